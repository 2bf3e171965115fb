/* Checks the ChaCha20, BLAKE2b and key-derivation code the CUDA kernel runs
 * (node/attest/cuda/attest_prims.h, compiled here as plain C) against libsodium and
 * the CPU reference, so the GPU path is tested where no GPU is. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "attest_int.h"
#include "cuda/attest_prims.h"
#include <sodium.h>

static void test_chacha_block_matches_libsodium(void **state) {
  (void)state;
  static const uint8_t zero_nonce[12];
  uint8_t key[32], want[64 * 4];
  uint32_t kw[8], got[16];
  for (int i = 0; i < 32; i++)
    key[i] = (uint8_t)(i * 7 + 1);
  memcpy(kw, key, 32);
  memset(want, 0, sizeof(want));
  crypto_stream_chacha20_ietf_xor_ic(want, want, sizeof(want), zero_nonce, 1000, key);
  for (uint32_t b = 0; b < 4; b++) {
    gn_prim_chacha20_block(kw, 1000 + b, got);
    assert_memory_equal(got, want + 64 * b, 64);
  }
}

static void test_blake2b_matches_libsodium_at_every_length(void **state) {
  (void)state;
  /* Lengths around block edges and the row sizes the kernel hashes. */
  static const size_t lens[] = {0, 1, 7, 8, 63, 64, 93, 127, 128, 129, 255, 256, 257, 1024, 4096};
  uint64_t words[4096 / 8 + 1], got[4];
  uint8_t want[32];
  for (size_t i = 0; i < sizeof(words); i++)
    ((uint8_t *)words)[i] = (uint8_t)(i * 31 + 5);
  for (size_t t = 0; t < GN_ARRAY_SIZE(lens); t++) {
    crypto_generichash(want, 32, (const uint8_t *)words, lens[t], NULL, 0);
    gn_prim_b2b256(words, lens[t], got);
    assert_memory_equal(got, want, 32);
  }
}

static void test_round_key_matches_reference(void **state) {
  (void)state;
  gn_attest_params p = {.n = 256, .depth = 3, .rounds = 9, .open_rounds = 1, .open_rows = 1};
  uint8_t nonce[32], prev[32], want[32];
  uint32_t got[8];
  randombytes_buf(nonce, sizeof(nonce));
  randombytes_buf(prev, sizeof(prev));
  gn__attest_round_key(&p, nonce, 5, prev, 'B', want);
  gn_prim_round_key(p.n, p.depth, nonce, 5, prev, 'B', got);
  assert_memory_equal(got, want, 32);
}

static void test_quant_matches_reference(void **state) {
  (void)state;
  static const int32_t xs[] = {0, 1, -1, 255, 256, -256, 0x7fffffff, INT32_MIN, 123456789, -987654321};
  for (size_t i = 0; i < GN_ARRAY_SIZE(xs); i++)
    assert_int_equal(gn_prim_quant(xs[i]), gn__attest_quant(xs[i]));
}

/* The Merkle tree as the kernel builds it (k_chunks, k_leaves, k_level: the
 * same buffers and index arithmetic, run serially here) against the CPU
 * reference's root. */
static void test_kernel_tree_layout_matches_reference(void **state) {
  (void)state;
  static const uint32_t sizes[] = {64, 128, 256, 512, 1024};
  for (size_t t = 0; t < GN_ARRAY_SIZE(sizes); t++) {
    uint32_t n = sizes[t];
    int32_t *c = malloc((size_t)n * n * 4);
    for (size_t i = 0; i < (size_t)n * n; i++)
      c[i] = (int32_t)(i * 2654435761u ^ (uint32_t)t);
    uint32_t chunk = n < 256 ? n : 256, per_row = n / chunk;
    size_t count = (size_t)n * per_row;
    uint64_t *chunks = malloc(count * 32), *tree = malloc((size_t)2 * n * 32);
    for (size_t k = 0; k < count; k++)
      gn_prim_b2b256((const uint64_t *)(c + k * chunk), (size_t)chunk * 4u, chunks + k * 4);
    for (uint32_t row = 0; row < n; row++)
      gn_prim_b2b256(chunks + (size_t)row * per_row * 4, (size_t)per_row * 32u, tree + (size_t)row * 4);
    size_t base = 0;
    for (uint32_t width = n; width > 1; width /= 2) {
      for (uint32_t i = 0; i < width / 2; i++)
        gn_prim_b2b256(tree + base * 4 + (size_t)i * 8, 64, tree + (base + width) * 4 + (size_t)i * 4);
      base += width;
    }
    uint8_t want[32];
    assert_int_equal(gn__attest_merkle(c, n, NULL, 0, NULL, want), 0);
    assert_memory_equal(tree + (size_t)(2 * n - 2) * 4, want, 32);
    free(c);
    free(chunks);
    free(tree);
  }
}

static void cpu_table_get(void *ctx, uint32_t index, uint8_t ret[64]) {
  memcpy(ret, (const uint8_t *)ctx + (size_t)index * 64u, 64);
}

/* The memory kernels' arithmetic (k_mem_fill, k_mem_walk), run serially with
 * the same word-level code, against the reference entry and walk. */
static void test_kernel_memory_walk_matches_reference(void **state) {
  (void)state;
  gn_attest_mem_params p = {.table_mib = 1, .cost = 3, .walkers = 8, .steps = 500, .samples = 1};
  uint8_t nonce[32] = {5}, key[32], seed[32] = {6, 7};
  uint64_t entries = gn__attest_mem_entries(&p);
  uint32_t *table = malloc((size_t)entries * 64u), k0[8], sw[8];
  gn__attest_mem_key(&p, nonce, key);
  memcpy(k0, key, 32);
  memcpy(sw, seed, 32);
  for (uint64_t e = 0; e < entries; e++) {
    uint32_t o[16];
    gn_prim_chacha20_block(k0, (uint32_t)e, o);
    for (uint32_t j = 1; j < p.cost; j++) {
      uint32_t k[8];
      memcpy(k, o, 32);
      gn_prim_chacha20_block(k, 0, o);
    }
    memcpy(table + e * 16, o, 64);
  }
  uint8_t want_entry[64];
  gn__attest_mem_entry(key, 777, p.cost, want_entry);
  assert_memory_equal(table + 777 * 16, want_entry, 64);
  for (uint32_t w = 0; w < p.walkers; w++) {
    uint32_t o[16];
    gn_prim_chacha20_block(sw, w, o);
    uint64_t acc = (uint64_t)o[0] | ((uint64_t)o[1] << 32);
    for (uint32_t s = 0; s < p.steps; s++) {
      uint64_t idx = ((acc >> 32) * entries) >> 32;
      const uint32_t *e = table + idx * 16;
      uint32_t lo = 0, hi = 0;
      for (int i = 0; i < 16; i += 2) {
        lo ^= e[i];
        hi ^= e[i + 1];
      }
      acc ^= (uint64_t)lo | ((uint64_t)hi << 32);
      acc = ((acc << 23) | (acc >> 41)) * 0x9e3779b97f4a7c15ull + s;
    }
    assert_true(acc == gn__attest_mem_walk(&p, seed, w, cpu_table_get, table));
  }
  free(table);
}

int main(void) {
  if (sodium_init() < 0)
    return 1;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_chacha_block_matches_libsodium),
      cmocka_unit_test(test_blake2b_matches_libsodium_at_every_length),
      cmocka_unit_test(test_round_key_matches_reference),
      cmocka_unit_test(test_quant_matches_reference),
      cmocka_unit_test(test_kernel_tree_layout_matches_reference),
      cmocka_unit_test(test_kernel_memory_walk_matches_reference),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
