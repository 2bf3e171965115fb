/* GPU check for attestation, for a machine with an NVIDIA GPU: the CUDA
 * prover's roots and rows must equal the CPU reference bit for bit, a full
 * exchange with the CUDA prover must verify, and the achieved int8
 * throughput is printed against the card's class peak. Built and run by
 * scripts/bench/attest_gpu_check; exits non-zero on any mismatch. */
#include "attest_int.h"

#include <sodium.h>
#include <stdio.h>

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static int check_equal(gn_attest_backend *b) {
  static const gn_attest_params cases[] = {
      {.n = 64, .depth = 1, .rounds = 3, .open_rounds = 1, .open_rows = 1},
      {.n = 128, .depth = 2, .rounds = 2, .open_rounds = 1, .open_rows = 1},
      {.n = 256, .depth = 3, .rounds = 2, .open_rounds = 1, .open_rows = 1},
      {.n = 512, .depth = 1, .rounds = 2, .open_rounds = 1, .open_rows = 1},
      {.n = 1024, .depth = 4, .rounds = 2, .open_rounds = 1, .open_rows = 1},
      {.n = 2048, .depth = 2, .rounds = 1, .open_rounds = 1, .open_rows = 1},
  };
  uint8_t nonce[32];
  int bad = 0;
  randombytes_buf(nonce, sizeof(nonce));
  for (size_t t = 0; t < GN_ARRAY_SIZE(cases); t++) {
    const gn_attest_params *p = &cases[t];
    uint8_t gpu[3 * 32], cpu[3 * 32];
    size_t cells = (size_t)p->n * p->n;
    int32_t *cg = malloc(cells * 4), *cc = malloc(cells * 4);
    int r1 = b->chain(b->ctx, p, nonce, gpu);
    int r2 = gn__attest_cpu_chain(p, nonce, cpu);
    int r3 = b->round_output(b->ctx, p, nonce, p->rounds - 1, p->rounds > 1 ? gpu + (p->rounds - 2) * 32 : gpu, cg);
    int r4 = gn_attest_backend_cpu()->round_output(NULL, p, nonce, p->rounds - 1,
                                                   p->rounds > 1 ? gpu + (p->rounds - 2) * 32 : gpu, cc);
    bool same = r1 == 0 && r2 == 0 && r3 == 0 && r4 == 0 && memcmp(gpu, cpu, (size_t)p->rounds * 32) == 0 &&
                memcmp(cg, cc, cells * 4) == 0;
    printf("  n=%-5u depth=%u rounds=%u: %s\n", p->n, p->depth, p->rounds,
           same ? "roots and rows equal the CPU reference" : "MISMATCH");
    if (!same && r1 == 0 && r3 == 0) {
      size_t first = 0;
      while (first < cells && cg[first] == cc[first])
        first++;
      if (first < cells)
        printf("    first differing cell (%zu, %zu): gpu %d cpu %d\n", first / p->n, first % p->n, cg[first],
               cc[first]);
    } else if (!same) {
      printf("    errors: gpu chain %s, gpu round %s\n", gn_strerror(r1), gn_strerror(r3));
    }
    bad += !same;
    free(cg);
    free(cc);
  }
  return bad;
}

static int check_exchange(gn_attest_backend *b, const char *cls) {
  gn_attest_params p = {.n = 1024, .depth = 2, .rounds = 8, .open_rounds = 4, .open_rows = 4};
  gn_buf ch = {0}, resp = {0}, open = {0}, proof = {0};
  gn_attest_verifier *v;
  gn_attest_prover *pr;
  gn_attest_result res;
  int r;
  if ((r = gn_attest_verifier_new(&p, cls, NULL, NULL, &ch, &v)) < 0 || (r = gn_attest_prover_new(b, &pr)) < 0)
    return r;
  double t0 = now_s();
  if ((r = gn_attest_prover_on_challenge(pr, ch.data, ch.len, &resp)) == 0 &&
      (r = gn_attest_verifier_on_response(v, resp.data, resp.len, &open)) == 0 &&
      (r = gn_attest_prover_on_open(pr, open.data, open.len, &proof)) == 0) {
    uint64_t ms = (uint64_t)((now_s() - t0) * 1000);
    r = gn_attest_verifier_on_proof(v, proof.data, proof.len, ms, &res);
  }
  if (r == 0)
    printf("  exchange n=1024 with the CUDA prover: %s\n", res.verdict);
  gn_attest_prover_free(pr);
  gn_attest_verifier_free(v);
  gn_buf_done(&ch);
  gn_buf_done(&resp);
  gn_buf_done(&open);
  gn_buf_done(&proof);
  return r < 0 ? r : res.outcome == GN_ATTEST_FAILED ? GN_EAUDIT : 0;
}

