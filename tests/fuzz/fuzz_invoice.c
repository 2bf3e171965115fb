/* libFuzzer target for invoices. The first input byte picks the entry point:
 * 0 an invoice envelope (gn_invoice_check, summarize, export), 1 an invoice
 * body signed here by the fixed provider (reaching the agreement, chain and
 * total checks behind the signature), 2 JSON text for gn_invoice_audit_json,
 * 3 an accept/reject envelope for a fixed invoice. Nothing may crash, leak,
 * or succeed without the reason buffer being a terminated string. */
#include <gpunet/billing.h>

#include "../../billing/billing_int.h"

#include <jansson.h>
#include <sodium.h>
#include <stdio.h>

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static gn_identity *prov, *req;
static gn_buf agreement, invoice;

/* The same fixed identities, lease and times as `scripts/bench/billing
 * examples`, which wrote the seed corpus: its agreement bytes are identical. */
static gn_identity *identity_from(uint8_t b) {
  uint8_t seed[crypto_sign_SEEDBYTES];
  gn_identity *id = calloc(1, sizeof(*id));
  if (!id || !(id->sk = sodium_malloc(crypto_sign_SECRETKEYBYTES)))
    abort();
  memset(seed, b, sizeof(seed));
  crypto_sign_seed_keypair(id->pk, id->sk, seed);
  return id;
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc, (void)argv;
  static const char *const gpus[1] = {"GPU-8f1c2a3b-5d6e-4f70-8192-a3b4c5d6e7f8"};
  gn_lease_terms t;
  gn_buf rq = {0};
  sqlite3 *db = NULL;
  gn_ledger *l = NULL;
  if (sodium_init() < 0)
    abort();
  prov = identity_from(1);
  req = identity_from(2);
  memset(&t, 0, sizeof(t));
  snprintf(t.lease_id, sizeof(t.lease_id), "l-00c0ffee00c0ffee");
  memset(t.nonce, 0x5a, sizeof(t.nonce));
  memcpy(t.provider, prov->pk, GN_PK_LEN);
  memcpy(t.requester, req->pk, GN_PK_LEN);
  snprintf(t.offer_id, sizeof(t.offer_id), "o-3f2a9c1d7e4b");
  snprintf(t.gpu_model, sizeof(t.gpu_model), "NVIDIA GeForce RTX 4090");
  t.count = 1;
  t.price_uper_hour = 400000;
  snprintf(t.currency, sizeof(t.currency), "EUR");
  t.max_s = 3600;
  t.interval_s = 60;
  t.requested_s = 1764670000;
  if (gn_lease_request_seal(req, &t, &rq) < 0 ||
      gn_agreement_seal(prov, rq.data, rq.len, 1764670001, gpus, 1, &agreement) < 0)
    abort();
  if (sqlite3_open(":memory:", &db) != SQLITE_OK ||
      sqlite3_exec(db, "PRAGMA synchronous=FULL", NULL, NULL, NULL) != SQLITE_OK || gn_ledger_open(db, &l) < 0 ||
      gn_ledger_begin_lease(l, t.lease_id, agreement.data, agreement.len) < 0)
    abort();
  for (int i = 0; i < 5; i++)
    if (gn_ledger_append_tick(l, t.lease_id, 1764670001 + i, 1, 50, NULL) < 0)
      abort();
  if (gn_invoice_seal(l, prov, t.lease_id, 1764670006, "released", &invoice) < 0)
    abort();
  gn_ledger_free(l);
  sqlite3_close(db);
  gn_buf_done(&rq);
  return 0;
}

static void reason_ok(const char *reason, size_t cap) {
  if (!memchr(reason, 0, cap))
    __builtin_trap();
}

static void invoice_env(const uint8_t *p, size_t n) {
  char reason[512];
  gn_invoice_summary s;
  int rc = gn_invoice_check(p, n, agreement.data, agreement.len, 3600, 0, &s, reason, sizeof(reason));
  reason_ok(reason, sizeof(reason));
  if (rc != 0 && rc != GN_EAUDIT)
    __builtin_trap();
  /* A verified invoice never bills past the lease or above full use. */
  if (rc == 0 && (s.seconds > 3600 || s.total_micro > gn_price_cost(s.price_uper_hour, s.gpus, s.seconds)))
    __builtin_trap();
  (void)gn_invoice_summarize(p, n, &s);
  /* A continuation verifies the invoice too, so it can only pass if the check did. */
  if (gn_invoice_check_continues(p, n, invoice.data, invoice.len, reason, sizeof(reason)) == 0 && rc != 0)
    __builtin_trap();
  reason_ok(reason, sizeof(reason));
  json_t *j = NULL;
  if (gn_invoice_export(p, n, NULL, 0, &j) == 0) {
    /* What we export must audit. */
    if (rc != 0 || gn_invoice_audit_json(j, &s, reason, sizeof(reason)) != 0)
      __builtin_trap();
    json_decref(j);
  }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1)
    return 0;
  uint8_t mode = data[0] & 3;
  const uint8_t *p = data + 1;
  size_t n = size - 1;
  switch (mode) {
  case 0:
    invoice_env(p, n);
    break;
  case 1: {
    gn_buf env = {0};
    if (gn_envelope_seal(prov, GN_MSG_INVOICE, p, n, &env) == 0)
      invoice_env(env.data, env.len);
    gn_buf_done(&env);
    break;
  }
  case 2: {
    json_error_t err;
    char reason[512];
    gn_invoice_summary s;
    json_t *j = json_loadb((const char *)p, n, 0, &err);
    if (j) {
      int rc = gn_invoice_audit_json(j, &s, reason, sizeof(reason));
      reason_ok(reason, sizeof(reason));
      if (rc != 0 && rc != GN_EAUDIT && rc != GN_EINVAL)
        __builtin_trap();
      json_decref(j);
    }
    break;
  }
  default: {
    gn_invoice_response r;
    (void)gn_invoice_response_open(p, n, invoice.data, invoice.len, &r);
    break;
  }
  }
  return 0;
}
