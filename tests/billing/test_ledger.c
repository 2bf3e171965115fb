/* Tests of the ledger on real SQLite files: the hash chain, durability across
 * reopening, append-only enforcement, limits, and the invoices table. */
#include "billing/fixture.h"

#include <signal.h>
#include <sys/wait.h>

static void test_ledger_refuses_weak_synchronous(void **state) {
  fixture *f = *state;
  char path[160];
  sqlite3 *db = NULL;
  gn_ledger *l = NULL;
  snprintf(path, sizeof(path), "%s/weak.db", f->dir);
  assert_int_equal(sqlite3_open(path, &db), SQLITE_OK);
  assert_int_equal(sqlite3_exec(db, "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;", NULL, NULL, NULL), 0);
  assert_int_equal(gn_ledger_open(db, &l), GN_EINVAL);
  assert_null(l);
  assert_int_equal(sqlite3_exec(db, "PRAGMA synchronous=FULL;", NULL, NULL, NULL), 0);
  assert_int_equal(gn_ledger_open(db, &l), 0);
  assert_non_null(l);
  gn_ledger_free(l);
  sqlite3_close(db);
}

static void test_ledger_chain_links_each_tick_to_the_previous(void **state) {
  fixture *f = *state;
  gn_tick t1, t2;
  uint8_t g[32], h[32];
  assert_int_equal(gn_ledger_begin_lease(f->ledger, f->terms.lease_id, f->agreement.data, f->agreement.len), 0);
  assert_int_equal(fx_append_tick(f->ledger, f->terms.lease_id, FX_START_S + 1, 1, 42, &t1), 0);
  assert_int_equal(fx_append_tick(f->ledger, f->terms.lease_id, FX_START_S + 2, 1, GN_UTIL_UNKNOWN, &t2), 0);
  assert_int_equal(t1.idx, 1);
  assert_int_equal(t2.idx, 2);
  gn__genesis(f->agreement.data, f->agreement.len, g);
  gn__tick_hash(g, f->terms.lease_id, 1, 1, 42, h);
  assert_memory_equal(h, t1.hash, 32);
  gn__tick_hash(t1.hash, f->terms.lease_id, 2, 1, GN_UTIL_UNKNOWN, h);
  assert_memory_equal(h, t2.hash, 32);
  assert_int_equal(gn_ledger_verify_chain(f->ledger, f->terms.lease_id, NULL, 0), 0);
}

/* The tick hash v2 is specified byte for byte (docs/protocol.md,
 * notes/billing2.md): no wall-clock time, the index is the time. This
 * recomputes one by hand so a change to the layout cannot go unnoticed. */
static void test_ledger_tick_hash_layout(void **state) {
  (void)state;
  uint8_t prev[32], want[32], got[32];
  uint8_t msg[15 + 32 + 4 + 13];
  for (int i = 0; i < 32; i++)
    prev[i] = (uint8_t)i;
  memcpy(msg, "gpunet-tick-v2", 15);
  memcpy(msg + 15, prev, 32);
  memcpy(msg + 47, "l-ab", 4);
  const uint8_t fixed[13] = {0, 0, 0, 0, 0, 0, 0, 7, 0, 0, 0, 2, 55};
  memcpy(msg + 51, fixed, 13);
  crypto_generichash(want, 32, msg, sizeof(msg), NULL, 0);
  gn__tick_hash(prev, "l-ab", 7, 2, 55, got);
  assert_memory_equal(want, got, 32);
}

/* gn_ledger_ticks reads compact ticks of any range and re-verifies each row
 * against the chain; the chain head it returns is the stored one. */
