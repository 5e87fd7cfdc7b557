/* mlalab: a Lua 5.4 interpreter with the mlalab library built in.
 * Modelled on Lua's own lua.c: pmain runs under a protected call, errors get
 * a traceback from a message handler, scripts receive `arg` and `...`, and
 * Ctrl-C interrupts through a hook. mlalab adds --device, --info, --version,
 * --timeout and --check-kernels, and preloads `mla` in the REPL. */
#define _POSIX_C_SOURCE 200809L
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <lauxlib.h>
#include <lua.h>
#include <lualib.h>

#include "device.h"
#include "mla_version.h"

#ifdef MLA_USE_READLINE
#include <readline/history.h>
#include <readline/readline.h>
#endif

int luaopen_mlalab_core(lua_State *L);
void mla_set_requested_device(const char *name);

static const char *progname = "mlalab";
static lua_State *globalL;
static double timeout_s;      /* --timeout: 0 = none */
static struct timespec t_start;

/* ---- messages ----------------------------------------------------------- */

static void l_message(const char *pname, const char *msg) {
  if (pname) fprintf(stderr, "%s: ", pname);
  fprintf(stderr, "%s\n", msg);
  fflush(stderr);
}

static int report(lua_State *L, int status) {
  if (status != LUA_OK) {
    const char *msg = lua_tostring(L, -1);
    if (!msg) msg = "(error object is not a string)";
    l_message(progname, msg);
    lua_pop(L, 1);
  }
  return status;
}

static int msghandler(lua_State *L) {
  const char *msg = lua_tostring(L, 1);
  if (msg == NULL) {
    if (luaL_callmeta(L, 1, "__tostring") && lua_type(L, -1) == LUA_TSTRING) return 1;
    msg = lua_pushfstring(L, "(error object is a %s value)", luaL_typename(L, 1));
  }
  luaL_traceback(L, L, msg, 1);
  return 1;
}

/* ---- interrupts and time limits ------------------------------------------ */

static double elapsed(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)(t.tv_sec - t_start.tv_sec) + 1e-9 * (double)(t.tv_nsec - t_start.tv_nsec);
}

static void timeout_hook(lua_State *L, lua_Debug *ar) {
  (void)ar;
  if (timeout_s > 0 && elapsed() > timeout_s)
    luaL_error(L, "timeout: the script ran longer than --timeout %.3g s", timeout_s);
}

static void install_timeout_hook(lua_State *L) {
  if (timeout_s > 0) lua_sethook(L, timeout_hook, LUA_MASKCOUNT, 100000);
}

static void lstop(lua_State *L, lua_Debug *ar) {
  (void)ar;
  lua_sethook(L, NULL, 0, 0);
  install_timeout_hook(L);
  luaL_error(L, "interrupted!");
}

/* Only sets a hook: the one async-signal-safe way to stop the Lua VM. */
static void laction(int i) {
  int flag = LUA_MASKCALL | LUA_MASKRET | LUA_MASKLINE | LUA_MASKCOUNT;
  signal(i, SIG_DFL); /* a second Ctrl-C kills the process */
  lua_sethook(globalL, lstop, flag, 1);
}

static int docall(lua_State *L, int narg, int nres) {
  int base = lua_gettop(L) - narg;
  lua_pushcfunction(L, msghandler);
  lua_insert(L, base);
  globalL = L;
  signal(SIGINT, laction);
  int status = lua_pcall(L, narg, nres, base);
  signal(SIGINT, SIG_DFL);
  lua_remove(L, base);
  if (status != LUA_OK) {
    /* drain queued GPU work so the device is usable at the next prompt */
    if (mla_device_count() > 0) mla_device_sync_all();
  }
  return status;
}

/* ---- arguments ------------------------------------------------------------ */

static void print_version(void) {
  printf("mlalab %s (%s)\n", MLALAB_VERSION, LUA_RELEASE);
  fflush(stdout);
}

