/* A volunteer relay's slots, calls and byte budgets (docs/nat.md), with no
 * I/O: every table is bounded by the limits, a network holds at most
 * GN_RELAY_PER_NET slots, each caller is rate-limited, and each pair and all
 * pairs together are held to their bytes per second. */
#include "nat_body.h"

#include <gpunet/nat.h>
#include <gpunet/ratelimit.h>
#include <gpunet/relay.h>
#include <gpunet/wire.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>

typedef struct slot {
  bool used;
  uint8_t peer[GN_PK_LEN];
  uint8_t net[8]; /* the /24 (3 bytes) or /64 (8 bytes) it reserved from */
  uint8_t net_len;
  uint64_t expires_ms;
} slot;

/* Bytes in hand, refilled at rate up to one second's worth. */
typedef struct bytes_bucket {
  int64_t level;
  uint64_t last_ms;
} bytes_bucket;

typedef struct pair {
  uint32_t gen; /* 0: free */
  bool active;
  bool claimed[2];
  uint8_t tok[2][GN_RELAY_TOKEN_LEN];
  uint64_t deadline_ms; /* for both claims */
  bytes_bucket bucket;
} pair;

struct gn_relay {
  gn_relay_limits lim;
  uint8_t seed[32];
  uint64_t counter;
  uint32_t gen;
  slot *slots;
  pair *pairs;
  gn_ratelimit *callers;
  bytes_bucket total;
  gn_relay_stats st;
};

static const gn_rate call_rate = GN_RATE_EVERY_S(GN_RELAY_CALL_EVERY_S, GN_RELAY_CALL_BURST);

void gn_relay_limits_default(gn_relay_limits *ret) {
  *ret = (gn_relay_limits){
      .max_reservations = 32, .max_sessions = 16, .pair_bytes_per_s = 1u << 20, .total_bytes_per_s = 8u << 20};
}

int gn_relay_new(const gn_relay_limits *l, const uint8_t seed[32], uint64_t now_ms, gn_relay **ret) {
  if (!l || !seed || !ret || !l->max_reservations || !l->max_sessions || !l->pair_bytes_per_s ||
      !l->total_bytes_per_s || l->max_reservations > 4096 || l->max_sessions > 4096)
    return GN_EINVAL;
  gn_relay *r = calloc(1, sizeof *r);
  if (!r)
    return GN_ENOMEM;
  r->lim = *l;
  memcpy(r->seed, seed, 32);
  r->slots = calloc(l->max_reservations, sizeof *r->slots);
  r->pairs = calloc(l->max_sessions, sizeof *r->pairs);
  if (!r->slots || !r->pairs || gn_ratelimit_new(GN_RELAY_CALLERS_MAX, call_rate, &r->callers) < 0) {
    gn_relay_free(r);
    return GN_ENOMEM;
  }
  r->total = (bytes_bucket){.level = (int64_t)l->total_bytes_per_s, .last_ms = now_ms};
  *ret = r;
  return 0;
}

gn_relay *gn_relay_free(gn_relay *r) {
  if (r) {
    free(r->slots);
    free(r->pairs);
    gn_ratelimit_free(r->callers);
    sodium_memzero(r->seed, sizeof r->seed);
    free(r);
  }
  return NULL;
}

void gn_relay_stats_get(const gn_relay *r, gn_relay_stats *ret) {
  *ret = r->st;
}

/* The network of "host:port": 3 bytes of IPv4, 8 of IPv6. */
static int net_of(const char *addr, uint8_t net[8], uint8_t *ret_len) {
  char host[48];
  if (!gn_nat_addr_valid(addr))
    return GN_EINVAL;
  const char *colon = strrchr(addr, ':');
  size_t hl = (size_t)(colon - addr);
  const char *h = addr;
  if (addr[0] == '[') {
    h++;
    hl -= 2;
  }
  memcpy(host, h, hl);
  host[hl] = '\0';
  uint8_t ip[16];
  if (addr[0] == '[') {
    if (inet_pton(AF_INET6, host, ip) != 1)
      return GN_EINVAL;
    memcpy(net, ip, 8);
    *ret_len = 8;
  } else {
    if (inet_pton(AF_INET, host, ip) != 1)
      return GN_EINVAL;
    memcpy(net, ip, 3);
    *ret_len = 3;
  }
  return 0;
}

