/* GPU classes for attestation (memory, bandwidth, dense int8 tensor
 * throughput from the manufacturers' figures) and the rule that turns a
 * verified timing into a verdict. */
#include "attest_int.h"

#include <stdio.h>

/* Throughput is the dense (no 2:4 sparsity) int8 tensor-core peak at boost
 * clock, as the vendor's whitepaper or datasheet states it; "TOPS" is 10^12
 * int8 operations per second, a multiply-accumulate counting as 2.
 *
 * min_fraction is what a straightforward WMMA kernel (node/attest/cuda) should
 * reach, measured end to end by a remote verifier (hashing, ChaCha and the
 * network round trip included); mem_min_fraction the same for the memory
 * walk (attest_mem.c), against nominal bandwidth. Each is set at about half
 * of what an honest card of the class reached in scripts/bench/gpu_check,
 * where one was measured (measured = true):
 *
 * - H200 (2026-12-04, driver 580.159.04, the WMMA kernel): the chain reached
 *   125-153 TOPS (6.3-7.7% of the dense peak: Hopper's int8 peak needs wgmma,
 *   which WMMA does not use) and the walk over a 123 GiB table 182 GB/s
 *   (3.8% of 4.8 TB/s; 163 GB/s, 3.4%, on a shorter walk: dependent random
 *   64-byte reads over that much memory are bound by address translation,
 *   not bandwidth). The fill's ChaCha ran at 2.5e10 blocks/s, so a prover
 *   regenerating entries at cost 32 gets 50 GB/s (1.0%), and an 80 GB card
 *   holding 57% of the table ~85 GB/s (1.8%): 2.2% sits between those and
 *   the honest 3.4-3.8%. H100 SXM is the same chip with less memory and is
 *   given the H200's fractions unmeasured.
 * - The others were never run: 35% / 30% are first settings from the
 *   datasheets. An honest card of those classes may well fall short of the
 *   memory rule (the H200 reached an eighth of it); run gpu_check on one and
 *   revise its row. */
static const gn_attest_class classes[] = {
    /* NVIDIA Ampere GA102 whitepaper (v2.1), table "GeForce RTX 3090": 24 GB
     * GDDR6X, 936 GB/s, peak INT8 Tensor TOPS 284/568 (dense/sparse). */
    {"RTX 3090", "RTX 3090", 24576, 936.0, 284.0, 0.35, 0.30, false},
    /* NVIDIA Ada Lovelace whitepaper (v1.1), "GeForce RTX 4080": 16 GB GDDR6X,
     * 716.8 GB/s, INT8 Tensor TOPS 389.9/779.8 (the 4080 figure is the one
     * of this table I am least sure of; 16 GB variant, not the 4080 SUPER). */
    {"RTX 4080", "RTX 4080", 16384, 716.8, 389.9, 0.35, 0.30, false},
    /* Ada whitepaper, "GeForce RTX 4090": 24 GB GDDR6X, 1008 GB/s, INT8 Tensor
     * TOPS 660.6/1321.2. */
    {"RTX 4090", "RTX 4090", 24576, 1008.0, 660.6, 0.35, 0.30, false},
    /* NVIDIA RTX Blackwell GPU architecture whitepaper, "GeForce RTX 5090":
     * 32 GB GDDR7, 1792 GB/s, INT8 Tensor TOPS 838/1676. (NVIDIA's marketing
     * "3352 AI TOPS" is FP4 with sparsity.) */
    {"RTX 5090", "RTX 5090", 32768, 1792.0, 838.0, 0.35, 0.30, false},
    /* NVIDIA A100 datasheet: 80 GB HBM2e SXM, 2039 GB/s, INT8 624/1248 TOPS. */
    {"A100 80GB", "A100", 81920, 2039.0, 624.0, 0.35, 0.30, false},
    /* NVIDIA H100 datasheet, SXM5: 80 GB HBM3, 3.35 TB/s, INT8 3958 TOPS
     * "with sparsity", so 1979 dense. */
    {"H100 SXM", "H100", 81920, 3350.0, 1979.0, 0.04, 0.022, false},
    /* NVIDIA H200 datasheet, SXM: 141 GB HBM3e, 4.8 TB/s, INT8 3958 TOPS with
     * sparsity (1979 dense): the same compute as H100 SXM with more, faster
     * memory. (H200 NVL is 3341 sparse; it reports the same device name, so
     * an NVL card is held to the SXM figure here.) The "141 GB" are in fact
     * ~141 GiB: NVML reports 143,771 MiB usable; nominal 144,384 MiB. */
    {"H200", "H200", 144384, 4800.0, 1979.0, 0.04, 0.022, true},
};

