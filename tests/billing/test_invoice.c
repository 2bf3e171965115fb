/* Tests of the final invoice that continues no debit note (seq 0, from 1:
 * what node/ sends when a lease ends before any note was accepted), built
 * from the ledger (fx_invoice_seal: gn_ledger_ticks and
 * gn_bill_invoice_seal), checked with gn_invoice_check (gn_bill_invoice_check
 * at the genesis head, with the summary), countersigned or rejected, and a
 * table of tampered invoices that must each fail with a reason naming the
 * problem. A final invoice that does not continue the accepted note (a
 * rewritten history): test_note.c; export and audit: test_audit.c. */
#include "billing/fixture.h"

#include <jansson.h>

#define N_TICKS 20

static int setup20(void **state) {
  return fx_setup_with(state, 1, 400000, N_TICKS);
}

static void seal20(fixture *f, gn_buf *inv) {
  fx_ticks(f, N_TICKS, 1);
  assert_int_equal(fx_invoice_seal(f->ledger, f->provider, f->terms.lease_id, FX_START_S + N_TICKS, "expired", inv), 0);
}

static void m_tick17(gn__bill_body *b, uint8_t *t, size_t *n) {
  (void)b, (void)n;
  t[2 * 16] = 0; /* second 17 billed 0 GPUs, chain head kept */
}
static void m_remove17(gn__bill_body *b, uint8_t *t, size_t *n) {
  memmove(t + 16 * 2, t + 17 * 2, *n - 17 * 2);
  *n -= 2;
  b->seconds--;
  b->gpu_seconds--;
  b->total_micro = gn_price_cost(400000, 1, b->gpu_seconds);
}
static void m_swap5_6(gn__bill_body *b, uint8_t *t, size_t *n) {
  (void)b, (void)n;
  uint8_t tmp[2];
  memcpy(tmp, t + 4 * 2, 2);
  memcpy(t + 4 * 2, t + 5 * 2, 2);
  memcpy(t + 5 * 2, tmp, 2);
}
static void m_extra(gn__bill_body *b, uint8_t *t, size_t *n) {
  t[*n] = 1;
  t[*n + 1] = 7;
  *n += 2;
  b->seconds++;
}
static void m_seconds(gn__bill_body *b, uint8_t *t, size_t *n) {
  (void)t, (void)n;
  b->seconds = 19;
}
static void m_gpu_seconds(gn__bill_body *b, uint8_t *t, size_t *n) {
  (void)t, (void)n;
  b->gpu_seconds = 21;
}
static void m_price(gn__bill_body *b, uint8_t *t, size_t *n) {
  (void)t, (void)n;
  b->price_uper_hour = 500000;
  b->total_micro = gn_price_cost(500000, 1, b->seconds);
}
static void m_currency(gn__bill_body *b, uint8_t *t, size_t *n) {
  (void)t, (void)n;
  snprintf(b->currency, sizeof(b->currency), "USD");
}
static void m_total(gn__bill_body *b, uint8_t *t, size_t *n) {
  (void)t, (void)n;
  b->total_micro = 4455;
}
static void m_total_saturated(gn__bill_body *b, uint8_t *t, size_t *n) {
  (void)t, (void)n;
  b->total_micro = UINT64_MAX;
}
static void m_head(gn__bill_body *b, uint8_t *t, size_t *n) {
  (void)t, (void)n;
  b->chain_head[31] ^= 1;
}
static void m_gpus_over(gn__bill_body *b, uint8_t *t, size_t *n) {
  (void)b, (void)n;
  t[2 * 2] = 2;
}
static void m_util(gn__bill_body *b, uint8_t *t, size_t *n) {
  (void)b, (void)n;
  t[2 * 8 + 1] = 101;
}
/* The old finding: a 1-second window billed for its whole maximum. */
static void m_window(gn__bill_body *b, uint8_t *t, size_t *n) {
  (void)t, (void)n;
  b->end_s = b->start_s + 1;
}
static void m_end_before_start(gn__bill_body *b, uint8_t *t, size_t *n) {
  (void)t, (void)n;
  b->end_s = b->start_s - 1;
}
static void m_lease_id(gn__bill_body *b, uint8_t *t, size_t *n) {
  (void)t, (void)n;
  snprintf(b->lease_id, sizeof(b->lease_id), "l-0000000000000000");
}
static void m_start(gn__bill_body *b, uint8_t *t, size_t *n) {
  (void)t, (void)n;
  b->start_s -= 3600;
}
static void m_ragged(gn__bill_body *b, uint8_t *t, size_t *n) {
  (void)b, (void)t;
  *n -= 1;
}
static void m_seq(gn__bill_body *b, uint8_t *t, size_t *n) {
  (void)t, (void)n;
  b->seq = 1;
}
static void m_prev(gn__bill_body *b, uint8_t *t, size_t *n) {
  (void)t, (void)n;
  b->prev[0] = 1;
}
static void m_from(gn__bill_body *b, uint8_t *t, size_t *n) {
  (void)t, (void)n;
  b->from = 2;
}
static void m_nothing(gn__bill_body *b, uint8_t *t, size_t *n) {
  (void)b, (void)t, (void)n;
}

