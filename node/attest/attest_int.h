/* Private to the attestation module (gpunet_attest): the challenge's math
 * (matrix derivation, the CPU product, the Merkle tree) shared by the
 * protocol, the CPU backend, the CUDA loader, tests and benches. */
#ifndef GPUNET_ATTEST_INT_H
#define GPUNET_ATTEST_INT_H

#include <gpunet/attest.h>
#include <gpunet/wire.h>

/* Domain string of every key derivation; the CUDA kernel hard-codes the same
 * bytes (node/attest/cuda/attest_prims.h). */
#define GN__ATTEST_DOMAIN "gpunet-attest-v1"
#define GN__ATTEST_DOMAIN_LEN 16

/* The ChaCha20 keys of round r's matrices: BLAKE2b-256 of domain || role
 * ('A' or 'B') || le32 round || le32 n || le32 depth || nonce || prev_root
 * (93 bytes). prev_root is round r-1's Merkle root, zeros for round 0. */
void gn__attest_round_key(const gn_attest_params *p, const uint8_t nonce[GN_ATTEST_NONCE_LEN], uint32_t round,
                          const uint8_t prev_root[GN_ATTEST_HASH_LEN], char role, uint8_t ret_key[32]);

/* Rows [row, row+nrows) of the n x n int8 matrix that is the ChaCha20-IETF
 * keystream of key (nonce zero, counter 0), read row-major. n % 64 == 0. */
void gn__attest_matrix_rows(const uint8_t key[32], uint32_t n, uint32_t row, uint32_t nrows, int8_t *out);

/* The elementwise map from one product's int32 results to the next
 * product's int8 inputs: the low byte of x ^ (x >> 8) ^ (x >> 16) ^ (x >> 24)
 * on the two's-complement bits, so the whole 32-bit sum matters. */
static inline int8_t gn__attest_quant(int32_t x) {
  uint32_t u = (uint32_t)x;
  return (int8_t)(uint8_t)(u ^ (u >> 8) ^ (u >> 16) ^ (u >> 24));
}

/* c (nrows x n int32) = a (nrows x n int8) * b (n x n int8), exactly. */
void gn__attest_gemm(const int8_t *a, const int8_t *b, int32_t *c, uint32_t nrows, uint32_t n);

/* One round's output rows [row, row+nrows): X0 = A rows, X(j+1) =
 * quant(Xj * B), output = X(depth-1) * B in int32. b is the full B; a the
 * A rows; scratch holds nrows*n int8. */
void gn__attest_round_rows(const gn_attest_params *p, const int8_t *a, const int8_t *b, int32_t *out, uint32_t nrows,
                           int8_t *scratch);

/* Computes the full output of a round into c (n*n int32). GN_ENOMEM. */
int gn__attest_round_full(const gn_attest_params *p, const uint8_t key_a[32], const uint8_t key_b[32], int32_t *c);

/* Merkle tree over the n rows of c. A row is 4n bytes of little-endian int32
 * cut into chunks of GN__ATTEST_CHUNK elements (the whole row when shorter);
 * leaf = BLAKE2b-256 of the concatenated BLAKE2b-256 of each chunk, so a GPU
 * hashes with n*n/256 threads rather than n; node = BLAKE2b-256(left ||
 * right). n is a power of two, so the tree is perfect, of fixed depth, and
 * every path has log2(n) siblings, leaf side first. */
#define GN__ATTEST_CHUNK 256u
void gn__attest_leaf_hash(const int32_t *row, uint32_t n, uint8_t ret[GN_ATTEST_HASH_LEN]);
/* Builds the tree; ret_root gets the root; if path_rows/ret_paths are given,
 * also the paths of those rows (count entries of log2(n)*32 bytes). */
int gn__attest_merkle(const int32_t *c, uint32_t n, const uint32_t *path_rows, size_t count, uint8_t *ret_paths,
                      uint8_t ret_root[GN_ATTEST_HASH_LEN]);
