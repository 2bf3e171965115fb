/* Integration test of a provider's policy: a real gpunetd process with a
 * simulated GPU, and this test as a requester speaking the wire protocol
 * over real Noise sessions, sending good and bad leases and manifests. */
#include <gpunet/billing.h>
#include <gpunet/identity.h>
#include <gpunet/transport.h>
#include <gpunet/wire.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
/* cmocka needs the above first. */
#include <cmocka.h>

#include <limits.h>
#include <signal.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

typedef struct msg {
  uint32_t type;
  uint8_t peer[GN_PK_LEN];
  gn_buf raw;
} msg;

typedef struct world {
  char dir[PATH_MAX];
  char addr[64];
  pid_t daemon;
  uv_loop_t loop;
  gn_identity *prov_id;
  gn_identity *req_id, *other_id;
  gn_transport *req_tp, *other_tp;
  int up_req, up_other;
  msg inbox[64];
  size_t inbox_n;
} world;

static world W;

static void on_up(gn_transport *t, const uint8_t peer[GN_PK_LEN], const char *addr, void *ud) {
  (void)peer;
  (void)addr;
  (void)ud;
  if (t == W.req_tp)
    W.up_req = 1;
  else
    W.up_other = 1;
}

static void on_down(gn_transport *t, const uint8_t peer[GN_PK_LEN], void *ud) {
  (void)peer;
  (void)ud;
  if (t == W.req_tp)
    W.up_req = 0;
  else
    W.up_other = 0;
}

static void on_msg(gn_transport *t, const uint8_t peer[GN_PK_LEN], const gn_envelope *env, const uint8_t *raw,
                   size_t len, void *ud) {
  (void)t;
  (void)ud;
  /* Discovery traffic (peers, offers) is not what these tests look at. */
  if (env->type < 10 || W.inbox_n >= GN_ARRAY_SIZE(W.inbox))
    return;
  msg *m = &W.inbox[W.inbox_n++];
  memset(m, 0, sizeof *m);
  m->type = env->type;
  memcpy(m->peer, peer, GN_PK_LEN);
  gn_buf_append(&m->raw, raw, len);
}

static void on_timer(uv_timer_t *t) {
  (void)t;
}

/* Runs the loop until a message of `type` arrives (returns it, removed from
 * the inbox; the caller frees raw) or timeout_ms passes (returns 0). */
static int wait_msg(uint32_t type, uint64_t timeout_ms, msg *ret) {
  uv_timer_t t;
  uv_timer_init(&W.loop, &t);
  uv_timer_start(&t, on_timer, 20, 20);
  uint64_t end = gn_mono_ms() + timeout_ms;
  int found = 0;
  while (!found && gn_mono_ms() < end) {
    uv_run(&W.loop, UV_RUN_ONCE);
    for (size_t i = 0; i < W.inbox_n; i++) {
      if (W.inbox[i].type == type) {
        *ret = W.inbox[i];
        memmove(&W.inbox[i], &W.inbox[i + 1], (W.inbox_n - i - 1) * sizeof W.inbox[0]);
        W.inbox_n--;
        found = 1;
        break;
      }
    }
  }
  uv_timer_stop(&t);
  uv_close((uv_handle_t *)&t, NULL);
  uv_run(&W.loop, UV_RUN_NOWAIT);
  return found;
}

static void run_until(int *flag, uint64_t timeout_ms) {
  uv_timer_t t;
  uv_timer_init(&W.loop, &t);
  uv_timer_start(&t, on_timer, 20, 20);
  uint64_t end = gn_mono_ms() + timeout_ms;
  while (!*flag && gn_mono_ms() < end)
    uv_run(&W.loop, UV_RUN_ONCE);
  uv_timer_stop(&t);
  uv_close((uv_handle_t *)&t, NULL);
  uv_run(&W.loop, UV_RUN_NOWAIT);
}

/* A port the kernel just handed out on 127.0.0.1, so tests running side by
 * side do not pick the same one. */