typedef struct tamper_case {
  const char *name;
  fx_mutate_fn fn;
  const char *want; /* substring of the reason */
} tamper_case;

static const tamper_case tamper_cases[] = {
    {"changed tick", m_tick17, "chain_head does not match the chain recomputed"},
    {"removed second", m_remove17, "chain_head does not match the chain recomputed"},
    {"swapped seconds", m_swap5_6, "chain_head does not match"},
    {"more seconds than max_s", m_extra, "invoice bills 21 seconds but the lease allows at most max_s 20"},
    {"seconds field", m_seconds, "invoice says 19 seconds but carries 20"},
    {"gpu_seconds field", m_gpu_seconds, "gpu_seconds 21 but its ticks add up to 20"},
    {"changed price", m_price, "invoice price is 0.500000 but the agreement says 0.400000 EUR/GPU-hour"},
    {"changed currency", m_currency, "currency is USD but the agreement says EUR"},
    {"changed total", m_total, "total_micro is 4455 but 20 GPU-seconds at 0.400000 EUR/GPU-hour cost 2222"},
    {"saturated total", m_total_saturated, "total_micro is 18446744073709551615 but"},
    {"changed chain head", m_head, "chain_head does not match"},
    {"more GPUs than leased", m_gpus_over, "second 3: gpus is 2 but the lease has 1 GPU"},
    {"util not a percentage", m_util, "second 9: util 101 is not a percentage"},
    {"more seconds than the window", m_window, "invoice bills 20 seconds but its window end_s - start_s holds only 1"},
    {"end before start", m_end_before_start, "is before start_s"},
    {"other lease id", m_lease_id, "is for lease l-0000000000000000 but the agreement is for lease"},
    {"moved start", m_start, "start_s is"},
    {"ragged ticks", m_ragged, "ticks are 39 bytes, not 2 per second"},
    {"seq of a note not accepted", m_seq, "seq 1 but the last accepted note is 0"},
    {"prev of a note not accepted", m_prev, "does not continue the last accepted note"},
    {"from not after the head", m_from, "starts at second 2 but the last accepted note ends at second 0"},
};

static void test_invoice_check_accepts_honest_invoice(void **state) {
  fixture *f = *state;
  gn_buf inv = {0};
  gn_invoice_summary s;
  char reason[256] = "x";
  seal20(f, &inv);
  assert_int_equal(
      gn_invoice_check(inv.data, inv.len, f->agreement.data, f->agreement.len, N_TICKS, 0, &s, reason, sizeof(reason)),
      0);
  assert_string_equal(reason, "");
  assert_int_equal(s.seconds, N_TICKS);
  assert_int_equal(s.total_micro, 2222); /* floor(400000 * 20 / 3600) */
  assert_int_equal(s.price_uper_hour, 400000);
  assert_string_equal(s.currency, "EUR");
  assert_string_equal(s.lease_id, f->terms.lease_id);
  assert_memory_equal(s.provider, f->provider->pk, 32);
  assert_memory_equal(s.requester, f->requester->pk, 32);
  assert_int_equal(s.start_s, FX_START_S);
  assert_int_equal(s.end_s, FX_START_S + N_TICKS);
  assert_int_equal(s.gpus, 1);
  assert_memory_equal(s.invoice_id, "i-", 2);
  gn_tick last;
  assert_int_equal(gn_ledger_last_tick(f->ledger, f->terms.lease_id, &last), 0);
  assert_memory_equal(s.chain_head, last.hash, 32);
  gn_buf_done(&inv);
}

