/* Tests of the provider's lease machine (billing/lease_prov.c): the metering
 * schedule and catch-up, a debit note every interval, credit control
 * (payment timeout, an unreachable requester, a rejection), release and
 * expiry, the final invoice continuing the last ACCEPTED note (also after a
 * late acceptance), and restarts from the persisted state and the ledger.
 * The requester's answers are made with the pure billing functions. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
/* cmocka needs the above first. */
#include <cmocka.h>

#include "billing/lease_helpers.h"

#define START_S 1764670000
#define COUNT 2

/* The provider under test and what it asked for so far. */
typedef struct pv {
  gn_identity *prov, *req, *other;
  gn_buf ag;
  lh_lease terms;
  gn_lease_prov *m;
  uint64_t now_ms;
  int64_t utc0; /* provider UTC at mono 0 */
  uint64_t timer;
  gn_buf ledger; /* compact ticks written, second 1 first */
  uint64_t writes, idle_writes;
  gn_buf state;
  gn_buf notes[256]; /* every DEBIT_NOTE sent, in order (repeats too) */
  size_t n_notes;
  gn_buf invoice; /* the last INVOICE action */
  size_t n_invoice_actions, n_invoice_sends, n_vouchers, n_rejected, n_unanswered;
  uint64_t unanswered_at_ms;
  bool voucher_timed; /* the last VOUCHER's */
  uint64_t voucher_latency_ms;
  bool ended, settled, settled_accepted;
  char end_reason[256];
  uint8_t gpus; /* what the glue writes per second */
} pv;

static gn_lease_now pv_now(const pv *p) {
  return lh_now(p->now_ms, p->utc0 + (int64_t)(p->now_ms / 1000));
}

static void pv_handle(pv *p, const gn_lease_out *o) {
  uint64_t wfrom = 0, wto = 0;
  bool widle = false;
  for (size_t i = 0; i < o->n; i++) {
    const gn_lease_action *a = &o->act[i];
    switch (a->kind) {
    case GN_LEASE_ACT_PERSIST:
      p->state.len = 0;
      assert_int_equal(gn_buf_append(&p->state, a->data, a->len), 0);
      break;
    case GN_LEASE_ACT_SEND: {
      uint32_t t = lh_type(a->data, a->len);
      if (t == GN_MSG_DEBIT_NOTE) {
        assert_true(p->n_notes < GN_ARRAY_SIZE(p->notes));
        assert_int_equal(gn_buf_append(&p->notes[p->n_notes++], a->data, a->len), 0);
      } else if (t == GN_MSG_INVOICE) {
        p->n_invoice_sends++;
      } else {
        fail_msg("unexpected message type %u sent", t);
      }
      break;
    }
    case GN_LEASE_ACT_WRITE_TICKS:
      assert_false(p->ended); /* a stopped lease stops billing */
      wfrom = a->from;
      wto = a->to;
      widle = a->idle;
      break;
    case GN_LEASE_ACT_END:
      assert_false(p->ended);
      p->ended = true;
      snprintf(p->end_reason, sizeof(p->end_reason), "%s", a->reason);
      break;
    case GN_LEASE_ACT_INVOICE:
      p->invoice.len = 0;
      assert_int_equal(gn_buf_append(&p->invoice, a->data, a->len), 0);
      p->n_invoice_actions++;
      break;
    case GN_LEASE_ACT_VOUCHER:
      p->n_vouchers++;
      p->voucher_timed = a->timed;
      p->voucher_latency_ms = a->latency_ms;
      break;
    case GN_LEASE_ACT_REJECTED:
      p->n_rejected++;
      break;
    case GN_LEASE_ACT_UNANSWERED:
      p->n_unanswered++;
      p->unanswered_at_ms = p->now_ms;
      assert_non_null(strstr(a->reason, "never answered"));
      break;
    case GN_LEASE_ACT_SETTLED:
      p->settled = true;
      p->settled_accepted = a->accepted;
      break;
    default:
      fail_msg("unexpected action %d", a->kind);
    }
  }
  p->timer = o->timer_at_ms;
  if (wto) {
    /* The glue: measure, write durably, report. */
    uint64_t n = wto - wfrom + 1;
    assert_int_equal(wfrom, p->ledger.len / 2 + 1);
    uint8_t *t = lh_ticks(n, widle ? 0 : p->gpus);
    assert_non_null(t);
    assert_int_equal(gn_buf_append(&p->ledger, t, n * 2), 0);
    p->writes++;
    p->idle_writes += widle;
    gn_lease_out o2 = {0};
    assert_int_equal(gn_lease_prov_ticks(p->m, pv_now(p), wfrom, t, n, &o2), 0);
    free(t);
    pv_handle(p, &o2);
    gn_lease_out_done(&o2);
  }
}

/* Runs the machine's timers up to mono time t. */
static void pv_until(pv *p, uint64_t t) {
  gn_lease_out o = {0};
  while (p->timer <= t) {
    if (p->timer > p->now_ms)
      p->now_ms = p->timer;
    assert_int_equal(gn_lease_prov_timer(p->m, pv_now(p), &o), 0);
    pv_handle(p, &o);
  }
  p->now_ms = t;
  gn_lease_out_done(&o);
}

static int pv_setup_terms(void **state, uint64_t max_s, uint32_t interval_s) {
  pv *p = calloc(1, sizeof(*p));
  assert_non_null(p);
  p->prov = lh_identity(1, 'p');
  p->req = lh_identity(1, 'r');
  p->other = lh_identity(1, 'o');
  p->terms = (lh_lease){COUNT, 3600000, max_s, interval_s, START_S, 42};
  assert_int_equal(lh_agreement(p->prov, p->req, &p->terms, &p->ag), 0);
  p->utc0 = START_S;
  p->gpus = COUNT;
  gn_lease_out o = {0};
  assert_int_equal(gn_lease_prov_new(p->prov, p->ag.data, p->ag.len, pv_now(p), &p->m, &o), 0);
  pv_handle(p, &o);
  gn_lease_out_done(&o);
  *state = p;
  return 0;
}

