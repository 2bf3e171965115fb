/* Home networks as an I/O-free state machine (docs/nat.md): observed
 * addresses and the NAT classification drawn from them, the rendezvous that
 * introduces two peers, and the UDP hole punch between them. Every table is
 * bounded, every request from a peer rate-limited, and no single reporter
 * (nor any number of them inside one /24) can move the address we advertise. */
#include "nat_body.h"

#include <gpunet/nat.h>
#include <gpunet/ratelimit.h>
#include <gpunet/wire.h>

#include <arpa/inet.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>

#define INTRO_WAIT_MS 5000 /* the rendezvous's answer to our PUNCH_REQ */

/* --- addresses ---------------------------------------------------------------*/

typedef struct naddr {
  int family; /* 0: none */
  uint8_t ip[16];
  uint16_t port;
} naddr;

static int naddr_parse(const char *s, naddr *ret) {
  char host[48];
  naddr a = {0};
  if (!s)
    return GN_EINVAL;
  size_t n = strnlen(s, GN_NAT_ADDR_MAX);
  if (n == 0 || n >= GN_NAT_ADDR_MAX)
    return GN_EINVAL;
  const char *colon = strrchr(s, ':');
  if (!colon || colon == s)
    return GN_EINVAL;
  size_t hl = (size_t)(colon - s);
  const char *h = s;
  bool v6 = s[0] == '[';
  if (v6) {
    if (hl < 3 || s[hl - 1] != ']')
      return GN_EINVAL;
    h = s + 1;
    hl -= 2;
  }
  if (hl >= sizeof host)
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
  if (v6) {
    if (inet_pton(AF_INET6, host, a.ip) != 1)
      return GN_EINVAL;
    a.family = AF_INET6;
  } else {
    if (inet_pton(AF_INET, host, a.ip) != 1)
      return GN_EINVAL;
    a.family = AF_INET;
  }
  a.port = (uint16_t)port;
  *ret = a;
  return 0;
}

static void naddr_format(const naddr *a, char *buf, size_t cap) {
  char host[INET6_ADDRSTRLEN] = "";
  inet_ntop(a->family, a->ip, host, sizeof host);
  if (a->family == AF_INET6)
    snprintf(buf, cap, "[%s]:%u", host, (unsigned)a->port);
  else
    snprintf(buf, cap, "%s:%u", host, (unsigned)a->port);
}

static size_t ip_len(int family) {
  return family == AF_INET6 ? 16 : 4;
}

static bool same_host(const naddr *a, const naddr *b) {
  return a->family && a->family == b->family && memcmp(a->ip, b->ip, ip_len(a->family)) == 0;
}

static bool same_addr(const naddr *a, const naddr *b) {
  return same_host(a, b) && a->port == b->port;
}

/* The network a reporter speaks from: its /24, or /64 for IPv6. */
static bool same_net(const naddr *a, const naddr *b) {
  return a->family && a->family == b->family && memcmp(a->ip, b->ip, a->family == AF_INET6 ? 8 : 3) == 0;
}

static bool unspecified(const naddr *a) {
  static const uint8_t zero[16];
  return !a->family || memcmp(a->ip, zero, ip_len(a->family)) == 0;
}

bool gn_nat_addr_valid(const char *addr) {
  naddr a;
  return naddr_parse(addr, &a) == 0;
}

bool gn_nat_addr_private(const char *addr) {
  naddr a;
  if (naddr_parse(addr, &a) < 0)
    return false;
  const uint8_t *ip = a.ip;
  if (unspecified(&a))
    return true;
  if (a.family == AF_INET)
    return ip[0] == 10 || ip[0] == 127 || (ip[0] == 172 && (ip[1] & 0xf0) == 16) || (ip[0] == 192 && ip[1] == 168) ||
           (ip[0] == 169 && ip[1] == 254) || (ip[0] == 100 && (ip[1] & 0xc0) == 64) || ip[0] == 0;
  static const uint8_t loop6[16] = {[15] = 1};
  return memcmp(ip, loop6, 16) == 0 || (ip[0] & 0xfe) == 0xfc || (ip[0] == 0xfe && (ip[1] & 0xc0) == 0x80);
}

const char *gn_nat_type_name(gn_nat_type t) {
  switch (t) {
  case GN_NAT_PUBLIC:
    return "public";
  case GN_NAT_CONE:
    return "cone";
  case GN_NAT_SYMMETRIC:
    return "symmetric";
  case GN_NAT_UNKNOWN:
    break;
  }
  return "unknown";
}

/* --- bodies --------------------------------------------------------------------*/

int gn__nat_take(gn_wire_writer *w, gn_buf *ret) {
  int r = gn_wire_writer_take(w, ret);
  gn_wire_writer_done(w);
  return r;
}

int gn__nat_open_map(const uint8_t *body, size_t len, size_t max, gn_wire_doc *doc) {
  if (!body || len == 0)
    return GN_EINVAL;
  if (len > GN__NAT_BODY_MAX)
    return GN_ETOOBIG;
  int r = gn_wire_decode(body, len, doc);
  if (r < 0)
    return r;
  if (doc->root->type != MSGPACK_OBJECT_MAP || doc->root->via.map.size > max) {
    gn_wire_doc_done(doc);
    return GN_EINVAL;
  }
  return 0;
}

int gn__nat_get_addr(const msgpack_object *map, const char *key, bool empty_ok, char *out, size_t cap) {
  int r = gn_wire_get_str(map, key, out, cap);
  if (r < 0)
    return r;
  if (out[0] == '\0' ? !empty_ok : !gn_nat_addr_valid(out))
    return GN_EINVAL;
  return 0;
}

int gn_nat_observed_encode(const gn_nat_observed *m, gn_buf *ret) {
  gn_wire_writer w;
  if (m->answer && !gn_nat_addr_valid(m->addr))
    return GN_EINVAL;
  gn_wire_writer_init(&w);
  gn_wire_put_map(&w, m->answer ? 2 : 1);
  gn_wire_put_str(&w, m->answer ? "r" : "q");
  gn_wire_put_bin(&w, m->nonce, GN_NAT_NONCE_LEN);
  if (m->answer) {
    gn_wire_put_str(&w, "a");
    gn_wire_put_str(&w, m->addr);
  }
  return gn__nat_take(&w, ret);
}

