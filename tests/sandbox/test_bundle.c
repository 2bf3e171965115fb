/* OCI bundle generation: config.json written by gn_bundle_write, read back
 * with jansson and checked field by field; malformed specs refused. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <gpunet/sandbox.h>
#include <jansson.h>
#include <sys/statfs.h>

#include "sandbox/helpers.h"

static const char *const argv_echo[] = {"/bin/echo", "hello", NULL};
static const char *const env_one[] = {"FOO=bar", NULL};

static json_t *write_and_load(const gn_bundle_spec *spec, char **ret_dir) {
  char path[512];
  json_error_t e;
  *ret_dir = th_mkdtemp("bundle");
  assert_non_null(*ret_dir);
  int rc = gn_bundle_write(*ret_dir, spec);
  if (rc)
    fail_msg("gn_bundle_write: %d %s", rc, gn_strerror(rc));
  snprintf(path, sizeof(path), "%s/config.json", *ret_dir);
  json_t *j = json_load_file(path, 0, &e);
  if (!j)
    fail_msg("config.json does not parse: %s", e.text);
  return j;
}

static void done(json_t *j, char *dir) {
  json_decref(j);
  th_rm_rf(dir);
  free(dir);
}

static bool array_has_string(json_t *a, const char *s) {
  size_t i;
  json_t *v;
  json_array_foreach(a, i, v) {
    if (json_is_string(v) && strcmp(json_string_value(v), s) == 0)
      return true;
  }
  return false;
}

static json_t *find_by(json_t *a, const char *key, const char *value) {
  size_t i;
  json_t *v;
  json_array_foreach(a, i, v) {
    json_t *k = json_object_get(v, key);
    if (json_is_string(k) && strcmp(json_string_value(k), value) == 0)
      return v;
  }
  return NULL;
}

static void test_bundle_process_is_unprivileged(void **state) {
  (void)state;
  char *dir;
  gn_bundle_spec spec = {.argv = argv_echo, .env = env_one, .cwd = "/work", .nofile = 4096};
  json_t *j = write_and_load(&spec, &dir);
  assert_string_equal(json_string_value(json_object_get(j, "ociVersion")), "1.0.2");
  json_t *p = json_object_get(j, "process");
  assert_true(json_is_false(json_object_get(p, "terminal")));
  assert_int_equal(json_integer_value(json_object_get(json_object_get(p, "user"), "uid")), 0);
  assert_int_equal(json_integer_value(json_object_get(json_object_get(p, "user"), "gid")), 0);
  assert_true(json_is_true(json_object_get(p, "noNewPrivileges")));
  assert_string_equal(json_string_value(json_array_get(json_object_get(p, "args"), 0)), "/bin/echo");
  assert_string_equal(json_string_value(json_array_get(json_object_get(p, "args"), 1)), "hello");
  assert_int_equal(json_array_size(json_object_get(p, "args")), 2);
  assert_string_equal(json_string_value(json_object_get(p, "cwd")), "/work");
  json_t *env = json_object_get(p, "env");
  assert_true(array_has_string(env, "FOO=bar"));
  assert_true(json_string_length(json_array_get(env, 0)) > 5); /* a default PATH was added */
  assert_true(strncmp(json_string_value(json_array_get(env, 0)), "PATH=", 5) == 0);
  json_t *caps = json_object_get(p, "capabilities");
  const char *sets[] = {"bounding", "effective", "inheritable", "permitted", "ambient"};
  for (size_t i = 0; i < 5; i++) {
    json_t *set = json_object_get(caps, sets[i]);
    assert_true(json_is_array(set));
    assert_int_equal(json_array_size(set), 0);
  }
  json_t *rl = json_object_get(p, "rlimits");
  json_t *nofile = find_by(rl, "type", "RLIMIT_NOFILE");
  json_t *core = find_by(rl, "type", "RLIMIT_CORE");
  assert_non_null(nofile);
  assert_non_null(core);
  assert_int_equal(json_integer_value(json_object_get(nofile, "soft")), 4096);
  assert_int_equal(json_integer_value(json_object_get(nofile, "hard")), 4096);
  assert_int_equal(json_integer_value(json_object_get(core, "hard")), 0);
  assert_int_equal(json_array_size(rl), 2);
  done(j, dir);
}

