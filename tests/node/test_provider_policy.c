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

#include <curl/curl.h>
#include <fcntl.h>
#include <jansson.h>
#include <limits.h>
#include <sched.h>
#include <signal.h>
#include <sodium.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/mount.h>
#include <errno.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "node/helpers.h"
#include "sandbox/helpers.h"

typedef tn_msg msg;

typedef struct world {
  char dir[PATH_MAX];
  char addr[64];
  pid_t daemon;
  uv_loop_t loop;
  gn_identity *prov_id;
  gn_identity *req_id, *other_id;
  gn_transport *req_tp, *other_tp;
  int up_req, up_other;
  tn_inbox in;
  tn_link link_req, link_other;
  /* Set before setup by the tests that need them. */
  const char *extra[16]; /* more gpunetd flags */
  bool hide_cgroups;     /* the daemon sees an empty /sys/fs/cgroup (a host without controllers) */
  bool hide_failed;      /* ...which this kernel would not allow */
  int hang_fd;           /* a registry that accepts and never answers */
  int hang_port;
} world;

static world W;

/* Runs the loop until a message of `type` arrives (returns it, removed from
 * the inbox; the caller frees raw) or timeout_ms passes (returns 0). */
static int wait_msg(uint32_t type, uint64_t timeout_ms, msg *ret) {
  return tn_wait_msg(&W.loop, &W.in, type, NULL, NULL, timeout_ms, ret);
}

static void run_until(int *flag, uint64_t timeout_ms) {
  tn_run_until_flag(&W.loop, flag, timeout_ms);
}

static void start_daemon(void) {
  char bin[PATH_MAX];
  tn_gpunetd_path(bin, sizeof bin);
  tn_identity_for(W.dir, &W.prov_id);
  snprintf(W.addr, sizeof W.addr, "127.0.0.1:%d", tn_free_port());
  W.daemon = fork();
  assert_true(W.daemon >= 0);
  if (W.daemon == 0) {
    char log[PATH_MAX + 32];
    snprintf(log, sizeof log, "%s/gpunetd.log", W.dir);
    if (!freopen(log, "w", stderr))
      _exit(127);
    /* Its own uid slot table: other tests' daemons running at once on this
     * host would otherwise take the slots these tests expect free. */
    char slots[PATH_MAX + 32];
    snprintf(slots, sizeof slots, "%s/uid-slots", W.dir);
    setenv("GN_UID_SLOT_DIR", slots, 1);
    /* A host whose cgroups have no controllers: a private mount namespace
     * with an empty tmpfs on /sys/fs/cgroup (real, not a fake answer). */
    if (W.hide_cgroups && (unshare(CLONE_NEWNS) < 0 || mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) < 0 ||
                           mount("tmpfs", "/sys/fs/cgroup", "tmpfs", 0, "size=1m") < 0))
      _exit(99);
    const char *args[48] = {bin,
                            "--data-dir",
                            W.dir,
                            "--listen",
                            W.addr,
                            "--provide",
                            "--simulate-gpu",
                            "RTX 4090",
                            "--simulate-gpu",
                            "RTX 4090",
                            "--price",
                            "0.40",
                            "--max-hours",
                            "2",
                            "--allow-no-userns"};
    size_t n = 15;
    for (size_t i = 0; i < GN_ARRAY_SIZE(W.extra) && W.extra[i]; i++)
      args[n++] = W.extra[i];
    args[n] = NULL;
    execv(bin, (char *const *)args);
    _exit(127);
  }
}

static char private_parent[PATH_MAX]; /* set non-empty before setup: see setup_private_parent */

