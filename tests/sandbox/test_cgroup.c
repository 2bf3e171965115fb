/* The lease's cgroup (sandbox/cgroup.c). The v2 and v1 value writing runs
 * against FAKE cgroup trees: plain temp directories with the control files
 * made beforehand, since this host has no v2 hierarchy and a test must not
 * depend on one. The real v1 test creates and removes a lease cgroup under
 * /sys/fs/cgroup when it runs as root on a host with v1 cpu mounted, and
 * skips with the reason otherwise. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <gpunet/sandbox.h>
#include <linux/magic.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <time.h>

#include "sandbox/helpers.h"

static void mkdirs(const char *root, const char *rel) {
  char path[1024];
  snprintf(path, sizeof path, "%s/%s", root, rel);
  for (char *p = path + strlen(root) + 1; *p; p++) {
    if (*p == '/') {
      *p = 0;
      mkdir(path, 0755);
      *p = '/';
    }
  }
  mkdir(path, 0755);
}

/* An empty control file, as the kernel would show it. */
static void touch(const char *root, const char *rel) {
  char path[1024];
  snprintf(path, sizeof path, "%s/%s", root, rel);
  assert_int_equal(th_write_file(path, "", 0), 0);
}

static void expect_file(const char *root, const char *rel, const char *want) {
  char path[1024];
  snprintf(path, sizeof path, "%s/%s", root, rel);
  char *got = th_read_file(path, NULL);
  if (!got)
    fail_msg("%s was not written", rel);
  if (strcmp(got, want) != 0)
    fail_msg("%s holds \"%s\", not \"%s\"", rel, got, want);
  free(got);
}

static void test_cgroup_lease_path_from_ids_only(void **state) {
  (void)state;
  char buf[128];
  assert_int_equal(gn_cgroup_lease_path("l-ab12", "j-cd34", buf, sizeof buf), 0);
  assert_string_equal(buf, "/gpunet/l-ab12/j-cd34");
  assert_int_equal(gn_cgroup_lease_path("l-ab12", NULL, buf, sizeof buf), 0);
  assert_string_equal(buf, "/gpunet/l-ab12");
  static const char *const bad[] = {"", ".", "..", "../x", "a/b", "-l", "l 1", "l\n1"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    assert_int_equal(gn_cgroup_lease_path(bad[i], "j-1", buf, sizeof buf), GN_EINVAL);
    assert_int_equal(gn_cgroup_lease_path("l-1", bad[i], buf, sizeof buf), GN_EINVAL);
  }
  assert_int_equal(gn_cgroup_lease_path("l-ab12", "j-cd34", buf, 8), GN_ETOOBIG);
  assert_string_equal(buf, "");
}

/* FAKE v2 tree: the root's and gpunet's subtree_control, and the lease's
 * files, made beforehand. */
static void test_cgroup_v2_fake_tree_gets_limits(void **state) {
  (void)state;
  char *root = th_mkdtemp("cgfake2");
  assert_non_null(root);
  mkdirs(root, "gpunet/l-v2");
  touch(root, "cgroup.subtree_control");
  touch(root, "gpunet/cgroup.subtree_control");
  static const char *const files[] = {"cpu.max", "memory.max", "pids.max", "cgroup.subtree_control"};
  for (size_t i = 0; i < 4; i++) {
    char rel[128];
    snprintf(rel, sizeof rel, "gpunet/l-v2/%s", files[i]);
    touch(root, rel);
  }
  gn_cgroup_set_root(root, GN_CGROUP_V2);
  assert_int_equal(gn_cgroup_layout_get(), GN_CGROUP_V2);
  gn_cgroup_limits lim = {.cpu_quota_us = 150000, .cpu_period_us = 100000, .memory_bytes = 3ull << 30, .pids_max = 512};
  char err[256] = "";
  int r = gn_cgroup_lease_create("l-v2", &lim, err, sizeof err);
  if (r)
    fail_msg("create: %s", err);
  expect_file(root, "cgroup.subtree_control", "+cpu +memory +pids");
  expect_file(root, "gpunet/cgroup.subtree_control", "+cpu +memory +pids");
  expect_file(root, "gpunet/l-v2/cgroup.subtree_control", "+cpu +memory +pids");
  expect_file(root, "gpunet/l-v2/cpu.max", "150000 100000");
  expect_file(root, "gpunet/l-v2/memory.max", "3221225472");
  expect_file(root, "gpunet/l-v2/pids.max", "512");

  /* Controllers already enabled (as systemd leaves the root): not written
   * again, since a cgroup holding processes would refuse even that. */
  char path[1024];
  snprintf(path, sizeof path, "%s/cgroup.subtree_control", root);
  assert_int_equal(th_write_file(path, "cpuset cpu io memory pids\n", 26), 0);
  assert_int_equal(chmod(path, 0444), 0); /* a write would fail (but root ignores modes: the content tells) */
  assert_int_equal(gn_cgroup_lease_create("l-v2", &lim, err, sizeof err), 0);
  expect_file(root, "cgroup.subtree_control", "cpuset cpu io memory pids\n");
  /* One missing: enabled. */
  assert_int_equal(chmod(path, 0644), 0);
  assert_int_equal(th_write_file(path, "cpu memory\n", 11), 0);
  assert_int_equal(gn_cgroup_lease_create("l-v2", &lim, err, sizeof err), 0);
  expect_file(root, "cgroup.subtree_control", "+cpu +memory +pids");

  /* The default period; and a missing controller file is an error naming it. */
  lim.cpu_period_us = 0;
  assert_int_equal(gn_cgroup_lease_create("l-v2", &lim, err, sizeof err), 0);
  expect_file(root, "gpunet/l-v2/cpu.max", "150000 100000");
  mkdirs(root, "gpunet/l-nopids");
  touch(root, "gpunet/l-nopids/cpu.max");
  touch(root, "gpunet/l-nopids/memory.max");
  assert_int_not_equal(gn_cgroup_lease_create("l-nopids", &lim, err, sizeof err), 0);
  assert_non_null(strstr(err, "pids.max"));
  /* Ids outside the grammar never reach a path. */
  assert_int_equal(gn_cgroup_lease_create("..", &lim, err, sizeof err), GN_EINVAL);
  assert_int_equal(gn_cgroup_lease_create("a/b", &lim, err, sizeof err), GN_EINVAL);
  gn_cgroup_set_root(NULL, GN_CGROUP_NONE);
  th_rm_rf(root);
  free(root);
}

