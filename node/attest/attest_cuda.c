/* Loads the CUDA attestation kernel (libgpunet_attest_cuda.so) at run time
 * and exposes it as an attestation backend, so gpunetd needs neither a GPU
 * nor the CUDA runtime to start: without them this returns GN_EUNSUPPORTED. */
#include "attest_int.h"

#include <dlfcn.h>
#include <limits.h>
#include <stdio.h>
#include <unistd.h>

#define CUDA_LIB_NAME "libgpunet_attest_cuda.so"
#define CUDA_ABI 2 /* GN_ATTEST_CUDA_ABI in node/attest/cuda/attest_kernel.cu */

/* The library's own codes (node/attest/cuda/attest_kernel.cu). */
enum { E_OK = 0, E_NODEV = -1, E_NOMEM = -2, E_CUDA = -3, E_INVAL = -4 };

typedef struct cuda_backend {
  gn_attest_backend b;
  void *dl;
  int device;
  int cc;
  char name[128];
  int (*chain)(int device, uint32_t n, uint32_t depth, uint32_t rounds, const uint8_t *nonce, uint8_t *roots_out);
  int (*round)(int device, uint32_t n, uint32_t depth, const uint8_t *nonce, uint32_t round, const uint8_t *prev_root,
               int32_t *c_out);
  int (*mem_fill)(int device, uint32_t table_mib, uint32_t cost, const uint8_t *key, void **ret_handle);
  int (*mem_walk)(void *handle, const uint8_t *seed, uint32_t walkers, uint32_t steps, uint8_t *finals_out);
  void (*mem_free)(void *handle);
} cuda_backend;

static int map_err(int e) {
  switch (e) {
  case E_OK:
    return 0;
  case E_NODEV:
    return GN_EUNSUPPORTED;
  case E_NOMEM:
    return GN_ENOMEM;
  case E_INVAL:
    return GN_EINVAL;
  default:
    return GN_EIO;
  }
}

static int cuda_chain(void *ctx, const gn_attest_params *p, const uint8_t nonce[GN_ATTEST_NONCE_LEN],
                      uint8_t *ret_roots) {
  cuda_backend *cb = ctx;
  return map_err(cb->chain(cb->device, p->n, p->depth, p->rounds, nonce, ret_roots));
}

static int cuda_round(void *ctx, const gn_attest_params *p, const uint8_t nonce[GN_ATTEST_NONCE_LEN], uint32_t round,
                      const uint8_t prev_root[GN_ATTEST_HASH_LEN], int32_t *ret_c) {
  cuda_backend *cb = ctx;
  return map_err(cb->round(cb->device, p->n, p->depth, nonce, round, prev_root, ret_c));
}

/* Candidates in order: $GN_ATTEST_CUDA_LIB, beside the executable, the build
 * folder this was configured in. The first that loads wins. */
static void *load_lib(void) {
  const char *env = getenv("GN_ATTEST_CUDA_LIB");
  char path[PATH_MAX + sizeof(CUDA_LIB_NAME) + 1];
  if (env && *env)
    return dlopen(env, RTLD_NOW | RTLD_LOCAL);
  ssize_t len = readlink("/proc/self/exe", path, PATH_MAX);
  if (len > 0) {
    path[len] = '\0';
    char *slash = strrchr(path, '/');
    if (slash) {
      snprintf(slash + 1, sizeof(path) - (size_t)(slash + 1 - path), "%s", CUDA_LIB_NAME);
      void *dl = dlopen(path, RTLD_NOW | RTLD_LOCAL);
      if (dl)
        return dl;
    }
  }
#ifdef GN_ATTEST_CUDA_BUILD_DIR
  snprintf(path, sizeof(path), "%s/%s", GN_ATTEST_CUDA_BUILD_DIR, CUDA_LIB_NAME);
  return dlopen(path, RTLD_NOW | RTLD_LOCAL);
#else
  return NULL;
#endif
}

int gn_attest_cuda_open(int device, gn_attest_backend **ret) {
  int (*abi)(void);
  int (*probe)(int device, char *name, size_t cap, int *ret_cc);
  int r = GN_EUNSUPPORTED;
  cuda_backend *cb = calloc(1, sizeof(*cb));
  if (!cb)
    return GN_ENOMEM;
  if (!(cb->dl = load_lib()))
    goto fail;
  /* POSIX's way to turn a data pointer from dlsym into a function pointer. */
  *(void **)&abi = dlsym(cb->dl, "gn_attest_cuda_abi");
  *(void **)&probe = dlsym(cb->dl, "gn_attest_cuda_probe");
  *(void **)&cb->chain = dlsym(cb->dl, "gn_attest_cuda_chain");
  *(void **)&cb->round = dlsym(cb->dl, "gn_attest_cuda_round");
  *(void **)&cb->mem_fill = dlsym(cb->dl, "gn_attest_cuda_mem_fill");
  *(void **)&cb->mem_walk = dlsym(cb->dl, "gn_attest_cuda_mem_walk");
  *(void **)&cb->mem_free = dlsym(cb->dl, "gn_attest_cuda_mem_free");
  if (!abi || !probe || !cb->chain || !cb->round || !cb->mem_fill || !cb->mem_walk || !cb->mem_free ||
      abi() != CUDA_ABI)
    goto fail;
  if ((r = map_err(probe(device, cb->name, sizeof(cb->name), &cb->cc))) < 0)
    goto fail;
  cb->device = device;
  cb->b.name = "cuda";
  cb->b.simulated = false;
  cb->b.ctx = cb;
  cb->b.chain = cuda_chain;
  cb->b.round_output = cuda_round;
  *ret = &cb->b;
  return 0;
fail:
  if (cb->dl)
    dlclose(cb->dl);
  free(cb);
  return r;
}

gn_attest_backend *gn_attest_cuda_close(gn_attest_backend *b) {
  if (b) {
    cuda_backend *cb = b->ctx;
    dlclose(cb->dl);
    free(cb);
  }
  return NULL;
}

int gn_attest_cuda_device_name(const gn_attest_backend *b, char *buf, size_t cap) {
  if (!b || !buf || cap == 0 || strcmp(b->name, "cuda") != 0)
    return GN_EINVAL;
  const cuda_backend *cb = b->ctx;
  if (strlen(cb->name) >= cap)
    return GN_ETOOBIG;
  memcpy(buf, cb->name, strlen(cb->name) + 1);
  return 0;
}

static const cuda_backend *as_cuda(const gn_attest_backend *b) {
  return b && b->chain == cuda_chain ? b->ctx : NULL;
}

int gn__attest_cuda_mem_fill(const gn_attest_backend *b, const gn_attest_mem_params *p, const uint8_t key[32],
                             void **ret_handle) {
  const cuda_backend *cb = as_cuda(b);
  if (!cb)
    return GN_EINVAL;
  return map_err(cb->mem_fill(cb->device, p->table_mib, p->cost, key, ret_handle));
}

int gn__attest_cuda_mem_walk(const gn_attest_backend *b, void *handle, const uint8_t seed[32],
                             const gn_attest_mem_params *p, uint8_t *ret_finals) {
  const cuda_backend *cb = as_cuda(b);
  if (!cb)
    return GN_EINVAL;
  return map_err(cb->mem_walk(handle, seed, p->walkers, p->steps, ret_finals));
}

void gn__attest_cuda_mem_free(const gn_attest_backend *b, void *handle) {
  const cuda_backend *cb = as_cuda(b);
  if (cb && handle)
    cb->mem_free(handle);
}
