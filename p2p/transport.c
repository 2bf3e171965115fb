/* TCP transport on libuv: each connection is a gn_session fed from the
 * socket; this file only moves bytes, enforces limits and timeouts, and keeps
 * one session per peer. */
#include <gpunet/transport.h>
#include <gpunet/uvutil.h>

#include <stdio.h>

#include "session.h"

#define ADDR_MAX 80
#define READ_BUF 65536
#define SENDQ_MAX (64u << 20) /* bytes queued to one peer before we give up on it */
#define MAX_CONNS 512
#define TICK_MS 1000
/* How long a connection closed with a last word (an ERROR) may take to hand
 * it to the kernel before it is cut anyway. */
#define DRAIN_MS 2000

typedef struct conn conn;

struct conn {
  gn_transport *t;
  uv_tcp_t *tcp;
  gn_session *s;
  conn *prev, *next;
  bool active; /* the session reported up for its peer */
  bool closing;
  bool reading;
  bool draining;       /* closed for the session, its last bytes still going out */
  bool handle_closing; /* uv_close called (draining connections only) */
  uint64_t drain_deadline_ms;
  bool has_expect; /* we dialled an address learnt with this key */
  uint8_t expect[GN_PK_LEN];
  char dial_addr[ADDR_MAX]; /* set when we dialled */
  size_t queued;            /* bytes handed to uv_write, not yet written */
  uint8_t rbuf[READ_BUF];
};

struct gn_transport {
  uv_loop_t *loop;
  const gn_identity *id;
  gn_transport_cbs cbs;
  gn_transport_refused_cb on_refused;
  void *ud;
  uv_tcp_t *listener;
  uv_timer_t *timer;
  char listen_addr[ADDR_MAX];
  char adv_addr[GN_SESSION_ADDR_MAX];
  conn *conns;
  size_t nconns;
  conn *drains;   /* closed connections still writing their last bytes */
  size_t handles; /* allocated handles whose close callback has not run */
  bool closing;
  void (*close_cb)(void *ud);
  void *close_ud;
};

typedef struct wreq {
  uv_write_t req;
  conn *c;
  gn_buf buf;
} wreq;

static void conn_close(conn *c, int err);

/* --- addresses ------------------------------------------------------------*/

/* Numeric "host:port" (IPv4, [IPv6] or localhost) to a sockaddr. */
static int parse_addr(const char *addr, struct sockaddr_storage *ret) {
  char host[64];
  const char *colon = addr ? strrchr(addr, ':') : NULL;
  if (!colon || colon == addr)
    return GN_EINVAL;
  size_t hl = (size_t)(colon - addr);
  const char *h = addr;
  if (addr[0] == '[') {
    if (hl < 2 || addr[hl - 1] != ']')
      return GN_EINVAL;
    h = addr + 1;
    hl -= 2;
  }
  if (hl == 0 || hl >= sizeof(host))
    return GN_EINVAL;
  memcpy(host, h, hl);
  host[hl] = '\0';
  const char *p = colon + 1;
  if (!*p || strlen(p) > 5)
    return GN_EINVAL;
  unsigned port = 0;
  for (; *p; p++) {
    if (*p < '0' || *p > '9')
      return GN_EINVAL;
    port = port * 10 + (unsigned)(*p - '0');
  }
  if (port > 65535)
    return GN_EINVAL;
  struct sockaddr_storage ss;
  memset(&ss, 0, sizeof(ss));
  if (strcmp(host, "localhost") == 0)
    snprintf(host, sizeof(host), "127.0.0.1");
  if (uv_ip4_addr(host, (int)port, (struct sockaddr_in *)&ss) != 0 &&
      uv_ip6_addr(host, (int)port, (struct sockaddr_in6 *)&ss) != 0)
    return GN_EINVAL;
  /* uv_ip4_addr accepts some odd spellings; require a real literal. */
  if (ss.ss_family == AF_INET) {
    struct in_addr a;
    if (inet_pton(AF_INET, host, &a) != 1)
      return GN_EINVAL;
  }
  *ret = ss;
  return 0;
}

