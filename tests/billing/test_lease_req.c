/* Tests of the requester's lease machine (billing/lease_req.c): accepting an
 * honest debit note (persisted before the voucher is sent), rejecting one
 * beyond its own observation plus the tolerance or beyond the spending cap,
 * re-sending its acceptance when the provider missed it, at most one final
 * invoice countersigned, a debit note never taken as final, the release,
 * and a restart that observes from its own UTC of receipt (never the
 * provider's start_s). The provider's messages are sealed with the pure
 * billing functions. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
/* cmocka needs the above first. */
#include <cmocka.h>

#include "billing/lease_helpers.h"

#define START_S 1764670000
#define COUNT 2
#define PRICE 3600000 /* 1000 micro per GPU-second */

typedef struct rq {
  gn_identity *prov, *req, *other;
  gn_buf ag;
  lh_lease terms;
  gn_lease_req *m;
  gn_lease_out out;
  int64_t utc0;    /* requester UTC at its mono 0 */
  gn_bill_head ph; /* the provider's head (last note it knows accepted) */
} rq;

static gn_lease_now rq_now(const rq *q, uint64_t mono_ms) {
  return lh_now(mono_ms, q->utc0 + (int64_t)(mono_ms / 1000));
}

static int rq_setup_with(void **state, int64_t start_s, uint64_t max_spend) {
  rq *q = calloc(1, sizeof(*q));
  assert_non_null(q);
  q->prov = lh_identity(2, 'p');
  q->req = lh_identity(2, 'r');
  q->other = lh_identity(2, 'o');
  q->terms = (lh_lease){COUNT, PRICE, 100000, 10, start_s, 7};
  assert_int_equal(lh_agreement(q->prov, q->req, &q->terms, &q->ag), 0);
  assert_int_equal(gn_bill_head_init(q->ag.data, q->ag.len, &q->ph), 0);
  q->utc0 = START_S + 1; /* the agreement arrives a second after the provider's start */
  assert_int_equal(gn_lease_req_new(q->req, q->ag.data, q->ag.len, max_spend, rq_now(q, 0), &q->m, &q->out), 0);
  assert_int_equal(lh_count(&q->out, GN_LEASE_ACT_PERSIST), 1);
  *state = q;
  return 0;
}

static int rq_setup(void **state) {
  return rq_setup_with(state, START_S, 0);
}

static int rq_setup_cap(void **state) {
  return rq_setup_with(state, START_S, 20000); /* 10 s of 2 GPUs */
}

/* The provider claims the lease started an hour before it did. */
static int rq_setup_backdated(void **state) {
  return rq_setup_with(state, START_S - 3600, 0);
}

static int rq_teardown(void **state) {
  rq *q = *state;
  gn_lease_req_free(q->m);
  gn_lease_out_done(&q->out);
  gn_identity_free(q->prov);
  gn_identity_free(q->req);
  gn_identity_free(q->other);
  gn_buf_done(&q->ag);
  free(q);
  return 0;
}

/* A note continuing head with n seconds of gpus GPUs. */
static void rq_note(rq *q, const gn_bill_head *head, uint64_t n, uint8_t gpus, gn_buf *env, gn_bill_head *next) {
  uint8_t *t = lh_ticks(n, gpus);
  assert_non_null(t);
  assert_int_equal(gn_bill_note_seal(q->prov, q->ag.data, q->ag.len, head, t, n, START_S, env, next), 0);
  free(t);
}

static void rq_invoice(rq *q, const gn_bill_head *head, uint64_t n, const char *reason, gn_buf *env) {
  uint8_t *t = lh_ticks(n, COUNT);
  gn_bill_head fin;
  assert_non_null(t);
  assert_int_equal(gn_bill_invoice_seal(q->prov, q->ag.data, q->ag.len, head, t, n,
                                        q->terms.start_s + (int64_t)(head->seconds + n) + 2, reason, env, &fin),
                   0);
  free(t);
}

static int rq_recv(rq *q, uint64_t mono_ms, const gn_buf *env) {
  return gn_lease_req_recv(q->m, rq_now(q, mono_ms), env->data, env->len, &q->out);
}

static void test_req_refuses_another_identity(void **state) {
  rq *q = *state;
  gn_lease_req *m = NULL;
  gn_lease_out o = {0};
  assert_int_equal(gn_lease_req_new(q->prov, q->ag.data, q->ag.len, 0, rq_now(q, 0), &m, &o), GN_EPERM);
  assert_null(m);
  gn_lease_out_done(&o);
}

