/* Attestation in the daemon: a provider's self-check of each GPU model at
 * start (its signed report rides on its offers), the challenge exchange over
 * the network (provider answers, requester verifies with its own clock), and
 * the peer's signed verdict, which the provider then carries in its report.
 * The math and the message bodies are attest_*.c; this file moves them. */
#include "node_internal.h"

#include <math.h>
#include <sodium.h>
#include <stdio.h>

/* Simulated GPUs are proven by the CPU reference: a tiny challenge, enough
 * to exercise every message, graded "simulated" whatever its timing. */
static const gn_attest_params sim_params = {.n = 256, .depth = 1, .rounds = 2, .open_rounds = 2, .open_rows = 4};
#define SIM_MAX_OPS 1e10
#define ATTEST_TIMEOUT_MS 120000 /* default; env GN_ATTEST_TIMEOUT_MS overrides */
#define ATTEST_DATA_MAX (GN_ATTEST_PROOF_ROW_BYTES_MAX + 1024 * 1024)

/* How long a peer has for each challenge. Tests shorten it. */
uint64_t gn__attest_timeout_ms(void) {
  const char *e = getenv("GN_ATTEST_TIMEOUT_MS");
  char *end;
  unsigned long long v = e ? strtoull(e, &end, 10) : 0;
  return e && *e && !*end && v >= 100 && v <= 3600000 ? v : ATTEST_TIMEOUT_MS;
}

static gn_attest_gpu gpu_identity(const gn_gpu *g) {
  gn_attest_gpu a;
  memset(&a, 0, sizeof a);
  gn__strf(a.uuid, sizeof a.uuid, "%s", g->uuid);
  gn__strf(a.name, sizeof a.name, "%s", g->name);
  a.memory_mib = (uint32_t)g->memory_mib;
  gn__strf(a.pci_bus_id, sizeof a.pci_bus_id, "%s", g->pci_bus_id);
  gn__strf(a.driver, sizeof a.driver, "%s", g->driver);
  return a;
}

const gn_attest_local *gn__attest_local_find(const gn_node *n, const char *model) {
  for (size_t i = 0; i < n->attest_n; i++)
    if (strcmp(n->attest[i].model, model) == 0)
      return &n->attest[i];
  return NULL;
}

/* The backend that proves a local GPU model: the CPU reference for a
 * simulated GPU, the CUDA kernel for a real one (NULL when it cannot load). */
static const gn_attest_backend *slot_backend(gn_node *n, gn_attest_local *a) {
  if (a->simulated)
    return gn_attest_backend_cpu();
  if (!a->cuda && gn_attest_cuda_open(n->gpus.items[a->gpu_index].index, &a->cuda) < 0)
    return NULL;
  return a->cuda;
}

static int params_for(const char *model, bool simulated, gn_attest_params *ret, const char **ret_class) {
  const gn_attest_class *c = gn_attest_class_find(model);
  *ret_class = c ? c->name : model;
  if (simulated) {
    *ret = sim_params;
    return 0;
  }
  if (!c)
    return GN_ENOTFOUND;
  return gn_attest_params_for_class(c, GN__ATTEST_TARGET_MS, ret);
}

/* --- the provider's self-check at start -------------------------------------*/

static void local_work(uv_work_t *w) {
  gn_attest_local *a = w->data;
  const char *cls;
  a->rc = params_for(a->model, a->simulated, &a->params, &cls);
  if (a->rc == 0)
    a->rc = gn_attest_run_local(a->simulated ? gn_attest_backend_cpu() : a->cuda, &a->params, cls, &a->result);
}

