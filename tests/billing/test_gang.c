/* The gang lease machine (billing/gang.c): all or nothing across providers,
 * releases of every agreed lease on a refusal, a timeout or a late
 * agreement, hostile and duplicate events, bounds, restarts from spares,
 * persistence (a requester restarted while forming releases everything),
 * and a deterministic simulation over many seeds (random refusals,
 * silences, late agreements, lost providers, link delays, requester
 * restarts) that checks no job ever starts without every member and no
 * agreed lease is left unreleased.
 *
 * GN_GANG_SEEDS=N runs N seeds (default 50000, under a second),
 * GN_GANG_SEED=S only seed S (a failure prints it), GN_GANG_VERBOSE=1
 * traces every event and action. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
/* cmocka needs the above first. */
#include <cmocka.h>

#include <gpunet/base.h>
#include <gpunet/gang.h>

#include <inttypes.h>
#include <stdio.h>

static const uint8_t SEED[32] = {7};

static gn_gang_offer offer(uint32_t i, uint32_t gpus, uint64_t price) {
  gn_gang_offer o;
  memset(&o, 0, sizeof(o));
  o.provider[0] = (uint8_t)(i + 1);
  o.provider[1] = (uint8_t)((i + 1) >> 8);
  snprintf(o.offer_id, sizeof(o.offer_id), "o-%012x", i);
  o.gpus = gpus;
  o.price_uper_hour = price;
  return o;
}

static gn_gang_opts opts(uint64_t timeout_ms, uint32_t restarts, uint64_t max_total) {
  gn_gang_opts o = {.answer_timeout_ms = timeout_ms, .restarts = restarts, .max_total_uper_hour = max_total};
  return o;
}

static gn_gang_out *out_new(void) {
  gn_gang_out *o = calloc(1, sizeof(*o));
  assert_non_null(o);
  return o;
}

static size_t count(const gn_gang_out *o, int kind) {
  size_t c = 0;
  for (size_t i = 0; i < o->n; i++)
    c += o->act[i].kind == kind;
  return c;
}

static const gn_gang_action *find(const gn_gang_out *o, int kind, const char *lease_id) {
  for (size_t i = 0; i < o->n; i++)
    if (o->act[i].kind == kind && (!lease_id || strcmp(o->act[i].lease_id, lease_id) == 0))
      return &o->act[i];
  return NULL;
}

/* A gang of n members (offers 0..n-1, 1 GPU at 0.40/h) and its lease ids. */
typedef struct fixture {
  gn_gang *g;
  gn_gang_out *out;
  gn_gang_offer m[GN_GANG_MAX_MEMBERS], sp[GN_GANG_MAX_SPARES];
  char id[GN_GANG_MAX_MEMBERS][24];
  size_t n;
} fixture;

static void fx_start(fixture *f, size_t n, size_t n_spares, gn_gang_opts o) {
  memset(f, 0, sizeof(*f));
  f->out = out_new();
  f->n = n;
  for (size_t i = 0; i < n; i++)
    f->m[i] = offer((uint32_t)i, 1, 400000);
  for (size_t i = 0; i < n_spares; i++)
    f->sp[i] = offer((uint32_t)(100 + i), 1, 400000);
  assert_int_equal(gn_gang_new(f->m, n, f->sp, n_spares, &o, SEED, 1000, &f->g, f->out), 0);
  assert_int_equal(f->out->n, n);
  for (size_t i = 0; i < n; i++) {
    const gn_gang_action *a = &f->out->act[i];
    assert_int_equal(a->kind, GN_GANG_ACT_REQUEST);
    assert_int_equal(a->member, (int)i);
    assert_memory_equal(a->offer.provider, f->m[i].provider, GN_PK_LEN);
    memcpy(f->id[i], a->lease_id, 24);
  }
  assert_int_equal(f->out->timer_at_ms, 1000 + o.answer_timeout_ms);
}

static void fx_done(fixture *f) {
  f->g = gn_gang_free(f->g);
  free(f->out);
}

static void fx_accept_all(fixture *f, uint64_t now) {
  for (size_t i = 0; i < f->n; i++)
    assert_int_equal(gn_gang_accepted(f->g, now, f->id[i], f->m[i].provider, f->out), 0);
  assert_int_equal(count(f->out, GN_GANG_ACT_READY), 1);
}

static int phase(const gn_gang *g) {
  gn_gang_info info;
  gn_gang_info_get(g, &info);
  return info.phase;
}

static int mstate(const gn_gang *g, size_t i) {
  gn_gang_member_info mi;
  assert_int_equal(gn_gang_member(g, i, &mi), 0);
  return mi.state;
}

/* --- unit tests ------------------------------------------------------------*/

static void test_gang_ready_only_when_every_member_agreed(void **st) {
  (void)st;
  fixture f;
  fx_start(&f, 3, 0, opts(5000, 0, 0));
  for (size_t i = 0; i < 3; i++)
    for (size_t j = 0; j < i; j++)
      assert_string_not_equal(f.id[i], f.id[j]);
  assert_int_equal(gn_gang_accepted(f.g, 1100, f.id[0], f.m[0].provider, f.out), 0);
  assert_int_equal(f.out->n, 0);
  assert_int_equal(gn_gang_accepted(f.g, 1200, f.id[2], f.m[2].provider, f.out), 0);
  assert_int_equal(f.out->n, 0);
  assert_int_equal(f.out->timer_at_ms, 6000);
  assert_int_equal(phase(f.g), GN_GANG_FORMING);
  assert_int_equal(gn_gang_accepted(f.g, 1300, f.id[1], f.m[1].provider, f.out), 0);
  assert_int_equal(f.out->n, 1);
  assert_int_equal(f.out->act[0].kind, GN_GANG_ACT_READY);
  assert_int_equal(f.out->act[0].restart, 0);
  assert_int_equal(f.out->timer_at_ms, UINT64_MAX);
  gn_gang_info info;
  gn_gang_info_get(f.g, &info);
  assert_int_equal(info.phase, GN_GANG_READY);
  assert_int_equal(info.agreed, 3);
  assert_int_equal(info.total_uper_hour, 1200000);
  /* The deadline passing after READY changes nothing. */
  assert_int_equal(gn_gang_timer(f.g, 999999, f.out), 0);
  assert_int_equal(f.out->n, 0);
  assert_int_equal(phase(f.g), GN_GANG_READY);
  fx_done(&f);
}

static void test_gang_one_refusal_releases_everything(void **st) {
  (void)st;
  fixture f;
  fx_start(&f, 4, 0, opts(5000, 0, 0));
  assert_int_equal(gn_gang_accepted(f.g, 1100, f.id[0], f.m[0].provider, f.out), 0);
  assert_int_equal(gn_gang_accepted(f.g, 1100, f.id[1], f.m[1].provider, f.out), 0);
  assert_int_equal(gn_gang_refused(f.g, 1200, f.id[2], f.m[2].provider, "asked for 1 x X but 0 of 1 are free", f.out),
                   0);
  /* Both agreed leases released as agreed, the unanswered one abandoned with
   * a bare release, then FAILED; nothing starts. */
  assert_int_equal(count(f.out, GN_GANG_ACT_READY), 0);
  assert_int_equal(count(f.out, GN_GANG_ACT_STOP_JOBS), 0);
  assert_int_equal(count(f.out, GN_GANG_ACT_RELEASE), 3);
  assert_true(find(f.out, GN_GANG_ACT_RELEASE, f.id[0])->agreed);
  assert_true(find(f.out, GN_GANG_ACT_RELEASE, f.id[1])->agreed);
  assert_false(find(f.out, GN_GANG_ACT_RELEASE, f.id[3])->agreed);
  assert_null(find(f.out, GN_GANG_ACT_RELEASE, f.id[2]));
  assert_int_equal(f.out->act[f.out->n - 1].kind, GN_GANG_ACT_FAILED);
  assert_non_null(strstr(f.out->act[f.out->n - 1].reason, "member 2"));
  assert_non_null(strstr(f.out->act[f.out->n - 1].reason, "0 of 1 are free"));
  assert_int_equal(f.out->timer_at_ms, UINT64_MAX);
  assert_int_equal(phase(f.g), GN_GANG_FAILED);
  assert_int_equal(mstate(f.g, 0), GN_GANG_M_RELEASED);
  assert_int_equal(mstate(f.g, 2), GN_GANG_M_REFUSED);
  assert_int_equal(mstate(f.g, 3), GN_GANG_M_ABANDONED);
  gn_gang_member_info mi;
  assert_int_equal(gn_gang_member(f.g, 0, &mi), 0);
  assert_int_equal(mi.accepted_at_ms, 1100);
  assert_int_equal(mi.released_at_ms, 1200);
  fx_done(&f);
}

