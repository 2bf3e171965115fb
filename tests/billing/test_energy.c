/* Tests of a lease's energy: the once-a-second integration of power
 * readings on an injected clock (the cap on a gap, no readings -> no
 * claim), the optional energy claim of the final invoice (signed, bounded,
 * absent from older invoices that still verify), and the judgement of a
 * claim no GPU could make (a provider claiming 1 MW). */
#include "billing/fixture.h"

#include <jansson.h>

#define N_TICKS 20

static int setup20(void **state) {
  return fx_setup_with(state, 1, 400000, N_TICKS);
}

/* --- integration ----------------------------------------------------------*/

static void test_energy_constant_250w_for_10s_is_2500j(void **state) {
  (void)state;
  gn_energy e = {0};
  gn_energy_start(&e, 7000);
  for (uint64_t s = 1; s <= 10; s++)
    gn_energy_sample(&e, 7000 + s * 1000, true, 250000);
  assert_int_equal(gn_energy_mj(&e), 2500000);
  assert_int_equal(gn_energy_measured_s(&e), 10);
  assert_int_equal(e.unmeasured_ms, 0);
  gn_bill_energy c = gn_energy_claim(&e);
  assert_true(c.present);
  assert_int_equal(c.mj, 2500000);
  assert_int_equal(c.measured_s, 10);
}

static void test_energy_late_samples_count_their_real_interval(void **state) {
  (void)state;
  gn_energy e = {0};
  gn_energy_start(&e, 0);
  gn_energy_sample(&e, 1500, true, 100000); /* 1.5 s at 100 W */
  gn_energy_sample(&e, 2000, true, 300000); /* 0.5 s at 300 W */
  assert_int_equal(gn_energy_mj(&e), 150000 + 150000);
  assert_int_equal(e.measured_ms, 2000);
}

static void test_energy_gap_counts_at_most_the_cap(void **state) {
  (void)state;
  gn_energy e = {0};
  gn_energy_start(&e, 1000);
  gn_energy_sample(&e, 2000, true, 250000);  /* 1 s */
  gn_energy_sample(&e, 32000, true, 250000); /* a 30 s gap: 2 s counted */
  assert_int_equal(gn_energy_mj(&e), 250000 + 500000);
  assert_int_equal(e.measured_ms, 1000 + GN_ENERGY_CAP_MS);
  assert_int_equal(e.unmeasured_ms, 30000 - GN_ENERGY_CAP_MS);
}

static void test_energy_no_readings_is_absent(void **state) {
  (void)state;
  gn_energy e = {0};
  gn_energy_start(&e, 0);
  for (uint64_t s = 1; s <= 30; s++)
    gn_energy_sample(&e, s * 1000, false, 0);
  assert_int_equal(gn_energy_mj(&e), 0);
  assert_int_equal(e.unmeasured_ms, 30000);
  assert_false(gn_energy_claim(&e).present);
  /* Nor is a fraction of a second measured a claim of 0 seconds. */
  gn_energy_sample(&e, 30500, true, 250000);
  assert_false(gn_energy_claim(&e).present);
}

static void test_energy_first_sample_only_starts(void **state) {
  (void)state;
  gn_energy e = {0};
  gn_energy_sample(&e, 50000, true, 250000); /* nothing before it is counted */
  assert_true(e.started);
  assert_int_equal(e.uj, 0);
  gn_energy_sample(&e, 51000, true, 250000);
  assert_int_equal(gn_energy_mj(&e), 250000);
}

static void test_energy_resume_after_restart_keeps_totals_not_downtime(void **state) {
  (void)state;
  gn_energy e = {0};
  gn_energy_start(&e, 0);
  for (uint64_t s = 1; s <= 5; s++)
    gn_energy_sample(&e, s * 1000, true, 200000);
  /* A restart: the totals come back from disk, the clock is a new one. */
  gn_energy back = {.uj = e.uj, .measured_ms = e.measured_ms, .unmeasured_ms = e.unmeasured_ms};
  gn_energy_start(&back, 900);
  gn_energy_sample(&back, 1900, true, 200000);
  assert_int_equal(gn_energy_mj(&back), 6 * 200000);
  assert_int_equal(gn_energy_measured_s(&back), 6);
}

static void test_energy_clock_back_counts_nothing(void **state) {
  (void)state;
  gn_energy e = {0};
  gn_energy_start(&e, 5000);
  gn_energy_sample(&e, 4000, true, 250000);
  gn_energy_sample(&e, 5000, true, 250000);
  assert_int_equal(e.uj, 0);
  assert_int_equal(e.measured_ms, 0);
}

