/* Checks the ChaCha20, BLAKE2b and key-derivation code the CUDA kernel runs
 * (node/cuda/attest_prims.h, compiled here as plain C) against libsodium and
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

int main(void) {
  if (sodium_init() < 0)
    return 1;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_chacha_block_matches_libsodium),
      cmocka_unit_test(test_blake2b_matches_libsodium_at_every_length),
      cmocka_unit_test(test_round_key_matches_reference),
      cmocka_unit_test(test_quant_matches_reference),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
