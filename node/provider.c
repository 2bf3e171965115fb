/* The provider agent: offers for the local GPUs, accepting lease requests,
 * the per-second meter, running signed job manifests in the sandbox, and the
 * invoice at the end of each lease. */
#include "node_internal.h"

#include <ftw.h>
#include <limits.h>
#include <signal.h>
#include <sodium.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

/* --- offers -----------------------------------------------------------------*/

static uint32_t gpus_free_of(gn_node *n, const char *model, uint32_t *ret_total) {
  uint32_t free_n = 0, total = 0;
  for (size_t i = 0; i < n->gpus.count; i++) {
    if (strcmp(n->gpus.items[i].name, model) != 0)
      continue;
    total++;
    if (!n->gpu_leased_by[i][0])
      free_n++;
  }
  *ret_total = total;
  return free_n;
}

static bool model_seen_before(gn_node *n, size_t upto) {
  for (size_t k = 0; k < upto; k++)
    if (strcmp(n->gpus.items[k].name, n->gpus.items[upto].name) == 0)
      return true;
  return false;
}

/* Offer sequence numbers must grow across restarts too, or peers would keep
 * a stale offer from the previous run: derive them from the wall clock. */
static uint64_t next_seq(gn_node *n, int64_t now_s) {
  uint64_t s = (uint64_t)now_s * 1000u;
  n->offer_seq = s > n->offer_seq ? s : n->offer_seq + 1;
  return n->offer_seq;
}

void gn__provider_publish_offers(gn_node *n, int64_t now_s) {
  if (!n->cfg.provide || n->stopping)
    return;
  for (size_t i = 0; i < n->gpus.count; i++) {
    if (model_seen_before(n, i))
      continue;
    const gn_gpu *g = &n->gpus.items[i];
    gn_offer o;
    memset(&o, 0, sizeof o);
    memcpy(o.provider, n->id->pk, GN_PK_LEN);
    o.seq = next_seq(n, now_s);
    o.issued_s = now_s;
    o.expires_s = now_s + GN_OFFER_TTL_S;
    gn__strf(o.addr, sizeof o.addr, "%s", gn_transport_listen_addr(n->tp));
    gn__strf(o.gpu_model, sizeof o.gpu_model, "%s", g->name);
    o.vram_mib = (uint32_t)g->memory_mib;
    o.gpus_free = gpus_free_of(n, g->name, &o.gpus_total);
    o.price_uper_hour = n->cfg.price_uper_hour;
    gn__strf(o.currency, sizeof o.currency, "%s", n->cfg.currency);
    o.max_hours = n->cfg.max_hours;
    o.simulated = g->simulated;
    const gn_attest_local *a = gn__attest_local_find(n, g->name);
    if (a && a->report_env.len && a->report_env.len <= sizeof o.attest) {
      memcpy(o.attest, a->report_env.data, a->report_env.len);
      o.attest_len = (uint32_t)a->report_env.len;
    }
    gn_buf env = {0};
    int r = gn_offer_seal(n->id, &o, &env);
    if (r == 0)
      r = gn_discovery_publish(n->disc, env.data, env.len, now_s);
    if (r < 0)
      gn_log(GN_LOG_WARN, "cannot publish offer for %s: %s", g->name, gn_strerror(r));
    gn_buf_done(&env);
  }
  n->offer_published_s = now_s;
  n->offers_dirty = false;
}

void gn__provider_withdraw_offers(gn_node *n) {
  if (!n->cfg.provide)
    return;
  gn_buf env = {0};
  if (gn_offer_withdraw_seal(n->id, n->offer_seq, &env) == 0) {
    gn_discovery_publish(n->disc, env.data, env.len, gn_unix_s());
  }
  gn_buf_done(&env);
}

/* --- leases -----------------------------------------------------------------*/

static void send_simple(gn_node *n, const uint8_t peer[GN_PK_LEN], uint32_t type, const char *lease_id,
                        const char *reason, int64_t end_s) {
  gn_wire_writer w;
  gn_wire_writer_init(&w);
  gn_wire_put_map(&w, end_s ? 3 : 2);
  gn_wire_put_str(&w, "lease_id");
  gn_wire_put_str(&w, lease_id);
  gn_wire_put_str(&w, "reason");
  gn_wire_put_str(&w, reason ? reason : "");
  if (end_s) {
    gn_wire_put_str(&w, "end_s");
    gn_wire_put_i64(&w, end_s);
  }
  gn__node_send(n, peer, type, &w);
  gn_wire_writer_done(&w);
}

static void reject_lease(gn_node *n, const uint8_t peer[GN_PK_LEN], const char *lease_id, const char *reason) {
  char pid[GN_NODE_ID_STRLEN];
  gn_node_id_format(peer, pid);
  gn_log(GN_LOG_INFO, "rejecting lease %s from %s: %s", lease_id, pid, reason);
  send_simple(n, peer, GN_MSG_LEASE_REJECT, lease_id, reason, 0);
}

