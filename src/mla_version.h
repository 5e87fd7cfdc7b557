#ifndef MLA_VERSION_H
#define MLA_VERSION_H
#define MLALAB_VERSION "0.1.0"
#endif
