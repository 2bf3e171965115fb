/* Shared test fixture for the billing tests: identities, a signed agreement,
 * and a real SQLite database file in a fresh temporary directory. */
#ifndef GPUNET_TESTS_BILLING_FIXTURE_H
#define GPUNET_TESTS_BILLING_FIXTURE_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
/* cmocka needs the above first. */
#include <cmocka.h>

#include "billing_int.h"

#include <sodium.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct fixture {
  char dir[64];
  char path[128];
  sqlite3 *db;
  gn_ledger *ledger;
  gn_identity *provider, *requester, *other;
  gn_lease_terms terms;
  gn_buf request, agreement;
} fixture;

static inline sqlite3 *fx_db_open(const char *path) {
  sqlite3 *db = NULL;
  assert_int_equal(sqlite3_open(path, &db), SQLITE_OK);
  assert_int_equal(sqlite3_exec(db, "PRAGMA journal_mode=WAL; PRAGMA synchronous=FULL;", NULL, NULL, NULL), SQLITE_OK);
  return db;
}

static inline void fx_terms(fixture *f, gn_lease_terms *t, uint32_t count, uint64_t price, uint64_t max_s) {
  memset(t, 0, sizeof(*t));
  gn_lease_terms_init(t);
  memcpy(t->provider, f->provider->pk, GN_PK_LEN);
  memcpy(t->requester, f->requester->pk, GN_PK_LEN);
  snprintf(t->offer_id, sizeof(t->offer_id), "o-0123456789ab");
  snprintf(t->gpu_model, sizeof(t->gpu_model), "NVIDIA GeForce RTX 4090");
  t->count = count;
  t->price_uper_hour = price;
  snprintf(t->currency, sizeof(t->currency), "EUR");
  t->max_s = max_s;
  t->interval_s = 60;
  t->requested_s = 1764670000;
  t->simulated = true;
}

static const char *const fx_gpus[GN_LEASE_MAX_GPUS] = {"GPU-00000000-0000-0000-0000-000000000001",
                                                       "GPU-00000000-0000-0000-0000-000000000002",
                                                       "GPU-00000000-0000-0000-0000-000000000003",
                                                       "GPU-00000000-0000-0000-0000-000000000004",
                                                       "GPU-5",
                                                       "GPU-6",
                                                       "GPU-7",
                                                       "GPU-8",
                                                       "GPU-9",
                                                       "GPU-10",
                                                       "GPU-11",
                                                       "GPU-12",
                                                       "GPU-13",
                                                       "GPU-14",
                                                       "GPU-15",
                                                       "GPU-16"};

#define FX_START_S 1764670001

/* Seals a request and the agreement for t into req and ag (appended). */
static inline void fx_agree(fixture *f, const gn_lease_terms *t, gn_buf *req, gn_buf *ag) {
  assert_int_equal(gn_lease_request_seal(f->requester, t, req), 0);
  assert_int_equal(gn_agreement_seal(f->provider, req->data, req->len, FX_START_S, fx_gpus, t->count, ag), 0);
}

static inline int fx_setup_with(void **state, uint32_t count, uint64_t price, uint64_t max_s) {
  fixture *f = calloc(1, sizeof(*f));
  assert_non_null(f);
  snprintf(f->dir, sizeof(f->dir), "/tmp/gn-billing-XXXXXX");
  assert_non_null(mkdtemp(f->dir));
  snprintf(f->path, sizeof(f->path), "%s/gpunet.db", f->dir);
  f->db = fx_db_open(f->path);
  assert_int_equal(gn_ledger_open(f->db, &f->ledger), 0);
  assert_int_equal(gn_identity_generate(&f->provider), 0);
  assert_int_equal(gn_identity_generate(&f->requester), 0);
  assert_int_equal(gn_identity_generate(&f->other), 0);
  fx_terms(f, &f->terms, count, price, max_s);
  fx_agree(f, &f->terms, &f->request, &f->agreement);
  *state = f;
  return 0;
}

static inline int fx_setup(void **state) {
  return fx_setup_with(state, 1, 400000, 3600);
}

