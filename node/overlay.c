/* The daemon's membership: SWIM with Lifeguard (p2p/swim.c, an I/O-free
 * state machine) driven on a UDP socket bound to the same address and port
 * as the TCP listener, a timer at the machine's next deadline, and what a
 * member's death means for the offer table. Every datagram is a signed
 * envelope; one that comes in is bounded in size, then rate-limited by its
 * source address and by a bucket for all sources, and only then verified
 * (verification costs CPU, a token does not). docs/overlay/daemon.md. */
#include "overlay.h"

#include <gpunet/ratelimit.h>
#include <gpunet/swim.h>
#include <gpunet/uvutil.h>
#include <gpunet/views.h>
#include <gpunet/wire.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sodium.h>
#include <stdarg.h>
#include <stdio.h>

/* Membership lines in the log: a bucket of 64 refilled at 2 per second;
 * what it holds back is counted and said with the next line that passes. */
#define LOG_BURST 64
#define LOG_RATE_PER_S 2
/* The timer never sleeps longer than this, whatever the machine says. */
#define TICK_MAX_MS 1000
/* After the leave, the socket stays open (past the sessions' close if
 * need be) until a member answered one of the pings that carry the leave
 * (the machine sends them, and again until one is answered; the one who
 * holds it spreads it), or this long after the leave. */
#define LEAVE_LINGER_MS 3000
/* Where a member's signed datagrams come from, when that is not the address
 * it advertises (a node behind a symmetric NAT: another outside port for
 * every peer it sends to, none of them the one it can advertise). Our
 * datagrams to the advertised address go there instead while it is this
 * fresh, below the 30 s a NAT keeps an unanswered UDP mapping. A bounded
 * table: the entry heard from longest ago gives way. */
#define OBS_MAX 64
#define OBS_FRESH_MS 25000

typedef struct ov_stats {
  uint64_t in, oversized, rate_limited, verified, bad_sig, bad_version, malformed, not_swim, rejected, out, out_failed,
      offers_dropped, out_observed;
} ov_stats;

typedef struct ov_observed {
  char adv[GN_SWIM_ADDR_MAX]; /* the member's advertised address ("" : free) */
  char src[GN_SWIM_ADDR_MAX]; /* where its datagrams came from */
  uint64_t at_ms;
} ov_observed;

struct gn__overlay {
  gn_node *n;
  gn_swim *swim;
  gn_views *views; /* partial views over sessions; NULL without membership */
  uv_udp_t *udp;
  uv_timer_t *timer;
  bool leaving;   /* gn__overlay_stop: the leave is said, the socket still open */
  bool lingering; /* gn__overlay_close came while leaving: closes once the leave is told */
  bool closing;
  uint64_t linger_end_ms;
  char error[200]; /* why there is no membership, "" when there is */
  uint8_t rbuf[GN_OVERLAY_DGRAM_MAX];
  gn_ratelimit *per_src; /* by source host, any port */
  gn_token_bucket all;
  gn_rate src_rate, all_rate; /* the config's overlay_source_rate and overlay_rate, bursts of twice */
  gn_token_bucket logb;
  uint64_t logs_held;
  ov_stats st;
  ov_observed obs[OBS_MAX];
};

static const gn_rate log_rate = GN_RATE(LOG_RATE_PER_S, LOG_BURST);

/* The rate limits, in order: the source host's bucket, then everyone's (a
 * source over its own limit takes nothing from the others' share). */
static bool admit(struct gn__overlay *o, const struct sockaddr *sa, uint64_t now_ms) {
  uint8_t key[GN_RATELIMIT_KEY_MAX];
  size_t klen = gn_ratelimit_addr_key(sa, false, key);
  if (!klen || !gn_ratelimit_allow(o->per_src, key, klen, 1, now_ms))
    return false;
  return gn_token_bucket_take(&o->all, o->all_rate, 1, now_ms);
}

/* --- addresses ----------------------------------------------------------------*/

/* "a.b.c.d:port" or "[v6]:port", numeric only ("localhost" is
 * 127.0.0.1): addresses come from peers, and a name would make us resolve
 * what a stranger chose. */