static int free_port(void) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t len = sizeof a;
  assert_true(fd >= 0);
  assert_int_equal(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
  assert_int_equal(getsockname(fd, (struct sockaddr *)&a, &len), 0);
  close(fd);
  return ntohs(a.sin_port);
}

static void start_daemon(void) {
  char bin[PATH_MAX], key[PATH_MAX + 32];
  const char *bd = getenv("GN_BUILD_DIR");
  assert_non_null(bd);
  snprintf(bin, sizeof bin, "%s/gpunetd", bd);
  snprintf(key, sizeof key, "%s/identity.key", W.dir);
  assert_int_equal(gn_identity_generate(&W.prov_id), 0);
  assert_int_equal(gn_identity_save(W.prov_id, key), 0);
  snprintf(W.addr, sizeof W.addr, "127.0.0.1:%d", free_port());
  W.daemon = fork();
  assert_true(W.daemon >= 0);
  if (W.daemon == 0) {
    char log[PATH_MAX + 32];
    snprintf(log, sizeof log, "%s/gpunetd.log", W.dir);
    if (!freopen(log, "w", stderr))
      _exit(127);
    execl(bin, bin, "--data-dir", W.dir, "--listen", W.addr, "--provide", "--simulate-gpu", "RTX 4090",
          "--simulate-gpu", "RTX 4090", "--price", "0.40", "--max-hours", "2", (char *)NULL);
    _exit(127);
  }
}

static int setup(void **state) {
  (void)state;
  memset(&W, 0, sizeof W);
  snprintf(W.dir, sizeof W.dir, "/tmp/gn-policy-XXXXXX");
  assert_non_null(mkdtemp(W.dir));
  start_daemon();
  uv_loop_init(&W.loop);
  gn_transport_cbs cbs = {on_up, on_down, on_msg};
  assert_int_equal(gn_identity_generate(&W.req_id), 0);
  assert_int_equal(gn_identity_generate(&W.other_id), 0);
  assert_int_equal(gn_transport_new(&W.loop, W.req_id, &cbs, NULL, &W.req_tp), 0);
  assert_int_equal(gn_transport_new(&W.loop, W.other_id, &cbs, NULL, &W.other_tp), 0);
  /* The daemon needs a moment to listen; retry the connection. */
  for (int i = 0; i < 50 && !(W.up_req && W.up_other); i++) {
    usleep(100000);
    if (!W.up_req)
      gn_transport_connect(W.req_tp, W.addr);
    if (!W.up_other)
      gn_transport_connect(W.other_tp, W.addr);
    run_until(&W.up_req, 300);
    run_until(&W.up_other, 300);
  }
  assert_true(W.up_req);
  assert_true(W.up_other);
  return 0;
}

static void closed(void *ud) {
  (void)ud;
}

static int teardown(void **state) {
  (void)state;
  gn_transport_close(W.req_tp, closed, NULL);
  gn_transport_close(W.other_tp, closed, NULL);
  uv_run(&W.loop, UV_RUN_DEFAULT);
  uv_loop_close(&W.loop);
  kill(W.daemon, SIGTERM);
  int status = 0;
  waitpid(W.daemon, &status, 0);
  for (size_t i = 0; i < W.inbox_n; i++)
    gn_buf_done(&W.inbox[i].raw);
  W.prov_id = gn_identity_free(W.prov_id);
  W.req_id = gn_identity_free(W.req_id);
  W.other_id = gn_identity_free(W.other_id);
  char cmd[PATH_MAX + 16];
  snprintf(cmd, sizeof cmd, "rm -rf %s", W.dir);
  if (system(cmd) != 0)
    return -1;
  return 0;
}

/* --- helpers speaking the protocol -----------------------------------------*/

