/* The daemon's home networks (docs/nat.md): drives p2p/nat.c (observed
 * addresses, the NAT type, hole punching) on the overlay's UDP socket and
 * over sessions, and p2p/relay.c when this node volunteers as a relay: a
 * TCP listener for splices, each a pair of connections that presented the
 * two tokens of one call, copied both ways within the relay's byte budgets.
 * A node behind NAT reserves slots at relays, and takes a splice the relay
 * calls it to, or one it asked for, up as an ordinary session
 * (gn_transport_adopt): the Noise handshake runs end to end through it. */
#include "node_internal.h"
#include "overlay.h"

#include <gpunet/nat.h>
#include <gpunet/relay.h>
#include <gpunet/uvutil.h>

#include <jansson.h>
#include <sodium.h>
#include <stdio.h>
#include <unistd.h>

#define TICK_MS 1000
#define RESERVE_MAX 4                /* relays we hold (or ask for) a slot at */
#define RESERVE_RETRY_MS 600000      /* a node that refused is asked again after */
#define RESERVE_RENEW_MS 60000       /* a slot is renewed this long before it lapses */
#define CALLS_MAX 16                 /* our calls through relays, remembered */
#define DIALS_MAX 16                 /* splice connections we are making */
#define SPLICES_MAX 64               /* connections at our relay, paired or not */
#define SPLICE_HELD_MAX 65536        /* bytes after the token held until the pair is up */
#define SPLICE_QUEUE_HIGH (1u << 20) /* stop reading a side while the other has this much queued */
#define SPLICE_QUEUE_LOW (256u << 10)
#define RESULTS_MAX 16 /* punch outcomes remembered */
#define PEERS_MAX 64   /* session peers we ask where they see us */

typedef struct sconn sconn;
struct sconn {
  struct gn__nat *g;
  uv_tcp_t *tcp;
  sconn *next, *other;
  uint64_t pair;
  bool claimed, closing, reading;
  uint8_t pre[GN_RELAY_TOKEN_LEN];
  size_t pre_len;
  gn_buf held;
  uint64_t deadline_ms; /* to claim and be paired; 0 once spliced */
  uint64_t resume_ms;   /* paused by the byte budget until then (0: not) */
  size_t queued;        /* bytes written to this side, not yet taken by the kernel */
};

typedef struct dial {
  struct gn__nat *g;
  uv_tcp_t *tcp;
  struct dial *next;
  uint8_t token[GN_RELAY_TOKEN_LEN];
  uint8_t expect[GN_PK_LEN];
  uint8_t relay[GN_PK_LEN]; /* whose splice it is */
  bool initiator;
  bool closed; /* closed by gn__nat_close: its connect callback only frees the request */
} dial;

/* A TCP punch's connect (docs/nat.md): a socket of its own bound to our
 * listening address, connecting to the peer's outside endpoint. */
typedef struct tdial {
  struct gn__nat *g;
  uv_tcp_t *tcp;
  struct tdial *next;
  uint8_t peer[GN_PK_LEN];
  bool initiator;
  bool closed; /* closed before its connect callback: that only frees the request */
  uint64_t deadline_ms;
} tdial;

typedef struct reservation {
  bool used, ok;
  uint8_t relay[GN_PK_LEN];
  char relay_addr[GN_NAT_ADDR_MAX]; /* where the relay's sessions are (its handshake's address) */
  uint64_t asked_ms, expires_ms;
  char splice[64];
  char why[GN_RELAY_WHY_MAX];
} reservation;

typedef struct call {
  bool used;
  uint8_t relay[GN_PK_LEN], target[GN_PK_LEN];
  uint64_t at_ms;
  char state[16]; /* "calling", "dialling", "refused", "failed" */
  char why[GN_RELAY_WHY_MAX];
} call;

typedef struct sess_peer {
  bool used;
  uint8_t id[GN_PK_LEN];
  char addr[GN_NAT_ADDR_MAX];
} sess_peer;

typedef struct result {
  bool used, ok;
  uint8_t peer[GN_PK_LEN];
  char addr[GN_NAT_ADDR_MAX];
} result;

struct gn__nat {
  gn_node *n;
  gn_nat *nat;
  gn_relay *relay;                /* NULL unless relay = on */
  gn_reach *reach;                /* peers we reach through the relays their offers name */
  uint8_t offer_relay[GN_PK_LEN]; /* the relay our offers name now (zero: none) */
  uv_timer_t *timer;
  uv_tcp_t *listener;
  char splice_addr[64];
  sconn *splices;
  size_t nsplices;
  dial *dials;
  size_t ndials;
  tdial *tdials;
  size_t ntdials;
  uint8_t held[GN_NAT_TCP_MAX][GN_PK_LEN]; /* peers whose relay call waits for a TCP punch */
  bool held_used[GN_NAT_TCP_MAX];
  reservation res[RESERVE_MAX];
  call calls[CALLS_MAX];
  result results[RESULTS_MAX];
  sess_peer peers[PEERS_MAX]; /* sessions that came up with an address (pruned when down) */
  size_t next_result;
  gn_nat_type type;
  char advertised[GN_NAT_ADDR_MAX];
  bool closing;
  char error[120];
};

static void arm(struct gn__nat *g);

/* --- sending -------------------------------------------------------------------*/

static void nat_dgram(void *ud, const char *addr, uint32_t type, const uint8_t *body, size_t len) {
  struct gn__nat *g = ud;
  gn__overlay_send(g->n, addr, type, body, len);
}

static int nat_msg(void *ud, const uint8_t peer[GN_PK_LEN], uint32_t type, const uint8_t *body, size_t len) {
  struct gn__nat *g = ud;
  gn_buf env = {0};
  if (!g->n->tp)
    return GN_ECLOSED;
  int r = gn_envelope_seal(g->n->id, type, body, len, &env);
  if (r == 0)
    r = gn_transport_send(g->n->tp, peer, env.data, env.len);
  gn_buf_done(&env);
  return r;
}

static void nat_punched(void *ud, const uint8_t peer[GN_PK_LEN], const char *addr, bool ok) {
  struct gn__nat *g = ud;
  char id[GN_NODE_ID_STRLEN];
  gn_node_id_format(peer, id);
  result *slot = NULL;
  for (size_t i = 0; i < RESULTS_MAX && !slot; i++)
    if (g->results[i].used && memcmp(g->results[i].peer, peer, GN_PK_LEN) == 0)
      slot = &g->results[i];
  if (!slot)
    slot = &g->results[g->next_result++ % RESULTS_MAX];
  *slot = (result){.used = true, .ok = ok};
  memcpy(slot->peer, peer, GN_PK_LEN);
  snprintf(slot->addr, sizeof slot->addr, "%s", addr);
  if (ok)
    gn_log_ratelimited("nat-punch", GN_LOG_INFO, "nat: punched a UDP hole to %s at %s", id, addr);
  else
    gn_log_ratelimited("nat-punch", GN_LOG_INFO, "nat: no UDP hole to %s (no answer to our probes)", id);
}

static int send_status(struct gn__nat *g, const uint8_t peer[GN_PK_LEN], const gn_relay_status_msg *m) {
  gn_buf b = {0};
  int r = gn_relay_status_encode(m, &b);
  if (r == 0)
    r = nat_msg(g, peer, GN_MSG_RELAY_STATUS, b.data, b.len);
  gn_buf_done(&b);
  return r;
}

/* --- splices at our relay ----------------------------------------------------------*/

static void splice_close(sconn *s);

static void splice_unlink(sconn *s) {
  struct gn__nat *g = s->g;
  for (sconn **pp = &g->splices; *pp; pp = &(*pp)->next)
    if (*pp == s) {
      *pp = s->next;
      g->nsplices--;
      break;
    }
}

static void splice_freed(void *arg) {
  sconn *s = arg;
  gn_buf_done(&s->held);
  free(s);
}

static void splice_close(sconn *s) {
  if (s->closing)
    return;
  s->closing = true;
  splice_unlink(s);
  /* Ending a pair twice is harmless: its generation no longer matches. */
  if (s->claimed && s->g->relay)
    gn_relay_pair_end(s->g->relay, s->pair);
  sconn *o = s->other;
  s->other = NULL;
  if (o) {
    o->other = NULL;
    splice_close(o);
  }
  gn_uv_close_free((uv_handle_t *)s->tcp, splice_freed, s);
}

typedef struct splice_wreq {
  uv_write_t req;
  sconn *to;
  size_t len;
  char data[];
} splice_wreq;

