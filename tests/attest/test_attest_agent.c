/* The attestation agent through its io alone, no daemon: a provider's and a
 * requester's agent joined by an in-process link (every message sealed,
 * opened and verified as on the wire), a worker queue that the test pumps
 * and a clock it sets. Other challengers are played by sealing their
 * messages here; what the provider answers them is kept aside. The GPU is
 * simulated (the CPU reference), as it says. */
#include <gpunet/attest.h>
#include <gpunet/identity.h>
#include <gpunet/wire.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#define MAX_MSGS 64
#define MAX_TASKS 16

typedef struct side side;

typedef struct msg {
  side *to;
  uint8_t from[GN_PK_LEN];
  gn_buf env;
} msg;

typedef struct world {
  msg msgs[MAX_MSGS];
  size_t nmsgs;
  gn_buf stray[MAX_MSGS]; /* sent to played peers (neither side) */
  size_t nstray;
  uint64_t clock_ms;     /* the agents' io clock */
  bool nothing_leasable; /* the provider's io says no GPU is free */
  gn_attest_task *tasks[MAX_TASKS];
  size_t ntasks;
  side *sides[2];
  bool drop_all; /* the link loses everything */
} world;

struct side {
  world *w;
  gn_identity *id;
  gn_attest_agent *a;
  bool up;
  int connects;
  int changed;
  char last_log[512];
};

typedef struct outcome {
  int calls;
  int rc;
  gn_attest_result res;
  bool has_mem;
  gn_attest_result mem;
  char err[300];
} outcome;

static side *peer_side(world *w, const uint8_t pk[GN_PK_LEN]) {
  for (int i = 0; i < 2; i++)
    if (memcmp(w->sides[i]->id->pk, pk, GN_PK_LEN) == 0)
      return w->sides[i];
  return NULL;
}

static int io_send(void *ctx, const uint8_t peer[GN_PK_LEN], const uint8_t *env, size_t len) {
  side *s = ctx;
  world *w = s->w;
  side *to = peer_side(w, peer);
  if (!to) {
    assert_true(w->nstray < MAX_MSGS);
    memset(&w->stray[w->nstray], 0, sizeof w->stray[0]);
    assert_int_equal(gn_buf_append(&w->stray[w->nstray++], env, len), 0);
    return 0;
  }
  assert_true(w->nmsgs < MAX_MSGS);
  if (w->drop_all)
    return 0;
  msg *m = &w->msgs[w->nmsgs++];
  memset(m, 0, sizeof *m);
  m->to = to;
  memcpy(m->from, s->id->pk, GN_PK_LEN);
  assert_int_equal(gn_buf_append(&m->env, env, len), 0);
  return 0;
}

static bool io_is_up(void *ctx, const uint8_t peer[GN_PK_LEN]) {
  (void)peer;
  return ((side *)ctx)->up;
}

static void io_connect(void *ctx, const char *addr) {
  (void)addr;
  ((side *)ctx)->connects++;
}

static int io_queue(void *ctx, gn_attest_task *t) {
  world *w = ((side *)ctx)->w;
  assert_true(w->ntasks < MAX_TASKS);
  w->tasks[w->ntasks++] = t;
  return 0;
}

static void io_log(void *ctx, bool warn, const char *line) {
  (void)warn;
  side *s = ctx;
  snprintf(s->last_log, sizeof s->last_log, "%s", line);
}

static void io_changed(void *ctx, size_t slot) {
  (void)slot;
  ((side *)ctx)->changed++;
}

static bool io_leasable(void *ctx, const uint8_t peer[GN_PK_LEN], const char *model) {
  (void)peer;
  (void)model;
  return !((side *)ctx)->w->nothing_leasable;
}

static uint64_t io_now_ms(void *ctx) {
  return ((side *)ctx)->w->clock_ms;
}

static const gn_attest_io test_io = {.send = io_send,
                                     .is_up = io_is_up,
                                     .connect = io_connect,
                                     .queue = io_queue,
                                     .log = io_log,
                                     .changed = io_changed,
                                     .leasable = io_leasable,
                                     .now_ms = io_now_ms};

/* Delivers messages and runs tasks (oldest first) until nothing is left. */
static void pump(world *w) {
  for (int guard = 0; guard < 1000 && (w->nmsgs || w->ntasks); guard++) {
    if (w->ntasks) {
      gn_attest_task *t = w->tasks[0];
      memmove(w->tasks, w->tasks + 1, --w->ntasks * sizeof w->tasks[0]);
      gn_attest_task_run(t);
      gn_attest_task_done(t, 0);
      continue;
    }
    msg m = w->msgs[0];
    memmove(w->msgs, w->msgs + 1, --w->nmsgs * sizeof w->msgs[0]);
    gn_envelope env;
    assert_int_equal(gn_envelope_open(m.env.data, m.env.len, &env), 0);
    assert_memory_equal(env.signer, m.from, GN_PK_LEN);
    if (m.to->a)
      gn_attest_agent_on_message(m.to->a, m.from, &env, m.env.data, m.env.len);
    gn_buf_done(&m.env);
  }
  assert_int_equal(w->nmsgs, 0);
  assert_int_equal(w->ntasks, 0);
}

