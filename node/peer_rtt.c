/* Round trips between providers (docs/protocol.md §2.14). A provider asked
 * by a requester (RTT_ASK) pings each target it already knows over the
 * overlay, one PING after the other, at most GN_RTT_PINGS each within
 * GN_RTT_TARGET_MS, and answers RTT_REPORT with the least round trip per
 * target. The requester's side asks every candidate of a plan at once and
 * combines both ends of each pair into one matrix (gn__rtt_matrix_begin).
 *
 * Everything is bounded: GN_RTT_MAX_TARGETS per ask, GN_RTT_MAX_ASKS asks
 * measured at once, one per asker in flight and one started per
 * GN_RTT_ASK_INTERVAL_MS, PINGs answered per peer by a token bucket, and the
 * tables of askers and pingers have a fixed size. A target the provider's
 * overlay does not know (no offer, no session) is never dialled. */
#include "peer_rtt.h"

#include "node_internal.h"
#include "overlay.h"
#include "records.h"
#include "util.h"

#include <gpunet/gang.h>
#include <gpunet/swim.h>
#include <sodium.h>

#define RTT_TIMER_MS 20 /* dials polled, deadlines kept */
#define RTT_ASKERS 64   /* askers remembered for the rate */
#define RTT_BUCKETS 64  /* pingers remembered for the PONG rate */
#define RTT_GLUES 4     /* nodes in one process (tests) */

/* --- the codec ---------------------------------------------------------------*/

int gn__rtt_ask_encode(const gn_rtt_ask *a, gn_wire_writer *w) {
  if (a->count > GN_RTT_MAX_TARGETS)
    return GN_ETOOBIG;
  gn_wire_put_map(w, 2);
  gn_wire_put_str(w, "nonce");
  gn_wire_put_bin(w, a->nonce, GN_RTT_NONCE_LEN);
  gn_wire_put_str(w, "targets");
  gn_wire_put_array(w, (uint32_t)a->count);
  for (size_t i = 0; i < a->count; i++)
    gn_wire_put_bin(w, a->targets[i], GN_PK_LEN);
  return w->failed ? GN_ENOMEM : 0;
}

int gn__rtt_ask_decode(const uint8_t *body, size_t len, gn_rtt_ask *ret) {
  gn_wire_doc doc;
  gn_rtt_ask a;
  const msgpack_object_array *arr = NULL;
  memset(&a, 0, sizeof a);
  int r = gn_wire_decode(body, len, &doc);
  if (r < 0) /* GN_ETOOBIG is kept for too many targets, with the nonce */
    return r == GN_ETOOBIG ? GN_EINVAL : r;
  if ((r = gn_wire_get_bin_exact(doc.root, "nonce", a.nonce, GN_RTT_NONCE_LEN)) < 0)
    goto out;
  if ((r = gn_wire_get_array(doc.root, "targets", GN_RTT_MAX_TARGETS, &arr)) < 0) {
    if (r == GN_ETOOBIG) { /* refused by name: the nonce says which ask */
      memset(ret, 0, sizeof *ret);
      memcpy(ret->nonce, a.nonce, GN_RTT_NONCE_LEN);
    }
    goto out;
  }
  for (uint32_t i = 0; i < arr->size; i++) {
    const msgpack_object *o = &arr->ptr[i];
    if (o->type != MSGPACK_OBJECT_BIN || o->via.bin.size != GN_PK_LEN) {
      r = GN_EINVAL;
      goto out;
    }
    memcpy(a.targets[i], o->via.bin.ptr, GN_PK_LEN);
  }
  a.count = arr->size;
  *ret = a;
out:
  gn_wire_doc_done(&doc);
  return r;
}

