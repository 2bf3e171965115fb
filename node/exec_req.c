/* The requester's side of gpunet exec: the CLI connects to
 * DATA_DIR/gpunetd-exec.sock (0600, like the control socket) and speaks a
 * small framed protocol; the daemon signs the EXEC_OPEN as the lease holder
 * and relays stdin, resizes and signals to the provider, and output and the
 * exit code back (docs/protocol.md §3.3).
 *
 * Frames both ways: type (1 byte), length (4 bytes big-endian), payload (at
 * most 64 KiB). CLI -> daemon: 'o' the request (JSON {lease, job, cmd, env,
 * tty, rows, cols}, first and once), 'd' stdin bytes, 'e' end of stdin, 'w'
 * a terminal size (rows, cols: 2 bytes each), 's' a signal (1 byte: 2, 15
 * or 9). Daemon -> CLI: 'd' stdout bytes, 'f' stderr bytes, 'x' the end
 * (exit code as 4 bytes big-endian, -1 when the command never ran, then the
 * reason as text, possibly empty). The daemon closes the connection after
 * 'x'; the CLI closing it first ends the process (EXEC_CLOSE).
 *
 * Memory: what the provider sends is written to the CLI before it is
 * acknowledged, so a CLI that stops reading holds at most the window
 * (256 KiB) here; stdin is read only while the provider's credit lasts. */
#include "exec.h"

#include <errno.h>
#include <gpunet/uvutil.h>
#include <jansson.h>
#include <signal.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define FRAME_MAX 65536
#define CLIENTS_MAX 32
#define OPEN_TIMEOUT_MS 20000 /* the provider says nothing about an EXEC_OPEN this long */

typedef struct gn__exec_client client;

struct gn__exec_client {
  client *next;
  gn_node *n;
  uv_pipe_t pipe;
  bool closing;
  uint8_t *rbuf; /* one frame being read, FRAME_MAX + 5 */
  size_t rlen;
  bool opened, started, ended;
  bool remote_done; /* the provider sent EXEC_EXIT: nothing of it to close */
  uint32_t sid;
  uint8_t peer[GN_PK_LEN];
  bool tty;
  uint64_t open_ms;
  uint32_t credit;   /* bytes of stdin the provider will still take */
  gn_buf pending;    /* stdin waiting for credit (at most one frame) */
  bool eof_pending;  /* end of stdin, after pending */
  uint32_t out_held; /* output bytes received and not yet written to the CLI */
  bool paused;       /* not reading the CLI: stdin waits for credit */
};

typedef struct cwrite {
  uv_write_t w;
  client *c;
  uint32_t ack; /* output bytes to acknowledge once written */
  bool last;    /* the 'x' frame: close after it */
  uint8_t data[];
} cwrite;

static void client_close(client *c, bool tell_provider);

static void on_client_closed(uv_handle_t *h) {
  client *c = h->data;
  gn_node *n = c->n;
  for (client **pp = &n->exec->clients; *pp; pp = &(*pp)->next)
    if (*pp == c) {
      *pp = c->next;
      break;
    }
  n->exec->client_count--;
  gn_buf_done(&c->pending);
  free(c->rbuf);
  free(c);
}

static void send_window(client *c, uint32_t ack, uint16_t rows, uint16_t cols) {
  gn_wire_writer w;
  gn_wire_writer_init(&w);
  gn__execwindow_encode(&w, c->sid, false, ack, rows, cols);
  gn__exec_send(c->n, c->peer, GN_MSG_EXEC_WINDOW, &w);
  gn_wire_writer_done(&w);
}

static void on_cwritten(uv_write_t *w, int status) {
  cwrite *q = (cwrite *)w;
  client *c = q->c;
  c->out_held -= q->ack;
  if (status == 0 && q->ack && !c->ended && !c->closing)
    send_window(c, q->ack, 0, 0);
  if (q->last && !c->closing)
    client_close(c, true);
  free(q);
}