static bool slot_live(const slot *s, uint64_t now_ms) {
  return s->used && now_ms < s->expires_ms;
}

int gn_relay_reserve(gn_relay *r, const uint8_t peer[GN_PK_LEN], const char *peer_addr, uint64_t now_ms,
                     uint64_t *ret_expires_ms) {
  uint8_t net[8];
  uint8_t net_len = 0;
  if (!peer || net_of(peer_addr, net, &net_len) < 0)
    return GN_EINVAL;
  slot *mine = NULL, *free_slot = NULL;
  size_t in_net = 0;
  for (size_t i = 0; i < r->lim.max_reservations; i++) {
    slot *s = &r->slots[i];
    if (!slot_live(s, now_ms)) {
      if (!free_slot)
        free_slot = s;
      continue;
    }
    if (memcmp(s->peer, peer, GN_PK_LEN) == 0)
      mine = s;
    else if (s->net_len == net_len && memcmp(s->net, net, net_len) == 0)
      in_net++;
  }
  if (!mine && (in_net >= GN_RELAY_PER_NET || !free_slot)) {
    r->st.reserve_refused++;
    return GN_EBUSY;
  }
  slot *s = mine ? mine : free_slot;
  s->used = true;
  memcpy(s->peer, peer, GN_PK_LEN);
  memcpy(s->net, net, net_len);
  s->net_len = net_len;
  s->expires_ms = now_ms + GN_RELAY_RESERVE_TTL_MS;
  r->st.reserved++;
  if (ret_expires_ms)
    *ret_expires_ms = s->expires_ms;
  return 0;
}

bool gn_relay_is_reserved(const gn_relay *r, const uint8_t peer[GN_PK_LEN], uint64_t now_ms) {
  for (size_t i = 0; i < r->lim.max_reservations; i++)
    if (slot_live(&r->slots[i], now_ms) && memcmp(r->slots[i].peer, peer, GN_PK_LEN) == 0)
      return true;
  return false;
}

size_t gn_relay_reservations(const gn_relay *r, uint64_t now_ms) {
  size_t n = 0;
  for (size_t i = 0; i < r->lim.max_reservations; i++)
    n += slot_live(&r->slots[i], now_ms);
  return n;
}

static bool pair_live(const pair *p, uint64_t now_ms) {
  return p->gen && (p->active || now_ms < p->deadline_ms);
}

static uint64_t pair_id(const gn_relay *r, const pair *p) {
  return ((uint64_t)p->gen << 16) | (uint64_t)(p - r->pairs);
}

static pair *pair_get(const gn_relay *r, uint64_t id) {
  size_t idx = (size_t)(id & 0xffff);
  if (idx >= r->lim.max_sessions || r->pairs[idx].gen == 0 || r->pairs[idx].gen != (uint32_t)(id >> 16))
    return NULL;
  return &r->pairs[idx];
}

static void new_token(gn_relay *r, uint8_t out[GN_RELAY_TOKEN_LEN]) {
  uint8_t ctr[8];
  uint64_t c = r->counter++;
  for (int i = 0; i < 8; i++)
    ctr[i] = (uint8_t)(c >> (8 * i));
  crypto_generichash(out, GN_RELAY_TOKEN_LEN, ctr, sizeof ctr, r->seed, sizeof r->seed);
}