static void test_energy_saturates_instead_of_wrapping(void **state) {
  (void)state;
  gn_energy e = {.uj = UINT64_MAX - 10};
  gn_energy_start(&e, 0);
  gn_energy_sample(&e, 1000, true, UINT64_MAX);
  assert_true(e.uj == UINT64_MAX);
  gn_energy_sample(&e, 2000, true, 1);
  assert_true(e.uj == UINT64_MAX);
}

/* --- plausibility -----------------------------------------------------------*/

static void test_energy_plausible_bounds(void **state) {
  (void)state;
  const struct {
    uint32_t gpus;
    uint64_t window_s, mj, measured_s;
    bool present, want;
  } cases[] = {
      {1, 20, 0, 0, false, true},                           /* no claim */
      {1, 20, 2000ull * 1000 * 21, 20, true, true},         /* 2 kW for the whole window, + 1 s */
      {1, 20, 2000ull * 1000 * 21 + 1, 20, true, false},    /* one millijoule more */
      {2, 20, 2000ull * 1000 * 42, 20, true, true},         /* per GPU */
      {1, 20, 1000, 20 + 5 + 1, true, false},               /* measured beyond the window + tolerance */
      {1, 20, 1000, 25, true, true},                        /* within the tolerance */
      {1, 20, 0, 0, true, false},                           /* a claim of no second */
      {16, UINT64_MAX, INT64_MAX, INT64_MAX, true, true},   /* no overflow at the extremes */
      {16, UINT64_MAX, UINT64_MAX, UINT64_MAX, true, true}, /* 128-bit bound */
      {1, 20, 1000000ull * 1000 * 20, 20, true, false},     /* 1 MW */
  };
  for (size_t i = 0; i < GN_ARRAY_SIZE(cases); i++) {
    gn_bill_energy c = {cases[i].present, cases[i].mj, cases[i].measured_s};
    if (gn_energy_plausible(cases[i].gpus, cases[i].window_s, &c) != cases[i].want)
      fail_msg("case %zu: expected %s", i, cases[i].want ? "plausible" : "implausible");
  }
}

/* --- the invoice's claim ------------------------------------------------------*/

static void seal_energy(fixture *f, const gn_bill_energy *energy, gn_buf *inv) {
  gn_bill_head head;
  fx_ticks(f, N_TICKS, 1);
  uint8_t *ticks = fx_compact(1, N_TICKS, 1);
  assert_int_equal(gn_bill_head_init(f->agreement.data, f->agreement.len, &head), 0);
  assert_int_equal(gn_bill_invoice_seal_energy(f->provider, f->agreement.data, f->agreement.len, &head, ticks, N_TICKS,
                                               FX_START_S + N_TICKS, "expired", energy, inv, NULL),
                   0);
  free(ticks);
}

static size_t body_keys(const gn_buf *env) {
  gn_envelope e;
  gn_wire_doc doc;
  assert_int_equal(gn_envelope_open(env->data, env->len, &e), 0);
  assert_int_equal(gn_wire_decode(e.body, e.body_len, &doc), 0);
  size_t n = doc.root->via.map.size;
  gn_wire_doc_done(&doc);
  return n;
}

static void test_invoice_energy_round_trips_signed(void **state) {
  fixture *f = *state;
  gn_buf inv = {0};
  gn_invoice_summary s;
  gn_bill_energy en = {true, 250000ull * N_TICKS, N_TICKS}; /* 250 W for 20 s */
  seal_energy(f, &en, &inv);
  assert_int_equal(body_keys(&inv), 17);
  assert_int_equal(gn_invoice_check(inv.data, inv.len, f->agreement.data, f->agreement.len, N_TICKS, 0, &s, NULL, 0),
                   0);
  assert_true(s.energy.present);
  assert_int_equal(s.energy.mj, 5000000);
  assert_int_equal(s.energy.measured_s, N_TICKS);
  assert_true(s.energy_plausible);
  /* The requester's own check hands it over too, and its answer is as before. */
  gn_bill_head head, fin;
  gn_bill_note no;
  assert_int_equal(gn_bill_head_init(f->agreement.data, f->agreement.len, &head), 0);
  assert_int_equal(gn_bill_invoice_check(inv.data, inv.len, f->agreement.data, f->agreement.len, &head, N_TICKS, 0, 0,
                                         &fin, &no, NULL, 0),
                   0);
  assert_true(no.energy.present);
  assert_int_equal(no.energy.mj, 5000000);
  gn_buf_done(&inv);
}

