/* gpunetd: the gpunet daemon; everything it does starts in daemon.c. */
#include "daemon.h"
#include "pool.h"

#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv) {
  /* libuv reads UV_THREADPOOL_SIZE once, at its first uv_queue_work: pulls,
   * unpacks and runtime calls (at most GN_POOL_PULLS + GN_POOL_CLEANUPS at
   * once) must leave threads for attestation and name lookups. A larger
   * size set by the operator is kept. */
  const char *size = getenv("UV_THREADPOOL_SIZE");
  if (!size || atoi(size) < GN_POOL_THREADS) {
    char v[16];
    snprintf(v, sizeof v, "%d", GN_POOL_THREADS);
    setenv("UV_THREADPOOL_SIZE", v, 1);
  }
  return gn__node_main(argc, argv);
}