static int parse_addr(const char *addr, struct sockaddr_storage *ret) {
  char host[64];
  const char *colon = addr ? strrchr(addr, ':') : NULL;
  if (!colon || colon == addr)
    return GN_EINVAL;
  size_t hl = (size_t)(colon - addr);
  const char *h = addr;
  bool v6 = addr[0] == '[';
  if (v6) {
    if (hl < 3 || addr[hl - 1] != ']')
      return GN_EINVAL;
    h = addr + 1;
    hl -= 2;
  }
  if (hl == 0 || hl >= sizeof host)
    return GN_EINVAL;
  memcpy(host, h, hl);
  host[hl] = '\0';
  const char *p = colon + 1;
  unsigned port = 0;
  if (!*p || strlen(p) > 5)
    return GN_EINVAL;
  for (; *p; p++) {
    if (*p < '0' || *p > '9')
      return GN_EINVAL;
    port = port * 10 + (unsigned)(*p - '0');
  }
  if (port == 0 || port > 65535)
    return GN_EINVAL;
  memset(ret, 0, sizeof *ret);
  if (!v6 && strcmp(host, "localhost") == 0)
    memcpy(host, "127.0.0.1", sizeof "127.0.0.1");
  int r = v6 ? uv_ip6_addr(host, (int)port, (struct sockaddr_in6 *)ret)
             : uv_ip4_addr(host, (int)port, (struct sockaddr_in *)ret);
  return r < 0 ? GN_EINVAL : 0;
}

static void format_addr(const struct sockaddr *sa, char *out, size_t cap) {
  char host[64] = "";
  if (sa->sa_family == AF_INET6) {
    const struct sockaddr_in6 *a = (const struct sockaddr_in6 *)sa;
    uv_ip6_name(a, host, sizeof host);
    snprintf(out, cap, "[%s]:%u", host, (unsigned)ntohs(a->sin6_port));
  } else {
    const struct sockaddr_in *a = (const struct sockaddr_in *)sa;
    uv_ip4_name(a, host, sizeof host);
    snprintf(out, cap, "%s:%u", host, (unsigned)ntohs(a->sin_port));
  }
}

/* An address nobody can send to: 0.0.0.0 or [::] (a wildcard listener). */
static bool unspecified(const struct sockaddr_storage *ss) {
  static const uint8_t zero[16];
  if (ss->ss_family == AF_INET)
    return ((const struct sockaddr_in *)ss)->sin_addr.s_addr == 0;
  return memcmp(&((const struct sockaddr_in6 *)ss)->sin6_addr, zero, 16) == 0;
}

/* --- the machine's I/O ----------------------------------------------------------*/

