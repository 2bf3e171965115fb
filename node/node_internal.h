/* Private state of one gpunetd: the node, its leases and jobs, shared by
 * the daemon's files (daemon.c, provider.c, requester.c, api.c, jobmsg.c). */
#ifndef GPUNET_NODE_INTERNAL_H
#define GPUNET_NODE_INTERNAL_H

#include <gpunet/attest.h>
#include <gpunet/billing.h>
#include <gpunet/discovery.h>
#include <gpunet/identity.h>
#include <gpunet/lease.h>
#include <gpunet/node.h>
#include <gpunet/offer.h>
#include <gpunet/sandbox.h>
#include <gpunet/transport.h>
#include <gpunet/wire.h>
#include <jansson.h>
#include <sqlite3.h>
#include <stdbool.h>
#include <uv.h>

#define GN_VERSION "0.1.0"
#define GN_JOB_ID_STRLEN 24
#define GN_JOB_MAX_ARGS 64
#define GN_JOB_MAX_ARG_LEN 4096
#define GN_JOB_LOG_CHUNK 32768
#define GN_MANIFEST_MAX_TTL_S 600    /* a manifest may live at most this long */
#define GN_JOB_LOG_MAX (64ull << 20) /* output kept per job, on either side */
#define GN_LEASE_MAX_JOBS 8          /* jobs pulling or running at once on one lease */
#define GN_OFFER_TTL_S 60
#define GN_OFFER_REFRESH_S 20
/* The thread pool: pulls and unpacks at most GN_POOL_PULLS at once, runtime
 * kill/delete and bundle removal at most GN_POOL_CLEANUPS, the rest queued,
 * so attestation work and name lookups always find a free thread. main.c
 * sizes the pool to at least GN_POOL_THREADS. */
#define GN_POOL_PULLS 4
#define GN_POOL_CLEANUPS 4
#define GN_POOL_THREADS 16
/* User namespaces: lease slot s maps the job's ids 0..65535 to host ids
 * GN_USERNS_BASE + s * GN_USERNS_SIZE onwards. */
#define GN_USERNS_BASE (1u << 20)
#define GN_USERNS_SIZE 65536u
#define GN_USERNS_SLOTS ((uint32_t)((UINT32_MAX - GN_USERNS_BASE) / GN_USERNS_SIZE))

typedef enum gn_role { GN_ROLE_PROVIDER = 1, GN_ROLE_REQUESTER = 2 } gn_role;
typedef enum gn_lease_state { GN_LEASE_ACTIVE = 1, GN_LEASE_ENDED = 2 } gn_lease_state;

typedef enum gn_job_state {
  GN_JOB_PENDING = 0,
  GN_JOB_PULLING,
  GN_JOB_RUNNING,
  GN_JOB_EXITED,
  GN_JOB_FAILED,
  GN_JOB_STOPPED,
  GN_JOB_REJECTED,
} gn_job_state;

typedef struct gn_node gn_node;
typedef struct gn_job gn_job;

/* Attestation of one local GPU model (provider), as the offers and the API
 * show it: attest_net.c keeps it a copy of the attestation agent's slot. */
#define GN_ATTEST_MODELS GN_ATTEST_LOCAL_MAX
typedef struct gn_attest_local {
  char model[96];
  char verdict[GN_ATTEST_VERDICT_STRLEN];
  gn_buf report_env; /* sealed GN_MSG_ATTEST_REPORT, attached to offers */
} gn_attest_local;

typedef void (*gn_attest_done_fn)(gn_node *n, void *ud, int rc, const gn_attest_result *res, const char *err);