static void format_addr(const struct sockaddr_storage *ss, char *out, size_t cap) {
  char host[64] = "";
  if (ss->ss_family == AF_INET6) {
    const struct sockaddr_in6 *a = (const struct sockaddr_in6 *)ss;
    uv_ip6_name(a, host, sizeof(host));
    snprintf(out, cap, "[%s]:%u", host, (unsigned)ntohs(a->sin6_port));
  } else {
    const struct sockaddr_in *a = (const struct sockaddr_in *)ss;
    uv_ip4_name(a, host, sizeof(host));
    snprintf(out, cap, "%s:%u", host, (unsigned)ntohs(a->sin_port));
  }
}

/* --- handle bookkeeping ---------------------------------------------------*/

static void transport_maybe_free(gn_transport *t) {
  if (!t->closing || t->handles > 0)
    return;
  void (*cb)(void *) = t->close_cb;
  void *ud = t->close_ud;
  free(t);
  if (cb)
    cb(ud);
}

static void handle_freed(void *arg) {
  gn_transport *t = arg;
  t->handles--;
  transport_maybe_free(t);
}

static void conn_freed(void *arg) {
  conn *c = arg;
  gn_transport *t = c->t;
  gn__session_free(c->s);
  free(c);
  t->handles--;
  transport_maybe_free(t);
}

/* --- connections ----------------------------------------------------------*/

static int conn_new(gn_transport *t, bool initiator, conn **ret_c) {
  if (t->nconns >= MAX_CONNS)
    return GN_EBUSY;
  conn *c = calloc(1, sizeof(*c));
  if (!c)
    return GN_ENOMEM;
  c->t = t;
  gn_session_cfg cfg = {.initiator = initiator, .id = t->id, .listen_addr = t->adv_addr, .now_ms = uv_now(t->loop)};
  int r = gn__session_new(&cfg, &c->s);
  if (r < 0) {
    free(c);
    return r;
  }
  c->tcp = gn_uv_handle_alloc(sizeof(uv_tcp_t));
  if (!c->tcp) {
    gn__session_free(c->s);
    free(c);
    return GN_ENOMEM;
  }
  if ((r = uv_tcp_init(t->loop, c->tcp)) < 0) {
    /* Never initialised, so no close callback will come. */
    gn_uv_handle_free_unused(c->tcp);
    gn__session_free(c->s);
    free(c);
    return r;
  }
  c->tcp->data = c;
  t->handles++;
  c->next = t->conns;
  if (t->conns)
    t->conns->prev = c;
  t->conns = c;
  t->nconns++;
  *ret_c = c;
  return 0;
}

static void conn_unlink(conn *c) {
  gn_transport *t = c->t;
  if (c->prev)
    c->prev->next = c->next;
  else if (t->conns == c)
    t->conns = c->next;
  if (c->next)
    c->next->prev = c->prev;
  c->prev = c->next = NULL;
  t->nconns--;
}

static void on_write(uv_write_t *req, int status) {
  wreq *w = (wreq *)req;
  conn *c = w->c;
  c->queued -= w->buf.len;
  gn_buf_done(&w->buf);
  free(w);
  if (status < 0)
    conn_close(c, status);
}

/* Hands the session's pending output to the socket. */
static int conn_flush(conn *c) {
  if (c->closing)
    return GN_ECLOSED;
  if (gn__session_output_len(c->s) == 0)
    return 0;
  if (c->queued + gn__session_output_len(c->s) > SENDQ_MAX) {
    conn_close(c, GN_ETOOBIG);
    return GN_ETOOBIG;
  }
  wreq *w = calloc(1, sizeof(*w));
  if (!w) {
    conn_close(c, GN_ENOMEM);
    return GN_ENOMEM;
  }
  int r = gn__session_take_output(c->s, &w->buf);
  if (r < 0) {
    free(w);
    conn_close(c, r);
    return r;
  }
  w->c = c;
  uv_buf_t b = uv_buf_init((char *)w->buf.data, (unsigned)w->buf.len);
  if ((r = uv_write(&w->req, (uv_stream_t *)c->tcp, &b, 1, on_write)) < 0) {
    gn_buf_done(&w->buf);
    free(w);
    conn_close(c, r);
    return r;
  }
  c->queued += w->buf.len;
  return 0;
}