int gn__rtt_report_encode(const gn_rtt_report *rep, gn_wire_writer *w) {
  if (rep->count > GN_RTT_MAX_TARGETS)
    return GN_ETOOBIG;
  gn_wire_put_map(w, rep->error[0] ? 3 : 2);
  gn_wire_put_str(w, "nonce");
  gn_wire_put_bin(w, rep->nonce, GN_RTT_NONCE_LEN);
  gn_wire_put_str(w, "results");
  gn_wire_put_array(w, rep->error[0] ? 0 : (uint32_t)rep->count);
  for (size_t i = 0; !rep->error[0] && i < rep->count; i++) {
    const gn_rtt_result *res = &rep->results[i];
    gn_wire_put_map(w, 2);
    gn_wire_put_str(w, "id");
    gn_wire_put_bin(w, res->id, GN_PK_LEN);
    if (res->rtt_us) {
      gn_wire_put_str(w, "rtt_us");
      gn_wire_put_u64(w, res->rtt_us);
    } else {
      gn_wire_put_str(w, "error");
      gn_wire_put_str(w, res->error[0] ? res->error : "unreachable");
    }
  }
  if (rep->error[0]) {
    gn_wire_put_str(w, "error");
    gn_wire_put_str(w, rep->error);
  }
  return w->failed ? GN_ENOMEM : 0;
}

int gn__rtt_report_decode(const uint8_t *body, size_t len, gn_rtt_report *ret) {
  gn_wire_doc doc;
  const msgpack_object_array *arr = NULL;
  gn_rtt_report *rep = calloc(1, sizeof *rep);
  if (!rep)
    return GN_ENOMEM;
  int r = gn_wire_decode(body, len, &doc);
  if (r < 0) {
    free(rep);
    return r;
  }
  if ((r = gn_wire_get_bin_exact(doc.root, "nonce", rep->nonce, GN_RTT_NONCE_LEN)) < 0 ||
      (r = gn_wire_get_array(doc.root, "results", GN_RTT_MAX_TARGETS, &arr)) < 0)
    goto out;
  if (gn_wire_get(doc.root, "error")) {
    if ((r = gn_wire_get_str(doc.root, "error", rep->error, sizeof rep->error)) < 0)
      goto out;
    if (!rep->error[0]) {
      r = GN_EINVAL;
      goto out;
    }
  }
  for (uint32_t i = 0; !rep->error[0] && i < arr->size; i++) {
    const msgpack_object *o = &arr->ptr[i];
    gn_rtt_result *res = &rep->results[i];
    uint64_t us;
    if ((r = gn_wire_get_bin_exact(o, "id", res->id, GN_PK_LEN)) < 0)
      goto out;
    if (gn_wire_get(o, "rtt_us")) {
      if ((r = gn_wire_get_u64(o, "rtt_us", &us)) < 0)
        goto out;
      if (us == 0 || us > GN_RTT_MAX_US) /* kept, as not measured */
        gn__strf(res->error, sizeof res->error, "absurd");
      else
        res->rtt_us = (uint32_t)us;
    } else if ((r = gn_wire_get_str(o, "error", res->error, sizeof res->error)) < 0) {
      goto out;
    } else if (!res->error[0]) {
      r = GN_EINVAL;
      goto out;
    }
    rep->count = i + 1;
  }
  *ret = *rep;
out:
  gn_wire_doc_done(&doc);
  free(rep);
  return r;
}

int gn__rtt_ping_encode(const uint8_t nonce[GN_RTT_NONCE_LEN], gn_wire_writer *w) {
  gn_wire_put_map(w, 1);
  gn_wire_put_str(w, "nonce");
  gn_wire_put_bin(w, nonce, GN_RTT_NONCE_LEN);
  return w->failed ? GN_ENOMEM : 0;
}

int gn__rtt_ping_decode(const uint8_t *body, size_t len, uint8_t ret_nonce[GN_RTT_NONCE_LEN]) {
  gn_wire_doc doc;
  uint8_t nonce[GN_RTT_NONCE_LEN];
  int r = gn_wire_decode(body, len, &doc);
  if (r < 0)
    return r;
  r = gn_wire_get_bin_exact(doc.root, "nonce", nonce, sizeof nonce);
  if (r == 0)
    memcpy(ret_nonce, nonce, sizeof nonce);
  gn_wire_doc_done(&doc);
  return r;
}

void gn__rtt_combine(size_t k, const uint32_t *dir, uint32_t *ret) {
  for (size_t i = 0; i < k; i++)
    for (size_t j = 0; j < k; j++) {
      uint32_t a = dir[i * k + j], b = dir[j * k + i];
      ret[i * k + j] = i == j ? 0 : a > b ? a : b; /* 0 (unknown) loses to any measure */
    }
}