static void terms_for(gn_lease_terms *t, uint32_t count, bool simulated) {
  gn_lease_terms_init(t);
  memcpy(t->provider, W.prov_id->pk, GN_PK_LEN);
  memcpy(t->requester, W.req_id->pk, GN_PK_LEN);
  snprintf(t->offer_id, sizeof t->offer_id, "o-test");
  snprintf(t->gpu_model, sizeof t->gpu_model, "NVIDIA GeForce RTX 4090");
  t->count = count;
  t->price_uper_hour = 400000;
  snprintf(t->currency, sizeof t->currency, "EUR");
  t->max_s = 3600;
  t->interval_s = 60;
  t->requested_s = gn_unix_s();
  t->simulated = simulated;
}

static char *reason_of(const msg *m) {
  static char reason[256];
  gn_envelope env;
  gn_wire_doc doc;
  reason[0] = 0;
  if (gn_envelope_open(m->raw.data, m->raw.len, &env) == 0 && gn_wire_decode(env.body, env.body_len, &doc) == 0) {
    gn_wire_get_str(doc.root, "reason", reason, sizeof reason);
    gn_wire_doc_done(&doc);
  }
  return reason;
}

static char *state_of(const msg *m) {
  static char state[32];
  gn_envelope env;
  gn_wire_doc doc;
  state[0] = 0;
  if (gn_envelope_open(m->raw.data, m->raw.len, &env) == 0 && gn_wire_decode(env.body, env.body_len, &doc) == 0) {
    gn_wire_get_str(doc.root, "state", state, sizeof state);
    gn_wire_doc_done(&doc);
  }
  return state;
}

static void rent(gn_agreement *ret_ag, gn_buf *ret_env) {
  gn_lease_terms t;
  gn_buf env = {0};
  msg m;
  terms_for(&t, 1, true);
  assert_int_equal(gn_lease_request_seal(W.req_id, &t, &env), 0);
  assert_int_equal(gn_transport_send(W.req_tp, W.prov_id->pk, env.data, env.len), 0);
  gn_buf_done(&env);
  assert_true(wait_msg(GN_MSG_LEASE_ACCEPT, 5000, &m));
  assert_int_equal(gn_agreement_open(m.raw.data, m.raw.len, ret_ag), 0);
  assert_string_equal(ret_ag->terms.lease_id, t.lease_id);
  if (ret_env)
    gn_buf_append(ret_env, m.raw.data, m.raw.len);
  gn_buf_done(&m.raw);
}

static void manifest_env(const gn_identity *signer, const char *lease_id, const char *image, int64_t expires_delta,
                         gn_buf *ret) {
  uint8_t nonce[16], rnd[6];
  char job[32], hex[13];
  randombytes_buf(nonce, sizeof nonce);
  randombytes_buf(rnd, sizeof rnd);
  sodium_bin2hex(hex, sizeof hex, rnd, sizeof rnd);
  snprintf(job, sizeof job, "j-%s", hex);
  gn_wire_writer w;
  gn_wire_writer_init(&w);
  gn_wire_put_map(&w, 12);
  gn_wire_put_str(&w, "job_id");
  gn_wire_put_str(&w, job);
  gn_wire_put_str(&w, "lease_id");
  gn_wire_put_str(&w, lease_id);
  gn_wire_put_str(&w, "image");
  gn_wire_put_str(&w, image);
  gn_wire_put_str(&w, "cmd");
  gn_wire_put_array(&w, 1);
  gn_wire_put_str(&w, "true");
  gn_wire_put_str(&w, "env");
  gn_wire_put_array(&w, 0);
  gn_wire_put_str(&w, "memory_mib");
  gn_wire_put_u64(&w, 64);
  gn_wire_put_str(&w, "pids");
  gn_wire_put_u64(&w, 16);
  gn_wire_put_str(&w, "network");
  gn_wire_put_bool(&w, false);
  gn_wire_put_str(&w, "nonce");
  gn_wire_put_bin(&w, nonce, sizeof nonce);
  gn_wire_put_str(&w, "issued_s");
  gn_wire_put_i64(&w, gn_unix_s());
  gn_wire_put_str(&w, "expires_s");
  gn_wire_put_i64(&w, gn_unix_s() + expires_delta);
  gn_wire_put_str(&w, "v");
  gn_wire_put_u64(&w, GN_PROTO_VERSION);
  gn_buf body = {0};
  assert_int_equal(gn_wire_writer_take(&w, &body), 0);
  gn_wire_writer_done(&w);
  assert_int_equal(gn_envelope_seal(signer, GN_MSG_JOB_MANIFEST, body.data, body.len, ret), 0);
  gn_buf_done(&body);
}