static inline int fx_teardown(void **state) {
  fixture *f = *state;
  char cmd[160];
  gn_ledger_free(f->ledger);
  sqlite3_close(f->db);
  gn_identity_free(f->provider);
  gn_identity_free(f->requester);
  gn_identity_free(f->other);
  gn_buf_done(&f->request);
  gn_buf_done(&f->agreement);
  snprintf(cmd, sizeof(cmd), "rm -rf '%s'", f->dir);
  if (system(cmd) != 0)
    fprintf(stderr, "could not remove %s\n", f->dir);
  free(f);
  return 0;
}

/* Begins the fixture's lease and writes n ticks of `gpus` GPUs, one per
 * second from the start. */
static inline void fx_ticks(fixture *f, uint64_t n, uint32_t gpus) {
  uint64_t have = 0;
  if (gn_ledger_tick_count(f->ledger, f->terms.lease_id, &have) == GN_ENOTFOUND)
    assert_int_equal(gn_ledger_begin_lease(f->ledger, f->terms.lease_id, f->agreement.data, f->agreement.len), 0);
  assert_int_equal(sqlite3_exec(f->db, "BEGIN", NULL, NULL, NULL), SQLITE_OK);
  for (uint64_t i = 0; i < n; i++)
    assert_int_equal(gn__ledger_append(f->ledger, f->terms.lease_id, FX_START_S + (int64_t)(have + i), gpus,
                                       (uint8_t)((have + i) % 101), false, NULL),
                     0);
  assert_int_equal(sqlite3_exec(f->db, "COMMIT", NULL, NULL, NULL), SQLITE_OK);
}

/* n compact ticks (2 bytes a second) of `gpus` GPUs, util (from+k) % 101,
 * the same values fx_ticks writes. Caller frees. */
static inline uint8_t *fx_compact(uint64_t from, uint64_t n, uint8_t gpus) {
  uint8_t *t = malloc(n ? n * GN_BILL_TICK_LEN : 1);
  assert_non_null(t);
  for (uint64_t k = 0; k < n; k++) {
    t[2 * k] = gpus;
    t[2 * k + 1] = (uint8_t)((from + k - 1) % 101);
  }
  return t;
}

/* A malicious provider's edit: decode a note or invoice body, change it,
 * encode and sign it again with `signer` so that the envelope signature is
 * valid. ticks has room for 4 more seconds. */
typedef void (*fx_mutate_fn)(gn__bill_body *b, uint8_t *ticks, size_t *ticks_len);

static inline void fx_tamper(const gn_buf *env, fx_mutate_fn fn, const gn_identity *signer, gn_buf *out) {
  gn_envelope e;
  gn_wire_doc doc;
  gn__bill_body b;
  gn_buf body = {0};
  assert_int_equal(gn_envelope_open(env->data, env->len, &e), 0);
  const bool final = e.type == GN_MSG_INVOICE;
  assert_int_equal(gn__bill_body_decode(final, e.body, e.body_len, &doc, &b, NULL, 0), 0);
  uint8_t *ticks = calloc(1, b.ticks_len + 8);
  assert_non_null(ticks);
  if (b.ticks_len)
    memcpy(ticks, b.ticks, b.ticks_len);
  size_t ticks_len = b.ticks_len;
  fn(&b, ticks, &ticks_len);
  b.ticks = ticks;
  b.ticks_len = ticks_len;
  assert_int_equal(gn__bill_body_encode(&b, &body), 0);
  assert_int_equal(gn_envelope_seal(signer, e.type, body.data, body.len, out), 0);
  gn_wire_doc_done(&doc);
  gn_buf_done(&body);
  free(ticks);
}

/* --- what the removed pre-note invoice API did, for the tests ------------ */

/* One tick committed at once: gn_ledger_append_ticks of one (the same
 * checks and errors, one fsync). */
static inline int fx_append_tick(gn_ledger *l, const char *lease_id, int64_t t_s, uint32_t gpus, uint8_t util,
                                 gn_tick *ret_tick) {
  const gn_tick_append a = {lease_id, t_s, gpus, util};
  return gn_ledger_append_ticks(l, &a, 1, ret_tick);
}

