/* The OCI runtime: finding a working runc or crun, building their command
 * lines, starting them (posix_spawn, watched through a pidfd for a job) and
 * a blocking start-and-wait helper for tests and cleanup.
 *
 * Auto-detection prefers crun only on a pure cgroup v2 (unified) host:
 * crun 1.8 refuses hybrid layouts (cgroup v1 controllers plus a cgroup2
 * mount at /sys/fs/cgroup/unified) with "cgroups in hybrid mode not
 * supported, drop all controllers from cgroupv2", while runc handles v1,
 * hybrid and v2 alike. */
#include "sandbox_int.h"

#include <fcntl.h>
#include <linux/magic.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stdatomic.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#define VERSION_TIMEOUT_MS 5000

/* posix_spawn_file_actions_addclosefrom_np: glibc 2.34 and later. */
#if defined(__GLIBC__) && (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 34))
#define GN_HAVE_SPAWN_CLOSEFROM 1
#endif
#define ID_MAX 128

static bool cgroup2_unified(void) {
  struct statfs sf;
  return statfs("/sys/fs/cgroup", &sf) == 0 && (long)sf.f_type == CGROUP2_SUPER_MAGIC;
}

/* A hybrid layout: cgroup v1 controllers under /sys/fs/cgroup with a
 * cgroup2 tree beside them at /sys/fs/cgroup/unified. crun (1.8 at least)
 * refuses to start any container there. GN_CGROUP_HYBRID=0/1 overrides the
 * probe (tests). */
static bool cgroup_hybrid(void) {
  const char *o = getenv("GN_CGROUP_HYBRID");
  if (o && (strcmp(o, "0") == 0 || strcmp(o, "1") == 0))
    return o[0] == '1';
  struct statfs sf;
  return !cgroup2_unified() && statfs("/sys/fs/cgroup/unified", &sf) == 0 && (long)sf.f_type == CGROUP2_SUPER_MAGIC;
}

/* Finds an executable by name in PATH, then in the sbin dirs that a
 * non-login PATH often lacks (Debian installs runc in /usr/sbin). */
static bool find_exec(const char *name, char *out, size_t cap) {
  if (strchr(name, '/')) {
    if (access(name, X_OK) != 0 || strlen(name) >= cap)
      return false;
    snprintf(out, cap, "%s", name);
    return true;
  }
  const char *path = getenv("PATH");
  char buf[4096];
  snprintf(buf, sizeof(buf), "%s:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", path ? path : "");
  for (char *save = NULL, *dir = strtok_r(buf, ":", &save); dir; dir = strtok_r(NULL, ":", &save)) {
    char cand[4096];
    struct stat st;
    if (!dir[0])
      continue;
    snprintf(cand, sizeof(cand), "%s/%s", dir, name);
    if (stat(cand, &st) == 0 && S_ISREG(st.st_mode) && access(cand, X_OK) == 0 && strlen(cand) < cap) {
      snprintf(out, cap, "%s", cand);
      return true;
    }
  }
  return false;
}

static void close_from(int lowfd) {
#ifdef SYS_close_range
  if (syscall(SYS_close_range, lowfd, ~0U, 0) == 0)
    return;
#endif
  for (int fd = lowfd; fd < 1024; fd++)
    close(fd);
}

