/* The provider's side of gpunet exec: an EXEC_OPEN signed by the lease
 * holder becomes `runc exec` into the lease's running job, on a PTY (tty)
 * or on socket pairs, its output sent back in EXEC_DATA chunks within the
 * requester's credit and its exit code in EXEC_EXIT (docs/protocol.md §3.3).
 *
 * For a terminal the daemon opens the PTY and hands the slave to runc as
 * stdin, stdout and stderr; runc relays it to the container's own console
 * and copies its size there on SIGWINCH, so a resize is TIOCSWINSZ on our
 * master and a SIGWINCH to runc. Ctrl-C is the byte 0x03 through the PTY.
 * Nothing read is buffered past the credit: with none left the master (or
 * the pipes) is not read, and the process blocks on its writes. */
#include "exec.h"

#include <errno.h>
#include <fcntl.h>
#include <pty.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#define EXIT_DRAIN_MS 2000       /* output still read this long after the process ended */
#define STALL_MS 60000           /* output waiting and no credit for this long: killed */
#define IDLE_MS (30 * 60 * 1000) /* nothing either way for this long: killed */
#define KILL_WAIT_MS 10000       /* a killed runc that does not end: its handles closed anyway */
/* A job is "running" once its runtime is started, a moment before the
 * runtime has made the container: an EXEC_OPEN in between waits (held, at
 * most WAITING_MAX at once, WAITING_PER_PEER of one peer) until the
 * container is there, at most START_WAIT_MS. */
#define START_WAIT_MS 10000
#define WAITING_MAX 16
#define WAITING_PER_PEER 4

typedef struct gn__exec_waiting {
  struct gn__exec_waiting *next;
  uint8_t peer[GN_PK_LEN];
  gn_envelope env; /* its body points at body[] */
  uint64_t since_ms;
  uint8_t body[];
} waiting;

typedef struct gn__exec_pstream pstream;

struct gn__exec_pstream {
  pstream *next;
  gn_node *n;
  uint8_t peer[GN_PK_LEN];
  uint32_t sid;
  char lease_id[GN_LEASE_ID_STRLEN];
  char job_id[GN_JOB_ID_STRLEN];
  bool tty;
  pid_t pid;
  int pidfd;
  char pid_file[4200];
  uv_poll_t exit_poll;
  uv_pipe_t io;  /* tty: the PTY master; else the process's stdin */
  uv_pipe_t out; /* no tty: stdout and stderr */
  uv_pipe_t err;
  int handles_open;
  bool exited, finished, killed, peer_gone;
  int code;
  bool out_eof, err_eof; /* tty: out_eof is the master's end */
  bool out_reading, err_reading;
  bool stdin_shut;
  uint32_t credit;      /* bytes we may still send */
  uint32_t in_unacked;  /* bytes received and not yet written and acknowledged */
  uint64_t activity_ms; /* last message from the requester or output read */
  uint64_t stalled_ms;  /* since when output waits for credit (0: not) */
  uint64_t exited_ms, killed_ms;
  char reason[200];
  uint8_t buf[GN_EXEC_CHUNK];
};

typedef struct wreq {
  uv_write_t w;
  pstream *s;
  uint32_t len;
  uint8_t data[];
} wreq;

int gn__exec_send(gn_node *n, const uint8_t peer[GN_PK_LEN], uint32_t type, gn_wire_writer *w) {
  gn_buf body = {0}, env = {0};
  int r = gn_wire_writer_take(w, &body);
  if (r == 0)
    r = gn_envelope_seal_for_session(n->id, type, body.data, body.len, &env);
  if (r == 0)
    r = n->tp && gn_transport_is_up(n->tp, peer) ? gn_transport_send(n->tp, peer, env.data, env.len) : GN_ECLOSED;
  gn_buf_done(&body);
  gn_buf_done(&env);
  return r;
}

static void send_exit(gn_node *n, const uint8_t peer[GN_PK_LEN], uint32_t sid, int32_t code, const char *reason) {
  gn_wire_writer w;
  gn_wire_writer_init(&w);
  gn__execexit_encode(&w, sid, code, reason);
  gn__exec_send(n, peer, GN_MSG_EXEC_EXIT, &w);
  gn_wire_writer_done(&w);
}

static void send_window(pstream *s, uint32_t ack) {
  gn_wire_writer w;
  gn_wire_writer_init(&w);
  gn__execwindow_encode(&w, s->sid, true, ack, 0, 0);
  gn__exec_send(s->n, s->peer, GN_MSG_EXEC_WINDOW, &w);
  gn_wire_writer_done(&w);
}

