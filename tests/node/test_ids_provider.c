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

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "node/helpers.h"

#define PINNED "127.0.0.1:9/none/busybox@sha256:0000000000000000000000000000000000000000000000000000000000000000"

typedef tn_msg msg;

static struct world {
  char top[64];  /* holds data/ and the canary beside it */
  char dir[128]; /* the provider's data dir */
  char addr[64];
  pid_t daemon;
  uv_loop_t loop;
  gn_identity *prov_id, *req_id;
  gn_transport *tp;
  int up;
  tn_inbox in;
  tn_link link;
} W;

/* Runs the loop until a message of type arrives (returned, the caller frees
 * raw) or timeout_ms passes (0). */
static int wait_msg(uint32_t type, uint64_t timeout_ms, msg *ret) {
  return tn_wait_msg(&W.loop, &W.in, type, NULL, NULL, timeout_ms, ret);
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
  char path[PATH_MAX + 64];
  memset(&W, 0, sizeof W);
  snprintf(W.top, sizeof W.top, "/tmp/gn-ids-prov-XXXXXX");
  assert_non_null(mkdtemp(W.top));
  snprintf(W.dir, sizeof W.dir, "%s/data", W.top);
  assert_int_equal(mkdir(W.dir, 0700), 0);
  snprintf(path, sizeof path, "%s/canary", W.top);
  write_file(path, "canary\n");
  tn_identity_for(W.dir, &W.prov_id);
  snprintf(W.addr, sizeof W.addr, "127.0.0.1:%d", tn_free_port());
  W.daemon = tn_daemon_spawn(W.top, "w", "--data-dir", W.dir, "--listen", W.addr, "--provide", "--simulate-gpu",
                             "RTX 4090", "--price", "0.40", "--max-hours", "2",
                             /* Isolation is not what this tests, and not every host has it. */
                             "--allow-no-userns", (char *)NULL);
  uv_loop_init(&W.loop);
  W.link = (tn_link){&W.up, &W.in, NULL};
  tn_peer_new(&W.loop, &W.link, &W.req_id, &W.tp);
  tn_dial(&W.loop, W.tp, W.addr, &W.up, W.top);
  /* What an earlier, still running job "x" has: its bundle directory (made
   * now: the daemon clears leftover bundles when it starts). */
  snprintf(path, sizeof path, "%s/run/bundle-x", W.dir);
  assert_int_equal(mkdir(path, 0700), 0);
  return 0;
}

static int teardown(void **state) {
  (void)state;
  int rc = tn_world_end(&W.loop, &W.tp, 1, W.daemon, &W.in, W.top);
  W.prov_id = gn_identity_free(W.prov_id);
  W.req_id = gn_identity_free(W.req_id);
  return rc;
}

static void rent(gn_agreement *ret_ag) {
  gn_lease_terms t;
  tn_lease_terms(&t, W.prov_id, W.req_id, 1, true);
  tn_rent(&W.loop, &W.in, W.tp, W.req_id, W.prov_id, &t, ret_ag, NULL);
}

/* Sends a manifest naming any job id (what a hostile requester can send)
 * and returns the state of the provider's first answer ("rejected",
 * "pulling"...), waiting up to wait_end_ms more for the job to reach an end
 * state if it was taken. */
static void send_job(const char *job_id, const char *lease_id, char *state, size_t cap, uint64_t wait_end_ms) {
  tn_manifest man = {.job_id = job_id,
                     .lease_id = lease_id,
                     .image = PINNED,
                     .memory_mib = 64,
                     .pids = 16,
                     .issued_s = gn_unix_s(),
                     .expires_s = gn_unix_s() + 120};
  msg m;
  tn_manifest_send(W.tp, W.req_id, &man, W.prov_id->pk);
  if (!wait_msg(GN_MSG_JOB_STATUS, 5000, &m))
    fail_msg("no answer to a manifest for job '%s'", job_id);
  tn_msg_str(&m, "state", state, cap);
  gn_buf_done(&m.raw);
  if (strcmp(state, "rejected") == 0)
    return;
  char last[32] = "";
  uint64_t end = gn_mono_ms() + wait_end_ms;
  while (gn_mono_ms() < end && strcmp(last, "failed") && strcmp(last, "exited") && strcmp(last, "rejected")) {
    if (!wait_msg(GN_MSG_JOB_STATUS, end - gn_mono_ms(), &m))
      break;
    tn_msg_str(&m, "state", last, sizeof last);
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