static void ov_log(struct gn__overlay *o, enum gn_log_level lvl, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* A membership line, unless the log bucket is empty (then counted). */
static void ov_log(struct gn__overlay *o, enum gn_log_level lvl, const char *fmt, ...) {
  if (!gn_token_bucket_take(&o->logb, log_rate, 1, gn_mono_ms())) {
    o->logs_held++;
    return;
  }
  if (o->logs_held) {
    gn_log(GN_LOG_WARN, "overlay: %llu membership lines not logged (more than %d a second)",
           (unsigned long long)o->logs_held, LOG_RATE_PER_S);
    o->logs_held = 0;
  }
  va_list ap;
  va_start(ap, fmt);
  gn_logv(lvl, fmt, ap);
  va_end(ap);
}

/* A member's datagram, accepted, came from src: remember it when that is
 * not where the member says it is, forget it when it is. */
static void observed_from(struct gn__overlay *o, const uint8_t id[GN_PK_LEN], const char *src, uint64_t now) {
  gn_swim_member m;
  if (gn_swim_get(o->swim, id, &m) < 0 || !m.addr[0])
    return;
  ov_observed *e = NULL, *oldest = &o->obs[0];
  for (size_t i = 0; i < OBS_MAX && !e; i++) {
    if (o->obs[i].adv[0] && strcmp(o->obs[i].adv, m.addr) == 0)
      e = &o->obs[i];
    else if (oldest->adv[0] && (!o->obs[i].adv[0] || o->obs[i].at_ms < oldest->at_ms))
      oldest = &o->obs[i];
  }
  if (strcmp(m.addr, src) == 0) {
    if (e)
      e->adv[0] = '\0';
    return;
  }
  e = e ? e : oldest;
  snprintf(e->adv, sizeof e->adv, "%s", m.addr);
  snprintf(e->src, sizeof e->src, "%s", src);
  e->at_ms = now;
}

/* Where a datagram for addr goes: the source a member at addr spoke from
 * lately, else addr. */
static const char *send_to(struct gn__overlay *o, const char *addr, uint64_t now) {
  for (size_t i = 0; i < OBS_MAX; i++)
    if (o->obs[i].adv[0] && strcmp(o->obs[i].adv, addr) == 0) {
      if (now - o->obs[i].at_ms >= OBS_FRESH_MS)
        return addr;
      o->st.out_observed++;
      return o->obs[i].src;
    }
  return addr;
}

static void io_send(void *ud, const char *addr, uint32_t type, const uint8_t *body, size_t len) {
  struct gn__overlay *o = ud;
  struct sockaddr_storage ss;
  gn_buf env = {0};
  if (!o->udp)
    return;
  addr = send_to(o, addr, gn_mono_ms());
  if (parse_addr(addr, &ss) < 0 || gn_envelope_seal(o->n->id, type, body, len, &env) < 0 ||
      env.len > GN_OVERLAY_DGRAM_MAX) {
    o->st.out_failed++;
    gn_buf_done(&env);
    return;
  }
  uv_buf_t b = uv_buf_init((char *)env.data, (unsigned)env.len);
  /* Datagrams are fire and forget: one the kernel cannot take now is lost,
   * as it could be on the way; the protocol retries. */
  if (uv_udp_try_send(o->udp, &b, 1, (const struct sockaddr *)&ss) < 0)
    o->st.out_failed++;
  else
    o->st.out++;
  gn_buf_done(&env);
}

static const char *state_name(gn_swim_state s) {
  switch (s) {
  case GN_SWIM_ALIVE:
    return "alive";
  case GN_SWIM_SUSPECT:
    return "suspect";
  case GN_SWIM_DEAD:
    return "dead";
  case GN_SWIM_LEFT:
    return "left";
  }
  return "unknown";
}

static void io_event(void *ud, const gn_swim_event *ev) {
  struct gn__overlay *o = ud;
  gn_node *n = o->n;
  const gn_swim_member *m = &ev->member;
  char id[GN_NODE_ID_STRLEN];
  gn_node_id_format(m->id, id);
  unsigned inc = m->incarnation;
  switch (ev->kind) {
  case GN_SWIM_EV_JOIN:
    ov_log(o, GN_LOG_INFO, "overlay: %s joined at %s (incarnation %u)", id, m->addr, inc);
    /* A member is a candidate neighbour: hearsay in the passive view, so a
     * node whose contacts are gone can still refill its active view. */
    if (o->views && !o->leaving)
      gn_views_add_passive(o->views, m->id, m->addr, gn_mono_ms());
    if (n->peertab)
      gn_peertab_heard(n->peertab, m->id, m->addr, GN_PEER_HEARSAY, gn_mono_ms());
    return;
  case GN_SWIM_EV_SUSPECT:
    ov_log(o, GN_LOG_INFO, "overlay: %s is suspect (incarnation %u, %s)", id, inc,
           ev->local ? "its probe failed here" : "reported");
    return;
  case GN_SWIM_EV_ALIVE:
    ov_log(o, GN_LOG_INFO, "overlay: %s is alive (incarnation %u)", id, inc);
    return;
  case GN_SWIM_EV_DEAD:
  case GN_SWIM_EV_LEFT:
    break;
  }
  bool dead = ev->kind == GN_SWIM_EV_DEAD;
  /* Its offers go only when no session vouches for it: a node declared
   * dead by hearsay (or by lost datagrams) that still holds a session to
   * us is alive enough to rent from, and its refutation brings it back
   * into the membership. A session that ends drops them anyway (discovery's
   * peer_down). */
  size_t dropped = 0;
  bool session = n->tp && gn_transport_is_up(n->tp, m->id);
  if (!session && n->offers)
    dropped = gn_offer_table_remove_provider(n->offers, m->id);
  o->st.offers_dropped += dropped;
  if (dead)
    ov_log(o, GN_LOG_INFO, "overlay: %s is dead (incarnation %u, %s)%s", id, inc,
           ev->local ? "declared here" : "reported", session ? "; its session is up: its offers stay" : "");
  else
    ov_log(o, GN_LOG_INFO, "overlay: %s left (incarnation %u)", id, inc);
  if (dropped)
    ov_log(o, GN_LOG_INFO, "overlay: dropped %zu offer%s of %s", dropped, dropped == 1 ? "" : "s", id);
}

/* --- partial views ----------------------------------------------------------*/

static int views_send(void *ud, const uint8_t peer[GN_PK_LEN], uint32_t type, const uint8_t *body, size_t len) {
  struct gn__overlay *o = ud;
  gn_buf env = {0};
  int r = o->n->tp ? gn_envelope_seal(o->n->id, type, body, len, &env) : GN_ECLOSED;
  if (r == 0)
    r = gn_transport_send(o->n->tp, peer, env.data, env.len);
  gn_buf_done(&env);
  return r;
}

static void views_connect(void *ud, const uint8_t peer[GN_PK_LEN], const char *addr) {
  struct gn__overlay *o = ud;
  /* A key whose address answered with another key lately is not dialled
   * (the peer table's back-off); the views time the request out. */
  if (o->n->tp && !o->leaving && !gn_peertab_backed_off(o->n->peertab, peer, gn_mono_ms()))
    gn_transport_connect_peer(o->n->tp, addr, peer);
}

/* The views no longer need the session: the peer table lets it close
 * sooner, when nothing else uses it (daemon.c's sweep closes it). */
static void views_disconnect(void *ud, const uint8_t peer[GN_PK_LEN]) {
  struct gn__overlay *o = ud;
  if (o->n->peertab)
    gn_peertab_release(o->n->peertab, peer, gn_mono_ms());
}

/* The active view is who discovery pushes offers to. */
static void views_event(void *ud, const uint8_t peer[GN_PK_LEN], gn_views_event_kind kind) {
  struct gn__overlay *o = ud;
  if (o->n->disc)
    gn_discovery_set_neighbour(o->n->disc, peer, kind == GN_VIEWS_EV_ADDED);
}

/* Whether addr is one of the configured bootstrap addresses (both
 * normalised: "localhost" is 127.0.0.1). */
static bool is_bootstrap(const gn_node *n, const char *addr) {
  struct sockaddr_storage a, b;
  char x[GN_SWIM_ADDR_MAX], y[GN_SWIM_ADDR_MAX];
  if (parse_addr(addr, &a) < 0)
    return false;
  format_addr((const struct sockaddr *)&a, x, sizeof x);
  for (size_t i = 0; i < n->cfg.bootstrap_count; i++) {
    if (parse_addr(n->cfg.bootstrap[i], &b) < 0)
      continue;
    format_addr((const struct sockaddr *)&b, y, sizeof y);
    if (strcmp(x, y) == 0)
      return true;
  }
  return false;
}

/* --- the loop ---------------------------------------------------------------*/

static void on_timer(uv_timer_t *t);

static void close_now(struct gn__overlay *o);

/* Lingering after the leave: closes once enough answers carried it, or
 * its time is up, or nobody is left to tell. */
static void linger_check(struct gn__overlay *o) {
  if (!o->lingering || o->closing)
    return;
  if (gn_swim_leave_acks(o->swim) > 0 || gn_mono_ms() >= o->linger_end_ms ||
      gn_swim_count(o->swim, GN_SWIM_ALIVE) + gn_swim_count(o->swim, GN_SWIM_SUSPECT) == 0)
    close_now(o);
}

/* Sets the timer at the machine's next deadline (now when it is past),
 * or at the end of the linger when that is sooner. */
static void arm(struct gn__overlay *o) {
  if (o->closing || !o->timer)
    return;
  uint64_t now = gn_mono_ms(), at = gn_swim_next_deadline_ms(o->swim);
  uint64_t vat = o->views && !o->leaving ? gn_views_next_deadline_ms(o->views) : UINT64_MAX;
  if (vat < at)
    at = vat;
  if (o->lingering && o->linger_end_ms < at)
    at = o->linger_end_ms;
  uint64_t delay = at > now ? at - now : 0;
  if (delay > TICK_MAX_MS)
    delay = TICK_MAX_MS;
  uv_timer_start(o->timer, on_timer, delay, 0);
}

static void on_timer(uv_timer_t *t) {
  struct gn__overlay *o = t->data;
  uint64_t now = gn_mono_ms();
  gn_swim_tick(o->swim, now);
  if (o->views && !o->leaving)
    gn_views_tick(o->views, now);
  linger_check(o);
  arm(o);
}

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf) {
  (void)suggested;
  struct gn__overlay *o = h->data;
  /* Exactly the bound: a longer datagram arrives cut, flagged partial. */
  *buf = uv_buf_init((char *)o->rbuf, sizeof o->rbuf);
}

