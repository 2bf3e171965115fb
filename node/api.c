/* The control API's endpoints of the node as a whole: each turns node state
 * into the JSON the `gpunet` CLI shows. The agents register their own
 * operations (rent, run, release, stop: requester.c; attest: attest_net.c;
 * balance: settle.c). */
#include "api.h"

#include "attest_net.h"
#include "node_internal.h"
#include "overlay.h"
#include "provider.h"
#include "settle_glue.h"
#include "train_prov.h"
#include "util.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void api_status(gn_ctl_req *req, void *ud) {
  gn_node *n = ud;
  size_t leases = 0, jobs = 0;
  for (gn_lease *l = n->leases; l; l = l->next)
    leases += l->state == GN_LEASE_ACTIVE;
  for (gn_job *j = n->jobs; j; j = j->next)
    jobs += j->state == GN_JOB_RUNNING || j->state == GN_JOB_PULLING || j->state == GN_JOB_PENDING;
  char runtime[400];
  if (n->have_runtime)
    gn__strf(runtime, sizeof runtime, "%s %s", n->rt.kind == GN_RUNTIME_CRUN ? "crun" : "runc", n->rt.version);
  else
    gn__strf(runtime, sizeof runtime, "none (%s)", n->runtime_err);
  json_t *o =
      json_pack("{s:s, s:s, s:s, s:s, s:b, s:s, s:I, s:I, s:I, s:I}", "node_id", n->node_id, "version", GN_VERSION,
                "listen", gn_transport_listen_addr(n->tp), "data_dir", n->cfg.data_dir, "provider", n->cfg.provide,
                "runtime", runtime, "peers", (json_int_t)gn_transport_peer_count(n->tp), "offers",
                (json_int_t)gn_offer_table_count(n->offers), "leases", (json_int_t)leases, "jobs", (json_int_t)jobs);
  /* How jobs are isolated here: budgets, limits enforced, user namespaces. */
  if (o && n->cfg.provide)
    json_object_set_new(o, "isolation", gn__provider_status_json(n));
  /* Whether ranks of training jobs run here, their ports, how many now. */
  if (o && n->cfg.provide)
    json_object_set_new(o, "training", gn__train_status_json(n));
  /* Membership: counts by state, local health, the UDP socket's figures. */
  gn__overlay_status_json(n, o);
  json_object_set_new(o, "limits", gn_config_limits_json(&n->cfg));
  gn_ctl_reply_json(req, 200, o);
}

static void api_gpus(gn_ctl_req *req, void *ud) {
  gn_node *n = ud;
  json_t *arr = json_array();
  for (size_t i = 0; i < n->gpus.count; i++) {
    const gn_gpu *g = &n->gpus.items[i];
    uint8_t util;
    json_t *o = json_pack("{s:i, s:s, s:s, s:I, s:s, s:b}", "index", g->index, "uuid", g->uuid, "name", g->name,
                          "memory_mib", (json_int_t)g->memory_mib, "driver", g->driver, "simulated", g->simulated);
    json_object_set_new(o, "leased_by", n->gpu_leased_by[i][0] ? json_string(n->gpu_leased_by[i]) : json_null());
    json_object_set_new(o, "utilization", gn_gpu_utilization(g, &util) == 0 ? json_integer(util) : json_null());
    const gn_attest_local *a = gn__attest_local_find(n, g->name);
    json_object_set_new(o, "attestation", a ? json_string(a->verdict) : json_null());
    gn_gpu_stats st;
    if (gn_gpu_stats_get(g, &st) == 0) {
      json_object_set_new(o, "sm_clock_mhz", st.sm_clock_mhz ? json_integer(st.sm_clock_mhz) : json_null());
      json_object_set_new(o, "power_mw", st.power_mw ? json_integer(st.power_mw) : json_null());
    }
    json_object_set_new(o, "pci_bus_id", json_string(g->pci_bus_id));
    json_array_append_new(arr, o);
  }
  gn_ctl_reply_json(req, 200, json_pack("{s:o}", "gpus", arr));
}

static int cmp_uint(uint64_t a, uint64_t b) {
  return a < b ? -1 : a > b;
}

static const char *sort_key;
static int offer_cmp(const void *pa, const void *pb) {
  const gn_offer_entry *a = *(const gn_offer_entry *const *)pa, *b = *(const gn_offer_entry *const *)pb;
  int c = 0;
  if (strcmp(sort_key, "vram") == 0)
    c = -cmp_uint(a->offer.vram_mib, b->offer.vram_mib);
  else if (strcmp(sort_key, "count") == 0)
    c = -cmp_uint(a->offer.gpus_free, b->offer.gpus_free);
  if (c == 0)
    c = cmp_uint(a->offer.price_uper_hour, b->offer.price_uper_hour);
  return c ? c : strcmp(a->id, b->id);
}

