/* A stop that reaches a provider's job after it is "running" but before the
 * OCI runtime has made its container (node/provider.c, 9369eeb): the
 * runtime's kill found "container does not exist", the TERM forwarded to
 * `runc run` was lost, the container's PID 1 (busybox sleep, which ignores
 * TERM as PID 1) ran on, and so did the job. Made deterministic here: the
 * provider's runtime (--runtime) is a wrapper script that, for `run`, waits
 * 1.5 s with TERM ignored before it execs the real runc (every other
 * subcommand goes straight through). A job running `sleep` is stopped as
 * soon as it reports running, by JOB_STOP and by the daemon's SIGTERM; it
 * must end within STOP_BOUND_MS with no container state or sleep process
 * left. Needs root, runc or crun, and the test registry (scripts/registry). */
#include <gpunet/billing.h>
#include <gpunet/identity.h>
#include <gpunet/transport.h>
#include <gpunet/wire.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
/* cmocka needs the above first. */
#include <cmocka.h>

#include <dirent.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "node/helpers.h"
#include "sandbox/helpers.h"

#define RUN_DELAY "1.5"      /* seconds the wrapper holds `run` back */
#define STOP_BOUND_MS 10000u /* from the stop to the job's end; gpunetd's shutdown watchdog is 20 s */

static struct {
  char dir[PATH_MAX];
  char addr[64];
  char real_rt[PATH_MAX]; /* the runtime the wrapper execs */
  pid_t daemon;
  uv_loop_t loop;
  gn_identity *prov_id, *req_id;
  gn_transport *tp;
  int up;
  tn_inbox in;
  tn_link link;
  char sleep_arg[16]; /* the job's `sleep N`, N of this test's own */
  char job[32];
} W;

static th_registry reg;
static const char *skip_why;

static bool find_runtime(const char *name, char *out, size_t cap) {
  char cmd[128];
  snprintf(cmd, sizeof cmd, "command -v %s 2>/dev/null", name);
  FILE *p = popen(cmd, "r");
  bool ok = p && fgets(out, (int)cap, p) && out[0] == '/';
  if (p)
    pclose(p);
  out[strcspn(out, "\n")] = 0;
  return ok;
}

static int group_setup(void **state) {
  (void)state;
  if (geteuid() != 0)
    skip_why = "needs root (the provider runs its jobs under a real runc)";
  else if (!find_runtime("runc", W.real_rt, sizeof W.real_rt) && !find_runtime("crun", W.real_rt, sizeof W.real_rt))
    skip_why = "needs runc or crun";
  else if (th_registry_start(&reg) < 0)
    skip_why = "cannot start the test registry (scripts/registry: docker-registry, umoci)";
  return 0;
}

static int group_teardown(void **state) {
  (void)state;
  th_registry_stop(&reg);
  return 0;
}

/* The runtime gpunetd is given: the real one, but `run` (the first word
 * that names a subcommand: gpunetd puts --root STATE first) is held back
 * RUN_DELAY seconds with TERM ignored, as a TERM is lost when it reaches
 * `runc run` before the container exists. Each held `run` appends a line to
 * DIR/run-held, so the test knows the window was there. */
static void write_wrapper(const char *path) {
  FILE *f = fopen(path, "w");
  assert_non_null(f);
  fprintf(f,
          "#!/bin/sh\n"
          "for a in \"$@\"; do\n"
          "  case \"$a\" in\n"
          "  run)\n"
          "    trap '' TERM\n"
          "    echo held >>'%s/run-held'\n"
          "    sleep " RUN_DELAY "\n"
          "    trap - TERM\n"
          "    break ;;\n"
          "  create|start|kill|delete|state|list|exec|ps|events|pause|resume|update|features|spec|checkpoint|restore)\n"
          "    break ;;\n"
          "  esac\n"
          "done\n"
          "exec '%s' \"$@\"\n",
          W.dir, W.real_rt);
  assert_int_equal(fclose(f), 0);
  assert_int_equal(chmod(path, 0755), 0);
}