int gn_relay_call(gn_relay *r, const uint8_t caller[GN_PK_LEN], const uint8_t target[GN_PK_LEN], uint64_t now_ms,
                  uint64_t *ret_pair, uint8_t ret_caller_tok[GN_RELAY_TOKEN_LEN],
                  uint8_t ret_target_tok[GN_RELAY_TOKEN_LEN]) {
  if (!caller || !target || memcmp(caller, target, GN_PK_LEN) == 0)
    return GN_EINVAL;
  if (!gn_relay_is_reserved(r, target, now_ms)) {
    r->st.calls_refused++;
    return GN_ENOTFOUND;
  }
  pair *p = NULL;
  for (size_t i = 0; i < r->lim.max_sessions && !p; i++)
    if (!pair_live(&r->pairs[i], now_ms))
      p = &r->pairs[i];
  /* The caller's token last: a call refused for room costs it nothing. */
  if (!p || !gn_ratelimit_allow(r->callers, caller, GN_RATELIMIT_KEY_MAX, 1, now_ms)) {
    r->st.calls_refused++;
    return GN_EBUSY;
  }
  if (++r->gen == 0 || r->gen > 0xffffffu)
    r->gen = 1;
  *p = (pair){.gen = r->gen, .deadline_ms = now_ms + GN_RELAY_CALL_WAIT_MS};
  p->bucket = (bytes_bucket){.level = (int64_t)r->lim.pair_bytes_per_s, .last_ms = now_ms};
  new_token(r, p->tok[0]);
  new_token(r, p->tok[1]);
  memcpy(ret_caller_tok, p->tok[0], GN_RELAY_TOKEN_LEN);
  memcpy(ret_target_tok, p->tok[1], GN_RELAY_TOKEN_LEN);
  *ret_pair = pair_id(r, p);
  r->st.calls++;
  return 0;
}

int gn_relay_claim(gn_relay *r, const uint8_t tok[GN_RELAY_TOKEN_LEN], uint64_t now_ms, uint64_t *ret_pair,
                   int *ret_side) {
  for (size_t i = 0; i < r->lim.max_sessions; i++) {
    pair *p = &r->pairs[i];
    if (!p->gen || p->active || now_ms >= p->deadline_ms)
      continue;
    for (int side = 0; side < 2; side++) {
      if (p->claimed[side] || sodium_memcmp(p->tok[side], tok, GN_RELAY_TOKEN_LEN) != 0)
        continue;
      p->claimed[side] = true;
      if (p->claimed[0] && p->claimed[1])
        p->active = true;
      *ret_pair = pair_id(r, p);
      *ret_side = side;
      return 0;
    }
  }
  r->st.claims_refused++;
  return GN_ENOTFOUND;
}

bool gn_relay_pair_ready(const gn_relay *r, uint64_t id) {
  const pair *p = pair_get(r, id);
  return p && p->active;
}

bool gn_relay_pair_live(const gn_relay *r, uint64_t id, uint64_t now_ms) {
  const pair *p = pair_get(r, id);
  return p && pair_live(p, now_ms);
}

/* Takes bytes from the bucket; the milliseconds until it is back to zero
 * when that leaves it in debt. */
static uint64_t bucket_charge(bytes_bucket *b, uint64_t rate, size_t bytes, uint64_t now_ms) {
  if (now_ms > b->last_ms) {
    uint64_t add = (now_ms - b->last_ms) * rate / 1000;
    b->level = b->level + (int64_t)add > (int64_t)rate ? (int64_t)rate : b->level + (int64_t)add;
    b->last_ms = now_ms;
  }
  b->level -= (int64_t)bytes;
  if (b->level >= 0)
    return 0;
  return ((uint64_t)(-b->level) * 1000 + rate - 1) / rate;
}

uint64_t gn_relay_pair_charge(gn_relay *r, uint64_t id, size_t bytes, uint64_t now_ms) {
  pair *p = pair_get(r, id);
  if (!p)
    return 0;
  r->st.bytes += bytes;
  uint64_t a = bucket_charge(&p->bucket, r->lim.pair_bytes_per_s, bytes, now_ms);
  uint64_t b = bucket_charge(&r->total, r->lim.total_bytes_per_s, bytes, now_ms);
  uint64_t wait = a > b ? a : b;
  if (wait)
    r->st.paused++;
  return wait;
}

void gn_relay_pair_end(gn_relay *r, uint64_t id) {
  pair *p = pair_get(r, id);
  if (p)
    memset(p, 0, sizeof *p);
}