static void test_ledger_reads_compact_ticks(void **state) {
  fixture *f = *state;
  uint8_t ticks[2 * 10], head[32];
  gn_tick last;
  fx_ticks(f, 10, 1);
  assert_int_equal(gn_ledger_ticks(f->ledger, f->terms.lease_id, 1, 10, ticks, head), 0);
  for (int i = 0; i < 10; i++) {
    assert_int_equal(ticks[2 * i], 1);
    assert_int_equal(ticks[2 * i + 1], i % 101);
  }
  assert_int_equal(gn_ledger_last_tick(f->ledger, f->terms.lease_id, &last), 0);
  assert_memory_equal(head, last.hash, 32);
  assert_int_equal(gn_ledger_ticks(f->ledger, f->terms.lease_id, 4, 3, ticks, head), 0);
  assert_int_equal(ticks[1], 3);
  assert_int_equal(ticks[5], 5);
  /* Beyond what exists: refused, not padded. */
  assert_int_equal(gn_ledger_ticks(f->ledger, f->terms.lease_id, 8, 4, ticks, head), GN_EINVAL);
  assert_int_equal(gn_ledger_ticks(f->ledger, "l-none", 1, 1, ticks, head), GN_ENOTFOUND);
  /* A row edited behind the ledger's back (triggers dropped) is caught. */
  assert_int_equal(
      sqlite3_exec(f->db, "DROP TRIGGER ticks_no_update; UPDATE ticks SET gpus = 0 WHERE idx = 6;", NULL, NULL, NULL),
      SQLITE_OK);
  assert_int_equal(gn_ledger_ticks(f->ledger, f->terms.lease_id, 1, 10, ticks, head), GN_EAUDIT);
  assert_int_equal(gn_ledger_ticks(f->ledger, f->terms.lease_id, 5, 3, ticks, head), GN_EAUDIT);
  assert_int_equal(gn_ledger_ticks(f->ledger, f->terms.lease_id, 1, 5, ticks, head), 0);
}

static void test_ledger_ticks_survive_reopen(void **state) {
  fixture *f = *state;
  gn_tick last;
  uint64_t n = 0;
  assert_int_equal(gn_ledger_begin_lease(f->ledger, f->terms.lease_id, f->agreement.data, f->agreement.len), 0);
  for (int i = 1; i <= 5; i++)
    assert_int_equal(fx_append_tick(f->ledger, f->terms.lease_id, FX_START_S + i, 1, 50, &last), 0);
  /* Close everything and open the file again, as a restarted node would. */
  f->ledger = gn_ledger_free(f->ledger);
  assert_int_equal(sqlite3_close(f->db), SQLITE_OK);
  f->db = fx_db_open(f->path);
  assert_int_equal(gn_ledger_open(f->db, &f->ledger), 0);
  assert_int_equal(gn_ledger_tick_count(f->ledger, f->terms.lease_id, &n), 0);
  assert_int_equal(n, 5);
  gn_tick got;
  assert_int_equal(gn_ledger_last_tick(f->ledger, f->terms.lease_id, &got), 0);
  assert_int_equal(got.idx, 5);
  assert_memory_equal(got.hash, last.hash, 32);
  assert_int_equal(gn_ledger_verify_chain(f->ledger, f->terms.lease_id, NULL, 0), 0);
  /* The chain continues where it stopped. */
  gn_tick t6;
  assert_int_equal(fx_append_tick(f->ledger, f->terms.lease_id, FX_START_S + 6, 1, 50, &t6), 0);
  assert_int_equal(t6.idx, 6);
  /* Beginning the same lease again is harmless; another agreement under the
   * same id is not. */
  assert_int_equal(gn_ledger_begin_lease(f->ledger, f->terms.lease_id, f->agreement.data, f->agreement.len), 0);
  gn_buf req2 = {0}, ag2 = {0};
  gn_lease_terms t2 = f->terms;
  t2.max_s = 99;
  assert_int_equal(gn_lease_request_seal(f->requester, &t2, &req2), 0);
  assert_int_equal(gn_agreement_seal(f->provider, req2.data, req2.len, FX_START_S, fx_gpus, 1, &ag2), 0);
  assert_int_equal(gn_ledger_begin_lease(f->ledger, f->terms.lease_id, ag2.data, ag2.len), GN_EEXIST);
  gn_buf_done(&req2);
  gn_buf_done(&ag2);
}

/* Each tick is committed by itself: a second connection (another process
 * after a crash) sees it as soon as append returns. */