static void test_invoice_total_uses_gpu_seconds(void **state) {
  fixture *f = *state;
  gn_buf req = {0}, ag = {0}, inv = {0};
  gn_lease_terms t;
  gn_invoice_summary s;
  char reason[256];
  fx_terms(f, &t, 2, 400000, 100);
  fx_agree(f, &t, &req, &ag);
  assert_int_equal(gn_ledger_begin_lease(f->ledger, t.lease_id, ag.data, ag.len), 0);
  static const uint32_t gpus[] = {2, 2, 1, 0, 2};
  for (size_t i = 0; i < GN_ARRAY_SIZE(gpus); i++)
    assert_int_equal(fx_append_tick(f->ledger, t.lease_id, FX_START_S + 1 + (int64_t)i, gpus[i], 90, NULL), 0);
  assert_int_equal(fx_invoice_seal(f->ledger, f->provider, t.lease_id, FX_START_S + 5, "released", &inv), 0);
  assert_int_equal(gn_invoice_check(inv.data, inv.len, ag.data, ag.len, 5, 0, &s, reason, sizeof(reason)), 0);
  assert_int_equal(s.seconds, 5);
  assert_int_equal(s.total_micro, 777); /* 7 GPU-seconds: floor(400000 * 7 / 3600) */
  gn_buf_done(&req);
  gn_buf_done(&ag);
  gn_buf_done(&inv);
}

static void test_invoice_of_empty_lease(void **state) {
  fixture *f = *state;
  gn_buf inv = {0};
  gn_invoice_summary s;
  assert_int_equal(gn_ledger_begin_lease(f->ledger, f->terms.lease_id, f->agreement.data, f->agreement.len), 0);
  assert_int_equal(fx_invoice_seal(f->ledger, f->provider, f->terms.lease_id, FX_START_S - 5, "released", &inv), 0);
  assert_int_equal(gn_invoice_check(inv.data, inv.len, f->agreement.data, f->agreement.len, 0, 0, &s, NULL, 0), 0);
  assert_int_equal(s.seconds, 0);
  assert_int_equal(s.total_micro, 0);
  assert_int_equal(s.end_s, FX_START_S); /* raised to the start */
  gn_buf_done(&inv);
}

static void test_invoice_seal_requires_the_provider(void **state) {
  fixture *f = *state;
  gn_buf inv = {0};
  fx_ticks(f, 3, 1);
  assert_int_equal(fx_invoice_seal(f->ledger, f->requester, f->terms.lease_id, FX_START_S + 3, "x", &inv), GN_EPERM);
  assert_int_equal(fx_invoice_seal(f->ledger, f->provider, "l-unknown", FX_START_S + 3, "x", &inv), GN_ENOTFOUND);
  assert_int_equal(fx_invoice_seal(f->ledger, f->provider, f->terms.lease_id, FX_START_S + 3, "bad\nreason", &inv),
                   GN_EINVAL);
  gn_buf_done(&inv);
}

