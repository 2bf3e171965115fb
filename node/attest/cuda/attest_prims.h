/* ChaCha20 and BLAKE2b written once for both the CUDA attestation kernel (as
 * device code) and the host (as plain C), so that tests on machines without a
 * GPU check these exact lines against libsodium (tests/attest/test_attest_prims.c).
 * Little-endian only, as are x86-64, arm64 and every NVIDIA GPU. */
#ifndef GPUNET_ATTEST_PRIMS_H
#define GPUNET_ATTEST_PRIMS_H

#include <stddef.h>
#include <stdint.h>

#ifdef __CUDACC__
/* Device only: the host side of the CUDA library never hashes. */
#define GN_PRIM __device__ static inline
#define GN_PRIM_CONST __constant__ static const
#else
#define GN_PRIM static inline
#define GN_PRIM_CONST static const
#endif

/* --- ChaCha20 (RFC 8439 block function, as libsodium's _ietf variant) ------*/

GN_PRIM uint32_t gn_prim_rotl32(uint32_t x, int n) {
  return (x << n) | (x >> (32 - n));
}

#define GN_PRIM_QR(a, b, c, d)                                                                                         \
  do {                                                                                                                 \
    a += b;                                                                                                            \
    d = gn_prim_rotl32(d ^ a, 16);                                                                                     \
    c += d;                                                                                                            \
    b = gn_prim_rotl32(b ^ c, 12);                                                                                     \
    a += b;                                                                                                            \
    d = gn_prim_rotl32(d ^ a, 8);                                                                                      \
    c += d;                                                                                                            \
    b = gn_prim_rotl32(b ^ c, 7);                                                                                      \
  } while (0)

/* Block `counter` of the keystream of key (8 little-endian words) with an
 * all-zero 96-bit nonce: 16 words, i.e. 64 bytes little-endian. */
GN_PRIM void gn_prim_chacha20_block(const uint32_t key[8], uint32_t counter, uint32_t out[16]) {
  uint32_t s[16] = {0x61707865u, 0x3320646eu, 0x79622d32u, 0x6b206574u, key[0],  key[1], key[2], key[3],
                    key[4],      key[5],      key[6],      key[7],      counter, 0,      0,      0};
  uint32_t x[16];
  for (int i = 0; i < 16; i++)
    x[i] = s[i];
  for (int i = 0; i < 10; i++) {
    GN_PRIM_QR(x[0], x[4], x[8], x[12]);
    GN_PRIM_QR(x[1], x[5], x[9], x[13]);
    GN_PRIM_QR(x[2], x[6], x[10], x[14]);
    GN_PRIM_QR(x[3], x[7], x[11], x[15]);
    GN_PRIM_QR(x[0], x[5], x[10], x[15]);
    GN_PRIM_QR(x[1], x[6], x[11], x[12]);
    GN_PRIM_QR(x[2], x[7], x[8], x[13]);
    GN_PRIM_QR(x[3], x[4], x[9], x[14]);
  }
  for (int i = 0; i < 16; i++)
    out[i] = x[i] + s[i];
}

/* --- BLAKE2b-256 (RFC 7693), unkeyed, as libsodium's crypto_generichash ----*/

GN_PRIM_CONST uint64_t gn_prim_b2b_iv[8] = {0x6a09e667f3bcc908ull, 0xbb67ae8584caa73bull, 0x3c6ef372fe94f82bull,
                                            0xa54ff53a5f1d36f1ull, 0x510e527fade682d1ull, 0x9b05688c2b3e6c1full,
                                            0x1f83d9abfb41bd6bull, 0x5be0cd19137e2179ull};

GN_PRIM uint64_t gn_prim_rotr64(uint64_t x, int n) {
  return (x >> n) | (x << (64 - n));
}

#define GN_PRIM_G(v, a, b, c, d, x, y)                                                                                 \
  do {                                                                                                                 \
    v[a] = v[a] + v[b] + (x);                                                                                          \
    v[d] = gn_prim_rotr64(v[d] ^ v[a], 32);                                                                            \
    v[c] = v[c] + v[d];                                                                                                \
    v[b] = gn_prim_rotr64(v[b] ^ v[c], 24);                                                                            \
    v[a] = v[a] + v[b] + (y);                                                                                          \
    v[d] = gn_prim_rotr64(v[d] ^ v[a], 16);                                                                            \
    v[c] = v[c] + v[d];                                                                                                \
    v[b] = gn_prim_rotr64(v[b] ^ v[c], 63);                                                                            \
  } while (0)

/* Compresses one 128-byte block m (16 little-endian words); t is the byte
 * count so far including this block (messages here stay below 2^64 bytes). */