/* 0 if the leaf hash with path leads to root, GN_EDIGEST otherwise. */
int gn__attest_merkle_check(const uint8_t leaf[GN_ATTEST_HASH_LEN], uint32_t n, uint32_t row, const uint8_t *path,
                            const uint8_t root[GN_ATTEST_HASH_LEN]);
uint32_t gn__attest_log2(uint32_t n);

/* BLAKE2b-256 of all round roots, as carried in reports. */
void gn__attest_roots_hash(const uint8_t *roots, uint32_t rounds, uint8_t ret[GN_ATTEST_HASH_LEN]);

/* The verifier's recomputation of output row `row` of round `round`: derives
 * A's row and all of B from the keys and runs the depth chain on one row. */
int gn__attest_row_expected(const gn_attest_params *p, const uint8_t nonce[GN_ATTEST_NONCE_LEN], uint32_t round,
                            const uint8_t prev_root[GN_ATTEST_HASH_LEN], uint32_t row, int32_t *ret_row);

/* Whole-chain CPU computation: writes rounds*32 bytes of roots. */
int gn__attest_cpu_chain(const gn_attest_params *p, const uint8_t nonce[GN_ATTEST_NONCE_LEN], uint8_t *ret_roots);

/* The prover's per-round hook for tests: a backend whose output rows are
 * damaged on purpose (see tests/attest/test_attest.c) needs the same pieces. */
int gn__attest_chain_with(const gn_attest_params *p, const uint8_t nonce[GN_ATTEST_NONCE_LEN],
                          int (*round_fn)(void *ctx, const gn_attest_params *p,
                                          const uint8_t nonce[GN_ATTEST_NONCE_LEN], uint32_t round,
                                          const uint8_t prev_root[GN_ATTEST_HASH_LEN], int32_t *ret_c),
                          void *ctx, uint8_t *ret_roots);

/* --- the memory challenge (attest_mem.c) ---------------------------------------*/

/* Table key: BLAKE2b-256("gpunet-attest-mem-v1" || nonce || le32 table_mib ||
 * le32 cost). */
void gn__attest_mem_key(const gn_attest_mem_params *p, const uint8_t nonce[GN_ATTEST_NONCE_LEN], uint8_t ret_key[32]);
/* Entry `index` of the table: ChaCha20 block `index` of key, then cost-1
 * times the block of the previous block's first 32 bytes as key. */
void gn__attest_mem_entry(const uint8_t key[32], uint32_t index, uint32_t cost, uint8_t ret[64]);
/* Entries in the table: table_mib * 2^20 / 64. */
uint64_t gn__attest_mem_entries(const gn_attest_mem_params *p);
/* Walker w's final accumulator. get(ctx, index, ret) supplies entries, from a
 * table (the prover) or regenerated (the verifier). */
uint64_t gn__attest_mem_walk(const gn_attest_mem_params *p, const uint8_t seed[32], uint32_t walker,
                             void (*get)(void *ctx, uint32_t index, uint8_t ret[64]), void *ctx);

/* The CUDA library's memory-challenge entry points, through the backend from
 * gn_attest_cuda_open (GN_EINVAL for any other backend). */
int gn__attest_cuda_mem_fill(const gn_attest_backend *b, const gn_attest_mem_params *p, const uint8_t key[32],
                             void **ret_handle);
int gn__attest_cuda_mem_walk(const gn_attest_backend *b, void *handle, const uint8_t seed[32],
                             const gn_attest_mem_params *p, uint8_t *ret_finals);
void gn__attest_cuda_mem_free(const gn_attest_backend *b, void *handle);

/* Opens an attestation message body (map, version, nonce), used by the
 * compute and the memory challenge alike. The caller frees doc on success. */
int gn__attest_open_doc(const uint8_t *msg, size_t len, gn_wire_doc *doc, uint8_t ret_nonce[GN_ATTEST_NONCE_LEN]);

#endif