static void splice_read_start(sconn *s);

static void splice_write_done(uv_write_t *req, int status) {
  splice_wreq *w = (splice_wreq *)req;
  sconn *to = w->to;
  size_t len = w->len;
  free(w);
  if (to->queued >= len)
    to->queued -= len;
  if (status < 0) {
    splice_close(to);
    return;
  }
  /* The other side was held back for this queue: it may read again. */
  sconn *from = to->other;
  if (from && !from->closing && !from->reading && from->resume_ms == 0 && to->queued <= SPLICE_QUEUE_LOW)
    splice_read_start(from);
}

static int splice_send(sconn *to, const char *data, size_t len) {
  splice_wreq *w = malloc(sizeof *w + len);
  if (!w)
    return GN_ENOMEM;
  w->to = to;
  w->len = len;
  memcpy(w->data, data, len);
  uv_buf_t b = uv_buf_init(w->data, (unsigned)len);
  int r = uv_write(&w->req, (uv_stream_t *)to->tcp, &b, 1, splice_write_done);
  if (r < 0) {
    free(w);
    return r;
  }
  to->queued += len;
  return 0;
}

static void splice_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf) {
  (void)suggested;
  static char rbuf[65536];
  (void)h;
  *buf = uv_buf_init(rbuf, sizeof rbuf);
}

static void splice_read_stop(sconn *s) {
  if (s->reading && !s->closing)
    uv_read_stop((uv_stream_t *)s->tcp);
  s->reading = false;
}

/* Both sides presented their tokens: from now on bytes go across. */
static void splice_join(sconn *a, sconn *b) {
  a->other = b;
  b->other = a;
  a->deadline_ms = b->deadline_ms = 0;
  gn_log_ratelimited("relay-pair", GN_LOG_INFO, "relay: spliced a pair (%zu connections at the relay)", a->g->nsplices);
  if (a->held.len && splice_send(b, (const char *)a->held.data, a->held.len) < 0)
    return splice_close(a);
  if (b->held.len && splice_send(a, (const char *)b->held.data, b->held.len) < 0)
    return splice_close(a);
  /* What was held counts against the pair's budget like any byte. */
  uint64_t now = gn_mono_ms();
  uint64_t wait = gn_relay_pair_charge(a->g->relay, a->pair, a->held.len + b->held.len, now);
  gn_buf_done(&a->held);
  gn_buf_done(&b->held);
  if (wait) {
    a->resume_ms = b->resume_ms = now + wait;
    arm(a->g);
    return;
  }
  splice_read_start(a);
  splice_read_start(b);
}

static void splice_on_read(uv_stream_t *st, ssize_t nread, const uv_buf_t *buf) {
  sconn *s = st->data;
  struct gn__nat *g = s->g;
  if (s->closing)
    return;
  if (nread < 0) {
    splice_close(s);
    return;
  }
  const char *p = buf->base;
  size_t n = (size_t)nread;
  uint64_t now = gn_mono_ms();
  if (s->other) {
    if (splice_send(s->other, p, n) < 0) {
      splice_close(s);
      return;
    }
    uint64_t wait = gn_relay_pair_charge(g->relay, s->pair, n, now);
    if (wait) {
      splice_read_stop(s);
      splice_read_stop(s->other);
      s->resume_ms = s->other->resume_ms = now + wait;
      arm(g);
    } else if (s->other->queued > SPLICE_QUEUE_HIGH) {
      splice_read_stop(s);
    }
    return;
  }
  if (!s->claimed) {
    size_t take = GN_RELAY_TOKEN_LEN - s->pre_len < n ? GN_RELAY_TOKEN_LEN - s->pre_len : n;
    memcpy(s->pre + s->pre_len, p, take);
    s->pre_len += take;
    p += take;
    n -= take;
    if (s->pre_len < GN_RELAY_TOKEN_LEN)
      return;
    int side;
    if (gn_relay_claim(g->relay, s->pre, now, &s->pair, &side) < 0) {
      gn_log_ratelimited("relay-token", GN_LOG_INFO, "relay: closed a splice connection with an unknown token");
      splice_close(s);
      return;
    }
    s->claimed = true;
  }
  if (n && (s->held.len + n > SPLICE_HELD_MAX || gn_buf_append(&s->held, p, n) < 0)) {
    splice_close(s);
    return;
  }
  if (!gn_relay_pair_ready(g->relay, s->pair)) {
    /* Nothing more is read before the other side is here: what the peer
     * sends meanwhile waits in the kernel's buffers, not in ours. */
    splice_read_stop(s);
    return;
  }
  for (sconn *o = g->splices; o; o = o->next)
    if (o != s && o->claimed && !o->other && !o->closing && o->pair == s->pair) {
      splice_join(s, o);
      return;
    }
}

static void splice_read_start(sconn *s) {
  if (s->reading || s->closing)
    return;
  if (uv_read_start((uv_stream_t *)s->tcp, splice_alloc, splice_on_read) == 0)
    s->reading = true;
}

static void on_splice_conn(uv_stream_t *server, int status) {
  struct gn__nat *g = server->data;
  if (status < 0 || g->closing)
    return;
  uv_tcp_t *tcp = gn_uv_handle_alloc(sizeof *tcp);
  if (!tcp || uv_tcp_init(g->n->loop, tcp) != 0) {
    gn_uv_handle_free_unused(tcp);
    return;
  }
  sconn *s = calloc(1, sizeof *s);
  if (!s || uv_accept(server, (uv_stream_t *)tcp) < 0 || g->nsplices >= SPLICES_MAX) {
    /* Always accepted, so the backlog does not fill with what we refuse. */
    free(s);
    gn_uv_close_free((uv_handle_t *)tcp, NULL, NULL);
    return;
  }
  s->g = g;
  s->tcp = tcp;
  tcp->data = s;
  s->deadline_ms = gn_mono_ms() + GN_RELAY_CALL_WAIT_MS;
  s->next = g->splices;
  g->splices = s;
  g->nsplices++;
  uv_tcp_nodelay(tcp, 1);
  splice_read_start(s);
  arm(g);
}

/* Closes connections past their time to pair up, resumes paused pairs. */
static void splices_tick(struct gn__nat *g, uint64_t now) {
  for (sconn *s = g->splices, *next; s; s = next) {
    next = s->next;
    if (s->deadline_ms && now >= s->deadline_ms) {
      /* The next one may be the other side of a pair closed with it. */
      splice_close(s);
      next = g->splices;
      continue;
    }
    if (s->resume_ms && now >= s->resume_ms) {
      s->resume_ms = 0;
      if (!s->other || s->other->queued <= SPLICE_QUEUE_HIGH)
        splice_read_start(s);
    }
  }
}

static int relay_listen(struct gn__nat *g) {
  const char *laddr = gn_transport_listen_addr(g->n->tp);
  char host[64];
  const char *colon = strrchr(laddr, ':');
  struct sockaddr_storage ss;
  if (!colon || (size_t)(colon - laddr) >= sizeof host)
    return GN_EINVAL;
  memcpy(host, laddr, (size_t)(colon - laddr));
  host[colon - laddr] = '\0';
  bool v6 = host[0] == '[';
  if (v6) {
    memmove(host, host + 1, strlen(host));
    host[strlen(host) - 1] = '\0';
  }
  int r = v6 ? uv_ip6_addr(host, 0, (struct sockaddr_in6 *)&ss) : uv_ip4_addr(host, 0, (struct sockaddr_in *)&ss);
  if (r < 0)
    return GN_EINVAL;
  g->listener = gn_uv_handle_alloc(sizeof *g->listener);
  if (!g->listener)
    return GN_ENOMEM;
  uv_tcp_init(g->n->loop, g->listener);
  g->listener->data = g;
  struct sockaddr_storage bound;
  int len = sizeof bound;
  if ((r = uv_tcp_bind(g->listener, (const struct sockaddr *)&ss, 0)) < 0 ||
      (r = uv_listen((uv_stream_t *)g->listener, 128, on_splice_conn)) < 0 ||
      (r = uv_tcp_getsockname(g->listener, (struct sockaddr *)&bound, &len)) < 0) {
    gn_uv_close_free((uv_handle_t *)g->listener, NULL, NULL);
    g->listener = NULL;
    return r;
  }
  unsigned port = ntohs(bound.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&bound)->sin6_port
                                                    : ((struct sockaddr_in *)&bound)->sin_port);
  snprintf(g->splice_addr, sizeof g->splice_addr, v6 ? "[%s]:%u" : "%s:%u", host, port);
  return 0;
}