int gn_nat_observed_decode(const uint8_t *body, size_t len, gn_nat_observed *ret) {
  gn_wire_doc doc;
  gn_nat_observed m = {0};
  int r = gn__nat_open_map(body, len, 2, &doc);
  if (r < 0)
    return r;
  m.answer = gn_wire_get(doc.root, "r") != NULL;
  if (m.answer)
    r = gn_wire_get_bin_exact(doc.root, "r", m.nonce, GN_NAT_NONCE_LEN);
  else
    r = doc.root->via.map.size == 1 ? gn_wire_get_bin_exact(doc.root, "q", m.nonce, GN_NAT_NONCE_LEN) : GN_EINVAL;
  if (r == 0 && m.answer)
    r = gn__nat_get_addr(doc.root, "a", false, m.addr, sizeof m.addr);
  gn_wire_doc_done(&doc);
  if (r == 0)
    *ret = m;
  return r;
}

int gn_nat_punch_req_encode(const gn_nat_punch_req *m, gn_buf *ret) {
  gn_wire_writer w;
  if (m->intro && m->addr[0] && !gn_nat_addr_valid(m->addr))
    return GN_EINVAL;
  gn_wire_writer_init(&w);
  gn_wire_put_map(&w, (m->intro ? 3 : 2) + (m->tcp ? 1 : 0));
  gn_wire_put_str(&w, m->intro ? "p" : "t");
  gn_wire_put_bin(&w, m->peer, GN_PK_LEN);
  gn_wire_put_str(&w, "n");
  gn_wire_put_bin(&w, m->nonce, GN_NAT_NONCE_LEN);
  if (m->intro) {
    gn_wire_put_str(&w, "a");
    gn_wire_put_str(&w, m->addr);
  }
  /* Only when set: a node that predates it refuses a key it does not know. */
  if (m->tcp) {
    gn_wire_put_str(&w, "c");
    gn_wire_put_bool(&w, true);
  }
  return gn__nat_take(&w, ret);
}

int gn_nat_punch_req_decode(const uint8_t *body, size_t len, gn_nat_punch_req *ret) {
  gn_wire_doc doc;
  gn_nat_punch_req m = {0};
  int r = gn__nat_open_map(body, len, 4, &doc);
  if (r < 0)
    return r;
  m.intro = gn_wire_get(doc.root, "p") != NULL;
  bool has_c = gn_wire_get(doc.root, "c") != NULL;
  r = gn_wire_get_bin_exact(doc.root, m.intro ? "p" : "t", m.peer, GN_PK_LEN);
  if (r == 0)
    r = gn_wire_get_bin_exact(doc.root, "n", m.nonce, GN_NAT_NONCE_LEN);
  if (r == 0 && m.intro)
    r = gn__nat_get_addr(doc.root, "a", true, m.addr, sizeof m.addr);
  if (r == 0 && has_c)
    r = gn_wire_get_bool(doc.root, "c", &m.tcp);
  if (r == 0 && doc.root->via.map.size != (m.intro ? 3u : 2u) + (has_c ? 1u : 0u))
    r = GN_EINVAL;
  gn_wire_doc_done(&doc);
  if (r == 0)
    *ret = m;
  return r;
}

int gn_nat_punch_encode(const gn_nat_punch *m, gn_buf *ret) {
  gn_wire_writer w;
  gn_wire_writer_init(&w);
  gn_wire_put_map(&w, 2);
  gn_wire_put_str(&w, "n");
  gn_wire_put_bin(&w, m->nonce, GN_NAT_NONCE_LEN);
  gn_wire_put_str(&w, "k");
  gn_wire_put_u64(&w, m->ack ? 1 : 0);
  return gn__nat_take(&w, ret);
}

int gn_nat_punch_decode(const uint8_t *body, size_t len, gn_nat_punch *ret) {
  gn_wire_doc doc;
  gn_nat_punch m = {0};
  uint64_t k = 0;
  int r = gn__nat_open_map(body, len, 2, &doc);
  if (r < 0)
    return r;
  r = gn_wire_get_bin_exact(doc.root, "n", m.nonce, GN_NAT_NONCE_LEN);
  if (r == 0)
    r = gn_wire_get_u64(doc.root, "k", &k);
  if (r == 0 && k > 1)
    r = GN_EINVAL;
  gn_wire_doc_done(&doc);
  if (r == 0) {
    m.ack = k == 1;
    *ret = m;
  }
  return r;
}

/* --- the machine ---------------------------------------------------------------*/

typedef struct obs {
  bool used;
  uint8_t reporter[GN_PK_LEN];
  naddr from;     /* where the reporter's answer came from: its network */
  naddr observed; /* where it saw us */
  uint64_t at_ms;
} obs;

typedef struct ask {
  bool used, answered;
  uint8_t peer[GN_PK_LEN];
  naddr to;
  uint8_t nonce[GN_NAT_NONCE_LEN];
  uint64_t sent_ms;
} ask;

typedef struct seen {
  bool used;
  uint8_t peer[GN_PK_LEN];
  naddr at;
  uint64_t at_ms;
} seen;

enum punch_state { P_FREE, P_WAIT_INTRO, P_PROBING, P_ESTABLISHED };

typedef struct punch {
  enum punch_state state;
  uint8_t peer[GN_PK_LEN], rendezvous[GN_PK_LEN];
  uint8_t nonce[GN_NAT_NONCE_LEN];
  naddr target;   /* where we send our probes */
  naddr endpoint; /* where their datagrams came from */
  uint32_t tries;
  uint64_t next_ms; /* next probe, or the end of the wait, or the hole's expiry */
  bool tcp;         /* a TCP punch follows when the hole opens */
} punch;

enum tcp_state { T_FREE, T_UDP, T_DIAL, T_RETRY, T_OK, T_FAILED };

/* A TCP punch: one per peer per GN_NAT_TCP_AGAIN_MS (the entry is kept that
 * long from its start, whatever its end). */
