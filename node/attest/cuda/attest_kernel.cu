// The attestation challenge on an NVIDIA GPU: ChaCha20 matrix generation,
// the int8 product on tensor cores (WMMA, sm_75 and newer), the depth chain and
// the BLAKE2b Merkle tree, all on the device, one round after another. Built as
// libgpunet_attest_cuda.so and loaded by node/attest/attest_cuda.c with dlopen; its
// results must equal the CPU reference (node/attest/attest_core.c) bit for bit.
#include <cuda_runtime.h>
#include <mma.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attest_prims.h"

#define GN_CUDA_API extern "C" __attribute__((visibility("default")))

// The ABI the loader checks; bump on any change to the functions below.
#define GN_ATTEST_CUDA_ABI 2

enum { E_OK = 0, E_NODEV = -1, E_NOMEM = -2, E_CUDA = -3, E_INVAL = -4 };

// --- kernels -----------------------------------------------------------------

// One thread: the two ChaCha keys of a round from the nonce and the previous
// root, which lives in device memory so rounds chain without a host trip.
__global__ void k_round_keys(uint32_t n, uint32_t depth, const uint8_t *nonce, uint32_t round, const uint8_t *prev,
                             uint32_t *keys) {
  if (threadIdx.x != 0 || blockIdx.x != 0)
    return;
  uint8_t nb[32], pb[32];
  for (int i = 0; i < 32; i++) {
    nb[i] = nonce[i];
    pb[i] = prev[i];
  }
  gn_prim_round_key(n, depth, nb, round, pb, 'A', keys);
  gn_prim_round_key(n, depth, nb, round, pb, 'B', keys + 8);
}

// One thread per 64-byte ChaCha block: block b is bytes [64b, 64b+64) of the
// row-major int8 matrix, exactly as crypto_stream_chacha20_ietf lays it out.
__global__ void k_chacha(const uint32_t *key, uint32_t nblocks, uint4 *out) {
  uint32_t b = blockIdx.x * blockDim.x + threadIdx.x;
  if (b >= nblocks)
    return;
  uint32_t k[8], o[16];
  for (int i = 0; i < 8; i++)
    k[i] = key[i];
  gn_prim_chacha20_block(k, b, o);
  uint4 *dst = out + (size_t)b * 4;
  dst[0] = make_uint4(o[0], o[1], o[2], o[3]);
  dst[1] = make_uint4(o[4], o[5], o[6], o[7]);
  dst[2] = make_uint4(o[8], o[9], o[10], o[11]);
  dst[3] = make_uint4(o[12], o[13], o[14], o[15]);
}

__global__ void k_quant(const int32_t *c, size_t cells, int8_t *x) {
  size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (e < cells)
    x[e] = gn_prim_quant(c[e]);
}

// C = A * B for n x n row-major int8 A, B and int32 C. A block computes a
// BM x BN tile with WARPS_M x WARPS_N warps, each FM x FN 16x16 fragments.
// Tiles of A and B are staged in shared memory in 16-byte-wide column strips
// ([strip][row][16]), so every fragment pointer is 256-bit aligned as WMMA
// requires, whatever the k offset.
template <int WARPS_M, int WARPS_N, int FM, int FN>
__global__ void __launch_bounds__(WARPS_M *WARPS_N * 32)
    k_gemm(const int8_t *A, const int8_t *B, int32_t *C, uint32_t n) {
  constexpr int BM = WARPS_M * FM * 16, BN = WARPS_N * FN * 16, BK = 64, THREADS = WARPS_M * WARPS_N * 32;
  __shared__ __align__(128) int8_t As[BK / 16][BM][16];
  __shared__ __align__(128) int8_t Bs[BN / 16][BK][16];
  const size_t row0 = (size_t)blockIdx.y * BM, col0 = (size_t)blockIdx.x * BN;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 720
  using namespace nvcuda;
  const int warp = threadIdx.x / 32, wm = warp / WARPS_N, wn = warp % WARPS_N;
  wmma::fragment<wmma::accumulator, 16, 16, 16, int> acc[FM][FN];
  for (int i = 0; i < FM; i++)
    for (int j = 0; j < FN; j++)
      wmma::fill_fragment(acc[i][j], 0);
  for (uint32_t k0 = 0; k0 < n; k0 += BK) {
    for (int c = threadIdx.x; c < BM * (BK / 16); c += THREADS) {
      int r = c / (BK / 16), s = c % (BK / 16);
      *(int4 *)&As[s][r][0] = *(const int4 *)(A + (row0 + r) * n + k0 + s * 16);
    }
    for (int c = threadIdx.x; c < BK * (BN / 16); c += THREADS) {
      int k = c / (BN / 16), s = c % (BN / 16);
      *(int4 *)&Bs[s][k][0] = *(const int4 *)(B + (k0 + k) * (size_t)n + col0 + s * 16);
    }
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < BK / 16; kk++) {
      wmma::fragment<wmma::matrix_a, 16, 16, 16, signed char, wmma::row_major> a[FM];
      wmma::fragment<wmma::matrix_b, 16, 16, 16, signed char, wmma::row_major> b[FN];
      for (int i = 0; i < FM; i++)
        wmma::load_matrix_sync(a[i], (const signed char *)&As[kk][(wm * FM + i) * 16][0], 16);
      for (int j = 0; j < FN; j++)
        wmma::load_matrix_sync(b[j], (const signed char *)&Bs[wn * FN + j][kk * 16][0], 16);
      for (int i = 0; i < FM; i++)
        for (int j = 0; j < FN; j++)
          wmma::mma_sync(acc[i][j], a[i], b[j], acc[i][j]);
    }
    __syncthreads();
  }
  for (int i = 0; i < FM; i++)
    for (int j = 0; j < FN; j++)
      wmma::store_matrix_sync(C + (row0 + (wm * FM + i) * 16) * n + col0 + (wn * FN + j) * 16, acc[i][j], n,
                              wmma::mem_row_major);