/* --- our splice dials ---------------------------------------------------------------*/

static void dial_unlink(dial *d) {
  struct gn__nat *g = d->g;
  for (dial **pp = &g->dials; *pp; pp = &(*pp)->next)
    if (*pp == d) {
      *pp = d->next;
      g->ndials--;
      break;
    }
}

static void dial_freed(void *arg) {
  free(arg);
}

static void on_dial_connect(uv_connect_t *req, int status) {
  dial *d = req->data;
  free(req);
  if (d->closed)
    return;
  struct gn__nat *g = d->g;
  dial_unlink(d);
  uv_os_fd_t fd = -1;
  int dupfd = -1;
  if (status == 0 && !g->closing) {
    uv_buf_t b = uv_buf_init((char *)d->token, GN_RELAY_TOKEN_LEN);
    /* A fresh socket takes 16 bytes at once. */
    if (uv_try_write((uv_stream_t *)d->tcp, &b, 1) == GN_RELAY_TOKEN_LEN && uv_fileno((uv_handle_t *)d->tcp, &fd) == 0)
      dupfd = dup(fd);
  }
  if (dupfd >= 0) {
    int r = gn_transport_adopt(g->n->tp, dupfd, d->initiator, d->expect);
    if (r < 0)
      gn_log_ratelimited("relay-dial", GN_LOG_WARN, "nat: cannot take up a relayed connection: %s", gn_strerror(r));
  } else {
    gn_log_ratelimited("relay-dial", GN_LOG_WARN, "nat: cannot reach a relay's splice: %s",
                       status < 0 ? uv_strerror(status) : "write failed");
    if (d->initiator)
      gn_reach_refused(g->reach, d->relay, d->expect, "cannot reach the relay's splice", gn_mono_ms());
  }
  gn_uv_close_free((uv_handle_t *)d->tcp, dial_freed, d);
}

/* A numeric host:port as a socket address (GN_EINVAL for anything else). */
static int sockaddr_of(const char *addr, struct sockaddr_storage *ss) {
  char host[64];
  const char *colon = addr ? strrchr(addr, ':') : NULL;
  if (!colon || (size_t)(colon - addr) >= sizeof host || !gn_nat_addr_valid(addr))
    return GN_EINVAL;
  size_t hl = (size_t)(colon - addr);
  bool v6 = addr[0] == '[';
  memcpy(host, addr + v6, hl - 2 * v6);
  host[hl - 2 * v6] = '\0';
  int port = atoi(colon + 1);
  memset(ss, 0, sizeof *ss);
  int r = v6 ? uv_ip6_addr(host, port, (struct sockaddr_in6 *)ss) : uv_ip4_addr(host, port, (struct sockaddr_in *)ss);
  return r < 0 ? GN_EINVAL : 0;
}

static int dial_splice(struct gn__nat *g, const char *addr, const uint8_t token[GN_RELAY_TOKEN_LEN],
                       const uint8_t expect[GN_PK_LEN], const uint8_t relay[GN_PK_LEN], bool initiator) {
  struct sockaddr_storage ss;
  if (g->ndials >= DIALS_MAX)
    return GN_EBUSY;
  int r = sockaddr_of(addr, &ss);
  if (r < 0)
    return r;
  dial *d = calloc(1, sizeof *d);
  uv_connect_t *req = calloc(1, sizeof *req);
  if (!d || !req || !(d->tcp = gn_uv_handle_alloc(sizeof *d->tcp))) {
    free(d);
    free(req);
    return GN_ENOMEM;
  }
  uv_tcp_init(g->n->loop, d->tcp);
  d->g = g;
  memcpy(d->token, token, GN_RELAY_TOKEN_LEN);
  memcpy(d->expect, expect, GN_PK_LEN);
  memcpy(d->relay, relay, GN_PK_LEN);
  d->initiator = initiator;
  req->data = d;
  if ((r = uv_tcp_connect(req, d->tcp, (const struct sockaddr *)&ss, on_dial_connect)) < 0) {
    free(req);
    gn_uv_close_free((uv_handle_t *)d->tcp, dial_freed, d);
    return r;
  }
  d->next = g->dials;
  g->dials = d;
  g->ndials++;
  return 0;
}

/* --- TCP hole punching -------------------------------------------------------------------*/

static void tdial_unlink(tdial *d) {
  struct gn__nat *g = d->g;
  for (tdial **pp = &g->tdials; *pp; pp = &(*pp)->next)
    if (*pp == d) {
      *pp = d->next;
      g->ntdials--;
      break;
    }
}

/* The connect came through (a simultaneous open, or the peer's listener):
 * the connection is taken up as a session with the peer's key required,
 * the Noise initiator the end with the smaller key. */
static void on_tdial_connect(uv_connect_t *req, int status) {
  tdial *d = req->data;
  free(req);
  if (d->closed)
    return;
  struct gn__nat *g = d->g;
  tdial_unlink(d);
  uv_os_fd_t fd = -1;
  int r = status, dupfd = -1;
  if (r == 0 && !g->closing && uv_fileno((uv_handle_t *)d->tcp, &fd) == 0)
    dupfd = dup(fd);
  if (r == 0)
    r = dupfd >= 0 ? gn_transport_adopt(g->n->tp, dupfd, d->initiator, d->peer) : GN_EIO;
  char id[GN_NODE_ID_STRLEN];
  gn_node_id_format(d->peer, id);
  uint64_t now = gn_mono_ms();
  if (r == 0) {
    gn_log_ratelimited("nat-tcp", GN_LOG_INFO, "nat: punched a TCP connection to %s; handshake follows", id);
    /* The handshake has a moment before the relay is asked. */
    gn_reach_hold(g->reach, d->peer, now + 2000, now);
  }
  gn_nat_tcp_result(g->nat, d->peer, r, now);
  gn_uv_close_free((uv_handle_t *)d->tcp, dial_freed, d);
  arm(g);
}

static void tdial_close(tdial *d) {
  tdial_unlink(d);
  d->closed = true;
  gn_uv_close_free((uv_handle_t *)d->tcp, dial_freed, d);
}

/* gn_nat_io.tcp_dial: a socket bound to our listening address (the
 * listener sets SO_REUSEPORT too), connecting to addr until deadline_ms. */
static int nat_tcp_dial(void *ud, const uint8_t peer[GN_PK_LEN], const char *addr, bool initiator,
                        uint64_t deadline_ms) {
  struct gn__nat *g = ud;
  struct sockaddr_storage to, from;
  if (g->closing || !g->n->tp || g->ntdials >= GN_NAT_TCP_MAX)
    return GN_EBUSY;
  for (tdial *d = g->tdials; d; d = d->next)
    if (memcmp(d->peer, peer, GN_PK_LEN) == 0)
      return GN_EBUSY;
  int r = sockaddr_of(addr, &to);
  if (r == 0)
    r = sockaddr_of(gn_transport_listen_addr(g->n->tp), &from);
  if (r < 0 || from.ss_family != to.ss_family)
    return GN_EINVAL;
  int fd = socket(to.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0)
    return GN_EIO;
  int one = 1;
  socklen_t len = to.ss_family == AF_INET6 ? sizeof(struct sockaddr_in6) : sizeof(struct sockaddr_in);
  if (setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) < 0 ||
      setsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &one, sizeof one) < 0 || bind(fd, (struct sockaddr *)&from, len) < 0) {
    close(fd);
    return GN_EIO;
  }
  tdial *d = calloc(1, sizeof *d);
  uv_connect_t *req = calloc(1, sizeof *req);
  if (!d || !req || !(d->tcp = gn_uv_handle_alloc(sizeof *d->tcp))) {
    free(d);
    free(req);
    close(fd);
    return GN_ENOMEM;
  }
  uv_tcp_init(g->n->loop, d->tcp);
  d->g = g;
  memcpy(d->peer, peer, GN_PK_LEN);
  d->initiator = initiator;
  d->deadline_ms = deadline_ms;
  req->data = d;
  if ((r = uv_tcp_open(d->tcp, fd)) < 0) {
    close(fd);
    free(req);
    gn_uv_close_free((uv_handle_t *)d->tcp, dial_freed, d);
    return r;
  }
  if ((r = uv_tcp_connect(req, d->tcp, (const struct sockaddr *)&to, on_tdial_connect)) < 0) {
    free(req);
    gn_uv_close_free((uv_handle_t *)d->tcp, dial_freed, d);
    return r;
  }
  d->next = g->tdials;
  g->tdials = d;
  g->ntdials++;
  char id[GN_NODE_ID_STRLEN];
  gn_node_id_format(peer, id);
  gn_log_ratelimited("nat-tcp", GN_LOG_INFO, "nat: punching TCP to %s at %s (the %s)", id, addr,
                     initiator ? "handshake's initiator" : "handshake's responder");
  arm(g);
  return 0;
}