/* Runs `path --version`, returning its first line of output. */
static int run_version(const char *path, char *out, size_t cap) {
  int p[2];
  if (pipe2(p, O_CLOEXEC) < 0)
    return -errno;
  pid_t pid = fork();
  if (pid < 0) {
    int e = -errno;
    close(p[0]);
    close(p[1]);
    return e;
  }
  if (pid == 0) {
    int devnull = open("/dev/null", O_RDWR);
    dup2(devnull, 0);
    dup2(p[1], 1);
    dup2(devnull, 2);
    close_from(3);
    execl(path, path, "--version", (char *)NULL);
    _exit(127);
  }
  close(p[1]);
  char buf[1024];
  size_t n = 0;
  uint64_t deadline = gn_mono_ms() + VERSION_TIMEOUT_MS;
  for (;;) {
    uint64_t now = gn_mono_ms();
    if (now >= deadline) {
      kill(pid, SIGKILL);
      break;
    }
    struct pollfd pf = {.fd = p[0], .events = POLLIN};
    int pr = poll(&pf, 1, (int)(deadline - now));
    if (pr < 0 && errno == EINTR)
      continue;
    if (pr <= 0) {
      kill(pid, SIGKILL);
      break;
    }
    ssize_t r = read(p[0], buf + n, sizeof(buf) - 1 - n);
    if (r < 0 && errno == EINTR)
      continue;
    if (r <= 0)
      break;
    n += (size_t)r;
    if (n == sizeof(buf) - 1)
      break;
  }
  close(p[0]);
  int st = 0;
  while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {
  }
  if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
    return GN_EUNSUPPORTED;
  buf[n] = '\0';
  char *nl = strchr(buf, '\n');
  if (nl)
    *nl = '\0';
  size_t len = strlen(buf);
  if (len >= cap)
    len = cap - 1;
  memcpy(out, buf, len);
  out[len] = '\0';
  return 0;
}

/* Tries one runtime binary: it must run and say it is runc or crun. */
static int try_runtime(const char *name, gn_runtime *ret) {
  gn_runtime rt;
  char line[256];
  memset(&rt, 0, sizeof(rt));
  if (!find_exec(name, rt.path, sizeof(rt.path)))
    return GN_ENOTFOUND;
  if (run_version(rt.path, line, sizeof(line)) < 0)
    return GN_EUNSUPPORTED;
  /* "runc version 1.1.5+ds1" / "crun version 1.8.1" */
  const char *v = NULL;
  if (strncmp(line, "runc version ", 13) == 0) {
    rt.kind = GN_RUNTIME_RUNC;
    v = line + 13;
  } else if (strncmp(line, "crun version ", 13) == 0) {
    rt.kind = GN_RUNTIME_CRUN;
    v = line + 13;
  } else {
    return GN_EUNSUPPORTED;
  }
  snprintf(rt.version, sizeof(rt.version), "%.*s", (int)strcspn(v, " \t"), v);
  *ret = rt;
  return 0;
}

int gn_runtime_detect(const char *name, gn_runtime *ret, char *err, size_t err_cap) {
  int r;
  if (!ret)
    return GN_EINVAL;
  if (name && name[0] && strcmp(name, "auto") != 0) {
    if ((r = try_runtime(name, ret)) < 0)
      return gn__err(err, err_cap, r, "OCI runtime \"%s\" %s", name,
                     r == GN_ENOTFOUND ? "is not installed or not executable"
                                       : "does not run or is neither runc nor crun");
    if (ret->kind == GN_RUNTIME_CRUN && cgroup_hybrid())
      return gn__err(err, err_cap, GN_EUNSUPPORTED,
                     "OCI runtime crun %s refuses this host's hybrid cgroup layout (cgroup v1 controllers with "
                     "cgroup2 at /sys/fs/cgroup/unified), so every job would fail; use runc (--runtime runc or auto)",
                     ret->version);
    return 0;
  }
  const char *first = cgroup2_unified() ? "crun" : "runc";
  const char *second = cgroup2_unified() ? "runc" : "crun";
  if (try_runtime(first, ret) == 0)
    return 0;
  if (try_runtime(second, ret) == 0 && !(ret->kind == GN_RUNTIME_CRUN && cgroup_hybrid()))
    return 0;
  if (ret->kind == GN_RUNTIME_CRUN && cgroup_hybrid())
    return gn__err(err, err_cap, GN_EUNSUPPORTED,
                   "no usable OCI runtime: runc is not installed and crun refuses this host's hybrid cgroup layout; "
                   "install runc (apt-get install runc)");
  return gn__err(err, err_cap, GN_EUNSUPPORTED,
                 "no OCI runtime found: neither runc nor crun runs here; install one (apt-get install runc)");
}

