/* Shared pieces of the settlement tests: a provider, a requester and a
 * stranger, signed agreements, real vouchers and final invoices sealed with
 * the billing codec, and a real SQLite file that can be closed and reopened
 * (a crash between two attempts). */
#ifndef GPUNET_TESTS_BILLING_SETTLE_FIXTURE_H
#define GPUNET_TESTS_BILLING_SETTLE_FIXTURE_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
/* cmocka needs the above first. */
#include <cmocka.h>

#include <gpunet/billing.h>
#include <gpunet/settle.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define SF_START_S 1764670001

typedef struct sf_lease {
  gn_buf request, agreement;
  char lease_id[GN_LEASE_ID_STRLEN];
} sf_lease;

typedef struct sf {
  char dir[64];
  char path[128];
  sqlite3 *db;
  gn_identity *provider, *requester, *other;
  gn_settle *prov;   /* the provider's view (self = provider) */
  gn_settle *req_db; /* the requester's view, on its own database */
  sqlite3 *rdb;
  char rpath[128];
  sf_lease a, b;
} sf;

static inline sqlite3 *sf_db_open(const char *path) {
  sqlite3 *db = NULL;
  assert_int_equal(sqlite3_open(path, &db), SQLITE_OK);
  assert_int_equal(sqlite3_exec(db, "PRAGMA journal_mode=WAL; PRAGMA synchronous=FULL;", NULL, NULL, NULL), SQLITE_OK);
  return db;
}

static inline void sf_agree(sf *f, gn_identity *provider, gn_identity *requester, const char *currency, sf_lease *ret) {
  gn_lease_terms t;
  memset(&t, 0, sizeof t);
  gn_lease_terms_init(&t);
  memcpy(t.provider, provider->pk, GN_PK_LEN);
  memcpy(t.requester, requester->pk, GN_PK_LEN);
  snprintf(t.offer_id, sizeof t.offer_id, "o-0123456789ab");
  snprintf(t.gpu_model, sizeof t.gpu_model, "NVIDIA GeForce RTX 4090");
  t.count = 1;
  t.price_uper_hour = 3600000; /* 1000 micro per GPU-second */
  snprintf(t.currency, sizeof t.currency, "%s", currency);
  t.max_s = 86400;
  t.interval_s = 60;
  t.requested_s = SF_START_S - 1;
  t.simulated = true;
  static const char *const gpus[] = {"GPU-00000000-0000-0000-0000-000000000001"};
  memset(ret, 0, sizeof *ret);
  assert_int_equal(gn_lease_request_seal(requester, &t, &ret->request), 0);
  assert_int_equal(
      gn_agreement_seal(provider, ret->request.data, ret->request.len, SF_START_S, gpus, 1, &ret->agreement), 0);
  snprintf(ret->lease_id, sizeof ret->lease_id, "%s", t.lease_id);
  (void)f;
}

static inline void sf_lease_done(sf_lease *l) {
  gn_buf_done(&l->request);
  gn_buf_done(&l->agreement);
}

/* A DEBIT_ACCEPT voucher of lease l signed by `who` (the requester, unless a
 * test wants it otherwise): note seq, cumulative seconds and amount. */
static inline void sf_debit_voucher(const sf_lease *l, const gn_identity *who, uint64_t seq, uint64_t seconds,
                                    uint64_t amount, gn_buf *ret) {
  gn_bill_head h;
  memset(&h, 0, sizeof h);
  h.seq = seq;
  h.seconds = seconds;
  h.gpu_seconds = seconds;
  h.total_micro = amount;
  memset(h.note_hash, (int)(0x40 + seq), sizeof h.note_hash);
  ret->len = 0;
  assert_int_equal(gn_bill_note_accept_seal(who, l->agreement.data, l->agreement.len, &h, ret), 0);
}

/* A real final invoice of lease l (n seconds of 1 GPU after `head`, sealed
 * by the provider) and the requester's INVOICE_ACCEPT of it. */
