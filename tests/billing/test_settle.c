/* Settlement: vouchers (only increasing, only the requester's, only for their
 * own lease), the durable outbox with the ledger driver, the retry schedule,
 * the outbox bound and the balance arithmetic (an overflow is an error). */
#include "settle_fixture.h"

#define NOW_MS 1764700000000ll

static void expect_voucher(gn_settle *s, const char *lease, gn_settle_role role, uint64_t seq, uint64_t amount,
                           bool final) {
  gn_settle_voucher v;
  assert_int_equal(gn_settle_get_voucher(s, lease, role, &v, NULL), 0);
  assert_int_equal(v.seq, seq);
  assert_int_equal(v.amount_micro, amount);
  assert_int_equal(v.final, final);
}

static int record(sf *f, const sf_lease *l, const gn_buf *v) {
  return gn_settle_record_voucher(f->prov, GN_SETTLE_PROVIDER, l->agreement.data, l->agreement.len, v->data, v->len,
                                  SF_START_S + 10);
}

static void test_voucher_recorded_highest_per_lease(void **state) {
  sf *f = *state;
  gn_buf v = {0};
  sf_debit_voucher(&f->a, f->requester, 1, 60, 60000, &v);
  assert_int_equal(record(f, &f->a, &v), 0);
  sf_debit_voucher(&f->a, f->requester, 2, 120, 120000, &v);
  assert_int_equal(record(f, &f->a, &v), 0);
  expect_voucher(f->prov, f->a.lease_id, GN_SETTLE_PROVIDER, 2, 120000, false);
  /* The envelope kept is the requester's, byte for byte. */
  gn_buf kept = {0};
  gn_settle_voucher sv;
  assert_int_equal(gn_settle_get_voucher(f->prov, f->a.lease_id, GN_SETTLE_PROVIDER, &sv, &kept), 0);
  assert_int_equal(kept.len, v.len);
  assert_memory_equal(kept.data, v.data, v.len);
  assert_memory_equal(sv.requester, f->requester->pk, GN_PK_LEN);
  /* The same voucher again changes nothing. */
  assert_int_equal(record(f, &f->a, &v), 0);
  assert_int_equal(sf_count(f->db, "SELECT count(*) FROM settle_vouchers"), 1);
  gn_buf_done(&kept);
  gn_buf_done(&v);
}

static void test_voucher_that_decreases_is_refused(void **state) {
  sf *f = *state;
  gn_buf v = {0};
  sf_debit_voucher(&f->a, f->requester, 2, 120, 120000, &v);
  assert_int_equal(record(f, &f->a, &v), 0);
  /* A newer note's voucher for less money, or for fewer seconds. */
  sf_debit_voucher(&f->a, f->requester, 3, 180, 100000, &v);
  assert_int_equal(record(f, &f->a, &v), GN_EAUDIT);
  sf_debit_voucher(&f->a, f->requester, 3, 100, 130000, &v);
  assert_int_equal(record(f, &f->a, &v), GN_EAUDIT);
  /* A second, different voucher for the same note. */
  sf_debit_voucher(&f->a, f->requester, 2, 120, 125000, &v);
  assert_int_equal(record(f, &f->a, &v), GN_EAUDIT);
  /* An older note's voucher for more than the newest. */
  sf_debit_voucher(&f->a, f->requester, 1, 60, 130000, &v);
  assert_int_equal(record(f, &f->a, &v), GN_EAUDIT);
  expect_voucher(f->prov, f->a.lease_id, GN_SETTLE_PROVIDER, 2, 120000, false);
  gn_buf_done(&v);
}