/* Queues one frame to the CLI; ack: output bytes it carries. */
static int write_frame(client *c, uint8_t type, const void *p1, size_t n1, const void *p2, size_t n2, uint32_t ack,
                       bool last) {
  if (c->closing)
    return GN_ECLOSED;
  cwrite *q = malloc(sizeof *q + 5 + n1 + n2);
  if (!q)
    return GN_ENOMEM;
  size_t len = n1 + n2;
  q->c = c;
  q->ack = ack;
  q->last = last;
  q->data[0] = type;
  q->data[1] = (uint8_t)(len >> 24);
  q->data[2] = (uint8_t)(len >> 16);
  q->data[3] = (uint8_t)(len >> 8);
  q->data[4] = (uint8_t)len;
  if (n1)
    memcpy(q->data + 5, p1, n1);
  if (n2)
    memcpy(q->data + 5 + n1, p2, n2);
  uv_buf_t b = uv_buf_init((char *)q->data, (unsigned)(5 + len));
  c->out_held += ack;
  int r = uv_write(&q->w, (uv_stream_t *)&c->pipe, &b, 1, on_cwritten);
  if (r < 0) {
    c->out_held -= ack;
    free(q);
    if (last)
      client_close(c, true);
  }
  return r;
}

/* Tells the CLI the end: the exit code (-1: never ran) and why. */
static void client_end(client *c, int32_t code, const char *reason) {
  if (c->ended || c->closing)
    return;
  c->ended = true;
  uint8_t b[4] = {(uint8_t)((uint32_t)code >> 24), (uint8_t)((uint32_t)code >> 16), (uint8_t)((uint32_t)code >> 8),
                  (uint8_t)code};
  write_frame(c, 'x', b, 4, reason, reason ? strlen(reason) : 0, 0, true);
}

static void client_close(client *c, bool tell_provider) {
  if (c->closing)
    return;
  if (tell_provider && c->opened && !c->remote_done) {
    gn_wire_writer w;
    gn_wire_writer_init(&w);
    gn__execclose_encode(&w, c->sid, "the renter closed the session");
    gn__exec_send(c->n, c->peer, GN_MSG_EXEC_CLOSE, &w);
    gn_wire_writer_done(&w);
  }
  c->ended = true;
  c->closing = true;
  uv_close((uv_handle_t *)&c->pipe, on_client_closed);
}

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *b) {
  (void)suggested;
  client *c = h->data;
  *b = uv_buf_init((char *)c->rbuf + c->rlen, (unsigned)(FRAME_MAX + 5 - c->rlen));
}

/* Sends pending stdin within the credit; reads the CLI again once it is
 * all out. */
static void flush_stdin(client *c) {
  while (c->pending.len && c->credit) {
    size_t k = c->pending.len;
    if (k > GN_EXEC_CHUNK)
      k = GN_EXEC_CHUNK;
    if (k > c->credit)
      k = c->credit;
    bool eof = c->eof_pending && k == c->pending.len;
    gn_wire_writer w;
    gn_wire_writer_init(&w);
    gn__execdata_encode(&w, c->sid, 0, c->pending.data, k, eof);
    gn__exec_send(c->n, c->peer, GN_MSG_EXEC_DATA, &w);
    gn_wire_writer_done(&w);
    c->credit -= (uint32_t)k;
    memmove(c->pending.data, c->pending.data + k, c->pending.len - k);
    c->pending.len -= k;
    if (eof)
      c->eof_pending = false;
  }
  if (!c->pending.len && c->eof_pending) {
    gn_wire_writer w;
    gn_wire_writer_init(&w);
    gn__execdata_encode(&w, c->sid, 0, NULL, 0, true);
    gn__exec_send(c->n, c->peer, GN_MSG_EXEC_DATA, &w);
    gn_wire_writer_done(&w);
    c->eof_pending = false;
  }
}

static void on_read(uv_stream_t *st, ssize_t nread, const uv_buf_t *b);
static void process(client *c);

static void update_reading(client *c) {
  bool want = !c->closing && !c->ended && c->pending.len == 0;
  if (want && c->paused) {
    c->paused = false;
    uv_read_start((uv_stream_t *)&c->pipe, on_alloc, on_read);
  } else if (!want && !c->paused && !c->closing) {
    c->paused = true;
    uv_read_stop((uv_stream_t *)&c->pipe);
  }
}

/* The newest running job of the lease that this node started. */
static gn_job *lease_job(gn_node *n, const char *lease_id) {
  gn_job *best = NULL;
  for (gn_job *j = n->jobs; j; j = j->next)
    if (j->role == GN_ROLE_REQUESTER && j->state == GN_JOB_RUNNING && strcmp(j->lease_id, lease_id) == 0 &&
        (!best || j->created_s > best->created_s))
      best = j;
  return best;
}