static void test_gang_timeout_releases_agreed_leases(void **st) {
  (void)st;
  fixture f;
  fx_start(&f, 3, 0, opts(5000, 0, 0));
  assert_int_equal(gn_gang_accepted(f.g, 2000, f.id[1], f.m[1].provider, f.out), 0);
  assert_int_equal(gn_gang_timer(f.g, 5999, f.out), 0);
  assert_int_equal(f.out->n, 0);
  assert_int_equal(f.out->timer_at_ms, 6000);
  assert_int_equal(gn_gang_timer(f.g, 6000, f.out), 0);
  assert_int_equal(count(f.out, GN_GANG_ACT_RELEASE), 2);
  assert_true(find(f.out, GN_GANG_ACT_RELEASE, f.id[1])->agreed);
  assert_false(find(f.out, GN_GANG_ACT_RELEASE, f.id[2])->agreed);
  assert_int_equal(count(f.out, GN_GANG_ACT_FAILED), 1);
  assert_non_null(strstr(find(f.out, GN_GANG_ACT_FAILED, NULL)->reason, "no answer within 5000 ms"));
  assert_int_equal(mstate(f.g, 0), GN_GANG_M_NO_ANSWER);
  assert_int_equal(mstate(f.g, 1), GN_GANG_M_RELEASED);
  /* An unreachable provider reported by the glue is a timeout too. */
  fixture h;
  fx_start(&h, 2, 0, opts(5000, 0, 0));
  assert_int_equal(gn_gang_accepted(h.g, 1001, h.id[0], h.m[0].provider, h.out), 0);
  assert_int_equal(gn_gang_no_answer(h.g, 1002, h.id[1], "cannot reach 10.0.0.2:7946", h.out), 0);
  assert_true(find(h.out, GN_GANG_ACT_RELEASE, h.id[0])->agreed);
  assert_non_null(strstr(find(h.out, GN_GANG_ACT_FAILED, NULL)->reason, "cannot reach"));
  fx_done(&h);
  fx_done(&f);
}

static void test_gang_late_agreement_after_failure_is_released(void **st) {
  (void)st;
  fixture f;
  fx_start(&f, 3, 0, opts(5000, 0, 0));
  assert_int_equal(gn_gang_refused(f.g, 1100, f.id[0], f.m[0].provider, "no", f.out), 0);
  assert_int_equal(phase(f.g), GN_GANG_FAILED);
  /* The abandoned one and the refused one agree after all: both released
   * as agreed at once, and the group stays failed. */
  for (size_t i = 1; i < 3; i++) {
    assert_int_equal(gn_gang_accepted(f.g, 7000, f.id[i], f.m[i].provider, f.out), 0);
    assert_int_equal(f.out->n, 1);
    assert_int_equal(f.out->act[0].kind, GN_GANG_ACT_RELEASE);
    assert_true(f.out->act[0].agreed);
    assert_string_equal(f.out->act[0].lease_id, f.id[i]);
    /* The same agreement again: nothing more. */
    assert_int_equal(gn_gang_accepted(f.g, 7001, f.id[i], f.m[i].provider, f.out), 0);
    assert_int_equal(f.out->n, 0);
  }
  /* A provider that refused and then agrees (contradicting itself) is
   * released too. */
  assert_int_equal(gn_gang_accepted(f.g, 7002, f.id[0], f.m[0].provider, f.out), 0);
  assert_true(find(f.out, GN_GANG_ACT_RELEASE, f.id[0])->agreed);
  assert_int_equal(count(f.out, GN_GANG_ACT_READY), 0);
  assert_int_equal(phase(f.g), GN_GANG_FAILED);
  /* A late agreement after a timeout, likewise. */
  fixture h;
  fx_start(&h, 2, 0, opts(1000, 0, 0));
  assert_int_equal(gn_gang_accepted(h.g, 1500, h.id[0], h.m[0].provider, h.out), 0);
  assert_int_equal(gn_gang_timer(h.g, 2000, h.out), 0);
  assert_int_equal(gn_gang_accepted(h.g, 2100, h.id[1], h.m[1].provider, h.out), 0);
  assert_int_equal(h.out->n, 1);
  assert_int_equal(h.out->act[0].kind, GN_GANG_ACT_RELEASE);
  assert_non_null(strstr(h.out->act[0].reason, "late agreement"));
  fx_done(&h);
  fx_done(&f);
}

static void test_gang_foreign_and_duplicate_events_change_nothing(void **st) {
  (void)st;
  fixture f;
  fx_start(&f, 2, 0, opts(5000, 0, 0));
  gn_gang_offer stranger = offer(900, 1, 1);
  assert_int_equal(gn_gang_accepted(f.g, 1100, "l-0000000000000000", f.m[0].provider, f.out), GN_ENOTFOUND);
  assert_int_equal(gn_gang_refused(f.g, 1100, "l-0000000000000000", f.m[0].provider, "x", f.out), GN_ENOTFOUND);
  assert_int_equal(gn_gang_lost(f.g, 1100, "nope", "x", f.out), GN_ENOTFOUND);
  assert_int_equal(gn_gang_no_answer(f.g, 1100, NULL, "x", f.out), GN_ENOTFOUND);
  /* Another provider answering for our member's lease. */
  assert_int_equal(gn_gang_accepted(f.g, 1100, f.id[0], stranger.provider, f.out), GN_EPERM);
  assert_int_equal(gn_gang_refused(f.g, 1100, f.id[0], f.m[1].provider, "x", f.out), GN_EPERM);
  assert_int_equal(f.out->n, 0);
  /* A refused event still hands back the deadline (the glue re-arms from
   * the latest call). */
  assert_int_equal(f.out->timer_at_ms, 6000);
  assert_int_equal(gn_gang_job_failed(f.g, 1100, 0, "x", f.out), GN_ESTATE);
  assert_int_equal(f.out->timer_at_ms, 6000);
  assert_int_equal(phase(f.g), GN_GANG_FORMING);
  assert_int_equal(mstate(f.g, 0), GN_GANG_M_REQUESTED);
  /* Duplicates and contradictions. */
  assert_int_equal(gn_gang_accepted(f.g, 1200, f.id[0], f.m[0].provider, f.out), 0);
  assert_int_equal(gn_gang_accepted(f.g, 1201, f.id[0], f.m[0].provider, f.out), 0);
  assert_int_equal(f.out->n, 0);
  assert_int_equal(gn_gang_refused(f.g, 1202, f.id[0], f.m[0].provider, "changed my mind", f.out), GN_ESTATE);
  assert_int_equal(gn_gang_no_answer(f.g, 1203, f.id[0], "x", f.out), 0);
  assert_int_equal(f.out->n, 0);
  assert_int_equal(mstate(f.g, 0), GN_GANG_M_AGREED);
  assert_int_equal(gn_gang_job_failed(f.g, 1204, 0, "x", f.out), GN_ESTATE);
  assert_int_equal(phase(f.g), GN_GANG_FORMING);
  assert_int_equal(gn_gang_accepted(f.g, 1300, f.id[1], f.m[1].provider, f.out), 0);
  assert_int_equal(count(f.out, GN_GANG_ACT_READY), 1);
  assert_int_equal(gn_gang_accepted(f.g, 1301, f.id[1], f.m[1].provider, f.out), 0);
  assert_int_equal(f.out->n, 0);
  assert_int_equal(gn_gang_job_failed(f.g, 1302, 2, "x", f.out), GN_EINVAL);
  /* A peer's reason with control bytes is made printable. */
  fixture h;
  fx_start(&h, 1, 0, opts(5000, 0, 0));
  assert_int_equal(gn_gang_refused(h.g, 1100, h.id[0], h.m[0].provider, "bad\n\x1b[31mred", h.out), 0);
  const char *why = find(h.out, GN_GANG_ACT_FAILED, NULL)->reason;
  for (const char *p = why; *p; p++)
    assert_true(*p >= 0x20 && *p < 0x7f);
  fx_done(&h);
  fx_done(&f);
}