static void on_verified(void *ud, int rc, const gn_attest_result *res, const gn_attest_result *mem, const char *err) {
  outcome *o = ud;
  o->calls++;
  o->rc = rc;
  if (res)
    o->res = *res;
  o->has_mem = mem != NULL;
  if (mem)
    o->mem = *mem;
  snprintf(o->err, sizeof o->err, "%s", err ? err : "");
}

typedef struct fixture {
  world w;
  side prov, req;
} fixture;

static int setup(void **state) {
  fixture *f = calloc(1, sizeof *f);
  assert_non_null(f);
  f->prov.w = f->req.w = &f->w;
  f->w.sides[0] = &f->prov;
  f->w.sides[1] = &f->req;
  assert_int_equal(gn_identity_generate(&f->prov.id), 0);
  assert_int_equal(gn_identity_generate(&f->req.id), 0);
  assert_int_equal(gn_attest_agent_new(f->prov.id, &test_io, &f->prov, true, &f->prov.a), 0);
  assert_int_equal(gn_attest_agent_new(f->req.id, &test_io, &f->req, false, &f->req.a), 0);
  f->req.up = true;
  f->w.clock_ms = 5000000;
  *state = f;
  return 0;
}

static int teardown(void **state) {
  fixture *f = *state;
  gn_attest_agent_shutdown(f->prov.a);
  gn_attest_agent_shutdown(f->req.a);
  f->prov.a = f->req.a = NULL;
  pump(&f->w); /* tasks still queued return to agents that then free themselves */
  for (size_t i = 0; i < f->w.nstray; i++)
    gn_buf_done(&f->w.stray[i]);
  gn_identity_free(f->prov.id);
  gn_identity_free(f->req.id);
  free(f);
  return 0;
}

static gn_attest_gpu sim_gpu(const char *name) {
  gn_attest_gpu g;
  memset(&g, 0, sizeof g);
  snprintf(g.name, sizeof g.name, "%s", name);
  snprintf(g.uuid, sizeof g.uuid, "GPU-SIM-1");
  g.memory_mib = 24564;
  return g;
}

static gn_offer offer_of(const fixture *f, const char *model, bool simulated) {
  gn_offer o;
  memset(&o, 0, sizeof o);
  memcpy(o.provider, f->prov.id->pk, GN_PK_LEN);
  snprintf(o.addr, sizeof o.addr, "127.0.0.1:1");
  snprintf(o.gpu_model, sizeof o.gpu_model, "%s", model);
  o.simulated = simulated;
  return o;
}

/* The provider's own check at start: a sealed, self-signed report. */
static void test_self_check_seals_a_report(void **state) {
  fixture *f = *state;
  gn_attest_gpu g = sim_gpu("NVIDIA GeForce RTX 4090");
  assert_int_equal(gn_attest_agent_add_local(f->prov.a, &g, 0, true), 0);
  gn_attest_local_view v;
  assert_int_equal(gn_attest_agent_local(f->prov.a, 0, &v), 0);
  assert_string_equal(v.verdict, "pending");
  assert_false(v.done);
  pump(&f->w);
  assert_int_equal(gn_attest_agent_local(f->prov.a, 0, &v), 0);
  assert_true(v.done);
  assert_string_equal(v.model, "NVIDIA GeForce RTX 4090");
  assert_string_equal(v.verdict, "simulated (self-check)");
  assert_true(f->prov.changed >= 2);
  gn_attest_report rep;
  uint8_t signer[GN_PK_LEN];
  assert_non_null(v.report);
  assert_int_equal(gn_attest_report_open(v.report, v.report_len, &rep, signer), 0);
  assert_memory_equal(signer, f->prov.id->pk, GN_PK_LEN);
  assert_false(rep.has_verifier);
  assert_true(rep.simulated);
  gn_attest_report_done(&rep);
  /* The offer view says whose word it is. */
  gn_offer o = offer_of(f, "NVIDIA GeForce RTX 4090", true);
  memcpy(o.attest, v.report, v.report_len);
  o.attest_len = (uint32_t)v.report_len;
  char verdict[GN_ATTEST_VERDICT_STRLEN + 64];
  gn_attest_offer_verdict(&o, verdict, sizeof verdict);
  assert_string_equal(verdict, "simulated (self-reported)");
  /* Someone else's report on this provider's offer is not its word. */
  memcpy(o.provider, f->req.id->pk, GN_PK_LEN);
  gn_attest_offer_verdict(&o, verdict, sizeof verdict);
  assert_string_equal(verdict, "invalid report");
}