/* The final invoice of every tick the ledger holds for a lease, continuing
 * no debit note (seq 0, from 1): gn_ledger_ticks (the stored chain
 * re-verified) and gn_bill_invoice_seal from the genesis head. */
static inline int fx_invoice_seal(gn_ledger *l, const gn_identity *provider, const char *lease_id, int64_t end_s,
                                  const char *end_reason, gn_buf *ret_env) {
  gn_buf ag = {0};
  gn_bill_head head;
  uint64_t count = 0;
  uint8_t *ticks = NULL;
  int r;
  if ((r = gn_ledger_agreement(l, lease_id, &ag)) < 0 || (r = gn_ledger_tick_count(l, lease_id, &count)) < 0 ||
      (r = gn_bill_head_init(ag.data, ag.len, &head)) < 0)
    goto out;
  r = GN_ENOMEM;
  if (!(ticks = malloc(count ? count * GN_BILL_TICK_LEN : 1)))
    goto out;
  if ((r = gn_ledger_ticks(l, lease_id, 1, count, ticks, NULL)) < 0)
    goto out;
  r = gn_bill_invoice_seal(provider, ag.data, ag.len, &head, ticks, count, end_s, end_reason, ret_env, NULL);
out:
  free(ticks);
  gn_buf_done(&ag);
  return r;
}

/* The requester's countersignature of such an invoice, verified first
 * (GN_EAUDIT) against the agreement it holds. */
static inline int fx_invoice_accept(const gn_identity *requester, const gn_buf *ag, const uint8_t *inv, size_t len,
                                    gn_buf *ret_env) {
  gn_bill_head head, fin;
  int r;
  if ((r = gn_bill_head_init(ag->data, ag->len, &head)) < 0 ||
      (r = gn_bill_note_open(inv, len, ag->data, ag->len, &head, &fin, NULL, NULL, 0)) < 0)
    return r;
  return gn_bill_invoice_accept_seal(requester, ag->data, ag->len, &fin, FX_START_S + 1000, ret_env);
}

/* A row of the invoices table as nodes kept it before the debit notes
 * (gn_ledger_get_invoice and _list_invoices still read it). */
static inline void fx_invoice_row(fixture *f, const char *lease_id, const char *role, const gn_buf *inv,
                                  const gn_buf *acc, const char *status) {
  sqlite3_stmt *st = NULL;
  uint8_t hash[GN__HASH_LEN];
  char id[GN_LEASE_ID_STRLEN];
  gn__invoice_hash(inv->data, inv->len, hash);
  gn__invoice_id(hash, id);
  assert_int_equal(sqlite3_prepare_v2(
                       f->db,
                       "INSERT INTO invoices(lease_id, role, invoice_id, invoice, accept, status, created_s, updated_s)"
                       " VALUES(?1, ?2, ?3, ?4, ?5, ?6, 1, 1) ON CONFLICT(lease_id, role) DO UPDATE SET"
                       " invoice_id = excluded.invoice_id, invoice = excluded.invoice, accept = excluded.accept,"
                       " status = excluded.status, updated_s = 2",
                       -1, &st, NULL),
                   SQLITE_OK);
  sqlite3_bind_text(st, 1, lease_id, -1, SQLITE_STATIC);
  sqlite3_bind_text(st, 2, role, -1, SQLITE_STATIC);
  sqlite3_bind_text(st, 3, id, -1, SQLITE_STATIC);
  sqlite3_bind_blob(st, 4, inv->data, (int)inv->len, SQLITE_STATIC);
  if (acc && acc->len)
    sqlite3_bind_blob(st, 5, acc->data, (int)acc->len, SQLITE_STATIC);
  else
    sqlite3_bind_null(st, 5);
  sqlite3_bind_text(st, 6, status, -1, SQLITE_STATIC);
  assert_int_equal(sqlite3_step(st), SQLITE_DONE);
  sqlite3_finalize(st);
}

#endif