#else
  // No int8 tensor cores (never built: CMake targets sm_75+); kept so the
  // file compiles for any architecture. One thread per output of the tile.
  (void)As;
  (void)Bs;
  for (int c = threadIdx.x; c < BM * BN; c += THREADS) {
    size_t i = row0 + c / BN, j = col0 + c % BN;
    int32_t s = 0;
    for (uint32_t k = 0; k < n; k++)
      s += (int32_t)A[i * n + k] * (int32_t)B[(size_t)k * n + j];
    C[i * n + j] = s;
  }
#endif
}

// Rows are hashed in chunks of GN_CHUNK int32 (node/attest/attest_int.h,
// GN__ATTEST_CHUNK): one thread per chunk, then one per row over its chunk
// hashes, so n*n/256 threads share the work instead of n. The GPU is
// little-endian, as is the reference's byte order.
#define GN_CHUNK 256u

__global__ void k_chunks(const int32_t *c, uint32_t chunk, size_t count, uint64_t *out) {
  size_t t = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (t >= count)
    return;
  gn_prim_b2b256((const uint64_t *)(c + t * chunk), (size_t)chunk * 4u, out + t * 4);
}

__global__ void k_leaves(const uint64_t *chunk_hashes, uint32_t n, uint32_t chunks, uint64_t *tree) {
  uint32_t row = blockIdx.x * blockDim.x + threadIdx.x;
  if (row >= n)
    return;
  gn_prim_b2b256(chunk_hashes + (size_t)row * chunks * 4, (size_t)chunks * 32u, tree + (size_t)row * 4);
}

// One thread per parent: BLAKE2b-256(left || right), children adjacent.
__global__ void k_level(const uint64_t *children, uint32_t parents, uint64_t *out) {
  uint32_t i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= parents)
    return;
  gn_prim_b2b256(children + (size_t)i * 8, 64, out + (size_t)i * 4);
}

// --- host side ---------------------------------------------------------------

typedef struct dev_bufs {
  uint32_t n;
  int8_t *a, *b, *x;
  int32_t *c;
  uint64_t *tree;   // 2n-1 nodes of 4 words: leaves first, root last
  uint64_t *chunks; // n * chunks-per-row hashes of 4 words
  uint32_t *keys;   // 16 words: key A, key B
  uint8_t *nonce, *prev;
  cudaStream_t s;
} dev_bufs;

static void bufs_free(dev_bufs *d) {
  cudaFree(d->a);
  cudaFree(d->b);
  cudaFree(d->x);
  cudaFree(d->c);
  cudaFree(d->tree);
  cudaFree(d->chunks);
  cudaFree(d->keys);
  cudaFree(d->nonce);
  cudaFree(d->prev);
  if (d->s)
    cudaStreamDestroy(d->s);
  memset(d, 0, sizeof(*d));
}