static void test_invoice_without_energy_has_no_claim_and_verifies(void **state) {
  fixture *f = *state;
  gn_buf inv = {0}, inv2 = {0};
  gn_invoice_summary s;
  /* The sealing of before (no energy) and an absent claim give the same
   * 15-key body, byte for byte: older invoices are these. */
  gn_bill_energy none = {false, 0, 0};
  seal_energy(f, &none, &inv);
  assert_int_equal(fx_invoice_seal(f->ledger, f->provider, f->terms.lease_id, FX_START_S + N_TICKS, "expired", &inv2),
                   0);
  assert_int_equal(inv.len, inv2.len);
  assert_memory_equal(inv.data, inv2.data, inv.len);
  assert_int_equal(body_keys(&inv), 15);
  memset(&s, 0x5a, sizeof(s));
  assert_int_equal(gn_invoice_check(inv.data, inv.len, f->agreement.data, f->agreement.len, N_TICKS, 0, &s, NULL, 0),
                   0);
  assert_false(s.energy.present);
  assert_int_equal(s.energy.mj, 0);
  assert_true(s.energy_plausible);
  assert_int_equal(gn_invoice_summarize(inv.data, inv.len, &s), 0);
  assert_false(s.energy.present);
  gn_buf_done(&inv);
  gn_buf_done(&inv2);
}

static void test_invoice_energy_tampered_fails_signature(void **state) {
  fixture *f = *state;
  gn_buf inv = {0};
  char reason[256] = "";
  gn_bill_energy en = {true, 0x01020304, N_TICKS};
  seal_energy(f, &en, &inv);
  /* energy_mj is a msgpack uint32 (0xce 01 02 03 04) in the signed body:
   * change one byte of it without signing again. */
  static const uint8_t val[] = {0xce, 0x01, 0x02, 0x03, 0x04};
  uint8_t *p = memmem(inv.data, inv.len, val, sizeof(val));
  assert_non_null(p);
  p[4] = 0x05;
  assert_int_equal(gn_invoice_check(inv.data, inv.len, f->agreement.data, f->agreement.len, N_TICKS, 0, NULL, reason,
                                    sizeof(reason)),
                   GN_EAUDIT);
  assert_non_null(strstr(reason, "signature does not verify"));
  gn_buf_done(&inv);
}

static void m_energy_huge(gn__bill_body *b, uint8_t *t, size_t *n) {
  (void)t, (void)n;
  b->energy.mj = UINT64_MAX;
}
static void m_energy_zero_s(gn__bill_body *b, uint8_t *t, size_t *n) {
  (void)t, (void)n;
  b->energy.measured_s = 0;
}
static void m_energy_add(gn__bill_body *b, uint8_t *t, size_t *n) {
  (void)t, (void)n;
  b->energy = (gn_bill_energy){true, 1, 1};
}

static void test_invoice_energy_out_of_bounds_is_malformed(void **state) {
  fixture *f = *state;
  gn_buf inv = {0};
  gn_bill_energy en = {true, 1000, N_TICKS};
  seal_energy(f, &en, &inv);
  const struct {
    fx_mutate_fn fn;
    const char *want;
  } cases[] = {{m_energy_huge, "energy_mj"}, {m_energy_zero_s, "energy_measured_s"}};
  for (size_t i = 0; i < GN_ARRAY_SIZE(cases); i++) {
    gn_buf bad = {0};
    char reason[256] = "";
    fx_tamper(&inv, cases[i].fn, f->provider, &bad); /* signed again by the provider */
    assert_int_equal(gn_invoice_check(bad.data, bad.len, f->agreement.data, f->agreement.len, N_TICKS, 0, NULL, reason,
                                      sizeof(reason)),
                     GN_EAUDIT);
    if (!strstr(reason, cases[i].want))
      fail_msg("case %zu: reason \"%s\"", i, reason);
    gn_buf_done(&bad);
  }
  gn_buf_done(&inv);
}

static void test_invoice_energy_added_by_provider_still_verifies(void **state) {
  fixture *f = *state;
  gn_buf inv = {0}, more = {0};
  gn_invoice_summary s;
  seal_energy(f, NULL, &inv);
  fx_tamper(&inv, m_energy_add, f->provider, &more);
  assert_int_equal(gn_invoice_check(more.data, more.len, f->agreement.data, f->agreement.len, N_TICKS, 0, &s, NULL, 0),
                   0);
  assert_true(s.energy.present);
  assert_int_equal(s.energy.mj, 1);
  /* ...but not when signed by anyone else. */
  gn_buf forged = {0};
  fx_tamper(&inv, m_energy_add, f->other, &forged);
  assert_int_equal(
      gn_invoice_check(forged.data, forged.len, f->agreement.data, f->agreement.len, N_TICKS, 0, NULL, NULL, 0),
      GN_EAUDIT);
  gn_buf_done(&inv);
  gn_buf_done(&more);
  gn_buf_done(&forged);
}