static void test_ledger_tick_is_committed_on_return(void **state) {
  fixture *f = *state;
  sqlite3 *db2 = fx_db_open(f->path);
  sqlite3_stmt *st = NULL;
  assert_int_equal(gn_ledger_begin_lease(f->ledger, f->terms.lease_id, f->agreement.data, f->agreement.len), 0);
  assert_int_equal(fx_append_tick(f->ledger, f->terms.lease_id, FX_START_S + 1, 1, 10, NULL), 0);
  assert_int_equal(sqlite3_prepare_v2(db2, "SELECT count(*) FROM ticks", -1, &st, NULL), SQLITE_OK);
  assert_int_equal(sqlite3_step(st), SQLITE_ROW);
  assert_int_equal(sqlite3_column_int(st, 0), 1);
  sqlite3_finalize(st);
  sqlite3_close(db2);
  /* Inside the caller's transaction the commit would not be ours. */
  assert_int_equal(sqlite3_exec(f->db, "BEGIN", NULL, NULL, NULL), SQLITE_OK);
  assert_int_equal(fx_append_tick(f->ledger, f->terms.lease_id, FX_START_S + 2, 1, 10, NULL), GN_ESTATE);
  assert_int_equal(sqlite3_exec(f->db, "ROLLBACK", NULL, NULL, NULL), SQLITE_OK);
}

/* A 7-day lease, so the child below is still metering when it is killed. */
static int setup_week(void **state) {
  return fx_setup_with(state, 1, 400000, GN_INVOICE_MAX_S);
}

/* A process killed while metering loses nothing it had reported: every
 * tick whose append returned is in the file, and the chain verifies. */
static void test_ledger_kill_loses_no_reported_tick(void **state) {
  fixture *f = *state;
  int fds[2];
  assert_int_equal(gn_ledger_begin_lease(f->ledger, f->terms.lease_id, f->agreement.data, f->agreement.len), 0);
  assert_int_equal(pipe(fds), 0);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    /* The child meters on its own connection, reporting each durable tick. */
    sqlite3 *db = fx_db_open(f->path);
    gn_ledger *l = NULL;
    close(fds[0]);
    if (gn_ledger_open(db, &l) < 0)
      _exit(2);
    for (uint64_t i = 1; i <= f->terms.max_s; i++) {
      gn_tick t;
      if (fx_append_tick(l, f->terms.lease_id, FX_START_S + (int64_t)i, 1, 50, &t) < 0)
        _exit(3);
      if (write(fds[1], &t.idx, sizeof(t.idx)) != sizeof(t.idx))
        _exit(4);
    }
    _exit(0);
  }
  close(fds[1]);
  uint64_t reported = 0, idx;
  while (reported < 200 && read(fds[0], &idx, sizeof(idx)) == sizeof(idx))
    reported = idx;
  assert_int_equal(reported, 200);
  kill(pid, SIGKILL);
  /* Whatever the child reported after our last read is durable too. */
  while (read(fds[0], &idx, sizeof(idx)) == sizeof(idx))
    reported = idx;
  int status = 0;
  assert_int_equal(waitpid(pid, &status, 0), pid);
  assert_true(WIFSIGNALED(status));
  close(fds[0]);
  /* Reopen the file from scratch, as the restarted node would. */
  f->ledger = gn_ledger_free(f->ledger);
  assert_int_equal(sqlite3_close(f->db), SQLITE_OK);
  f->db = fx_db_open(f->path);
  assert_int_equal(gn_ledger_open(f->db, &f->ledger), 0);
  uint64_t n = 0;
  assert_int_equal(gn_ledger_tick_count(f->ledger, f->terms.lease_id, &n), 0);
  assert_true(n >= reported);
  assert_true(n <= reported + 1); /* at most the second being written */
  assert_int_equal(gn_ledger_verify_chain(f->ledger, f->terms.lease_id, NULL, 0), 0);
}

