/* gpunetd's core: start-up from config, the SQLite state of leases and jobs,
 * the transport and discovery glue, the once-a-second timer, signals and a
 * clean shutdown. Protocol decisions live in provider.c and requester.c. */
#include "daemon.h"

#include "api.h"
#include "attest_net.h"
#include "dashboard.h"
#include "exec.h"
#include "fwd.h"
#include "node_internal.h"
#include "overlay.h"
#include "peer_rtt.h"
#include "provider.h"
#include "records.h"
#include "requester.h"
#include "settle_glue.h"
#include "util.h"
#include "ws.h"

#include <dirent.h>
#include <fcntl.h>
#include <getopt.h>
#include <limits.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

/* Containers and bundles an earlier run left behind (it was killed before
 * its cleanup ran): every container in this node's runtime state and every
 * bundle is deleted before the first lease, so no job of an old lease runs
 * on in the uid range a new lease gets. Blocking, at start only. */
static void remove_leftovers(gn_node *n) {
  DIR *d = opendir(n->run_dir);
  if (!d)
    return;
  struct dirent *e;
  while ((e = readdir(d))) {
    char path[PATH_MAX];
    if (strncmp(e->d_name, "gn-", 3) == 0 && n->have_runtime) {
      char **argv = NULL;
      int status;
      if (gn_runtime_argv_delete(&n->rt, n->run_dir, e->d_name, &argv) == 0) {
        gn_runtime_exec(argv, &status);
        gn_argv_free(argv);
      }
    } else if (strncmp(e->d_name, "bundle-", 7) == 0 &&
               gn__pathf(path, sizeof path, "%s/%s", n->run_dir, e->d_name) == 0) {
      gn_rm_tree(path);
    }
  }
  closedir(d);
}

static bool own_provider_lease(const char *lease_id, void *ud) {
  const gn_lease *l = gn__lease_find(ud, lease_id);
  return l && l->role == GN_ROLE_PROVIDER;
}

/* The lease cgroups an earlier run left (killed before a lease's last
 * cleanup), once their containers are deleted: only this node's leases',
 * since another gpunetd on the host may have a lease's cgroup ready for
 * its next job. Blocking, at start only. */
static void remove_stale_cgroups(gn_node *n) {
  unsigned removed = 0;
  if (!n->cfg.provide || !n->limits_enforced)
    return;
  int r = gn_cgroup_remove_stale(own_provider_lease, n, &removed);
  if (r < 0)
    gn_log(GN_LOG_WARN, "cannot remove every lease cgroup an earlier run left under gpunet/: %s", gn_strerror(r));
  else if (removed)
    gn_log(GN_LOG_INFO, "removed %u lease cgroups an earlier run left", removed);
}

/* Loads leases and jobs kept by an earlier run. A lease or job that was
 * active when the daemon stopped cannot be resumed (its container died with
 * the runtime's parent), so restart reconciles: provider leases end now and
 * are invoiced from the ticks already durable in the ledger; leftover
 * containers are deleted. */