static int pv_setup(void **state) {
  return pv_setup_terms(state, 100, 10);
}

static int pv_setup_long(void **state) {
  return pv_setup_terms(state, 3600, 10);
}

static int pv_teardown(void **state) {
  pv *p = *state;
  gn_lease_prov_free(p->m);
  gn_identity_free(p->prov);
  gn_identity_free(p->req);
  gn_identity_free(p->other);
  gn_buf_done(&p->ag);
  gn_buf_done(&p->ledger);
  gn_buf_done(&p->state);
  gn_buf_done(&p->invoice);
  for (size_t i = 0; i < GN_ARRAY_SIZE(p->notes); i++)
    gn_buf_done(&p->notes[i]);
  free(p);
  return 0;
}

/* The requester's acceptance of note i (continuing head), and its head. */
static void pv_accept(pv *p, size_t i, gn_bill_head *head, gn_buf *ret_acc) {
  gn_bill_head next;
  char reason[256];
  int r = gn_bill_note_check(p->notes[i].data, p->notes[i].len, p->ag.data, p->ag.len, head, 100000, 100, 0, &next,
                             NULL, reason, sizeof(reason));
  if (r != 0)
    fail_msg("note %zu does not check: %s", i, reason);
  assert_int_equal(gn_bill_note_accept_seal(p->req, p->ag.data, p->ag.len, &next, ret_acc), 0);
  *head = next;
}

static int pv_recv(pv *p, const gn_buf *env) {
  gn_lease_out o = {0};
  int r = gn_lease_prov_recv(p->m, pv_now(p), env->data, env->len, &o);
  pv_handle(p, &o);
  gn_lease_out_done(&o);
  return r;
}

static void test_prov_refuses_another_identity(void **state) {
  pv *p = *state;
  gn_lease_prov *m = NULL;
  gn_lease_out o = {0};
  assert_int_equal(gn_lease_prov_new(p->req, p->ag.data, p->ag.len, pv_now(p), &m, &o), GN_EPERM);
  assert_null(m);
  assert_int_equal(o.n, 0);
  gn_lease_out_done(&o);
}

static void test_prov_tick_only_after_whole_seconds(void **state) {
  pv *p = *state;
  assert_int_equal(p->timer, 1000); /* the first second is due at 1 s */
  pv_until(p, 999);
  assert_int_equal(p->ledger.len, 0);
  pv_until(p, 1000);
  assert_int_equal(p->ledger.len / 2, 1);
  pv_until(p, 4999);
  assert_int_equal(p->ledger.len / 2, 4);
  assert_int_equal(p->timer, 5000);
}

static void test_prov_catch_up_writes_each_second(void **state) {
  pv *p = *state;
  gn_lease_out o = {0};
  /* The loop stalled for 7.5 s: one WRITE_TICKS of seconds 1..7. */
  p->now_ms = 7500;
  assert_int_equal(gn_lease_prov_timer(p->m, pv_now(p), &o), 0);
  const gn_lease_action *w = lh_find(&o, GN_LEASE_ACT_WRITE_TICKS, 0);
  assert_non_null(w);
  assert_int_equal(w->from, 1);
  assert_int_equal(w->to, 7);
  assert_false(w->idle);
  /* Reporting other seconds than asked changes nothing. */
  uint8_t *t = lh_ticks(8, COUNT);
  assert_int_equal(gn_lease_prov_ticks(p->m, pv_now(p), 1, t, 8, &o), GN_ESTATE);
  assert_int_equal(gn_lease_prov_ticks(p->m, pv_now(p), 2, t, 6, &o), GN_ESTATE);
  /* A tick with more GPUs than the lease has is refused. */
  t[4] = COUNT + 1;
  assert_int_equal(gn_lease_prov_ticks(p->m, pv_now(p), 1, t, 7, &o), GN_EINVAL);
  t[4] = COUNT;
  assert_int_equal(gn_lease_prov_ticks(p->m, pv_now(p), 1, t, 7, &o), 0);
  gn_lease_info info;
  gn_lease_prov_info(p->m, &info);
  assert_int_equal(info.seconds, 7);
  assert_int_equal(o.timer_at_ms, 8000);
  free(t);
  gn_lease_out_done(&o);
}

static void test_prov_note_every_interval(void **state) {
  pv *p = *state;
  pv_until(p, 9999);
  assert_int_equal(p->n_notes, 0);
  pv_until(p, 10000);
  assert_int_equal(p->n_notes, 1);
  gn_bill_head h0, next;
  gn_bill_note note;
  char reason[256];
  assert_int_equal(gn_bill_head_init(p->ag.data, p->ag.len, &h0), 0);
  assert_int_equal(gn_bill_note_open(p->notes[0].data, p->notes[0].len, p->ag.data, p->ag.len, &h0, &next, &note,
                                     reason, sizeof(reason)),
                   0);
  assert_int_equal(note.seq, 1);
  assert_int_equal(note.from, 1);
  assert_int_equal(note.seconds, 10);
  assert_int_equal(note.gpu_seconds, 10 * COUNT);
  /* Unanswered, a later note continues the same (last accepted) head and
   * covers more: the first one is superseded. */
  pv_until(p, 20000);
  size_t last = p->n_notes - 1;
  assert_int_equal(gn_bill_note_open(p->notes[last].data, p->notes[last].len, p->ag.data, p->ag.len, &h0, &next, &note,
                                     reason, sizeof(reason)),
                   0);
  assert_int_equal(note.seq, 1);
  assert_int_equal(note.seconds, 20);
  /* The state is persisted before a note is sent. */
  gn_lease_state_info si;
  assert_int_equal(gn_lease_state_peek(p->state.data, p->state.len, &si), 0);
  assert_true(si.provider);
  assert_int_equal(si.phase, GN_LEASE_PHASE_ACTIVE);
}

