/* Integration test of attestation against dishonest providers: a real
 * requester gpunetd, and this test as a provider that publishes an offer and
 * then answers the requester's challenges with garbage, with stale answers,
 * or not at all, while the requester's control API is driven with libcurl. */
#include <gpunet/attest.h>
#include <gpunet/billing.h>
#include <gpunet/identity.h>
#include <gpunet/offer.h>
#include <gpunet/transport.h>
#include <gpunet/wire.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <curl/curl.h>
#include <jansson.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "node/helpers.h"

#define TIMEOUT_MS 3000 /* the requester's GN_ATTEST_TIMEOUT_MS */

typedef tn_msg msg;

typedef tn_call call;

typedef struct world {
  char dir[PATH_MAX];
  char sock[PATH_MAX + 16];
  char addr[64];
  pid_t daemon;
  uv_loop_t loop;
  gn_identity *req_id, *prov_id;
  gn_transport *tp;
  int up;
  char offer_id[GN_OFFER_ID_STRLEN];
  tn_inbox in;
  tn_link link;
} world;

static world W;

/* Runs the loop until a message of `type` arrives (returned, removed from
 * the inbox; the caller frees raw), the call c is done (when c is not NULL),
 * or timeout_ms passes. Returns 1 when the message came. */
static int wait_msg(uint32_t type, const call *c, uint64_t timeout_ms, msg *ret) {
  return tn_wait_msg(&W.loop, &W.in, type, tn_call_done, (void *)c, timeout_ms, ret);
}

static bool inbox_has(uint32_t type) {
  return tn_inbox_has(&W.in, type);
}

/* --- the control API --------------------------------------------------------*/

/* Keeps the fake provider's loop running until the call returns. */
static void call_finish(call *c, uint64_t timeout_ms) {
  tn_call_finish(&W.loop, c, timeout_ms);
}

static void rent_start(call *c, bool attest) {
  char body[200];
  snprintf(body, sizeof body,
           "{\"offer\": \"%s\", \"hours\": 1, \"count\": 1, \"attest\": %s, \"allow_simulated\": true}", W.offer_id,
           attest ? "true" : "false");
  tn_call_start(c, W.sock, "/v1/leases", body);
}

/* --- the fake provider ------------------------------------------------------*/

/* A wrapped attestation message {sid, gpu_model?, data}: its sid and data. */
typedef struct wrapped {
  char sid[32];
  gn_buf data;
} wrapped;

static void unwrap(const msg *m, wrapped *ret) {
  gn_envelope env;
  gn_wire_doc doc;
  const uint8_t *d;
  size_t dl;
  memset(ret, 0, sizeof *ret);
  assert_int_equal(gn_envelope_open(m->raw.data, m->raw.len, &env), 0);
  assert_int_equal(gn_wire_decode(env.body, env.body_len, &doc), 0);
  assert_int_equal(gn_wire_get_str(doc.root, "sid", ret->sid, sizeof ret->sid), 0);
  assert_int_equal(gn_wire_get_bin_ref(doc.root, "data", GN_MSG_MAX, &d, &dl), 0);
  gn_buf_append(&ret->data, d, dl);
  gn_wire_doc_done(&doc);
}

static void send_wrapped(uint32_t type, const char *sid, const uint8_t *data, size_t len) {
  gn_wire_writer w;
  gn_buf body = {0}, env = {0};
  gn_wire_writer_init(&w);
  gn_wire_put_map(&w, 2);
  gn_wire_put_str(&w, "sid");
  gn_wire_put_str(&w, sid);
  gn_wire_put_str(&w, "data");
  gn_wire_put_bin(&w, data, len);
  assert_int_equal(gn_wire_writer_take(&w, &body), 0);
  gn_wire_writer_done(&w);
  assert_int_equal(gn_envelope_seal(W.prov_id, type, body.data, body.len, &env), 0);
  assert_int_equal(gn_transport_send(W.tp, W.req_id->pk, env.data, env.len), 0);
  gn_buf_done(&body);
  gn_buf_done(&env);
}

/* Waits for the requester's challenge of `type` and unwraps it. */
static void expect_challenge(uint32_t type, call *c, wrapped *ret) {
  msg m;
  if (!wait_msg(type, c, 10000, &m))
    fail_msg("no message %u from the requester (call %s)", type, c->done ? (const char *)c->out.data : "running");
  unwrap(&m, ret);
  gn_buf_done(&m.raw);
}

