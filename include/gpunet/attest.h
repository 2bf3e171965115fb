/* GPU attestation: a challenge that only hardware of a claimed class answers in
 * time, checked cheaply on a CPU, plus the signed report a provider attaches to
 * its offers. I/O-free: every step takes bytes, time and randomness in and
 * hands bytes back. See docs/attestation.md for the protocol and its math. */
#ifndef GPUNET_ATTEST_H
#define GPUNET_ATTEST_H

#include <gpunet/base.h>
#include <gpunet/identity.h>
#include <gpunet/offer.h>
#include <gpunet/wire.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define GN_ATTEST_VERSION 1
#define GN_ATTEST_NONCE_LEN 32
#define GN_ATTEST_HASH_LEN 32
#define GN_ATTEST_N_MIN 64u
#define GN_ATTEST_N_MAX 16384u
#define GN_ATTEST_DEPTH_MAX 16u
#define GN_ATTEST_ROUNDS_MAX 65536u
#define GN_ATTEST_OPEN_ROUNDS_MAX 64u
#define GN_ATTEST_OPEN_ROWS_MAX 64u
/* Bytes of opened rows one proof may carry (rows are 4*n bytes each). */
#define GN_ATTEST_PROOF_ROW_BYTES_MAX (4u * 1024u * 1024u)
#define GN_ATTEST_CLASS_STRLEN 32
#define GN_ATTEST_VERDICT_STRLEN 160

/* Envelope types beside the reserved GN_MSG_ATTEST_* (50-53) of wire.h. */
#define GN_MSG_ATTEST_REPORT 54        /* a provider's signed attestation report */
#define GN_MSG_ATTEST_VERDICT 55       /* a verifier's signed verdict on one exchange */
#define GN_MSG_ATTEST_MEM_CHALLENGE 56 /* memory challenge: fill a table */
#define GN_MSG_ATTEST_MEM_READY 57     /* prover: the table is filled */
#define GN_MSG_ATTEST_MEM_WALK 58      /* verifier: walk it now (timed) */
#define GN_MSG_ATTEST_MEM_RESULT 59    /* prover: every walker's result */

/* What the verifier asks for. n is a power of two in [N_MIN, N_MAX]; each
 * round computes depth chained int8 products of n x n matrices; rounds are
 * chained through their Merkle roots. After the roots arrive the verifier
 * opens open_rows distinct rows in each of open_rounds distinct rounds. */
typedef struct gn_attest_params {
  uint32_t n;
  uint32_t depth;
  uint32_t rounds;
  uint32_t open_rounds;
  uint32_t open_rows;
} gn_attest_params;

/* GN_EINVAL unless every field is in range (see the limits above). */
int gn_attest_params_check(const gn_attest_params *p);
/* Multiply-accumulate operations the prover performs, counted as 2 ops per
 * MAC: 2 * depth * n^3 * rounds. */
double gn_attest_params_ops(const gn_attest_params *p);

/* Randomness source, injected so tests and simulators replay exactly. NULL
 * means libsodium's randombytes_buf. */
typedef void (*gn_attest_rng_fn)(void *ctx, uint8_t *buf, size_t len);

/* --- GPU classes ------------------------------------------------------------*/

typedef struct gn_attest_class {
  const char *name;        /* "RTX 4090" */
  const char *match;       /* substring of the NVML/CUDA device name */
  uint32_t memory_mib;     /* nominal memory */
  double bandwidth_gbs;    /* memory bandwidth, GB/s (10^9 bytes) */
  double int8_tops;        /* dense int8 tensor throughput, 10^12 ops/s */
  double min_fraction;     /* measured/peak needed to verify the class */
  double mem_min_fraction; /* the memory walk: measured/nominal bandwidth needed */
  bool measured;           /* the fractions were set from a run on such a card */
} gn_attest_class;

/* By exact name ("RTX 4090") or, failing that, by device name substring
 * ("NVIDIA GeForce RTX 4090"); NULL when unknown. */
const gn_attest_class *gn_attest_class_find(const char *name);
size_t gn_attest_class_count(void);
const gn_attest_class *gn_attest_class_at(size_t index);