static pstream *find(gn_node *n, const uint8_t peer[GN_PK_LEN], uint32_t sid) {
  for (pstream *s = n->exec ? n->exec->pstreams : NULL; s; s = s->next)
    if (s->sid == sid && memcmp(s->peer, peer, GN_PK_LEN) == 0)
      return s;
  return NULL;
}

static void stream_unlink_free(pstream *s) {
  gn_node *n = s->n;
  for (pstream **pp = &n->exec->pstreams; *pp; pp = &(*pp)->next)
    if (*pp == s) {
      *pp = s->next;
      break;
    }
  n->exec->pstream_count--;
  if (s->pid_file[0])
    unlink(s->pid_file);
  free(s);
}

static void on_handle_closed(uv_handle_t *h) {
  pstream *s = h->data;
  if (--s->handles_open == 0)
    stream_unlink_free(s);
}

/* The process ended (or was given up on) and its output is read or the
 * drain time is over: the requester gets EXEC_EXIT, the handles close, the
 * last close frees the stream. */
static void stream_finish(pstream *s) {
  if (s->finished)
    return;
  s->finished = true;
  gn_lease *l = gn__lease_find(s->n, s->lease_id);
  gn_job *j = gn__job_find(s->n, s->job_id);
  if (!s->reason[0] && (!l || l->state != GN_LEASE_ACTIVE))
    gn__strf(s->reason, sizeof s->reason, "the lease ended");
  else if (!s->reason[0] && (!j || j->state != GN_JOB_RUNNING))
    gn__strf(s->reason, sizeof s->reason, "the job ended");
  if (!s->peer_gone)
    send_exit(s->n, s->peer, s->sid, s->exited ? s->code : -1, s->reason);
  gn_log(GN_LOG_INFO, "exec %u on job %s ended: %s%s%d", s->sid, s->job_id, s->reason[0] ? s->reason : "",
         s->reason[0] ? "; code " : "code ", s->exited ? s->code : -1);
  if (!s->exited) { /* given up on: not watched any more, reaped when it ends */
    kill(s->pid, SIGKILL);
    int code;
    gn_runtime_reap(s->pid, &code);
  }
  uv_close((uv_handle_t *)&s->exit_poll, on_handle_closed);
  uv_close((uv_handle_t *)&s->io, on_handle_closed);
  if (!s->tty) {
    uv_close((uv_handle_t *)&s->out, on_handle_closed);
    uv_close((uv_handle_t *)&s->err, on_handle_closed);
  }
  close(s->pidfd);
  s->pidfd = -1;
}

static void maybe_finish(pstream *s) {
  if (s->exited && s->out_eof && (s->tty || s->err_eof))
    stream_finish(s);
}

/* The exec'd process itself (runc wrote its host pid), or 0. */
static pid_t exec_pid(const pstream *s) {
  char b[32] = {0};
  int fd = open(s->pid_file, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0)
    return 0;
  ssize_t k = read(fd, b, sizeof b - 1);
  close(fd);
  long v = k > 0 ? strtol(b, NULL, 10) : 0;
  return v > 1 && v < (1l << 22) ? (pid_t)v : 0;
}

/* Kills the process and runc (SIGKILL cannot be relayed by runc, so the
 * process is killed by its pid); the exit is reported as usual, with why. */
static void stream_kill(pstream *s, const char *why) {
  if (s->finished)
    return;
  if (!s->reason[0])
    gn__strf(s->reason, sizeof s->reason, "%s", why);
  if (s->exited) {
    stream_finish(s);
    return;
  }
  pid_t p = exec_pid(s);
  if (p > 0)
    kill(p, SIGKILL);
  kill(s->pid, SIGKILL);
  if (!s->killed) {
    s->killed = true;
    s->killed_ms = gn_mono_ms();
  }
}

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *b) {
  (void)suggested;
  pstream *s = h->data;
  /* Never more than the credit: what is read is sent at once. */
  size_t k = s->credit < sizeof s->buf ? s->credit : sizeof s->buf;
  *b = uv_buf_init((char *)s->buf, (unsigned)(k ? k : 1));
}

static void read_stop_all(pstream *s) {
  if (s->out_reading)
    uv_read_stop((uv_stream_t *)(s->tty ? &s->io : &s->out));
  if (!s->tty && s->err_reading)
    uv_read_stop((uv_stream_t *)&s->err);
  s->out_reading = s->err_reading = false;
}