static void on_lease_request(gn_node *n, const uint8_t peer[GN_PK_LEN], const uint8_t *raw, size_t raw_len) {
  gn_lease_terms t;
  char reason[256];
  int64_t now_s = gn_unix_s();
  int r = gn_lease_request_open(raw, raw_len, &t);
  if (r < 0) {
    gn_log(GN_LOG_WARN, "malformed lease request: %s", gn_strerror(r));
    return;
  }
  if (!n->cfg.provide) {
    reject_lease(n, peer, t.lease_id, "this node does not provide GPUs");
    return;
  }
  if (memcmp(t.provider, n->id->pk, GN_PK_LEN) != 0 || memcmp(t.requester, peer, GN_PK_LEN) != 0) {
    reject_lease(n, peer, t.lease_id, "the request names another provider or requester");
    return;
  }
  if (gn__lease_find(n, t.lease_id)) {
    reject_lease(n, peer, t.lease_id, "lease id already used (replayed request?)");
    return;
  }
  if (t.requested_s < now_s - 300 || t.requested_s > now_s + 300) {
    reject_lease(n, peer, t.lease_id, "request time is more than 5 minutes off this provider's clock");
    return;
  }
  uint32_t total = 0, free_n = gpus_free_of(n, t.gpu_model, &total);
  if (total == 0) {
    gn__strf(reason, sizeof reason, "no %s here", t.gpu_model);
    reject_lease(n, peer, t.lease_id, reason);
    return;
  }
  if (t.count < 1 || t.count > free_n) {
    gn__strf(reason, sizeof reason, "asked for %u x %s but %u of %u are free", t.count, t.gpu_model, free_n, total);
    reject_lease(n, peer, t.lease_id, reason);
    return;
  }
  if (strcmp(t.currency, n->cfg.currency) != 0 || t.price_uper_hour < n->cfg.price_uper_hour) {
    char want[32];
    gn_price_format(n->cfg.price_uper_hour, want, sizeof want);
    gn__strf(reason, sizeof reason, "price below this provider's %s %s per GPU-hour", want, n->cfg.currency);
    reject_lease(n, peer, t.lease_id, reason);
    return;
  }
  if (t.max_s < 1 || t.max_s > (uint64_t)n->cfg.max_hours * 3600u) {
    gn__strf(reason, sizeof reason, "duration must be between 1 second and %u hours", n->cfg.max_hours);
    reject_lease(n, peer, t.lease_id, reason);
    return;
  }
  bool simulated = false;
  const char *uuids[GN_LEASE_MAX_GPUS];
  int idx[GN_LEASE_MAX_GPUS];
  uint32_t got = 0;
  for (size_t i = 0; i < n->gpus.count && got < t.count; i++) {
    if (strcmp(n->gpus.items[i].name, t.gpu_model) != 0 || n->gpu_leased_by[i][0])
      continue;
    simulated |= n->gpus.items[i].simulated;
    uuids[got] = n->gpus.items[i].uuid;
    idx[got++] = (int)i;
  }
  if (simulated && !t.simulated) {
    reject_lease(n, peer, t.lease_id, "these GPUs are SIMULATED and the request did not accept simulated GPUs");
    return;
  }

  gn_lease *l = calloc(1, sizeof *l);
  if (!l)
    return;
  r = gn_agreement_seal(n->id, raw, raw_len, now_s, uuids, got, &l->agreement_env);
  if (r == 0)
    r = gn_agreement_open(l->agreement_env.data, l->agreement_env.len, &l->ag);
  if (r == 0)
    r = gn_ledger_begin_lease(n->ledger, t.lease_id, l->agreement_env.data, l->agreement_env.len);
  if (r < 0) {
    gn_log(GN_LOG_ERROR, "cannot record lease %s: %s", t.lease_id, gn_strerror(r));
    reject_lease(n, peer, t.lease_id, "provider could not record the lease");
    gn_buf_done(&l->agreement_env);
    free(l);
    return;
  }
  gn__strf(l->id, sizeof l->id, "%s", t.lease_id);
  l->role = GN_ROLE_PROVIDER;
  memcpy(l->peer, peer, GN_PK_LEN);
  l->state = GN_LEASE_ACTIVE;
  l->start_mono_ms = gn_mono_ms();
  gn_meter_start(&l->meter, l->start_mono_ms, t.max_s);
  for (int i = 0; i < GN_LEASE_MAX_GPUS; i++)
    l->gpu_index[i] = -1;
  for (uint32_t i = 0; i < got; i++) {
    l->gpu_index[i] = idx[i];
    gn__strf(n->gpu_leased_by[idx[i]], sizeof n->gpu_leased_by[0], "%s", l->id);
  }
  l->next = n->leases;
  n->leases = l;
  gn__node_persist_lease(n, l);
  char pid[GN_NODE_ID_STRLEN], price[32];
  gn_node_id_format(peer, pid);
  gn_price_format(t.price_uper_hour, price, sizeof price);
  gn_log(GN_LOG_INFO, "lease %s: %u x %s to %s at %s %s/GPU-hour for at most %llus", l->id, got, t.gpu_model, pid,
         price, t.currency, (unsigned long long)t.max_s);
  gn_transport_send(n->tp, peer, l->agreement_env.data, l->agreement_env.len);
  n->offers_dirty = true;
}

