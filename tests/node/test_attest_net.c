/* Integration test of attestation against dishonest peers. A real
 * requester gpunetd, and this test as a provider that publishes an offer and
 * then answers the requester's challenges with garbage, with stale answers,
 * or not at all, while the requester's control API is driven with libcurl.
 * Then a real provider gpunetd (a simulated RTX 4090), and this test as
 * challengers that name no offer, challenge too often, or vouch for it
 * without leasing: what it proves and which verdicts its offers carry. */
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

/* --- what a requester counts of an offer's verdict ---------------------------*/

/* A report on this test provider's simulated RTX 4090 checked by `ver`
 * (its verdict signed 5 s ago), carrying the agreement by which `lessee`
 * leased that GPU now (none when lessee is NULL), sealed by the provider
 * and appended to ret. */
static void checked_report(const gn_identity *ver, const gn_identity *lessee, gn_buf *ret) {
  const gn_attest_params p = {.n = 256, .depth = 1, .rounds = 2, .open_rounds = 2, .open_rows = 4};
  gn_buf ch = {0}, resp = {0}, open = {0}, proof = {0}, venv = {0}, req = {0}, ag = {0};
  gn_attest_verifier *v;
  gn_attest_prover *pr;
  gn_attest_result res;
  gn_attest_report rep;
  gn_attest_gpu gpu;
  int64_t now = gn_unix_s();
  memset(&gpu, 0, sizeof gpu);
  snprintf(gpu.name, sizeof gpu.name, "NVIDIA GeForce RTX 4090");
  snprintf(gpu.uuid, sizeof gpu.uuid, "GPU-SIM-0");
  assert_int_equal(gn_attest_verifier_new(&p, "RTX 4090", NULL, NULL, &ch, &v), 0);
  assert_int_equal(gn_attest_prover_new(gn_attest_backend_cpu(), &pr), 0);
  assert_int_equal(gn_attest_prover_on_challenge(pr, ch.data, ch.len, &resp), 0);
  assert_int_equal(gn_attest_verifier_on_response(v, resp.data, resp.len, &open), 0);
  assert_int_equal(gn_attest_prover_on_open(pr, open.data, open.len, &proof), 0);
  assert_int_equal(gn_attest_verifier_on_proof(v, proof.data, proof.len, 10, &res), 0);
  gn_attest_report_from_result(&rep, &gpu, &p, &res, now);
  assert_int_equal(gn_attest_verdict_seal(ver, W.prov_id->pk, &p, &res, now - 5, &venv), 0);
  assert_int_equal(gn_attest_report_attach_verdict(&rep, W.prov_id->pk, venv.data, venv.len), 0);
  if (lessee) {
    gn_lease_terms t;
    const char *uuids[] = {"GPU-SIM-0"};
    tn_lease_terms(&t, W.prov_id, lessee, 1, true);
    snprintf(t.offer_id, sizeof t.offer_id, "%s", W.offer_id);
    assert_int_equal(gn_lease_request_seal(lessee, &t, &req), 0);
    assert_int_equal(gn_agreement_seal(W.prov_id, req.data, req.len, now, uuids, 1, &ag), 0);
    assert_int_equal(gn_attest_report_set_lease(&rep, ag.data, ag.len), 0);
  }
  assert_int_equal(gn_attest_report_seal(W.prov_id, &rep, ret), 0);
  assert_true(ret->len <= GN_OFFER_ATTEST_MAX);
  gn_attest_report_done(&rep);
  gn_attest_prover_free(pr);
  gn_attest_verifier_free(v);
  gn_buf *bufs[] = {&ch, &resp, &open, &proof, &venv, &req, &ag};
  for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
    gn_buf_done(bufs[i]);
}

/* Publishes the test provider's offer again (seq), carrying report. */
static void publish_offer_with(uint64_t seq, const gn_buf *report) {
  gn_offer o;
  gn_buf env = {0};
  tn_offer(&o, W.prov_id->pk, gn_transport_listen_addr(W.tp), 1, 60, true);
  o.seq = seq;
  memcpy(o.attest, report->data, report->len);
  o.attest_len = (uint32_t)report->len;
  assert_int_equal(gn_offer_seal(W.prov_id, &o, &env), 0);
  assert_int_equal(gn_transport_send(W.tp, W.req_id->pk, env.data, env.len), 0);
  gn_buf_done(&env);
}

typedef struct offer_att {
  const char *want; /* a part the requester's view of the offer must have */
  char att[256];
} offer_att;