static void api_offers(gn_ctl_req *req, void *ud) {
  gn_node *n = ud;
  gn_filter f;
  char err[256];
  const char *spec = gn_ctl_req_query(req, "filter");
  const char *sort = gn_ctl_req_query(req, "sort");
  if (gn_filter_parse(spec ? spec : "", &f, err, sizeof err) < 0)
    return gn_ctl_reply_error(req, 400, "bad filter: %s", err);
  if (sort && strcmp(sort, "price") && strcmp(sort, "vram") && strcmp(sort, "count"))
    return gn_ctl_reply_error(req, 400, "unknown sort key '%s' (known: price, vram, count)", sort);
  gn_offer_table_expire(n->offers, gn_unix_s());
  size_t cnt = gn_offer_table_count(n->offers), m = 0;
  const gn_offer_entry **v = calloc(cnt ? cnt : 1, sizeof *v);
  if (!v)
    return gn_ctl_reply_error(req, 500, "out of memory");
  for (size_t i = 0; i < cnt; i++) {
    const gn_offer_entry *e = gn_offer_table_at(n->offers, i);
    if (gn_filter_match(&f, &e->offer))
      v[m++] = e;
  }
  sort_key = sort ? sort : "price";
  qsort(v, m, sizeof *v, offer_cmp);
  json_t *arr = json_array();
  for (size_t i = 0; i < m; i++) {
    const gn_offer *o = &v[i]->offer;
    char provider[GN_NODE_ID_STRLEN], price[32];
    gn_node_id_format(o->provider, provider);
    gn_price_format(o->price_uper_hour, price, sizeof price);
    json_array_append_new(
        arr, json_pack("{s:s, s:s, s:s, s:s, s:I, s:I, s:I, s:I, s:s, s:s, s:I, s:b, s:I, s:b}", "id", v[i]->id,
                       "provider", provider, "addr", o->addr, "gpu_model", o->gpu_model, "vram_mib",
                       (json_int_t)o->vram_mib, "gpus_free", (json_int_t)o->gpus_free, "gpus_total",
                       (json_int_t)o->gpus_total, "price_uper_hour", (json_int_t)o->price_uper_hour, "price", price,
                       "currency", o->currency, "max_hours", (json_int_t)o->max_hours, "simulated", o->simulated,
                       "expires_s", (json_int_t)o->expires_s, "own", memcmp(o->provider, n->id->pk, GN_PK_LEN) == 0));
    char verdict[GN_ATTEST_VERDICT_STRLEN + 48];
    gn__offer_attest_verdict(o, verdict, sizeof verdict);
    json_t *x = json_array_get(arr, json_array_size(arr) - 1);
    json_object_set_new(x, "attestation", verdict[0] ? json_string(verdict) : json_null());
    /* What the provider's own signed offer says it does not confine. */
    json_object_set_new(x, "no_userns", json_boolean(o->no_userns));
    /* Whether it takes ranks of training jobs, and their UDP ports. */
    json_object_set_new(x, "training", json_boolean(o->training));
    if (o->training)
      json_object_set_new(x, "jobnet_ports",
                          json_pack("[I, I]", (json_int_t)o->jobnet_port_lo, (json_int_t)o->jobnet_port_hi));
    json_object_set_new(x, "unenforced_limits", json_boolean(o->unenforced_limits));
    /* Behind NAT: the relay it is reached through (docs/nat.md). */
    char rid[GN_NODE_ID_STRLEN];
    gn_node_id_format(o->relay_id, rid);
    json_object_set_new(x, "relay",
                        o->relay_addr[0] ? json_pack("{s:s, s:s}", "id", rid, "addr", o->relay_addr) : json_null());
  }
  free(v);
  gn_ctl_reply_json(req, 200, json_pack("{s:o}", "offers", arr));
}

static void api_peers(gn_ctl_req *req, void *ud) {
  gn_node *n = ud;
  json_t *arr = json_array();
  for (size_t i = 0; i < gn_peertab_count(n->peertab); i++) {
    const gn_peertab_entry *e = gn_peertab_at(n->peertab, i);
    if (!e->up)
      continue; /* sessions up only: the table also keeps peers heard of */
    char id[GN_NODE_ID_STRLEN];
    gn_node_id_format(e->id, id);
    json_t *p = json_pack("{s:s, s:s, s:b}", "node_id", id, "addr", e->addr, "inbound", e->inbound);
    const char *membership = gn__overlay_member_state(n, e->id);
    if (p && membership)
      json_object_set_new(p, "membership", json_string(membership));
    const char *view = gn__overlay_view_of(n, e->id);
    if (p && view)
      json_object_set_new(p, "view", json_string(view));
    json_array_append_new(arr, p);
  }
  gn_ctl_reply_json(req, 200, json_pack("{s:o}", "peers", arr));
}

static void api_leases(gn_ctl_req *req, void *ud) {
  gn_node *n = ud;
  json_t *arr = json_array();
  for (gn_lease *l = n->leases; l; l = l->next)
    json_array_insert_new(arr, 0, gn__lease_json(n, l));
  gn_ctl_reply_json(req, 200, json_pack("{s:o}", "leases", arr));
}

static void api_lease(gn_ctl_req *req, void *ud) {
  gn_node *n = ud;
  gn_lease *l = gn__lease_find(n, gn_ctl_req_param(req, "id"));
  if (!l)
    return gn_ctl_reply_error(req, 404, "no lease %s", gn_ctl_req_param(req, "id"));
  gn_ctl_reply_json(req, 200, json_pack("{s:o}", "lease", gn__lease_json(n, l)));
}