typedef struct tcpp {
  enum tcp_state state;
  uint8_t peer[GN_PK_LEN];
  naddr addr;
  uint32_t dials;
  uint64_t started_ms, deadline_ms, next_ms;
} tcpp;

struct gn_nat {
  uint8_t self[GN_PK_LEN];
  naddr local;
  gn_nat_io io;
  uint8_t seed[32];
  uint64_t counter;
  obs obs[GN_NAT_OBS_MAX];
  ask asks[GN_NAT_ASKS_MAX];
  seen seen[GN_NAT_SEEN_MAX];
  punch punches[GN_NAT_PUNCH_MAX];
  tcpp tcp[GN_NAT_TCP_MAX];
  gn_ratelimit *per_peer; /* PUNCH_REQs forwarded per requester, intros taken per rendezvous */
  gn_token_bucket all;
  gn_nat_stats st;
};

static const gn_rate req_rate = GN_RATE_EVERY_S(GN_NAT_REQ_EVERY_S, GN_NAT_REQ_BURST);
static const gn_rate all_rate = GN_RATE(GN_NAT_REQ_ALL_PER_S, GN_NAT_REQ_ALL_PER_S);

static void new_nonce(gn_nat *nat, uint8_t out[GN_NAT_NONCE_LEN]) {
  uint8_t ctr[8];
  uint64_t c = nat->counter++;
  for (int i = 0; i < 8; i++)
    ctr[i] = (uint8_t)(c >> (8 * i));
  crypto_generichash(out, GN_NAT_NONCE_LEN, ctr, sizeof ctr, nat->seed, sizeof nat->seed);
}

int gn_nat_new(const uint8_t self[GN_PK_LEN], const char *local_addr, const gn_nat_io *io, const uint8_t seed[32],
               uint64_t now_ms, gn_nat **ret) {
  if (!self || !io || !io->send_dgram || !io->send_msg || !seed || !ret)
    return GN_EINVAL;
  gn_nat *nat = calloc(1, sizeof *nat);
  if (!nat)
    return GN_ENOMEM;
  memcpy(nat->self, self, GN_PK_LEN);
  if (local_addr && local_addr[0])
    naddr_parse(local_addr, &nat->local); /* a name or a wildcard: never public */
  nat->io = *io;
  memcpy(nat->seed, seed, 32);
  if (gn_ratelimit_new(GN_NAT_REQ_KEYS_MAX, req_rate, &nat->per_peer) < 0) {
    free(nat);
    return GN_ENOMEM;
  }
  gn_token_bucket_init(&nat->all, all_rate, now_ms);
  *ret = nat;
  return 0;
}

gn_nat *gn_nat_free(gn_nat *nat) {
  if (nat) {
    gn_ratelimit_free(nat->per_peer);
    sodium_memzero(nat->seed, sizeof nat->seed);
    free(nat);
  }
  return NULL;
}

void gn_nat_stats_get(const gn_nat *nat, gn_nat_stats *ret) {
  *ret = nat->st;
}

static void send_body(gn_nat *nat, const naddr *to, uint32_t type, const gn_buf *b) {
  char addr[GN_NAT_ADDR_MAX];
  naddr_format(to, addr, sizeof addr);
  nat->io.send_dgram(nat->io.ud, addr, type, b->data, b->len);
}

/* --- observations ----------------------------------------------------------------*/

static bool obs_live(const obs *o, uint64_t now_ms) {
  return o->used && now_ms < o->at_ms + GN_NAT_OBS_TTL_MS;
}

/* Keeps what reporter said: its earlier report is replaced; a reporter of
 * a network already holding GN_NAT_OBS_PER_NET reports replaces the oldest
 * of them; else a free or expired place, else the oldest report. */
static void observe(gn_nat *nat, const uint8_t reporter[GN_PK_LEN], const naddr *from, const naddr *observed,
                    uint64_t now_ms) {
  obs *slot = NULL, *oldest = NULL, *oldest_net = NULL;
  size_t in_net = 0;
  for (size_t i = 0; i < GN_NAT_OBS_MAX; i++) {
    obs *o = &nat->obs[i];
    if (o->used && memcmp(o->reporter, reporter, GN_PK_LEN) == 0) {
      slot = o;
      break;
    }
  }
  if (!slot) {
    for (size_t i = 0; i < GN_NAT_OBS_MAX; i++) {
      obs *o = &nat->obs[i];
      if (!obs_live(o, now_ms)) {
        if (!slot)
          slot = o;
        continue;
      }
      if (same_net(&o->from, from)) {
        in_net++;
        if (!oldest_net || o->at_ms < oldest_net->at_ms)
          oldest_net = o;
      }
      if (!oldest || o->at_ms < oldest->at_ms)
        oldest = o;
    }
    if (in_net >= GN_NAT_OBS_PER_NET)
      slot = oldest_net;
    else if (!slot)
      slot = oldest;
  }
  slot->used = true;
  memcpy(slot->reporter, reporter, GN_PK_LEN);
  slot->from = *from;
  slot->observed = *observed;
  slot->at_ms = now_ms;
  nat->st.observations++;
}

/* Distinct reporter networks among the live reports that match: same
 * outside host, and the same port too when port_too. */
static size_t nets_agreeing(const gn_nat *nat, const naddr *a, bool port_too, uint64_t now_ms) {
  size_t n = 0;
  for (size_t i = 0; i < GN_NAT_OBS_MAX; i++) {
    const obs *o = &nat->obs[i];
    if (!obs_live(o, now_ms) || !(port_too ? same_addr(&o->observed, a) : same_host(&o->observed, a)))
      continue;
    bool counted = false;
    for (size_t j = 0; j < i && !counted; j++) {
      const obs *p = &nat->obs[j];
      counted = obs_live(p, now_ms) && (port_too ? same_addr(&p->observed, a) : same_host(&p->observed, a)) &&
                same_net(&p->from, &o->from);
    }
    if (!counted)
      n++;
  }
  return n;
}