static void test_local_slots_are_bounded(void **state) {
  fixture *f = *state;
  gn_attest_gpu g = sim_gpu("RTX 4090");
  assert_int_equal(gn_attest_agent_add_local(f->prov.a, &g, 0, true), 0);
  assert_int_equal(gn_attest_agent_add_local(f->prov.a, &g, 1, true), GN_EEXIST);
  for (int i = 1; i < (int)GN_ATTEST_LOCAL_MAX; i++) {
    char name[32];
    snprintf(name, sizeof name, "model %d", i);
    g = sim_gpu(name);
    assert_int_equal(gn_attest_agent_add_local(f->prov.a, &g, i, true), i);
  }
  g = sim_gpu("one too many");
  assert_int_equal(gn_attest_agent_add_local(f->prov.a, &g, 9, true), GN_ETOOBIG);
  assert_int_equal(gn_attest_agent_local_count(f->prov.a), GN_ATTEST_LOCAL_MAX);
  gn_attest_local_view v;
  assert_int_equal(gn_attest_agent_local(f->prov.a, GN_ATTEST_LOCAL_MAX, &v), GN_ENOTFOUND);
  pump(&f->w);
}

/* A real GPU model on a host without the CUDA kernel says so, and answers
 * challenges with a refusal rather than a proof. */
static void test_real_gpu_without_kernel_is_not_attested(void **state) {
  fixture *f = *state;
  setenv("GN_ATTEST_CUDA_LIB", "/nonexistent/libgpunet_attest_cuda.so", 1);
  gn_attest_gpu g = sim_gpu("NVIDIA GeForce RTX 4090");
  int slot = gn_attest_agent_add_local(f->prov.a, &g, 0, false);
  unsetenv("GN_ATTEST_CUDA_LIB");
  gn_attest_local_view v;
  assert_int_equal(gn_attest_agent_local(f->prov.a, (size_t)slot, &v), 0);
  if (strcmp(v.verdict, "pending") == 0) { /* a CUDA device here after all */
    pump(&f->w);
    skip();
  }
  assert_true(v.done);
  assert_null(v.report);
  assert_string_equal(v.verdict, "not attested: the CUDA attestation kernel is not available here");
}

/* The whole exchange, compute then memory challenge: the requester's verdict
 * and figures, and the provider then carries the requester's signed verdict. */
static void test_exchange_against_honest_simulated_provider(void **state) {
  fixture *f = *state;
  gn_attest_gpu g = sim_gpu("NVIDIA GeForce RTX 4090");
  assert_int_equal(gn_attest_agent_add_local(f->prov.a, &g, 0, true), 0);
  pump(&f->w);
  int changed = f->prov.changed;
  gn_offer o = offer_of(f, "NVIDIA GeForce RTX 4090", true);
  outcome out = {0};
  assert_int_equal(gn_attest_agent_verify(f->req.a, &o, on_verified, &out), 0);
  assert_int_equal(out.calls, 0); /* never from inside the call */
  pump(&f->w);
  assert_int_equal(out.calls, 1);
  assert_int_equal(out.rc, 0);
  assert_int_equal(out.res.outcome, GN_ATTEST_SIMULATED);
  assert_true(out.has_mem);
  assert_int_equal(out.mem.outcome, GN_ATTEST_SIMULATED);
  assert_true(out.mem.elapsed_ms >= 1);
  /* The verdict is held, not published, until the requester leases. */
  assert_int_equal(f->prov.changed, changed);
  assert_int_equal(gn_attest_agent_held(f->prov.a), 1);
  gn_attest_local_view v;
  assert_int_equal(gn_attest_agent_local(f->prov.a, 0, &v), 0);
  assert_string_equal(v.verdict, "simulated (self-check)");
  /* It leases: the slot now carries a report with the requester as
   * verifier, and the agreement (opaque to the agent) in it. */
  const uint8_t agreement[] = "the lease agreement envelope";
  assert_int_equal(gn_attest_agent_lease_agreed(f->prov.a, f->req.id->pk, "NVIDIA GeForce RTX 4090", gn_unix_s(),
                                                agreement, sizeof agreement),
                   1);
  assert_true(f->prov.changed > changed);
  assert_int_equal(gn_attest_agent_held(f->prov.a), 0);
  assert_int_equal(gn_attest_agent_local(f->prov.a, 0, &v), 0);
  assert_non_null(strstr(v.verdict, "(checked by gn"));
  gn_attest_report rep;
  uint8_t signer[GN_PK_LEN];
  assert_int_equal(gn_attest_report_open(v.report, v.report_len, &rep, signer), 0);
  assert_memory_equal(signer, f->prov.id->pk, GN_PK_LEN);
  assert_true(rep.has_verifier);
  assert_memory_equal(rep.verifier, f->req.id->pk, GN_PK_LEN);
  assert_int_equal(rep.lease_env_len, sizeof agreement);
  assert_memory_equal(rep.lease_env, agreement, sizeof agreement);
  assert_true(rep.verdict_issued_s > 0);
  gn_attest_report_done(&rep);
}

/* A provider still to dial: the challenge waits for the session, so the
 * clock does not count the connection. */