static void test_voucher_arriving_late_is_kept_out(void **state) {
  sf *f = *state;
  gn_buf v1 = {0}, v2 = {0};
  sf_debit_voucher(&f->a, f->requester, 1, 60, 60000, &v1);
  sf_debit_voucher(&f->a, f->requester, 2, 120, 120000, &v2);
  assert_int_equal(record(f, &f->a, &v2), 0);
  /* The requester re-sent its first acceptance after the second: not an
   * error, and the highest voucher stays. */
  assert_int_equal(record(f, &f->a, &v1), 0);
  expect_voucher(f->prov, f->a.lease_id, GN_SETTLE_PROVIDER, 2, 120000, false);
  gn_buf_done(&v1);
  gn_buf_done(&v2);
}

static void test_voucher_not_signed_by_the_requester_is_refused(void **state) {
  sf *f = *state;
  gn_buf v = {0}, forged = {0};
  sf_debit_voucher(&f->a, f->requester, 1, 60, 60000, &v);
  /* The provider (or a stranger) signing the requester's promise. */
  sf_resign(&v, f->provider, &forged);
  assert_int_equal(record(f, &f->a, &forged), GN_EPERM);
  sf_resign(&v, f->other, &forged);
  assert_int_equal(record(f, &f->a, &forged), GN_EPERM);
  /* A broken signature. */
  forged.len = 0;
  assert_int_equal(gn_buf_append(&forged, v.data, v.len), 0);
  forged.data[forged.len - 1] ^= 1;
  assert_int_equal(record(f, &f->a, &forged), GN_ESIG);
  assert_int_equal(sf_count(f->db, "SELECT count(*) FROM settle_vouchers"), 0);
  gn_buf_done(&v);
  gn_buf_done(&forged);
}

static void test_voucher_for_another_lease_is_refused(void **state) {
  sf *f = *state;
  gn_buf v = {0};
  sf_debit_voucher(&f->b, f->requester, 1, 60, 60000, &v);
  assert_true(record(f, &f->a, &v) < 0);
  assert_int_equal(sf_count(f->db, "SELECT count(*) FROM settle_vouchers"), 0);
  /* A lease id recorded under one agreement never takes another's. */
  assert_int_equal(record(f, &f->b, &v), 0);
  assert_int_equal(sqlite3_exec(f->db, "UPDATE settle_vouchers SET agreement = zeroblob(32)", NULL, NULL, NULL),
                   SQLITE_OK);
  sf_debit_voucher(&f->b, f->requester, 2, 120, 120000, &v);
  assert_int_equal(record(f, &f->b, &v), GN_EPERM);
  gn_buf_done(&v);
}

static void test_voucher_recorded_only_by_its_party(void **state) {
  sf *f = *state;
  gn_buf v = {0};
  sf_debit_voucher(&f->a, f->requester, 1, 60, 60000, &v);
  /* The provider's node is not the requester of this lease. */
  assert_int_equal(gn_settle_record_voucher(f->prov, GN_SETTLE_REQUESTER, f->a.agreement.data, f->a.agreement.len,
                                            v.data, v.len, SF_START_S),
                   GN_EPERM);
  assert_int_equal(gn_settle_record_voucher(f->req_db, GN_SETTLE_REQUESTER, f->a.agreement.data, f->a.agreement.len,
                                            v.data, v.len, SF_START_S),
                   0);
  assert_int_equal(gn_settle_record_voucher(f->req_db, GN_SETTLE_PROVIDER, f->a.agreement.data, f->a.agreement.len,
                                            v.data, v.len, SF_START_S),
                   GN_EPERM);
  gn_buf_done(&v);
}