static void test_ledger_group_commit_is_all_or_nothing(void **state) {
  fixture *f = *state;
  gn_buf req = {0}, ag = {0};
  gn_lease_terms t;
  gn_tick out[4];
  uint64_t n1 = 0, n2 = 0;
  fx_terms(f, &t, 2, 400000, 100);
  fx_agree(f, &t, &req, &ag);
  assert_int_equal(gn_ledger_begin_lease(f->ledger, f->terms.lease_id, f->agreement.data, f->agreement.len), 0);
  assert_int_equal(gn_ledger_begin_lease(f->ledger, t.lease_id, ag.data, ag.len), 0);
  gn_tick_append batch[4] = {{f->terms.lease_id, FX_START_S + 1, 1, 10},
                             {t.lease_id, FX_START_S + 1, 2, 20},
                             {f->terms.lease_id, FX_START_S + 2, 1, 11},
                             {t.lease_id, FX_START_S + 2, 3, 20}}; /* 3 GPUs: over the lease's 2 */
  memset(out, 0x5a, sizeof(out));
  assert_int_equal(gn_ledger_append_ticks(f->ledger, batch, 4, out), GN_EINVAL);
  assert_int_equal(out[0].idx, 0x5a5a5a5a5a5a5a5aull); /* untouched */
  assert_int_equal(gn_ledger_tick_count(f->ledger, f->terms.lease_id, &n1), 0);
  assert_int_equal(gn_ledger_tick_count(f->ledger, t.lease_id, &n2), 0);
  assert_int_equal(n1 + n2, 0);
  batch[3].gpus = 2;
  assert_int_equal(gn_ledger_append_ticks(f->ledger, batch, 4, out), 0);
  assert_int_equal(out[0].idx, 1);
  assert_int_equal(out[2].idx, 2);
  assert_int_equal(out[3].idx, 2);
  assert_int_equal(out[3].gpus, 2);
  assert_int_equal(gn_ledger_tick_count(f->ledger, f->terms.lease_id, &n1), 0);
  assert_int_equal(gn_ledger_tick_count(f->ledger, t.lease_id, &n2), 0);
  assert_int_equal(n1, 2);
  assert_int_equal(n2, 2);
  assert_int_equal(gn_ledger_verify_chain(f->ledger, t.lease_id, NULL, 0), 0);
  gn_tick last;
  assert_int_equal(gn_ledger_last_tick(f->ledger, f->terms.lease_id, &last), 0);
  assert_memory_equal(last.hash, out[2].hash, 32);
  gn_buf_done(&req);
  gn_buf_done(&ag);
}

static void test_ledger_refuses_update_and_delete(void **state) {
  fixture *f = *state;
  fx_ticks(f, 3, 1);
  static const char *const sql[] = {
      "UPDATE ticks SET gpus = 0 WHERE idx = 2", "DELETE FROM ticks WHERE idx = 3", "DELETE FROM ticks",
      "UPDATE ledger_leases SET max_s = 1",      "DELETE FROM ledger_leases",
  };
  for (size_t i = 0; i < GN_ARRAY_SIZE(sql); i++) {
    char *err = NULL;
    int rc = sqlite3_exec(f->db, sql[i], NULL, NULL, &err);
    if (rc == SQLITE_OK)
      fail_msg("\"%s\" was allowed", sql[i]);
    assert_non_null(strstr(err, "append-only"));
    sqlite3_free(err);
  }
  uint64_t n = 0;
  assert_int_equal(gn_ledger_tick_count(f->ledger, f->terms.lease_id, &n), 0);
  assert_int_equal(n, 3);
}

/* Rows changed around the triggers (a tool that drops them) are caught when
 * the chain is read back, naming the second. */
static void test_ledger_detects_rows_edited_behind_its_back(void **state) {
  fixture *f = *state;
  char reason[256];
  fx_ticks(f, 20, 1);
  assert_int_equal(sqlite3_exec(f->db,
                                "DROP TRIGGER ticks_no_update; DROP TRIGGER ticks_no_delete;"
                                "UPDATE ticks SET gpus = 0 WHERE idx = 17;",
                                NULL, NULL, NULL),
                   SQLITE_OK);
  assert_int_equal(gn_ledger_verify_chain(f->ledger, f->terms.lease_id, reason, sizeof(reason)), GN_EAUDIT);
  assert_non_null(strstr(reason, "second 17: hash chain broken"));
  gn_buf env = {0};
  assert_int_equal(fx_invoice_seal(f->ledger, f->provider, f->terms.lease_id, FX_START_S + 30, "released", &env),
                   GN_EAUDIT);
  assert_int_equal(sqlite3_exec(f->db, "DELETE FROM ticks WHERE idx = 9", NULL, NULL, NULL), SQLITE_OK);
  assert_int_equal(gn_ledger_verify_chain(f->ledger, f->terms.lease_id, reason, sizeof(reason)), GN_EAUDIT);
  assert_non_null(strstr(reason, "second 9 is missing"));
  gn_buf_done(&env);
}

