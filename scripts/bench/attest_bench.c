/* Attestation bench on the CPU: for the same challenge, how long the prover
 * takes (commit + open) against how long the verifier takes to check, and
 * the int8 throughput of the CPU reference product. Built by scripts/bench/attest. */
#include "attest_int.h"

#include <sodium.h>
#include <stdio.h>

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static int run(const gn_attest_params *p) {
  gn_buf ch = {0}, resp = {0}, open = {0}, proof = {0};
  gn_attest_verifier *v = NULL;
  gn_attest_prover *pr = NULL;
  gn_attest_result res;
  int r;
  if ((r = gn_attest_verifier_new(p, "RTX 4090", NULL, NULL, &ch, &v)) < 0 ||
      (r = gn_attest_prover_new(gn_attest_backend_cpu(), &pr)) < 0)
    goto out;
  double t0 = now_s();
  if ((r = gn_attest_prover_on_challenge(pr, ch.data, ch.len, &resp)) < 0)
    goto out;
  double t1 = now_s();
  if ((r = gn_attest_verifier_on_response(v, resp.data, resp.len, &open)) < 0)
    goto out;
  double t2 = now_s();
  if ((r = gn_attest_prover_on_open(pr, open.data, open.len, &proof)) < 0)
    goto out;
  double t3 = now_s();
  if ((r = gn_attest_verifier_on_proof(v, proof.data, proof.len, (uint64_t)((t1 - t0) * 1000), &res)) < 0)
    goto out;
  double t4 = now_s();
  double prove = t1 - t0, verify = (t2 - t1) + (t4 - t3);
  printf("n=%-5u depth=%u rounds=%-3u open=%ux%-2u  prove %8.3f s (%6.1f GOPS)  open %7.3f s  verify %7.4f s  "
         "prove/verify %7.1f  (k*m/(rounds*n) = %.4f)  verdict: %s\n",
         p->n, p->depth, p->rounds, p->open_rounds, p->open_rows, prove, gn_attest_params_ops(p) / prove / 1e9, t3 - t2,
         verify, prove / verify, (double)p->open_rounds * p->open_rows / ((double)p->rounds * p->n), res.verdict);
out:
  gn_attest_prover_free(pr);
  gn_attest_verifier_free(v);
  gn_buf_done(&ch);
  gn_buf_done(&resp);
  gn_buf_done(&open);
  gn_buf_done(&proof);
  return r;
}

int main(int argc, char **argv) {
  static const gn_attest_params cases[] = {
      {.n = 256, .depth = 1, .rounds = 16, .open_rounds = 4, .open_rows = 4},
      {.n = 512, .depth = 1, .rounds = 8, .open_rounds = 4, .open_rows = 4},
      {.n = 1024, .depth = 1, .rounds = 4, .open_rounds = 2, .open_rows = 4},
      {.n = 1024, .depth = 4, .rounds = 4, .open_rounds = 2, .open_rows = 4},
      {.n = 2048, .depth = 1, .rounds = 2, .open_rounds = 2, .open_rows = 4},
  };
  size_t count = argc > 1 ? (size_t)atoi(argv[1]) : GN_ARRAY_SIZE(cases);
  if (sodium_init() < 0)
    return 1;
  for (size_t i = 0; i < count && i < GN_ARRAY_SIZE(cases); i++) {
    int r = run(&cases[i]);
    if (r < 0) {
      fprintf(stderr, "attest_bench: %s\n", gn_strerror(r));
      return 1;
    }
  }
  return 0;
}