static void test_req_accepts_honest_note(void **state) {
  rq *q = *state;
  gn_buf note = {0};
  gn_bill_head next;
  rq_note(q, &q->ph, 10, COUNT, &note, &next);
  assert_int_equal(rq_recv(q, 10200, &note), 0);
  /* Persisted before the acceptance leaves. */
  assert_true(lh_pos(&q->out, GN_LEASE_ACT_PERSIST) < lh_pos(&q->out, GN_LEASE_ACT_SEND));
  assert_int_equal(lh_count(&q->out, GN_LEASE_ACT_VOUCHER), 1);
  const gn_lease_action *s = lh_sent(&q->out, GN_MSG_DEBIT_ACCEPT);
  assert_non_null(s);
  gn_bill_response resp;
  assert_int_equal(gn_bill_response_open(s->data, s->len, q->ag.data, q->ag.len, &resp), 0);
  assert_true(resp.accepted);
  assert_int_equal(resp.seq, 1);
  assert_int_equal(resp.seconds, 10);
  assert_int_equal(resp.total_micro, 20000);
  assert_memory_equal(resp.hash, next.note_hash, 32);
  gn_lease_info info;
  gn_lease_req_info(q->m, rq_now(q, 10200), &info);
  assert_int_equal(info.accepted_s, 10);
  assert_int_equal(info.phase, GN_LEASE_PHASE_ACTIVE); /* a debit note is never the final invoice */
  gn_buf_done(&note);
}

static void test_req_rejects_beyond_observation(void **state) {
  rq *q = *state;
  gn_buf note = {0};
  gn_bill_head next;
  /* Observed 10 s: the tolerance is 5 s, so 16 s is too many. */
  rq_note(q, &q->ph, 16, COUNT, &note, &next);
  assert_int_equal(rq_recv(q, 10000, &note), GN_EAUDIT);
  assert_int_equal(lh_count(&q->out, GN_LEASE_ACT_VOUCHER), 0);
  const gn_lease_action *rj = lh_find(&q->out, GN_LEASE_ACT_REJECTED, 0);
  assert_non_null(rj);
  assert_true(strlen(rj->reason) > 0);
  const gn_lease_action *s = lh_sent(&q->out, GN_MSG_DEBIT_REJECT);
  assert_non_null(s);
  gn_bill_response resp;
  assert_int_equal(gn_bill_response_open(s->data, s->len, q->ag.data, q->ag.len, &resp), 0);
  assert_false(resp.accepted);
  assert_memory_equal(resp.hash, next.note_hash, 32);
  /* 15 s (observed + tolerance) is accepted. */
  note.len = 0;
  rq_note(q, &q->ph, 15, COUNT, &note, &next);
  assert_int_equal(rq_recv(q, 10000, &note), 0);
  assert_int_equal(lh_count(&q->out, GN_LEASE_ACT_VOUCHER), 1);
  gn_buf_done(&note);
}

static void test_req_resends_acceptance_provider_missed(void **state) {
  rq *q = *state;
  gn_buf a = {0}, b = {0}, first = {0};
  gn_bill_head na, nb;
  rq_note(q, &q->ph, 10, COUNT, &a, &na);
  assert_int_equal(rq_recv(q, 10100, &a), 0);
  const gn_lease_action *s = lh_sent(&q->out, GN_MSG_DEBIT_ACCEPT);
  assert_non_null(s);
  assert_int_equal(gn_buf_append(&first, s->data, s->len), 0);
  /* The provider never saw it: its next note continues the same head. */
  rq_note(q, &q->ph, 20, COUNT, &b, &nb);
  assert_int_equal(rq_recv(q, 20100, &b), 0);
  assert_int_equal(lh_count(&q->out, GN_LEASE_ACT_VOUCHER), 0);
  assert_int_equal(lh_count(&q->out, GN_LEASE_ACT_REJECTED), 0);
  s = lh_sent(&q->out, GN_MSG_DEBIT_ACCEPT);
  assert_non_null(s);
  assert_int_equal(s->len, first.len);
  assert_memory_equal(s->data, first.data, first.len); /* the same voucher */
  /* The same note again: the same answer. */
  assert_int_equal(rq_recv(q, 20200, &a), 0);
  s = lh_sent(&q->out, GN_MSG_DEBIT_ACCEPT);
  assert_non_null(s);
  assert_memory_equal(s->data, first.data, first.len);
  gn_lease_info info;
  gn_lease_req_info(q->m, rq_now(q, 20200), &info);
  assert_int_equal(info.accepted_s, 10);
  gn_buf_done(&a);
  gn_buf_done(&b);
  gn_buf_done(&first);
}