/* Challenge parameters for a claimed class: n=4096, depth=4, 16 opened
 * rounds of 4 rows each, and as many rounds as the class needs to spend
 * target_ms at its peak (at least 1). */
int gn_attest_params_for_class(const gn_attest_class *c, uint32_t target_ms, gn_attest_params *ret);

/* --- the verifier's state machine --------------------------------------------*/

typedef enum gn_attest_outcome {
  GN_ATTEST_VERIFIED = 0, /* proof holds and fast enough for the class */
  GN_ATTEST_TOO_SLOW,     /* proof holds, too slow for the class */
  GN_ATTEST_SIMULATED,    /* proof holds, prover said it is simulated */
  GN_ATTEST_FAILED,       /* the proof does not hold: wrong row, bad path... */
} gn_attest_outcome;

typedef struct gn_attest_result {
  gn_attest_outcome outcome;
  char verdict[GN_ATTEST_VERDICT_STRLEN]; /* "verified RTX 4090", ... */
  char claimed_class[GN_ATTEST_CLASS_STRLEN];
  double measured_tops; /* from the verifier's clock */
  double expected_tops; /* min_fraction * class peak */
  uint64_t elapsed_ms;  /* as given by the caller */
  uint64_t prover_ms;   /* the prover's own claim, informative */
  bool simulated;
  uint8_t nonce[GN_ATTEST_NONCE_LEN];
  uint8_t final_root[GN_ATTEST_HASH_LEN];
  uint8_t roots_hash[GN_ATTEST_HASH_LEN]; /* BLAKE2b-256 of all round roots */
} gn_attest_result;

typedef struct gn_attest_verifier gn_attest_verifier;

/* Starts an exchange: draws a nonce from rng and appends the challenge
 * (a GN_MSG_ATTEST_CHALLENGE body) to ret_challenge. claimed_class is the
 * class the provider claims (from its offer), used for the verdict. */
int gn_attest_verifier_new(const gn_attest_params *p, const char *claimed_class, gn_attest_rng_fn rng, void *rng_ctx,
                           gn_buf *ret_challenge, gn_attest_verifier **ret_v);
gn_attest_verifier *gn_attest_verifier_free(gn_attest_verifier *v);
/* Takes the prover's GN_MSG_ATTEST_RESPONSE body, then draws the rows to open
 * from fresh randomness and appends the GN_MSG_ATTEST_OPEN body. GN_EREPLAY
 * when the response answers another nonce, GN_ESTATE when a response was
 * already taken. */
int gn_attest_verifier_on_response(gn_attest_verifier *v, const uint8_t *msg, size_t len, gn_buf *ret_open);
/* Checks the GN_MSG_ATTEST_PROOF body by recomputing every opened row and its
 * Merkle path, then grades the timing. elapsed_ms is the verifier's own
 * measure from sending the challenge to receiving the response. A proof that
 * does not hold yields 0 with outcome GN_ATTEST_FAILED; a negative return means
 * a malformed message or a call in the wrong state. */
int gn_attest_verifier_on_proof(gn_attest_verifier *v, const uint8_t *msg, size_t len, uint64_t elapsed_ms,
                                gn_attest_result *ret);

/* The verdict rule alone: "verified C", "too slow for C (measured X TOPS,
 * expected at least Y TOPS)", or "simulated". Fills outcome, verdict,
 * measured_tops, expected_tops; GN_ENOTFOUND for an unknown class. */
int gn_attest_grade(const gn_attest_params *p, const char *claimed_class, uint64_t elapsed_ms, bool simulated,
                    gn_attest_result *ret);

/* --- the prover -----------------------------------------------------------------*/

/* A compute backend. chain computes every round and writes rounds*32 bytes of
 * roots; round_output writes round r's full n*n int32 output (row-major) given
 * the previous round's root (zeros for round 0), for opening. ctx is the
 * backend's. The CPU backend is gn_attest_backend_cpu(); the CUDA one comes
 * from gn_attest_cuda_open(). */
