/* OCI runtime detection, argv builders and the blocking exec helper. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <gpunet/sandbox.h>
#include <errno.h>
#include <poll.h>
#include <signal.h>
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
    setenv("GN_CGROUP_HYBRID", "0", 1);
    assert_int_equal(gn_runtime_detect("crun", &rt, err, sizeof(err)), 0);
    assert_int_equal(rt.kind, GN_RUNTIME_CRUN);
    assert_non_null(strstr(rt.path, "crun"));
    /* On a hybrid cgroup layout crun would fail every job: refused at
     * start, naming why and what to use. */
    setenv("GN_CGROUP_HYBRID", "1", 1);
    err[0] = 0;
    assert_int_equal(gn_runtime_detect("crun", &rt, err, sizeof(err)), GN_EUNSUPPORTED);
    assert_non_null(strstr(err, "hybrid cgroup layout"));
    assert_non_null(strstr(err, "runc"));
    unsetenv("GN_CGROUP_HYBRID");
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

/* The runtime's state is looked for as state_root/id, and only an id that
 * could be a container's is looked up (else: "may be there"). */
static void test_has_state_looks_for_the_container_dir(void **state) {
  (void)state;
  char *root = th_mkdtemp("rtstate");
  char dir[600];
  assert_false(gn_runtime_has_state(root, "gn-j-1"));
  snprintf(dir, sizeof dir, "%s/gn-j-1", root);
  assert_int_equal(mkdir(dir, 0700), 0);
  assert_true(gn_runtime_has_state(root, "gn-j-1"));
  assert_false(gn_runtime_has_state(root, "gn-j-2"));
  assert_true(gn_runtime_has_state(root, "../x"));
  assert_true(gn_runtime_has_state(NULL, "gn-j-2"));
  th_rm_rf(root);
  free(root);
}

/* Waits (at most 10 s) for a pidfd to turn readable: the process ended. */
static bool pidfd_ends(int pidfd) {
  struct pollfd pf = {.fd = pidfd, .events = POLLIN};
  return poll(&pf, 1, 10000) == 1 && (pf.revents & POLLIN);
}

/* A job's start: output on the given descriptors, stdin empty, nothing
 * else of the daemon's open, no signal ignored or blocked (the daemon
 * ignores SIGPIPE and blocks some), the end seen on the pidfd. */
static void test_spawn_gives_the_child_only_its_stdio(void **state) {
  (void)state;
  if (!gn_runtime_spawn_supported()) {
    print_message("skipped: no pidfd_open here (Linux before 5.3)\n");
    skip();
  }
  int leak = open("/dev/null", O_RDONLY); /* not close-on-exec */
  assert_true(leak > 2);
  sigset_t block, old;
  sigemptyset(&block);
  sigaddset(&block, SIGUSR1);
  sigprocmask(SIG_BLOCK, &block, &old);
  signal(SIGPIPE, SIG_IGN);
  char script[512];
  snprintf(script, sizeof script,
           "read x && echo stdin-not-empty; [ -e /proc/self/fd/%d ] && echo fd-leaked; "
           "grep -E '^Sig(Ign|Blk)' /proc/self/status; echo err >&2; exit 5",
           leak);
  char *const argv[] = {"/bin/sh", "-c", script, NULL};
  char tout[] = "/tmp/gn-spawn-out-XXXXXX", terr[] = "/tmp/gn-spawn-err-XXXXXX";
  int out = mkstemp(tout), err = mkstemp(terr);
  assert_true(out >= 0 && err >= 0);
  pid_t pid = 0;
  int pidfd = -1, status = -1;
  assert_int_equal(gn_runtime_spawn(argv, out, err, &pid, &pidfd), 0);
  signal(SIGPIPE, SIG_DFL);
  sigprocmask(SIG_SETMASK, &old, NULL);
  assert_true(pid > 0 && pidfd > 2);
  assert_true(fcntl(pidfd, F_GETFD) & FD_CLOEXEC);
  assert_true(pidfd_ends(pidfd));
  assert_int_equal(gn_runtime_reap(pid, &status), 0);
  assert_int_equal(status, 5);
  char *o = th_read_file(tout, NULL), *e = th_read_file(terr, NULL);
  /* All signals, glibc's own two (32, 33) included: a Go runtime such as
   * runc's would hand an ignored one on to the job. */
  unsigned long long blk = ~0ull, ign = ~0ull;
  assert_int_equal(sscanf(o, "SigBlk:\t%llx\nSigIgn:\t%llx", &blk, &ign), 2);
  assert_int_equal(blk, 0);
  assert_int_equal(ign, 0);
  assert_null(strstr(o, "stdin-not-empty"));
  assert_null(strstr(o, "fd-leaked"));
  assert_string_equal(e, "err\n");
  free(o);
  free(e);
  close(pidfd);
  close(leak);
  close(out);
  close(err);
  unlink(tout);
  unlink(terr);
}

/* While the process runs, reaping says so and leaves it be; a signal ends
 * it, the pidfd says when, and the status names the signal. */
static void test_spawn_reap_waits_for_the_end(void **state) {
  (void)state;
  if (!gn_runtime_spawn_supported()) {
    print_message("skipped: no pidfd_open here (Linux before 5.3)\n");
    skip();
  }
  char *const argv[] = {"/bin/sleep", "30", NULL};
  pid_t pid = 0;
  int pidfd = -1, status = -1;
  assert_int_equal(gn_runtime_spawn(argv, -1, -1, &pid, &pidfd), 0);
  assert_int_equal(gn_runtime_reap(pid, &status), -EAGAIN);
  assert_int_equal(status, -1);
  struct pollfd pf = {.fd = pidfd, .events = POLLIN};
  assert_int_equal(poll(&pf, 1, 50), 0);
  assert_int_equal(kill(pid, SIGKILL), 0);
  assert_true(pidfd_ends(pidfd));
  assert_int_equal(gn_runtime_reap(pid, &status), 0);
  assert_int_equal(status, 128 + SIGKILL);
  close(pidfd);
}

/* A runtime path that cannot be run starts nothing and says why. */
static void test_spawn_refuses_a_missing_binary(void **state) {
  (void)state;
  char *const argv[] = {"/nonexistent/runc", "run", NULL};
  pid_t pid = 0;
  int pidfd = -1;
  int r = gn_runtime_spawn(argv, -1, -1, &pid, &pidfd);
  assert_true(r == -ENOENT || r == GN_EUNSUPPORTED);
  assert_int_equal(pid, 0);
  assert_int_equal(pidfd, -1);
  assert_int_equal(gn_runtime_spawn(NULL, -1, -1, &pid, &pidfd), GN_EINVAL);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_detect_auto_follows_cgroup_layout),
      cmocka_unit_test(test_detect_explicit_name_wins),
      cmocka_unit_test(test_detect_refuses_missing_or_foreign_binary),
      cmocka_unit_test(test_argv_builders),
      cmocka_unit_test(test_exec_reports_exit_status_and_output),
      cmocka_unit_test(test_has_state_looks_for_the_container_dir),
      cmocka_unit_test(test_spawn_gives_the_child_only_its_stdio),
      cmocka_unit_test(test_spawn_reap_waits_for_the_end),
      cmocka_unit_test(test_spawn_refuses_a_missing_binary),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