static void test_invoice_seal_refuses_a_claim_of_no_second(void **state) {
  fixture *f = *state;
  gn_buf inv = {0};
  gn_bill_head head;
  uint8_t *ticks = fx_compact(1, N_TICKS, 1);
  gn_bill_energy en = {true, 1000, 0};
  assert_int_equal(gn_bill_head_init(f->agreement.data, f->agreement.len, &head), 0);
  assert_int_equal(gn_bill_invoice_seal_energy(f->provider, f->agreement.data, f->agreement.len, &head, ticks, N_TICKS,
                                               FX_START_S + N_TICKS, "expired", &en, &inv, NULL),
                   GN_EINVAL);
  assert_int_equal(inv.len, 0);
  free(ticks);
}

/* Attack: a provider claims its one GPU drew 1 MW for the 20 s. The
 * requester cannot measure the provider's power, and energy is not money:
 * the bill verifies, countersigned or not, but every view of it says the
 * claim is implausible. */
static void test_invoice_energy_one_megawatt_is_flagged_implausible(void **state) {
  fixture *f = *state;
  gn_buf inv = {0}, acc = {0};
  gn_invoice_summary s;
  gn_bill_audit a;
  gn_bill_energy en = {true, 1000000ull * 1000 * N_TICKS, N_TICKS};
  seal_energy(f, &en, &inv);
  assert_int_equal(gn_invoice_check(inv.data, inv.len, f->agreement.data, f->agreement.len, N_TICKS, 0, &s, NULL, 0),
                   0);
  assert_true(s.energy.present);
  assert_int_equal(s.energy.mj, 20000000000ull);
  assert_false(s.energy_plausible);
  /* The export and its audit carry the flag; the verdict is the bill's. */
  assert_int_equal(fx_invoice_accept(f->requester, &f->agreement, inv.data, inv.len, &acc), 0);
  json_t *j = NULL;
  assert_int_equal(gn_invoice_export(inv.data, inv.len, acc.data, acc.len, &j), 0);
  const json_t *sum = json_object_get(j, "summary");
  assert_true(json_is_false(json_object_get(sum, "energy_plausible")));
  assert_int_equal(json_integer_value(json_object_get(sum, "energy_mj")), 20000000000ll);
  assert_int_equal(gn_invoice_audit_json(j, &a), 0);
  assert_int_equal(a.verdict, GN_BILL_COUNTERSIGNED);
  assert_false(a.summary.energy_plausible);
  /* An export whose summary hides the flag does not audit. */
  json_object_set_new(json_object_get(j, "summary"), "energy_plausible", json_true());
  assert_int_equal(gn_invoice_audit_json(j, &a), GN_EAUDIT);
  assert_int_equal(a.verdict, GN_BILL_INVALID);
  json_decref(j);
  gn_buf_done(&inv);
  gn_buf_done(&acc);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_energy_constant_250w_for_10s_is_2500j),
      cmocka_unit_test(test_energy_late_samples_count_their_real_interval),
      cmocka_unit_test(test_energy_gap_counts_at_most_the_cap),
      cmocka_unit_test(test_energy_no_readings_is_absent),
      cmocka_unit_test(test_energy_first_sample_only_starts),
      cmocka_unit_test(test_energy_resume_after_restart_keeps_totals_not_downtime),
      cmocka_unit_test(test_energy_clock_back_counts_nothing),
      cmocka_unit_test(test_energy_saturates_instead_of_wrapping),
      cmocka_unit_test(test_energy_plausible_bounds),
      cmocka_unit_test_setup_teardown(test_invoice_energy_round_trips_signed, setup20, fx_teardown),
      cmocka_unit_test_setup_teardown(test_invoice_without_energy_has_no_claim_and_verifies, setup20, fx_teardown),
      cmocka_unit_test_setup_teardown(test_invoice_energy_tampered_fails_signature, setup20, fx_teardown),
      cmocka_unit_test_setup_teardown(test_invoice_energy_out_of_bounds_is_malformed, setup20, fx_teardown),
      cmocka_unit_test_setup_teardown(test_invoice_energy_added_by_provider_still_verifies, setup20, fx_teardown),
      cmocka_unit_test_setup_teardown(test_invoice_seal_refuses_a_claim_of_no_second, setup20, fx_teardown),
      cmocka_unit_test_setup_teardown(test_invoice_energy_one_megawatt_is_flagged_implausible, setup20, fx_teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