static int bufs_alloc(dev_bufs *d, uint32_t n) {
  size_t cells = (size_t)n * n;
  memset(d, 0, sizeof(*d));
  d->n = n;
  if (cudaMalloc(&d->a, cells) != cudaSuccess || cudaMalloc(&d->b, cells) != cudaSuccess ||
      cudaMalloc(&d->x, cells) != cudaSuccess || cudaMalloc(&d->c, cells * 4) != cudaSuccess ||
      cudaMalloc(&d->tree, (size_t)(2 * n) * 32) != cudaSuccess ||
      cudaMalloc(&d->chunks, (size_t)n * (n < GN_CHUNK ? 1 : n / GN_CHUNK) * 32) != cudaSuccess ||
      cudaMalloc(&d->keys, 64) != cudaSuccess || cudaMalloc(&d->nonce, 32) != cudaSuccess ||
      cudaMalloc(&d->prev, 32) != cudaSuccess ||
      cudaStreamCreateWithFlags(&d->s, cudaStreamNonBlocking) != cudaSuccess) {
    bufs_free(d);
    return E_NOMEM;
  }
  return E_OK;
}

static void launch_gemm(const int8_t *a, const int8_t *b, int32_t *c, uint32_t n, cudaStream_t s) {
  if (n % 128 == 0) {
    dim3 grid(n / 128, n / 128);
    k_gemm<2, 4, 4, 2><<<grid, 256, 0, s>>>(a, b, c, n);
  } else {
    dim3 grid(n / 64, n / 64);
    k_gemm<2, 2, 2, 2><<<grid, 128, 0, s>>>(a, b, c, n);
  }
}

// Queues one round: keys from prev (device), A and B, the depth chain into
// d->c and, if tree, the Merkle tree whose root ends at node 2n-2.
static void launch_round(dev_bufs *d, uint32_t depth, uint32_t round, const uint8_t *prev, bool tree) {
  uint32_t n = d->n, nblocks = (uint32_t)((size_t)n * n / 64);
  cudaStream_t s = d->s;
  k_round_keys<<<1, 1, 0, s>>>(n, depth, d->nonce, round, prev, d->keys);
  k_chacha<<<(nblocks + 255) / 256, 256, 0, s>>>(d->keys, nblocks, (uint4 *)d->a);
  k_chacha<<<(nblocks + 255) / 256, 256, 0, s>>>(d->keys + 8, nblocks, (uint4 *)d->b);
  const int8_t *x = d->a;
  for (uint32_t j = 0; j < depth; j++) {
    launch_gemm(x, d->b, d->c, n, s);
    if (j + 1 < depth) {
      size_t cells = (size_t)n * n;
      k_quant<<<(unsigned)((cells + 255) / 256), 256, 0, s>>>(d->c, cells, d->x);
      x = d->x;
    }
  }
  if (!tree)
    return;
  uint32_t chunk = n < GN_CHUNK ? n : GN_CHUNK, per_row = n / chunk;
  size_t count = (size_t)n * per_row;
  k_chunks<<<(unsigned)((count + 127) / 128), 128, 0, s>>>(d->c, chunk, count, d->chunks);
  k_leaves<<<(n + 127) / 128, 128, 0, s>>>(d->chunks, n, per_row, d->tree);
  size_t base = 0;
  for (uint32_t width = n; width > 1; width /= 2) {
    k_level<<<(width / 2 + 127) / 128, 128, 0, s>>>(d->tree + base * 4, width / 2, d->tree + (base + width) * 4);
    base += width;
  }
}

static bool params_ok(uint32_t n, uint32_t depth) {
  return n >= 64 && n <= 16384 && (n & (n - 1)) == 0 && depth >= 1 && depth <= 16;
}

GN_CUDA_API int gn_attest_cuda_abi(void) {
  return GN_ATTEST_CUDA_ABI;
}

// 0 and the device's name and compute capability, or E_NODEV when there is
// no such device, no driver, or a device without int8 tensor cores.
GN_CUDA_API int gn_attest_cuda_probe(int device, char *name, size_t cap, int *ret_cc) {
  int count = 0;
  cudaDeviceProp prop;
  if (cudaGetDeviceCount(&count) != cudaSuccess || device < 0 || device >= count)
    return E_NODEV;
  if (cudaGetDeviceProperties(&prop, device) != cudaSuccess)
    return E_NODEV;
  if (name && cap) {
    strncpy(name, prop.name, cap - 1);
    name[cap - 1] = '\0';
  }
  if (ret_cc)
    *ret_cc = prop.major * 10 + prop.minor;
  return prop.major * 10 + prop.minor >= 75 ? E_OK : E_NODEV;
}