void gn__rtt_to_plan_ms(size_t k, const uint32_t *rtt_us, uint32_t *ret_ms) {
  for (size_t i = 0; i < k * k; i++)
    ret_ms[i] = i % (k + 1) == 0 ? 0 : rtt_us[i] ? (rtt_us[i] + 999u) / 1000u : GN_RTT_UNKNOWN;
}

/* --- state -------------------------------------------------------------------*/

/* One target of an ask being measured by this provider. */
typedef struct rtt_probe {
  uint8_t id[GN_PK_LEN];
  uint8_t nonce[GN_RTT_NONCE_LEN]; /* of the PING in flight */
  uint64_t sent_ns;                /* when it left (0: none in flight) */
  uint32_t best_us;
  uint8_t samples;
  bool done;
  const char *error; /* when done without a sample */
} rtt_probe;

typedef struct rtt_asking {
  bool used;
  uint8_t asker[GN_PK_LEN];
  uint8_t nonce[GN_RTT_NONCE_LEN];
  uint64_t deadline_ms;
  size_t count;
  rtt_probe p[GN_RTT_MAX_TARGETS];
} rtt_asking;

typedef struct rtt_asker {
  bool used;
  uint8_t id[GN_PK_LEN];
  uint64_t last_ms; /* its last ask taken */
} rtt_asker;

typedef struct rtt_bucket {
  bool used;
  uint8_t id[GN_PK_LEN];
  uint64_t at_ms; /* tokens counted then */
  uint32_t milli; /* tokens, in thousandths */
} rtt_bucket;

/* One candidate of a requester's matrix. */
typedef struct rtt_cand {
  uint8_t id[GN_PK_LEN];
  uint8_t nonce[GN_RTT_NONCE_LEN];
  uint8_t tgt[GN_RTT_MAX_TARGETS]; /* indices of the candidates it is asked about */
  size_t nt;
  bool sent, answered;
} rtt_cand;

typedef struct rtt_matrix {
  int handle;
  size_t k;
  uint64_t deadline_ms;
  gn_rtt_done_fn done;
  void *ud;
  rtt_cand c[GN_RTT_MAX_CANDIDATES];
  uint32_t dir[GN_RTT_MAX_CANDIDATES * GN_RTT_MAX_CANDIDATES];
  uint32_t out[GN_RTT_MAX_CANDIDATES * GN_RTT_MAX_CANDIDATES];
} rtt_matrix;

enum { TIMER_NONE, TIMER_ON, TIMER_CLOSING };

typedef struct rtt_glue {
  gn_node *n;
  uv_timer_t timer;
  int timer_state;
  rtt_asking asks[GN_RTT_MAX_ASKS];
  rtt_asker askers[RTT_ASKERS];
  rtt_bucket buckets[RTT_BUCKETS];
  rtt_matrix *m[GN_RTT_MAX_MATRICES];
  int next_handle;
} rtt_glue;

static rtt_glue glues[RTT_GLUES];

static rtt_glue *glue_of(gn_node *n, bool create) {
  for (size_t i = 0; i < RTT_GLUES; i++)
    if (glues[i].n == n)
      return &glues[i];
  for (size_t i = 0; create && i < RTT_GLUES; i++)
    if (!glues[i].n) {
      memset(&glues[i], 0, sizeof glues[i]);
      glues[i].n = n;
      return &glues[i];
    }
  return NULL;
}

static uint64_t now_ns(void) {
  return uv_hrtime();
}

/* Where to dial a peer we have no session with: its signed offer's address,
 * else the address the membership holds it alive at (its own signed
 * datagrams: a provider whose offer has not reached us yet is still a
 * member). NULL: the overlay does not know it. */
static const char *peer_addr(gn_node *n, const uint8_t id[GN_PK_LEN], char buf[GN_SWIM_ADDR_MAX]) {
  for (size_t i = 0; n->offers && i < gn_offer_table_count(n->offers); i++) {
    const gn_offer_entry *e = gn_offer_table_at(n->offers, i);
    if (memcmp(e->offer.provider, id, GN_PK_LEN) == 0 && e->offer.addr[0])
      return e->offer.addr;
  }
  return gn__overlay_member_addr(n, id, buf, GN_SWIM_ADDR_MAX) == 0 ? buf : NULL;
}

