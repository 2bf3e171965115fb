/* Attestation in the daemon: the glue around the attestation agent
 * (node/attest/attest_agent.c, which keeps the sessions of both sides and
 * knows nothing of gpunetd). Here: its io (the transport, the libuv thread
 * pool, the log, which GPUs are free to lease), the local GPUs it
 * self-checks, a copy of their verdicts and reports for the offers and
 * `gpunet gpus`, the leases that publish a held verdict, whether an offer's
 * verdict counts (its verifier leased), and POST /v1/attest. */
#include "attest_net.h"

#include "node_internal.h"
#include "util.h"

#include <math.h>
#include <stdio.h>

/* What the daemon keeps of attestation (gn_node.attest), made with the
 * agent on first use and freed at shutdown. */
typedef struct gn__attest_glue {
  gn_attest_agent *agent;                  /* both sides of attestation; NULL once the node stops */
  gn_attest_local local[GN_ATTEST_MODELS]; /* copies of the agent's local slots */
  size_t nlocal;
  struct gn__attest_wait *waits; /* verifications whose callers wait */
  const uint8_t *dial_key;       /* the key the agent's dial expects, during a verify call */
  int dial_rc;                   /* that dial's result */
} gn__attest_glue;

/* --- the agent's io -------------------------------------------------------------*/

static int io_send(void *ctx, const uint8_t peer[GN_PK_LEN], const uint8_t *env, size_t len) {
  gn_node *n = ctx;
  return gn_transport_send(n->tp, peer, env, len);
}

static bool io_is_up(void *ctx, const uint8_t peer[GN_PK_LEN]) {
  gn_node *n = ctx;
  return gn_transport_is_up(n->tp, peer);
}

/* The agent dials an offer's provider from inside gn_attest_agent_verify
 * (verify_call below): the session must prove the key the offer names. */
static void io_connect(void *ctx, const char *addr) {
  gn_node *n = ctx;
  gn__attest_glue *g = n->attest;
  if (!g || !g->dial_key) {
    gn_log(GN_LOG_WARN, "attestation: not dialling %s without the key expected there", addr);
    if (g)
      g->dial_rc = GN_EINVAL;
    return;
  }
  g->dial_rc = gn__nat_connect_peer(n, addr, g->dial_key);
}

typedef struct pool_task {
  uv_work_t work;
  gn_attest_task *t;
} pool_task;

static void pool_work(uv_work_t *w) {
  gn_attest_task_run(((pool_task *)w->data)->t);
}

static void pool_done(uv_work_t *w, int status) {
  pool_task *p = w->data;
  gn_attest_task *t = p->t;
  free(p);
  gn_attest_task_done(t, status < 0 ? GN_ECLOSED : 0);
}

static int io_queue(void *ctx, gn_attest_task *t) {
  gn_node *n = ctx;
  pool_task *p = calloc(1, sizeof *p);
  if (!p)
    return GN_ENOMEM;
  p->t = t;
  p->work.data = p;
  if (uv_queue_work(n->loop, &p->work, pool_work, pool_done) < 0) {
    free(p);
    return GN_ENOMEM;
  }
  return 0;
}

static void io_log(void *ctx, bool warn, const char *line) {
  (void)ctx;
  gn_log(warn ? GN_LOG_WARN : GN_LOG_INFO, "%s", line);
}

/* Keeps n->attest->local[slot] (read by the offers and the API) the agent's; a new
 * report means new offers. */
