/* Tests of debit notes and the final invoice as pure functions
 * (billing/note.c): the round trip seal -> check -> accept -> open, the
 * requester's checks (continuity with its head, changed ticks, another
 * agreement, observation and tolerance, spending cap, max_s, overflow), stale
 * notes, rejections, and the final invoice continuing the last accepted
 * note. */
#include "billing/fixture.h"

#define MAX_S 3600

static int setup(void **state) {
  return fx_setup_with(state, 2, 400000, MAX_S);
}

typedef struct lease {
  fixture *f;
  gn_bill_head head; /* the requester's, and the provider's after each accept */
} lease;

static void lease_init(lease *l, fixture *f) {
  l->f = f;
  assert_int_equal(gn_bill_head_init(f->agreement.data, f->agreement.len, &l->head), 0);
}

/* Seals the next note of n seconds of `gpus` GPUs. */
static void note_seal(lease *l, uint64_t n, uint8_t gpus, gn_buf *env, gn_bill_head *next) {
  uint8_t *t = fx_compact(l->head.seconds + 1, n, gpus);
  assert_int_equal(gn_bill_note_seal(l->f->provider, l->f->agreement.data, l->f->agreement.len, &l->head, t, n,
                                     FX_START_S + (int64_t)(l->head.seconds + n), env, next),
                   0);
  free(t);
}

static int check(lease *l, const gn_buf *env, uint64_t observed, uint64_t cap, gn_bill_head *next, char *reason) {
  return gn_bill_note_check(env->data, env->len, l->f->agreement.data, l->f->agreement.len, &l->head, observed,
                            gn_bill_tolerance_s(observed), cap, next, NULL, reason, 512);
}

static void test_note_tolerance_rule(void **state) {
  (void)state;
  assert_int_equal(gn_bill_tolerance_s(0), 5);
  assert_int_equal(gn_bill_tolerance_s(999), 5);
  assert_int_equal(gn_bill_tolerance_s(1000), 6);
  assert_int_equal(gn_bill_tolerance_s(2592000), 5 + 2592);
  assert_int_equal(gn_bill_tolerance_s(UINT64_MAX), 5 + UINT64_MAX / 1000);
}

static void test_note_head_round_trip(void **state) {
  fixture *f = *state;
  gn_bill_head h, back;
  uint8_t buf[GN_BILL_HEAD_LEN];
  assert_int_equal(gn_bill_head_init(f->agreement.data, f->agreement.len, &h), 0);
  assert_int_equal(h.seq, 0);
  uint8_t g[32];
  gn__genesis(f->agreement.data, f->agreement.len, g);
  assert_memory_equal(h.chain_head, g, 32);
  h.seq = 7;
  h.seconds = 0x0102030405060708ull;
  h.total_micro = UINT64_MAX;
  h.note_hash[3] = 9;
  gn_bill_head_encode(&h, buf);
  assert_int_equal(gn_bill_head_decode(buf, sizeof(buf), &back), 0);
  assert_memory_equal(&h, &back, sizeof(h));
  assert_int_equal(gn_bill_head_decode(buf, sizeof(buf) - 1, &back), GN_EINVAL);
  f->agreement.data[f->agreement.len - 1] ^= 1;
  assert_int_not_equal(gn_bill_head_init(f->agreement.data, f->agreement.len, &h), 0);
  f->agreement.data[f->agreement.len - 1] ^= 1;
}

