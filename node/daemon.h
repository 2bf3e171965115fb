/* What main.c needs of the daemon (daemon.c), and the thread pool's shares. */
#ifndef GPUNET_NODE_DAEMON_H
#define GPUNET_NODE_DAEMON_H

#define GN_VERSION "0.1.0"
/* The thread pool: pulls and unpacks at most GN_POOL_PULLS at once, runtime
 * kill/delete and bundle removal at most GN_POOL_CLEANUPS, the rest queued,
 * so attestation work and name lookups always find a free thread. main.c
 * sizes the pool to at least GN_POOL_THREADS. */
#define GN_POOL_PULLS 4
#define GN_POOL_CLEANUPS 4
#define GN_POOL_THREADS 16

/* gpunetd: runs until a signal; the process's exit code. */
int gn__node_main(int argc, char **argv);

#endif
