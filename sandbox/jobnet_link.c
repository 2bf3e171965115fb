/* The job network's interface: creating it in the host's network namespace
 * (kernel WireGuard with ip and wg, or a wireguard-go child configured
 * through its socket), moving it into the job's namespace, addressing it
 * there, and taking it all down again. Every child runs from a fixed argv
 * (no shell) with a time limit and is reaped; every failure undoes what was
 * done.
 *
 * Why this isolates the job: WireGuard keeps its UDP socket in the namespace
 * where the interface was created (kernel) or where its process runs
 * (wireguard-go), so after the move the job's namespace holds only lo and
 * the interface, with one route, the job subnet's. A packet the job sends
 * leaves only if its destination is a peer's allowed /32, encrypted to that
 * peer; a packet arrives only if it decrypts under a peer's key and its
 * source is that peer's /32. Even a job with CAP_NET_ADMIN in its namespace
 * that adds routes or addresses reaches no one else: the host, its LAN, the
 * internet and other jobs are not peers. */
#include "jobnet_int.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/nsfs.h>
#include <net/if.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sodium.h>
#include <stdio.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#define WG_SOCK_DIR "/var/run/wireguard" /* wireguard-go's, fixed in its source */
#define CMD_TIMEOUT_MS 5000              /* one ip or wg command */
#define SOCKET_WAIT_MS 5000              /* wireguard-go's socket appearing */
#define UAPI_TIMEOUT_MS 3000             /* one exchange on that socket */
#define READY_WAIT_MS 3000               /* wireguard-go bound to its port */
#define STOP_WAIT_MS 2000                /* TERM before KILL */
#define POLL_STEP_MS 20
#define CAPTURE_MAX 1024 /* what a command printed, for the error message */
#define UAPI_REPLY_MAX 65536u
#define INPUT_MAX 60000u /* stdin of a command: less than a pipe's buffer */
#define PROC_NET_MAX (1u << 20)

struct gn_jobnet {
  char ifname[GN_JOBNET_IFNAME_MAX];
  gn_jobnet_backend backend;
  pid_t pid;    /* wireguard-go, not reaped yet; 0: none */
  int netns_fd; /* the job's network namespace */
  int host_fd;  /* the namespace the interface was made in */
  bool created; /* the interface exists (kernel) */
  bool moved;   /* it is in the job's namespace */
  uint16_t listen_port;
  uint32_t mtu;
  char ip[PATH_MAX];
};

static const char *const child_env[] = {"PATH=/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL=C", NULL};
/* Debian's wireguard-go refuses Linux without the first; the second keeps
 * its log to errors (it goes to /dev/null: a pipe we stopped reading would
 * kill it with SIGPIPE). */
static const char *const wg_go_env[] = {"WG_I_PREFER_BUGGY_USERSPACE_TO_POLISHED_KMOD=1", "LOG_LEVEL=error",
                                        "PATH=/usr/sbin:/usr/bin:/sbin:/bin", NULL};

/* An executable by name in PATH, then in the sbin folders a non-login PATH
 * often lacks (runtime.c has the same lookup, static there). */