size_t gn_relay_sessions(const gn_relay *r, uint64_t now_ms) {
  size_t n = 0;
  for (size_t i = 0; i < r->lim.max_sessions; i++)
    n += pair_live(&r->pairs[i], now_ms);
  return n;
}

/* --- bodies ----------------------------------------------------------------------*/

int gn_relay_reserve_encode(const gn_relay_reserve_msg *m, gn_buf *ret) {
  gn_wire_writer w;
  gn_wire_writer_init(&w);
  gn_wire_put_map(&w, 1);
  gn_wire_put_str(&w, "r");
  gn_wire_put_bool(&w, m->reserve);
  return gn__nat_take(&w, ret);
}

int gn_relay_reserve_decode(const uint8_t *body, size_t len, gn_relay_reserve_msg *ret) {
  gn_wire_doc doc;
  gn_relay_reserve_msg m = {0};
  int r = gn__nat_open_map(body, len, 1, &doc);
  if (r < 0)
    return r;
  r = gn_wire_get_bool(doc.root, "r", &m.reserve);
  gn_wire_doc_done(&doc);
  if (r == 0)
    *ret = m;
  return r;
}

int gn_relay_status_encode(const gn_relay_status_msg *m, gn_buf *ret) {
  gn_wire_writer w;
  if ((m->addr[0] && !gn_nat_addr_valid(m->addr)) || strlen(m->why) >= GN_RELAY_WHY_MAX)
    return GN_EINVAL;
  gn_wire_writer_init(&w);
  gn_wire_put_map(&w, m->has_call ? 6 : 4);
  gn_wire_put_str(&w, "ok");
  gn_wire_put_bool(&w, m->ok);
  gn_wire_put_str(&w, "w");
  gn_wire_put_str(&w, m->why);
  gn_wire_put_str(&w, "a");
  gn_wire_put_str(&w, m->addr);
  gn_wire_put_str(&w, "e");
  gn_wire_put_u64(&w, m->ttl_s);
  if (m->has_call) {
    gn_wire_put_str(&w, "p");
    gn_wire_put_bin(&w, m->peer, GN_PK_LEN);
    gn_wire_put_str(&w, "k");
    gn_wire_put_bin(&w, m->token, GN_RELAY_TOKEN_LEN);
  }
  return gn__nat_take(&w, ret);
}

int gn_relay_status_decode(const uint8_t *body, size_t len, gn_relay_status_msg *ret) {
  gn_wire_doc doc;
  gn_relay_status_msg m = {0};
  int r = gn__nat_open_map(body, len, 6, &doc);
  if (r < 0)
    return r;
  r = gn_wire_get_bool(doc.root, "ok", &m.ok);
  if (r == 0)
    r = gn_wire_get_str(doc.root, "w", m.why, sizeof m.why);
  if (r == 0)
    r = gn__nat_get_addr(doc.root, "a", true, m.addr, sizeof m.addr);
  if (r == 0)
    r = gn_wire_get_u32(doc.root, "e", &m.ttl_s);
  m.has_call = gn_wire_get(doc.root, "p") != NULL;
  if (r == 0 && m.has_call) {
    r = gn_wire_get_bin_exact(doc.root, "p", m.peer, GN_PK_LEN);
    if (r == 0)
      r = gn_wire_get_bin_exact(doc.root, "k", m.token, GN_RELAY_TOKEN_LEN);
  }
  if (r == 0 && doc.root->via.map.size != (m.has_call ? 6u : 4u))
    r = GN_EINVAL;
  gn_wire_doc_done(&doc);
  if (r == 0)
    *ret = m;
  return r;
}