static inline void sf_final(sf *f, const sf_lease *l, const gn_bill_head *head, uint64_t n, gn_buf *ret_invoice,
                            gn_buf *ret_accept, gn_bill_head *ret_final) {
  uint8_t *ticks = calloc(n ? n * GN_BILL_TICK_LEN : 1, 1);
  assert_non_null(ticks);
  for (uint64_t i = 0; i < n; i++) {
    ticks[2 * i] = 1;
    ticks[2 * i + 1] = 50;
  }
  gn_bill_head start, fin;
  if (head)
    start = *head;
  else
    assert_int_equal(gn_bill_head_init(l->agreement.data, l->agreement.len, &start), 0);
  ret_invoice->len = ret_accept->len = 0;
  assert_int_equal(gn_bill_invoice_seal(f->provider, l->agreement.data, l->agreement.len, &start, ticks, n,
                                        SF_START_S + (int64_t)start.seconds + (int64_t)n, "released", ret_invoice,
                                        &fin),
                   0);
  assert_int_equal(gn_bill_invoice_accept_seal(f->requester, l->agreement.data, l->agreement.len, &fin,
                                               SF_START_S + 100000, ret_accept),
                   0);
  free(ticks);
  if (ret_final)
    *ret_final = fin;
}

/* The same envelope re-signed by `who` (same body): a voucher someone else
 * signed. */
static inline void sf_resign(const gn_buf *env, const gn_identity *who, gn_buf *ret) {
  gn_envelope e;
  assert_int_equal(gn_envelope_open(env->data, env->len, &e), 0);
  ret->len = 0;
  assert_int_equal(gn_envelope_seal(who, e.type, e.body, e.body_len, ret), 0);
}

static inline void sf_open_dbs(sf *f) {
  f->db = sf_db_open(f->path);
  f->rdb = sf_db_open(f->rpath);
  assert_int_equal(gn_settle_open(f->db, f->provider->pk, &f->prov), 0);
  assert_int_equal(gn_settle_open(f->rdb, f->requester->pk, &f->req_db), 0);
}

static inline void sf_close_dbs(sf *f) {
  f->prov = gn_settle_free(f->prov);
  f->req_db = gn_settle_free(f->req_db);
  assert_int_equal(sqlite3_close(f->db), SQLITE_OK);
  assert_int_equal(sqlite3_close(f->rdb), SQLITE_OK);
  f->db = f->rdb = NULL;
}

static inline int sf_setup(void **state) {
  sf *f = calloc(1, sizeof(*f));
  assert_non_null(f);
  assert_true(sodium_init() >= 0);
  snprintf(f->dir, sizeof f->dir, "/tmp/gn-settle-XXXXXX");
  assert_non_null(mkdtemp(f->dir));
  snprintf(f->path, sizeof f->path, "%s/provider.db", f->dir);
  snprintf(f->rpath, sizeof f->rpath, "%s/requester.db", f->dir);
  assert_int_equal(gn_identity_generate(&f->provider), 0);
  assert_int_equal(gn_identity_generate(&f->requester), 0);
  assert_int_equal(gn_identity_generate(&f->other), 0);
  sf_agree(f, f->provider, f->requester, "EUR", &f->a);
  sf_agree(f, f->provider, f->requester, "EUR", &f->b);
  sf_open_dbs(f);
  /* Tests count retries in milliseconds. */
  gn_settle_set_backoff(f->prov, 100, 1000);
  gn_settle_set_backoff(f->req_db, 100, 1000);
  *state = f;
  return 0;
}

static inline int sf_teardown(void **state) {
  sf *f = *state;
  char cmd[160];
  if (f->db)
    sf_close_dbs(f);
  gn_identity_free(f->provider);
  gn_identity_free(f->requester);
  gn_identity_free(f->other);
  sf_lease_done(&f->a);
  sf_lease_done(&f->b);
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", f->dir);
  if (system(cmd) != 0)
    fprintf(stderr, "could not remove %s\n", f->dir);
  free(f);
  return 0;
}

/* The final settlement of lease l as the provider (role PROVIDER) holds it. */
static inline gn_settle_final sf_final_item(const sf_lease *l, gn_settle_role role, const gn_buf *invoice,
                                            const gn_buf *accept) {
  gn_settle_final fi = {
      .role = role,
      .agreement_env = l->agreement.data,
      .agreement_len = l->agreement.len,
      .invoice_env = invoice->data,
      .invoice_len = invoice->len,
      .accept_env = accept->data,
      .accept_len = accept->len,
      .export_doc = NULL,
  };
  return fi;
}

static inline uint64_t sf_count(sqlite3 *db, const char *sql) {
  sqlite3_stmt *st = NULL;
  assert_int_equal(sqlite3_prepare_v2(db, sql, -1, &st, NULL), SQLITE_OK);
  assert_int_equal(sqlite3_step(st), SQLITE_ROW);
  uint64_t n = (uint64_t)sqlite3_column_int64(st, 0);
  sqlite3_finalize(st);
  return n;
}

#endif
