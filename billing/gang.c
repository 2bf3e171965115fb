/* The requester's gang lease machine (include/gpunet/gang.h): N GPUs across
 * several providers all or nothing, by signing ordinary leases and
 * releasing every one of them if any member refuses, does not answer in time
 * or is lost before the group is ready; replacements from spares for
 * --restarts. No I/O: member events and the time in, actions out. */
#include <gpunet/base.h>
#include <gpunet/billing.h>
#include <gpunet/gang.h>

#include <assert.h>
#include <inttypes.h>
#include <sodium.h>
#include <stdio.h>

/* One lease asked for a slot (the first one, or a replacement). */
typedef struct gang_att {
  gn_gang_offer offer;
  char lease_id[24];
  uint32_t slot;
  int state;   /* enum gn_gang_member_state */
  bool agreed; /* its agreement arrived (at any time) */
  uint64_t deadline_ms, accepted_at_ms, released_at_ms;
  char reason[160];
} gang_att;

struct gn_gang {
  gn_gang_opts opts;
  uint8_t seed[32];
  uint64_t id_counter;
  int phase;
  uint32_t restarts_used;
  char reason[160];

  uint32_t n;                             /* slots */
  uint32_t slot_att[GN_GANG_MAX_MEMBERS]; /* each slot's current attempt */
  uint32_t slot_tries[GN_GANG_MAX_MEMBERS];
  gang_att att[GN_GANG_MAX_ATTEMPTS];
  uint32_t n_att;

  gn_gang_offer spare[GN_GANG_MAX_SPARES];
  bool spare_used[GN_GANG_MAX_SPARES];
  uint32_t n_spares;
};

/* --- small helpers --------------------------------------------------------*/

static void out_reset(gn_gang_out *out) {
  out->n = 0;
  out->timer_at_ms = UINT64_MAX;
}

static gn_gang_action *out_push(gn_gang_out *out, int kind, int member, const char *reason) {
  /* GN_GANG_MAX_ACTIONS covers the worst call (see the header); running out
   * would be a bug here, not a peer's doing. */
  assert(out->n < GN_GANG_MAX_ACTIONS);
  gn_gang_action *a = &out->act[out->n++];
  memset(a, 0, sizeof(*a));
  a->kind = kind;
  a->member = member;
  snprintf(a->reason, sizeof(a->reason), "%s", reason ? reason : "");
  return a;
}

/* Replaces what is not printable ASCII, so a peer's reason is safe to log. */
static void copy_reason(char *dst, size_t cap, const char *src) {
  size_t i = 0;
  for (; src && src[i] && i + 1 < cap; i++)
    dst[i] = (src[i] >= 0x20 && src[i] < 0x7f) ? src[i] : '?';
  dst[i] = 0;
}

/* The offer id goes into a LEASE_REQUEST (§2.2): "" or an id of at most
 * 23 bytes in the project's id grammar. */
static bool offer_ok(const gn_gang_offer *o) {
  size_t len = strnlen(o->offer_id, sizeof(o->offer_id));
  if (len == sizeof(o->offer_id) || o->gpus == 0 || o->gpus > GN_LEASE_MAX_GPUS)
    return false;
  return len == 0 || gn_id_valid(o->offer_id);
}

/* gpus * price, or false when it does not fit. */
static bool offer_cost(const gn_gang_offer *o, uint64_t *ret) {
  return !__builtin_mul_overflow((uint64_t)o->gpus, o->price_uper_hour, ret);
}

static uint64_t group_total(const gn_gang *g, uint32_t replace_slot, const gn_gang_offer *with) {
  uint64_t sum = 0, c;
  for (uint32_t i = 0; i < g->n; i++) {
    const gn_gang_offer *o = i == replace_slot ? with : &g->att[g->slot_att[i]].offer;
    if (!offer_cost(o, &c) || __builtin_add_overflow(sum, c, &sum))
      return UINT64_MAX;
  }
  return sum;
}