static void test_prov_acceptance_moves_head(void **state) {
  pv *p = *state;
  gn_bill_head h;
  gn_buf acc = {0};
  assert_int_equal(gn_bill_head_init(p->ag.data, p->ag.len, &h), 0);
  pv_until(p, 10000);
  pv_accept(p, 0, &h, &acc);
  assert_int_equal(pv_recv(p, &acc), 0);
  assert_int_equal(p->n_vouchers, 1);
  gn_lease_info info;
  gn_lease_prov_info(p->m, &info);
  assert_int_equal(info.accepted_s, 10);
  assert_int_equal(info.accepted_seq, 1);
  assert_int_equal(info.pending, 0);
  /* The same acceptance again is a harmless duplicate. */
  assert_int_equal(pv_recv(p, &acc), 0);
  assert_int_equal(p->n_vouchers, 1);
  /* The next note continues it: seq 2 from second 11. */
  pv_until(p, 20000);
  gn_bill_head next;
  gn_bill_note note;
  size_t last = p->n_notes - 1;
  assert_int_equal(
      gn_bill_note_open(p->notes[last].data, p->notes[last].len, p->ag.data, p->ag.len, &h, &next, &note, NULL, 0), 0);
  assert_int_equal(note.seq, 2);
  assert_int_equal(note.from, 11);
  assert_int_equal(note.seconds, 20);
  gn_buf_done(&acc);
}

static void test_prov_acceptance_latency_from_send(void **state) {
  pv *p = *state;
  gn_bill_head h;
  gn_buf acc = {0};
  assert_int_equal(gn_bill_head_init(p->ag.data, p->ag.len, &h), 0);
  pv_until(p, 10000); /* the note goes out at 10 s */
  assert_int_equal(p->n_notes, 1);
  pv_until(p, 10250);
  pv_accept(p, 0, &h, &acc);
  assert_int_equal(pv_recv(p, &acc), 0);
  assert_int_equal(p->n_vouchers, 1);
  assert_true(p->voucher_timed);
  assert_int_equal(p->voucher_latency_ms, 250);
  gn_buf_done(&acc);
}

static void test_prov_latency_counts_from_send_not_issue(void **state) {
  pv *p = *state;
  gn_lease_out o = {0};
  pv_until(p, 3000);
  assert_int_equal(gn_lease_prov_peer(p->m, pv_now(p), false, &o), 0);
  pv_handle(p, &o);
  pv_until(p, 15000); /* the note of 10 s is issued, not sent */
  assert_int_equal(p->n_notes, 0);
  assert_int_equal(gn_lease_prov_peer(p->m, pv_now(p), true, &o), 0);
  pv_handle(p, &o);
  assert_int_equal(p->n_notes, 1); /* sent now, at 15 s */
  pv_until(p, 15400);
  gn_bill_head h;
  gn_buf acc = {0};
  assert_int_equal(gn_bill_head_init(p->ag.data, p->ag.len, &h), 0);
  pv_accept(p, 0, &h, &acc);
  assert_int_equal(pv_recv(p, &acc), 0);
  assert_true(p->voucher_timed);
  assert_int_equal(p->voucher_latency_ms, 400);
  gn_buf_done(&acc);
  gn_lease_out_done(&o);
}

static void test_prov_payment_timeout_ends_lease(void **state) {
  pv *p = *state;
  pv_until(p, 10000); /* first note at 10 s, never answered */
  assert_int_equal(p->n_notes, 1);
  pv_until(p, 30000); /* exactly two intervals: not yet */
  assert_false(p->ended);
  pv_until(p, 30001);
  assert_true(p->ended);
  assert_non_null(strstr(p->end_reason, "unpaid"));
  /* The final invoice continues the last accepted note (none): from 1. */
  gn_bill_head h0, fin;
  gn_bill_note note;
  assert_int_equal(gn_bill_head_init(p->ag.data, p->ag.len, &h0), 0);
  assert_int_equal(gn_bill_note_open(p->invoice.data, p->invoice.len, p->ag.data, p->ag.len, &h0, &fin, &note, NULL, 0),
                   0);
  assert_true(note.final);
  assert_int_equal(note.from, 1);
  assert_int_equal(note.seconds, 30);
  assert_int_equal(p->n_invoice_sends, 1);
  /* Stopped: no more ticks, ever. */
  size_t ticks = p->ledger.len;
  pv_until(p, 200000);
  assert_int_equal(p->ledger.len, ticks);
  assert_true(p->n_invoice_sends > 1); /* re-sent until answered */
}

static void test_prov_unreachable_requester_ends_lease(void **state) {
  pv *p = *state;
  gn_lease_out o = {0};
  pv_until(p, 3000);
  assert_int_equal(gn_lease_prov_peer(p->m, pv_now(p), false, &o), 0);
  pv_handle(p, &o);
  pv_until(p, 23000);
  assert_false(p->ended);
  size_t sends = p->n_notes;
  pv_until(p, 23001);
  assert_true(p->ended);
  assert_non_null(strstr(p->end_reason, "unreachable"));
  assert_int_equal(p->n_notes, sends); /* nothing is sent to a peer that is down */
  assert_int_equal(p->n_invoice_sends, 0);
  assert_int_equal(gn_lease_prov_peer(p->m, pv_now(p), true, &o), 0);
  pv_handle(p, &o);
  assert_int_equal(p->n_invoice_sends, 1); /* sent once it is back */
  gn_lease_out_done(&o);
}

