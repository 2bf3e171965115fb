/* OCI runtime detection, argv builders and the blocking exec helper. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <gpunet/sandbox.h>
#include <sys/statfs.h>

#include "sandbox/helpers.h"

#define CGROUP2_MAGIC 0x63677270

static bool have(const char *name) {
  char cmd[256];
  snprintf(cmd, sizeof(cmd), "PATH=$PATH:/usr/sbin:/sbin command -v %s >/dev/null", name);
  return th_run(cmd, NULL, 0) == 0;
}

static void test_detect_auto_follows_cgroup_layout(void **state) {
  (void)state;
  gn_runtime rt;
  char err[256] = "";
  struct statfs sf;
  assert_int_equal(statfs("/sys/fs/cgroup", &sf), 0);
  bool unified = sf.f_type == CGROUP2_MAGIC;
  if (!have("runc") && !have("crun")) {
    assert_int_equal(gn_runtime_detect(NULL, &rt, err, sizeof(err)), GN_EUNSUPPORTED);
    assert_non_null(strstr(err, "runc"));
    return;
  }
  int rc = gn_runtime_detect(NULL, &rt, err, sizeof(err));
  if (rc)
    fail_msg("detect: %d %s", rc, err);
  if (!unified && have("runc")) {
    /* A v1 or hybrid host (like this one) must get runc: crun refuses hybrid. */
    assert_int_equal(rt.kind, GN_RUNTIME_RUNC);
  } else if (unified && have("crun")) {
    assert_int_equal(rt.kind, GN_RUNTIME_CRUN);
  }
  assert_true(rt.path[0] == '/');
  assert_true(rt.version[0] >= '0' && rt.version[0] <= '9');
  /* "auto" means the same as NULL. */
  gn_runtime rt2;
  assert_int_equal(gn_runtime_detect("auto", &rt2, err, sizeof(err)), 0);
  assert_int_equal(rt2.kind, rt.kind);
}

static void test_detect_explicit_name_wins(void **state) {
  (void)state;
  gn_runtime rt;
  char err[256] = "";
  if (have("crun")) {
    assert_int_equal(gn_runtime_detect("crun", &rt, err, sizeof(err)), 0);
    assert_int_equal(rt.kind, GN_RUNTIME_CRUN);
    assert_non_null(strstr(rt.path, "crun"));
  }
  if (have("runc")) {
    assert_int_equal(gn_runtime_detect("runc", &rt, err, sizeof(err)), 0);
    assert_int_equal(rt.kind, GN_RUNTIME_RUNC);
    char path[256];
    snprintf(path, sizeof(path), "%s", rt.path);
    assert_int_equal(gn_runtime_detect(path, &rt, err, sizeof(err)), 0); /* by path */
    assert_string_equal(rt.path, path);
  }
}

static void test_detect_refuses_missing_or_foreign_binary(void **state) {
  (void)state;
  gn_runtime rt;
  memset(&rt, 0x5a, sizeof(rt));
  gn_runtime before = rt;
  char err[256] = "";
  assert_int_equal(gn_runtime_detect("/nonexistent/runc", &rt, err, sizeof(err)), GN_ENOTFOUND);
  assert_non_null(strstr(err, "/nonexistent/runc"));
  /* /bin/true runs but is no OCI runtime. */
  assert_int_equal(gn_runtime_detect("/bin/true", &rt, err, sizeof(err)), GN_EUNSUPPORTED);
  assert_memory_equal(&rt, &before, sizeof(rt));
}

static void test_argv_builders(void **state) {
  (void)state;
  gn_runtime rt = {.kind = GN_RUNTIME_RUNC, .path = "/usr/sbin/runc"};
  char **v = NULL;
  assert_int_equal(gn_runtime_argv_run(&rt, "/run/gn", "/b/j1", "j1", &v), 0);
  const char *run[] = {"/usr/sbin/runc", "--root", "/run/gn", "run", "--bundle", "/b/j1", "j1", NULL};
  for (size_t i = 0; run[i]; i++)
    assert_string_equal(v[i], run[i]);
  assert_null(v[7]);
  v = gn_argv_free(v);
  assert_null(v);
  assert_int_equal(gn_runtime_argv_kill(&rt, "/run/gn", "j1", "KILL", &v), 0);
  assert_string_equal(v[3], "kill");
  assert_string_equal(v[4], "j1");
  assert_string_equal(v[5], "KILL");
  assert_null(v[6]);
  v = gn_argv_free(v);
  assert_int_equal(gn_runtime_argv_delete(&rt, "/run/gn", "j1", &v), 0);
  assert_string_equal(v[3], "delete");
  assert_string_equal(v[4], "-f");
  assert_string_equal(v[5], "j1");
  v = gn_argv_free(v);
  /* Ids and signals that could be read as options or paths are refused. */
  assert_int_equal(gn_runtime_argv_run(&rt, "/run/gn", "/b", "-rf", &v), GN_EINVAL);
  assert_int_equal(gn_runtime_argv_run(&rt, "/run/gn", "/b", "a/b", &v), GN_EINVAL);
  assert_int_equal(gn_runtime_argv_run(&rt, "/run/gn", "/b", "", &v), GN_EINVAL);
  assert_int_equal(gn_runtime_argv_kill(&rt, "/run/gn", "j1", "--all", &v), GN_EINVAL);
  assert_null(v);
  assert_null(gn_argv_free(NULL));
}

static void test_exec_reports_exit_status_and_output(void **state) {
  (void)state;
  char *const ok[] = {"/bin/sh", "-c", "echo out; exit 3", NULL};
  char *const sig[] = {"/bin/sh", "-c", "kill -9 $$", NULL};
  int status = -1;
  char tmpl[] = "/tmp/gn-exec-XXXXXX";
  int fd = mkstemp(tmpl);
  assert_true(fd >= 0);
  assert_int_equal(gn_runtime_exec_io(ok, -1, fd, -1, &status), 0);
  assert_int_equal(status, 3);
  char *out = th_read_file(tmpl, NULL);
  assert_string_equal(out, "out\n");
  free(out);
  close(fd);
  unlink(tmpl);
  assert_int_equal(gn_runtime_exec((char **)sig, &status), 0);
  assert_int_equal(status, 128 + 9);
  char *const missing[] = {"/nonexistent/binary", NULL};
  assert_int_equal(gn_runtime_exec((char **)missing, &status), 0);
  assert_int_equal(status, 127);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_detect_auto_follows_cgroup_layout),        cmocka_unit_test(test_detect_explicit_name_wins),
      cmocka_unit_test(test_detect_refuses_missing_or_foreign_binary), cmocka_unit_test(test_argv_builders),
      cmocka_unit_test(test_exec_reports_exit_status_and_output),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