static conn *find_active(const gn_transport *t, const uint8_t peer[GN_PK_LEN]) {
  for (conn *c = t->conns; c; c = c->next)
    if (c->active && !c->closing && memcmp(gn__session_peer(c->s), peer, GN_PK_LEN) == 0)
      return c;
  return NULL;
}

static void conn_close(conn *c, int err) {
  (void)err; /* the caller learns of it through on_peer_down only */
  if (c->closing)
    return;
  gn_transport *t = c->t;
  c->closing = true;
  bool was_active = c->active;
  c->active = false;
  conn_unlink(c);
  if (c->reading)
    uv_read_stop((uv_stream_t *)c->tcp);
  gn_uv_close_free((uv_handle_t *)c->tcp, conn_freed, c);
  if (was_active && !t->closing && t->cbs.on_peer_down)
    t->cbs.on_peer_down(t, gn__session_peer(c->s), t->ud);
}

static void drain_unlink(conn *c) {
  conn **pp = &c->t->drains;
  while (*pp && *pp != c)
    pp = &(*pp)->next;
  if (*pp)
    *pp = c->next;
  c->next = NULL;
}

/* Ends a draining connection's handle (once). A pending shutdown request is
 * cancelled by uv_close and its callback runs before the close callback. */
static void drain_close(conn *c) {
  if (c->handle_closing)
    return;
  c->handle_closing = true;
  drain_unlink(c);
  gn_uv_close_free((uv_handle_t *)c->tcp, conn_freed, c);
}

static void on_shutdown(uv_shutdown_t *req, int status) {
  (void)status;
  conn *c = req->data;
  free(req);
  drain_close(c);
}

/* Closes the session like conn_close, but lets the bytes already queued (the
 * ERROR that says why) reach the peer first: the socket is shut down for
 * writing once they are written, and closed then, or after DRAIN_MS. */
static void conn_close_after_flush(conn *c, int err) {
  if (c->closing)
    return;
  gn_transport *t = c->t;
  bool was_active = c->active;
  uv_shutdown_t *req = NULL;
  if (conn_flush(c) < 0)
    return; /* conn_flush closed it */
  if (t->closing || !(req = calloc(1, sizeof(*req)))) {
    conn_close(c, err);
    return;
  }
  c->closing = true;
  c->active = false;
  conn_unlink(c);
  if (c->reading)
    uv_read_stop((uv_stream_t *)c->tcp);
  c->draining = true;
  c->drain_deadline_ms = uv_now(t->loop) + DRAIN_MS;
  c->next = t->drains;
  t->drains = c;
  req->data = c;
  if (uv_shutdown(req, (uv_stream_t *)c->tcp, on_shutdown) < 0) {
    free(req);
    drain_close(c);
  }
  if (was_active && t->cbs.on_peer_down)
    t->cbs.on_peer_down(t, gn__session_peer(c->s), t->ud);
}

/* The side whose initiator has the smaller key wins; both ends compute the
 * same answer for a crossed pair of connections. */
static const uint8_t *initiator_of(const conn *c) {
  return gn__session_is_initiator(c->s) ? c->t->id->pk : gn__session_peer(c->s);
}