static void api_jobs(gn_ctl_req *req, void *ud) {
  gn_node *n = ud;
  json_t *arr = json_array();
  for (gn_job *j = n->jobs; j; j = j->next)
    json_array_insert_new(arr, 0, gn__job_json(j));
  gn_ctl_reply_json(req, 200, json_pack("{s:o}", "jobs", arr));
}

static void api_job(gn_ctl_req *req, void *ud) {
  gn_node *n = ud;
  gn_job *j = gn__job_find(n, gn_ctl_req_param(req, "id"));
  if (!j)
    return gn_ctl_reply_error(req, 404, "no job %s", gn_ctl_req_param(req, "id"));
  gn_ctl_reply_json(req, 200, json_pack("{s:o}", "job", gn__job_json(j)));
}

static bool job_done(const gn_job *j) {
  return j->state >= GN_JOB_EXITED;
}

/* Logs are read from the job's log file, which the provider writes as the
 * container prints and the requester as chunks arrive. */
static void logs_reply(gn_ctl_req *req, const gn_job *j, uint64_t offset) {
  size_t want = offset < j->log_len ? (size_t)(j->log_len - offset) : 0;
  if (want > 256 * 1024)
    want = 256 * 1024;
  char *buf = malloc(want + 1);
  size_t got = 0;
  if (!buf)
    return gn_ctl_reply_error(req, 500, "out of memory");
  if (want) {
    int fd = open(j->log_path, O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
      ssize_t r = pread(fd, buf, want, (off_t)offset);
      got = r > 0 ? (size_t)r : 0;
      close(fd);
    }
  }
  buf[got] = 0;
  bool done = job_done(j) && offset + got >= j->log_len;
  json_t *o = json_object();
  json_object_set_new(o, "data", json_stringn_nocheck(buf, got));
  json_object_set_new(o, "offset", json_integer((json_int_t)(offset + got)));
  json_object_set_new(o, "done", json_boolean(done));
  json_object_set_new(o, "state", json_string(gn__job_state_name(j->state)));
  json_object_set_new(o, "exit_code",
                      j->state == GN_JOB_EXITED || j->state == GN_JOB_STOPPED ? json_integer(j->exit_code)
                                                                              : json_null());
  gn__job_pull_json(j, o);
  free(buf);
  gn_ctl_reply_json(req, 200, o);
}

/* A long poll waits at most this long, whatever wait_ms asks: the client
 * asks again, and a request held for minutes looks like a hung daemon. */
#define API_LOGS_MAX_WAIT_MS 30000

/* What a waiting logs request has already seen. */
typedef struct logs_seen {
  uint64_t offset;
  gn_job_state state;
  uint64_t pull_done; /* the image pull's bytes: progress is news too */
} logs_seen;

static bool logs_news(const gn_job *j, const logs_seen *seen) {
  return seen->offset < j->log_len || job_done(j) || j->state != seen->state || j->pull_done != seen->pull_done;
}

/* GET /v1/jobs/:id/logs?offset=N[&wait_ms=M]: the log from byte N. With
 * wait_ms and nothing new (no output past N, the job not ended), the reply
 * waits, on the loop without blocking it, until output arrives, the job
 * changes state, or wait_ms (at most API_LOGS_MAX_WAIT_MS) passes. */
static void api_logs(gn_ctl_req *req, void *ud) {
  gn_node *n = ud;
  gn_job *j = gn__job_find(n, gn_ctl_req_param(req, "id"));
  if (!j)
    return gn_ctl_reply_error(req, 404, "no job %s", gn_ctl_req_param(req, "id"));
  const char *qo = gn_ctl_req_query(req, "offset");
  char *end = NULL;
  unsigned long long offset = qo ? strtoull(qo, &end, 10) : 0;
  if (qo && (*end || end == qo))
    return gn_ctl_reply_error(req, 400, "offset must be a number");
  const char *qw = gn_ctl_req_query(req, "wait_ms");
  unsigned long long wait_ms = qw ? strtoull(qw, &end, 10) : 0;
  if (qw && (*end || end == qw || qw[0] == '-'))
    return gn_ctl_reply_error(req, 400, "wait_ms must be a number of milliseconds");
  if (wait_ms > API_LOGS_MAX_WAIT_MS)
    wait_ms = API_LOGS_MAX_WAIT_MS;
  logs_seen now = {offset, j->state, j->pull_done};
  if (wait_ms && !logs_news(j, &now) && !n->stopping) {
    logs_seen *seen = malloc(sizeof *seen);
    gn_pending *p = seen ? gn__pending_add(n, req, GN_PENDING_LOGS, j->id, wait_ms) : NULL;
    if (p) {
      *seen = now;
      p->data = seen;
      return; /* answered by gn__api_logs_wake or, at its deadline, gn__api_logs_answer */
    }
    free(seen); /* out of memory: answer at once, the client asks again */
  }
  logs_reply(req, j, offset);
}