/* FAKE v1 tree: one directory per controller, the lease's files made
 * beforehand in cpu, memory and pids. */
static void test_cgroup_v1_fake_tree_gets_limits(void **state) {
  (void)state;
  char *root = th_mkdtemp("cgfake1");
  assert_non_null(root);
  mkdirs(root, "cpu/gpunet/l-v1");
  mkdirs(root, "memory/gpunet/l-v1");
  mkdirs(root, "pids/gpunet/l-v1");
  touch(root, "cpu/gpunet/l-v1/cpu.cfs_quota_us");
  touch(root, "cpu/gpunet/l-v1/cpu.cfs_period_us");
  touch(root, "memory/gpunet/l-v1/memory.limit_in_bytes");
  touch(root, "pids/gpunet/l-v1/pids.max");
  gn_cgroup_set_root(root, GN_CGROUP_V1);
  gn_cgroup_limits lim = {.cpu_quota_us = 75000, .cpu_period_us = 50000, .memory_bytes = 1ull << 30, .pids_max = 64};
  char err[256] = "";
  int r = gn_cgroup_lease_create("l-v1", &lim, err, sizeof err);
  if (r)
    fail_msg("create: %s", err);
  expect_file(root, "cpu/gpunet/l-v1/cpu.cfs_quota_us", "75000");
  expect_file(root, "cpu/gpunet/l-v1/cpu.cfs_period_us", "50000");
  expect_file(root, "memory/gpunet/l-v1/memory.limit_in_bytes", "1073741824");
  expect_file(root, "pids/gpunet/l-v1/pids.max", "64");

  /* Only the limits asked for: a lease without a memory limit makes no
   * memory cgroup. */
  gn_cgroup_limits cpu_only = {.cpu_quota_us = 20000};
  mkdirs(root, "cpu/gpunet/l-cpu");
  touch(root, "cpu/gpunet/l-cpu/cpu.cfs_quota_us");
  touch(root, "cpu/gpunet/l-cpu/cpu.cfs_period_us");
  assert_int_equal(gn_cgroup_lease_create("l-cpu", &cpu_only, err, sizeof err), 0);
  expect_file(root, "cpu/gpunet/l-cpu/cpu.cfs_period_us", "100000");
  expect_file(root, "cpu/gpunet/l-cpu/cpu.cfs_quota_us", "20000");
  char path[1024];
  snprintf(path, sizeof path, "%s/memory/gpunet/l-cpu", root);
  assert_false(th_exists(path));
  gn_cgroup_set_root(NULL, GN_CGROUP_NONE);
  th_rm_rf(root);
  free(root);
}

static bool only_l_other(const char *lease_id, void *ud) {
  (void)ud;
  return strcmp(lease_id, "l-other") == 0;
}

/* FAKE v1 tree of directories only (cgroup directories can be rmdir'ed with
 * their files; plain ones only empty): the lease's and its jobs' cgroups go
 * in every hierarchy, other leases' stay, and the stale sweep takes them
 * all but what is not a lease id. */
