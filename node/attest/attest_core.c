/* The attestation challenge's math on the CPU: deriving the int8 matrices from
 * ChaCha20, the exact int8 x int8 -> int32 product (the reference, the CPU
 * prover and the verifier's row recomputation), and the BLAKE2b Merkle tree
 * over output rows. */
#include "attest_int.h"

#include <sodium.h>

static void le32_put(uint8_t *p, uint32_t v) {
  p[0] = (uint8_t)v;
  p[1] = (uint8_t)(v >> 8);
  p[2] = (uint8_t)(v >> 16);
  p[3] = (uint8_t)(v >> 24);
}

void gn__attest_round_key(const gn_attest_params *p, const uint8_t nonce[GN_ATTEST_NONCE_LEN], uint32_t round,
                          const uint8_t prev_root[GN_ATTEST_HASH_LEN], char role, uint8_t ret_key[32]) {
  uint8_t msg[GN__ATTEST_DOMAIN_LEN + 1 + 12 + GN_ATTEST_NONCE_LEN + GN_ATTEST_HASH_LEN];
  size_t o = 0;
  memcpy(msg, GN__ATTEST_DOMAIN, GN__ATTEST_DOMAIN_LEN);
  o += GN__ATTEST_DOMAIN_LEN;
  msg[o++] = (uint8_t)role;
  le32_put(msg + o, round);
  le32_put(msg + o + 4, p->n);
  le32_put(msg + o + 8, p->depth);
  o += 12;
  memcpy(msg + o, nonce, GN_ATTEST_NONCE_LEN);
  o += GN_ATTEST_NONCE_LEN;
  memcpy(msg + o, prev_root, GN_ATTEST_HASH_LEN);
  o += GN_ATTEST_HASH_LEN;
  crypto_generichash(ret_key, 32, msg, o, NULL, 0);
}

void gn__attest_matrix_rows(const uint8_t key[32], uint32_t n, uint32_t row, uint32_t nrows, int8_t *out) {
  static const uint8_t zero_nonce[crypto_stream_chacha20_ietf_NONCEBYTES];
  /* Row r starts at byte r*n, i.e. at ChaCha block r*n/64 because n % 64 == 0:
   * the verifier derives one row of A without the rows before it. */
  size_t len = (size_t)nrows * n;
  memset(out, 0, len);
  crypto_stream_chacha20_ietf_xor_ic((unsigned char *)out, (const unsigned char *)out, len, zero_nonce,
                                     (uint32_t)((uint64_t)row * n / 64u), key);
}

/* Columns are processed in strips of 64 and the k loop is unrolled by 4 so the
 * compiler keeps a strip of C in vector registers and vectorises over columns;
 * k is blocked so that a block of B stays in L2 while every row of A uses it. */
#define GEMM_JB 64u
#define GEMM_KB 256u

/* On x86-64 the product is also built for AVX2 and AVX-512 and the loader
 * picks the best the CPU has (GCC function multiversioning): the verifier's
 * rows and the simulated prover run 2-4x faster than with SSE2 alone. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define GEMM_CLONES __attribute__((target_clones("arch=x86-64-v4", "avx2", "default")))
#else
#define GEMM_CLONES
#endif

GEMM_CLONES void gn__attest_gemm(const int8_t *a, const int8_t *b, int32_t *c, uint32_t nrows, uint32_t n) {
  memset(c, 0, (size_t)nrows * n * sizeof(*c));
  for (uint32_t k0 = 0; k0 < n; k0 += GEMM_KB) {
    uint32_t k1 = k0 + GEMM_KB < n ? k0 + GEMM_KB : n;
    for (uint32_t i = 0; i < nrows; i++) {
      const int8_t *ai = a + (size_t)i * n;
      int32_t *ci = c + (size_t)i * n;
      for (uint32_t j0 = 0; j0 < n; j0 += GEMM_JB) {
        int32_t acc[GEMM_JB];
        memcpy(acc, ci + j0, sizeof(acc));
        for (uint32_t k = k0; k < k1; k += 4) {
          const int32_t a0 = ai[k], a1 = ai[k + 1], a2 = ai[k + 2], a3 = ai[k + 3];
          const int8_t *b0 = b + (size_t)k * n + j0;
          const int8_t *b1 = b0 + n, *b2 = b1 + n, *b3 = b2 + n;
          for (uint32_t j = 0; j < GEMM_JB; j++)
            acc[j] += a0 * b0[j] + a1 * b1[j] + a2 * b2[j] + a3 * b3[j];
        }
        memcpy(ci + j0, acc, sizeof(acc));
      }
    }
  }
}

void gn__attest_round_rows(const gn_attest_params *p, const int8_t *a, const int8_t *b, int32_t *out, uint32_t nrows,
                           int8_t *scratch) {
  uint32_t n = p->n;
  size_t cells = (size_t)nrows * n;
  const int8_t *x = a;
  for (uint32_t d = 0; d + 1 < p->depth; d++) {
    gn__attest_gemm(x, b, out, nrows, n);
    for (size_t e = 0; e < cells; e++)
      scratch[e] = gn__attest_quant(out[e]);
    x = scratch;
  }
  gn__attest_gemm(x, b, out, nrows, n);
}

/* Rows are processed in bands so the int8 scratch stays small and a band of
 * A plus the depth chain stay in cache. */