static bool find_exec(const char *name, char *out, size_t cap) {
  const char *path = getenv("PATH");
  char buf[4096];
  snprintf(buf, sizeof buf, "%s:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", path ? path : "");
  for (char *save = NULL, *dir = strtok_r(buf, ":", &save); dir; dir = strtok_r(NULL, ":", &save)) {
    char cand[PATH_MAX];
    struct stat st;
    if (dir[0] != '/')
      continue; /* never a relative PATH entry for a root daemon */
    int k = snprintf(cand, sizeof cand, "%s/%s", dir, name);
    if (k > 0 && (size_t)k < cap && stat(cand, &st) == 0 && S_ISREG(st.st_mode) && access(cand, X_OK) == 0) {
      memcpy(out, cand, (size_t)k + 1);
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
  for (int fd = lowfd; fd < 4096; fd++)
    close(fd);
}

/* In a forked child: default dispositions and an empty mask, whatever the
 * daemon set (an ignored TERM would survive exec). Async-signal-safe only. */
static void child_signals(void) {
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = SIG_DFL;
  for (int s = 1; s < NSIG; s++)
    if (s != SIGKILL && s != SIGSTOP)
      sigaction(s, &sa, NULL);
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, NULL);
}

static int reap(pid_t pid, int options, int *ret_code) {
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

static void sleep_ms(int ms) {
  struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000L};
  while (nanosleep(&ts, &ts) < 0 && errno == EINTR) {
  }
}

typedef struct cmd {
  const char *const *argv; /* argv[0]: an absolute path */
  int netns_fd;            /* run in this network namespace; -1: the caller's thread's */
  int keep_fd;             /* handed to the command as descriptor 3; -1: none */
  const char *input;       /* standard input; NULL: /dev/null */
  size_t input_len;
  char *out; /* what it printed on stdout and stderr, cut at out_cap; may be NULL */
  size_t out_cap;
} cmd;

/* Runs one command to its end (killed after timeout_ms). 0 with its exit
 * status in *ret_code (125: could not enter the namespace, 127: could not
 * run), or a negative code. */
static int run_cmd(const cmd *c, int timeout_ms, int *ret_code) {
  int outp[2] = {-1, -1}, inp[2] = {-1, -1}, devnull = -1, kfd = -1, r = 0;
  size_t got = 0;
  if (c->input && c->input_len > INPUT_MAX)
    return GN_ETOOBIG;
  if (c->out && c->out_cap)
    c->out[0] = '\0';
  if (pipe2(outp, O_CLOEXEC) < 0 || (c->input && pipe2(inp, O_CLOEXEC) < 0) ||
      (devnull = open("/dev/null", O_RDWR | O_CLOEXEC)) < 0 ||
      (c->keep_fd >= 0 && (kfd = fcntl(c->keep_fd, F_DUPFD_CLOEXEC, 10)) < 0)) {
    r = -errno;
    goto out;
  }
  if (c->input) {
    /* Whole into the pipe before the child starts: it fits the buffer. */
    size_t off = 0;
    while (off < c->input_len) {
      ssize_t w = write(inp[1], c->input + off, c->input_len - off);
      if (w < 0 && errno == EINTR)
        continue;
      if (w <= 0) {
        r = w < 0 ? -errno : GN_EIO;
        goto out;
      }
      off += (size_t)w;
    }
    close(inp[1]);
    inp[1] = -1;
  }
  pid_t pid = fork();
  if (pid < 0) {
    r = -errno;
    goto out;
  }
  if (pid == 0) {
    child_signals();
    if (c->netns_fd >= 0 && setns(c->netns_fd, CLONE_NEWNET) < 0)
      _exit(125);
    if (dup2(c->input ? inp[0] : devnull, 0) < 0 || dup2(outp[1], 1) < 0 || dup2(outp[1], 2) < 0 ||
        (kfd >= 0 && dup2(kfd, 3) < 0))
      _exit(126);
    close_from(kfd >= 0 ? 4 : 3);
    execve(c->argv[0], (char *const *)c->argv, (char *const *)child_env);
    _exit(127);
  }
  close(outp[1]);
  outp[1] = -1;
  uint64_t deadline = gn_mono_ms() + (uint64_t)timeout_ms;
  bool killed = false;
  for (;;) {
    uint64_t now = gn_mono_ms();
    if (now >= deadline) {
      kill(pid, SIGKILL);
      killed = true;
      break;
    }
    struct pollfd pf = {.fd = outp[0], .events = POLLIN};
    int pr = poll(&pf, 1, (int)(deadline - now));
    if (pr < 0 && errno == EINTR)
      continue;
    if (pr <= 0)
      continue; /* the deadline check above ends it */
    char buf[512];
    ssize_t n = read(outp[0], buf, sizeof buf);
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0)
      break;
    if (c->out && c->out_cap > 1 && got < c->out_cap - 1) {
      size_t take = (size_t)n < c->out_cap - 1 - got ? (size_t)n : c->out_cap - 1 - got;
      memcpy(c->out + got, buf, take);
      got += take;
      c->out[got] = '\0';
    }
  }
  int code = 0;
  r = reap(pid, 0, &code);
  if (r == 0 && killed)
    r = GN_ETIMEDOUT;
  if (r == 0)
    *ret_code = code;
out:
  if (c->out && got) {
    /* One line for messages: newlines and control bytes become spaces. */
    for (size_t i = 0; i < got; i++)
      if ((unsigned char)c->out[i] < 0x20 || c->out[i] == 0x7f)
        c->out[i] = ' ';
    while (got && c->out[got - 1] == ' ')
      c->out[--got] = '\0';
  }
  int saved = errno;
  for (int i = 0; i < 2; i++) {
    if (outp[i] >= 0)
      close(outp[i]);
    if (inp[i] >= 0)
      close(inp[i]);
  }
  if (devnull >= 0)
    close(devnull);
  if (kfd >= 0)
    close(kfd);
  errno = saved;
  return r;
}