static gang_att *find_att(gn_gang *g, const char *lease_id) {
  if (!lease_id)
    return NULL;
  for (uint32_t i = 0; i < g->n_att; i++)
    if (strncmp(g->att[i].lease_id, lease_id, sizeof(g->att[i].lease_id)) == 0)
      return &g->att[i];
  return NULL;
}

static bool is_current(const gn_gang *g, const gang_att *a) {
  return &g->att[g->slot_att[a->slot]] == a;
}

static bool forming(const gn_gang *g) {
  return g->phase == GN_GANG_FORMING || g->phase == GN_GANG_RESTARTING;
}

/* A fresh lease id: "l-" + 16 hex digits of BLAKE2b(seed, counter), distinct
 * from every id this gang issued. */
static void new_lease_id(gn_gang *g, char ret[24]) {
  for (;;) {
    uint8_t ctr[8], h[8];
    for (int i = 0; i < 8; i++)
      ctr[i] = (uint8_t)(g->id_counter >> (8 * i));
    g->id_counter++;
    crypto_generichash(h, sizeof(h), ctr, sizeof(ctr), g->seed, sizeof(g->seed));
    char hex[17];
    sodium_bin2hex(hex, sizeof(hex), h, sizeof(h));
    snprintf(ret, 24, "l-%s", hex);
    if (!find_att(g, ret))
      return;
  }
}

static void request(gn_gang *g, uint32_t slot, const gn_gang_offer *o, uint64_t now_ms, gn_gang_out *out) {
  assert(g->n_att < GN_GANG_MAX_ATTEMPTS);
  gang_att *a = &g->att[g->n_att];
  memset(a, 0, sizeof(*a));
  a->offer = *o;
  a->slot = slot;
  a->state = GN_GANG_M_REQUESTED;
  a->deadline_ms = now_ms + g->opts.answer_timeout_ms;
  new_lease_id(g, a->lease_id);
  g->slot_att[slot] = g->n_att++;
  g->slot_tries[slot]++;
  gn_gang_action *act = out_push(out, GN_GANG_ACT_REQUEST, (int)slot, NULL);
  memcpy(act->lease_id, a->lease_id, sizeof(act->lease_id));
  act->offer = a->offer;
}

static void release(gang_att *a, uint64_t now_ms, const char *why, gn_gang_out *out) {
  gn_gang_action *act = out_push(out, GN_GANG_ACT_RELEASE, (int)a->slot, why);
  memcpy(act->lease_id, a->lease_id, sizeof(act->lease_id));
  act->offer = a->offer;
  act->agreed = a->agreed;
  if (a->agreed)
    a->released_at_ms = now_ms;
}

static void set_timer(const gn_gang *g, gn_gang_out *out) {
  out->timer_at_ms = UINT64_MAX;
  if (!forming(g))
    return;
  for (uint32_t i = 0; i < g->n; i++) {
    const gang_att *a = &g->att[g->slot_att[i]];
    if (a->state == GN_GANG_M_REQUESTED && a->deadline_ms < out->timer_at_ms)
      out->timer_at_ms = a->deadline_ms;
  }
}

/* Ends the group: every agreed lease released, every unanswered request
 * abandoned (a bare release), then FAILED (failed) or nothing (ended). */
static void finish(gn_gang *g, uint64_t now_ms, bool failed, const char *why, gn_gang_out *out) {
  if (g->phase == GN_GANG_READY)
    out_push(out, GN_GANG_ACT_STOP_JOBS, -1, why);
  g->phase = failed ? GN_GANG_FAILED : GN_GANG_ENDED;
  copy_reason(g->reason, sizeof(g->reason), why);
  char r[160];
  snprintf(r, sizeof(r), "%s: %.140s", failed ? "gang failed" : "gang released", g->reason);
  for (uint32_t i = 0; i < g->n_att; i++) {
    gang_att *a = &g->att[i];
    if (a->state == GN_GANG_M_AGREED) {
      a->state = GN_GANG_M_RELEASED;
      copy_reason(a->reason, sizeof(a->reason), r);
      release(a, now_ms, r, out);
    } else if (a->state == GN_GANG_M_REQUESTED) {
      a->state = GN_GANG_M_ABANDONED;
      copy_reason(a->reason, sizeof(a->reason), r);
      release(a, now_ms, r, out);
    }
  }
  if (failed)
    out_push(out, GN_GANG_ACT_FAILED, -1, g->reason);
}

