/* Issue 7's findings that no other test drives through both lease machines
 * at once: the provider's and the requester's machines wired to each other
 * (every SEND delivered at once, every WRITE_TICKS written), honest on both
 * sides.
 *  - "It takes an interval note as the final invoice and marks the lease
 *    ended, so a later `gpunet release` sends nothing and an honest
 *    provider meters on": debit notes leave the requester's lease active,
 *    a release after them still reaches the provider, which stops metering
 *    there and sends a final invoice continuing the last accepted note; the
 *    requester countersigns that one and no second, different one.
 * The machines' own tests (test_lease_prov.c, test_lease_req.c) check each
 * rule on one side; the simulator (test_lease_sim.c) the same under faults. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
/* cmocka needs the above first. */
#include <cmocka.h>

#include "billing/lease_helpers.h"

#define START_S 1764670000
#define INTERVAL 10
#define MAX_S 100
#define QMAX 64

typedef struct msg {
  int to; /* 0: provider, 1: requester */
  gn_buf env;
} msg;

typedef struct pair {
  gn_identity *prov, *req;
  gn_buf ag;
  gn_lease_prov *p;
  gn_lease_req *r;
  uint64_t now_ms;
  uint64_t timer[2];
  msg q[QMAX];
  size_t nq;
  uint64_t ticks;             /* seconds the provider metered */
  uint64_t ticks_after_end;   /* ...asked for after its END */
  bool prov_ended, req_ended; /* END seen */
  size_t releases;            /* RELEASE actions of the requester */
  size_t notes_sent, invoices_sent, vouchers;
  gn_buf invoice;               /* the provider's latest final invoice */
  bool settled[2], accepted[2]; /* SETTLED seen, and how */
  gn_bill_head head;            /* after the last note the requester accepted */
} pair;

static gn_lease_now pr_now(const pair *w) {
  return lh_now(w->now_ms, START_S + (int64_t)(w->now_ms / 1000));
}

static void pr_handle(pair *w, int side, gn_lease_out *out);

static void pr_queue(pair *w, int to, const uint8_t *data, size_t len) {
  assert_true(w->nq < QMAX);
  msg *m = &w->q[w->nq++];
  m->to = to;
  memset(&m->env, 0, sizeof(m->env));
  assert_int_equal(gn_buf_append(&m->env, data, len), 0);
}

/* Performs a machine's actions in order, as the glue does. */
static void pr_handle(pair *w, int side, gn_lease_out *out) {
  /* Set first: a call made while performing these actions (the ticks a
   * WRITE_TICKS reports) is the latest, and its timer replaces this one. */
  w->timer[side] = out->timer_at_ms;
  for (size_t i = 0; i < out->n; i++) {
    const gn_lease_action *a = &out->act[i];
    switch (a->kind) {
    case GN_LEASE_ACT_SEND: {
      uint32_t type = lh_type(a->data, a->len);
      if (side == 0 && type == GN_MSG_DEBIT_NOTE)
        w->notes_sent++;
      if (side == 0 && type == GN_MSG_INVOICE) {
        w->invoices_sent++;
        w->invoice.len = 0;
        assert_int_equal(gn_buf_append(&w->invoice, a->data, a->len), 0);
      }
      pr_queue(w, !side, a->data, a->len);
      break;
    }
    case GN_LEASE_ACT_WRITE_TICKS: {
      assert_int_equal(side, 0);
      uint64_t n = a->to - a->from + 1;
      if (w->prov_ended)
        w->ticks_after_end += n;
      uint8_t *t = lh_ticks(n, a->idle ? 0 : 1);
      gn_lease_out o2 = {0};
      assert_int_equal(gn_lease_prov_ticks(w->p, pr_now(w), a->from, t, n, &o2), 0);
      free(t);
      w->ticks += n;
      pr_handle(w, 0, &o2);
      gn_lease_out_done(&o2);
      break;
    }
    case GN_LEASE_ACT_END:
      if (side == 0)
        w->prov_ended = true;
      else
        w->req_ended = true;
      break;
    case GN_LEASE_ACT_RELEASE:
      assert_int_equal(side, 1);
      w->releases++;
      break;
    case GN_LEASE_ACT_VOUCHER:
      if (side == 1)
        w->vouchers++;
      break;
    case GN_LEASE_ACT_SETTLED:
      w->settled[side] = true;
      w->accepted[side] = a->accepted;
      break;
    default:
      break;
    }
  }
}