/* The agreed outside host (true) and, when some port is agreed on too,
 * that endpoint (ret_port_agreed). Ties between hosts or between ports
 * agree on nothing: two equally backed stories, and we cannot tell which
 * one lies. */
static bool agreed(const gn_nat *nat, uint64_t now_ms, naddr *ret_host, naddr *ret_ep, bool *ret_port_agreed) {
  const naddr *best = NULL;
  size_t best_n = 0;
  bool tie = false;
  for (size_t i = 0; i < GN_NAT_OBS_MAX; i++) {
    const obs *o = &nat->obs[i];
    if (!obs_live(o, now_ms))
      continue;
    size_t n = nets_agreeing(nat, &o->observed, false, now_ms);
    if (n > best_n) {
      best = &o->observed;
      best_n = n;
      tie = false;
    } else if (n == best_n && best && !same_host(best, &o->observed)) {
      tie = true;
    }
  }
  if (!best || best_n < 2 || tie)
    return false;
  *ret_host = *best;
  const naddr *ep = NULL;
  size_t ep_n = 0;
  bool ep_tie = false;
  for (size_t i = 0; i < GN_NAT_OBS_MAX; i++) {
    const obs *o = &nat->obs[i];
    if (!obs_live(o, now_ms) || !same_host(&o->observed, best))
      continue;
    size_t n = nets_agreeing(nat, &o->observed, true, now_ms);
    if (n > ep_n) {
      ep = &o->observed;
      ep_n = n;
      ep_tie = false;
    } else if (n == ep_n && ep && !same_addr(ep, &o->observed)) {
      ep_tie = true;
    }
  }
  *ret_port_agreed = ep && ep_n >= 2 && !ep_tie;
  if (*ret_port_agreed)
    *ret_ep = *ep;
  return true;
}

gn_nat_type gn_nat_type_get(const gn_nat *nat, uint64_t now_ms) {
  naddr host, ep;
  bool port_agreed = false;
  if (!agreed(nat, now_ms, &host, &ep, &port_agreed))
    return GN_NAT_UNKNOWN;
  if (!port_agreed) {
    /* The host is agreed on but no port is: each network saw another one
     * (a liar alone cannot do this: it needs two networks of its own). */
    return GN_NAT_SYMMETRIC;
  }
  if (!unspecified(&nat->local) && same_addr(&ep, &nat->local))
    return GN_NAT_PUBLIC;
  return GN_NAT_CONE;
}

bool gn_nat_advertised(const gn_nat *nat, uint64_t now_ms, char *buf, size_t cap) {
  naddr host, ep;
  bool port_agreed = false;
  if (!buf || !agreed(nat, now_ms, &host, &ep, &port_agreed) || !port_agreed)
    return false;
  naddr_format(&ep, buf, cap);
  return true;
}

bool gn_nat_outside_host(const gn_nat *nat, uint64_t now_ms, char *buf, size_t cap) {
  naddr host, ep;
  bool port_agreed = false;
  if (!buf || !agreed(nat, now_ms, &host, &ep, &port_agreed))
    return false;
  char tmp[GN_NAT_ADDR_MAX];
  naddr_format(&host, tmp, sizeof tmp);
  char *colon = strrchr(tmp, ':');
  if (colon)
    *colon = '\0';
  snprintf(buf, cap, "%s", tmp[0] == '[' ? tmp + 1 : tmp);
  size_t l = strlen(buf);
  if (l && buf[l - 1] == ']')
    buf[l - 1] = '\0';
  return true;
}

size_t gn_nat_observation_count(const gn_nat *nat, uint64_t now_ms) {
  size_t n = 0;
  for (size_t i = 0; i < GN_NAT_OBS_MAX; i++)
    n += obs_live(&nat->obs[i], now_ms);
  return n;
}

int gn_nat_ask(gn_nat *nat, const uint8_t peer[GN_PK_LEN], const char *addr, uint64_t now_ms) {
  naddr to;
  if (!peer || naddr_parse(addr, &to) < 0 || unspecified(&to))
    return GN_EINVAL;
  ask *slot = NULL;
  for (size_t i = 0; i < GN_NAT_ASKS_MAX; i++) {
    ask *a = &nat->asks[i];
    bool live = a->used && now_ms < a->sent_ms + GN_NAT_ASK_AGAIN_MS;
    if (live && same_addr(&a->to, &to))
      return GN_EBUSY;
    if (!live && !slot)
      slot = a;
  }
  if (!slot)
    return GN_EBUSY;
  gn_nat_observed q = {.answer = false};
  new_nonce(nat, q.nonce);
  gn_buf b = {0};
  int r = gn_nat_observed_encode(&q, &b);
  if (r < 0)
    return r;
  *slot = (ask){.used = true, .to = to, .sent_ms = now_ms};
  memcpy(slot->peer, peer, GN_PK_LEN);
  memcpy(slot->nonce, q.nonce, GN_NAT_NONCE_LEN);
  send_body(nat, &to, GN_MSG_NAT_OBSERVED, &b);
  gn_buf_done(&b);
  nat->st.asks_sent++;
  return 0;
}

/* Remembers where peer's datagrams come from, for introductions. */
static void seen_put(gn_nat *nat, const uint8_t peer[GN_PK_LEN], const naddr *at, uint64_t now_ms) {
  seen *slot = NULL, *oldest = NULL;
  for (size_t i = 0; i < GN_NAT_SEEN_MAX; i++) {
    seen *s = &nat->seen[i];
    if (s->used && memcmp(s->peer, peer, GN_PK_LEN) == 0) {
      slot = s;
      break;
    }
    if (!s->used && !slot)
      slot = s;
    if (s->used && (!oldest || s->at_ms < oldest->at_ms))
      oldest = s;
  }
  if (!slot)
    slot = oldest;
  slot->used = true;
  memcpy(slot->peer, peer, GN_PK_LEN);
  slot->at = *at;
  slot->at_ms = now_ms;
}

static const seen *seen_get(const gn_nat *nat, const uint8_t peer[GN_PK_LEN], uint64_t now_ms) {
  for (size_t i = 0; i < GN_NAT_SEEN_MAX; i++) {
    const seen *s = &nat->seen[i];
    if (s->used && now_ms < s->at_ms + GN_NAT_SEEN_TTL_MS && memcmp(s->peer, peer, GN_PK_LEN) == 0)
      return s;
  }
  return NULL;
}

