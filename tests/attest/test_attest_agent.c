/* The attestation agent through its io alone, no daemon: a provider's and a
 * requester's agent joined by an in-process link (every message sealed,
 * opened and verified as on the wire) and a worker queue that the test pumps.
 * The GPU is simulated (the CPU reference), as it says. */
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
  assert_non_null(to);
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

static const gn_attest_io test_io = {
    .send = io_send, .is_up = io_is_up, .connect = io_connect, .queue = io_queue, .log = io_log, .changed = io_changed};

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
  *state = f;
  return 0;
}

static int teardown(void **state) {
  fixture *f = *state;
  gn_attest_agent_shutdown(f->prov.a);
  gn_attest_agent_shutdown(f->req.a);
  f->prov.a = f->req.a = NULL;
  pump(&f->w); /* tasks still queued return to agents that then free themselves */
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
  /* The provider's slot now carries a report with the requester as verifier. */
  assert_true(f->prov.changed > changed);
  gn_attest_local_view v;
  assert_int_equal(gn_attest_agent_local(f->prov.a, 0, &v), 0);
  assert_non_null(strstr(v.verdict, "(checked by gn"));
  gn_attest_report rep;
  uint8_t signer[GN_PK_LEN];
  assert_int_equal(gn_attest_report_open(v.report, v.report_len, &rep, signer), 0);
  assert_memory_equal(signer, f->prov.id->pk, GN_PK_LEN);
  assert_true(rep.has_verifier);
  assert_memory_equal(rep.verifier, f->req.id->pk, GN_PK_LEN);
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
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
