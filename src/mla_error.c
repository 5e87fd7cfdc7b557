#include "mla_error.h"

#include <stdarg.h>
#include <string.h>

static _Thread_local char errbuf[2048];

int mla_err(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(errbuf, sizeof errbuf, fmt, ap);
  va_end(ap);
  return -1;
}

int mla_err_prefix(const char *fmt, ...) {
  char prefix[512], old[sizeof errbuf];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(prefix, sizeof prefix, fmt, ap);
  va_end(ap);
  memcpy(old, errbuf, sizeof old);
  size_t n = strlen(prefix);
  if (n >= sizeof errbuf) n = sizeof errbuf - 1;
  memcpy(errbuf, prefix, n);
  snprintf(errbuf + n, sizeof errbuf - n, "%.*s", (int)(sizeof errbuf - n - 1), old);
  return -1;
}

const char *mla_errmsg(void) { return errbuf[0] ? errbuf : "unknown error"; }