void gn__api_logs_answer(gn_node *n, gn_pending *p) {
  const logs_seen *seen = p->data;
  gn_job *j = gn__job_find(n, p->key);
  if (!j)
    return gn_ctl_reply_error(p->req, 404, "no job %s", p->key);
  logs_reply(p->req, j, seen->offset);
}

void gn__api_logs_wake(gn_node *n, const gn_job *j) {
  for (gn_pending **pp = &n->pending; *pp;) {
    gn_pending *p = *pp;
    if (p->kind != GN_PENDING_LOGS || strcmp(p->key, j->id) != 0 || !logs_news(j, p->data)) {
      pp = &p->next;
      continue;
    }
    *pp = p->next;
    logs_reply(p->req, j, ((const logs_seen *)p->data)->offset);
    gn__pending_free(p);
  }
}

static json_t *invoice_record_json(const gn_invoice_record *r) {
  char total[32], price[32], provider[GN_NODE_ID_STRLEN], requester[GN_NODE_ID_STRLEN], head[65];
  gn_price_format(r->summary.total_micro, total, sizeof total);
  gn_price_format(r->summary.price_uper_hour, price, sizeof price);
  gn_node_id_format(r->summary.provider, provider);
  gn_node_id_format(r->summary.requester, requester);
  gn__hex(r->summary.chain_head, 32, head);
  return json_pack("{s:s, s:s, s:s, s:s, s:s, s:s, s:s, s:I, s:I, s:I, s:s, s:s, s:s, s:I, s:I, s:I, s:b, s:s}", "id",
                   r->invoice_id, "lease", r->lease_id, "role", r->role, "status", r->status, "provider", provider,
                   "requester", requester, "gpu_model", r->summary.gpu_model, "gpus", (json_int_t)r->summary.gpus,
                   "seconds", (json_int_t)r->summary.seconds, "total_micro", (json_int_t)r->summary.total_micro,
                   "total", total, "price", price, "currency", r->summary.currency, "start_s",
                   (json_int_t)r->summary.start_s, "end_s", (json_int_t)r->summary.end_s, "created_s",
                   (json_int_t)r->created_s, "countersigned", r->summary.countersigned, "chain_head", head);
}

/* The bill of a lease this node holds with its machine (billing v2): what
 * the requester's vouchers cover so far (the last accepted debit note, or
 * the answered final invoice) and where the final invoice stands. */
static json_t *lease_bill_json(gn_node *n, const gn_lease *l) {
  gn_lease_info info;
  memset(&info, 0, sizeof info);
  if (l->prov)
    gn_lease_prov_info(l->prov, &info);
  else if (l->req)
    gn_lease_req_info(l->req, (gn_lease_now){gn_mono_ms(), gn_unix_s()}, &info);
  /* Once there is a final invoice, what it bills; before, what the
   * accepted debit notes cover. */
  uint64_t seconds = l->invoice_id[0] ? l->invoice_seconds : info.accepted_s;
  uint64_t micro = l->invoice_id[0] ? l->invoice_micro : info.accepted_micro;
  char total[32], price[32], provider[GN_NODE_ID_STRLEN], requester[GN_NODE_ID_STRLEN];
  gn_price_format(micro, total, sizeof total);
  gn_price_format(l->ag.terms.price_uper_hour, price, sizeof price);
  gn_node_id_format(l->ag.terms.provider, provider);
  gn_node_id_format(l->ag.terms.requester, requester);
  const char *role = l->role == GN_ROLE_PROVIDER ? "provider" : "requester";
  /* No final invoice yet: "open" while the lease runs, "ended" until the
   * provider's invoice is issued or arrives. */
  const char *status = l->invoice_status[0] ? l->invoice_status : l->state == GN_LEASE_ACTIVE ? "open" : "ended";
  json_t *o =
      json_pack("{s:s, s:s, s:s, s:s, s:s, s:s, s:s, s:I, s:I, s:I, s:s, s:s, s:s, s:I, s:I, s:b}", "id",
                l->invoice_id[0] ? l->invoice_id : l->id, "lease", l->id, "role", role, "status", status, "provider",
                provider, "requester", requester, "gpu_model", l->ag.terms.gpu_model, "gpus",
                (json_int_t)l->ag.terms.count, "seconds", (json_int_t)seconds, "total_micro", (json_int_t)micro,
                "total", total, "price", price, "currency", l->ag.terms.currency, "start_s", (json_int_t)l->ag.start_s,
                "end_s", (json_int_t)l->end_s, "countersigned", strcmp(status, "accepted") == 0);
  /* When the bill was made: the end of the lease (its final invoice), else its start. */
  json_object_set_new(o, "created_s", json_integer(l->end_s ? l->end_s : l->ag.start_s));
  json_object_set_new(o, "notes_accepted", json_integer((json_int_t)info.accepted_seq));
  json_object_set_new(o, "vouched_s", json_integer((json_int_t)info.accepted_s));
  json_object_set_new(o, "vouched_micro", json_integer((json_int_t)info.accepted_micro));
  json_object_set_new(o, "pending_notes", json_integer((json_int_t)info.pending));
  json_object_set_new(o, "settled", json_string(gn__settle_state(n, l->id, role)));
  gn__lease_energy_json(l, o);
  return o;
}