static void send_invoice(gn_node *n, gn_lease *l) {
  if (!l->invoice_env.len || !gn_transport_is_up(n->tp, l->peer))
    return;
  gn_transport_send(n->tp, l->peer, l->invoice_env.data, l->invoice_env.len);
}

void gn__provider_end_lease(gn_node *n, gn_lease *l, const char *reason) {
  if (l->state != GN_LEASE_ACTIVE)
    return;
  for (gn_job *j = n->jobs; j; j = j->next)
    if (j->role == GN_ROLE_PROVIDER && strcmp(j->lease_id, l->id) == 0)
      gn__provider_stop_job(n, j);
  l->state = GN_LEASE_ENDED;
  l->end_s = gn_unix_s();
  gn__strf(l->end_reason, sizeof l->end_reason, "%s", reason);
  for (int i = 0; i < GN_LEASE_MAX_GPUS; i++)
    if (l->gpu_index[i] >= 0)
      n->gpu_leased_by[l->gpu_index[i]][0] = 0;
  gn_buf_done(&l->invoice_env);
  int r = gn_invoice_seal(n->ledger, n->id, l->id, l->end_s, reason, &l->invoice_env);
  if (r == 0)
    r = gn_ledger_store_invoice(n->ledger, l->id, "provider", l->invoice_env.data, l->invoice_env.len, NULL, 0,
                                "issued");
  if (r < 0)
    gn_log(GN_LOG_ERROR, "cannot invoice lease %s: %s", l->id, gn_strerror(r));
  gn__node_persist_lease(n, l);
  char price[32];
  gn_price_format(gn_price_cost(l->ag.terms.price_uper_hour, l->ag.terms.count, l->seconds), price, sizeof price);
  gn_log(GN_LOG_INFO, "lease %s ended (%s): %llu seconds, %s %s", l->id, reason, (unsigned long long)l->seconds, price,
         l->ag.terms.currency);
  if (gn_transport_is_up(n->tp, l->peer))
    send_simple(n, l->peer, GN_MSG_LEASE_END, l->id, reason, l->end_s);
  send_invoice(n, l);
  n->offers_dirty = true;
}

void gn__provider_peer_up(gn_node *n, const uint8_t peer[GN_PK_LEN]) {
  /* Invoices the requester has not answered yet are sent again. */
  for (gn_lease *l = n->leases; l; l = l->next)
    if (l->role == GN_ROLE_PROVIDER && l->state == GN_LEASE_ENDED && !l->invoice_done &&
        memcmp(l->peer, peer, GN_PK_LEN) == 0) {
      if (!l->invoice_env.len)
        gn_invoice_seal(n->ledger, n->id, l->id, l->end_s, l->end_reason, &l->invoice_env);
      send_invoice(n, l);
    }
}

/* The requester's answer to an invoice: it must be signed by the lease's
 * requester and name the exact invoice bytes this provider sent. */
static void on_invoice_answer(gn_node *n, const uint8_t peer[GN_PK_LEN], const uint8_t *raw, size_t raw_len) {
  for (gn_lease *l = n->leases; l; l = l->next) {
    if (l->role != GN_ROLE_PROVIDER || !l->invoice_env.len || l->invoice_done || memcmp(l->peer, peer, GN_PK_LEN) != 0)
      continue;
    gn_invoice_response resp;
    if (gn_invoice_response_open(raw, raw_len, l->invoice_env.data, l->invoice_env.len, &resp) < 0 ||
        strcmp(resp.lease_id, l->id) != 0)
      continue;
    const char *status = resp.accepted ? "accepted" : "rejected";
    int r = gn_ledger_store_invoice(n->ledger, l->id, "provider", l->invoice_env.data, l->invoice_env.len, raw, raw_len,
                                    status);
    if (r < 0)
      gn_log(GN_LOG_ERROR, "cannot store the answer to invoice of lease %s: %s", l->id, gn_strerror(r));
    if (resp.accepted)
      gn_log(GN_LOG_INFO, "invoice for lease %s countersigned by the requester", l->id);
    else
      gn_log(GN_LOG_WARN, "requester rejected the invoice for lease %s: %s", l->id, resp.reason);
    l->invoice_done = true;
    gn__node_persist_lease(n, l);
    return;
  }
  gn_log(GN_LOG_WARN, "answer to an invoice this provider did not send, or does not verify; ignored");
}