static void test_challenge_waits_for_the_session(void **state) {
  fixture *f = *state;
  gn_attest_gpu g = sim_gpu("RTX 4090");
  assert_int_equal(gn_attest_agent_add_local(f->prov.a, &g, 0, true), 0);
  pump(&f->w);
  f->req.up = false;
  gn_offer o = offer_of(f, "RTX 4090", true);
  outcome out = {0};
  assert_int_equal(gn_attest_agent_verify(f->req.a, &o, on_verified, &out), 0);
  assert_int_equal(f->req.connects, 1);
  pump(&f->w);
  assert_int_equal(out.calls, 0); /* nothing sent yet */
  gn_attest_agent_peer_up(f->req.a, f->prov.id->pk);
  pump(&f->w);
  assert_int_equal(out.calls, 1);
  assert_int_equal(out.res.outcome, GN_ATTEST_SIMULATED);
}

/* A node that does not provide, or lacks the model, refuses with a reason
 * the requester reports. */
static void test_refusal_reaches_the_requester(void **state) {
  fixture *f = *state;
  gn_offer o = offer_of(f, "RTX 4090", true);
  outcome out = {0};
  assert_int_equal(gn_attest_agent_verify(f->req.a, &o, on_verified, &out), 0);
  pump(&f->w);
  assert_int_equal(out.calls, 1);
  assert_int_equal(out.rc, GN_EREMOTE);
  assert_string_equal(out.err, "provider refused the attestation challenge: no such GPU model on this provider");
}

static void test_unknown_model_is_refused_at_once(void **state) {
  fixture *f = *state;
  gn_offer o = offer_of(f, "Nonexistent Accelerator 9000", false);
  outcome out = {0};
  assert_int_equal(gn_attest_agent_verify(f->req.a, &o, on_verified, &out), GN_ENOTFOUND);
  pump(&f->w);
  assert_int_equal(out.calls, 0);
}

/* Nothing comes back: the verification ends at its deadline, not before. */
static void test_silent_provider_times_out(void **state) {
  fixture *f = *state;
  f->w.drop_all = true;
  gn_offer o = offer_of(f, "RTX 4090", true);
  outcome out = {0};
  uint64_t t0 = gn_mono_ms();
  assert_int_equal(gn_attest_agent_verify(f->req.a, &o, on_verified, &out), 0);
  pump(&f->w);
  gn_attest_agent_tick(f->req.a, t0 + gn_attest_timeout_ms() / 2);
  assert_int_equal(out.calls, 0);
  gn_attest_agent_tick(f->req.a, t0 + gn_attest_timeout_ms() + 1000);
  assert_int_equal(out.calls, 1);
  assert_int_equal(out.rc, GN_ETIMEDOUT);
  gn_attest_agent_tick(f->req.a, t0 + 2 * gn_attest_timeout_ms() + 1000);
  assert_int_equal(out.calls, 1);
}

/* Shutdown ends a verification in progress once, with a reason, even while
 * the provider's proof is still on a worker (the agent frees itself when the
 * worker hands it back: teardown's pump). */
static void test_shutdown_ends_verifications(void **state) {
  fixture *f = *state;
  gn_attest_gpu g = sim_gpu("RTX 4090");
  assert_int_equal(gn_attest_agent_add_local(f->prov.a, &g, 0, true), 0);
  pump(&f->w);
  gn_offer o = offer_of(f, "RTX 4090", true);
  outcome out = {0};
  assert_int_equal(gn_attest_agent_verify(f->req.a, &o, on_verified, &out), 0);
  /* Deliver the challenge only: the provider's proof is now queued. */
  msg m = f->w.msgs[0];
  f->w.nmsgs = 0;
  gn_envelope env;
  assert_int_equal(gn_envelope_open(m.env.data, m.env.len, &env), 0);
  gn_attest_agent_on_message(f->prov.a, m.from, &env, m.env.data, m.env.len);
  gn_buf_done(&m.env);
  assert_int_equal(f->w.ntasks, 1);
  gn_attest_agent_shutdown(f->req.a);
  f->req.a = NULL;
  assert_int_equal(out.calls, 1);
  assert_int_equal(out.rc, GN_ECLOSED);
  gn_attest_agent_shutdown(f->prov.a);
  f->prov.a = NULL;
  pump(&f->w);
  assert_int_equal(out.calls, 1);
}

/* --- played challengers ---------------------------------------------------------*/

/* The provider's offer id for model (the one a challenger must name). */
static void own_offer_id(const fixture *f, const char *model, char ret[GN_OFFER_ID_STRLEN]) {
  gn_offer o = offer_of(f, model, true);
  gn_offer_id(&o, ret);
}

/* Hands the provider's agent a message of type from a played peer `who`:
 * the wrapper {sid, gpu_model (when not NULL), offer (when not NULL), data},
 * sealed by who, as if it came over the wire. */