static void publish_offer(bool simulated) {
  gn_offer o;
  gn_buf env = {0};
  tn_offer(&o, W.prov_id->pk, gn_transport_listen_addr(W.tp), 1, 60, simulated);
  gn_offer_id(&o, W.offer_id);
  assert_int_equal(gn_offer_seal(W.prov_id, &o, &env), 0);
  assert_int_equal(gn_transport_send(W.tp, W.req_id->pk, env.data, env.len), 0);
  gn_buf_done(&env);
  /* Discovery takes it in at once; one more turn of the loop sends it. */
  msg none;
  wait_msg(UINT32_MAX, NULL, 300, &none);
}

/* --- setup ------------------------------------------------------------------*/

static void start_daemon(void) {
  char t[48];
  tn_identity_for(W.dir, &W.req_id);
  snprintf(W.addr, sizeof W.addr, "127.0.0.1:%d", tn_free_port());
  snprintf(W.sock, sizeof W.sock, "%s/gpunetd.sock", W.dir);
  snprintf(t, sizeof t, "GN_ATTEST_TIMEOUT_MS=%d", TIMEOUT_MS);
  const char *const env[] = {t, NULL};
  W.daemon = tn_daemon_spawnv(W.dir, "w", env, (const char *const[]){"--data-dir", W.dir, "--listen", W.addr, NULL});
}

static int setup_with(bool simulated) {
  memset(&W, 0, sizeof W);
  snprintf(W.dir, sizeof W.dir, "/tmp/gn-attest-net-XXXXXX");
  assert_non_null(mkdtemp(W.dir));
  start_daemon();
  uv_loop_init(&W.loop);
  /* Only the requester's session counts. */
  W.link = (tn_link){&W.up, &W.in, W.req_id->pk};
  tn_peer_new(&W.loop, &W.link, &W.prov_id, &W.tp);
  assert_int_equal(gn_transport_listen(W.tp, "127.0.0.1:0"), 0);
  tn_dial(&W.loop, W.tp, W.addr, &W.up, NULL);
  /* ...and its control socket. */
  for (int i = 0; i < 50 && access(W.sock, F_OK) != 0; i++)
    usleep(100000);
  publish_offer(simulated);
  return 0;
}

static int setup(void **state) {
  (void)state;
  return setup_with(false);
}

static int setup_simulated(void **state) {
  (void)state;
  return setup_with(true);
}

static int teardown(void **state) {
  (void)state;
  int rc = tn_world_end(&W.loop, &W.tp, 1, W.daemon, &W.in, W.dir);
  W.req_id = gn_identity_free(W.req_id);
  W.prov_id = gn_identity_free(W.prov_id);
  return rc;
}

/* --- tests ------------------------------------------------------------------*/

static void test_rent_refuses_provider_answering_garbage(void **state) {
  (void)state;
  call c;
  wrapped ch;
  uint8_t junk[200];
  rent_start(&c, true);
  expect_challenge(GN_MSG_ATTEST_CHALLENGE, &c, &ch);
  randombytes_buf(junk, sizeof junk);
  send_wrapped(GN_MSG_ATTEST_RESPONSE, ch.sid, junk, sizeof junk);
  call_finish(&c, 10000);
  tn_call_expect(&c, 409, "failed attestation");
  assert_false(inbox_has(GN_MSG_LEASE_REQUEST));
  gn_buf_done(&ch.data);
  gn_buf_done(&c.out);
}

static void test_rent_refuses_response_to_another_nonce(void **state) {
  (void)state;
  call c;
  wrapped ch;
  /* A well-formed response, honestly computed, for a challenge of our own
   * of the very shape a simulated offer gets (attest_net.c's sim_params): a
   * stale root the requester never asked for. */
  const gn_attest_params p = {.n = 256, .depth = 1, .rounds = 2, .open_rounds = 2, .open_rows = 4};
  gn_buf mine = {0}, resp = {0};
  gn_attest_verifier *v;
  gn_attest_prover *pr;
  assert_int_equal(gn_attest_verifier_new(&p, "RTX 4090", NULL, NULL, &mine, &v), 0);
  assert_int_equal(gn_attest_prover_new(gn_attest_backend_cpu(), &pr), 0);
  assert_int_equal(gn_attest_prover_on_challenge(pr, mine.data, mine.len, &resp), 0);

  rent_start(&c, true);
  expect_challenge(GN_MSG_ATTEST_CHALLENGE, &c, &ch);
  send_wrapped(GN_MSG_ATTEST_RESPONSE, ch.sid, resp.data, resp.len);
  call_finish(&c, 10000);
  tn_call_expect(&c, 409, "failed attestation");
  tn_call_expect(&c, 409, "replayed");
  assert_false(inbox_has(GN_MSG_LEASE_REQUEST));
  gn_attest_prover_free(pr);
  gn_attest_verifier_free(v);
  gn_buf_done(&mine);
  gn_buf_done(&resp);
  gn_buf_done(&ch.data);
  gn_buf_done(&c.out);
}