static void test_prov_peer_back_within_grace_keeps_lease(void **state) {
  pv *p = *state;
  gn_lease_out o = {0};
  pv_until(p, 3000);
  assert_int_equal(gn_lease_prov_peer(p->m, pv_now(p), false, &o), 0);
  pv_handle(p, &o);
  pv_until(p, 20000);
  assert_int_equal(gn_lease_prov_peer(p->m, pv_now(p), true, &o), 0);
  pv_handle(p, &o);
  assert_true(p->n_notes >= 1); /* the note issued meanwhile goes out now */
  gn_bill_head h;
  gn_buf acc = {0};
  assert_int_equal(gn_bill_head_init(p->ag.data, p->ag.len, &h), 0);
  pv_accept(p, p->n_notes - 1, &h, &acc);
  assert_int_equal(pv_recv(p, &acc), 0);
  pv_until(p, 40000);
  assert_false(p->ended);
  gn_buf_done(&acc);
  gn_lease_out_done(&o);
}

static void test_prov_rejection_ends_lease(void **state) {
  pv *p = *state;
  gn_buf rej = {0};
  pv_until(p, 10000);
  assert_int_equal(gn_bill_note_reject_seal(p->req, p->ag.data, p->ag.len, p->notes[0].data, p->notes[0].len,
                                            "not what I observed", &rej),
                   0);
  assert_int_equal(pv_recv(p, &rej), 0);
  assert_true(p->ended);
  assert_int_equal(p->n_rejected, 1);
  assert_non_null(strstr(p->end_reason, "rejected"));
  gn_buf_done(&rej);
}

static void test_prov_answer_from_another_key_ignored(void **state) {
  pv *p = *state;
  gn_bill_head h;
  gn_buf acc = {0};
  pv_until(p, 10000);
  assert_int_equal(gn_bill_head_init(p->ag.data, p->ag.len, &h), 0);
  gn_bill_head next;
  assert_int_equal(gn_bill_note_check(p->notes[0].data, p->notes[0].len, p->ag.data, p->ag.len, &h, 100, 10, 0, &next,
                                      NULL, NULL, 0),
                   0);
  /* Sealed by someone who is not the agreement's requester. */
  int r = gn_bill_note_accept_seal(p->other, p->ag.data, p->ag.len, &next, &acc);
  if (r == 0) {
    assert_true(pv_recv(p, &acc) < 0);
  } else {
    assert_int_equal(r, GN_EPERM);
  }
  assert_int_equal(p->n_vouchers, 0);
  /* The real acceptance with one byte changed does not verify either. */
  acc.len = 0;
  assert_int_equal(gn_bill_note_accept_seal(p->req, p->ag.data, p->ag.len, &next, &acc), 0);
  acc.data[acc.len - 5] ^= 1;
  assert_true(pv_recv(p, &acc) < 0);
  assert_int_equal(p->n_vouchers, 0);
  acc.data[acc.len - 5] ^= 1;
  assert_int_equal(pv_recv(p, &acc), 0);
  assert_int_equal(p->n_vouchers, 1);
  gn_buf_done(&acc);
}

static void test_prov_release_ends_with_invoice_after_last_accepted(void **state) {
  pv *p = *state;
  gn_bill_head h;
  gn_buf acc = {0};
  gn_lease_out o = {0};
  assert_int_equal(gn_bill_head_init(p->ag.data, p->ag.len, &h), 0);
  pv_until(p, 10000);
  pv_accept(p, 0, &h, &acc);
  assert_int_equal(pv_recv(p, &acc), 0);
  pv_until(p, 23500);
  assert_int_equal(gn_lease_prov_release(p->m, pv_now(p), &o), 0);
  /* The end is persisted first, then END (kill jobs), then the invoice is
   * stored and sent. */
  assert_true(lh_pos(&o, GN_LEASE_ACT_PERSIST) < lh_pos(&o, GN_LEASE_ACT_END));
  assert_true(lh_pos(&o, GN_LEASE_ACT_END) < lh_pos(&o, GN_LEASE_ACT_INVOICE));
  assert_true(lh_pos(&o, GN_LEASE_ACT_INVOICE) < lh_pos(&o, GN_LEASE_ACT_SEND));
  pv_handle(p, &o);
  assert_string_equal(p->end_reason, "released");
  gn_bill_head fin;
  gn_bill_note note;
  assert_int_equal(gn_bill_note_open(p->invoice.data, p->invoice.len, p->ag.data, p->ag.len, &h, &fin, &note, NULL, 0),
                   0);
  assert_int_equal(note.seq, 1);
  assert_int_equal(note.from, 11);
  assert_int_equal(note.seconds, 23);
  assert_memory_equal(note.prev, h.note_hash, 32);
  /* Released twice: nothing more. */
  assert_int_equal(gn_lease_prov_release(p->m, pv_now(p), &o), 0);
  assert_int_equal(lh_count(&o, GN_LEASE_ACT_END), 0);
  /* The requester countersigns: settled. */
  gn_buf ia = {0};
  assert_int_equal(
      gn_bill_invoice_check(p->invoice.data, p->invoice.len, p->ag.data, p->ag.len, &h, 23, 5, 0, &fin, NULL, NULL, 0),
      0);
  assert_int_equal(gn_bill_invoice_accept_seal(p->req, p->ag.data, p->ag.len, &fin, START_S + 30, &ia), 0);
  assert_int_equal(pv_recv(p, &ia), 0);
  assert_true(p->settled);
  assert_true(p->settled_accepted);
  size_t sends = p->n_invoice_sends;
  pv_until(p, 900000);
  assert_int_equal(p->n_invoice_sends, sends); /* no resend once answered */
  gn_buf_done(&ia);
  gn_buf_done(&acc);
  gn_lease_out_done(&o);
}