/* Copies a JSON array of strings into v (bounded); false when it is not one. */
static bool strv_from_json(const json_t *a, char **v, uint32_t *ret_n, uint32_t min) {
  if (a == NULL && min == 0) {
    *ret_n = 0;
    v[0] = NULL;
    return true;
  }
  if (!json_is_array(a) || json_array_size(a) < min || json_array_size(a) > GN_EXEC_MAX_ARGS)
    return false;
  uint32_t k = (uint32_t)json_array_size(a);
  for (uint32_t i = 0; i < k; i++) {
    v[i] = (char *)json_string_value(json_array_get(a, i));
    if (!v[i])
      return false;
  }
  v[k] = NULL;
  *ret_n = k;
  return true;
}

/* The 'o' frame: checks the request, signs the EXEC_OPEN and sends it. */
static void on_open_frame(client *c, const uint8_t *p, size_t len) {
  gn_node *n = c->n;
  char why[300] = "";
  json_error_t je;
  json_t *req = json_loadb((const char *)p, len, 0, &je);
  gn_execopen o;
  memset(&o, 0, sizeof o);
  const char *lease_id = req ? json_string_value(json_object_get(req, "lease")) : NULL;
  const char *job_id = req ? json_string_value(json_object_get(req, "job")) : NULL;
  gn_lease *l = lease_id ? gn__lease_find(n, lease_id) : NULL;
  gn_job *j = NULL;
  if (!req || !json_is_object(req)) {
    gn__strf(why, sizeof why, "the exec request is not a JSON object");
  } else if (!lease_id || !gn_id_valid(lease_id)) {
    gn__strf(why, sizeof why, "the exec request names no valid lease");
  } else if (!l || l->role != GN_ROLE_REQUESTER) {
    gn__strf(why, sizeof why, "no lease %s rented by this node", lease_id);
  } else if (l->state != GN_LEASE_ACTIVE) {
    gn__strf(why, sizeof why, "lease %s has ended", lease_id);
  } else if (job_id &&
             !((j = gn__job_find(n, job_id)) && j->role == GN_ROLE_REQUESTER && strcmp(j->lease_id, lease_id) == 0)) {
    gn__strf(why, sizeof why, "no job %s of this node on lease %s", job_id, lease_id);
  } else if (!job_id && !(j = lease_job(n, lease_id))) {
    gn__strf(why, sizeof why,
             "no running job on lease %s: start one with gpunet run, or use gpunet shell %s --image REF", lease_id,
             lease_id);
  } else if (j->state != GN_JOB_RUNNING) {
    gn__strf(why, sizeof why, "job %s is not running", j->id);
  } else if (!strv_from_json(json_object_get(req, "cmd"), o.argv, &o.argc, 1) ||
             !strv_from_json(json_object_get(req, "env"), o.env, &o.envc, 0)) {
    gn__strf(why, sizeof why, "the command and the environment must be 1..%d and 0..%d strings", GN_EXEC_MAX_ARGS,
             GN_EXEC_MAX_ARGS);
  }
  if (!why[0]) {
    o.sid = ++n->exec->next_sid;
    gn__strf(o.lease_id, sizeof o.lease_id, "%s", l->id);
    gn__strf(o.job_id, sizeof o.job_id, "%s", j->id);
    o.tty = json_is_true(json_object_get(req, "tty"));
    json_int_t rows = json_integer_value(json_object_get(req, "rows"));
    json_int_t cols = json_integer_value(json_object_get(req, "cols"));
    o.rows = (uint16_t)(rows >= 1 && rows <= GN_EXEC_MAX_DIM ? rows : 24);
    o.cols = (uint16_t)(cols >= 1 && cols <= GN_EXEC_MAX_DIM ? cols : 80);
    randombytes_buf(o.nonce, sizeof o.nonce);
    o.issued_s = gn_unix_s();
    o.expires_s = o.issued_s + 120;
    gn_wire_writer w;
    gn_wire_writer_init(&w);
    int r = gn__execopen_encode(&o, &w);
    if (r < 0)
      gn__strf(why, sizeof why,
               "the command or environment is over its limits (%d entries of %d bytes, env as KEY=VALUE)",
               GN_EXEC_MAX_ARGS, GN_EXEC_MAX_ARG_LEN);
    else if ((r = gn__exec_send(n, l->peer, GN_MSG_EXEC_OPEN, &w)) < 0)
      gn__strf(why, sizeof why, "cannot reach the provider of lease %s: %s", l->id, gn_strerror(r));
    gn_wire_writer_done(&w);
    if (r == 0) {
      c->opened = true;
      c->sid = o.sid;
      c->tty = o.tty;
      memcpy(c->peer, l->peer, GN_PK_LEN);
      c->open_ms = gn_mono_ms();
      c->credit = GN_EXEC_WINDOW;
    }
  }
  json_decref(req);
  if (why[0])
    client_end(c, -1, why);
}