static void conn_on_up(conn *c) {
  gn_transport *t = c->t;
  const uint8_t *peer = gn__session_peer(c->s);
  if (memcmp(peer, t->id->pk, GN_PK_LEN) == 0) {
    conn_close(c, GN_EINVAL); /* we dialled ourselves */
    return;
  }
  if (c->has_expect && memcmp(peer, c->expect, GN_PK_LEN) != 0) {
    /* The address was advertised for another node: whoever answers there
     * now is not the peer we were told of, so it is not taken up at all. */
    uint8_t got[GN_PK_LEN];
    memcpy(got, peer, GN_PK_LEN);
    conn_close(c, GN_EPERM);
    if (t->on_refused && !t->closing)
      t->on_refused(t, c->dial_addr, c->expect, got, t->ud);
    return;
  }
  conn *e = find_active(t, peer);
  if (e) {
    int cmp = memcmp(initiator_of(c), initiator_of(e), GN_PK_LEN);
    if (cmp >= 0) {
      /* Same initiator (a redundant dial) or the other one wins: keep the
       * older session. */
      conn_close(c, GN_EEXIST);
      return;
    }
    /* The new session replaces the old one without the peer going down. */
    e->active = false;
    c->active = true;
    conn_close(e, GN_EEXIST);
    return;
  }
  c->active = true;
  if (t->cbs.on_peer_up)
    t->cbs.on_peer_up(t, peer, gn__session_peer_addr(c->s), t->ud);
}

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf) {
  (void)suggested;
  conn *c = h->data;
  *buf = uv_buf_init((char *)c->rbuf, sizeof(c->rbuf));
}

static void on_read(uv_stream_t *stream, ssize_t nread, const uv_buf_t *buf) {
  conn *c = stream->data;
  if (nread < 0) {
    conn_close(c, (int)nread);
    return;
  }
  const uint8_t *p = (const uint8_t *)buf->base;
  size_t pos = 0, len = (size_t)nread;
  while (pos < len && !c->closing) {
    size_t used = 0;
    gn_session_event ev;
    int r = gn__session_feed(c->s, p + pos, len - pos, &used, &ev);
    pos += used;
    if (r < 0) {
      /* A peer of another version gets the end of the handshake and an
       * ERROR before the connection closes; anything else closes at once. */
      if (r == GN_EVERSION)
        conn_close_after_flush(c, r);
      else
        conn_close(c, r);
      return;
    }
    if (conn_flush(c) < 0)
      return;
    if (r == 0)
      break;
    if (ev.kind == GN_SESSION_EV_UP) {
      conn_on_up(c);
    } else if (ev.kind == GN_SESSION_EV_MESSAGE) {
      gn_envelope env;
      int er = gn_envelope_open(ev.msg, ev.msg_len, &env);
      if (er == GN_EVERSION) {
        /* Say which version we speak, then close. */
        uint64_t v = 0;
        gn_buf err = {0};
        gn__proto_peek_version(ev.msg, ev.msg_len, &v);
        if (gn__proto_version_error(c->t->id, v, &err) == 0 && gn__session_send(c->s, err.data, err.len) == 0)
          conn_close_after_flush(c, er);
        else
          conn_close(c, er);
        gn_buf_done(&err);
        return;
      }
      if (er < 0) {
        /* Not an envelope, or one whose signature does not verify: a peer
         * that sends either is broken or hostile, and the whole session
         * ends, not just the message (docs/protocol.md §1.5). */
        conn_close(c, er);
        return;
      }
      if (c->active && c->t->cbs.on_message)
        c->t->cbs.on_message(c->t, gn__session_peer(c->s), &env, ev.msg, ev.msg_len, c->t->ud);
    }
  }
}

static int conn_start_reading(conn *c) {
  /* Every frame is a whole message, written at once: Nagle's algorithm
   * would only hold a small one (a job's status, a log chunk) back until
   * the peer's delayed ACK of the one before it, up to 40 ms. */
  uv_tcp_nodelay(c->tcp, 1); /* an option only; a socket without it still works */
  int r = uv_read_start((uv_stream_t *)c->tcp, on_alloc, on_read);
  if (r < 0)
    return r;
  c->reading = true;
  return 0;
}