static void load_state(gn_node *n) {
  sqlite3_stmt *st = NULL;
  if (sqlite3_prepare_v2(n->db,
                         "SELECT id, role, peer, agreement, state, seconds, end_s, end_reason, invoice_done,"
                         " received_s, max_spend_micro, max_price, invoice_id, invoice_status, invoice_seconds,"
                         " invoice_micro, energy_uj, energy_measured_ms, energy_unmeasured_ms, invoice_energy_mj,"
                         " invoice_energy_s"
                         " FROM node_leases ORDER BY rowid",
                         -1, &st, NULL) == SQLITE_OK) {
    while (sqlite3_step(st) == SQLITE_ROW) {
      gn_lease *l = calloc(1, sizeof *l);
      if (!l)
        break;
      gn__strf(l->id, sizeof l->id, "%s", (const char *)sqlite3_column_text(st, 0));
      l->role = sqlite3_column_int(st, 1);
      if (sqlite3_column_bytes(st, 2) == GN_PK_LEN)
        memcpy(l->peer, sqlite3_column_blob(st, 2), GN_PK_LEN);
      gn_buf_append(&l->agreement_env, sqlite3_column_blob(st, 3), (size_t)sqlite3_column_bytes(st, 3));
      if (gn_agreement_open(l->agreement_env.data, l->agreement_env.len, &l->ag) < 0) {
        gn_log(GN_LOG_WARN, "lease %s in the database has an agreement that does not verify; skipping it", l->id);
        gn_buf_done(&l->agreement_env);
        free(l);
        continue;
      }
      l->state = sqlite3_column_int(st, 4);
      l->seconds = (uint64_t)sqlite3_column_int64(st, 5);
      l->end_s = sqlite3_column_int64(st, 6);
      if (sqlite3_column_text(st, 7))
        gn__strf(l->end_reason, sizeof l->end_reason, "%s", (const char *)sqlite3_column_text(st, 7));
      l->invoice_done = sqlite3_column_int(st, 8);
      l->received_s = sqlite3_column_int64(st, 9);
      l->max_spend_micro = (uint64_t)sqlite3_column_int64(st, 10);
      l->max_price_uper_hour = (uint64_t)sqlite3_column_int64(st, 11);
      if (sqlite3_column_text(st, 12))
        gn__strf(l->invoice_id, sizeof l->invoice_id, "%s", (const char *)sqlite3_column_text(st, 12));
      if (sqlite3_column_text(st, 13))
        gn__strf(l->invoice_status, sizeof l->invoice_status, "%s", (const char *)sqlite3_column_text(st, 13));
      l->invoice_seconds = (uint64_t)sqlite3_column_int64(st, 14);
      l->invoice_micro = (uint64_t)sqlite3_column_int64(st, 15);
      /* Negative values are not ours: read as 0 (no energy). */
      l->energy.uj = (uint64_t)(sqlite3_column_int64(st, 16) > 0 ? sqlite3_column_int64(st, 16) : 0);
      l->energy.measured_ms = (uint64_t)(sqlite3_column_int64(st, 17) > 0 ? sqlite3_column_int64(st, 17) : 0);
      l->energy.unmeasured_ms = (uint64_t)(sqlite3_column_int64(st, 18) > 0 ? sqlite3_column_int64(st, 18) : 0);
      if (sqlite3_column_type(st, 19) == SQLITE_INTEGER && sqlite3_column_int64(st, 19) >= 0 &&
          sqlite3_column_int64(st, 20) >= 1)
        l->invoice_energy =
            (gn_bill_energy){true, (uint64_t)sqlite3_column_int64(st, 19), (uint64_t)sqlite3_column_int64(st, 20)};
      for (int i = 0; i < GN_LEASE_MAX_GPUS; i++)
        l->gpu_index[i] = -1;
      l->uid_slot = -1;
      l->next = n->leases;
      n->leases = l;
    }
  }
  sqlite3_finalize(st);
  st = NULL;
  if (sqlite3_prepare_v2(n->db,
                         "SELECT id, lease_id, role, image, digest, cmd, env, state, exit_code, error, created_s,"
                         " ended_s, log_len FROM node_jobs ORDER BY rowid",
                         -1, &st, NULL) == SQLITE_OK) {
    while (sqlite3_step(st) == SQLITE_ROW) {
      gn_job *j = calloc(1, sizeof *j);
      if (!j)
        break;
      j->node = n;
      gn__strf(j->id, sizeof j->id, "%s", (const char *)sqlite3_column_text(st, 0));
      gn__strf(j->lease_id, sizeof j->lease_id, "%s", (const char *)sqlite3_column_text(st, 1));
      j->role = sqlite3_column_int(st, 2);
      gn__strf(j->image, sizeof j->image, "%s", (const char *)sqlite3_column_text(st, 3));
      if (sqlite3_column_text(st, 4))
        gn__strf(j->digest, sizeof j->digest, "%s", (const char *)sqlite3_column_text(st, 4));
      if (sqlite3_column_text(st, 5))
        j->cmd = json_loads((const char *)sqlite3_column_text(st, 5), 0, NULL);
      if (sqlite3_column_text(st, 6))
        j->env = json_loads((const char *)sqlite3_column_text(st, 6), 0, NULL);
      j->state = sqlite3_column_int(st, 7);
      j->exit_code = sqlite3_column_int(st, 8);
      if (sqlite3_column_text(st, 9))
        gn__strf(j->error, sizeof j->error, "%s", (const char *)sqlite3_column_text(st, 9));
      j->created_s = sqlite3_column_int64(st, 10);
      j->ended_s = sqlite3_column_int64(st, 11);
      j->log_len = (uint64_t)sqlite3_column_int64(st, 12);
      char jobs_dir[sizeof n->run_dir + 8]; /* a stored id is checked again before it names a file */
      gn__pathf(jobs_dir, sizeof jobs_dir, "%s/jobs", n->run_dir);
      gn_path_join(j->log_path, sizeof j->log_path, jobs_dir, NULL, j->id, ".log");
      gn__strf(j->container_id, sizeof j->container_id, "gn-%s", j->id);
      struct stat sb;
      if (stat(j->log_path, &sb) == 0)
        j->log_len = (uint64_t)sb.st_size;
      j->log_sent = j->log_len; /* what an earlier run sent is not known: not sent again */
      j->next = n->jobs;
      n->jobs = j;
    }
  }
  sqlite3_finalize(st);

  remove_leftovers(n);
  for (gn_job *j = n->jobs; j; j = j->next) {
    /* A requester's job runs on its provider whatever happened here: its
     * status and output keep arriving and pick up where the log file ends. */
    if (j->role != GN_ROLE_PROVIDER)
      continue;
    if (j->state == GN_JOB_PENDING || j->state == GN_JOB_PULLING || j->state == GN_JOB_RUNNING) {
      if (n->have_runtime) {
        char **argv = NULL;
        int status;
        if (gn_runtime_argv_delete(&n->rt, n->run_dir, j->container_id, &argv) == 0) {
          gn_runtime_exec(argv, &status);
          gn_argv_free(argv);
        }
      }
      j->state = GN_JOB_FAILED;
      gn__strf(j->error, sizeof j->error, "the provider daemon restarted while the job ran");
      j->ended_s = gn_unix_s();
      gn__node_persist_job(n, j);
    }
  }
  remove_stale_cgroups(n);
  for (gn_lease *l = n->leases; l; l = l->next) {
    l->timer_at_ms = UINT64_MAX;
    gn_buf state = {0};
    int r = gn__records_load_machine(n, l->id, &state);
    if (r == 0) {
      /* The lease's machine resumes from its newest persisted state: a
       * provider lease goes on metering (the seconds it was down are
       * written idle, billed nothing), a requester lease is observed from
       * our own UTC of receipt, an ended one re-sends or awaits its final
       * invoice. */
      r = l->role == GN_ROLE_PROVIDER ? gn__provider_restore(n, l, state.data, state.len)
                                      : gn__requester_restore(n, l, state.data, state.len);
      gn_buf_done(&state);
      if (r < 0)
        gn_log(GN_LOG_ERROR, "lease %s: cannot resume its billing state: %s", l->id, gn_strerror(r));
      continue;
    }
    gn_buf_done(&state);
    /* A lease of a run before billing state machines existed. */
    if (l->state != GN_LEASE_ACTIVE)
      continue;
    if (l->role == GN_ROLE_PROVIDER) {
      uint64_t ticks = 0;
      gn_ledger_tick_count(n->ledger, l->id, &ticks);
      l->seconds = ticks;
      gn_log(GN_LOG_WARN, "lease %s was active when the daemon stopped: ending it with %llu seconds metered", l->id,
             (unsigned long long)ticks);
      gn__provider_end_lease(n, l, "provider daemon restarted");
    } else {
      /* The provider kept metering while we were down: the lease goes on,
       * observed from our OWN record of when the agreement reached us (our
       * clock, persisted then), never from the provider's start_s, which
       * nothing checks against our clock. A row from before received_s
       * existed is observed from now: that can only make us refuse to pay
       * for seconds we cannot vouch for, never pay for more. (If this
       * machine rebooted since, the monotonic clock cannot reach that far
       * back and our observation starts at boot.) */
      int64_t now_s = gn_unix_s(), age_s = l->received_s > 0 ? now_s - l->received_s : 0;
      if (l->received_s <= 0)
        l->received_s = now_s;
      uint64_t now_ms = gn_mono_ms(), age_ms = age_s > 0 ? (uint64_t)age_s * 1000u : 0;
      l->start_mono_ms = age_ms < now_ms ? now_ms - age_ms : 0;
      gn_log(GN_LOG_INFO, "lease %s is still active (%llds since its agreement reached this node): watching it again",
             l->id, (long long)age_s);
    }
  }
}