static void print_usage(const char *badoption) {
  if (badoption) fprintf(stderr, "%s: unrecognized option '%s'\n", progname, badoption);
  fprintf(stderr,
          "usage: %s [options] [script [args]]\n"
          "Available options are:\n"
          "  -e stat            execute string 'stat'\n"
          "  -i                 enter interactive mode after executing 'script'\n"
          "  -l mod             require library 'mod' into global 'mod'\n"
          "  -l g=mod           require library 'mod' into global 'g'\n"
          "  -v                 show version information\n"
          "  -E                 ignore environment variables\n"
          "  -W                 turn warnings on\n"
          "  --device DEV       default device: cpu, cuda or cuda:N\n"
          "  --info             show Lua, CUDA and device information\n"
          "  --version          show mlalab's version\n"
          "  --timeout SECONDS  stop the script after SECONDS of run time\n"
          "  --check-kernels    compile every kernel in kernels_rtc/ and print resources\n"
          "  --                 stop handling options\n"
          "  -                  stop handling options and execute stdin\n",
          progname);
  fflush(stderr);
}

static void createargtable(lua_State *L, char **argv, int argc, int script) {
  if (script == argc) script = 0; /* no script: program name goes to arg[0] */
  int narg = argc - (script + 1);
  lua_createtable(L, narg, script + 1);
  for (int i = 0; i < argc; i++) {
    lua_pushstring(L, argv[i]);
    lua_rawseti(L, -2, i - script);
  }
  lua_setglobal(L, "arg");
}

enum { has_error = 1, has_i = 2, has_v = 4, has_e = 8, has_E = 16, has_info = 32, has_check = 64 };

/* Scans the options; returns flags and sets *first to the script's index. */
static int collectargs(char **argv, int *first) {
  int args = 0, i;
  if (argv[0] != NULL) {
    if (argv[0][0]) progname = argv[0];
  } else {
    *first = -1;
    return 0;
  }
  for (i = 1; argv[i] != NULL; i++) {
    *first = i;
    if (argv[i][0] != '-') return args;
    if (argv[i][1] == '-' && argv[i][2]) { /* long options */
      const char *o = argv[i] + 2;
      const char *val = strchr(o, '=');
      size_t len = val ? (size_t)(val - o) : strlen(o);
      if (strncmp(o, "device", len) == 0 && len == 6) {
        if (!val) { if (argv[i + 1] == NULL) { *first = i; return has_error; } val = argv[++i]; }
        else val++;
        mla_set_requested_device(val);
      } else if (strncmp(o, "timeout", len) == 0 && len == 7) {
        if (!val) { if (argv[i + 1] == NULL) { *first = i; return has_error; } val = argv[++i]; }
        else val++;
        char *end;
        timeout_s = strtod(val, &end);
        if (*end || timeout_s <= 0) { *first = i; return has_error; }
      } else if (len == 4 && strncmp(o, "info", 4) == 0) args |= has_info;
      else if (len == 13 && strncmp(o, "check-kernels", 13) == 0) args |= has_check;
      else if (len == 7 && strncmp(o, "version", 7) == 0) args |= has_v;
      else if (len == 4 && strncmp(o, "help", 4) == 0) { *first = -2; return has_error; }
      else return has_error;
      continue;
    }
    switch (argv[i][1]) {
    case '-':
      if (argv[i][2] != '\0') return has_error;
      *first = i + 1;
      return args;
    case '\0': return args; /* '-': script is stdin */
    case 'E':
      if (argv[i][2] != '\0') return has_error;
      args |= has_E;
      break;
    case 'W':
      if (argv[i][2] != '\0') return has_error;
      break;
    case 'i': args |= has_i; /* -i implies -v */
      /* fallthrough */
    case 'v':
      if (argv[i][2] != '\0') return has_error;
      args |= has_v;
      break;
    case 'e': args |= has_e;
      /* fallthrough */
    case 'l':
      if (argv[i][2] == '\0') {
        i++;
        if (argv[i] == NULL || argv[i][0] == '-') return has_error;
      }
      break;
    default: return has_error;
    }
  }
  *first = i;
  return args;
}

static int dochunk(lua_State *L, int status) {
  if (status == LUA_OK) status = docall(L, 0, 0);
  return report(L, status);
}

static int dostring(lua_State *L, const char *s, const char *name) {
  return dochunk(L, luaL_loadbuffer(L, s, strlen(s), name));
}