static void on_read(uv_stream_t *st, ssize_t nread, const uv_buf_t *b) {
  pstream *s = st->data;
  bool is_err = !s->tty && st == (uv_stream_t *)&s->err;
  if (nread < 0) { /* EOF, or EIO from a master whose slave closed */
    uv_read_stop(st);
    if (is_err) {
      s->err_eof = true;
      s->err_reading = false;
    } else {
      s->out_eof = true;
      s->out_reading = false;
    }
    maybe_finish(s);
    return;
  }
  if (nread == 0)
    return;
  uint32_t k = (uint32_t)nread > s->credit ? s->credit : (uint32_t)nread;
  gn_wire_writer w;
  gn_wire_writer_init(&w);
  gn__execdata_encode(&w, s->sid, is_err ? 2 : 1, (const uint8_t *)b->base, k, false);
  gn__exec_send(s->n, s->peer, GN_MSG_EXEC_DATA, &w);
  gn_wire_writer_done(&w);
  s->credit -= k;
  s->activity_ms = gn_mono_ms();
  if (s->credit == 0) {
    read_stop_all(s);
    s->stalled_ms = s->activity_ms;
  }
}

static void read_start_all(pstream *s) {
  if (s->finished || s->credit == 0)
    return;
  s->stalled_ms = 0;
  if (!s->out_eof && !s->out_reading) {
    s->out_reading = true;
    uv_read_start((uv_stream_t *)(s->tty ? &s->io : &s->out), on_alloc, on_read);
  }
  if (!s->tty && !s->err_eof && !s->err_reading) {
    s->err_reading = true;
    uv_read_start((uv_stream_t *)&s->err, on_alloc, on_read);
  }
}

static void on_exit_poll(uv_poll_t *h, int status, int events) {
  (void)status;
  (void)events;
  pstream *s = h->data;
  int code;
  if (gn_runtime_reap(s->pid, &code) == -EAGAIN)
    return;
  uv_poll_stop(h);
  s->exited = true;
  s->code = code;
  s->exited_ms = gn_mono_ms();
  if (s->killed) {
    stream_finish(s);
    return;
  }
  maybe_finish(s);
}

static void on_written(uv_write_t *w, int status) {
  (void)status; /* a process that stopped reading: its bytes are dropped, still acknowledged */
  wreq *q = (wreq *)w;
  pstream *s = q->s;
  s->in_unacked -= q->len;
  if (!s->finished && !s->peer_gone)
    send_window(s, q->len);
  free(q);
}

static void on_shutdown(uv_shutdown_t *r, int status) {
  (void)status;
  free(r);
}

/* Starts runc exec for an admitted request. 0: running, handles open. */
static int stream_spawn(gn_node *n, pstream *s, const gn_execopen *o, const gn_job *j) {
  int master = -1, slave = -1, in[2] = {-1, -1}, out[2] = {-1, -1}, err[2] = {-1, -1}, r = 0;
  char **argv = NULL;
  gn__pathf(s->pid_file, sizeof s->pid_file, "%s/exec-%u.pid", n->run_dir, ++n->exec->pid_seq);
  unlink(s->pid_file);
  r = gn_runtime_argv_exec(&n->rt, n->run_dir, j->container_id, o->tty, s->pid_file, o->env, o->argv, &argv);
  if (r < 0)
    goto out;
  if (o->tty) {
    struct winsize ws = {.ws_row = o->rows, .ws_col = o->cols};
    if (openpty(&master, &slave, NULL, NULL, &ws) < 0) {
      r = -errno;
      goto out;
    }
    fcntl(master, F_SETFD, FD_CLOEXEC);
    fcntl(slave, F_SETFD, FD_CLOEXEC);
    r = gn_runtime_spawn_io(argv, slave, slave, slave, true, &s->pid, &s->pidfd);
  } else {
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, in) < 0 ||
        socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, out) < 0 ||
        socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, err) < 0) {
      r = -errno;
      goto out;
    }
    r = gn_runtime_spawn_io(argv, in[1], out[1], err[1], true, &s->pid, &s->pidfd);
  }
  if (r < 0)
    goto out;
  uv_poll_init(n->loop, &s->exit_poll, s->pidfd);
  uv_pipe_init(n->loop, &s->io, 0);
  s->exit_poll.data = s->io.data = s;
  s->handles_open = 2;
  uv_pipe_open(&s->io, o->tty ? master : in[0]);
  if (o->tty) {
    master = -1;
  } else {
    in[0] = -1;
    uv_pipe_init(n->loop, &s->out, 0);
    uv_pipe_init(n->loop, &s->err, 0);
    s->out.data = s->err.data = s;
    s->handles_open += 2;
    uv_pipe_open(&s->out, out[0]);
    uv_pipe_open(&s->err, err[0]);
    out[0] = err[0] = -1;
  }
  uv_poll_start(&s->exit_poll, UV_READABLE, on_exit_poll);