/* Silence, and also the honest CPU prover's fate against a real-GPU class:
 * the challenge is sized for an RTX 4090, far beyond a CPU in the time
 * given, so answering honestly would be the same silence. */
static void test_rent_gives_up_on_silent_provider(void **state) {
  (void)state;
  call c;
  wrapped ch;
  rent_start(&c, true);
  uint64_t t0 = gn_mono_ms();
  expect_challenge(GN_MSG_ATTEST_CHALLENGE, &c, &ch);
  gn_wire_doc doc;
  uint64_t n = 0, rounds = 0;
  assert_int_equal(gn_wire_decode(ch.data.data, ch.data.len, &doc), 0);
  assert_int_equal(gn_wire_get_u64(doc.root, "n", &n), 0);
  assert_int_equal(gn_wire_get_u64(doc.root, "rounds", &rounds), 0);
  gn_wire_doc_done(&doc);
  gn_attest_params sized;
  assert_int_equal(gn_attest_params_for_class(gn_attest_class_find("RTX 4090"), 1000, &sized), 0);
  assert_int_equal(n, sized.n);
  assert_int_equal(rounds, sized.rounds);
  call_finish(&c, 20000);
  uint64_t took = gn_mono_ms() - t0;
  tn_call_expect(&c, 502, "did not finish the attestation challenge in time");
  assert_true(took >= TIMEOUT_MS - 500 && took < TIMEOUT_MS + 5000);
  assert_false(inbox_has(GN_MSG_LEASE_REQUEST));
  gn_buf_done(&ch.data);
  gn_buf_done(&c.out);
}

static void test_rent_without_attestation_asks_for_the_lease_at_once(void **state) {
  (void)state;
  call c;
  msg m;
  gn_lease_terms t;
  rent_start(&c, false);
  assert_true(wait_msg(GN_MSG_LEASE_REQUEST, &c, 10000, &m));
  assert_false(inbox_has(GN_MSG_ATTEST_CHALLENGE));
  assert_int_equal(gn_lease_request_open(m.raw.data, m.raw.len, &t), 0);
  tn_send_lease_end(W.tp, W.prov_id, GN_MSG_LEASE_REJECT, t.lease_id, "test provider says no", W.req_id->pk);
  call_finish(&c, 10000);
  tn_call_expect(&c, 409, "test provider says no");
  gn_buf_done(&m.raw);
  gn_buf_done(&c.out);
}

/* A simulated offer: the compute challenge is small and answered honestly
 * by the CPU prover, then the memory table is filled for another nonce. */
static void test_rent_refuses_stale_memory_table(void **state) {
  (void)state;
  call c;
  wrapped ch, op, mc;
  gn_attest_prover *pr;
  gn_buf out = {0};
  rent_start(&c, true);
  expect_challenge(GN_MSG_ATTEST_CHALLENGE, &c, &ch);
  assert_int_equal(gn_attest_prover_new(gn_attest_backend_cpu(), &pr), 0);
  assert_int_equal(gn_attest_prover_on_challenge(pr, ch.data.data, ch.data.len, &out), 0);
  send_wrapped(GN_MSG_ATTEST_RESPONSE, ch.sid, out.data, out.len);
  gn_buf_done(&out);
  expect_challenge(GN_MSG_ATTEST_OPEN, &c, &op);
  assert_int_equal(gn_attest_prover_on_open(pr, op.data.data, op.data.len, &out), 0);
  send_wrapped(GN_MSG_ATTEST_PROOF, ch.sid, out.data, out.len);
  gn_buf_done(&out);
  expect_challenge(GN_MSG_ATTEST_MEM_CHALLENGE, &c, &mc);

  const gn_attest_mem_params mp = {.table_mib = 1, .cost = 1, .walkers = 8, .steps = 4, .samples = 1};
  gn_attest_mem_verifier *mv;
  gn_attest_mem_prover *mpr;
  gn_buf mine = {0};
  assert_int_equal(gn_attest_mem_verifier_new(&mp, "RTX 4090", NULL, NULL, &mine, &mv), 0);
  assert_int_equal(gn_attest_mem_prover_new(4, &mpr), 0);
  assert_int_equal(gn_attest_mem_prover_on_challenge(mpr, mine.data, mine.len, &out), 0);
  send_wrapped(GN_MSG_ATTEST_MEM_READY, ch.sid, out.data, out.len);
  call_finish(&c, 10000);
  tn_call_expect(&c, 409, "failed attestation");
  assert_false(inbox_has(GN_MSG_ATTEST_MEM_WALK));
  assert_false(inbox_has(GN_MSG_LEASE_REQUEST));
  /* No signed verdict for a provider that failed half of the exchange. */
  assert_false(inbox_has(GN_MSG_ATTEST_VERDICT));
  gn_attest_mem_prover_free(mpr);
  gn_attest_mem_verifier_free(mv);
  gn_attest_prover_free(pr);
  gn_buf_done(&mine);
  gn_buf_done(&out);
  gn_buf_done(&ch.data);
  gn_buf_done(&op.data);
  gn_buf_done(&mc.data);
  gn_buf_done(&c.out);
}