static void test_gang_rejects_bad_input(void **st) {
  (void)st;
  gn_gang_offer m[GN_GANG_MAX_MEMBERS + 1], sp[GN_GANG_MAX_SPARES + 1];
  for (uint32_t i = 0; i <= GN_GANG_MAX_MEMBERS; i++)
    m[i] = offer(i, 1, 400000);
  for (uint32_t i = 0; i <= GN_GANG_MAX_SPARES; i++)
    sp[i] = offer(1000 + i, 1, 400000);
  gn_gang_out *out = out_new();
  gn_gang *sentinel = (gn_gang *)(uintptr_t)0x1, *g = sentinel;
  gn_gang_opts o = opts(5000, 0, 0);
  out->n = 99;
  assert_int_equal(gn_gang_new(m, 0, NULL, 0, &o, SEED, 0, &g, out), GN_EINVAL);
  assert_int_equal(out->n, 0);
  assert_int_equal(gn_gang_new(m, GN_GANG_MAX_MEMBERS + 1, NULL, 0, &o, SEED, 0, &g, out), GN_ETOOBIG);
  assert_int_equal(gn_gang_new(m, 2, sp, GN_GANG_MAX_SPARES + 1, &o, SEED, 0, &g, out), GN_ETOOBIG);
  assert_int_equal(gn_gang_new(m, 2, NULL, 1, &o, SEED, 0, &g, out), GN_EINVAL);
  gn_gang_opts bad = opts(GN_GANG_TIMEOUT_MIN_MS - 1, 0, 0);
  assert_int_equal(gn_gang_new(m, 2, NULL, 0, &bad, SEED, 0, &g, out), GN_EINVAL);
  bad = opts(GN_GANG_TIMEOUT_MAX_MS + 1, 0, 0);
  assert_int_equal(gn_gang_new(m, 2, NULL, 0, &bad, SEED, 0, &g, out), GN_EINVAL);
  /* The members' total above the maximum. */
  bad = opts(5000, 0, 799999);
  assert_int_equal(gn_gang_new(m, 2, NULL, 0, &bad, SEED, 0, &g, out), GN_EINVAL);
  /* A bad offer: 0 or 17 GPUs, an id without its end or with a space, a
   * price whose gpus * price overflows. */
  gn_gang_offer b[2] = {m[0], m[1]};
  b[1].gpus = 0;
  assert_int_equal(gn_gang_new(b, 2, NULL, 0, &o, SEED, 0, &g, out), GN_EINVAL);
  b[1].gpus = 17;
  assert_int_equal(gn_gang_new(b, 2, NULL, 0, &o, SEED, 0, &g, out), GN_EINVAL);
  b[1] = m[1];
  memset(b[1].offer_id, 'a', sizeof(b[1].offer_id));
  assert_int_equal(gn_gang_new(b, 2, NULL, 0, &o, SEED, 0, &g, out), GN_EINVAL);
  b[1] = m[1];
  strcpy(b[1].offer_id, "o 1");
  assert_int_equal(gn_gang_new(b, 2, NULL, 0, &o, SEED, 0, &g, out), GN_EINVAL);
  b[1] = m[1];
  b[1].gpus = 2;
  b[1].price_uper_hour = UINT64_MAX;
  assert_int_equal(gn_gang_new(b, 2, NULL, 0, &o, SEED, 0, &g, out), GN_EINVAL);
  /* One provider twice, among members or between a member and a spare. */
  b[1] = m[0];
  assert_int_equal(gn_gang_new(b, 2, NULL, 0, &o, SEED, 0, &g, out), GN_EINVAL);
  assert_int_equal(gn_gang_new(m, 2, &m[1], 1, &o, SEED, 0, &g, out), GN_EINVAL);
  assert_int_equal(gn_gang_new(m, 2, NULL, 0, NULL, SEED, 0, &g, out), GN_EINVAL);
  assert_int_equal(gn_gang_new(m, 2, NULL, 0, &o, NULL, 0, &g, out), GN_EINVAL);
  assert_ptr_equal(g, sentinel);
  assert_int_equal(out->n, 0);
  /* The bound itself is fine: 64 members all agreeing, in one call each. */
  assert_int_equal(gn_gang_new(m, GN_GANG_MAX_MEMBERS, sp, GN_GANG_MAX_SPARES, &o, SEED, 0, &g, out), 0);
  assert_int_equal(out->n, GN_GANG_MAX_MEMBERS);
  char ids[GN_GANG_MAX_MEMBERS][24];
  for (size_t i = 0; i < GN_GANG_MAX_MEMBERS; i++)
    memcpy(ids[i], out->act[i].lease_id, 24);
  for (size_t i = 0; i < GN_GANG_MAX_MEMBERS; i++)
    assert_int_equal(gn_gang_accepted(g, 10, ids[i], m[i].provider, out), 0);
  assert_int_equal(count(out, GN_GANG_ACT_READY), 1);
  /* And all of them released in one call. */
  assert_int_equal(gn_gang_release(g, 20, "done", out), 0);
  assert_int_equal(count(out, GN_GANG_ACT_RELEASE), GN_GANG_MAX_MEMBERS);
  assert_int_equal(out->act[0].kind, GN_GANG_ACT_STOP_JOBS);
  g = gn_gang_free(g);
  assert_null(gn_gang_free(NULL));
  free(out);
}

static void test_gang_lease_ids_are_fresh_and_replayable(void **st) {
  (void)st;
  fixture a, b;
  fx_start(&a, 8, 0, opts(5000, 0, 0));
  fx_start(&b, 8, 0, opts(5000, 0, 0));
  for (size_t i = 0; i < 8; i++) {
    assert_string_equal(a.id[i], b.id[i]); /* same seed, same ids: a simulator replays */
    assert_int_equal(strlen(a.id[i]), 18);
    assert_memory_equal(a.id[i], "l-", 2);
    for (size_t k = 2; k < 18; k++)
      assert_non_null(strchr("0123456789abcdef", a.id[i][k]));
    size_t slot = 99;
    assert_int_equal(gn_gang_lookup(a.g, a.id[i], &slot), 0);
    assert_int_equal(slot, i);
  }
  assert_int_equal(gn_gang_lookup(a.g, "l-ffffffffffffffff", NULL), GN_ENOTFOUND);
  uint8_t other[32] = {8};
  gn_gang *g = NULL;
  gn_gang_opts o = opts(5000, 0, 0);
  assert_int_equal(gn_gang_new(a.m, 1, NULL, 0, &o, other, 0, &g, b.out), 0);
  assert_string_not_equal(b.out->act[0].lease_id, a.id[0]);
  gn_gang_free(g);
  fx_done(&a);
  fx_done(&b);
}