/* --- jobs -------------------------------------------------------------------*/

static void send_job_status(gn_node *n, gn_job *j, const gn_lease *l) {
  gn_wire_writer w;
  gn_wire_writer_init(&w);
  gn_wire_put_map(&w, 6);
  gn_wire_put_str(&w, "job_id");
  gn_wire_put_str(&w, j->id);
  gn_wire_put_str(&w, "lease_id");
  gn_wire_put_str(&w, j->lease_id);
  gn_wire_put_str(&w, "state");
  gn_wire_put_str(&w, gn__job_state_name(j->state));
  gn_wire_put_str(&w, "exit_code");
  gn_wire_put_i64(&w, j->exit_code);
  gn_wire_put_str(&w, "reason");
  gn_wire_put_str(&w, j->error);
  gn_wire_put_str(&w, "digest");
  gn_wire_put_str(&w, j->digest);
  gn__node_send(n, l->peer, GN_MSG_JOB_STATUS, &w);
  gn_wire_writer_done(&w);
}

static void reject_job(gn_node *n, const uint8_t peer[GN_PK_LEN], const char *job_id, const char *lease_id,
                       const char *reason) {
  char pid[GN_NODE_ID_STRLEN];
  gn_node_id_format(peer, pid);
  gn_log(GN_LOG_WARN, "rejecting job %s from %s: %s", job_id, pid, reason);
  gn_wire_writer w;
  gn_wire_writer_init(&w);
  gn_wire_put_map(&w, 5);
  gn_wire_put_str(&w, "job_id");
  gn_wire_put_str(&w, job_id);
  gn_wire_put_str(&w, "lease_id");
  gn_wire_put_str(&w, lease_id);
  gn_wire_put_str(&w, "state");
  gn_wire_put_str(&w, "rejected");
  gn_wire_put_str(&w, "exit_code");
  gn_wire_put_i64(&w, -1);
  gn_wire_put_str(&w, "reason");
  gn_wire_put_str(&w, reason);
  gn__node_send(n, peer, GN_MSG_JOB_STATUS, &w);
  gn_wire_writer_done(&w);
}

static gn_lease *job_lease(gn_node *n, gn_job *j) {
  return gn__lease_find(n, j->lease_id);
}

static int rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
  (void)sb;
  (void)flag;
  (void)ftw;
  remove(path);
  return 0;
}

static void job_finish(gn_node *n, gn_job *j) {
  j->ended_s = gn_unix_s();
  gn__node_persist_job(n, j);
  gn_lease *l = job_lease(n, j);
  if (l)
    send_job_status(n, j, l);
  gn_log(GN_LOG_INFO, "job %s %s%s%s (exit code %d)", j->id, gn__job_state_name(j->state), j->error[0] ? ": " : "",
         j->error, j->exit_code);
  if (n->have_runtime && j->container_id[0]) {
    char **argv = NULL;
    int status;
    if (gn_runtime_argv_delete(&n->rt, n->run_dir, j->container_id, &argv) == 0) {
      gn_runtime_exec(argv, &status);
      gn_argv_free(argv);
    }
  }
  if (j->bundle[0])
    nftw(j->bundle, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
}

static void on_job_handle_closed(uv_handle_t *h) {
  gn_job *j = h->data;
  if (--j->handles_open == 0)
    job_finish(j->node, j);
}

static void on_job_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf) {
  (void)h;
  (void)suggested;
  static char slab[GN_JOB_LOG_CHUNK];
  *buf = uv_buf_init(slab, sizeof slab);
}

static void on_job_output(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf) {
  gn_job *j = s->data;
  gn_node *n = j->node;
  if (nread < 0) {
    uv_close((uv_handle_t *)s, on_job_handle_closed);
    return;
  }
  if (nread == 0)
    return;
  /* A job that prints without end must not fill the provider's disk, nor
   * the requester's: past GN_JOB_LOG_MAX its output is dropped, once said. */
  static const char cut[] = "\n[gpunet: output beyond 64 MiB dropped]\n";
  if (j->log_cut)
    return;
  if (j->log_len + (uint64_t)nread > GN_JOB_LOG_MAX) {
    memcpy(buf->base, cut, sizeof cut - 1);
    nread = (ssize_t)(sizeof cut - 1);
    j->log_cut = true;
  }
  uint64_t offset = j->log_len;
  gn__job_append_log(j, (const uint8_t *)buf->base, (size_t)nread);
  gn_lease *l = job_lease(n, j);
  if (!l || !gn_transport_is_up(n->tp, l->peer))
    return;
  gn_wire_writer w;
  gn_wire_writer_init(&w);
  gn_wire_put_map(&w, 4);
  gn_wire_put_str(&w, "job_id");
  gn_wire_put_str(&w, j->id);
  gn_wire_put_str(&w, "lease_id");
  gn_wire_put_str(&w, j->lease_id);
  gn_wire_put_str(&w, "offset");
  gn_wire_put_u64(&w, offset);
  gn_wire_put_str(&w, "data");
  gn_wire_put_bin(&w, buf->base, (size_t)nread);
  gn__node_send(n, l->peer, GN_MSG_JOB_LOG, &w);
  gn_wire_writer_done(&w);
}

