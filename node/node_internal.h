/* The state of one gpunetd shared by the daemon's modules: struct gn_node.
 * Only the files that read or write its fields include this; what each
 * module offers the others is in its own header (records.h, provider.h,
 * requester.h, attest_net.h, settle_glue.h, api.h, jobmsg.h, util.h), and
 * only daemon.c includes them all. */
#ifndef GPUNET_NODE_INTERNAL_H
#define GPUNET_NODE_INTERNAL_H

#include "histogram.h"
#include "records.h"
#include "util.h"

#include <gpunet/billing.h>
#include <gpunet/discovery.h>
#include <gpunet/identity.h>
#include <gpunet/node.h>
#include <gpunet/offer.h>
#include <gpunet/peertab.h>
#include <gpunet/sandbox.h>
#include <gpunet/transport.h>
#include <sqlite3.h>
#include <stdbool.h>
#include <uv.h>

/* records.h brings jobmsg.h, and util.h is here too: tests/node/test_ids.c,
 * tests/fuzz/fuzz_jobmsg.c and scripts/docs/node_examples.c take gn_jobman,
 * gn_jobmsg and gn__strf from this header. */

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
  gn_ctl *metrics_ctl; /* GET /metrics over TCP (--metrics-listen), or NULL */
  /* dashboard.c: the dashboard's server and history (--dashboard-listen), or NULL */
  struct gn__dash *dash;
  /* Provider: from a debit note's first send to its acceptance. */
  gn_histo debit_latency;
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
  /* Hooks daemon.c sets at start, so that no module calls another's:
   * job_changed (called by records.c when a job's state is persisted or its
   * log grows) is the API's answer to the long polls waiting on it;
   * stop_provided_job (POST /v1/jobs/:id/stop of a job this node provides,
   * routed by requester.c) is the provider's. NULL: nothing is done. */
  void (*job_changed)(gn_node *n, const gn_job *j);
  void (*stop_provided_job)(gn_node *n, gn_job *j);
  /* The one table of known peers: sessions up, dialled, heard of (p2p/peertab.c). */
  gn_peertab *peertab;
  struct gn__attest_glue *attest; /* attest_net.c: the agent, its slots' copies, waiting verifications */
  uv_timer_t tick_timer;
  uv_signal_t sig_int, sig_term;
  uint64_t offer_seq;
  int64_t offer_published_s;
  bool offers_dirty;
  bool stopping;
  uv_timer_t stop_timer;
  uint64_t ticks_total;
  uint64_t lease_energy_uj; /* provider: what its leases' GPUs used since start (provider.c) */
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
  struct gn__overlay *overlay;    /* overlay.c: membership over UDP */
  struct gn__nat *nat;            /* nat.c: observed addresses, hole punching, relays */
  struct gn__fwd *fwd;            /* fwd*.c: forwarded ports (gpunet forward) */
  struct gn__exec *exec;          /* exec_prov.c, exec_req.c: gpunet exec streams */
};

/* nat.c, home networks (docs/nat.md). Started after the overlay (it sends
 * on the overlay's UDP socket): GN_ENOMEM only. */
int gn__nat_start(gn_node *n);
/* GET /v1/nat, POST /v1/nat/punch, /v1/nat/relay and /v1/nat/reserve. */
void gn__nat_register(gn_node *n);
/* A session came up: the peer is asked where it sees us. */
void gn__nat_peer_up(gn_node *n, const uint8_t peer[GN_PK_LEN], const char *addr);
/* A NAT_OBSERVED or NAT_PUNCH datagram on the overlay socket, verified. */
void gn__nat_on_datagram(gn_node *n, const char *from, const gn_envelope *env, uint64_t now_ms);
/* NAT_PUNCH_REQ and RELAY_* over the session to peer (signer checked). */
void gn__nat_on_message(gn_node *n, const uint8_t peer[GN_PK_LEN], const gn_envelope *env);
/* The endpoint of a punched UDP hole to peer (the job network's path). */
bool gn__nat_punched_addr(gn_node *n, const uint8_t peer[GN_PK_LEN], char *buf, size_t cap);
/* gn_transport_connect_peer(n->tp, addr, peer), and when an offer of peer
 * names a relay, the relay is asked to call peer should no session come up
 * within 2 s (docs/nat.md, "Reaching a NATed peer"). 0 when either is under
 * way, else the dial's error. */
int gn__nat_connect_peer(gn_node *n, const char *addr, const uint8_t peer[GN_PK_LEN]);
/* Whether peer is being reached through its relay now (not given up). */
bool gn__nat_reaching(gn_node *n, const uint8_t peer[GN_PK_LEN]);
/* Our offers name the relay we hold a slot at (relay_id, relay_addr). */
void gn__nat_offer(gn_node *n, gn_offer *o);
void gn__nat_close(gn_node *n);
void gn__nat_free(gn_node *n);
/* overlay.c: one datagram, sealed, on the overlay's UDP socket
 * (GN_ECLOSED without one). */
int gn__overlay_send(gn_node *n, const char *addr, uint32_t type, const uint8_t *body, size_t len);

#endif