static void test_prov_late_acceptance_reseals_invoice(void **state) {
  pv *p = *state;
  gn_bill_head h;
  gn_buf acc = {0};
  gn_lease_out o = {0};
  assert_int_equal(gn_bill_head_init(p->ag.data, p->ag.len, &h), 0);
  pv_until(p, 15000);
  assert_int_equal(gn_lease_prov_release(p->m, pv_now(p), &o), 0);
  pv_handle(p, &o);
  assert_int_equal(p->n_invoice_actions, 1);
  /* The acceptance of note 1 crossed the end: the invoice is sealed again,
   * continuing that note. */
  pv_accept(p, 0, &h, &acc);
  assert_int_equal(pv_recv(p, &acc), 0);
  assert_int_equal(p->n_vouchers, 1);
  assert_int_equal(p->n_invoice_actions, 2);
  gn_bill_head fin;
  gn_bill_note note;
  assert_int_equal(gn_bill_note_open(p->invoice.data, p->invoice.len, p->ag.data, p->ag.len, &h, &fin, &note, NULL, 0),
                   0);
  assert_int_equal(note.from, 11);
  assert_int_equal(note.seconds, 15);
  gn_buf_done(&acc);
  gn_lease_out_done(&o);
}

static void test_prov_expires_at_max_s(void **state) {
  pv *p = *state;
  gn_bill_head h;
  assert_int_equal(gn_bill_head_init(p->ag.data, p->ag.len, &h), 0);
  /* Accept every note on time. */
  for (uint64_t t = 10000; t <= 100000; t += 10000) {
    pv_until(p, t);
    if (p->ended)
      break;
    gn_buf acc = {0};
    pv_accept(p, p->n_notes - 1, &h, &acc);
    assert_int_equal(pv_recv(p, &acc), 0);
    gn_buf_done(&acc);
  }
  assert_true(p->ended);
  assert_string_equal(p->end_reason, "expired");
  assert_int_equal(p->ledger.len / 2, 100);
  gn_bill_head fin;
  gn_bill_note note;
  assert_int_equal(gn_bill_note_open(p->invoice.data, p->invoice.len, p->ag.data, p->ag.len, &h, &fin, &note, NULL, 0),
                   0);
  assert_int_equal(note.seconds, 100);
  pv_until(p, 200000);
  assert_int_equal(p->ledger.len / 2, 100);
}

static void test_prov_restart_writes_downtime_idle(void **state) {
  pv *p = *state;
  gn_bill_head h;
  gn_buf acc = {0};
  gn_lease_out o = {0};
  assert_int_equal(gn_bill_head_init(p->ag.data, p->ag.len, &h), 0);
  pv_until(p, 10000);
  pv_accept(p, 0, &h, &acc);
  assert_int_equal(pv_recv(p, &acc), 0);
  pv_until(p, 14500);
  /* Crash: the machine is gone; the ledger and the last state remain. Back
   * 20 s later by the provider's UTC, on a new monotonic clock. */
  p->m = gn_lease_prov_free(p->m);
  gn_lease_state_info si;
  assert_int_equal(gn_lease_state_peek(p->state.data, p->state.len, &si), 0);
  assert_int_equal(si.ticks_from, 11);
  uint64_t have = p->ledger.len / 2;
  assert_int_equal(have, 14);
  p->utc0 = START_S + 34 - 5; /* utc at mono 5000 is START_S + 34 */
  p->now_ms = 5000;
  assert_int_equal(gn_lease_prov_restore(p->prov, p->ag.data, p->ag.len, p->state.data, p->state.len,
                                         p->ledger.data + (si.ticks_from - 1) * 2, have - (si.ticks_from - 1),
                                         pv_now(p), &p->m, &o),
                   0);
  const gn_lease_action *w = lh_find(&o, GN_LEASE_ACT_WRITE_TICKS, 0);
  assert_non_null(w);
  assert_true(w->idle);
  assert_int_equal(w->from, 15);
  assert_int_equal(w->to, 34);
  pv_handle(p, &o);
  assert_int_equal(p->idle_writes, 1);
  for (uint64_t s = 15; s <= 34; s++)
    assert_int_equal(p->ledger.data[(s - 1) * 2], 0); /* not billed */
  /* The idle seconds reached the next interval: a note (after the peer is
   * back) continues the accepted head. */
  assert_int_equal(gn_lease_prov_peer(p->m, pv_now(p), true, &o), 0);
  pv_handle(p, &o);
  gn_bill_head next;
  gn_bill_note note;
  size_t last = p->n_notes - 1;
  assert_int_equal(
      gn_bill_note_open(p->notes[last].data, p->notes[last].len, p->ag.data, p->ag.len, &h, &next, &note, NULL, 0), 0);
  assert_int_equal(note.from, 11);
  assert_int_equal(note.seconds, 34);
  assert_int_equal(note.gpu_seconds, 10 * COUNT + 4 * COUNT);
  /* Metering goes on from there, a second per second of the new clock. */
  pv_until(p, 6000);
  assert_int_equal(p->ledger.len / 2, 35);
  gn_buf_done(&acc);
  gn_lease_out_done(&o);
}