static bool requester_offer_says(void *ud) {
  offer_att *a = ud;
  json_t *j = tn_api_try_get(W.dir, "/v1/offers");
  json_t *o = json_array_get(json_object_get(j, "offers"), 0);
  snprintf(a->att, sizeof a->att, "%s", json_string_value(json_object_get(o, "attestation")) ?: "");
  json_decref(j);
  return strstr(a->att, a->want) != NULL;
}

/* A requester does not count a peer's verdict on an offer unless the report
 * shows that very peer then leased the GPU: neither one with no agreement
 * nor one with someone else's (a provider's second identity vouching). */
static void test_requester_does_not_count_verdict_without_its_verifiers_lease(void **state) {
  (void)state;
  gn_identity *ver, *ver2, *other;
  gn_buf rep = {0};
  char vid[GN_NODE_ID_STRLEN], part[96];
  assert_int_equal(gn_identity_generate(&ver), 0);
  assert_int_equal(gn_identity_generate(&ver2), 0);
  assert_int_equal(gn_identity_generate(&other), 0);
  checked_report(ver, NULL, &rep);
  publish_offer_with(2, &rep);
  gn_node_id_format(ver->pk, vid);
  snprintf(part, sizeof part, "simulated (not counted: verifier %.14s", vid);
  offer_att a = {.want = part};
  if (!tn_run_until(&W.loop, requester_offer_says, &a, 10000))
    fail_msg("an unleased verdict is shown as: %s", a.att);
  gn_buf_done(&rep);
  /* Another verifier, with an agreement in which someone else leased. */
  checked_report(ver2, other, &rep);
  publish_offer_with(3, &rep);
  gn_node_id_format(ver2->pk, vid);
  snprintf(part, sizeof part, "simulated (not counted: verifier %.14s", vid);
  if (!tn_run_until(&W.loop, requester_offer_says, &a, 10000))
    fail_msg("a verdict with another peer's lease is shown as: %s", a.att);
  gn_buf_done(&rep);
  gn_identity_free(ver);
  gn_identity_free(ver2);
  gn_identity_free(other);
}

/* ...and counts it when the verifier leased after its verdict. */
static void test_requester_counts_verdict_of_verifier_that_leased(void **state) {
  (void)state;
  gn_identity *ver;
  gn_buf rep = {0};
  char vid[GN_NODE_ID_STRLEN], part[64];
  assert_int_equal(gn_identity_generate(&ver), 0);
  checked_report(ver, ver, &rep);
  publish_offer_with(2, &rep);
  gn_node_id_format(ver->pk, vid);
  snprintf(part, sizeof part, "simulated (checked by %.14s", vid);
  offer_att a = {.want = part};
  if (!tn_run_until(&W.loop, requester_offer_says, &a, 10000))
    fail_msg("a leased verdict is shown as: %s", a.att);
  gn_buf_done(&rep);
  gn_identity_free(ver);
}

/* --- a real provider, played challengers -------------------------------------*/

typedef struct pworld {
  char dir[PATH_MAX];
  char addr[64];
  pid_t daemon;
  uv_loop_t loop;
  gn_identity *prov_id, *ids[2]; /* ids[0] challenges; ids[1] is another peer */
  gn_transport *tps[2];
  int up[2];
  tn_inbox in[2];
  tn_link link[2];
  char model[64];                    /* the simulated GPU's name */
  char offer_id[GN_OFFER_ID_STRLEN]; /* the provider's offer for it */
} pworld;

static pworld P;

/* The small challenge a simulated GPU gets (attest_agent.c's sim_params). */
static const gn_attest_params p_params = {.n = 256, .depth = 1, .rounds = 2, .open_rounds = 2, .open_rows = 4};

/* The attestation of the provider's GPU as GET /v1/gpus says it, to out. */
static void p_gpu_attestation(char *out, size_t cap) {
  json_t *j = tn_api_get(P.dir, "/v1/gpus");
  json_t *g = json_array_get(json_object_get(j, "gpus"), 0);
  snprintf(out, cap, "%s", json_string_value(json_object_get(g, "attestation")) ?: "");
  if (!P.model[0])
    snprintf(P.model, sizeof P.model, "%s", json_string_value(json_object_get(g, "name")) ?: "");
  json_decref(j);
}

/* The provider's own offer as its GET /v1/offers shows it: gpus_free and
 * the attestation it carries (what any requester reads from it). */
static void p_own_offer(int *ret_free, char *att, size_t cap) {
  json_t *j = tn_api_get(P.dir, "/v1/offers");
  json_t *offers = json_object_get(j, "offers");
  *ret_free = -1;
  att[0] = 0;
  for (size_t i = 0; i < json_array_size(offers); i++) {
    json_t *o = json_array_get(offers, i);
    if (!json_is_true(json_object_get(o, "own")))
      continue;
    *ret_free = (int)json_integer_value(json_object_get(o, "gpus_free"));
    snprintf(att, cap, "%s", json_string_value(json_object_get(o, "attestation")) ?: "");
  }
  json_decref(j);
}

