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

static void table_get(void *ctx, uint32_t index, uint8_t ret[64]) {
  memcpy(ret, (const uint8_t *)ctx + (size_t)index * 64u, 64);
}

typedef struct regen {
  const uint8_t *key;
  uint32_t cost;
} regen;

static void regen_get(void *ctx, uint32_t index, uint8_t ret[64]) {
  const regen *g = ctx;
  gn__attest_mem_entry(g->key, index, g->cost, ret);
}

/* The memory challenge's premise on this CPU: a walk step that reads its
 * entry from a table much larger than the caches, against one that
 * regenerates the entry (cost 32 ChaCha blocks). The table is filled at cost
 * 1 to save time: its contents do not change the read time. */
static void mem_ratio(void) {
  gn_attest_mem_params p = {.table_mib = 512, .cost = 1, .walkers = 1, .steps = 200000, .samples = 1};
  uint8_t key[32] = {1}, seed[32] = {2};
  uint64_t entries = gn__attest_mem_entries(&p);
  uint8_t *table = malloc((size_t)entries * 64u);
  if (!table)
    return;
  for (uint64_t i = 0; i < entries; i++)
    gn__attest_mem_entry(key, (uint32_t)i, 1, table + i * 64u);
  double t0 = now_s();
  volatile uint64_t sink = gn__attest_mem_walk(&p, seed, 0, table_get, table);
  double read = (now_s() - t0) / p.steps;
  regen g = {key, 32};
  p.steps = 20000;
  t0 = now_s();
  sink = gn__attest_mem_walk(&p, seed, 0, regen_get, &g);
  double gen = (now_s() - t0) / p.steps;
  (void)sink;
  printf("memory walk on this CPU (one walker, 512 MiB table): read %.0f ns/step, regenerate at cost 32 "
         "%.0f ns/step: regenerating is %.1fx slower\n",
         read * 1e9, gen * 1e9, gen / read);
  free(table);
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
  if (argc <= 1)
    mem_ratio();
  return 0;
}