static void maybe_ready(gn_gang *g, gn_gang_out *out) {
  for (uint32_t i = 0; i < g->n; i++)
    if (g->att[g->slot_att[i]].state != GN_GANG_M_AGREED)
      return;
  g->phase = GN_GANG_READY;
  gn_gang_action *a = out_push(out, GN_GANG_ACT_READY, -1, NULL);
  a->restart = g->restarts_used;
}

/* Asks the next spare that fits for slot: true if one was asked. */
static bool replace(gn_gang *g, uint32_t slot, uint64_t now_ms, gn_gang_out *out) {
  const gn_gang_offer *old = &g->att[g->slot_att[slot]].offer;
  for (uint32_t s = 0; s < g->n_spares; s++) {
    const gn_gang_offer *o = &g->spare[s];
    if (g->spare_used[s] || o->gpus != old->gpus)
      continue;
    bool taken = false;
    for (uint32_t i = 0; i < g->n && !taken; i++) {
      const gang_att *a = &g->att[g->slot_att[i]];
      taken = i != slot && (a->state == GN_GANG_M_AGREED || a->state == GN_GANG_M_REQUESTED) &&
              memcmp(a->offer.provider, o->provider, GN_PK_LEN) == 0;
    }
    if (taken)
      continue;
    if (g->opts.max_total_uper_hour && group_total(g, slot, o) > g->opts.max_total_uper_hour)
      continue;
    g->spare_used[s] = true;
    request(g, slot, o, now_ms, out);
    return true;
  }
  return false;
}

/* The slot's current lease will not be (or is no longer) agreed. */
static void slot_failed(gn_gang *g, uint32_t slot, uint64_t now_ms, const char *why, gn_gang_out *out) {
  char r[160];
  snprintf(r, sizeof(r), "member %u: %.140s", slot, why);
  if (g->phase == GN_GANG_RESTARTING) {
    if (replace(g, slot, now_ms, out))
      return;
    char r2[160];
    snprintf(r2, sizeof(r2), "%.120s; no spare left to replace it", r);
    finish(g, now_ms, true, r2, out);
    return;
  }
  finish(g, now_ms, true, r, out);
}

/* Every call, even one that refuses its input, hands back the timer that is
 * due (the glue re-arms from the latest call; a refused event must not
 * disarm a deadline). */
static int check(gn_gang *g, gn_gang_out *out) {
  if (!g || !out)
    return GN_EINVAL;
  out_reset(out);
  set_timer(g, out);
  return 0;
}

/* --- public -------------------------------------------------------------*/

int gn_gang_new(const gn_gang_offer *members, size_t n, const gn_gang_offer *spares, size_t n_spares,
                const gn_gang_opts *opts, const uint8_t seed[32], uint64_t now_ms, gn_gang **ret, gn_gang_out *out) {
  if (!members || !opts || !seed || !ret || !out || (n_spares && !spares))
    return GN_EINVAL;
  out_reset(out);
  if (n == 0)
    return GN_EINVAL;
  if (n > GN_GANG_MAX_MEMBERS || n_spares > GN_GANG_MAX_SPARES)
    return GN_ETOOBIG;
  if (opts->answer_timeout_ms < GN_GANG_TIMEOUT_MIN_MS || opts->answer_timeout_ms > GN_GANG_TIMEOUT_MAX_MS)
    return GN_EINVAL;
  uint64_t total = 0, c;
  for (size_t i = 0; i < n + n_spares; i++) {
    const gn_gang_offer *o = i < n ? &members[i] : &spares[i - n];
    if (!offer_ok(o) || !offer_cost(o, &c))
      return GN_EINVAL;
    if (i < n && __builtin_add_overflow(total, c, &total))
      return GN_EINVAL;
    for (size_t j = 0; j < i; j++) {
      const gn_gang_offer *p = j < n ? &members[j] : &spares[j - n];
      if (memcmp(o->provider, p->provider, GN_PK_LEN) == 0)
        return GN_EINVAL;
    }
  }
  if (opts->max_total_uper_hour && total > opts->max_total_uper_hour)
    return GN_EINVAL;
  gn_gang *g = calloc(1, sizeof(*g));
  if (!g)
    return GN_ENOMEM;
  g->opts = *opts;
  memcpy(g->seed, seed, sizeof(g->seed));
  g->phase = GN_GANG_FORMING;
  g->n = (uint32_t)n;
  g->n_spares = (uint32_t)n_spares;
  if (n_spares)
    memcpy(g->spare, spares, n_spares * sizeof(*spares));
  for (uint32_t i = 0; i < g->n; i++)
    request(g, i, &members[i], now_ms, out);
  set_timer(g, out);
  *ret = g;
  return 0;
}

