/* gpunet exec and gpunet shell: a process in a lease's sandbox with its
 * stdio, or a terminal, carried through gpunetd (DATA_DIR/gpunetd-exec.sock,
 * the framed protocol of node/exec_req.c) over the lease's session. The
 * terminal is put in raw mode only for a remote tty on a local tty, and is
 * restored on every way out (exit, atexit, the signals that end us). */
#include "cli.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <termios.h>
#include <time.h>
#include <unistd.h>

#define EXEC_FAIL 125 /* gpunet itself failed (as docker exec): never the command's code */
#define FRAME_MAX 65536
#define OUTBUF_MAX (256 * 1024)

static struct termios saved_tio;
static bool raw_on;
static int sig_pipe[2] = {-1, -1};
/* A signal that ends us while a write to our stdout is stuck (nobody
 * reads it): the loop cannot pass it on, so it ends the session. */
static volatile sig_atomic_t term_sig;

static void tty_restore(void) {
  if (raw_on) {
    tcsetattr(STDIN_FILENO, TCSAFLUSH, &saved_tio);
    raw_on = false;
  }
}

static void on_signal(int sig) {
  int e = errno;
  if (sig != SIGWINCH)
    term_sig = sig;
  unsigned char b = (unsigned char)sig;
  if (sig_pipe[1] >= 0 && write(sig_pipe[1], &b, 1) < 0) {
  }
  errno = e;
}

static void tty_raw(void) {
  struct termios t;
  if (tcgetattr(STDIN_FILENO, &saved_tio) < 0)
    return;
  t = saved_tio;
  cfmakeraw(&t);
  if (tcsetattr(STDIN_FILENO, TCSAFLUSH, &t) == 0) {
    raw_on = true;
    atexit(tty_restore);
  }
}

static void winsize(int *rows, int *cols) {
  struct winsize ws;
  *rows = 24;
  *cols = 80;
  for (int fd = 0; fd <= 2; fd++)
    if (ioctl(fd, TIOCGWINSZ, &ws) == 0 && ws.ws_row && ws.ws_col) {
      *rows = ws.ws_row;
      *cols = ws.ws_col;
      return;
    }
}

static bool write_all(int fd, const void *p, size_t n) {
  const char *b = p;
  while (n) {
    ssize_t k = write(fd, b, n);
    if (k < 0 && errno == EINTR && term_sig)
      return false;
    if (k < 0 && errno == EINTR)
      continue;
    if (k < 0 && errno == EAGAIN) {
      struct pollfd pf = {.fd = fd, .events = POLLOUT};
      poll(&pf, 1, -1);
      continue;
    }
    if (k <= 0)
      return false;
    b += k;
    n -= (size_t)k;
  }
  return true;
}

/* Frames to the daemon wait here, so that the CLI always reads what the
 * daemon sends while its own writes are held up. */
typedef struct outq {
  char *p;
  size_t len, cap;
} outq;

static bool out_frame(outq *q, char type, const void *p, size_t n) {
  if (q->len + 5 + n > q->cap) {
    size_t cap = q->cap ? q->cap : 8192;
    while (cap < q->len + 5 + n)
      cap *= 2;
    char *b = realloc(q->p, cap);
    if (!b)
      return false;
    q->p = b;
    q->cap = cap;
  }
  char *h = q->p + q->len;
  h[0] = type;
  h[1] = (char)(n >> 24);
  h[2] = (char)(n >> 16);
  h[3] = (char)(n >> 8);
  h[4] = (char)n;
  if (n)
    memcpy(h + 5, p, n);
  q->len += 5 + n;
  return true;
}

static int connect_exec(const cli *c) {
  struct sockaddr_un a = {.sun_family = AF_UNIX};
  int k = snprintf(a.sun_path, sizeof a.sun_path, "%s/gpunetd-exec.sock", c->data_dir);
  if (k < 0 || (size_t)k >= sizeof a.sun_path) {
    fprintf(stderr, "gpunet: the data dir's path is too long for a socket: %s\n", c->data_dir);
    return -1;
  }
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof a) < 0) {
    fprintf(stderr, "gpunet: cannot reach gpunetd at %s: %s (is gpunetd running? gpunet status)\n", a.sun_path,
            strerror(errno));
    if (fd >= 0)
      close(fd);
    return -1;
  }
  return fd;
}