typedef struct gn_lease {
  struct gn_lease *next;
  char id[GN_LEASE_ID_STRLEN];
  gn_role role;
  uint8_t peer[GN_PK_LEN];
  gn_agreement ag;
  gn_buf agreement_env;
  gn_lease_state state;
  uint64_t start_mono_ms; /* requester: our own observation of the lease start (a lease without machine) */
  uint64_t end_mono_ms;
  uint64_t seconds; /* provider: ticks written; requester: seconds observed */
  int64_t end_s;
  char end_reason[128];
  int gpu_index[GN_LEASE_MAX_GPUS]; /* provider: which local GPUs */
  int uid_slot;                     /* provider: user namespace slot, -1 when none is held */
  bool invoice_done;                /* the final invoice was answered */
  /* requester: our own UTC when the agreement arrived. The observation of
   * the lease (observed_s, against which every note is checked) is measured
   * from it, also after a restart; never from the provider's start_s. */
  int64_t received_s;
  uint64_t max_spend_micro;     /* requester: spending cap, 0 = none */
  uint64_t max_price_uper_hour; /* requester: the most it agreed to pay, 0 = none given */
  /* The lease's state machine (include/gpunet/lease.h): the protocol lives
   * there; provider.c and requester.c feed it messages and time and do
   * what it asks. NULL for a lease settled before this run (a record). */
  struct gn_lease_prov *prov;
  struct gn_lease_req *req;
  uint64_t timer_at_ms;                    /* call the machine's timer then (UINT64_MAX: none) */
  char invoice_id[GN_LEASE_ID_STRLEN];     /* "i-" + 16 hex of the final invoice's hash, "" before it */
  char invoice_status[16];                 /* "issued", "accepted", "rejected", "" */
  uint64_t invoice_seconds, invoice_micro; /* what the final invoice bills (cumulative), once known */
} gn_lease;

typedef struct gn_node gn_node;

/* An API request waiting for a peer's answer. */
typedef struct gn_pending {
  struct gn_pending *next;
  gn_node *node;
  gn_ctl_req *req;
  int kind; /* GN_PENDING_* */
  char key[GN_LEASE_ID_STRLEN + 8];
  uint8_t peer[GN_PK_LEN];
  gn_buf msg; /* envelope to send once the peer is up */
  uint64_t deadline_ms;
  void *data;
} gn_pending;

enum { GN_PENDING_RENT = 1, GN_PENDING_JOB, GN_PENDING_RELEASE, GN_PENDING_LOGS };

struct gn_job {
  gn_job *next;
  gn_node *node;
  char id[GN_JOB_ID_STRLEN];
  char lease_id[GN_LEASE_ID_STRLEN];
  gn_role role;
  char image[600];
  char digest[GN_DIGEST_STRLEN];
  json_t *cmd; /* array of strings */
  json_t *env;
  gn_job_state state;
  int exit_code; /* -1 until exited */
  char error[256];
  int64_t created_s, ended_s;
  uint64_t log_len; /* bytes in the log file */
  bool log_cut;     /* output past GN_JOB_LOG_MAX was dropped */
  char log_path[4096];
  /* provider side */
  uv_process_t proc;   /* the runtime, started by uv_spawn where the kernel has no pidfds */
  uv_poll_t exit_poll; /* else: started by gn_runtime_spawn, its end seen on pidfd */
  int pidfd;           /* -1 when none */
  pid_t pid;
  uv_pipe_t out_pipe;
  uv_pipe_t err_pipe;
  char work_err[512];
  int work_rc;
  bool proc_running;
  int handles_open;
  char bundle[4096];
  char visible[1024]; /* NVIDIA_VISIBLE_DEVICES and CUDA_VISIBLE_DEVICES: the leased GPUs */
  bool cgroup_limits;
  uint64_t memory_mib; /* limits the manifest asked for, clamped by policy */
  uint32_t pids_max;
  char container_id[64];
  bool stop_requested;
  gn_buf manifest_env;
  /* Set on the loop (stop, lease end, shutdown); the pull or unpack on the
   * thread pool reads it and stops within a second. */
  volatile int cancel;
  int tasks;                          /* thread-pool tasks queued or running for this job; it lives until 0 */
  bool kill_busy;                     /* a runtime kill is queued or running */
  bool budget_held;                   /* memory_mib and pids_max are counted in the node's budgets */
  bool finished;                      /* job_finish ran */
  char rootfs[4096];                  /* the shared read-only root in use, "" when none */
  char overlay[128];                  /* its read-only overlay mount, "" when none */
  char work_log[1024];                /* detail for the provider's log only (registry error bodies) */
  uint32_t uid_base;                  /* user namespace: host ids of the job's 0.. */
  uint32_t id_count;                  /* 0: no user namespace */
  uint64_t cpu_quota_us;              /* per GN_CPU_PERIOD_US; 0: no CPU limit */
  unsigned minors[GN_LEASE_MAX_GPUS]; /* the leased real GPUs' /dev/nvidiaN */
  size_t nminors;
};

#define GN_CPU_PERIOD_US 100000u