static void test_gang_lost_member_without_restarts_fails_the_group(void **st) {
  (void)st;
  fixture f;
  fx_start(&f, 3, 2, opts(5000, 0, 0));
  fx_accept_all(&f, 1100);
  assert_int_equal(gn_gang_lost(f.g, 9000, f.id[1], "provider: unpaid", f.out), 0);
  /* The jobs stop first, then every lease is released, then FAILED. */
  assert_int_equal(f.out->act[0].kind, GN_GANG_ACT_STOP_JOBS);
  assert_int_equal(count(f.out, GN_GANG_ACT_RELEASE), 3);
  assert_int_equal(count(f.out, GN_GANG_ACT_REQUEST), 0); /* no restart: spares unused */
  assert_int_equal(f.out->act[f.out->n - 1].kind, GN_GANG_ACT_FAILED);
  assert_non_null(strstr(f.out->act[f.out->n - 1].reason, "member 1: lost: provider: unpaid"));
  assert_int_equal(mstate(f.g, 1), GN_GANG_M_LOST);
  assert_int_equal(mstate(f.g, 0), GN_GANG_M_RELEASED);
  /* Its LEASE_END coming again, or another member's: nothing more. */
  assert_int_equal(gn_gang_lost(f.g, 9001, f.id[1], "again", f.out), 0);
  assert_int_equal(gn_gang_lost(f.g, 9001, f.id[0], "released", f.out), 0);
  assert_int_equal(f.out->n, 0);
  fx_done(&f);
}

static void test_gang_lost_before_ready_fails_the_group(void **st) {
  (void)st;
  fixture f;
  fx_start(&f, 2, 1, opts(5000, 3, 0));
  assert_int_equal(gn_gang_accepted(f.g, 1100, f.id[0], f.m[0].provider, f.out), 0);
  assert_int_equal(gn_gang_lost(f.g, 1200, f.id[0], "provider shut down", f.out), 0);
  /* Forming is all or nothing even with restarts: no replacement. */
  assert_int_equal(count(f.out, GN_GANG_ACT_STOP_JOBS), 0);
  assert_int_equal(count(f.out, GN_GANG_ACT_REQUEST), 0);
  assert_int_equal(count(f.out, GN_GANG_ACT_FAILED), 1);
  assert_false(find(f.out, GN_GANG_ACT_RELEASE, f.id[1])->agreed);
  fx_done(&f);
}

static void test_gang_restart_replaces_a_lost_member_from_spares(void **st) {
  (void)st;
  fixture f;
  memset(&f, 0, sizeof(f));
  f.out = out_new();
  f.n = 3;
  for (size_t i = 0; i < 3; i++)
    f.m[i] = offer((uint32_t)i, 2, 400000);
  f.sp[0] = offer(100, 1, 100000); /* one GPU: does not fit a 2-GPU slot */
  f.sp[1] = offer(101, 2, 900000); /* over the group's maximum */
  f.sp[2] = offer(102, 2, 500000);
  f.sp[3] = offer(103, 2, 400000);
  gn_gang_opts o = opts(5000, 1, 2600000);
  assert_int_equal(gn_gang_new(f.m, 3, f.sp, 4, &o, SEED, 1000, &f.g, f.out), 0);
  for (size_t i = 0; i < 3; i++)
    memcpy(f.id[i], f.out->act[i].lease_id, 24);
  fx_accept_all(&f, 1100);
  assert_int_equal(gn_gang_lost(f.g, 50000, f.id[1], "provider gone", f.out), 0);
  assert_int_equal(f.out->act[0].kind, GN_GANG_ACT_STOP_JOBS);
  const gn_gang_action *rel = find(f.out, GN_GANG_ACT_RELEASE, f.id[1]);
  assert_non_null(rel);
  assert_true(rel->agreed);
  assert_int_equal(count(f.out, GN_GANG_ACT_RELEASE), 1); /* the others keep their leases */
  const gn_gang_action *req = find(f.out, GN_GANG_ACT_REQUEST, NULL);
  assert_non_null(req);
  assert_int_equal(req->member, 1);
  assert_memory_equal(req->offer.provider, f.sp[2].provider, GN_PK_LEN);
  char rid[24];
  memcpy(rid, req->lease_id, 24);
  assert_string_not_equal(rid, f.id[1]);
  assert_int_equal(f.out->timer_at_ms, 55000);
  assert_int_equal(phase(f.g), GN_GANG_RESTARTING);
  /* The old lease id still belongs to slot 1 (a late message is ours). */
  size_t slot;
  assert_int_equal(gn_gang_lookup(f.g, f.id[1], &slot), 0);
  assert_int_equal(slot, 1);
  assert_int_equal(gn_gang_accepted(f.g, 50100, rid, f.sp[2].provider, f.out), 0);
  assert_int_equal(f.out->n, 1);
  assert_int_equal(f.out->act[0].kind, GN_GANG_ACT_READY);
  assert_int_equal(f.out->act[0].restart, 1);
  gn_gang_member_info mi;
  assert_int_equal(gn_gang_member(f.g, 1, &mi), 0);
  assert_int_equal(mi.attempts, 2);
  assert_string_equal(mi.lease_id, rid);
  gn_gang_info info;
  gn_gang_info_get(f.g, &info);
  assert_int_equal(info.restarts_used, 1);
  assert_int_equal(info.total_uper_hour, 2600000);
  assert_int_equal(info.spares_left, 3);
  /* A second loss: no restart left. */
  assert_int_equal(gn_gang_lost(f.g, 60000, f.id[0], "provider gone", f.out), 0);
  assert_int_equal(count(f.out, GN_GANG_ACT_REQUEST), 0);
  assert_int_equal(count(f.out, GN_GANG_ACT_RELEASE), 3);
  assert_true(find(f.out, GN_GANG_ACT_RELEASE, rid)->agreed);
  assert_int_equal(count(f.out, GN_GANG_ACT_FAILED), 1);
  fx_done(&f);
}

static void test_gang_replacement_refusal_tries_next_spare_then_fails(void **st) {
  (void)st;
  fixture f;
  fx_start(&f, 2, 2, opts(5000, 2, 0));
  fx_accept_all(&f, 1100);
  assert_int_equal(gn_gang_lost(f.g, 2000, f.id[0], "gone", f.out), 0);
  char r1[24], r2[24];
  memcpy(r1, find(f.out, GN_GANG_ACT_REQUEST, NULL)->lease_id, 24);
  assert_int_equal(gn_gang_refused(f.g, 2100, r1, f.sp[0].provider, "busy", f.out), 0);
  assert_int_equal(f.out->n, 1);
  assert_int_equal(f.out->act[0].kind, GN_GANG_ACT_REQUEST);
  assert_memory_equal(f.out->act[0].offer.provider, f.sp[1].provider, GN_PK_LEN);
  memcpy(r2, f.out->act[0].lease_id, 24);
  assert_int_equal(f.out->timer_at_ms, 7100);
  /* The second spare does not answer either: no spare left. */
  assert_int_equal(gn_gang_timer(f.g, 7100, f.out), 0);
  assert_int_equal(count(f.out, GN_GANG_ACT_FAILED), 1);
  assert_non_null(strstr(find(f.out, GN_GANG_ACT_FAILED, NULL)->reason, "no spare left"));
  assert_true(find(f.out, GN_GANG_ACT_RELEASE, f.id[1])->agreed);
  assert_int_equal(count(f.out, GN_GANG_ACT_STOP_JOBS), 0); /* already stopped */
  /* The refused spare agreeing after all: released. */
  assert_int_equal(gn_gang_accepted(f.g, 8000, r1, f.sp[0].provider, f.out), 0);
  assert_true(find(f.out, GN_GANG_ACT_RELEASE, r1)->agreed);
  assert_int_equal(count(f.out, GN_GANG_ACT_READY), 0);
  fx_done(&f);
}