static void test_bundle_root_is_readonly_with_tmpfs_tmp(void **state) {
  (void)state;
  char *dir;
  gn_bundle_spec spec = {.argv = argv_echo, .rootfs = "rootfs", .hostname = "job-42"};
  json_t *j = write_and_load(&spec, &dir);
  json_t *root = json_object_get(j, "root");
  assert_string_equal(json_string_value(json_object_get(root, "path")), "rootfs");
  assert_true(json_is_true(json_object_get(root, "readonly")));
  assert_string_equal(json_string_value(json_object_get(j, "hostname")), "job-42");
  json_t *mounts = json_object_get(j, "mounts");
  static const char *const want[][2] = {{"/proc", "proc"},     {"/dev", "tmpfs"},         {"/dev/pts", "devpts"},
                                        {"/dev/shm", "tmpfs"}, {"/dev/mqueue", "mqueue"}, {"/sys", "sysfs"},
                                        {"/tmp", "tmpfs"}};
  for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++) {
    json_t *m = find_by(mounts, "destination", want[i][0]);
    if (!m)
      fail_msg("no mount at %s", want[i][0]);
    assert_string_equal(json_string_value(json_object_get(m, "type")), want[i][1]);
  }
  json_t *sys = json_object_get(find_by(mounts, "destination", "/sys"), "options");
  assert_true(array_has_string(sys, "ro"));
  json_t *tmp = json_object_get(find_by(mounts, "destination", "/tmp"), "options");
  assert_true(array_has_string(tmp, "nosuid"));
  assert_true(array_has_string(tmp, "nodev"));
  assert_true(array_has_string(tmp, "size=64m"));
  assert_false(array_has_string(tmp, "ro"));
  done(j, dir);
}

static void test_bundle_has_new_namespaces_and_masks(void **state) {
  (void)state;
  char *dir;
  /* network=true still gets its own (empty) namespace in this version. */
  for (int network = 0; network < 2; network++) {
    gn_bundle_spec spec = {.argv = argv_echo, .network = network};
    json_t *j = write_and_load(&spec, &dir);
    json_t *lx = json_object_get(j, "linux");
    json_t *ns = json_object_get(lx, "namespaces");
    const char *want[] = {"pid", "ipc", "uts", "mount", "network"};
    for (size_t i = 0; i < 5; i++) {
      json_t *n = find_by(ns, "type", want[i]);
      if (!n)
        fail_msg("no %s namespace (network=%d)", want[i], network);
      assert_null(json_object_get(n, "path")); /* new, never joined */
    }
    assert_true(array_has_string(json_object_get(lx, "maskedPaths"), "/proc/kcore"));
    assert_true(array_has_string(json_object_get(lx, "maskedPaths"), "/sys/firmware"));
    assert_true(array_has_string(json_object_get(lx, "readonlyPaths"), "/proc/sys"));
    assert_true(array_has_string(json_object_get(lx, "readonlyPaths"), "/proc/sysrq-trigger"));
    done(j, dir);
  }
}

static void test_bundle_limits_only_when_cgroups_apply_them(void **state) {
  (void)state;
  char *dir;
  gn_bundle_spec spec = {.argv = argv_echo, .memory_bytes = 256u << 20, .pids_max = 64, .cgroup_limits = true};
  json_t *j = write_and_load(&spec, &dir);
  json_t *res = json_object_get(json_object_get(j, "linux"), "resources");
  assert_int_equal(json_integer_value(json_object_get(json_object_get(res, "memory"), "limit")), 256 << 20);
  assert_int_equal(json_integer_value(json_object_get(json_object_get(res, "pids"), "limit")), 64);
  done(j, dir);

  spec.cgroup_limits = false;
  j = write_and_load(&spec, &dir);
  res = json_object_get(json_object_get(j, "linux"), "resources");
  assert_null(json_object_get(res, "memory"));
  assert_null(json_object_get(res, "pids"));
  done(j, dir);
}