static void local_done(uv_work_t *w, int status) {
  gn_attest_local *a = w->data;
  gn_node *n = a->node;
  a->running = false;
  a->done = true;
  if (status < 0 || a->rc < 0) {
    gn__strf(a->verdict, sizeof a->verdict, "not attested: %s", gn_strerror(a->rc));
    gn_log(GN_LOG_WARN, "attestation of %s failed to run: %s", a->model, gn_strerror(a->rc));
    return;
  }
  gn_attest_gpu gpu = gpu_identity(&n->gpus.items[a->gpu_index]);
  gn_attest_report_done(&a->report);
  gn_attest_report_from_result(&a->report, &gpu, &a->params, &a->result, gn_unix_s());
  gn_buf_done(&a->report_env);
  if (gn_attest_report_seal(n->id, &a->report, &a->report_env) < 0)
    gn_buf_done(&a->report_env);
  gn__strf(a->verdict, sizeof a->verdict, "%s (self-check)", a->result.verdict);
  gn_log(GN_LOG_INFO, "attestation of %s: %s (%llu ms)", a->model, a->result.verdict,
         (unsigned long long)a->result.elapsed_ms);
  n->offers_dirty = true;
}

void gn__attest_start_local(gn_node *n) {
  for (size_t i = 0; i < n->gpus.count && n->attest_n < GN_ATTEST_MODELS; i++) {
    if (gn__attest_local_find(n, n->gpus.items[i].name))
      continue;
    gn_attest_local *a = &n->attest[n->attest_n++];
    a->node = n;
    gn__strf(a->model, sizeof a->model, "%s", n->gpus.items[i].name);
    a->gpu_index = i;
    a->simulated = n->gpus.items[i].simulated;
    if (!slot_backend(n, a)) {
      gn__strf(a->verdict, sizeof a->verdict, "not attested: the CUDA attestation kernel is not available here");
      a->done = true;
      continue;
    }
    gn__strf(a->verdict, sizeof a->verdict, "pending");
    a->running = true;
    a->work.data = a;
    uv_queue_work(n->loop, &a->work, local_work, local_done);
  }
}

/* --- wire wrapper: {sid, gpu_model?, data} -----------------------------------*/

int gn__attest_send_wrapped(gn_node *n, const uint8_t peer[GN_PK_LEN], uint32_t type, const char *sid,
                            const char *model, const gn_buf *data, gn_buf *ret_env) {
  gn_wire_writer w;
  gn_buf body = {0};
  gn_wire_writer_init(&w);
  gn_wire_put_map(&w, model ? 3 : 2);
  gn_wire_put_str(&w, "sid");
  gn_wire_put_str(&w, sid);
  if (model) {
    gn_wire_put_str(&w, "gpu_model");
    gn_wire_put_str(&w, model);
  }
  gn_wire_put_str(&w, "data");
  gn_wire_put_bin(&w, data->data, data->len);
  int r = gn_wire_writer_take(&w, &body);
  gn_wire_writer_done(&w);
  gn_buf env = {0};
  if (r == 0)
    r = gn_envelope_seal(n->id, type, body.data, body.len, &env);
  gn_buf_done(&body);
  if (r == 0 && ret_env)
    r = gn_buf_append(ret_env, env.data, env.len);
  else if (r == 0)
    r = gn_transport_send(n->tp, peer, env.data, env.len);
  gn_buf_done(&env);
  return r;
}

void gn__attest_send_error(gn_node *n, const uint8_t peer[GN_PK_LEN], const char *sid, const char *reason) {
  gn_wire_writer w;
  gn_wire_writer_init(&w);
  gn_wire_put_map(&w, 2);
  gn_wire_put_str(&w, "sid");
  gn_wire_put_str(&w, sid);
  gn_wire_put_str(&w, "reason");
  gn_wire_put_str(&w, reason);
  gn__node_send(n, peer, GN_MSG_ERROR, &w);
  gn_wire_writer_done(&w);
}

static int unwrap(const gn_envelope *env, gn__attest_wrapped *ret) {
  memset(ret, 0, sizeof *ret);
  int r = gn_wire_decode(env->body, env->body_len, &ret->doc);
  if (r < 0)
    return r;
  const msgpack_object *o = ret->doc.root;
  if (o->type != MSGPACK_OBJECT_MAP || (r = gn_wire_get_str(o, "sid", ret->sid, sizeof ret->sid)) < 0 ||
      (gn_wire_get(o, "gpu_model") && (r = gn_wire_get_str(o, "gpu_model", ret->model, sizeof ret->model)) < 0) ||
      (gn_wire_get(o, "reason") && (r = gn_wire_get_str(o, "reason", ret->reason, sizeof ret->reason)) < 0) ||
      (env->type != GN_MSG_ERROR &&
       (r = gn_wire_get_bin_ref(o, "data", ATTEST_DATA_MAX, &ret->data, &ret->data_len)) < 0)) {
    gn_wire_doc_done(&ret->doc);
    return r < 0 ? r : GN_EINVAL;
  }
  return 0;
}