static void on_recv(uv_udp_t *h, ssize_t nread, const uv_buf_t *buf, const struct sockaddr *sa, unsigned flags) {
  struct gn__overlay *o = h->data;
  if (nread <= 0 || !sa || o->closing)
    return; /* nothing more to read now, or a read error (ICMP): nothing to do */
  o->st.in++;
  if (flags & UV_UDP_PARTIAL) {
    o->st.oversized++;
    return;
  }
  uint64_t now = gn_mono_ms();
  if (!admit(o, sa, now)) {
    o->st.rate_limited++;
    return;
  }
  gn_envelope env;
  o->st.verified++;
  int r = gn_envelope_open((const uint8_t *)buf->base, (size_t)nread, &env);
  if (r < 0) {
    *(r == GN_ESIG ? &o->st.bad_sig : r == GN_EVERSION ? &o->st.bad_version : &o->st.malformed) += 1;
    return;
  }
  if (env.type == GN_MSG_NAT_OBSERVED || env.type == GN_MSG_NAT_PUNCH) {
    char nfrom[GN_SWIM_ADDR_MAX];
    format_addr(sa, nfrom, sizeof nfrom);
    gn__nat_on_datagram(o->n, nfrom, &env, now); /* node/nat.c */
    return;
  }
  /* Our own key never speaks to us: a datagram of ours sent back is a
   * replay. */
  if (env.type < GN_MSG_SWIM_PING || env.type > GN_MSG_SWIM_NACK || memcmp(env.signer, o->n->id->pk, GN_PK_LEN) == 0) {
    o->st.not_swim++;
    return;
  }
  char from[GN_SWIM_ADDR_MAX];
  format_addr(sa, from, sizeof from);
  if (gn_swim_on_datagram(o->swim, from, env.signer, env.type, env.body, env.body_len, now) < 0)
    o->st.rejected++;
  else
    observed_from(o, env.signer, from, now);
  linger_check(o);
  arm(o);
}