static void test_req_spending_cap_releases_in_time(void **state) {
  rq *q = *state;
  /* 20000 micro is 10 s of 2 GPUs: released at 5 s observed, so that even
   * the 5 s tolerance on top stays within the cap. */
  assert_int_equal(q->out.timer_at_ms, 5000);
  assert_int_equal(gn_lease_req_timer(q->m, rq_now(q, 4999), &q->out), 0);
  assert_int_equal(lh_count(&q->out, GN_LEASE_ACT_RELEASE), 0);
  assert_int_equal(gn_lease_req_timer(q->m, rq_now(q, 5000), &q->out), 0);
  assert_int_equal(lh_count(&q->out, GN_LEASE_ACT_RELEASE), 1);
  assert_true(lh_pos(&q->out, GN_LEASE_ACT_PERSIST) < lh_pos(&q->out, GN_LEASE_ACT_END));
  const gn_lease_action *end = lh_find(&q->out, GN_LEASE_ACT_END, 0);
  assert_non_null(end);
  assert_non_null(strstr(end->reason, "spending cap"));
  /* The honest final invoice (the provider heard of it 5 s later) is paid. */
  gn_buf inv = {0};
  rq_invoice(q, &q->ph, 10, "released", &inv);
  assert_int_equal(rq_recv(q, 11000, &inv), 0);
  assert_non_null(lh_sent(&q->out, GN_MSG_INVOICE_ACCEPT));
  gn_buf_done(&inv);
}

static void test_req_spending_cap_refuses_beyond(void **state) {
  rq *q = *state;
  gn_buf a = {0}, b = {0}, st = {0}, inv = {0};
  gn_bill_head na, nb;
  /* Its timer ran late: 12 s observed when a note of 15 s (30000) comes,
   * within the observation but over the cap. */
  rq_note(q, &q->ph, 15, COUNT, &b, &nb);
  assert_int_equal(rq_recv(q, 12000, &b), GN_EAUDIT);
  const gn_lease_action *rj = lh_find(&q->out, GN_LEASE_ACT_REJECTED, 0);
  assert_non_null(rj);
  assert_non_null(strstr(rj->reason, "spending cap"));
  assert_non_null(lh_sent(&q->out, GN_MSG_DEBIT_REJECT));
  assert_int_equal(lh_count(&q->out, GN_LEASE_ACT_RELEASE), 1); /* and the cap releases it */
  const gn_lease_action *p = lh_find(&q->out, GN_LEASE_ACT_PERSIST, 0);
  assert_non_null(p);
  /* 10 s (20000, the cap) is accepted. */
  rq_note(q, &q->ph, 10, COUNT, &a, &na);
  assert_int_equal(rq_recv(q, 12100, &a), 0);
  p = lh_find(&q->out, GN_LEASE_ACT_PERSIST, 0);
  assert_non_null(p);
  assert_int_equal(gn_buf_append(&st, p->data, p->len), 0);
  /* The cap survives a restart: a final invoice over it is the dispute. */
  q->m = gn_lease_req_free(q->m);
  assert_int_equal(
      gn_lease_req_restore(q->req, q->ag.data, q->ag.len, st.data, st.len, rq_now(q, 30000), &q->m, &q->out), 0);
  rq_invoice(q, &na, 2, "released", &inv);
  assert_int_equal(rq_recv(q, 30000, &inv), GN_EAUDIT);
  const gn_lease_action *set = lh_find(&q->out, GN_LEASE_ACT_SETTLED, 0);
  assert_non_null(set);
  assert_false(set->accepted);
  assert_non_null(strstr(set->reason, "spending cap"));
  gn_buf_done(&inv);
  gn_buf_done(&st);
  gn_buf_done(&a);
  gn_buf_done(&b);
}