static void test_invoice_check_rejects_tampering(void **state) {
  fixture *f = *state;
  gn_buf inv = {0};
  seal20(f, &inv);
  /* The untouched re-encoding must pass, or the table proves nothing. */
  gn_buf same = {0};
  fx_tamper(&inv, m_nothing, f->provider, &same);
  assert_int_equal(
      gn_invoice_check(same.data, same.len, f->agreement.data, f->agreement.len, N_TICKS, 0, NULL, NULL, 0), 0);
  gn_buf_done(&same);
  for (size_t i = 0; i < GN_ARRAY_SIZE(tamper_cases); i++) {
    gn_buf bad = {0};
    char reason[512] = "";
    gn_invoice_summary s;
    memset(&s, 0x5a, sizeof(s));
    fx_tamper(&inv, tamper_cases[i].fn, f->provider, &bad);
    int rc =
        gn_invoice_check(bad.data, bad.len, f->agreement.data, f->agreement.len, 100, 0, &s, reason, sizeof(reason));
    if (rc != GN_EAUDIT || !strstr(reason, tamper_cases[i].want))
      fail_msg("%s: rc %d, reason \"%s\", want \"%s\"", tamper_cases[i].name, rc, reason, tamper_cases[i].want);
    assert_int_equal(s.seconds, 0x5a5a5a5a5a5a5a5aull); /* untouched on failure */
    gn_buf buf = {0};
    assert_int_equal(fx_invoice_accept(f->requester, &f->agreement, bad.data, bad.len, &buf), GN_EAUDIT);
    gn_buf_done(&buf);
    gn_buf_done(&bad);
  }
  gn_buf_done(&inv);
}

static void test_invoice_check_names_broken_signature(void **state) {
  fixture *f = *state;
  gn_buf inv = {0}, other = {0};
  char reason[256], id[GN_NODE_ID_STRLEN];
  seal20(f, &inv);
  inv.data[inv.len - 10] ^= 0x08;
  assert_int_equal(gn_invoice_check(inv.data, inv.len, f->agreement.data, f->agreement.len, N_TICKS, 0, NULL, reason,
                                    sizeof(reason)),
                   GN_EAUDIT);
  gn_node_id_format(f->provider->pk, id);
  assert_non_null(strstr(reason, "invoice signature does not verify against provider gn"));
  assert_non_null(strstr(reason, id));
  /* Validly signed, but by someone who is not the lease's provider. */
  inv.data[inv.len - 10] ^= 0x08;
  fx_tamper(&inv, m_nothing, f->other, &other);
  assert_int_equal(gn_invoice_check(other.data, other.len, f->agreement.data, f->agreement.len, N_TICKS, 0, NULL,
                                    reason, sizeof(reason)),
                   GN_EAUDIT);
  assert_non_null(strstr(reason, "not by the lease's provider"));
  gn_buf_done(&inv);
  gn_buf_done(&other);
}

static void test_invoice_check_rejects_more_than_observed(void **state) {
  fixture *f = *state;
  gn_buf inv = {0};
  char reason[256];
  seal20(f, &inv);
  assert_int_equal(
      gn_invoice_check(inv.data, inv.len, f->agreement.data, f->agreement.len, 15, 4, NULL, reason, sizeof(reason)),
      GN_EAUDIT);
  assert_non_null(strstr(reason, "invoice bills 20 seconds but only 15 were observed (tolerance 4 s)"));
  assert_int_equal(
      gn_invoice_check(inv.data, inv.len, f->agreement.data, f->agreement.len, 15, 5, NULL, reason, sizeof(reason)), 0);
  gn_buf_done(&inv);
}

static void test_invoice_check_rejects_wrong_agreement(void **state) {
  fixture *f = *state;
  gn_buf inv = {0}, req = {0}, ag = {0};
  gn_lease_terms t;
  char reason[256];
  seal20(f, &inv);
  fx_terms(f, &t, 1, 400000, 20);
  fx_agree(f, &t, &req, &ag);
  assert_int_equal(gn_invoice_check(inv.data, inv.len, ag.data, ag.len, N_TICKS, 0, NULL, reason, sizeof(reason)),
                   GN_EAUDIT);
  assert_non_null(strstr(reason, "is for another agreement than the one held"));
  gn_buf_done(&inv);
  gn_buf_done(&req);
  gn_buf_done(&ag);
}