static void test_gang_job_failure_restarts_on_the_same_leases(void **st) {
  (void)st;
  fixture f;
  fx_start(&f, 2, 0, opts(5000, 1, 0));
  fx_accept_all(&f, 1100);
  assert_int_equal(gn_gang_job_failed(f.g, 2000, 1, "exit code 1", f.out), 0);
  assert_int_equal(f.out->n, 2);
  assert_int_equal(f.out->act[0].kind, GN_GANG_ACT_STOP_JOBS);
  assert_int_equal(f.out->act[1].kind, GN_GANG_ACT_READY);
  assert_int_equal(f.out->act[1].restart, 1);
  assert_int_equal(gn_gang_job_failed(f.g, 3000, 0, "exit code 1", f.out), 0);
  assert_int_equal(f.out->act[0].kind, GN_GANG_ACT_STOP_JOBS);
  assert_int_equal(count(f.out, GN_GANG_ACT_STOP_JOBS), 1);
  assert_int_equal(count(f.out, GN_GANG_ACT_RELEASE), 2);
  assert_int_equal(count(f.out, GN_GANG_ACT_READY), 0);
  assert_non_null(strstr(find(f.out, GN_GANG_ACT_FAILED, NULL)->reason, "member 0: rank failed: exit code 1"));
  fx_done(&f);
}

static void test_gang_release_by_the_user(void **st) {
  (void)st;
  fixture f;
  fx_start(&f, 3, 0, opts(5000, 0, 0));
  assert_int_equal(gn_gang_accepted(f.g, 1100, f.id[0], f.m[0].provider, f.out), 0);
  assert_int_equal(gn_gang_release(f.g, 1200, "interrupted", f.out), 0);
  assert_int_equal(count(f.out, GN_GANG_ACT_RELEASE), 3);
  assert_int_equal(count(f.out, GN_GANG_ACT_FAILED), 0);
  assert_int_equal(count(f.out, GN_GANG_ACT_STOP_JOBS), 0);
  assert_true(find(f.out, GN_GANG_ACT_RELEASE, f.id[0])->agreed);
  assert_false(find(f.out, GN_GANG_ACT_RELEASE, f.id[1])->agreed);
  assert_int_equal(phase(f.g), GN_GANG_ENDED);
  assert_int_equal(f.out->timer_at_ms, UINT64_MAX);
  assert_int_equal(gn_gang_release(f.g, 1300, "again", f.out), 0);
  assert_int_equal(f.out->n, 0);
  assert_int_equal(gn_gang_accepted(f.g, 1400, f.id[2], f.m[2].provider, f.out), 0);
  assert_true(find(f.out, GN_GANG_ACT_RELEASE, f.id[2])->agreed);
  assert_int_equal(count(f.out, GN_GANG_ACT_READY), 0);
  fx_done(&f);
}

static gn_gang *save_restore(gn_gang *g, uint64_t now, gn_gang_out *out) {
  gn_buf b = {0};
  assert_int_equal(gn_gang_save(g, &b), 0);
  gn_gang_free(g);
  gn_gang *h = NULL;
  assert_int_equal(gn_gang_restore(b.data, b.len, now, &h, out), 0);
  gn_buf_done(&b);
  return h;
}

static void test_gang_restored_while_forming_releases_everything(void **st) {
  (void)st;
  fixture f;
  fx_start(&f, 3, 1, opts(5000, 1, 0));
  assert_int_equal(gn_gang_accepted(f.g, 1100, f.id[0], f.m[0].provider, f.out), 0);
  assert_int_equal(gn_gang_refused(f.g, 1100, f.id[0], f.m[1].provider, "x", f.out), GN_EPERM);
  f.g = save_restore(f.g, 7, f.out); /* another process: its clock starts anew */
  assert_true(find(f.out, GN_GANG_ACT_RELEASE, f.id[0])->agreed);
  assert_false(find(f.out, GN_GANG_ACT_RELEASE, f.id[1])->agreed);
  assert_false(find(f.out, GN_GANG_ACT_RELEASE, f.id[2])->agreed);
  assert_int_equal(count(f.out, GN_GANG_ACT_REQUEST), 0);
  assert_non_null(strstr(find(f.out, GN_GANG_ACT_FAILED, NULL)->reason, "restarted"));
  assert_int_equal(f.out->timer_at_ms, UINT64_MAX);
  assert_int_equal(phase(f.g), GN_GANG_FAILED);
  /* The ids are still known: a late agreement is released. */
  assert_int_equal(gn_gang_accepted(f.g, 20, f.id[2], f.m[2].provider, f.out), 0);
  assert_true(find(f.out, GN_GANG_ACT_RELEASE, f.id[2])->agreed);
  /* Restored again, FAILED stays FAILED with nothing to do. */
  f.g = save_restore(f.g, 30, f.out);
  assert_int_equal(f.out->n, 0);
  assert_int_equal(phase(f.g), GN_GANG_FAILED);
  fx_done(&f);
}

static void test_gang_restored_while_ready_keeps_running(void **st) {
  (void)st;
  fixture f;
  fx_start(&f, 2, 2, opts(5000, 2, 0));
  fx_accept_all(&f, 1100);
  assert_int_equal(gn_gang_lost(f.g, 2000, f.id[0], "gone", f.out), 0);
  char r1[24];
  memcpy(r1, find(f.out, GN_GANG_ACT_REQUEST, NULL)->lease_id, 24);
  assert_int_equal(gn_gang_accepted(f.g, 2100, r1, f.sp[0].provider, f.out), 0);
  assert_int_equal(count(f.out, GN_GANG_ACT_READY), 1);
  gn_gang_info a, b;
  gn_gang_info_get(f.g, &a);
  gn_gang_member_info ma[2], mb[2];
  for (size_t i = 0; i < 2; i++)
    assert_int_equal(gn_gang_member(f.g, i, &ma[i]), 0);
  f.g = save_restore(f.g, 5, f.out);
  assert_int_equal(f.out->n, 0);
  gn_gang_info_get(f.g, &b);
  assert_memory_equal(&a, &b, sizeof(a));
  for (size_t i = 0; i < 2; i++) {
    assert_int_equal(gn_gang_member(f.g, i, &mb[i]), 0);
    assert_string_equal(ma[i].lease_id, mb[i].lease_id);
    assert_int_equal(ma[i].state, mb[i].state);
    assert_int_equal(ma[i].attempts, mb[i].attempts);
  }
  /* It goes on: the second restart takes the second spare with a fresh id. */
  assert_int_equal(gn_gang_lost(f.g, 10, f.id[1], "gone", f.out), 0);
  const gn_gang_action *req = find(f.out, GN_GANG_ACT_REQUEST, NULL);
  assert_non_null(req);
  assert_memory_equal(req->offer.provider, f.sp[1].provider, GN_PK_LEN);
  assert_string_not_equal(req->lease_id, r1);
  assert_string_not_equal(req->lease_id, f.id[0]);
  assert_string_not_equal(req->lease_id, f.id[1]);
  assert_int_equal(f.out->timer_at_ms, 5010);
  fx_done(&f);
}