static void test_final_voucher_closes_the_lease(void **state) {
  sf *f = *state;
  gn_buf v = {0}, inv = {0}, acc = {0}, inv2 = {0}, acc2 = {0};
  gn_bill_head fin;
  sf_final(f, &f->a, NULL, 30, &inv, &acc, &fin);
  /* A debit voucher for more than the final one cannot come later. */
  sf_debit_voucher(&f->a, f->requester, 1, 10, 10000, &v);
  assert_int_equal(record(f, &f->a, &v), 0);
  assert_int_equal(record(f, &f->a, &acc), 0);
  expect_voucher(f->prov, f->a.lease_id, GN_SETTLE_PROVIDER, 0, fin.total_micro, true);
  assert_int_equal(record(f, &f->a, &v), 0); /* late, and less: kept out */
  sf_debit_voucher(&f->a, f->requester, 2, 60, 60000, &v);
  assert_int_equal(record(f, &f->a, &v), GN_ESTATE);
  /* Nor a second final voucher. */
  sf_final(f, &f->a, NULL, 40, &inv2, &acc2, NULL);
  assert_int_equal(record(f, &f->a, &acc2), GN_ESTATE);
  expect_voucher(f->prov, f->a.lease_id, GN_SETTLE_PROVIDER, 0, fin.total_micro, true);
  gn_buf_done(&v);
  gn_buf_done(&inv);
  gn_buf_done(&acc);
  gn_buf_done(&inv2);
  gn_buf_done(&acc2);
}

static void test_final_below_the_vouchers_is_refused(void **state) {
  sf *f = *state;
  gn_buf v = {0}, inv = {0}, acc = {0};
  sf_debit_voucher(&f->a, f->requester, 1, 60, 60000, &v);
  assert_int_equal(record(f, &f->a, &v), 0);
  sf_final(f, &f->a, NULL, 30, &inv, &acc, NULL); /* 30 s: less than the 60 s vouched */
  gn_settle_final fi = sf_final_item(&f->a, GN_SETTLE_PROVIDER, &inv, &acc);
  assert_int_equal(gn_settle_enqueue_final(f->prov, &fi, NOW_MS), GN_EAUDIT);
  assert_int_equal(sf_count(f->db, "SELECT count(*) FROM settle_outbox"), 0);
  expect_voucher(f->prov, f->a.lease_id, GN_SETTLE_PROVIDER, 1, 60000, false);
  gn_buf_done(&v);
  gn_buf_done(&inv);
  gn_buf_done(&acc);
}

static void test_ledger_driver_settles_the_final_voucher(void **state) {
  sf *f = *state;
  gn_buf v = {0}, inv = {0}, acc = {0};
  gn_bill_head fin;
  sf_debit_voucher(&f->a, f->requester, 1, 10, 10000, &v);
  assert_int_equal(record(f, &f->a, &v), 0);
  sf_final(f, &f->a, NULL, 30, &inv, &acc, &fin);
  gn_settle_final fi = sf_final_item(&f->a, GN_SETTLE_PROVIDER, &inv, &acc);
  gn_settle_status st;
  assert_int_equal(gn_settle_status_get(f->prov, f->a.lease_id, GN_SETTLE_PROVIDER, &st), 0);
  assert_int_equal(st.state, GN_SETTLE_NONE);
  assert_int_equal(gn_settle_enqueue_final(f->prov, &fi, NOW_MS), 0);
  assert_int_equal(gn_settle_status_get(f->prov, f->a.lease_id, GN_SETTLE_PROVIDER, &st), 0);
  assert_int_equal(st.state, GN_SETTLE_PENDING);
  char hex[65], key[GN_SETTLE_KEY_STRLEN];
  uint8_t h[32];
  gn_bill_hash(inv.data, inv.len, h);
  sodium_bin2hex(hex, sizeof hex, h, 32);
  snprintf(key, sizeof key, "%s-%s", f->a.lease_id, hex);
  assert_string_equal(st.key, key);

  gn_settle_driver *d = NULL;
  assert_int_equal(gn_settle_ledger_driver_new(f->prov, &d), 0);
  assert_string_equal(d->name, "ledger");
  size_t n = 0;
  assert_int_equal(gn_settle_drain(f->prov, d, NOW_MS, 10, &n), 0);
  assert_int_equal(n, 1);
  assert_int_equal(gn_settle_status_get(f->prov, f->a.lease_id, GN_SETTLE_PROVIDER, &st), 0);
  assert_int_equal(st.state, GN_SETTLE_SETTLED);
  assert_string_equal(st.driver, "ledger");
  assert_int_equal(sf_count(f->db, "SELECT count(*) FROM settle_book"), 1);
  char sql[200];
  snprintf(sql, sizeof sql, "SELECT amount_micro FROM settle_book WHERE key = '%s'", key);
  assert_int_equal(sf_count(f->db, sql), fin.total_micro);
  /* The settled item's body is dropped; the key and the outcome stay. */
  assert_int_equal(sf_count(f->db, "SELECT length(body) FROM settle_outbox"), 0);
  /* Nothing is left to do. */
  assert_int_equal(gn_settle_drain(f->prov, d, NOW_MS + 10000000, 10, &n), 0);
  assert_int_equal(n, 0);

  gn_settle_balance *b = NULL;
  size_t nb = 0;
  assert_int_equal(gn_settle_balances(f->prov, &b, &nb), 0);
  assert_int_equal(nb, 1);
  assert_int_equal(b[0].role, GN_SETTLE_PROVIDER);
  assert_memory_equal(b[0].peer, f->requester->pk, GN_PK_LEN);
  assert_string_equal(b[0].currency, "EUR");
  assert_int_equal(b[0].leases, 1);
  assert_int_equal(b[0].vouched_micro, fin.total_micro);
  assert_int_equal(b[0].settled_micro, fin.total_micro);
  free(b);
  gn_settle_driver_free(d);
  gn_buf_done(&v);
  gn_buf_done(&inv);
  gn_buf_done(&acc);
}

