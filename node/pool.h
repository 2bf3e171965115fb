/* The libuv thread pool's shares: pulls and unpacks at most GN_POOL_PULLS
 * at once, runtime kill/delete and bundle removal at most GN_POOL_CLEANUPS,
 * the rest queued (provider.c), so attestation work and name lookups always
 * find a free thread. main.c sizes the pool to at least GN_POOL_THREADS. */
#ifndef GPUNET_NODE_POOL_H
#define GPUNET_NODE_POOL_H

#define GN_POOL_PULLS 4
#define GN_POOL_CLEANUPS 4
#define GN_POOL_THREADS 16

#endif