static void test_req_countersigns_one_final_invoice(void **state) {
  rq *q = *state;
  gn_buf a = {0}, inv = {0}, inv2 = {0}, first = {0};
  gn_bill_head na;
  rq_note(q, &q->ph, 10, COUNT, &a, &na);
  assert_int_equal(rq_recv(q, 10100, &a), 0);
  rq_invoice(q, &na, 3, "released", &inv);
  assert_int_equal(rq_recv(q, 14000, &inv), 0);
  const gn_lease_action *set = lh_find(&q->out, GN_LEASE_ACT_SETTLED, 0);
  assert_non_null(set);
  assert_true(set->accepted);
  assert_int_equal(lh_count(&q->out, GN_LEASE_ACT_END), 1);
  assert_string_equal(lh_find(&q->out, GN_LEASE_ACT_END, 0)->reason, "provider: released");
  const gn_lease_action *s = lh_sent(&q->out, GN_MSG_INVOICE_ACCEPT);
  assert_non_null(s);
  assert_int_equal(gn_buf_append(&first, s->data, s->len), 0);
  /* The same invoice again: the same countersignature, nothing new. */
  assert_int_equal(rq_recv(q, 50000, &inv), 0);
  s = lh_sent(&q->out, GN_MSG_INVOICE_ACCEPT);
  assert_non_null(s);
  assert_memory_equal(s->data, first.data, first.len);
  assert_int_equal(lh_count(&q->out, GN_LEASE_ACT_SETTLED), 0);
  /* Another final invoice for the same lease is refused. */
  rq_invoice(q, &na, 2, "expired", &inv2);
  assert_int_equal(rq_recv(q, 50000, &inv2), GN_EAUDIT);
  assert_null(lh_sent(&q->out, GN_MSG_INVOICE_ACCEPT));
  assert_non_null(lh_sent(&q->out, GN_MSG_INVOICE_REJECT));
  gn_lease_info info;
  gn_lease_req_info(q->m, rq_now(q, 50000), &info);
  assert_int_equal(info.phase, GN_LEASE_PHASE_SETTLED);
  assert_true(info.invoice_accepted);
  /* And a debit note after the end is not answered at all. */
  gn_buf b = {0};
  gn_bill_head nb;
  rq_note(q, &na, 3, COUNT, &b, &nb);
  assert_int_equal(rq_recv(q, 50000, &b), GN_ESTATE);
  assert_int_equal(q->out.n, 0);
  gn_buf_done(&b);
  gn_buf_done(&a);
  gn_buf_done(&inv);
  gn_buf_done(&inv2);
  gn_buf_done(&first);
}

static void test_req_invoice_after_missed_acceptance_gets_it_again(void **state) {
  rq *q = *state;
  gn_buf a = {0}, inv = {0}, first = {0};
  gn_bill_head na;
  rq_note(q, &q->ph, 10, COUNT, &a, &na);
  assert_int_equal(rq_recv(q, 10100, &a), 0);
  const gn_lease_action *s = lh_sent(&q->out, GN_MSG_DEBIT_ACCEPT);
  assert_int_equal(gn_buf_append(&first, s->data, s->len), 0);
  /* The provider ended the lease without our acceptance: its invoice
   * continues the head before ours. We send the acceptance, not a
   * rejection, and wait for the invoice that continues it. */
  rq_invoice(q, &q->ph, 12, "released", &inv);
  assert_int_equal(rq_recv(q, 12500, &inv), 0);
  assert_null(lh_sent(&q->out, GN_MSG_INVOICE_REJECT));
  assert_null(lh_sent(&q->out, GN_MSG_INVOICE_ACCEPT));
  s = lh_sent(&q->out, GN_MSG_DEBIT_ACCEPT);
  assert_non_null(s);
  assert_memory_equal(s->data, first.data, first.len);
  inv.len = 0;
  rq_invoice(q, &na, 2, "released", &inv);
  assert_int_equal(rq_recv(q, 13000, &inv), 0);
  assert_non_null(lh_sent(&q->out, GN_MSG_INVOICE_ACCEPT));
  gn_buf_done(&a);
  gn_buf_done(&inv);
  gn_buf_done(&first);
}

static void test_req_ignores_other_signer(void **state) {
  rq *q = *state;
  gn_buf a = {0}, forged = {0};
  gn_bill_head na;
  gn_envelope e;
  rq_note(q, &q->ph, 10, COUNT, &a, &na);
  assert_int_equal(gn_envelope_open(a.data, a.len, &e), 0);
  assert_int_equal(gn_envelope_seal(q->other, GN_MSG_DEBIT_NOTE, e.body, e.body_len, &forged), 0);
  assert_int_equal(rq_recv(q, 10100, &forged), GN_EPERM);
  assert_int_equal(q->out.n, 0);
  forged.data[forged.len / 2] ^= 0x40; /* broken bytes */
  assert_true(rq_recv(q, 10100, &forged) < 0);
  assert_int_equal(q->out.n, 0);
  gn_buf_done(&a);
  gn_buf_done(&forged);
}