out:
  gn_argv_free(argv);
  int fds[] = {master, slave, in[0], in[1], out[0], out[1], err[0], err[1]};
  for (size_t i = 0; i < GN_ARRAY_SIZE(fds); i++)
    if (fds[i] >= 0)
      close(fds[i]);
  return r;
}

/* Holds env for a retry by the tick; false when WAITING_MAX are held or
 * out of memory. */
static bool open_wait(gn_node *n, const uint8_t peer[GN_PK_LEN], const gn_envelope *env, uint64_t since_ms) {
  unsigned of_peer = 0;
  for (const waiting *w = n->exec->waiting; w; w = w->next)
    of_peer += memcmp(w->peer, peer, GN_PK_LEN) == 0;
  if (n->exec->waiting_count >= WAITING_MAX || of_peer >= WAITING_PER_PEER)
    return false;
  waiting *w = malloc(sizeof *w + env->body_len);
  if (!w)
    return false;
  memcpy(w->peer, peer, GN_PK_LEN);
  w->env = *env;
  memcpy(w->body, env->body, env->body_len);
  w->env.body = w->body;
  w->since_ms = since_ms;
  w->next = n->exec->waiting;
  n->exec->waiting = w;
  n->exec->waiting_count++;
  return true;
}

/* since_ms: when the EXEC_OPEN first arrived (it may have waited since). */
static void on_open(gn_node *n, const uint8_t peer[GN_PK_LEN], const gn_envelope *env, uint64_t since_ms) {
  gn_execopen o;
  char reason[300];
  int r = gn__execopen_decode(env->body, env->body_len, &o);
  if (r < 0) {
    gn_execmsg m; /* the stream id, when it can be read, for the refusal */
    if (gn__execmsg_decode(GN_MSG_EXEC_CLOSE, env->body, env->body_len, &m) == 0) {
      send_exit(n, peer, m.sid, -1, r == GN_ETOOBIG ? "exec request over its limits" : "malformed exec request");
      gn__execmsg_done(&m);
    }
    gn_log_ratelimited("exec-bad", GN_LOG_WARN, "malformed exec request: %s", gn_strerror(r));
    return;
  }
  gn_lease *l = gn__lease_find(n, o.lease_id);
  gn_job *j = gn__job_find(n, o.job_id);
  gn_exec_ctx c = {.signer = env->signer, .now_s = gn_unix_s()};
  c.lease_found = l && l->role == GN_ROLE_PROVIDER;
  c.lease_holder = c.lease_found ? l->ag.terms.requester : NULL;
  c.lease_active = c.lease_found && l->state == GN_LEASE_ACTIVE;
  c.job_found = j && j->role == GN_ROLE_PROVIDER;
  c.job_lease_id = c.job_found ? j->lease_id : NULL;
  c.job_running = c.job_found && j->state == GN_JOB_RUNNING && j->proc_running && j->container_id[0];
  c.sid_in_use = find(n, peer, o.sid) != NULL;
  c.total_streams = n->exec->pstream_count;
  for (pstream *s = n->exec->pstreams; s; s = s->next)
    c.lease_streams += strcmp(s->lease_id, o.lease_id) == 0;
  sqlite3_stmt *st = NULL;
  sqlite3_prepare_v2(n->db, "SELECT 1 FROM job_nonces WHERE nonce = ?", -1, &st, NULL);
  sqlite3_bind_blob(st, 1, o.nonce, sizeof o.nonce, SQLITE_STATIC);
  int sr = sqlite3_step(st);
  sqlite3_finalize(st);
  c.nonce_seen = sr != SQLITE_DONE; /* a failed look-up refuses too */
  if (!n->have_runtime) {
    gn__strf(reason, sizeof reason, "this provider has no OCI runtime");
    r = GN_EUNSUPPORTED;
  } else {
    r = gn__exec_admit(&o, &c, reason, sizeof reason);
  }
  pid_t init_pid;
  if (r == 0 && gn__job_container_pid(n, j, &init_pid) < 0) {
    if (gn_mono_ms() - since_ms < START_WAIT_MS && open_wait(n, peer, env, since_ms)) {
      gn__execopen_done(&o);
      return; /* the tick tries again */
    }
    gn__strf(reason, sizeof reason, "the job's container has not started");
    r = GN_EBUSY;
  }
  if (r == 0) { /* remembered before anything runs, as a manifest's */
    sqlite3_prepare_v2(n->db, "INSERT INTO job_nonces(nonce, expires_s) VALUES(?, ?)", -1, &st, NULL);
    sqlite3_bind_blob(st, 1, o.nonce, sizeof o.nonce, SQLITE_STATIC);
    sqlite3_bind_int64(st, 2, o.expires_s);
    if (sqlite3_step(st) != SQLITE_DONE) {
      gn__strf(reason, sizeof reason, "the provider cannot record the request's nonce");
      r = GN_EDB;
    }
    sqlite3_finalize(st);
  }
  pstream *s = NULL;
  if (r == 0 && !(s = calloc(1, sizeof *s))) {
    gn__strf(reason, sizeof reason, "provider out of memory");
    r = GN_ENOMEM;
  }
  if (r == 0) {
    s->n = n;
    memcpy(s->peer, peer, GN_PK_LEN);
    s->sid = o.sid;
    s->tty = o.tty;
    s->pidfd = -1;
    s->credit = GN_EXEC_WINDOW;
    s->activity_ms = gn_mono_ms();
    gn__strf(s->lease_id, sizeof s->lease_id, "%s", o.lease_id);
    gn__strf(s->job_id, sizeof s->job_id, "%s", o.job_id);
    if ((r = stream_spawn(n, s, &o, j)) < 0) {
      gn__strf(reason, sizeof reason, "cannot start %s: %s", n->rt.path, gn_strerror(r));
      free(s);
    }
  }
  if (r < 0) {
    gn_log(GN_LOG_INFO, "exec on lease %s refused: %s", o.lease_id, reason);
    send_exit(n, peer, o.sid, -1, reason);
    gn__execopen_done(&o);
    return;
  }
  s->next = n->exec->pstreams;
  n->exec->pstreams = s;
  n->exec->pstream_count++;
  gn_log(GN_LOG_INFO, "exec %u on job %s (lease %s)%s: %s", s->sid, s->job_id, s->lease_id, s->tty ? " with a tty" : "",
         o.argv[0]);
  gn__execopen_done(&o);
  send_window(s, 0); /* says it started */
  read_start_all(s);
}