static void test_prov_restart_after_long_downtime_ends_lease(void **state) {
  pv *p = *state;
  gn_lease_out o = {0};
  pv_until(p, 7500);
  p->m = gn_lease_prov_free(p->m);
  /* Back 21 s after the last tick: more than grace_s (2 intervals). */
  p->utc0 = START_S + 28;
  p->now_ms = 0;
  assert_int_equal(gn_lease_prov_restore(p->prov, p->ag.data, p->ag.len, p->state.data, p->state.len, p->ledger.data,
                                         p->ledger.len / 2, pv_now(p), &p->m, &o),
                   0);
  assert_int_equal(lh_count(&o, GN_LEASE_ACT_WRITE_TICKS), 0);
  pv_handle(p, &o);
  assert_true(p->ended);
  assert_non_null(strstr(p->end_reason, "provider down"));
  gn_bill_head h0, fin;
  gn_bill_note note;
  assert_int_equal(gn_bill_head_init(p->ag.data, p->ag.len, &h0), 0);
  assert_int_equal(gn_bill_note_open(p->invoice.data, p->invoice.len, p->ag.data, p->ag.len, &h0, &fin, &note, NULL, 0),
                   0);
  assert_int_equal(note.seconds, 7);
  gn_lease_out_done(&o);
}

static void test_prov_invoice_leaves_out_trailing_idle_seconds(void **state) {
  pv *p = *state;
  gn_lease_out o = {0};
  pv_until(p, 5500);
  p->m = gn_lease_prov_free(p->m);
  /* Down 10 s (within grace): the gap is written idle, then released. */
  p->utc0 = START_S + 15;
  p->now_ms = 0;
  assert_int_equal(gn_lease_prov_restore(p->prov, p->ag.data, p->ag.len, p->state.data, p->state.len, p->ledger.data,
                                         p->ledger.len / 2, pv_now(p), &p->m, &o),
                   0);
  pv_handle(p, &o);
  assert_int_equal(p->ledger.len / 2, 15);
  assert_int_equal(gn_lease_prov_release(p->m, pv_now(p), &o), 0);
  pv_handle(p, &o);
  gn_bill_head h0, fin;
  gn_bill_note note;
  assert_int_equal(gn_bill_head_init(p->ag.data, p->ag.len, &h0), 0);
  assert_int_equal(gn_bill_note_open(p->invoice.data, p->invoice.len, p->ag.data, p->ag.len, &h0, &fin, &note, NULL, 0),
                   0);
  assert_int_equal(note.seconds, 5); /* 6..15 had no GPU and cost nothing */
  gn_lease_out_done(&o);
}

static void test_prov_restart_after_end_resends_same_invoice(void **state) {
  pv *p = *state;
  gn_lease_out o = {0};
  pv_until(p, 12000);
  assert_int_equal(gn_lease_prov_stop(p->m, pv_now(p), "operator", &o), 0);
  pv_handle(p, &o);
  gn_buf inv = {0};
  assert_int_equal(gn_buf_append(&inv, p->invoice.data, p->invoice.len), 0);
  p->m = gn_lease_prov_free(p->m);
  /* The ledger may hold a tick the end cancelled: it is not billed. */
  uint8_t extra[2] = {COUNT, 50};
  assert_int_equal(gn_buf_append(&p->ledger, extra, 2), 0);
  p->now_ms = 100;
  p->utc0 = START_S + 500;
  assert_int_equal(gn_lease_prov_restore(p->prov, p->ag.data, p->ag.len, p->state.data, p->state.len, p->ledger.data,
                                         p->ledger.len / 2, pv_now(p), &p->m, &o),
                   0);
  assert_int_equal(lh_count(&o, GN_LEASE_ACT_WRITE_TICKS), 0);
  assert_int_equal(lh_count(&o, GN_LEASE_ACT_SEND), 0); /* the peer is not up yet */
  assert_int_equal(gn_lease_prov_peer(p->m, pv_now(p), true, &o), 0);
  const gn_lease_action *s = lh_sent(&o, GN_MSG_INVOICE);
  assert_non_null(s);
  assert_int_equal(s->len, inv.len);
  assert_memory_equal(s->data, inv.data, inv.len);
  gn_buf_done(&inv);
  gn_lease_out_done(&o);
}

/* The energy the glue measured is stated by the final invoice, frozen at
 * the end (a figure given later is ignored) and persisted: the invoice
 * re-sealed after a restart is the same, energy included. */
static void test_prov_invoice_states_energy_kept_across_restart(void **state) {
  pv *p = *state;
  gn_lease_out o = {0};
  gn_invoice_summary sum;
  pv_until(p, 12000);
  gn_lease_prov_energy(p->m, &(gn_bill_energy){true, 3000000, 12});
  assert_int_equal(gn_lease_prov_stop(p->m, pv_now(p), "operator", &o), 0);
  pv_handle(p, &o);
  gn_lease_prov_energy(p->m, &(gn_bill_energy){true, 9999999, 13});
  assert_int_equal(gn_invoice_summarize(p->invoice.data, p->invoice.len, &sum), 0);
  assert_true(sum.energy.present);
  assert_int_equal(sum.energy.mj, 3000000);
  assert_int_equal(sum.energy.measured_s, 12);
  gn_buf inv = {0};
  assert_int_equal(gn_buf_append(&inv, p->invoice.data, p->invoice.len), 0);
  p->m = gn_lease_prov_free(p->m);
  p->now_ms = 100;
  p->utc0 = START_S + 500;
  assert_int_equal(gn_lease_prov_restore(p->prov, p->ag.data, p->ag.len, p->state.data, p->state.len, p->ledger.data,
                                         p->ledger.len / 2, pv_now(p), &p->m, &o),
                   0);
  assert_int_equal(gn_lease_prov_peer(p->m, pv_now(p), true, &o), 0);
  const gn_lease_action *s = lh_sent(&o, GN_MSG_INVOICE);
  assert_non_null(s);
  assert_int_equal(s->len, inv.len);
  assert_memory_equal(s->data, inv.data, inv.len);
  gn_buf_done(&inv);
  gn_lease_out_done(&o);
}