static void test_ledger_enforces_lease_limits(void **state) {
  fixture *f = *state;
  gn_buf req = {0}, ag = {0};
  gn_lease_terms t;
  gn_tick tk;
  fx_terms(f, &t, 2, 400000, 3);
  fx_agree(f, &t, &req, &ag);
  assert_int_equal(fx_append_tick(f->ledger, t.lease_id, FX_START_S, 1, 0, NULL), GN_ENOTFOUND);
  assert_int_equal(gn_ledger_begin_lease(f->ledger, "l-other", ag.data, ag.len), GN_EINVAL);
  assert_int_equal(gn_ledger_begin_lease(f->ledger, t.lease_id, ag.data, ag.len), 0);
  assert_int_equal(fx_append_tick(f->ledger, t.lease_id, FX_START_S + 1, 3, 0, NULL), GN_EINVAL);
  assert_int_equal(fx_append_tick(f->ledger, t.lease_id, FX_START_S + 1, 2, 101, NULL), GN_EINVAL);
  assert_int_equal(fx_append_tick(f->ledger, t.lease_id, FX_START_S + 1, 2, 0, NULL), 0);
  /* The wall clock stepped back: recorded as the previous second's time. */
  assert_int_equal(fx_append_tick(f->ledger, t.lease_id, FX_START_S - 100, 2, 0, &tk), 0);
  assert_int_equal(tk.t_s, FX_START_S + 1);
  assert_int_equal(fx_append_tick(f->ledger, t.lease_id, FX_START_S + 3, 0, 0, NULL), 0);
  assert_int_equal(fx_append_tick(f->ledger, t.lease_id, FX_START_S + 4, 2, 0, NULL), GN_ETOOBIG);
  uint64_t n = 0;
  assert_int_equal(gn_ledger_tick_count(f->ledger, t.lease_id, &n), 0);
  assert_int_equal(n, 3);
  assert_int_equal(gn_ledger_tick_count(f->ledger, "l-none", &n), GN_ENOTFOUND);
  /* Ids outside the one grammar never reach SQL or a file name. */
  static const char *const bad_ids[] = {"..", ".", "a/b", "l-1.2", "", "-x", "a b"};
  for (size_t i = 0; i < sizeof bad_ids / sizeof bad_ids[0]; i++) {
    assert_int_equal(gn_ledger_tick_count(f->ledger, bad_ids[i], &n), GN_EINVAL);
    assert_int_equal(fx_append_tick(f->ledger, bad_ids[i], FX_START_S + 5, 1, 0, NULL), GN_EINVAL);
  }
  /* A forged agreement never starts a chain. */
  ag.data[ag.len - 1] ^= 1;
  assert_int_equal(gn_ledger_begin_lease(f->ledger, t.lease_id, ag.data, ag.len), GN_ESIG);
  gn_buf_done(&req);
  gn_buf_done(&ag);
}

/* The invoices table of nodes from before the debit notes: rows are read
 * back by lease or invoice id, listed by role, and an acceptance kept with
 * an invoice shows it countersigned. */
static void test_ledger_reads_and_lists_invoices(void **state) {
  fixture *f = *state;
  gn_buf inv = {0}, acc = {0}, inv2 = {0};
  gn_invoice_record rec;
  gn_invoice_record *list = NULL;
  size_t n = 0;
  fx_ticks(f, 10, 1);
  assert_int_equal(fx_invoice_seal(f->ledger, f->provider, f->terms.lease_id, FX_START_S + 10, "interval", &inv), 0);
  fx_invoice_row(f, f->terms.lease_id, "provider", &inv, NULL, "issued");
  assert_int_equal(gn_ledger_get_invoice(f->ledger, f->terms.lease_id, NULL, &rec), 0);
  assert_string_equal(rec.status, "issued");
  assert_string_equal(rec.role, "provider");
  assert_int_equal(rec.summary.seconds, 10);
  assert_int_equal(rec.summary.total_micro, 1111);
  assert_false(rec.summary.countersigned);
  assert_int_equal(rec.accept.len, 0);
  assert_int_equal(rec.invoice.len, inv.len);
  char id[GN_LEASE_ID_STRLEN];
  memcpy(id, rec.invoice_id, sizeof(id));
  gn_invoice_record_done(&rec);
  /* By invoice id, too. */
  assert_int_equal(gn_ledger_get_invoice(f->ledger, id, "provider", &rec), 0);
  gn_invoice_record_done(&rec);
  assert_int_equal(gn_ledger_get_invoice(f->ledger, id, "requester", &rec), GN_ENOTFOUND);

  /* Accepted: both rows show the countersignature. */
  assert_int_equal(fx_invoice_accept(f->requester, &f->agreement, inv.data, inv.len, &acc), 0);
  fx_invoice_row(f, f->terms.lease_id, "provider", &inv, &acc, "accepted");
  fx_invoice_row(f, f->terms.lease_id, "requester", &inv, &acc, "accepted");
  assert_int_equal(gn_ledger_list_invoices(f->ledger, NULL, &list, &n), 0);
  assert_int_equal(n, 2);
  for (size_t i = 0; i < n; i++) {
    assert_string_equal(list[i].status, "accepted");
    assert_true(list[i].summary.countersigned);
    assert_int_equal(list[i].accept.len, acc.len);
  }
  list = gn_invoice_records_free(list, n);
  assert_int_equal(gn_ledger_list_invoices(f->ledger, "requester", &list, &n), 0);
  assert_int_equal(n, 1);
  list = gn_invoice_records_free(list, n);

  /* An acceptance of another invoice kept with a row does not make it
   * countersigned. */
  fx_ticks(f, 5, 1);
  assert_int_equal(fx_invoice_seal(f->ledger, f->provider, f->terms.lease_id, FX_START_S + 15, "released", &inv2), 0);
  fx_invoice_row(f, f->terms.lease_id, "provider", &inv2, &acc, "issued");
  assert_int_equal(gn_ledger_get_invoice(f->ledger, f->terms.lease_id, "provider", &rec), 0);
  assert_int_equal(rec.summary.seconds, 15);
  assert_false(rec.summary.countersigned);
  gn_invoice_record_done(&rec);
  gn_buf_done(&inv);
  gn_buf_done(&inv2);
  gn_buf_done(&acc);
}