/* --- the provider answers a challenge ----------------------------------------*/

static void prove_free(gn_node *n, gn_prove_sess *s) {
  for (gn_prove_sess **pp = &n->provers; *pp; pp = &(*pp)->next)
    if (*pp == s) {
      *pp = s->next;
      break;
    }
  gn_attest_prover_free(s->pr);
  gn_attest_mem_prover_free(s->mem);
  gn_buf_done(&s->in);
  gn_buf_done(&s->out);
  free(s);
}

static void prove_work(uv_work_t *w) {
  gn_prove_sess *s = w->data;
  uint64_t t0 = gn_mono_ms();
  switch (s->stage) {
  case GN_MSG_ATTEST_CHALLENGE:
    s->rc = gn_attest_prover_on_challenge(s->pr, s->in.data, s->in.len, &s->out);
    s->prover_ms = gn_mono_ms() - t0;
    break;
  case GN_MSG_ATTEST_OPEN:
    s->rc = gn_attest_prover_on_open(s->pr, s->in.data, s->in.len, &s->out);
    break;
  case GN_MSG_ATTEST_MEM_CHALLENGE:
    s->rc = gn_attest_mem_prover_on_challenge(s->mem, s->in.data, s->in.len, &s->out);
    break;
  default:
    s->rc = gn_attest_mem_prover_on_walk(s->mem, s->in.data, s->in.len, &s->out);
    break;
  }
}

/* What the provider answers to the message it just worked. */
static uint32_t answer_type(uint32_t stage) {
  switch (stage) {
  case GN_MSG_ATTEST_CHALLENGE:
    return GN_MSG_ATTEST_RESPONSE;
  case GN_MSG_ATTEST_OPEN:
    return GN_MSG_ATTEST_PROOF;
  case GN_MSG_ATTEST_MEM_CHALLENGE:
    return GN_MSG_ATTEST_MEM_READY;
  default:
    return GN_MSG_ATTEST_MEM_RESULT;
  }
}

static void prove_done(uv_work_t *w, int status) {
  gn_prove_sess *s = w->data;
  gn_node *n = s->n;
  s->working = false;
  n->prover_busy = false;
  if (status < 0 || s->rc < 0) {
    gn__attest_send_error(n, s->peer, s->sid,
                          s->rc == GN_ETOOBIG ? "challenge too large for this provider" : gn_strerror(s->rc));
    prove_free(n, s);
    return;
  }
  uint32_t type = answer_type(s->stage);
  gn__attest_send_wrapped(n, s->peer, type, s->sid, NULL, &s->out, NULL);
  gn_buf_done(&s->out);
  gn_buf_done(&s->in);
  if (type == GN_MSG_ATTEST_PROOF || type == GN_MSG_ATTEST_MEM_RESULT) {
    /* Kept until the verifier's memory challenge or verdict arrives (or the
     * session expires), for the prover's own timing in the report. */
    s->stage = 0;
  }
}

void gn__attest_prove_start(gn_node *n, gn_prove_sess *s, uint32_t stage, const uint8_t *data, size_t len) {
  s->stage = stage;
  gn_buf_done(&s->in);
  gn_buf_append(&s->in, data, len);
  s->working = true;
  n->prover_busy = true;
  s->work.data = s;
  uv_queue_work(n->loop, &s->work, prove_work, prove_done);
}

gn_prove_sess *gn__attest_prove_find(gn_node *n, const uint8_t peer[GN_PK_LEN], const char *sid) {
  for (gn_prove_sess *s = n->provers; s; s = s->next)
    if (memcmp(s->peer, peer, GN_PK_LEN) == 0 && strcmp(s->sid, sid) == 0)
      return s;
  return NULL;
}