static int on_observed(gn_nat *nat, const naddr *from, const uint8_t signer[GN_PK_LEN], const uint8_t *body, size_t len,
                       uint64_t now_ms) {
  gn_nat_observed m;
  int r = gn_nat_observed_decode(body, len, &m);
  if (r < 0)
    return r;
  if (!m.answer) {
    gn_nat_observed a = {.answer = true};
    memcpy(a.nonce, m.nonce, GN_NAT_NONCE_LEN);
    naddr_format(from, a.addr, sizeof a.addr);
    gn_buf b = {0};
    if ((r = gn_nat_observed_encode(&a, &b)) == 0) {
      send_body(nat, from, GN_MSG_NAT_OBSERVED, &b);
      nat->st.answers_sent++;
      seen_put(nat, signer, from, now_ms);
    }
    gn_buf_done(&b);
    return r;
  }
  naddr observed;
  naddr_parse(m.addr, &observed); /* checked by the decoder */
  for (size_t i = 0; i < GN_NAT_ASKS_MAX; i++) {
    ask *a = &nat->asks[i];
    /* Only the answer to a question of ours, from the key and the address
     * we asked, in time, once: an off-path sender cannot know the nonce,
     * and a peer cannot speak for another address. */
    if (!a->used || a->answered || now_ms >= a->sent_ms + GN_NAT_ASK_TIMEOUT_MS ||
        sodium_memcmp(a->nonce, m.nonce, GN_NAT_NONCE_LEN) != 0)
      continue;
    if (memcmp(a->peer, signer, GN_PK_LEN) != 0 || !same_addr(&a->to, from))
      break;
    a->answered = true;
    observe(nat, signer, from, &observed, now_ms);
    return 0;
  }
  nat->st.answers_ignored++;
  return GN_ENOTFOUND;
}

/* --- punching --------------------------------------------------------------------*/

static punch *punch_find(gn_nat *nat, const uint8_t peer[GN_PK_LEN]) {
  for (size_t i = 0; i < GN_NAT_PUNCH_MAX; i++)
    if (nat->punches[i].state != P_FREE && memcmp(nat->punches[i].peer, peer, GN_PK_LEN) == 0)
      return &nat->punches[i];
  return NULL;
}

static punch *punch_alloc(gn_nat *nat, uint64_t now_ms) {
  for (size_t i = 0; i < GN_NAT_PUNCH_MAX; i++) {
    punch *p = &nat->punches[i];
    if (p->state == P_ESTABLISHED && now_ms >= p->next_ms)
      p->state = P_FREE;
    if (p->state == P_FREE)
      return p;
  }
  return NULL;
}

static void tcp_punch_go(gn_nat *nat, const punch *p, bool ok, uint64_t now_ms);

static void punch_end(gn_nat *nat, punch *p, bool ok, uint64_t now_ms) {
  uint8_t peer[GN_PK_LEN];
  char addr[GN_NAT_ADDR_MAX] = "";
  memcpy(peer, p->peer, GN_PK_LEN);
  if (p->tcp)
    tcp_punch_go(nat, p, ok, now_ms);
  p->tcp = false;
  if (ok) {
    p->state = P_ESTABLISHED;
    p->next_ms = now_ms + GN_NAT_PUNCHED_TTL_MS;
    naddr_format(&p->endpoint, addr, sizeof addr);
    nat->st.punches_ok++;
  } else {
    p->state = P_FREE;
    nat->st.punches_failed++;
  }
  if (nat->io.punched)
    nat->io.punched(nat->io.ud, peer, addr, ok);
}

static void probe(gn_nat *nat, punch *p, const naddr *to, bool ack) {
  gn_nat_punch m = {.ack = ack};
  memcpy(m.nonce, p->nonce, GN_NAT_NONCE_LEN);
  gn_buf b = {0};
  if (gn_nat_punch_encode(&m, &b) == 0) {
    send_body(nat, to, GN_MSG_NAT_PUNCH, &b);
    nat->st.punch_dgrams_sent++;
  }
  gn_buf_done(&b);
}

static void start_probing(gn_nat *nat, punch *p, const naddr *target, uint64_t now_ms) {
  p->state = P_PROBING;
  p->target = *target;
  p->tries = 0;
  p->next_ms = now_ms;
  gn_nat_tick(nat, now_ms);
}

static int punch_start(gn_nat *nat, const uint8_t target[GN_PK_LEN], const uint8_t rendezvous[GN_PK_LEN], bool tcp,
                       uint64_t now_ms) {
  if (!target || !rendezvous || memcmp(target, nat->self, GN_PK_LEN) == 0 || memcmp(target, rendezvous, GN_PK_LEN) == 0)
    return GN_EINVAL;
  punch *p = punch_find(nat, target);
  if (p && p->state == P_ESTABLISHED && now_ms < p->next_ms)
    return GN_EEXIST;
  if (p && p->state != P_ESTABLISHED)
    return GN_EBUSY;
  if (p)
    p->state = P_FREE;
  if (!(p = punch_alloc(nat, now_ms)))
    return GN_EBUSY;
  gn_nat_punch_req m = {.intro = false, .tcp = tcp};
  memcpy(m.peer, target, GN_PK_LEN);
  new_nonce(nat, m.nonce);
  gn_buf b = {0};
  int r = gn_nat_punch_req_encode(&m, &b);
  if (r == 0)
    r = nat->io.send_msg(nat->io.ud, rendezvous, GN_MSG_NAT_PUNCH_REQ, b.data, b.len);
  gn_buf_done(&b);
  if (r < 0)
    return r;
  *p = (punch){.state = P_WAIT_INTRO, .next_ms = now_ms + INTRO_WAIT_MS, .tcp = tcp};
  memcpy(p->peer, target, GN_PK_LEN);
  memcpy(p->rendezvous, rendezvous, GN_PK_LEN);
  memcpy(p->nonce, m.nonce, GN_NAT_NONCE_LEN);
  return 0;
}