static bool is_up(gn_node *n, const uint8_t id[GN_PK_LEN]) {
  return n->tp && gn_transport_is_up(n->tp, id);
}

static void short_id(const uint8_t id[GN_PK_LEN], char out[GN_NODE_ID_STRLEN]) {
  gn_node_id_format(id, out);
}

static bool busy(const rtt_glue *g) {
  for (size_t i = 0; i < GN_RTT_MAX_ASKS; i++)
    if (g->asks[i].used)
      return true;
  for (size_t i = 0; i < GN_RTT_MAX_MATRICES; i++)
    if (g->m[i])
      return true;
  return false;
}

static void step(rtt_glue *g, uint64_t now_ms);

static void arm(rtt_glue *g);

static void on_timer_closed(uv_handle_t *h) {
  rtt_glue *g = h->data;
  g->timer_state = TIMER_NONE;
  arm(g); /* work that came while it closed */
}

static void on_timer(uv_timer_t *t) {
  rtt_glue *g = t->data;
  step(g, gn_mono_ms());
  if (g->timer_state == TIMER_ON && (!busy(g) || g->n->stopping)) {
    g->timer_state = TIMER_CLOSING;
    uv_close((uv_handle_t *)&g->timer, on_timer_closed);
  }
}

/* The timer runs only while there is work, and closes itself when the
 * daemon stops (step() then ends every ask and matrix). */
static void arm(rtt_glue *g) {
  if (g->timer_state != TIMER_NONE || g->n->stopping || !busy(g))
    return;
  uv_timer_init(g->n->loop, &g->timer);
  g->timer.data = g;
  g->timer_state = TIMER_ON;
  uv_timer_start(&g->timer, on_timer, RTT_TIMER_MS, RTT_TIMER_MS);
}

/* --- the provider: measuring -------------------------------------------------*/

static void send_ping(gn_node *n, rtt_probe *p) {
  gn_wire_writer w;
  randombytes_buf(p->nonce, sizeof p->nonce);
  gn_wire_writer_init(&w);
  gn__rtt_ping_encode(p->nonce, &w);
  p->sent_ns = now_ns();
  if (gn__node_send(n, p->id, GN_MSG_RTT_PING, &w) < 0)
    p->sent_ns = 0; /* tried again while the session is up and time is left */
  gn_wire_writer_done(&w);
}

static void send_report(gn_node *n, const uint8_t to[GN_PK_LEN], const gn_rtt_report *rep) {
  gn_wire_writer w;
  gn_wire_writer_init(&w);
  if (gn__rtt_report_encode(rep, &w) == 0)
    gn__node_send(n, to, GN_MSG_RTT_REPORT, &w);
  gn_wire_writer_done(&w);
}

static void refuse(gn_node *n, const uint8_t to[GN_PK_LEN], const uint8_t nonce[GN_RTT_NONCE_LEN], const char *why) {
  gn_rtt_report rep;
  char id[GN_NODE_ID_STRLEN];
  memset(&rep, 0, sizeof rep);
  memcpy(rep.nonce, nonce, GN_RTT_NONCE_LEN);
  gn__strf(rep.error, sizeof rep.error, "%s", why);
  short_id(to, id);
  gn_log(GN_LOG_INFO, "refused an RTT ask from %s: %s", id, why);
  send_report(n, to, &rep);
}

/* Sends the report when every target is done, and frees the ask. */
static void ask_maybe_done(gn_node *n, rtt_asking *a) {
  gn_rtt_report rep;
  for (size_t i = 0; i < a->count; i++)
    if (!a->p[i].done)
      return;
  memset(&rep, 0, sizeof rep);
  memcpy(rep.nonce, a->nonce, GN_RTT_NONCE_LEN);
  rep.count = a->count;
  size_t measured = 0;
  for (size_t i = 0; i < a->count; i++) {
    memcpy(rep.results[i].id, a->p[i].id, GN_PK_LEN);
    if (a->p[i].samples) {
      rep.results[i].rtt_us = a->p[i].best_us;
      measured++;
    } else {
      gn__strf(rep.results[i].error, sizeof rep.results[i].error, "%s", a->p[i].error ? a->p[i].error : "unreachable");
    }
  }
  char id[GN_NODE_ID_STRLEN];
  short_id(a->asker, id);
  gn_log(GN_LOG_INFO, "RTT report to %s: %zu of %zu targets measured", id, measured, a->count);
  send_report(n, a->asker, &rep);
  a->used = false;
}

