/* fork + exec with pipes, a poll loop and a deadline. The child calls only
 * async-signal-safe functions before exec, so forking a process that holds a
 * CUDA context is safe: the child never touches it. */
#define _GNU_SOURCE
#include "process.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "mla_error.h"

extern char **environ;

typedef struct buf {
  char *p;
  size_t len, cap, max;
} buf;

static void buf_add(buf *b, const char *s, size_t n) {
  if (b->len + n > b->max) n = b->len < b->max ? b->max - b->len : 0;
  if (n == 0) return;
  if (b->len + n + 1 > b->cap) {
    size_t cap = b->cap ? b->cap * 2 : 4096;
    while (cap < b->len + n + 1) cap *= 2;
    char *q = realloc(b->p, cap);
    MLA_ASSERT(q);
    b->p = q, b->cap = cap;
  }
  memcpy(b->p + b->len, s, n);
  b->len += n;
  b->p[b->len] = 0;
}

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static char **merged_env(const char *const *extra) {
  size_t n = 0, m = 0;
  while (environ[n]) n++;
  while (extra && extra[m]) m++;
  char **e = calloc(n + m + 1, sizeof *e);
  MLA_ASSERT(e);
  size_t k = 0;
  for (size_t i = 0; i < n; i++) {
    /* an extra NAME=... replaces the inherited NAME */
    const char *eq = strchr(environ[i], '=');
    size_t nl = eq ? (size_t)(eq - environ[i]) : strlen(environ[i]);
    int replaced = 0;
    for (size_t j = 0; j < m; j++)
      if (strncmp(extra[j], environ[i], nl) == 0 && extra[j][nl] == '=') replaced = 1;
    if (!replaced) e[k++] = environ[i];
  }
  for (size_t j = 0; j < m; j++) e[k++] = (char *)extra[j];
  return e;
}

int mla_spawn(const mla_spawn_opts *o, mla_spawn_result *r) {
  int in[2] = {-1, -1}, out[2] = {-1, -1}, err[2] = {-1, -1}, res[2] = {-1, -1}, exe[2] = {-1, -1};
  memset(r, 0, sizeof *r);
  if (!o->argv || !o->argv[0]) return mla_err("spawn: no program given");
  if (pipe2(in, O_CLOEXEC) || pipe2(out, O_CLOEXEC) || pipe2(err, O_CLOEXEC) || pipe2(exe, O_CLOEXEC) ||
      (o->result_fd >= 3 && pipe2(res, O_CLOEXEC)))
    return mla_err("spawn: pipe: %s", strerror(errno));
  char **env = merged_env(o->env);
  double t0 = now();
  pid_t pid = fork();
  if (pid < 0) {
    free(env);
    return mla_err("spawn: fork: %s", strerror(errno));
  }
  if (pid == 0) { /* child: async-signal-safe calls only */
    setpgid(0, 0);
    dup2(in[0], 0), dup2(out[1], 1), dup2(err[1], 2);
    if (o->result_fd >= 3) dup2(res[1], o->result_fd);
    signal(SIGPIPE, SIG_DFL);
    execve(o->argv[0], (char *const *)o->argv, env);
    int e = errno;
    ssize_t w = write(exe[1], &e, sizeof e);
    (void)w;
    _exit(127);
  }
  free(env);
  setpgid(pid, pid);
  close(in[0]), close(out[1]), close(err[1]), close(exe[1]);
  if (o->result_fd >= 3) close(res[1]);
  int exec_errno = 0;
  if (read(exe[0], &exec_errno, sizeof exec_errno) > 0) {
    close(exe[0]), close(in[1]), close(out[0]), close(err[0]);
    if (res[0] >= 0) close(res[0]);
    waitpid(pid, NULL, 0);
    return mla_err("spawn: cannot run '%s': %s", o->argv[0], strerror(exec_errno));
  }
  close(exe[0]);

  size_t max = o->max_capture ? o->max_capture : (size_t)64 << 20;
  buf bo = {0, 0, 0, max}, be = {0, 0, 0, max}, br = {0, 0, 0, max};
  size_t in_off = 0;
  if (!o->input || o->input_len == 0) close(in[1]), in[1] = -1;
  else fcntl(in[1], F_SETFL, O_NONBLOCK);
  int fds_open = 2 + (res[0] >= 0);
  while (fds_open > 0 || in[1] >= 0) {
    struct pollfd p[4];
    buf *dst[4];
    int *src[4];
    int n = 0;
    int *rd[3] = {&out[0], &err[0], &res[0]};
    buf *bb[3] = {&bo, &be, &br};
    for (int k = 0; k < 3; k++)
      if (*rd[k] >= 0) p[n].fd = *rd[k], p[n].events = POLLIN, dst[n] = bb[k], src[n] = rd[k], n++;
    if (in[1] >= 0) p[n].fd = in[1], p[n].events = POLLOUT, dst[n] = NULL, src[n] = &in[1], n++;
    int wait_ms = -1;
    if (o->timeout_s > 0) {
      double left = o->timeout_s - (now() - t0);
      if (left <= 0) { r->timed_out = 1; break; }
      wait_ms = (int)(left * 1000) + 1;
    }
    int rc = poll(p, (nfds_t)n, wait_ms);
    if (rc < 0 && errno == EINTR) continue;
    if (rc < 0) break;
    for (int k = 0; k < n; k++) {
      if (!p[k].revents) continue;
      if (!dst[k]) { /* stdin */
        ssize_t w = write(in[1], o->input + in_off, o->input_len - in_off);
        if (w > 0) in_off += (size_t)w;
        if (w < 0 && errno != EAGAIN) in_off = o->input_len;
        if (in_off >= o->input_len) close(in[1]), in[1] = -1;
        continue;
      }
      char tmp[65536];
      ssize_t got = read(*src[k], tmp, sizeof tmp);
      if (got > 0) buf_add(dst[k], tmp, (size_t)got);
      else if (got == 0 || (got < 0 && errno != EAGAIN && errno != EINTR)) close(*src[k]), *src[k] = -1, fds_open--;
    }
  }
  int status = 0;
  if (r->timed_out) {
    kill(-pid, SIGKILL);
    kill(pid, SIGKILL);
  } else if (o->timeout_s > 0) {
    /* streams closed: wait for exit, still within the deadline */
    while (waitpid(pid, &status, WNOHANG) == 0) {
      if (now() - t0 > o->timeout_s) { r->timed_out = 1; kill(-pid, SIGKILL); kill(pid, SIGKILL); break; }
      struct timespec ts = {0, 2000000};
      nanosleep(&ts, NULL);
    }
    if (!r->timed_out) goto reaped;
  }
  waitpid(pid, &status, 0);
reaped:
  if (in[1] >= 0) close(in[1]);
  if (out[0] >= 0) close(out[0]);
  if (err[0] >= 0) close(err[0]);
  if (res[0] >= 0) close(res[0]);
  r->elapsed_s = now() - t0;
  if (WIFEXITED(status)) r->exit_code = WEXITSTATUS(status);
  else r->exit_code = -1, r->signal = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
  r->out = bo.p ? bo.p : calloc(1, 1), r->out_len = bo.len;
  r->err = be.p ? be.p : calloc(1, 1), r->err_len = be.len;
  r->result = br.p ? br.p : calloc(1, 1), r->result_len = br.len;
  return 0;
}

void mla_spawn_result_free(mla_spawn_result *r) {
  free(r->out), free(r->err), free(r->result);
  r->out = r->err = r->result = NULL;
}