static int dofile(lua_State *L, const char *name) { return dochunk(L, luaL_loadfile(L, name)); }

/* -l [g=]mod: require mod into global g */
static int dolibrary(lua_State *L, char *globname) {
  char *modname = strchr(globname, '=');
  if (modname == NULL) {
    modname = globname;
    char *suffix = strchr(modname, '-'); /* version suffix, as lua.c */
    if (suffix) *suffix = '\0';
  } else {
    *modname = '\0';
    modname++;
  }
  lua_getglobal(L, "require");
  lua_pushstring(L, modname);
  int status = docall(L, 1, 1);
  if (status == LUA_OK) lua_setglobal(L, globname);
  return report(L, status);
}

static int runargs(lua_State *L, char **argv, int n) {
  for (int i = 1; i < n; i++) {
    int option = argv[i][1];
    if (option == '-' && argv[i][2]) { /* long option with a separate value */
      const char *o = argv[i] + 2;
      if ((strcmp(o, "device") == 0 || strcmp(o, "timeout") == 0)) i++;
      continue;
    }
    if (option == 'e' || option == 'l') {
      int status;
      char *extra = argv[i] + 2;
      if (*extra == '\0') extra = argv[++i];
      status = option == 'e' ? dostring(L, extra, "=(command line)") : dolibrary(L, extra);
      if (status != LUA_OK) return 0;
    } else if (option == 'W') {
      lua_warning(L, "@on", 0);
    }
  }
  return 1;
}

static int handle_init(lua_State *L) {
  const char *names[] = {"MLALAB_INIT", "LUA_INIT_5_4", "LUA_INIT"};
  for (size_t k = 0; k < sizeof names / sizeof names[0]; k++) {
    const char *init = getenv(names[k]);
    if (init == NULL) continue;
    if (init[0] == '@') return dofile(L, init + 1);
    char nm[32];
    snprintf(nm, sizeof nm, "=%s", names[k]);
    return dostring(L, init, nm);
  }
  return LUA_OK;
}

static int pushargs(lua_State *L) {
  if (lua_getglobal(L, "arg") != LUA_TTABLE) luaL_error(L, "'arg' is not a table");
  int n = (int)luaL_len(L, -1);
  luaL_checkstack(L, n + 3, "too many arguments to script");
  int i;
  for (i = 1; i <= n; i++) lua_rawgeti(L, -i, i);
  lua_remove(L, -i);
  return n;
}

static int handle_script(lua_State *L, char **argv) {
  const char *fname = argv[0];
  if (strcmp(fname, "-") == 0 && strcmp(argv[-1], "--") != 0) fname = NULL; /* stdin */
  int status = luaL_loadfile(L, fname);
  if (status == LUA_OK) {
    int n = pushargs(L);
    status = docall(L, n, LUA_MULTRET);
  }
  return report(L, status);
}

/* ---- REPL ------------------------------------------------------------------ */

#define LUA_MAXINPUT 4096

static const char *get_prompt(lua_State *L, int firstline) {
  if (lua_getglobal(L, firstline ? "_PROMPT" : "_PROMPT2") == LUA_TNIL)
    return firstline ? "mla> " : "mla>> ";
  const char *p = luaL_tolstring(L, -1, NULL);
  lua_remove(L, -2);
  return p;
}

static int incomplete(lua_State *L, int status) {
  if (status == LUA_ERRSYNTAX) {
    size_t lmsg;
    const char *msg = lua_tolstring(L, -1, &lmsg);
    const char *eof = "<eof>";
    size_t leof = strlen(eof);
    if (lmsg >= leof && strcmp(msg + lmsg - leof, eof) == 0) {
      lua_pop(L, 1);
      return 1;
    }
  }
  return 0;
}