static void probe_finish(rtt_probe *p, const char *error) {
  p->done = true;
  p->sent_ns = 0;
  if (!p->samples)
    p->error = error;
}

static void on_ask(rtt_glue *g, const uint8_t peer[GN_PK_LEN], const gn_envelope *env) {
  gn_node *n = g->n;
  gn_rtt_ask ask;
  int r = gn__rtt_ask_decode(env->body, env->body_len, &ask);
  if (r == GN_ETOOBIG) {
    refuse(n, peer, ask.nonce, "too_many_targets");
    return;
  }
  if (r < 0) {
    gn_log(GN_LOG_DEBUG, "dropped a malformed RTT ask: %s", gn_strerror(r));
    return;
  }
  const char *why = !n->cfg.provide ? "not_provider" : n->stopping || !n->tp ? "busy" : NULL;
  if (why) {
    refuse(n, peer, ask.nonce, why);
    return;
  }
  uint64_t now = gn_mono_ms();
  rtt_asking *slot = NULL;
  for (size_t i = 0; i < GN_RTT_MAX_ASKS; i++) {
    if (g->asks[i].used && memcmp(g->asks[i].asker, peer, GN_PK_LEN) == 0) {
      refuse(n, peer, ask.nonce, "in_progress");
      return;
    }
    if (!g->asks[i].used && !slot)
      slot = &g->asks[i];
  }
  rtt_asker *who = NULL, *free_one = NULL;
  for (size_t i = 0; i < RTT_ASKERS; i++) {
    rtt_asker *e = &g->askers[i];
    if (e->used && memcmp(e->id, peer, GN_PK_LEN) == 0)
      who = e;
    else if (!free_one && (!e->used || now - e->last_ms >= GN_RTT_ASK_INTERVAL_MS))
      free_one = e;
  }
  why = who && now - who->last_ms < GN_RTT_ASK_INTERVAL_MS ? "rate"
        : !slot || (!who && !free_one)                     ? "busy" /* or every asker remembered asked lately */
                                                           : NULL;
  if (why) {
    refuse(n, peer, ask.nonce, why);
    return;
  }
  if (!who) {
    who = free_one;
    who->used = true;
    memcpy(who->id, peer, GN_PK_LEN);
  }
  who->last_ms = now;
  memset(slot, 0, sizeof *slot);
  slot->used = true;
  memcpy(slot->asker, peer, GN_PK_LEN);
  memcpy(slot->nonce, ask.nonce, GN_RTT_NONCE_LEN);
  slot->deadline_ms = now + GN_RTT_TARGET_MS;
  slot->count = ask.count;
  size_t dialled = 0;
  for (size_t i = 0; i < ask.count; i++) {
    rtt_probe *p = &slot->p[i];
    memcpy(p->id, ask.targets[i], GN_PK_LEN);
    bool dup = false;
    for (size_t j = 0; j < i; j++)
      dup = dup || memcmp(ask.targets[j], p->id, GN_PK_LEN) == 0;
    if (dup) {
      probe_finish(p, "duplicate");
    } else if (memcmp(p->id, n->id->pk, GN_PK_LEN) == 0) {
      probe_finish(p, "self");
    } else if (is_up(n, p->id)) {
      send_ping(n, p);
    } else {
      char buf[GN_SWIM_ADDR_MAX];
      const char *addr = peer_addr(n, p->id, buf);
      if (!addr)
        probe_finish(p, "unknown"); /* never dialled: the overlay does not know it */
      else if (gn__nat_connect_peer(n, addr, p->id) < 0)
        probe_finish(p, "unreachable");
      else
        dialled++;
    }
  }
  char id[GN_NODE_ID_STRLEN];
  short_id(peer, id);
  gn_log(GN_LOG_INFO, "RTT ask from %s: %zu targets, %zu dialled", id, ask.count, dialled);
  ask_maybe_done(n, slot);
  arm(g);
}

/* A token bucket per pinger: GN_RTT_PONG_BURST, refilled at
 * GN_RTT_PONG_PER_S. A full table reuses the slot idle longest, once it has
 * refilled (so it forgets nothing that still limits); otherwise drops. */