static void test_bundle_devices_default_deny_plus_gpu_nodes(void **state) {
  (void)state;
  char *dir;
  /* /dev/null stands in for a GPU node: any character device will do. */
  const char *const devs[] = {"/dev/null", NULL};
  gn_bundle_spec spec = {.argv = argv_echo, .devices = devs, .visible_devices = "0,1"};
  json_t *j = write_and_load(&spec, &dir);
  json_t *lx = json_object_get(j, "linux");
  json_t *rules = json_object_get(json_object_get(lx, "resources"), "devices");
  json_t *deny = json_array_get(rules, 0);
  assert_true(json_is_false(json_object_get(deny, "allow")));
  assert_string_equal(json_string_value(json_object_get(deny, "access")), "rwm");
  assert_null(json_object_get(deny, "major")); /* all devices */
  json_t *allow = json_array_get(rules, 1);
  assert_true(json_is_true(json_object_get(allow, "allow")));
  assert_int_equal(json_integer_value(json_object_get(allow, "major")), 1);
  assert_int_equal(json_integer_value(json_object_get(allow, "minor")), 3);
  json_t *d = json_array_get(json_object_get(lx, "devices"), 0);
  assert_string_equal(json_string_value(json_object_get(d, "path")), "/dev/null");
  assert_string_equal(json_string_value(json_object_get(d, "type")), "c");
  assert_int_equal(json_integer_value(json_object_get(d, "major")), 1);
  assert_int_equal(json_integer_value(json_object_get(d, "minor")), 3);
  assert_true(array_has_string(json_object_get(json_object_get(j, "process"), "env"), "NVIDIA_VISIBLE_DEVICES=0,1"));
  done(j, dir);
}

static void test_bundle_refuses_bad_specs(void **state) {
  (void)state;
  const char *const empty_argv[] = {NULL};
  const char *const bad_env[] = {"NOEQUALS", NULL};
  const char *const not_dev[] = {"/etc/passwd", NULL};
  const char *const dir_dev[] = {"/dev/", NULL};
  const char *const escape_dev[] = {"/dev/../etc/passwd", NULL};
  const char *const missing_dev[] = {"/dev/nvidia-does-not-exist", NULL};
  struct {
    gn_bundle_spec spec;
    int code;
  } cases[] = {
      {{.argv = NULL}, GN_EINVAL},
      {{.argv = empty_argv}, GN_EINVAL},
      {{.argv = argv_echo, .env = bad_env}, GN_EINVAL},
      {{.argv = argv_echo, .cwd = "relative"}, GN_EINVAL},
      {{.argv = argv_echo, .hostname = "bad host"}, GN_EINVAL},
      {{.argv = argv_echo, .rootfs = "../elsewhere"}, GN_EINVAL},
      {{.argv = argv_echo, .visible_devices = "0;rm -rf"}, GN_EINVAL},
      {{.argv = argv_echo, .devices = not_dev}, GN_EINVAL},
      {{.argv = argv_echo, .devices = dir_dev}, GN_EINVAL},
      {{.argv = argv_echo, .devices = escape_dev}, GN_EINVAL},
      {{.argv = argv_echo, .devices = missing_dev}, -ENOENT},
  };
  char *dir = th_mkdtemp("badbundle");
  char path[512];
  snprintf(path, sizeof(path), "%s/config.json", dir);
  for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
    int rc = gn_bundle_write(dir, &cases[i].spec);
    if (rc != cases[i].code)
      fail_msg("case %zu: got %d, wanted %d", i, rc, cases[i].code);
    assert_false(th_exists(path));
  }
  th_rm_rf(dir);
  free(dir);
}

static void test_cgroup_limits_supported_matches_layout(void **state) {
  (void)state;
  struct statfs a, b;
  bool v1 = statfs("/sys/fs/cgroup/memory", &a) == 0 && a.f_type == 0x27e0eb /* CGROUP_SUPER_MAGIC */ &&
            statfs("/sys/fs/cgroup/pids", &b) == 0 && b.f_type == 0x27e0eb;
  bool v2 = false;
  char *ctl = th_read_file("/sys/fs/cgroup/cgroup.controllers", NULL);
  if (ctl) {
    v2 = strstr(ctl, "memory") && strstr(ctl, "pids");
    free(ctl);
  }
  assert_int_equal(gn_cgroup_limits_supported(), v1 || v2);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_bundle_process_is_unprivileged),
      cmocka_unit_test(test_bundle_root_is_readonly_with_tmpfs_tmp),
      cmocka_unit_test(test_bundle_has_new_namespaces_and_masks),
      cmocka_unit_test(test_bundle_limits_only_when_cgroups_apply_them),
      cmocka_unit_test(test_bundle_devices_default_deny_plus_gpu_nodes),
      cmocka_unit_test(test_bundle_refuses_bad_specs),
      cmocka_unit_test(test_cgroup_limits_supported_matches_layout),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