/* A lease with a billing machine, or one whose final invoice it answered
 * or issued in this version (a record kept in node_leases). */
static bool lease_billed_v2(const gn_lease *l) {
  return l->prov || l->req || l->invoice_id[0];
}

static void api_invoices(gn_ctl_req *req, void *ud) {
  gn_node *n = ud;
  gn_invoice_record *recs = NULL;
  size_t cnt = 0;
  int r = gn_ledger_list_invoices(n->ledger, NULL, &recs, &cnt);
  if (r < 0)
    return gn_ctl_reply_error(req, 500, "cannot list invoices: %s", gn_strerror(r));
  json_t *arr = json_array();
  for (gn_lease *l = n->leases; l; l = l->next) /* newest first */
    if (lease_billed_v2(l))
      json_array_append_new(arr, lease_bill_json(n, l));
  for (size_t i = 0; i < cnt; i++) { /* invoices of leases billed before v2 */
    const gn_lease *l = gn__lease_find(n, recs[i].lease_id);
    if (l && lease_billed_v2(l))
      continue;
    json_t *o = invoice_record_json(&recs[i]);
    /* settle.c: where the lease's final settlement stands. */
    json_object_set_new(o, "settled", json_string(gn__settle_state(n, recs[i].lease_id, recs[i].role)));
    json_array_insert_new(arr, 0, o);
  }
  gn_invoice_records_free(recs, cnt);
  gn_ctl_reply_json(req, 200, json_pack("{s:o}", "invoices", arr));
}

/* The lease an id names: a lease id, or the id of its final invoice; role
 * (NULL for either) picks between a node's two sides of one lease. */
static gn_lease *find_billed_lease(gn_node *n, const char *id, const char *role) {
  for (gn_lease *l = n->leases; l; l = l->next) {
    if (!lease_billed_v2(l) || (strcmp(l->id, id) != 0 && strcmp(l->invoice_id, id) != 0))
      continue;
    if (!role || strcmp(role, l->role == GN_ROLE_PROVIDER ? "provider" : "requester") == 0)
      return l;
  }
  return NULL;
}

static int find_invoice(gn_node *n, gn_ctl_req *req, gn_invoice_record *rec) {
  const char *id = gn_ctl_req_param(req, "id"), *role = gn_ctl_req_query(req, "role");
  if (role && strcmp(role, "provider") && strcmp(role, "requester")) {
    gn_ctl_reply_error(req, 400, "role must be provider or requester");
    return GN_EINVAL;
  }
  int r = gn_ledger_get_invoice(n->ledger, id, role, rec);
  if (r == GN_ENOTFOUND)
    gn_ctl_reply_error(req, 404, "no invoice %s (list them with: gpunet invoices)", id);
  else if (r < 0)
    gn_ctl_reply_error(req, 500, "cannot read invoice %s: %s", id, gn_strerror(r));
  return r;
}

static void api_invoice(gn_ctl_req *req, void *ud) {
  gn_node *n = ud;
  const char *role = gn_ctl_req_query(req, "role");
  if (role && strcmp(role, "provider") && strcmp(role, "requester"))
    return gn_ctl_reply_error(req, 400, "role must be provider or requester");
  const gn_lease *l = find_billed_lease(n, gn_ctl_req_param(req, "id"), role);
  if (l)
    return gn_ctl_reply_json(req, 200, json_pack("{s:o}", "invoice", lease_bill_json(n, l)));
  gn_invoice_record rec;
  if (find_invoice(ud, req, &rec) < 0)
    return;
  gn_ctl_reply_json(req, 200, json_pack("{s:o}", "invoice", invoice_record_json(&rec)));
  gn_invoice_record_done(&rec);
}

static void api_invoice_export(gn_ctl_req *req, void *ud) {
  gn_node *n = ud;
  const char *role = gn_ctl_req_query(req, "role");
  if (role && strcmp(role, "provider") && strcmp(role, "requester"))
    return gn_ctl_reply_error(req, 400, "role must be provider or requester");
  const gn_lease *l = find_billed_lease(n, gn_ctl_req_param(req, "id"), role);
  if (l) {
    /* gpunet-invoice/2, as this side holds it: the agreement, every note
     * with its answer (vouchers and rejections alike), the final invoice and
     * its answer (a rejection too: a disputed bill must not audit like an
     * ordinary one). */
    json_t *doc = NULL;
    int r = gn_ledger_export(n->ledger, l->id, l->role == GN_ROLE_PROVIDER ? "provider" : "requester", &doc);
    if (r < 0)
      return gn_ctl_reply_error(req, r == GN_ENOTFOUND ? 404 : 500, "cannot export the bill of lease %s: %s", l->id,
                                gn_strerror(r));
    return gn_ctl_reply_json(req, 200, doc);
  }
  gn_invoice_record rec;
  if (find_invoice(ud, req, &rec) < 0)
    return;
  json_t *doc = NULL;
  /* Only an acceptance goes into the export: a rejection is not a
   * countersignature. */
  bool accepted = rec.summary.countersigned;
  int r = gn_invoice_export(rec.invoice.data, rec.invoice.len, accepted ? rec.accept.data : NULL,
                            accepted ? rec.accept.len : 0, &doc);
  gn_invoice_record_done(&rec);
  if (r < 0)
    return gn_ctl_reply_error(req, 500, "cannot export invoice: %s", gn_strerror(r));
  gn_ctl_reply_json(req, 200, doc);
}