static bool pong_allowed(rtt_glue *g, const uint8_t peer[GN_PK_LEN], uint64_t now) {
  const uint32_t full = GN_RTT_PONG_BURST * 1000u;
  rtt_bucket *b = NULL, *oldest = NULL; /* oldest: a free slot, else the one idle longest */
  for (size_t i = 0; i < RTT_BUCKETS && !b; i++) {
    rtt_bucket *e = &g->buckets[i];
    if (e->used && memcmp(e->id, peer, GN_PK_LEN) == 0)
      b = e;
    else if (!oldest || (oldest->used && (!e->used || e->at_ms < oldest->at_ms)))
      oldest = e;
  }
  if (!b) {
    if (!oldest || (oldest->used && (now - oldest->at_ms) * GN_RTT_PONG_PER_S < full))
      return false;
    b = oldest;
    b->used = true;
    memcpy(b->id, peer, GN_PK_LEN);
    b->at_ms = now;
    b->milli = full;
  }
  uint64_t add = (now - b->at_ms) * GN_RTT_PONG_PER_S; /* thousandths of a token per ms */
  b->milli = add >= full - b->milli ? full : b->milli + (uint32_t)add;
  b->at_ms = now;
  if (b->milli < 1000)
    return false;
  b->milli -= 1000;
  return true;
}

static void on_ping(rtt_glue *g, const uint8_t peer[GN_PK_LEN], const gn_envelope *env) {
  uint8_t nonce[GN_RTT_NONCE_LEN];
  if (gn__rtt_ping_decode(env->body, env->body_len, nonce) < 0)
    return;
  if (!pong_allowed(g, peer, gn_mono_ms()))
    return; /* over the rate: dropped, the pinger sees a lost PING */
  gn_wire_writer w;
  gn_wire_writer_init(&w);
  gn__rtt_ping_encode(nonce, &w);
  gn__node_send(g->n, peer, GN_MSG_RTT_PONG, &w);
  gn_wire_writer_done(&w);
}

static void on_pong(rtt_glue *g, const uint8_t peer[GN_PK_LEN], const gn_envelope *env) {
  uint8_t nonce[GN_RTT_NONCE_LEN];
  uint64_t at = now_ns();
  if (gn__rtt_ping_decode(env->body, env->body_len, nonce) < 0)
    return;
  for (size_t i = 0; i < GN_RTT_MAX_ASKS; i++) {
    rtt_asking *a = &g->asks[i];
    for (size_t j = 0; a->used && j < a->count; j++) {
      rtt_probe *p = &a->p[j];
      if (p->done || !p->sent_ns || memcmp(p->id, peer, GN_PK_LEN) != 0 ||
          sodium_memcmp(p->nonce, nonce, GN_RTT_NONCE_LEN) != 0)
        continue;
      uint64_t us = (at - p->sent_ns) / 1000u; /* below GN_RTT_TARGET_MS: the deadline ends it */
      us = us ? us : 1;
      if (!p->samples || us < p->best_us)
        p->best_us = (uint32_t)us;
      p->samples++;
      p->sent_ns = 0;
      if (p->samples >= GN_RTT_PINGS)
        probe_finish(p, NULL);
      else if (gn_mono_ms() < a->deadline_ms)
        send_ping(g->n, p);
      ask_maybe_done(g->n, a);
      return;
    }
  }
  char id[GN_NODE_ID_STRLEN];
  short_id(peer, id);
  gn_log(GN_LOG_DEBUG, "ignored an RTT pong from %s that answers no ping in flight", id);
}

/* --- the requester: the matrix -----------------------------------------------*/

static void send_ask(gn_node *n, rtt_matrix *m, size_t i) {
  rtt_cand *c = &m->c[i];
  gn_rtt_ask a;
  gn_wire_writer w;
  memset(&a, 0, sizeof a);
  memcpy(a.nonce, c->nonce, GN_RTT_NONCE_LEN);
  a.count = c->nt;
  for (size_t t = 0; t < c->nt; t++)
    memcpy(a.targets[t], m->c[c->tgt[t]].id, GN_PK_LEN);
  gn_wire_writer_init(&w);
  if (gn__rtt_ask_encode(&a, &w) == 0 && gn__node_send(n, c->id, GN_MSG_RTT_ASK, &w) == 0)
    c->sent = true;
  gn_wire_writer_done(&w);
}