/* Connects past their deadline are closed (their punch failed); peers whose
 * TCP punch failed have their relay called at once. */
static void tcp_tick(struct gn__nat *g, uint64_t now) {
  for (tdial *d = g->tdials, *next; d; d = next) {
    next = d->next;
    if (now >= d->deadline_ms) {
      uint8_t peer[GN_PK_LEN];
      memcpy(peer, d->peer, GN_PK_LEN);
      tdial_close(d);
      gn_nat_tcp_result(g->nat, peer, GN_ETIMEDOUT, now);
    }
  }
  for (size_t i = 0; i < GN_NAT_TCP_MAX; i++) {
    if (!g->held_used[i] || gn_nat_tcp_active(g->nat, g->held[i], now))
      continue;
    g->held_used[i] = false;
    gn_nat_tcp_info ti;
    for (size_t k = 0; gn_nat_tcp_get(g->nat, k, now, &ti); k++)
      if (memcmp(ti.peer, g->held[i], GN_PK_LEN) == 0 && strcmp(ti.state, "failed") == 0)
        gn_reach_hold(g->reach, g->held[i], now, now);
  }
}

/* Before the relay is called: a TCP punch through the relay (our
 * rendezvous) when both sides are behind cone NATs. We know ours; the
 * peer's signed offer names the outside address a provider behind a cone
 * NAT advertises (gn__nat_offer), where one behind a symmetric NAT (or of
 * unknown type) names its private listen address: then the relay is
 * called as before, with no punch to wait for. */
static void tcp_punch_maybe(struct gn__nat *g, const gn_offer *o, uint64_t now) {
  gn_node *n = g->n;
  if (g->type != GN_NAT_CONE || !gn_transport_is_up(n->tp, o->relay_id) || !gn_nat_addr_valid(o->addr) ||
      gn_nat_addr_private(o->addr))
    return;
  size_t slot = GN_NAT_TCP_MAX;
  for (size_t i = 0; i < GN_NAT_TCP_MAX; i++)
    if (!g->held_used[i] || memcmp(g->held[i], o->provider, GN_PK_LEN) == 0) {
      slot = i;
      break;
    }
  if (slot == GN_NAT_TCP_MAX)
    return;
  int r = gn_nat_tcp_punch_start(g->nat, o->provider, o->relay_id, now);
  char id[GN_NODE_ID_STRLEN];
  gn_node_id_format(o->provider, id);
  if (r < 0) {
    gn_log_ratelimited("nat-tcp", GN_LOG_INFO, "nat: no TCP punch to %s: %s", id, gn_strerror(r));
    return;
  }
  g->held_used[slot] = true;
  memcpy(g->held[slot], o->provider, GN_PK_LEN);
  gn_reach_hold(g->reach, o->provider, now + GN_REACH_HOLD_MAX_MS, now);
  gn_log_ratelimited("nat-tcp", GN_LOG_INFO, "nat: punching a TCP hole to %s (behind a cone NAT at %s) through %s", id,
                     o->addr, "the relay its offer names");
}

/* --- relay messages ------------------------------------------------------------------*/

static reservation *res_find(struct gn__nat *g, const uint8_t relay[GN_PK_LEN]) {
  for (size_t i = 0; i < RESERVE_MAX; i++)
    if (g->res[i].used && memcmp(g->res[i].relay, relay, GN_PK_LEN) == 0)
      return &g->res[i];
  return NULL;
}

static call *call_find(struct gn__nat *g, const uint8_t relay[GN_PK_LEN], const uint8_t target[GN_PK_LEN]) {
  for (size_t i = 0; i < CALLS_MAX; i++)
    if (g->calls[i].used && memcmp(g->calls[i].relay, relay, GN_PK_LEN) == 0 &&
        memcmp(g->calls[i].target, target, GN_PK_LEN) == 0)
      return &g->calls[i];
  return NULL;
}

/* As a relay: a slot for peer, counted against the network its datagrams
 * come from (it must have asked us where we see it: an address we saw). */
static void on_reserve(struct gn__nat *g, const uint8_t peer[GN_PK_LEN], const gn_relay_reserve_msg *m, uint64_t now) {
  gn_relay_status_msg st = {.ok = false};
  char from[GN_NAT_ADDR_MAX];
  if (!g->relay) {
    snprintf(st.why, sizeof st.why, "this node does not relay");
  } else if (!m->reserve) {
    return; /* a slot lapses on its own; nothing to answer */
  } else if (!gn_nat_seen_addr(g->nat, peer, now, from, sizeof from)) {
    snprintf(st.why, sizeof st.why, "ask where you are seen first");
  } else {
    uint64_t expires = 0;
    int r = gn_relay_reserve(g->relay, peer, from, now, &expires);
    if (r == 0) {
      st.ok = true;
      st.ttl_s = (uint32_t)((expires - now) / 1000);
      snprintf(st.addr, sizeof st.addr, "%s", g->splice_addr);
    } else {
      snprintf(st.why, sizeof st.why, "no slot free here (%s)", gn_strerror(r));
    }
  }
  send_status(g, peer, &st);
}

/* As a relay: caller wants a reserved target. */
static void on_call_to_relay(struct gn__nat *g, const uint8_t caller[GN_PK_LEN], const gn_relay_call_msg *m,
                             uint64_t now) {
  gn_relay_status_msg st = {.ok = false, .has_call = true};
  memcpy(st.peer, m->peer, GN_PK_LEN);
  uint64_t pair = 0;
  uint8_t tok_target[GN_RELAY_TOKEN_LEN];
  int r = g->relay ? gn_relay_call(g->relay, caller, m->peer, now, &pair, st.token, tok_target) : GN_EUNSUPPORTED;
  if (r == 0) {
    gn_relay_call_msg to = {.from_relay = true};
    memcpy(to.peer, caller, GN_PK_LEN);
    memcpy(to.token, tok_target, GN_RELAY_TOKEN_LEN);
    snprintf(to.addr, sizeof to.addr, "%s", g->splice_addr);
    gn_buf b = {0};
    r = gn_relay_call_encode(&to, &b);
    if (r == 0)
      r = nat_msg(g, m->peer, GN_MSG_RELAY_CALL, b.data, b.len);
    gn_buf_done(&b);
    if (r < 0)
      gn_relay_pair_end(g->relay, pair);
  }
  if (r == 0) {
    st.ok = true;
    snprintf(st.addr, sizeof st.addr, "%s", g->splice_addr);
    arm(g);
  } else {
    memset(st.token, 0, sizeof st.token);
    snprintf(st.why, sizeof st.why, "%s",
             r == GN_ENOTFOUND      ? "that peer holds no slot here"
             : r == GN_EBUSY        ? "busy: over your call rate or the relay's sessions"
             : r == GN_EUNSUPPORTED ? "this node does not relay"
                                    : gn_strerror(r));
  }
  send_status(g, caller, &st);
}

/* A relay we hold a slot at says caller wants us: we dial its splice (the
 * address it gave with our slot, nowhere else) and answer the handshake. */
static void on_call_from_relay(struct gn__nat *g, const uint8_t relay[GN_PK_LEN], const gn_relay_call_msg *m) {
  reservation *rv = res_find(g, relay);
  if (!rv || !rv->ok || strcmp(rv->splice, m->addr) != 0) {
    gn_log_ratelimited("relay-call", GN_LOG_INFO, "nat: ignored a relay call from a node we hold no slot at");
    return;
  }
  int r = dial_splice(g, m->addr, m->token, m->peer, relay, false);
  if (r < 0)
    gn_log_ratelimited("relay-call", GN_LOG_WARN, "nat: cannot answer a relayed call: %s", gn_strerror(r));
}