static void test_invoice_check_rejects_garbage(void **state) {
  fixture *f = *state;
  gn_buf inv = {0};
  char reason[256];
  seal20(f, &inv);
  for (size_t n = 0; n < inv.len; n += 13)
    assert_int_equal(
        gn_invoice_check(inv.data, n, f->agreement.data, f->agreement.len, 100, 0, NULL, reason, sizeof(reason)),
        GN_EAUDIT);
  /* An agreement is not an invoice. */
  assert_int_equal(gn_invoice_check(f->agreement.data, f->agreement.len, f->agreement.data, f->agreement.len, 100, 0,
                                    NULL, reason, sizeof(reason)),
                   GN_EAUDIT);
  assert_non_null(strstr(reason, "not an invoice"));
  /* A debit note is never taken for the final invoice. */
  gn_bill_head h0;
  gn_buf note = {0};
  uint8_t *ticks = fx_compact(1, 5, 1);
  assert_int_equal(gn_bill_head_init(f->agreement.data, f->agreement.len, &h0), 0);
  assert_int_equal(
      gn_bill_note_seal(f->provider, f->agreement.data, f->agreement.len, &h0, ticks, 5, FX_START_S + 5, &note, NULL),
      0);
  assert_int_equal(
      gn_invoice_check(note.data, note.len, f->agreement.data, f->agreement.len, 100, 0, NULL, reason, sizeof(reason)),
      GN_EAUDIT);
  assert_non_null(strstr(reason, "not an invoice"));
  assert_int_equal(gn_bill_invoice_check(note.data, note.len, f->agreement.data, f->agreement.len, &h0, 100, 0, 0, NULL,
                                         NULL, reason, sizeof(reason)),
                   GN_EAUDIT);
  free(ticks);
  gn_buf_done(&note);
  gn_buf_done(&inv);
}

static void test_invoice_accept_and_reject(void **state) {
  fixture *f = *state;
  gn_buf inv = {0}, acc = {0}, rej = {0};
  gn_invoice_response resp;
  seal20(f, &inv);
  assert_int_equal(fx_invoice_accept(f->other, &f->agreement, inv.data, inv.len, &acc), GN_EPERM);
  assert_int_equal(fx_invoice_accept(f->provider, &f->agreement, inv.data, inv.len, &acc), GN_EPERM);
  assert_int_equal(fx_invoice_accept(f->requester, &f->agreement, inv.data, inv.len, &acc), 0);
  assert_int_equal(gn_invoice_response_open(acc.data, acc.len, inv.data, inv.len, &resp), 0);
  assert_true(resp.accepted);
  assert_string_equal(resp.lease_id, f->terms.lease_id);
  uint8_t h[32];
  gn__invoice_hash(inv.data, inv.len, h);
  assert_memory_equal(resp.invoice_hash, h, 32);
  assert_true(resp.at_s > 0);
  /* A rejection works even for an invoice whose signature is broken. */
  inv.data[inv.len - 3] ^= 1;
  assert_int_equal(gn_bill_invoice_reject_seal(f->requester, f->agreement.data, f->agreement.len, inv.data, inv.len,
                                               "second 17 is missing", &rej),
                   0);
  assert_int_equal(gn_invoice_response_open(rej.data, rej.len, inv.data, inv.len, &resp), 0);
  assert_false(resp.accepted);
  assert_string_equal(resp.reason, "second 17 is missing");
  /* The acceptance names the original invoice, not the changed one. */
  assert_int_equal(gn_invoice_response_open(acc.data, acc.len, inv.data, inv.len, &resp), GN_EDIGEST);
  inv.data[inv.len - 3] ^= 1;
  /* Signed by someone other than the requester. */
  gn_buf forged = {0};
  gn_envelope e;
  assert_int_equal(gn_envelope_open(acc.data, acc.len, &e), 0);
  assert_int_equal(gn_envelope_seal(f->other, GN_MSG_INVOICE_ACCEPT, e.body, e.body_len, &forged), 0);
  assert_int_equal(gn_invoice_response_open(forged.data, forged.len, inv.data, inv.len, &resp), GN_EPERM);
  acc.data[acc.len - 1] ^= 1;
  assert_int_equal(gn_invoice_response_open(acc.data, acc.len, inv.data, inv.len, &resp), GN_ESIG);
  gn_buf_done(&forged);
  gn_buf_done(&inv);
  gn_buf_done(&acc);
  gn_buf_done(&rej);
}

/* The longest lease's invoice carrying every second from 1 (no debit note
 * ever accepted) fits in one message, and seals and checks. */