static int setup(void **state) {
  (void)state;
  const char *extra[GN_ARRAY_SIZE(W.extra)];
  memcpy(extra, W.extra, sizeof extra);
  bool hide = W.hide_cgroups;
  int hang_fd = W.hang_fd, hang_port = W.hang_port;
  memset(&W, 0, sizeof W);
  memcpy(W.extra, extra, sizeof extra);
  W.hide_cgroups = hide;
  W.hang_fd = hang_fd;
  W.hang_port = hang_port;
  snprintf(W.dir, sizeof W.dir, "/tmp/gn-policy-XXXXXX");
  assert_non_null(mkdtemp(W.dir));
  if (private_parent[0]) { /* the data dir one level down, under a 0700 directory */
    snprintf(private_parent, sizeof private_parent, "%s", W.dir);
    strcat(W.dir, "/data");
    assert_int_equal(mkdir(W.dir, 0700), 0);
  }
  start_daemon();
  uv_loop_init(&W.loop);
  W.link_req = (tn_link){&W.up_req, &W.in, NULL};
  W.link_other = (tn_link){&W.up_other, &W.in, NULL};
  tn_peer_new(&W.loop, &W.link_req, &W.req_id, &W.req_tp);
  tn_peer_new(&W.loop, &W.link_other, &W.other_id, &W.other_tp);
  /* The daemon needs a moment to listen; retry the connection. */
  for (int i = 0; i < 50 && !(W.up_req && W.up_other); i++) {
    usleep(100000);
    int status;
    if (W.hide_cgroups && waitpid(W.daemon, &status, WNOHANG) == W.daemon) {
      W.daemon = 0;
      W.hide_failed = WIFEXITED(status) && WEXITSTATUS(status) == 99;
      return 0; /* the test skips, saying why */
    }
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

static int teardown(void **state) {
  (void)state;
  gn_transport *tps[] = {W.req_tp, W.other_tp};
  int rc = tn_world_end(&W.loop, tps, GN_ARRAY_SIZE(tps), W.daemon, &W.in, W.dir);
  memset(W.extra, 0, sizeof W.extra);
  W.hide_cgroups = false;
  if (W.hang_fd > 0)
    close(W.hang_fd);
  W.hang_fd = 0;
  W.prov_id = gn_identity_free(W.prov_id);
  W.req_id = gn_identity_free(W.req_id);
  W.other_id = gn_identity_free(W.other_id);
  return rc;
}

/* --- helpers speaking the protocol -----------------------------------------*/

static void terms_for(gn_lease_terms *t, uint32_t count, bool simulated) {
  tn_lease_terms(t, W.prov_id, W.req_id, count, simulated);
}

static char *reason_of(const msg *m) {
  static char reason[256];
  tn_msg_str(m, "reason", reason, sizeof reason);
  return reason;
}

static char *state_of(const msg *m) {
  static char state[32];
  tn_msg_str(m, "state", state, sizeof state);
  return state;
}

/* Runs the loop until the provider reports job in state (any state when
 * NULL): tn_wait_job_status on the requester's inbox. */
static bool wait_status(const char *job, const char *state, uint64_t timeout_ms, char *ret_state, char *ret_reason) {
  return tn_wait_job_status(&W.loop, &W.in, job, state, timeout_ms, ret_state, ret_reason);
}

static void rent(gn_agreement *ret_ag, gn_buf *ret_env) {
  gn_lease_terms t;
  terms_for(&t, 1, true);
  tn_rent(&W.loop, &W.in, W.req_tp, W.req_id, W.prov_id, &t, ret_ag, ret_env);
}

/* The command of the manifests sent next ("true" when manifest_cmd[0] is
 * NULL); NULL-terminated (the ninth is always NULL). */
static const char *manifest_cmd[9];

/* A manifest asking for memory_mib and pids; the job id goes to ret_job
 * (32 bytes) when not NULL. */
static void manifest_env_ex(const gn_identity *signer, const char *lease_id, const char *image, int64_t expires_delta,
                            uint64_t memory_mib, uint64_t pids, char *ret_job, gn_buf *ret) {
  char job[32];
  tn_job_id(job, sizeof job);
  if (ret_job)
    snprintf(ret_job, 32, "%s", job);
  tn_manifest m = {.job_id = job,
                   .lease_id = lease_id,
                   .image = image,
                   .cmd = manifest_cmd[0] ? manifest_cmd : NULL,
                   .memory_mib = memory_mib,
                   .pids = pids,
                   .issued_s = gn_unix_s(),
                   .expires_s = gn_unix_s() + expires_delta};
  gn_buf body = {0};
  tn_manifest_body(&m, &body);
  assert_int_equal(gn_envelope_seal(signer, GN_MSG_JOB_MANIFEST, body.data, body.len, ret), 0);
  gn_buf_done(&body);
}

static void manifest_env(const gn_identity *signer, const char *lease_id, const char *image, int64_t expires_delta,
                         gn_buf *ret) {
  manifest_env_ex(signer, lease_id, image, expires_delta, 64, 16, NULL, ret);
}

#define PINNED "127.0.0.1:9/none/busybox@sha256:0000000000000000000000000000000000000000000000000000000000000000"
#define ZERO_DIGEST "@sha256:0000000000000000000000000000000000000000000000000000000000000000"

/* Sends a manifest and waits for the provider's first answer about it:
 * "pulling" when accepted, "rejected" (its reason in ret_reason) when not. */
static void send_job(const char *lease_id, const char *image, uint64_t memory_mib, uint64_t pids, char *ret_job,
                     char *ret_state, char *ret_reason) {
  gn_buf env = {0};
  char job[32];
  manifest_env_ex(W.req_id, lease_id, image, 120, memory_mib, pids, job, &env);
  assert_int_equal(gn_transport_send(W.req_tp, W.prov_id->pk, env.data, env.len), 0);
  gn_buf_done(&env);
  assert_true(wait_status(job, NULL, 5000, ret_state, ret_reason));
  if (ret_job)
    snprintf(ret_job, 32, "%s", job);
}

static void send_stop(const char *lease_id, const char *job_id) {
  gn_buf env = {0};
  tn_job_stop_seal(W.req_id, lease_id, job_id, &env);
  assert_int_equal(gn_transport_send(W.req_tp, W.prov_id->pk, env.data, env.len), 0);
  gn_buf_done(&env);
}

static void send_release(const char *lease_id) {
  tn_send_lease_end(W.req_tp, W.req_id, GN_MSG_LEASE_RELEASE, lease_id, "test", W.prov_id->pk);
}

/* A registry on loopback that takes connections and never answers: a pull
 * from it stays in progress until cancelled. */
static void hanging_registry(void) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t len = sizeof a;
  assert_true(fd >= 0);
  assert_int_equal(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
  assert_int_equal(listen(fd, 64), 0);
  assert_int_equal(getsockname(fd, (struct sockaddr *)&a, &len), 0);
  W.hang_fd = fd;
  W.hang_port = ntohs(a.sin_port);
}

static void hanging_image(char *buf, size_t cap) {
  snprintf(buf, cap, "127.0.0.1:%d/slow/image%s", W.hang_port, ZERO_DIGEST);
}

/* The host's RAM as gpunetd counts it, in MiB. */
static uint64_t host_ram_mib(void) {
  return ((uint64_t)sysconf(_SC_PHYS_PAGES) * (uint64_t)sysconf(_SC_PAGESIZE)) >> 20;
}

/* GET path on the daemon's control socket, parsed. */
static json_t *api_get(const char *path) {
  return tn_api_get(W.dir, path);
}

/* The host uid range the provider's log gives lease_id ("lease L: its jobs
 * run as host uids and gids A-B"). */
static bool lease_uid_range(const char *lease_id, unsigned long *ret_lo, unsigned long *ret_hi) {
  char path[PATH_MAX + 32], line[1024], pat[128];
  snprintf(path, sizeof path, "%s/gpunetd.log", W.dir);
  snprintf(pat, sizeof pat, "lease %s: its jobs run as host uids and gids ", lease_id);
  for (int tries = 0; tries < 50; tries++) {
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    bool found = false;
    while (!found && fgets(line, sizeof line, f)) {
      char *p = strstr(line, pat);
      found = p && sscanf(p + strlen(pat), "%lu-%lu", ret_lo, ret_hi) == 2;
    }
    fclose(f);
    if (found)
      return true;
    usleep(100000);
  }
  return false;
}

static void expect_job_rejected(gn_transport *tp, const gn_buf *env, const char *reason_part) {
  msg m;
  assert_int_equal(gn_transport_send(tp, W.prov_id->pk, env->data, env->len), 0);
  /* An earlier job of the test may report its end (its pull fails at once)
   * before the answer to this one. */
  do {
    assert_true(wait_msg(GN_MSG_JOB_STATUS, 5000, &m));
    if (strcmp(state_of(&m), "failed") != 0)
      break;
    gn_buf_done(&m.raw);
  } while (true);
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

/* Rents a GPU, then sends a manifest for it signed by signer over tp (an
 * image, expiring expires_delta s from now) that must be rejected for part. */
static void rent_and_expect_rejected(const gn_identity *signer, gn_transport *tp, const char *image,
                                     int64_t expires_delta, const char *part) {
  gn_agreement ag;
  gn_buf env = {0};
  rent(&ag, NULL);
  manifest_env(signer, ag.terms.lease_id, image, expires_delta, &env);
  expect_job_rejected(tp, &env, part);
  gn_buf_done(&env);
}

static void test_provider_rejects_expired_manifest(void **state) {
  (void)state;
  rent_and_expect_rejected(W.req_id, W.req_tp, PINNED, -10, "expired");
}

static void test_provider_rejects_manifest_from_someone_else(void **state) {
  (void)state;
  rent_and_expect_rejected(W.other_id, W.other_tp, PINNED, 120, "not signed by the lease holder");
}

static void test_provider_rejects_unpinned_image(void **state) {
  (void)state;
  rent_and_expect_rejected(W.req_id, W.req_tp, "127.0.0.1:9/none/busybox:latest", 120, "pinned");
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
  send_release(ag.terms.lease_id);
  assert_true(wait_msg(GN_MSG_INVOICE, 5000, &m));
  uint64_t observed = (gn_mono_ms() - t0) / 1000;
  /* The requester machine's check: no debit note was accepted (this
   * requester answers none), so the final invoice continues the genesis
   * head, within what was observed plus the tolerance of the rule. */
  gn_bill_head head, fin;
  gn_bill_note inv;
  char reason[512] = "";
  const uint64_t tol = gn_bill_tolerance_s(observed);
  assert_int_equal(gn_bill_head_init(agreement.data, agreement.len, &head), 0);
  int r = gn_bill_invoice_check(m.raw.data, m.raw.len, agreement.data, agreement.len, &head, observed, tol, 0, &fin,
                                &inv, reason, sizeof reason);
  if (r != 0)
    fail_msg("final invoice does not check: %s", reason);
  assert_true(inv.final);
  assert_int_equal(inv.seq, 0);
  assert_int_equal(inv.from, 1);
  assert_true(inv.seconds >= 1 && inv.seconds <= observed + tol);
  assert_int_equal(inv.gpu_seconds, inv.seconds); /* 1 GPU every second */
  assert_int_equal(inv.total_micro, gn_price_cost(400000, 1, inv.seconds));
  assert_true(inv.end_reason[0] != 0);
  gn_buf_done(&m.raw);

  manifest_env(W.req_id, ag.terms.lease_id, PINNED, 120, &env);
  expect_job_rejected(W.req_tp, &env, "not active");
  gn_buf_done(&env);
  gn_buf_done(&agreement);
}

/* Requests t and expects a LEASE_REJECT within 5 s whose reason has part. */
static void expect_lease_reject(const gn_lease_terms *t, const char *part) {
  gn_buf env = {0};
  msg m;
  assert_int_equal(gn_lease_request_seal(W.req_id, t, &env), 0);
  assert_int_equal(gn_transport_send(W.req_tp, W.prov_id->pk, env.data, env.len), 0);
  assert_true(wait_msg(GN_MSG_LEASE_REJECT, 5000, &m));
  if (!strstr(reason_of(&m), part))
    fail_msg("lease %s refused for '%s', not for '%s'", t->lease_id, reason_of(&m), part);
  gn_buf_done(&m.raw);
  gn_buf_done(&env);
}

static void test_provider_refuses_simulated_gpu_to_unknowing_requester(void **state) {
  (void)state;
  gn_lease_terms t;
  terms_for(&t, 1, false);
  expect_lease_reject(&t, "SIMULATED");
}

static void test_provider_never_leases_a_gpu_twice(void **state) {
  (void)state;
  /* The daemon has two simulated GPUs: two leases take both, a third
   * request must be refused, naming how many are free. */
  gn_agreement a1, a2;
  gn_lease_terms t;
  rent(&a1, NULL);
  rent(&a2, NULL);
  assert_string_not_equal(a1.gpus[0], a2.gpus[0]);
  terms_for(&t, 1, true);
  expect_lease_reject(&t, "0 of 2 are free");
}

/* --- budgets, isolation and the loop ----------------------------------------*/

static int setup_budget(void **state) {
  hanging_registry();
  const char *extra[] = {"--registry-allow", "127.0.0.1", "--job-memory-share",        "0.01",
                         "--job-pids-max",   "100",       "--allow-unenforced-limits", NULL};
  memcpy(W.extra, extra, sizeof extra);
  return setup(state);
}

/* Whether the provider's status says it gives jobs user namespaces. */
static bool status_userns(void) {
  json_t *st = api_get("/v1/status");
  json_t *iso = json_object_get(st, "isolation");
  if (!iso)
    fail_msg("status has no isolation object");
  bool v = json_is_true(json_object_get(iso, "user_namespaces"));
  json_decref(st);
  return v;
}

static uint64_t status_u64(const char *key) {
  json_t *st = api_get("/v1/status");
  json_t *iso = json_object_get(st, "isolation");
  if (!iso)
    fail_msg("status has no isolation object");
  uint64_t v = (uint64_t)json_integer_value(json_object_get(iso, key));
  json_decref(st);
  return v;
}

/* Jobs of two leases whose memory adds past the provider's budget: the
 * second is refused, saying so; once the first is stopped, its memory is
 * free again. */
static void test_provider_refuses_a_job_past_the_memory_budget(void **state) {
  (void)state;
  gn_agreement a, b;
  char image[256], job1[32], job3[32], st[32], reason[256];
  hanging_image(image, sizeof image);
  rent(&a, NULL);
  rent(&b, NULL);
  uint64_t budget = status_u64("memory_budget_mib");
  assert_int_equal(budget, (uint64_t)((double)host_ram_mib() * 0.01));
  uint64_t ask = budget * 6 / 10 + 1;
  send_job(a.terms.lease_id, image, ask, 16, job1, st, NULL);
  assert_string_equal(st, "pulling");
  assert_int_equal(status_u64("memory_used_mib"), ask);
  send_job(b.terms.lease_id, image, ask, 16, NULL, st, reason);
  assert_string_equal(st, "rejected");
  if (!strstr(reason, "MiB of memory") || !strstr(reason, "budget"))
    fail_msg("reason '%s' does not name the memory budget", reason);
  /* Stopping the first cancels its pull (the registry never answers) and
   * gives its memory back. */
  uint64_t t0 = gn_mono_ms();
  send_stop(a.terms.lease_id, job1);
  assert_true(wait_status(job1, "stopped", 5000, NULL, NULL));
  assert_true(gn_mono_ms() - t0 < 3000);
  for (int i = 0; i < 50 && status_u64("memory_used_mib") != 0; i++)
    run_until(&(int){0}, 100);
  assert_int_equal(status_u64("memory_used_mib"), 0);
  send_job(b.terms.lease_id, image, ask, 16, job3, st, NULL);
  assert_string_equal(st, "pulling");
}

static void test_provider_refuses_a_job_past_the_pids_budget(void **state) {
  (void)state;
  gn_agreement a, b;
  char image[256], st[32], reason[256];
  hanging_image(image, sizeof image);
  rent(&a, NULL);
  rent(&b, NULL);
  send_job(a.terms.lease_id, image, 16, 64, NULL, st, NULL);
  assert_string_equal(st, "pulling");
  send_job(b.terms.lease_id, image, 16, 64, NULL, st, reason);
  assert_string_equal(st, "rejected");
  if (!strstr(reason, "64 processes") || !strstr(reason, "36 of this provider's 100"))
    fail_msg("reason '%s' does not name the process budget", reason);
}

/* SIGTERM ends the daemon within seconds even while a pull runs that would
 * otherwise wait on the registry for minutes. */
static void test_sigterm_ends_the_daemon_during_a_pull(void **state) {
  (void)state;
  gn_agreement a;
  char image[256], st[32], job[32];
  hanging_image(image, sizeof image);
  rent(&a, NULL);
  send_job(a.terms.lease_id, image, 16, 16, job, st, NULL);
  assert_string_equal(st, "pulling");
  assert_false(wait_status(job, NULL, 1000, NULL, NULL)); /* still pulling a second later */
  uint64_t t0 = gn_mono_ms();
  kill(W.daemon, SIGTERM);
  int status = 0;
  pid_t r = 0;
  while ((r = waitpid(W.daemon, &status, WNOHANG)) == 0 && gn_mono_ms() - t0 < 15000)
    usleep(50000);
  uint64_t took = gn_mono_ms() - t0;
  if (r == W.daemon)
    W.daemon = 0;
  if (r != 0 && took < 5000 && WIFEXITED(status) && WEXITSTATUS(status) == 0)
    return;
  fail_msg("gpunetd took %llu ms to end after SIGTERM during a pull (status %d)", (unsigned long long)took, status);
}

/* Counts the connections the hanging registry has taken so far (it
 * accepts them and never answers). */
static int accepted[64];
static size_t accepted_n;

static size_t hanging_accept(void) {
  for (;;) {
    int fd = accept4(W.hang_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0)
      break;
    if (accepted_n < GN_ARRAY_SIZE(accepted))
      accepted[accepted_n++] = fd;
    else
      close(fd);
  }
  return accepted_n;
}

/* Of the accepted connections, those the provider still holds open (one
 * per running pull; a pull that retried or was stopped has closed its
 * earlier one). */
static size_t hanging_live(void) {
  size_t live = 0;
  hanging_accept();
  for (size_t i = 0; i < accepted_n; i++) {
    char c;
    ssize_t n = recv(accepted[i], &c, 1, MSG_PEEK | MSG_DONTWAIT);
    if (n > 0 || (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))) /* its request, or nothing yet */
      live++;
  }
  return live;
}

/* Six jobs pulling from a registry that never answers: four pulls run, two
 * wait, so the thread pool keeps threads for everything else; stopping one
 * lets the next start. */
static void test_provider_runs_at_most_four_pulls_at_once(void **state) {
  (void)state;
  gn_agreement a, b;
  char image[256], st[32], jobs[6][32];
  hanging_image(image, sizeof image);
  int fl = fcntl(W.hang_fd, F_GETFL);
  fcntl(W.hang_fd, F_SETFL, fl | O_NONBLOCK);
  accepted_n = 0;
  rent(&a, NULL);
  rent(&b, NULL);
  for (int i = 0; i < 6; i++) {
    send_job(i < 3 ? a.terms.lease_id : b.terms.lease_id, image, 16, 8, jobs[i], st, NULL);
    assert_string_equal(st, "pulling");
  }
  for (int i = 0; i < 30; i++) {
    hanging_accept();
    run_until(&(int){0}, 100);
  }
  size_t first = hanging_live();
  send_stop(a.terms.lease_id, jobs[0]);
  assert_true(wait_status(jobs[0], "stopped", 5000, NULL, NULL));
  for (int i = 0; i < 20; i++) {
    hanging_accept();
    run_until(&(int){0}, 100);
  }
  size_t then = hanging_live(), total = accepted_n;
  for (size_t i = 0; i < accepted_n; i++)
    close(accepted[i]);
  accepted_n = 0;
  /* Counted as connections held open, not connections made: under load a
   * pull may retry its connection, which must not read as a fifth pull. The stopped pull's connection may still be open
   * for a moment (at most 5 then), but never a sixth pull. */
  if (first != 4 || then < 4 || then > 5 || total < 5)
    fail_msg("%zu pulls ran at once (want 4), %zu connections open after one stopped and the next started "
             "(want 4 or 5; %zu made in all, want at least 5)",
             first, then, total);
}

/* Two leases at once never share a host uid; a released lease's range can
 * go to a later lease. */
static void test_provider_gives_each_lease_its_own_uid_range(void **state) {
  (void)state;
  if (!status_userns())
    skip(); /* this host cannot run user-namespaced containers; the daemon says why in its status */
  gn_agreement a, b, c;
  unsigned long alo, ahi, blo, bhi, clo, chi;
  rent(&a, NULL);
  rent(&b, NULL);
  assert_true(lease_uid_range(a.terms.lease_id, &alo, &ahi));
  assert_true(lease_uid_range(b.terms.lease_id, &blo, &bhi));
  assert_true(alo >= (1ul << 20) && blo >= (1ul << 20));
  assert_int_equal(ahi - alo + 1, 65536);
  assert_int_equal(bhi - blo + 1, 65536);
  assert_true(ahi < blo || bhi < alo);
  send_release(a.terms.lease_id);
  msg m;
  assert_true(wait_msg(GN_MSG_INVOICE, 5000, &m));
  gn_buf_done(&m.raw);
  rent(&c, NULL);
  assert_true(lease_uid_range(c.terms.lease_id, &clo, &chi));
  assert_true(chi < blo || bhi < clo);
}

/* A stand-in for runc (the real one cannot be made slow on demand): it
 * answers --version like runc and takes 5 s over kill and delete, noting
 * each call, as a runtime on a loaded host may. Labelled TEST FAKE. */
static char slow_dir[64];

static int setup_slow_runtime(void **state) {
  snprintf(slow_dir, sizeof slow_dir, "/tmp/gn-slowrt-XXXXXX");
  assert_non_null(mkdtemp(slow_dir));
  char path[128];
  snprintf(path, sizeof path, "%s/runc", slow_dir);
  FILE *f = fopen(path, "w");
  assert_non_null(f);
  fprintf(f,
          "#!/bin/sh\n"
          "# TEST FAKE of runc: slow kill and delete.\n"
          "for a in \"$@\"; do\n"
          "  case \"$a\" in\n"
          "  --version) echo 'runc version 1.1.5-slow-test-fake'; exit 0 ;;\n"
          "  kill|delete) sleep 5; echo \"$a\" >>'%s/calls'; exit 0 ;;\n"
          "  run) exit 1 ;;\n"
          "  esac\n"
          "done\n"
          "exit 1\n",
          slow_dir);
  fclose(f);
  chmod(path, 0755);
  static char runtime_arg[128];
  snprintf(runtime_arg, sizeof runtime_arg, "%s", path);
  const char *extra[] = {"--runtime", runtime_arg, NULL};
  memcpy(W.extra, extra, sizeof extra);
  return setup(state);
}

static int teardown_slow_runtime(void **state) {
  int r = teardown(state);
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf %s", slow_dir);
  if (system(cmd) != 0)
    return -1;
  return r;
}

static size_t slow_calls(void) {
  char path[128], line[64];
  size_t n = 0;
  snprintf(path, sizeof path, "%s/calls", slow_dir);
  FILE *f = fopen(path, "r");
  if (!f)
    return 0;
  while (fgets(line, sizeof line, f))
    n++;
  fclose(f);
  return n;
}

/* The seconds metered for lease_id, as the ledger has them. */
static size_t ledger_ticks(const char *lease_id, int64_t *t_s, size_t cap) {
  char path[PATH_MAX + 32];
  snprintf(path, sizeof path, "%s/gpunet.db", W.dir);
  sqlite3 *db = NULL;
  sqlite3_stmt *st = NULL;
  size_t n = 0;
  assert_int_equal(sqlite3_open_v2(path, &db, SQLITE_OPEN_READONLY, NULL), SQLITE_OK);
  sqlite3_busy_timeout(db, 2000);
  assert_int_equal(sqlite3_prepare_v2(db, "SELECT t_s FROM ticks WHERE lease_id = ? ORDER BY idx", -1, &st, NULL),
                   SQLITE_OK);
  sqlite3_bind_text(st, 1, lease_id, -1, SQLITE_STATIC);
  while (sqlite3_step(st) == SQLITE_ROW && n < cap)
    t_s[n++] = sqlite3_column_int64(st, 0);
  sqlite3_finalize(st);
  sqlite3_close(db);
  return n;
}

/* While three jobs' containers take 5 s each to delete, the lease keeps
 * metering every second and a new lease is answered at once: the runtime
 * runs on the thread pool, not on the loop. */
static void test_loop_meters_while_the_runtime_is_slow(void **state) {
  (void)state;
  gn_agreement a, b;
  char st[32];
  rent(&a, NULL);
  uint64_t t0 = gn_mono_ms();
  char jobs[3][32];
  for (int i = 0; i < 3; i++) {
    send_job(a.terms.lease_id, PINNED, 16, 16, jobs[i], st, NULL); /* refused registry: fails at once */
    assert_string_equal(st, "pulling");
  }
  for (int i = 0; i < 3; i++)
    assert_true(wait_status(jobs[i], "failed", 5000, NULL, NULL));
  /* Now three `delete` calls sleep on the pool. */
  uint64_t t1 = gn_mono_ms();
  rent(&b, NULL);
  uint64_t answered_ms = gn_mono_ms() - t1;
  assert_int_equal(slow_calls(), 0);
  while (gn_mono_ms() - t0 < 8000)
    run_until(&(int){0}, 200);
  assert_int_equal(slow_calls(), 3);
  if (answered_ms > 1000)
    fail_msg("a lease request took %llu ms to be answered while the runtime was slow", (unsigned long long)answered_ms);
  int64_t t_s[64];
  size_t n = ledger_ticks(a.terms.lease_id, t_s, GN_ARRAY_SIZE(t_s));
  if (n < 6)
    fail_msg("only %zu seconds metered in 8 s", n);
  for (size_t i = 1; i < n; i++)
    if (t_s[i] - t_s[i - 1] > 2)
      fail_msg("metering stalled: no tick between %lld and %lld", (long long)t_s[i - 1], (long long)t_s[i]);
}

/* A released lease keeps its uid range until its last container is
 * deleted: a lease rented meanwhile gets another one. */
static void test_uid_range_held_until_the_jobs_are_gone(void **state) {
  (void)state;
  if (!status_userns())
    skip(); /* no user namespaces on this host */
  gn_agreement a, c, d;
  char st[32];
  unsigned long alo, ahi, clo, chi, dlo, dhi;
  rent(&a, NULL);
  assert_true(lease_uid_range(a.terms.lease_id, &alo, &ahi));
  char job[32];
  send_job(a.terms.lease_id, PINNED, 16, 16, job, st, NULL);
  assert_true(wait_status(job, "failed", 5000, NULL, NULL)); /* its delete now takes 5 s */
  send_release(a.terms.lease_id);
  msg m;
  assert_true(wait_msg(GN_MSG_INVOICE, 5000, &m));
  gn_buf_done(&m.raw);
  rent(&c, NULL);
  assert_true(lease_uid_range(c.terms.lease_id, &clo, &chi));
  assert_true(chi < alo || ahi < clo);
  while (slow_calls() < 1)
    run_until(&(int){0}, 200);
  run_until(&(int){0}, 500);
  rent(&d, NULL); /* a's range is free again: the lowest free one */
  assert_true(lease_uid_range(d.terms.lease_id, &dlo, &dhi));
  assert_int_equal(dlo, alo);
}

/* A host whose cgroups cannot apply memory and pids limits: jobs are
 * refused, unless the provider allows it, and then its status says so. */
static int setup_no_cgroups(void **state) {
  hanging_registry();
  W.hide_cgroups = true;
  const char *extra[] = {"--registry-allow", "127.0.0.1", NULL};
  memcpy(W.extra, extra, sizeof extra);
  return setup(state);
}

static int setup_no_cgroups_allowed(void **state) {
  hanging_registry();
  W.hide_cgroups = true;
  const char *extra[] = {"--registry-allow", "127.0.0.1", "--allow-unenforced-limits", NULL};
  memcpy(W.extra, extra, sizeof extra);
  return setup(state);
}

static void test_provider_refuses_jobs_it_cannot_limit(void **state) {
  (void)state;
  if (W.hide_failed)
    skip(); /* no private mount namespace here (needs root): cannot make a host without cgroup controllers */
  assert_true(W.up_req);
  gn_agreement a;
  char image[256], st[32], reason[256];
  hanging_image(image, sizeof image);
  rent(&a, NULL);
  send_job(a.terms.lease_id, image, 64, 16, NULL, st, reason);
  assert_string_equal(st, "rejected");
  if (!strstr(reason, "cannot enforce"))
    fail_msg("reason '%s' does not say the limits cannot be enforced", reason);
}

static void test_provider_runs_unlimited_jobs_when_allowed_and_says_so(void **state) {
  (void)state;
  if (W.hide_failed)
    skip(); /* as above */
  assert_true(W.up_req);
  gn_agreement a;
  char image[256], st[32];
  hanging_image(image, sizeof image);
  rent(&a, NULL);
  send_job(a.terms.lease_id, image, 64, 16, NULL, st, NULL);
  assert_string_equal(st, "pulling");
  json_t *j = api_get("/v1/status");
  json_t *iso = json_object_get(j, "isolation");
  assert_true(json_is_false(json_object_get(iso, "limits_enforced")));
  assert_true(json_is_true(json_object_get(iso, "unenforced_limits_allowed")));
  json_decref(j);
}

/* Root's default data dir is under /root (0700), which the jobs' uids
 * cannot search: the provider still runs, reaching the data dir through a
 * bind mount in its own mount namespace, which nobody else sees. */
static int setup_private_parent(void **state) {
  snprintf(private_parent, sizeof private_parent, "x");
  return setup(state);
}

static int teardown_private_parent(void **state) {
  int r = teardown(state);
  if (rmdir(private_parent) < 0)
    r = -1;
  private_parent[0] = 0;
  return r;
}

static bool mountinfo_has(pid_t pid, const char *what) {
  char path[64], line[4096];
  snprintf(path, sizeof path, "/proc/%d/mountinfo", (int)pid);
  FILE *f = fopen(path, "r");
  bool found = false;
  while (f && !found && fgets(line, sizeof line, f))
    found = strstr(line, what) != NULL;
  if (f)
    fclose(f);
  return found;
}

static void test_provider_reaches_a_data_dir_under_a_private_parent(void **state) {
  (void)state;
  struct stat st;
  assert_int_equal(stat(private_parent, &st), 0);
  assert_int_equal(st.st_mode & 0777, 0700);
  if (!status_userns())
    skip(); /* without user namespaces jobs run as root, who needs no path opened */
  assert_true(mountinfo_has(W.daemon, " /run/gpunet/data "));
  assert_false(mountinfo_has(getpid(), " /run/gpunet/data "));
  assert_int_equal(stat(private_parent, &st), 0);
  assert_int_equal(st.st_mode & 0777, 0700); /* left as it was */
  gn_agreement a;
  rent(&a, NULL); /* and it provides */
}

/* --- the lease's cgroup, with real jobs ---------------------------------------*/

static th_registry lease_reg;
static const char *lease_cg_skip;

/* A registry with busybox, and a job CPU budget of half the host's CPUs,
 * of which a lease of one of the two GPUs gets half. */
static int setup_lease_cgroup(void **state) {
  struct stat st;
  lease_cg_skip = NULL;
  if (geteuid() != 0)
    lease_cg_skip = "needs root (the provider's jobs under real runc)";
  else if (stat("/sys/fs/cgroup/cpu/cpu.cfs_quota_us", &st) != 0 ||
           stat("/sys/fs/cgroup/cpuacct/cpuacct.usage", &st) != 0)
    lease_cg_skip = "needs cgroup v1 cpu and cpuacct hierarchies at /sys/fs/cgroup/{cpu,cpuacct} (this check reads "
                    "them; the v2 path is covered by test_cgroup's fake tree only)";
  else if (th_registry_start(&lease_reg) < 0)
    lease_cg_skip = "cannot start the test registry (scripts/registry: docker-registry, umoci)";
  if (lease_cg_skip)
    return 0;
  const char *extra[] = {"--registry-allow", "127.0.0.1", "--job-cpu-share", "0.5", NULL};
  memcpy(W.extra, extra, sizeof extra);
  return setup(state);
}

static int teardown_lease_cgroup(void **state) {
  manifest_cmd[0] = NULL;
  th_registry_stop(&lease_reg);
  if (lease_cg_skip) {
    lease_cg_skip = NULL;
    return 0;
  }
  return teardown(state);
}

static long long cg_value(const char *fmt, const char *lease, const char *key) {
  char path[512];
  snprintf(path, sizeof path, fmt, lease);
  char *v = th_read_file(path, NULL);
  if (!v)
    return -1;
  long long x = -1;
  if (!key) {
    x = atoll(v);
  } else {
    size_t k = strlen(key);
    for (char *line = v; line; line = strchr(line, '\n') ? strchr(line, '\n') + 1 : NULL)
      if (strncmp(line, key, k) == 0 && line[k] == ' ')
        x = atoll(line + k + 1);
  }
  free(v);
  return x;
}

/* Two CPU burners of one lease, each a job with the lease's quota as its
 * own, run together within one quota: the provider nests them under the
 * lease's cgroup, and removes it once the lease is released and both
 * containers are gone. */
static void test_provider_holds_a_leases_jobs_to_its_cpu_share(void **state) {
  (void)state;
  if (lease_cg_skip) {
    print_message("skipped: %s\n", lease_cg_skip);
    skip();
  }
  static const char *const burn[] = {"sh", "-c", "while :; do :; done", NULL};
  memcpy(manifest_cmd, burn, sizeof burn);
  char image[256], jobs[2][32], st[32], reason[256];
  snprintf(image, sizeof image, "%s/bb@%s", lease_reg.host, lease_reg.digest);
  gn_agreement a;
  rent(&a, NULL);
  const char *lease = a.terms.lease_id;
  for (int k = 0; k < 2; k++) {
    send_job(lease, image, 64, 64, jobs[k], st, reason);
    if (strcmp(st, "pulling") != 0)
      fail_msg("job %d: %s (%s)", k, st, reason);
  }
  for (int k = 0; k < 2; k++)
    if (!wait_status(jobs[k], "running", 60000, st, reason))
      fail_msg("job %s never ran (see %s/gpunetd.log)", jobs[k], W.dir);
  /* The lease's quota is its share of the CPU budget: half of 0.5 of the
   * host's CPUs. */
  long cpus = sysconf(_SC_NPROCESSORS_ONLN);
  long long quota = cg_value("/sys/fs/cgroup/cpu/gpunet/%s/cpu.cfs_quota_us", lease, NULL);
  long long period = cg_value("/sys/fs/cgroup/cpu/gpunet/%s/cpu.cfs_period_us", lease, NULL);
  assert_true(period > 0);
  double want = (double)cpus * 0.5 / 2;
  if (quota <= 0 || (double)quota / (double)period < want * 0.99 || (double)quota / (double)period > want * 1.01)
    fail_msg("lease cgroup quota %lld/%lld, expected %.2f CPUs", quota, period, want);
  char path[512];
  for (int k = 0; k < 2; k++) { /* each job in its own cgroup below the lease's */
    snprintf(path, sizeof path, "/sys/fs/cgroup/cpu/gpunet/%s/%s/cgroup.procs", lease, jobs[k]);
    /* "running" is said once runc runs: its container's process joins the
     * cgroup a moment later (longer on a loaded host). */
    bool joined = false;
    for (int i = 0; i < 100 && !joined; i++) {
      char *procs = th_read_file(path, NULL);
      joined = procs && procs[0];
      free(procs);
      if (!joined)
        run_until(&(int){0}, 100);
    }
    if (!joined)
      fail_msg("job %s has no processes in %s after 10 s", jobs[k], path);
  }
  run_until(&(int){0}, 300);
  long long thr0 = cg_value("/sys/fs/cgroup/cpu/gpunet/%s/cpu.stat", lease, "nr_throttled");
  long long u0 = cg_value("/sys/fs/cgroup/cpuacct/gpunet/%s/cpuacct.usage", lease, NULL);
  uint64_t t0 = gn_mono_ms();
  run_until(&(int){0}, 2000); /* the loop keeps the sessions up meanwhile */
  long long u1 = cg_value("/sys/fs/cgroup/cpuacct/gpunet/%s/cpuacct.usage", lease, NULL);
  uint64_t t1 = gn_mono_ms();
  long long thr1 = cg_value("/sys/fs/cgroup/cpu/gpunet/%s/cpu.stat", lease, "nr_throttled");
  double secs = (double)(t1 - t0) / 1000, used = (double)(u1 - u0) / 1e9, allowed = (double)quota / period * secs;
  print_message("  two burners of lease %s: %.2f CPU-s in %.2f s (its quota: %.2f; each job's own quota would allow "
                "%.2f together), lease throttled %lld times\n",
                lease, used, secs, allowed, 2 * allowed, thr1 - thr0);
  assert_true(u0 >= 0 && u1 > u0);
  if (used > allowed * 1.3)
    fail_msg("the lease's jobs used %.2f CPU-s in %.2f s, over its quota of %.2f", used, secs, allowed);
  assert_true(thr1 > thr0); /* the lease's own quota did the limiting */

  /* Released: both containers deleted, then the lease's cgroup, in every
   * hierarchy (runc made the cpuacct one). */
  send_release(lease);
  static const char *const gone[] = {"cpu", "cpuacct", "memory", "pids", "devices"};
  bool all_gone = false;
  for (int i = 0; i < 300 && !all_gone; i++) {
    all_gone = true;
    for (size_t h = 0; h < GN_ARRAY_SIZE(gone); h++) {
      snprintf(path, sizeof path, "/sys/fs/cgroup/%s/gpunet/%s", gone[h], lease);
      all_gone = all_gone && !th_exists(path);
    }
    if (!all_gone)
      run_until(&(int){0}, 50);
  }
  if (!all_gone)
    fail_msg("the lease's cgroup %s is still there 15 s after its release", path);
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
      cmocka_unit_test_setup_teardown(test_provider_refuses_a_job_past_the_memory_budget, setup_budget, teardown),
      cmocka_unit_test_setup_teardown(test_provider_refuses_a_job_past_the_pids_budget, setup_budget, teardown),
      cmocka_unit_test_setup_teardown(test_sigterm_ends_the_daemon_during_a_pull, setup_budget, teardown),
      cmocka_unit_test_setup_teardown(test_provider_runs_at_most_four_pulls_at_once, setup_budget, teardown),
      cmocka_unit_test_setup_teardown(test_provider_gives_each_lease_its_own_uid_range, setup, teardown),
      cmocka_unit_test_setup_teardown(test_loop_meters_while_the_runtime_is_slow, setup_slow_runtime,
                                      teardown_slow_runtime),
      cmocka_unit_test_setup_teardown(test_uid_range_held_until_the_jobs_are_gone, setup_slow_runtime,
                                      teardown_slow_runtime),
      cmocka_unit_test_setup_teardown(test_provider_refuses_jobs_it_cannot_limit, setup_no_cgroups, teardown),
      cmocka_unit_test_setup_teardown(test_provider_runs_unlimited_jobs_when_allowed_and_says_so,
                                      setup_no_cgroups_allowed, teardown),
      cmocka_unit_test_setup_teardown(test_provider_reaches_a_data_dir_under_a_private_parent, setup_private_parent,
                                      teardown_private_parent),
      cmocka_unit_test_setup_teardown(test_provider_holds_a_leases_jobs_to_its_cpu_share, setup_lease_cgroup,
                                      teardown_lease_cgroup),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