int gn_relay_call_encode(const gn_relay_call_msg *m, gn_buf *ret) {
  gn_wire_writer w;
  if (m->from_relay && !gn_nat_addr_valid(m->addr))
    return GN_EINVAL;
  gn_wire_writer_init(&w);
  gn_wire_put_map(&w, m->from_relay ? 3 : 1);
  gn_wire_put_str(&w, "p");
  gn_wire_put_bin(&w, m->peer, GN_PK_LEN);
  if (m->from_relay) {
    gn_wire_put_str(&w, "k");
    gn_wire_put_bin(&w, m->token, GN_RELAY_TOKEN_LEN);
    gn_wire_put_str(&w, "a");
    gn_wire_put_str(&w, m->addr);
  }
  return gn__nat_take(&w, ret);
}

int gn_relay_call_decode(const uint8_t *body, size_t len, gn_relay_call_msg *ret) {
  gn_wire_doc doc;
  gn_relay_call_msg m = {0};
  int r = gn__nat_open_map(body, len, 3, &doc);
  if (r < 0)
    return r;
  r = gn_wire_get_bin_exact(doc.root, "p", m.peer, GN_PK_LEN);
  m.from_relay = doc.root->via.map.size == 3;
  if (r == 0 && m.from_relay) {
    r = gn_wire_get_bin_exact(doc.root, "k", m.token, GN_RELAY_TOKEN_LEN);
    if (r == 0)
      r = gn__nat_get_addr(doc.root, "a", false, m.addr, sizeof m.addr);
  } else if (r == 0 && doc.root->via.map.size != 1) {
    r = GN_EINVAL;
  }
  gn_wire_doc_done(&doc);
  if (r == 0)
    *ret = m;
  return r;
}

/* --- reaching a peer through its relay ------------------------------------------*/

typedef enum reach_state { R_DIRECT, R_RELAY_WAIT, R_CALLING, R_BACKOFF, R_GAVE_UP } reach_state;

typedef struct attempt {
  bool used;
  reach_state state;
  bool dialled; /* the relay's address was dialled (once) */
  unsigned calls;
  uint8_t peer[GN_PK_LEN], relay[GN_PK_LEN];
  char relay_addr[64];
  uint64_t next_ms; /* when the state's wait ends */
  uint64_t wanted_ms;
  char why[GN_RELAY_WHY_MAX];
} attempt;

struct gn_reach {
  gn_reach_io io;
  attempt a[GN_REACH_MAX];
  gn_reach_stats st;
};

int gn_reach_new(const gn_reach_io *io, gn_reach **ret) {
  if (!io || !ret || !io->is_up || !io->dial || !io->call)
    return GN_EINVAL;
  gn_reach *r = calloc(1, sizeof *r);
  if (!r)
    return GN_ENOMEM;
  r->io = *io;
  *ret = r;
  return 0;
}

gn_reach *gn_reach_free(gn_reach *r) {
  free(r);
  return NULL;
}

static attempt *attempt_of(gn_reach *r, const uint8_t peer[GN_PK_LEN]) {
  for (size_t i = 0; i < GN_REACH_MAX; i++)
    if (r->a[i].used && memcmp(r->a[i].peer, peer, GN_PK_LEN) == 0)
      return &r->a[i];
  return NULL;
}

/* The attempt ends: a failure is kept (as given up) for GN_REACH_FORGET_MS. */
static void attempt_end(gn_reach *r, attempt *a, gn_reach_outcome o, const char *why, uint64_t now_ms) {
  uint8_t peer[GN_PK_LEN], relay[GN_PK_LEN];
  memcpy(peer, a->peer, GN_PK_LEN);
  memcpy(relay, a->relay, GN_PK_LEN);
  if (o == GN_REACH_GAVE_UP) {
    a->state = R_GAVE_UP;
    a->next_ms = now_ms + GN_REACH_FORGET_MS;
    snprintf(a->why, sizeof a->why, "%s", why);
    r->st.gave_up++;
  } else {
    a->used = false;
    if (o == GN_REACH_DIRECT)
      r->st.direct++;
    else
      r->st.relayed++;
  }
  if (r->io.done)
    r->io.done(r->io.ud, peer, relay, o, o == GN_REACH_GAVE_UP ? why : "");
}