int gn_nat_punch_start(gn_nat *nat, const uint8_t target[GN_PK_LEN], const uint8_t rendezvous[GN_PK_LEN],
                       uint64_t now_ms) {
  return punch_start(nat, target, rendezvous, false, now_ms);
}

/* --- TCP punching ------------------------------------------------------------------*/

static tcpp *tcp_find(gn_nat *nat, const uint8_t peer[GN_PK_LEN]) {
  for (size_t i = 0; i < GN_NAT_TCP_MAX; i++)
    if (nat->tcp[i].state != T_FREE && memcmp(nat->tcp[i].peer, peer, GN_PK_LEN) == 0)
      return &nat->tcp[i];
  return NULL;
}

static bool tcp_live(const tcpp *t) {
  return t->state == T_UDP || t->state == T_DIAL || t->state == T_RETRY;
}

/* The place for a new TCP punch with peer (not taken yet), or NULL with why. */
static tcpp *tcp_place(gn_nat *nat, const uint8_t peer[GN_PK_LEN], uint64_t now_ms, int *why) {
  tcpp *t = tcp_find(nat, peer);
  if (t) {
    *why = tcp_live(t) ? GN_EBUSY : GN_ETIMEDOUT;
    return !tcp_live(t) && now_ms >= t->started_ms + GN_NAT_TCP_AGAIN_MS ? t : NULL;
  }
  for (size_t i = 0; i < GN_NAT_TCP_MAX; i++) {
    t = &nat->tcp[i];
    if (t->state == T_FREE || (!tcp_live(t) && now_ms >= t->started_ms + GN_NAT_TCP_AGAIN_MS))
      return t;
  }
  *why = GN_EBUSY;
  return NULL;
}

static void tcp_take(gn_nat *nat, tcpp *t, const uint8_t peer[GN_PK_LEN], uint64_t now_ms) {
  *t = (tcpp){.state = T_UDP, .started_ms = now_ms};
  memcpy(t->peer, peer, GN_PK_LEN);
  nat->st.tcp_punches++;
}

/* Behind a cone NAT, with a glue that can connect from its listening port. */
static bool tcp_allowed(const gn_nat *nat, uint64_t now_ms) {
  return nat->io.tcp_dial && gn_nat_type_get(nat, now_ms) == GN_NAT_CONE;
}

static void tcp_end(gn_nat *nat, tcpp *t, bool ok) {
  t->state = ok ? T_OK : T_FAILED;
  if (ok)
    nat->st.tcp_ok++;
  else
    nat->st.tcp_failed++;
}

static void tcp_retry(gn_nat *nat, tcpp *t, uint64_t now_ms) {
  if (now_ms + GN_NAT_TCP_RETRY_MS >= t->deadline_ms) {
    tcp_end(nat, t, false);
    return;
  }
  t->state = T_RETRY;
  t->next_ms = now_ms + GN_NAT_TCP_RETRY_MS;
}

static void tcp_dial_now(gn_nat *nat, tcpp *t, uint64_t now_ms) {
  char addr[GN_NAT_ADDR_MAX];
  naddr_format(&t->addr, addr, sizeof addr);
  t->state = T_DIAL;
  t->dials++;
  nat->st.tcp_dials++;
  /* Both ends of a simultaneous open hold one connection: the smaller key
   * starts the handshake, as both ends can tell. */
  bool initiator = memcmp(nat->self, t->peer, GN_PK_LEN) < 0;
  if (nat->io.tcp_dial(nat->io.ud, t->peer, addr, initiator, t->deadline_ms) < 0)
    tcp_retry(nat, t, now_ms);
}

/* The UDP punch of a TCP punch ended. Only a hole whose peer's signed
 * datagrams came from the very endpoint the rendezvous named is dialled
 * (neither a rendezvous nor the peer alone picks where we connect), and
 * only while we are behind a cone NAT. */
static void tcp_punch_go(gn_nat *nat, const punch *p, bool ok, uint64_t now_ms) {
  tcpp *t = tcp_find(nat, p->peer);
  if (!t || t->state != T_UDP)
    return;
  if (!ok || !same_addr(&p->endpoint, &p->target) || !tcp_allowed(nat, now_ms)) {
    if (ok)
      nat->st.tcp_refused++;
    tcp_end(nat, t, false);
    return;
  }
  t->addr = p->endpoint;
  t->deadline_ms = now_ms + GN_NAT_TCP_WAIT_MS;
  tcp_dial_now(nat, t, now_ms);
}

int gn_nat_tcp_punch_start(gn_nat *nat, const uint8_t target[GN_PK_LEN], const uint8_t rendezvous[GN_PK_LEN],
                           uint64_t now_ms) {
  if (!nat || !target || !rendezvous)
    return GN_EINVAL;
  if (!nat->io.tcp_dial)
    return GN_EUNSUPPORTED;
  if (!tcp_allowed(nat, now_ms))
    return GN_EPERM;
  int why = 0;
  tcpp *t = tcp_place(nat, target, now_ms, &why);
  if (!t)
    return why;
  /* An open hole is punched again: the other side connects only when it
   * hears of this punch from the rendezvous. */
  punch *old = punch_find(nat, target), saved;
  if (old && old->state == P_ESTABLISHED) {
    saved = *old;
    old->state = P_FREE;
  } else {
    old = NULL;
  }
  int r = punch_start(nat, target, rendezvous, true, now_ms);
  if (r < 0) {
    if (old && old->state == P_FREE)
      *old = saved;
    return r;
  }
  tcp_take(nat, t, target, now_ms);
  return 0;
}

void gn_nat_tcp_result(gn_nat *nat, const uint8_t peer[GN_PK_LEN], int status, uint64_t now_ms) {
  tcpp *t = nat && peer ? tcp_find(nat, peer) : NULL;
  if (!t || t->state != T_DIAL)
    return;
  if (status == 0)
    tcp_end(nat, t, true);
  else
    tcp_retry(nat, t, now_ms);
}