static void on_job_exit(uv_process_t *p, int64_t status, int term_signal) {
  gn_job *j = p->data;
  j->proc_running = false;
  j->exit_code = term_signal ? 128 + term_signal : (int)status;
  j->state = j->stop_requested ? GN_JOB_STOPPED : GN_JOB_EXITED;
  uv_close((uv_handle_t *)p, on_job_handle_closed);
}

/* Pull, unpack and write the bundle: blocking, on the thread pool. */
static void job_prepare_work(uv_work_t *w) {
  gn_job *j = w->data;
  gn_node *n = j->node;
  gn_imageref ref;
  gn_image img;
  char rootfs[PATH_MAX];
  memset(&img, 0, sizeof img);
  j->work_rc = gn_imageref_parse(j->image, &ref);
  if (j->work_rc < 0) {
    gn__strf(j->work_err, sizeof j->work_err, "bad image reference %s", j->image);
    return;
  }
  j->work_rc = gn_store_pull(n->store, &ref, NULL, NULL, &img, j->work_err, sizeof j->work_err);
  if (j->work_rc < 0)
    return;
  gn__pathf(rootfs, sizeof rootfs, "%s/rootfs", j->bundle);
  mkdir(j->bundle, 0700);
  j->work_rc = gn_store_unpack(n->store, &img, rootfs, j->work_err, sizeof j->work_err);
  if (j->work_rc < 0)
    goto out;

  /* The manifest's command runs as given; the image's entrypoint is not
   * prepended, so what the requester signed is exactly what runs. */
  const char *argv[GN_JOB_MAX_ARGS + 1];
  const char *env[GN_JOB_MAX_ARGS + 16];
  size_t ac = 0, ec = 0;
  for (size_t i = 0; i < json_array_size(j->cmd) && ac < GN_JOB_MAX_ARGS; i++)
    argv[ac++] = json_string_value(json_array_get(j->cmd, i));
  argv[ac] = NULL;
  for (size_t i = 0; img.env && img.env[i] && ec < 8; i++)
    env[ec++] = img.env[i];
  for (size_t i = 0; i < json_array_size(j->env) && ec < GN_JOB_MAX_ARGS + 8; i++)
    env[ec++] = json_string_value(json_array_get(j->env, i));
  const char *devices[GN_LEASE_MAX_GPUS + 1];
  for (size_t i = 0; i < j->ndev; i++)
    devices[i] = j->devices[i];
  devices[j->ndev] = NULL;
  env[ec] = NULL;
  gn_bundle_spec spec = {
      .rootfs = "rootfs",
      .argv = argv,
      .env = env,
      .cwd = img.workdir[0] ? img.workdir : "/",
      .hostname = j->id,
      .network = false,
      .memory_bytes = j->memory_mib << 20,
      .pids_max = j->pids_max,
      .nofile = 1024,
      .devices = devices,
      .visible_devices = j->visible[0] ? j->visible : NULL,
      .cgroup_limits = j->cgroup_limits,
  };
  j->work_rc = gn_bundle_write(j->bundle, &spec);
  if (j->work_rc < 0)
    gn__strf(j->work_err, sizeof j->work_err, "cannot write the OCI bundle: %s", gn_strerror(j->work_rc));
out:
  gn_image_done(&img);
}