static void test_enqueue_twice_queues_once(void **state) {
  sf *f = *state;
  gn_buf inv = {0}, acc = {0};
  sf_final(f, &f->a, NULL, 5, &inv, &acc, NULL);
  gn_settle_final fi = sf_final_item(&f->a, GN_SETTLE_PROVIDER, &inv, &acc);
  assert_int_equal(gn_settle_enqueue_final(f->prov, &fi, NOW_MS), 0);
  assert_int_equal(gn_settle_enqueue_final(f->prov, &fi, NOW_MS + 5), 0);
  assert_int_equal(sf_count(f->db, "SELECT count(*) FROM settle_outbox"), 1);
  gn_buf_done(&inv);
  gn_buf_done(&acc);
}

static void test_enqueue_checks_what_it_settles(void **state) {
  sf *f = *state;
  gn_buf inv = {0}, acc = {0}, inv2 = {0}, acc2 = {0}, v = {0};
  sf_final(f, &f->a, NULL, 5, &inv, &acc, NULL);
  sf_final(f, &f->a, NULL, 6, &inv2, &acc2, NULL);
  /* The voucher must name this very invoice. */
  gn_settle_final fi = sf_final_item(&f->a, GN_SETTLE_PROVIDER, &inv2, &acc);
  assert_int_equal(gn_settle_enqueue_final(f->prov, &fi, NOW_MS), GN_EDIGEST);
  /* A debit voucher is not a final one. */
  sf_debit_voucher(&f->a, f->requester, 1, 5, 5000, &v);
  fi = sf_final_item(&f->a, GN_SETTLE_PROVIDER, &inv, &v);
  assert_int_equal(gn_settle_enqueue_final(f->prov, &fi, NOW_MS), GN_EINVAL);
  /* Another lease's agreement. */
  fi = sf_final_item(&f->b, GN_SETTLE_PROVIDER, &inv, &acc);
  assert_true(gn_settle_enqueue_final(f->prov, &fi, NOW_MS) < 0);
  assert_int_equal(sf_count(f->db, "SELECT count(*) FROM settle_outbox"), 0);
  assert_int_equal(sf_count(f->db, "SELECT count(*) FROM settle_vouchers"), 0);
  gn_buf_done(&inv);
  gn_buf_done(&acc);
  gn_buf_done(&inv2);
  gn_buf_done(&acc2);
  gn_buf_done(&v);
}