static int setup(void **state) {
  (void)state;
  if (skip_why)
    return 0;
  char real[PATH_MAX];
  snprintf(real, sizeof real, "%s", W.real_rt);
  memset(&W, 0, sizeof W);
  snprintf(W.real_rt, sizeof W.real_rt, "%s", real);
  snprintf(W.dir, sizeof W.dir, "/tmp/gn-stoprace-XXXXXX");
  assert_non_null(mkdtemp(W.dir));
  snprintf(W.sleep_arg, sizeof W.sleep_arg, "%d", 600 + (int)(getpid() % 1000));
  char wrapper[PATH_MAX + 16];
  snprintf(wrapper, sizeof wrapper, "%s/slow-runtime", W.dir);
  write_wrapper(wrapper);
  tn_identity_for(W.dir, &W.prov_id);
  snprintf(W.addr, sizeof W.addr, "127.0.0.1:%d", tn_free_port());
  W.daemon = tn_daemon_spawn(W.dir, "a", "--data-dir", W.dir, "--listen", W.addr, "--provide", "--simulate-gpu",
                             "RTX 4090", "--price", "0.40", "--max-hours", "2", "--allow-no-userns", "--registry-allow",
                             "127.0.0.1", "--runtime", wrapper, (char *)NULL);
  uv_loop_init(&W.loop);
  W.link = (tn_link){&W.up, &W.in, NULL};
  tn_peer_new(&W.loop, &W.link, &W.req_id, &W.tp);
  tn_dial(&W.loop, W.tp, W.addr, &W.up, NULL);
  return 0;
}

/* How many `sleep N` processes of this test run (the job's PID 1); their
 * pids, up to cap, to pids. */
static size_t sleepers(pid_t *pids, size_t cap) {
  DIR *d = opendir("/proc");
  size_t n = 0;
  struct dirent *e;
  char want[32];
  int wlen = snprintf(want, sizeof want, "sleep%c%s%c", 0, W.sleep_arg, 0);
  while (d && (e = readdir(d))) {
    char path[300], buf[64];
    if (e->d_name[0] < '1' || e->d_name[0] > '9')
      continue;
    snprintf(path, sizeof path, "/proc/%s/cmdline", e->d_name);
    FILE *f = fopen(path, "r");
    size_t got = f ? fread(buf, 1, sizeof buf, f) : 0;
    if (f)
      fclose(f);
    if (got != (size_t)wlen || memcmp(buf, want, got) != 0)
      continue;
    if (n < cap)
      pids[n] = (pid_t)atoi(e->d_name);
    n++;
  }
  if (d)
    closedir(d);
  return n;
}

/* Whether the runtime still keeps the job's container (its state dir). */
static bool container_left(void) {
  char p[PATH_MAX + 64];
  snprintf(p, sizeof p, "%s/run/gn-%s", W.dir, W.job);
  return th_exists(p);
}

static void show_log(void) {
  char cmd[PATH_MAX + 64];
  snprintf(cmd, sizeof cmd, "tail -n 30 '%s/gpunetd.log' >&2", W.dir);
  if (system(cmd) != 0)
    fprintf(stderr, "(no daemon log)\n");
}

static int teardown(void **state) {
  (void)state;
  if (skip_why)
    return 0;
  gn_transport *tps[] = {W.tp};
  for (size_t i = 0; i < GN_ARRAY_SIZE(tps); i++)
    gn_transport_close(tps[i], tn__closed, NULL);
  uv_run(&W.loop, UV_RUN_DEFAULT);
  uv_loop_close(&W.loop);
  if (W.daemon > 0) {
    kill(W.daemon, SIGKILL);
    waitpid(W.daemon, NULL, 0);
  }
  if (W.job[0]) { /* after a failure: nothing of the job may outlive the test */
    char cmd[2 * PATH_MAX + 128];
    snprintf(cmd, sizeof cmd, "'%s' --root '%s/run' delete -f 'gn-%s' >/dev/null 2>&1", W.real_rt, W.dir, W.job);
    if (container_left() && system(cmd) != 0)
      fprintf(stderr, "could not delete the job's container\n");
    pid_t pids[16];
    size_t n = sleepers(pids, GN_ARRAY_SIZE(pids));
    for (size_t i = 0; i < n && i < GN_ARRAY_SIZE(pids); i++)
      kill(pids[i], SIGKILL);
  }
  tn_inbox_done(&W.in);
  W.prov_id = gn_identity_free(W.prov_id);
  W.req_id = gn_identity_free(W.req_id);
  return tn_rm_rf(W.dir);
}

/* Rents one GPU and starts `sleep N` on it; returns once the provider
 * reports the job running, with the lease id in ret_lease. */