/* A Prometheus label value: backslash, double quote and newline escaped. */
static void prom_label(FILE *f, const char *v) {
  for (; *v; v++) {
    if (*v == '\\' || *v == '"')
      fputc('\\', f);
    if (*v == '\n')
      fputs("\\n", f);
    else
      fputc(*v, f);
  }
}

/* Money by currency, for earnings (provider) and spending (requester). */
typedef struct {
  char currency[8];
  uint64_t micro[2]; /* [0] earned as provider, [1] spent as requester */
} money_row;

static void money_add(money_row *rows, size_t *n, size_t cap, const char *currency, int role, uint64_t micro) {
  size_t i = 0;
  while (i < *n && strcmp(rows[i].currency, currency) != 0)
    i++;
  if (i == *n) {
    if (*n == cap)
      return;
    memset(&rows[i], 0, sizeof(rows[i]));
    gn__strf(rows[i].currency, sizeof rows[i].currency, "%s", currency);
    (*n)++;
  }
  rows[i].micro[role] += micro;
}

/* What the leases this node holds have billed: a final invoice's total once
 * there is one, before that what the accepted debit notes cover; and the
 * countersigned invoices of leases billed before v2. */
static size_t metrics_money(gn_node *n, money_row *rows, size_t cap) {
  size_t cnt = 0, nrows = 0;
  for (gn_lease *l = n->leases; l; l = l->next) {
    if (!lease_billed_v2(l))
      continue;
    gn_lease_info info;
    memset(&info, 0, sizeof info);
    if (l->prov)
      gn_lease_prov_info(l->prov, &info);
    else if (l->req)
      gn_lease_req_info(l->req, (gn_lease_now){gn_mono_ms(), gn_unix_s()}, &info);
    uint64_t micro = l->invoice_id[0] ? l->invoice_micro : info.accepted_micro;
    money_add(rows, &nrows, cap, l->ag.terms.currency, l->role == GN_ROLE_PROVIDER ? 0 : 1, micro);
  }
  gn_invoice_record *recs = NULL;
  if (gn_ledger_list_invoices(n->ledger, NULL, &recs, &cnt) < 0)
    return nrows;
  for (size_t i = 0; i < cnt; i++) {
    const gn_lease *l = gn__lease_find(n, recs[i].lease_id);
    if ((l && lease_billed_v2(l)) || !recs[i].summary.countersigned)
      continue;
    money_add(rows, &nrows, cap, recs[i].summary.currency, strcmp(recs[i].role, "provider") == 0 ? 0 : 1,
              recs[i].summary.total_micro);
  }
  gn_invoice_records_free(recs, cnt);
  return nrows;
}

uint64_t gn__api_earned_micro(gn_node *n) {
  money_row money[16];
  size_t nmoney = metrics_money(n, money, GN_ARRAY_SIZE(money));
  for (size_t i = 0; i < nmoney; i++)
    if (strcmp(money[i].currency, n->cfg.currency) == 0)
      return money[i].micro[0];
  return 0;
}

/* NVML's figures per GPU: each a gauge, a GPU's line only where NVML gave
 * the figure. */
static bool nvml_util(const gn_gpu_stats *s, double *v) {
  *v = s->utilization_pct / 100.0;
  return s->utilization_pct >= 0;
}
static bool nvml_power(const gn_gpu_stats *s, double *v) {
  *v = s->power_mw / 1000.0;
  return s->power_mw != 0;
}
static bool nvml_clock(const gn_gpu_stats *s, double *v) {
  *v = (double)s->sm_clock_mhz * 1e6;
  return s->sm_clock_mhz != 0;
}
static bool nvml_temp(const gn_gpu_stats *s, double *v) {
  *v = s->temperature_c;
  return s->temperature_c >= 0;
}

typedef struct nvml_metric {
  const char *name, *help;
  bool (*value)(const gn_gpu_stats *s, double *v);
  int decimals;
} nvml_metric;

static const nvml_metric nvml_metrics[] = {
    {"gpunet_gpu_utilization_ratio", "GPU busy time, 0 to 1 (NVML).", nvml_util, 2},
    {"gpunet_gpu_power_watts", "GPU power draw (NVML).", nvml_power, 3},
    {"gpunet_gpu_sm_clock_hertz", "GPU SM clock (NVML).", nvml_clock, 0},
    {"gpunet_gpu_temperature_celsius", "GPU core temperature (NVML).", nvml_temp, 0},
};