static void test_invoice_max_size_fits_a_message(void **state) {
  fixture *f = *state;
  gn_buf req = {0}, ag = {0}, env = {0};
  gn_lease_terms t;
  gn_bill_head h0, h1;
  char reason[256];
  fx_terms(f, &t, 16, 400000, GN_INVOICE_MAX_S);
  fx_agree(f, &t, &req, &ag);
  uint8_t *ticks = fx_compact(1, GN_INVOICE_MAX_S, 16);
  assert_int_equal(gn_bill_head_init(ag.data, ag.len, &h0), 0);
  assert_int_equal(gn_bill_invoice_seal(f->provider, ag.data, ag.len, &h0, ticks, GN_INVOICE_MAX_S,
                                        FX_START_S + GN_INVOICE_MAX_S, "expired", &env, &h1),
                   0);
  assert_true(env.len <= GN_MSG_MAX);
  assert_int_equal(gn_bill_invoice_check(env.data, env.len, ag.data, ag.len, &h0, GN_INVOICE_MAX_S, 0, 0, NULL, NULL,
                                         reason, sizeof(reason)),
                   0);
  assert_int_equal(h1.seconds, GN_INVOICE_MAX_S);
  free(ticks);
  gn_buf_done(&req);
  gn_buf_done(&ag);
  gn_buf_done(&env);
}

/* A rejected invoice exports with its rejection (the provider's export used
 * to leave it out, so the disputed bill audited like an ordinary one). */
static void test_invoice_export_carries_the_rejection(void **state) {
  fixture *f = *state;
  gn_buf inv = {0}, rej = {0};
  json_t *j = NULL;
  gn_bill_audit a;
  seal20(f, &inv);
  assert_int_equal(gn_bill_invoice_reject_seal(f->requester, f->agreement.data, f->agreement.len, inv.data, inv.len,
                                               "second 3 was not given", &rej),
                   0);
  assert_int_equal(gn_invoice_export(inv.data, inv.len, rej.data, rej.len, &j), 0);
  assert_false(json_is_null(json_object_get(j, "response")));
  assert_int_equal(gn_invoice_audit_json(j, &a), GN_EAUDIT);
  assert_int_equal(a.verdict, GN_BILL_REJECTED);
  assert_non_null(strstr(a.reason, "second 3 was not given"));
  json_decref(j);
  gn_buf_done(&inv);
  gn_buf_done(&rej);
}

static void test_invoice_export_refuses_bad_inputs(void **state) {
  fixture *f = *state;
  gn_buf inv = {0}, bad = {0};
  json_t *j = NULL;
  seal20(f, &inv);
  fx_tamper(&inv, m_total, f->provider, &bad);
  assert_int_equal(gn_invoice_export(bad.data, bad.len, NULL, 0, &j), GN_EAUDIT);
  assert_null(j);
  gn_buf_done(&inv);
  gn_buf_done(&bad);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_invoice_check_accepts_honest_invoice, setup20, fx_teardown),
      cmocka_unit_test_setup_teardown(test_invoice_total_uses_gpu_seconds, setup20, fx_teardown),
      cmocka_unit_test_setup_teardown(test_invoice_of_empty_lease, setup20, fx_teardown),
      cmocka_unit_test_setup_teardown(test_invoice_seal_requires_the_provider, setup20, fx_teardown),
      cmocka_unit_test_setup_teardown(test_invoice_check_rejects_tampering, setup20, fx_teardown),
      cmocka_unit_test_setup_teardown(test_invoice_check_names_broken_signature, setup20, fx_teardown),
      cmocka_unit_test_setup_teardown(test_invoice_check_rejects_more_than_observed, setup20, fx_teardown),
      cmocka_unit_test_setup_teardown(test_invoice_check_rejects_wrong_agreement, setup20, fx_teardown),
      cmocka_unit_test_setup_teardown(test_invoice_check_rejects_garbage, setup20, fx_teardown),
      cmocka_unit_test_setup_teardown(test_invoice_accept_and_reject, setup20, fx_teardown),
      cmocka_unit_test_setup_teardown(test_invoice_max_size_fits_a_message, setup20, fx_teardown),
      cmocka_unit_test_setup_teardown(test_invoice_export_carries_the_rejection, setup20, fx_teardown),
      cmocka_unit_test_setup_teardown(test_invoice_export_refuses_bad_inputs, setup20, fx_teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
