/* OCI bundle generation: config.json written by gn_bundle_write, read back
 * with jansson and checked field by field; malformed specs refused. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <gpunet/sandbox.h>
#include <jansson.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/sysmacros.h>

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
  assert_true(th_json_has_string(env, "FOO=bar"));
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
  json_t *nofile = th_json_find_by(rl, "type", "RLIMIT_NOFILE");
  json_t *core = th_json_find_by(rl, "type", "RLIMIT_CORE");
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
    json_t *m = th_json_find_by(mounts, "destination", want[i][0]);
    if (!m)
      fail_msg("no mount at %s", want[i][0]);
    assert_string_equal(json_string_value(json_object_get(m, "type")), want[i][1]);
  }
  json_t *sys = json_object_get(th_json_find_by(mounts, "destination", "/sys"), "options");
  assert_true(th_json_has_string(sys, "ro"));
  json_t *tmp = json_object_get(th_json_find_by(mounts, "destination", "/tmp"), "options");
  assert_true(th_json_has_string(tmp, "nosuid"));
  assert_true(th_json_has_string(tmp, "nodev"));
  assert_true(th_json_has_string(tmp, "size=64m"));
  assert_false(th_json_has_string(tmp, "ro"));
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
    const char *want[] = {"pid", "ipc", "uts", "mount", "network", "cgroup"};
    for (size_t i = 0; i < 6; i++) {
      json_t *n = th_json_find_by(ns, "type", want[i]);
      if (!n)
        fail_msg("no %s namespace (network=%d)", want[i], network);
      assert_null(json_object_get(n, "path")); /* new, never joined */
    }
    assert_true(th_json_has_string(json_object_get(lx, "maskedPaths"), "/proc/kcore"));
    assert_true(th_json_has_string(json_object_get(lx, "maskedPaths"), "/sys/firmware"));
    assert_true(th_json_has_string(json_object_get(lx, "readonlyPaths"), "/proc/sys"));
    assert_true(th_json_has_string(json_object_get(lx, "readonlyPaths"), "/proc/sysrq-trigger"));
    assert_true(th_json_has_string(json_object_get(lx, "maskedPaths"), "/proc/driver/nvidia"));
    assert_true(th_json_has_string(json_object_get(lx, "maskedPaths"), "/sys/devices/virtual/powercap"));
    assert_null(th_json_find_by(ns, "type", "user")); /* only with spec.id_count */
    assert_null(json_object_get(lx, "uidMappings"));
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
  assert_true(th_json_has_string(json_object_get(json_object_get(j, "process"), "env"), "NVIDIA_VISIBLE_DEVICES=0,1"));
  done(j, dir);
}

/* A spec gn_bundle_write must refuse, and the code it must refuse it with. */
typedef struct bad_spec {
  gn_bundle_spec spec;
  int code;
} bad_spec;

/* Each spec is refused with its code, and no config.json is left. */
static void expect_refused(const char *tag, const bad_spec *cases, size_t n) {
  char *dir = th_mkdtemp(tag);
  char path[512];
  if (!dir)
    abort();
  snprintf(path, sizeof(path), "%s/config.json", dir);
  for (size_t i = 0; i < n; i++) {
    int rc = gn_bundle_write(dir, &cases[i].spec);
    if (rc != cases[i].code)
      fail_msg("case %zu: got %d, wanted %d", i, rc, cases[i].code);
    assert_false(th_exists(path));
  }
  th_rm_rf(dir);
  free(dir);
}