/* Runs one exec session; returns the remote exit code or EXEC_FAIL. */
static int exec_session(cli *c, const char *lease, const char *job, json_t *cmd, json_t *env, bool in, bool tty) {
  int rows, cols, rc = EXEC_FAIL;
  winsize(&rows, &cols);
  json_t *req = json_pack("{s:s, s:O, s:O, s:b, s:i, s:i}", "lease", lease, "cmd", cmd, "env", env, "tty", tty, "rows",
                          rows, "cols", cols);
  if (job)
    json_object_set_new(req, "job", json_string(job));
  char *body = req ? json_dumps(req, JSON_COMPACT) : NULL;
  json_decref(req);
  int fd = body ? connect_exec(c) : -1;
  outq q = {0};
  char *in_buf = malloc(FRAME_MAX + 5);
  size_t in_len = 0;
  bool stdin_open = in, got_exit = false;
  if (!body || fd < 0 || !in_buf || !out_frame(&q, 'o', body, strlen(body)))
    goto out;
  if (!in)
    out_frame(&q, 'e', NULL, 0);
  if (pipe2(sig_pipe, O_CLOEXEC | O_NONBLOCK) < 0)
    goto out;
  struct sigaction sa = {.sa_handler = on_signal};
  sigemptyset(&sa.sa_mask);
  int sigs[] = {SIGWINCH, SIGINT, SIGTERM, SIGHUP, SIGQUIT};
  for (size_t i = 0; i < sizeof sigs / sizeof sigs[0]; i++)
    sigaction(sigs[i], &sa, NULL);
  signal(SIGPIPE, SIG_IGN);
  fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
  if (tty && isatty(STDIN_FILENO) && in)
    tty_raw();
  for (;;) {
    struct pollfd pf[3] = {{.fd = fd, .events = POLLIN | (q.len ? POLLOUT : 0)},
                           {.fd = sig_pipe[0], .events = POLLIN},
                           {.fd = stdin_open && q.len < OUTBUF_MAX ? STDIN_FILENO : -1, .events = POLLIN}};
    if (poll(pf, 3, -1) < 0) {
      if (errno == EINTR)
        continue;
      break;
    }
    if (pf[1].revents & POLLIN) {
      unsigned char s;
      while (read(sig_pipe[0], &s, 1) == 1) {
        if (s == SIGWINCH && tty) {
          winsize(&rows, &cols);
          unsigned char w[4] = {(unsigned char)(rows >> 8), (unsigned char)rows, (unsigned char)(cols >> 8),
                                (unsigned char)cols};
          out_frame(&q, 'w', w, 4);
        } else if (s == SIGINT || s == SIGTERM) {
          term_sig = 0;              /* handled here */
          out_frame(&q, 's', &s, 1); /* the remote process gets it; its exit ends us */
        } else if (s == SIGHUP || s == SIGQUIT) {
          rc = 128 + s; /* closing the connection ends the remote process */
          goto out;
        }
      }
    }
    if (pf[2].revents & (POLLIN | POLLHUP | POLLERR)) {
      char b[32768];
      ssize_t k = read(STDIN_FILENO, b, sizeof b);
      if (k > 0) {
        out_frame(&q, 'd', b, (size_t)k);
      } else if (k == 0 || (errno != EINTR && errno != EAGAIN)) {
        stdin_open = false;
        out_frame(&q, 'e', NULL, 0);
      }
    }
    if ((pf[0].revents & POLLOUT) && q.len) {
      ssize_t k = write(fd, q.p, q.len);
      if (k > 0) {
        memmove(q.p, q.p + k, q.len - (size_t)k);
        q.len -= (size_t)k;
      } else if (k < 0 && errno != EAGAIN && errno != EINTR) {
        break;
      }
    }
    if (pf[0].revents & (POLLIN | POLLHUP | POLLERR)) {
      ssize_t k = read(fd, in_buf + in_len, FRAME_MAX + 5 - in_len);
      if (k < 0 && (errno == EAGAIN || errno == EINTR))
        continue;
      if (k <= 0)
        break;
      in_len += (size_t)k;
      size_t off = 0;
      while (in_len - off >= 5) {
        const unsigned char *h = (const unsigned char *)in_buf + off;
        size_t len = (size_t)h[1] << 24 | (size_t)h[2] << 16 | (size_t)h[3] << 8 | h[4];
        if (len > FRAME_MAX) {
          tty_restore();
          fprintf(stderr, "gpunet: gpunetd sent a frame over 64 KiB\n");
          goto out;
        }
        if (in_len - off < 5 + len)
          break;
        const char *p = (const char *)h + 5;
        if ((h[0] == 'd' || h[0] == 'f') && !write_all(h[0] == 'd' ? STDOUT_FILENO : STDERR_FILENO, p, len)) {
          rc = term_sig ? 128 + term_sig : EXEC_FAIL; /* closing ends the remote process */
          goto out;
        } else if (h[0] == 'x' && len >= 4) {
          int32_t code = (int32_t)((uint32_t)h[5] << 24 | (uint32_t)h[6] << 16 | (uint32_t)h[7] << 8 | h[8]);
          tty_restore();
          if (len > 4)
            fprintf(stderr, "gpunet: %s%.*s\n", code < 0 ? "" : "exec ended: ", (int)(len - 4), p + 4);
          rc = code < 0 ? EXEC_FAIL : code;
          got_exit = true;
          goto out;
        }
        off += 5 + len;
      }
      memmove(in_buf, in_buf + off, in_len - off);
      in_len -= off;
    }
  }
  tty_restore();
  if (!got_exit)
    fprintf(stderr, "gpunet: the connection to gpunetd closed before the command ended\n");
out:
  tty_restore();
  if (fd >= 0)
    close(fd);
  free(body);
  free(in_buf);
  free(q.p);
  return rc;
}