int gn_reach_want(gn_reach *r, const uint8_t peer[GN_PK_LEN], const uint8_t relay_id[GN_PK_LEN], const char *relay_addr,
                  bool direct_dialling, uint64_t now_ms) {
  if (!r || !peer || !relay_id || !relay_addr || strlen(relay_addr) >= sizeof r->a[0].relay_addr ||
      !gn_nat_addr_valid(relay_addr) || memcmp(peer, relay_id, GN_PK_LEN) == 0)
    return GN_EINVAL;
  attempt *a = attempt_of(r, peer);
  if (a && a->state == R_GAVE_UP) {
    if (now_ms < a->next_ms)
      return GN_ETIMEDOUT;
    a->used = false;
  } else if (a) {
    return GN_EEXIST;
  }
  a = NULL;
  for (size_t i = 0; i < GN_REACH_MAX && !a; i++)
    if (!r->a[i].used || (r->a[i].state == R_GAVE_UP && now_ms >= r->a[i].next_ms))
      a = &r->a[i];
  if (!a) {
    r->st.busy++;
    return GN_EBUSY;
  }
  *a = (attempt){.used = true,
                 .state = R_DIRECT,
                 .next_ms = direct_dialling ? now_ms + GN_REACH_GRACE_MS : now_ms,
                 .wanted_ms = now_ms};
  memcpy(a->peer, peer, GN_PK_LEN);
  memcpy(a->relay, relay_id, GN_PK_LEN);
  snprintf(a->relay_addr, sizeof a->relay_addr, "%s", relay_addr);
  r->st.wanted++;
  gn_reach_tick(r, now_ms);
  return 0;
}

/* The next step of an attempt whose wait is over (and whose peer is not up). */
static void attempt_step(gn_reach *r, attempt *a, uint64_t now_ms) {
  switch (a->state) {
  case R_DIRECT:
  case R_BACKOFF:
    if (r->io.is_up(r->io.ud, a->relay)) {
      a->calls++;
      r->st.calls++;
      a->state = R_CALLING;
      a->next_ms = now_ms + GN_REACH_CALL_WAIT_MS;
      if (r->io.call(r->io.ud, a->relay, a->peer) < 0)
        gn_reach_refused(r, a->relay, a->peer, "cannot send the call to the relay", now_ms);
    } else if (!a->dialled) {
      a->dialled = true;
      r->st.dials++;
      a->state = R_RELAY_WAIT;
      a->next_ms = now_ms + GN_REACH_RELAY_WAIT_MS;
      if (r->io.dial(r->io.ud, a->relay_addr, a->relay) < 0)
        attempt_end(r, a, GN_REACH_GAVE_UP, "cannot dial the relay the offer names", now_ms);
    } else {
      attempt_end(r, a, GN_REACH_GAVE_UP, "the session with the relay went down", now_ms);
    }
    break;
  case R_RELAY_WAIT:
    attempt_end(r, a, GN_REACH_GAVE_UP, "the relay the offer names did not answer under its key", now_ms);
    break;
  case R_CALLING:
    if (a->calls >= GN_REACH_CALLS) {
      attempt_end(r, a, GN_REACH_GAVE_UP, "no session through the relay after its calls", now_ms);
    } else {
      a->state = R_BACKOFF;
      attempt_step(r, a, now_ms);
    }
    break;
  case R_GAVE_UP:
    break;
  }
}

void gn_reach_tick(gn_reach *r, uint64_t now_ms) {
  if (!r)
    return;
  for (size_t i = 0; i < GN_REACH_MAX; i++) {
    attempt *a = &r->a[i];
    if (!a->used)
      continue;
    if (a->state == R_GAVE_UP) {
      if (now_ms >= a->next_ms)
        a->used = false;
      continue;
    }
    if (r->io.is_up(r->io.ud, a->peer)) {
      attempt_end(r, a, a->calls ? GN_REACH_RELAYED : GN_REACH_DIRECT, "", now_ms);
      continue;
    }
    if (now_ms >= a->next_ms)
      attempt_step(r, a, now_ms);
  }
}