static void test_cgroup_remove_takes_lease_in_every_hierarchy(void **state) {
  (void)state;
  char *root = th_mkdtemp("cgfake1rm");
  assert_non_null(root);
  static const char *const ctrl[] = {"cpu", "memory", "pids", "devices", "freezer"};
  for (size_t i = 0; i < 5; i++) {
    char rel[256];
    snprintf(rel, sizeof rel, "%s/gpunet/l-gone/j-1", ctrl[i]);
    mkdirs(root, rel);
    snprintf(rel, sizeof rel, "%s/gpunet/l-gone/j-2", ctrl[i]);
    mkdirs(root, rel);
    snprintf(rel, sizeof rel, "%s/gpunet/l-other/j-3", ctrl[i]);
    mkdirs(root, rel);
  }
  mkdirs(root, "cpu/gpunet/not.a.lease");
  gn_cgroup_set_root(root, GN_CGROUP_V1);
  assert_int_equal(gn_cgroup_lease_remove("l-gone"), 0);
  char path[1024];
  for (size_t i = 0; i < 5; i++) {
    snprintf(path, sizeof path, "%s/%s/gpunet/l-gone", root, ctrl[i]);
    assert_false(th_exists(path));
    snprintf(path, sizeof path, "%s/%s/gpunet/l-other/j-3", root, ctrl[i]);
    assert_true(th_exists(path));
  }
  assert_int_equal(gn_cgroup_lease_remove("l-gone"), 0); /* gone already: fine */
  assert_int_equal(gn_cgroup_lease_remove(".."), GN_EINVAL);
  for (size_t i = 0; i < 5; i++) {
    char rel[256];
    snprintf(rel, sizeof rel, "%s/gpunet/l-other-daemon", ctrl[i]);
    mkdirs(root, rel);
  }
  unsigned removed = 0;
  assert_int_equal(gn_cgroup_remove_stale(only_l_other, NULL, &removed), 0);
  assert_int_equal(removed, 5);
  snprintf(path, sizeof path, "%s/pids/gpunet/l-other-daemon", root);
  assert_true(th_exists(path)); /* not claimed: stays */
  assert_int_equal(gn_cgroup_remove_stale(NULL, NULL, &removed), 0);
  assert_int_equal(removed, 5);
  assert_false(th_exists(path));
  for (size_t i = 0; i < 5; i++) {
    snprintf(path, sizeof path, "%s/%s/gpunet/l-other", root, ctrl[i]);
    assert_false(th_exists(path));
  }
  snprintf(path, sizeof path, "%s/cpu/gpunet/not.a.lease", root);
  assert_true(th_exists(path));
  gn_cgroup_set_root(NULL, GN_CGROUP_NONE);
  th_rm_rf(root);
  free(root);
}

static long long read_ll(const char *path) {
  char *s = th_read_file(path, NULL);
  long long v = s ? atoll(s) : -1;
  free(s);
  return v;
}

/* The real thing on a v1 (or hybrid) host, as root: the kernel takes the
 * values, a job cgroup nests under the lease's, and removal leaves nothing. */