#define ROUND_BAND 64u

int gn__attest_round_full(const gn_attest_params *p, const uint8_t key_a[32], const uint8_t key_b[32], int32_t *c) {
  uint32_t n = p->n;
  int r = GN_ENOMEM;
  int8_t *b = malloc((size_t)n * n);
  int8_t *a = malloc((size_t)ROUND_BAND * n);
  int8_t *scratch = malloc((size_t)ROUND_BAND * n);
  if (!a || !b || !scratch)
    goto out;
  gn__attest_matrix_rows(key_b, n, 0, n, b);
  for (uint32_t i = 0; i < n; i += ROUND_BAND) {
    uint32_t rows = n - i < ROUND_BAND ? n - i : ROUND_BAND;
    gn__attest_matrix_rows(key_a, n, i, rows, a);
    gn__attest_round_rows(p, a, b, c + (size_t)i * n, rows, scratch);
  }
  r = 0;
out:
  free(a);
  free(b);
  free(scratch);
  return r;
}

uint32_t gn__attest_log2(uint32_t n) {
  uint32_t l = 0;
  while ((1u << l) < n)
    l++;
  return l;
}

void gn__attest_leaf_hash(const int32_t *row, uint32_t n, uint8_t ret[GN_ATTEST_HASH_LEN]) {
  uint32_t chunk = n < GN__ATTEST_CHUNK ? n : GN__ATTEST_CHUNK, chunks = n / chunk;
  uint8_t hashes[(GN_ATTEST_N_MAX / GN__ATTEST_CHUNK) * GN_ATTEST_HASH_LEN];
  for (uint32_t q = 0; q < chunks; q++) {
    const int32_t *part = row + (size_t)q * chunk;
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    crypto_generichash(hashes + (size_t)q * GN_ATTEST_HASH_LEN, GN_ATTEST_HASH_LEN, (const unsigned char *)part,
                       (size_t)chunk * 4u, NULL, 0);
#else
    uint8_t le[GN__ATTEST_CHUNK * 4];
    for (uint32_t j = 0; j < chunk; j++)
      le32_put(le + 4 * j, (uint32_t)part[j]);
    crypto_generichash(hashes + (size_t)q * GN_ATTEST_HASH_LEN, GN_ATTEST_HASH_LEN, le, (size_t)chunk * 4u, NULL, 0);
#endif
  }
  crypto_generichash(ret, GN_ATTEST_HASH_LEN, hashes, (size_t)chunks * GN_ATTEST_HASH_LEN, NULL, 0);
}

static void node_hash(const uint8_t *left, const uint8_t *right, uint8_t *ret) {
  uint8_t both[2 * GN_ATTEST_HASH_LEN];
  memcpy(both, left, GN_ATTEST_HASH_LEN);
  memcpy(both + GN_ATTEST_HASH_LEN, right, GN_ATTEST_HASH_LEN);
  crypto_generichash(ret, GN_ATTEST_HASH_LEN, both, sizeof(both), NULL, 0);
}