/* How many lines of the provider's log mention part. */
static int p_log_count(const char *part) {
  char path[PATH_MAX + 16], line[2048];
  int n = 0;
  snprintf(path, sizeof path, "%s/gpunetd.log", P.dir);
  FILE *fp = fopen(path, "r");
  while (fp && fgets(line, sizeof line, fp))
    n += strstr(line, part) != NULL;
  if (fp)
    fclose(fp);
  return n;
}

static bool p_ready(void *ud) {
  (void)ud;
  json_t *j = tn_api_try_get(P.dir, "/v1/gpus");
  json_t *g = json_array_get(json_object_get(j, "gpus"), 0);
  const char *a = json_string_value(json_object_get(g, "attestation"));
  bool done = a && strstr(a, "(self-check)");
  json_decref(j);
  return done;
}

static int p_setup(void **state) {
  (void)state;
  memset(&P, 0, sizeof P);
  snprintf(P.dir, sizeof P.dir, "/tmp/gn-attest-prov-XXXXXX");
  assert_non_null(mkdtemp(P.dir));
  tn_identity_for(P.dir, &P.prov_id);
  snprintf(P.addr, sizeof P.addr, "127.0.0.1:%d", tn_free_port());
  P.daemon = tn_daemon_spawn(P.dir, "w", "--data-dir", P.dir, "--listen", P.addr, "--provide", "--simulate-gpu",
                             "RTX 4090", "--price", "0.40", "--max-hours", "2", "--interval-min-s", "10",
                             "--interval-max-s", "600", "--allow-no-userns", (char *)NULL);
  uv_loop_init(&P.loop);
  for (int i = 0; i < 2; i++) {
    P.link[i] = (tn_link){&P.up[i], &P.in[i], P.prov_id->pk};
    tn_peer_new(&P.loop, &P.link[i], &P.ids[i], &P.tps[i]);
    tn_dial(&P.loop, P.tps[i], P.addr, &P.up[i], P.dir);
  }
  /* Its self-check is done (the GPU is known and attested). */
  if (!tn_run_until(&P.loop, p_ready, NULL, 30000))
    fail_msg("the provider's self-check did not finish in 30 s");
  char att[256];
  p_gpu_attestation(att, sizeof att);
  gn_offer o;
  memset(&o, 0, sizeof o);
  memcpy(o.provider, P.prov_id->pk, GN_PK_LEN);
  snprintf(o.gpu_model, sizeof o.gpu_model, "%s", P.model);
  gn_offer_id(&o, P.offer_id);
  return 0;
}

static int p_teardown(void **state) {
  (void)state;
  tn_inbox_done(&P.in[1]);
  int rc = tn_world_end(&P.loop, P.tps, 2, P.daemon, &P.in[0], P.dir);
  P.prov_id = gn_identity_free(P.prov_id);
  for (int i = 0; i < 2; i++)
    P.ids[i] = gn_identity_free(P.ids[i]);
  return rc;
}

/* Sends a wrapped attestation message {sid, gpu_model?, offer?, data} as
 * played peer i. */
static void p_send_wrapped(int i, uint32_t type, const char *sid, const char *model, const char *offer,
                           const gn_buf *data) {
  gn_wire_writer w;
  gn_buf body = {0};
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
  tn_send(P.tps[i], P.ids[i], type, &body, P.prov_id->pk);
  gn_buf_done(&body);
}

/* Peer i challenges the provider's GPU naming offer (NULL: none) and waits
 * for the answer: 1 with the graded compute result in *ret_res when it
 * proved, 0 with its refusal's reason in reason (256 bytes) otherwise. */
