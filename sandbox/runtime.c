/* The OCI runtime: finding a working runc or crun, building their command
 * lines, and a blocking fork/exec/wait helper for tests and cleanup.
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
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#define VERSION_TIMEOUT_MS 5000
#define ID_MAX 128

static bool cgroup2_unified(void) {
  struct statfs sf;
  return statfs("/sys/fs/cgroup", &sf) == 0 && (long)sf.f_type == CGROUP2_SUPER_MAGIC;
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
    return 0;
  }
  const char *first = cgroup2_unified() ? "crun" : "runc";
  const char *second = cgroup2_unified() ? "runc" : "crun";
  if (try_runtime(first, ret) == 0 || try_runtime(second, ret) == 0)
    return 0;
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

int gn_runtime_exec_io(char *const *argv, int stdin_fd, int stdout_fd, int stderr_fd, int *ret_status) {
  if (!argv || !argv[0])
    return GN_EINVAL;
  pid_t pid = fork();
  if (pid < 0)
    return -errno;
  if (pid == 0) {
    /* dup2 first into high numbers would be needed if the caller passed
     * 0..2 crossed; callers pass files they opened, which are >= 3. */
    if (stdin_fd >= 0 && dup2(stdin_fd, 0) < 0)
      _exit(126);
    if (stdout_fd >= 0 && dup2(stdout_fd, 1) < 0)
      _exit(126);
    if (stderr_fd >= 0 && dup2(stderr_fd, 2) < 0)
      _exit(126);
    close_from(3);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    execv(argv[0], argv);
    _exit(127);
  }
  int st;
  while (waitpid(pid, &st, 0) < 0) {
    if (errno != EINTR)
      return -errno;
  }
  int code = WIFEXITED(st) ? WEXITSTATUS(st) : WIFSIGNALED(st) ? 128 + WTERMSIG(st) : 255;
  if (ret_status)
    *ret_status = code;
  return 0;
}

int gn_runtime_exec(char **argv, int *ret_status) {
  return gn_runtime_exec_io(argv, -1, -1, -1, ret_status);
}