#define PINNED "127.0.0.1:9/none/busybox@sha256:0000000000000000000000000000000000000000000000000000000000000000"

static void expect_job_rejected(gn_transport *tp, const gn_buf *env, const char *reason_part) {
  msg m;
  assert_int_equal(gn_transport_send(tp, W.prov_id->pk, env->data, env->len), 0);
  assert_true(wait_msg(GN_MSG_JOB_STATUS, 5000, &m));
  assert_string_equal(state_of(&m), "rejected");
  if (!strstr(reason_of(&m), reason_part))
    fail_msg("reason '%s' does not mention '%s'", reason_of(&m), reason_part);
  gn_buf_done(&m.raw);
}

/* --- tests -----------------------------------------------------------------*/

static void test_provider_accepts_a_manifest_once_and_refuses_its_replay(void **state) {
  (void)state;
  gn_agreement ag;
  gn_buf env = {0};
  msg m;
  rent(&ag, NULL);
  manifest_env(W.req_id, ag.terms.lease_id, PINNED, 120, &env);
  assert_int_equal(gn_transport_send(W.req_tp, W.prov_id->pk, env.data, env.len), 0);
  assert_true(wait_msg(GN_MSG_JOB_STATUS, 5000, &m));
  assert_string_equal(state_of(&m), "pulling");
  gn_buf_done(&m.raw);
  expect_job_rejected(W.req_tp, &env, "replayed");
  gn_buf_done(&env);
}

static void test_provider_rejects_expired_manifest(void **state) {
  (void)state;
  gn_agreement ag;
  gn_buf env = {0};
  rent(&ag, NULL);
  manifest_env(W.req_id, ag.terms.lease_id, PINNED, -10, &env);
  expect_job_rejected(W.req_tp, &env, "expired");
  gn_buf_done(&env);
}

static void test_provider_rejects_manifest_from_someone_else(void **state) {
  (void)state;
  gn_agreement ag;
  gn_buf env = {0};
  rent(&ag, NULL);
  manifest_env(W.other_id, ag.terms.lease_id, PINNED, 120, &env);
  expect_job_rejected(W.other_tp, &env, "not signed by the lease holder");
  gn_buf_done(&env);
}

static void test_provider_rejects_unpinned_image(void **state) {
  (void)state;
  gn_agreement ag;
  gn_buf env = {0};
  rent(&ag, NULL);
  manifest_env(W.req_id, ag.terms.lease_id, "127.0.0.1:9/none/busybox:latest", 120, &env);
  expect_job_rejected(W.req_tp, &env, "pinned");
  gn_buf_done(&env);
}

static void test_provider_drops_forged_signature(void **state) {
  (void)state;
  gn_agreement ag;
  gn_buf env = {0};
  msg m;
  rent(&ag, NULL);
  manifest_env(W.req_id, ag.terms.lease_id, PINNED, 120, &env);
  env.data[env.len - 1] ^= 1; /* the last byte is in the signature */
  gn_transport_send(W.req_tp, W.prov_id->pk, env.data, env.len);
  /* No job may start: the provider answers nothing at all to a forgery. */
  assert_false(wait_msg(GN_MSG_JOB_STATUS, 1500, &m));
  gn_buf_done(&env);
}