static const struct option exec_longs[] = {
    {"help", no_argument, NULL, 'h'},      {"interactive", no_argument, NULL, 'i'}, {"tty", no_argument, NULL, 't'},
    {"job", required_argument, NULL, 'j'}, {"env", required_argument, NULL, 'e'},   {NULL, 0, NULL, 0}};
const cli_opts cli_exec_opts = {":hitj:e:", exec_longs};
static const struct option shell_longs[] = {{"help", no_argument, NULL, 'h'},
                                            {"job", required_argument, NULL, 'j'},
                                            {"image", required_argument, NULL, 'm'},
                                            {NULL, 0, NULL, 0}};
const cli_opts cli_shell_opts = {":hj:m:", shell_longs};

/* The lease's newest running job of this node, and the image of its newest
 * job of any state (for a shell's keeper job); either may be NULL. */
static int lease_jobs(cli *c, const char *lease, char **ret_running, char **ret_image) {
  json_t *j = NULL;
  *ret_running = *ret_image = NULL;
  int rc = cli_call(c, "GET", "/v1/jobs", NULL, &j);
  if (rc != CLI_OK)
    return rc;
  int64_t best_run = -1, best_any = -1;
  json_t *arr = json_object_get(j, "jobs"), *it;
  size_t i;
  json_array_foreach(arr, i, it) {
    const char *l = cli_str(it, "lease"), *id = cli_str(it, "id"), *st = cli_str(it, "state"),
               *role = cli_str(it, "role"), *img = cli_str(it, "image");
    int64_t t = cli_int(it, "created_s", 0);
    if (!l || !id || !st || strcmp(l, lease) != 0 || (role && strcmp(role, "requester") != 0))
      continue;
    if (strcmp(st, "running") == 0 && t > best_run) {
      best_run = t;
      free(*ret_running);
      *ret_running = strdup(id);
    }
    if (img && t > best_any) {
      best_any = t;
      free(*ret_image);
      *ret_image = strdup(img);
    }
  }
  json_decref(j);
  return CLI_OK;
}

static int parse_exec(const char *name, char **argv, int dd, bool is_shell, const char **job, const char **image,
                      bool *in, bool *tty, json_t *env) {
  int o;
  optind = 0;
  opterr = 0;
  const cli_opts *opts = is_shell ? &cli_shell_opts : &cli_exec_opts;
  while ((o = getopt_long(dd, argv, opts->shorts, opts->longs, NULL)) != -1) {
    switch (o) {
    case 'h':
      return cli_print_usage(cli_find_cmd(name));
    case 'i':
      *in = true;
      break;
    case 't':
      *tty = true;
      break;
    case 'j':
      if (cli_check_id(name, "job", optarg) >= 0)
        return CLI_USAGE;
      *job = optarg;
      break;
    case 'm':
      *image = optarg;
      break;
    case 'e':
      if (cli_check_env(name, optarg) >= 0)
        return CLI_USAGE;
      if (json_array_size(env) == 64)
        return cli_usage_error(name, "more than 64 --env variables");
      json_array_append_new(env, json_string(optarg));
      break;
    default:
      return cli_bad_option(name, o, argv);
    }
  }
  return -1;
}

int cmd_exec(cli *c, int argc, char **argv) {
  int dd = argc;
  for (int i = 1; i < argc; i++)
    if (strcmp(argv[i], "--") == 0) {
      dd = i;
      break;
    }
  const char *job = NULL, *image = NULL;
  bool in = false, tty = false;
  json_t *env = json_array(), *cmd = json_array();
  int rc = parse_exec("exec", argv, dd, false, &job, &image, &in, &tty, env);
  if (rc >= 0)
    goto out;
  if (optind != dd - 1 || dd >= argc - 1) {
    rc = cli_usage_error("exec", "expected LEASE -- CMD [ARGS...]");
    goto out;
  }
  const char *lease = argv[optind];
  if ((rc = cli_check_id("exec", "lease", lease)) >= 0)
    goto out;
  if (argc - dd - 1 > 64) {
    rc = cli_usage_error("exec", "more than 64 command words");
    goto out;
  }
  for (int i = dd + 1; i < argc; i++)
    if (strlen(argv[i]) > 4096 || json_array_append_new(cmd, json_string(argv[i])) < 0) {
      rc = cli_usage_error("exec", "command word %d is over 4096 bytes or not UTF-8", i - dd);
      goto out;
    }
  const char *term = getenv("TERM");
  if (tty && term && term[0] && strlen(term) < 128)
    json_array_append_new(env, json_sprintf("TERM=%s", term));
  rc = exec_session(c, lease, job, cmd, env, in, tty);
out:
  json_decref(env);
  json_decref(cmd);
  return rc;
}