/* --- the daemon's calls ---------------------------------------------------------*/

int gn__overlay_start(gn_node *n, char *err, size_t cap) {
  struct gn__overlay *o = calloc(1, sizeof *o);
  const char *laddr = gn_transport_listen_addr(n->tp);
  struct sockaddr_storage ss;
  int r;
  if (!o) {
    snprintf(err, cap, "cannot start the overlay: out of memory");
    return GN_ENOMEM;
  }
  o->n = n;
  n->overlay = o;
  uint64_t now = gn_mono_ms();
  /* The config's rates (defaults GN_OVERLAY_SRC_RATE_PER_S and
   * GN_OVERLAY_ALL_RATE_PER_S), with bursts of twice the rate. */
  uint32_t src_per_s = (uint32_t)n->cfg.limits.overlay_source_rate, all_per_s = (uint32_t)n->cfg.limits.overlay_rate;
  o->src_rate =
      GN_RATE(src_per_s ? src_per_s : GN_OVERLAY_SRC_RATE_PER_S, src_per_s ? 2 * src_per_s : GN_OVERLAY_SRC_BURST);
  o->all_rate =
      GN_RATE(all_per_s ? all_per_s : GN_OVERLAY_ALL_RATE_PER_S, all_per_s ? 2 * all_per_s : GN_OVERLAY_ALL_BURST);
  gn_token_bucket_init(&o->all, o->all_rate, now);
  gn_token_bucket_init(&o->logb, log_rate, now);
  if (!n->cfg.overlay) {
    snprintf(o->error, sizeof o->error, "off");
    return 0;
  }
  if ((r = parse_addr(laddr, &ss)) < 0) {
    snprintf(o->error, sizeof o->error, "failed: the listen address %s is not numeric", laddr);
    goto degraded;
  }
  if (gn_ratelimit_new(GN_OVERLAY_SRC_MAX, o->src_rate, &o->per_src) < 0) {
    snprintf(err, cap, "cannot start the overlay: out of memory");
    return GN_ENOMEM;
  }
  gn_swim_io io = {io_send, io_event, o};
  uint64_t seed;
  randombytes_buf(&seed, sizeof seed);
  if ((r = gn_swim_new(n->id->pk, laddr, NULL, &io, seed, now, &o->swim)) < 0) {
    snprintf(err, cap, "cannot start the overlay's membership: %s", gn_strerror(r));
    return r;
  }
  o->udp = gn_uv_handle_alloc(sizeof *o->udp);
  o->timer = gn_uv_handle_alloc(sizeof *o->timer);
  if (!o->udp || !o->timer) {
    gn_uv_handle_free_unused(o->udp);
    gn_uv_handle_free_unused(o->timer);
    o->udp = NULL;
    o->timer = NULL;
    snprintf(err, cap, "cannot start the overlay: out of memory");
    return GN_ENOMEM;
  }
  uv_timer_init(n->loop, o->timer);
  o->timer->data = o;
  if ((r = uv_udp_init(n->loop, o->udp)) < 0) {
    gn_uv_handle_free_unused(o->udp);
    o->udp = NULL;
    gn_uv_close_free((uv_handle_t *)o->timer, NULL, NULL);
    o->timer = NULL;
    o->swim = gn_swim_free(o->swim);
    snprintf(o->error, sizeof o->error, "failed: cannot make a UDP socket: %s", uv_strerror(r));
    goto degraded;
  }
  o->udp->data = o;
  if ((r = uv_udp_bind(o->udp, (const struct sockaddr *)&ss, 0)) < 0 ||
      (r = uv_udp_recv_start(o->udp, on_alloc, on_recv)) < 0) {
    snprintf(o->error, sizeof o->error, "failed: cannot bind UDP %s: %s", laddr, uv_strerror(r));
    gn_uv_close_free((uv_handle_t *)o->udp, NULL, NULL);
    gn_uv_close_free((uv_handle_t *)o->timer, NULL, NULL);
    o->udp = NULL;
    o->timer = NULL;
    o->swim = gn_swim_free(o->swim);
    goto degraded;
  }
  gn_views_io vio = {views_send, views_connect, views_disconnect, views_event, o};
  if ((r = gn_views_new(n->id->pk, laddr, NULL, &vio, seed ^ 0x9e3779b97f4a7c15ull, now, &o->views)) < 0)
    gn_log(GN_LOG_ERROR, "overlay: no partial views (%s): offers go to every peer", gn_strerror(r));
  else
    gn_discovery_neighbours_only(n->disc, true);
  arm(o);
  gn_log(GN_LOG_INFO, "overlay: membership on UDP %s%s", laddr, o->views ? ", partial views over sessions" : "");
  return 0;
degraded:
  gn_log(GN_LOG_ERROR, "overlay: %s; this node runs without membership (peers and offers still work)", o->error);
  return 0;
}