/* Delivers every queued message (and what they cause). */
static void pr_deliver(pair *w) {
  while (w->nq) {
    msg m = w->q[0];
    memmove(&w->q[0], &w->q[1], (w->nq - 1) * sizeof(msg));
    w->nq--;
    gn_lease_out o = {0};
    if (m.to == 0) {
      assert_true(gn_lease_prov_recv(w->p, pr_now(w), m.env.data, m.env.len, &o) >= 0);
      pr_handle(w, 0, &o);
    } else {
      uint32_t type = lh_type(m.env.data, m.env.len);
      gn_bill_head next;
      /* Follow the head the requester reaches (it accepts every honest note). */
      bool opens = type == GN_MSG_DEBIT_NOTE &&
                   gn_bill_note_open(m.env.data, m.env.len, w->ag.data, w->ag.len, &w->head, &next, NULL, NULL, 0) == 0;
      int r = gn_lease_req_recv(w->r, pr_now(w), m.env.data, m.env.len, &o);
      assert_int_equal(r, 0);
      if (opens && lh_sent(&o, GN_MSG_DEBIT_ACCEPT))
        w->head = next;
      pr_handle(w, 1, &o);
    }
    gn_lease_out_done(&o);
    gn_buf_done(&m.env);
  }
}

/* Runs both machines' timers up to t_ms, in steps of 50 ms. */
static void pr_until(pair *w, uint64_t t_ms) {
  while (w->now_ms < t_ms) {
    w->now_ms += 50;
    for (int side = 0; side < 2; side++) {
      if (w->timer[side] > w->now_ms)
        continue;
      gn_lease_out o = {0};
      if (side == 0)
        assert_int_equal(gn_lease_prov_timer(w->p, pr_now(w), &o), 0);
      else
        assert_int_equal(gn_lease_req_timer(w->r, pr_now(w), &o), 0);
      pr_handle(w, side, &o);
      gn_lease_out_done(&o);
    }
    pr_deliver(w);
  }
}

static int setup(void **state) {
  pair *w = calloc(1, sizeof(*w));
  assert_non_null(w);
  w->prov = lh_identity(7, 'p');
  w->req = lh_identity(7, 'r');
  lh_lease terms = {1, 3600000, MAX_S, INTERVAL, START_S, 77};
  assert_int_equal(lh_agreement(w->prov, w->req, &terms, &w->ag), 0);
  assert_int_equal(gn_bill_head_init(w->ag.data, w->ag.len, &w->head), 0);
  gn_lease_out o = {0};
  assert_int_equal(gn_lease_prov_new(w->prov, w->ag.data, w->ag.len, pr_now(w), &w->p, &o), 0);
  pr_handle(w, 0, &o);
  assert_int_equal(gn_lease_req_new(w->req, w->ag.data, w->ag.len, 0, pr_now(w), &w->r, &o), 0);
  pr_handle(w, 1, &o);
  gn_lease_out_done(&o);
  pr_deliver(w);
  *state = w;
  return 0;
}

static int teardown(void **state) {
  pair *w = *state;
  gn_lease_prov_free(w->p);
  gn_lease_req_free(w->r);
  for (size_t i = 0; i < w->nq; i++)
    gn_buf_done(&w->q[i].env);
  gn_buf_done(&w->invoice);
  gn_buf_done(&w->ag);
  gn_identity_free(w->prov);
  gn_identity_free(w->req);
  free(w);
  return 0;
}

