/* A deterministic simulator of one lease: the provider's and the
 * requester's machines (include/gpunet/lease.h) over a link that loses,
 * delays, duplicates and reorders messages and partitions, with crashes of
 * either side (restart from the persisted state and, for the provider, the
 * ledger; a crash may also fall between two actions, or between a ledger
 * write and its report), clocks with offsets and drift, a provider loop that
 * runs timers late (catch-ups), and a release, a stop by the provider or the
 * expiry. Everything comes from one seed: identities, scenario, link.
 *
 * Invariants, checked as the run goes and at its end:
 *  I1 never a second billed twice: the notes the requester accepted form one
 *     chain (seq 1, 2, ... each from = previous seconds + 1), and the final
 *     invoice it countersigned continues the last of them, so every accepted
 *     note is a prefix of the final invoice; every billed second is the
 *     ledger's second (same chain head); the provider's vouchers are notes
 *     the requester accepted; every final invoice the provider issues
 *     continues the last note the provider saw accepted.
 *  I2 never more billed than observed: anything the requester accepts bills
 *     at most its true observation (from receipt of the agreement to the end
 *     it learned of) + gn_bill_tolerance_s + 1 s (whole-second clocks), is
 *     within its spending cap, and is a note the provider's machine issued
 *     (never a forged one).
 *  I3 a stopped lease stops billing: no tick is asked for after the
 *     provider's END, a release that reaches an active provider ends it at
 *     once, and the final invoice bills no second after the END (it may
 *     leave out trailing seconds of no GPU, nothing else).
 *  I4 credit control: a note unanswered for more than 2 * interval_s, or a
 *     requester unreachable for more than 2 * interval_s, ends the lease
 *     within that + 1 s (the stated slack; + the loop's stall in scenarios
 *     that stall it) of the provider's clock.
 *  I5 metering schedule: second i is asked for only once the provider's
 *     monotonic clock says i whole seconds passed (since the start, or since
 *     a restart that accounted for the seconds its UTC says passed).
 *  I6 liveness: once the link heals and both run, the lease settles: both
 *     sides hold the same final invoice, countersigned or rejected alike; on
 *     a clean link (no loss, fault or cap) nothing at all is rejected.
 * Plus adversaries: a provider whose meter runs fast or that forges notes
 * billing more than passed (never accepted beyond I2, and caught), an honest
 * provider whose UTC clock is off by minutes (never rejected, even across a
 * requester restart), and a requester that never answers (stopped by I4).
 *
 * GN_SIM_SEEDS=N runs N random seeds from GN_SIM_FIRST_SEED (default 1):
 * 3000 by default (about 6 s here, Debug or Release: signing dominates),
 * 1000 in a sanitizer build (about 3.5 s, the fixed scenarios included, so
 * the ASan+UBSan suite stays well under a minute);
 * GN_SIM_SEED=S runs only seed S (a failure prints it); GN_SIM_VERBOSE=1
 * traces every event; GN_SIM_REASONS=1 prints why final invoices were
 * rejected; GN_SIM_BENCH=1 runs the random seeds (2000, or GN_SIM_SEEDS)
 * and prints seeds per second (scripts/bench/billing). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
/* cmocka needs the above first. */
#include <cmocka.h>

#include "billing/lease_helpers.h"

#include <inttypes.h>
#include <time.h>

#if defined(__SANITIZE_ADDRESS__)
#define SIM_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define SIM_SANITIZED 1
#endif
#endif
#ifndef SIM_SANITIZED
#define SIM_SANITIZED 0
#endif

#define SIM_DEFAULT_SEEDS (SIM_SANITIZED ? 1000u : 3000u)
#define SIM_EPOCH_S 1764670000LL
#define SIM_MAX_MSGS 2048
#define SIM_MAX_EVENTS 64
#define SIM_MAX_STEPS 400000u
#define SIM_SLACK_MS 1000u /* I4's stated slack */

enum { P = 0, R = 1 };
enum { MSG_ENV = 1, MSG_RELEASE, MSG_END };
enum { EV_CRASH = 1, EV_RESTART, EV_PART_START, EV_PART_END, EV_RELEASE, EV_STOP, EV_FORGE, EV_HEAL };

typedef struct sim_cfg {
  uint64_t seed;
  uint32_t interval_s, count;
  uint64_t max_s, price, max_spend;
  uint32_t loss_pm, dup_pm, delay_min_ms, delay_max_ms;
  uint32_t stall_pm, stall_max_ms; /* the provider's loop runs a timer late (a catch-up follows) */
  int64_t utc_off_ms[2];
  uint64_t rate_ppm[2]; /* monotonic clock speed, 1000000 = true */
  bool silent;          /* the requester never answers */
  bool overbill;        /* the provider's meter runs fast, or it forges notes (EV_FORGE) */
  bool honest_clean;    /* no loss, no fault that can delay past the tolerance: expect no rejection at all */
  uint64_t release_ms;  /* UINT64_MAX: never (expiry) */
  uint64_t heal_ms;     /* from here the link is perfect and both run */
} sim_cfg;

typedef struct sim_ev {
  uint64_t at;
  int kind, who;
  bool in_actions; /* EV_CRASH: the crash falls inside the next action list */
} sim_ev;

typedef struct sim_msg {
  uint64_t at;
  int to, kind;
  uint64_t epoch;
  gn_buf data;
} sim_msg;

typedef struct sim_node {
  bool exists, alive, crash_armed;
  uint64_t t0, base; /* mono(t) = base + (t - t0) * rate / 1e6 */
  uint64_t timer;    /* mono ms, UINT64_MAX none */
  gn_buf state;
} sim_node;

typedef struct sim_stats {
  uint64_t seeds, notes_accepted, notes_rejected, invoices_accepted, invoices_rejected, unpaid_ends, unreachable_ends,
      crashes, steps, rej_cap, rej_observed, rej_other, forged, catchups;
} sim_stats;

typedef struct sim {
  sim_cfg c;
  uint64_t rng;
  bool verbose;
  char why[512];
  bool failed;
  uint64_t t; /* true ms */
  gn_identity *pid, *rid;
  gn_buf ag;
  gn_lease_prov *pm;
  gn_lease_req *rm;
  sim_node n[2];
  bool link_up, healed, session_up;
  uint64_t epoch;
  sim_msg msgs[SIM_MAX_MSGS];
  size_t n_msgs;
  sim_ev ev[SIM_MAX_EVENTS];
  size_t n_ev, next_ev;
  bool release_pending, release_requested, release_durable;

  /* provider's ledger (durable) and what the provider did */
  gn_buf ledger;
  bool p_ended;
  uint64_t p_end_t, p_end_ticks;
  gn_bill_head p_head; /* after the last voucher the provider got */
  uint8_t p_inv_hash[32];
  bool p_has_inv, p_settled, p_settled_acc;
  int64_t p_start_s;
  uint64_t p_stall_ms;              /* the next provider timer runs this late */
  uint64_t sched_ticks, sched_mono; /* I5: seconds accounted for at the incarnation's start */
  /* I4 */
  bool unacc;
  uint64_t unacc_mono;
  bool p_peer_up;
  uint64_t p_down_mono;
  uint8_t seen_notes[512][32]; /* every note the provider's machine sent */
  size_t n_seen;

  /* requester */
  uint64_t r_recv_t, r_stop_t;
  bool r_stopped;
  gn_bill_head r_head; /* after the last note the requester accepted */
  uint8_t r_acc[256][32];
  size_t n_r_acc;
  bool r_settled, r_settled_acc;
  uint8_t r_inv_hash[32];
  uint64_t r_final_seconds;
  uint8_t r_final_chain[32];

  sim_stats st;
} sim;