int gn__attest_merkle(const int32_t *c, uint32_t n, const uint32_t *path_rows, size_t count, uint8_t *ret_paths,
                      uint8_t ret_root[GN_ATTEST_HASH_LEN]) {
  uint32_t levels = gn__attest_log2(n);
  /* All levels in one array: level 0 (n leaves), level 1 (n/2)... 2n-1 nodes. */
  uint8_t *t = malloc((size_t)(2 * n) * GN_ATTEST_HASH_LEN);
  if (!t)
    return GN_ENOMEM;
  for (uint32_t i = 0; i < n; i++)
    gn__attest_leaf_hash(c + (size_t)i * n, n, t + (size_t)i * GN_ATTEST_HASH_LEN);
  size_t base = 0, width = n;
  for (uint32_t l = 0; l < levels; l++) {
    for (size_t i = 0; i < width / 2; i++)
      node_hash(t + (base + 2 * i) * GN_ATTEST_HASH_LEN, t + (base + 2 * i + 1) * GN_ATTEST_HASH_LEN,
                t + (base + width + i) * GN_ATTEST_HASH_LEN);
    base += width;
    width /= 2;
  }
  for (size_t q = 0; q < count; q++) {
    size_t idx = path_rows[q];
    base = 0;
    width = n;
    for (uint32_t l = 0; l < levels; l++) {
      memcpy(ret_paths + (q * levels + l) * GN_ATTEST_HASH_LEN, t + (base + (idx ^ 1u)) * GN_ATTEST_HASH_LEN,
             GN_ATTEST_HASH_LEN);
      idx /= 2;
      base += width;
      width /= 2;
    }
  }
  memcpy(ret_root, t + base * GN_ATTEST_HASH_LEN, GN_ATTEST_HASH_LEN);
  free(t);
  return 0;
}

int gn__attest_merkle_check(const uint8_t leaf[GN_ATTEST_HASH_LEN], uint32_t n, uint32_t row, const uint8_t *path,
                            const uint8_t root[GN_ATTEST_HASH_LEN]) {
  uint8_t h[GN_ATTEST_HASH_LEN];
  uint32_t levels = gn__attest_log2(n);
  memcpy(h, leaf, sizeof(h));
  for (uint32_t l = 0; l < levels; l++) {
    const uint8_t *sib = path + (size_t)l * GN_ATTEST_HASH_LEN;
    if (row & 1u)
      node_hash(sib, h, h);
    else
      node_hash(h, sib, h);
    row /= 2;
  }
  return sodium_memcmp(h, root, GN_ATTEST_HASH_LEN) == 0 ? 0 : GN_EDIGEST;
}

void gn__attest_roots_hash(const uint8_t *roots, uint32_t rounds, uint8_t ret[GN_ATTEST_HASH_LEN]) {
  crypto_generichash(ret, GN_ATTEST_HASH_LEN, roots, (size_t)rounds * GN_ATTEST_HASH_LEN, NULL, 0);
}

int gn__attest_row_expected(const gn_attest_params *p, const uint8_t nonce[GN_ATTEST_NONCE_LEN], uint32_t round,
                            const uint8_t prev_root[GN_ATTEST_HASH_LEN], uint32_t row, int32_t *ret_row) {
  uint8_t key_a[32], key_b[32];
  uint32_t n = p->n;
  int r = GN_ENOMEM;
  int8_t *b = malloc((size_t)n * n);
  int8_t *a = malloc(n);
  int8_t *scratch = malloc(n);
  if (!a || !b || !scratch)
    goto out;
  gn__attest_round_key(p, nonce, round, prev_root, 'A', key_a);
  gn__attest_round_key(p, nonce, round, prev_root, 'B', key_b);
  gn__attest_matrix_rows(key_b, n, 0, n, b);
  gn__attest_matrix_rows(key_a, n, row, 1, a);
  gn__attest_round_rows(p, a, b, ret_row, 1, scratch);
  r = 0;
out:
  free(a);
  free(b);
  free(scratch);
  return r;
}