typedef struct gn_attest_backend {
  const char *name;
  bool simulated; /* results must be graded "simulated" */
  void *ctx;
  int (*chain)(void *ctx, const gn_attest_params *p, const uint8_t nonce[GN_ATTEST_NONCE_LEN], uint8_t *ret_roots);
  int (*round_output)(void *ctx, const gn_attest_params *p, const uint8_t nonce[GN_ATTEST_NONCE_LEN], uint32_t round,
                      const uint8_t prev_root[GN_ATTEST_HASH_LEN], int32_t *ret_c);
} gn_attest_backend;

/* The plain C reference, marked simulated (a CPU is no GPU). */
const gn_attest_backend *gn_attest_backend_cpu(void);

/* Loads libgpunet_attest_cuda.so (env GN_ATTEST_CUDA_LIB, else beside the
 * executable, else the build dir) and binds to CUDA device `device`.
 * GN_EUNSUPPORTED when the library, the CUDA driver or the device is missing. */
int gn_attest_cuda_open(int device, gn_attest_backend **ret);
gn_attest_backend *gn_attest_cuda_close(gn_attest_backend *b);
/* The CUDA device's name ("NVIDIA GeForce RTX 4090"). */
int gn_attest_cuda_device_name(const gn_attest_backend *b, char *buf, size_t cap);

typedef struct gn_attest_prover gn_attest_prover;

/* A prover for one exchange, using backend b (borrowed; it must outlive the
 * prover). */
int gn_attest_prover_new(const gn_attest_backend *b, gn_attest_prover **ret);
gn_attest_prover *gn_attest_prover_free(gn_attest_prover *pr);
/* Challenges costing more than max_ops (gn_attest_params_ops) are refused
 * with GN_ETOOBIG, so a peer cannot make a prover compute for hours. The
 * default, GN_ATTEST_PROVER_MAX_OPS, is about 50 s on an H200. */
#define GN_ATTEST_PROVER_MAX_OPS 1e17
void gn_attest_prover_set_max_ops(gn_attest_prover *pr, double max_ops);
/* Runs the challenge (blocking: put it on a worker thread) and appends the
 * GN_MSG_ATTEST_RESPONSE body. GN_EREPLAY for a nonce this prover already
 * answered, GN_ESTATE if it already answered one challenge. */
int gn_attest_prover_on_challenge(gn_attest_prover *pr, const uint8_t *msg, size_t len, gn_buf *ret_response);
/* Opens the requested rows (recomputing the opened rounds) and appends the
 * GN_MSG_ATTEST_PROOF body. */
int gn_attest_prover_on_open(gn_attest_prover *pr, const uint8_t *msg, size_t len, gn_buf *ret_proof);

/* Runs a whole exchange in-process against backend b (a provider checking
 * its own GPU at start): fresh nonce, prover, verifier, with the time of the
 * prover's answer measured here by gn_mono_ms. Blocking. The result carries
 * no verifier signature; a peer's check is what gives one. */
int gn_attest_run_local(const gn_attest_backend *b, const gn_attest_params *p, const char *claimed_class,
                        gn_attest_result *ret);

/* --- reports ----------------------------------------------------------------------*/

typedef struct gn_attest_gpu {
  char uuid[64]; /* "GPU-8f3c..." from NVML, or "" */
  char name[96]; /* "NVIDIA GeForce RTX 4090" */
  uint32_t memory_mib;
  char pci_bus_id[32]; /* "00000000:01:00.0" */
  char driver[32];     /* "550.54.14" */
} gn_attest_gpu;

/* What a provider attaches to its offers: its GPU, the exchange and the
 * verdict. A report checked by a peer carries the verifier's own signed
 * GN_MSG_ATTEST_VERDICT envelope (verdict_env) and its key. */