static void job_prepare_done(uv_work_t *w, int status) {
  gn_job *j = w->data;
  gn_node *n = j->node;
  gn_lease *l = job_lease(n, j);
  if (status < 0 || j->work_rc < 0 || j->stop_requested || !l || l->state != GN_LEASE_ACTIVE) {
    j->state = j->stop_requested || (l && l->state != GN_LEASE_ACTIVE) ? GN_JOB_STOPPED : GN_JOB_FAILED;
    if (j->state == GN_JOB_FAILED)
      gn__strf(j->error, sizeof j->error, "%s", j->work_err[0] ? j->work_err : gn_strerror(j->work_rc));
    job_finish(n, j);
    return;
  }
  char **argv = NULL;
  int r = gn_runtime_argv_run(&n->rt, n->run_dir, j->bundle, j->container_id, &argv);
  if (r == 0) {
    uv_pipe_init(n->loop, &j->out_pipe, 0);
    uv_pipe_init(n->loop, &j->err_pipe, 0);
    j->out_pipe.data = j->err_pipe.data = j->proc.data = j;
    uv_stdio_container_t stdio[3];
    stdio[0].flags = UV_IGNORE;
    stdio[1].flags = UV_CREATE_PIPE | UV_WRITABLE_PIPE;
    stdio[1].data.stream = (uv_stream_t *)&j->out_pipe;
    stdio[2].flags = UV_CREATE_PIPE | UV_WRITABLE_PIPE;
    stdio[2].data.stream = (uv_stream_t *)&j->err_pipe;
    uv_process_options_t opt = {0};
    opt.file = argv[0];
    opt.args = argv;
    opt.exit_cb = on_job_exit;
    opt.stdio = stdio;
    opt.stdio_count = 3;
    r = uv_spawn(n->loop, &j->proc, &opt);
    j->handles_open = 2;
    if (r < 0) {
      uv_close((uv_handle_t *)&j->out_pipe, on_job_handle_closed);
      uv_close((uv_handle_t *)&j->err_pipe, on_job_handle_closed);
      j->state = GN_JOB_FAILED;
      gn__strf(j->error, sizeof j->error, "cannot start %s: %s", argv[0], uv_strerror(r));
    } else {
      j->handles_open = 3;
      j->proc_running = true;
      j->state = GN_JOB_RUNNING;
      uv_read_start((uv_stream_t *)&j->out_pipe, on_job_alloc, on_job_output);
      uv_read_start((uv_stream_t *)&j->err_pipe, on_job_alloc, on_job_output);
      gn__node_persist_job(n, j);
      send_job_status(n, j, l);
      gn_log(GN_LOG_INFO, "job %s running %s", j->id, j->image);
    }
  } else {
    j->state = GN_JOB_FAILED;
    gn__strf(j->error, sizeof j->error, "cannot build the runtime command: %s", gn_strerror(r));
    job_finish(n, j);
  }
  gn_argv_free(argv);
}

static void on_job_manifest(gn_node *n, const uint8_t peer[GN_PK_LEN], const gn_envelope *env, const uint8_t *raw,
                            size_t raw_len) {
  gn_jobman m;
  char reason[300];
  int64_t now_s = gn_unix_s();
  int r = gn__jobman_decode(env->body, env->body_len, &m);
  if (r < 0) {
    gn_log(GN_LOG_WARN, "malformed job manifest: %s", gn_strerror(r));
    reject_job(n, peer, "?", "?", "malformed job manifest");
    return;
  }
  gn_lease *l = gn__lease_find(n, m.lease_id);
  gn_imageref ref;
  if (!l || l->role != GN_ROLE_PROVIDER) {
    gn__strf(reason, sizeof reason, "no lease %s on this provider", m.lease_id);
    goto reject;
  }
  if (memcmp(env->signer, l->ag.terms.requester, GN_PK_LEN) != 0) {
    gn__strf(reason, sizeof reason, "manifest for lease %s is not signed by the lease holder", m.lease_id);
    goto reject;
  }
  if (l->state != GN_LEASE_ACTIVE) {
    gn__strf(reason, sizeof reason, "lease %s is not active (%s)", m.lease_id, l->end_reason);
    goto reject;
  }
  if (m.expires_s < now_s) {
    gn__strf(reason, sizeof reason, "manifest expired %llds ago", (long long)(now_s - m.expires_s));
    goto reject;
  }
  if (m.expires_s > now_s + GN_MANIFEST_MAX_TTL_S || m.issued_s > now_s + 300) {
    gn__strf(reason, sizeof reason, "manifest validity is more than %ds in the future", GN_MANIFEST_MAX_TTL_S);
    goto reject;
  }
  size_t active = 0;
  for (gn_job *o = n->jobs; o; o = o->next)
    active += strcmp(o->lease_id, l->id) == 0 && (o->state == GN_JOB_PULLING || o->state == GN_JOB_RUNNING);
  if (active >= GN_LEASE_MAX_JOBS) {
    gn__strf(reason, sizeof reason, "lease %s already has %zu jobs running; stop one first", m.lease_id, active);
    goto reject;
  }
  if (gn__job_find(n, m.job_id)) {
    gn__strf(reason, sizeof reason, "job id %s already used: replayed manifest", m.job_id);
    goto reject;
  }
  if (gn_imageref_parse(m.image, &ref) < 0 || !ref.digest[0]) {
    gn__strf(reason, sizeof reason, "image %s is not a reference pinned to a digest", m.image);
    goto reject;
  }
  /* The nonce is remembered (durably) until long after the manifest's
   * expiry, so a replay is refused even across restarts. */
  sqlite3_stmt *st = NULL;
  sqlite3_prepare_v2(n->db, "INSERT INTO job_nonces(nonce, expires_s) VALUES(?, ?)", -1, &st, NULL);
  sqlite3_bind_blob(st, 1, m.nonce, sizeof m.nonce, SQLITE_STATIC);
  sqlite3_bind_int64(st, 2, m.expires_s);
  r = sqlite3_step(st);
  sqlite3_finalize(st);
  if (r != SQLITE_DONE) {
    gn__strf(reason, sizeof reason, "manifest nonce already seen: replayed manifest");
    goto reject;
  }

  gn_job *j = calloc(1, sizeof *j);
  if (!j) {
    gn__jobman_done(&m);
    return;
  }
  j->node = n;
  gn__strf(j->id, sizeof j->id, "%s", m.job_id);
  gn__strf(j->lease_id, sizeof j->lease_id, "%s", m.lease_id);
  j->role = GN_ROLE_PROVIDER;
  gn__strf(j->image, sizeof j->image, "%s", m.image);
  gn__strf(j->digest, sizeof j->digest, "%s", ref.digest);
  j->cmd = json_array();
  for (uint32_t i = 0; i < m.argc; i++)
    json_array_append_new(j->cmd, json_string(m.argv[i]));
  j->env = json_array();
  for (uint32_t i = 0; i < m.envc; i++)
    json_array_append_new(j->env, json_string(m.env[i]));
  j->state = GN_JOB_PULLING;
  j->exit_code = -1;
  j->created_s = now_s;
  /* The manifest's limits apply within this provider's policy bounds. */
  j->memory_mib = m.memory_mib < 16 ? 16 : m.memory_mib > 65536 ? 65536 : m.memory_mib;
  j->pids_max = m.pids < 8 ? 8 : m.pids > 4096 ? 4096 : m.pids;
  char jobs_dir[sizeof n->run_dir + 8]; /* paths from the job id: one checked component each */
  gn__pathf(jobs_dir, sizeof jobs_dir, "%s/jobs", n->run_dir);
  gn_path_join(j->log_path, sizeof j->log_path, jobs_dir, NULL, j->id, ".log");
  gn_path_join(j->bundle, sizeof j->bundle, n->run_dir, "bundle-", j->id, NULL);
  gn__strf(j->container_id, sizeof j->container_id, "gn-%s", j->id);
  gn_buf_append(&j->manifest_env, raw, raw_len);
  j->next = n->jobs;
  n->jobs = j;
  gn__jobman_done(&m);
  gn__node_persist_job(n, j);
  send_job_status(n, j, l);
  gn_log(GN_LOG_INFO, "job %s on lease %s: pulling %s", j->id, j->lease_id, j->image);
  /* Everything the worker thread needs from node state is copied here, on
   * the loop, so the worker touches only the job. */
  for (int i = 0; i < GN_LEASE_MAX_GPUS && l->gpu_index[i] >= 0; i++) {
    const gn_gpu *g = &n->gpus.items[l->gpu_index[i]];
    size_t used = strlen(j->visible);
    gn__strf(j->visible + used, sizeof j->visible - used, "%s%s", used ? "," : "", g->uuid);
    if (!g->simulated && g->dev_path[0])
      gn__strf(j->devices[j->ndev++], sizeof j->devices[0], "%s", g->dev_path);
  }
  j->cgroup_limits = gn_cgroup_limits_supported();
  j->work.data = j;
  uv_queue_work(n->loop, &j->work, job_prepare_work, job_prepare_done);
  return;
reject:
  reject_job(n, peer, m.job_id, m.lease_id, reason);
  gn__jobman_done(&m);
}