static void test_requester_settles_what_it_owes(void **state) {
  sf *f = *state;
  gn_buf inv = {0}, acc = {0};
  gn_bill_head fin;
  sf_final(f, &f->a, NULL, 7, &inv, &acc, &fin);
  gn_settle_final fi = sf_final_item(&f->a, GN_SETTLE_REQUESTER, &inv, &acc);
  assert_int_equal(gn_settle_enqueue_final(f->req_db, &fi, NOW_MS), 0);
  gn_settle_balance *b = NULL;
  size_t nb = 0;
  assert_int_equal(gn_settle_balances(f->req_db, &b, &nb), 0);
  assert_int_equal(nb, 1);
  assert_int_equal(b[0].role, GN_SETTLE_REQUESTER);
  assert_memory_equal(b[0].peer, f->provider->pk, GN_PK_LEN);
  assert_int_equal(b[0].vouched_micro, fin.total_micro);
  assert_int_equal(b[0].final_micro, fin.total_micro);
  assert_int_equal(b[0].settled_micro, 0); /* queued, not yet settled */
  free(b);
  gn_buf_done(&inv);
  gn_buf_done(&acc);
}

/* A driver that refuses as told: transient or for good. */
typedef struct fake_driver {
  gn_settle_driver base;
  int calls;
  bool retry;
} fake_driver;

static int fake_submit(gn_settle_driver *d, const gn_settle_item *it, gn_settle_outcome *o) {
  fake_driver *fd = (fake_driver *)d;
  (void)it;
  fd->calls++;
  o->retry = fd->retry;
  o->http_status = fd->retry ? 503 : 400;
  snprintf(o->reason, sizeof o->reason, "refused\x01 by test");
  return GN_EREMOTE;
}

static void test_retries_back_off_exponentially(void **state) {
  sf *f = *state;
  gn_buf inv = {0}, acc = {0};
  sf_final(f, &f->a, NULL, 5, &inv, &acc, NULL);
  gn_settle_final fi = sf_final_item(&f->a, GN_SETTLE_PROVIDER, &inv, &acc);
  assert_int_equal(gn_settle_enqueue_final(f->prov, &fi, NOW_MS), 0);
  fake_driver fd = {.base = {.name = "fake", .submit = fake_submit}, .retry = true};
  int64_t due = 0, t = NOW_MS;
  /* Backoff 100 ms base, 1000 ms cap (sf_setup): 100, 200, 400, 800, 1000, 1000. */
  static const int64_t gaps[] = {100, 200, 400, 800, 1000, 1000};
  for (size_t i = 0; i < GN_ARRAY_SIZE(gaps); i++) {
    size_t n = 0;
    assert_int_equal(gn_settle_drain(f->prov, &fd.base, t, 10, &n), 0);
    assert_int_equal(n, 1);
    assert_int_equal(gn_settle_outbox_next_due(f->prov, &due), 0);
    assert_int_equal(due - t, gaps[i]);
    /* Not before it is due. */
    assert_int_equal(gn_settle_drain(f->prov, &fd.base, due - 1, 10, &n), 0);
    assert_int_equal(n, 0);
    t = due;
  }
  assert_int_equal(fd.calls, (int)GN_ARRAY_SIZE(gaps));
  gn_settle_status st;
  assert_int_equal(gn_settle_status_get(f->prov, f->a.lease_id, GN_SETTLE_PROVIDER, &st), 0);
  assert_int_equal(st.state, GN_SETTLE_PENDING);
  assert_int_equal(st.attempts, GN_ARRAY_SIZE(gaps));
  assert_string_equal(st.reason, "refused? by test"); /* made printable */
  gn_buf_done(&inv);
  gn_buf_done(&acc);
}