static void test_finding_release_after_debit_notes_stops_the_provider(void **state) {
  pair *w = *state;
  gn_lease_info pi, ri;
  /* Three debit notes (10, 20, 30 s), each countersigned: the lease goes on
   * on both sides (the old requester took a note as the final invoice). */
  pr_until(w, 35400);
  assert_int_equal(w->notes_sent, 3);
  assert_int_equal(w->vouchers, 3);
  assert_int_equal(w->invoices_sent, 0);
  assert_false(w->req_ended);
  assert_false(w->prov_ended);
  gn_lease_req_info(w->r, pr_now(w), &ri);
  assert_int_equal(ri.phase, GN_LEASE_PHASE_ACTIVE);
  assert_int_equal(ri.accepted_s, 30);
  gn_lease_prov_info(w->p, &pi);
  assert_int_equal(pi.phase, GN_LEASE_PHASE_ACTIVE);
  assert_int_equal(pi.accepted_s, 30);
  assert_int_equal(w->ticks, 35);
  /* `gpunet release` now: the requester's machine asks to send it... */
  gn_lease_out o = {0};
  assert_int_equal(gn_lease_req_release(w->r, pr_now(w), &o), 0);
  pr_handle(w, 1, &o);
  gn_lease_out_done(&o);
  assert_int_equal(w->releases, 1);
  /* ...and the provider that gets it stops there. */
  assert_int_equal(gn_lease_prov_release(w->p, pr_now(w), &o), 0);
  pr_handle(w, 0, &o);
  gn_lease_out_done(&o);
  assert_true(w->prov_ended);
  uint64_t metered = w->ticks;
  assert_int_equal(metered, 35);
  pr_deliver(w);
  /* The final invoice continues note 3 with seconds 31..35, countersigned. */
  assert_int_equal(w->invoices_sent, 1);
  gn_bill_head fin;
  gn_bill_note note;
  assert_int_equal(
      gn_bill_note_open(w->invoice.data, w->invoice.len, w->ag.data, w->ag.len, &w->head, &fin, &note, NULL, 0), 0);
  assert_true(note.final);
  assert_int_equal(note.seq, 3);
  assert_int_equal(note.from, 31);
  assert_int_equal(note.seconds, 35);
  assert_string_equal(note.end_reason, "released");
  assert_true(w->settled[1] && w->accepted[1]);
  assert_true(w->settled[0] && w->accepted[0]);
  gn_lease_prov_info(w->p, &pi);
  assert_int_equal(pi.phase, GN_LEASE_PHASE_SETTLED);
  /* A minute on: nothing metered after the release, no release repeated
   * after the invoice, no second invoice. */
  size_t releases = w->releases;
  pr_until(w, 95000);
  assert_int_equal(w->ticks, metered);
  assert_int_equal(w->ticks_after_end, 0);
  assert_int_equal(w->releases, releases);
  assert_int_equal(w->invoices_sent, 1);
  /* A second, different final invoice for the lease (one second more) is
   * refused, and the requester's answer stays the countersignature of the
   * first. */
  gn_buf other = {0};
  uint8_t *t = lh_ticks(6, 1);
  gn_bill_head fin2;
  assert_int_equal(
      gn_bill_invoice_seal(w->prov, w->ag.data, w->ag.len, &w->head, t, 6, START_S + 40, "expired", &other, &fin2), 0);
  free(t);
  assert_int_equal(gn_lease_req_recv(w->r, pr_now(w), other.data, other.len, &o), GN_EAUDIT);
  assert_null(lh_sent(&o, GN_MSG_INVOICE_ACCEPT));
  assert_non_null(lh_sent(&o, GN_MSG_INVOICE_REJECT));
  assert_int_equal(lh_count(&o, GN_LEASE_ACT_SETTLED), 0);
  gn_lease_req_info(w->r, pr_now(w), &ri);
  assert_int_equal(ri.phase, GN_LEASE_PHASE_SETTLED);
  assert_true(ri.invoice_accepted);
  gn_lease_out_done(&o);
  gn_buf_done(&other);
}

int main(void) {
  if (sodium_init() < 0)
    return 1;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_finding_release_after_debit_notes_stops_the_provider, setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