static int pushline(lua_State *L, int firstline) {
  const char *prmt = get_prompt(L, firstline);
#ifdef MLA_USE_READLINE
  char *b = readline(prmt);
  lua_pop(L, 1);
  if (b == NULL) return 0;
  size_t l = strlen(b);
  lua_pushlstring(L, b, l);
  free(b);
#else
  char buffer[LUA_MAXINPUT];
  fputs(prmt, stdout);
  fflush(stdout);
  lua_pop(L, 1);
  if (fgets(buffer, LUA_MAXINPUT, stdin) == NULL) return 0;
  size_t l = strlen(buffer);
  if (l > 0 && buffer[l - 1] == '\n') buffer[--l] = '\0';
  lua_pushlstring(L, buffer, l);
#endif
  if (firstline && lua_tostring(L, -1)[0] == '=') { /* "=expr" as in 5.1 */
    lua_pushfstring(L, "return %s", lua_tostring(L, -1) + 1);
    lua_remove(L, -2);
  }
  return 1;
}

static void saveline(const char *line) {
#ifdef MLA_USE_READLINE
  if (line[0]) add_history(line);
#else
  (void)line;
#endif
}

static int addreturn(lua_State *L) {
  const char *line = lua_tostring(L, -1);
  const char *retline = lua_pushfstring(L, "return %s;", line);
  int status = luaL_loadbuffer(L, retline, strlen(retline), "=stdin");
  if (status == LUA_OK) {
    lua_remove(L, -2);
    saveline(line);
  } else {
    lua_pop(L, 2);
  }
  return status;
}

static int multiline(lua_State *L) {
  for (;;) {
    size_t len;
    const char *line = lua_tolstring(L, 1, &len);
    int status = luaL_loadbuffer(L, line, len, "=stdin");
    if (!incomplete(L, status) || !pushline(L, 0)) {
      saveline(line);
      return status;
    }
    lua_pushliteral(L, "\n");
    lua_insert(L, -2);
    lua_concat(L, 3);
  }
}

static int loadline(lua_State *L) {
  lua_settop(L, 0);
  if (!pushline(L, 1)) return -1;
  int status = addreturn(L);
  if (status != LUA_OK) status = multiline(L);
  lua_remove(L, 1);
  return status;
}

static void l_print(lua_State *L) {
  int n = lua_gettop(L);
  if (n > 0) {
    luaL_checkstack(L, LUA_MINSTACK, "too many results to print");
    lua_getglobal(L, "print");
    lua_insert(L, 1);
    if (lua_pcall(L, n, 0, 0) != LUA_OK)
      l_message(progname, lua_pushfstring(L, "error calling 'print' (%s)", lua_tostring(L, -1)));
  }
}

#ifdef MLA_USE_READLINE
/* Tab completion: the word before the cursor (names joined by "." and ":")
 * goes to mlalab.complete.candidates, in the REPL's own state between two
 * lines, so the completions are what the next line would see. */
static char **completions; /* NULL-terminated, handed out by the generator */
static int completion_next;

static char *completion_generator(const char *text, int state) {
  (void)text;
  if (state == 0) completion_next = 0;
  if (!completions || !completions[completion_next]) return NULL;
  return strdup(completions[completion_next++]);
}

static void completions_free(void) {
  if (!completions) return;
  for (int i = 0; completions[i]; i++) free(completions[i]);
  free(completions);
  completions = NULL;
}

static int push_candidates(lua_State *L) {
  const char *word = lua_tostring(L, 1);
  lua_getglobal(L, "require");
  lua_pushliteral(L, "mlalab.complete");
  lua_call(L, 1, 1);
  lua_getfield(L, -1, "candidates");
  lua_pushstring(L, word);
  lua_call(L, 1, 1);
  return 1;
}

static char **lua_completion(const char *text, int start, int end) {
  (void)start, (void)end;
  rl_attempted_completion_over = 1; /* never file names */
  lua_State *L = globalL;
  int top = lua_gettop(L);
  completions_free();
  lua_pushcfunction(L, push_candidates);
  lua_pushstring(L, text);
  if (lua_pcall(L, 1, 1, 0) == LUA_OK && lua_istable(L, -1)) {
    lua_Integer n = luaL_len(L, -1);
    completions = calloc((size_t)n + 1, sizeof *completions);
    for (lua_Integer i = 1; completions && i <= n; i++) {
      lua_geti(L, -1, i);
      const char *c = lua_tostring(L, -1);
      completions[i - 1] = strdup(c ? c : "");
      lua_pop(L, 1);
    }
  }
  lua_settop(L, top); /* an error in the completer completes nothing */
  rl_completion_append_character = '\0'; /* candidates end in "(" or "." themselves */
  return rl_completion_matches(text, completion_generator);
}