static void on_status(struct gn__nat *g, const uint8_t relay[GN_PK_LEN], const gn_relay_status_msg *m, uint64_t now) {
  if (m->has_call) {
    call *c = call_find(g, relay, m->peer);
    if (!c || strcmp(c->state, "calling") != 0)
      return;
    if (!m->ok) {
      snprintf(c->state, sizeof c->state, "refused");
      snprintf(c->why, sizeof c->why, "%s", m->why);
      gn_reach_refused(g->reach, relay, m->peer, m->why, now);
      return;
    }
    int r = m->addr[0] ? dial_splice(g, m->addr, m->token, m->peer, relay, true) : GN_EINVAL;
    snprintf(c->state, sizeof c->state, r == 0 ? "dialling" : "failed");
    if (r < 0) {
      snprintf(c->why, sizeof c->why, "%s", gn_strerror(r));
      gn_reach_refused(g->reach, relay, m->peer, "cannot dial the relay's splice", now);
    }
    return;
  }
  reservation *rv = res_find(g, relay);
  if (!rv)
    return;
  rv->ok = m->ok && m->addr[0];
  snprintf(rv->splice, sizeof rv->splice, "%s", m->ok ? m->addr : "");
  snprintf(rv->why, sizeof rv->why, "%s", m->why);
  rv->expires_ms = rv->ok ? now + (uint64_t)m->ttl_s * 1000 : 0;
  if (rv->ok) {
    char id[GN_NODE_ID_STRLEN];
    gn_node_id_format(relay, id);
    gn_log_ratelimited("relay-slot", GN_LOG_INFO, "nat: holding a relay slot at %s (splice %s)", id, rv->splice);
  }
}

/* Asks relay via to call peer for us (RELAY_CALL), remembered in the call
 * table: GN_EBUSY when it is full, else what sending gave. */
static int start_call(struct gn__nat *g, const uint8_t via[GN_PK_LEN], const uint8_t peer[GN_PK_LEN], uint64_t now) {
  call *c = call_find(g, via, peer);
  for (size_t i = 0; i < CALLS_MAX && !c; i++)
    if (!g->calls[i].used || now >= g->calls[i].at_ms + 60000)
      c = &g->calls[i];
  if (!c)
    return GN_EBUSY;
  gn_relay_call_msg m = {.from_relay = false};
  memcpy(m.peer, peer, GN_PK_LEN);
  gn_buf b = {0};
  int r = gn_relay_call_encode(&m, &b);
  if (r == 0)
    r = nat_msg(g, via, GN_MSG_RELAY_CALL, b.data, b.len);
  gn_buf_done(&b);
  if (r < 0)
    return r;
  *c = (call){.used = true, .at_ms = now};
  memcpy(c->relay, via, GN_PK_LEN);
  memcpy(c->target, peer, GN_PK_LEN);
  snprintf(c->state, sizeof c->state, "calling");
  return 0;
}

/* --- reaching NATed peers through the relays their offers name ------------------------*/

static bool reach_is_up(void *ud, const uint8_t key[GN_PK_LEN]) {
  struct gn__nat *g = ud;
  return g->n->tp && gn_transport_is_up(g->n->tp, key);
}

static int reach_dial(void *ud, const char *addr, const uint8_t key[GN_PK_LEN]) {
  struct gn__nat *g = ud;
  char id[GN_NODE_ID_STRLEN];
  gn_node_id_format(key, id);
  gn_log_ratelimited("nat-reach", GN_LOG_INFO, "nat: dialling relay %s at %s (an offer names it)", id, addr);
  return g->n->tp ? gn_transport_connect_peer(g->n->tp, addr, key) : GN_ECLOSED;
}

static int reach_call(void *ud, const uint8_t relay[GN_PK_LEN], const uint8_t peer[GN_PK_LEN]) {
  struct gn__nat *g = ud;
  char id[GN_NODE_ID_STRLEN], rid[GN_NODE_ID_STRLEN];
  gn_node_id_format(peer, id);
  gn_node_id_format(relay, rid);
  gn_log_ratelimited("nat-reach", GN_LOG_INFO, "nat: no direct session with %s; asking relay %s to call it", id, rid);
  return start_call(g, relay, peer, gn_mono_ms());
}

static void reach_done(void *ud, const uint8_t peer[GN_PK_LEN], const uint8_t relay[GN_PK_LEN], gn_reach_outcome o,
                       const char *why) {
  (void)ud;
  char id[GN_NODE_ID_STRLEN], rid[GN_NODE_ID_STRLEN];
  gn_node_id_format(peer, id);
  gn_node_id_format(relay, rid);
  if (o == GN_REACH_RELAYED)
    gn_log_ratelimited("nat-reach", GN_LOG_INFO, "nat: reached %s through relay %s", id, rid);
  else if (o == GN_REACH_GAVE_UP)
    gn_log_ratelimited("nat-reach", GN_LOG_WARN, "nat: gave up reaching %s through relay %s: %s", id, rid, why);
}

/* A relay our offers can name: the first slot held whose relay's address we know. */
static const reservation *offer_reservation(struct gn__nat *g, uint64_t now) {
  for (size_t i = 0; i < RESERVE_MAX; i++) {
    const reservation *r = &g->res[i];
    if (r->used && r->ok && now < r->expires_ms && gn_nat_addr_valid(r->relay_addr))
      return r;
  }
  return NULL;
}

/* Our offers say where we can be reached: republished when that changes. */
static void offer_relay_tick(struct gn__nat *g, uint64_t now) {
  const reservation *r = offer_reservation(g, now);
  uint8_t want[GN_PK_LEN] = {0};
  if (r)
    memcpy(want, r->relay, GN_PK_LEN);
  if (memcmp(want, g->offer_relay, GN_PK_LEN) == 0)
    return;
  memcpy(g->offer_relay, want, GN_PK_LEN);
  g->n->offers_dirty = true;
  if (r) {
    char id[GN_NODE_ID_STRLEN];
    gn_node_id_format(r->relay, id);
    gn_log(GN_LOG_INFO, "nat: our offers name relay %s at %s", id, r->relay_addr);
  }
}

/* Behind a NAT: a slot at up to RESERVE_MAX session peers that relay. */
static void reserve_tick(struct gn__nat *g, uint64_t now) {
  if (g->relay || (g->type != GN_NAT_CONE && g->type != GN_NAT_SYMMETRIC))
    return;
  for (size_t i = 0; i < PEERS_MAX; i++) {
    if (!g->peers[i].used)
      continue;
    reservation *rv = res_find(g, g->peers[i].id);
    if (!rv) {
      for (size_t j = 0; j < RESERVE_MAX && !rv; j++) {
        reservation *x = &g->res[j];
        /* A refusal is forgotten after its retry time, to make room. */
        if (!x->used || (!x->ok && now >= x->asked_ms + RESERVE_RETRY_MS) || (x->ok && now >= x->expires_ms))
          rv = x;
      }
      if (!rv)
        return;
      *rv = (reservation){.used = true};
      memcpy(rv->relay, g->peers[i].id, GN_PK_LEN);
      snprintf(rv->relay_addr, sizeof rv->relay_addr, "%s", g->peers[i].addr);
    } else if (rv->ok ? now + RESERVE_RENEW_MS < rv->expires_ms : now < rv->asked_ms + RESERVE_RETRY_MS) {
      continue;
    }
    if (rv->asked_ms && now < rv->asked_ms + 5000)
      continue;
    rv->asked_ms = now;
    gn_relay_reserve_msg m = {.reserve = true};
    gn_buf b = {0};
    if (gn_relay_reserve_encode(&m, &b) == 0)
      nat_msg(g, rv->relay, GN_MSG_RELAY_RESERVE, b.data, b.len);
    gn_buf_done(&b);
  }
}

/* --- the loop ---------------------------------------------------------------------------*/

static void classify(struct gn__nat *g, uint64_t now) {
  gn_node *n = g->n;
  gn_nat_type t = gn_nat_type_get(g->nat, now);
  char adv[GN_NAT_ADDR_MAX] = "";
  gn_nat_advertised(g->nat, now, adv, sizeof adv);
  if (t == g->type && strcmp(adv, g->advertised) == 0)
    return;
  g->type = t;
  snprintf(g->advertised, sizeof g->advertised, "%s", adv);
  n->offers_dirty = true; /* a cone node's offers name its outside address */
  static const char *const what[] = {[GN_NAT_UNKNOWN] = "of unknown reach (peers do not agree yet)",
                                     [GN_NAT_PUBLIC] = "public",
                                     [GN_NAT_CONE] = "behind a cone NAT (one outside port for every peer)",
                                     [GN_NAT_SYMMETRIC] = "behind a symmetric NAT (another outside port per peer)"};
  gn_log(GN_LOG_INFO, "nat: this node is %s%s%s", what[t], adv[0] ? "; seen at " : "", adv);
  /* New sessions and our gossip tell peers the address they can reach. */
  if (adv[0]) {
    gn_transport_set_advertised_addr(n->tp, adv);
    if (n->disc)
      gn_discovery_set_self_addr(n->disc, adv);
    /* The membership too: a member behind a cone NAT is probed at its
     * outside address, not at its private one that others cannot reach. */
    gn__overlay_set_addr(n, adv);
  }
}