static void io_changed(void *ctx, size_t slot) {
  gn_node *n = ctx;
  gn_attest_local_view v;
  gn__attest_glue *g = n->attest;
  if (!g || !g->agent || slot >= GN_ATTEST_MODELS || gn_attest_agent_local(g->agent, slot, &v) < 0)
    return;
  gn_attest_local *l = &g->local[slot];
  if (slot >= g->nlocal)
    g->nlocal = slot + 1;
  gn__strf(l->model, sizeof l->model, "%s", v.model);
  gn__strf(l->verdict, sizeof l->verdict, "%s", v.verdict);
  if (l->report_env.len == v.report_len && (!v.report_len || memcmp(l->report_env.data, v.report, v.report_len) == 0))
    return;
  gn_buf_done(&l->report_env);
  if (v.report_len && gn_buf_append(&l->report_env, v.report, v.report_len) < 0)
    gn_buf_done(&l->report_env);
  n->offers_dirty = true;
}

/* A challenge is answered only while a GPU of its model is free: a leased
 * one is busy with its renter's job, and there is nothing to lease. */
static bool io_leasable(void *ctx, const uint8_t peer[GN_PK_LEN], const char *model) {
  gn_node *n = ctx;
  (void)peer;
  for (size_t i = 0; i < n->gpus.count; i++)
    if (strcmp(n->gpus.items[i].name, model) == 0 && !n->gpu_leased_by[i][0])
      return true;
  return false;
}

static const gn_attest_io node_io = {
    .send = io_send,
    .is_up = io_is_up,
    .connect = io_connect,
    .queue = io_queue,
    .log = io_log,
    .changed = io_changed,
    .leasable = io_leasable,
};

/* The node's agent, made on first use; NULL once the node stops. */
static gn_attest_agent *agent_of(gn_node *n) {
  if (n->stopping)
    return n->attest ? n->attest->agent : NULL;
  if (!n->attest && !(n->attest = calloc(1, sizeof *n->attest)))
    return NULL;
  if (!n->attest->agent && gn_attest_agent_new(n->id, &node_io, n, n->cfg.provide, &n->attest->agent) < 0)
    n->attest->agent = NULL;
  return n->attest->agent;
}

/* --- what the daemon calls ---------------------------------------------------------*/

void gn__attest_start_local(gn_node *n) {
  gn_attest_agent *a = agent_of(n);
  for (size_t i = 0; a && i < n->gpus.count; i++) {
    const gn_gpu *g = &n->gpus.items[i];
    gn_attest_gpu gpu;
    memset(&gpu, 0, sizeof gpu);
    gn__strf(gpu.uuid, sizeof gpu.uuid, "%s", g->uuid);
    gn__strf(gpu.name, sizeof gpu.name, "%s", g->name);
    gpu.memory_mib = (uint32_t)g->memory_mib;
    gn__strf(gpu.pci_bus_id, sizeof gpu.pci_bus_id, "%s", g->pci_bus_id);
    gn__strf(gpu.driver, sizeof gpu.driver, "%s", g->driver);
    /* The first GPU of each model proves it; GN_EEXIST for the others. */
    gn_attest_agent_add_local(a, &gpu, g->index, g->simulated);
  }
}

const gn_attest_local *gn__attest_local_find(const gn_node *n, const char *model) {
  const gn__attest_glue *g = n->attest;
  for (size_t i = 0; g && i < g->nlocal; i++)
    if (strcmp(g->local[i].model, model) == 0)
      return &g->local[i];
  return NULL;
}

void gn__attest_on_message(gn_node *n, const uint8_t peer[GN_PK_LEN], const gn_envelope *env, const uint8_t *raw,
                           size_t raw_len) {
  gn_attest_agent *a = agent_of(n);
  if (a)
    gn_attest_agent_on_message(a, peer, env, raw, raw_len);
}

void gn__attest_peer_up(gn_node *n, const uint8_t peer[GN_PK_LEN]) {
  if (n->attest && n->attest->agent)
    gn_attest_agent_peer_up(n->attest->agent, peer);
}

/* A held verdict is published once its verifier has leased from us: the
 * leases agreed lately are offered to the agent, which matches them to its
 * held verdicts by peer, model and time (nothing to do when none is held). */
