/* TCP transport on libuv: each connection is a gn_session fed from the
 * socket; this file only moves bytes, enforces limits and timeouts, and keeps
 * one session per peer. */
#include <gpunet/transport.h>
#include <gpunet/uvutil.h>

#include <gpunet/ratelimit.h>

#include <stdio.h>
#include <unistd.h>

#include "rateclass.h"
#include "session.h"

#define ADDR_MAX 80
#define READ_BUF 65536
#define TICK_MS 1000 /* at most; shorter when a limit is shorter */
/* How long a connection closed with a last word (an ERROR) may take to hand
 * it to the kernel before it is cut anyway. */
#define DRAIN_MS 2000
/* Connections draining at once at most; past them one is closed outright
 * (the peer then learns nothing), so a peer that keeps earning an ERROR
 * cannot make us hold connections outside every other count. */
#define DRAIN_MAX 64

typedef struct conn conn;

/* The remote address of a socket, and its host and network keys (empty
 * until known). */
typedef struct remote_info {
  char addr[ADDR_MAX];
  uint8_t host_key[GN_RATELIMIT_KEY_MAX], net_key[GN_RATELIMIT_KEY_MAX];
  uint8_t host_key_len, net_key_len;
} remote_info;

struct conn {
  gn_transport *t;
  uv_tcp_t *tcp;
  gn_session *s;
  conn *prev, *next;
  bool active; /* the session reported up for its peer */
  /* Lost to another session with the same peer (conn_wins): nothing is
   * sent on it any more, it is shut for writing, and what the peer had
   * already sent on it is still read and delivered until the peer's end
   * of it, or retire_deadline_ms. */
  bool retiring;
  uint64_t retire_deadline_ms;
  bool closing;
  bool reading;
  bool draining;       /* closed for the session, its last bytes still going out */
  bool handle_closing; /* uv_close called (draining connections only) */
  uint64_t drain_deadline_ms;
  bool has_expect; /* we dialled an address learnt with this key */
  uint8_t expect[GN_PK_LEN];
  char dial_addr[ADDR_MAX]; /* set when we dialled */
  size_t queued;            /* bytes handed to uv_write, not yet written */
  size_t queued_alloc;      /* what those write buffers hold allocated */
  size_t mem;               /* counted in t->mem_used: session buffers + queued_alloc */
  bool inbound;
  bool unauth; /* inbound, handshake not done: counted in t->unauth */
  remote_info r;
  gn_token_bucket buckets[GN__RC_COUNT];
  uint64_t created_ms;
  uint64_t last_tx_ms;       /* the last time bytes were handed to the socket */
  uint64_t sent_total;       /* bytes ever handed to uv_write */
  uint64_t written_seen;     /* of those, written to the kernel at the last check */
  uint64_t send_progress_ms; /* the last time that number grew, or the queue was empty */
  uint64_t last_use_ms;      /* the last message of a use class either way (is_use_class), 0: none yet */
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
  conn *drains; /* closed connections still writing their last bytes */
  size_t ndrains;
  size_t handles; /* allocated handles whose close callback has not run */
  size_t inbound, unauth;
  size_t mem_used; /* every conn's mem */
  gn_backoff *backoff;
  uint64_t tick_ms;
  /* One read buffer for every connection: libuv hands each read to on_read
   * before it allocates for the next. */
  uint8_t rbuf[READ_BUF];
  bool closing;
  void (*close_cb)(void *ud);
  void *close_ud;
  gn_transport_limits lim;
  gn_transport_stats st;
  gn_transport_limit_cb on_limit;
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
  gn_backoff_free(t->backoff);
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

/* A new connection around a fresh handle (a dial), or around one just
 * accepted (which the caller closes if this fails). */
static int conn_new(gn_transport *t, bool initiator, uv_tcp_t *accepted, conn **ret_c) {
  if (!accepted && t->nconns >= t->lim.max_conns)
    return GN_EBUSY;
  conn *c = calloc(1, sizeof(*c));
  if (!c)
    return GN_ENOMEM;
  c->t = t;
  uint64_t now = uv_now(t->loop);
  gn_session_cfg cfg = {.initiator = initiator,
                        .id = t->id,
                        .listen_addr = t->adv_addr,
                        .now_ms = now,
                        .handshake_timeout_ms = t->lim.handshake_timeout_ms,
                        .idle_timeout_ms = t->lim.idle_timeout_ms,
                        .msg_timeout_ms = t->lim.msg_timeout_ms,
                        .msg_min_rate_bps = t->lim.msg_min_rate_bps};
  int r = gn__session_new(&cfg, &c->s);
  if (r < 0) {
    free(c);
    return r;
  }
  if (accepted) {
    c->tcp = accepted; /* already counted in t->handles */
  } else {
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
    t->handles++;
  }
  c->tcp->data = c;
  for (int i = 0; i < GN__RC_COUNT; i++)
    gn_token_bucket_init(&c->buckets[i], gn__rate_class_get(i)->rate, now);
  c->created_ms = c->last_tx_ms = c->send_progress_ms = now;
  c->next = t->conns;
  if (t->conns)
    t->conns->prev = c;
  t->conns = c;
  t->nconns++;
  *ret_c = c;
  return 0;
}

static void remote_learn(uv_tcp_t *tcp, remote_info *ret) {
  struct sockaddr_storage ss;
  int len = sizeof(ss);
  memset(ret, 0, sizeof(*ret));
  if (uv_tcp_getpeername(tcp, (struct sockaddr *)&ss, &len) < 0)
    return;
  format_addr(&ss, ret->addr, sizeof(ret->addr));
  ret->host_key_len = (uint8_t)gn_ratelimit_addr_key((const struct sockaddr *)&ss, false, ret->host_key);
  ret->net_key_len = (uint8_t)gn_ratelimit_addr_key((const struct sockaddr *)&ss, true, ret->net_key);
}

/* Bytes c makes us hold: the session's buffers and the writes not done. */
static void conn_account(conn *c) {
  gn_transport *t = c->t;
  if (c->closing)
    return;
  size_t m = gn__session_mem(c->s) + c->queued_alloc;
  t->mem_used = t->mem_used - c->mem + m;
  c->mem = m;
  if (t->mem_used > t->st.mem_peak_bytes)
    t->st.mem_peak_bytes = t->mem_used;
}

static void report(gn_transport *t, const char *addr, const uint8_t *peer, const char *what, uint64_t backoff_ms) {
  if (t->on_limit && !t->closing)
    t->on_limit(t, addr, peer, what, backoff_ms, t->ud);
}

/* Takes c out of the list of open connections and of every count. */
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
  if (c->inbound)
    t->inbound--;
  if (c->unauth)
    t->unauth--;
  c->unauth = false;
  t->mem_used -= c->mem;
  c->mem = 0;
}