static void on_timer(uv_timer_t *t) {
  struct gn__nat *g = t->data;
  gn_node *n = g->n;
  uint64_t now = gn_mono_ms();
  gn_nat_tick(g->nat, now);
  /* Where each session peer sees us (each address at most every 30 s). */
  for (size_t i = 0; i < PEERS_MAX; i++) {
    sess_peer *p = &g->peers[i];
    if (p->used && !(n->tp && gn_transport_is_up(n->tp, p->id)))
      p->used = false;
    else if (p->used)
      gn_nat_ask(g->nat, p->id, p->addr, now);
  }
  classify(g, now);
  reserve_tick(g, now);
  offer_relay_tick(g, now);
  splices_tick(g, now);
  tcp_tick(g, now);
  gn_reach_tick(g->reach, now);
  arm(g);
}

static void arm(struct gn__nat *g) {
  if (!g->timer || g->closing)
    return;
  uint64_t now = gn_mono_ms(), at = gn_nat_next_deadline_ms(g->nat);
  uint64_t reach_at = gn_reach_next_deadline_ms(g->reach);
  if (reach_at < at)
    at = reach_at;
  for (tdial *d = g->tdials; d; d = d->next)
    if (d->deadline_ms < at)
      at = d->deadline_ms;
  for (sconn *s = g->splices; s; s = s->next) {
    if (s->resume_ms && s->resume_ms < at)
      at = s->resume_ms;
    if (s->deadline_ms && s->deadline_ms < at)
      at = s->deadline_ms;
  }
  uint64_t delay = at > now ? at - now : 0;
  if (delay > TICK_MS)
    delay = TICK_MS;
  uv_timer_start(g->timer, on_timer, delay, 0);
}

/* --- the daemon's calls ---------------------------------------------------------------*/

int gn__nat_start(gn_node *n) {
  struct gn__nat *g = calloc(1, sizeof *g);
  if (!g)
    return GN_ENOMEM;
  g->n = n;
  n->nat = g;
  uint8_t seed[32];
  randombytes_buf(seed, sizeof seed);
  gn_nat_io io = {nat_dgram, nat_msg, nat_punched, g, nat_tcp_dial};
  int r = gn_nat_new(n->id->pk, gn_transport_listen_addr(n->tp), &io, seed, gn_mono_ms(), &g->nat);
  sodium_memzero(seed, sizeof seed);
  if (r < 0)
    return r;
  gn_reach_io rio = {reach_is_up, reach_dial, reach_call, reach_done, g};
  if ((r = gn_reach_new(&rio, &g->reach)) < 0)
    return r;
  if (!n->cfg.overlay)
    snprintf(g->error, sizeof g->error, "off: it needs the overlay's UDP socket (overlay = on)");
  if (n->cfg.relay) {
    gn_relay_limits l = {.max_reservations = 2u * n->cfg.relay_sessions,
                         .max_sessions = n->cfg.relay_sessions,
                         .pair_bytes_per_s = n->cfg.relay_pair_rate,
                         .total_bytes_per_s = n->cfg.relay_total_rate};
    randombytes_buf(seed, sizeof seed);
    r = gn_relay_new(&l, seed, gn_mono_ms(), &g->relay);
    sodium_memzero(seed, sizeof seed);
    if (r < 0)
      return r;
    if ((r = relay_listen(g)) < 0) {
      gn_log(GN_LOG_ERROR, "relay: cannot listen for splices: %s; this node does not relay", gn_strerror(r));
      g->relay = gn_relay_free(g->relay);
    } else {
      gn_log(GN_LOG_INFO,
             "relay: relaying for peers behind NAT, splices on %s (%u pairs, %llu B/s each, %llu B/s in all)",
             g->splice_addr, n->cfg.relay_sessions, (unsigned long long)n->cfg.relay_pair_rate,
             (unsigned long long)n->cfg.relay_total_rate);
    }
  }
  g->timer = gn_uv_handle_alloc(sizeof *g->timer);
  if (!g->timer)
    return GN_ENOMEM;
  uv_timer_init(n->loop, g->timer);
  g->timer->data = g;
  arm(g);
  return 0;
}

/* The offer of peer that names a relay (every offer of one provider names
 * the same one; the first that names any), or NULL. */
static const gn_offer *relay_offer(gn_node *n, const uint8_t peer[GN_PK_LEN]) {
  for (size_t i = 0; n->offers && i < gn_offer_table_count(n->offers); i++) {
    const gn_offer_entry *e = gn_offer_table_at(n->offers, i);
    if (memcmp(e->offer.provider, peer, GN_PK_LEN) == 0 && e->offer.relay_addr[0])
      return &e->offer;
  }
  return NULL;
}

void gn__nat_peer_up(gn_node *n, const uint8_t peer[GN_PK_LEN], const char *addr) {
  struct gn__nat *g = n->nat;
  if (g && !g->closing) {
    uint64_t now = gn_mono_ms();
    /* A relay we dialled for a reach attempt is up: the punch that had to
     * wait for a rendezvous goes first (held), else the call follows. */
    gn_reach_info ri;
    for (size_t i = 0; gn_reach_get(g->reach, i, &ri); i++) {
      const gn_offer *o = NULL;
      if (strcmp(ri.state, "dialling-relay") == 0 && memcmp(ri.relay, peer, GN_PK_LEN) == 0 &&
          (o = relay_offer(n, ri.peer)) && memcmp(o->relay_id, peer, GN_PK_LEN) == 0)
        tcp_punch_maybe(g, o, now);
    }
    gn_reach_up(g->reach, peer, now);
    arm(g);
  }
  if (!g || g->closing || !n->cfg.overlay || !addr || !gn_nat_addr_valid(addr))
    return;
  sess_peer *slot = NULL;
  for (size_t i = 0; i < PEERS_MAX; i++) {
    sess_peer *p = &g->peers[i];
    if (p->used && memcmp(p->id, peer, GN_PK_LEN) == 0) {
      slot = p;
      break;
    }
    if (!slot && (!p->used || !gn_transport_is_up(n->tp, p->id)))
      slot = p;
  }
  if (slot) {
    *slot = (sess_peer){.used = true};
    memcpy(slot->id, peer, GN_PK_LEN);
    snprintf(slot->addr, sizeof slot->addr, "%s", addr);
  }
  gn_nat_ask(g->nat, peer, addr, gn_mono_ms());
}

void gn__nat_on_datagram(gn_node *n, const char *from, const gn_envelope *env, uint64_t now_ms) {
  struct gn__nat *g = n->nat;
  if (!g || g->closing)
    return;
  gn_nat_on_datagram(g->nat, from, env->signer, env->type, env->body, env->body_len, now_ms);
  arm(g);
}

void gn__nat_on_message(gn_node *n, const uint8_t peer[GN_PK_LEN], const gn_envelope *env) {
  struct gn__nat *g = n->nat;
  uint64_t now = gn_mono_ms();
  int r = 0;
  if (!g || g->closing)
    return;
  switch (env->type) {
  case GN_MSG_NAT_PUNCH_REQ:
    r = gn_nat_on_message(g->nat, peer, env->type, env->body, env->body_len, now);
    break;
  case GN_MSG_RELAY_RESERVE: {
    gn_relay_reserve_msg m;
    if ((r = gn_relay_reserve_decode(env->body, env->body_len, &m)) == 0)
      on_reserve(g, peer, &m, now);
    break;
  }
  case GN_MSG_RELAY_STATUS: {
    gn_relay_status_msg m;
    if ((r = gn_relay_status_decode(env->body, env->body_len, &m)) == 0)
      on_status(g, peer, &m, now);
    break;
  }
  case GN_MSG_RELAY_CALL: {
    gn_relay_call_msg m;
    if ((r = gn_relay_call_decode(env->body, env->body_len, &m)) == 0) {
      if (m.from_relay)
        on_call_from_relay(g, peer, &m);
      else
        on_call_to_relay(g, peer, &m, now);
    }
    break;
  }
  default:
    r = GN_EINVAL;
  }
  if (r < 0)
    gn_log_ratelimited("nat-dropped", GN_LOG_DEBUG, "nat: dropped a message of type %u: %s", env->type, gn_strerror(r));
  arm(g);
}