static void publish_leased_verdicts(gn_node *n, gn_attest_agent *a) {
  int64_t now_s = gn_unix_s();
  for (gn_lease *l = n->leases; l && gn_attest_agent_held(a); l = l->next) {
    if (l->role != GN_ROLE_PROVIDER || l->ag.start_s < now_s - GN_ATTEST_LEASE_WINDOW_S)
      continue;
    gn_attest_agent_lease_agreed(a, l->peer, l->ag.terms.gpu_model, l->ag.start_s, l->agreement_env.data,
                                 l->agreement_env.len);
  }
}

void gn__attest_tick(gn_node *n, uint64_t now_ms) {
  if (!n->attest || !n->attest->agent)
    return;
  gn_attest_agent_tick(n->attest->agent, now_ms);
  if (n->cfg.provide)
    publish_leased_verdicts(n, n->attest->agent);
}

void gn__attest_shutdown(gn_node *n) {
  /* The agent finishes the verifications in progress (their callbacks run
   * now) and frees itself once the pool hands back its last task. */
  gn__attest_glue *g = n->attest;
  if (!g)
    return;
  gn_attest_agent *a = g->agent;
  g->agent = NULL;
  gn_attest_agent_shutdown(a);
  for (size_t i = 0; i < g->nlocal; i++)
    gn_buf_done(&g->local[i].report_env);
  n->attest = NULL;
  free(g);
}

/* A verification someone waits for: the requester's check before it rents
 * (done) or POST /v1/attest (req). On the node's list until the agent
 * answers, so that a dial refused for another key answers it at once
 * (answered; the agent's own answer comes later, at its timeout, and is
 * dropped). */
typedef struct gn__attest_wait {
  struct gn__attest_wait *next;
  gn_node *n;
  uint8_t peer[GN_PK_LEN];
  bool answered;
  gn_attest_done_fn done; /* the requester's, or NULL */
  void *ud;
  gn_ctl_req *req; /* POST /v1/attest */
  char offer_id[GN_OFFER_ID_STRLEN];
  char provider[GN_NODE_ID_STRLEN];
} gn__attest_wait;

static void api_attest_answer(gn__attest_wait *w, int rc, const gn_attest_result *res, const gn_attest_result *mem,
                              const char *err);

static void wait_answer(gn__attest_wait *w, int rc, const gn_attest_result *res, const gn_attest_result *mem,
                        const char *err) {
  w->answered = true;
  if (w->done)
    w->done(w->n, w->ud, rc, res, err);
  else
    api_attest_answer(w, rc, res, mem, err);
}

static void wait_unlink(gn__attest_wait *w) {
  for (gn__attest_wait **pp = &w->n->attest->waits; *pp; pp = &(*pp)->next)
    if (*pp == w) {
      *pp = w->next;
      break;
    }
}

static void verify_done(void *ud, int rc, const gn_attest_result *res, const gn_attest_result *mem, const char *err) {
  gn__attest_wait *w = ud;
  wait_unlink(w);
  if (!w->answered)
    wait_answer(w, rc, res, mem, err);
  free(w);
}

/* Starts the agent's verification of offer e for w, its dial held to the
 * provider's key. Returns 0 (w belongs to the agent), GN_EPERM when the
 * offer's address is already up under another key (w is answered later by
 * the agent, and must not be answered by the caller), or another error
 * (verify refused: the caller frees w). */
static int verify_call(gn_node *n, const gn_offer_entry *e, gn__attest_wait *w) {
  gn_attest_agent *a = agent_of(n);
  if (!a)
    return GN_ECLOSED;
  w->n = n;
  memcpy(w->peer, e->offer.provider, GN_PK_LEN);
  gn__attest_glue *g = n->attest;
  g->dial_key = e->offer.provider;
  g->dial_rc = 0;
  int r = gn_attest_agent_verify(a, &e->offer, verify_done, w);
  g->dial_key = NULL;
  if (r < 0)
    return r;
  w->next = g->waits;
  g->waits = w;
  if (g->dial_rc == GN_EPERM) {
    w->answered = true;
    return GN_EPERM;
  }
  return 0;
}