static void on_write(uv_write_t *req, int status) {
  wreq *w = (wreq *)req;
  conn *c = w->c;
  c->queued -= w->buf.len;
  c->queued_alloc -= w->buf.cap;
  gn_buf_done(&w->buf);
  free(w);
  if (status < 0)
    conn_close(c, status);
  else
    conn_account(c);
}

/* Hands the session's pending output to the socket. */
static int conn_flush(conn *c) {
  if (c->closing)
    return GN_ECLOSED;
  if (gn__session_output_len(c->s) == 0)
    return 0;
  if (c->queued + gn__session_output_len(c->s) > c->t->lim.sendq_max) {
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
  uint64_t now = uv_now(c->t->loop);
  if (c->queued == 0)
    c->send_progress_ms = now;
  c->queued += w->buf.len;
  c->queued_alloc += w->buf.cap;
  c->sent_total += w->buf.len;
  c->last_tx_ms = now;
  conn_account(c);
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

/* Closes c for misbehaving: its node key (once known) and its address are
 * refused for a while, doubling on each repeat. */
static void conn_punish_close(conn *c, int err, const char *what) {
  gn_transport *t = c->t;
  uint64_t now = uv_now(t->loop), ms = 0, k;
  uint8_t peer[GN_PK_LEN];
  bool up = gn__session_is_up(c->s) || c->active;
  char remote[ADDR_MAX];
  if (up)
    memcpy(peer, gn__session_peer(c->s), GN_PK_LEN);
  snprintf(remote, sizeof(remote), "%s", c->r.addr);
  if (up && (k = gn_backoff_punish(t->backoff, peer, GN_PK_LEN, now)) > ms)
    ms = k;
  if (c->r.host_key_len && (k = gn_backoff_punish(t->backoff, c->r.host_key, c->r.host_key_len, now)) > ms)
    ms = k;
  conn_close(c, err);
  report(t, remote, up ? peer : NULL, what, ms);
}

/* Makes room for extra bytes that self (may be NULL) is about to take:
 * while all connections together would hold more than the budget, the one
 * holding the most (self counted with extra; self on a tie) is closed and
 * backed off. False when self was closed. */
static bool budget_fit(gn_transport *t, conn *self, size_t extra) {
  while (t->mem_used + extra > t->lim.mem_budget) {
    conn *v = NULL;
    size_t vm = 0;
    for (conn *c = t->conns; c; c = c->next) {
      size_t m = c->mem + (c == self ? extra : 0);
      if (!v || m > vm || (m == vm && c == self)) {
        v = c;
        vm = m;
      }
    }
    if (!v || vm == 0)
      break;
    t->st.closed_budget++;
    conn_punish_close(v, GN_ETOOBIG, "held the most memory when the transport was over its budget");
    if (v == self)
      return false;
  }
  if (self && t->mem_used + extra > t->lim.mem_budget) {
    t->st.closed_budget++;
    conn_punish_close(self, GN_ETOOBIG, "would alone pass the memory budget");
    return false;
  }
  return true;
}

static void drain_unlink(conn *c) {
  conn **pp = &c->t->drains;
  while (*pp && *pp != c)
    pp = &(*pp)->next;
  if (*pp) {
    *pp = c->next;
    c->t->ndrains--;
  }
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
  if (t->closing || t->ndrains >= DRAIN_MAX || !(req = calloc(1, sizeof(*req)))) {
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
  t->ndrains++;
  req->data = c;
  if (uv_shutdown(req, (uv_stream_t *)c->tcp, on_shutdown) < 0) {
    free(req);
    drain_close(c);
  }
  if (was_active && t->cbs.on_peer_down)
    t->cbs.on_peer_down(t, gn__session_peer(c->s), t->ud);
}

static const uint8_t *initiator_of(const conn *c) {
  return gn__session_is_initiator(c->s) ? c->t->id->pk : gn__session_peer(c->s);
}

/* Whether c, just up, wins over e, up with the same peer: both ends keep
 * the session whose initiator has the smaller key and, of two from the same
 * initiator (a redundant dial), the one with the smaller handshake hash.
 * Each end decides from what both ends know, never from which session came
 * up first at it: the dialler has a session up when it sends the last
 * handshake message, the listener when that message arrives, so the two
 * can see two sessions come up in opposite orders. */
static bool conn_wins(const conn *c, const conn *e) {
  int cmp = memcmp(initiator_of(c), initiator_of(e), GN_PK_LEN);
  if (cmp == 0)
    cmp = memcmp(gn__session_handshake_hash(c->s), gn__session_handshake_hash(e->s), GN_NOISE_HASHLEN);
  return cmp < 0;
}

static void on_retire_shutdown(uv_shutdown_t *req, int status) {
  conn *c = req->data;
  free(req);
  /* UV_ECANCELED when the handle closes first: c is closing then. */
  if (status < 0 && !c->closing)
    conn_close(c, status);
}

/* c lost to another session with its peer (which stays up): nothing more
 * is sent on it; once what was queued is written it is shut for writing,
 * which tells the peer, who decides the same, that we are done with it.
 * It is still read, so that what the peer sent on it before it learnt of
 * the other session is delivered, not lost, and it closes when the peer
 * shuts its side (or at the deadline). */
static void conn_retire(conn *c) {
  gn_transport *t = c->t;
  c->active = false;
  c->retiring = true;
  c->retire_deadline_ms = uv_now(t->loop) + t->lim.handshake_timeout_ms;
  uv_shutdown_t *req = calloc(1, sizeof(*req));
  if (!req) {
    conn_close(c, GN_ENOMEM);
    return;
  }
  req->data = c;
  int r = uv_shutdown(req, (uv_stream_t *)c->tcp, on_retire_shutdown);
  if (r < 0) {
    free(req);
    conn_close(c, r);
  }
}

static void conn_on_up(conn *c) {
  gn_transport *t = c->t;
  const uint8_t *peer = gn__session_peer(c->s);
  if (c->unauth) {
    c->unauth = false;
    t->unauth--;
  }
  if (gn_backoff_refused(t->backoff, peer, GN_PK_LEN, uv_now(t->loop))) {
    uint8_t pk[GN_PK_LEN];
    char remote[ADDR_MAX];
    memcpy(pk, peer, GN_PK_LEN);
    snprintf(remote, sizeof(remote), "%s", c->r.addr);
    t->st.refused_backoff++;
    conn_close(c, GN_EPERM);
    report(t, remote, pk, "refused: its key is backed off", 0);
    return;
  }
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
    if (!conn_wins(c, e)) {
      conn_retire(c);
      return;
    }
    /* The new session replaces the old one without the peer going down. */
    c->active = true;
    conn_retire(e);
    return;
  }
  c->active = true;
  if (t->cbs.on_peer_up)
    t->cbs.on_peer_up(t, peer, gn__session_peer_addr(c->s), t->ud);
}

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf) {
  (void)suggested;
  conn *c = h->data;
  *buf = uv_buf_init((char *)c->t->rbuf, sizeof(c->t->rbuf));
}

/* The type of an encoded envelope ([v, type, ...]) from its first bytes,
 * before anything is verified: what the message is charged to. */
static int peek_type(const uint8_t *p, size_t n, uint32_t *ret_type) {
  size_t i = 0;
  uint64_t v[2] = {0, 0};
  if (n < 1)
    return GN_EINVAL;
  uint8_t b = p[i++];
  if ((b & 0xf0) == 0x90)
    ;
  else if (b == 0xdc)
    i += 2;
  else if (b == 0xdd)
    i += 4;
  else
    return GN_EINVAL;
  for (int k = 0; k < 2; k++) {
    size_t w;
    if (i >= n)
      return GN_EINVAL;
    b = p[i++];
    if (b <= 0x7f) {
      v[k] = b;
      continue;
    }
    if (b == 0xcc)
      w = 1;
    else if (b == 0xcd)
      w = 2;
    else if (b == 0xce)
      w = 4;
    else if (b == 0xcf)
      w = 8;
    else
      return GN_EINVAL;
    if (n - i < w)
      return GN_EINVAL;
    for (size_t j = 0; j < w; j++)
      v[k] = v[k] << 8 | p[i++];
  }
  if (v[1] > UINT32_MAX)
    return GN_EINVAL;
  *ret_type = (uint32_t)v[1];
  return 0;
}

/* Whether a message of class cls is the session's own business (a lease,
 * a job, billing, attestation, round trips) rather than the overlay's
 * upkeep (PEERS, gossip, views) or a keepalive: what makes a session in use
 * for gn_transport_get_peer_info's use_idle_ms. */
static bool is_use_class(int cls) {
  return cls == GN__RC_CONTROL || cls == GN__RC_BULK || cls == GN__RC_ATTEST || cls == GN__RC_RTT;
}

/* Charges one message of len bytes to its class; a peer over its rate is
 * closed and backed off (false). */
static bool conn_charge(conn *c, int cls, size_t len) {
  const gn__rate_class *rc = gn__rate_class_get(cls);
  if (gn_token_bucket_take(&c->buckets[cls], rc->rate, gn__rate_cost(cls, len), uv_now(c->t->loop)))
    return true;
  char what[64];
  snprintf(what, sizeof(what), "over its %s rate", rc->name);
  c->t->st.closed_rate++;
  conn_punish_close(c, GN_ETOOBIG, what);
  return false;
}

static void on_read(uv_stream_t *stream, ssize_t nread, const uv_buf_t *buf) {
  conn *c = stream->data;
  if (nread < 0) {
    conn_close(c, (int)nread);
    return;
  }
  const uint8_t *p = (const uint8_t *)buf->base;
  size_t pos = 0, len = (size_t)nread;
  gn__session_set_time(c->s, uv_now(c->t->loop));
  while (pos < len && !c->closing) {
    size_t used = 0;
    gn_session_event ev;
    int r = gn__session_feed(c->s, p + pos, len - pos, &used, &ev);
    pos += used;
    if (r >= 0) {
      /* What the peer made the session allocate counts at once. */
      conn_account(c);
      if (!budget_fit(c->t, NULL, 0) || c->closing)
        return;
    }
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
    } else if (ev.kind == GN_SESSION_EV_KEEPALIVE) {
      if (!conn_charge(c, GN__RC_KEEPALIVE, 0))
        return;
    } else if (ev.kind == GN_SESSION_EV_MESSAGE) {
      uint32_t type = 0;
      int cls = peek_type(ev.msg, ev.msg_len, &type) == 0 ? gn__rate_class_of(type) : GN__RC_OTHER;
      if (!conn_charge(c, cls, ev.msg_len))
        return;
      if (is_use_class(cls))
        c->last_use_ms = uv_now(c->t->loop);
      gn_envelope env;
      int er = gn_envelope_open_from(ev.msg, ev.msg_len, gn__session_peer(c->s), &env);
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
      /* A retiring session's messages were sent before the peer learnt
       * of the session that replaced it: delivered while that one is up. */
      bool deliver = c->active || (c->retiring && find_active(c->t, gn__session_peer(c->s)));
      if (deliver && c->t->cbs.on_message)
        c->t->cbs.on_message(c->t, gn__session_peer(c->s), &env, ev.msg, ev.msg_len, c->t->ud);
      if (c->closing)
        return;
      gn__session_trim(c->s);
      conn_account(c);
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

static size_t count_inbound_from(const gn_transport *t, const uint8_t *key, size_t len, bool net) {
  size_t n = 0;
  for (const conn *c = t->conns; c; c = c->next) {
    if (!c->inbound)
      continue;
    if (net ? c->r.net_key_len == len && memcmp(c->r.net_key, key, len) == 0
            : c->r.host_key_len == len && memcmp(c->r.host_key, key, len) == 0)
      n++;
  }
  return n;
}

/* Why a connection just accepted from r is refused, or NULL. Checked
 * before anything is allocated for it. */
static const char *inbound_refusal(gn_transport *t, const remote_info *r, bool *ret_backoff) {
  *ret_backoff = false;
  if (r->host_key_len && gn_backoff_refused(t->backoff, r->host_key, r->host_key_len, uv_now(t->loop))) {
    *ret_backoff = true;
    return "refused: its address is backed off";
  }
  if (t->nconns >= t->lim.max_conns || t->inbound >= t->lim.max_conns - t->lim.dial_reserve)
    return "refused: the node is at its connection limit";
  if (r->host_key_len && count_inbound_from(t, r->host_key, r->host_key_len, false) >= t->lim.max_inbound_per_host)
    return "refused: too many connections from its address";
  if (r->net_key_len && count_inbound_from(t, r->net_key, r->net_key_len, true) >= t->lim.max_inbound_per_net)
    return "refused: too many connections from its network";
  return NULL;
}

static int cmp_net(const void *x, const void *y) {
  const conn *a = *(const conn *const *)x, *b = *(const conn *const *)y;
  if (a->r.net_key_len != b->r.net_key_len)
    return a->r.net_key_len < b->r.net_key_len ? -1 : 1;
  int d = memcmp(a->r.net_key, b->r.net_key, a->r.net_key_len);
  if (d)
    return d;
  return a->created_ms < b->created_ms ? -1 : a->created_ms > b->created_ms;
}

/* All max_unauth places for handshakes are taken: rather than refuse every
 * newcomer while someone holds them, the oldest pre-handshake connection of
 * the network holding the most of them makes room (a real peer's handshake
 * takes a round trip or two; a flood's connections sit there). Sorting them
 * by network costs n log n; counting pairs would cost n^2 per accept. */
static void evict_unauth(gn_transport *t) {
  conn **v = malloc(t->unauth * sizeof(*v));
  size_t n = 0, best = 0, best_len = 0;
  if (!v)
    return;
  for (conn *c = t->conns; c && n < t->unauth; c = c->next)
    if (c->unauth)
      v[n++] = c;
  if (n == 0) {
    free(v);
    return;
  }
  qsort(v, n, sizeof(*v), cmp_net);
  for (size_t i = 0; i < n;) {
    size_t j = i + 1;
    while (j < n && v[j]->r.net_key_len == v[i]->r.net_key_len &&
           memcmp(v[j]->r.net_key, v[i]->r.net_key, v[i]->r.net_key_len) == 0)
      j++;
    /* On a tie, the network whose oldest waited longest. */
    if (j - i > best_len || (j - i == best_len && v[i]->created_ms < v[best]->created_ms)) {
      best = i; /* the oldest of its run */
      best_len = j - i;
    }
    i = j;
  }
  conn *victim = v[best];
  free(v);
  char remote[ADDR_MAX];
  snprintf(remote, sizeof(remote), "%s", victim->r.addr);
  t->st.refused_limit++;
  conn_close(victim, GN_EBUSY);
  report(t, remote, NULL, "closed in its handshake to make room: too many connections are in theirs", 0);
}

static void on_connection(uv_stream_t *server, int status) {
  gn_transport *t = server->data;
  conn *c = NULL;
  remote_info r;
  bool backoff;
  if (status < 0 || t->closing)
    return;
  /* Always accept, so the backlog does not fill with what we refuse. */
  uv_tcp_t *tcp = gn_uv_handle_alloc(sizeof(uv_tcp_t));
  if (!tcp || uv_tcp_init(t->loop, tcp) != 0) {
    gn_uv_handle_free_unused(tcp);
    return;
  }
  t->handles++;
  if (uv_accept(server, (uv_stream_t *)tcp) < 0) {
    gn_uv_close_free((uv_handle_t *)tcp, handle_freed, t);
    return;
  }
  remote_learn(tcp, &r);
  const char *why = inbound_refusal(t, &r, &backoff);
  if (!why && t->unauth >= t->lim.max_unauth)
    evict_unauth(t);
  if (why || conn_new(t, false, tcp, &c) < 0) {
    gn_uv_close_free((uv_handle_t *)tcp, handle_freed, t);
    if (why && backoff)
      t->st.refused_backoff++;
    else if (why)
      t->st.refused_limit++;
    if (why)
      report(t, r.addr, NULL, why, 0);
    return;
  }
  c->r = r;
  c->inbound = c->unauth = true;
  t->inbound++;
  t->unauth++;
  if (conn_start_reading(c) < 0)
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
  remote_learn(c->tcp, &c->r);
  int r = conn_start_reading(c);
  if (r == 0)
    r = gn__session_start(c->s);
  if (r < 0) {
    conn_close(c, r);
    return;
  }
  conn_flush(c);
}

/* A queue to the peer stalls when bytes wait in it and none were taken for
 * send_stall_ms; true (and c closed) then. */
static bool conn_send_stalled(conn *c, uint64_t now) {
  size_t waiting = c->tcp->write_queue_size;
  uint64_t written = c->sent_total - waiting;
  if (c->queued == 0 || waiting == 0 || written != c->written_seen) {
    c->written_seen = written;
    c->send_progress_ms = now;
    return false;
  }
  if (now - c->send_progress_ms < c->t->lim.send_stall_ms)
    return false;
  gn_transport *t = c->t;
  char remote[ADDR_MAX];
  uint8_t peer[GN_PK_LEN];
  bool up = c->active;
  if (up)
    memcpy(peer, gn__session_peer(c->s), GN_PK_LEN);
  snprintf(remote, sizeof(remote), "%s", c->r.addr);
  t->st.closed_timeout++;
  /* Not backed off: a peer that stopped reading may be gone or stuck, and
   * it only ever held its own queue. */
  conn_close(c, GN_ETIMEDOUT);
  report(t, remote, up ? peer : NULL, "took nothing we sent for too long", 0);
  return true;
}

static void on_tick(uv_timer_t *timer) {
  gn_transport *t = timer->data;
  uint64_t now = uv_now(t->loop);
  conn *next;
  for (conn *c = t->conns; c; c = next) {
    next = c->next;
    bool up = gn__session_is_up(c->s), receiving = gn__session_receiving(c->s);
    if (gn__session_tick(c->s, now) < 0) {
      t->st.closed_timeout++;
      if (up && receiving) {
        /* A message started and not finished at the minimum rate. */
        conn_punish_close(c, GN_ETIMEDOUT, "sent a message too slowly");
      } else {
        char remote[ADDR_MAX];
        snprintf(remote, sizeof(remote), "%s", c->r.addr);
        conn_close(c, GN_ETIMEDOUT);
        report(t, remote, NULL, up ? "idle for too long" : "did not finish its handshake in time", 0);
      }
      continue;
    }
    /* The tick may have let an idle receive buffer go. */
    conn_account(c);
    if (c->retiring && now >= c->retire_deadline_ms) {
      conn_close(c, GN_ETIMEDOUT);
      continue;
    }
    if (conn_send_stalled(c, now))
      continue;
    /* Nothing sent for a while: say we are here, so the peer's idle
     * timeout does not cut a quiet session (a lease between debit notes). */
    if (up && !c->retiring && c->queued == 0 && now - c->last_tx_ms >= t->lim.keepalive_ms &&
        gn__session_keepalive(c->s) == 0)
      conn_flush(c);
  }
  for (conn *c = t->drains; c; c = next) {
    next = c->next;
    if (now >= c->drain_deadline_ms)
      drain_close(c);
  }
}

static uint64_t tick_for(const gn_transport_limits *l) {
  uint64_t ms = TICK_MS;
  const uint64_t quarter[] = {l->handshake_timeout_ms, l->idle_timeout_ms, l->msg_timeout_ms, l->send_stall_ms,
                              l->keepalive_ms};
  for (size_t i = 0; i < GN_ARRAY_SIZE(quarter); i++)
    if (quarter[i] / 4 < ms)
      ms = quarter[i] / 4;
  return ms < 10 ? 10 : ms;
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
  gn_transport_limits_default(&t->lim);
  int r = gn_backoff_new(t->lim.backoff_cap, t->lim.backoff_base_ms, t->lim.backoff_max_ms, &t->backoff);
  if (r < 0) {
    free(t);
    return r;
  }
  t->timer = gn_uv_handle_alloc(sizeof(uv_timer_t));
  if (!t->timer) {
    gn_backoff_free(t->backoff);
    free(t);
    return GN_ENOMEM;
  }
  uv_timer_init(loop, t->timer); /* cannot fail */
  t->handles++;
  t->timer->data = t;
  t->tick_ms = tick_for(&t->lim);
  uv_timer_start(t->timer, on_tick, t->tick_ms, t->tick_ms);
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
  /* SO_REUSEPORT once bound: a TCP hole punch (docs/nat.md) connects from
   * this very address on a socket of its own that sets it before binding
   * (same user only); set after the bind, another listener still cannot
   * take the address from us. */
  uv_os_fd_t lfd;
  int one = 1;
  if ((r = uv_tcp_bind(l, (const struct sockaddr *)&ss, 0)) == 0 && uv_fileno((uv_handle_t *)l, &lfd) == 0)
    setsockopt(lfd, SOL_SOCKET, SO_REUSEPORT, &one, sizeof(one));
  if (r < 0 || (r = uv_listen((uv_stream_t *)l, 128, on_connection)) < 0) {
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
    if (e->closing || e->retiring || strcmp(e->dial_addr, addr) != 0)
      continue;
    /* Already dialled or up through this address. */
    if (expect && e->active && memcmp(gn__session_peer(e->s), expect, GN_PK_LEN) != 0)
      return GN_EPERM;
    return 0;
  }
  if ((r = conn_new(t, true, NULL, &c)) < 0)
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
  /* What the session's output will take for it: frames of at most
   * GN_NOISE_MAX_PAYLOAD, each with its length and tag, and the message's
   * 4-byte length. */
  size_t frames = (len + 4 + GN_NOISE_MAX_PAYLOAD - 1) / GN_NOISE_MAX_PAYLOAD;
  size_t need = len + 4 + frames * (2 + GN_NOISE_TAGLEN);
  if (c->queued + need > t->lim.sendq_max) {
    /* A peer that reads slowly hurts itself: closed, not backed off. */
    char remote[ADDR_MAX];
    snprintf(remote, sizeof(remote), "%s", c->r.addr);
    conn_close(c, GN_ETOOBIG);
    report(t, remote, peer, "let more than sendq_max wait for it", 0);
    return GN_ETOOBIG;
  }
  if (!budget_fit(t, c, need))
    return GN_ETOOBIG;
  int r = gn__session_send(c->s, env, len);
  if (r < 0) {
    if (gn__session_is_closed(c->s))
      conn_close(c, r);
    return r;
  }
  uint32_t type;
  if (peek_type(env, len, &type) == 0 && is_use_class(gn__rate_class_of(type)))
    c->last_use_ms = uv_now(t->loop);
  return conn_flush(c);
}

int gn_transport_close_peer(gn_transport *t, const uint8_t peer[GN_PK_LEN], const char *what) {
  if (!t || !peer)
    return GN_EINVAL;
  if (t->closing)
    return GN_ECLOSED;
  int r = GN_ENOTFOUND;
  conn *next;
  /* Dials in flight to that key first: they were never up, so closing them
   * reports nothing, and a dial of ours cannot bring the session back. Its
   * retiring sessions go too (nothing more is read from them); they were
   * never reported down, so that reports nothing either. */
  for (conn *c = t->conns; c; c = next) {
    next = c->next;
    if (c->retiring) {
      if (memcmp(gn__session_peer(c->s), peer, GN_PK_LEN) == 0)
        conn_close(c, GN_ECLOSED);
    } else if (!c->active && c->has_expect && memcmp(c->expect, peer, GN_PK_LEN) == 0) {
      conn_close(c, GN_ECLOSED);
      r = 0;
    }
  }
  conn *c = find_active(t, peer);
  if (c) {
    char remote[ADDR_MAX];
    snprintf(remote, sizeof(remote), "%s", c->r.addr);
    t->st.closed_by_us++;
    /* What we queued (a last DISCONNECT, a withdrawal) goes out before the
     * socket is shut; on_peer_down runs once, from inside this call. */
    conn_close_after_flush(c, GN_ECLOSED);
    report(t, remote, peer, what ? what : "closed: no longer needed", 0);
    r = 0;
  }
  return r;
}

int gn_transport_get_peer_info(const gn_transport *t, const uint8_t peer[GN_PK_LEN], gn_transport_peer_info *ret_info) {
  if (!t || !peer || !ret_info)
    return GN_EINVAL;
  const conn *c = find_active(t, peer);
  if (!c)
    return GN_ENOTFOUND;
  uint64_t now = uv_now(t->loop);
  gn_transport_peer_info i = {0};
  i.inbound = c->inbound;
  i.age_ms = now - c->created_ms;
  i.used = c->last_use_ms != 0;
  uint64_t since = i.used ? c->last_use_ms : c->created_ms;
  i.use_idle_ms = now > since ? now - since : 0;
  i.queued = c->queued + gn__session_output_len(c->s);
  snprintf(i.remote, sizeof(i.remote), "%s", c->r.addr);
  *ret_info = i;
  return 0;
}

size_t gn_transport_peers(const gn_transport *t, uint8_t (*ret_ids)[GN_PK_LEN], size_t cap) {
  size_t n = 0;
  for (const conn *c = t->conns; c; c = c->next)
    if (c->active && !c->closing) {
      if (n < cap)
        memcpy(ret_ids[n], gn__session_peer(c->s), GN_PK_LEN);
      n++;
    }
  return n;
}

void gn_transport_limits_default(gn_transport_limits *ret_l) {
  *ret_l = (gn_transport_limits){
      .max_conns = 512,
      .dial_reserve = 64,
      .max_inbound_per_host = 8,
      .max_inbound_per_net = 64,
      .max_unauth = 128,
      .handshake_timeout_ms = 10000,
      .idle_timeout_ms = 180000,
      .keepalive_ms = 60000,
      .msg_timeout_ms = 60000,
      .msg_min_rate_bps = 65536,
      .send_stall_ms = 30000,
      .sendq_max = 64u << 20,
      .mem_budget = 256u << 20,
      .backoff_base_ms = 60000,
      .backoff_max_ms = 3600000,
      .backoff_cap = 4096,
  };
}

int gn_transport_set_limits(gn_transport *t, const gn_transport_limits *l) {
  if (!t || !l)
    return GN_EINVAL;
  if (!l->max_conns || l->dial_reserve >= l->max_conns || !l->max_inbound_per_host ||
      l->max_inbound_per_net < l->max_inbound_per_host || !l->max_unauth || !l->handshake_timeout_ms ||
      !l->idle_timeout_ms || !l->keepalive_ms || l->keepalive_ms >= l->idle_timeout_ms || !l->msg_timeout_ms ||
      !l->msg_min_rate_bps || !l->send_stall_ms || !l->sendq_max || !l->mem_budget || !l->backoff_base_ms ||
      l->backoff_max_ms < l->backoff_base_ms || !l->backoff_cap)
    return GN_EINVAL;
  gn_backoff *b = NULL;
  int r = gn_backoff_new(l->backoff_cap, l->backoff_base_ms, l->backoff_max_ms, &b);
  if (r < 0)
    return r;
  gn_backoff_free(t->backoff);
  t->backoff = b;
  t->lim = *l;
  t->tick_ms = tick_for(l);
  if (!t->closing)
    uv_timer_start(t->timer, on_tick, t->tick_ms, t->tick_ms);
  return 0;
}

void gn_transport_get_stats(const gn_transport *t, gn_transport_stats *ret_s) {
  *ret_s = t->st;
  ret_s->conns = t->nconns;
  ret_s->inbound = t->inbound;
  ret_s->unauth = t->unauth;
  ret_s->mem_bytes = t->mem_used;
  ret_s->backoff_keys = gn_backoff_count(t->backoff);
}

void gn_transport_set_limit_cb(gn_transport *t, gn_transport_limit_cb cb) {
  if (t)
    t->on_limit = cb;
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

/* A relay's splice (docs/nat.md) is a TCP connection this node made, to
 * the relay, that another node's bytes come through: after the token
 * exchange it carries an ordinary session, so it is taken up like a dial
 * (counted as ours, never as accepted), with the key it must prove. */
int gn_transport_adopt(gn_transport *t, uv_os_sock_t fd, bool initiator, const uint8_t expect[GN_PK_LEN]) {
  conn *c = NULL;
  int r;
  if (t->closing || !expect) {
    close(fd);
    return t->closing ? GN_ECLOSED : GN_EINVAL;
  }
  if ((r = conn_new(t, initiator, NULL, &c)) < 0) {
    close(fd);
    return r;
  }
  c->has_expect = true;
  memcpy(c->expect, expect, GN_PK_LEN);
  if ((r = uv_tcp_open(c->tcp, fd)) < 0) {
    close(fd);
    conn_close(c, r);
    return r;
  }
  remote_learn(c->tcp, &c->r);
  r = conn_start_reading(c);
  if (r == 0 && initiator)
    r = gn__session_start(c->s);
  if (r < 0) {
    conn_close(c, r);
    return r;
  }
  conn_flush(c);
  return 0;
}