typedef struct gn_attest_report {
  gn_attest_gpu gpu;
  gn_attest_params params;
  uint8_t nonce[GN_ATTEST_NONCE_LEN];
  uint8_t final_root[GN_ATTEST_HASH_LEN];
  uint8_t roots_hash[GN_ATTEST_HASH_LEN];
  uint64_t prover_ms;
  uint64_t elapsed_ms; /* whoever graded it measured this */
  char claimed_class[GN_ATTEST_CLASS_STRLEN];
  char verdict[GN_ATTEST_VERDICT_STRLEN];
  bool simulated;
  int64_t issued_s;  /* UTC */
  bool has_verifier; /* a peer checked it: the fields below are set */
  uint8_t verifier[GN_PK_LEN];
  uint8_t *verdict_env; /* malloc'd, owned by the report */
  size_t verdict_env_len;
  int64_t verdict_issued_s; /* when the verifier signed its verdict (its clock) */
  /* Optional (key "lease", absent when NULL): the lease agreement envelope
   * (GN_MSG_LEASE_ACCEPT, signed by provider and requester) by which the
   * verifier leased from the provider after its verdict. Opaque here (the
   * billing module opens it); malloc'd, owned by the report. */
  uint8_t *lease_env;
  size_t lease_env_len;
} gn_attest_report;

#define GN_ATTEST_LEASE_ENV_MAX 2048 /* the agreement a report may carry */

/* Frees what the report holds (verdict_env, lease_env). */
void gn_attest_report_done(gn_attest_report *r);
/* Fills a report from a finished exchange (copies; no verifier yet). */
void gn_attest_report_from_result(gn_attest_report *r, const gn_attest_gpu *gpu, const gn_attest_params *p,
                                  const gn_attest_result *res, int64_t issued_s);

/* A verifier signs its verdict on an exchange with a provider (provider's
 * key): a GN_MSG_ATTEST_VERDICT envelope appended to ret. */
int gn_attest_verdict_seal(const gn_identity *verifier, const uint8_t provider[GN_PK_LEN], const gn_attest_params *p,
                           const gn_attest_result *res, int64_t issued_s, gn_buf *ret);
/* Attaches a verifier's verdict envelope to the provider's report after
 * checking it: signature, nonce, roots and verdict must match the report and
 * provider must be the verdict's subject. */
int gn_attest_report_attach_verdict(gn_attest_report *r, const uint8_t provider[GN_PK_LEN], const uint8_t *env,
                                    size_t len);
/* A provider's report built from a peer's verdict on an exchange with it
 * (the verdict says which challenge, roots and timing; gpu says which card):
 * GN_EPERM when the verdict is about another provider, GN_ESIG when it does
 * not verify. Replaces what r held (r must be zeroed or a valid report). */
int gn_attest_report_from_verdict(gn_attest_report *r, const gn_attest_gpu *gpu, const uint8_t provider[GN_PK_LEN],
                                  const uint8_t *env, size_t len, uint64_t prover_ms, int64_t issued_s);
/* Sets the lease agreement the report carries (a copy; GN_ETOOBIG past
 * GN_ATTEST_LEASE_ENV_MAX, GN_EINVAL for none). */
int gn_attest_report_set_lease(gn_attest_report *r, const uint8_t *env, size_t len);
/* Seals the report as a GN_MSG_ATTEST_REPORT envelope signed by the provider. */
int gn_attest_report_seal(const gn_identity *provider, const gn_attest_report *r, gn_buf *ret);
/* Opens and checks a report envelope (and its verdict envelope when present);
 * ret_provider gets the signer. GN_ESIG for a bad signature on either. The
 * caller frees with gn_attest_report_done. */
int gn_attest_report_open(const uint8_t *env, size_t len, gn_attest_report *ret, uint8_t ret_provider[GN_PK_LEN]);

/* --- the memory challenge (node/attest/attest_mem.c) ---------------------------------------*/

/* The prover fills a table of table_mib MiB with 64-byte entries, each the end
 * of a chain of `cost` ChaCha20 blocks keyed by the nonce, reports ready, then
 * on a fresh seed runs `walkers` walks of `steps` dependent reads each (the
 * next address depends on the entry just read). Only the walk is timed. The
 * verifier recomputes `samples` walkers, regenerating the few entries they
 * touch. Why a card with less memory fails in time: see attest_mem.c. */