int gn__attest_begin(gn_node *n, const gn_offer_entry *e, gn_attest_done_fn done, void *ud) {
  gn__attest_wait *w = calloc(1, sizeof *w);
  if (!w)
    return GN_ENOMEM;
  w->done = done;
  w->ud = ud;
  int r = verify_call(n, e, w);
  if (r < 0 && r != GN_EPERM)
    free(w);
  return r;
}

void gn__attest_dial_refused(gn_node *n, const char *addr, const uint8_t expected[GN_PK_LEN],
                             const uint8_t got[GN_PK_LEN]) {
  char want[GN_NODE_ID_STRLEN], is[GN_NODE_ID_STRLEN], err[300];
  gn_node_id_format(expected, want);
  gn_node_id_format(got, is);
  gn__strf(err, sizeof err, "cannot reach provider %s: the node at %s is %s, not the provider its offer names", want,
           addr, is);
  /* From the head again after each answer: it may change the list. */
  for (;;) {
    gn__attest_wait *w = n->attest ? n->attest->waits : NULL;
    while (w && (w->answered || memcmp(w->peer, expected, GN_PK_LEN) != 0))
      w = w->next;
    if (!w)
      break;
    wait_answer(w, GN_EPERM, NULL, NULL, err);
  }
}
/* --- views and the API --------------------------------------------------------*/

/* Whether the peer-checked report rep on offer o counts: it carries a lease
 * agreement, signed by the provider and by the report's verifier as
 * requester, of the offer's GPU model, requested after the verdict (both
 * times on the verifier's clock) and within GN_ATTEST_LEASE_WINDOW_S of it.
 * A verdict alone may be the provider's own second identity vouching. */
static bool verdict_leased(const gn_offer *o, const gn_attest_report *rep) {
  gn_agreement ag;
  if (!rep->has_verifier || !rep->lease_env || gn_agreement_open(rep->lease_env, rep->lease_env_len, &ag) < 0)
    return false;
  return memcmp(ag.terms.provider, o->provider, GN_PK_LEN) == 0 &&
         memcmp(ag.terms.requester, rep->verifier, GN_PK_LEN) == 0 && strcmp(ag.terms.gpu_model, o->gpu_model) == 0 &&
         ag.terms.requested_s >= rep->verdict_issued_s &&
         ag.terms.requested_s - rep->verdict_issued_s <= GN_ATTEST_LEASE_WINDOW_S;
}

void gn__offer_attest_verdict(const gn_offer *o, char *buf, size_t cap) {
  gn_attest_offer_verdict(o, buf, cap);
  gn_attest_report rep;
  uint8_t signer[GN_PK_LEN];
  if (!o->attest_len || gn_attest_report_open(o->attest, o->attest_len, &rep, signer) < 0)
    return;
  if (memcmp(signer, o->provider, GN_PK_LEN) == 0 && rep.has_verifier && !verdict_leased(o, &rep)) {
    char vid[GN_NODE_ID_STRLEN];
    gn_node_id_format(rep.verifier, vid);
    gn__strf(buf, cap, "%s (not counted: verifier %.14s… shows no lease of it)", rep.verdict, vid);
  }
  gn_attest_report_done(&rep);
}

static const char *outcome_name(gn_attest_outcome o) {
  switch (o) {
  case GN_ATTEST_VERIFIED:
    return "verified";
  case GN_ATTEST_TOO_SLOW:
    return "too_slow";
  case GN_ATTEST_SIMULATED:
    return "simulated";
  default:
    return "failed";
  }
}

/* Figures to four decimals: the measurement is not more precise than that. */
static double round4(double x) {
  return round(x * 1e4) / 1e4;
}