int gn__overlay_send(gn_node *n, const char *addr, uint32_t type, const uint8_t *body, size_t len) {
  struct gn__overlay *o = n->overlay;
  if (!o || !o->udp || o->closing)
    return GN_ECLOSED;
  io_send(o, addr, type, body, len);
  return 0;
}

void gn__overlay_peer_up(gn_node *n, const uint8_t peer[GN_PK_LEN], const char *addr) {
  struct gn__overlay *o = n->overlay;
  struct sockaddr_storage ss;
  if (!o || !o->swim || o->leaving || o->closing)
    return;
  uint64_t now = gn_mono_ms();
  bool reachable = addr && parse_addr(addr, &ss) == 0 && !unspecified(&ss);
  if (reachable) {
    int r = gn_swim_add(o->swim, peer, addr, now);
    if (r < 0)
      gn_log(GN_LOG_DEBUG, "overlay: cannot add member at %s: %s", addr, gn_strerror(r));
  }
  if (o->views) {
    gn_views_peer_up(o->views, peer, reachable ? addr : "", now);
    /* A bootstrap node's session proves its key: JOIN through it, once
     * (the views rejoin through it themselves when they run empty; a JOIN
     * on every reconnect would make it evict a member each time). */
    if (reachable && is_bootstrap(n, addr) && !gn_views_is_contact(o->views, peer)) {
      gn_views_add_contact(o->views, peer, addr, now);
      if (n->peertab)
        gn_peertab_heard(n->peertab, peer, addr, GN_PEER_BOOTSTRAP, now);
    }
  }
  arm(o);
}

