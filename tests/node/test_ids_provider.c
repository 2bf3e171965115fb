/* A hostile lease holder names its jobs so their paths climb out of the
 * provider's run directory: a real gpunetd provider with a simulated GPU,
 * this test as the requester over real Noise sessions. An earlier job's
 * bundle directory (run/bundle-x) is in place, so before ids were checked a
 * job named "x/../.." resolved to the data directory itself, and the cleanup
 * after its failed pull deleted it recursively. Each such manifest must now
 * be refused, and the data directory and a canary beside it survive. */
#include <gpunet/billing.h>
#include <gpunet/identity.h>
#include <gpunet/transport.h>
#include <gpunet/wire.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
/* cmocka needs the above first. */
#include <cmocka.h>

#include <arpa/inet.h>
#include <limits.h>
#include <netinet/in.h>
#include <signal.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#define PINNED "127.0.0.1:9/none/busybox@sha256:0000000000000000000000000000000000000000000000000000000000000000"

typedef struct msg {
  uint32_t type;
  gn_buf raw;
} msg;

static struct world {
  char top[64];  /* holds data/ and the canary beside it */
  char dir[128]; /* the provider's data dir */
  char addr[64];
  pid_t daemon;
  uv_loop_t loop;
  gn_identity *prov_id, *req_id;
  gn_transport *tp;
  int up;
  msg inbox[64];
  size_t inbox_n;
} W;

static void on_up(gn_transport *t, const uint8_t peer[GN_PK_LEN], const char *addr, void *ud) {
  (void)t, (void)peer, (void)addr, (void)ud;
  W.up = 1;
}

static void on_down(gn_transport *t, const uint8_t peer[GN_PK_LEN], void *ud) {
  (void)t, (void)peer, (void)ud;
  W.up = 0;
}

static void on_msg(gn_transport *t, const uint8_t peer[GN_PK_LEN], const gn_envelope *env, const uint8_t *raw,
                   size_t len, void *ud) {
  (void)t, (void)peer, (void)ud;
  if (env->type < 10 || W.inbox_n >= GN_ARRAY_SIZE(W.inbox))
    return; /* discovery traffic */
  msg *m = &W.inbox[W.inbox_n++];
  memset(m, 0, sizeof *m);
  m->type = env->type;
  gn_buf_append(&m->raw, raw, len);
}

static void on_timer(uv_timer_t *t) {
  (void)t;
}

/* Runs the loop until a message of type arrives (returned, the caller frees
 * raw) or timeout_ms passes (0). */
static int wait_msg(uint32_t type, uint64_t timeout_ms, msg *ret) {
  uv_timer_t t;
  uv_timer_init(&W.loop, &t);
  uv_timer_start(&t, on_timer, 20, 20);
  uint64_t end = gn_mono_ms() + timeout_ms;
  int found = 0;
  while (!found && gn_mono_ms() < end) {
    uv_run(&W.loop, UV_RUN_ONCE);
    for (size_t i = 0; i < W.inbox_n && !found; i++) {
      if (W.inbox[i].type != type)
        continue;
      *ret = W.inbox[i];
      memmove(&W.inbox[i], &W.inbox[i + 1], (W.inbox_n - i - 1) * sizeof W.inbox[0]);
      W.inbox_n--;
      found = 1;
    }
  }
  uv_timer_stop(&t);
  uv_close((uv_handle_t *)&t, NULL);
  uv_run(&W.loop, UV_RUN_NOWAIT);
  return found;
}

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

static void write_file(const char *path, const char *text) {
  FILE *f = fopen(path, "w");
  assert_non_null(f);
  fputs(text, f);
  fclose(f);
}

static bool file_says(const char *path, const char *text) {
  char buf[256] = "";
  FILE *f = fopen(path, "r");
  if (!f)
    return false;
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  buf[n] = 0;
  fclose(f);
  return strcmp(buf, text) == 0;
}