// Every round of the challenge; roots_out gets rounds*32 bytes.
GN_CUDA_API int gn_attest_cuda_chain(int device, uint32_t n, uint32_t depth, uint32_t rounds, const uint8_t *nonce,
                                     uint8_t *roots_out) {
  dev_bufs d;
  uint8_t *roots = NULL;
  int r;
  if (!params_ok(n, depth) || rounds == 0 || !nonce || !roots_out)
    return E_INVAL;
  if (cudaSetDevice(device) != cudaSuccess)
    return E_NODEV;
  if ((r = bufs_alloc(&d, n)) < 0)
    return r;
  if (cudaMalloc(&roots, (size_t)rounds * 32) != cudaSuccess) {
    r = E_NOMEM;
    goto out;
  }
  r = E_CUDA;
  if (cudaMemcpyAsync(d.nonce, nonce, 32, cudaMemcpyHostToDevice, d.s) != cudaSuccess ||
      cudaMemsetAsync(d.prev, 0, 32, d.s) != cudaSuccess)
    goto out;
  for (uint32_t i = 0; i < rounds; i++) {
    const uint8_t *prev = i ? roots + (size_t)(i - 1) * 32 : d.prev;
    launch_round(&d, depth, i, prev, true);
    cudaMemcpyAsync(roots + (size_t)i * 32, d.tree + (size_t)(2 * n - 2) * 4, 32, cudaMemcpyDeviceToDevice, d.s);
  }
  if (cudaGetLastError() != cudaSuccess ||
      cudaMemcpyAsync(roots_out, roots, (size_t)rounds * 32, cudaMemcpyDeviceToHost, d.s) != cudaSuccess ||
      cudaStreamSynchronize(d.s) != cudaSuccess)
    goto out;
  r = E_OK;
out:
  cudaFree(roots);
  bufs_free(&d);
  return r;
}

// One round's full output (n*n int32, row-major) for opening rows.
GN_CUDA_API int gn_attest_cuda_round(int device, uint32_t n, uint32_t depth, const uint8_t *nonce, uint32_t round,
                                     const uint8_t *prev_root, int32_t *c_out) {
  dev_bufs d;
  int r;
  if (!params_ok(n, depth) || !nonce || !prev_root || !c_out)
    return E_INVAL;
  if (cudaSetDevice(device) != cudaSuccess)
    return E_NODEV;
  if ((r = bufs_alloc(&d, n)) < 0)
    return r;
  r = E_CUDA;
  if (cudaMemcpyAsync(d.nonce, nonce, 32, cudaMemcpyHostToDevice, d.s) != cudaSuccess ||
      cudaMemcpyAsync(d.prev, prev_root, 32, cudaMemcpyHostToDevice, d.s) != cudaSuccess)
    goto out;
  launch_round(&d, depth, round, d.prev, false);
  if (cudaGetLastError() != cudaSuccess ||
      cudaMemcpyAsync(c_out, d.c, (size_t)n * n * 4, cudaMemcpyDeviceToHost, d.s) != cudaSuccess ||
      cudaStreamSynchronize(d.s) != cudaSuccess)
    goto out;
  r = E_OK;
out:
  bufs_free(&d);
  return r;
}

// --- the memory challenge (node/attest/attest_mem.c) ----------------------------------

// One thread per entry (grid-stride: tables exceed 2^31 entries on big cards):
// ChaCha20 block i of the table key, then cost-1 blocks each keyed by the
// previous block's first 32 bytes.
__global__ void k_mem_fill(const uint32_t *key, uint64_t entries, uint32_t cost, uint4 *table) {
  uint32_t k0[8];
  for (int i = 0; i < 8; i++)
    k0[i] = key[i];
  for (uint64_t e = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; e < entries;
       e += (uint64_t)gridDim.x * blockDim.x) {
    uint32_t o[16];
    gn_prim_chacha20_block(k0, (uint32_t)e, o);
    for (uint32_t j = 1; j < cost; j++) {
      uint32_t k[8];
      for (int i = 0; i < 8; i++)
        k[i] = o[i];
      gn_prim_chacha20_block(k, 0, o);
    }
    uint4 *dst = table + e * 4;
    dst[0] = make_uint4(o[0], o[1], o[2], o[3]);
    dst[1] = make_uint4(o[4], o[5], o[6], o[7]);
    dst[2] = make_uint4(o[8], o[9], o[10], o[11]);
    dst[3] = make_uint4(o[12], o[13], o[14], o[15]);
  }
}