static void pending_expire(gn_node *n, uint64_t now_ms) {
  for (gn_pending **pp = &n->pending; *pp;) {
    gn_pending *p = *pp;
    if (now_ms < p->deadline_ms) {
      pp = &p->next;
      continue;
    }
    *pp = p->next;
    if (p->kind == GN_PENDING_LOGS) { /* a long poll that saw nothing new */
      gn__api_logs_answer(n, p);
      gn__pending_free(p);
      continue;
    }
    char peer[GN_NODE_ID_STRLEN];
    gn_node_id_format(p->peer, peer);
    static const char *const what[] = {"", "the lease request", "the job", "the release"};
    gn_ctl_reply_error(p->req, 504, "provider %s did not answer %s %s in time", peer, what[p->kind], p->key);
    gn__pending_free(p);
  }
}

/* --- messaging --------------------------------------------------------------*/

static int disc_send(void *ud, const uint8_t peer[GN_PK_LEN], const uint8_t *env, size_t len) {
  gn_node *n = ud;
  return gn_transport_send(n->tp, peer, env, len);
}

static int disc_connect(void *ud, const char *addr) {
  gn_node *n = ud;
  return gn_transport_connect(n->tp, addr);
}

/* A PEERS entry: the session must prove the key it was advertised with. */
static int disc_connect_peer(void *ud, const char *addr, const uint8_t expect[GN_PK_LEN]) {
  gn_node *n = ud;
  return gn_transport_connect_peer(n->tp, addr, expect);
}

/* A dial for a known key (a PEERS entry, an offer's provider) reached
 * another node: its session was closed unused. What waited for that
 * provider learns it now, rather than at its timeout. */
static void on_refused(gn_transport *t, const char *addr, const uint8_t expected[GN_PK_LEN],
                       const uint8_t got[GN_PK_LEN], void *ud) {
  (void)t;
  gn_node *n = ud;
  char want[GN_NODE_ID_STRLEN], is[GN_NODE_ID_STRLEN];
  gn_node_id_format(expected, want);
  gn_node_id_format(got, is);
  gn_log_ratelimited("refused-key", GN_LOG_WARN,
                     "refused the session with %s: it was advertised as %s but the node there is %s", addr, want, is);
  gn_peertab_dial_failed(n->peertab, expected, gn_mono_ms()); /* the views do not dial it again for a while */
  if (gn__nat_reaching(n, expected))
    return; /* a NATed provider's private address held another node: its relay may still reach it */
  gn__requester_dial_refused(n, addr, expected, got);
  gn__attest_dial_refused(n, addr, expected, got);
}

/* A peer over a transport limit (docs/overlay/limits.md): closed or refused. */
static void on_limit(gn_transport *t, const char *addr, const uint8_t *peer, const char *what, uint64_t backoff_ms,
                     void *ud) {
  (void)t;
  (void)ud;
  char id[GN_NODE_ID_STRLEN] = "(before its handshake)";
  if (peer)
    gn_node_id_format(peer, id);
  if (backoff_ms)
    gn_log_ratelimited("peer-limit", GN_LOG_WARN, "peer %s at %s %s; refused for %llu s", id, addr, what,
                       (unsigned long long)(backoff_ms / 1000));
  else
    gn_log_ratelimited("peer-refused", GN_LOG_INFO, "peer %s at %s %s", id, addr, what);
}

static void on_peer_up(gn_transport *t, const uint8_t peer[GN_PK_LEN], const char *addr, void *ud) {
  (void)t;
  gn_node *n = ud;
  char id[GN_NODE_ID_STRLEN];
  gn_node_id_format(peer, id);
  gn_log_ratelimited("peer-up", GN_LOG_INFO, "peer up %s at %s", id, addr && addr[0] ? addr : "(no listen address)");
  gn_transport_peer_info in = {0};
  gn_transport_get_peer_info(n->tp, peer, &in);
  if (gn_peertab_session_up(n->peertab, peer, addr, in.inbound, gn_mono_ms()) < 0)
    gn_log_ratelimited("peertab", GN_LOG_WARN, "the peer table has no room for %s: every entry holds a session", id);
  gn_discovery_peer_up(n->disc, peer, addr, gn_unix_s());
  gn__overlay_peer_up(n, peer, addr);
  gn__nat_peer_up(n, peer, addr);
  gn__requester_peer_up(n, peer);
  gn__provider_peer_up(n, peer);
  gn__attest_peer_up(n, peer);
}

static void on_peer_down(gn_transport *t, const uint8_t peer[GN_PK_LEN], void *ud) {
  (void)t;
  gn_node *n = ud;
  char id[GN_NODE_ID_STRLEN];
  gn_node_id_format(peer, id);
  gn_log_ratelimited("peer-down", GN_LOG_INFO, "peer down %s", id);
  gn_peertab_session_down(n->peertab, peer, gn_mono_ms());
  gn_discovery_peer_down(n->disc, peer, gn_unix_s());
  /* With partial views discovery keeps the offers of a closed session (the
   * views close sessions of live peers); a member the membership already
   * holds dead or gone loses them now, as its death kept them for the
   * session's sake (node/overlay.c). */
  const char *ms = gn__overlay_member_state(n, peer);
  if (ms && (strcmp(ms, "dead") == 0 || strcmp(ms, "left") == 0))
    gn_offer_table_remove_provider(n->offers, peer);
  gn__provider_peer_down(n, peer);
  gn__exec_peer_down(n, peer);
  gn__requester_peer_down(n, peer);
  gn__overlay_peer_down(n, peer);
}