static int setup(void **state) {
  (void)state;
  char path[PATH_MAX + 64], bin[PATH_MAX];
  memset(&W, 0, sizeof W);
  const char *bd = getenv("GN_BUILD_DIR");
  assert_non_null(bd);
  snprintf(bin, sizeof bin, "%s/gpunetd", bd);
  snprintf(W.top, sizeof W.top, "/tmp/gn-ids-prov-XXXXXX");
  assert_non_null(mkdtemp(W.top));
  snprintf(W.dir, sizeof W.dir, "%s/data", W.top);
  assert_int_equal(mkdir(W.dir, 0700), 0);
  snprintf(path, sizeof path, "%s/canary", W.top);
  write_file(path, "canary\n");
  snprintf(path, sizeof path, "%s/identity.key", W.dir);
  assert_int_equal(gn_identity_generate(&W.prov_id), 0);
  assert_int_equal(gn_identity_save(W.prov_id, path), 0);
  snprintf(W.addr, sizeof W.addr, "127.0.0.1:%d", free_port());
  W.daemon = fork();
  assert_true(W.daemon >= 0);
  if (W.daemon == 0) {
    snprintf(path, sizeof path, "%s/gpunetd.log", W.top);
    if (!freopen(path, "w", stderr))
      _exit(127);
    execl(bin, bin, "--data-dir", W.dir, "--listen", W.addr, "--provide", "--simulate-gpu", "RTX 4090", "--price",
          "0.40", "--max-hours", "2",
          /* Isolation is not what this tests, and not every host has it. */
          "--allow-no-userns", (char *)NULL);
    _exit(127);
  }
  uv_loop_init(&W.loop);
  gn_transport_cbs cbs = {on_up, on_down, on_msg};
  assert_int_equal(gn_identity_generate(&W.req_id), 0);
  assert_int_equal(gn_transport_new(&W.loop, W.req_id, &cbs, NULL, &W.tp), 0);
  for (int i = 0; i < 50 && !W.up; i++) {
    usleep(100000);
    gn_transport_connect(W.tp, W.addr);
    uint64_t end = gn_mono_ms() + 300;
    uv_timer_t t;
    uv_timer_init(&W.loop, &t);
    uv_timer_start(&t, on_timer, 20, 20);
    while (!W.up && gn_mono_ms() < end)
      uv_run(&W.loop, UV_RUN_ONCE);
    uv_timer_stop(&t);
    uv_close((uv_handle_t *)&t, NULL);
    uv_run(&W.loop, UV_RUN_NOWAIT);
  }
  if (!W.up) {
    snprintf(path, sizeof path, "tail -n 20 %s/gpunetd.log >&2", W.top);
    if (system(path) != 0)
      print_message("no daemon log\n");
  }
  assert_true(W.up);
  /* What an earlier, still running job "x" has: its bundle directory (made
   * now: the daemon clears leftover bundles when it starts). */
  snprintf(path, sizeof path, "%s/run/bundle-x", W.dir);
  assert_int_equal(mkdir(path, 0700), 0);
  return 0;
}

static void closed(void *ud) {
  (void)ud;
}

static int teardown(void **state) {
  (void)state;
  gn_transport_close(W.tp, closed, NULL);
  uv_run(&W.loop, UV_RUN_DEFAULT);
  uv_loop_close(&W.loop);
  kill(W.daemon, SIGTERM);
  int status = 0;
  waitpid(W.daemon, &status, 0);
  for (size_t i = 0; i < W.inbox_n; i++)
    gn_buf_done(&W.inbox[i].raw);
  W.prov_id = gn_identity_free(W.prov_id);
  W.req_id = gn_identity_free(W.req_id);
  char cmd[PATH_MAX + 16];
  snprintf(cmd, sizeof cmd, "rm -rf %s", W.top);
  return system(cmd) == 0 ? 0 : -1;
}

static void field_of(const msg *m, const char *key, char *out, size_t cap) {
  gn_envelope env;
  gn_wire_doc doc;
  out[0] = 0;
  if (gn_envelope_open(m->raw.data, m->raw.len, &env) == 0 && gn_wire_decode(env.body, env.body_len, &doc) == 0) {
    gn_wire_get_str(doc.root, key, out, cap);
    gn_wire_doc_done(&doc);
  }
}

static void rent(gn_agreement *ret_ag) {
  gn_lease_terms t;
  gn_buf env = {0};
  msg m;
  gn_lease_terms_init(&t);
  memcpy(t.provider, W.prov_id->pk, GN_PK_LEN);
  memcpy(t.requester, W.req_id->pk, GN_PK_LEN);
  snprintf(t.offer_id, sizeof t.offer_id, "o-test");
  snprintf(t.gpu_model, sizeof t.gpu_model, "NVIDIA GeForce RTX 4090");
  t.count = 1;
  t.price_uper_hour = 400000;
  snprintf(t.currency, sizeof t.currency, "EUR");
  t.max_s = 3600;
  t.interval_s = 60;
  t.requested_s = gn_unix_s();
  t.simulated = true;
  assert_int_equal(gn_lease_request_seal(W.req_id, &t, &env), 0);
  assert_int_equal(gn_transport_send(W.tp, W.prov_id->pk, env.data, env.len), 0);
  gn_buf_done(&env);
  assert_true(wait_msg(GN_MSG_LEASE_ACCEPT, 5000, &m));
  assert_int_equal(gn_agreement_open(m.raw.data, m.raw.len, ret_ag), 0);
  gn_buf_done(&m.raw);
}