static void test_cgroup_v1_real_create_and_remove(void **state) {
  (void)state;
  struct statfs sf;
  if (geteuid() != 0 || statfs("/sys/fs/cgroup/cpu", &sf) != 0 || (long)sf.f_type != CGROUP_SUPER_MAGIC) {
    print_message("skipped: needs root and a cgroup v1 cpu hierarchy at /sys/fs/cgroup/cpu (%s)\n",
                  geteuid() != 0 ? "not root" : "none here");
    skip();
  }
  assert_int_equal(gn_cgroup_layout_get(), GN_CGROUP_V1);
  char id[64], dir[256];
  snprintf(id, sizeof id, "l-test-%d", (int)getpid());
  gn_cgroup_limits lim = {.cpu_quota_us = 30000, .cpu_period_us = 100000, .memory_bytes = 256ull << 20, .pids_max = 99};
  char err[256] = "";
  int r = gn_cgroup_lease_create(id, &lim, err, sizeof err);
  if (r)
    fail_msg("create: %s", err);
  snprintf(dir, sizeof dir, "/sys/fs/cgroup/cpu/gpunet/%s/cpu.cfs_quota_us", id);
  assert_int_equal(read_ll(dir), 30000);
  snprintf(dir, sizeof dir, "/sys/fs/cgroup/cpu/gpunet/%s/cpu.cfs_period_us", id);
  assert_int_equal(read_ll(dir), 100000);
  snprintf(dir, sizeof dir, "/sys/fs/cgroup/memory/gpunet/%s/memory.limit_in_bytes", id);
  assert_int_equal(read_ll(dir), 256ll << 20);
  snprintf(dir, sizeof dir, "/sys/fs/cgroup/pids/gpunet/%s/pids.max", id);
  assert_int_equal(read_ll(dir), 99);
  /* Again (a second job of the lease): same values, no error. */
  assert_int_equal(gn_cgroup_lease_create(id, &lim, err, sizeof err), 0);
  /* A job's cgroup below it, as the runtime makes it; the kernel refuses
   * a job quota above the lease's (v1 checks children against parents). */
  snprintf(dir, sizeof dir, "/sys/fs/cgroup/cpu/gpunet/%s/j-1", id);
  assert_int_equal(mkdir(dir, 0755), 0);
  snprintf(dir, sizeof dir, "/sys/fs/cgroup/cpu/gpunet/%s/j-1/cpu.cfs_quota_us", id);
  assert_int_not_equal(th_write_file(dir, "60000", 5), 0);
  assert_int_equal(gn_cgroup_lease_remove(id), 0);
  snprintf(dir, sizeof dir, "/sys/fs/cgroup/cpu/gpunet/%s", id);
  assert_false(th_exists(dir));
  snprintf(dir, sizeof dir, "/sys/fs/cgroup/memory/gpunet/%s", id);
  assert_false(th_exists(dir));
  snprintf(dir, sizeof dir, "/sys/fs/cgroup/pids/gpunet/%s", id);
  assert_false(th_exists(dir));
}

static const char *warm_skip_reason(void) {
  if (geteuid() != 0)
    return "needs root (it writes cgroup.procs)";
  if (gn_cgroup_layout_get() == GN_CGROUP_NONE)
    return "no cgroup file system at /sys/fs/cgroup";
  return NULL;
}

static double mono_ms(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec * 1e3 + (double)t.tv_nsec / 1e6;
}

/* The warming write moves the daemon nowhere: the same cgroups after. */
static void test_cgroup_attach_warm_keeps_the_process_in_its_cgroups(void **state) {
  (void)state;
  TH_SKIP_IF(warm_skip_reason());
  char *before = th_read_file("/proc/self/cgroup", NULL);
  assert_non_null(before);
  assert_int_equal(gn_cgroup_attach_warm(), 0);
  char *after = th_read_file("/proc/self/cgroup", NULL);
  assert_non_null(after);
  assert_string_equal(before, after);
  free(before);
  free(after);
}

/* What the warming is for: right after it, a cgroup.procs write (here the
 * same one again) does not wait for a grace period. The best of three, so
 * a preempted write on a loaded host does not fail the test. */
static void test_cgroup_attach_warm_leaves_the_lock_fast(void **state) {
  (void)state;
  TH_SKIP_IF(warm_skip_reason());
  double best = 1e9;
  for (int i = 0; i < 3; i++) {
    assert_int_equal(gn_cgroup_attach_warm(), 0);
    double t0 = mono_ms();
    assert_int_equal(gn_cgroup_attach_warm(), 0);
    double d = mono_ms() - t0;
    if (d < best)
      best = d;
  }
  if (best >= 2.0)
    fail_msg("a cgroup.procs write right after the warming took %.2f ms", best);
}

/* With the root overridden (a fake tree) there is no lock to warm, and
 * nothing under the fake root is written. */
static void test_cgroup_attach_warm_leaves_a_fake_tree_alone(void **state) {
  (void)state;
  char root[] = "/tmp/gn-cg-warm-XXXXXX";
  assert_non_null(mkdtemp(root));
  mkdirs(root, "pids");
  touch(root, "pids/cgroup.procs");
  gn_cgroup_set_root(root, GN_CGROUP_V1);
  assert_int_equal(gn_cgroup_attach_warm(), GN_EUNSUPPORTED);
  gn_cgroup_set_root(NULL, GN_CGROUP_NONE);
  expect_file(root, "pids/cgroup.procs", "");
  th_rm_rf(root);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_cgroup_attach_warm_keeps_the_process_in_its_cgroups),
      cmocka_unit_test(test_cgroup_attach_warm_leaves_the_lock_fast),
      cmocka_unit_test(test_cgroup_attach_warm_leaves_a_fake_tree_alone),
      cmocka_unit_test(test_cgroup_lease_path_from_ids_only),
      cmocka_unit_test(test_cgroup_v2_fake_tree_gets_limits),
      cmocka_unit_test(test_cgroup_v1_fake_tree_gets_limits),
      cmocka_unit_test(test_cgroup_remove_takes_lease_in_every_hierarchy),
      cmocka_unit_test(test_cgroup_v1_real_create_and_remove),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