static void metrics_gpus(gn_node *n, FILE *f) {
  fprintf(f, "# HELP gpunet_gpus GPUs on this node.\n# TYPE gpunet_gpus gauge\ngpunet_gpus %zu\n", n->gpus.count);
  if (!n->gpus.count)
    return;
  fprintf(f, "# HELP gpunet_gpu_info A GPU of this node (simulated=\"true\" for a fake one).\n"
             "# TYPE gpunet_gpu_info gauge\n");
  for (size_t i = 0; i < n->gpus.count; i++) {
    const gn_gpu *g = &n->gpus.items[i];
    fprintf(f, "gpunet_gpu_info{gpu=\"%d\",uuid=\"", g->index);
    prom_label(f, g->uuid);
    fputs("\",name=\"", f);
    prom_label(f, g->name);
    fprintf(f, "\",simulated=\"%s\"} 1\n", g->simulated ? "true" : "false");
  }
  fprintf(f, "# HELP gpunet_gpu_leased Whether a lease holds the GPU.\n# TYPE gpunet_gpu_leased gauge\n");
  for (size_t i = 0; i < n->gpus.count; i++) {
    fprintf(f, "gpunet_gpu_leased{gpu=\"%d\",uuid=\"", n->gpus.items[i].index);
    prom_label(f, n->gpus.items[i].uuid);
    fprintf(f, "\"} %d\n", n->gpu_leased_by[i][0] ? 1 : 0);
  }
  /* NVML's figures, for the GPUs it can tell about (not simulated ones). */
  gn_gpu_stats st[GN_ARRAY_SIZE(n->gpu_leased_by)];
  bool have[GN_ARRAY_SIZE(n->gpu_leased_by)] = {false};
  size_t known = 0;
  for (size_t i = 0; i < n->gpus.count && i < GN_ARRAY_SIZE(st); i++)
    if (!n->gpus.items[i].simulated && gn_gpu_stats_get(&n->gpus.items[i], &st[i]) == 0)
      have[i] = true, known++;
  if (!known)
    return;
  for (size_t m = 0; m < GN_ARRAY_SIZE(nvml_metrics); m++) {
    const nvml_metric *nm = &nvml_metrics[m];
    fprintf(f, "# HELP %s %s\n# TYPE %s gauge\n", nm->name, nm->help, nm->name);
    for (size_t i = 0; i < n->gpus.count && i < GN_ARRAY_SIZE(st); i++) {
      double v;
      if (!have[i] || !nm->value(&st[i], &v))
        continue;
      fprintf(f, "%s{gpu=\"%d\",uuid=\"", nm->name, n->gpus.items[i].index);
      prom_label(f, n->gpus.items[i].uuid);
      fprintf(f, "\"} %.*f\n", nm->decimals, v);
    }
  }
}

/* SWIM membership by state, as GET /v1/status shows it. */
static void metrics_members(gn_node *n, FILE *f) {
  json_t *o = json_object();
  gn__overlay_status_json(n, o);
  json_t *m = json_object_get(o, "members");
  if (json_is_object(m)) {
    fprintf(f, "# HELP gpunet_overlay_members Overlay members by state (this node counts as alive).\n"
               "# TYPE gpunet_overlay_members gauge\n");
    static const char *const states[] = {"alive", "suspect", "dead", "left"};
    for (size_t i = 0; i < GN_ARRAY_SIZE(states); i++)
      fprintf(f, "gpunet_overlay_members{state=\"%s\"} %lld\n", states[i],
              (long long)json_integer_value(json_object_get(m, states[i])));
  }
  json_decref(o);
}

