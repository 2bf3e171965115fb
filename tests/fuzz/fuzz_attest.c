/* libFuzzer target for the attestation decoders: the four exchange messages
 * (each fed to the state machine in the state that reads it), the memory
 * challenge's messages, signed reports (as received, and their bodies signed
 * here so the decoder behind the signature is reached), and peers' messages
 * to a provider's agent (the {sid, gpu_model, offer, data} wrapper, who may
 * challenge, held verdicts). The first byte picks the target. */
#include "../../node/attest/attest_int.h"

#include <sodium.h>
#include <stdio.h>
#include <string.h>

static const gn_attest_params params = {.n = 64, .depth = 1, .rounds = 2, .open_rounds = 1, .open_rows = 2};
static const gn_attest_mem_params mem_params = {.table_mib = 1, .cost = 1, .walkers = 4, .steps = 8, .samples = 2};

static void rng_fn(void *ctx, uint8_t *buf, size_t len) {
  uint64_t *s = ctx;
  for (size_t i = 0; i < len; i++) {
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    buf[i] = (uint8_t)(*s >> 56);
  }
}

static void fuzz_exchange(int which, const uint8_t *data, size_t size) {
  uint64_t seed = 1;
  gn_buf ch = {0}, resp = {0}, open = {0}, out = {0};
  gn_attest_verifier *v = NULL;
  gn_attest_prover *pr = NULL;
  gn_attest_result res;
  if (gn_attest_verifier_new(&params, "RTX 4090", rng_fn, &seed, &ch, &v) < 0 ||
      gn_attest_prover_new(gn_attest_backend_cpu(), &pr) < 0)
    goto out;
  /* A fuzzed challenge may ask for any size: keep the prover's budget tiny. */
  gn_attest_prover_set_max_ops(pr, 1e7);
  if (which == 0) {
    gn_attest_prover_on_challenge(pr, data, size, &out);
    goto out;
  }
  if (gn_attest_prover_on_challenge(pr, ch.data, ch.len, &resp) < 0)
    goto out;
  if (which == 1) {
    gn_attest_verifier_on_response(v, data, size, &out);
    goto out;
  }
  if (gn_attest_verifier_on_response(v, resp.data, resp.len, &open) < 0)
    goto out;
  if (which == 2)
    gn_attest_prover_on_open(pr, data, size, &out);
  else
    gn_attest_verifier_on_proof(v, data, size, 1, &res);
out:
  gn_attest_prover_free(pr);
  gn_attest_verifier_free(v);
  gn_buf_done(&ch);
  gn_buf_done(&resp);
  gn_buf_done(&open);
  gn_buf_done(&out);
}

static void fuzz_mem(int which, const uint8_t *data, size_t size) {
  uint64_t seed = 2;
  gn_buf ch = {0}, ready = {0}, walk = {0}, out = {0};
  gn_attest_mem_verifier *v = NULL;
  gn_attest_mem_prover *pr = NULL;
  gn_attest_result res;
  if (gn_attest_mem_verifier_new(&mem_params, "RTX 4090", rng_fn, &seed, &ch, &v) < 0 ||
      gn_attest_mem_prover_new(1, &pr) < 0)
    goto out;
  if (which == 0) {
    gn_attest_mem_verifier_on_ready(v, data, size, &out);
    goto out;
  }
  if (gn_attest_mem_prover_on_challenge(pr, ch.data, ch.len, &ready) < 0 ||
      gn_attest_mem_verifier_on_ready(v, ready.data, ready.len, &walk) < 0)
    goto out;
  if (which == 1)
    gn_attest_mem_prover_on_walk(pr, data, size, &out);
  else
    gn_attest_mem_verifier_on_result(v, data, size, 1, &res);
out:
  gn_attest_mem_prover_free(pr);
  gn_attest_mem_verifier_free(v);
  gn_buf_done(&ch);
  gn_buf_done(&ready);
  gn_buf_done(&walk);
  gn_buf_done(&out);
}

/* Two fixed identities: the provider and a peer. */
static gn_identity *ids[2];

static void fuzz_report_body(const uint8_t *data, size_t size) {
  gn_buf env = {0};
  gn_attest_report rep;
  uint8_t signer[GN_PK_LEN];
  if (gn_envelope_seal(ids[0], GN_MSG_ATTEST_REPORT, data, size, &env) == 0 &&
      gn_attest_report_open(env.data, env.len, &rep, signer) == 0)
    gn_attest_report_done(&rep);
  gn_buf_done(&env);
}

static int io_send(void *ctx, const uint8_t peer[GN_PK_LEN], const uint8_t *env, size_t len) {
  (void)ctx, (void)peer, (void)env, (void)len;
  return 0;
}

static bool io_is_up(void *ctx, const uint8_t peer[GN_PK_LEN]) {
  (void)ctx, (void)peer;
  return true;
}

static void io_connect(void *ctx, const char *addr) {
  (void)ctx, (void)addr;
}

/* Nothing runs on a worker: a challenge let in is answered "out of memory". */
static int io_queue(void *ctx, gn_attest_task *t) {
  (void)ctx, (void)t;
  return GN_ENOMEM;
}

static const gn_attest_io fuzz_io = {.send = io_send, .is_up = io_is_up, .connect = io_connect, .queue = io_queue};

/* One provider agent for the whole run, with a simulated RTX 4090: its
 * per-peer table and held verdicts fill up across inputs, within bounds. */
static void fuzz_agent(const uint8_t *data, size_t size) {
  static gn_attest_agent *a;
  if (!a) {
    gn_attest_gpu g;
    memset(&g, 0, sizeof g);
    snprintf(g.name, sizeof g.name, "RTX 4090");
    if (gn_attest_agent_new(ids[0], &fuzz_io, NULL, true, &a) < 0)
      return;
    gn_attest_agent_add_local(a, &g, 0, true);
  }
  if (size < 1)
    return;
  uint32_t type = data[0] % 11 == 10 ? GN_MSG_ERROR : 50u + data[0] % 11;
  gn_buf env = {0};
  gn_envelope e;
  if (gn_envelope_seal(ids[1], type, data + 1, size - 1, &env) == 0 && gn_envelope_open(env.data, env.len, &e) == 0) {
    gn_attest_agent_on_message(a, ids[1]->pk, &e, env.data, env.len);
    gn_attest_agent_lease_agreed(a, ids[1]->pk, "RTX 4090", gn_unix_s(), env.data, env.len);
  }
  gn_buf_done(&env);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static bool ready;
  if (!ready) {
    if (sodium_init() < 0 || gn_identity_generate(&ids[0]) < 0 || gn_identity_generate(&ids[1]) < 0)
      return 0;
    ready = true;
  }
  if (size < 1)
    return 0;
  uint8_t which = data[0] % 10;
  data++;
  size--;
  if (which < 4) {
    fuzz_exchange(which, data, size);
  } else if (which < 7) {
    fuzz_mem(which - 4, data, size);
  } else if (which == 7) {
    gn_attest_report rep;
    uint8_t signer[GN_PK_LEN];
    if (gn_attest_report_open(data, size, &rep, signer) == 0)
      gn_attest_report_done(&rep);
  } else if (which == 8) {
    fuzz_report_body(data, size);
  } else {
    fuzz_agent(data, size);
  }
  return 0;
}
