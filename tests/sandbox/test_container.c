/* End to end: busybox pushed to a local docker-registry, pulled into a
 * store, unpacked, given a bundle, and run with the detected OCI runtime.
 * Checks output, exit codes, the read-only root, the empty network
 * namespace, dropped capabilities and the pids limit. Needs root and runc
 * (or crun); skipped, saying why, without them. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <gpunet/sandbox.h>

#include "sandbox/helpers.h"

static th_registry reg;
static gn_store *store;
static gn_image image;
static gn_runtime rt;
static char *work;
static const char *skip_reason;
static int job_counter;

static int setup(void **state) {
  (void)state;
  char err[512] = "";
  if ((skip_reason = th_containers_skip("container tests need root", NULL, &rt)))
    return 0;
  if (th_registry_setup(&reg) < 0)
    return -1;
  work = th_mkdtemp("ctr");
  char dir[512], ref[256];
  snprintf(dir, sizeof(dir), "%s/store", work);
  if (th_store_open_loopback(dir, &store) < 0)
    return -1;
  gn_imageref r;
  snprintf(ref, sizeof(ref), "%s/bb@%s", reg.host, reg.digest);
  if (gn_imageref_parse(ref, &r) < 0 || gn_store_pull(store, &r, NULL, NULL, &image, err, sizeof(err)) < 0) {
    fprintf(stderr, "pull failed: %s\n", err);
    return -1;
  }
  return 0;
}

static int teardown(void **state) {
  (void)state;
  gn_image_done(&image);
  store = gn_store_free(store);
  th_registry_stop(&reg);
  if (work) {
    th_rm_rf(work);
    free(work);
  }
  return 0;
}

typedef th_job_result job_result;

/* Unpacks a fresh rootfs, writes a bundle for spec, runs it to completion. */
static void run_job(gn_bundle_spec *spec, job_result *res) {
  char bundle[512], rootfs[600], state_dir[512], id[64], err[512] = "";
  int n = ++job_counter;
  snprintf(bundle, sizeof(bundle), "%s/bundle%d", work, n);
  snprintf(rootfs, sizeof(rootfs), "%s/rootfs", bundle);
  snprintf(state_dir, sizeof(state_dir), "%s/state", work);
  snprintf(id, sizeof(id), "gn-test-%d-%d", (int)getpid(), n);
  assert_int_equal(mkdir(bundle, 0700), 0);
  int rc = gn_store_unpack(store, &image, rootfs, err, sizeof(err));
  if (rc)
    fail_msg("unpack: %d %s", rc, err);
  spec->rootfs = "rootfs";
  if (!spec->env)
    spec->env = (const char *const *)image.env;
  assert_int_equal(gn_bundle_write(bundle, spec), 0);
  th_run_bundle(&rt, state_dir, bundle, id, res);
  fprintf(stderr, "  %s %s ran in %llu ms, exit %d\n", rt.kind == GN_RUNTIME_RUNC ? "runc" : "crun", id,
          (unsigned long long)res->ms, res->status);
}

#define NEED_CONTAINERS() TH_SKIP_IF(skip_reason)

static void test_container_echo_hello(void **state) {
  (void)state;
  NEED_CONTAINERS();
  const char *const argv[] = {"/bin/echo", "hello", NULL};
  gn_bundle_spec spec = {.argv = argv};
  job_result r;
  run_job(&spec, &r);
  if (r.status != 0)
    fail_msg("exit %d, stderr: %s", r.status, r.errout);
  assert_string_equal(r.out, "hello\n");
}

/* `run` to the container's end leaves no state for a delete to remove:
 * what lets the daemon skip starting the runtime again after each job. */
static void test_container_run_leaves_no_runtime_state(void **state) {
  (void)state;
  NEED_CONTAINERS();
  const char *const argv[] = {"/bin/sh", "-c", "exit 4", NULL};
  gn_bundle_spec spec = {.argv = argv};
  job_result r;
  run_job(&spec, &r);
  assert_int_equal(r.status, 4);
  char state_dir[512], id[64];
  snprintf(state_dir, sizeof(state_dir), "%s/state", work);
  snprintf(id, sizeof(id), "gn-test-%d-%d", (int)getpid(), job_counter);
  assert_false(gn_runtime_has_state(state_dir, id));
}

static void test_container_exit_code_passes_through(void **state) {
  (void)state;
  NEED_CONTAINERS();
  const char *const argv[] = {"/bin/sh", "-c", "exit 3", NULL};
  gn_bundle_spec spec = {.argv = argv};
  job_result r;
  run_job(&spec, &r);
  assert_int_equal(r.status, 3);
}