gn_gang *gn_gang_free(gn_gang *g) {
  if (g)
    sodium_memzero(g->seed, sizeof(g->seed));
  free(g);
  return NULL;
}

int gn_gang_accepted(gn_gang *g, uint64_t now_ms, const char *lease_id, const uint8_t provider[GN_PK_LEN],
                     gn_gang_out *out) {
  int r = check(g, out);
  if (r < 0 || !provider)
    return r < 0 ? r : GN_EINVAL;
  gang_att *a = find_att(g, lease_id);
  if (!a)
    return GN_ENOTFOUND;
  if (memcmp(a->offer.provider, provider, GN_PK_LEN) != 0)
    return GN_EPERM;
  if (a->agreed) {
    set_timer(g, out);
    return 0; /* the same agreement again */
  }
  a->agreed = true;
  a->accepted_at_ms = now_ms;
  if (a->state == GN_GANG_M_REQUESTED && forming(g) && is_current(g, a)) {
    a->state = GN_GANG_M_AGREED;
    maybe_ready(g, out);
  } else {
    /* Too late: the member refused or timed out, the group failed or ended,
     * or the slot went to a replacement. Nothing runs on it: release it. */
    char why[160];
    snprintf(why, sizeof(why), "late agreement released (%.130s)",
             a->reason[0] ? a->reason : "the gang no longer waited for it");
    a->state = GN_GANG_M_RELEASED;
    copy_reason(a->reason, sizeof(a->reason), why);
    release(a, now_ms, a->reason, out);
  }
  set_timer(g, out);
  return 0;
}

int gn_gang_refused(gn_gang *g, uint64_t now_ms, const char *lease_id, const uint8_t provider[GN_PK_LEN],
                    const char *reason, gn_gang_out *out) {
  int r = check(g, out);
  if (r < 0 || !provider)
    return r < 0 ? r : GN_EINVAL;
  gang_att *a = find_att(g, lease_id);
  if (!a)
    return GN_ENOTFOUND;
  if (memcmp(a->offer.provider, provider, GN_PK_LEN) != 0)
    return GN_EPERM;
  if (a->agreed)
    return GN_ESTATE;
  if (a->state == GN_GANG_M_REQUESTED) {
    char why[160];
    snprintf(why, sizeof(why), "refused: %.140s", reason && reason[0] ? reason : "no reason given");
    a->state = GN_GANG_M_REFUSED;
    copy_reason(a->reason, sizeof(a->reason), why);
    if (forming(g) && is_current(g, a))
      slot_failed(g, a->slot, now_ms, a->reason, out);
  }
  set_timer(g, out);
  return 0;
}

static void no_answer(gn_gang *g, gang_att *a, uint64_t now_ms, const char *why, gn_gang_out *out) {
  a->state = GN_GANG_M_NO_ANSWER;
  copy_reason(a->reason, sizeof(a->reason), why);
  if (forming(g) && is_current(g, a))
    slot_failed(g, a->slot, now_ms, a->reason, out);
}