static void on_message(gn_transport *t, const uint8_t peer[GN_PK_LEN], const gn_envelope *env, const uint8_t *raw,
                       size_t raw_len, void *ud) {
  (void)t;
  gn_node *n = ud;
  int r = gn_discovery_on_message(n->disc, peer, env, raw, raw_len, gn_unix_s());
  if (r != GN_ENOTFOUND) {
    if (r < 0)
      gn_log_ratelimited("dropped", GN_LOG_DEBUG, "dropped %s: %s", gn_msg_type_name(env->type), gn_strerror(r));
    return;
  }
  /* Lease and job messages must come from the node that signed them: a
   * relayed request would let a third party act for someone else. */
  if (memcmp(env->signer, peer, GN_PK_LEN) != 0) {
    gn_log_ratelimited("dropped-signer", GN_LOG_WARN, "dropped %s signed by another node than the sender",
                       gn_msg_type_name(env->type));
    return;
  }
  switch (env->type) {
  case GN_MSG_ATTEST_CHALLENGE:
  case GN_MSG_ATTEST_RESPONSE:
  case GN_MSG_ATTEST_OPEN:
  case GN_MSG_ATTEST_PROOF:
  case GN_MSG_ATTEST_VERDICT:
  case GN_MSG_ATTEST_MEM_CHALLENGE:
  case GN_MSG_ATTEST_MEM_READY:
  case GN_MSG_ATTEST_MEM_WALK:
  case GN_MSG_ATTEST_MEM_RESULT:
    gn__attest_on_message(n, peer, env, raw, raw_len);
    break;
  case GN_MSG_LEASE_REQUEST:
  case GN_MSG_LEASE_RELEASE:
  case GN_MSG_JOB_MANIFEST:
  case GN_MSG_JOB_STOP:
  case GN_MSG_JOB_OUTPUT_GET:
  case GN_MSG_JOB_SEED:
  case GN_MSG_INVOICE_ACCEPT:
  case GN_MSG_INVOICE_REJECT:
  case GN_MSG_DEBIT_ACCEPT:
  case GN_MSG_DEBIT_REJECT:
    gn__provider_on_message(n, peer, env, raw, raw_len);
    break;
  case GN_MSG_LEASE_ACCEPT:
  case GN_MSG_LEASE_REJECT:
  case GN_MSG_LEASE_END:
  case GN_MSG_JOB_STATUS:
  case GN_MSG_JOB_LOG:
  case GN_MSG_ERROR:
    gn__attest_on_message(n, peer, env, raw, raw_len);
    gn__requester_on_message(n, peer, env, raw, raw_len);
    break;
  case GN_MSG_INVOICE:
  case GN_MSG_DEBIT_NOTE:
  case GN_MSG_JOB_OUTPUT:
  case GN_MSG_JOB_SEED_GET:
    gn__requester_on_message(n, peer, env, raw, raw_len);
    break;
  case GN_MSG_EXEC_OPEN: /* gpunet exec (exec_prov.c, exec_req.c); data and windows go both ways */
  case GN_MSG_EXEC_SIGNAL:
  case GN_MSG_EXEC_CLOSE:
    gn__exec_prov_on_message(n, peer, env);
    break;
  case GN_MSG_EXEC_DATA:
  case GN_MSG_EXEC_WINDOW:
    gn__exec_prov_on_message(n, peer, env);
    gn__exec_req_on_message(n, peer, env);
    break;
  case GN_MSG_EXEC_EXIT:
    gn__exec_req_on_message(n, peer, env);
    break;
  case GN_MSG_WS_PUT: /* a lease's workspace (ws_prov.c, ws_req.c) */
  case GN_MSG_WS_GET:
  case GN_MSG_WS_STAT:
    gn__ws_prov_on_message(n, peer, env);
    break;
  case GN_MSG_WS_PUT_ACK:
  case GN_MSG_WS_DATA:
  case GN_MSG_WS_STAT_REPLY:
    gn__ws_req_on_message(n, peer, env);
    break;
  case GN_MSG_RTT_ASK:
  case GN_MSG_RTT_REPORT:
  case GN_MSG_RTT_PING:
  case GN_MSG_RTT_PONG:
    gn__rtt_on_message(n, peer, env, raw, raw_len);
    break;
  case GN_MSG_VIEW_JOIN:
  case GN_MSG_VIEW_FORWARD_JOIN:
  case GN_MSG_VIEW_NEIGHBOR:
  case GN_MSG_VIEW_NEIGHBOR_REPLY:
  case GN_MSG_VIEW_DISCONNECT:
  case GN_MSG_VIEW_SHUFFLE:
  case GN_MSG_VIEW_SHUFFLE_REPLY: {
    int vr = gn__overlay_on_message(n, peer, env);
    if (vr < 0)
      gn_log_ratelimited("view-dropped", GN_LOG_DEBUG, "dropped %s: %s", gn_msg_type_name(env->type), gn_strerror(vr));
    break;
  }
  case GN_MSG_NAT_PUNCH_REQ:
  case GN_MSG_RELAY_RESERVE:
  case GN_MSG_RELAY_STATUS:
  case GN_MSG_RELAY_CALL:
    gn__nat_on_message(n, peer, env);
    break;
  case GN_MSG_FWD_OPEN:
  case GN_MSG_FWD_DATA:
  case GN_MSG_FWD_CREDIT:
  case GN_MSG_FWD_CLOSE:
    gn__fwd_on_message(n, peer, env);
    break;
  default:
    gn_log_ratelimited("ignored-type", GN_LOG_DEBUG, "ignored message type %u", env->type);
  }
}