GN_PRIM void gn_prim_b2b_compress(uint64_t h[8], const uint64_t m[16], uint64_t t, int last) {
  uint64_t v[16];
  for (int i = 0; i < 8; i++) {
    v[i] = h[i];
    v[i + 8] = gn_prim_b2b_iv[i];
  }
  v[12] ^= t;
  if (last)
    v[14] = ~v[14];
    /* The twelve rounds spelled out with the message schedule (RFC 7693's
     * SIGMA; rounds 10 and 11 repeat 0 and 1) as literals, so that on the GPU
     * m[] stays in registers instead of being indexed from local memory. */
#define GN_PRIM_ROUND(s0, s1, s2, s3, s4, s5, s6, s7, s8, s9, s10, s11, s12, s13, s14, s15)                            \
  do {                                                                                                                 \
    GN_PRIM_G(v, 0, 4, 8, 12, m[s0], m[s1]);                                                                           \
    GN_PRIM_G(v, 1, 5, 9, 13, m[s2], m[s3]);                                                                           \
    GN_PRIM_G(v, 2, 6, 10, 14, m[s4], m[s5]);                                                                          \
    GN_PRIM_G(v, 3, 7, 11, 15, m[s6], m[s7]);                                                                          \
    GN_PRIM_G(v, 0, 5, 10, 15, m[s8], m[s9]);                                                                          \
    GN_PRIM_G(v, 1, 6, 11, 12, m[s10], m[s11]);                                                                        \
    GN_PRIM_G(v, 2, 7, 8, 13, m[s12], m[s13]);                                                                         \
    GN_PRIM_G(v, 3, 4, 9, 14, m[s14], m[s15]);                                                                         \
  } while (0)
  GN_PRIM_ROUND(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  GN_PRIM_ROUND(14, 10, 4, 8, 9, 15, 13, 6, 1, 12, 0, 2, 11, 7, 5, 3);
  GN_PRIM_ROUND(11, 8, 12, 0, 5, 2, 15, 13, 10, 14, 3, 6, 7, 1, 9, 4);
  GN_PRIM_ROUND(7, 9, 3, 1, 13, 12, 11, 14, 2, 6, 5, 10, 4, 0, 15, 8);
  GN_PRIM_ROUND(9, 0, 5, 7, 2, 4, 10, 15, 14, 1, 11, 12, 6, 8, 3, 13);
  GN_PRIM_ROUND(2, 12, 6, 10, 0, 11, 8, 3, 4, 13, 7, 5, 15, 14, 1, 9);
  GN_PRIM_ROUND(12, 5, 1, 15, 14, 13, 4, 10, 0, 7, 6, 3, 9, 2, 8, 11);
  GN_PRIM_ROUND(13, 11, 7, 14, 12, 1, 3, 9, 5, 0, 15, 4, 8, 6, 2, 10);
  GN_PRIM_ROUND(6, 15, 14, 9, 11, 3, 0, 8, 12, 2, 13, 7, 1, 4, 10, 5);
  GN_PRIM_ROUND(10, 2, 8, 4, 7, 6, 1, 5, 15, 11, 9, 14, 3, 12, 13, 0);
  GN_PRIM_ROUND(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  GN_PRIM_ROUND(14, 10, 4, 8, 9, 15, 13, 6, 1, 12, 0, 2, 11, 7, 5, 3);
#undef GN_PRIM_ROUND
  for (int i = 0; i < 8; i++)
    h[i] ^= v[i] ^ v[i + 8];
}

/* BLAKE2b-256 of len bytes at words (8-byte aligned, little-endian; bytes
 * past len in the last word are ignored). out: 4 little-endian words. */
GN_PRIM void gn_prim_b2b256(const uint64_t *words, size_t len, uint64_t out[4]) {
  uint64_t h[8], m[16];
  for (int i = 0; i < 8; i++)
    h[i] = gn_prim_b2b_iv[i];
  h[0] ^= 0x01010000ull ^ 32u; /* digest length 32, no key, fanout 1, depth 1 */
  size_t done = 0;
  /* Every full block but the last is compressed as not-last; an exact
   * multiple of 128 bytes ends with a full last block, as in RFC 7693. */
  while (len - done > 128) {
    for (int i = 0; i < 16; i++)
      m[i] = words[done / 8 + i];
    done += 128;
    gn_prim_b2b_compress(h, m, done, 0);
  }
  size_t rest = len - done;
  for (int i = 0; i < 16; i++) {
    size_t at = (size_t)i * 8;
    uint64_t w = 0;
    if (at + 8 <= rest)
      w = words[done / 8 + i];
    else if (at < rest)
      w = words[done / 8 + i] & ((1ull << (8 * (rest - at))) - 1);
    m[i] = w;
  }
  gn_prim_b2b_compress(h, m, len, 1);
  for (int i = 0; i < 4; i++)
    out[i] = h[i];
}

/* The round key derivation of node/attest/attest_core.c (gn__attest_round_key):
 * BLAKE2b-256("gpunet-attest-v1" || role || le32 round || le32 n ||
 * le32 depth || nonce || prev_root). */
GN_PRIM void gn_prim_round_key(uint32_t n, uint32_t depth, const uint8_t nonce[32], uint32_t round,
                               const uint8_t prev_root[32], char role, uint32_t ret_key[8]) {
  uint64_t buf[12];
  uint8_t *b = (uint8_t *)buf;
  const char *domain = "gpunet-attest-v1";
  for (int i = 0; i < 12; i++)
    buf[i] = 0;
  int o = 0;
  for (int i = 0; i < 16; i++)
    b[o++] = (uint8_t)domain[i];
  b[o++] = (uint8_t)role;
  uint32_t le[3] = {round, n, depth};
  for (int k = 0; k < 3; k++)
    for (int i = 0; i < 4; i++)
      b[o++] = (uint8_t)(le[k] >> (8 * i));
  for (int i = 0; i < 32; i++)
    b[o++] = nonce[i];
  for (int i = 0; i < 32; i++)
    b[o++] = prev_root[i];
  uint64_t h[4];
  gn_prim_b2b256(buf, (size_t)o, h);
  for (int i = 0; i < 4; i++) {
    ret_key[2 * i] = (uint32_t)h[i];
    ret_key[2 * i + 1] = (uint32_t)(h[i] >> 32);
  }
}

/* The map between chained products (gn__attest_quant). */
GN_PRIM int8_t gn_prim_quant(int32_t x) {
  uint32_t u = (uint32_t)x;
  return (int8_t)(uint8_t)(u ^ (u >> 8) ^ (u >> 16) ^ (u >> 24));
}

#endif