void gn__nat_close(gn_node *n) {
  struct gn__nat *g = n->nat;
  if (!g || g->closing)
    return;
  g->closing = true;
  while (g->splices)
    splice_close(g->splices);
  /* A dial in flight gets its connect callback (cancelled) before its
   * close callback frees it. */
  for (dial *d = g->dials, *next; d; d = next) {
    next = d->next;
    d->closed = true;
    gn_uv_close_free((uv_handle_t *)d->tcp, dial_freed, d);
  }
  g->dials = NULL;
  g->ndials = 0;
  while (g->tdials)
    tdial_close(g->tdials);
  if (g->listener)
    gn_uv_close_free((uv_handle_t *)g->listener, NULL, NULL);
  if (g->timer)
    gn_uv_close_free((uv_handle_t *)g->timer, NULL, NULL);
  g->listener = NULL;
  g->timer = NULL;
}

void gn__nat_free(gn_node *n) {
  struct gn__nat *g = n->nat;
  if (!g)
    return;
  gn__nat_close(n);
  g->nat = gn_nat_free(g->nat);
  g->relay = gn_relay_free(g->relay);
  g->reach = gn_reach_free(g->reach);
  free(g);
  n->nat = NULL;
}

/* --- the control API ---------------------------------------------------------------------*/

static json_t *nat_json(struct gn__nat *g) {
  uint64_t now = gn_mono_ms();
  char id[GN_NODE_ID_STRLEN], buf[GN_NAT_ADDR_MAX];
  json_t *o = json_object();
  json_object_set_new(o, "state", json_string(g->error[0] ? g->error : "on"));
  json_object_set_new(o, "type", json_string(gn_nat_type_name(gn_nat_type_get(g->nat, now))));
  json_object_set_new(o, "advertised",
                      gn_nat_advertised(g->nat, now, buf, sizeof buf) ? json_string(buf) : json_null());
  json_object_set_new(o, "outside_host",
                      gn_nat_outside_host(g->nat, now, buf, sizeof buf) ? json_string(buf) : json_null());
  json_object_set_new(o, "observations", json_integer((json_int_t)gn_nat_observation_count(g->nat, now)));
  json_t *punches = json_array();
  for (size_t i = 0; i < RESULTS_MAX; i++) {
    const result *x = &g->results[i];
    if (!x->used)
      continue;
    gn_node_id_format(x->peer, id);
    bool open = gn_nat_punched_addr(g->nat, x->peer, now, buf, sizeof buf);
    json_array_append_new(punches, json_pack("{s:s, s:s, s:s}", "peer", id, "state",
                                             open    ? "open"
                                             : x->ok ? "expired"
                                                     : "failed",
                                             "addr", open ? buf : x->addr));
  }
  json_object_set_new(o, "punches", punches);
  json_t *res = json_array();
  for (size_t i = 0; i < RESERVE_MAX; i++) {
    const reservation *r = &g->res[i];
    if (!r->used)
      continue;
    gn_node_id_format(r->relay, id);
    bool ok = r->ok && now < r->expires_ms;
    json_array_append_new(res, json_pack("{s:s, s:s, s:s, s:s}", "relay", id, "state",
                                         ok          ? "held"
                                         : r->why[0] ? "refused"
                                                     : "asked",
                                         "splice", r->splice, "why", r->why));
  }
  json_object_set_new(o, "reservations", res);
  json_t *calls = json_array();
  for (size_t i = 0; i < CALLS_MAX; i++) {
    const call *c = &g->calls[i];
    if (!c->used)
      continue;
    char rid[GN_NODE_ID_STRLEN];
    gn_node_id_format(c->target, id);
    gn_node_id_format(c->relay, rid);
    bool up = g->n->tp && gn_transport_is_up(g->n->tp, c->target);
    json_array_append_new(calls, json_pack("{s:s, s:s, s:s, s:s}", "peer", id, "relay", rid, "state",
                                           up && strcmp(c->state, "dialling") == 0 ? "up" : c->state, "why", c->why));
  }
  json_object_set_new(o, "calls", calls);
  json_t *reach = json_array();
  gn_reach_info ri;
  for (size_t i = 0; gn_reach_get(g->reach, i, &ri); i++) {
    char rid[GN_NODE_ID_STRLEN];
    gn_node_id_format(ri.peer, id);
    gn_node_id_format(ri.relay, rid);
    json_array_append_new(reach, json_pack("{s:s, s:s, s:s, s:s, s:i, s:s}", "peer", id, "relay", rid, "relay_addr",
                                           ri.relay_addr, "state", ri.state, "calls", (int)ri.calls, "why", ri.why));
  }
  json_object_set_new(o, "reach", reach);
  json_t *tcp = json_array();
  gn_nat_tcp_info ti;
  for (size_t i = 0; gn_nat_tcp_get(g->nat, i, now, &ti); i++) {
    gn_node_id_format(ti.peer, id);
    /* Where the peer's session goes now: its outside endpoint when the
     * punched connection is the one kept, a relay's splice when not. */
    gn_transport_peer_info pi;
    bool up = g->n->tp && gn_transport_get_peer_info(g->n->tp, ti.peer, &pi) == 0;
    json_array_append_new(tcp, json_pack("{s:s, s:s, s:s, s:i, s:o}", "peer", id, "addr", ti.addr, "state", ti.state,
                                         "dials", (int)ti.dials, "session", up ? json_string(pi.remote) : json_null()));
  }
  json_object_set_new(o, "tcp_punches", tcp);
  gn_reach_stats rs_;
  gn_reach_stats_get(g->reach, &rs_);
  json_object_set_new(o, "reach_stats",
                      json_pack("{s:I, s:I, s:I, s:I, s:I, s:I, s:I}", "wanted", (json_int_t)rs_.wanted, "direct",
                                (json_int_t)rs_.direct, "relayed", (json_int_t)rs_.relayed, "gave_up",
                                (json_int_t)rs_.gave_up, "dials", (json_int_t)rs_.dials, "calls", (json_int_t)rs_.calls,
                                "refused", (json_int_t)rs_.refused));
  const reservation *orv = offer_reservation(g, now);
  if (orv) {
    gn_node_id_format(orv->relay, id);
    json_object_set_new(o, "offer_relay", json_pack("{s:s, s:s}", "relay", id, "addr", orv->relay_addr));
  } else {
    json_object_set_new(o, "offer_relay", json_null());
  }
  gn_nat_stats ns;
  gn_nat_stats_get(g->nat, &ns);
  json_object_set_new(o, "tcp_stats",
                      json_pack("{s:I, s:I, s:I, s:I, s:I}", "punches", (json_int_t)ns.tcp_punches, "dials",
                                (json_int_t)ns.tcp_dials, "ok", (json_int_t)ns.tcp_ok, "failed",
                                (json_int_t)ns.tcp_failed, "refused", (json_int_t)ns.tcp_refused));
  json_object_set_new(o, "stats",
                      json_pack("{s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I}", "asks_sent",
                                (json_int_t)ns.asks_sent, "answers_sent", (json_int_t)ns.answers_sent, "observations",
                                (json_int_t)ns.observations, "answers_ignored", (json_int_t)ns.answers_ignored,
                                "punch_reqs_forwarded", (json_int_t)ns.punch_reqs_forwarded, "punch_reqs_refused",
                                (json_int_t)ns.punch_reqs_refused, "intros_refused", (json_int_t)ns.intros_refused,
                                "punch_dgrams_ignored", (json_int_t)ns.punch_dgrams_ignored, "punches_ok",
                                (json_int_t)ns.punches_ok, "punches_failed", (json_int_t)ns.punches_failed));
  if (g->relay) {
    gn_relay_stats rs;
    gn_relay_stats_get(g->relay, &rs);
    json_object_set_new(o, "relay",
                        json_pack("{s:s, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I}", "splice", g->splice_addr,
                                  "reservations", (json_int_t)gn_relay_reservations(g->relay, now), "sessions",
                                  (json_int_t)gn_relay_sessions(g->relay, now), "connections", (json_int_t)g->nsplices,
                                  "reserve_refused", (json_int_t)rs.reserve_refused, "calls", (json_int_t)rs.calls,
                                  "calls_refused", (json_int_t)rs.calls_refused, "bytes", (json_int_t)rs.bytes,
                                  "paused", (json_int_t)rs.paused));
  } else {
    json_object_set_new(o, "relay", json_null());
  }
  return o;
}

