/* The provider's side of training jobs (issue 8, items 4, 5, 7;
 * train_prov.c): its policy (config `training`, `jobnet_ports`), the checks
 * of a manifest's `net` section, and for each rank its network namespace
 * with the job network (sandbox/jobnet.c) in it, the rendezvous environment
 * and its /output directory. provider.c calls these hooks; the state of a
 * rank lives here, keyed by its job. */
#ifndef GPUNET_NODE_TRAIN_PROV_H
#define GPUNET_NODE_TRAIN_PROV_H

#include "records.h"

#include <gpunet/offer.h>
#include <gpunet/sandbox.h>
#include <jansson.h>

/* Whether this provider takes ranks of training jobs: config training
 * (-1: when jobs get user namespaces). */
bool gn__train_enabled(const gn_node *n);
/* Sets the offer's training attributes (training, jobnet_ports). */
void gn__train_offer(const gn_node *n, gn_offer *o);
/* {"enabled", "jobnet_ports", "ranks"} for `gpunet status`. */
json_t *gn__train_status_json(const gn_node *n);

/* On the loop, before anything of the job exists: 0 when the manifest's
 * training parts may run here, else GN_EPERM/GN_EINVAL/GN_EBUSY with a
 * reason for the requester (training refused here, a port outside the
 * range or busy, world/rank/peers inconsistent, a bad key or endpoint, no
 * user namespace for /output). An ordinary manifest passes. */
int gn__train_check(gn_node *n, const gn_jobman *m, char *reason, size_t cap);
/* On the loop, once the job exists and before its preparation is queued:
 * keeps what the worker needs (the private key in guarded memory).
 * GN_ENOMEM: the job must fail. A manifest without net or output: 0,
 * nothing kept. */
int gn__train_attach(gn_node *n, gn_job *j, const gn_jobman *m);
/* Whether j has training state (a net or an output). */
bool gn__train_has(const gn_job *j);

/* The worker's part (thread pool, TASK_PREPARE, before the bundle is
 * written): makes the rank's network namespace with lo up, brings the job
 * network up into it, makes /output. Fills spec->netns_path and the rw
 * bind (storage in the rank's state) and adds the rendezvous variables to
 * *env (replacing the same names). GN_* with err on failure; what it made
 * is undone by gn__train_cleanup. No-op for a job without training state. */
int gn__train_prepare(gn_job *j, gn_bundle_spec *spec, char ***env, char *err, size_t cap);
/* The worker's part of the end (TASK_FINISH, after the container is
 * deleted): job network down, namespace unmounted and removed. Keeps
 * /output (the lease holder may still fetch it). */
void gn__train_cleanup(gn_job *j);
/* On the loop once the cleanup is done: forgets the rank. */
void gn__train_detach(gn_job *j);
/* At start (blocking, before any job): what a crashed run left: job
 * network processes, their sockets, namespaces. Jobs never resume across a
 * restart, so every record of this node's is stale. */
void gn__train_remove_stale(gn_node *n);

/* JOB_OUTPUT_GET from peer: answered (JOB_OUTPUT) only to the job's lease
 * holder, from the thread pool: offset 0 makes a new snapshot of the job's
 * /output (a tar: directories and regular files only, never following a
 * link, bounded in entries, depth and bytes), other offsets read the one
 * made; GN_JOB_OUTPUT_CHUNK bytes at most per answer. */
void gn__train_on_output_get(gn_node *n, const uint8_t peer[GN_PK_LEN], const gn_envelope *env);
/* Every few seconds: /output's bytes against the budget (jobs writing it
 * are stopped when all outputs pass store_max or the disk is into its
 * reserve), and the outputs of ended leases' finished jobs removed. */
void gn__train_tick(gn_node *n, int64_t now_s);
/* The seed (docs/protocol.md §3, "JOB_SEED_GET"): a manifest with one has
 * gn__train_check refuse it past the output budget or the free disk;
 * gn__train_attach starts fetching it from the lease holder (JOB_SEED_GET,
 * one chunk in flight) into DATA_DIR/seed/JOB.tar. JOB_SEED from peer:
 * taken only from the lease holder, for a seed being fetched, at the
 * offset asked; more bytes than the manifest's size, a hash not the
 * manifest's, a refusal or GN_SEED_WAIT_MS (120 s) without a chunk fail the
 * job (j->error). */
void gn__train_on_seed(gn_node *n, const uint8_t peer[GN_PK_LEN], const gn_envelope *env);
/* On the loop, the preparation done and successful: true when the job
 * must wait for its seed (fetched, then unpacked into /output on the
 * thread pool: regular files and directories only, modes 0644/0755,
 * within the output budget); gn__provider_job_seeded is called once it is
 * in or has failed (j->error set). false: start (no seed, or unpacked), or
 * fail when j->error is set. */
bool gn__train_seed_wait(gn_node *n, gn_job *j);
/* On the loop when the job is stopped: a seed being fetched is dropped and
 * a job waiting for it comes back (gn__provider_job_seeded) to stop. */
void gn__train_seed_stop(gn_node *n, gn_job *j);
/* provider.c: takes up a job gn__train_seed_wait held (it starts, or ends
 * failed or stopped). */
void gn__provider_job_seeded(gn_node *n, gn_job *j);
/* Output and seed work still on the thread pool (shutdown waits for it). */
bool gn__train_busy(const gn_node *n);

#endif