json_t *gn__attest_result_json(const gn_attest_result *res) {
  return json_pack("{s:s, s:s, s:s, s:f, s:f, s:I, s:I, s:b}", "verdict", res->verdict, "outcome",
                   outcome_name(res->outcome), "class", res->claimed_class, "measured_tops", round4(res->measured_tops),
                   "expected_tops", round4(res->expected_tops), "elapsed_ms", (json_int_t)res->elapsed_ms, "prover_ms",
                   (json_int_t)res->prover_ms, "simulated", res->simulated);
}

/* The memory challenge's figures (GB/s in the *_tops fields). */
static json_t *mem_result_json(const gn_attest_result *m) {
  return json_pack("{s:s, s:s, s:f, s:f, s:I}", "verdict", m->verdict, "outcome", outcome_name(m->outcome),
                   "measured_gbs", round4(m->measured_tops), "expected_gbs", round4(m->expected_tops), "elapsed_ms",
                   (json_int_t)m->elapsed_ms);
}

static void api_attest_answer(gn__attest_wait *w, int rc, const gn_attest_result *res, const gn_attest_result *mem,
                              const char *err) {
  if (rc < 0) {
    gn_ctl_reply_error(w->req, rc == GN_ETIMEDOUT ? 504 : 502, "%s", err ? err : gn_strerror(rc));
  } else {
    json_t *o = gn__attest_result_json(res);
    json_object_set_new(o, "offer", json_string(w->offer_id));
    json_object_set_new(o, "provider", json_string(w->provider));
    json_object_set_new(o, "memory", mem ? mem_result_json(mem) : json_null());
    gn_ctl_reply_json(w->req, 200, o);
  }
}

static void api_attest(gn_ctl_req *req, void *ud) {
  gn_node *n = ud;
  const char *target = json_string_value(json_object_get(gn_ctl_req_body(req), "target"));
  if (!target)
    return gn_ctl_reply_error(req, 400, "name an offer id or a provider's node id to attest");
  const gn_offer_entry *e = gn_offer_table_find(n->offers, target);
  uint8_t pk[GN_PK_LEN];
  if (!e && gn_node_id_parse(target, pk) == 0) {
    for (size_t i = 0; i < gn_offer_table_count(n->offers) && !e; i++)
      if (memcmp(gn_offer_table_at(n->offers, i)->offer.provider, pk, GN_PK_LEN) == 0)
        e = gn_offer_table_at(n->offers, i);
  }
  if (!e)
    return gn_ctl_reply_error(req, 404, "no offer or provider %s in the offer table (see: gpunet offers)", target);
  if (memcmp(e->offer.provider, n->id->pk, GN_PK_LEN) == 0)
    return gn_ctl_reply_error(req, 400, "offer %s is this node's own; see its self-check with: gpunet gpus", e->id);
  gn__attest_wait *w = calloc(1, sizeof *w);
  if (!w)
    return gn_ctl_reply_error(req, 500, "out of memory");
  w->req = req;
  gn__strf(w->offer_id, sizeof w->offer_id, "%s", e->id);
  gn_node_id_format(e->offer.provider, w->provider);
  int r = verify_call(n, e, w);
  if (r == GN_EPERM)
    return gn_ctl_reply_error(req, 502,
                              "cannot reach provider %s: the node at %s is another one, not the provider its offer "
                              "names",
                              w->provider, e->offer.addr);
  if (r < 0) {
    free(w);
    return gn_ctl_reply_error(req, r == GN_ENOTFOUND ? 409 : 500, "cannot attest %s: %s", e->offer.gpu_model,
                              r == GN_ENOTFOUND ? "no attestation class for this GPU model" : gn_strerror(r));
  }
}

static void route_attest(gn_ctl_req *req, void *ud) {
  if (gn__body_id_ok(req, "target", "offer or node"))
    api_attest(req, ud);
}

void gn__attest_register(gn_node *n) {
  gn_ctl_route(n->ctl, "POST", "/v1/attest", route_attest, n);
}