int gn_gang_no_answer(gn_gang *g, uint64_t now_ms, const char *lease_id, const char *reason, gn_gang_out *out) {
  int r = check(g, out);
  if (r < 0)
    return r;
  gang_att *a = find_att(g, lease_id);
  if (!a)
    return GN_ENOTFOUND;
  if (a->state == GN_GANG_M_REQUESTED) {
    char why[160];
    snprintf(why, sizeof(why), "no answer: %.140s", reason && reason[0] ? reason : "unreachable");
    no_answer(g, a, now_ms, why, out);
  }
  set_timer(g, out);
  return 0;
}

int gn_gang_lost(gn_gang *g, uint64_t now_ms, const char *lease_id, const char *reason, gn_gang_out *out) {
  int r = check(g, out);
  if (r < 0)
    return r;
  gang_att *a = find_att(g, lease_id);
  if (!a)
    return GN_ENOTFOUND;
  char why[160];
  snprintf(why, sizeof(why), "lost: %.140s", reason && reason[0] ? reason : "its lease ended");
  if (a->state == GN_GANG_M_REQUESTED) {
    no_answer(g, a, now_ms, why, out);
  } else if (a->state == GN_GANG_M_AGREED) {
    char r2[160];
    snprintf(r2, sizeof(r2), "member %u: lost: %.120s", a->slot, reason && reason[0] ? reason : "its lease ended");
    char clean[160];
    copy_reason(clean, sizeof(clean), r2);
    bool was_ready = g->phase == GN_GANG_READY;
    if (was_ready) {
      /* The ranks stop before any lease is released or asked for. */
      out_push(out, GN_GANG_ACT_STOP_JOBS, -1, clean);
      g->phase = GN_GANG_RESTARTING;
    }
    a->state = GN_GANG_M_LOST;
    copy_reason(a->reason, sizeof(a->reason), why);
    /* Its lease may not have ended on the provider's side (the provider is
     * only unreachable): release it; after a LEASE_END this is harmless. */
    release(a, now_ms, a->reason, out);
    if (was_ready && g->restarts_used < g->opts.restarts) {
      g->restarts_used++;
      if (!replace(g, a->slot, now_ms, out)) {
        char r3[160];
        snprintf(r3, sizeof(r3), "%.120s; no spare left to replace it", clean);
        finish(g, now_ms, true, r3, out);
      }
    } else if (was_ready) {
      finish(g, now_ms, true, clean, out);
    } else if (forming(g)) {
      slot_failed(g, a->slot, now_ms, a->reason, out);
    }
  }
  set_timer(g, out);
  return 0;
}

int gn_gang_job_failed(gn_gang *g, uint64_t now_ms, size_t member, const char *reason, gn_gang_out *out) {
  int r = check(g, out);
  if (r < 0)
    return r;
  if (member >= g->n)
    return GN_EINVAL;
  if (g->phase != GN_GANG_READY)
    return GN_ESTATE;
  char why[160];
  snprintf(why, sizeof(why), "member %zu: rank failed: %.120s", member, reason && reason[0] ? reason : "no reason");
  char clean[160];
  copy_reason(clean, sizeof(clean), why);
  if (g->restarts_used < g->opts.restarts) {
    out_push(out, GN_GANG_ACT_STOP_JOBS, -1, clean);
    g->restarts_used++;
    gn_gang_action *a = out_push(out, GN_GANG_ACT_READY, -1, NULL);
    a->restart = g->restarts_used;
  } else {
    finish(g, now_ms, true, clean, out); /* STOP_JOBS first */
  }
  set_timer(g, out);
  return 0;
}

int gn_gang_release(gn_gang *g, uint64_t now_ms, const char *reason, gn_gang_out *out) {
  int r = check(g, out);
  if (r < 0)
    return r;
  if (g->phase == GN_GANG_FAILED || g->phase == GN_GANG_ENDED)
    return 0;
  finish(g, now_ms, false, reason && reason[0] ? reason : "released", out);
  set_timer(g, out);
  return 0;
}