int gn__attest_chain_with(const gn_attest_params *p, const uint8_t nonce[GN_ATTEST_NONCE_LEN],
                          int (*round_fn)(void *ctx, const gn_attest_params *p,
                                          const uint8_t nonce[GN_ATTEST_NONCE_LEN], uint32_t round,
                                          const uint8_t prev_root[GN_ATTEST_HASH_LEN], int32_t *ret_c),
                          void *ctx, uint8_t *ret_roots) {
  static const uint8_t zero[GN_ATTEST_HASH_LEN];
  int32_t *c = malloc((size_t)p->n * p->n * sizeof(*c));
  int r = GN_ENOMEM;
  if (!c)
    goto out;
  for (uint32_t i = 0; i < p->rounds; i++) {
    const uint8_t *prev = i ? ret_roots + (size_t)(i - 1) * GN_ATTEST_HASH_LEN : zero;
    if ((r = round_fn(ctx, p, nonce, i, prev, c)) < 0)
      goto out;
    if ((r = gn__attest_merkle(c, p->n, NULL, 0, NULL, ret_roots + (size_t)i * GN_ATTEST_HASH_LEN)) < 0)
      goto out;
  }
  r = 0;
out:
  free(c);
  return r;
}

static int cpu_round_output(void *ctx, const gn_attest_params *p, const uint8_t nonce[GN_ATTEST_NONCE_LEN],
                            uint32_t round, const uint8_t prev_root[GN_ATTEST_HASH_LEN], int32_t *ret_c) {
  uint8_t key_a[32], key_b[32];
  (void)ctx;
  gn__attest_round_key(p, nonce, round, prev_root, 'A', key_a);
  gn__attest_round_key(p, nonce, round, prev_root, 'B', key_b);
  return gn__attest_round_full(p, key_a, key_b, ret_c);
}

int gn__attest_cpu_chain(const gn_attest_params *p, const uint8_t nonce[GN_ATTEST_NONCE_LEN], uint8_t *ret_roots) {
  return gn__attest_chain_with(p, nonce, cpu_round_output, NULL, ret_roots);
}

static int cpu_chain(void *ctx, const gn_attest_params *p, const uint8_t nonce[GN_ATTEST_NONCE_LEN],
                     uint8_t *ret_roots) {
  (void)ctx;
  return gn__attest_cpu_chain(p, nonce, ret_roots);
}

static const gn_attest_backend cpu_backend = {
    .name = "cpu",
    .simulated = true,
    .ctx = NULL,
    .chain = cpu_chain,
    .round_output = cpu_round_output,
};

const gn_attest_backend *gn_attest_backend_cpu(void) {
  return &cpu_backend;
}

int gn_attest_params_check(const gn_attest_params *p) {
  if (!p || p->n < GN_ATTEST_N_MIN || p->n > GN_ATTEST_N_MAX || (p->n & (p->n - 1)) != 0)
    return GN_EINVAL;
  if (p->depth < 1 || p->depth > GN_ATTEST_DEPTH_MAX || p->rounds < 1 || p->rounds > GN_ATTEST_ROUNDS_MAX)
    return GN_EINVAL;
  if (p->open_rounds < 1 || p->open_rounds > GN_ATTEST_OPEN_ROUNDS_MAX || p->open_rounds > p->rounds)
    return GN_EINVAL;
  if (p->open_rows < 1 || p->open_rows > GN_ATTEST_OPEN_ROWS_MAX || p->open_rows > p->n)
    return GN_EINVAL;
  if ((uint64_t)p->open_rounds * p->open_rows * p->n * 4u > GN_ATTEST_PROOF_ROW_BYTES_MAX)
    return GN_ETOOBIG;
  return 0;
}

double gn_attest_params_ops(const gn_attest_params *p) {
  double n = p->n;
  return 2.0 * p->depth * n * n * n * p->rounds;
}

/* Decodes an attestation message body: a map of our version carrying a
 * nonce. On success the caller owns doc. */
int gn__attest_open_doc(const uint8_t *msg, size_t len, gn_wire_doc *doc, uint8_t ret_nonce[GN_ATTEST_NONCE_LEN]) {
  uint64_t v;
  int r;
  if (len > GN_MSG_MAX)
    return GN_ETOOBIG;
  if ((r = gn_wire_decode(msg, len, doc)) < 0)
    return r;
  if (doc->root->type != MSGPACK_OBJECT_MAP || (r = gn_wire_get_u64(doc->root, "v", &v)) < 0 ||
      (r = gn_wire_get_bin_exact(doc->root, "nonce", ret_nonce, GN_ATTEST_NONCE_LEN)) < 0) {
    gn_wire_doc_done(doc);
    return r < 0 ? r : GN_EINVAL;
  }
  if (v != GN_ATTEST_VERSION) {
    gn_wire_doc_done(doc);
    return GN_EVERSION;
  }
  return 0;
}