/* seal -> check -> accept -> open, twice; both sides reach the same head. */
static void test_note_round_trip(void **state) {
  fixture *f = *state;
  lease l;
  gn_buf n1 = {0}, n2 = {0}, a1 = {0}, a1b = {0};
  gn_bill_head prov_next, req_next;
  gn_bill_note no;
  gn_bill_response resp;
  char reason[512] = "x";
  lease_init(&l, f);
  note_seal(&l, 60, 2, &n1, &prov_next);
  assert_int_equal(gn_bill_note_check(n1.data, n1.len, f->agreement.data, f->agreement.len, &l.head, 60, 5, 0,
                                      &req_next, &no, reason, sizeof(reason)),
                   0);
  assert_memory_equal(&prov_next, &req_next, sizeof(req_next));
  assert_int_equal(no.seq, 1);
  assert_int_equal(no.from, 1);
  assert_int_equal(no.n, 60);
  assert_int_equal(req_next.seconds, 60);
  assert_int_equal(req_next.gpu_seconds, 120);
  assert_int_equal(req_next.total_micro, 13333); /* floor(400000 * 120 / 3600) */
  assert_int_equal(gn_bill_note_accept_seal(f->requester, f->agreement.data, f->agreement.len, &req_next, &a1), 0);
  /* Deterministic: a re-sent acceptance is the same bytes. */
  assert_int_equal(gn_bill_note_accept_seal(f->requester, f->agreement.data, f->agreement.len, &req_next, &a1b), 0);
  assert_int_equal(a1.len, a1b.len);
  assert_memory_equal(a1.data, a1b.data, a1.len);
  assert_int_equal(gn_bill_note_accept_seal(f->provider, f->agreement.data, f->agreement.len, &req_next, &a1b),
                   GN_EPERM);
  assert_int_equal(gn_bill_response_open(a1.data, a1.len, f->agreement.data, f->agreement.len, &resp), 0);
  assert_true(resp.accepted);
  assert_false(resp.final);
  assert_int_equal(resp.seq, 1);
  assert_int_equal(resp.seconds, 60);
  assert_int_equal(resp.total_micro, 13333);
  assert_int_equal(gn_bill_response_matches(&resp, &no), 0);
  l.head = req_next;
  /* The second note carries only the seconds since the first. */
  note_seal(&l, 30, 1, &n2, &prov_next);
  assert_int_equal(check(&l, &n2, 90, 0, &req_next, reason), 0);
  assert_int_equal(req_next.seq, 2);
  assert_int_equal(req_next.seconds, 90);
  assert_int_equal(req_next.gpu_seconds, 150);
  assert_true(n2.len < n1.len);
  /* The first note's acceptance does not match the second note. */
  assert_int_equal(gn_bill_note_open(n2.data, n2.len, f->agreement.data, f->agreement.len, &l.head, NULL, &no, reason,
                                     sizeof(reason)),
                   0);
  assert_int_equal(gn_bill_response_matches(&resp, &no), GN_EDIGEST);
  gn_buf_done(&n1);
  gn_buf_done(&n2);
  gn_buf_done(&a1);
  gn_buf_done(&a1b);
}

static void m_tick(gn__bill_body *b, uint8_t *t, size_t *n) {
  (void)b, (void)n;
  t[2 * 4] = 1; /* second 5: 1 GPU instead of 2, chain head kept */
}
static void m_agreement_hash(gn__bill_body *b, uint8_t *t, size_t *n) {
  (void)t, (void)n;
  b->agreement_hash[0] ^= 1;
}
static void m_seq_skip(gn__bill_body *b, uint8_t *t, size_t *n) {
  (void)t, (void)n;
  b->seq = 3;
}
static void m_prev(gn__bill_body *b, uint8_t *t, size_t *n) {
  (void)t, (void)n;
  b->prev[5] ^= 1;
}
static void m_from(gn__bill_body *b, uint8_t *t, size_t *n) {
  (void)t, (void)n;
  b->from = 10;
}
static void m_total(gn__bill_body *b, uint8_t *t, size_t *n) {
  (void)t, (void)n;
  b->total_micro++;
}
static void m_nothing(gn__bill_body *b, uint8_t *t, size_t *n) {
  (void)b, (void)t, (void)n;
}

typedef struct bad_case {
  const char *name;
  fx_mutate_fn fn;
  const char *want;
} bad_case;