/* --- sessions nobody needs ------------------------------------------------*/

/* A session still counts as in use this long after its last lease, job,
 * billing, attestation or round-trip message either way: an exchange may
 * pause while one side computes (a memory walk, an image pull). */
#define GN_SESSION_USE_HOLD_MS 120000
/* ... and this long after a lease with its peer ended (the final invoice,
 * vouchers, the job's /output fetched afterwards). */
#define GN_SESSION_LEASE_HOLD_S 600

/* Whether anything of this node rides on the session to peer: a lease (any
 * role, a training gang's ranks included) not ended long ago or whose final
 * invoice is not answered, a control request waiting for the peer, bytes
 * still queued to it, or a message of its own (not the overlay's upkeep)
 * recently: a negotiation, an attestation exchange, job logs, round trips. */
static bool session_in_use(gn_node *n, const uint8_t peer[GN_PK_LEN], int64_t now_s) {
  for (const gn_lease *l = n->leases; l; l = l->next)
    if (memcmp(l->peer, peer, GN_PK_LEN) == 0 &&
        (l->state != GN_LEASE_ENDED || !l->invoice_done || l->end_s + GN_SESSION_LEASE_HOLD_S > now_s))
      return true;
  for (const gn_pending *p = n->pending; p; p = p->next)
    if (p->kind != GN_PENDING_LOGS && memcmp(p->peer, peer, GN_PK_LEN) == 0)
      return true;
  gn_transport_peer_info in;
  if (gn_transport_get_peer_info(n->tp, peer, &in) < 0)
    return false;
  return in.queued > 0 || (in.used && in.use_idle_ms < GN_SESSION_USE_HOLD_MS);
}

/* With partial views, a session is wanted while its peer is in the active
 * view; one that is not, and carries nothing of ours, is closed once the
 * peer table's grace (30 s) has passed, so that sessions per node stay near
 * the active view's size whatever the size of the network. Without views
 * every session is kept (offers go to every peer). Once a second. */
static void sweep_sessions(gn_node *n, uint64_t now_ms, int64_t now_s) {
  static uint8_t ids[512][GN_PK_LEN];
  if (!n->tp || !n->peertab || n->stopping || !gn__overlay_view_of(n, n->id->pk))
    return;
  size_t k = gn_transport_peers(n->tp, ids, GN_ARRAY_SIZE(ids));
  for (size_t i = 0; i < k && i < GN_ARRAY_SIZE(ids); i++) {
    const char *view = gn__overlay_view_of(n, ids[i]);
    gn_peertab_set_wanted(n->peertab, ids[i], view && strcmp(view, "active") == 0, now_ms);
    if (session_in_use(n, ids[i], now_s))
      gn_peertab_mark_busy(n->peertab, ids[i], now_ms);
  }
  k = gn_peertab_to_close(n->peertab, now_ms, ids, GN_ARRAY_SIZE(ids));
  for (size_t i = 0; i < k && i < GN_ARRAY_SIZE(ids); i++) {
    /* Looked at again: past 512 sessions the loop above saw only some. */
    const char *view = gn__overlay_view_of(n, ids[i]);
    if ((view && strcmp(view, "active") == 0) || session_in_use(n, ids[i], now_s)) {
      gn_peertab_mark_busy(n->peertab, ids[i], now_ms);
      continue;
    }
    char id[GN_NODE_ID_STRLEN];
    gn_node_id_format(ids[i], id);
    gn_log_ratelimited("session-closed", GN_LOG_DEBUG, "closing the session to %s: idle and not in the active view",
                       id);
    gn_transport_close_peer(n->tp, ids[i], "closed: idle and not in the active view");
  }
}

/* A PEERS entry: into the peer table and the views' passive view, which
 * dial it when they need a neighbour. */
static void disc_heard(void *ud, const uint8_t id[GN_PK_LEN], const char *addr) {
  gn_node *n = ud;
  if (gn_peertab_heard(n->peertab, id, addr, GN_PEER_HEARSAY, gn_mono_ms()) >= 0)
    gn__overlay_heard(n, id, addr);
}

/* --- timers, signals, shutdown --------------------------------------------*/

/* The offer table's standing of a provider (gn_offer_table_set_standing):
 * 1 when its offer carries an attestation report verified by a peer and
 * counted (gn__offer_attest_verdict), 2 when we also completed a lease with
 * it (as its requester, the final invoice answered), 0 otherwise: when the
 * table is full, a flood from fresh identities cannot push these out. */
static int offer_standing(void *ud, const gn_offer *o) {
  gn_node *n = ud;
  char v[256];
  gn__offer_attest_verdict(o, v, sizeof v);
  if (strncmp(v, "verified ", 9) != 0 || !strstr(v, "(checked by "))
    return 0;
  for (const gn_lease *l = n->leases; l; l = l->next)
    if (l->role == GN_ROLE_REQUESTER && l->state == GN_LEASE_ENDED && l->invoice_done &&
        memcmp(l->peer, o->provider, GN_PK_LEN) == 0)
      return 2;
  return 1;
}

static void on_tick(uv_timer_t *t) {
  gn_node *n = t->data;
  uint64_t now_ms = gn_mono_ms();
  int64_t now_s = gn_unix_s();
  gn_discovery_tick(n->disc, now_s);
  gn__provider_tick(n, now_ms, now_s);
  gn__requester_tick(n, now_ms, now_s);
  gn__exec_tick(n, now_ms);
  pending_expire(n, now_ms);
  gn__ws_prov_tick(n, now_s);
  gn__ws_req_tick(n, now_ms);
  gn__attest_tick(n, now_ms);
  static int64_t last_sweep;
  if (now_s != last_sweep) {
    last_sweep = now_s;
    sweep_sessions(n, now_ms, now_s);
  }
  static int64_t last_save;
  if (now_s - last_save >= 30) {
    last_save = now_s;
    gn_offer_table_save(n->offers, n->db);
    sqlite3_exec(n->db, "DELETE FROM job_nonces WHERE expires_s < strftime('%s','now') - 60", NULL, NULL, NULL);
  }
}