void gn__provider_stop_job(gn_node *n, gn_job *j) {
  if (j->state != GN_JOB_PULLING && j->state != GN_JOB_RUNNING)
    return;
  j->stop_requested = true;
  if (!j->proc_running)
    return;
  char **argv = NULL;
  int status;
  if (gn_runtime_argv_kill(&n->rt, n->run_dir, j->container_id, "KILL", &argv) == 0) {
    gn_runtime_exec(argv, &status);
    gn_argv_free(argv);
  }
  /* If the runtime could not signal the container, end the runtime itself. */
  uv_process_kill(&j->proc, SIGTERM);
}

static void on_job_stop(gn_node *n, const uint8_t peer[GN_PK_LEN], const gn_envelope *env) {
  gn_jobmsg m;
  if (gn__jobmsg_decode(env->type, env->body, env->body_len, &m) < 0)
    return;
  gn_job *j = gn__job_find(n, m.job_id);
  gn_lease *l = j ? job_lease(n, j) : NULL;
  if (j && l && j->role == GN_ROLE_PROVIDER && memcmp(l->ag.terms.requester, peer, GN_PK_LEN) == 0) {
    gn_log(GN_LOG_INFO, "job %s: stop requested by the lease holder", j->id);
    gn__provider_stop_job(n, j);
  }
  gn__jobmsg_done(&m);
}

static void on_lease_release(gn_node *n, const uint8_t peer[GN_PK_LEN], const gn_envelope *env) {
  gn_jobmsg m;
  if (gn__jobmsg_decode(env->type, env->body, env->body_len, &m) < 0)
    return;
  gn_lease *l = gn__lease_find(n, m.lease_id);
  if (l && l->role == GN_ROLE_PROVIDER && memcmp(l->ag.terms.requester, peer, GN_PK_LEN) == 0) {
    if (l->state == GN_LEASE_ACTIVE)
      gn__provider_end_lease(n, l, "released by the requester");
    else
      send_invoice(n, l);
  }
  gn__jobmsg_done(&m);
}