/* Simulated GPUs have no power reading: the invoice states no energy (not 0). */
static void test_prov_invoice_without_energy_states_none(void **state) {
  pv *p = *state;
  gn_lease_out o = {0};
  gn_invoice_summary sum;
  pv_until(p, 5000);
  gn_lease_prov_energy(p->m, &(gn_bill_energy){false, 0, 0});
  assert_int_equal(gn_lease_prov_stop(p->m, pv_now(p), "operator", &o), 0);
  pv_handle(p, &o);
  assert_int_equal(gn_invoice_summarize(p->invoice.data, p->invoice.len, &sum), 0);
  assert_false(sum.energy.present);
  assert_int_equal(sum.energy.mj, 0);
  gn_lease_out_done(&o);
}

/* A final invoice nobody answers (the peer is up: a requester that holds no
 * such lease drops it) is sent again, backing off, for a day after the end
 * and then no more: not on a timer, not when the peer comes back, not after a
 * restart. It stays a provider-only claim (the machine says so once) and an
 * answer that still comes is taken. A link that comes and goes does not use
 * the sends up before the day is over. */
static void test_prov_unanswered_invoice_resends_bounded(void **state) {
  pv *p = *state;
  gn_lease_out o = {0};
  pv_until(p, 15000);
  assert_int_equal(gn_lease_prov_release(p->m, pv_now(p), &o), 0);
  pv_handle(p, &o);
  assert_int_equal(p->n_invoice_sends, 1);
  /* The link drops and comes back 40 times in the first minutes: each return
   * sends the invoice; that is no reason to give up. */
  for (int i = 0; i < 40; i++) {
    assert_int_equal(gn_lease_prov_peer(p->m, pv_now(p), false, &o), 0);
    pv_handle(p, &o);
    p->now_ms += 1000;
    assert_int_equal(gn_lease_prov_peer(p->m, pv_now(p), true, &o), 0);
    pv_handle(p, &o);
  }
  assert_true(p->n_invoice_sends >= 41);
  assert_int_equal(p->n_unanswered, 0);
  size_t flapped = p->n_invoice_sends;
  pv_until(p, 48ull * 3600 * 1000); /* two days of a silent, reachable peer */
  assert_int_equal(p->n_unanswered, 1);
  /* A day after the end (at second 15), within one backoff of 10 minutes. */
  assert_true(p->unanswered_at_ms >= (15ull + GN_LEASE_INVOICE_GIVEUP_S) * 1000);
  assert_true(p->unanswered_at_ms <= (15ull + GN_LEASE_INVOICE_GIVEUP_S) * 1000 + GN_LEASE_INVOICE_RESEND_MAX_MS);
  /* About one send per 10 minutes of that day, and none after it. */
  size_t day = p->n_invoice_sends - flapped;
  assert_true(day >= GN_LEASE_INVOICE_GIVEUP_S / 600 && day <= GN_LEASE_INVOICE_GIVEUP_S / 600 + 20);
  assert_int_equal(p->timer, UINT64_MAX); /* nothing left to do */
  size_t sent = p->n_invoice_sends;
  gn_lease_info info;
  gn_lease_prov_info(p->m, &info);
  assert_int_equal(info.phase, GN_LEASE_PHASE_ENDED);
  assert_true(info.invoice_unanswered);
  assert_false(p->settled);
  /* The peer goes and comes back: still nothing sent. */
  assert_int_equal(gn_lease_prov_peer(p->m, pv_now(p), false, &o), 0);
  pv_handle(p, &o);
  assert_int_equal(gn_lease_prov_peer(p->m, pv_now(p), true, &o), 0);
  pv_handle(p, &o);
  pv_until(p, p->now_ms + 3600000);
  assert_int_equal(p->n_invoice_sends, sent);
  /* A restart keeps it so (the count is persisted); the invoice is stored
   * again (idempotent), not sent, and not announced again. */
  gn_buf inv = {0};
  assert_int_equal(gn_buf_append(&inv, p->invoice.data, p->invoice.len), 0);
  p->m = gn_lease_prov_free(p->m);
  p->utc0 += (int64_t)(p->now_ms / 1000);
  p->now_ms = 0;
  p->timer = 0;
  assert_int_equal(gn_lease_prov_restore(p->prov, p->ag.data, p->ag.len, p->state.data, p->state.len, p->ledger.data,
                                         p->ledger.len / 2, pv_now(p), &p->m, &o),
                   0);
  pv_handle(p, &o);
  assert_int_equal(gn_lease_prov_peer(p->m, pv_now(p), true, &o), 0);
  pv_handle(p, &o);
  pv_until(p, 3600000);
  assert_int_equal(p->n_invoice_sends, sent);
  assert_int_equal(p->n_unanswered, 1);
  gn_lease_prov_info(p->m, &info);
  assert_true(info.invoice_unanswered);
  /* A countersignature that still arrives settles the lease. */
  gn_bill_head h, fin;
  gn_buf ia = {0};
  assert_int_equal(gn_bill_head_init(p->ag.data, p->ag.len, &h), 0);
  assert_int_equal(gn_bill_invoice_check(inv.data, inv.len, p->ag.data, p->ag.len, &h, 15, 5, 0, &fin, NULL, NULL, 0),
                   0);
  assert_int_equal(gn_bill_invoice_accept_seal(p->req, p->ag.data, p->ag.len, &fin, START_S + 30, &ia), 0);
  assert_int_equal(pv_recv(p, &ia), 0);
  assert_true(p->settled);
  assert_true(p->settled_accepted);
  gn_lease_prov_info(p->m, &info);
  assert_false(info.invoice_unanswered);
  gn_buf_done(&ia);
  gn_buf_done(&inv);
  gn_lease_out_done(&o);
}