static void start_sleeper(char *ret_lease) {
  gn_lease_terms t;
  gn_agreement ag;
  tn_lease_terms(&t, W.prov_id, W.req_id, 1, true);
  tn_rent(&W.loop, &W.in, W.tp, W.req_id, W.prov_id, &t, &ag, NULL);
  snprintf(ret_lease, GN_LEASE_ID_STRLEN, "%s", ag.terms.lease_id);

  char image[256];
  tn_job_id(W.job, sizeof W.job);
  snprintf(image, sizeof image, "%s/bb@%s", reg.host, reg.digest);
  const char *cmd[] = {"sleep", W.sleep_arg, NULL};
  tn_manifest man = {.job_id = W.job,
                     .lease_id = ret_lease,
                     .image = image,
                     .cmd = cmd,
                     .memory_mib = 64,
                     .pids = 16,
                     .issued_s = gn_unix_s(),
                     .expires_s = gn_unix_s() + 120};
  tn_manifest_send(W.tp, W.req_id, &man, W.prov_id->pk);
  char st[32] = "", reason[256] = "";
  if (!tn_wait_job_status(&W.loop, &W.in, W.job, "running", 60000, st, reason)) {
    show_log();
    fail_msg("job %s never reported running", W.job);
  }
}

/* After the job ended: the runtime keeps no container of it and no `sleep
 * N` runs (the cleanup may take a moment after the status). */
static void assert_nothing_left(void) {
  bool left = true;
  for (int i = 0; i < 60 && left; i++) {
    left = container_left() || sleepers(NULL, 0) > 0;
    if (left)
      usleep(50000);
  }
  if (left) {
    show_log();
    fail_msg("job %s ended but left its container (%d) or its sleep (%zu processes)", W.job, container_left(),
             sleepers(NULL, 0));
  }
}

/* The wrapper did hold `run` back: the stop came before the container. */
static void assert_run_was_held(void) {
  char p[PATH_MAX + 16];
  snprintf(p, sizeof p, "%s/run-held", W.dir);
  assert_true(th_exists(p));
}

static void test_job_stop_before_the_container_exists(void **state) {
  (void)state;
  if (skip_why) {
    print_message("skipped: %s\n", skip_why);
    skip();
  }
  char lease[GN_LEASE_ID_STRLEN];
  start_sleeper(lease);
  uint64_t t0 = gn_mono_ms();
  gn_buf env = {0};
  tn_job_stop_seal(W.req_id, lease, W.job, &env);
  assert_int_equal(gn_transport_send(W.tp, W.prov_id->pk, env.data, env.len), 0);
  gn_buf_done(&env);
  char st[32] = "", reason[256] = "";
  if (!tn_wait_job_status(&W.loop, &W.in, W.job, "stopped", STOP_BOUND_MS, st, reason)) {
    show_log();
    fail_msg("job %s still runs %u ms after its stop (container %d, sleep processes %zu)", W.job, STOP_BOUND_MS,
             container_left(), sleepers(NULL, 0));
  }
  print_message("  stopped %llu ms after the stop\n", (unsigned long long)(gn_mono_ms() - t0));
  assert_run_was_held();
  assert_nothing_left();
}

static void test_shutdown_before_the_container_exists(void **state) {
  (void)state;
  if (skip_why) {
    print_message("skipped: %s\n", skip_why);
    skip();
  }
  char lease[GN_LEASE_ID_STRLEN];
  start_sleeper(lease);
  uint64_t t0 = gn_mono_ms();
  assert_int_equal(kill(W.daemon, SIGTERM), 0);
  int status = 0;
  pid_t got = 0;
  while ((got = waitpid(W.daemon, &status, WNOHANG)) == 0 && gn_mono_ms() - t0 < STOP_BOUND_MS)
    usleep(50000);
  if (got != W.daemon) {
    show_log();
    fail_msg("gpunetd still runs %u ms after its SIGTERM (container %d, sleep processes %zu)", STOP_BOUND_MS,
             container_left(), sleepers(NULL, 0));
  }
  W.daemon = 0;
  print_message("  gpunetd exited %llu ms after its SIGTERM\n", (unsigned long long)(gn_mono_ms() - t0));
  assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  assert_run_was_held();
  assert_nothing_left();
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_job_stop_before_the_container_exists, setup, teardown),
      cmocka_unit_test_setup_teardown(test_shutdown_before_the_container_exists, setup, teardown),
  };
  return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