/* --- randomness (splitmix64: the whole run follows from the seed) ----------*/

static uint64_t rnd64(sim *s) {
  uint64_t z = (s->rng += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

static uint64_t rnd(sim *s, uint64_t n) {
  return n ? rnd64(s) % n : 0;
}

static bool chance_pm(sim *s, uint32_t pm) {
  return rnd(s, 1000) < pm;
}

/* --- failures and tracing ---------------------------------------------------*/

static void fail_at(sim *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void fail_at(sim *s, const char *fmt, ...) {
  if (s->failed)
    return;
  s->failed = true;
  char msg[400];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof(msg), fmt, ap);
  va_end(ap);
  snprintf(s->why, sizeof(s->why), "t=%" PRIu64 " ms: %s", s->t, msg);
}

#define CHECK(s, cond, ...)                                                                                            \
  do {                                                                                                                 \
    if (!(cond))                                                                                                       \
      fail_at(s, __VA_ARGS__);                                                                                         \
  } while (0)

static void trace(sim *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void trace(sim *s, const char *fmt, ...) {
  if (!s->verbose)
    return;
  va_list ap;
  fprintf(stderr, "[%8" PRIu64 "] ", s->t);
  va_start(ap, fmt);
  vfprintf(stderr, fmt, ap);
  va_end(ap);
  fputc('\n', stderr);
}

/* --- clocks -----------------------------------------------------------------*/

static uint64_t mono_of(const sim *s, int who) {
  const sim_node *n = &s->n[who];
  return n->base + (s->t - n->t0) * s->c.rate_ppm[who] / 1000000u;
}

static int64_t utc_of(const sim *s, int who) {
  return SIM_EPOCH_S + ((int64_t)s->t + s->c.utc_off_ms[who]) / 1000;
}

static gn_lease_now now_of(const sim *s, int who) {
  return lh_now(mono_of(s, who), utc_of(s, who));
}

/* The true time at which node who's monotonic clock reaches m. */
static uint64_t true_of(const sim *s, int who, uint64_t m) {
  const sim_node *n = &s->n[who];
  if (m == UINT64_MAX)
    return UINT64_MAX;
  if (m <= n->base)
    return n->t0;
  uint64_t d = m - n->base, rate = s->c.rate_ppm[who];
  return n->t0 + (d * 1000000u + rate - 1) / rate;
}

/* --- the link ---------------------------------------------------------------*/

static void send_msg(sim *s, int to, int kind, const uint8_t *p, size_t len) {
  if (!s->session_up) {
    trace(s, "%s -> dropped (no session)", to == P ? "R" : "P");
    return;
  }
  int copies = 1;
  if (!s->healed && chance_pm(s, s->c.loss_pm))
    copies = 0;
  if (!s->healed && chance_pm(s, s->c.dup_pm))
    copies++;
  for (int i = 0; i < copies && s->n_msgs < SIM_MAX_MSGS; i++) {
    sim_msg *m = &s->msgs[s->n_msgs++];
    memset(m, 0, sizeof(*m));
    uint64_t span = s->c.delay_max_ms - s->c.delay_min_ms;
    m->at = s->t + s->c.delay_min_ms + (s->healed ? 0 : rnd(s, span + 1));
    m->to = to;
    m->kind = kind;
    m->epoch = s->epoch;
    if (gn_buf_append(&m->data, p, len) < 0)
      fail_at(s, "out of memory");
  }
  trace(s, "%s -> %s kind %d (%zu bytes) x%d", to == P ? "R" : "P", to == P ? "P" : "R", kind, len, copies);
}

static void prov_peer(sim *s, bool up);
static void req_peer(sim *s, bool up);

/* A session exists while the link is up and both processes run. Messages
 * in flight when it breaks are lost (the epoch changes). */
static void session_update(sim *s) {
  bool up = s->link_up && s->n[P].alive && s->n[R].alive && s->n[R].exists;
  if (up == s->session_up)
    return;
  s->session_up = up;
  s->epoch++;
  trace(s, "session %s", up ? "up" : "down");
  if (s->n[P].alive)
    prov_peer(s, up);
  if (s->n[R].alive && s->n[R].exists)
    req_peer(s, up);
}

/* --- the provider's glue ----------------------------------------------------*/

static bool seen_note(sim *s, const uint8_t h[32]) {
  for (size_t i = 0; i < s->n_seen; i++)
    if (memcmp(s->seen_notes[i], h, 32) == 0)
      return true;
  if (s->n_seen < GN_ARRAY_SIZE(s->seen_notes))
    memcpy(s->seen_notes[s->n_seen++], h, 32);
  return false;
}

static void prov_crash(sim *s);
static void prov_out(sim *s, const gn_lease_out *o);

static void prov_write(sim *s, const gn_lease_action *a) {
  uint64_t have = s->ledger.len / 2, mono = mono_of(s, P);
  CHECK(s, !s->p_ended, "I3: the provider asked for ticks %" PRIu64 "..%" PRIu64 " after its END", a->from, a->to);
  CHECK(s, a->from == have + 1 && a->to >= a->from, "ticks %" PRIu64 "..%" PRIu64 " asked with %" PRIu64 " written",
        a->from, a->to, have);
  CHECK(s, a->to <= s->c.max_s, "I5: tick %" PRIu64 " beyond max_s", a->to);
  if (!a->idle)
    CHECK(s, a->to <= s->sched_ticks + (mono - s->sched_mono) / 1000u,
          "I5: tick %" PRIu64 " asked before its second passed (%" PRIu64 " + %" PRIu64 " ms)", a->to, s->sched_ticks,
          mono - s->sched_mono);
  else
    CHECK(s, a->to <= s->sched_ticks, "I5: idle tick %" PRIu64 " beyond the restart's gap", a->to);
  if (s->failed)
    return;
  uint64_t n = a->to - a->from + 1;
  s->st.catchups += !a->idle && n > 1;
  for (uint64_t k = 0; k < n; k++) {
    uint8_t t[2] = {a->idle ? 0 : (uint8_t)s->c.count, (uint8_t)rnd(s, 101)};
    gn_buf_append(&s->ledger, t, 2);
  }
  trace(s, "P writes %s%" PRIu64 "..%" PRIu64, a->idle ? "idle " : "", a->from, a->to);
  /* A crash after the durable write, before the report. */
  if (s->n[P].crash_armed && chance_pm(s, 300)) {
    prov_crash(s);
    return;
  }
  gn_lease_out o = {0};
  int r = gn_lease_prov_ticks(s->pm, now_of(s, P), a->from, s->ledger.data + (a->from - 1) * 2, n, &o);
  CHECK(s, r == 0, "gn_lease_prov_ticks: %s", gn_strerror(r));
  prov_out(s, &o);
  gn_lease_out_done(&o);
}

static void prov_out(sim *s, const gn_lease_out *o) {
  /* This call's timer; a nested call (WRITE_TICKS -> ticks) replaces it. */
  s->n[P].timer = o->timer_at_ms;
  s->p_stall_ms = !s->healed && chance_pm(s, s->c.stall_pm) ? rnd(s, (uint64_t)s->c.stall_max_ms + 1) : 0;
  for (size_t i = 0; i < o->n && !s->failed && s->n[P].alive; i++) {
    const gn_lease_action *a = &o->act[i];
    if (s->n[P].crash_armed && chance_pm(s, 250)) {
      prov_crash(s); /* between two actions: the rest never happens */
      return;
    }
    switch (a->kind) {
    case GN_LEASE_ACT_PERSIST:
      s->n[P].state.len = 0;
      gn_buf_append(&s->n[P].state, a->data, a->len);
      break;
    case GN_LEASE_ACT_SEND: {
      gn_envelope e;
      CHECK(s, s->p_peer_up, "the provider sent while it knows the peer is down");
      if (gn_envelope_open(a->data, a->len, &e) == 0 && e.type == GN_MSG_DEBIT_NOTE) {
        uint8_t h[32];
        gn_bill_hash(a->data, a->len, h);
        if (!seen_note(s, h) && !s->unacc) {
          s->unacc = true;
          s->unacc_mono = mono_of(s, P);
        }
      }
      send_msg(s, R, MSG_ENV, a->data, a->len);
      break;
    }
    case GN_LEASE_ACT_WRITE_TICKS:
      prov_write(s, a);
      break;
    case GN_LEASE_ACT_VOUCHER: {
      gn_bill_head next;
      char reason[256] = "";
      uint8_t h[32];
      gn_bill_hash(a->data, a->len, h);
      if (memcmp(h, s->p_head.note_hash, 32) == 0)
        break; /* emitted again after a restart */
      int r =
          gn_bill_note_open(a->data, a->len, s->ag.data, s->ag.len, &s->p_head, &next, NULL, reason, sizeof(reason));
      CHECK(s, r == 0, "I1: a voucher the provider got does not continue its last one: %s", reason);
      bool known = false;
      for (size_t k = 0; k < s->n_r_acc; k++)
        known |= memcmp(s->r_acc[k], next.note_hash, 32) == 0;
      CHECK(s, known, "I1: the provider holds a voucher for a note the requester never accepted");
      s->p_head = next;
      s->unacc = false;
      trace(s, "P voucher seq %" PRIu64 " %" PRIu64 " s", next.seq, next.seconds);
      break;
    }
    case GN_LEASE_ACT_END:
      CHECK(s, !s->p_ended, "the provider ended twice");
      s->p_ended = true;
      s->p_end_t = s->t;
      s->p_end_ticks = s->ledger.len / 2;
      if (strstr(a->reason, "unpaid"))
        s->st.unpaid_ends++;
      if (strstr(a->reason, "unreachable"))
        s->st.unreachable_ends++;
      trace(s, "P END (%s) at %" PRIu64 " s", a->reason, s->p_end_ticks);
      send_msg(s, R, MSG_END, (const uint8_t *)a->reason, strlen(a->reason));
      break;
    case GN_LEASE_ACT_INVOICE: {
      gn_bill_head fin;
      gn_bill_note note;
      char reason[256] = "";
      int r =
          gn_bill_note_open(a->data, a->len, s->ag.data, s->ag.len, &s->p_head, &fin, &note, reason, sizeof(reason));
      CHECK(s, r == 0 && note.final, "I1: the final invoice does not continue the last accepted note: %s", reason);
      CHECK(s, r != 0 || note.seconds <= s->p_end_ticks,
            "I3: the final invoice bills %" PRIu64 " s, %" PRIu64 " were metered at the end", note.seconds,
            s->p_end_ticks);
      /* Only seconds of no GPU may be left out (they cost nothing). */
      for (uint64_t k = note.seconds; r == 0 && k < s->p_end_ticks && k < s->ledger.len / 2; k++)
        CHECK(s, s->ledger.data[2 * k] == 0, "I3: the final invoice leaves out second %" PRIu64 " that had GPUs",
              k + 1);
      gn_bill_hash(a->data, a->len, s->p_inv_hash);
      s->p_has_inv = true;
      trace(s, "P invoice %" PRIu64 " s", note.seconds);
      break;
    }
    case GN_LEASE_ACT_SETTLED:
      CHECK(s, !s->p_settled || s->p_settled_acc == a->accepted, "the provider's verdict changed");
      s->p_settled = true;
      s->p_settled_acc = a->accepted;
      trace(s, "P settled: %s %s", a->accepted ? "countersigned" : "rejected", a->reason);
      break;
    case GN_LEASE_ACT_REJECTED:
      trace(s, "P got a rejection: %s", a->reason);
      break;
    default:
      fail_at(s, "the provider emitted action %d", a->kind);
    }
  }
  if (s->n[P].crash_armed && s->n[P].alive)
    prov_crash(s);
}

static void prov_peer(sim *s, bool up) {
  gn_lease_out o = {0};
  s->p_peer_up = up;
  if (!up)
    s->p_down_mono = mono_of(s, P);
  int r = gn_lease_prov_peer(s->pm, now_of(s, P), up, &o);
  CHECK(s, r == 0, "gn_lease_prov_peer: %s", gn_strerror(r));
  prov_out(s, &o);
  gn_lease_out_done(&o);
}

static void prov_crash(sim *s) {
  trace(s, "P crashes");
  s->st.crashes++;
  s->pm = gn_lease_prov_free(s->pm);
  s->n[P].alive = false;
  s->n[P].crash_armed = false;
  s->n[P].timer = UINT64_MAX;
  session_update(s);
}

static void prov_restart(sim *s) {
  gn_lease_state_info si;
  gn_lease_out o = {0};
  sim_node *n = &s->n[P];
  n->alive = true;
  n->t0 = s->t;
  n->base = 1000 + rnd(s, 1000000); /* a new boot: another monotonic origin */
  CHECK(s, gn_lease_state_peek(n->state.data, n->state.len, &si) == 0 && si.provider, "provider state unreadable");
  if (s->failed)
    return;
  uint64_t have = s->ledger.len / 2;
  CHECK(s, si.ticks_from >= 1 && si.ticks_from - 1 <= have, "state needs ticks from %" PRIu64 ", ledger has %" PRIu64,
        si.ticks_from, have);
  if (s->failed)
    return;
  s->p_peer_up = false;
  s->p_down_mono = mono_of(s, P);
  int r = gn_lease_prov_restore(s->pid, s->ag.data, s->ag.len, n->state.data, n->state.len,
                                s->ledger.data + (si.ticks_from - 1) * 2, have - (si.ticks_from - 1), now_of(s, P),
                                &s->pm, &o);
  CHECK(s, r == 0, "gn_lease_prov_restore: %s", gn_strerror(r));
  if (s->failed)
    return;
  /* I5: from here second i is due once the new clock says so, after the
   * seconds its UTC says passed since the start. */
  int64_t e = utc_of(s, P) - s->p_start_s;
  uint64_t elapsed = e < 0 ? 0 : (uint64_t)e;
  if (elapsed > s->c.max_s)
    elapsed = s->c.max_s;
  s->sched_ticks = elapsed > have ? elapsed : have;
  s->sched_mono = mono_of(s, P);
  gn_lease_info info;
  gn_lease_prov_info(s->pm, &info);
  s->unacc = info.pending > 0;
  s->unacc_mono = mono_of(s, P);
  if (info.phase != GN_LEASE_PHASE_ACTIVE && !s->p_ended && lh_count(&o, GN_LEASE_ACT_END) == 0) {
    /* It crashed between persisting the end and the END action. */
    s->p_ended = true;
    s->p_end_t = s->t;
    s->p_end_ticks = info.seconds;
  }
  trace(s, "P restarts (%s, %" PRIu64 " s in the ledger, %" PRIu64 " pending)",
        info.phase == GN_LEASE_PHASE_ACTIVE ? "active" : "ended", have, info.pending);
  prov_out(s, &o);
  gn_lease_out_done(&o);
  session_update(s);
}

/* --- the requester's glue ---------------------------------------------------*/

static void req_crash(sim *s);

/* I2: what the requester really observed at the true time now. */
static uint64_t true_observed(const sim *s) {
  uint64_t end = s->r_stopped ? s->r_stop_t : s->t;
  return end > s->r_recv_t ? (end - s->r_recv_t) / 1000u : 0;
}

static void req_accepted_bill(sim *s, const uint8_t *env, size_t len, bool final) {
  gn_bill_head next;
  gn_bill_note note;
  char reason[256] = "";
  uint8_t h[32];
  gn_bill_hash(env, len, h);
  if (!final && memcmp(h, s->r_head.note_hash, 32) == 0)
    return; /* emitted again after a restart */
  if (!final) {
    bool issued = false;
    for (size_t i = 0; i < s->n_seen && !issued; i++)
      issued = memcmp(s->seen_notes[i], h, 32) == 0;
    CHECK(s, issued, "I2: the requester accepted a note the provider's machine never issued (a forged one)");
  }
  int r = gn_bill_note_open(env, len, s->ag.data, s->ag.len, &s->r_head, &next, &note, reason, sizeof(reason));
  CHECK(s, r == 0 && note.final == final, "I1: the requester accepted a %s that does not continue its last: %s",
        final ? "final invoice" : "note", reason);
  if (r != 0)
    return;
  uint64_t obs = true_observed(s);
  CHECK(s, note.seconds <= obs + gn_bill_tolerance_s(obs) + 1,
        "I2: accepted %" PRIu64 " s with %" PRIu64 " s observed (tolerance %" PRIu64 ")", note.seconds, obs,
        gn_bill_tolerance_s(obs));
  CHECK(s, s->c.max_spend == 0 || note.total_micro <= s->c.max_spend,
        "spending cap: accepted %" PRIu64 " over %" PRIu64, note.total_micro, s->c.max_spend);
  if (final) {
    s->r_final_seconds = note.seconds;
    memcpy(s->r_final_chain, note.chain_head, 32);
  } else {
    s->r_head = next;
    if (s->n_r_acc < GN_ARRAY_SIZE(s->r_acc))
      memcpy(s->r_acc[s->n_r_acc++], next.note_hash, 32);
    else
      fail_at(s, "too many notes for the simulator's record");
  }
}

static void req_out(sim *s, const gn_lease_out *o) {
  s->n[R].timer = o->timer_at_ms;
  for (size_t i = 0; i < o->n && !s->failed && s->n[R].alive; i++) {
    const gn_lease_action *a = &o->act[i];
    if (s->n[R].crash_armed && chance_pm(s, 250)) {
      req_crash(s);
      return;
    }
    switch (a->kind) {
    case GN_LEASE_ACT_PERSIST:
      s->n[R].state.len = 0;
      gn_buf_append(&s->n[R].state, a->data, a->len);
      s->release_durable |= s->release_requested;
      break;
    case GN_LEASE_ACT_SEND:
      if (!s->c.silent)
        send_msg(s, P, MSG_ENV, a->data, a->len);
      break;
    case GN_LEASE_ACT_RELEASE:
      send_msg(s, P, MSG_RELEASE, NULL, 0);
      break;
    case GN_LEASE_ACT_VOUCHER:
      req_accepted_bill(s, a->data, a->len, false);
      s->st.notes_accepted++;
      trace(s, "R accepts note seq %" PRIu64 " (%" PRIu64 " s)", s->r_head.seq, s->r_head.seconds);
      break;
    case GN_LEASE_ACT_END:
      if (!s->r_stopped) {
        s->r_stopped = true;
        s->r_stop_t = s->t;
      }
      trace(s, "R END (%s)", a->reason);
      break;
    case GN_LEASE_ACT_SETTLED:
      if (s->r_settled) {
        /* Only the same answer again (a restored machine re-emits it). */
        uint8_t h[32];
        gn_bill_hash(a->data, a->len, h);
        CHECK(s, memcmp(h, s->r_inv_hash, 32) == 0 && a->accepted == s->r_settled_acc,
              "the requester answered a second final invoice");
        break;
      }
      s->r_settled = true;
      s->r_settled_acc = a->accepted;
      gn_bill_hash(a->data, a->len, s->r_inv_hash);
      if (a->accepted) {
        req_accepted_bill(s, a->data, a->len, true);
        s->st.invoices_accepted++;
      } else {
        s->st.invoices_rejected++;
        if (strstr(a->reason, "spending cap"))
          s->st.rej_cap++;
        else if (strstr(a->reason, "observed"))
          s->st.rej_observed++;
        else
          s->st.rej_other++;
        if (getenv("GN_SIM_REASONS"))
          fprintf(stderr, "seed %" PRIu64 ": invoice rejected: %s\n", s->c.seed, a->reason);
      }
      trace(s, "R settles: %s %s", a->accepted ? "countersigned" : "rejected", a->reason);
      break;
    case GN_LEASE_ACT_REJECTED:
      s->st.notes_rejected++;
      trace(s, "R rejects a note: %s", a->reason);
      CHECK(s, !s->c.honest_clean, "an honest provider on a clean link got a note rejected: %s", a->reason);
      break;
    default:
      fail_at(s, "the requester emitted action %d", a->kind);
    }
  }
  if (s->n[R].crash_armed && s->n[R].alive)
    req_crash(s);
}

static void req_peer(sim *s, bool up) {
  gn_lease_out o = {0};
  int r = gn_lease_req_peer(s->rm, now_of(s, R), up, &o);
  CHECK(s, r == 0, "gn_lease_req_peer: %s", gn_strerror(r));
  req_out(s, &o);
  gn_lease_out_done(&o);
}

static void req_release(sim *s) {
  gn_lease_out o = {0};
  s->release_pending = false;
  s->release_requested = true;
  trace(s, "R releases");
  int r = gn_lease_req_release(s->rm, now_of(s, R), &o);
  CHECK(s, r == 0, "gn_lease_req_release: %s", gn_strerror(r));
  req_out(s, &o);
  gn_lease_out_done(&o);
}

static void req_crash(sim *s) {
  trace(s, "R crashes");
  if (s->release_requested && !s->release_durable)
    s->release_pending = true; /* the user's release was lost: tried again */
  s->st.crashes++;
  s->rm = gn_lease_req_free(s->rm);
  s->n[R].alive = false;
  s->n[R].crash_armed = false;
  s->n[R].timer = UINT64_MAX;
  session_update(s);
}

static void req_restart(sim *s) {
  gn_lease_out o = {0};
  sim_node *n = &s->n[R];
  n->alive = true;
  n->t0 = s->t;
  n->base = 1000 + rnd(s, 1000000);
  int r = gn_lease_req_restore(s->rid, s->ag.data, s->ag.len, n->state.data, n->state.len, now_of(s, R), &s->rm, &o);
  CHECK(s, r == 0, "gn_lease_req_restore: %s", gn_strerror(r));
  if (s->failed)
    return;
  trace(s, "R restarts");
  req_out(s, &o);
  gn_lease_out_done(&o);
  session_update(s);
  if (s->release_pending && s->n[R].alive)
    req_release(s);
}

/* --- delivery ---------------------------------------------------------------*/

static void deliver(sim *s, size_t idx) {
  sim_msg m = s->msgs[idx];
  s->msgs[idx] = s->msgs[--s->n_msgs];
  gn_lease_out o = {0};
  if (m.epoch != s->epoch || !s->session_up) {
    trace(s, "message to %s lost with its session", m.to == P ? "P" : "R");
    goto out;
  }
  if (m.to == P) {
    int r = 0;
    if (m.kind == MSG_ENV) {
      r = gn_lease_prov_recv(s->pm, now_of(s, P), m.data.data, m.data.len, &o);
      trace(s, "P receives a message: %d", r);
    } else if (m.kind == MSG_RELEASE) {
      gn_lease_info info;
      gn_lease_prov_info(s->pm, &info);
      r = gn_lease_prov_release(s->pm, now_of(s, P), &o);
      CHECK(s, r == 0, "gn_lease_prov_release: %s", gn_strerror(r));
      CHECK(s, info.phase != GN_LEASE_PHASE_ACTIVE || lh_count(&o, GN_LEASE_ACT_END) == 1,
            "I3: a release reached an active provider and did not end the lease");
    }
    prov_out(s, &o);
  } else {
    int r = 0;
    if (m.kind == MSG_ENV) {
      r = gn_lease_req_recv(s->rm, now_of(s, R), m.data.data, m.data.len, &o);
      trace(s, "R receives a message: %d", r);
    } else if (m.kind == MSG_END) {
      char reason[64];
      snprintf(reason, sizeof(reason), "%.*s", (int)(m.data.len < 60 ? m.data.len : 60), (const char *)m.data.data);
      r = gn_lease_req_ended(s->rm, now_of(s, R), reason, &o);
      CHECK(s, r == 0, "gn_lease_req_ended: %s", gn_strerror(r));
    }
    req_out(s, &o);
  }
out:
  gn_buf_done(&m.data);
  gn_lease_out_done(&o);
}

/* --- the scenario -----------------------------------------------------------*/

static void add_ev(sim *s, uint64_t at, int kind, int who, bool in_actions) {
  if (s->n_ev < SIM_MAX_EVENTS)
    s->ev[s->n_ev++] = (sim_ev){at, kind, who, in_actions};
}

static int ev_cmp(const void *a, const void *b) {
  const sim_ev *x = a, *y = b;
  if (x->at != y->at)
    return x->at < y->at ? -1 : 1;
  return x->kind - y->kind;
}

/* A random scenario from the seed. */
static void scenario_random(sim *s) {
  static const uint32_t intervals[] = {10, 10, 15, 20, 30, 60};
  sim_cfg *c = &s->c;
  c->interval_s = intervals[rnd(s, GN_ARRAY_SIZE(intervals))];
  c->max_s = c->interval_s + rnd(s, c->interval_s * 8 + 1);
  if (c->max_s > 600)
    c->max_s = 600;
  c->count = 1 + (uint32_t)rnd(s, 4);
  c->price = 1 + rnd(s, 20000000);
  bool clean = rnd(s, 4) == 0;
  if (!clean) {
    c->loss_pm = rnd(s, 3) == 0 ? 0 : (uint32_t)rnd(s, 300);
    c->dup_pm = (uint32_t)rnd(s, 150);
  }
  c->delay_min_ms = 1 + (uint32_t)rnd(s, 50);
  c->delay_max_ms = c->delay_min_ms + (uint32_t)rnd(s, clean ? 500 : (rnd(s, 4) == 0 ? 4000 : 800));
  if (rnd(s, 3) == 0) {
    c->stall_pm = 50 + (uint32_t)rnd(s, 300);
    c->stall_max_ms = 500 + (uint32_t)rnd(s, 4000);
  }
  c->utc_off_ms[P] = (int64_t)rnd(s, 1200001) - 600000;
  c->utc_off_ms[R] = (int64_t)rnd(s, 1200001) - 600000;
  c->rate_ppm[P] = 1000000 - 100 + rnd(s, 201);
  c->rate_ppm[R] = 1000000 - 100 + rnd(s, 201);
  uint64_t span = c->max_s * 1000;
  c->release_ms = rnd(s, 2) ? rnd(s, span) + 1 : UINT64_MAX;
  if (rnd(s, 5) == 0) {
    uint64_t full = gn_price_cost(c->price, c->count, c->max_s);
    c->max_spend = 1 + rnd(s, full + 1);
  }
  if (!clean) {
    /* Crashes of either side, partitions; each window closes before the
     * next opens (per side). */
    for (int who = 0; who < 2; who++) {
      uint64_t at = 0;
      unsigned k = (unsigned)rnd(s, 3);
      for (unsigned i = 0; i < k; i++) {
        at += 1 + rnd(s, span / 2 + 1);
        uint64_t down = 100 + rnd(s, (uint64_t)c->interval_s * 3000);
        add_ev(s, at, EV_CRASH, who, rnd(s, 2) == 0);
        add_ev(s, at + down, EV_RESTART, who, false);
        at += down;
      }
    }
    uint64_t at = 0;
    unsigned k = (unsigned)rnd(s, 3);
    for (unsigned i = 0; i < k; i++) {
      at += 1 + rnd(s, span / 2 + 1);
      uint64_t len = 100 + rnd(s, (uint64_t)c->interval_s * 3000);
      add_ev(s, at, EV_PART_START, 0, false);
      add_ev(s, at + len, EV_PART_END, 0, false);
      at += len;
    }
  }
  if (rnd(s, 15) == 0)
    add_ev(s, 1 + rnd(s, span), EV_STOP, P, false);
  if (rnd(s, 10) == 0) {
    /* A provider that also sends notes over-billing the requester. */
    unsigned k = 1 + (unsigned)rnd(s, 4);
    for (unsigned i = 0; i < k; i++)
      add_ev(s, 1 + rnd(s, span), EV_FORGE, P, false);
    clean = false;
  }
  /* A cap below the price of the tolerance (5 s) cannot be kept by any
   * provider: the lease is released at once and its first second is over. */
  c->honest_clean =
      clean && (c->max_spend == 0 || gn_price_cost(c->price, c->count, GN_BILL_TOLERANCE_S) <= c->max_spend);
}

static void sim_init(sim *s, uint64_t seed) {
  memset(s, 0, sizeof(*s));
  s->c.seed = seed;
  s->rng = seed * 0x2545f4914f6cdd1dull + 1;
  s->c.rate_ppm[P] = s->c.rate_ppm[R] = 1000000;
  s->c.delay_min_ms = 1;
  s->c.delay_max_ms = 200;
  s->c.interval_s = 10;
  s->c.max_s = 120;
  s->c.count = 1;
  s->c.price = 3600000;
  s->c.release_ms = UINT64_MAX;
  s->verbose = getenv("GN_SIM_VERBOSE") != NULL;
}

static void finish_events(sim *s) {
  uint64_t last = s->c.max_s * 1000 + 5000;
  for (size_t i = 0; i < s->n_ev; i++)
    if (s->ev[i].at > last)
      last = s->ev[i].at;
  if (s->c.release_ms != UINT64_MAX)
    add_ev(s, s->c.release_ms, EV_RELEASE, R, false);
  s->c.heal_ms = last + 1;
  add_ev(s, s->c.heal_ms, EV_HEAL, 0, false);
  qsort(s->ev, s->n_ev, sizeof(s->ev[0]), ev_cmp);
}

/* A dishonest provider (with its real key) sends a note continuing the
 * requester's head that bills more seconds than it observed. */
static void forge_note(sim *s) {
  if (!s->n[R].exists || !s->n[R].alive || !s->session_up || s->r_settled)
    return;
  /* More than it can have observed when the note arrives (the longest
   * delay later), by 2..31 s. */
  uint64_t obs = true_observed(s) + s->c.delay_max_ms / 1000u + 1;
  uint64_t total = obs + gn_bill_tolerance_s(obs) + 2 + rnd(s, 30);
  if (total > s->c.max_s || total <= s->r_head.seconds)
    return;
  uint64_t n = total - s->r_head.seconds;
  uint8_t *t = lh_ticks(n, (uint8_t)s->c.count);
  gn_buf env = {0};
  gn_bill_head next;
  if (t && gn_bill_note_seal(s->pid, s->ag.data, s->ag.len, &s->r_head, t, n, utc_of(s, P), &env, &next) == 0) {
    trace(s, "forged note of %" PRIu64 " s (observed %" PRIu64 ")", total, obs);
    s->st.forged++;
    send_msg(s, R, MSG_ENV, env.data, env.len);
  }
  free(t);
  gn_buf_done(&env);
}

static void do_event(sim *s, const sim_ev *e) {
  switch (e->kind) {
  case EV_CRASH:
    if (!s->n[e->who].alive || (e->who == R && !s->n[R].exists))
      break;
    if (e->in_actions)
      s->n[e->who].crash_armed = true; /* crashes inside its next action list */
    else if (e->who == P)
      prov_crash(s);
    else
      req_crash(s);
    break;
  case EV_RESTART:
    s->n[e->who].crash_armed = false;
    if (s->n[e->who].alive || (e->who == R && !s->n[R].exists))
      break;
    if (e->who == P)
      prov_restart(s);
    else
      req_restart(s);
    break;
  case EV_PART_START:
    trace(s, "partition");
    s->link_up = false;
    session_update(s);
    break;
  case EV_PART_END:
    s->link_up = true;
    session_update(s);
    break;
  case EV_RELEASE:
    if (s->n[R].alive && s->n[R].exists)
      req_release(s);
    else
      s->release_pending = true;
    break;
  case EV_FORGE:
    forge_note(s);
    break;
  case EV_STOP:
    /* The provider ends the lease itself (an operator, a shutdown). */
    if (s->n[P].alive) {
      gn_lease_out o = {0};
      trace(s, "P stops the lease");
      CHECK(s, gn_lease_prov_stop(s->pm, now_of(s, P), "operator", &o) == 0, "gn_lease_prov_stop");
      prov_out(s, &o);
      gn_lease_out_done(&o);
    }
    break;
  case EV_HEAL:
    trace(s, "heal");
    s->healed = true;
    s->n[P].crash_armed = s->n[R].crash_armed = false;
    s->link_up = true;
    if (!s->n[P].alive)
      prov_restart(s);
    if (!s->n[R].alive && s->n[R].exists)
      req_restart(s);
    session_update(s);
    if (s->n[R].alive && s->n[R].exists && !s->r_stopped)
      req_release(s); /* the user ends it if nothing else did */
    break;
  }
}

/* I4, checked after every step: a lease whose note stays unanswered, or
 * whose requester stays unreachable, for more than two intervals (+ the
 * slack) is no longer active. */
static void check_credit(sim *s) {
  if (!s->n[P].alive || s->p_ended)
    return;
  uint64_t mono = mono_of(s, P), lim = (uint64_t)s->c.interval_s * 2000u + SIM_SLACK_MS + s->c.stall_max_ms;
  CHECK(s, !s->unacc || mono - s->unacc_mono <= lim,
        "I4: a debit note unanswered for %" PRIu64 " ms and the lease still runs", mono - s->unacc_mono);
  CHECK(s, s->p_peer_up || mono - s->p_down_mono <= lim,
        "I4: the requester unreachable for %" PRIu64 " ms and the lease still runs", mono - s->p_down_mono);
}

static void sim_start(sim *s) {
  gn_lease_out o = {0};
  s->p_start_s = utc_of(s, P);
  lh_lease l = {s->c.count, s->c.price, s->c.max_s, s->c.interval_s, s->p_start_s, s->c.seed};
  s->pid = lh_identity(s->c.seed, 'p');
  s->rid = lh_identity(s->c.seed, 'r');
  if (!s->pid || !s->rid || lh_agreement(s->pid, s->rid, &l, &s->ag) < 0) {
    fail_at(s, "cannot make the agreement");
    return;
  }
  gn_bill_head_init(s->ag.data, s->ag.len, &s->p_head);
  s->r_head = s->p_head;
  s->link_up = true;
  s->n[P].alive = true;
  s->n[P].base = 1000 + rnd(s, 1000000);
  s->p_peer_up = true;
  s->sched_mono = s->n[P].base;
  int r = gn_lease_prov_new(s->pid, s->ag.data, s->ag.len, now_of(s, P), &s->pm, &o);
  CHECK(s, r == 0, "gn_lease_prov_new: %s", gn_strerror(r));
  if (r == 0)
    prov_out(s, &o);
  gn_lease_out_done(&o);
}

/* The agreement reaches the requester: it starts observing. */
static void req_start(sim *s) {
  gn_lease_out o = {0};
  sim_node *n = &s->n[R];
  n->exists = n->alive = true;
  n->t0 = s->t;
  n->base = 1000 + rnd(s, 1000000);
  s->r_recv_t = s->t;
  /* The session existed for the provider from the start: the new machine
   * takes its peer as up, so it is up here unless the link is not. */
  s->session_up = s->link_up && s->n[P].alive;
  int r = gn_lease_req_new(s->rid, s->ag.data, s->ag.len, s->c.max_spend, now_of(s, R), &s->rm, &o);
  CHECK(s, r == 0, "gn_lease_req_new: %s", gn_strerror(r));
  if (r == 0)
    req_out(s, &o);
  gn_lease_out_done(&o);
  if (!s->session_up && s->n[R].alive)
    req_peer(s, false);
}

/* Runs one scenario; 0 if every invariant held. */
static int sim_run(sim *s, sim_stats *st) {
  uint64_t agreement_at = s->c.delay_min_ms + rnd(s, 500);
  finish_events(s);
  sim_start(s);
  uint64_t horizon = s->c.heal_ms + 300000;
  uint64_t steps = 0;
  while (!s->failed) {
    /* The earliest of: the agreement's arrival, a scheduled event, a
     * message, either machine's timer. Ties in that order. */
    uint64_t t_ev = s->next_ev < s->n_ev ? s->ev[s->next_ev].at : UINT64_MAX;
    uint64_t t_ag = s->n[R].exists ? UINT64_MAX : agreement_at;
    size_t mi = SIZE_MAX;
    uint64_t t_msg = UINT64_MAX;
    for (size_t i = 0; i < s->n_msgs; i++)
      if (s->msgs[i].at < t_msg) {
        t_msg = s->msgs[i].at;
        mi = i;
      }
    uint64_t t_p = s->n[P].alive ? true_of(s, P, s->n[P].timer) : UINT64_MAX;
    if (t_p != UINT64_MAX)
      t_p += s->p_stall_ms;
    uint64_t t_r = s->n[R].alive && s->n[R].exists ? true_of(s, R, s->n[R].timer) : UINT64_MAX;
    uint64_t t = t_ag;
    int which = 0;
    if (t_ev < t)
      t = t_ev, which = 1;
    if (t_msg < t)
      t = t_msg, which = 2;
    if (t_p < t)
      t = t_p, which = 3;
    if (t_r < t)
      t = t_r, which = 4;
    if (t == UINT64_MAX || t > horizon)
      break;
    if (s->healed && s->p_settled && s->r_settled && s->n_msgs == 0)
      break;
    if (++steps > SIM_MAX_STEPS) {
      fail_at(s, "runaway: more than %u steps", SIM_MAX_STEPS);
      break;
    }
    if (t > s->t)
      s->t = t;
    gn_lease_out o = {0};
    switch (which) {
    case 0:
      trace(s, "agreement reaches R");
      req_start(s);
      break;
    case 1:
      do_event(s, &s->ev[s->next_ev++]);
      break;
    case 2:
      deliver(s, mi);
      break;
    case 3:
      CHECK(s, gn_lease_prov_timer(s->pm, now_of(s, P), &o) == 0, "gn_lease_prov_timer");
      prov_out(s, &o);
      break;
    case 4:
      CHECK(s, gn_lease_req_timer(s->rm, now_of(s, R), &o) == 0, "gn_lease_req_timer");
      req_out(s, &o);
      break;
    }
    gn_lease_out_done(&o);
    check_credit(s);
  }
  st->steps += steps;

  /* I6 and the end-of-run checks. */
  if (!s->failed && !s->c.silent) {
    CHECK(s, s->p_settled && s->r_settled, "I6: not settled after the link healed (provider %s, requester %s)",
          s->p_settled ? "settled" : "not settled", s->r_settled ? "settled" : "not settled");
    CHECK(s, !s->p_settled || !s->r_settled || memcmp(s->p_inv_hash, s->r_inv_hash, 32) == 0,
          "I6: the two sides settled different final invoices");
    CHECK(s, s->p_settled_acc == s->r_settled_acc, "I6: the two sides disagree on the verdict");
    CHECK(s, !s->c.honest_clean || s->r_settled_acc, "an honest provider on a clean link got its invoice rejected");
  }
  if (!s->failed && s->r_settled && s->r_settled_acc) {
    /* I1: the seconds billed are the ledger's, second for second. */
    gn_bill_head h0, fin;
    gn_buf env = {0};
    gn_bill_head_init(s->ag.data, s->ag.len, &h0);
    CHECK(s, s->r_final_seconds <= s->p_end_ticks, "I3: billed %" PRIu64 " s, %" PRIu64 " metered at the end",
          s->r_final_seconds, s->p_end_ticks);
    if (s->r_final_seconds > 0 && !s->failed) {
      int r = gn_bill_note_seal(s->pid, s->ag.data, s->ag.len, &h0, s->ledger.data, s->r_final_seconds, 0, &env, &fin);
      CHECK(s, r == 0 && memcmp(fin.chain_head, s->r_final_chain, 32) == 0,
            "I1: the countersigned seconds are not the ledger's");
    }
    gn_buf_done(&env);
  }
  st->seeds++;
  st->notes_accepted += s->st.notes_accepted;
  st->notes_rejected += s->st.notes_rejected;
  st->invoices_accepted += s->st.invoices_accepted;
  st->invoices_rejected += s->st.invoices_rejected;
  st->unpaid_ends += s->st.unpaid_ends;
  st->unreachable_ends += s->st.unreachable_ends;
  st->crashes += s->st.crashes;
  st->rej_cap += s->st.rej_cap;
  st->rej_observed += s->st.rej_observed;
  st->rej_other += s->st.rej_other;
  st->forged += s->st.forged;
  st->catchups += s->st.catchups;
  return s->failed ? -1 : 0;
}

static void sim_done(sim *s) {
  gn_lease_prov_free(s->pm);
  gn_lease_req_free(s->rm);
  gn_identity_free(s->pid);
  gn_identity_free(s->rid);
  gn_buf_done(&s->ag);
  gn_buf_done(&s->ledger);
  gn_buf_done(&s->n[P].state);
  gn_buf_done(&s->n[R].state);
  for (size_t i = 0; i < s->n_msgs; i++)
    gn_buf_done(&s->msgs[i].data);
}

/* --- the tests ----------------------------------------------------------------*/

static int run_random_seed(uint64_t seed, sim_stats *st) {
  sim *s = calloc(1, sizeof(*s));
  if (!s)
    return -1;
  sim_init(s, seed);
  scenario_random(s);
  int r = sim_run(s, st);
  if (r < 0)
    fprintf(stderr,
            "lease simulator: seed %" PRIu64 " FAILED: %s\n  replay: GN_SIM_SEED=%" PRIu64
            " GN_SIM_VERBOSE=1 ./billing_test_lease_sim\n",
            seed, s->why, seed);
  sim_done(s);
  free(s);
  return r;
}

static uint64_t env_u64(const char *name, uint64_t def) {
  const char *v = getenv(name);
  return v && *v ? strtoull(v, NULL, 10) : def;
}

static void print_stats(const char *what, const sim_stats *st, double secs) {
  fprintf(stderr,
          "lease simulator (%s): %" PRIu64 " seeds in %.2f s (%.0f seeds/s); %" PRIu64 " notes accepted, %" PRIu64
          " rejected; final invoices %" PRIu64 " countersigned, %" PRIu64 " rejected (%" PRIu64
          " spending cap, %" PRIu64 " beyond observation, %" PRIu64 " other); %" PRIu64 " unpaid and %" PRIu64
          " unreachable ends; %" PRIu64 " crashes; %" PRIu64 " steps; %" PRIu64 " forged notes; %" PRIu64
          " catch-ups\n",
          what, st->seeds, secs, secs > 0 ? (double)st->seeds / secs : 0.0, st->notes_accepted, st->notes_rejected,
          st->invoices_accepted, st->invoices_rejected, st->rej_cap, st->rej_observed, st->rej_other, st->unpaid_ends,
          st->unreachable_ends, st->crashes, st->steps, st->forged, st->catchups);
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void test_sim_random_seeds(void **state) {
  (void)state;
  sim_stats st = {0};
  const char *one = getenv("GN_SIM_SEED");
  if (one && *one) {
    assert_int_equal(run_random_seed(strtoull(one, NULL, 10), &st), 0);
    print_stats("one seed", &st, 0);
    return;
  }
  uint64_t n = env_u64("GN_SIM_SEEDS", SIM_DEFAULT_SEEDS), first = env_u64("GN_SIM_FIRST_SEED", 1);
  double t0 = now_s();
  uint64_t failures = 0;
  for (uint64_t seed = first; seed < first + n; seed++)
    if (run_random_seed(seed, &st) < 0 && ++failures >= 5)
      break;
  print_stats("random", &st, now_s() - t0);
  assert_int_equal(failures, 0);
  /* The scenarios did reach what they are for. */
  if (n >= 500) {
    assert_true(st.notes_accepted > 0 && st.invoices_accepted > 0);
    assert_true(st.unpaid_ends + st.unreachable_ends > 0 && st.crashes > 0);
  }
}

/* An honest provider whose UTC clock is minutes off (either way), clean link,
 * the requester crashing and restarting mid-lease: everything is accepted. */
static void test_sim_clock_offset_honest(void **state) {
  (void)state;
  sim_stats st = {0};
  for (uint64_t seed = 1; seed <= 60; seed++) {
    sim *s = calloc(1, sizeof(*s));
    assert_non_null(s);
    sim_init(s, 1000000 + seed);
    s->c.interval_s = 10 + (uint32_t)rnd(s, 3) * 10;
    s->c.max_s = 120 + rnd(s, 120);
    s->c.utc_off_ms[P] = (seed % 2 ? 1 : -1) * (int64_t)(60000 + rnd(s, 540000)); /* 1..10 minutes */
    s->c.rate_ppm[P] = 1000000 + 50;
    uint64_t crash = 20000 + rnd(s, 60000);
    add_ev(s, crash, EV_CRASH, R, seed % 3 == 0);
    add_ev(s, crash + 1000 + rnd(s, 8000), EV_RESTART, R, false);
    if (seed % 2)
      s->c.release_ms = 100000;
    s->c.honest_clean = true;
    int r = sim_run(s, &st);
    if (r < 0)
      fprintf(stderr, "clock offset seed %" PRIu64 ": %s\n", seed, s->why);
    assert_int_equal(r, 0);
    assert_true(s->r_settled_acc);
    assert_int_equal(s->st.notes_rejected, 0);
    assert_true(s->st.notes_accepted > 0);
    sim_done(s);
    free(s);
  }
  print_stats("clock offset", &st, 0);
}

/* A provider whose meter runs fast bills more seconds than passed: the
 * requester never accepts beyond its observation (I2 holds) and rejects. */
static void test_sim_overbilling_provider(void **state) {
  (void)state;
  sim_stats st = {0};
  for (uint64_t seed = 1; seed <= 60; seed++) {
    sim *s = calloc(1, sizeof(*s));
    assert_non_null(s);
    sim_init(s, 2000000 + seed);
    s->c.overbill = true;
    s->c.interval_s = 10;
    s->c.max_s = 300;
    s->c.loss_pm = (uint32_t)rnd(s, 200);
    bool forging = seed % 2 == 0;
    if (forging) {
      /* An honest meter, but notes that claim more than passed. */
      for (int k = 0; k < 6; k++)
        add_ev(s, 5000 + rnd(s, 250000), EV_FORGE, P, false);
    } else {
      s->c.rate_ppm[P] = 1300000 + rnd(s, 1700000); /* a meter 1.3x .. 3x too fast */
    }
    int r = sim_run(s, &st);
    if (r < 0)
      fprintf(stderr, "overbilling seed %" PRIu64 ": %s\n", seed, s->why);
    assert_int_equal(r, 0);
    /* Caught: a note or the final invoice rejected, never a clean pass. */
    if (forging)
      assert_true(s->st.forged == 0 || s->st.notes_rejected > 0);
    else
      assert_true(s->st.notes_rejected > 0 || !s->r_settled_acc);
    sim_done(s);
    free(s);
  }
  print_stats("over-billing", &st, 0);
}

/* A requester that never answers: the lease stops within two intervals of
 * its first unanswered note (I4, checked at every step) as unpaid, and the
 * provider holds a final invoice. */
static void test_sim_silent_requester(void **state) {
  (void)state;
  sim_stats st = {0};
  for (uint64_t seed = 1; seed <= 40; seed++) {
    sim *s = calloc(1, sizeof(*s));
    assert_non_null(s);
    sim_init(s, 3000000 + seed);
    s->c.silent = true;
    s->c.interval_s = 10 + (uint32_t)rnd(s, 6) * 10;
    s->c.max_s = 3600;
    s->c.loss_pm = (uint32_t)rnd(s, 100);
    int r = sim_run(s, &st);
    if (r < 0)
      fprintf(stderr, "silent seed %" PRIu64 ": %s\n", seed, s->why);
    assert_int_equal(r, 0);
    assert_true(s->p_ended);
    assert_true(s->p_has_inv);
    assert_int_equal(s->st.unpaid_ends, 1);
    /* First note at interval_s, stopped by 3 intervals (+ the slack). */
    assert_true(s->p_end_t <= (uint64_t)s->c.interval_s * 3000u + SIM_SLACK_MS + 1000);
    assert_true(s->p_end_ticks <= (uint64_t)s->c.interval_s * 3 + 2);
    sim_done(s);
    free(s);
  }
  print_stats("silent requester", &st, 0);
}

/* The same seed twice gives the same run (what makes a failure replayable). */
static void test_sim_replays_exactly(void **state) {
  (void)state;
  for (uint64_t seed = 7; seed <= 9; seed++) {
    sim_stats a = {0}, b = {0};
    sim *s1 = calloc(1, sizeof(*s1)), *s2 = calloc(1, sizeof(*s2));
    assert_non_null(s1);
    assert_non_null(s2);
    sim_init(s1, seed);
    scenario_random(s1);
    sim_init(s2, seed);
    scenario_random(s2);
    assert_int_equal(sim_run(s1, &a), 0);
    assert_int_equal(sim_run(s2, &b), 0);
    assert_int_equal(a.steps, b.steps);
    assert_int_equal(s1->t, s2->t);
    assert_int_equal(s1->ledger.len, s2->ledger.len);
    assert_memory_equal(s1->ledger.data, s2->ledger.data, s1->ledger.len);
    assert_memory_equal(s1->r_inv_hash, s2->r_inv_hash, 32);
    sim_done(s1);
    sim_done(s2);
    free(s1);
    free(s2);
  }
}

int main(void) {
  if (sodium_init() < 0)
    return 1;
  if (getenv("GN_SIM_BENCH")) {
    sim_stats st = {0};
    uint64_t n = env_u64("GN_SIM_SEEDS", 2000), bad = 0;
    double t0 = now_s();
    for (uint64_t seed = 1; seed <= n; seed++)
      bad += run_random_seed(seed, &st) < 0;
    double dt = now_s() - t0;
    printf("lease simulator: %" PRIu64 " seeds in %.3f s: %.0f seeds/s (%" PRIu64 " failed)\n", st.seeds, dt,
           dt > 0 ? (double)st.seeds / dt : 0.0, bad);
    return bad ? 1 : 0;
  }
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_sim_replays_exactly),      cmocka_unit_test(test_sim_clock_offset_honest),
      cmocka_unit_test(test_sim_overbilling_provider), cmocka_unit_test(test_sim_silent_requester),
      cmocka_unit_test(test_sim_random_seeds),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
