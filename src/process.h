/* Child processes with captured output and a time limit: the base of
 * mla.isolate (a faulting or hanging kernel only takes its own process and
 * CUDA context down) and of specs that run the interpreter as users do. */
#ifndef MLA_PROCESS_H
#define MLA_PROCESS_H

#include <stddef.h>
#include <stdint.h>

typedef struct mla_spawn_opts {
  const char *const *argv; /* argv[0] is the program path; NULL-terminated */
  const char *const *env;  /* extra NAME=value entries, NULL-terminated, or NULL */
  const char *input;       /* written to the child's stdin, then closed */
  size_t input_len;
  double timeout_s;        /* 0 = none; on expiry the process group is killed */
  int result_fd;           /* >= 3: a pipe at this fd in the child, captured into `result` */
  size_t max_capture;      /* per stream, bytes kept (rest counted, dropped) */
} mla_spawn_opts;

typedef struct mla_spawn_result {
  int exit_code; /* -1 when killed by a signal */
  int signal;    /* signal number, 0 if it exited */
  int timed_out;
  double elapsed_s;
  char *out, *err, *result; /* captured streams (NUL-terminated, caller frees) */
  size_t out_len, err_len, result_len;
} mla_spawn_result;

int mla_spawn(const mla_spawn_opts *o, mla_spawn_result *r);
void mla_spawn_result_free(mla_spawn_result *r);

#endif