void gn__provider_on_message(gn_node *n, const uint8_t peer[GN_PK_LEN], const gn_envelope *env, const uint8_t *raw,
                             size_t raw_len) {
  switch (env->type) {
  case GN_MSG_LEASE_REQUEST:
    on_lease_request(n, peer, raw, raw_len);
    break;
  case GN_MSG_LEASE_RELEASE:
    on_lease_release(n, peer, env);
    break;
  case GN_MSG_JOB_MANIFEST:
    on_job_manifest(n, peer, env, raw, raw_len);
    break;
  case GN_MSG_JOB_STOP:
    on_job_stop(n, peer, env);
    break;
  case GN_MSG_INVOICE_ACCEPT:
  case GN_MSG_INVOICE_REJECT:
    on_invoice_answer(n, peer, raw, raw_len);
    break;
  default:
    break;
  }
}

/* --- the once-a-second work -------------------------------------------------*/

static uint8_t lease_util(gn_node *n, const gn_lease *l) {
  unsigned sum = 0, cnt = 0;
  for (int i = 0; i < GN_LEASE_MAX_GPUS && l->gpu_index[i] >= 0; i++) {
    uint8_t u;
    if (gn_gpu_utilization(&n->gpus.items[l->gpu_index[i]], &u) == 0) {
      sum += u;
      cnt++;
    }
  }
  return cnt ? (uint8_t)(sum / cnt) : GN_UTIL_UNKNOWN;
}

/* Commits one lease's due seconds; on failure the lease ends, since a
 * second that cannot be recorded must not be sold. */
static void meter_commit(gn_node *n, gn_lease *l, const gn_tick_append *ticks, size_t cnt, bool committed) {
  int r = committed ? 0 : gn_ledger_append_ticks(n->ledger, ticks, cnt, NULL);
  if (r < 0) {
    gn_log(GN_LOG_ERROR, "cannot record usage seconds of lease %s: %s; ending the lease", l->id, gn_strerror(r));
    gn__provider_end_lease(n, l, "provider ledger error");
    return;
  }
  gn_meter_advance(&l->meter, cnt);
  l->seconds += cnt;
  n->ticks_total += cnt;
}

void gn__provider_tick(gn_node *n, uint64_t now_ms, int64_t now_s) {
  /* All leases' due seconds go to the ledger in one transaction: one fsync
   * per timer however many leases run, and still committed before they
   * count anywhere, so a crash loses at most the second being written. */
  enum { MAX_CATCHUP = 120 };
  size_t cap = 0, n_ticks = 0;
  for (gn_lease *l = n->leases; l; l = l->next)
    if (l->role == GN_ROLE_PROVIDER && l->state == GN_LEASE_ACTIVE)
      cap += MAX_CATCHUP;
  gn_tick_append *batch = cap ? calloc(cap, sizeof *batch) : NULL;
  if (cap && !batch)
    return;
  for (gn_lease *l = n->leases; l; l = l->next) {
    if (l->role != GN_ROLE_PROVIDER || l->state != GN_LEASE_ACTIVE)
      continue;
    uint64_t due = gn_meter_due(&l->meter, now_ms);
    if (due > MAX_CATCHUP)
      due = MAX_CATCHUP;
    uint8_t util = due ? lease_util(n, l) : GN_UTIL_UNKNOWN;
    for (uint64_t i = 0; i < due; i++)
      batch[n_ticks++] = (gn_tick_append){l->id, now_s, l->ag.terms.count, util};
  }
  bool committed = n_ticks == 0 || gn_ledger_append_ticks(n->ledger, batch, n_ticks, NULL) == 0;
  /* The batch is in lease order; walk it again to advance each meter, or,
   * if the group commit failed, retry lease by lease to isolate the bad one. */
  for (size_t i = 0; i < n_ticks;) {
    size_t k = i;
    while (k < n_ticks && batch[k].lease_id == batch[i].lease_id)
      k++;
    gn_lease *l = gn__lease_find(n, batch[i].lease_id);
    if (l)
      meter_commit(n, l, batch + i, k - i, committed);
    i = k;
  }
  free(batch);
  for (gn_lease *l = n->leases; l; l = l->next)
    if (l->role == GN_ROLE_PROVIDER && l->state == GN_LEASE_ACTIVE && gn_meter_finished(&l->meter))
      gn__provider_end_lease(n, l, "maximum duration reached");
  if (n->cfg.provide && (n->offers_dirty || now_s - n->offer_published_s >= GN_OFFER_REFRESH_S))
    gn__provider_publish_offers(n, now_s);
}