static void completion_init(void) {
  rl_readline_name = "mlalab";
  rl_basic_word_break_characters = " \t\n\"\\'`@$><=;|&{}()[],+-*/%^~#";
  rl_attempted_completion_function = lua_completion;
}
#endif

static void doREPL(lua_State *L) {
  const char *oldprogname = progname;
  progname = NULL;
  /* the library is there as `mla` without a require */
  lua_getglobal(L, "require");
  lua_pushstring(L, "mlalab");
  if (docall(L, 1, 1) == LUA_OK) lua_setglobal(L, "mla");
  else report(L, LUA_ERRRUN);
  /* help(x), help.find(word): the library's doc comments (lua/mlalab/help.lua), loaded on first use */
  if (luaL_loadstring(L, "help = help or setmetatable({}, {__call = function(_, ...) return mla.help(...) end, "
                         "__index = function(_, k) return mla.help[k] end})") != LUA_OK ||
      docall(L, 0, 0) != LUA_OK)
    report(L, LUA_ERRRUN);
#ifdef MLA_USE_READLINE
  completion_init();
#endif
  if (isatty(0)) {
    static const char hint[] = "help() lists the library; help(x) describes x; help.find(word) searches it\n";
    lua_writestring(hint, sizeof hint - 1);
  }
  int status;
  while ((status = loadline(L)) != -1) {
    if (status == LUA_OK) status = docall(L, 0, LUA_MULTRET);
    if (status == LUA_OK) l_print(L);
    else report(L, status);
  }
  lua_settop(L, 0);
  lua_writeline();
  progname = oldprogname;
}

/* ---- library paths --------------------------------------------------------- */

static int file_exists(const char *p) {
  FILE *f = fopen(p, "r");
  if (f) fclose(f);
  return f != NULL;
}

/* Finds lua/mlalab/init.lua next to the executable (build tree) or in
 * <prefix>/share/mlalab (installed), and puts it on package.path. */
static void setup_paths(lua_State *L) {
  char exe[4096], dir[4096], cand[8300];
  const char *found = NULL;
  ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
  static char root[4096 + 32]; /* dir plus the longest suffix in rel */
  if (n > 0) {
    exe[n] = 0;
    snprintf(dir, sizeof dir, "%s", exe);
    char *slash = strrchr(dir, '/');
    if (slash) *slash = 0;
    const char *rel[] = {"", "/../share/mlalab"};
    for (size_t k = 0; k < 2 && !found; k++) {
      snprintf(cand, sizeof cand, "%s%s/lua/mlalab/init.lua", dir, rel[k]);
      if (file_exists(cand)) snprintf(root, sizeof root, "%s%s", dir, rel[k]), found = root;
    }
  }
#ifdef MLALAB_SOURCE_DIR
  if (!found) {
    snprintf(cand, sizeof cand, "%s/lua/mlalab/init.lua", MLALAB_SOURCE_DIR);
    if (file_exists(cand)) snprintf(root, sizeof root, "%s", MLALAB_SOURCE_DIR), found = root;
  }
#endif
  lua_getglobal(L, "package");
  if (found) {
    lua_getfield(L, -1, "path");
    const char *old = lua_tostring(L, -1);
    int user_path = getenv("LUA_PATH_5_4") || getenv("LUA_PATH");
    if (user_path) lua_pushfstring(L, "%s;%s/lua/?.lua;%s/lua/?/init.lua", old, found, found);
    else lua_pushfstring(L, "%s/lua/?.lua;%s/lua/?/init.lua;%s", found, found, old);
    lua_setfield(L, -3, "path");
    lua_pop(L, 1);
  }
  /* package.loaded["mlalab.paths"]: where the library found its files */
  lua_getfield(L, -1, "loaded");
  lua_createtable(L, 0, 3);
  if (found) {
    lua_pushstring(L, found), lua_setfield(L, -2, "root");
    lua_pushfstring(L, "%s/kernels_rtc", found), lua_setfield(L, -2, "kernels_rtc");
  }
  if (n > 0) lua_pushstring(L, exe), lua_setfield(L, -2, "exe");
  lua_setfield(L, -2, "mlalab.paths");
  lua_pop(L, 1);
  /* the C core, preloaded so require("mlalab.core") needs no .so */
  lua_getfield(L, -1, "preload");
  lua_pushcfunction(L, luaopen_mlalab_core);
  lua_setfield(L, -2, "mlalab.core");
  lua_pop(L, 2);
}