static void test_bundle_refuses_bad_specs(void **state) {
  (void)state;
  const char *const empty_argv[] = {NULL};
  const char *const bad_env[] = {"NOEQUALS", NULL};
  const char *const not_dev[] = {"/etc/passwd", NULL};
  const char *const dir_dev[] = {"/dev/", NULL};
  const char *const escape_dev[] = {"/dev/../etc/passwd", NULL};
  const char *const missing_dev[] = {"/dev/nvidia-does-not-exist", NULL};
  const bad_spec cases[] = {
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
  expect_refused("badbundle", cases, GN_ARRAY_SIZE(cases));
}

/* Calls the profile must refuse: none of them may appear in an ALLOW rule. */
static const char *const must_refuse[] = {"add_key",
                                          "request_key",
                                          "keyctl",
                                          "io_uring_setup",
                                          "io_uring_enter",
                                          "io_uring_register",
                                          "perf_event_open",
                                          "userfaultfd",
                                          "bpf",
                                          "mount",
                                          "umount",
                                          "umount2",
                                          "pivot_root",
                                          "move_mount",
                                          "open_tree",
                                          "fsopen",
                                          "fsconfig",
                                          "fsmount",
                                          "fspick",
                                          "mount_setattr",
                                          "setns",
                                          "ptrace",
                                          "process_vm_readv",
                                          "process_vm_writev",
                                          "kexec_load",
                                          "kexec_file_load",
                                          "init_module",
                                          "finit_module",
                                          "delete_module",
                                          "reboot",
                                          "swapon",
                                          "swapoff",
                                          "acct",
                                          "settimeofday",
                                          "clock_settime",
                                          "stime",
                                          "sethostname",
                                          "setdomainname",
                                          "syslog",
                                          "quotactl",
                                          "open_by_handle_at",
                                          "iopl",
                                          "ioperm",
                                          "kcmp",
                                          "pidfd_getfd",
                                          "chroot",
                                          "lookup_dcookie",
                                          "uselib",
                                          NULL};
/* Calls CUDA, PyTorch and ordinary programs need. */
static const char *const must_allow[] = {"mmap",
                                         "munmap",
                                         "mprotect",
                                         "mremap",
                                         "ioctl",
                                         "futex",
                                         "sched_yield",
                                         "sched_setaffinity",
                                         "sched_getaffinity",
                                         "execve",
                                         "read",
                                         "write",
                                         "openat",
                                         "fork",
                                         "wait4",
                                         "socket",
                                         "getrandom",
                                         "memfd_create",
                                         "eventfd2",
                                         "epoll_wait",
                                         "rt_sigaction",
                                         "prctl",
                                         "get_mempolicy",
                                         "mbind",
                                         "clone",
                                         "unshare",
                                         "set_robust_list",
                                         "rseq",
                                         "exit_group",
                                         NULL};

/* The rules naming call, in order. */
static size_t rules_for(json_t *syscalls, const char *call, json_t **ret, size_t cap) {
  size_t n = 0, i;
  json_t *r;
  json_array_foreach(syscalls, i, r) {
    if (th_json_has_string(json_object_get(r, "names"), call) && n < cap)
      ret[n++] = r;
  }
  return n;
}

static bool is_action(json_t *rule, const char *action) {
  return strcmp(json_string_value(json_object_get(rule, "action")), action) == 0;
}

static void test_bundle_seccomp_refuses_dangerous_calls(void **state) {
  (void)state;
  char *dir;
  gn_bundle_spec spec = {.argv = argv_echo};
  json_t *j = write_and_load(&spec, &dir);
  json_t *sc = json_object_get(json_object_get(j, "linux"), "seccomp");
  assert_non_null(sc);
  assert_string_equal(json_string_value(json_object_get(sc, "defaultAction")), "SCMP_ACT_ERRNO");
  assert_int_equal(json_integer_value(json_object_get(sc, "defaultErrnoRet")), 1); /* EPERM */
#if defined(__x86_64__)
  json_t *arches = json_object_get(sc, "architectures");
  assert_true(th_json_has_string(arches, "SCMP_ARCH_X86_64"));
  assert_true(th_json_has_string(arches, "SCMP_ARCH_X86"));
  assert_true(th_json_has_string(arches, "SCMP_ARCH_X32"));
#elif defined(__aarch64__)
  assert_true(th_json_has_string(json_object_get(sc, "architectures"), "SCMP_ARCH_AARCH64"));
#endif
  json_t *syscalls = json_object_get(sc, "syscalls");
  json_t *found[16];
  for (size_t i = 0; must_refuse[i]; i++) {
    size_t n = rules_for(syscalls, must_refuse[i], found, 16);
    for (size_t k = 0; k < n; k++)
      if (is_action(found[k], "SCMP_ACT_ALLOW"))
        fail_msg("%s is allowed", must_refuse[i]);
  }
  for (size_t i = 0; must_allow[i]; i++) {
    size_t n = rules_for(syscalls, must_allow[i], found, 16);
    bool ok = false;
    for (size_t k = 0; k < n; k++)
      ok = ok || is_action(found[k], "SCMP_ACT_ALLOW");
    if (!ok)
      fail_msg("%s is not allowed", must_allow[i]);
  }
  /* clone and unshare only without namespace flags: one ALLOW rule each,
   * (flags & mask) == 0 with CLONE_NEWUSER in the mask. */
  const char *ns_calls[] = {"clone", "unshare"};
  for (size_t i = 0; i < 2; i++) {
    assert_int_equal(rules_for(syscalls, ns_calls[i], found, 16), 1);
    json_t *arg = json_array_get(json_object_get(found[0], "args"), 0);
    assert_non_null(arg);
    assert_int_equal(json_integer_value(json_object_get(arg, "index")), 0);
    assert_string_equal(json_string_value(json_object_get(arg, "op")), "SCMP_CMP_MASKED_EQ");
    json_int_t mask = json_integer_value(json_object_get(arg, "value"));
    assert_true(mask & 0x10000000);  /* CLONE_NEWUSER */
    assert_true(mask & 0x00020000);  /* CLONE_NEWNS */
    assert_true(mask & 0x40000000);  /* CLONE_NEWNET */
    assert_false(mask & 0x00010000); /* CLONE_THREAD: threads must work */
    assert_int_equal(json_integer_value(json_object_get(arg, "valueTwo")), 0);
  }
  /* clone3's flags are out of a filter's reach: ENOSYS, so libc uses clone. */
  assert_int_equal(rules_for(syscalls, "clone3", found, 16), 1);
  assert_true(is_action(found[0], "SCMP_ACT_ERRNO"));
  assert_int_equal(json_integer_value(json_object_get(found[0], "errnoRet")), 38);
  done(j, dir);

  spec.no_seccomp = true;
  j = write_and_load(&spec, &dir);
  assert_null(json_object_get(json_object_get(j, "linux"), "seccomp"));
  done(j, dir);
}

static void test_bundle_user_namespace_maps_ids(void **state) {
  (void)state;
  char *dir;
  gn_bundle_spec spec = {.argv = argv_echo, .uid_base = 200000, .gid_base = 300000, .id_count = 65536};
  json_t *j = write_and_load(&spec, &dir);
  json_t *lx = json_object_get(j, "linux");
  json_t *user = th_json_find_by(json_object_get(lx, "namespaces"), "type", "user");
  assert_non_null(user);
  assert_null(json_object_get(user, "path"));
  const char *maps[] = {"uidMappings", "gidMappings"};
  json_int_t bases[] = {200000, 300000};
  for (size_t i = 0; i < 2; i++) {
    json_t *m = json_object_get(lx, maps[i]);
    assert_int_equal(json_array_size(m), 1);
    json_t *e = json_array_get(m, 0);
    assert_int_equal(json_integer_value(json_object_get(e, "containerID")), 0);
    assert_int_equal(json_integer_value(json_object_get(e, "hostID")), bases[i]);
    assert_int_equal(json_integer_value(json_object_get(e, "size")), 65536);
  }
  /* Root inside: host uid 200000 outside. */
  json_t *u = json_object_get(json_object_get(j, "process"), "user");
  assert_int_equal(json_integer_value(json_object_get(u, "uid")), 0);
  assert_int_equal(json_integer_value(json_object_get(u, "gid")), 0);
  /* The job's host uid must be able to pass through the bundle dir. */
  struct stat st;
  assert_int_equal(stat(dir, &st), 0);
  assert_int_equal(st.st_mode & 0777, 0711);
  /* devpts keeps gid=5, which the range maps. */
  json_t *pts = json_object_get(th_json_find_by(json_object_get(j, "mounts"), "destination", "/dev/pts"), "options");
  assert_true(th_json_has_string(pts, "gid=5"));
  done(j, dir);
}

static void test_bundle_cpu_limit_only_when_cgroups_apply_it(void **state) {
  (void)state;
  char *dir;
  gn_bundle_spec spec = {.argv = argv_echo, .cpu_quota_us = 250000, .cpu_period_us = 50000, .cgroup_limits = true};
  json_t *j = write_and_load(&spec, &dir);
  json_t *cpu = json_object_get(json_object_get(json_object_get(j, "linux"), "resources"), "cpu");
  assert_int_equal(json_integer_value(json_object_get(cpu, "quota")), 250000);
  assert_int_equal(json_integer_value(json_object_get(cpu, "period")), 50000);
  done(j, dir);

  spec.cpu_period_us = 0; /* the default period */
  j = write_and_load(&spec, &dir);
  cpu = json_object_get(json_object_get(json_object_get(j, "linux"), "resources"), "cpu");
  assert_int_equal(json_integer_value(json_object_get(cpu, "quota")), 250000);
  assert_int_equal(json_integer_value(json_object_get(cpu, "period")), 100000);
  done(j, dir);

  spec.cgroup_limits = false;
  j = write_and_load(&spec, &dir);
  assert_null(json_object_get(json_object_get(json_object_get(j, "linux"), "resources"), "cpu"));
  done(j, dir);
}

/* A fake GPU control node: a character device with NVIDIA's major made in a
 * temp dir (needs CAP_MKNOD). NULL, after saying why, when it cannot. */
static char *make_fake_node(char **ret_tmp) {
  char *tmp = th_mkdtemp("fakedev");
  assert_non_null(tmp);
  char *node = malloc(300);
  if (!tmp || !node)
    abort(); /* -O2 cannot see that assert_non_null does not return */
  snprintf(node, 300, "%s/nvidiactl", tmp);
  if (mknod(node, S_IFCHR | 0666, makedev(195, 255)) < 0) {
    fprintf(stderr, "skipped: mknod needs root here (%s)\n", strerror(errno));
    th_rm_rf(tmp);
    free(tmp);
    free(node);
    return NULL;
  }
  *ret_tmp = tmp;
  return node;
}

static void test_bundle_dev_nodes_from_source_numbers(void **state) {
  (void)state;
  char *dir, *tmp = NULL;
  char *node = make_fake_node(&tmp);
  if (!node)
    skip();
  gn_bundle_bind nodes[] = {{.source = node, .dest = "/dev/nvidiactl"}};
  gn_bundle_spec spec = {.argv = argv_echo, .dev_nodes = nodes, .n_dev_nodes = 1};
  json_t *j = write_and_load(&spec, &dir);
  json_t *lx = json_object_get(j, "linux");
  json_t *d = th_json_find_by(json_object_get(lx, "devices"), "path", "/dev/nvidiactl");
  assert_non_null(d);
  assert_string_equal(json_string_value(json_object_get(d, "type")), "c");
  assert_int_equal(json_integer_value(json_object_get(d, "major")), 195);
  assert_int_equal(json_integer_value(json_object_get(d, "minor")), 255);
  json_t *rules = json_object_get(json_object_get(lx, "resources"), "devices");
  json_t *allow = json_array_get(rules, json_array_size(rules) - 1);
  assert_true(json_is_true(json_object_get(allow, "allow")));
  assert_int_equal(json_integer_value(json_object_get(allow, "major")), 195);
  assert_int_equal(json_integer_value(json_object_get(allow, "minor")), 255);
  assert_string_equal(json_string_value(json_object_get(allow, "access")), "rwm");
  done(j, dir);

  /* In a user namespace no one can mknod: the node is bind-mounted from its
   * source instead, and the cgroup rule stays. */
  spec.uid_base = spec.gid_base = 100000;
  spec.id_count = 65536;
  j = write_and_load(&spec, &dir);
  lx = json_object_get(j, "linux");
  assert_null(th_json_find_by(json_object_get(lx, "devices"), "path", "/dev/nvidiactl"));
  json_t *m = th_json_find_by(json_object_get(j, "mounts"), "destination", "/dev/nvidiactl");
  assert_non_null(m);
  assert_string_equal(json_string_value(json_object_get(m, "source")), node);
  assert_string_equal(json_string_value(json_object_get(m, "type")), "bind");
  rules = json_object_get(json_object_get(lx, "resources"), "devices");
  allow = json_array_get(rules, json_array_size(rules) - 1);
  assert_int_equal(json_integer_value(json_object_get(allow, "major")), 195);
  done(j, dir);
  th_rm_rf(tmp);
  free(tmp);
  free(node);
}

static void test_bundle_ro_binds_are_read_only_binds(void **state) {
  (void)state;
  char *dir;
  gn_bundle_bind binds[] = {{.source = "/etc/hostname", .dest = "/usr/lib/x86_64-linux-gnu/libcuda.so.1"},
                            {.source = "/usr/bin", .dest = "/usr/local/nvidia/bin"}};
  gn_bundle_spec spec = {.argv = argv_echo, .ro_binds = binds, .n_ro_binds = 2};
  if (!th_exists("/etc/hostname"))
    binds[0].source = "/etc/passwd";
  json_t *j = write_and_load(&spec, &dir);
  json_t *mounts = json_object_get(j, "mounts");
  for (size_t i = 0; i < 2; i++) {
    json_t *m = th_json_find_by(mounts, "destination", binds[i].dest);
    if (!m)
      fail_msg("no mount at %s", binds[i].dest);
    assert_string_equal(json_string_value(json_object_get(m, "type")), "bind");
    assert_string_equal(json_string_value(json_object_get(m, "source")), binds[i].source);
    json_t *o = json_object_get(m, "options");
    const char *want[] = {"bind", "rbind", "ro", "nosuid", "nodev"};
    for (size_t k = 0; k < 5; k++)
      assert_true(th_json_has_string(o, want[k]));
  }
  done(j, dir);
}

static void test_bundle_refuses_bad_isolation_specs(void **state) {
  (void)state;
  char *tmp = th_mkdtemp("badiso");
  char regular[300];
  snprintf(regular, sizeof(regular), "%s/not-a-device", tmp);
  assert_int_equal(th_write_file(regular, "x", 1), 0);
  gn_bundle_bind not_chr[] = {{.source = regular, .dest = "/dev/nvidiactl"}};
  gn_bundle_bind dir_src[] = {{.source = "/dev", .dest = "/dev/nvidiactl"}};
  gn_bundle_bind missing[] = {{.source = "/dev/gn-does-not-exist", .dest = "/dev/nvidiactl"}};
  gn_bundle_bind outside_dev[] = {{.source = "/dev/null", .dest = "/etc/nvidiactl"}};
  gn_bundle_bind dotdot_dev[] = {{.source = "/dev/null", .dest = "/dev/../etc/x"}};
  gn_bundle_bind rel_src[] = {{.source = "dev/null", .dest = "/dev/x"}};
  gn_bundle_bind null_dest[] = {{.source = "/dev/null", .dest = NULL}};
  gn_bundle_bind ro_rel[] = {{.source = "/etc/passwd", .dest = "usr/lib/x"}};
  gn_bundle_bind ro_dotdot[] = {{.source = "/etc/passwd", .dest = "/usr/../../etc/x"}};
  gn_bundle_bind ro_dot[] = {{.source = "/etc/passwd", .dest = "/usr/./lib"}};
  gn_bundle_bind ro_root[] = {{.source = "/etc", .dest = "/"}};
  gn_bundle_bind ro_proc[] = {{.source = "/etc/passwd", .dest = "/proc/keys"}};
  gn_bundle_bind ro_sys[] = {{.source = "/etc", .dest = "/sys/fs"}};
  gn_bundle_bind ro_missing[] = {{.source = "/gn-no-such-lib.so", .dest = "/usr/lib/x.so"}};
  gn_bundle_bind ro_ctl[] = {{.source = "/etc/passwd", .dest = "/usr/lib/a\nb"}};
  const bad_spec cases[] = {
      {{.argv = argv_echo, .dev_nodes = not_chr, .n_dev_nodes = 1}, GN_EINVAL},
      {{.argv = argv_echo, .dev_nodes = dir_src, .n_dev_nodes = 1}, GN_EINVAL},
      {{.argv = argv_echo, .dev_nodes = missing, .n_dev_nodes = 1}, -ENOENT},
      {{.argv = argv_echo, .dev_nodes = outside_dev, .n_dev_nodes = 1}, GN_EINVAL},
      {{.argv = argv_echo, .dev_nodes = dotdot_dev, .n_dev_nodes = 1}, GN_EINVAL},
      {{.argv = argv_echo, .dev_nodes = rel_src, .n_dev_nodes = 1}, GN_EINVAL},
      {{.argv = argv_echo, .dev_nodes = null_dest, .n_dev_nodes = 1}, GN_EINVAL},
      {{.argv = argv_echo, .dev_nodes = NULL, .n_dev_nodes = 1}, GN_EINVAL},
      {{.argv = argv_echo, .ro_binds = ro_rel, .n_ro_binds = 1}, GN_EINVAL},
      {{.argv = argv_echo, .ro_binds = ro_dotdot, .n_ro_binds = 1}, GN_EINVAL},
      {{.argv = argv_echo, .ro_binds = ro_dot, .n_ro_binds = 1}, GN_EINVAL},
      {{.argv = argv_echo, .ro_binds = ro_root, .n_ro_binds = 1}, GN_EINVAL},
      {{.argv = argv_echo, .ro_binds = ro_proc, .n_ro_binds = 1}, GN_EINVAL},
      {{.argv = argv_echo, .ro_binds = ro_sys, .n_ro_binds = 1}, GN_EINVAL},
      {{.argv = argv_echo, .ro_binds = ro_missing, .n_ro_binds = 1}, -ENOENT},
      {{.argv = argv_echo, .ro_binds = ro_ctl, .n_ro_binds = 1}, GN_EINVAL},
      {{.argv = argv_echo, .ro_binds = NULL, .n_ro_binds = 2}, GN_EINVAL},
      {{.argv = argv_echo, .ro_binds = ro_rel, .n_ro_binds = 100000}, GN_ETOOBIG},
      /* user namespaces: root onto host root, ranges past the last id */
      {{.argv = argv_echo, .uid_base = 0, .gid_base = 100000, .id_count = 65536}, GN_EINVAL},
      {{.argv = argv_echo, .uid_base = 100000, .gid_base = 0, .id_count = 65536}, GN_EINVAL},
      {{.argv = argv_echo, .uid_base = 4294960000u, .gid_base = 100000, .id_count = 65536}, GN_EINVAL},
      /* CPU: below the kernel's 1 ms, a period alone, a period over 1 s */
      {{.argv = argv_echo, .cpu_quota_us = 999, .cgroup_limits = true}, GN_EINVAL},
      {{.argv = argv_echo, .cpu_period_us = 100000, .cgroup_limits = true}, GN_EINVAL},
      {{.argv = argv_echo, .cpu_quota_us = 100000, .cpu_period_us = 2000000, .cgroup_limits = true}, GN_EINVAL},
  };
  expect_refused("badiso-bundle", cases, GN_ARRAY_SIZE(cases));
  th_rm_rf(tmp);
  free(tmp);
}

static void test_cgroup_limits_supported_matches_layout(void **state) {
  (void)state;
  struct statfs a, b, c;
  bool v1 = statfs("/sys/fs/cgroup/memory", &a) == 0 && a.f_type == 0x27e0eb /* CGROUP_SUPER_MAGIC */ &&
            statfs("/sys/fs/cgroup/pids", &b) == 0 && b.f_type == 0x27e0eb && statfs("/sys/fs/cgroup/cpu", &c) == 0 &&
            c.f_type == 0x27e0eb;
  bool v2 = false;
  char *ctl = th_read_file("/sys/fs/cgroup/cgroup.controllers", NULL);
  if (ctl) {
    /* " cpu " as a word: "cpuset" is another controller. */
    char words[600];
    snprintf(words, sizeof(words), " %s ", ctl);
    for (char *p = words; *p; p++)
      if (*p == '\n')
        *p = ' ';
    v2 = strstr(words, " memory ") && strstr(words, " pids ") && strstr(words, " cpu ");
    free(ctl);
  }
  assert_int_equal(gn_cgroup_limits_supported(), v1 || v2);
}

static void test_bundle_writes_cgroups_path(void **state) {
  (void)state;
  char *dir;
  gn_bundle_spec spec = {.argv = argv_echo, .cgroups_path = "/gpunet/l-ab12/j-cd_34"};
  json_t *j = write_and_load(&spec, &dir);
  assert_string_equal(json_string_value(json_object_get(json_object_get(j, "linux"), "cgroupsPath")),
                      "/gpunet/l-ab12/j-cd_34");
  done(j, dir);

  spec.cgroups_path = NULL; /* the runtime's default: no key at all */
  j = write_and_load(&spec, &dir);
  assert_null(json_object_get(json_object_get(j, "linux"), "cgroupsPath"));
  done(j, dir);
}

static void test_bundle_refuses_bad_cgroups_paths(void **state) {
  (void)state;
  static const char *const bad[] = {
      "",
      "gpunet/l-1/j-1", /* relative: the runtime would put it under its own cgroup */
      "/",
      "//gpunet",
      "/gpunet/",
      "/gpunet//j-1",
      "/gpunet/../..",
      "/gpunet/./j-1",
      "/gpunet/l-1/..",
      "/gpunet/-l/j-1",
      "/gpunet/l 1/j-1",
      "/gpunet/l\n1/j-1",
      "/gpunet/l.1/j-1",
      "/a/b/c/d/e", /* deeper than any lease's job */
      "/gpunet/l-1234567890123456789012345678901234567890123456789012345678901234567890/j-1",
  };
  char *dir = th_mkdtemp("bundle");
  assert_non_null(dir);
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    gn_bundle_spec spec = {.argv = argv_echo, .cgroups_path = bad[i]};
    if (gn_bundle_write(dir, &spec) != GN_EINVAL)
      fail_msg("cgroupsPath \"%s\" was not refused", bad[i]);
  }
  char path[600];
  snprintf(path, sizeof path, "%s/config.json", dir);
  assert_int_not_equal(access(path, F_OK), 0); /* nothing written */
  gn_bundle_spec ok = {.argv = argv_echo, .cgroups_path = "/a/b/c/d"};
  assert_int_equal(gn_bundle_write(dir, &ok), 0);
  th_rm_rf(dir);
  free(dir);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_bundle_process_is_unprivileged),
      cmocka_unit_test(test_bundle_root_is_readonly_with_tmpfs_tmp),
      cmocka_unit_test(test_bundle_has_new_namespaces_and_masks),
      cmocka_unit_test(test_bundle_limits_only_when_cgroups_apply_them),
      cmocka_unit_test(test_bundle_devices_default_deny_plus_gpu_nodes),
      cmocka_unit_test(test_bundle_refuses_bad_specs),
      cmocka_unit_test(test_bundle_seccomp_refuses_dangerous_calls),
      cmocka_unit_test(test_bundle_user_namespace_maps_ids),
      cmocka_unit_test(test_bundle_cpu_limit_only_when_cgroups_apply_it),
      cmocka_unit_test(test_bundle_dev_nodes_from_source_numbers),
      cmocka_unit_test(test_bundle_ro_binds_are_read_only_binds),
      cmocka_unit_test(test_bundle_refuses_bad_isolation_specs),
      cmocka_unit_test(test_cgroup_limits_supported_matches_layout),
      cmocka_unit_test(test_bundle_writes_cgroups_path),
      cmocka_unit_test(test_bundle_refuses_bad_cgroups_paths),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
