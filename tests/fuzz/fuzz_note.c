/* libFuzzer target for debit notes, the final invoice continuing them, and
 * the requester's answers (billing/note.c). The first input byte picks the
 * entry point: 0 a note envelope checked at the fresh head, 1 a note body
 * signed here by the fixed provider (reaching everything behind the
 * signature), 2 an invoice body signed here, checked at the head after note
 * 1, 3 a response envelope (DEBIT_/INVOICE_ ACCEPT/REJECT), 4 a note
 * envelope checked at the head after note 1. Nothing may crash or leak; the
 * reason is a terminated string; an accepted note continues the head
 * exactly, bills no more than observed + tolerance, max_s or the spending
 * cap, and its totals are the checked cost; a stale note is only reported
 * for a seq at or below the head. The seed corpus is written by
 * `scripts/bench/billing seeds` (same keys and lease). */
#include <gpunet/billing.h>

#include "../../billing/billing_int.h"

#include <sodium.h>
#include <stdio.h>

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define OBSERVED_S 12
#define CAP_MICRO 1000

static gn_identity *prov, *req;
static gn_buf agreement;
static gn_bill_head h0, h1;

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
  gn_buf rq = {0}, n1 = {0};
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
  if (gn_bill_head_init(agreement.data, agreement.len, &h0) < 0 ||
      gn_bill_note_seal(prov, agreement.data, agreement.len, &h0, ticks, 5, 1764670006, &n1, &h1) < 0)
    abort();
  gn_buf_done(&rq);
  gn_buf_done(&n1);
  return 0;
}

static void reason_ok(const char *reason, size_t cap) {
  if (!memchr(reason, 0, cap))
    __builtin_trap();
}

static void next_ok(const gn_bill_head *head, const gn_bill_head *next, const gn_bill_note *no, bool final) {
  uint64_t cost = 0;
  if (no->from != head->seconds + 1 || next->seconds != head->seconds + no->n ||
      memcmp(no->prev, head->note_hash, 32) != 0 || next->seq != (final ? head->seq : head->seq + 1) ||
      next->seconds > 3600 || next->seconds > OBSERVED_S + gn_bill_tolerance_s(OBSERVED_S) ||
      next->total_micro > CAP_MICRO || next->gpu_seconds < head->gpu_seconds ||
      next->gpu_seconds - head->gpu_seconds > no->n || gn_price_cost_checked(400000, 1, next->gpu_seconds, &cost) < 0 ||
      cost != next->total_micro)
    __builtin_trap();
  if (final && (no->end_s < no->start_s || next->seconds > (uint64_t)(no->end_s - no->start_s)))
    __builtin_trap();
}

static void note_env(const uint8_t *p, size_t n, const gn_bill_head *head) {
  char reason[512];
  gn_bill_head next;
  gn_bill_note no;
  int rc = gn_bill_note_check(p, n, agreement.data, agreement.len, head, OBSERVED_S, gn_bill_tolerance_s(OBSERVED_S),
                              CAP_MICRO, &next, &no, reason, sizeof(reason));
  reason_ok(reason, sizeof(reason));
  if (rc != 0 && rc != GN_EAUDIT && rc != GN_ESTATE)
    __builtin_trap();
  if (rc == 0)
    next_ok(head, &next, &no, false);
  /* The provider's open has no limits: it passes whenever the check did. */
  int orc = gn_bill_note_open(p, n, agreement.data, agreement.len, head, NULL, NULL, reason, sizeof(reason));
  if (rc == 0 && orc != 0)
    __builtin_trap();
  gn_buf out = {0};
  if (rc == 0) {
    gn_bill_response r;
    if (gn_bill_note_accept_seal(req, agreement.data, agreement.len, &next, &out) < 0 ||
        gn_bill_response_open(out.data, out.len, agreement.data, agreement.len, &r) < 0 ||
        gn_bill_response_matches(&r, &no) < 0)
      __builtin_trap();
  } else if (gn_bill_note_reject_seal(req, agreement.data, agreement.len, p, n, reason, &out) < 0) {
    __builtin_trap(); /* anything can be rejected */
  }
  gn_buf_done(&out);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1)
    return 0;
  uint8_t mode = data[0] % 5;
  const uint8_t *p = data + 1;
  size_t n = size - 1;
  switch (mode) {
  case 0:
    note_env(p, n, &h0);
    break;
  case 1: {
    gn_buf env = {0};
    if (gn_envelope_seal(prov, GN_MSG_DEBIT_NOTE, p, n, &env) == 0) {
      note_env(env.data, env.len, &h0);
      note_env(env.data, env.len, &h1);
    }
    gn_buf_done(&env);
    break;
  }
  case 2: {
    gn_buf env = {0};
    char reason[512];
    gn_bill_head next;
    gn_bill_note no;
    if (gn_envelope_seal(prov, GN_MSG_INVOICE, p, n, &env) == 0) {
      int rc = gn_bill_invoice_check(env.data, env.len, agreement.data, agreement.len, &h1, OBSERVED_S,
                                     gn_bill_tolerance_s(OBSERVED_S), CAP_MICRO, &next, &no, reason, sizeof(reason));
      reason_ok(reason, sizeof(reason));
      if (rc != 0 && rc != GN_EAUDIT)
        __builtin_trap();
      if (rc == 0)
        next_ok(&h1, &next, &no, true);
    }
    gn_buf_done(&env);
    break;
  }
  case 3: {
    gn_bill_response r;
    if (gn_bill_response_open(p, n, agreement.data, agreement.len, &r) == 0 &&
        (!memchr(r.reason, 0, sizeof(r.reason)) || (!r.accepted && !r.reason[0])))
      __builtin_trap();
    break;
  }
  default:
    note_env(p, n, &h1);
    break;
  }
  return 0;
}