static void test_failed_item_stays_failed_until_retried(void **state) {
  sf *f = *state;
  gn_buf inv = {0}, acc = {0};
  sf_final(f, &f->a, NULL, 5, &inv, &acc, NULL);
  gn_settle_final fi = sf_final_item(&f->a, GN_SETTLE_PROVIDER, &inv, &acc);
  assert_int_equal(gn_settle_enqueue_final(f->prov, &fi, NOW_MS), 0);
  fake_driver fd = {.base = {.name = "fake", .submit = fake_submit}, .retry = false};
  size_t n = 0;
  assert_int_equal(gn_settle_drain(f->prov, &fd.base, NOW_MS, 10, &n), 0);
  assert_int_equal(gn_settle_drain(f->prov, &fd.base, NOW_MS + 86400000, 10, &n), 0);
  assert_int_equal(fd.calls, 1);
  gn_settle_status st;
  assert_int_equal(gn_settle_status_get(f->prov, f->a.lease_id, GN_SETTLE_PROVIDER, &st), 0);
  assert_int_equal(st.state, GN_SETTLE_FAILED);
  uint64_t pending = 9, failed = 9;
  assert_int_equal(gn_settle_outbox_counts(f->prov, &pending, &failed), 0);
  assert_int_equal(pending, 0);
  assert_int_equal(failed, 1);
  uint64_t again = 0;
  assert_int_equal(gn_settle_outbox_retry(f->prov, f->a.lease_id, GN_SETTLE_PROVIDER, NOW_MS + 5, &again), 0);
  assert_int_equal(again, 1);
  assert_int_equal(gn_settle_outbox_retry(f->prov, f->a.lease_id, GN_SETTLE_PROVIDER, NOW_MS + 5, NULL),
                   GN_ENOTFOUND); /* pending now, not failed */
  assert_int_equal(gn_settle_drain(f->prov, &fd.base, NOW_MS + 5, 10, &n), 0);
  assert_int_equal(fd.calls, 2);
  /* Failed again; "retry all" takes it back too. */
  assert_int_equal(gn_settle_outbox_retry(f->prov, NULL, GN_SETTLE_PROVIDER, NOW_MS + 6, &again), 0);
  assert_int_equal(again, 1);
  assert_int_equal(gn_settle_outbox_counts(f->prov, &pending, &failed), 0);
  assert_int_equal(pending, 1);
  assert_int_equal(failed, 0);
  gn_buf_done(&inv);
  gn_buf_done(&acc);
}

static void test_outbox_is_bounded(void **state) {
  sf *f = *state;
  /* Fill the outbox with waiting items (rows as enqueue writes them). */
  assert_int_equal(
      sqlite3_exec(f->db,
                   "WITH RECURSIVE c(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM c WHERE i < 4096)"
                   " INSERT INTO settle_outbox(key, lease_id, role, peer, currency, amount_micro, body, state,"
                   " attempts, next_ms, created_ms) SELECT 'k-' || i, 'l-' || i, 1, zeroblob(32), 'EUR', 1, '{}', 1,"
                   " 0, 0, 0 FROM c",
                   NULL, NULL, NULL),
      SQLITE_OK);
  gn_buf inv = {0}, acc = {0};
  sf_final(f, &f->a, NULL, 5, &inv, &acc, NULL);
  gn_settle_final fi = sf_final_item(&f->a, GN_SETTLE_PROVIDER, &inv, &acc);
  assert_int_equal(gn_settle_enqueue_final(f->prov, &fi, NOW_MS), GN_ETOOBIG);
  /* All or nothing: the final voucher is not recorded either. */
  assert_int_equal(sf_count(f->db, "SELECT count(*) FROM settle_vouchers"), 0);
  /* Once one is done there is room again. */
  assert_int_equal(sqlite3_exec(f->db, "UPDATE settle_outbox SET state = 2 WHERE key = 'k-1'", NULL, NULL, NULL),
                   SQLITE_OK);
  assert_int_equal(gn_settle_enqueue_final(f->prov, &fi, NOW_MS), 0);
  gn_buf_done(&inv);
  gn_buf_done(&acc);
}