static void on_closed(void *ud) {
  gn_node *n = ud;
  n->tp = NULL; /* freed by the transport */
}

/* Jobs stopping at shutdown get up to GN_STOP_WAIT_MS to end (a cancelled
 * pull or unpack returns within a second, a runtime kill and delete within
 * a few) and to send their last status before the sessions close; past
 * GN_STOP_HARD_MS a worker that does not stop no longer holds the process. */
#define GN_STOP_WAIT_MS 10000
#define GN_STOP_HARD_MS 20000

static void on_stop_timer(uv_timer_t *t) {
  gn_node *n = t->data;
  gn__provider_kill_again(n, gn_mono_ms());
  if (gn__provider_busy(n) && gn_mono_ms() < n->stop_deadline_ms) {
    uv_timer_start(t, on_stop_timer, 100, 0);
    return;
  }
  if (gn__provider_busy(n))
    gn_log(GN_LOG_WARN, "jobs are still stopping %ds after the shutdown began; closing the network anyway",
           GN_STOP_WAIT_MS / 1000);
  uv_close((uv_handle_t *)t, NULL);
  gn__overlay_close(n);
  gn__nat_close(n);
  gn_transport_close(n->tp, on_closed, n);
}

static void on_watchdog(uv_timer_t *t) {
  gn_node *n = t->data;
  gn_log(GN_LOG_ERROR, "work on the thread pool did not stop %ds after the shutdown began; exiting anyway",
         GN_STOP_HARD_MS / 1000);
  _exit(n->exit_code ? n->exit_code : 1);
}

static void shutdown_node(gn_node *n) {
  if (n->stopping)
    return;
  n->stopping = true;
  gn_log(GN_LOG_INFO, "shutting down");
  for (gn_lease *l = n->leases; l; l = l->next)
    if (l->role == GN_ROLE_PROVIDER && l->state == GN_LEASE_ACTIVE)
      gn__provider_end_lease(n, l, "provider shut down");
  gn__provider_withdraw_offers(n);
  gn_offer_table_save(n->offers, n->db);
  for (gn_pending *p = n->pending; p;) {
    gn_pending *next = p->next;
    gn_ctl_reply_error(p->req, 503, "gpunetd is shutting down");
    gn__pending_free(p);
    p = next;
  }
  n->pending = NULL;
  gn__ws_req_shutdown(n);
  gn__attest_shutdown(n);
  gn__settle_stop(n);
  gn__overlay_stop(n);
  gn__fwd_close(n);
  gn__exec_close(n);
  uv_timer_stop(&n->tick_timer);
  uv_close((uv_handle_t *)&n->tick_timer, NULL);
  uv_close((uv_handle_t *)&n->sig_int, NULL);
  uv_close((uv_handle_t *)&n->sig_term, NULL);
  gn_ctl_close(n->ctl);
  n->ctl = NULL;
  gn_ctl_close(n->metrics_ctl);
  n->metrics_ctl = NULL;
  gn__dash_stop(n);
  /* Give queued frames (withdrawals, invoices, lease ends) a moment to
   * leave before the sessions close. */
  uv_timer_init(n->loop, &n->stop_timer);
  n->stop_timer.data = n;
  n->stop_deadline_ms = gn_mono_ms() + GN_STOP_WAIT_MS;
  uv_timer_start(&n->stop_timer, on_stop_timer, 500, 0);
  /* Does not keep the loop alive: it only bounds how long it may run. */
  uv_timer_init(n->loop, &n->watchdog);
  n->watchdog.data = n;
  uv_timer_start(&n->watchdog, on_watchdog, GN_STOP_HARD_MS, 0);
  uv_unref((uv_handle_t *)&n->watchdog);
}

static void on_signal(uv_signal_t *s, int signum) {
  (void)signum;
  shutdown_node(s->data);
}

static int ensure_dir(const char *path) {
  if (mkdir(path, 0700) < 0 && errno != EEXIST)
    return -errno;
  return 0;
}