static void play_wrapped(fixture *f, const gn_identity *who, uint32_t type, const char *sid, const char *model,
                         const char *offer, const gn_buf *data) {
  gn_buf body = {0}, env = {0};
  gn_wire_writer w;
  gn_envelope e;
  gn_wire_writer_init(&w);
  gn_wire_put_map(&w, 2 + (model ? 1 : 0) + (offer ? 1 : 0));
  gn_wire_put_str(&w, "sid");
  gn_wire_put_str(&w, sid);
  if (model) {
    gn_wire_put_str(&w, "gpu_model");
    gn_wire_put_str(&w, model);
  }
  if (offer) {
    gn_wire_put_str(&w, "offer");
    gn_wire_put_str(&w, offer);
  }
  gn_wire_put_str(&w, "data");
  gn_wire_put_bin(&w, data->data, data->len);
  assert_int_equal(gn_wire_writer_take(&w, &body), 0);
  gn_wire_writer_done(&w);
  assert_int_equal(gn_envelope_seal(who, type, body.data, body.len, &env), 0);
  assert_int_equal(gn_envelope_open(env.data, env.len, &e), 0);
  gn_attest_agent_on_message(f->prov.a, who->pk, &e, env.data, env.len);
  gn_buf_done(&body);
  gn_buf_done(&env);
}

static const gn_attest_params played_params = {.n = 256, .depth = 1, .rounds = 2, .open_rounds = 2, .open_rows = 4};

/* A challenge from a played peer `who`: a small simulated-class challenge
 * body, naming offer when not NULL. */
static void play_challenge(fixture *f, const gn_identity *who, const char *sid, const char *model, const char *offer) {
  gn_buf ch = {0};
  gn_attest_verifier *v;
  assert_int_equal(gn_attest_verifier_new(&played_params, "RTX 4090", NULL, NULL, &ch, &v), 0);
  play_wrapped(f, who, GN_MSG_ATTEST_CHALLENGE, sid, model, offer, &ch);
  gn_attest_verifier_free(v);
  gn_buf_done(&ch);
}

/* The data of the last message sent to a played peer, which must be of type. */
static void last_stray_data(const fixture *f, uint32_t type, gn_buf *ret) {
  gn_envelope e;
  gn_wire_doc doc;
  const uint8_t *d;
  size_t dl;
  assert_true(f->w.nstray > 0);
  const gn_buf *m = &f->w.stray[f->w.nstray - 1];
  assert_int_equal(gn_envelope_open(m->data, m->len, &e), 0);
  assert_int_equal(e.type, type);
  assert_int_equal(gn_wire_decode(e.body, e.body_len, &doc), 0);
  assert_int_equal(gn_wire_get_bin_ref(doc.root, "data", GN_MSG_MAX, &d, &dl), 0);
  assert_int_equal(gn_buf_append(ret, d, dl), 0);
  gn_wire_doc_done(&doc);
}

/* A played peer proves the provider's GPU (compute only) and vouches for
 * it with its signed verdict, which the provider then holds. */
static void play_vouch(fixture *f, const gn_identity *who, const char *model) {
  gn_buf ch = {0}, resp = {0}, open = {0}, proof = {0}, verdict = {0};
  gn_attest_verifier *v;
  gn_attest_result res;
  gn_envelope e;
  char mine[GN_OFFER_ID_STRLEN];
  own_offer_id(f, model, mine);
  assert_int_equal(gn_attest_verifier_new(&played_params, "RTX 4090", NULL, NULL, &ch, &v), 0);
  play_wrapped(f, who, GN_MSG_ATTEST_CHALLENGE, "a-vouch", model, mine, &ch);
  pump(&f->w);
  last_stray_data(f, GN_MSG_ATTEST_RESPONSE, &resp);
  assert_int_equal(gn_attest_verifier_on_response(v, resp.data, resp.len, &open), 0);
  play_wrapped(f, who, GN_MSG_ATTEST_OPEN, "a-vouch", NULL, NULL, &open);
  pump(&f->w);
  last_stray_data(f, GN_MSG_ATTEST_PROOF, &proof);
  assert_int_equal(gn_attest_verifier_on_proof(v, proof.data, proof.len, 5, &res), 0);
  assert_int_equal(gn_attest_verdict_seal(who, f->prov.id->pk, &played_params, &res, gn_unix_s(), &verdict), 0);
  assert_int_equal(gn_envelope_open(verdict.data, verdict.len, &e), 0);
  gn_attest_agent_on_message(f->prov.a, who->pk, &e, verdict.data, verdict.len);
  gn_attest_verifier_free(v);
  gn_buf *bufs[] = {&ch, &resp, &open, &proof, &verdict};
  for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
    gn_buf_done(bufs[i]);
}

/* The type of the i-th message sent to a played peer, and its reason (an
 * ERROR's) to reason (256 bytes) when not NULL. */