static void throughput(gn_attest_backend *b, const gn_attest_class *c, uint32_t n, uint32_t depth, double seconds) {
  gn_attest_params p = {.n = n, .depth = depth, .rounds = 1, .open_rounds = 1, .open_rows = 1};
  uint8_t nonce[32] = {1};
  uint8_t *roots = malloc((size_t)GN_ATTEST_ROUNDS_MAX * 32);
  /* One round to size the run, then enough rounds for `seconds`. */
  double t0 = now_s();
  if (b->chain(b->ctx, &p, nonce, roots) < 0) {
    printf("  n=%u: chain failed\n", n);
    free(roots);
    return;
  }
  double one = now_s() - t0;
  double want = seconds / (one > 1e-6 ? one : 1e-6);
  p.rounds = want < 2 ? 2 : want > GN_ATTEST_ROUNDS_MAX ? GN_ATTEST_ROUNDS_MAX : (uint32_t)want;
  t0 = now_s();
  int r = b->chain(b->ctx, &p, nonce, roots);
  double dt = now_s() - t0;
  double tops = gn_attest_params_ops(&p) / dt / 1e12;
  gn_attest_result res;
  if (r == 0 && c && gn_attest_grade(&p, c->name, (uint64_t)(dt * 1000), false, &res) == 0)
    printf("  n=%-5u depth=%u rounds=%-5u %.3f s: %.1f TOPS = %.1f%% of %s peak %.1f (threshold %.0f%%): %s\n", n,
           depth, p.rounds, dt, tops, 100 * tops / c->int8_tops, c->name, c->int8_tops, 100 * c->min_fraction,
           res.verdict);
  else
    printf("  n=%-5u depth=%u rounds=%-5u %.3f s: %.1f TOPS (%s)\n", n, depth, p.rounds, dt, tops,
           r ? gn_strerror(r) : "no class for this card");
  free(roots);
}

/* The memory challenge sized for the class (7/8 of its memory), the walk on
 * the device, checked by the CPU verifier, bandwidth against the class. */
static int check_memory(gn_attest_backend *b, const gn_attest_class *c) {
  gn_attest_mem_params p;
  gn_buf ch = {0}, ready = {0}, walk = {0}, result = {0};
  gn_attest_mem_verifier *v = NULL;
  gn_attest_mem_prover *pr = NULL;
  gn_attest_result res;
  int r;
  if (!c)
    return 0;
  if ((r = gn_attest_mem_params_for_class(c, 1000, &p)) < 0 ||
      (r = gn_attest_mem_verifier_new(&p, c->name, NULL, NULL, &ch, &v)) < 0 ||
      (r = gn_attest_mem_prover_new_cuda(b, p.table_mib, &pr)) < 0)
    goto out;
  double t0 = now_s();
  if ((r = gn_attest_mem_prover_on_challenge(pr, ch.data, ch.len, &ready)) < 0)
    goto out;
  double t1 = now_s();
  if ((r = gn_attest_mem_verifier_on_ready(v, ready.data, ready.len, &walk)) < 0)
    goto out;
  double t2 = now_s();
  if ((r = gn_attest_mem_prover_on_walk(pr, walk.data, walk.len, &result)) < 0)
    goto out;
  double t3 = now_s();
  if ((r = gn_attest_mem_verifier_on_result(v, result.data, result.len, (uint64_t)((t3 - t2) * 1000), &res)) < 0)
    goto out;
  double t4 = now_s();
  printf("  table %u MiB (cost %u), %u walkers x %u steps: fill %.2f s, walk %.3f s = %.1f GB/s = %.1f%% of %.0f "
         "GB/s; verify %.2f s on the CPU: %s\n",
         p.table_mib, p.cost, p.walkers, p.steps, t1 - t0, t3 - t2, res.measured_tops,
         100 * res.measured_tops / c->bandwidth_gbs, c->bandwidth_gbs, t4 - t3, res.verdict);
  r = res.outcome == GN_ATTEST_FAILED ? GN_EAUDIT : 0;
out:
  if (r < 0)
    printf("  memory challenge: %s\n", gn_strerror(r));
  gn_attest_mem_prover_free(pr);
  gn_attest_mem_verifier_free(v);
  gn_buf_done(&ch);
  gn_buf_done(&ready);
  gn_buf_done(&walk);
  gn_buf_done(&result);
  return r;
}

int main(void) {
  gn_attest_backend *b;
  char name[128];
  if (sodium_init() < 0)
    return 1;
  int r = gn_attest_cuda_open(0, &b);
  if (r < 0) {
    fprintf(stderr, "attest_gpu_check: no CUDA backend: %s (library, driver or a GPU >= sm_75 missing)\n",
            gn_strerror(r));
    return 2;
  }
  gn_attest_cuda_device_name(b, name, sizeof(name));
  const gn_attest_class *c = gn_attest_class_find(name);
  printf("device 0: %s, class %s\n", name, c ? c->name : "(none in the table)");
  printf("bit-for-bit equality with the CPU reference:\n");
  int bad = check_equal(b);
  printf("protocol:\n");
  int ex = check_exchange(b, c ? c->name : "RTX 4090");
  if (ex < 0)
    printf("  exchange failed: %s\n", gn_strerror(ex));
  printf("throughput (whole chain: ChaCha, products, Merkle tree; host clock):\n");
  throughput(b, c, 2048, 4, 1.0);
  throughput(b, c, 4096, 4, 2.0);
  throughput(b, c, 8192, 2, 2.0);
  printf("memory challenge:\n");
  int mem = check_memory(b, c);
  gn_attest_cuda_close(b);
  if (bad || ex < 0 || mem == GN_EAUDIT) {
    printf("FAILED\n");
    return 1;
  }
  printf("OK\n");
  return 0;
}