static const bad_case bad_cases[] = {
    {"changed tick", m_tick, "chain_head does not match the chain recomputed from our head"},
    {"another agreement", m_agreement_hash, "is for another agreement than the one held"},
    {"skipped seq", m_seq_skip, "seq 3 but the last accepted note is 1 (expected 2)"},
    {"does not continue the head", m_prev, "does not continue the last accepted note"},
    {"gap after the head", m_from, "starts at second 10 but the last accepted note ends at second 60"},
    {"changed total", m_total, "total_micro is"},
};

/* Each tampered second note (validly re-signed by the provider) is rejected
 * with a reason, and the head is left as it was. */
static void test_note_check_rejects_with_a_reason(void **state) {
  fixture *f = *state;
  lease l;
  gn_buf n1 = {0}, n2 = {0};
  gn_bill_head next;
  char reason[512];
  lease_init(&l, f);
  note_seal(&l, 60, 2, &n1, &next);
  l.head = next;
  note_seal(&l, 30, 2, &n2, NULL);
  gn_buf same = {0};
  fx_tamper(&n2, m_nothing, f->provider, &same);
  assert_int_equal(check(&l, &same, 90, 0, &next, reason), 0);
  gn_buf_done(&same);
  for (size_t i = 0; i < GN_ARRAY_SIZE(bad_cases); i++) {
    gn_buf bad = {0};
    gn_bill_head keep;
    memset(&keep, 0x5a, sizeof(keep));
    reason[0] = 0;
    fx_tamper(&n2, bad_cases[i].fn, f->provider, &bad);
    int rc = check(&l, &bad, 90, 0, &keep, reason);
    if (rc != GN_EAUDIT || !strstr(reason, bad_cases[i].want))
      fail_msg("%s: rc %d, reason \"%s\", want \"%s\"", bad_cases[i].name, rc, reason, bad_cases[i].want);
    assert_int_equal(keep.seq, 0x5a5a5a5a5a5a5a5aull); /* untouched */
    gn_buf_done(&bad);
  }
  /* Signed by someone else. */
  gn_buf other = {0};
  fx_tamper(&n2, m_nothing, f->other, &other);
  assert_int_equal(check(&l, &other, 90, 0, &next, reason), GN_EAUDIT);
  assert_non_null(strstr(reason, "not by the lease's provider"));
  gn_buf_done(&other);
  gn_buf_done(&n1);
  gn_buf_done(&n2);
}

/* Seconds beyond what the requester observed plus the stated tolerance. */
static void test_note_check_rejects_more_than_observed(void **state) {
  fixture *f = *state;
  lease l;
  gn_buf n = {0};
  gn_bill_head next;
  char reason[512];
  lease_init(&l, f);
  note_seal(&l, 100, 2, &n, NULL);
  assert_int_equal(check(&l, &n, 94, 0, &next, reason), GN_EAUDIT); /* 94 + 5 < 100 */
  assert_non_null(strstr(reason, "bills 100 seconds but only 94 were observed (tolerance 5 s)"));
  assert_int_equal(check(&l, &n, 95, 0, &next, reason), 0);
  gn_buf_done(&n);
}

static void test_note_check_enforces_the_spending_cap(void **state) {
  fixture *f = *state;
  lease l;
  gn_buf n = {0};
  gn_bill_head next;
  char reason[512];
  lease_init(&l, f);
  note_seal(&l, 100, 2, &n, NULL); /* 200 GPU-s: 22222 micro */
  assert_int_equal(check(&l, &n, 100, 22221, &next, reason), GN_EAUDIT);
  assert_non_null(strstr(reason, "spending cap"));
  assert_int_equal(check(&l, &n, 100, 22222, &next, reason), 0);
  assert_int_equal(check(&l, &n, 100, 0, &next, reason), 0); /* 0: no cap */
  gn_buf_done(&n);
}

