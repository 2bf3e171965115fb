/* The node's records (records.c): its leases and jobs, and the API requests
 * waiting for a peer's answer; their SQLite tables, lookups and JSON views;
 * and sending one message to a peer. Every module of the daemon keeps its
 * state here; none of them is needed to read it. */
#ifndef GPUNET_NODE_RECORDS_H
#define GPUNET_NODE_RECORDS_H

#include "jobmsg.h"
#include "outmerge.h"

#include <gpunet/billing.h>
#include <gpunet/identity.h>
#include <gpunet/lease.h>
#include <gpunet/node.h>
#include <gpunet/wire.h>
#include <jansson.h>
#include <stdbool.h>
#include <uv.h>

#define GN_JOB_LOG_MAX (64ull << 20) /* output kept per job, on either side */

typedef struct gn_node gn_node;

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

typedef struct gn_job gn_job;

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
  /* provider, after a restart: its seconds are billed idle (no GPU, free)
   * until then; UINT64_MAX until the requester's session is back. Its jobs
   * died with the daemon, and a release sent while we were down arrives
   * only once the requester reaches us again. 0 otherwise. */
  uint64_t busy_from_ms;
  bool invoice_done; /* the final invoice was answered */
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
  /* Provider: its GPUs' energy so far (integrated once a second, saved
   * each second in node_leases). Both: what the final invoice states. */
  gn_energy energy;
  gn_bill_energy invoice_energy;
} gn_lease;

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
  gn_out_partial out_held[2]; /* the unfinished line of stdout, of stderr (outmerge.h) */
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
  uint64_t kill_again_ms;             /* a stopped job still running is killed again then */
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
  /* The image pull's progress in bytes (pull_total 0: not known yet).
   * Provider: written by the pull on the thread pool, read on the loop,
   * which sends it in JOB_STATUS at most once a second (pull_sent_*).
   * Requester: what the provider last said, for progress only. */
  _Atomic uint64_t pull_done, pull_total;
  uint64_t pull_sent_done, pull_sent_ms;
  /* Provider: the bytes of the log handed to the session for the lease
   * holder, in order from 0. Output read while the session is down is sent
   * from the log file once it is up again, and the job's final status
   * waits for it (status_due): the holder has the whole log when it hears
   * the job ended. A lost session may have taken the last bytes handed to
   * it: they are sent again (the holder keeps what it lacks of a chunk). */
  uint64_t log_sent;
  bool status_due;
};

/* Opens (creating) DATA_DIR/gpunet.db with the records' tables. */
int gn__records_open_db(gn_node *n);
int gn__node_send(gn_node *n, const uint8_t peer[GN_PK_LEN], uint32_t type, gn_wire_writer *body);
gn_lease *gn__lease_find(gn_node *n, const char *id);
gn_job *gn__job_find(gn_node *n, const char *id);
/* Persisting a job (every state change) and appending to its log call the
 * node's job_changed hook (the API's long polls). */
void gn__node_persist_lease(gn_node *n, const gn_lease *l);
/* Saves a provider lease's energy totals (once a second; committed without
 * its own fsync, made durable by the next tick's commit). */
void gn__node_persist_energy(gn_node *n, const gn_lease *l);
/* Sets energy_mj, energy_measured_s (null when not measured: simulated GPUs
 * or no power reading) and energy_plausible on a lease's JSON view: the
 * final invoice's claim once there is one, before it the provider's
 * figure so far. */
void gn__lease_energy_json(const gn_lease *l, json_t *o);
void gn__node_persist_job(gn_node *n, const gn_job *j);
/* Provider: the pid of job j's container init, from the runtime's state
 * (runc: RUN_DIR/ID/state.json init_process_pid; crun: RUN_DIR/ID/status
 * pid); GN_ENOTFOUND while the runtime has not made the container yet. */
int gn__job_container_pid(const gn_node *n, const gn_job *j, pid_t *ret);
/* Sets "pull": {done, total} (bytes) on o while j's image is pulled and its
 * size is known. */
void gn__job_pull_json(const gn_job *j, json_t *o);
/* The newest PERSIST of lease_id's machine, committed (fsynced) before it
 * returns: GN_EDB if it could not be. */
int gn__node_persist_machine(gn_node *n, const char *lease_id, const uint8_t *state, size_t len);
/* lease_id's newest machine state, appended to ret; GN_ENOTFOUND if none. */
int gn__records_load_machine(gn_node *n, const char *lease_id, gn_buf *ret);
gn_pending *gn__pending_add(gn_node *n, gn_ctl_req *req, int kind, const char *key, uint64_t timeout_ms);
gn_pending *gn__pending_take(gn_node *n, int kind, const char *key);
void gn__pending_free(gn_pending *p);
json_t *gn__lease_json(gn_node *n, const gn_lease *l);
json_t *gn__job_json(const gn_job *j);
const char *gn__job_state_name(gn_job_state s);
void gn__job_append_log(gn_job *j, const uint8_t *data, size_t len);
/* An id in a control request's JSON body (key): true when it is absent,
 * null or a valid id; else answers 400 naming `what` and returns false. */
bool gn__body_id_ok(gn_ctl_req *req, const char *key, const char *what);

#endif