static void test_req_refuses_bills_of_another_lease(void **state) {
  rq *q = *state;
  gn_buf ag2 = {0}, note = {0}, inv = {0};
  lh_lease t2 = q->terms;
  t2.nonce = 8; /* the same parties, another lease */
  assert_int_equal(lh_agreement(q->prov, q->req, &t2, &ag2), 0);
  gn_bill_head h2, n2, fin;
  assert_int_equal(gn_bill_head_init(ag2.data, ag2.len, &h2), 0);
  uint8_t *t = lh_ticks(5, COUNT);
  assert_int_equal(gn_bill_note_seal(q->prov, ag2.data, ag2.len, &h2, t, 5, START_S, &note, &n2), 0);
  assert_int_equal(gn_bill_invoice_seal(q->prov, ag2.data, ag2.len, &h2, t, 5, START_S + 10, "released", &inv, &fin),
                   0);
  assert_int_equal(rq_recv(q, 10000, &note), GN_EAUDIT);
  assert_int_equal(lh_count(&q->out, GN_LEASE_ACT_VOUCHER), 0);
  assert_null(lh_sent(&q->out, GN_MSG_DEBIT_ACCEPT));
  /* Rejected, without using up the one answer of this lease. */
  assert_int_equal(rq_recv(q, 10000, &inv), GN_EAUDIT);
  assert_null(lh_sent(&q->out, GN_MSG_INVOICE_ACCEPT));
  assert_non_null(lh_sent(&q->out, GN_MSG_INVOICE_REJECT));
  assert_int_equal(lh_count(&q->out, GN_LEASE_ACT_SETTLED), 0);
  gn_lease_info info;
  gn_lease_req_info(q->m, rq_now(q, 10000), &info);
  assert_int_equal(info.accepted_s, 0);
  assert_int_not_equal(info.phase, GN_LEASE_PHASE_SETTLED);
  /* This lease's own final invoice is still countersigned. */
  gn_buf mine = {0};
  rq_invoice(q, &q->ph, 9, "released", &mine);
  assert_int_equal(rq_recv(q, 10000, &mine), 0);
  assert_non_null(lh_sent(&q->out, GN_MSG_INVOICE_ACCEPT));
  gn_buf_done(&mine);
  free(t);
  gn_buf_done(&ag2);
  gn_buf_done(&note);
  gn_buf_done(&inv);
}

static void test_req_release_repeats_until_invoice(void **state) {
  rq *q = *state;
  assert_int_equal(gn_lease_req_release(q->m, rq_now(q, 10400), &q->out), 0);
  assert_int_equal(lh_count(&q->out, GN_LEASE_ACT_RELEASE), 1);
  assert_int_equal(lh_count(&q->out, GN_LEASE_ACT_END), 1);
  assert_int_equal(lh_count(&q->out, GN_LEASE_ACT_PERSIST), 1);
  uint64_t t = q->out.timer_at_ms;
  assert_true(t > 10400 && t < UINT64_MAX);
  assert_int_equal(gn_lease_req_timer(q->m, rq_now(q, t), &q->out), 0);
  assert_int_equal(lh_count(&q->out, GN_LEASE_ACT_RELEASE), 1);
  /* The observation stopped at the release (10 s): an invoice of 15 s
   * (10 + the 5 s tolerance) arriving much later is accepted... */
  gn_buf inv = {0};
  rq_invoice(q, &q->ph, 15, "released", &inv);
  assert_int_equal(rq_recv(q, 90000, &inv), 0);
  assert_non_null(lh_sent(&q->out, GN_MSG_INVOICE_ACCEPT));
  /* ...and the release is not repeated any more. */
  assert_int_equal(q->out.timer_at_ms, UINT64_MAX);
  assert_int_equal(gn_lease_req_timer(q->m, rq_now(q, 900000), &q->out), 0);
  assert_int_equal(lh_count(&q->out, GN_LEASE_ACT_RELEASE), 0);
  gn_buf_done(&inv);
}

static void test_req_observation_stops_at_release(void **state) {
  rq *q = *state;
  assert_int_equal(gn_lease_req_release(q->m, rq_now(q, 10400), &q->out), 0);
  gn_buf inv = {0};
  rq_invoice(q, &q->ph, 16, "released", &inv);
  assert_int_equal(rq_recv(q, 90000, &inv), GN_EAUDIT);
  assert_non_null(lh_sent(&q->out, GN_MSG_INVOICE_REJECT));
  gn_buf_done(&inv);
}