int gn_gang_timer(gn_gang *g, uint64_t now_ms, gn_gang_out *out) {
  int r = check(g, out);
  if (r < 0)
    return r;
  /* A replacement asked here has its deadline in the future, so one pass
   * over the slots is enough. */
  for (uint32_t i = 0; i < g->n && forming(g); i++) {
    gang_att *a = &g->att[g->slot_att[i]];
    if (a->state == GN_GANG_M_REQUESTED && a->deadline_ms <= now_ms) {
      char why[160];
      snprintf(why, sizeof(why), "no answer within %" PRIu64 " ms", g->opts.answer_timeout_ms);
      no_answer(g, a, now_ms, why, out);
    }
  }
  set_timer(g, out);
  return 0;
}

void gn_gang_info_get(const gn_gang *g, gn_gang_info *ret) {
  memset(ret, 0, sizeof(*ret));
  if (!g)
    return;
  ret->phase = g->phase;
  ret->members = g->n;
  for (uint32_t i = 0; i < g->n; i++)
    ret->agreed += g->att[g->slot_att[i]].state == GN_GANG_M_AGREED;
  ret->restarts_used = g->restarts_used;
  for (uint32_t s = 0; s < g->n_spares; s++)
    ret->spares_left += !g->spare_used[s];
  ret->total_uper_hour = group_total(g, UINT32_MAX, NULL);
  memcpy(ret->reason, g->reason, sizeof(ret->reason));
}

int gn_gang_member(const gn_gang *g, size_t i, gn_gang_member_info *ret) {
  if (!g || !ret || i >= g->n)
    return GN_EINVAL;
  const gang_att *a = &g->att[g->slot_att[i]];
  memset(ret, 0, sizeof(*ret));
  ret->offer = a->offer;
  memcpy(ret->lease_id, a->lease_id, sizeof(ret->lease_id));
  ret->state = a->state;
  ret->agreed = a->agreed;
  ret->accepted_at_ms = a->accepted_at_ms;
  ret->released_at_ms = a->released_at_ms;
  ret->attempts = g->slot_tries[i];
  memcpy(ret->reason, a->reason, sizeof(ret->reason));
  return 0;
}

int gn_gang_lookup(const gn_gang *g, const char *lease_id, size_t *ret_member) {
  if (!g || !lease_id)
    return GN_EINVAL;
  const gang_att *a = find_att((gn_gang *)g, lease_id);
  if (!a)
    return GN_ENOTFOUND;
  if (ret_member)
    *ret_member = a->slot;
  return 0;
}

/* --- persistence ----------------------------------------------------------
 *
 * A fixed little-endian layout, version 1: "GNG1", the options, the seed
 * and id counter, phase, restarts used, reason, the slots, the attempts and
 * the spares. Restore checks every field before it builds anything. */

#define GANG_MAGIC "GNG1"

static int put(gn_buf *b, const void *p, size_t n) {
  return gn_buf_append(b, p, n);
}

static int put_u64(gn_buf *b, uint64_t v) {
  uint8_t x[8];
  for (int i = 0; i < 8; i++)
    x[i] = (uint8_t)(v >> (8 * i));
  return put(b, x, 8);
}

static int put_offer(gn_buf *b, const gn_gang_offer *o) {
  int r;
  if ((r = put(b, o->provider, GN_PK_LEN)) < 0 || (r = put(b, o->offer_id, sizeof(o->offer_id))) < 0 ||
      (r = put_u64(b, o->gpus)) < 0 || (r = put_u64(b, o->price_uper_hour)) < 0)
    return r;
  return 0;
}