static bool id_valid(const char *id) {
  size_t n = id ? strlen(id) : 0;
  if (n == 0 || n > ID_MAX)
    return false;
  for (size_t i = 0; i < n; i++) {
    char c = id[i];
    bool alnum = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
    if (!(alnum || (i > 0 && (c == '-' || c == '_' || c == '.'))))
      return false;
  }
  return true;
}

char **gn_argv_free(char **argv) {
  return gn__strv_free(argv);
}

static int argv_build(const char *const *parts, char ***ret_argv) {
  size_t n = 0;
  while (parts[n])
    n++;
  char **v = calloc(n + 1, sizeof(char *));
  if (!v)
    return GN_ENOMEM;
  for (size_t i = 0; i < n; i++) {
    if (!(v[i] = strdup(parts[i]))) {
      gn__strv_free(v);
      return GN_ENOMEM;
    }
  }
  *ret_argv = v;
  return 0;
}

/* runc and crun take the same global --root and the same subcommand flags
 * for run, kill and delete (crun --help lists --root; crun run --bundle). */
int gn_runtime_argv_run(const gn_runtime *rt, const char *state_root, const char *bundle, const char *id,
                        char ***ret_argv) {
  if (!rt || !rt->path[0] || !state_root || !bundle || !id_valid(id) || !ret_argv)
    return GN_EINVAL;
  const char *parts[] = {rt->path, "--root", state_root, "run", "--bundle", bundle, id, NULL};
  return argv_build(parts, ret_argv);
}

/* `exec` runs one more process in a running container with the container's
 * own process settings (user, capabilities, rlimits, seccomp, cgroup, no new
 * privileges: runc copies config.json's process and replaces only argv, the
 * added env and the tty flag). --no-new-privs is said again so that a
 * container started without it cannot hand a setuid path to the exec. */
int gn_runtime_argv_exec(const gn_runtime *rt, const char *state_root, const char *id, bool tty, const char *pid_file,
                         char *const *env, char *const *cmd, char ***ret_argv) {
  if (!rt || !rt->path[0] || !state_root || !id_valid(id) || !cmd || !cmd[0] || !ret_argv)
    return GN_EINVAL;
  size_t nenv = 0, ncmd = 0;
  while (env && env[nenv])
    nenv++;
  while (cmd[ncmd])
    ncmd++;
  if (nenv > 256 || ncmd > 256)
    return GN_ETOOBIG;
  for (size_t i = 0; i < nenv; i++)
    if (!env[i][0] || env[i][0] == '=' || !strchr(env[i], '='))
      return GN_EINVAL;
  const char **parts = calloc(12 + 2 * nenv + ncmd, sizeof *parts);
  if (!parts)
    return GN_ENOMEM;
  size_t k = 0;
  parts[k++] = rt->path;
  parts[k++] = "--root";
  parts[k++] = state_root;
  parts[k++] = "exec";
  parts[k++] = "--no-new-privs";
  if (tty)
    parts[k++] = "--tty";
  if (pid_file) {
    parts[k++] = "--pid-file";
    parts[k++] = pid_file;
  }
  for (size_t i = 0; i < nenv; i++) {
    parts[k++] = "--env";
    parts[k++] = env[i];
  }
  parts[k++] = id;
  for (size_t i = 0; i < ncmd; i++)
    parts[k++] = cmd[i];
  parts[k] = NULL;
  int r = argv_build(parts, ret_argv);
  free(parts);
  return r;
}

int gn_runtime_argv_kill(const gn_runtime *rt, const char *state_root, const char *id, const char *signal,
                         char ***ret_argv) {
  if (!rt || !rt->path[0] || !state_root || !id_valid(id) || !ret_argv)
    return GN_EINVAL;
  const char *sig = signal ? signal : "TERM";
  if (!sig[0] || strlen(sig) > 16 || strspn(sig, "ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789") != strlen(sig))
    return GN_EINVAL;
  const char *parts[] = {rt->path, "--root", state_root, "kill", id, sig, NULL};
  return argv_build(parts, ret_argv);
}