static int p_challenge(int i, const char *sid, const char *offer, gn_attest_result *ret_res, char *reason) {
  gn_buf ch = {0}, open = {0};
  gn_attest_verifier *v;
  tn_msg m;
  wrapped r;
  int proved = 0;
  assert_int_equal(gn_attest_verifier_new(&p_params, "RTX 4090", NULL, NULL, &ch, &v), 0);
  p_send_wrapped(i, GN_MSG_ATTEST_CHALLENGE, sid, P.model, offer, &ch);
  uint64_t t0 = gn_mono_ms();
  bool answered = false;
  for (uint64_t deadline = t0 + 15000; !answered && gn_mono_ms() < deadline;) {
    if (tn_inbox_take(&P.in[i], GN_MSG_ERROR, &m)) {
      tn_msg_str(&m, "reason", reason, 256);
      gn_buf_done(&m.raw);
      goto out;
    }
    answered = tn_inbox_take(&P.in[i], GN_MSG_ATTEST_RESPONSE, &m);
    tn_msg none;
    if (!answered)
      tn_wait_msg(&P.loop, &P.in[i], UINT32_MAX, NULL, NULL, 50, &none);
  }
  if (!answered)
    fail_msg("no answer to challenge %s in 15 s", sid);
  unwrap(&m, &r);
  gn_buf_done(&m.raw);
  uint64_t elapsed = gn_mono_ms() - t0;
  assert_int_equal(gn_attest_verifier_on_response(v, r.data.data, r.data.len, &open), 0);
  gn_buf_done(&r.data);
  p_send_wrapped(i, GN_MSG_ATTEST_OPEN, sid, NULL, NULL, &open);
  if (!tn_wait_msg(&P.loop, &P.in[i], GN_MSG_ATTEST_PROOF, NULL, NULL, 15000, &m))
    fail_msg("no proof for challenge %s in 15 s", sid);
  unwrap(&m, &r);
  gn_buf_done(&m.raw);
  assert_int_equal(gn_attest_verifier_on_proof(v, r.data.data, r.data.len, elapsed ? elapsed : 1, ret_res), 0);
  assert_int_equal(ret_res->outcome, GN_ATTEST_SIMULATED);
  gn_buf_done(&r.data);
  proved = 1;
out:
  gn_attest_verifier_free(v);
  gn_buf_done(&ch);
  gn_buf_done(&open);
  return proved;
}

/* Peer i's signed verdict on its exchange, sent to the provider. */
static void p_send_verdict(int i, const gn_attest_result *res) {
  gn_buf env = {0};
  assert_int_equal(gn_attest_verdict_seal(P.ids[i], P.prov_id->pk, &p_params, res, gn_unix_s(), &env), 0);
  assert_int_equal(gn_transport_send(P.tps[i], P.prov_id->pk, env.data, env.len), 0);
  gn_buf_done(&env);
}

static bool p_verdict_held(void *ud) {
  return p_log_count("published if") >= *(const int *)ud;
}

/* Peer i leases the provider's GPU (the lease request names its offer). */
static void p_lease(int i) {
  gn_lease_terms t;
  gn_agreement ag;
  tn_lease_terms(&t, P.prov_id, P.ids[i], 1, true);
  snprintf(t.gpu_model, sizeof t.gpu_model, "%s", P.model);
  snprintf(t.offer_id, sizeof t.offer_id, "%s", P.offer_id);
  tn_rent(&P.loop, &P.in[i], P.tps[i], P.ids[i], P.prov_id, &t, &ag, NULL);
}

typedef struct own_wait {
  int want_free;
  const char *want_att; /* a part the attestation must have, or NULL */
  int free_n;
  char att[256];
} own_wait;

static bool p_own_offer_is(void *ud) {
  own_wait *w = ud;
  p_own_offer(&w->free_n, w->att, sizeof w->att);
  return w->free_n == w->want_free && (!w->want_att || strstr(w->att, w->want_att));
}

/* A challenge that names no offer, or not this provider's, is refused, and
 * the GPU proves nothing for it; naming the offer gets a proof. */
static void test_provider_refuses_challenge_without_lease_intent(void **state) {
  (void)state;
  char reason[256];
  gn_attest_result res;
  char other[GN_OFFER_ID_STRLEN];
  gn_offer o;
  memset(&o, 0, sizeof o);
  memcpy(o.provider, P.ids[1]->pk, GN_PK_LEN);
  snprintf(o.gpu_model, sizeof o.gpu_model, "%s", P.model);
  gn_offer_id(&o, other);
  const char *names[] = {NULL, "o-000000000000", other};
  for (int i = 0; i < 3; i++) {
    char sid[32];
    snprintf(sid, sizeof sid, "a-%016d", i);
    assert_int_equal(p_challenge(0, sid, names[i], &res, reason), 0);
    assert_non_null(strstr(reason, "attestation is for peers about to lease"));
  }
  assert_int_equal(p_log_count("attestation challenge for"), 0);
  assert_int_equal(p_challenge(0, "a-0000000000000009", P.offer_id, &res, reason), 1);
  assert_int_equal(p_log_count("attestation challenge for"), 1);
}

/* GN_ATTEST_PEER_HOURLY challenges from one peer are proven, the next is
 * refused unproven; another peer is still served. */