static uint32_t stray_type(const fixture *f, size_t i, char *reason) {
  gn_envelope e;
  gn_wire_doc doc;
  assert_true(i < f->w.nstray);
  assert_int_equal(gn_envelope_open(f->w.stray[i].data, f->w.stray[i].len, &e), 0);
  if (reason) {
    reason[0] = 0;
    assert_int_equal(gn_wire_decode(e.body, e.body_len, &doc), 0);
    gn_wire_get_str(doc.root, "reason", reason, 256);
    gn_wire_doc_done(&doc);
  }
  return e.type;
}

static size_t strays_of_type(const fixture *f, uint32_t type) {
  size_t n = 0;
  for (size_t i = 0; i < f->w.nstray; i++)
    n += stray_type(f, i, NULL) == type;
  return n;
}

/* Only a peer naming this provider's offer for the model may make it work:
 * none, a made-up one and another provider's are refused before any proof
 * is queued; the right one is proven. */
static void test_challenge_naming_no_offer_of_ours_is_refused(void **state) {
  fixture *f = *state;
  gn_attest_gpu g = sim_gpu("RTX 4090");
  assert_int_equal(gn_attest_agent_add_local(f->prov.a, &g, 0, true), 0);
  pump(&f->w);
  gn_identity *x;
  assert_int_equal(gn_identity_generate(&x), 0);
  char mine[GN_OFFER_ID_STRLEN], theirs[GN_OFFER_ID_STRLEN], reason[256];
  own_offer_id(f, "RTX 4090", mine);
  gn_offer o = offer_of(f, "RTX 4090", true);
  memcpy(o.provider, f->req.id->pk, GN_PK_LEN);
  gn_offer_id(&o, theirs);
  const char *names[] = {NULL, "o-000000000000", theirs};
  for (size_t i = 0; i < 3; i++) {
    play_challenge(f, x, "a-1", "RTX 4090", names[i]);
    assert_int_equal(f->w.ntasks, 0);
    assert_int_equal(f->w.nstray, i + 1);
    assert_int_equal(stray_type(f, i, reason), GN_MSG_ERROR);
    assert_non_null(strstr(reason, "attestation is for peers about to lease"));
  }
  play_challenge(f, x, "a-1", "RTX 4090", mine);
  assert_int_equal(f->w.ntasks, 1);
  pump(&f->w);
  assert_int_equal(strays_of_type(f, GN_MSG_ATTEST_RESPONSE), 1);
  gn_identity_free(x);
}

/* With every GPU of the model leased there is nothing to lease: refused. */
static void test_challenge_refused_while_nothing_is_free_to_lease(void **state) {
  fixture *f = *state;
  gn_attest_gpu g = sim_gpu("RTX 4090");
  assert_int_equal(gn_attest_agent_add_local(f->prov.a, &g, 0, true), 0);
  pump(&f->w);
  f->w.nothing_leasable = true;
  gn_offer o = offer_of(f, "RTX 4090", true);
  outcome out = {0};
  assert_int_equal(gn_attest_agent_verify(f->req.a, &o, on_verified, &out), 0);
  pump(&f->w);
  assert_int_equal(out.calls, 1);
  assert_int_equal(out.rc, GN_EREMOTE);
  assert_non_null(strstr(out.err, "no RTX 4090 is free to lease here"));
}

/* A peer's second challenge while its first is still being proven is
 * refused; the first goes on. */
static void test_one_exchange_in_flight_per_peer(void **state) {
  fixture *f = *state;
  gn_attest_gpu g = sim_gpu("RTX 4090");
  assert_int_equal(gn_attest_agent_add_local(f->prov.a, &g, 0, true), 0);
  pump(&f->w);
  gn_identity *x;
  assert_int_equal(gn_identity_generate(&x), 0);
  char mine[GN_OFFER_ID_STRLEN], reason[256];
  own_offer_id(f, "RTX 4090", mine);
  play_challenge(f, x, "a-1", "RTX 4090", mine);
  assert_int_equal(f->w.ntasks, 1);
  play_challenge(f, x, "a-2", "RTX 4090", mine);
  assert_int_equal(f->w.ntasks, 1);
  assert_int_equal(stray_type(f, 0, reason), GN_MSG_ERROR);
  assert_non_null(strstr(reason, "one attestation at a time per peer"));
  pump(&f->w);
  assert_int_equal(strays_of_type(f, GN_MSG_ATTEST_RESPONSE), 1);
  gn_identity_free(x);
}

/* GN_ATTEST_PEER_HOURLY challenges an hour from one peer are proven; the
 * next is refused without a proof, while another peer is still served, and
 * an hour later the first may challenge again. */