bool gn_nat_tcp_active(const gn_nat *nat, const uint8_t peer[GN_PK_LEN], uint64_t now_ms) {
  (void)now_ms;
  for (size_t i = 0; nat && peer && i < GN_NAT_TCP_MAX; i++)
    if (tcp_live(&nat->tcp[i]) && memcmp(nat->tcp[i].peer, peer, GN_PK_LEN) == 0)
      return true;
  return false;
}

bool gn_nat_tcp_get(const gn_nat *nat, size_t i, uint64_t now_ms, gn_nat_tcp_info *ret) {
  static const char *const names[] = {[T_FREE] = "free",   [T_UDP] = "udp",      [T_DIAL] = "connecting",
                                      [T_RETRY] = "retry", [T_OK] = "connected", [T_FAILED] = "failed"};
  (void)now_ms;
  for (size_t k = 0, seen = 0; nat && ret && k < GN_NAT_TCP_MAX; k++) {
    const tcpp *t = &nat->tcp[k];
    if (t->state == T_FREE || seen++ != i)
      continue;
    memcpy(ret->peer, t->peer, GN_PK_LEN);
    ret->addr[0] = '\0';
    if (t->addr.family)
      naddr_format(&t->addr, ret->addr, sizeof ret->addr);
    ret->state = names[t->state];
    ret->dials = t->dials;
    return true;
  }
  return false;
}

static void tcp_tick(gn_nat *nat, uint64_t now_ms) {
  for (size_t i = 0; i < GN_NAT_TCP_MAX; i++) {
    tcpp *t = &nat->tcp[i];
    if (t->state == T_RETRY && now_ms >= t->next_ms) {
      if (now_ms >= t->deadline_ms)
        tcp_end(nat, t, false);
      else
        tcp_dial_now(nat, t, now_ms);
    } else if (t->state == T_DIAL && now_ms >= t->deadline_ms + GN_NAT_TCP_RETRY_MS) {
      tcp_end(nat, t, false); /* the glue should have reported by now */
    } else if (t->state == T_UDP && now_ms >= t->started_ms + GN_NAT_TCP_AGAIN_MS) {
      tcp_end(nat, t, false); /* its punch went without ending (cannot happen) */
    } else if (!tcp_live(t) && t->state != T_FREE && now_ms >= t->started_ms + GN_NAT_TCP_AGAIN_MS) {
      t->state = T_FREE;
    }
  }
}

/* A rate bucket per peer, the role in the key's first byte. */
static bool allow(gn_nat *nat, char role, const uint8_t peer[GN_PK_LEN], uint64_t now_ms) {
  uint8_t key[GN_RATELIMIT_KEY_MAX];
  key[0] = (uint8_t)role;
  memcpy(key + 1, peer, GN_RATELIMIT_KEY_MAX - 1); /* 31 bytes of a key are as good as 32 */
  if (!gn_ratelimit_allow(nat->per_peer, key, sizeof key, 1, now_ms))
    return false;
  return gn_token_bucket_take(&nat->all, all_rate, 1, now_ms);
}

static int send_intro(gn_nat *nat, const uint8_t to[GN_PK_LEN], const uint8_t about[GN_PK_LEN],
                      const uint8_t nonce[GN_NAT_NONCE_LEN], const seen *s, bool tcp) {
  gn_nat_punch_req m = {.intro = true, .tcp = tcp};
  memcpy(m.peer, about, GN_PK_LEN);
  memcpy(m.nonce, nonce, GN_NAT_NONCE_LEN);
  if (s)
    naddr_format(&s->at, m.addr, sizeof m.addr);
  gn_buf b = {0};
  int r = gn_nat_punch_req_encode(&m, &b);
  if (r == 0)
    r = nat->io.send_msg(nat->io.ud, to, GN_MSG_NAT_PUNCH_REQ, b.data, b.len);
  gn_buf_done(&b);
  return r;
}

/* As the rendezvous: tells each side where the other's datagrams come from. */
static int rendezvous(gn_nat *nat, const uint8_t from[GN_PK_LEN], const gn_nat_punch_req *m, uint64_t now_ms) {
  if (memcmp(m->peer, from, GN_PK_LEN) == 0 || memcmp(m->peer, nat->self, GN_PK_LEN) == 0)
    return GN_EINVAL;
  if (!allow(nat, 'r', from, now_ms)) {
    nat->st.punch_reqs_refused++;
    return GN_EBUSY;
  }
  const seen *a = seen_get(nat, from, now_ms), *b = seen_get(nat, m->peer, now_ms);
  int r = a && b ? send_intro(nat, m->peer, from, m->nonce, a, m->tcp) : GN_ENOTFOUND;
  /* The requester learns at once when the other side is unknown or
   * unreachable here (an empty address), rather than at its timeout. */
  send_intro(nat, from, m->peer, m->nonce, r == 0 ? b : NULL, m->tcp);
  if (r == 0)
    nat->st.punch_reqs_forwarded++;
  return r;
}

static int on_intro(gn_nat *nat, const uint8_t from[GN_PK_LEN], const gn_nat_punch_req *m, uint64_t now_ms) {
  naddr target = {0};
  if (memcmp(m->peer, nat->self, GN_PK_LEN) == 0 || memcmp(m->peer, from, GN_PK_LEN) == 0)
    return GN_EINVAL;
  if (m->addr[0])
    naddr_parse(m->addr, &target);
  punch *p = punch_find(nat, m->peer);
  if (p && p->state == P_WAIT_INTRO && memcmp(p->rendezvous, from, GN_PK_LEN) == 0 &&
      sodium_memcmp(p->nonce, m->nonce, GN_NAT_NONCE_LEN) == 0) {
    if (!target.family || unspecified(&target)) {
      punch_end(nat, p, false, now_ms);
      return 0;
    }
    start_probing(nat, p, &target, now_ms);
    return 0;
  }
  /* An introduction we did not ask for: the other side asked. Taken at the
   * rendezvous's rate, into a free place only, never over a punch in
   * progress (a rendezvous cannot steer one elsewhere). */
  if (!target.family || unspecified(&target) || (p && p->state != P_ESTABLISHED) || !allow(nat, 'i', from, now_ms)) {
    nat->st.intros_refused++;
    return GN_EBUSY;
  }
  if (p)
    p->state = P_FREE;
  if (!(p = punch_alloc(nat, now_ms))) {
    nat->st.intros_refused++;
    return GN_EBUSY;
  }
  *p = (punch){.state = P_WAIT_INTRO};
  memcpy(p->peer, m->peer, GN_PK_LEN);
  memcpy(p->rendezvous, from, GN_PK_LEN);
  memcpy(p->nonce, m->nonce, GN_NAT_NONCE_LEN);
  nat->st.intros_taken++;
  /* The other side wants TCP too: taken under the same limits as our own
   * TCP punches (else the punch stays a UDP one). */
  if (m->tcp) {
    int why = 0;
    tcpp *t = tcp_allowed(nat, now_ms) ? tcp_place(nat, m->peer, now_ms, &why) : NULL;
    if (t) {
      tcp_take(nat, t, m->peer, now_ms);
      p->tcp = true;
    } else {
      nat->st.tcp_refused++;
    }
  }
  start_probing(nat, p, &target, now_ms);
  return 0;
}