int gn__node_main(int argc, char **argv) {
  static gn_node node;
  gn_node *n = &node;
  char err[512] = "";
  char path[PATH_MAX];
  int r;

  signal(SIGPIPE, SIG_IGN);
  r = gn_config_load(&n->cfg, argc, argv, err, sizeof err);
  if (r == GN_CONFIG_HELP) {
    fputs(gn_config_usage(), stdout);
    return 0;
  }
  if (r == GN_CONFIG_VERSION) {
    printf("gpunetd %s\n", GN_VERSION);
    return 0;
  }
  if (r < 0) {
    fprintf(stderr, "gpunetd: %s\n", err[0] ? err : gn_strerror(r));
    return 2;
  }
  gn_log_set_level(n->cfg.log_level);
  if (ensure_dir(n->cfg.data_dir) < 0) {
    fprintf(stderr, "gpunetd: cannot create data dir %s: %s\n", n->cfg.data_dir, strerror(errno));
    return 1;
  }
  gn__pathf(path, sizeof path, "%s/identity.key", n->cfg.data_dir);
  r = gn_identity_load(path, &n->id);
  if (r == GN_EPERM) {
    fprintf(stderr, "gpunetd: %s is readable by other users; refusing to start (fix with: chmod 600 %s)\n", path, path);
    return 1;
  }
  if (r < 0) {
    fprintf(stderr, "gpunetd: cannot load identity %s: %s (create it with: gpunet --data-dir %s init)\n", path,
            gn_strerror(r), n->cfg.data_dir);
    return 1;
  }
  gn_node_id_format(n->id->pk, n->node_id);
  gn__pathf(n->run_dir, sizeof n->run_dir, "%s/run", n->cfg.data_dir);
  ensure_dir(n->run_dir);
  gn__pathf(path, sizeof path, "%s/jobs", n->run_dir);
  ensure_dir(path);
  gn__pathf(path, sizeof path, "%s/images", n->cfg.data_dir);
  ensure_dir(path);
  /* Before anything starts a thread (NVML may): it may unshare a mount
   * namespace, which a threaded process cannot. */
  if ((r = gn__provider_init(n, err, sizeof err)) < 0) {
    fprintf(stderr, "gpunetd: %s\n", err);
    return 1;
  }

  if ((r = gn_gpu_discover((const char *const *)n->cfg.simulate_gpu, n->cfg.simulate_count, &n->gpus)) < 0) {
    fprintf(stderr, "gpunetd: GPU discovery failed: %s\n", gn_strerror(r));
    return 1;
  }
  if (n->cfg.provide) {
    if (n->gpus.count == 0) {
      fprintf(stderr, "gpunetd: --provide needs a GPU: none found through NVML (for development, add --simulate-gpu "
                      "\"RTX 4090\")\n");
      return 1;
    }
  }
  const char *rt_name = n->cfg.runtime[0] ? n->cfg.runtime : NULL;
  if (gn_runtime_detect(rt_name, &n->rt, n->runtime_err, sizeof n->runtime_err) == 0)
    n->have_runtime = true;
  else if (n->cfg.provide) {
    fprintf(stderr, "gpunetd: a provider needs an OCI runtime: %s\n", n->runtime_err);
    return 1;
  }
  if (n->cfg.provide && n->userns_ok) {
    /* A job's root in its user namespace is an unprivileged host uid that
     * must pass through these to reach its bundle and its image root
     * (search only: nobody else can list them). */
    chmod(n->cfg.data_dir, 0711);
    chmod(n->run_dir, 0711);
    chmod(path, 0711);
  }
  if ((r = gn_store_open(path, &n->store)) < 0) {
    fprintf(stderr, "gpunetd: cannot open image store %s: %s\n", path, gn_strerror(r));
    return 1;
  }
  /* No layer or image can be larger than the whole store may be. */
  uint64_t store_max = n->cfg.store_max_bytes;
  const gn_store_limits limits = {
      .layer_max_bytes = GN_STORE_DEFAULT_LAYER_MAX_BYTES < store_max ? GN_STORE_DEFAULT_LAYER_MAX_BYTES : store_max,
      .image_max_bytes = GN_STORE_DEFAULT_IMAGE_MAX_BYTES < store_max ? GN_STORE_DEFAULT_IMAGE_MAX_BYTES : store_max,
      .reserve_bytes = n->cfg.disk_reserve_bytes,
      .store_max_bytes = store_max,
      .registry_allow = (const char *const *)n->cfg.registry_allow,
  };
  if ((r = gn_store_set_limits(n->store, &limits)) < 0) {
    fprintf(stderr, "gpunetd: cannot set the image store's limits: %s\n", gn_strerror(r));
    return 1;
  }
  if (gn__records_open_db(n) < 0)
    return 1;
  if ((r = gn_ledger_open(n->db, &n->ledger)) < 0) {
    fprintf(stderr, "gpunetd: cannot open ledger: %s\n", gn_strerror(r));
    return 1;
  }

  n->loop = uv_default_loop();
  const gn_config_limits *lim = &n->cfg.limits;
  n->offers = gn_offer_table_new(lim->offer_table_size);
  if (!n->offers) {
    fprintf(stderr, "gpunetd: cannot make an offer table of %llu entries: out of memory\n",
            (unsigned long long)lim->offer_table_size);
    return 1;
  }
  gn_offer_table_set_max_per_provider(n->offers, lim->offers_per_provider);
  gn_offer_table_set_standing(n->offers, offer_standing, n);
  gn_offer_table_load(n->offers, n->db, gn_unix_s());
  gn_transport_cbs cbs = {.on_peer_up = on_peer_up, .on_peer_down = on_peer_down, .on_message = on_message};
  /* The configured limits (docs/overlay/limits.md); the rest stay as
   * gn_transport_limits_default has them. */
  gn_transport_limits tl;
  gn_transport_limits_default(&tl);
  tl.max_conns = lim->max_connections;
  tl.dial_reserve = lim->dial_reserve;
  tl.max_inbound_per_host = lim->max_inbound_per_ip;
  tl.max_inbound_per_net = lim->max_inbound_per_net;
  tl.max_unauth = lim->max_handshaking;
  tl.mem_budget = lim->transport_memory;
  tl.sendq_max = tl.sendq_max < tl.mem_budget ? tl.sendq_max : tl.mem_budget;
  tl.handshake_timeout_ms = lim->handshake_timeout_s * 1000;
  tl.idle_timeout_ms = lim->idle_timeout_s * 1000;
  tl.msg_timeout_ms = lim->progress_timeout_s * 1000;
  tl.send_stall_ms = lim->send_stall_s * 1000;
  if ((r = gn_transport_new(n->loop, n->id, &cbs, n, &n->tp)) < 0 || (r = gn_transport_set_limits(n->tp, &tl)) < 0 ||
      (r = gn_transport_listen(n->tp, n->cfg.listen)) < 0) {
    fprintf(stderr, "gpunetd: cannot listen on %s: %s\n", n->cfg.listen, gn_strerror(r));
    return 1;
  }
  gn_transport_set_refused_cb(n->tp, on_refused);
  gn_transport_set_limit_cb(n->tp, on_limit);
  if ((r = gn_peertab_new(NULL, &n->peertab)) < 0) {
    fprintf(stderr, "gpunetd: cannot make the peer table: %s\n", gn_strerror(r));
    return 1;
  }
  gn_discovery_io io = {disc_send, disc_connect, n};
  if ((r = gn_discovery_new(n->id, &io, n->offers, &n->disc)) < 0) {
    fprintf(stderr, "gpunetd: cannot start discovery: %s\n", gn_strerror(r));
    return 1;
  }
  gn_discovery_config dc;
  gn_discovery_config_default(&dc);
  dc.peer_digests = (uint32_t)lim->gossip_peer_digests;
  dc.peer_wants = (uint32_t)lim->gossip_peer_wants;
  dc.peer_sync_bytes = lim->gossip_peer_bytes;
  /* The totals stay as they are unless one peer may now take more. */
  dc.digests_per_period = dc.digests_per_period > dc.peer_digests ? dc.digests_per_period : dc.peer_digests;
  dc.sync_bytes = dc.sync_bytes > dc.peer_sync_bytes ? dc.sync_bytes : dc.peer_sync_bytes;
  if ((r = gn_discovery_set_config(n->disc, &dc)) < 0) {
    fprintf(stderr, "gpunetd: cannot set discovery's limits: %s\n", gn_strerror(r));
    return 1;
  }
  gn_discovery_set_connect_peer(n->disc, disc_connect_peer);
  gn_discovery_set_self_addr(n->disc, gn_transport_listen_addr(n->tp));
  for (size_t i = 0; i < n->cfg.bootstrap_count; i++)
    gn_discovery_add_bootstrap(n->disc, n->cfg.bootstrap[i]);
  if ((r = gn__overlay_start(n, err, sizeof err)) < 0) {
    fprintf(stderr, "gpunetd: %s\n", err);
    return 1;
  }
  if ((r = gn__nat_start(n)) < 0) {
    fprintf(stderr, "gpunetd: cannot start NAT traversal: %s\n", gn_strerror(r));
    return 1;
  }
  if ((r = gn__fwd_start(n)) < 0) {
    fprintf(stderr, "gpunetd: cannot start port forwarding: %s\n", gn_strerror(r));
    return 1;
  }
  /* With partial views, PEERS entries feed the peer table and the passive
   * view instead of being dialled. */
  if (gn__overlay_view_of(n, n->id->pk))
    gn_discovery_set_heard(n->disc, disc_heard);

  gn__pathf(path, sizeof path, "%s/gpunetd.sock", n->cfg.data_dir);
  if ((r = gn_ctl_new(n->loop, path, &n->ctl)) < 0) {
    fprintf(stderr, "gpunetd: cannot serve the control API on %s: %s%s\n", path, gn_strerror(r),
            r == GN_EBUSY ? " (another gpunetd runs with this data dir)" : "");
    return 1;
  }
  /* The agents' routes and hooks: the API answers long polls when a job
   * changes; a provided job is stopped by the provider. */
  gn__api_register(n);
  if (n->cfg.metrics_listen[0] && (r = gn__api_metrics_listen(n)) < 0) {
    fprintf(stderr, "gpunetd: cannot serve metrics on %s: %s\n", n->cfg.metrics_listen, gn_strerror(r));
    return 1;
  }
  gn__requester_register(n);
  gn__ws_register(n);
  if ((r = gn__exec_start(n)) < 0) {
    fprintf(stderr, "gpunetd: cannot serve gpunet exec on %s/gpunetd-exec.sock: %s\n", n->cfg.data_dir, gn_strerror(r));
    return 1;
  }
  gn__attest_register(n);
  gn__settle_register(n);
  gn__overlay_register(n);
  gn__nat_register(n);
  gn__fwd_register(n);
  n->job_changed = gn__api_logs_wake;
  n->stop_provided_job = gn__provider_stop_job;
  if ((r = gn__settle_start(n, err, sizeof err)) < 0) {
    fprintf(stderr, "gpunetd: %s\n", err);
    return 1;
  }
  load_state(n);
  if (n->cfg.dashboard_listen[0] && gn__dash_start(n, err, sizeof err) < 0) {
    fprintf(stderr, "gpunetd: %s\n", err);
    return 1;
  }

  uv_timer_init(n->loop, &n->tick_timer);
  n->tick_timer.data = n;
  uv_timer_start(&n->tick_timer, on_tick, 200, 250);
  uv_signal_init(n->loop, &n->sig_int);
  uv_signal_init(n->loop, &n->sig_term);
  n->sig_int.data = n->sig_term.data = n;
  uv_signal_start(&n->sig_int, on_signal, SIGINT);
  uv_signal_start(&n->sig_term, on_signal, SIGTERM);

  gn_log(GN_LOG_INFO, "gpunetd %s node %s listening on %s, control %s", GN_VERSION, n->node_id,
         gn_transport_listen_addr(n->tp), path);
  for (size_t i = 0; i < n->gpus.count; i++)
    gn_log(GN_LOG_INFO, "gpu %zu: %s (%llu MiB)%s", i, n->gpus.items[i].name,
           (unsigned long long)n->gpus.items[i].memory_mib, n->gpus.items[i].simulated ? " SIMULATED" : "");
  if (n->have_runtime)
    gn_log(GN_LOG_INFO, "OCI runtime: %s %s", n->rt.path, n->rt.version);
  if (n->cfg.provide) {
    gn__attest_start_local(n);
    gn__provider_publish_offers(n, gn_unix_s());
  }

  uv_run(n->loop, UV_RUN_DEFAULT);
  if (n->stopping) {
    uv_close((uv_handle_t *)&n->watchdog, NULL);
    uv_run(n->loop, UV_RUN_NOWAIT);
  }

  gn_log(GN_LOG_INFO, "stopped");
  gn__dash_free(n);
  gn__overlay_free(n);
  gn__nat_free(n);
  gn__fwd_free(n);
  free(n->exec);
  n->exec = NULL;
  n->disc = gn_discovery_free(n->disc);
  n->peertab = gn_peertab_free(n->peertab);
  n->offers = gn_offer_table_free(n->offers);
  gn__settle_free(n);
  n->ledger = gn_ledger_free(n->ledger);
  sqlite3_close(n->db);
  n->store = gn_store_free(n->store);
  n->id = gn_identity_free(n->id);
  gn_gpu_list_done(&n->gpus);
  gn_config_done(&n->cfg);
  uv_loop_close(n->loop);
  return n->exit_code;
}