static void matrix_finish(rtt_glue *g, size_t slot) {
  rtt_matrix *m = g->m[slot];
  g->m[slot] = NULL; /* done may begin another */
  gn__rtt_combine(m->k, m->dir, m->out);
  size_t known = 0, answered = 0;
  for (size_t i = 0; i < m->k; i++) {
    answered += m->c[i].answered;
    for (size_t j = i + 1; j < m->k; j++)
      known += m->out[i * m->k + j] != 0;
  }
  gn_log(GN_LOG_INFO, "RTT matrix of %zu candidates: %zu answered, %zu of %zu pairs measured", m->k, answered, known,
         m->k * (m->k - 1) / 2);
  m->done(g->n, m->ud, m->out);
  free(m);
}

static bool matrix_complete(const rtt_matrix *m) {
  for (size_t i = 0; i < m->k; i++)
    if (!m->c[i].answered)
      return false;
  return true;
}

static void on_report(rtt_glue *g, const uint8_t peer[GN_PK_LEN], const gn_envelope *env) {
  gn_rtt_report *rep = calloc(1, sizeof *rep);
  if (!rep)
    return;
  if (gn__rtt_report_decode(env->body, env->body_len, rep) < 0) {
    gn_log(GN_LOG_DEBUG, "dropped a malformed RTT report");
    free(rep);
    return;
  }
  for (size_t s = 0; s < GN_RTT_MAX_MATRICES; s++) {
    rtt_matrix *m = g->m[s];
    for (size_t i = 0; m && i < m->k; i++) {
      rtt_cand *c = &m->c[i];
      if (!c->sent || c->answered || memcmp(c->id, peer, GN_PK_LEN) != 0 ||
          sodium_memcmp(c->nonce, rep->nonce, GN_RTT_NONCE_LEN) != 0)
        continue;
      c->answered = true;
      char id[GN_NODE_ID_STRLEN];
      short_id(peer, id);
      if (rep->error[0])
        gn_log(GN_LOG_INFO, "candidate %s refused the RTT ask: %s", id, rep->error);
      /* Only what was asked, once each: extra or repeated ids are ignored. */
      for (size_t r = 0; !rep->error[0] && r < rep->count; r++) {
        const gn_rtt_result *res = &rep->results[r];
        if (!res->rtt_us)
          continue;
        for (size_t t = 0; t < c->nt; t++) {
          size_t j = c->tgt[t];
          if (memcmp(m->c[j].id, res->id, GN_PK_LEN) == 0 && !m->dir[i * m->k + j]) {
            m->dir[i * m->k + j] = res->rtt_us;
            break;
          }
        }
      }
      if (matrix_complete(m))
        matrix_finish(g, s);
      free(rep);
      return;
    }
  }
  gn_log(GN_LOG_DEBUG, "ignored an RTT report that answers no ask of ours");
  free(rep);
}