struct gn_node {
  uv_loop_t *loop;
  gn_config cfg;
  gn_identity *id;
  char node_id[GN_NODE_ID_STRLEN];
  sqlite3 *db;
  gn_ledger *ledger;
  gn_transport *tp;
  gn_discovery *disc;
  gn_offer_table *offers;
  gn_ctl *ctl;
  gn_gpu_list gpus;
  char gpu_leased_by[GN_LEASE_MAX_GPUS * 4][GN_LEASE_ID_STRLEN];
  gn_runtime rt;
  bool have_runtime;
  char runtime_err[256];
  gn_store *store;
  char run_dir[4096];
  gn_lease *leases;
  gn_job *jobs;
  gn_pending *pending;
  struct gn_peer_rec {
    uint8_t id[GN_PK_LEN];
    char addr[64];
  } peers[256];
  size_t peer_count;
  gn_attest_local attest[GN_ATTEST_MODELS];
  size_t attest_n;
  gn_attest_agent *attest_agent;        /* attest_net.c: both sides of attestation */
  struct gn__attest_wait *attest_waits; /* attest_net.c: verifications whose callers wait */
  const uint8_t *attest_dial_key;       /* attest_net.c: the key the agent's dial expects, during a verify call */
  int attest_dial_rc;                   /* attest_net.c: that dial's result */
  uv_timer_t tick_timer;
  uv_signal_t sig_int, sig_term;
  uint64_t offer_seq;
  int64_t offer_published_s;
  bool offers_dirty;
  bool stopping;
  uv_timer_t stop_timer;
  uint64_t ticks_total;
  int exit_code;
  /* provider: budgets shared by all jobs of all leases (provider.c) */
  uint64_t mem_budget_mib, mem_used_mib;
  uint32_t pids_budget, pids_used;
  double cpu_budget;    /* CPUs, for all jobs together */
  bool limits_enforced; /* cgroups can apply memory and pids limits here */
  bool userns_ok;       /* jobs get their own user namespace */
  /* Where the runtime reaches the data dir when a directory above it is
   * not searchable by the jobs' uids: a bind mount in gpunetd's private
   * mount namespace. "" when the data dir's own path serves. */
  char data_alias[64];
  char userns_why[200]; /* why not, when !userns_ok */
  bool disk_low;        /* the data dir's disk is into the reserve */
  int64_t disk_checked_s;
  uv_fs_t disk_req; /* statfs of the data dir, on the thread pool */
  bool disk_req_busy;
  struct gn_task *tasks_head, *tasks_tail; /* thread-pool tasks waiting for a slot */
  unsigned pulls_running, cleanups_running;
  uint64_t stop_deadline_ms;
  uv_timer_t watchdog;
  struct gn__settle_glue *settle; /* settle.c: vouchers, the outbox and its driver */
};

/* daemon.c */
int gn__node_send(gn_node *n, const uint8_t peer[GN_PK_LEN], uint32_t type, gn_wire_writer *body);
gn_lease *gn__lease_find(gn_node *n, const char *id);
gn_job *gn__job_find(gn_node *n, const char *id);
void gn__node_persist_lease(gn_node *n, const gn_lease *l);
void gn__node_persist_job(gn_node *n, const gn_job *j);
/* The newest PERSIST of lease_id's machine, committed (fsynced) before it
 * returns: GN_EDB if it could not be. */