static void on_data(pstream *s, const gn_execmsg *m) {
  if (m->data_len > GN_EXEC_WINDOW - s->in_unacked) {
    stream_kill(s, "the requester sent past its window");
    return;
  }
  if (m->data_len && !s->stdin_shut) {
    wreq *q = malloc(sizeof *q + m->data_len);
    if (!q) {
      stream_kill(s, "provider out of memory");
      return;
    }
    q->s = s;
    q->len = (uint32_t)m->data_len;
    memcpy(q->data, m->data, m->data_len);
    uv_buf_t b = uv_buf_init((char *)q->data, q->len);
    s->in_unacked += q->len;
    if (uv_write(&q->w, (uv_stream_t *)&s->io, &b, 1, on_written) < 0) {
      s->in_unacked -= q->len;
      free(q);
      send_window(s, (uint32_t)m->data_len);
    }
  } else if (m->data_len) {
    send_window(s, (uint32_t)m->data_len); /* stdin closed: dropped */
  }
  /* A terminal's end of input is ^D, typed; only pipes are shut. */
  if (m->eof && !s->tty && !s->stdin_shut) {
    s->stdin_shut = true;
    uv_shutdown_t *sh = malloc(sizeof *sh);
    if (sh && uv_shutdown(sh, (uv_stream_t *)&s->io, on_shutdown) < 0)
      free(sh);
  }
}