void gn__overlay_peer_down(gn_node *n, const uint8_t peer[GN_PK_LEN]) {
  struct gn__overlay *o = n->overlay;
  if (!o || !o->views || o->leaving || o->closing)
    return;
  gn_views_peer_down(o->views, peer, gn_mono_ms());
  arm(o);
}

void gn__overlay_heard(gn_node *n, const uint8_t id[GN_PK_LEN], const char *addr) {
  struct gn__overlay *o = n->overlay;
  if (!o || !o->views || o->leaving || o->closing)
    return;
  gn_views_add_passive(o->views, id, addr, gn_mono_ms());
}

int gn__overlay_on_message(gn_node *n, const uint8_t peer[GN_PK_LEN], const gn_envelope *env) {
  struct gn__overlay *o = n->overlay;
  if (!o || !o->views || o->leaving || o->closing)
    return GN_ESTATE;
  int r = gn_views_on_message(o->views, peer, env->type, env->body, env->body_len, gn_mono_ms());
  arm(o);
  return r;
}

void gn__overlay_stop(gn_node *n) {
  struct gn__overlay *o = n->overlay;
  if (!o || o->leaving || o->closing)
    return;
  o->leaving = true;
  if (o->swim && o->udp) {
    /* The machine stops probing and answers with the leave from now on;
     * what it sends at once goes out now (uv_udp_try_send). */
    uint64_t now = gn_mono_ms();
    gn_swim_leave(o->swim, now);
    o->linger_end_ms = now + LEAVE_LINGER_MS;
    gn_swim_tick(o->swim, now);
    arm(o);
  }
}

static void close_now(struct gn__overlay *o) {
  if (o->closing)
    return;
  o->closing = true;
  if (o->timer)
    gn_uv_close_free((uv_handle_t *)o->timer, NULL, NULL);
  if (o->udp)
    gn_uv_close_free((uv_handle_t *)o->udp, NULL, NULL);
  o->timer = NULL;
  o->udp = NULL;
}

void gn__overlay_close(gn_node *n) {
  struct gn__overlay *o = n->overlay;
  if (!o || o->closing || o->lingering)
    return;
  if (!o->leaving || !o->swim || !o->udp) {
    close_now(o);
    return;
  }
  o->lingering = true;
  linger_check(o);
  arm(o);
}

void gn__overlay_free(gn_node *n) {
  struct gn__overlay *o = n->overlay;
  if (!o)
    return;
  close_now(o);
  o->swim = gn_swim_free(o->swim);
  o->views = gn_views_free(o->views);
  o->per_src = gn_ratelimit_free(o->per_src);
  free(o);
  n->overlay = NULL;
}

void gn__overlay_status_json(gn_node *n, json_t *obj) {
  struct gn__overlay *o = n->overlay;
  if (!obj)
    return;
  if (!o || !o->swim) {
    json_object_set_new(obj, "overlay", json_string(o && o->error[0] ? o->error : "off"));
    return;
  }
  json_object_set_new(obj, "overlay", json_string("on"));
  /* The machine counts the others; this node is one more member, alive
   * until it leaves. */
  size_t alive = gn_swim_count(o->swim, GN_SWIM_ALIVE) + (o->leaving || o->closing ? 0 : 1);
  json_object_set_new(obj, "members",
                      json_pack("{s:I, s:I, s:I, s:I}", "alive", (json_int_t)alive, "suspect",
                                (json_int_t)gn_swim_count(o->swim, GN_SWIM_SUSPECT), "dead",
                                (json_int_t)gn_swim_count(o->swim, GN_SWIM_DEAD), "left",
                                (json_int_t)gn_swim_count(o->swim, GN_SWIM_LEFT)));
  json_object_set_new(obj, "health", json_integer(gn_swim_health(o->swim)));
  if (o->views)
    json_object_set_new(obj, "views",
                        json_pack("{s:I, s:I}", "active", (json_int_t)gn_views_active_count(o->views), "passive",
                                  (json_int_t)gn_views_passive_count(o->views)));
  json_object_set_new(obj, "incarnation", json_integer(gn_swim_incarnation(o->swim)));
  const ov_stats *s = &o->st;
  json_object_set_new(
      obj, "datagrams",
      json_pack("{s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I}", "in", (json_int_t)s->in,
                "oversized", (json_int_t)s->oversized, "rate_limited", (json_int_t)s->rate_limited, "verified",
                (json_int_t)s->verified, "bad_signature", (json_int_t)s->bad_sig, "bad_version",
                (json_int_t)s->bad_version, "malformed", (json_int_t)s->malformed, "not_membership",
                (json_int_t)s->not_swim, "rejected", (json_int_t)s->rejected, "out", (json_int_t)s->out, "out_failed",
                (json_int_t)s->out_failed, "sources", (json_int_t)gn_ratelimit_count(o->per_src), "offers_dropped",
                (json_int_t)s->offers_dropped, "out_to_observed", (json_int_t)s->out_observed));
}

