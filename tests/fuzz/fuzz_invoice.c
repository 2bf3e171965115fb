/* libFuzzer target for final invoices and the export audit. The first input
 * byte picks the entry point: 0 an invoice envelope (what node/ still calls:
 * gn_invoice_check, summarize, export; and the requester machine's
 * gn_bill_invoice_check at the genesis head, with its acceptance), 1 an
 * invoice body signed here by the fixed provider (reaching the agreement,
 * window, chain and total checks behind the signature), 2 JSON text for the
 * audit (full and default), 3 an accept/reject envelope for a fixed invoice.
 * Nothing may crash or leak; a verdict is one of the four and its reason a
 * terminated string; what verifies obeys the lease (max_s, window, checked
 * totals); what we export audits with a verdict other than invalid; the
 * default (linked) audit agrees with the full one wherever the full one
 * verifies. The seed corpus is written by `scripts/bench/billing seeds`
 * (same keys and lease). */
#include <gpunet/billing.h>

#include "../../billing/billing_int.h"

#include <jansson.h>
#include <sodium.h>
#include <stdio.h>

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static gn_identity *prov, *req;
static gn_buf agreement, invoice;

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
  gn_bill_head h;
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
  static const uint8_t ticks[10] = {1, 0, 1, 1, 1, 2, 1, 3, 1, 4};
  if (gn_bill_head_init(agreement.data, agreement.len, &h) < 0 ||
      gn_bill_invoice_seal(prov, agreement.data, agreement.len, &h, ticks, 5, 1764670006, "released", &invoice, NULL) <
          0)
    abort();
  gn_buf_done(&rq);
  return 0;
}

static void reason_ok(const char *reason, size_t cap) {
  if (!memchr(reason, 0, cap))
    __builtin_trap();
}

static void audit_ok(const json_t *j, bool must_verify) {
  gn_bill_audit a;
  int rc = gn_invoice_audit_json_flags(j, GN_BILL_AUDIT_FULL, &a);
  reason_ok(a.reason, sizeof(a.reason));
  if (rc != 0 && rc != GN_EAUDIT && rc != GN_EINVAL)
    __builtin_trap();
  if ((rc == 0) != (a.verdict == GN_BILL_COUNTERSIGNED))
    __builtin_trap();
  if (rc == GN_EAUDIT && a.verdict != GN_BILL_PROVIDER_ONLY && a.verdict != GN_BILL_REJECTED &&
      a.verdict != GN_BILL_INVALID)
    __builtin_trap();
  if (must_verify && (rc == GN_EINVAL || a.verdict == GN_BILL_INVALID))
    __builtin_trap();
  /* The default (linked) audit checks fewer signatures, never less of the
   * bill: where the full audit reaches a verdict, it reaches the same. */
  gn_bill_audit b;
  int lr = gn_invoice_audit_json(j, &b);
  reason_ok(b.reason, sizeof(b.reason));
  if ((lr == GN_EINVAL) != (rc == GN_EINVAL) ||
      (rc != GN_EINVAL && a.verdict != GN_BILL_INVALID && b.verdict != a.verdict))
    __builtin_trap();
  /* Whatever verifies stays within the lease. */
  if (a.verdict != GN_BILL_INVALID && rc != GN_EINVAL &&
      (a.summary.seconds > 3600 || a.summary.total_micro > gn_price_cost(400000, 1, a.summary.seconds) ||
       (a.has_invoice && a.summary.seconds > (uint64_t)(a.summary.end_s - a.summary.start_s))))
    __builtin_trap();
}

static void invoice_env(const uint8_t *p, size_t n) {
  char reason[512];
  gn_invoice_summary s;
  int rc = gn_invoice_check(p, n, agreement.data, agreement.len, 3600, 0, &s, reason, sizeof(reason));
  reason_ok(reason, sizeof(reason));
  if (rc != 0 && rc != GN_EAUDIT)
    __builtin_trap();
  /* A verified invoice never bills past the lease, its window or full use. */
  if (rc == 0 && (s.seconds > 3600 || s.seconds > (uint64_t)(s.end_s - s.start_s) ||
                  s.total_micro > gn_price_cost(s.price_uper_hour, s.gpus, s.seconds)))
    __builtin_trap();
  /* An energy claim that verifies is within the decoder's bounds; absent,
   * it is all zeros and plausible. */
  if (rc == 0 &&
      (s.energy.present ? s.energy.mj > INT64_MAX || s.energy.measured_s == 0 || s.energy.measured_s > INT64_MAX
                        : s.energy.mj || s.energy.measured_s || !s.energy_plausible))
    __builtin_trap();
  (void)gn_invoice_summarize(p, n, &s);
  /* The requester machine's check at the genesis head agrees with it, and
   * only what verifies is countersigned. */
  gn_bill_head h, fin;
  gn_buf acc = {0};
  if (gn_bill_head_init(agreement.data, agreement.len, &h) < 0)
    abort();
  int vr =
      gn_bill_invoice_check(p, n, agreement.data, agreement.len, &h, 3600, 0, 0, &fin, NULL, reason, sizeof(reason));
  reason_ok(reason, sizeof(reason));
  if ((vr == 0) != (rc == 0))
    __builtin_trap();
  if (vr == 0 && gn_bill_invoice_accept_seal(req, agreement.data, agreement.len, &fin, 1764670100, &acc) < 0)
    __builtin_trap();
  json_t *j = NULL;
  if (gn_invoice_export(p, n, acc.len ? acc.data : NULL, acc.len, &j) == 0) {
    if (rc != 0)
      __builtin_trap();
    audit_ok(j, true);
    json_decref(j);
  }
  gn_buf_done(&acc);
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
    json_t *j = json_loadb((const char *)p, n, 0, &err);
    if (j) {
      audit_ok(j, false);
      json_decref(j);
    }
    break;
  }
  default: {
    gn_invoice_response r;
    gn_bill_response br;
    (void)gn_invoice_response_open(p, n, invoice.data, invoice.len, &r);
    (void)gn_bill_response_open(p, n, agreement.data, agreement.len, &br);
    break;
  }
  }
  return 0;
}