static void test_req_restart_observes_from_own_receipt(void **state) {
  rq *q = *state;
  /* The agreement says the lease began an hour before we received it. */
  const gn_lease_action *p = lh_find(&q->out, GN_LEASE_ACT_PERSIST, 0);
  gn_buf st = {0}, big = {0}, ok = {0};
  assert_non_null(p);
  assert_int_equal(gn_buf_append(&st, p->data, p->len), 0);
  gn_lease_state_info si;
  assert_int_equal(gn_lease_state_peek(st.data, st.len, &si), 0);
  assert_false(si.provider);
  q->m = gn_lease_req_free(q->m);
  /* Back 20 s after receipt, on a new monotonic clock. */
  q->utc0 = START_S + 1 + 20;
  assert_int_equal(gn_lease_req_restore(q->req, q->ag.data, q->ag.len, st.data, st.len, rq_now(q, 0), &q->m, &q->out),
                   0);
  gn_lease_info info;
  gn_lease_req_info(q->m, rq_now(q, 0), &info);
  assert_int_equal(info.seconds, 20);
  gn_bill_head nb;
  rq_note(q, &q->ph, 3600, COUNT, &big, &nb);
  assert_int_equal(rq_recv(q, 500, &big), GN_EAUDIT);
  rq_note(q, &q->ph, 20, COUNT, &ok, &nb);
  assert_int_equal(rq_recv(q, 500, &ok), 0);
  gn_buf_done(&st);
  gn_buf_done(&big);
  gn_buf_done(&ok);
}

static void test_req_restore_settled_answers_the_same(void **state) {
  rq *q = *state;
  gn_buf inv = {0}, st = {0}, first = {0};
  rq_invoice(q, &q->ph, 8, "released", &inv);
  assert_int_equal(rq_recv(q, 9000, &inv), 0);
  const gn_lease_action *p = lh_find(&q->out, GN_LEASE_ACT_PERSIST, 0);
  assert_int_equal(gn_buf_append(&st, p->data, p->len), 0);
  const gn_lease_action *s = lh_sent(&q->out, GN_MSG_INVOICE_ACCEPT);
  assert_int_equal(gn_buf_append(&first, s->data, s->len), 0);
  q->m = gn_lease_req_free(q->m);
  q->utc0 += 3600;
  assert_int_equal(gn_lease_req_restore(q->req, q->ag.data, q->ag.len, st.data, st.len, rq_now(q, 0), &q->m, &q->out),
                   0);
  assert_int_equal(rq_recv(q, 100, &inv), 0);
  s = lh_sent(&q->out, GN_MSG_INVOICE_ACCEPT);
  assert_non_null(s);
  assert_int_equal(s->len, first.len);
  assert_memory_equal(s->data, first.data, first.len);
  gn_buf_done(&inv);
  gn_buf_done(&st);
  gn_buf_done(&first);
}

int main(void) {
  if (sodium_init() < 0)
    return 1;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_req_refuses_another_identity, rq_setup, rq_teardown),
      cmocka_unit_test_setup_teardown(test_req_accepts_honest_note, rq_setup, rq_teardown),
      cmocka_unit_test_setup_teardown(test_req_rejects_beyond_observation, rq_setup, rq_teardown),
      cmocka_unit_test_setup_teardown(test_req_resends_acceptance_provider_missed, rq_setup, rq_teardown),
      cmocka_unit_test_setup_teardown(test_req_spending_cap_releases_in_time, rq_setup_cap, rq_teardown),
      cmocka_unit_test_setup_teardown(test_req_spending_cap_refuses_beyond, rq_setup_cap, rq_teardown),
      cmocka_unit_test_setup_teardown(test_req_countersigns_one_final_invoice, rq_setup, rq_teardown),
      cmocka_unit_test_setup_teardown(test_req_invoice_after_missed_acceptance_gets_it_again, rq_setup, rq_teardown),
      cmocka_unit_test_setup_teardown(test_req_ignores_other_signer, rq_setup, rq_teardown),
      cmocka_unit_test_setup_teardown(test_req_refuses_bills_of_another_lease, rq_setup, rq_teardown),
      cmocka_unit_test_setup_teardown(test_req_release_repeats_until_invoice, rq_setup, rq_teardown),
      cmocka_unit_test_setup_teardown(test_req_observation_stops_at_release, rq_setup, rq_teardown),
      cmocka_unit_test_setup_teardown(test_req_restart_observes_from_own_receipt, rq_setup_backdated, rq_teardown),
      cmocka_unit_test_setup_teardown(test_req_restore_settled_answers_the_same, rq_setup, rq_teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