static void test_container_root_readonly_tmp_writable(void **state) {
  (void)state;
  NEED_CONTAINERS();
  const char *const argv[] = {"/bin/sh", "-c",
                              "if touch /newfile 2>/dev/null; then echo root-rw; else echo root-ro; fi; "
                              "if echo x > /tmp/f && [ \"$(cat /tmp/f)\" = x ]; then echo tmp-rw; else echo tmp-ro; fi",
                              NULL};
  gn_bundle_spec spec = {.argv = argv};
  job_result r;
  run_job(&spec, &r);
  assert_int_equal(r.status, 0);
  assert_string_equal(r.out, "root-ro\ntmp-rw\n");
}

static void assert_only_loopback(const char *proc_net_dev) {
  /* Two header lines, then one line per interface: "  lo: ...". */
  int ifaces = 0;
  const char *line = proc_net_dev;
  for (int i = 0; line && *line; i++) {
    const char *nl = strchr(line, '\n');
    if (i >= 2) {
      while (*line == ' ')
        line++;
      if (strncmp(line, "lo:", 3) != 0)
        fail_msg("interface besides lo: %.*s", (int)(nl ? nl - line : (long)strlen(line)), line);
      ifaces++;
    }
    line = nl ? nl + 1 : NULL;
  }
  assert_int_equal(ifaces, 1);
}

static void test_container_sees_only_loopback(void **state) {
  (void)state;
  NEED_CONTAINERS();
  const char *const argv[] = {"/bin/cat", "/proc/net/dev", NULL};
  for (int network = 0; network < 2; network++) {
    gn_bundle_spec spec = {.argv = argv, .network = network};
    job_result r;
    run_job(&spec, &r);
    assert_int_equal(r.status, 0);
    assert_only_loopback(r.out);
  }
}

static void test_container_has_no_capabilities_and_own_pid_ns(void **state) {
  (void)state;
  NEED_CONTAINERS();
  const char *const argv[] = {
      "/bin/sh", "-c", "grep -E '^(CapEff|CapPrm|CapBnd|NoNewPrivs)' /proc/self/status; echo pid=$$; hostname", NULL};
  gn_bundle_spec spec = {.argv = argv, .hostname = "job-7"};
  job_result r;
  run_job(&spec, &r);
  assert_int_equal(r.status, 0);
  assert_non_null(strstr(r.out, "CapEff:\t0000000000000000"));
  assert_non_null(strstr(r.out, "CapPrm:\t0000000000000000"));
  assert_non_null(strstr(r.out, "CapBnd:\t0000000000000000"));
  assert_non_null(strstr(r.out, "NoNewPrivs:\t1"));
  assert_non_null(strstr(r.out, "pid=1\n"));
  assert_non_null(strstr(r.out, "job-7\n"));
}

static void test_container_pids_limit_applies(void **state) {
  (void)state;
  NEED_CONTAINERS();
  if (!gn_cgroup_limits_supported()) {
    fprintf(stderr, "skipped: this host's cgroup layout cannot apply limits\n");
    skip();
  }
  /* With at most 8 tasks, starting 20 sleepers must fail: busybox sh
   * reports "can't fork" and gives up. Without the limit all 20 start. */
  const char *const argv[] = {"/bin/sh", "-c",
                              "i=0; while [ $i -lt 20 ]; do sleep 2 & i=$((i+1)); done; echo started=$i", NULL};
  gn_bundle_spec spec = {.argv = argv, .pids_max = 8, .memory_bytes = 64u << 20, .cgroup_limits = true};
  job_result r;
  run_job(&spec, &r);
  if (r.status == 0 || !strstr(r.errout, "fork"))
    fail_msg("the pids limit did not hold: exit %d, out %s, err %s", r.status, r.out, r.errout);
  /* The same job without limits starts every sleeper. */
  gn_bundle_spec free_spec = {.argv = argv};
  run_job(&free_spec, &r);
  if (r.status != 0 || strcmp(r.out, "started=20\n") != 0)
    fail_msg("without limits: exit %d, out %s, err %s", r.status, r.out, r.errout);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_container_echo_hello),
      cmocka_unit_test(test_container_exit_code_passes_through),
      cmocka_unit_test(test_container_run_leaves_no_runtime_state),
      cmocka_unit_test(test_container_root_readonly_tmp_writable),
      cmocka_unit_test(test_container_sees_only_loopback),
      cmocka_unit_test(test_container_has_no_capabilities_and_own_pid_ns),
      cmocka_unit_test(test_container_pids_limit_applies),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