int gn__rtt_matrix_begin(gn_node *n, const uint8_t (*cands)[GN_PK_LEN], size_t k, uint32_t timeout_ms,
                         gn_rtt_done_fn done, void *ud) {
  if (!n || !cands || !done || k < 2 || k > GN_RTT_MAX_CANDIDATES || timeout_ms < 100 || timeout_ms > 60000)
    return GN_EINVAL;
  for (size_t i = 0; i < k; i++)
    for (size_t j = i + 1; j < k; j++)
      if (memcmp(cands[i], cands[j], GN_PK_LEN) == 0)
        return GN_EINVAL;
  if (n->stopping || !n->tp)
    return GN_ESTATE;
  rtt_glue *g = glue_of(n, true);
  if (!g)
    return GN_EBUSY;
  size_t slot = GN_RTT_MAX_MATRICES;
  for (size_t s = 0; s < GN_RTT_MAX_MATRICES && slot == GN_RTT_MAX_MATRICES; s++)
    if (!g->m[s])
      slot = s;
  if (slot == GN_RTT_MAX_MATRICES)
    return GN_EBUSY;
  rtt_matrix *m = calloc(1, sizeof *m);
  if (!m)
    return GN_ENOMEM;
  m->k = k;
  m->done = done;
  m->ud = ud;
  m->deadline_ms = gn_mono_ms() + timeout_ms;
  g->next_handle = g->next_handle >= INT32_MAX - 1 ? 1 : g->next_handle + 1;
  m->handle = g->next_handle;
  /* Both ends of every pair when each can be asked about all the others;
   * beyond, i is asked about i+1 .. i+h (mod k), h = min(16, k/2): every
   * pair at distance <= h measured from one end (both at k/2), each
   * candidate asked about at most GN_RTT_MAX_TARGETS. */
  size_t h = k - 1 <= GN_RTT_MAX_TARGETS ? k - 1 : k / 2 < GN_RTT_MAX_TARGETS ? k / 2 : GN_RTT_MAX_TARGETS;
  for (size_t i = 0; i < k; i++) {
    rtt_cand *c = &m->c[i];
    memcpy(c->id, cands[i], GN_PK_LEN);
    randombytes_buf(c->nonce, sizeof c->nonce);
    for (size_t d = 1; d <= h; d++)
      c->tgt[c->nt++] = (uint8_t)((i + d) % k);
  }
  g->m[slot] = m;
  for (size_t i = 0; i < k; i++) {
    rtt_cand *c = &m->c[i];
    if (memcmp(c->id, n->id->pk, GN_PK_LEN) == 0) {
      c->answered = true; /* this node: the others measure to it */
    } else if (is_up(n, c->id)) {
      send_ask(n, m, i);
    } else {
      char buf[GN_SWIM_ADDR_MAX];
      const char *addr = peer_addr(n, c->id, buf);
      if (addr)
        gn__nat_connect_peer(n, addr, c->id); /* asked once up (the timer looks) */
    }
  }
  arm(g);
  return m->handle;
}

void gn__rtt_matrix_cancel(gn_node *n, int handle) {
  rtt_glue *g = glue_of(n, false);
  for (size_t s = 0; g && handle > 0 && s < GN_RTT_MAX_MATRICES; s++)
    if (g->m[s] && g->m[s]->handle == handle) {
      free(g->m[s]);
      g->m[s] = NULL;
    }
}

/* --- driving -----------------------------------------------------------------*/

static void step(rtt_glue *g, uint64_t now) {
  gn_node *n = g->n;
  for (size_t i = 0; i < GN_RTT_MAX_ASKS; i++) {
    rtt_asking *a = &g->asks[i];
    for (size_t j = 0; a->used && j < a->count; j++) {
      rtt_probe *p = &a->p[j];
      if (p->done)
        continue;
      if (now >= a->deadline_ms || n->stopping)
        probe_finish(p, "unreachable");
      else if (is_up(n, p->id) && (!p->sent_ns || now_ns() - p->sent_ns >= GN_RTT_RESEND_MS * 1000000ull))
        send_ping(n, p); /* the first, or again under a new nonce: the last one or its PONG was lost */
    }
    if (a->used)
      ask_maybe_done(n, a);
  }
  for (size_t s = 0; s < GN_RTT_MAX_MATRICES; s++) {
    rtt_matrix *m = g->m[s];
    if (!m)
      continue;
    for (size_t i = 0; i < m->k && !n->stopping; i++)
      if (!m->c[i].sent && !m->c[i].answered && is_up(n, m->c[i].id))
        send_ask(n, m, i);
    if (now >= m->deadline_ms || n->stopping || matrix_complete(m))
      matrix_finish(g, s);
  }
}

void gn__rtt_on_message(gn_node *n, const uint8_t peer[GN_PK_LEN], const gn_envelope *env, const uint8_t *raw,
                        size_t raw_len) {
  (void)raw, (void)raw_len;
  rtt_glue *g = glue_of(n, env->type == GN_MSG_RTT_ASK || env->type == GN_MSG_RTT_PING);
  if (!g)
    return; /* a report or a pong for a node that never asked or pinged */
  switch (env->type) {
  case GN_MSG_RTT_ASK:
    on_ask(g, peer, env);
    break;
  case GN_MSG_RTT_REPORT:
    on_report(g, peer, env);
    break;
  case GN_MSG_RTT_PING:
    on_ping(g, peer, env);
    break;
  case GN_MSG_RTT_PONG:
    on_pong(g, peer, env);
    break;
  default:
    break;
  }
  arm(g);
}