/* Runs require("mlalab.cli")[fn](args...) for --info / --check-kernels. */
static int run_cli(lua_State *L, const char *fn, char **argv, int first, int argc) {
  lua_getglobal(L, "require");
  lua_pushstring(L, "mlalab.cli");
  int status = docall(L, 1, 1);
  if (status != LUA_OK) return report(L, status);
  lua_getfield(L, -1, fn);
  lua_remove(L, -2);
  int n = 0;
  for (int i = first; i < argc; i++, n++) lua_pushstring(L, argv[i]);
  status = docall(L, n, 1);
  if (status != LUA_OK) return report(L, status);
  int ok = lua_toboolean(L, -1);
  lua_pop(L, 1);
  return ok ? LUA_OK : LUA_ERRRUN;
}

static int pmain(lua_State *L) {
  int argc = (int)lua_tointeger(L, 1);
  char **argv = (char **)lua_touserdata(L, 2);
  int script;
  int args = collectargs(argv, &script);
  int optlim = (script > 0) ? script : argc;
  luaL_checkversion(L);
  if (args == has_error) {
    if (script == -2) { print_usage(NULL); lua_pushboolean(L, 1); return 1; }
    print_usage(script > 0 && argv[script] ? argv[script] : NULL);
    return 0;
  }
  if (args & has_v) print_version();
  if (args & has_E) {
    lua_pushboolean(L, 1);
    lua_setfield(L, LUA_REGISTRYINDEX, "LUA_NOENV");
  }
  luaL_openlibs(L);
  setup_paths(L);
  createargtable(L, argv, argc, script);
  lua_gc(L, LUA_GCRESTART);
  lua_gc(L, LUA_GCGEN, 0, 0);
  clock_gettime(CLOCK_MONOTONIC, &t_start);
  install_timeout_hook(L);
  if (!(args & has_E)) {
    if (handle_init(L) != LUA_OK) return 0;
  }
  if (args & has_info) {
    lua_pushboolean(L, run_cli(L, "info", argv, script, argc) == LUA_OK);
    return 1;
  }
  if (args & has_check) {
    lua_pushboolean(L, run_cli(L, "check_kernels", argv, script, argc) == LUA_OK);
    return 1;
  }
  if (!runargs(L, argv, optlim)) return 0;
  if (script > 0 && script < argc) {
    if (handle_script(L, argv + script) != LUA_OK) return 0;
  }
  if (args & has_i) {
    doREPL(L);
  } else if (script == argc && !(args & (has_e | has_v))) {
    if (isatty(0)) {
      print_version();
      doREPL(L);
    } else {
      dofile(L, NULL);
    }
  }
  lua_pushboolean(L, 1);
  return 1;
}

int main(int argc, char **argv) {
  /* NVRTC (CUDA 12.9+) takes cubins from the driver's compute cache when a
   * driver is present, and then ptxas does not run: the log has no resource
   * report (registers, spills) for mla.rtc to read. mlalab keeps its own
   * content-addressed kernel cache, so the driver's is switched off for this
   * process before anything loads CUDA, unless the user set the variable. */
  setenv("CUDA_CACHE_DISABLE", "1", 0);
  lua_State *L = luaL_newstate();
  if (L == NULL) {
    l_message(argv[0], "cannot create state: not enough memory");
    return EXIT_FAILURE;
  }
  lua_gc(L, LUA_GCSTOP);
  lua_pushcfunction(L, &pmain);
  lua_pushinteger(L, argc);
  lua_pushlightuserdata(L, argv);
  int status = lua_pcall(L, 2, 1, 0);
  int result = lua_toboolean(L, -1);
  report(L, status);
  lua_close(L); /* runs every finalizer: files flush, tensors free */
  return (result && status == LUA_OK) ? EXIT_SUCCESS : EXIT_FAILURE;
}