static void on_frame(client *c, uint8_t type, const uint8_t *p, size_t len) {
  if (!c->opened) {
    if (type == 'o')
      on_open_frame(c, p, len);
    else
      client_end(c, -1, "the first frame must be the exec request");
    return;
  }
  switch (type) {
  case 'd':
    if (gn_buf_append(&c->pending, p, len) < 0) {
      client_end(c, -1, "out of memory");
      return;
    }
    flush_stdin(c);
    break;
  case 'e':
    c->eof_pending = true;
    flush_stdin(c);
    break;
  case 'w':
    if (len == 4) {
      uint16_t rows = (uint16_t)(p[0] << 8 | p[1]), cols = (uint16_t)(p[2] << 8 | p[3]);
      if (rows >= 1 && cols >= 1 && rows <= GN_EXEC_MAX_DIM && cols <= GN_EXEC_MAX_DIM)
        send_window(c, 0, rows, cols);
    }
    break;
  case 's':
    if (len == 1 && (p[0] == SIGINT || p[0] == SIGTERM || p[0] == SIGKILL)) {
      gn_wire_writer w;
      gn_wire_writer_init(&w);
      gn__execsignal_encode(&w, c->sid, p[0]);
      gn__exec_send(c->n, c->peer, GN_MSG_EXEC_SIGNAL, &w);
      gn_wire_writer_done(&w);
    }
    break;
  default:
    client_end(c, -1, "unknown frame from the CLI");
  }
}

/* Handles the whole frames read so far, while stdin is not waiting for
 * credit; then reads on or pauses. */
static void process(client *c) {
  size_t off = 0;
  while (!c->closing && !c->ended && c->rlen - off >= 5 && c->pending.len == 0) {
    const uint8_t *h = c->rbuf + off;
    size_t len = (size_t)h[1] << 24 | (size_t)h[2] << 16 | (size_t)h[3] << 8 | h[4];
    if (len > FRAME_MAX) {
      client_end(c, -1, "frame over 64 KiB");
      break;
    }
    if (c->rlen - off < 5 + len)
      break;
    on_frame(c, h[0], h + 5, len);
    off += 5 + len;
  }
  if (c->closing)
    return;
  memmove(c->rbuf, c->rbuf + off, c->rlen - off);
  c->rlen -= off;
  update_reading(c);
}

static void on_read(uv_stream_t *st, ssize_t nread, const uv_buf_t *b) {
  (void)b;
  client *c = st->data;
  if (nread < 0) {
    client_close(c, true);
    return;
  }
  c->rlen += (size_t)nread;
  process(c);
}

static void on_connection(uv_stream_t *server, int status) {
  gn_node *n = server->data;
  if (status < 0)
    return;
  client *c = calloc(1, sizeof *c);
  if (c)
    c->rbuf = malloc(FRAME_MAX + 5);
  if (!c || !c->rbuf) {
    if (c)
      free(c->rbuf);
    free(c);
    uv_pipe_t *tmp = gn_uv_handle_alloc(sizeof *tmp); /* accepted and closed at once */
    if (tmp && uv_pipe_init(n->loop, tmp, 0) == 0) {
      uv_accept(server, (uv_stream_t *)tmp);
      gn_uv_close_free((uv_handle_t *)tmp, NULL, NULL);
    } else {
      gn_uv_handle_free_unused(tmp);
    }
    return;
  }
  c->n = n;
  uv_pipe_init(n->loop, &c->pipe, 0);
  c->pipe.data = c;
  c->next = n->exec->clients;
  n->exec->clients = c;
  n->exec->client_count++;
  if (uv_accept(server, (uv_stream_t *)&c->pipe) < 0) {
    client_close(c, false);
    return;
  }
  if (n->exec->client_count > CLIENTS_MAX) {
    client_end(c, -1, "too many exec sessions on this node");
    return;
  }
  uv_read_start((uv_stream_t *)&c->pipe, on_alloc, on_read);
}