static void test_note_check_rejects_a_wrong_agreement(void **state) {
  fixture *f = *state;
  lease l;
  gn_buf n = {0}, req = {0}, ag = {0};
  gn_lease_terms t;
  gn_bill_head h2, next;
  char reason[512];
  lease_init(&l, f);
  note_seal(&l, 10, 2, &n, NULL);
  fx_terms(f, &t, 2, 400000, MAX_S);
  fx_agree(f, &t, &req, &ag);
  assert_int_equal(gn_bill_head_init(ag.data, ag.len, &h2), 0);
  assert_int_equal(gn_bill_note_check(n.data, n.len, ag.data, ag.len, &h2, 10, 5, 0, &next, NULL, reason, 512),
                   GN_EAUDIT);
  assert_non_null(strstr(reason, "another agreement"));
  gn_buf_done(&n);
  gn_buf_done(&req);
  gn_buf_done(&ag);
}

/* A note whose prev is before our head (the provider missed our acceptance):
 * GN_ESTATE, so the requester re-sends its acceptance instead of rejecting. */
static void test_note_stale_note_is_not_rejected(void **state) {
  fixture *f = *state;
  lease l;
  gn_buf n1 = {0}, n1b = {0};
  gn_bill_head h0, next;
  char reason[512];
  lease_init(&l, f);
  h0 = l.head;
  note_seal(&l, 10, 2, &n1, &next);
  note_seal(&l, 20, 2, &n1b, NULL); /* superseding the lost n1: same prev, more seconds */
  l.head = next;                    /* n1 accepted */
  assert_int_equal(check(&l, &n1, 30, 0, &next, reason), GN_ESTATE);
  assert_int_equal(check(&l, &n1b, 30, 0, &next, reason), GN_ESTATE);
  assert_non_null(strstr(reason, "re-send"));
  /* From the fresh head, the superseding note is the one accepted. */
  l.head = h0;
  assert_int_equal(check(&l, &n1b, 30, 0, &next, reason), 0);
  assert_int_equal(next.seconds, 20);
  gn_buf_done(&n1);
  gn_buf_done(&n1b);
}

static void test_note_reject_names_the_note(void **state) {
  fixture *f = *state;
  lease l;
  gn_buf n = {0}, rej = {0};
  gn_bill_response resp;
  gn_bill_note no;
  char reason[512];
  lease_init(&l, f);
  note_seal(&l, 10, 2, &n, NULL);
  assert_int_equal(gn_bill_note_reject_seal(f->requester, f->agreement.data, f->agreement.len, n.data, n.len,
                                            "spending cap\n reached", &rej),
                   0);
  assert_int_equal(gn_bill_response_open(rej.data, rej.len, f->agreement.data, f->agreement.len, &resp), 0);
  assert_false(resp.accepted);
  assert_int_equal(resp.seq, 1);
  assert_string_equal(resp.reason, "spending cap? reached");
  assert_int_equal(
      gn_bill_note_open(n.data, n.len, f->agreement.data, f->agreement.len, &l.head, NULL, &no, reason, sizeof(reason)),
      0);
  assert_int_equal(gn_bill_response_matches(&resp, &no), 0);
  /* Only the agreement's requester may answer. */
  gn_buf forged = {0};
  gn_envelope e;
  assert_int_equal(gn_envelope_open(rej.data, rej.len, &e), 0);
  assert_int_equal(gn_envelope_seal(f->other, GN_MSG_DEBIT_REJECT, e.body, e.body_len, &forged), 0);
  assert_int_equal(gn_bill_response_open(forged.data, forged.len, f->agreement.data, f->agreement.len, &resp),
                   GN_EPERM);
  rej.data[rej.len - 1] ^= 1;
  assert_int_equal(gn_bill_response_open(rej.data, rej.len, f->agreement.data, f->agreement.len, &resp), GN_ESIG);
  /* Garbage is answered with a rejection too (seq unknown: 0). */
  gn_buf rej2 = {0};
  const uint8_t junk[] = {1, 2, 3};
  assert_int_equal(
      gn_bill_note_reject_seal(f->requester, f->agreement.data, f->agreement.len, junk, sizeof(junk), "", &rej2), 0);
  assert_int_equal(gn_bill_response_open(rej2.data, rej2.len, f->agreement.data, f->agreement.len, &resp), 0);
  assert_int_equal(resp.seq, 0);
  assert_string_equal(resp.reason, "rejected");
  gn_buf_done(&n);
  gn_buf_done(&rej);
  gn_buf_done(&rej2);
  gn_buf_done(&forged);
}