static void test_gang_restore_rejects_bad_state(void **st) {
  (void)st;
  fixture f;
  fx_start(&f, 3, 2, opts(5000, 1, 0));
  fx_accept_all(&f, 1100);
  gn_buf b = {0};
  assert_int_equal(gn_gang_save(f.g, &b), 0);
  assert_int_equal(gn_gang_save(NULL, &b), GN_EINVAL);
  gn_gang *sentinel = (gn_gang *)(uintptr_t)0x1, *g = sentinel;
  /* Every truncation, and one byte more. */
  for (size_t len = 0; len < b.len; len++)
    assert_int_equal(gn_gang_restore(b.data, len, 0, &g, f.out), GN_EINVAL);
  uint8_t *longer = malloc(b.len + 1);
  assert_non_null(longer);
  memcpy(longer, b.data, b.len);
  longer[b.len] = 0;
  assert_int_equal(gn_gang_restore(longer, b.len + 1, 0, &g, f.out), GN_EINVAL);
  assert_ptr_equal(g, sentinel);
  /* Every single byte changed: refused, or a state that works (a price, a
   * seed byte); never a crash or a leak (the sanitizer build checks). */
  for (size_t i = 0; i < b.len; i++) {
    memcpy(longer, b.data, b.len);
    longer[i] ^= 0x5a;
    g = NULL;
    int r = gn_gang_restore(longer, b.len, 0, &g, f.out);
    /* The magic, the phase, the restarts used (over the options') and the
     * member count (over 64) are refused for sure. */
    if (i == 0 || i == 68 || i == 76 || i == 244)
      assert_int_equal(r, GN_EINVAL);
    if (r < 0)
      continue;
    gn_gang_info info;
    gn_gang_info_get(g, &info);
    assert_true(info.phase >= GN_GANG_FORMING && info.phase <= GN_GANG_ENDED);
    assert_true(f.out->n <= GN_GANG_MAX_ACTIONS);
    assert_int_equal(gn_gang_release(g, 1, "x", f.out), 0);
    gn_gang_free(g);
  }
  assert_int_equal(gn_gang_restore(NULL, 0, 0, &g, f.out), GN_EINVAL);
  free(longer);
  gn_buf_done(&b);
  fx_done(&f);
}

/* --- the simulation ----------------------------------------------------------
 *
 * Providers answer a request after a think time: agree, refuse or stay
 * silent; messages take 5..300 ms; the glue may fail to send a request; an
 * agreed provider may go (LEASE_END); the ranks may fail; the user may stop
 * the group; messages may be duplicated; strangers send events for foreign
 * lease ids. Checked: READY only when every slot's current lease's agreement
 * arrived, was not released by us, and no END arrived; ranks are stopped
 * before a running member's lease is released; after FAILED or ENDED no
 * lease is agreed and unreleased; at the end every lease any provider
 * metered was released or ended; a lease of a group that never became ready
 * metered at most the answer timeout + 2 link delays. */

#define SIM_MAX_EV 4096
#define SIM_MAX_LEASES GN_GANG_MAX_ATTEMPTS
#define SIM_DMAX 300u

enum {
  EV_REQ_AT_PROV = 1,
  EV_REL_AT_PROV,
  EV_ACC_AT_REQ,
  EV_REF_AT_REQ,
  EV_END_AT_REQ,
  EV_NOSEND,
  EV_GONE,
  EV_JOBFAIL,
  EV_USER_STOP,
  EV_FOREIGN
};

typedef struct sim_ev {
  uint64_t t, seq;
  int kind;
  int lease; /* sim lease index */
  int slot;
} sim_ev;

typedef struct sim_lease {
  char id[24];
  gn_gang_offer offer;
  int slot;
  int behaviour; /* 0 agree, 1 refuse, 2 silent */
  bool prov_active, prov_ended, ever_metered;
  uint64_t meter_from, meter_to;
  bool acc_seen, end_seen, released_agreed, released_bare;
  bool in_run; /* a member of the group whose ranks run */
  uint64_t requested_at;
} sim_lease;

typedef struct sim {
  uint64_t rng;
  uint64_t now, seq;
  sim_ev ev[SIM_MAX_EV];
  size_t nev;
  sim_lease l[SIM_MAX_LEASES];
  size_t nl;
  gn_gang *g;
  gn_gang_out *out;
  uint64_t timer_at;
  bool jobs_running, ever_ready;
  uint32_t n, timeout_ms;
  uint32_t p_refuse, p_silent, p_nosend, p_gone, p_jobfail, p_stop, p_dup, p_crash, think_max;
  gn_gang_offer m[8], sp[4];
} sim;

/* What the runs exercised, so that a change that stops exercising a path
 * shows. */
static struct { uint64_t restarts, late_released, bare_released, replacements, crashes; } stats;