static void test_challenges_per_peer_per_hour_are_limited(void **state) {
  fixture *f = *state;
  gn_attest_gpu g = sim_gpu("RTX 4090");
  assert_int_equal(gn_attest_agent_add_local(f->prov.a, &g, 0, true), 0);
  pump(&f->w);
  gn_identity *x, *y;
  assert_int_equal(gn_identity_generate(&x), 0);
  assert_int_equal(gn_identity_generate(&y), 0);
  char mine[GN_OFFER_ID_STRLEN], sid[32], reason[256];
  own_offer_id(f, "RTX 4090", mine);
  for (int i = 0; i < GN_ATTEST_PEER_HOURLY; i++) {
    snprintf(sid, sizeof sid, "a-%d", i);
    play_challenge(f, x, sid, "RTX 4090", mine);
    assert_int_equal(f->w.ntasks, 1);
    pump(&f->w);
    f->w.clock_ms += 60000;
  }
  assert_int_equal(strays_of_type(f, GN_MSG_ATTEST_RESPONSE), GN_ATTEST_PEER_HOURLY);
  play_challenge(f, x, "a-over", "RTX 4090", mine);
  assert_int_equal(f->w.ntasks, 0);
  assert_int_equal(stray_type(f, f->w.nstray - 1, reason), GN_MSG_ERROR);
  assert_non_null(strstr(reason, "attestation challenges an hour from one peer"));
  play_challenge(f, y, "a-y", "RTX 4090", mine);
  assert_int_equal(f->w.ntasks, 1);
  pump(&f->w);
  /* An hour after its first challenge, x has one again. */
  f->w.clock_ms += 3600000 - GN_ATTEST_PEER_HOURLY * 60000 + 1;
  play_challenge(f, x, "a-again", "RTX 4090", mine);
  assert_int_equal(f->w.ntasks, 1);
  pump(&f->w);
  assert_int_equal(strays_of_type(f, GN_MSG_ATTEST_RESPONSE), GN_ATTEST_PEER_HOURLY + 2);
  gn_identity_free(x);
  gn_identity_free(y);
}

/* GN_ATTEST_SESSIONS_MAX exchanges waiting on their challengers are all a
 * provider keeps: the next peer is told it is busy, until they expire. */
static void test_exchanges_in_flight_are_bounded_in_total(void **state) {
  fixture *f = *state;
  gn_attest_gpu g = sim_gpu("RTX 4090");
  assert_int_equal(gn_attest_agent_add_local(f->prov.a, &g, 0, true), 0);
  pump(&f->w);
  gn_identity *ids[GN_ATTEST_SESSIONS_MAX + 1];
  char mine[GN_OFFER_ID_STRLEN], reason[256];
  own_offer_id(f, "RTX 4090", mine);
  for (int i = 0; i <= GN_ATTEST_SESSIONS_MAX; i++)
    assert_int_equal(gn_identity_generate(&ids[i]), 0);
  for (int i = 0; i < GN_ATTEST_SESSIONS_MAX; i++) {
    play_challenge(f, ids[i], "a-1", "RTX 4090", mine);
    assert_int_equal(f->w.ntasks, 1);
    pump(&f->w); /* proven; the session waits for the opening */
  }
  play_challenge(f, ids[GN_ATTEST_SESSIONS_MAX], "a-1", "RTX 4090", mine);
  assert_int_equal(f->w.ntasks, 0);
  assert_int_equal(stray_type(f, f->w.nstray - 1, reason), GN_MSG_ERROR);
  assert_non_null(strstr(reason, "busy"));
  gn_attest_agent_tick(f->prov.a, gn_mono_ms() + gn_attest_timeout_ms() + 1000);
  play_challenge(f, ids[GN_ATTEST_SESSIONS_MAX], "a-2", "RTX 4090", mine);
  assert_int_equal(f->w.ntasks, 1);
  pump(&f->w);
  for (int i = 0; i <= GN_ATTEST_SESSIONS_MAX; i++)
    gn_identity_free(ids[i]);
}

/* A verdict is published only after its own verifier leases the model it
 * checked, within the window: another peer's lease, a lease of another
 * model, one agreed before the verdict or too long after it publish
 * nothing, and the held verdict is dropped when the window has passed. */