/* Runs `ip ARGS...` (in the job's namespace when netns_fd >= 0); on failure
 * writes "what: ip's message" into err. */
static int ip_run(const gn_jobnet *j, int netns_fd, int keep_fd, const char *what, const char *const *args, char *err,
                  size_t err_cap) {
  const char *argv[16];
  size_t n = 0;
  argv[n++] = j->ip;
  for (size_t i = 0; args[i] && n < 15; i++)
    argv[n++] = args[i];
  argv[n] = NULL;
  char out[CAPTURE_MAX];
  cmd c = {.argv = argv, .netns_fd = netns_fd, .keep_fd = keep_fd, .out = out, .out_cap = sizeof out};
  int code = 0, r = run_cmd(&c, CMD_TIMEOUT_MS, &code);
  if (r < 0)
    return gn__err(err, err_cap, r, "job network %s: %s: %s", j->ifname, what, gn_strerror(r));
  if (code != 0)
    return gn__err(err, err_cap, GN_EIO, "job network %s: %s failed (status %d): %s", j->ifname, what, code,
                   out[0] ? out : "no message");
  return 0;
}

/* --- wireguard-go --------------------------------------------------------*/

static void sock_path(const char *ifname, char out[sizeof(((struct sockaddr_un *)0)->sun_path)]) {
  snprintf(out, sizeof(((struct sockaddr_un *)0)->sun_path), "%s/%s.sock", WG_SOCK_DIR, ifname);
}

static int sock_connect(const char *ifname) {
  struct sockaddr_un a = {.sun_family = AF_UNIX};
  sock_path(ifname, a.sun_path);
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0)
    return -errno;
  if (connect(fd, (struct sockaddr *)&a, sizeof a) < 0) {
    int e = -errno;
    close(fd);
    return e;
  }
  return fd;
}

/* One request on wireguard-go's socket; the reply ends with an empty line
 * and its last line is errno=N. GN_EREMOTE when N is not 0. */