/* A provider restarted again and again (each restart gives the requester a
 * new payment timeout) keeps at most GN_LEASE_MAX_PENDING unanswered notes:
 * one more ends the lease as unpaid rather than forget one. */
static void test_prov_pending_notes_bounded(void **state) {
  pv *p = *state;
  gn_lease_out o = {0};
  uint64_t mono = 0;
  for (int k = 0; k < GN_LEASE_MAX_PENDING + 2 && !p->ended; k++) {
    pv_until(p, mono + 10000);
    gn_lease_info info;
    gn_lease_prov_info(p->m, &info);
    assert_true(info.pending <= GN_LEASE_MAX_PENDING);
    if (p->ended)
      break;
    /* Crash and come back at once on a new clock, the requester reachable. */
    p->m = gn_lease_prov_free(p->m);
    p->utc0 += (int64_t)((p->now_ms - mono) / 1000);
    mono = 0;
    p->now_ms = 0;
    gn_lease_state_info si;
    assert_int_equal(gn_lease_state_peek(p->state.data, p->state.len, &si), 0);
    assert_int_equal(gn_lease_prov_restore(p->prov, p->ag.data, p->ag.len, p->state.data, p->state.len,
                                           p->ledger.data + (si.ticks_from - 1) * 2,
                                           p->ledger.len / 2 - (si.ticks_from - 1), pv_now(p), &p->m, &o),
                     0);
    pv_handle(p, &o);
    assert_int_equal(gn_lease_prov_peer(p->m, pv_now(p), true, &o), 0);
    pv_handle(p, &o);
  }
  assert_true(p->ended);
  assert_non_null(strstr(p->end_reason, "too many debit notes"));
  gn_lease_out_done(&o);
}

static void test_prov_restore_refuses_other_lease_state(void **state) {
  pv *p = *state;
  gn_buf ag2 = {0};
  lh_lease t2 = p->terms;
  t2.nonce = 43;
  assert_int_equal(lh_agreement(p->prov, p->req, &t2, &ag2), 0);
  gn_lease_prov *m = NULL;
  gn_lease_out o = {0};
  assert_int_equal(
      gn_lease_prov_restore(p->prov, ag2.data, ag2.len, p->state.data, p->state.len, NULL, 0, pv_now(p), &m, &o),
      GN_EINVAL);
  uint8_t junk[8] = {1, 2, 3};
  assert_int_equal(
      gn_lease_prov_restore(p->prov, p->ag.data, p->ag.len, junk, sizeof(junk), NULL, 0, pv_now(p), &m, &o), GN_EINVAL);
  assert_null(m);
  gn_buf_done(&ag2);
  gn_lease_out_done(&o);
}

int main(void) {
  if (sodium_init() < 0)
    return 1;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_prov_refuses_another_identity, pv_setup, pv_teardown),
      cmocka_unit_test_setup_teardown(test_prov_tick_only_after_whole_seconds, pv_setup, pv_teardown),
      cmocka_unit_test_setup_teardown(test_prov_catch_up_writes_each_second, pv_setup, pv_teardown),
      cmocka_unit_test_setup_teardown(test_prov_note_every_interval, pv_setup, pv_teardown),
      cmocka_unit_test_setup_teardown(test_prov_acceptance_moves_head, pv_setup, pv_teardown),
      cmocka_unit_test_setup_teardown(test_prov_acceptance_latency_from_send, pv_setup, pv_teardown),
      cmocka_unit_test_setup_teardown(test_prov_latency_counts_from_send_not_issue, pv_setup, pv_teardown),
      cmocka_unit_test_setup_teardown(test_prov_payment_timeout_ends_lease, pv_setup, pv_teardown),
      cmocka_unit_test_setup_teardown(test_prov_unreachable_requester_ends_lease, pv_setup, pv_teardown),
      cmocka_unit_test_setup_teardown(test_prov_peer_back_within_grace_keeps_lease, pv_setup, pv_teardown),
      cmocka_unit_test_setup_teardown(test_prov_rejection_ends_lease, pv_setup, pv_teardown),
      cmocka_unit_test_setup_teardown(test_prov_answer_from_another_key_ignored, pv_setup, pv_teardown),
      cmocka_unit_test_setup_teardown(test_prov_release_ends_with_invoice_after_last_accepted, pv_setup, pv_teardown),
      cmocka_unit_test_setup_teardown(test_prov_late_acceptance_reseals_invoice, pv_setup, pv_teardown),
      cmocka_unit_test_setup_teardown(test_prov_expires_at_max_s, pv_setup, pv_teardown),
      cmocka_unit_test_setup_teardown(test_prov_restart_writes_downtime_idle, pv_setup, pv_teardown),
      cmocka_unit_test_setup_teardown(test_prov_restart_after_long_downtime_ends_lease, pv_setup, pv_teardown),
      cmocka_unit_test_setup_teardown(test_prov_invoice_leaves_out_trailing_idle_seconds, pv_setup, pv_teardown),
      cmocka_unit_test_setup_teardown(test_prov_restart_after_end_resends_same_invoice, pv_setup, pv_teardown),
      cmocka_unit_test_setup_teardown(test_prov_invoice_states_energy_kept_across_restart, pv_setup, pv_teardown),
      cmocka_unit_test_setup_teardown(test_prov_invoice_without_energy_states_none, pv_setup, pv_teardown),
      cmocka_unit_test_setup_teardown(test_prov_unanswered_invoice_resends_bounded, pv_setup, pv_teardown),
      cmocka_unit_test_setup_teardown(test_prov_pending_notes_bounded, pv_setup_long, pv_teardown),
      cmocka_unit_test_setup_teardown(test_prov_restore_refuses_other_lease_state, pv_setup, pv_teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