static void test_note_seal_refuses_bad_input(void **state) {
  fixture *f = *state;
  lease l;
  gn_buf env = {0};
  lease_init(&l, f);
  uint8_t *t = fx_compact(1, MAX_S + 1, 2);
  const gn_buf *ag = &f->agreement;
  assert_int_equal(gn_bill_note_seal(f->requester, ag->data, ag->len, &l.head, t, 10, 0, &env, NULL), GN_EPERM);
  assert_int_equal(gn_bill_note_seal(f->provider, ag->data, ag->len, &l.head, t, 0, 0, &env, NULL), GN_EINVAL);
  /* More seconds than max_s. */
  assert_int_equal(gn_bill_note_seal(f->provider, ag->data, ag->len, &l.head, t, MAX_S + 1, 0, &env, NULL), GN_EINVAL);
  /* More GPUs than leased, util not a percentage. */
  t[0] = 3;
  assert_int_equal(gn_bill_note_seal(f->provider, ag->data, ag->len, &l.head, t, 10, 0, &env, NULL), GN_EINVAL);
  t[0] = 2;
  t[1] = 150;
  assert_int_equal(gn_bill_note_seal(f->provider, ag->data, ag->len, &l.head, t, 10, 0, &env, NULL), GN_EINVAL);
  /* A head whose seconds would overflow. */
  t[1] = 1;
  gn_bill_head h = l.head;
  h.seconds = UINT64_MAX;
  assert_int_equal(gn_bill_note_seal(f->provider, ag->data, ag->len, &h, t, 10, 0, &env, NULL), GN_EINVAL);
  assert_int_equal(env.len, 0);
  free(t);
}

/* Totals overflow is an error, never a saturated value (the old code billed
 * UINT64_MAX and the audit recomputed the same saturated figure). */