static int uapi_exchange(const char *ifname, const char *req, size_t req_len, char *reply, size_t cap) {
  int fd = sock_connect(ifname);
  if (fd < 0)
    return fd;
  int r = 0;
  size_t off = 0, got = 0;
  uint64_t deadline = gn_mono_ms() + UAPI_TIMEOUT_MS;
  while (off < req_len) {
    uint64_t now = gn_mono_ms();
    struct pollfd pf = {.fd = fd, .events = POLLOUT};
    if (now >= deadline || poll(&pf, 1, (int)(deadline - now)) == 0) {
      r = GN_ETIMEDOUT;
      goto out;
    }
    ssize_t w = send(fd, req + off, req_len - off, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (w < 0 && (errno == EINTR || errno == EAGAIN))
      continue;
    if (w < 0) {
      r = -errno;
      goto out;
    }
    off += (size_t)w;
  }
  for (;;) {
    if (got >= 2 && reply[got - 1] == '\n' && reply[got - 2] == '\n')
      break;
    if (got == cap - 1) {
      r = GN_ETOOBIG;
      goto out;
    }
    uint64_t now = gn_mono_ms();
    struct pollfd pf = {.fd = fd, .events = POLLIN};
    if (now >= deadline || poll(&pf, 1, (int)(deadline - now)) == 0) {
      r = GN_ETIMEDOUT;
      goto out;
    }
    ssize_t n = recv(fd, reply + got, cap - 1 - got, MSG_DONTWAIT);
    if (n < 0 && (errno == EINTR || errno == EAGAIN))
      continue;
    if (n <= 0) {
      r = n < 0 ? -errno : GN_EPROTO;
      goto out;
    }
    got += (size_t)n;
  }
  reply[got] = '\0';
  /* The last line before the blank one. */
  reply[got - 2] = '\0';
  char *last = strrchr(reply, '\n');
  last = last ? last + 1 : reply;
  if (strncmp(last, "errno=", 6) != 0)
    r = GN_EPROTO;
  else if (strcmp(last + 6, "0") != 0)
    r = GN_EREMOTE;
out:
  close(fd);
  return r;
}

/* listen_port from a get=1 reply; 0 when it has none yet. */
static int uapi_listen_port(const char *ifname, uint16_t *ret) {
  char *reply = malloc(UAPI_REPLY_MAX);
  if (!reply)
    return GN_ENOMEM;
  static const char req[] = "get=1\n\n";
  int r = uapi_exchange(ifname, req, sizeof req - 1, reply, UAPI_REPLY_MAX);
  unsigned long port = 0;
  for (char *save = NULL, *line = r == 0 ? strtok_r(reply, "\n", &save) : NULL; line;
       line = strtok_r(NULL, "\n", &save)) {
    if (strncmp(line, "listen_port=", 12) == 0) {
      char *end;
      errno = 0;
      port = strtoul(line + 12, &end, 10);
      if (errno || *end || port > 65535)
        r = GN_EPROTO;
      break;
    }
  }
  /* A get reply holds the private key. */
  sodium_memzero(reply, UAPI_REPLY_MAX);
  free(reply);
  if (r == 0)
    *ret = (uint16_t)port;
  return r;
}

/* True when the process's network namespace has a UDP socket on port
 * (/proc/PID/net/udp and udp6: "sl local_address:PORT ..."). */
static bool udp_bound(pid_t pid, uint16_t port) {
  char path[64], want[8];
  snprintf(want, sizeof want, ":%04X ", (unsigned)port);
  for (int v6 = 0; v6 < 2; v6++) {
    snprintf(path, sizeof path, "/proc/%d/net/udp%s", (int)pid, v6 ? "6" : "");
    FILE *f = fopen(path, "re");
    if (!f)
      continue;
    char line[512];
    size_t total = 0;
    bool found = false;
    while (!found && total < PROC_NET_MAX && fgets(line, sizeof line, f)) {
      total += strlen(line);
      char *local = strchr(line, ':'); /* after "sl" */
      if (!local)
        continue;
      local++;
      while (*local == ' ')
        local++;
      char *sp = strchr(local, ' ');
      if (!sp)
        continue;
      /* local is HEXADDR:PORT; compare ":PORT " */
      char *colon = strchr(local, ':');
      if (colon && colon < sp && strncmp(colon, want, strlen(want)) == 0)
        found = true;
    }
    fclose(f);
    if (found)
      return true;
  }
  return false;
}

static int wg_go_start(gn_jobnet *j, const gn_jobnet_config *cfg, char *err, size_t err_cap) {
  char exe[PATH_MAX];
  if (!find_exec("wireguard-go", exe, sizeof exe))
    return gn__err(err, err_cap, GN_EUNSUPPORTED,
                   "job network %s: no WireGuard module and no wireguard-go (Debian package wireguard-go)", j->ifname);
  char path[sizeof(((struct sockaddr_un *)0)->sun_path)];
  struct stat st;
  sock_path(j->ifname, path);
  if (lstat(path, &st) == 0) {
    int fd = sock_connect(j->ifname);
    if (fd >= 0) {
      close(fd);
      return gn__err(err, err_cap, GN_EEXIST, "job network %s: a wireguard-go already serves %s", j->ifname, path);
    }
    if (!S_ISSOCK(st.st_mode) || unlink(path) < 0)
      return gn__err(err, err_cap, GN_EEXIST, "job network %s: %s is in the way", j->ifname, path);
  }
  int devnull = open("/dev/null", O_RDWR | O_CLOEXEC);
  if (devnull < 0)
    return gn__err(err, err_cap, -errno, "job network %s: /dev/null: %s", j->ifname, strerror(errno));
  const char *argv[] = {exe, "-f", j->ifname, NULL}; /* -f: stay our child, so we can stop and reap it */
  pid_t pid = fork();
  if (pid < 0) {
    int e = -errno;
    close(devnull);
    return gn__err(err, err_cap, e, "job network %s: fork: %s", j->ifname, strerror(-e));
  }
  if (pid == 0) {
    child_signals();
    if (dup2(devnull, 0) < 0 || dup2(devnull, 1) < 0 || dup2(devnull, 2) < 0)
      _exit(126);
    close_from(3);
    execve(argv[0], (char *const *)argv, (char *const *)wg_go_env);
    _exit(127);
  }
  close(devnull);
  j->pid = pid;
  /* Its socket appears once the TUN device exists. */
  uint64_t deadline = gn_mono_ms() + SOCKET_WAIT_MS;
  for (;;) {
    int code;
    if (reap(pid, WNOHANG, &code) == 0) {
      j->pid = 0;
      return gn__err(err, err_cap, GN_EIO, "job network %s: wireguard-go exited with status %d before it was ready",
                     j->ifname, code);
    }
    int fd = sock_connect(j->ifname);
    if (fd >= 0) {
      close(fd);
      break;
    }
    if (gn_mono_ms() >= deadline)
      return gn__err(err, err_cap, GN_ETIMEDOUT, "job network %s: wireguard-go's socket did not appear within %d ms",
                     j->ifname, SOCKET_WAIT_MS);
    sleep_ms(POLL_STEP_MS);
  }
  /* The configuration, private key included, goes only through the socket
   * (0600 in a root-only folder), in guarded memory wiped after. */
  size_t cap = 1024 + (size_t)cfg->peer_count * 512, len = 0;
  char *req = sodium_malloc(cap), reply[256];
  if (!req)
    return gn__err(err, err_cap, GN_ENOMEM, "job network %s: out of memory", j->ifname);
  int r = gn_jobnet_uapi_set_text(cfg, req, cap, &len);
  if (r == 0)
    r = uapi_exchange(j->ifname, req, len, reply, sizeof reply);
  sodium_free(req);
  if (r < 0)
    return gn__err(err, err_cap, r, "job network %s: wireguard-go refused its configuration: %s", j->ifname,
                   gn_strerror(r));
  return 0;
}

/* wireguard-go binds its port once it sees the interface up, which across
 * namespaces it learns by polling its TUN device once a second. Returns
 * when it has (so the network carries traffic when gn_jobnet_up returns). */
static int wg_go_ready(gn_jobnet *j, char *err, size_t err_cap) {
  uint64_t deadline = gn_mono_ms() + READY_WAIT_MS;
  for (;;) {
    uint16_t port = 0;
    int code, r = uapi_listen_port(j->ifname, &port);
    if (r == 0 && port && udp_bound(j->pid, port)) {
      j->listen_port = port;
      return 0;
    }
    if (reap(j->pid, WNOHANG, &code) == 0) {
      j->pid = 0;
      return gn__err(err, err_cap, GN_EIO, "job network %s: wireguard-go exited with status %d", j->ifname, code);
    }
    if (gn_mono_ms() >= deadline)
      return gn__err(err, err_cap, GN_ETIMEDOUT, "job network %s: wireguard-go did not bind its UDP port within %d ms",
                     j->ifname, READY_WAIT_MS);
    sleep_ms(POLL_STEP_MS * 2);
  }
}

/* --- kernel WireGuard (untested here: no wireguard module on this
 * project's machines; written from ip-link(8) and wg(8)) ------------------*/

static int kernel_start(gn_jobnet *j, const gn_jobnet_config *cfg, const char *wg, char *err, size_t err_cap) {
  size_t cap = 1024 + (size_t)cfg->peer_count * 512, len = 0;
  char *conf = sodium_malloc(cap), out[CAPTURE_MAX];
  if (!conf)
    return gn__err(err, err_cap, GN_ENOMEM, "job network %s: out of memory", j->ifname);
  int code = 0, r = gn__jobnet_wg_conf_text(cfg, conf, cap, &len);
  if (r == 0) {
    /* `wg setconf IF /dev/stdin`: the key through a pipe, not argv. */
    const char *argv[] = {wg, "setconf", j->ifname, "/dev/stdin", NULL};
    cmd c = {.argv = argv,
             .netns_fd = j->host_fd,
             .keep_fd = -1,
             .input = conf,
             .input_len = len,
             .out = out,
             .out_cap = sizeof out};
    r = run_cmd(&c, CMD_TIMEOUT_MS, &code);
  }
  sodium_free(conf);
  if (r < 0)
    return gn__err(err, err_cap, r, "job network %s: wg setconf: %s", j->ifname, gn_strerror(r));
  if (code != 0)
    return gn__err(err, err_cap, GN_EIO, "job network %s: wg setconf failed (status %d): %s", j->ifname, code, out);
  return 0;
}

static int kernel_ready(gn_jobnet *j, const char *wg, char *err, size_t err_cap) {
  char out[64];
  const char *argv[] = {wg, "show", j->ifname, "listen-port", NULL};
  cmd c = {.argv = argv, .netns_fd = j->netns_fd, .keep_fd = -1, .out = out, .out_cap = sizeof out};
  int code = 0, r = run_cmd(&c, CMD_TIMEOUT_MS, &code);
  char *end;
  unsigned long port = r == 0 && code == 0 ? strtoul(out, &end, 10) : 0;
  if (!port || port > 65535)
    return gn__err(err, err_cap, r < 0 ? r : GN_EIO, "job network %s: wg show listen-port: %s", j->ifname,
                   r < 0 ? gn_strerror(r) : out);
  j->listen_port = (uint16_t)port;
  return 0;
}

/* --- up and down ---------------------------------------------------------*/

static int open_netns(const char *path, char *err, size_t err_cap) {
  if (!path || path[0] != '/' || strnlen(path, PATH_MAX) >= PATH_MAX)
    return gn__err(err, err_cap, GN_EINVAL, "job network: the job's namespace must be an absolute path");
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return gn__err(err, err_cap, -errno, "job network: %s: %s", path, strerror(errno));
  struct stat a, b;
  int type = ioctl(fd, NS_GET_NSTYPE);
  if (type != CLONE_NEWNET) {
    close(fd);
    return gn__err(err, err_cap, GN_EINVAL, "job network: %s is not a network namespace", path);
  }
  /* Moving the interface into our own namespace would give the job nothing
   * and the host a WireGuard interface anyone's job could steer. */
  if (fstat(fd, &a) < 0 || stat("/proc/thread-self/ns/net", &b) < 0 || (a.st_dev == b.st_dev && a.st_ino == b.st_ino)) {
    close(fd);
    return gn__err(err, err_cap, GN_EINVAL, "job network: %s is the host's own network namespace", path);
  }
  return fd;
}

int gn_jobnet_up(const gn_jobnet_config *cfg, const char *netns_path, gn_jobnet **ret, char *err, size_t err_cap) {
  if (!ret)
    return gn__err(err, err_cap, GN_EINVAL, "job network: no result pointer");
  int r = gn_jobnet_config_validate(cfg, err, err_cap);
  if (r < 0)
    return r;
  gn_jobnet *j = calloc(1, sizeof *j);
  if (!j)
    return gn__err(err, err_cap, GN_ENOMEM, "job network: out of memory");
  j->netns_fd = j->host_fd = -1;
  memcpy(j->ifname, cfg->ifname, sizeof j->ifname);
  char wg[PATH_MAX];
  bool have_wg = find_exec("wg", wg, sizeof wg);
  if (!find_exec("ip", j->ip, sizeof j->ip)) {
    r = gn__err(err, err_cap, GN_EUNSUPPORTED, "job network %s: no ip (Debian package iproute2)", j->ifname);
    goto fail;
  }
  if ((r = open_netns(netns_path, err, err_cap)) < 0)
    goto fail;
  j->netns_fd = r;
  if ((j->host_fd = open("/proc/thread-self/ns/net", O_RDONLY | O_CLOEXEC)) < 0) {
    r = gn__err(err, err_cap, -errno, "job network %s: our own namespace: %s", j->ifname, strerror(errno));
    goto fail;
  }
  if (if_nametoindex(j->ifname) != 0) {
    r = gn__err(err, err_cap, GN_EEXIST, "job network %s: an interface of that name exists on the host", j->ifname);
    goto fail;
  }
  j->mtu = cfg->mtu;
  if (!j->mtu && (r = gn_jobnet_choose_mtu(cfg, &j->mtu)) < 0) {
    r = gn__err(err, err_cap, r, "job network %s: no path to a peer's endpoint: %s", j->ifname, gn_strerror(r));
    goto fail;
  }

  /* Kernel WireGuard when asked or when it is there (and wg to configure it). */
  j->backend = GN_JOBNET_USERSPACE;
  if (cfg->backend != GN_JOBNET_USERSPACE) {
    const char *add[] = {"link", "add", "dev", j->ifname, "type", "wireguard", NULL};
    if (!have_wg && cfg->backend == GN_JOBNET_KERNEL) {
      r = gn__err(err, err_cap, GN_EUNSUPPORTED, "job network %s: no wg (Debian package wireguard-tools)", j->ifname);
      goto fail;
    }
    if (have_wg && (r = ip_run(j, j->host_fd, -1, "ip link add type wireguard", add, err, err_cap)) == 0) {
      j->backend = GN_JOBNET_KERNEL;
      j->created = true;
    } else if (cfg->backend == GN_JOBNET_KERNEL) {
      goto fail;
    }
  }
  if (j->backend == GN_JOBNET_KERNEL)
    r = kernel_start(j, cfg, wg, err, err_cap);
  else
    r = wg_go_start(j, cfg, err, err_cap);
  if (r < 0)
    goto fail;

  /* The MTU is set in the host's namespace, where wireguard-go listens for
   * changes; it stays with the interface when it moves. */
  char mtu[16], host[INET_ADDRSTRLEN], addr[INET_ADDRSTRLEN + 8];
  snprintf(mtu, sizeof mtu, "%u", (unsigned)j->mtu);
  inet_ntop(AF_INET, &cfg->address, host, sizeof host);
  snprintf(addr, sizeof addr, "%s/%u", host, (unsigned)cfg->prefix_len);
  const char *set_mtu[] = {"link", "set", "dev", j->ifname, "mtu", mtu, NULL};
  /* The namespace by descriptor: ip opens /proc/self/fd/3, our open one,
   * so the path cannot be swapped between our check and the move. */
  const char *move[] = {"link", "set", "dev", j->ifname, "netns", "/proc/self/fd/3", NULL};
  const char *no_ll[] = {"link", "set", "dev", j->ifname, "addrgenmode", "none", NULL};
  const char *add_addr[] = {"address", "add", addr, "dev", j->ifname, NULL};
  const char *set_up[] = {"link", "set", "dev", j->ifname, "up", NULL};
  if ((r = ip_run(j, j->host_fd, -1, "setting the MTU", set_mtu, err, err_cap)) < 0 ||
      (r = ip_run(j, j->host_fd, j->netns_fd, "moving the interface into the job's namespace", move, err, err_cap)) < 0)
    goto fail;
  j->moved = true;
  /* No IPv6 link-local address: the job network is IPv4 /32s only. Best
   * effort (a kernel without IPv6 refuses it and needs nothing). */
  ip_run(j, j->netns_fd, -1, "addrgenmode", no_ll, NULL, 0);
  /* The address brings the subnet's route, the namespace's only one. */
  if ((r = ip_run(j, j->netns_fd, -1, "adding the rank's address", add_addr, err, err_cap)) < 0 ||
      (r = ip_run(j, j->netns_fd, -1, "bringing the interface up", set_up, err, err_cap)) < 0)
    goto fail;
  r = j->backend == GN_JOBNET_KERNEL ? kernel_ready(j, wg, err, err_cap) : wg_go_ready(j, err, err_cap);
  if (r < 0)
    goto fail;
  *ret = j;
  return 0;
fail:
  gn_jobnet_down(j);
  return r;
}

gn_jobnet *gn_jobnet_down(gn_jobnet *j) {
  if (!j)
    return NULL;
  int code;
  if (j->pid > 0) {
    /* TERM lets wireguard-go close its device and remove its socket. */
    kill(j->pid, SIGTERM);
    uint64_t deadline = gn_mono_ms() + STOP_WAIT_MS;
    while (reap(j->pid, WNOHANG, &code) == -EAGAIN) {
      if (gn_mono_ms() >= deadline) {
        kill(j->pid, SIGKILL);
        reap(j->pid, 0, &code);
        break;
      }
      sleep_ms(10);
    }
    j->pid = 0;
    /* Killed: its socket stays behind. The TUN device went with its
     * descriptor, wherever it was. */
    char path[sizeof(((struct sockaddr_un *)0)->sun_path)];
    struct stat st;
    sock_path(j->ifname, path);
    if (lstat(path, &st) == 0 && S_ISSOCK(st.st_mode)) {
      int fd = sock_connect(j->ifname);
      if (fd < 0)
        unlink(path);
      else
        close(fd); /* someone else's now: leave it */
    }
  }
  if (j->backend == GN_JOBNET_KERNEL && j->created) {
    const char *del[] = {"link", "del", "dev", j->ifname, NULL};
    /* Gone already when the job's namespace ended. */
    ip_run(j, j->moved ? j->netns_fd : j->host_fd, -1, "deleting the interface", del, NULL, 0);
  }
  if (j->netns_fd >= 0)
    close(j->netns_fd);
  if (j->host_fd >= 0)
    close(j->host_fd);
  free(j);
  return NULL;
}

const char *gn_jobnet_ifname_of(const gn_jobnet *j) {
  return j ? j->ifname : NULL;
}

gn_jobnet_backend gn_jobnet_backend_of(const gn_jobnet *j) {
  return j ? j->backend : GN_JOBNET_AUTO;
}

uint16_t gn_jobnet_listen_port(const gn_jobnet *j) {
  return j ? j->listen_port : 0;
}

uint32_t gn_jobnet_mtu(const gn_jobnet *j) {
  return j ? j->mtu : 0;
}

pid_t gn_jobnet_pid(const gn_jobnet *j) {
  return j ? j->pid : 0;
}