static void on_challenge(gn_node *n, const uint8_t peer[GN_PK_LEN], const gn__attest_wrapped *m) {
  gn_attest_local *a = NULL;
  for (size_t i = 0; i < n->attest_n; i++)
    if (strcmp(n->attest[i].model, m->model) == 0)
      a = &n->attest[i];
  if (!n->cfg.provide || !a)
    return gn__attest_send_error(n, peer, m->sid, "no such GPU model on this provider");
  const gn_attest_backend *b = slot_backend(n, a);
  if (!b)
    return gn__attest_send_error(n, peer, m->sid, "this provider cannot run the attestation kernel");
  /* One proof at a time: the GPU (or CPU) is the resource being measured,
   * and a second one would only slow both down. */
  if (n->prover_busy || gn__attest_prove_find(n, peer, m->sid))
    return gn__attest_send_error(n, peer, m->sid, "busy with another attestation; try again shortly");
  gn_prove_sess *s = calloc(1, sizeof *s);
  if (!s || gn_attest_prover_new(b, &s->pr) < 0) {
    free(s);
    return gn__attest_send_error(n, peer, m->sid, "out of memory");
  }
  if (a->simulated)
    gn_attest_prover_set_max_ops(s->pr, SIM_MAX_OPS);
  s->n = n;
  memcpy(s->peer, peer, GN_PK_LEN);
  gn__strf(s->sid, sizeof s->sid, "%s", m->sid);
  s->slot = (size_t)(a - n->attest);
  s->started_ms = gn_mono_ms();
  s->deadline_ms = s->started_ms + gn__attest_timeout_ms();
  s->next = n->provers;
  n->provers = s;
  char pid[GN_NODE_ID_STRLEN];
  gn_node_id_format(peer, pid);
  gn_log(GN_LOG_INFO, "attestation challenge for %s from %s", a->model, pid);
  gn__attest_prove_start(n, s, GN_MSG_ATTEST_CHALLENGE, m->data, m->data_len);
}

static void on_open(gn_node *n, const uint8_t peer[GN_PK_LEN], const gn__attest_wrapped *m) {
  gn_prove_sess *s = gn__attest_prove_find(n, peer, m->sid);
  if (!s || s->working || s->stage != GN_MSG_ATTEST_CHALLENGE)
    return gn__attest_send_error(n, peer, m->sid, "no attestation challenge awaiting its opening");
  if (n->prover_busy)
    return gn__attest_send_error(n, peer, m->sid, "busy with another attestation; try again shortly");
  gn__attest_prove_start(n, s, GN_MSG_ATTEST_OPEN, m->data, m->data_len);
}

/* A verifier's signed verdict on our exchange: it becomes our report, so
 * every requester sees a peer-checked result instead of our own word. */
static void on_verdict(gn_node *n, const uint8_t peer[GN_PK_LEN], const uint8_t *raw, size_t raw_len) {
  for (gn_prove_sess *s = n->provers; s; s = s->next) {
    if (memcmp(s->peer, peer, GN_PK_LEN) != 0 || s->working || s->stage != 0)
      continue;
    gn_attest_local *a = &n->attest[s->slot];
    gn_attest_gpu gpu = gpu_identity(&n->gpus.items[a->gpu_index]);
    gn_attest_report rep;
    memset(&rep, 0, sizeof rep);
    int r = gn_attest_report_from_verdict(&rep, &gpu, n->id->pk, raw, raw_len, s->prover_ms, gn_unix_s());
    if (r == 0) {
      gn_buf env = {0};
      if (gn_attest_report_seal(n->id, &rep, &env) == 0 && env.len <= GN_OFFER_ATTEST_MAX) {
        gn_buf_done(&a->report_env);
        a->report_env = env;
        gn_attest_report_done(&a->report);
        a->report = rep;
        char vid[GN_NODE_ID_STRLEN];
        gn_node_id_format(peer, vid);
        gn__strf(a->verdict, sizeof a->verdict, "%s (checked by %.14s…)", rep.verdict, vid);
        gn_log(GN_LOG_INFO, "attestation of %s checked by %s: %s", a->model, vid, rep.verdict);
        n->offers_dirty = true;
      } else {
        gn_buf_done(&env);
        gn_attest_report_done(&rep);
      }
      prove_free(n, s);
      return;
    }
    gn_attest_report_done(&rep);
  }
}