int gn_gang_save(const gn_gang *g, gn_buf *ret) {
  if (!g || !ret)
    return GN_EINVAL;
  gn_buf b = {0};
  int r;
  if ((r = put(&b, GANG_MAGIC, 4)) < 0 || (r = put_u64(&b, g->opts.answer_timeout_ms)) < 0 ||
      (r = put_u64(&b, g->opts.restarts)) < 0 || (r = put_u64(&b, g->opts.max_total_uper_hour)) < 0 ||
      (r = put(&b, g->seed, sizeof(g->seed))) < 0 || (r = put_u64(&b, g->id_counter)) < 0 ||
      (r = put_u64(&b, (uint64_t)g->phase)) < 0 || (r = put_u64(&b, g->restarts_used)) < 0 ||
      (r = put(&b, g->reason, sizeof(g->reason))) < 0 || (r = put_u64(&b, g->n)) < 0 ||
      (r = put_u64(&b, g->n_att)) < 0 || (r = put_u64(&b, g->n_spares)) < 0)
    goto fail;
  for (uint32_t i = 0; i < g->n; i++)
    if ((r = put_u64(&b, g->slot_att[i])) < 0 || (r = put_u64(&b, g->slot_tries[i])) < 0)
      goto fail;
  for (uint32_t i = 0; i < g->n_att; i++) {
    const gang_att *a = &g->att[i];
    if ((r = put_offer(&b, &a->offer)) < 0 || (r = put(&b, a->lease_id, sizeof(a->lease_id))) < 0 ||
        (r = put_u64(&b, a->slot)) < 0 || (r = put_u64(&b, (uint64_t)a->state)) < 0 ||
        (r = put_u64(&b, a->agreed)) < 0 || (r = put(&b, a->reason, sizeof(a->reason))) < 0)
      goto fail;
  }
  for (uint32_t i = 0; i < g->n_spares; i++)
    if ((r = put_offer(&b, &g->spare[i])) < 0 || (r = put_u64(&b, g->spare_used[i])) < 0)
      goto fail;
  gn_buf_done(ret);
  *ret = b;
  return 0;
fail:
  gn_buf_done(&b);
  return r;
}

typedef struct rd {
  const uint8_t *p;
  size_t left;
  bool bad;
} rd;

static void get(rd *d, void *out, size_t n) {
  if (d->bad || d->left < n) {
    d->bad = true;
    memset(out, 0, n);
    return;
  }
  memcpy(out, d->p, n);
  d->p += n;
  d->left -= n;
}

static uint64_t get_u64(rd *d, uint64_t max) {
  uint8_t x[8];
  uint64_t v = 0;
  get(d, x, 8);
  for (int i = 7; i >= 0; i--)
    v = v << 8 | x[i];
  if (v > max)
    d->bad = true;
  return v;
}

/* A fixed text field must be terminated and printable. */
static void get_text(rd *d, char *out, size_t n) {
  get(d, out, n);
  size_t len = strnlen(out, n);
  if (len == n)
    d->bad = true;
  for (size_t i = 0; i < len && !d->bad; i++)
    if (out[i] < 0x20 || out[i] > 0x7e)
      d->bad = true;
}

static void get_offer(rd *d, gn_gang_offer *o) {
  memset(o, 0, sizeof(*o));
  get(d, o->provider, GN_PK_LEN);
  get_text(d, o->offer_id, sizeof(o->offer_id));
  o->gpus = (uint32_t)get_u64(d, GN_LEASE_MAX_GPUS);
  o->price_uper_hour = get_u64(d, UINT64_MAX);
  uint64_t c;
  if (!d->bad && (!offer_ok(o) || !offer_cost(o, &c)))
    d->bad = true;
}

static bool lease_id_ok(const char *id) {
  if (strlen(id) != 18 || memcmp(id, "l-", 2) != 0)
    return false;
  for (size_t i = 2; i < 18; i++)
    if (!strchr("0123456789abcdef", id[i]))
      return false;
  return true;
}