/* Waits for a job to run; false when it ended or failed first. */
static bool wait_running(cli *c, const char *job_id) {
  char *path = cli_path("/v1/jobs", job_id, "");
  for (int i = 0; path && i < 1200; i++) { /* 120 s: a first pull takes a while */
    json_t *j = NULL;
    if (cli_call(c, "GET", path, NULL, &j) != CLI_OK)
      break;
    const char *st = cli_str(json_object_get(j, "job"), "state");
    bool run = st && strcmp(st, "running") == 0;
    bool over = !st || !(strcmp(st, "pending") == 0 || strcmp(st, "pulling") == 0 || run);
    if (over)
      fprintf(stderr, "gpunet: the shell's job %s is %s%s%s\n", job_id, st ? st : "gone",
              cli_str(json_object_get(j, "job"), "error") ? ": " : "",
              cli_str(json_object_get(j, "job"), "error") ? cli_str(json_object_get(j, "job"), "error") : "");
    json_decref(j);
    if (run) {
      free(path);
      return true;
    }
    if (over)
      break;
    struct timespec ts = {0, 100 * 1000 * 1000};
    nanosleep(&ts, NULL);
  }
  free(path);
  return false;
}

int cmd_shell(cli *c, int argc, char **argv) {
  const char *job = NULL, *image = NULL;
  bool in = true, tty = true;
  json_t *env = json_array(), *cmd = NULL;
  char *running = NULL, *last_image = NULL, *keeper = NULL;
  int rc = parse_exec("shell", argv, argc, true, &job, &image, &in, &tty, env);
  if (rc >= 0)
    goto out;
  if ((rc = cli_want_args(argc, argv, 1, "LEASE")) >= 0)
    goto out;
  const char *lease = argv[optind];
  if ((rc = cli_check_id("shell", "lease", lease)) >= 0)
    goto out;
  rc = EXEC_FAIL;
  if (!job) {
    if (lease_jobs(c, lease, &running, &last_image) != CLI_OK)
      goto out;
    job = image ? NULL : running;
  }
  if (!job) {
    /* No job to join: one that only keeps the sandbox up, stopped after. */
    const char *img = image ? image : last_image;
    if (!img) {
      rc = cli_usage_error("shell",
                           "lease %s has no running job and no earlier one to take the image from; "
                           "give --image REF",
                           lease);
      goto out;
    }
    json_t *body = json_pack("{s:s, s:s, s:[s,s,s]}", "lease", lease, "image", img, "cmd", "sh", "-c",
                             "trap 'exit 0' TERM; while :; do sleep 1; done");
    json_t *ans = NULL;
    if (cli_call(c, "POST", "/v1/jobs", body, &ans) != CLI_OK)
      goto out;
    const char *id = cli_str(json_object_get(ans, "job"), "id");
    keeper = id ? strdup(id) : NULL;
    json_decref(ans);
    if (!keeper) {
      fprintf(stderr, "gpunet: gpunetd started no job for the shell\n");
      goto out;
    }
    if (!wait_running(c, keeper))
      goto stop;
    job = keeper;
  }
  cmd = json_pack("[s,s,s]", "/bin/sh", "-c",
                  "if command -v bash >/dev/null 2>&1; then exec bash -l; else exec sh -l; fi");
  const char *term = getenv("TERM");
  if (term && term[0] && strlen(term) < 128)
    json_array_append_new(env, json_sprintf("TERM=%s", term));
  rc = exec_session(c, lease, job, cmd, env, in, tty);
stop:
  if (keeper) {
    char *path = cli_path("/v1/jobs", keeper, "/stop");
    json_t *ans = NULL;
    bool q = c->quiet;
    c->quiet = true; /* the lease may have ended with the shell */
    if (path)
      cli_call(c, "POST", path, json_object(), &ans);
    c->quiet = q;
    json_decref(ans);
    free(path);
  }
out:
  free(running);
  free(last_image);
  free(keeper);
  json_decref(env);
  json_decref(cmd);
  return rc;
}