typedef struct gn_attest_mem_params {
  uint32_t table_mib; /* 1 .. 262144 */
  uint32_t cost;      /* ChaCha20 blocks per entry, 1 .. 256 */
  uint32_t walkers;   /* 1 .. 2^18 */
  uint32_t steps;     /* 1 .. 2^24 */
  uint32_t samples;   /* walkers the verifier recomputes, 1 .. 64 */
} gn_attest_mem_params;

#define GN_ATTEST_MEM_WALKERS_MAX (1u << 18)
#define GN_ATTEST_MEM_STEPS_MAX (1u << 24)
#define GN_ATTEST_MEM_COST_MAX 256u
#define GN_ATTEST_MEM_TABLE_MIB_MAX 262144u

int gn_attest_mem_params_check(const gn_attest_mem_params *p);
/* Parameters for a class: a table of 7/8 of its memory, cost 32, 2^18
 * walkers and enough steps to read target_ms worth of its bandwidth. */
int gn_attest_mem_params_for_class(const gn_attest_class *c, uint32_t target_ms, gn_attest_mem_params *ret);
/* The bandwidth rule alone: "memory verified C (X GB/s)", "memory too slow
 * for C (measured X GB/s, expected at least Y GB/s)", or "simulated". Reads
 * measured_tops/expected_tops as GB/s. */
int gn_attest_mem_grade(const gn_attest_mem_params *p, const char *claimed_class, uint64_t elapsed_ms, bool simulated,
                        gn_attest_result *ret);

typedef struct gn_attest_mem_verifier gn_attest_mem_verifier;
typedef struct gn_attest_mem_prover gn_attest_mem_prover;

/* Appends the GN_MSG_ATTEST_MEM_CHALLENGE body. */
int gn_attest_mem_verifier_new(const gn_attest_mem_params *p, const char *claimed_class, gn_attest_rng_fn rng,
                               void *rng_ctx, gn_buf *ret_challenge, gn_attest_mem_verifier **ret_v);
gn_attest_mem_verifier *gn_attest_mem_verifier_free(gn_attest_mem_verifier *v);
/* Takes the READY body, appends the WALK body; start the clock when it is
 * sent. GN_EREPLAY for another nonce, GN_ESTATE out of order. */
int gn_attest_mem_verifier_on_ready(gn_attest_mem_verifier *v, const uint8_t *msg, size_t len, gn_buf *ret_walk);
/* Takes the RESULT body and the verifier's elapsed time since the WALK was
 * sent; recomputes the sampled walkers and grades bandwidth. A wrong walker
 * is outcome GN_ATTEST_FAILED with 0 returned. */
int gn_attest_mem_verifier_on_result(gn_attest_mem_verifier *v, const uint8_t *msg, size_t len, uint64_t elapsed_ms,
                                     gn_attest_result *ret);

/* The CPU prover (simulated): holds the table in host memory. max_table_mib
 * bounds what it accepts to allocate (GN_ETOOBIG beyond). */
int gn_attest_mem_prover_new(uint32_t max_table_mib, gn_attest_mem_prover **ret);
/* The GPU prover: the table lives in the memory of the CUDA backend's device
 * (cuda from gn_attest_cuda_open, borrowed). Not simulated. */
int gn_attest_mem_prover_new_cuda(const gn_attest_backend *cuda, uint32_t max_table_mib, gn_attest_mem_prover **ret);
gn_attest_mem_prover *gn_attest_mem_prover_free(gn_attest_mem_prover *pr);
/* Fills the table (blocking) and appends the READY body. */
int gn_attest_mem_prover_on_challenge(gn_attest_mem_prover *pr, const uint8_t *msg, size_t len, gn_buf *ret_ready);
/* Walks (blocking) and appends the RESULT body. */
int gn_attest_mem_prover_on_walk(gn_attest_mem_prover *pr, const uint8_t *msg, size_t len, gn_buf *ret_result);

/* --- exchanges with peers (node/attest/attest_agent.c) ---------------------------------
 *
 * The agent runs both sides of attestation over the network: a provider's
 * self-check of each local GPU model (its sealed report rides on offers), its
 * answers to peers' challenges, and a requester's verification of a provider
 * (compute, then memory challenge, timed by the requester's clock, its signed
 * verdict sent back). It keeps the sessions, the {sid, gpu_model?, data}
 * wrapper, the timeouts and the verdict rules; what it needs of the program
 * around it is gn_attest_io. Every call and callback runs on one thread (the
 * loop's), except gn_attest_task_run on a worker. */