static void test_verdict_without_its_verifiers_lease_is_not_published(void **state) {
  fixture *f = *state;
  gn_attest_gpu g = sim_gpu("RTX 4090");
  assert_int_equal(gn_attest_agent_add_local(f->prov.a, &g, 0, true), 0);
  pump(&f->w);
  int changed = f->prov.changed;
  gn_offer o = offer_of(f, "RTX 4090", true);
  outcome out = {0};
  assert_int_equal(gn_attest_agent_verify(f->req.a, &o, on_verified, &out), 0);
  pump(&f->w);
  assert_int_equal(out.res.outcome, GN_ATTEST_SIMULATED);
  assert_int_equal(gn_attest_agent_held(f->prov.a), 1);
  int64_t now = gn_unix_s();
  gn_identity *x;
  assert_int_equal(gn_identity_generate(&x), 0);
  assert_int_equal(gn_attest_agent_lease_agreed(f->prov.a, x->pk, "RTX 4090", now, NULL, 0), 0);
  assert_int_equal(gn_attest_agent_lease_agreed(f->prov.a, f->req.id->pk, "RTX 3090", now, NULL, 0), 0);
  assert_int_equal(gn_attest_agent_lease_agreed(f->prov.a, f->req.id->pk, "RTX 4090", now - 5, NULL, 0), 0);
  assert_int_equal(
      gn_attest_agent_lease_agreed(f->prov.a, f->req.id->pk, "RTX 4090", now + GN_ATTEST_LEASE_WINDOW_S + 5, NULL, 0),
      0);
  assert_int_equal(f->prov.changed, changed);
  gn_attest_local_view v;
  assert_int_equal(gn_attest_agent_local(f->prov.a, 0, &v), 0);
  assert_string_equal(v.verdict, "simulated (self-check)");
  gn_attest_report rep;
  uint8_t signer[GN_PK_LEN];
  assert_int_equal(gn_attest_report_open(v.report, v.report_len, &rep, signer), 0);
  assert_false(rep.has_verifier);
  gn_attest_report_done(&rep);
  /* The window passes: nothing is held any more, a lease now is too late. */
  assert_int_equal(gn_attest_agent_held(f->prov.a), 1);
  f->w.clock_ms += GN_ATTEST_LEASE_WINDOW_S * 1000ull + 1;
  gn_attest_agent_tick(f->prov.a, gn_mono_ms());
  assert_int_equal(gn_attest_agent_held(f->prov.a), 0);
  assert_int_equal(gn_attest_agent_lease_agreed(f->prov.a, f->req.id->pk, "RTX 4090", now, NULL, 0), 0);
  assert_int_equal(f->prov.changed, changed);
  gn_identity_free(x);
}

/* Held verdicts are bounded: GN_ATTEST_HELD_MAX peers' at most, the oldest
 * dropped for a newer one (its lease then publishes nothing), one per peer. */
static void test_held_verdicts_are_bounded(void **state) {
  fixture *f = *state;
  gn_attest_gpu g = sim_gpu("RTX 4090");
  assert_int_equal(gn_attest_agent_add_local(f->prov.a, &g, 0, true), 0);
  pump(&f->w);
  gn_identity *ids[GN_ATTEST_HELD_MAX + 1];
  for (int i = 0; i <= GN_ATTEST_HELD_MAX; i++) {
    assert_int_equal(gn_identity_generate(&ids[i]), 0);
    play_vouch(f, ids[i], "RTX 4090");
    f->w.clock_ms += 10;
    assert_int_equal(gn_attest_agent_held(f->prov.a), i < GN_ATTEST_HELD_MAX ? (size_t)i + 1 : GN_ATTEST_HELD_MAX);
  }
  /* A peer's second verdict replaces its first. */
  play_vouch(f, ids[GN_ATTEST_HELD_MAX], "RTX 4090");
  assert_int_equal(gn_attest_agent_held(f->prov.a), GN_ATTEST_HELD_MAX);
  int64_t now = gn_unix_s();
  assert_int_equal(gn_attest_agent_lease_agreed(f->prov.a, ids[0]->pk, "RTX 4090", now, NULL, 0), 0);
  assert_int_equal(gn_attest_agent_lease_agreed(f->prov.a, ids[1]->pk, "RTX 4090", now, NULL, 0), 1);
  assert_int_equal(gn_attest_agent_held(f->prov.a), GN_ATTEST_HELD_MAX - 1);
  for (int i = 0; i <= GN_ATTEST_HELD_MAX; i++)
    gn_identity_free(ids[i]);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_self_check_seals_a_report, setup, teardown),
      cmocka_unit_test_setup_teardown(test_local_slots_are_bounded, setup, teardown),
      cmocka_unit_test_setup_teardown(test_real_gpu_without_kernel_is_not_attested, setup, teardown),
      cmocka_unit_test_setup_teardown(test_exchange_against_honest_simulated_provider, setup, teardown),
      cmocka_unit_test_setup_teardown(test_challenge_waits_for_the_session, setup, teardown),
      cmocka_unit_test_setup_teardown(test_refusal_reaches_the_requester, setup, teardown),
      cmocka_unit_test_setup_teardown(test_unknown_model_is_refused_at_once, setup, teardown),
      cmocka_unit_test_setup_teardown(test_silent_provider_times_out, setup, teardown),
      cmocka_unit_test_setup_teardown(test_shutdown_ends_verifications, setup, teardown),
      cmocka_unit_test_setup_teardown(test_challenge_naming_no_offer_of_ours_is_refused, setup, teardown),
      cmocka_unit_test_setup_teardown(test_challenge_refused_while_nothing_is_free_to_lease, setup, teardown),
      cmocka_unit_test_setup_teardown(test_one_exchange_in_flight_per_peer, setup, teardown),
      cmocka_unit_test_setup_teardown(test_challenges_per_peer_per_hour_are_limited, setup, teardown),
      cmocka_unit_test_setup_teardown(test_exchanges_in_flight_are_bounded_in_total, setup, teardown),
      cmocka_unit_test_setup_teardown(test_verdict_without_its_verifiers_lease_is_not_published, setup, teardown),
      cmocka_unit_test_setup_teardown(test_held_verdicts_are_bounded, setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