const char *gn__overlay_view_of(gn_node *n, const uint8_t id[GN_PK_LEN]) {
  struct gn__overlay *o = n->overlay;
  if (!o || !o->views)
    return NULL;
  return gn_views_is_active(o->views, id) ? "active" : gn_views_is_passive(o->views, id) ? "passive" : "none";
}

const char *gn__overlay_member_state(gn_node *n, const uint8_t id[GN_PK_LEN]) {
  struct gn__overlay *o = n->overlay;
  gn_swim_member m;
  if (!o || !o->swim || gn_swim_get(o->swim, id, &m) < 0)
    return NULL;
  return state_name(m.state);
}

int gn__overlay_member_addr(gn_node *n, const uint8_t id[GN_PK_LEN], char *out, size_t cap) {
  struct gn__overlay *o = n->overlay;
  gn_swim_member m;
  if (!o || !o->swim || gn_swim_get(o->swim, id, &m) < 0 || !m.addr[0] ||
      (m.state != GN_SWIM_ALIVE && m.state != GN_SWIM_SUSPECT) || memcmp(id, n->id->pk, GN_PK_LEN) == 0)
    return GN_ENOTFOUND;
  if (strlen(m.addr) >= cap)
    return GN_ETOOBIG;
  memcpy(out, m.addr, strlen(m.addr) + 1);
  return 0;
}

void gn__overlay_set_addr(gn_node *n, const char *addr) {
  struct gn__overlay *o = n->overlay;
  if (!o || !o->swim || o->leaving || o->closing || !addr || !addr[0])
    return;
  int r = gn_swim_set_addr(o->swim, addr, gn_mono_ms());
  if (r < 0)
    gn_log(GN_LOG_WARN, "overlay: cannot advertise %s to the members: %s", addr, gn_strerror(r));
  arm(o);
}

/* GET /v1/members: every member this node knows, with its state, address,
 * incarnation and how long it has been in that state here. */
static void api_members(gn_ctl_req *req, void *ud) {
  gn_node *n = ud;
  struct gn__overlay *o = n->overlay;
  if (!o || !o->swim)
    return gn_ctl_reply_error(req, 409, "no membership on this node (overlay: %s)",
                              o && o->error[0] ? o->error : "off");
  size_t count = gn_swim_members(o->swim, NULL, 0);
  gn_swim_member *ms = calloc(count ? count : 1, sizeof *ms);
  if (!ms)
    return gn_ctl_reply_error(req, 500, "out of memory");
  count = gn_swim_members(o->swim, ms, count);
  json_t *arr = json_array();
  uint64_t now = gn_mono_ms();
  for (size_t i = 0; i < count; i++) {
    char id[GN_NODE_ID_STRLEN];
    gn_node_id_format(ms[i].id, id);
    json_array_append_new(arr, json_pack("{s:s, s:s, s:s, s:I, s:I}", "node_id", id, "addr", ms[i].addr, "state",
                                         state_name(ms[i].state), "incarnation", (json_int_t)ms[i].incarnation,
                                         "for_ms", (json_int_t)(now > ms[i].since_ms ? now - ms[i].since_ms : 0)));
  }
  free(ms);
  gn_ctl_reply_json(req, 200, json_pack("{s:o, s:I}", "members", arr, "health", (json_int_t)gn_swim_health(o->swim)));
}

void gn__overlay_register(gn_node *n) {
  gn_ctl_route(n->ctl, "GET", "/v1/members", api_members, n);
}