#define GN_ATTEST_TARGET_MS 1000 /* a real GPU's challenges last about this long */
#define GN_ATTEST_LOCAL_MAX 8    /* local GPU models an agent attests */
/* How long a peer has for each challenge: env GN_ATTEST_TIMEOUT_MS (100 ..
 * 3600000), else 120 s. */
uint64_t gn_attest_timeout_ms(void);

typedef struct gn_attest_agent gn_attest_agent;
/* A piece of blocking work (a proof, a table fill, a walk, a recomputation). */
typedef struct gn_attest_task gn_attest_task;

/* What the agent needs of the program around it; ctx (given to
 * gn_attest_agent_new) is every function's first argument. */
typedef struct gn_attest_io {
  /* Sends a sealed envelope to a peer. */
  int (*send)(void *ctx, const uint8_t peer[GN_PK_LEN], const uint8_t *env, size_t len);
  /* Whether a session with peer is up; connect asks for one, after which the
   * program calls gn_attest_agent_peer_up. */
  bool (*is_up)(void *ctx, const uint8_t peer[GN_PK_LEN]);
  void (*connect)(void *ctx, const char *addr);
  /* Runs gn_attest_task_run(t) on a worker thread, then gn_attest_task_done(t,
   * status) back on the agent's thread, after this call has returned (status
   * < 0: it did not run). A negative return means it will not run at all. */
  int (*queue)(void *ctx, gn_attest_task *t);
  /* A line for the program's log (the agent itself never prints). */
  void (*log)(void *ctx, bool warn, const char *line);
  /* Local slot `slot`'s verdict or sealed report changed (offers carry it). */
  void (*changed)(void *ctx, size_t slot);
  /* Optional: whether a GPU of model is free for peer to lease now. A
   * provider answers challenges only for what a challenger could lease;
   * NULL means every local model is. */
  bool (*leasable)(void *ctx, const uint8_t peer[GN_PK_LEN], const char *model);
  /* Optional: the monotonic clock of the per-peer limits and held verdicts
   * (milliseconds); NULL means gn_mono_ms. Injected so tests run an hour
   * in a moment. */
  uint64_t (*now_ms)(void *ctx);
} gn_attest_io;

/* What a provider's agent grants challengers (docs/attestation.md, "Who may
 * challenge"): a challenge must name this provider's offer for the GPU model
 * it challenges (the offer the challenger means to lease; its id is
 * gn_offer_id's, stable across refreshes) while a GPU of it is free; one
 * exchange in flight per peer, GN_ATTEST_PEER_HOURLY challenges per peer in
 * any hour, GN_ATTEST_SESSIONS_MAX exchanges in flight in all (and one proof
 * at a time on the GPU). Peers are remembered for the hourly count up to
 * GN_ATTEST_PEERS_MAX, the least recently seen forgotten first. */
#define GN_ATTEST_PEER_HOURLY 12
#define GN_ATTEST_SESSIONS_MAX 4
#define GN_ATTEST_PEERS_MAX 256
/* A challenger's signed verdict is held, not published, until that same
 * peer leases the challenged model from this provider within
 * GN_ATTEST_LEASE_WINDOW_S of the verdict (gn_attest_agent_lease_agreed);
 * then it becomes the slot's report, with the lease agreement in it. At
 * most one held verdict per peer (the latest) and GN_ATTEST_HELD_MAX in all
 * (the oldest dropped first); a verdict not followed by a lease in time is
 * dropped. */
#define GN_ATTEST_LEASE_WINDOW_S 600
#define GN_ATTEST_HELD_MAX 16

void gn_attest_task_run(gn_attest_task *t);
void gn_attest_task_done(gn_attest_task *t, int status);

/* id signs reports, verdicts and every message; id, io and ctx are borrowed
 * and must outlive the agent (which lives on after gn_attest_agent_shutdown
 * until its last task is done). provide: whether this node answers
 * challenges. */