void gn_reach_hold(gn_reach *r, const uint8_t peer[GN_PK_LEN], uint64_t until_ms, uint64_t now_ms) {
  attempt *a = r && peer ? attempt_of(r, peer) : NULL;
  if (!a || a->calls || (a->state != R_DIRECT && a->state != R_RELAY_WAIT && a->state != R_BACKOFF))
    return;
  /* Dialling the relay: its session is up (a punch goes through it), the
   * call waits for the hold instead of following at once. */
  if (a->state == R_RELAY_WAIT)
    a->state = R_BACKOFF;
  uint64_t cap = (a->state == R_DIRECT ? a->wanted_ms : now_ms) + GN_REACH_HOLD_MAX_MS;
  a->next_ms = until_ms < cap ? until_ms : cap;
  gn_reach_tick(r, now_ms);
}

void gn_reach_refused(gn_reach *r, const uint8_t relay[GN_PK_LEN], const uint8_t peer[GN_PK_LEN], const char *why,
                      uint64_t now_ms) {
  attempt *a = r ? attempt_of(r, peer) : NULL;
  if (!a || a->state != R_CALLING || memcmp(a->relay, relay, GN_PK_LEN) != 0)
    return;
  r->st.refused++;
  snprintf(a->why, sizeof a->why, "%s", why ? why : "");
  if (a->calls >= GN_REACH_CALLS) {
    char w[GN_RELAY_WHY_MAX];
    snprintf(w, sizeof w, "%s", a->why);
    attempt_end(r, a, GN_REACH_GAVE_UP, w, now_ms);
    return;
  }
  a->state = R_BACKOFF;
  a->next_ms = now_ms + ((uint64_t)GN_REACH_BACKOFF_MS << (a->calls - 1));
}

void gn_reach_up(gn_reach *r, const uint8_t key[GN_PK_LEN], uint64_t now_ms) {
  if (!r)
    return;
  for (size_t i = 0; i < GN_REACH_MAX; i++) {
    attempt *a = &r->a[i];
    if (a->used && a->state == R_RELAY_WAIT && memcmp(a->relay, key, GN_PK_LEN) == 0) {
      a->state = R_BACKOFF;
      a->next_ms = now_ms;
    }
  }
  gn_reach_tick(r, now_ms);
}

bool gn_reach_active(const gn_reach *r, const uint8_t peer[GN_PK_LEN]) {
  for (size_t i = 0; r && i < GN_REACH_MAX; i++)
    if (r->a[i].used && r->a[i].state != R_GAVE_UP && memcmp(r->a[i].peer, peer, GN_PK_LEN) == 0)
      return true;
  return false;
}

uint64_t gn_reach_next_deadline_ms(const gn_reach *r) {
  uint64_t at = UINT64_MAX;
  for (size_t i = 0; r && i < GN_REACH_MAX; i++)
    if (r->a[i].used && r->a[i].next_ms < at)
      at = r->a[i].next_ms;
  return at;
}

bool gn_reach_get(const gn_reach *r, size_t i, gn_reach_info *ret) {
  static const char *const names[] = {[R_DIRECT] = "direct",
                                      [R_RELAY_WAIT] = "dialling-relay",
                                      [R_CALLING] = "calling",
                                      [R_BACKOFF] = "backoff",
                                      [R_GAVE_UP] = "gave-up"};
  for (size_t k = 0, seen = 0; r && k < GN_REACH_MAX; k++) {
    const attempt *a = &r->a[k];
    if (!a->used || seen++ != i)
      continue;
    memcpy(ret->peer, a->peer, GN_PK_LEN);
    memcpy(ret->relay, a->relay, GN_PK_LEN);
    snprintf(ret->relay_addr, sizeof ret->relay_addr, "%s", a->relay_addr);
    ret->state = names[a->state];
    ret->calls = a->calls;
    snprintf(ret->why, sizeof ret->why, "%s", a->why);
    return true;
  }
  return false;
}

void gn_reach_stats_get(const gn_reach *r, gn_reach_stats *ret) {
  *ret = r ? r->st : (gn_reach_stats){0};
}