int gn_runtime_argv_delete(const gn_runtime *rt, const char *state_root, const char *id, char ***ret_argv) {
  if (!rt || !rt->path[0] || !state_root || !id_valid(id) || !ret_argv)
    return GN_EINVAL;
  const char *parts[] = {rt->path, "--root", state_root, "delete", "-f", id, NULL};
  return argv_build(parts, ret_argv);
}

/* The file actions and attributes every start shares: stdio as given (-1:
 * inherited; stdin_devnull: /dev/null), every other descriptor closed,
 * default signal dispositions (the daemon ignores SIGPIPE) and an empty
 * signal mask. */
static int spawn_setup(posix_spawn_file_actions_t *fa, posix_spawnattr_t *at, int stdin_fd, bool stdin_devnull,
                       int stdout_fd, int stderr_fd) {
  int e = posix_spawn_file_actions_init(fa);
  if (e)
    return -e;
  if ((e = posix_spawnattr_init(at))) {
    posix_spawn_file_actions_destroy(fa);
    return -e;
  }
  sigset_t all, none;
  sigfillset(&all);
  sigemptyset(&none);
#ifdef __GLIBC__
  /* glibc's posix_spawn leaves its two internal signals (32 and 33, which
   * sigfillset and sigaddset leave out) ignored in the child unless they
   * are in the defaults set, and runc, a Go program, hands an ignored
   * signal on to the job: set them by hand (signal n is bit n - 1). */
  for (unsigned sig = 32; sig <= 33; sig++)
    all.__val[(sig - 1) / (8 * sizeof all.__val[0])] |= 1ul << ((sig - 1) % (8 * sizeof all.__val[0]));
#endif
  if (stdin_devnull)
    e = posix_spawn_file_actions_addopen(fa, 0, "/dev/null", O_RDONLY, 0);
  else if (stdin_fd >= 0)
    e = posix_spawn_file_actions_adddup2(fa, stdin_fd, 0);
  if (!e && stdout_fd >= 0)
    e = posix_spawn_file_actions_adddup2(fa, stdout_fd, 1);
  if (!e && stderr_fd >= 0)
    e = posix_spawn_file_actions_adddup2(fa, stderr_fd, 2);
#ifdef GN_HAVE_SPAWN_CLOSEFROM
  if (!e)
    e = posix_spawn_file_actions_addclosefrom_np(fa, 3);
#endif
  if (!e)
    e = posix_spawnattr_setsigdefault(at, &all);
  if (!e)
    e = posix_spawnattr_setsigmask(at, &none);
  if (!e)
    e = posix_spawnattr_setflags(at, POSIX_SPAWN_SETSIGDEF | POSIX_SPAWN_SETSIGMASK);
  if (e) {
    posix_spawn_file_actions_destroy(fa);
    posix_spawnattr_destroy(at);
    return -e;
  }
  return 0;
}

/* posix_spawn: glibc starts the child with clone(CLONE_VM | CLONE_VFORK),
 * so a daemon with a large address space and many threads does not copy
 * its page tables for every runtime call, as fork() does. The parent waits
 * only until the child has exec'd (or failed to). */
static int spawn_ex(char *const *argv, int stdin_fd, bool stdin_devnull, int stdout_fd, int stderr_fd, bool new_session,
                    pid_t *ret_pid) {
  posix_spawn_file_actions_t fa;
  posix_spawnattr_t at;
  int r = spawn_setup(&fa, &at, stdin_fd, stdin_devnull, stdout_fd, stderr_fd);
  if (r < 0)
    return r;
  pid_t pid;
  int e = 0;
#ifdef POSIX_SPAWN_SETSID
  if (new_session)
    e = posix_spawnattr_setflags(&at, POSIX_SPAWN_SETSIGDEF | POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSID);
#else
  (void)new_session;
#endif
  if (!e)
    e = posix_spawn(&pid, argv[0], &fa, &at, argv, environ);
  posix_spawn_file_actions_destroy(&fa);
  posix_spawnattr_destroy(&at);
  if (e)
    return -e;
  *ret_pid = pid;
  return 0;
}