static void test_provider_limits_challenges_per_peer(void **state) {
  (void)state;
  char reason[256], sid[32];
  gn_attest_result res;
  for (int i = 0; i < GN_ATTEST_PEER_HOURLY; i++) {
    snprintf(sid, sizeof sid, "a-%016d", i);
    assert_int_equal(p_challenge(0, sid, P.offer_id, &res, reason), 1);
  }
  assert_int_equal(p_log_count("attestation challenge for"), GN_ATTEST_PEER_HOURLY);
  assert_int_equal(p_challenge(0, "a-over", P.offer_id, &res, reason), 0);
  assert_non_null(strstr(reason, "attestation challenges an hour from one peer"));
  assert_int_equal(p_log_count("attestation challenge for"), GN_ATTEST_PEER_HOURLY);
  assert_int_equal(p_challenge(1, "a-other", P.offer_id, &res, reason), 1);
  assert_int_equal(p_log_count("attestation challenge for"), GN_ATTEST_PEER_HOURLY + 1);
}

/* The attack: peer 0 (a second identity of the provider, say) proves it
 * and vouches for it, and someone else leases. The provider's next offer
 * (after that lease) carries no peer's verdict, nor does its GPU say one. */
static void test_verdict_of_challenger_that_did_not_lease_is_not_published(void **state) {
  (void)state;
  char reason[256], att[256];
  gn_attest_result res;
  assert_int_equal(p_challenge(0, "a-vouch", P.offer_id, &res, reason), 1);
  p_send_verdict(0, &res);
  int one = 1;
  if (!tn_run_until(&P.loop, p_verdict_held, &one, 10000))
    fail_msg("the provider did not take the verdict in 10 s");
  p_lease(1);
  own_wait w = {.want_free = 0};
  if (!tn_run_until(&P.loop, p_own_offer_is, &w, 10000))
    fail_msg("no offer after the lease in 10 s: %d free, %s", w.free_n, w.att);
  /* A few ticks more: a verdict published on the next one would show. */
  tn_msg none;
  tn_wait_msg(&P.loop, &P.in[0], UINT32_MAX, NULL, NULL, 1500, &none);
  p_own_offer(&w.free_n, w.att, sizeof w.att);
  assert_int_equal(w.free_n, 0);
  assert_non_null(strstr(w.att, "(self-reported)"));
  assert_null(strstr(w.att, "checked by"));
  p_gpu_attestation(att, sizeof att);
  assert_non_null(strstr(att, "(self-check)"));
}

/* The verifier leases: the next offer carries its verdict, counted (the
 * lease agreement by which it leased is in the report). */
static void test_verdict_of_challenger_that_leased_is_published(void **state) {
  (void)state;
  char reason[256], att[256], vid[GN_NODE_ID_STRLEN], part[64];
  gn_attest_result res;
  assert_int_equal(p_challenge(0, "a-lessee", P.offer_id, &res, reason), 1);
  p_send_verdict(0, &res);
  int one = 1;
  if (!tn_run_until(&P.loop, p_verdict_held, &one, 10000))
    fail_msg("the provider did not take the verdict in 10 s");
  p_lease(0);
  gn_node_id_format(P.ids[0]->pk, vid);
  snprintf(part, sizeof part, "(checked by %.14s", vid);
  own_wait w = {.want_free = 0, .want_att = part};
  if (!tn_run_until(&P.loop, p_own_offer_is, &w, 10000))
    fail_msg("the offer does not carry the lessee's verdict in 10 s: %d free, %s", w.free_n, w.att);
  assert_non_null(strstr(w.att, "simulated (checked by"));
  p_gpu_attestation(att, sizeof att);
  assert_non_null(strstr(att, part));
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
      cmocka_unit_test_setup_teardown(test_requester_does_not_count_verdict_without_its_verifiers_lease,
                                      setup_simulated, teardown),
      cmocka_unit_test_setup_teardown(test_requester_counts_verdict_of_verifier_that_leased, setup_simulated, teardown),
      cmocka_unit_test_setup_teardown(test_provider_refuses_challenge_without_lease_intent, p_setup, p_teardown),
      cmocka_unit_test_setup_teardown(test_provider_limits_challenges_per_peer, p_setup, p_teardown),
      cmocka_unit_test_setup_teardown(test_verdict_of_challenger_that_did_not_lease_is_not_published, p_setup,
                                      p_teardown),
      cmocka_unit_test_setup_teardown(test_verdict_of_challenger_that_leased_is_published, p_setup, p_teardown),
  };
  int r = cmocka_run_group_tests(tests, NULL, NULL);
  curl_global_cleanup();
  return r;
}