static void test_balance_add_checks_overflow(void **state) {
  (void)state;
  gn_settle_balance b;
  memset(&b, 0, sizeof b);
  assert_int_equal(gn_settle_balance_add(&b, UINT64_MAX - 5, true, true), 0);
  assert_int_equal(gn_settle_balance_add(&b, 5, false, false), 0);
  assert_int_equal(b.vouched_micro, UINT64_MAX);
  assert_int_equal(b.final_micro, UINT64_MAX - 5);
  assert_int_equal(b.settled_micro, UINT64_MAX - 5);
  gn_settle_balance before = b;
  assert_int_equal(gn_settle_balance_add(&b, 1, false, false), GN_ETOOBIG);
  assert_memory_equal(&b, &before, sizeof b); /* unchanged */
  /* The final sum overflowing alone is caught too. */
  memset(&b, 0, sizeof b);
  b.final_micro = UINT64_MAX;
  assert_int_equal(gn_settle_balance_add(&b, 1, true, false), GN_ETOOBIG);
  assert_int_equal(b.vouched_micro, 0);
  /* Settled without being final is a programming error. */
  assert_int_equal(gn_settle_balance_add(&b, 1, false, true), GN_EINVAL);
  /* 3 + 4 = 7 across leases. */
  memset(&b, 0, sizeof b);
  assert_int_equal(gn_settle_balance_add(&b, 3, false, false), 0);
  assert_int_equal(gn_settle_balance_add(&b, 4, true, false), 0);
  assert_int_equal(b.leases, 2);
  assert_int_equal(b.vouched_micro, 7);
  assert_int_equal(b.final_micro, 4);
}

static void test_balances_group_and_overflow_is_an_error(void **state) {
  sf *f = *state;
  gn_buf v = {0};
  sf_lease c, d, e;
  sf_agree(f, f->provider, f->requester, "EUR", &c);
  sf_agree(f, f->provider, f->requester, "USD", &d);
  sf_agree(f, f->provider, f->other, "EUR", &e);
  sf_debit_voucher(&f->a, f->requester, 1, 60, 1000, &v);
  assert_int_equal(record(f, &f->a, &v), 0);
  sf_debit_voucher(&f->b, f->requester, 1, 60, 2000, &v);
  assert_int_equal(record(f, &f->b, &v), 0);
  sf_debit_voucher(&d, f->requester, 1, 60, 500, &v);
  assert_int_equal(record(f, &d, &v), 0);
  sf_debit_voucher(&e, f->other, 1, 60, 700, &v);
  assert_int_equal(record(f, &e, &v), 0);
  gn_settle_balance *b = NULL;
  size_t nb = 0;
  assert_int_equal(gn_settle_balances(f->prov, &b, &nb), 0);
  assert_int_equal(nb, 3); /* requester/EUR (2 leases), requester/USD, other/EUR */
  uint64_t eur_req = 0, usd_req = 0, eur_other = 0;
  for (size_t i = 0; i < nb; i++) {
    bool req = memcmp(b[i].peer, f->requester->pk, GN_PK_LEN) == 0;
    if (req && strcmp(b[i].currency, "EUR") == 0) {
      eur_req = b[i].vouched_micro;
      assert_int_equal(b[i].leases, 2);
    } else if (req && strcmp(b[i].currency, "USD") == 0) {
      usd_req = b[i].vouched_micro;
    } else if (!req && strcmp(b[i].currency, "EUR") == 0) {
      eur_other = b[i].vouched_micro;
    }
  }
  assert_int_equal(eur_req, 3000);
  assert_int_equal(usd_req, 500);
  assert_int_equal(eur_other, 700);
  free(b);
  /* Vouchers at the largest amount a voucher may carry: three of them do
   * not fit in 64 bits, and the balance says so instead of wrapping. */
  sf_debit_voucher(&f->a, f->requester, 2, 120, INT64_MAX, &v);
  assert_int_equal(record(f, &f->a, &v), 0);
  sf_debit_voucher(&f->b, f->requester, 2, 120, INT64_MAX, &v);
  assert_int_equal(record(f, &f->b, &v), 0);
  assert_int_equal(gn_settle_balances(f->prov, &b, &nb), 0);
  free(b);
  sf_debit_voucher(&c, f->requester, 1, 60, INT64_MAX, &v);
  assert_int_equal(record(f, &c, &v), 0);
  b = NULL;
  assert_int_equal(gn_settle_balances(f->prov, &b, &nb), GN_ETOOBIG);
  assert_null(b);
  /* Above what SQLite holds: refused at the door. */
  sf_debit_voucher(&c, f->requester, 2, 120, (uint64_t)INT64_MAX + 1, &v);
  assert_int_equal(record(f, &c, &v), GN_ETOOBIG);
  sf_lease_done(&c);
  sf_lease_done(&d);
  sf_lease_done(&e);
  gn_buf_done(&v);
}