/* --- the requester verifies ---------------------------------------------------*/

void gn__attest_verify_free(gn_verify_sess *s) {
  gn_attest_verifier_free(s->v);
  gn_attest_mem_verifier_free(s->mv);
  gn_buf_done(&s->pending);
  gn_buf_done(&s->verdict_env);
  gn_buf_done(&s->in);
  free(s);
}

void gn__attest_verify_finish(gn_node *n, gn_verify_sess *s, int rc, const gn_attest_result *res, const char *err) {
  for (gn_verify_sess **pp = &n->verifiers; *pp; pp = &(*pp)->next)
    if (*pp == s) {
      *pp = s->next;
      break;
    }
  gn_attest_done_fn done = s->done;
  void *ud = s->ud;
  if (s->working)
    s->orphan = true; /* its work is still on the pool: freed when it returns */
  else
    gn__attest_verify_free(s);
  done(n, ud, rc, res, err);
}

static int attest_begin(gn_node *n, const gn_offer_entry *e, gn_attest_done_fn done, void *ud,
                        gn_attest_result *mem_out, bool *mem_set) {
  const char *cls;
  gn_verify_sess *s = calloc(1, sizeof *s);
  gn_buf challenge = {0};
  if (!s)
    return GN_ENOMEM;
  int r = params_for(e->offer.gpu_model, e->offer.simulated, &s->params, &cls);
  if (r < 0) {
    free(s);
    return r;
  }
  r = gn_attest_verifier_new(&s->params, cls, NULL, NULL, &challenge, &s->v);
  if (r < 0) {
    free(s);
    return r;
  }
  uint8_t rnd[8];
  char hex[17];
  randombytes_buf(rnd, sizeof rnd);
  gn__hex(rnd, sizeof rnd, hex);
  gn__strf(s->sid, sizeof s->sid, "a-%s", hex);
  memcpy(s->peer, e->offer.provider, GN_PK_LEN);
  gn__strf(s->model, sizeof s->model, "%s", e->offer.gpu_model);
  s->done = done;
  s->ud = ud;
  s->offer_sim = e->offer.simulated;
  s->mem_out = mem_out;
  s->mem_set = mem_set;
  s->deadline_ms = gn_mono_ms() + gn__attest_timeout_ms();
  r = gn__attest_send_wrapped(n, s->peer, GN_MSG_ATTEST_CHALLENGE, s->sid, s->model, &challenge, &s->pending);
  gn_buf_done(&challenge);
  if (r < 0) {
    gn_attest_verifier_free(s->v);
    gn_buf_done(&s->pending);
    free(s);
    return r;
  }
  s->next = n->verifiers;
  n->verifiers = s;
  /* The clock starts when the challenge leaves, not before: a provider we
   * still have to dial is not charged for the connection time. */
  if (gn_transport_is_up(n->tp, s->peer))
    gn__attest_peer_up(n, s->peer);
  else
    gn_transport_connect(n->tp, e->offer.addr);
  return 0;
}

int gn__attest_begin(gn_node *n, const gn_offer_entry *e, gn_attest_done_fn done, void *ud) {
  return attest_begin(n, e, done, ud, NULL, NULL);
}

void gn__attest_peer_up(gn_node *n, const uint8_t peer[GN_PK_LEN]) {
  for (gn_verify_sess *s = n->verifiers; s; s = s->next) {
    if (!s->pending.len || memcmp(s->peer, peer, GN_PK_LEN) != 0)
      continue;
    s->t_sent_ms = gn_mono_ms();
    gn_transport_send(n->tp, peer, s->pending.data, s->pending.len);
    gn_buf_done(&s->pending);
  }
}

gn_verify_sess *gn__attest_verify_find(gn_node *n, const uint8_t peer[GN_PK_LEN], const char *sid) {
  for (gn_verify_sess *s = n->verifiers; s; s = s->next)
    if (memcmp(s->peer, peer, GN_PK_LEN) == 0 && strcmp(s->sid, sid) == 0)
      return s;
  return NULL;
}