void gn__exec_prov_on_message(gn_node *n, const uint8_t peer[GN_PK_LEN], const gn_envelope *env) {
  if (!n->exec)
    return;
  if (env->type == GN_MSG_EXEC_OPEN) {
    on_open(n, peer, env, gn_mono_ms());
    return;
  }
  gn_execmsg m;
  if (gn__execmsg_decode(env->type, env->body, env->body_len, &m) < 0)
    return;
  if (m.from_provider) { /* for our requester side */
    gn__execmsg_done(&m);
    return;
  }
  pstream *s = find(n, peer, m.sid);
  if (!s || s->finished) {
    gn__execmsg_done(&m);
    return;
  }
  s->activity_ms = gn_mono_ms();
  switch (env->type) {
  case GN_MSG_EXEC_DATA:
    on_data(s, &m);
    break;
  case GN_MSG_EXEC_WINDOW:
    if (m.ack > GN_EXEC_WINDOW - s->credit) {
      stream_kill(s, "the requester returned more credit than it had");
      break;
    }
    s->credit += m.ack;
    read_start_all(s);
    if (m.rows && s->tty) {
      struct winsize ws = {.ws_row = m.rows, .ws_col = m.cols};
      int fd = -1;
      if (uv_fileno((uv_handle_t *)&s->io, &fd) == 0 && ioctl(fd, TIOCSWINSZ, &ws) == 0)
        kill(s->pid, SIGWINCH); /* runc copies the size to the container's console */
    }
    break;
  case GN_MSG_EXEC_SIGNAL:
    if (m.sig == SIGKILL) {
      pid_t p = exec_pid(s);
      if (p > 0)
        kill(p, SIGKILL);
    } else if (!s->exited) {
      kill(s->pid, m.sig); /* runc relays it to the process */
    }
    break;
  case GN_MSG_EXEC_CLOSE:
    s->peer_gone = true; /* it asked: nothing more to tell it */
    stream_kill(s, "closed by the requester");
    break;
  default:
    break;
  }
  gn__execmsg_done(&m);
}

void gn__exec_prov_peer_down(gn_node *n, const uint8_t peer[GN_PK_LEN]) {
  for (waiting **pw = n->exec ? &n->exec->waiting : NULL; pw && *pw;) {
    waiting *w = *pw;
    if (memcmp(w->peer, peer, GN_PK_LEN) != 0) {
      pw = &w->next;
      continue;
    }
    *pw = w->next;
    n->exec->waiting_count--;
    free(w);
  }
  for (pstream *s = n->exec ? n->exec->pstreams : NULL; s; s = s->next)
    if (memcmp(s->peer, peer, GN_PK_LEN) == 0) {
      s->peer_gone = true;
      stream_kill(s, "the requester's session closed");
    }
}

/* Each held open is tried again: run, held again, or refused. */
static void waiting_retry(gn_node *n) {
  waiting *w = n->exec ? n->exec->waiting : NULL;
  if (!w)
    return;
  n->exec->waiting = NULL;
  n->exec->waiting_count = 0;
  while (w) {
    waiting *next = w->next;
    on_open(n, w->peer, &w->env, w->since_ms);
    free(w);
    w = next;
  }
}

void gn__exec_prov_tick(gn_node *n, uint64_t now_ms) {
  waiting_retry(n);
  for (pstream *s = n->exec ? n->exec->pstreams : NULL, *next; s; s = next) {
    next = s->next; /* stream_finish frees nothing before the closes finish */
    if (s->finished)
      continue;
    gn_lease *l = gn__lease_find(n, s->lease_id);
    gn_job *j = gn__job_find(n, s->job_id);
    if (!l || l->state != GN_LEASE_ACTIVE)
      stream_kill(s, "the lease ended");
    else if (!j || j->state != GN_JOB_RUNNING)
      stream_kill(s, "the job ended");
    else if (s->stalled_ms && gn_ms_since(now_ms, s->stalled_ms) > STALL_MS)
      stream_kill(s, "stalled: the requester read no output for 60 s");
    else if (gn_ms_since(now_ms, s->activity_ms) > IDLE_MS)
      stream_kill(s, "idle for 30 minutes");
    if (s->finished)
      continue;
    /* Output is drained after the end while it flows (read or credited);
     * then the rest is given up: something of it holds the output open. */
    uint64_t last = s->exited_ms > s->activity_ms ? s->exited_ms : s->activity_ms;
    if (s->exited && gn_ms_since(now_ms, last) > EXIT_DRAIN_MS)
      stream_finish(s);
    else if (s->killed && !s->exited && gn_ms_since(now_ms, s->killed_ms) > KILL_WAIT_MS)
      stream_finish(s);
  }
}

void gn__exec_prov_close(gn_node *n) {
  for (waiting *w = n->exec ? n->exec->waiting : NULL, *next; w; w = next) {
    next = w->next;
    free(w);
  }
  if (n->exec) {
    n->exec->waiting = NULL;
    n->exec->waiting_count = 0;
  }
  for (pstream *s = n->exec ? n->exec->pstreams : NULL; s; s = s->next)
    stream_kill(s, "the provider shuts down");
}