static client *find(gn_node *n, const uint8_t peer[GN_PK_LEN], uint32_t sid) {
  for (client *c = n->exec ? n->exec->clients : NULL; c; c = c->next)
    if (c->opened && c->sid == sid && memcmp(c->peer, peer, GN_PK_LEN) == 0)
      return c;
  return NULL;
}

void gn__exec_req_on_message(gn_node *n, const uint8_t peer[GN_PK_LEN], const gn_envelope *env) {
  gn_execmsg m;
  if (gn__execmsg_decode(env->type, env->body, env->body_len, &m) < 0)
    return;
  if (!m.from_provider && env->type != GN_MSG_EXEC_EXIT) { /* for our provider side */
    gn__execmsg_done(&m);
    return;
  }
  client *c = find(n, peer, m.sid);
  if (!c || c->ended || c->closing) {
    gn__execmsg_done(&m);
    return;
  }
  c->started = true;
  switch (env->type) {
  case GN_MSG_EXEC_DATA:
    if (m.data_len > GN_EXEC_WINDOW - c->out_held) {
      client_end(c, -1, "the provider sent past its window");
      client_close(c, true);
      break;
    }
    write_frame(c, m.fd == 2 ? 'f' : 'd', m.data, m.data_len, NULL, 0, (uint32_t)m.data_len, false);
    break;
  case GN_MSG_EXEC_WINDOW:
    if (m.ack > GN_EXEC_WINDOW - c->credit) {
      client_end(c, -1, "the provider returned more credit than it had");
      client_close(c, true);
      break;
    }
    c->credit += m.ack;
    flush_stdin(c);
    if (!c->pending.len)
      process(c); /* frames read while stdin waited */
    break;
  case GN_MSG_EXEC_EXIT:
    c->remote_done = true;
    client_end(c, m.code, m.reason);
    break;
  default:
    break;
  }
  gn__execmsg_done(&m);
}

void gn__exec_req_peer_down(gn_node *n, const uint8_t peer[GN_PK_LEN]) {
  for (client *c = n->exec ? n->exec->clients : NULL; c; c = c->next)
    if (c->opened && memcmp(c->peer, peer, GN_PK_LEN) == 0)
      client_end(c, -1, "lost the session to the provider");
}

void gn__exec_req_tick(gn_node *n, uint64_t now_ms) {
  for (client *c = n->exec ? n->exec->clients : NULL; c; c = c->next)
    if (c->opened && !c->started && !c->ended && gn_ms_since(now_ms, c->open_ms) > OPEN_TIMEOUT_MS)
      client_end(c, -1, "the provider did not answer the exec request within 20 s");
}

void gn__exec_req_close(gn_node *n) {
  if (!n->exec)
    return;
  for (client *c = n->exec->clients; c; c = c->next)
    client_close(c, true);
  if (n->exec->listener) {
    gn_uv_close_free((uv_handle_t *)n->exec->listener, NULL, NULL);
    n->exec->listener = NULL;
    unlink(n->exec->sock_path);
  }
}

int gn__exec_start(gn_node *n) {
  struct gn__exec *e = calloc(1, sizeof *e);
  if (!e)
    return -ENOMEM;
  n->exec = e;
  gn__pathf(e->sock_path, sizeof e->sock_path, "%s/gpunetd-exec.sock", n->cfg.data_dir);
  uv_pipe_t *p = gn_uv_handle_alloc(sizeof *p);
  if (!p)
    return -ENOMEM;
  uv_pipe_init(n->loop, p, 0);
  p->data = n;
  unlink(e->sock_path); /* a stale one: the control socket is ours, so is this */
  int r = uv_pipe_bind(p, e->sock_path);
  if (r == 0 && chmod(e->sock_path, 0600) < 0)
    r = -errno;
  if (r == 0)
    r = uv_listen((uv_stream_t *)p, 16, on_connection);
  if (r < 0) {
    gn_uv_close_free((uv_handle_t *)p, NULL, NULL);
    return r;
  }
  e->listener = p;
  return 0;
}

void gn__exec_peer_down(gn_node *n, const uint8_t peer[GN_PK_LEN]) {
  gn__exec_prov_peer_down(n, peer);
  gn__exec_req_peer_down(n, peer);
}

void gn__exec_tick(gn_node *n, uint64_t now_ms) {
  gn__exec_prov_tick(n, now_ms);
  gn__exec_req_tick(n, now_ms);
}

void gn__exec_close(gn_node *n) {
  gn__exec_prov_close(n);
  gn__exec_req_close(n);
}