int gn_attest_agent_new(const gn_identity *id, const gn_attest_io *io, void *ctx, bool provide, gn_attest_agent **ret);
/* Finishes every verification in progress (GN_ECLOSED), drops idle sessions
 * and frees the agent once no task of it is left on the workers (at once when
 * none is). The agent must not be used after this. Accepts NULL. */
void gn_attest_agent_shutdown(gn_attest_agent *a);

/* Adds a local GPU model (gpu->name) proven on CUDA device cuda_device, or by
 * the CPU reference when simulated, and starts its self-check. Returns its
 * slot; GN_EEXIST when the model has one, GN_ETOOBIG past
 * GN_ATTEST_LOCAL_MAX. Without the CUDA kernel the slot says "not attested". */
int gn_attest_agent_add_local(gn_attest_agent *a, const gn_attest_gpu *gpu, int cuda_device, bool simulated);
typedef struct gn_attest_local_view {
  const char *model;
  const char *verdict;   /* "pending", "verified RTX 4090 (self-check)"... */
  const uint8_t *report; /* the sealed GN_MSG_ATTEST_REPORT, NULL while none */
  size_t report_len;
  bool done;
} gn_attest_local_view;
size_t gn_attest_agent_local_count(const gn_attest_agent *a);
/* GN_ENOTFOUND past the last slot. The view is valid until the next call. */
int gn_attest_agent_local(const gn_attest_agent *a, size_t slot, gn_attest_local_view *ret);

/* A verification's end: rc < 0 with err when it could not be run (timeout,
 * refusal, shutdown); otherwise res is the verdict (the worse of compute and
 * memory) and mem the memory challenge's figures, NULL when it did not run. */
typedef void (*gn_attest_verified_fn)(void *ud, int rc, const gn_attest_result *res, const gn_attest_result *mem,
                                      const char *err);
/* Challenges the provider of offer o (its GPU model's class, small simulated
 * parameters for a simulated offer), naming o's offer id as the one this
 * node means to lease. done is called exactly once, never from inside this
 * call, unless this returns an error (GN_ENOTFOUND: no class for the
 * model). */
int gn_attest_agent_verify(gn_attest_agent *a, const gn_offer *o, gn_attest_verified_fn done, void *ud);
/* Attestation messages (GN_MSG_ATTEST_*, and GN_MSG_ERROR answering one of
 * ours); raw is the whole envelope env was opened from. Others are ignored. */
void gn_attest_agent_on_message(gn_attest_agent *a, const uint8_t peer[GN_PK_LEN], const gn_envelope *env,
                                const uint8_t *raw, size_t raw_len);
void gn_attest_agent_peer_up(gn_attest_agent *a, const uint8_t peer[GN_PK_LEN]);
/* Expires sessions past their deadline (gn_mono_ms clock), and held
 * verdicts older than GN_ATTEST_LEASE_WINDOW_S (the io's clock). */
void gn_attest_agent_tick(gn_attest_agent *a, uint64_t now_ms);
/* Verdicts held until their verifier leases (provider). */
size_t gn_attest_agent_held(const gn_attest_agent *a);
/* The provider agreed a lease of model with peer at agreed_s (UTC, this
 * node's clock), its agreement envelope `agreement` (may be NULL): the
 * verdict peer sent on that model, if one is held and was received at most
 * GN_ATTEST_LEASE_WINDOW_S before agreed_s (and not after it), becomes the
 * model's report, carrying the agreement when it fits. Returns 1 when a
 * verdict was published, 0 when none was held for it, or a negative code. */
int gn_attest_agent_lease_agreed(gn_attest_agent *a, const uint8_t peer[GN_PK_LEN], const char *model, int64_t agreed_s,
                                 const uint8_t *agreement, size_t agreement_len);

/* The verdict an offer's attached report states, e.g. "verified RTX 4090
 * (checked by gn…)" or "simulated (self-reported)"; "invalid report" when it
 * does not verify or another node signed it; "" when there is none. */
void gn_attest_offer_verdict(const gn_offer *o, char *buf, size_t cap);

#endif