int gn__node_persist_machine(gn_node *n, const char *lease_id, const uint8_t *state, size_t len);
gn_pending *gn__pending_add(gn_node *n, gn_ctl_req *req, int kind, const char *key, uint64_t timeout_ms);
gn_pending *gn__pending_take(gn_node *n, int kind, const char *key);
void gn__pending_free(gn_pending *p);
json_t *gn__lease_json(gn_node *n, const gn_lease *l);
json_t *gn__job_json(const gn_job *j);
const char *gn__job_state_name(gn_job_state s);
void gn__job_append_log(gn_job *j, const uint8_t *data, size_t len);
void gn__hex(const uint8_t *p, size_t n, char *out);
/* snprintf for file paths: GN_ETOOBIG (and an empty buf) if it would not fit. */
int gn__pathf(char *buf, size_t cap, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* snprintf for messages and names, where cutting a long value short is the
 * intended behaviour. */
void gn__strf(char *buf, size_t cap, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* provider.c */
void gn__provider_publish_offers(gn_node *n, int64_t now_s);
void gn__provider_withdraw_offers(gn_node *n);
void gn__provider_on_message(gn_node *n, const uint8_t peer[GN_PK_LEN], const gn_envelope *env, const uint8_t *raw,
                             size_t raw_len);
void gn__provider_tick(gn_node *n, uint64_t now_ms, int64_t now_s);
void gn__provider_end_lease(gn_node *n, gn_lease *l, const char *reason);
void gn__provider_peer_up(gn_node *n, const uint8_t peer[GN_PK_LEN]);
void gn__provider_peer_down(gn_node *n, const uint8_t peer[GN_PK_LEN]);
/* load_state: rebuilds a provider lease's machine from its newest persisted
 * state and the ledger (an active lease resumes metering). */
int gn__provider_restore(gn_node *n, gn_lease *l, const uint8_t *state, size_t len);
void gn__provider_stop_job(gn_node *n, gn_job *j);
/* At start, before any lease: budgets from config and the host, whether
 * limits and user namespaces can be enforced. GN_EUNSUPPORTED (with why in
 * err) when this host must not provide under its config. */
int gn__provider_init(gn_node *n, char *err, size_t cap);
/* Thread-pool work of the provider still queued or running, or job
 * processes still open: shutdown waits for these. */
bool gn__provider_busy(const gn_node *n);
/* What `gpunet status` says about how jobs are isolated here. */
json_t *gn__provider_status_json(const gn_node *n);
/* Whether this host can run jobs in their own user namespace with a mapped
 * id range (a probe: a child unshares and its map is written); why not in
 * why. Blocking, once at start. */
bool gn__userns_probe(char *why, size_t cap);

/* requester.c */
void gn__requester_on_message(gn_node *n, const uint8_t peer[GN_PK_LEN], const gn_envelope *env, const uint8_t *raw,
                              size_t raw_len);
void gn__requester_peer_up(gn_node *n, const uint8_t peer[GN_PK_LEN]);
void gn__requester_peer_down(gn_node *n, const uint8_t peer[GN_PK_LEN]);
/* A dial to addr expecting provider `expected` reached node `got`: the lease
 * requests still waiting to be sent to `expected` fail now. */
void gn__requester_dial_refused(gn_node *n, const char *addr, const uint8_t expected[GN_PK_LEN],
                                const uint8_t got[GN_PK_LEN]);
/* load_state: rebuilds a requester lease's machine (its observation from
 * our own persisted UTC of receipt). */
int gn__requester_restore(gn_node *n, gn_lease *l, const uint8_t *state, size_t len);
void gn__requester_tick(gn_node *n, uint64_t now_ms, int64_t now_s);
void gn__api_rent(gn_ctl_req *req, void *ud);
void gn__api_release(gn_ctl_req *req, void *ud);
void gn__api_run(gn_ctl_req *req, void *ud);
void gn__api_stop(gn_ctl_req *req, void *ud);

/* settle.c: settlement (include/gpunet/settle.h). _start after the database
 * and the loop exist (opens the tables, the configured driver, the retry
 * timer), _stop at shutdown (the timer; a request in flight still finishes
 * and is recorded), _free after the loop has run dry. */
int gn__settle_start(gn_node *n, char *err, size_t cap);
void gn__settle_stop(gn_node *n);
void gn__settle_free(gn_node *n);
/* Records a voucher of lease l (a DEBIT_ACCEPT or INVOICE_ACCEPT envelope):
 * the provider for each one it receives from the requester, the requester
 * for each one it signs. Refused vouchers (decreasing, another lease's, not
 * signed by the requester...) are logged and the code returned; the lease
 * goes on either way. */
int gn__settle_voucher(gn_node *n, const gn_lease *l, const uint8_t *env, size_t len);
/* Once a final invoice is countersigned (the requester signed, or the
 * provider received and verified, the INVOICE_ACCEPT): records that final
 * voucher and queues the lease's settlement (with the lease's export from the
 * ledger, so call it after the invoice and its acceptance are stored) for the
 * driver; durable before it returns. */
int gn__settle_final(gn_node *n, const gn_lease *l, const uint8_t *invoice_env, size_t invoice_len,
                     const uint8_t *accept_env, size_t accept_len);
/* "none", "pending", "settled" or "failed" for a lease's final settlement
 * (role "provider" or "requester"), for the invoice list. */
const char *gn__settle_state(gn_node *n, const char *lease_id, const char *role);
void gn__api_balance(gn_ctl_req *req, void *ud);
/* POST /v1/balance/retry: failed settlements are queued again. */
void gn__api_settle_retry(gn_ctl_req *req, void *ud);

/* attest_net.c: the glue around the attestation agent (node/attest/,
 * gpunet/attest.h): its io, the local GPUs, POST /v1/attest. */
void gn__attest_start_local(gn_node *n);
void gn__attest_on_message(gn_node *n, const uint8_t peer[GN_PK_LEN], const gn_envelope *env, const uint8_t *raw,
                           size_t raw_len);
void gn__attest_peer_up(gn_node *n, const uint8_t peer[GN_PK_LEN]);
/* A dial to addr expecting provider `expected` reached node `got`: the
 * verifications of `expected` still waiting for their session fail now. */
void gn__attest_dial_refused(gn_node *n, const char *addr, const uint8_t expected[GN_PK_LEN],
                             const uint8_t got[GN_PK_LEN]);
void gn__attest_tick(gn_node *n, uint64_t now_ms);
/* Challenges the provider of offer e; done is called exactly once (from a
 * later loop callback) unless this returns an error: GN_EPERM when the
 * offer's address is up under another node's key. A session to that address
 * that proves another key fails it too (done with GN_EPERM). */
int gn__attest_begin(gn_node *n, const gn_offer_entry *e, gn_attest_done_fn done, void *ud);
void gn__api_attest(gn_ctl_req *req, void *ud);
const gn_attest_local *gn__attest_local_find(const gn_node *n, const char *model);
/* The verdict an offer's attached report states, e.g. "verified RTX 4090
 * (checked by gn…)" or "simulated (self-reported)"; "" when none. */
void gn__offer_attest_verdict(const gn_offer *o, char *buf, size_t cap);
json_t *gn__attest_result_json(const gn_attest_result *res);
void gn__attest_shutdown(gn_node *n);

/* api.c */
void gn__api_register(gn_node *n);
/* Long-polled logs (GET /v1/jobs/:id/logs?wait_ms=): a waiting request is a
 * GN_PENDING_LOGS entry keyed by job id. _wake answers the job's waiters that
 * have something new (output past their offset, a state change); call it
 * whenever the job's log grows or its state is persisted. _answer replies to
 * one waiter with what there is (its deadline passed); the caller frees p. */
void gn__api_logs_wake(gn_node *n, const gn_job *j);
void gn__api_logs_answer(gn_node *n, gn_pending *p);

/* jobmsg.c: bodies of the lease/job messages this module owns. */
typedef struct gn_jobman {
  char job_id[GN_JOB_ID_STRLEN];
  char lease_id[GN_LEASE_ID_STRLEN];
  char image[600];
  uint32_t argc;
  char *argv[GN_JOB_MAX_ARGS + 1];
  uint32_t envc;
  char *env[GN_JOB_MAX_ARGS + 1];
  uint64_t memory_mib;
  uint32_t pids;
  bool network;
  uint8_t nonce[16];
  int64_t issued_s;
  int64_t expires_s;
} gn_jobman;

void gn__jobman_done(gn_jobman *m);
int gn__jobman_encode(const gn_jobman *m, gn_wire_writer *w);
int gn__jobman_decode(const uint8_t *body, size_t len, gn_jobman *ret);

typedef struct gn_jobmsg {
  char job_id[GN_JOB_ID_STRLEN];
  char lease_id[GN_LEASE_ID_STRLEN];
  char state[16];
  int64_t exit_code; /* JOB_STATUS: -1 while none */
  int64_t end_s;     /* LEASE_END */
  char reason[256];  /* the error or reason, "" if none */
  char digest[GN_DIGEST_STRLEN];
  uint64_t offset;
  const uint8_t *data; /* JOB_LOG: into the decoded document */
  size_t data_len;
  gn_wire_doc doc;
} gn_jobmsg;

/* JOB_STATUS, JOB_LOG, JOB_STOP, LEASE_REJECT/RELEASE/END and ERROR all use
 * small maps; one decoder fills what each carries. */
int gn__jobmsg_decode(uint32_t type, const uint8_t *body, size_t len, gn_jobmsg *ret);
void gn__jobmsg_done(gn_jobmsg *m);

#endif
