/* libFuzzer target for lease requests and agreements. The first input byte
 * picks the entry point: 0 an agreement envelope, 1 a request envelope, 2 an
 * agreement body signed here by the fixed provider, 3 a request body signed
 * here by the fixed requester (reaching the term checks behind the
 * signatures). A request that opens must seal and open again to the same
 * terms. */
#include <gpunet/billing.h>

#include <sodium.h>
#include <stdio.h>

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static gn_identity *prov, *req;

/* The fixed identities (seed bytes 0x01: provider, 0x02: requester) of the
 * examples of docs/protocol.md (scripts/docs/billing_examples) and of the
 * billing seed corpora (`scripts/bench/billing seeds`); the committed seeds
 * in tests/fuzz/corpus/fuzz_agreement are signed with them. */
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
  if (sodium_init() < 0)
    abort();
  prov = identity_from(1);
  req = identity_from(2);
  return 0;
}

static void request_round_trip(const gn_lease_terms *t) {
  gn_buf env = {0};
  gn_lease_terms back;
  /* Only the requester named in the terms can seal them. */
  if (memcmp(t->requester, req->pk, GN_PK_LEN) != 0)
    return;
  if (gn_lease_request_seal(req, t, &env) != 0 || gn_lease_request_open(env.data, env.len, &back) != 0 ||
      memcmp(&back, t, sizeof(back)) != 0)
    __builtin_trap();
  gn_buf_done(&env);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  gn_agreement ag;
  gn_lease_terms t;
  gn_buf env = {0};
  if (size < 1)
    return 0;
  const uint8_t *p = data + 1;
  size_t n = size - 1;
  switch (data[0] & 3) {
  case 0:
    if (gn_agreement_open(p, n, &ag) == 0 && (ag.gpu_count != ag.terms.count || ag.terms.count > GN_LEASE_MAX_GPUS))
      __builtin_trap();
    break;
  case 1:
    if (gn_lease_request_open(p, n, &t) == 0)
      request_round_trip(&t);
    break;
  case 2:
    if (gn_envelope_seal(prov, GN_MSG_LEASE_ACCEPT, p, n, &env) == 0 &&
        gn_agreement_open(env.data, env.len, &ag) == 0 && memcmp(ag.terms.provider, prov->pk, GN_PK_LEN) != 0)
      __builtin_trap();
    break;
  default:
    if (gn_envelope_seal(req, GN_MSG_LEASE_REQUEST, p, n, &env) == 0 &&
        gn_lease_request_open(env.data, env.len, &t) == 0)
      request_round_trip(&t);
    break;
  }
  gn_buf_done(&env);
  return 0;
}