/* A signed manifest naming any job id (what a hostile requester can send). */
static void manifest_env(const char *job_id, const char *lease_id, gn_buf *ret) {
  uint8_t nonce[16];
  randombytes_buf(nonce, sizeof nonce);
  gn_wire_writer w;
  gn_wire_writer_init(&w);
  gn_wire_put_map(&w, 12);
  gn_wire_put_str(&w, "job_id");
  gn_wire_put_str(&w, job_id);
  gn_wire_put_str(&w, "lease_id");
  gn_wire_put_str(&w, lease_id);
  gn_wire_put_str(&w, "image");
  gn_wire_put_str(&w, PINNED);
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
  gn_wire_put_i64(&w, gn_unix_s() + 120);
  gn_wire_put_str(&w, "v");
  gn_wire_put_u64(&w, GN_PROTO_VERSION);
  gn_buf body = {0};
  assert_int_equal(gn_wire_writer_take(&w, &body), 0);
  gn_wire_writer_done(&w);
  assert_int_equal(gn_envelope_seal(W.req_id, GN_MSG_JOB_MANIFEST, body.data, body.len, ret), 0);
  gn_buf_done(&body);
}

/* Sends the manifest and returns the state of the provider's first answer
 * ("rejected", "pulling"...), waiting up to wait_end_ms more for the job to
 * reach an end state if it was taken. */
static void send_job(const char *job_id, const char *lease_id, char *state, size_t cap, uint64_t wait_end_ms) {
  gn_buf env = {0};
  msg m;
  manifest_env(job_id, lease_id, &env);
  assert_int_equal(gn_transport_send(W.tp, W.prov_id->pk, env.data, env.len), 0);
  gn_buf_done(&env);
  if (!wait_msg(GN_MSG_JOB_STATUS, 5000, &m))
    fail_msg("no answer to a manifest for job '%s'", job_id);
  field_of(&m, "state", state, cap);
  gn_buf_done(&m.raw);
  if (strcmp(state, "rejected") == 0)
    return;
  char last[32] = "";
  uint64_t end = gn_mono_ms() + wait_end_ms;
  while (gn_mono_ms() < end && strcmp(last, "failed") && strcmp(last, "exited") && strcmp(last, "rejected")) {
    if (!wait_msg(GN_MSG_JOB_STATUS, end - gn_mono_ms(), &m))
      break;
    field_of(&m, "state", last, sizeof last);
    gn_buf_done(&m.raw);
  }
}

static void assert_provider_files_intact(void) {
  char path[PATH_MAX + 64];
  struct stat st;
  snprintf(path, sizeof path, "%s/canary", W.top);
  if (!file_says(path, "canary\n"))
    fail_msg("the canary beside the data dir is gone or changed");
  snprintf(path, sizeof path, "%s/identity.key", W.dir);
  if (stat(path, &st) != 0)
    fail_msg("the provider's identity.key is gone");
  snprintf(path, sizeof path, "%s/run/bundle-x", W.dir);
  if (stat(path, &st) != 0 || !S_ISDIR(st.st_mode))
    fail_msg("the earlier job's bundle directory is gone");
  snprintf(path, sizeof path, "%s/gpunet.db", W.dir);
  if (stat(path, &st) != 0)
    fail_msg("the provider's database is gone");
}

static void test_provider_refuses_job_ids_that_climb_out(void **state) {
  (void)state;
  gn_agreement ag;
  rent(&ag);
  static const char *const ids[] = {"x/../..", "x/../../..", "..", "../../x", "a/b", ".", "x\n", "-x", "j-1 x"};
  for (size_t i = 0; i < GN_ARRAY_SIZE(ids); i++) {
    char st[32];
    send_job(ids[i], ag.terms.lease_id, st, sizeof st, 10000);
    if (strcmp(st, "rejected") != 0)
      fail_msg("job id '%s' was taken (%s)", ids[i], st);
    assert_provider_files_intact();
  }
  /* A well-named job still runs its course: taken, then failed on the
   * unreachable registry, and its own bundle is cleaned up. */
  char st[32];
  send_job("j-0123456789ab", ag.terms.lease_id, st, sizeof st, 10000);
  if (strcmp(st, "rejected") == 0)
    fail_msg("a valid job id was refused");
  assert_provider_files_intact();
  assert_int_equal(kill(W.daemon, 0), 0); /* still serving */
}

int main(void) {
  if (!getenv("GN_BUILD_DIR")) {
    print_message("GN_BUILD_DIR not set (run through ctest): skipped\n");
    return 77;
  }
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_provider_refuses_job_ids_that_climb_out, setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