static void test_note_total_overflow_is_an_error(void **state) {
  fixture *f = *state;
  gn_buf req = {0}, ag = {0}, env = {0};
  gn_lease_terms t;
  gn_bill_head h, next;
  uint64_t micro = 0;
  char reason[512];
  assert_int_equal(gn_price_cost_checked(UINT64_MAX, 16, UINT64_MAX, &micro), GN_ETOOBIG);
  assert_int_equal(gn_price_cost_checked(UINT64_MAX, 1, 3600, &micro), 0);
  assert_int_equal(micro, UINT64_MAX);
  assert_int_equal(gn_price_cost_checked(UINT64_MAX, 1, 3601, &micro), GN_ETOOBIG);
  fx_terms(f, &t, 1, UINT64_MAX, 7200);
  fx_agree(f, &t, &req, &ag);
  assert_int_equal(gn_bill_head_init(ag.data, ag.len, &h), 0);
  uint8_t *ticks = fx_compact(1, 7200, 1);
  assert_int_equal(gn_bill_note_seal(f->provider, ag.data, ag.len, &h, ticks, 7200, 0, &env, NULL), GN_EINVAL);
  /* 3600 GPU-seconds cost exactly UINT64_MAX: billable. */
  assert_int_equal(gn_bill_note_seal(f->provider, ag.data, ag.len, &h, ticks, 3600, 0, &env, &next), 0);
  assert_int_equal(next.total_micro, UINT64_MAX);
  /* A provider's note claiming the saturated total for more is refused. */
  gn_buf big = {0};
  assert_int_equal(gn_bill_note_check(env.data, env.len, ag.data, ag.len, &h, 3600, 5, 0, &next, NULL, reason, 512), 0);
  gn_bill_head h2 = next;
  /* A hand-built note for second 3601 with total UINT64_MAX. */
  gn__bill_body b;
  memset(&b, 0, sizeof(b));
  snprintf(b.lease_id, sizeof(b.lease_id), "%s", t.lease_id);
  gn__genesis(ag.data, ag.len, b.agreement_hash);
  b.seq = 2;
  memcpy(b.prev, h2.note_hash, 32);
  b.from = 3601;
  b.ticks = ticks;
  b.ticks_len = 2;
  b.seconds = 3601;
  b.gpu_seconds = 3601;
  memcpy(b.chain_head, h2.chain_head, 32);
  gn__tick_hash(b.chain_head, t.lease_id, 3601, 1, ticks[1], b.chain_head);
  b.total_micro = UINT64_MAX;
  gn_buf body = {0};
  assert_int_equal(gn__bill_body_encode(&b, &body), 0);
  assert_int_equal(gn_envelope_seal(f->provider, GN_MSG_DEBIT_NOTE, body.data, body.len, &big), 0);
  assert_int_equal(gn_bill_note_check(big.data, big.len, ag.data, ag.len, &h2, 3601, 5, 0, &next, NULL, reason, 512),
                   GN_EAUDIT);
  assert_non_null(strstr(reason, "total overflows"));
  free(ticks);
  gn_buf_done(&req);
  gn_buf_done(&ag);
  gn_buf_done(&env);
  gn_buf_done(&big);
  gn_buf_done(&body);
}

/* The final invoice continues the last accepted note and carries only the
 * seconds since; the same checks apply, plus the window. */