int gn_nat_on_message(gn_nat *nat, const uint8_t peer[GN_PK_LEN], uint32_t type, const uint8_t *body, size_t len,
                      uint64_t now_ms) {
  gn_nat_punch_req m;
  if (type != GN_MSG_NAT_PUNCH_REQ)
    return GN_EINVAL;
  int r = gn_nat_punch_req_decode(body, len, &m);
  if (r < 0)
    return r;
  return m.intro ? on_intro(nat, peer, &m, now_ms) : rendezvous(nat, peer, &m, now_ms);
}

static int on_punch(gn_nat *nat, const naddr *from, const uint8_t signer[GN_PK_LEN], const uint8_t *body, size_t len,
                    uint64_t now_ms) {
  gn_nat_punch m;
  int r = gn_nat_punch_decode(body, len, &m);
  if (r < 0)
    return r;
  punch *p = punch_find(nat, signer);
  /* Only a punch we are making with this signer, under its nonce: we never
   * answer a stranger's probe (no reflection off this node). */
  if (!p || (p->state != P_PROBING && p->state != P_ESTABLISHED) ||
      sodium_memcmp(p->nonce, m.nonce, GN_NAT_NONCE_LEN) != 0) {
    nat->st.punch_dgrams_ignored++;
    return GN_ENOTFOUND;
  }
  p->endpoint = *from;
  if (!m.ack) {
    probe(nat, p, from, true);
    return 0;
  }
  if (p->state == P_PROBING)
    punch_end(nat, p, true, now_ms);
  return 0;
}

int gn_nat_on_datagram(gn_nat *nat, const char *from_addr, const uint8_t signer[GN_PK_LEN], uint32_t type,
                       const uint8_t *body, size_t len, uint64_t now_ms) {
  naddr from;
  if (!signer || naddr_parse(from_addr, &from) < 0 || memcmp(signer, nat->self, GN_PK_LEN) == 0)
    return GN_EINVAL;
  if (type == GN_MSG_NAT_OBSERVED)
    return on_observed(nat, &from, signer, body, len, now_ms);
  if (type == GN_MSG_NAT_PUNCH)
    return on_punch(nat, &from, signer, body, len, now_ms);
  return GN_EINVAL;
}

void gn_nat_tick(gn_nat *nat, uint64_t now_ms) {
  tcp_tick(nat, now_ms);
  for (size_t i = 0; i < GN_NAT_PUNCH_MAX; i++) {
    punch *p = &nat->punches[i];
    if (p->state == P_FREE || now_ms < p->next_ms)
      continue;
    if (p->state == P_WAIT_INTRO) {
      punch_end(nat, p, false, now_ms);
    } else if (p->state == P_ESTABLISHED) {
      p->state = P_FREE;
    } else if (p->tries < GN_NAT_PUNCH_TRIES) {
      probe(nat, p, &p->target, false);
      p->tries++;
      p->next_ms = now_ms + GN_NAT_PUNCH_EVERY_MS;
    } else {
      punch_end(nat, p, false, now_ms);
    }
  }
}

uint64_t gn_nat_next_deadline_ms(const gn_nat *nat) {
  uint64_t at = UINT64_MAX;
  for (size_t i = 0; i < GN_NAT_PUNCH_MAX; i++)
    if (nat->punches[i].state != P_FREE && nat->punches[i].next_ms < at)
      at = nat->punches[i].next_ms;
  for (size_t i = 0; i < GN_NAT_TCP_MAX; i++) {
    const tcpp *t = &nat->tcp[i];
    uint64_t due = t->state == T_RETRY  ? t->next_ms
                   : t->state == T_DIAL ? t->deadline_ms + GN_NAT_TCP_RETRY_MS
                   : t->state != T_FREE ? t->started_ms + GN_NAT_TCP_AGAIN_MS
                                        : UINT64_MAX;
    if (due < at)
      at = due;
  }
  return at;
}

bool gn_nat_punched_addr(const gn_nat *nat, const uint8_t peer[GN_PK_LEN], uint64_t now_ms, char *buf, size_t cap) {
  for (size_t i = 0; i < GN_NAT_PUNCH_MAX; i++) {
    const punch *p = &nat->punches[i];
    if (p->state == P_ESTABLISHED && now_ms < p->next_ms && memcmp(p->peer, peer, GN_PK_LEN) == 0) {
      naddr_format(&p->endpoint, buf, cap);
      return true;
    }
  }
  return false;
}

size_t gn_nat_punch_count(const gn_nat *nat) {
  size_t n = 0;
  for (size_t i = 0; i < GN_NAT_PUNCH_MAX; i++)
    n += nat->punches[i].state != P_FREE;
  return n;
}

bool gn_nat_seen_addr(const gn_nat *nat, const uint8_t peer[GN_PK_LEN], uint64_t now_ms, char *buf, size_t cap) {
  const seen *s = seen_get(nat, peer, now_ms);
  if (!s || !buf)
    return false;
  naddr_format(&s->at, buf, cap);
  return true;
}