/* A node upgraded from the pre-v2 format still lists its other invoices: a
 * row that no longer decodes is left out, not an error for the whole list. */
static void test_ledger_lists_around_old_format_rows(void **state) {
  fixture *f = *state;
  gn_buf inv = {0};
  gn_invoice_record *list = NULL;
  size_t n = 0;
  fx_ticks(f, 5, 1);
  assert_int_equal(fx_invoice_seal(f->ledger, f->provider, f->terms.lease_id, FX_START_S + 5, "released", &inv), 0);
  fx_invoice_row(f, f->terms.lease_id, "provider", &inv, NULL, "issued");
  assert_int_equal(
      sqlite3_exec(f->db,
                   "INSERT INTO invoices(lease_id, role, invoice_id, invoice, status, created_s, updated_s)"
                   " VALUES('l-old', 'provider', 'i-old', x'9501', 'issued', 1, 1)",
                   NULL, NULL, NULL),
      SQLITE_OK);
  assert_int_equal(gn_ledger_list_invoices(f->ledger, NULL, &list, &n), 0);
  assert_int_equal(n, 1);
  assert_string_equal(list[0].lease_id, f->terms.lease_id);
  gn_invoice_records_free(list, n);
  gn_buf_done(&inv);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_ledger_refuses_weak_synchronous, fx_setup, fx_teardown),
      cmocka_unit_test_setup_teardown(test_ledger_chain_links_each_tick_to_the_previous, fx_setup, fx_teardown),
      cmocka_unit_test(test_ledger_tick_hash_layout),
      cmocka_unit_test_setup_teardown(test_ledger_reads_compact_ticks, fx_setup, fx_teardown),
      cmocka_unit_test_setup_teardown(test_ledger_ticks_survive_reopen, fx_setup, fx_teardown),
      cmocka_unit_test_setup_teardown(test_ledger_tick_is_committed_on_return, fx_setup, fx_teardown),
      cmocka_unit_test_setup_teardown(test_ledger_kill_loses_no_reported_tick, setup_week, fx_teardown),
      cmocka_unit_test_setup_teardown(test_ledger_group_commit_is_all_or_nothing, fx_setup, fx_teardown),
      cmocka_unit_test_setup_teardown(test_ledger_refuses_update_and_delete, fx_setup, fx_teardown),
      cmocka_unit_test_setup_teardown(test_ledger_detects_rows_edited_behind_its_back, fx_setup, fx_teardown),
      cmocka_unit_test_setup_teardown(test_ledger_enforces_lease_limits, fx_setup, fx_teardown),
      cmocka_unit_test_setup_teardown(test_ledger_reads_and_lists_invoices, fx_setup, fx_teardown),
      cmocka_unit_test_setup_teardown(test_ledger_lists_around_old_format_rows, fx_setup, fx_teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