static void test_note_final_invoice_continues_the_head(void **state) {
  fixture *f = *state;
  lease l;
  gn_buf n1 = {0}, inv = {0}, acc = {0}, rej = {0}, stale = {0};
  gn_bill_head next, fin, h0;
  gn_bill_note no;
  gn_bill_response resp;
  char reason[512];
  const gn_buf *ag = &f->agreement;
  lease_init(&l, f);
  h0 = l.head;
  note_seal(&l, 60, 2, &n1, &next);
  assert_int_equal(check(&l, &n1, 60, 0, &next, reason), 0);
  l.head = next;
  uint8_t *t = fx_compact(61, 15, 2);
  assert_int_equal(
      gn_bill_invoice_seal(f->provider, ag->data, ag->len, &l.head, t, 15, FX_START_S + 75, "released", &inv, &fin), 0);
  assert_int_equal(gn_bill_invoice_check(inv.data, inv.len, ag->data, ag->len, &l.head, 75, 5, 0, &next, &no, reason,
                                         sizeof(reason)),
                   0);
  assert_memory_equal(&fin, &next, sizeof(fin));
  assert_true(no.final);
  assert_int_equal(no.seq, 1);
  assert_int_equal(no.from, 61);
  assert_int_equal(no.seconds, 75);
  assert_string_equal(no.end_reason, "released");
  /* From the genesis head (a requester that never accepted n1) it does not
   * continue: rejected, never GN_ESTATE. */
  assert_int_equal(
      gn_bill_invoice_check(inv.data, inv.len, ag->data, ag->len, &h0, 75, 5, 0, &next, NULL, reason, sizeof(reason)),
      GN_EAUDIT);
  assert_non_null(strstr(reason, "seq 1 but the last accepted note is 0"));
  /* More than observed, over the cap. */
  assert_int_equal(gn_bill_invoice_check(inv.data, inv.len, ag->data, ag->len, &l.head, 60, 5, 0, &next, NULL, reason,
                                         sizeof(reason)),
                   GN_EAUDIT);
  assert_int_equal(gn_bill_invoice_check(inv.data, inv.len, ag->data, ag->len, &l.head, 75, 5, 1000, &next, NULL,
                                         reason, sizeof(reason)),
                   GN_EAUDIT);
  assert_non_null(strstr(reason, "spending cap"));
  /* The final voucher and a rejection, opened by the provider. */
  assert_int_equal(gn_bill_invoice_accept_seal(f->requester, ag->data, ag->len, &fin, FX_START_S + 80, &acc), 0);
  assert_int_equal(gn_bill_response_open(acc.data, acc.len, ag->data, ag->len, &resp), 0);
  assert_true(resp.accepted && resp.final);
  assert_int_equal(resp.accepted_s, FX_START_S + 80);
  assert_int_equal(resp.seconds, 75);
  assert_int_equal(gn_bill_response_matches(&resp, &no), 0);
  assert_int_equal(
      gn_bill_invoice_reject_seal(f->requester, ag->data, ag->len, inv.data, inv.len, "second 70 not given", &rej), 0);
  assert_int_equal(gn_bill_response_open(rej.data, rej.len, ag->data, ag->len, &resp), 0);
  assert_false(resp.accepted);
  assert_true(resp.final);
  assert_string_equal(resp.reason, "second 70 not given");
  /* A note's acceptance never answers the invoice. */
  assert_int_equal(gn_bill_note_accept_seal(f->requester, ag->data, ag->len, &l.head, &stale), 0);
  assert_int_equal(gn_bill_response_open(stale.data, stale.len, ag->data, ag->len, &resp), 0);
  assert_int_equal(gn_bill_response_matches(&resp, &no), GN_EDIGEST);
  /* An end_s before the billed seconds is raised (never a window too short);
   * an invoice of 0 seconds after the head is fine. */
  gn_buf inv0 = {0};
  assert_int_equal(
      gn_bill_invoice_seal(f->provider, ag->data, ag->len, &l.head, NULL, 0, FX_START_S, "expired", &inv0, &fin), 0);
  assert_int_equal(gn_bill_invoice_check(inv0.data, inv0.len, ag->data, ag->len, &l.head, 60, 5, 0, &next, &no, reason,
                                         sizeof(reason)),
                   0);
  assert_int_equal(no.end_s, FX_START_S + 60);
  assert_int_equal(no.seconds, 60);
  free(t);
  gn_buf_done(&n1);
  gn_buf_done(&inv);
  gn_buf_done(&inv0);
  gn_buf_done(&acc);
  gn_buf_done(&rej);
  gn_buf_done(&stale);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_note_tolerance_rule),
      cmocka_unit_test_setup_teardown(test_note_head_round_trip, setup, fx_teardown),
      cmocka_unit_test_setup_teardown(test_note_round_trip, setup, fx_teardown),
      cmocka_unit_test_setup_teardown(test_note_check_rejects_with_a_reason, setup, fx_teardown),
      cmocka_unit_test_setup_teardown(test_note_check_rejects_more_than_observed, setup, fx_teardown),
      cmocka_unit_test_setup_teardown(test_note_check_enforces_the_spending_cap, setup, fx_teardown),
      cmocka_unit_test_setup_teardown(test_note_check_rejects_a_wrong_agreement, setup, fx_teardown),
      cmocka_unit_test_setup_teardown(test_note_stale_note_is_not_rejected, setup, fx_teardown),
      cmocka_unit_test_setup_teardown(test_note_reject_names_the_note, setup, fx_teardown),
      cmocka_unit_test_setup_teardown(test_note_seal_refuses_bad_input, setup, fx_teardown),
      cmocka_unit_test_setup_teardown(test_note_total_overflow_is_an_error, setup, fx_teardown),
      cmocka_unit_test_setup_teardown(test_note_final_invoice_continues_the_head, setup, fx_teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