static void on_response(gn_node *n, const uint8_t peer[GN_PK_LEN], const gn__attest_wrapped *m) {
  gn_verify_sess *s = gn__attest_verify_find(n, peer, m->sid);
  if (!s || s->elapsed_ms)
    return;
  s->elapsed_ms = gn_mono_ms() - s->t_sent_ms;
  if (s->elapsed_ms == 0)
    s->elapsed_ms = 1;
  gn_buf open = {0};
  int r = gn_attest_verifier_on_response(s->v, m->data, m->data_len, &open);
  if (r < 0) {
    gn_attest_result res;
    memset(&res, 0, sizeof res);
    res.outcome = GN_ATTEST_FAILED;
    gn__strf(res.verdict, sizeof res.verdict, "failed: the provider's response is invalid (%s)", gn_strerror(r));
    gn_buf_done(&open);
    return gn__attest_verify_finish(n, s, 0, &res, NULL);
  }
  gn__attest_send_wrapped(n, peer, GN_MSG_ATTEST_OPEN, s->sid, NULL, &open, NULL);
  gn_buf_done(&open);
}

static void on_proof(gn_node *n, const uint8_t peer[GN_PK_LEN], const gn__attest_wrapped *m) {
  gn_verify_sess *s = gn__attest_verify_find(n, peer, m->sid);
  if (!s || !s->elapsed_ms || s->mv)
    return;
  gn_attest_result res;
  memset(&res, 0, sizeof res);
  int r = gn_attest_verifier_on_proof(s->v, m->data, m->data_len, s->elapsed_ms, &res);
  if (r < 0) {
    res.outcome = GN_ATTEST_FAILED;
    gn__strf(res.verdict, sizeof res.verdict, "failed: the provider's proof is malformed (%s)", gn_strerror(r));
  }
  if (res.outcome == GN_ATTEST_FAILED)
    return gn__attest_verify_finish(n, s, 0, &res, NULL);
  /* Our signed verdict on the compute proof goes back to the provider, who
   * may carry it, once the memory challenge is passed too. */
  s->compute = res;
  if (gn_attest_verdict_seal(n->id, peer, &s->params, &res, gn_unix_s(), &s->verdict_env) < 0)
    gn_buf_done(&s->verdict_env);
  gn__attest_mem_begin(n, s);
}

static void on_error(gn_node *n, const uint8_t peer[GN_PK_LEN], const gn__attest_wrapped *m) {
  gn_verify_sess *s = gn__attest_verify_find(n, peer, m->sid);
  if (s) {
    char err[300];
    gn__strf(err, sizeof err, "provider refused the attestation challenge: %s", m->reason);
    gn__attest_verify_finish(n, s, GN_EREMOTE, NULL, err);
  }
}

void gn__attest_on_message(gn_node *n, const uint8_t peer[GN_PK_LEN], const gn_envelope *env, const uint8_t *raw,
                           size_t raw_len) {
  if (env->type == GN_MSG_ATTEST_VERDICT)
    return on_verdict(n, peer, raw, raw_len);
  gn__attest_wrapped m;
  if (unwrap(env, &m) < 0)
    return;
  switch (env->type) {
  case GN_MSG_ATTEST_CHALLENGE:
    on_challenge(n, peer, &m);
    break;
  case GN_MSG_ATTEST_OPEN:
    on_open(n, peer, &m);
    break;
  case GN_MSG_ATTEST_RESPONSE:
    on_response(n, peer, &m);
    break;
  case GN_MSG_ATTEST_PROOF:
    on_proof(n, peer, &m);
    break;
  case GN_MSG_ATTEST_MEM_CHALLENGE:
    gn__attest_mem_on_challenge(n, peer, &m);
    break;
  case GN_MSG_ATTEST_MEM_READY:
    gn__attest_mem_on_ready(n, peer, &m);
    break;
  case GN_MSG_ATTEST_MEM_WALK:
    gn__attest_mem_on_walk(n, peer, &m);
    break;
  case GN_MSG_ATTEST_MEM_RESULT:
    gn__attest_mem_on_result(n, peer, &m);
    break;
  case GN_MSG_ERROR:
    on_error(n, peer, &m);
    break;
  default:
    break;
  }
  gn_wire_doc_done(&m.doc);
}