size_t gn_attest_class_count(void) {
  return GN_ARRAY_SIZE(classes);
}

const gn_attest_class *gn_attest_class_at(size_t index) {
  return index < GN_ARRAY_SIZE(classes) ? &classes[index] : NULL;
}

const gn_attest_class *gn_attest_class_find(const char *name) {
  if (!name)
    return NULL;
  for (size_t i = 0; i < GN_ARRAY_SIZE(classes); i++)
    if (strcmp(classes[i].name, name) == 0)
      return &classes[i];
  for (size_t i = 0; i < GN_ARRAY_SIZE(classes); i++)
    if (strstr(name, classes[i].match))
      return &classes[i];
  return NULL;
}

int gn_attest_params_for_class(const gn_attest_class *c, uint32_t target_ms, gn_attest_params *ret) {
  gn_attest_params p = {.n = 4096, .depth = 4, .rounds = 1, .open_rounds = 16, .open_rows = 4};
  if (!c || target_ms == 0)
    return GN_EINVAL;
  double per_round = 2.0 * p.depth * (double)p.n * p.n * p.n;
  double want = c->int8_tops * 1e12 * (double)target_ms / 1000.0 / per_round;
  if (want > GN_ATTEST_ROUNDS_MAX)
    want = GN_ATTEST_ROUNDS_MAX;
  p.rounds = want < 1.0 ? 1 : (uint32_t)(want + 0.999);
  if (p.open_rounds > p.rounds)
    p.open_rounds = p.rounds;
  int r = gn_attest_params_check(&p);
  if (r < 0)
    return r;
  *ret = p;
  return 0;
}

int gn_attest_grade(const gn_attest_params *p, const char *claimed_class, uint64_t elapsed_ms, bool simulated,
                    gn_attest_result *ret) {
  const gn_attest_class *c = gn_attest_class_find(claimed_class);
  if (!p)
    return GN_EINVAL;
  /* A simulated prover is graded "simulated" whatever its class or clock:
   * nothing it says about hardware means anything. */
  if (!c && !simulated)
    return GN_ENOTFOUND;
  /* A zero elapsed time (a clock too coarse) counts as 1 ms, so a very fast
   * answer grades as fast rather than dividing by zero. */
  double s = (elapsed_ms ? (double)elapsed_ms : 1.0) / 1000.0;
  double measured = gn_attest_params_ops(p) / s / 1e12;
  double expected = c ? c->int8_tops * c->min_fraction : 0.0;
  ret->measured_tops = measured;
  ret->expected_tops = expected;
  ret->elapsed_ms = elapsed_ms;
  ret->simulated = simulated;
  if (simulated) {
    ret->outcome = GN_ATTEST_SIMULATED;
    snprintf(ret->verdict, sizeof(ret->verdict), "simulated");
  } else if (measured >= expected) {
    ret->outcome = GN_ATTEST_VERIFIED;
    snprintf(ret->verdict, sizeof(ret->verdict), "verified %s", c->name);
  } else {
    ret->outcome = GN_ATTEST_TOO_SLOW;
    snprintf(ret->verdict, sizeof(ret->verdict), "too slow for %s (measured %.1f TOPS, expected at least %.1f TOPS)",
             c->name, measured, expected);
  }
  return 0;
}