// One thread per walker, exactly gn__attest_mem_walk: the next address is a
// function of the entry just read, so each walker waits on its own reads and
// the card's bandwidth comes from running many walkers at once.
__global__ void k_mem_walk(const uint4 *table, uint64_t entries, const uint32_t *seed, uint32_t walkers, uint32_t steps,
                           uint64_t *finals) {
  uint32_t w = blockIdx.x * blockDim.x + threadIdx.x;
  if (w >= walkers)
    return;
  uint32_t k[8], o[16];
  for (int i = 0; i < 8; i++)
    k[i] = seed[i];
  gn_prim_chacha20_block(k, w, o);
  uint64_t acc = (uint64_t)o[0] | ((uint64_t)o[1] << 32);
  for (uint32_t s = 0; s < steps; s++) {
    uint64_t idx = ((acc >> 32) * entries) >> 32;
    const uint4 *e = table + idx * 4;
    uint4 a = e[0], b = e[1], c = e[2], d = e[3];
    uint64_t lo = (uint64_t)(a.x ^ a.z ^ b.x ^ b.z ^ c.x ^ c.z ^ d.x ^ d.z);
    uint64_t hi = (uint64_t)(a.y ^ a.w ^ b.y ^ b.w ^ c.y ^ c.w ^ d.y ^ d.w);
    acc ^= lo | (hi << 32);
    acc = ((acc << 23) | (acc >> 41)) * 0x9e3779b97f4a7c15ull + s;
  }
  finals[w] = acc;
}

typedef struct mem_table {
  int device;
  uint64_t entries;
  uint4 *table;
  uint32_t *words; // key or seed, 8 words
  cudaStream_t s;
} mem_table;

GN_CUDA_API void gn_attest_cuda_mem_free(void *handle) {
  mem_table *m = (mem_table *)handle;
  if (!m)
    return;
  cudaSetDevice(m->device);
  cudaFree(m->table);
  cudaFree(m->words);
  if (m->s)
    cudaStreamDestroy(m->s);
  free(m);
}

// Allocates and fills a table of table_mib MiB on the device; *ret_handle
// keeps it for the walk.
GN_CUDA_API int gn_attest_cuda_mem_fill(int device, uint32_t table_mib, uint32_t cost, const uint8_t *key,
                                        void **ret_handle) {
  if (table_mib == 0 || cost == 0 || !key || !ret_handle)
    return E_INVAL;
  if (cudaSetDevice(device) != cudaSuccess)
    return E_NODEV;
  mem_table *m = (mem_table *)calloc(1, sizeof(*m));
  if (!m)
    return E_NOMEM;
  m->device = device;
  m->entries = (uint64_t)table_mib * (1024u * 1024u / 64u);
  if (cudaMalloc(&m->table, (size_t)m->entries * 64u) != cudaSuccess || cudaMalloc(&m->words, 32) != cudaSuccess ||
      cudaStreamCreateWithFlags(&m->s, cudaStreamNonBlocking) != cudaSuccess) {
    gn_attest_cuda_mem_free(m);
    return E_NOMEM;
  }
  int sms = 0;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  unsigned blocks = (unsigned)(sms > 0 ? sms * 32 : 1024);
  if (cudaMemcpyAsync(m->words, key, 32, cudaMemcpyHostToDevice, m->s) != cudaSuccess) {
    gn_attest_cuda_mem_free(m);
    return E_CUDA;
  }
  k_mem_fill<<<blocks, 256, 0, m->s>>>(m->words, m->entries, cost, m->table);
  if (cudaGetLastError() != cudaSuccess || cudaStreamSynchronize(m->s) != cudaSuccess) {
    gn_attest_cuda_mem_free(m);
    return E_CUDA;
  }
  *ret_handle = m;
  return E_OK;
}

// Runs every walker over a filled table; finals_out gets walkers * 8 bytes
// (little-endian, as the GPU stores them).
GN_CUDA_API int gn_attest_cuda_mem_walk(void *handle, const uint8_t *seed, uint32_t walkers, uint32_t steps,
                                        uint8_t *finals_out) {
  mem_table *m = (mem_table *)handle;
  uint64_t *finals = NULL;
  int r = E_CUDA;
  if (!m || !seed || !finals_out || walkers == 0)
    return E_INVAL;
  if (cudaSetDevice(m->device) != cudaSuccess)
    return E_NODEV;
  if (cudaMalloc(&finals, (size_t)walkers * 8u) != cudaSuccess)
    return E_NOMEM;
  if (cudaMemcpyAsync(m->words, seed, 32, cudaMemcpyHostToDevice, m->s) != cudaSuccess)
    goto out;
  k_mem_walk<<<(walkers + 127) / 128, 128, 0, m->s>>>(m->table, m->entries, m->words, walkers, steps, finals);
  if (cudaGetLastError() != cudaSuccess ||
      cudaMemcpyAsync(finals_out, finals, (size_t)walkers * 8u, cudaMemcpyDeviceToHost, m->s) != cudaSuccess ||
      cudaStreamSynchronize(m->s) != cudaSuccess)
    goto out;
  r = E_OK;
out:
  cudaFree(finals);
  return r;
}