static void test_vouchers_survive_a_reopen(void **state) {
  sf *f = *state;
  gn_buf v = {0};
  sf_debit_voucher(&f->a, f->requester, 3, 180, 180000, &v);
  assert_int_equal(record(f, &f->a, &v), 0);
  sf_close_dbs(f);
  sf_open_dbs(f);
  expect_voucher(f->prov, f->a.lease_id, GN_SETTLE_PROVIDER, 3, 180000, false);
  /* And the rule holds across the restart. */
  sf_debit_voucher(&f->a, f->requester, 4, 240, 170000, &v);
  assert_int_equal(record(f, &f->a, &v), GN_EAUDIT);
  gn_buf_done(&v);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_voucher_recorded_highest_per_lease, sf_setup, sf_teardown),
      cmocka_unit_test_setup_teardown(test_voucher_that_decreases_is_refused, sf_setup, sf_teardown),
      cmocka_unit_test_setup_teardown(test_voucher_arriving_late_is_kept_out, sf_setup, sf_teardown),
      cmocka_unit_test_setup_teardown(test_voucher_not_signed_by_the_requester_is_refused, sf_setup, sf_teardown),
      cmocka_unit_test_setup_teardown(test_voucher_for_another_lease_is_refused, sf_setup, sf_teardown),
      cmocka_unit_test_setup_teardown(test_voucher_recorded_only_by_its_party, sf_setup, sf_teardown),
      cmocka_unit_test_setup_teardown(test_final_voucher_closes_the_lease, sf_setup, sf_teardown),
      cmocka_unit_test_setup_teardown(test_final_below_the_vouchers_is_refused, sf_setup, sf_teardown),
      cmocka_unit_test_setup_teardown(test_ledger_driver_settles_the_final_voucher, sf_setup, sf_teardown),
      cmocka_unit_test_setup_teardown(test_enqueue_twice_queues_once, sf_setup, sf_teardown),
      cmocka_unit_test_setup_teardown(test_enqueue_checks_what_it_settles, sf_setup, sf_teardown),
      cmocka_unit_test_setup_teardown(test_requester_settles_what_it_owes, sf_setup, sf_teardown),
      cmocka_unit_test_setup_teardown(test_retries_back_off_exponentially, sf_setup, sf_teardown),
      cmocka_unit_test_setup_teardown(test_failed_item_stays_failed_until_retried, sf_setup, sf_teardown),
      cmocka_unit_test_setup_teardown(test_outbox_is_bounded, sf_setup, sf_teardown),
      cmocka_unit_test(test_balance_add_checks_overflow),
      cmocka_unit_test_setup_teardown(test_balances_group_and_overflow_is_an_error, sf_setup, sf_teardown),
      cmocka_unit_test_setup_teardown(test_vouchers_survive_a_reopen, sf_setup, sf_teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