static void test_provider_rejects_job_on_released_lease_and_invoices_it(void **state) {
  (void)state;
  gn_agreement ag;
  gn_buf agreement = {0}, env = {0};
  msg m;
  rent(&ag, &agreement);
  uint64_t t0 = gn_mono_ms();
  sleep(2);
  gn_wire_writer w;
  gn_wire_writer_init(&w);
  gn_wire_put_map(&w, 2);
  gn_wire_put_str(&w, "lease_id");
  gn_wire_put_str(&w, ag.terms.lease_id);
  gn_wire_put_str(&w, "reason");
  gn_wire_put_str(&w, "test");
  gn_buf body = {0};
  gn_wire_writer_take(&w, &body);
  gn_wire_writer_done(&w);
  assert_int_equal(gn_envelope_seal(W.req_id, GN_MSG_LEASE_RELEASE, body.data, body.len, &env), 0);
  gn_buf_done(&body);
  assert_int_equal(gn_transport_send(W.req_tp, W.prov_id->pk, env.data, env.len), 0);
  gn_buf_done(&env);
  assert_true(wait_msg(GN_MSG_INVOICE, 5000, &m));
  uint64_t observed = (gn_mono_ms() - t0) / 1000;
  gn_invoice_summary sum;
  char reason[256] = "";
  int r =
      gn_invoice_check(m.raw.data, m.raw.len, agreement.data, agreement.len, observed, 2, &sum, reason, sizeof reason);
  if (r != 0)
    fail_msg("invoice does not check: %s", reason);
  assert_true(sum.seconds >= 1 && sum.seconds <= observed + 2);
  assert_int_equal(sum.total_micro, gn_price_cost(400000, 1, sum.seconds));
  gn_buf_done(&m.raw);

  manifest_env(W.req_id, ag.terms.lease_id, PINNED, 120, &env);
  expect_job_rejected(W.req_tp, &env, "not active");
  gn_buf_done(&env);
  gn_buf_done(&agreement);
}

static void test_provider_refuses_simulated_gpu_to_unknowing_requester(void **state) {
  (void)state;
  gn_lease_terms t;
  gn_buf env = {0};
  msg m;
  terms_for(&t, 1, false);
  assert_int_equal(gn_lease_request_seal(W.req_id, &t, &env), 0);
  assert_int_equal(gn_transport_send(W.req_tp, W.prov_id->pk, env.data, env.len), 0);
  assert_true(wait_msg(GN_MSG_LEASE_REJECT, 5000, &m));
  assert_non_null(strstr(reason_of(&m), "SIMULATED"));
  gn_buf_done(&m.raw);
  gn_buf_done(&env);
}

static void test_provider_never_leases_a_gpu_twice(void **state) {
  (void)state;
  /* The daemon has two simulated GPUs: two leases take both, a third
   * request must be refused, naming how many are free. */
  gn_agreement a1, a2;
  gn_lease_terms t;
  gn_buf env = {0};
  msg m;
  rent(&a1, NULL);
  rent(&a2, NULL);
  assert_string_not_equal(a1.gpus[0], a2.gpus[0]);
  terms_for(&t, 1, true);
  assert_int_equal(gn_lease_request_seal(W.req_id, &t, &env), 0);
  assert_int_equal(gn_transport_send(W.req_tp, W.prov_id->pk, env.data, env.len), 0);
  assert_true(wait_msg(GN_MSG_LEASE_REJECT, 5000, &m));
  assert_non_null(strstr(reason_of(&m), "0 of 2 are free"));
  gn_buf_done(&m.raw);
  gn_buf_done(&env);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_provider_accepts_a_manifest_once_and_refuses_its_replay, setup, teardown),
      cmocka_unit_test_setup_teardown(test_provider_rejects_expired_manifest, setup, teardown),
      cmocka_unit_test_setup_teardown(test_provider_rejects_manifest_from_someone_else, setup, teardown),
      cmocka_unit_test_setup_teardown(test_provider_rejects_unpinned_image, setup, teardown),
      cmocka_unit_test_setup_teardown(test_provider_drops_forged_signature, setup, teardown),
      cmocka_unit_test_setup_teardown(test_provider_rejects_job_on_released_lease_and_invoices_it, setup, teardown),
      cmocka_unit_test_setup_teardown(test_provider_refuses_simulated_gpu_to_unknowing_requester, setup, teardown),
      cmocka_unit_test_setup_teardown(test_provider_never_leases_a_gpu_twice, setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