static void api_metrics(gn_ctl_req *req, void *ud) {
  gn_node *n = ud;
  size_t lp = 0, lr = 0, ended = 0, jobs[GN_JOB_REJECTED + 1] = {0};
  for (gn_lease *l = n->leases; l; l = l->next)
    if (l->state == GN_LEASE_ACTIVE)
      *(l->role == GN_ROLE_PROVIDER ? &lp : &lr) += 1;
    else
      ended++;
  for (gn_job *j = n->jobs; j; j = j->next)
    if ((unsigned)j->state <= GN_JOB_REJECTED)
      jobs[j->state]++;
  money_row money[16];
  size_t nmoney = metrics_money(n, money, GN_ARRAY_SIZE(money));
  if (!nmoney) /* a zero in the node's own currency, so the series exist */
    money_add(money, &nmoney, GN_ARRAY_SIZE(money), n->cfg.currency, 0, 0);
  char *text = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&text, &len);
  if (!f)
    return gn_ctl_reply_error(req, 500, "out of memory");
  fprintf(f, "# HELP gpunet_peers Connected peers (sessions up).\n# TYPE gpunet_peers gauge\ngpunet_peers %zu\n",
          gn_transport_peer_count(n->tp));
  metrics_members(n, f);
  fprintf(f, "# HELP gpunet_offers Offers in the offer table.\n# TYPE gpunet_offers gauge\ngpunet_offers %zu\n",
          gn_offer_table_count(n->offers));
  fprintf(f,
          "# HELP gpunet_leases_active Active leases by role.\n# TYPE gpunet_leases_active gauge\n"
          "gpunet_leases_active{role=\"provider\"} %zu\ngpunet_leases_active{role=\"requester\"} %zu\n",
          lp, lr);
  fprintf(f,
          "# HELP gpunet_leases_ended Ended leases this node still holds.\n# TYPE gpunet_leases_ended gauge\n"
          "gpunet_leases_ended %zu\n",
          ended);
  fprintf(f, "# HELP gpunet_jobs Jobs by state.\n# TYPE gpunet_jobs gauge\n");
  for (int s = 0; s <= GN_JOB_REJECTED; s++)
    fprintf(f, "gpunet_jobs{state=\"%s\"} %zu\n", gn__job_state_name((gn_job_state)s), jobs[s]);
  fprintf(f,
          "# HELP gpunet_ticks_total Usage seconds written to the ledger since start.\n"
          "# TYPE gpunet_ticks_total counter\ngpunet_ticks_total %llu\n",
          (unsigned long long)n->ticks_total);
  fprintf(f,
          "# HELP gpunet_lease_energy_joules_total Energy the GPUs of this node's provider leases used since start "
          "(NVML power, integrated each second; GPUs with no power reading count nothing).\n"
          "# TYPE gpunet_lease_energy_joules_total counter\ngpunet_lease_energy_joules_total %llu.%06llu\n",
          (unsigned long long)(n->lease_energy_uj / 1000000), (unsigned long long)(n->lease_energy_uj % 1000000));
  fprintf(f, "# HELP gpunet_earnings_total Billed as provider (accepted debit notes, then final invoices), in "
             "currency units.\n# TYPE gpunet_earnings_total counter\n");
  for (size_t i = 0; i < nmoney; i++)
    fprintf(f, "gpunet_earnings_total{currency=\"%s\"} %llu.%06llu\n", money[i].currency,
            (unsigned long long)(money[i].micro[0] / 1000000), (unsigned long long)(money[i].micro[0] % 1000000));
  fprintf(f, "# HELP gpunet_spent_total Billed as requester, in currency units.\n# TYPE gpunet_spent_total counter\n");
  for (size_t i = 0; i < nmoney; i++)
    fprintf(f, "gpunet_spent_total{currency=\"%s\"} %llu.%06llu\n", money[i].currency,
            (unsigned long long)(money[i].micro[1] / 1000000), (unsigned long long)(money[i].micro[1] % 1000000));
  gn_histo_write(&n->debit_latency, f, "gpunet_debit_note_latency_seconds",
                 "Provider: from a debit note's first send to the requester's acceptance.");
  metrics_gpus(n, f);
  fclose(f);
  gn_ctl_reply_text(req, 200, "text/plain; version=0.0.4", text);
  free(text);
}

int gn__api_listen_split(const char *listen, char *host, size_t cap, const char **ret_ip, int *ret_port) {
  gn__strf(host, cap, "%s", listen);
  char *colon = strrchr(host, ':');
  if (!colon)
    return GN_EINVAL;
  *colon = '\0';
  int port = atoi(colon + 1);
  const char *ip = host;
  size_t hl = strlen(host);
  if (hl > 2 && host[0] == '[' && host[hl - 1] == ']') {
    host[hl - 1] = '\0';
    ip = host + 1;
  }
  *ret_ip = ip;
  *ret_port = port;
  return 0;
}

int gn__api_metrics_listen(gn_node *n) {
  char host[64];
  const char *ip;
  int port;
  int r = gn__api_listen_split(n->cfg.metrics_listen, host, sizeof host, &ip, &port);
  if (r < 0)
    return r;
  if ((r = gn_ctl_new_tcp(n->loop, ip, port, &n->metrics_ctl)) < 0)
    return r;
  if ((r = gn_ctl_route(n->metrics_ctl, "GET", "/metrics", api_metrics, n)) < 0)
    return r;
  bool loopback = strncmp(ip, "127.", 4) == 0 || strcmp(ip, "::1") == 0;
  if (loopback)
    gn_log(GN_LOG_INFO, "metrics on http://%s/metrics", n->cfg.metrics_listen);
  else
    gn_log(GN_LOG_WARN, "metrics on http://%s/metrics: not loopback, anyone who can reach it reads them",
           n->cfg.metrics_listen);
  return 0;
}

void gn__api_register(gn_node *n) {
  static const struct {
    const char *method, *path;
    gn_ctl_handler fn;
  } routes[] = {
      {"GET", "/v1/status", api_status},
      {"GET", "/v1/gpus", api_gpus},
      {"GET", "/v1/peers", api_peers},
      {"GET", "/v1/offers", api_offers},
      {"GET", "/v1/leases", api_leases},
      {"GET", "/v1/leases/:id", api_lease},
      {"GET", "/v1/jobs", api_jobs},
      {"GET", "/v1/jobs/:id", api_job},
      {"GET", "/v1/jobs/:id/logs", api_logs},
      {"GET", "/v1/invoices", api_invoices},
      {"GET", "/v1/invoices/:id", api_invoice},
      {"GET", "/v1/invoices/:id/export", api_invoice_export},
      {"GET", "/metrics", api_metrics},
  };
  for (size_t i = 0; i < GN_ARRAY_SIZE(routes); i++)
    gn_ctl_route(n->ctl, routes[i].method, routes[i].path, routes[i].fn, n);
}
