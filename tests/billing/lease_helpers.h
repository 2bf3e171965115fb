/* Helpers of the lease machine tests (test_lease_prov, test_lease_req,
 * test_lease_sim): identities made from a seed (so a simulator run replays
 * exactly), agreements, and finding actions in a machine's output. Only
 * public headers: the machines are tested through their API. */
#ifndef GPUNET_TESTS_BILLING_LEASE_HELPERS_H
#define GPUNET_TESTS_BILLING_LEASE_HELPERS_H

#include <gpunet/billing.h>
#include <gpunet/lease.h>
#include <gpunet/wire.h>

#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* An identity whose key pair comes from a 32-byte seed built from (seed,
 * who): the same inputs give the same keys, so signatures and hashes (and
 * so a whole simulated run) are reproducible. NULL on failure. */
static inline gn_identity *lh_identity(uint64_t seed, uint8_t who) {
  uint8_t s[crypto_sign_SEEDBYTES] = {0};
  gn_identity *id = calloc(1, sizeof(*id));
  if (!id)
    return NULL;
  id->sk = sodium_malloc(crypto_sign_SECRETKEYBYTES);
  if (!id->sk) {
    free(id);
    return NULL;
  }
  memcpy(s, &seed, sizeof(seed));
  s[31] = who;
  crypto_sign_seed_keypair(id->pk, id->sk, s);
  sodium_memzero(s, sizeof(s));
  return id;
}

typedef struct lh_lease {
  uint32_t count;
  uint64_t price_uper_hour;
  uint64_t max_s;
  uint32_t interval_s;
  int64_t start_s; /* the provider's UTC at the start (its clock) */
  uint64_t nonce;  /* makes the lease id */
} lh_lease;

/* Seals a request by req and the agreement by prov for these terms into
 * ret_ag (appended). 0 or the first error. */
static inline int lh_agreement(const gn_identity *prov, const gn_identity *req, const lh_lease *l, gn_buf *ret_ag) {
  static const char *const gpus[GN_LEASE_MAX_GPUS] = {"GPU-1",  "GPU-2",  "GPU-3",  "GPU-4",  "GPU-5",  "GPU-6",
                                                      "GPU-7",  "GPU-8",  "GPU-9",  "GPU-10", "GPU-11", "GPU-12",
                                                      "GPU-13", "GPU-14", "GPU-15", "GPU-16"};
  gn_lease_terms t;
  gn_buf rq = {0};
  memset(&t, 0, sizeof(t));
  snprintf(t.lease_id, sizeof(t.lease_id), "l-%016llx", (unsigned long long)l->nonce);
  memcpy(t.nonce, &l->nonce, sizeof(l->nonce));
  memcpy(t.provider, prov->pk, GN_PK_LEN);
  memcpy(t.requester, req->pk, GN_PK_LEN);
  snprintf(t.offer_id, sizeof(t.offer_id), "o-0123456789ab");
  snprintf(t.gpu_model, sizeof(t.gpu_model), "NVIDIA GeForce RTX 4090");
  t.count = l->count;
  t.price_uper_hour = l->price_uper_hour;
  snprintf(t.currency, sizeof(t.currency), "EUR");
  t.max_s = l->max_s;
  t.interval_s = l->interval_s;
  t.requested_s = l->start_s;
  t.simulated = true;
  int r = gn_lease_request_seal(req, &t, &rq);
  if (r == 0)
    r = gn_agreement_seal(prov, rq.data, rq.len, l->start_s, gpus, l->count, ret_ag);
  gn_buf_done(&rq);
  return r;
}

/* The idx-th action of a kind in out (0 = the first), or NULL. */
static inline const gn_lease_action *lh_find(const gn_lease_out *out, int kind, size_t idx) {
  for (size_t i = 0; i < out->n; i++)
    if (out->act[i].kind == kind && idx-- == 0)
      return &out->act[i];
  return NULL;
}

static inline size_t lh_count(const gn_lease_out *out, int kind) {
  size_t n = 0;
  for (size_t i = 0; i < out->n; i++)
    n += out->act[i].kind == kind;
  return n;
}

/* Position of the first action of a kind, or out->n. */
static inline size_t lh_pos(const gn_lease_out *out, int kind) {
  size_t i = 0;
  while (i < out->n && out->act[i].kind != kind)
    i++;
  return i;
}

/* The message type of an envelope (0 if it does not open). */
static inline uint32_t lh_type(const uint8_t *env, size_t len) {
  gn_envelope e;
  return gn_envelope_open(env, len, &e) == 0 ? e.type : 0;
}

/* The first SEND of a message type, or NULL. */
static inline const gn_lease_action *lh_sent(const gn_lease_out *out, uint32_t type) {
  for (size_t i = 0; i < out->n; i++)
    if (out->act[i].kind == GN_LEASE_ACT_SEND && lh_type(out->act[i].data, out->act[i].len) == type)
      return &out->act[i];
  return NULL;
}

/* n compact ticks of `gpus` GPUs at 50 % utilization. Caller frees. */
static inline uint8_t *lh_ticks(uint64_t n, uint8_t gpus) {
  uint8_t *t = malloc(n ? n * GN_BILL_TICK_LEN : 1);
  for (uint64_t k = 0; t && k < n; k++) {
    t[2 * k] = gpus;
    t[2 * k + 1] = 50;
  }
  return t;
}

static inline gn_lease_now lh_now(uint64_t mono_ms, int64_t utc_s) {
  gn_lease_now n = {mono_ms, utc_s};
  return n;
}

#endif