static void on_connection(uv_stream_t *server, int status) {
  gn_transport *t = server->data;
  conn *c = NULL;
  if (status < 0 || t->closing)
    return;
  if (conn_new(t, false, &c) < 0) {
    /* Accept and drop, so the backlog does not fill with what we refuse. */
    uv_tcp_t *tmp = gn_uv_handle_alloc(sizeof(uv_tcp_t));
    if (tmp && uv_tcp_init(t->loop, tmp) == 0) {
      t->handles++;
      uv_accept(server, (uv_stream_t *)tmp);
      gn_uv_close_free((uv_handle_t *)tmp, handle_freed, t);
    } else {
      gn_uv_handle_free_unused(tmp);
    }
    return;
  }
  if (uv_accept(server, (uv_stream_t *)c->tcp) < 0 || conn_start_reading(c) < 0)
    conn_close(c, GN_EIO);
}

static void on_connect(uv_connect_t *req, int status) {
  conn *c = req->data;
  free(req);
  if (c->closing)
    return;
  if (status < 0) {
    conn_close(c, status);
    return;
  }
  int r = conn_start_reading(c);
  if (r == 0)
    r = gn__session_start(c->s);
  if (r < 0) {
    conn_close(c, r);
    return;
  }
  conn_flush(c);
}

static void on_tick(uv_timer_t *timer) {
  gn_transport *t = timer->data;
  uint64_t now = uv_now(t->loop);
  conn *next;
  for (conn *c = t->conns; c; c = next) {
    next = c->next;
    if (gn__session_tick(c->s, now) < 0)
      conn_close(c, GN_ETIMEDOUT);
  }
  for (conn *c = t->drains; c; c = next) {
    next = c->next;
    if (now >= c->drain_deadline_ms)
      drain_close(c);
  }
}

/* --- public API -----------------------------------------------------------*/

int gn_transport_new(uv_loop_t *loop, const gn_identity *id, const gn_transport_cbs *cbs, void *ud,
                     gn_transport **ret_t) {
  if (!loop || !id || !ret_t)
    return GN_EINVAL;
  gn_transport *t = calloc(1, sizeof(*t));
  if (!t)
    return GN_ENOMEM;
  t->loop = loop;
  t->id = id;
  if (cbs)
    t->cbs = *cbs;
  t->ud = ud;
  t->timer = gn_uv_handle_alloc(sizeof(uv_timer_t));
  if (!t->timer) {
    free(t);
    return GN_ENOMEM;
  }
  uv_timer_init(loop, t->timer); /* cannot fail */
  t->handles++;
  t->timer->data = t;
  uv_timer_start(t->timer, on_tick, TICK_MS, TICK_MS);
  /* Timeouts alone should not keep a loop alive. */
  uv_unref((uv_handle_t *)t->timer);
  *ret_t = t;
  return 0;
}

int gn_transport_listen(gn_transport *t, const char *addr) {
  struct sockaddr_storage ss;
  int r;
  if (t->closing)
    return GN_ECLOSED;
  if (t->listener)
    return GN_EEXIST;
  if ((r = parse_addr(addr, &ss)) < 0)
    return r;
  uv_tcp_t *l = gn_uv_handle_alloc(sizeof(uv_tcp_t));
  if (!l)
    return GN_ENOMEM;
  if ((r = uv_tcp_init(t->loop, l)) < 0) {
    gn_uv_handle_free_unused(l);
    return r;
  }
  t->handles++;
  l->data = t;
  if ((r = uv_tcp_bind(l, (const struct sockaddr *)&ss, 0)) < 0 ||
      (r = uv_listen((uv_stream_t *)l, 128, on_connection)) < 0) {
    gn_uv_close_free((uv_handle_t *)l, handle_freed, t);
    return r;
  }
  int len = sizeof(ss);
  if ((r = uv_tcp_getsockname(l, (struct sockaddr *)&ss, &len)) < 0) {
    gn_uv_close_free((uv_handle_t *)l, handle_freed, t);
    return r;
  }
  t->listener = l;
  format_addr(&ss, t->listen_addr, sizeof(t->listen_addr));
  size_t alen = strlen(t->listen_addr);
  if (!t->adv_addr[0] && alen < sizeof(t->adv_addr))
    memcpy(t->adv_addr, t->listen_addr, alen + 1);
  return 0;
}