static void api_nat(gn_ctl_req *req, void *ud) {
  gn_node *n = ud;
  if (!n->nat)
    return gn_ctl_reply_error(req, 409, "no NAT traversal on this node");
  gn_ctl_reply_json(req, 200, nat_json(n->nat));
}

/* {"peer": ID, "via": ID}: both must be node ids, via a session peer. */
static int peer_and_via(gn_ctl_req *req, uint8_t peer[GN_PK_LEN], uint8_t via[GN_PK_LEN]) {
  const json_t *body = gn_ctl_req_body(req);
  const char *p = json_string_value(json_object_get(body, "peer"));
  const char *v = json_string_value(json_object_get(body, "via"));
  if (!p || !v || gn_node_id_parse(p, peer) < 0 || gn_node_id_parse(v, via) < 0) {
    gn_ctl_reply_error(req, 400, "give {\"peer\": NODE_ID, \"via\": NODE_ID of a peer both reach}");
    return GN_EINVAL;
  }
  return 0;
}

static void api_punch(gn_ctl_req *req, void *ud) {
  gn_node *n = ud;
  struct gn__nat *g = n->nat;
  uint8_t peer[GN_PK_LEN], via[GN_PK_LEN];
  if (!g || g->error[0])
    return gn_ctl_reply_error(req, 409, "no NAT traversal on this node (%s)", g ? g->error : "off");
  if (peer_and_via(req, peer, via) < 0)
    return;
  int r = gn_nat_punch_start(g->nat, peer, via, gn_mono_ms());
  if (r == GN_EEXIST)
    return gn_ctl_reply_json(req, 200, json_pack("{s:s}", "state", "open"));
  if (r < 0)
    return gn_ctl_reply_error(req, 409, "cannot start a punch: %s%s", gn_strerror(r),
                              r == GN_ENOTFOUND ? " (no session to the rendezvous)" : "");
  arm(g);
  gn_ctl_reply_json(req, 202, json_pack("{s:s}", "state", "punching"));
}

static void api_relay(gn_ctl_req *req, void *ud) {
  gn_node *n = ud;
  struct gn__nat *g = n->nat;
  uint8_t peer[GN_PK_LEN], via[GN_PK_LEN];
  if (!g)
    return gn_ctl_reply_error(req, 409, "no NAT traversal on this node");
  if (peer_and_via(req, peer, via) < 0)
    return;
  int r = start_call(g, via, peer, gn_mono_ms());
  if (r == GN_EBUSY)
    return gn_ctl_reply_error(req, 429, "too many relayed calls at once; try again in a minute");
  if (r < 0)
    return gn_ctl_reply_error(req, 409, "cannot call through that relay: %s%s", gn_strerror(r),
                              r == GN_ENOTFOUND ? " (no session to it)" : "");
  gn_ctl_reply_json(req, 202, json_pack("{s:s}", "state", "calling"));
}

/* {"via": ID}: a slot at that relay now, whatever this node's NAT type
 * (a node behind NAT asks its session peers on its own). */
static void api_reserve(gn_ctl_req *req, void *ud) {
  gn_node *n = ud;
  struct gn__nat *g = n->nat;
  uint8_t via[GN_PK_LEN];
  const char *v = json_string_value(json_object_get(gn_ctl_req_body(req), "via"));
  if (!g)
    return gn_ctl_reply_error(req, 409, "no NAT traversal on this node");
  if (!v || gn_node_id_parse(v, via) < 0)
    return gn_ctl_reply_error(req, 400, "give {\"via\": NODE_ID of a relay this node has a session to}");
  uint64_t now = gn_mono_ms();
  reservation *rv = res_find(g, via);
  for (size_t j = 0; j < RESERVE_MAX && !rv; j++)
    if (!g->res[j].used || !g->res[j].ok || now >= g->res[j].expires_ms)
      rv = &g->res[j];
  if (!rv)
    return gn_ctl_reply_error(req, 429, "this node holds %d relay slots already", RESERVE_MAX);
  gn_relay_reserve_msg m = {.reserve = true};
  gn_buf b = {0};
  int r = gn_relay_reserve_encode(&m, &b);
  if (r == 0)
    r = nat_msg(g, via, GN_MSG_RELAY_RESERVE, b.data, b.len);
  gn_buf_done(&b);
  if (r < 0)
    return gn_ctl_reply_error(req, 409, "cannot ask that relay: %s%s", gn_strerror(r),
                              r == GN_ENOTFOUND ? " (no session to it)" : "");
  if (!rv->used || memcmp(rv->relay, via, GN_PK_LEN) != 0) {
    *rv = (reservation){.used = true};
    memcpy(rv->relay, via, GN_PK_LEN);
  }
  for (size_t i = 0; i < PEERS_MAX; i++)
    if (g->peers[i].used && memcmp(g->peers[i].id, via, GN_PK_LEN) == 0)
      snprintf(rv->relay_addr, sizeof rv->relay_addr, "%s", g->peers[i].addr);
  rv->asked_ms = now;
  gn_ctl_reply_json(req, 202, json_pack("{s:s}", "state", "asked"));
}

void gn__nat_register(gn_node *n) {
  gn_ctl_route(n->ctl, "POST", "/v1/nat/reserve", api_reserve, n);
  gn_ctl_route(n->ctl, "GET", "/v1/nat", api_nat, n);
  gn_ctl_route(n->ctl, "POST", "/v1/nat/punch", api_punch, n);
  gn_ctl_route(n->ctl, "POST", "/v1/nat/relay", api_relay, n);
}

bool gn__nat_punched_addr(gn_node *n, const uint8_t peer[GN_PK_LEN], char *buf, size_t cap) {
  struct gn__nat *g = n->nat;
  return g && gn_nat_punched_addr(g->nat, peer, gn_mono_ms(), buf, cap);
}

int gn__nat_connect_peer(gn_node *n, const char *addr, const uint8_t peer[GN_PK_LEN]) {
  int r = n->tp ? gn_transport_connect_peer(n->tp, addr, peer) : GN_ECLOSED;
  struct gn__nat *g = n->nat;
  if (!g || g->closing || !n->tp || r == GN_ECLOSED || !n->offers || gn_transport_is_up(n->tp, peer))
    return r;
  const gn_offer *o = relay_offer(n, peer);
  if (!o || memcmp(o->relay_id, n->id->pk, GN_PK_LEN) == 0)
    return r;
  uint64_t now = gn_mono_ms();
  int w = gn_reach_want(g->reach, peer, o->relay_id, o->relay_addr, r == 0, now);
  if (w == 0)
    tcp_punch_maybe(g, o, now);
  if (w == 0) {
    char id[GN_NODE_ID_STRLEN], rid[GN_NODE_ID_STRLEN];
    gn_node_id_format(peer, id);
    gn_node_id_format(o->relay_id, rid);
    gn_log_ratelimited("nat-reach", GN_LOG_INFO,
                       "nat: %s names relay %s at %s; asking it unless a direct session comes up", id, rid,
                       o->relay_addr);
  } else if (w != GN_EEXIST) {
    gn_log_ratelimited("nat-reach", GN_LOG_INFO, "nat: not reaching a peer through its relay: %s", gn_strerror(w));
  }
  arm(g);
  return w == 0 || w == GN_EEXIST ? 0 : r;
}

void gn__nat_offer(gn_node *n, gn_offer *o) {
  struct gn__nat *g = n->nat;
  /* Behind a cone NAT our outside address is where we are reached (by a
   * TCP punch: requesters behind cone NATs punch only to an offer that
   * names an outside address; one behind a symmetric NAT keeps its listen
   * address, which says there is no punching to it). */
  if (g && !g->closing && g->type == GN_NAT_CONE && gn_nat_addr_valid(g->advertised))
    snprintf(o->addr, sizeof o->addr, "%s", g->advertised);
  const reservation *r = g && !g->closing ? offer_reservation(g, gn_mono_ms()) : NULL;
  if (!r || memcmp(r->relay, n->id->pk, GN_PK_LEN) == 0)
    return;
  memcpy(o->relay_id, r->relay, GN_PK_LEN);
  snprintf(o->relay_addr, sizeof o->relay_addr, "%s", r->relay_addr);
}

bool gn__nat_reaching(gn_node *n, const uint8_t peer[GN_PK_LEN]) {
  struct gn__nat *g = n->nat;
  return g && !g->closing && gn_reach_active(g->reach, peer);
}