static int spawn(char *const *argv, int stdin_fd, bool stdin_devnull, int stdout_fd, int stderr_fd, pid_t *ret_pid) {
  return spawn_ex(argv, stdin_fd, stdin_devnull, stdout_fd, stderr_fd, false, ret_pid);
}

static int wait_code(pid_t pid, int options, int *ret_code) {
  int st;
  pid_t w;
  do
    w = waitpid(pid, &st, options);
  while (w < 0 && errno == EINTR);
  if (w < 0)
    return -errno;
  if (w == 0)
    return -EAGAIN;
  *ret_code = WIFEXITED(st) ? WEXITSTATUS(st) : WIFSIGNALED(st) ? 128 + WTERMSIG(st) : 255;
  return 0;
}

bool gn_runtime_has_state(const char *state_root, const char *id) {
  char path[4096];
  struct stat st;
  if (!state_root || !id_valid(id))
    return true; /* not known not to be there */
  int k = snprintf(path, sizeof path, "%s/%s", state_root, id);
  if (k < 0 || (size_t)k >= sizeof path)
    return true;
  return lstat(path, &st) == 0 || errno != ENOENT;
}

int gn_runtime_exec_io(char *const *argv, int stdin_fd, int stdout_fd, int stderr_fd, int *ret_status) {
  if (!argv || !argv[0])
    return GN_EINVAL;
  pid_t pid;
  int code, r = spawn(argv, stdin_fd, false, stdout_fd, stderr_fd, &pid);
  if (r == -ENOENT || r == -EACCES || r == -ENOEXEC || r == -ENOTDIR) {
    code = 127; /* what a shell reports for a command it cannot run */
  } else if (r < 0) {
    return r;
  } else if ((r = wait_code(pid, 0, &code)) < 0) {
    return r;
  }
  if (ret_status)
    *ret_status = code;
  return 0;
}

static int pidfd_of(pid_t pid) {
#ifdef SYS_pidfd_open
  int fd = (int)syscall(SYS_pidfd_open, pid, 0);
  return fd < 0 ? -errno : fd;
#else
  (void)pid;
  return -ENOSYS;
#endif
}

bool gn_runtime_spawn_supported(void) {
  static atomic_int known; /* 0: not tried; 1: yes; -1: no */
  int k = atomic_load(&known);
  if (!k) {
    int fd = pidfd_of(getpid());
    k = fd >= 0 ? 1 : -1;
    if (fd >= 0)
      close(fd);
    atomic_store(&known, k);
  }
  return k > 0;
}

int gn_runtime_spawn(char *const *argv, int stdout_fd, int stderr_fd, pid_t *ret_pid, int *ret_pidfd) {
  return gn_runtime_spawn_io(argv, -1, stdout_fd, stderr_fd, false, ret_pid, ret_pidfd);
}

int gn_runtime_spawn_io(char *const *argv, int stdin_fd, int stdout_fd, int stderr_fd, bool new_session, pid_t *ret_pid,
                        int *ret_pidfd) {
  if (!argv || !argv[0] || !ret_pid || !ret_pidfd)
    return GN_EINVAL;
  if (!gn_runtime_spawn_supported())
    return GN_EUNSUPPORTED;
  pid_t pid;
  int r = spawn_ex(argv, stdin_fd, stdin_fd < 0, stdout_fd, stderr_fd, new_session, &pid);
  if (r < 0)
    return r;
  /* Not reaped yet, so the pid cannot name another process. */
  int fd = pidfd_of(pid);
  if (fd < 0) {
    kill(pid, SIGKILL);
    int code;
    wait_code(pid, 0, &code);
    return fd;
  }
  *ret_pid = pid;
  *ret_pidfd = fd;
  return 0;
}

int gn_runtime_reap(pid_t pid, int *ret_status) {
  int code;
  int r = wait_code(pid, WNOHANG, &code);
  if (r == 0 && ret_status)
    *ret_status = code;
  return r;
}

int gn_runtime_exec(char **argv, int *ret_status) {
  return gn_runtime_exec_io(argv, -1, -1, -1, ret_status);
}