const char *gn_transport_listen_addr(const gn_transport *t) {
  return t->listen_addr;
}

int gn_transport_set_advertised_addr(gn_transport *t, const char *addr) {
  if (!addr || strlen(addr) >= sizeof(t->adv_addr))
    return GN_EINVAL;
  snprintf(t->adv_addr, sizeof(t->adv_addr), "%s", addr);
  return 0;
}

int gn_transport_connect(gn_transport *t, const char *addr) {
  return gn_transport_connect_peer(t, addr, NULL);
}

int gn_transport_connect_peer(gn_transport *t, const char *addr, const uint8_t expect[GN_PK_LEN]) {
  struct sockaddr_storage ss;
  conn *c = NULL;
  int r;
  if (t->closing)
    return GN_ECLOSED;
  if (!addr || strlen(addr) >= ADDR_MAX)
    return GN_EINVAL;
  if ((r = parse_addr(addr, &ss)) < 0)
    return r;
  for (conn *e = t->conns; e; e = e->next) {
    if (e->closing || strcmp(e->dial_addr, addr) != 0)
      continue;
    /* Already dialled or up through this address. */
    if (expect && e->active && memcmp(gn__session_peer(e->s), expect, GN_PK_LEN) != 0)
      return GN_EPERM;
    return 0;
  }
  if ((r = conn_new(t, true, &c)) < 0)
    return r;
  if (expect) {
    c->has_expect = true;
    memcpy(c->expect, expect, GN_PK_LEN);
  }
  snprintf(c->dial_addr, sizeof(c->dial_addr), "%s", addr);
  uv_connect_t *req = calloc(1, sizeof(*req));
  if (!req) {
    conn_close(c, GN_ENOMEM);
    return GN_ENOMEM;
  }
  req->data = c;
  if ((r = uv_tcp_connect(req, c->tcp, (const struct sockaddr *)&ss, on_connect)) < 0) {
    free(req);
    /* libuv has not taken the request, so no callback comes; the connection
     * was never up, so closing it reports nothing either. */
    conn_close(c, r);
    return r;
  }
  return 0;
}

int gn_transport_send(gn_transport *t, const uint8_t peer[GN_PK_LEN], const uint8_t *env, size_t len) {
  if (t->closing)
    return GN_ECLOSED;
  conn *c = find_active(t, peer);
  if (!c)
    return GN_ENOTFOUND;
  if (c->queued + len > SENDQ_MAX) {
    conn_close(c, GN_ETOOBIG);
    return GN_ETOOBIG;
  }
  int r = gn__session_send(c->s, env, len);
  if (r < 0) {
    if (gn__session_is_closed(c->s))
      conn_close(c, r);
    return r;
  }
  return conn_flush(c);
}

void gn_transport_set_refused_cb(gn_transport *t, gn_transport_refused_cb cb) {
  if (t)
    t->on_refused = cb;
}

bool gn_transport_is_up(const gn_transport *t, const uint8_t peer[GN_PK_LEN]) {
  return find_active(t, peer) != NULL;
}

size_t gn_transport_peer_count(const gn_transport *t) {
  size_t n = 0;
  for (const conn *c = t->conns; c; c = c->next)
    if (c->active && !c->closing)
      n++;
  return n;
}

void gn_transport_close(gn_transport *t, void (*cb)(void *ud), void *ud) {
  if (!t || t->closing)
    return;
  t->closing = true;
  t->close_cb = cb;
  t->close_ud = ud;
  while (t->conns)
    conn_close(t->conns, GN_ECLOSED);
  while (t->drains)
    drain_close(t->drains);
  if (t->listener)
    gn_uv_close_free((uv_handle_t *)t->listener, handle_freed, t);
  gn_uv_close_free((uv_handle_t *)t->timer, handle_freed, t);
}