void gn__attest_tick(gn_node *n, uint64_t now_ms) {
  for (gn_verify_sess *s = n->verifiers, *next; s; s = next) {
    next = s->next;
    if (now_ms >= s->deadline_ms)
      gn__attest_verify_finish(n, s, GN_ETIMEDOUT, NULL,
                               "the provider did not finish the attestation challenge in time");
  }
  for (gn_prove_sess *s = n->provers, *next; s; s = next) {
    next = s->next;
    if (!s->working && now_ms >= s->deadline_ms)
      prove_free(n, s);
  }
}

void gn__attest_shutdown(gn_node *n) {
  while (n->verifiers)
    gn__attest_verify_finish(n, n->verifiers, GN_ECLOSED, NULL, "gpunetd is shutting down");
  for (gn_prove_sess *s = n->provers, *next; s; s = next) {
    next = s->next;
    if (!s->working) /* a working one is freed when its work returns */
      prove_free(n, s);
  }
  for (size_t i = 0; i < n->attest_n; i++) {
    gn_attest_report_done(&n->attest[i].report);
    gn_buf_done(&n->attest[i].report_env);
  }
}

/* --- views and the API --------------------------------------------------------*/

void gn__offer_attest_verdict(const gn_offer *o, char *buf, size_t cap) {
  buf[0] = 0;
  if (!o->attest_len)
    return;
  gn_attest_report rep;
  uint8_t signer[GN_PK_LEN];
  if (gn_attest_report_open(o->attest, o->attest_len, &rep, signer) < 0 ||
      memcmp(signer, o->provider, GN_PK_LEN) != 0) {
    gn__strf(buf, cap, "invalid report");
    return;
  }
  if (rep.has_verifier) {
    char vid[GN_NODE_ID_STRLEN];
    gn_node_id_format(rep.verifier, vid);
    gn__strf(buf, cap, "%s (checked by %.14s…)", rep.verdict, vid);
  } else {
    gn__strf(buf, cap, "%s (self-reported)", rep.verdict);
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

typedef struct api_attest_ctx {
  gn_ctl_req *req;
  gn_attest_result mem;
  bool has_mem;
  char offer_id[GN_OFFER_ID_STRLEN];
  char provider[GN_NODE_ID_STRLEN];
} api_attest_ctx;

static void api_attest_done(gn_node *n, void *ud, int rc, const gn_attest_result *res, const char *err) {
  (void)n;
  api_attest_ctx *c = ud;
  if (rc < 0) {
    gn_ctl_reply_error(c->req, rc == GN_ETIMEDOUT ? 504 : 502, "%s", err ? err : gn_strerror(rc));
  } else {
    json_t *o = gn__attest_result_json(res);
    json_object_set_new(o, "offer", json_string(c->offer_id));
    json_object_set_new(o, "provider", json_string(c->provider));
    json_object_set_new(o, "memory", c->has_mem ? mem_result_json(&c->mem) : json_null());
    gn_ctl_reply_json(c->req, 200, o);
  }
  free(c);
}

void gn__api_attest(gn_ctl_req *req, void *ud) {
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
  api_attest_ctx *c = calloc(1, sizeof *c);
  if (!c)
    return gn_ctl_reply_error(req, 500, "out of memory");
  c->req = req;
  gn__strf(c->offer_id, sizeof c->offer_id, "%s", e->id);
  gn_node_id_format(e->offer.provider, c->provider);
  int r = attest_begin(n, e, api_attest_done, c, &c->mem, &c->has_mem);
  if (r < 0) {
    free(c);
    return gn_ctl_reply_error(req, r == GN_ENOTFOUND ? 409 : 500, "cannot attest %s: %s", e->offer.gpu_model,
                              r == GN_ENOTFOUND ? "no attestation class for this GPU model" : gn_strerror(r));
  }
}