/* The same, honest to the end: /v1/attest shows both challenges' figures. */
static void test_attest_reports_memory_figures_of_honest_simulated_provider(void **state) {
  (void)state;
  call c;
  wrapped ch, op, mc, wk;
  gn_attest_prover *pr;
  gn_attest_mem_prover *mpr;
  gn_buf out = {0};
  char body[96];
  snprintf(body, sizeof body, "{\"target\": \"%s\"}", W.offer_id);
  tn_call_start(&c, W.sock, "/v1/attest", body);
  expect_challenge(GN_MSG_ATTEST_CHALLENGE, &c, &ch);
  assert_int_equal(gn_attest_prover_new(gn_attest_backend_cpu(), &pr), 0);
  assert_int_equal(gn_attest_prover_on_challenge(pr, ch.data.data, ch.data.len, &out), 0);
  send_wrapped(GN_MSG_ATTEST_RESPONSE, ch.sid, out.data, out.len);
  gn_buf_done(&out);
  expect_challenge(GN_MSG_ATTEST_OPEN, &c, &op);
  assert_int_equal(gn_attest_prover_on_open(pr, op.data.data, op.data.len, &out), 0);
  send_wrapped(GN_MSG_ATTEST_PROOF, ch.sid, out.data, out.len);
  gn_buf_done(&out);
  expect_challenge(GN_MSG_ATTEST_MEM_CHALLENGE, &c, &mc);
  assert_int_equal(gn_attest_mem_prover_new(64, &mpr), 0);
  assert_int_equal(gn_attest_mem_prover_on_challenge(mpr, mc.data.data, mc.data.len, &out), 0);
  send_wrapped(GN_MSG_ATTEST_MEM_READY, ch.sid, out.data, out.len);
  gn_buf_done(&out);
  expect_challenge(GN_MSG_ATTEST_MEM_WALK, &c, &wk);
  assert_int_equal(gn_attest_mem_prover_on_walk(mpr, wk.data.data, wk.data.len, &out), 0);
  send_wrapped(GN_MSG_ATTEST_MEM_RESULT, ch.sid, out.data, out.len);
  msg verdict;
  assert_true(wait_msg(GN_MSG_ATTEST_VERDICT, NULL, 10000, &verdict));
  gn_buf_done(&verdict.raw);
  call_finish(&c, 10000);
  assert_int_equal(c.status, 200);
  json_t *o = json_loads((const char *)c.out.data, 0, NULL);
  assert_non_null(o);
  assert_string_equal(json_string_value(json_object_get(o, "outcome")), "simulated");
  json_t *mem = json_object_get(o, "memory");
  assert_true(json_is_object(mem));
  assert_string_equal(json_string_value(json_object_get(mem, "verdict")), "simulated");
  assert_true(json_number_value(json_object_get(mem, "measured_gbs")) > 0);
  assert_true(json_integer_value(json_object_get(mem, "elapsed_ms")) >= 1);
  json_decref(o);
  gn_attest_mem_prover_free(mpr);
  gn_attest_prover_free(pr);
  gn_buf_done(&out);
  gn_buf_done(&ch.data);
  gn_buf_done(&op.data);
  gn_buf_done(&mc.data);
  gn_buf_done(&wk.data);
  gn_buf_done(&c.out);
}

int main(void) {
  curl_global_init(CURL_GLOBAL_DEFAULT);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_rent_refuses_provider_answering_garbage, setup, teardown),
      cmocka_unit_test_setup_teardown(test_rent_refuses_response_to_another_nonce, setup_simulated, teardown),
      cmocka_unit_test_setup_teardown(test_rent_gives_up_on_silent_provider, setup, teardown),
      cmocka_unit_test_setup_teardown(test_rent_without_attestation_asks_for_the_lease_at_once, setup, teardown),
      cmocka_unit_test_setup_teardown(test_rent_refuses_stale_memory_table, setup_simulated, teardown),
      cmocka_unit_test_setup_teardown(test_attest_reports_memory_figures_of_honest_simulated_provider, setup_simulated,
                                      teardown),
  };
  int r = cmocka_run_group_tests(tests, NULL, NULL);
  curl_global_cleanup();
  return r;
}