int gn_gang_restore(const uint8_t *state, size_t len, uint64_t now_ms, gn_gang **ret, gn_gang_out *out) {
  if (!state || !ret || !out)
    return GN_EINVAL;
  out_reset(out);
  gn_gang *g = calloc(1, sizeof(*g));
  if (!g)
    return GN_ENOMEM;
  rd d = {state, len, false};
  char magic[4];
  get(&d, magic, 4);
  if (memcmp(magic, GANG_MAGIC, 4) != 0)
    d.bad = true;
  g->opts.answer_timeout_ms = get_u64(&d, GN_GANG_TIMEOUT_MAX_MS);
  g->opts.restarts = (uint32_t)get_u64(&d, UINT32_MAX);
  g->opts.max_total_uper_hour = get_u64(&d, UINT64_MAX);
  get(&d, g->seed, sizeof(g->seed));
  g->id_counter = get_u64(&d, UINT64_MAX);
  g->phase = (int)get_u64(&d, GN_GANG_ENDED);
  g->restarts_used = (uint32_t)get_u64(&d, g->opts.restarts);
  get_text(&d, g->reason, sizeof(g->reason));
  g->n = (uint32_t)get_u64(&d, GN_GANG_MAX_MEMBERS);
  g->n_att = (uint32_t)get_u64(&d, GN_GANG_MAX_ATTEMPTS);
  g->n_spares = (uint32_t)get_u64(&d, GN_GANG_MAX_SPARES);
  if (g->opts.answer_timeout_ms < GN_GANG_TIMEOUT_MIN_MS || g->phase < GN_GANG_FORMING || g->n == 0 ||
      g->n_att < g->n || g->n_att > g->n + g->n_spares)
    d.bad = true;
  for (uint32_t i = 0; i < g->n && !d.bad; i++) {
    g->slot_att[i] = (uint32_t)get_u64(&d, g->n_att - 1);
    g->slot_tries[i] = (uint32_t)get_u64(&d, g->n_att);
  }
  for (uint32_t i = 0; i < g->n_att && !d.bad; i++) {
    gang_att *a = &g->att[i];
    get_offer(&d, &a->offer);
    get_text(&d, a->lease_id, sizeof(a->lease_id));
    a->slot = (uint32_t)get_u64(&d, g->n - 1);
    a->state = (int)get_u64(&d, GN_GANG_M_ABANDONED);
    a->agreed = get_u64(&d, 1) != 0;
    get_text(&d, a->reason, sizeof(a->reason));
    if (!d.bad && (a->state < GN_GANG_M_REQUESTED || !lease_id_ok(a->lease_id)))
      d.bad = true;
    for (uint32_t j = 0; j < i && !d.bad; j++)
      if (strcmp(g->att[j].lease_id, a->lease_id) == 0)
        d.bad = true;
  }
  for (uint32_t i = 0; i < g->n_spares && !d.bad; i++) {
    get_offer(&d, &g->spare[i]);
    g->spare_used[i] = get_u64(&d, 1) != 0;
  }
  for (uint32_t i = 0; i < g->n && !d.bad; i++) {
    const gang_att *a = &g->att[g->slot_att[i]];
    if (a->slot != i || (g->phase == GN_GANG_READY && a->state != GN_GANG_M_AGREED))
      d.bad = true;
  }
  /* Only a current lease can be agreed or asked for, and none once the
   * gang is over. */
  for (uint32_t i = 0; i < g->n_att && !d.bad; i++) {
    const gang_att *a = &g->att[i];
    bool live = a->state == GN_GANG_M_AGREED || a->state == GN_GANG_M_REQUESTED;
    if (live && (!is_current(g, a) || g->phase == GN_GANG_FAILED || g->phase == GN_GANG_ENDED))
      d.bad = true;
  }
  if (d.bad || d.left != 0) {
    free(g);
    return GN_EINVAL;
  }
  /* Deadlines are on the monotonic clock of the process that crashed, and
   * the ranks stopped with it: a gang that was not running is not resumed.
   * All or nothing holds across the crash: every lease it agreed is
   * released now. A running one stays READY (the glue reconciles its jobs
   * as for any lease); an ended one still releases late agreements. */
  for (uint32_t i = 0; i < g->n_att; i++)
    g->att[i].deadline_ms = now_ms;
  if (forming(g))
    finish(g, now_ms, true, "the requester restarted before every member agreed", out);
  set_timer(g, out);
  *ret = g;
  return 0;
}