static uint64_t rnd(sim *s) {
  uint64_t z = (s->rng += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

static uint32_t rn(sim *s, uint32_t n) {
  return n ? (uint32_t)(rnd(s) % n) : 0;
}

static void push(sim *s, uint64_t t, int kind, int lease, int slot) {
  assert_true(s->nev < SIM_MAX_EV);
  s->ev[s->nev++] = (sim_ev){.t = t, .seq = s->seq++, .kind = kind, .lease = lease, .slot = slot};
}

static uint64_t delay(sim *s) {
  return 5 + rn(s, SIM_DMAX - 5 + 1);
}

static sim_lease *lease_by_id(sim *s, const char *id) {
  for (size_t i = 0; i < s->nl; i++)
    if (strcmp(s->l[i].id, id) == 0)
      return &s->l[i];
  return NULL;
}

static void fail_seed(uint64_t seed, const char *what) {
  fprintf(stderr, "gang sim: seed %" PRIu64 " (GN_GANG_SEED=%" PRIu64 "): %s\n", seed, seed, what);
  fail();
}

/* Performs the actions of the last call, checking them as it goes. */
static void perform(sim *s, uint64_t seed) {
  const gn_gang_out *o = s->out;
  assert_true(o->n <= GN_GANG_MAX_ACTIONS);
  for (size_t i = 0; i < o->n; i++) {
    const gn_gang_action *a = &o->act[i];
    if (getenv("GN_GANG_VERBOSE"))
      fprintf(stderr, "  act %d member %d %s agreed %d: %s\n", a->kind, a->member, a->lease_id, a->agreed, a->reason);
    switch (a->kind) {
    case GN_GANG_ACT_REQUEST: {
      if (s->jobs_running)
        fail_seed(seed, "a request while the ranks run");
      if (lease_by_id(s, a->lease_id))
        fail_seed(seed, "a lease id issued twice");
      assert_true(s->nl < SIM_MAX_LEASES);
      sim_lease *l = &s->l[s->nl];
      memset(l, 0, sizeof(*l));
      memcpy(l->id, a->lease_id, 24);
      l->offer = a->offer;
      l->slot = a->member;
      uint32_t x = rn(s, 1000);
      l->behaviour = x < s->p_refuse ? 1 : x < s->p_refuse + s->p_silent ? 2 : 0;
      l->requested_at = s->now;
      stats.replacements += s->ever_ready;
      if (rn(s, 1000) < s->p_nosend)
        push(s, s->now, EV_NOSEND, (int)s->nl, a->member);
      else
        push(s, s->now + delay(s), EV_REQ_AT_PROV, (int)s->nl, a->member);
      s->nl++;
      break;
    }
    case GN_GANG_ACT_RELEASE: {
      sim_lease *l = lease_by_id(s, a->lease_id);
      if (!l)
        fail_seed(seed, "a release of a lease never asked for");
      if (s->jobs_running && l->in_run)
        fail_seed(seed, "a running member released before the ranks were stopped");
      if (a->agreed && !l->acc_seen)
        fail_seed(seed, "released as agreed without an agreement");
      stats.late_released += a->agreed && strstr(a->reason, "late agreement") != NULL;
      stats.bare_released += !a->agreed;
      if (a->agreed)
        l->released_agreed = true;
      else
        l->released_bare = true;
      push(s, s->now + delay(s), EV_REL_AT_PROV, (int)(l - s->l), l->slot);
      break;
    }
    case GN_GANG_ACT_READY: {
      for (uint32_t k = 0; k < s->n; k++) {
        gn_gang_member_info mi;
        assert_int_equal(gn_gang_member(s->g, k, &mi), 0);
        sim_lease *l = lease_by_id(s, mi.lease_id);
        if (!l || !l->acc_seen || l->released_agreed || l->end_seen)
          fail_seed(seed, "READY without every member's live agreement");
        l->in_run = true;
        for (uint32_t j = 0; j < k; j++) {
          gn_gang_member_info mj;
          gn_gang_member(s->g, j, &mj);
          if (memcmp(mj.offer.provider, mi.offer.provider, GN_PK_LEN) == 0)
            fail_seed(seed, "one provider in two slots");
        }
      }
      s->jobs_running = true;
      s->ever_ready = true;
      stats.restarts += a->restart > 0;
      break;
    }
    case GN_GANG_ACT_STOP_JOBS:
      if (!s->jobs_running)
        fail_seed(seed, "STOP_JOBS while nothing runs");
      s->jobs_running = false;
      for (size_t k = 0; k < s->nl; k++)
        s->l[k].in_run = false;
      break;
    case GN_GANG_ACT_FAILED:
      if (s->jobs_running)
        fail_seed(seed, "FAILED with the ranks running");
      break;
    default:
      fail_seed(seed, "an unknown action");
    }
  }
  s->timer_at = o->timer_at_ms;
}

/* After FAILED or ENDED: every lease whose agreement arrived is released
 * (or ended by its provider). */
static void check_terminal(sim *s, uint64_t seed) {
  gn_gang_info info;
  gn_gang_info_get(s->g, &info);
  if (info.phase != GN_GANG_FAILED && info.phase != GN_GANG_ENDED)
    return;
  if (s->jobs_running)
    fail_seed(seed, "ranks running after the group ended");
  for (size_t i = 0; i < s->nl; i++)
    if (s->l[i].acc_seen && !s->l[i].released_agreed && !s->l[i].end_seen)
      fail_seed(seed, "an agreed lease left unreleased after the group ended");
  if (s->timer_at != UINT64_MAX)
    fail_seed(seed, "a timer after the group ended");
}

static void sim_event(sim *s, uint64_t seed, const sim_ev *e) {
  sim_lease *l = e->lease >= 0 ? &s->l[e->lease] : NULL;
  if (getenv("GN_GANG_VERBOSE"))
    fprintf(stderr, "t=%" PRIu64 " ev %d lease %d (%s) slot %d\n", s->now, e->kind, e->lease, l ? l->id : "-", e->slot);
  int r = 0;
  switch (e->kind) {
  case EV_REQ_AT_PROV: {
    /* The provider decides after a think time; a release before that finds
     * no lease and is ignored (as node/provider.c does). */
    uint64_t t = s->now + rn(s, s->think_max + 1);
    if (l->behaviour == 0) {
      l->prov_active = true;
      l->ever_metered = true;
      l->meter_from = t;
      push(s, t + delay(s), EV_ACC_AT_REQ, e->lease, e->slot);
      if (rn(s, 1000) < s->p_dup)
        push(s, t + delay(s), EV_ACC_AT_REQ, e->lease, e->slot);
      if (rn(s, 1000) < s->p_gone)
        push(s, t + rn(s, 20000), EV_GONE, e->lease, e->slot);
    } else if (l->behaviour == 1) {
      push(s, t + delay(s), EV_REF_AT_REQ, e->lease, e->slot);
    }
    return;
  }
  case EV_REL_AT_PROV:
    if (l->prov_active && s->now >= l->meter_from) {
      l->prov_active = false;
      l->prov_ended = true;
      l->meter_to = s->now;
    }
    /* Otherwise the provider has no such lease yet (it is still deciding,
     * or the request is behind the release): ignored, as node/provider.c
     * does; an agreement it makes later is released when it arrives. */
    return;
  case EV_GONE:
    if (l->prov_active) {
      l->prov_active = false;
      l->prov_ended = true;
      l->meter_to = s->now;
      push(s, s->now + delay(s), EV_END_AT_REQ, e->lease, e->slot);
    }
    return;
  case EV_ACC_AT_REQ:
    /* The glue verified the agreement and holds a lease machine for it. */
    l->acc_seen = true;
    r = gn_gang_accepted(s->g, s->now, l->id, l->offer.provider, s->out);
    break;
  case EV_REF_AT_REQ:
    r = gn_gang_refused(s->g, s->now, l->id, l->offer.provider, "no", s->out);
    break;
  case EV_END_AT_REQ:
    l->end_seen = true;
    r = gn_gang_lost(s->g, s->now, l->id, "provider: gone", s->out);
    break;
  case EV_NOSEND:
    r = gn_gang_no_answer(s->g, s->now, l->id, "cannot reach it", s->out);
    break;
  case EV_JOBFAIL:
    r = gn_gang_job_failed(s->g, s->now, (size_t)e->slot, "exit 1", s->out);
    if (r == GN_ESTATE && !s->jobs_running)
      r = 0;
    break;
  case EV_USER_STOP:
    r = gn_gang_release(s->g, s->now, "stopped", s->out);
    break;
  case EV_FOREIGN: {
    char id[24];
    snprintf(id, sizeof(id), "l-%016" PRIx64, rnd(s));
    gn_gang_offer st = offer(5000, 1, 1);
    if (gn_gang_accepted(s->g, s->now, id, st.provider, s->out) != GN_ENOTFOUND || s->out->n != 0)
      fail_seed(seed, "a foreign agreement was taken");
    if (s->nl) {
      sim_lease *v = &s->l[rn(s, (uint32_t)s->nl)];
      if (gn_gang_accepted(s->g, s->now, v->id, st.provider, s->out) != GN_EPERM || s->out->n != 0)
        fail_seed(seed, "an agreement from another provider was taken");
      if (gn_gang_refused(s->g, s->now, v->id, st.provider, "x", s->out) != GN_EPERM || s->out->n != 0)
        fail_seed(seed, "a refusal from another provider was taken");
    }
    return;
  }
  }
  if (r < 0 && !(e->kind == EV_JOBFAIL && r == GN_ESTATE))
    fail_seed(seed, "an event was refused");
  perform(s, seed);
  check_terminal(s, seed);
  if (rn(s, 1000) < s->p_crash) {
    /* The requester's process restarts: the glue saved the gang after the
     * call above, before performing its actions. */
    gn_buf b = {0};
    assert_int_equal(gn_gang_save(s->g, &b), 0);
    gn_gang_free(s->g);
    s->g = NULL;
    if (gn_gang_restore(b.data, b.len, s->now, &s->g, s->out) != 0)
      fail_seed(seed, "a saved gang does not restore");
    gn_buf_done(&b);
    stats.crashes++;
    perform(s, seed);
    check_terminal(s, seed);
  }
}

static void sim_run(uint64_t seed, uint64_t *ready, uint64_t *failed) {
  sim *s = calloc(1, sizeof(*s));
  assert_non_null(s);
  s->out = out_new();
  s->rng = seed * 0x2545f4914f6cdd1dull + 1;
  s->n = 1 + rn(s, 8);
  uint32_t n_sp = rn(s, 5);
  s->timeout_ms = 500 + rn(s, 4500);
  uint32_t restarts = rn(s, 3);
  s->p_refuse = rn(s, 4) == 0 ? 0 : rn(s, 150);
  s->p_silent = rn(s, 4) == 0 ? 0 : rn(s, 150);
  s->p_nosend = rn(s, 50);
  s->p_gone = rn(s, 300);
  s->p_jobfail = rn(s, 300);
  s->p_stop = rn(s, 300);
  s->p_dup = rn(s, 300);
  s->p_crash = rn(s, 4) == 0 ? rn(s, 100) : 0;
  s->think_max = rn(s, 2) ? rn(s, 200) : s->timeout_ms + 1000; /* late agreements */
  for (uint32_t i = 0; i < s->n; i++)
    s->m[i] = offer(i, 1 + rn(s, 2), 100000 + rn(s, 900000));
  for (uint32_t i = 0; i < n_sp; i++)
    s->sp[i] = offer(50 + i, s->m[0].gpus, 100000 + rn(s, 900000));
  uint8_t gseed[32];
  for (size_t i = 0; i < 32; i++)
    gseed[i] = (uint8_t)rnd(s);
  gn_gang_opts o = opts(s->timeout_ms, restarts, 0);
  s->now = 1000;
  if (gn_gang_new(s->m, s->n, s->sp, n_sp, &o, gseed, s->now, &s->g, s->out) != 0)
    fail_seed(seed, "gn_gang_new");
  perform(s, seed);
  for (uint32_t k = 0; k < 3; k++) {
    if (rn(s, 1000) < s->p_jobfail)
      push(s, s->now + rn(s, 30000), EV_JOBFAIL, -1, (int)rn(s, s->n));
    if (rn(s, 1000) < s->p_stop)
      push(s, s->now + rn(s, 30000), EV_USER_STOP, -1, -1);
    push(s, s->now + rn(s, 30000), EV_FOREIGN, -1, -1);
  }
  for (uint32_t steps = 0;; steps++) {
    assert_true(steps < 100000);
    size_t best = SIZE_MAX;
    for (size_t i = 0; i < s->nev; i++)
      if (best == SIZE_MAX || s->ev[i].t < s->ev[best].t ||
          (s->ev[i].t == s->ev[best].t && s->ev[i].seq < s->ev[best].seq))
        best = i;
    if (s->timer_at != UINT64_MAX && (best == SIZE_MAX || s->timer_at <= s->ev[best].t)) {
      if (s->timer_at > s->now)
        s->now = s->timer_at;
      assert_int_equal(gn_gang_timer(s->g, s->now, s->out), 0);
      perform(s, seed);
      check_terminal(s, seed);
      continue;
    }
    if (best == SIZE_MAX)
      break;
    sim_ev e = s->ev[best];
    s->ev[best] = s->ev[--s->nev];
    if (e.t > s->now)
      s->now = e.t;
    sim_event(s, seed, &e);
  }
  /* Quiet now. A group still running is stopped by its user; then nothing
   * may be left metering. */
  gn_gang_info info;
  gn_gang_info_get(s->g, &info);
  if (info.phase == GN_GANG_FORMING || info.phase == GN_GANG_RESTARTING)
    fail_seed(seed, "still forming with nothing left to happen");
  if (info.phase == GN_GANG_READY) {
    assert_int_equal(gn_gang_release(s->g, s->now, "done", s->out), 0);
    perform(s, seed);
    check_terminal(s, seed);
    while (s->nev) {
      size_t best = 0;
      for (size_t i = 1; i < s->nev; i++)
        if (s->ev[i].t < s->ev[best].t || (s->ev[i].t == s->ev[best].t && s->ev[i].seq < s->ev[best].seq))
          best = i;
      sim_ev e = s->ev[best];
      s->ev[best] = s->ev[--s->nev];
      if (e.t > s->now)
        s->now = e.t;
      sim_event(s, seed, &e);
    }
  }
  for (size_t i = 0; i < s->nl; i++) {
    sim_lease *l = &s->l[i];
    if (l->prov_active)
      fail_seed(seed, "a provider still meters a lease of a finished gang");
    if (getenv("GN_GANG_VERBOSE"))
      fprintf(stderr, "lease %s metered %" PRIu64 "..%" PRIu64 " (timeout %u)\n", l->id, l->meter_from, l->meter_to,
              s->timeout_ms);
    if (!s->ever_ready && l->ever_metered && l->meter_to - l->meter_from > s->timeout_ms + 2 * SIM_DMAX)
      fail_seed(seed, "a lease of a group that never formed metered past timeout + 2 link delays");
  }
  *ready += s->ever_ready;
  *failed += !s->ever_ready;
  gn_gang_free(s->g);
  free(s->out);
  free(s);
}

static void test_gang_simulation_many_seeds(void **st) {
  (void)st;
  const char *one = getenv("GN_GANG_SEED"), *many = getenv("GN_GANG_SEEDS");
  uint64_t first = one ? strtoull(one, NULL, 10) : 1, nseeds = one ? 1 : many ? strtoull(many, NULL, 10) : 50000;
  uint64_t ready = 0, failed = 0;
  for (uint64_t sd = first; sd < first + nseeds; sd++)
    sim_run(sd, &ready, &failed);
  fprintf(stderr,
          "gang sim: %" PRIu64 " seeds: %" PRIu64 " groups formed, %" PRIu64 " never did; %" PRIu64
          " restarts, %" PRIu64 " replacements asked, %" PRIu64 " late agreements released, %" PRIu64
          " unanswered requests released, %" PRIu64 " requester restarts\n",
          nseeds, ready, failed, stats.restarts, stats.replacements, stats.late_released, stats.bare_released,
          stats.crashes);
  /* Both outcomes are exercised (a run where every group formed or none
   * did would check little). */
  if (nseeds >= 1000) {
    assert_true(ready > nseeds / 10);
    assert_true(failed > nseeds / 10);
    assert_true(stats.restarts > 0 && stats.replacements > 0 && stats.late_released > 0 && stats.bare_released > 0 &&
                stats.crashes > 0);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_gang_ready_only_when_every_member_agreed),
      cmocka_unit_test(test_gang_one_refusal_releases_everything),
      cmocka_unit_test(test_gang_timeout_releases_agreed_leases),
      cmocka_unit_test(test_gang_late_agreement_after_failure_is_released),
      cmocka_unit_test(test_gang_foreign_and_duplicate_events_change_nothing),
      cmocka_unit_test(test_gang_rejects_bad_input),
      cmocka_unit_test(test_gang_lease_ids_are_fresh_and_replayable),
      cmocka_unit_test(test_gang_lost_member_without_restarts_fails_the_group),
      cmocka_unit_test(test_gang_lost_before_ready_fails_the_group),
      cmocka_unit_test(test_gang_restart_replaces_a_lost_member_from_spares),
      cmocka_unit_test(test_gang_replacement_refusal_tries_next_spare_then_fails),
      cmocka_unit_test(test_gang_job_failure_restarts_on_the_same_leases),
      cmocka_unit_test(test_gang_release_by_the_user),
      cmocka_unit_test(test_gang_restored_while_forming_releases_everything),
      cmocka_unit_test(test_gang_restored_while_ready_keeps_running),
      cmocka_unit_test(test_gang_restore_rejects_bad_state),
      cmocka_unit_test(test_gang_simulation_many_seeds),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
