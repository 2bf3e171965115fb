/* The exec messages (node/execmsg.c): EXEC_OPEN's bounded decoder and the
 * provider's admission rules, attacks first (another signer, an expired or
 * far-future request, a replayed nonce, another lease's job, too many
 * streams, oversized argv and env), then the small messages' bounds and the
 * direction flag that keeps two nodes renting from each other apart. */
#include "execmsg.h"

#include <gpunet/sandbox.h>

#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#define NOW 1800000000

static const uint8_t holder[GN_PK_LEN] = {1, 2, 3};
static const uint8_t stranger[GN_PK_LEN] = {9, 9, 9};
static char *sh_argv[] = {"sh", "-c", "echo hi", NULL};

static gn_execopen sample(void) {
  gn_execopen o;
  memset(&o, 0, sizeof o);
  o.sid = 7;
  snprintf(o.lease_id, sizeof o.lease_id, "l-0123456789abcdef");
  snprintf(o.job_id, sizeof o.job_id, "j-0123456789ab");
  o.argc = 3;
  for (int i = 0; i < 3; i++)
    o.argv[i] = sh_argv[i];
  o.tty = true;
  o.rows = 30;
  o.cols = 100;
  memset(o.nonce, 0x5a, sizeof o.nonce);
  o.issued_s = NOW;
  o.expires_s = NOW + 120;
  return o;
}

/* Everything the provider would accept for sample(). */
static gn_exec_ctx ok_ctx(void) {
  gn_exec_ctx c = {.signer = holder,
                   .lease_found = true,
                   .lease_holder = holder,
                   .lease_active = true,
                   .job_found = true,
                   .job_lease_id = "l-0123456789abcdef",
                   .job_running = true,
                   .now_s = NOW};
  return c;
}

static int encode(const gn_execopen *o, gn_buf *ret) {
  gn_wire_writer w;
  gn_wire_writer_init(&w);
  int r = gn__execopen_encode(o, &w);
  if (r == 0)
    r = gn_wire_writer_take(&w, ret);
  gn_wire_writer_done(&w);
  return r;
}

static void test_execopen_round_trips(void **state) {
  (void)state;
  gn_execopen o = sample(), d;
  char *env[] = {"TERM=xterm", "A=b=c", NULL};
  o.env[0] = env[0];
  o.env[1] = env[1];
  o.envc = 2;
  gn_buf b = {0};
  assert_int_equal(encode(&o, &b), 0);
  assert_int_equal(gn__execopen_decode(b.data, b.len, &d), 0);
  assert_int_equal(d.sid, 7);
  assert_string_equal(d.lease_id, o.lease_id);
  assert_string_equal(d.job_id, o.job_id);
  assert_int_equal(d.argc, 3);
  assert_string_equal(d.argv[2], "echo hi");
  assert_null(d.argv[3]);
  assert_int_equal(d.envc, 2);
  assert_string_equal(d.env[1], "A=b=c");
  assert_true(d.tty);
  assert_int_equal(d.rows, 30);
  assert_int_equal(d.cols, 100);
  assert_memory_equal(d.nonce, o.nonce, sizeof o.nonce);
  assert_int_equal(d.expires_s, NOW + 120);
  gn__execopen_done(&d);
  gn_buf_done(&b);
}

static void test_admit_accepts_the_lease_holder(void **state) {
  (void)state;
  gn_execopen o = sample();
  gn_exec_ctx c = ok_ctx();
  char why[300];
  assert_int_equal(gn__exec_admit(&o, &c, why, sizeof why), 0);
}

static void test_admit_refuses_another_signer(void **state) {
  (void)state;
  gn_execopen o = sample();
  gn_exec_ctx c = ok_ctx();
  c.signer = stranger;
  char why[300];
  assert_int_equal(gn__exec_admit(&o, &c, why, sizeof why), GN_EPERM);
  assert_non_null(strstr(why, "not signed by the lease holder"));
}

static void test_admit_refuses_expired_and_far_future(void **state) {
  (void)state;
  gn_execopen o = sample();
  gn_exec_ctx c = ok_ctx();
  char why[300];
  o.expires_s = NOW - 1;
  assert_int_equal(gn__exec_admit(&o, &c, why, sizeof why), GN_EEXPIRED);
  assert_non_null(strstr(why, "expired"));
  o.expires_s = NOW + GN_EXEC_MAX_TTL_S + 1; /* would outlive the nonce's row */
  assert_int_equal(gn__exec_admit(&o, &c, why, sizeof why), GN_EEXPIRED);
  o.expires_s = NOW + 60;
  o.issued_s = NOW + 301;
  assert_int_equal(gn__exec_admit(&o, &c, why, sizeof why), GN_EEXPIRED);
}

static void test_admit_refuses_replayed_nonce(void **state) {
  (void)state;
  gn_execopen o = sample();
  gn_exec_ctx c = ok_ctx();
  c.nonce_seen = true;
  char why[300];
  assert_int_equal(gn__exec_admit(&o, &c, why, sizeof why), GN_EREPLAY);
  assert_non_null(strstr(why, "replayed"));
}

static void test_admit_refuses_another_leases_job(void **state) {
  (void)state;
  gn_execopen o = sample();
  gn_exec_ctx c = ok_ctx();
  c.job_lease_id = "l-fedcba9876543210"; /* the holder's other lease, or someone else's */
  char why[300];
  assert_int_equal(gn__exec_admit(&o, &c, why, sizeof why), GN_EPERM);
  assert_non_null(strstr(why, "does not run on lease"));
}

static void test_admit_refuses_ended_lease_and_stopped_job(void **state) {
  (void)state;
  gn_execopen o = sample();
  gn_exec_ctx c = ok_ctx();
  char why[300];
  c.lease_active = false;
  assert_int_equal(gn__exec_admit(&o, &c, why, sizeof why), GN_ESTATE);
  c = ok_ctx();
  c.job_running = false;
  assert_int_equal(gn__exec_admit(&o, &c, why, sizeof why), GN_ESTATE);
  c = ok_ctx();
  c.lease_found = false;
  assert_int_equal(gn__exec_admit(&o, &c, why, sizeof why), GN_ENOTFOUND);
  c = ok_ctx();
  c.job_found = false;
  assert_int_equal(gn__exec_admit(&o, &c, why, sizeof why), GN_ENOTFOUND);
}

/* The signer is checked before anything about the lease's jobs is said. */
static void test_admit_tells_a_stranger_nothing_of_the_jobs(void **state) {
  (void)state;
  gn_execopen o = sample();
  gn_exec_ctx c = ok_ctx();
  c.signer = stranger;
  c.job_found = false;
  char why[300];
  assert_int_equal(gn__exec_admit(&o, &c, why, sizeof why), GN_EPERM);
  assert_null(strstr(why, o.job_id));
}

static void test_admit_caps_streams_per_lease_and_total(void **state) {
  (void)state;
  gn_execopen o = sample();
  gn_exec_ctx c = ok_ctx();
  char why[300];
  c.lease_streams = GN_EXEC_PER_LEASE - 1;
  c.total_streams = GN_EXEC_TOTAL - 1;
  assert_int_equal(gn__exec_admit(&o, &c, why, sizeof why), 0);
  c.lease_streams = GN_EXEC_PER_LEASE;
  assert_int_equal(gn__exec_admit(&o, &c, why, sizeof why), GN_EBUSY);
  assert_non_null(strstr(why, "exec sessions open"));
  c.lease_streams = 0;
  c.total_streams = GN_EXEC_TOTAL;
  assert_int_equal(gn__exec_admit(&o, &c, why, sizeof why), GN_EBUSY);
  c.total_streams = 0;
  c.sid_in_use = true;
  assert_int_equal(gn__exec_admit(&o, &c, why, sizeof why), GN_EBUSY);
}

/* Encodes sample() with the given cmd and env arrays by hand, so that the
 * decoder sees what the encoder would refuse to write. */
static void put_open(gn_wire_writer *w, uint32_t nargs, size_t arg_len, uint32_t nenv, const char *env0) {
  char *arg = malloc(arg_len + 1);
  memset(arg, 'a', arg_len);
  arg[arg_len] = 0;
  uint8_t nonce[16] = {0};
  gn_wire_put_map(w, 12);
  gn_wire_put_str(w, "v");
  gn_wire_put_u64(w, GN_PROTO_VERSION);
  gn_wire_put_str(w, "sid");
  gn_wire_put_u64(w, 1);
  gn_wire_put_str(w, "lease_id");
  gn_wire_put_str(w, "l-0123456789abcdef");
  gn_wire_put_str(w, "job_id");
  gn_wire_put_str(w, "j-0123456789ab");
  gn_wire_put_str(w, "cmd");
  gn_wire_put_array(w, nargs);
  for (uint32_t i = 0; i < nargs; i++)
    gn_wire_put_str(w, arg);
  gn_wire_put_str(w, "env");
  gn_wire_put_array(w, nenv);
  for (uint32_t i = 0; i < nenv; i++)
    gn_wire_put_str(w, env0);
  gn_wire_put_str(w, "tty");
  gn_wire_put_bool(w, false);
  gn_wire_put_str(w, "rows");
  gn_wire_put_u64(w, 0);
  gn_wire_put_str(w, "cols");
  gn_wire_put_u64(w, 0);
  gn_wire_put_str(w, "nonce");
  gn_wire_put_bin(w, nonce, sizeof nonce);
  gn_wire_put_str(w, "issued_s");
  gn_wire_put_i64(w, NOW);
  gn_wire_put_str(w, "expires_s");
  gn_wire_put_i64(w, NOW + 60);
  free(arg);
}

static int decode_built(uint32_t nargs, size_t arg_len, uint32_t nenv, const char *env0) {
  gn_wire_writer w;
  gn_buf b = {0};
  gn_execopen d;
  gn_wire_writer_init(&w);
  put_open(&w, nargs, arg_len, nenv, env0);
  assert_int_equal(gn_wire_writer_take(&w, &b), 0);
  gn_wire_writer_done(&w);
  int r = gn__execopen_decode(b.data, b.len, &d);
  if (r == 0)
    gn__execopen_done(&d);
  gn_buf_done(&b);
  return r;
}

static void test_execopen_refuses_oversized_argv_and_env(void **state) {
  (void)state;
  assert_int_equal(decode_built(GN_EXEC_MAX_ARGS, GN_EXEC_MAX_ARG_LEN, 1, "A=b"), 0); /* the limits themselves */
  assert_int_equal(decode_built(GN_EXEC_MAX_ARGS + 1, 1, 0, NULL), GN_ETOOBIG);
  assert_int_equal(decode_built(1, GN_EXEC_MAX_ARG_LEN + 1, 0, NULL), GN_ETOOBIG);
  assert_int_equal(decode_built(1, 1, GN_EXEC_MAX_ARGS + 1, "A=b"), GN_ETOOBIG);
  assert_int_equal(decode_built(0, 1, 0, NULL), GN_EINVAL); /* no command */
  assert_int_equal(decode_built(1, 1, 1, "=x"), GN_EINVAL); /* not KEY=VALUE */
  assert_int_equal(decode_built(1, 1, 1, "NOEQUALS"), GN_EINVAL);
}

static void test_execopen_refuses_bad_ids_and_sizes(void **state) {
  (void)state;
  gn_execopen o = sample();
  gn_buf b = {0};
  snprintf(o.job_id, sizeof o.job_id, "../x");
  assert_int_equal(encode(&o, &b), GN_EINVAL); /* the encoder refuses what the decoder would */
  o = sample();
  o.rows = 0;
  assert_int_equal(encode(&o, &b), GN_EINVAL);
  o.rows = GN_EXEC_MAX_DIM + 1;
  assert_int_equal(encode(&o, &b), GN_EINVAL);
  assert_int_equal(b.len, 0);
  /* A decoder given a tty of 0 rows (a hand-made body) refuses it too. */
  gn_wire_writer w;
  gn_wire_writer_init(&w);
  o = sample();
  assert_int_equal(gn__execopen_encode(&o, &w), 0);
  assert_int_equal(gn_wire_writer_take(&w, &b), 0);
  gn_wire_writer_done(&w);
  /* "rows" is encoded as a positive fixint 30 (0x1e): patch it to 0. */
  uint8_t *p = memmem(b.data, b.len, "rows", 4);
  assert_non_null(p);
  assert_int_equal(p[4], 30);
  p[4] = 0;
  gn_execopen d;
  assert_int_equal(gn__execopen_decode(b.data, b.len, &d), GN_EINVAL);
  gn_buf_done(&b);
}

static int decode_msg(uint32_t type, void (*put)(gn_wire_writer *w), gn_execmsg *ret) {
  gn_wire_writer w;
  gn_buf b = {0};
  gn_wire_writer_init(&w);
  put(&w);
  assert_int_equal(gn_wire_writer_take(&w, &b), 0);
  gn_wire_writer_done(&w);
  int r = gn__execmsg_decode(type, b.data, b.len, ret);
  if (r == 0) { /* the document points into b: copy what the tests read */
    ret->data = NULL;
    gn__execmsg_done(ret);
  }
  gn_buf_done(&b);
  return r;
}

static void put_big_data(gn_wire_writer *w) {
  static uint8_t big[GN_EXEC_CHUNK + 1];
  gn_wire_put_map(w, 2);
  gn_wire_put_str(w, "sid");
  gn_wire_put_u64(w, 1);
  gn_wire_put_str(w, "data");
  gn_wire_put_bin(w, big, sizeof big);
}
static void put_big_ack(gn_wire_writer *w) {
  gn__execwindow_encode(w, 1, false, GN_EXEC_WINDOW + 1, 0, 0);
}
static void put_bad_signal(gn_wire_writer *w) {
  gn_wire_put_map(w, 2);
  gn_wire_put_str(w, "sid");
  gn_wire_put_u64(w, 1);
  gn_wire_put_str(w, "sig");
  gn_wire_put_str(w, "STOP");
}
static void put_huge_resize(gn_wire_writer *w) {
  gn__execwindow_encode(w, 1, false, 0, 20000, 80);
}
static void put_prov_data(gn_wire_writer *w) {
  gn__execdata_encode(w, 3, 2, (const uint8_t *)"x", 1, false);
}
static void put_req_data(gn_wire_writer *w) {
  gn__execdata_encode(w, 3, 0, (const uint8_t *)"x", 1, true);
}
static void put_prov_window(gn_wire_writer *w) {
  gn__execwindow_encode(w, 3, true, 100, 0, 0);
}
static void put_kill(gn_wire_writer *w) {
  gn__execsignal_encode(w, 3, SIGKILL);
}
static void put_exit(gn_wire_writer *w) {
  gn__execexit_encode(w, 3, 130, "interrupted");
}
static void put_bad_exit(gn_wire_writer *w) {
  gn__execexit_encode(w, 3, 256, NULL);
}

static void test_execmsg_bounds(void **state) {
  (void)state;
  gn_execmsg m;
  assert_int_equal(decode_msg(GN_MSG_EXEC_DATA, put_big_data, &m), GN_ETOOBIG);
  assert_int_equal(decode_msg(GN_MSG_EXEC_WINDOW, put_big_ack, &m), GN_EINVAL);
  assert_int_equal(decode_msg(GN_MSG_EXEC_SIGNAL, put_bad_signal, &m), GN_EINVAL);
  assert_int_equal(decode_msg(GN_MSG_EXEC_WINDOW, put_huge_resize, &m), GN_EINVAL);
  assert_int_equal(decode_msg(GN_MSG_EXEC_EXIT, put_bad_exit, &m), GN_EINVAL);
  assert_int_equal(decode_msg(GN_MSG_JOB_LOG, put_exit, &m), GN_EPROTO);
}

static void test_execmsg_says_its_direction(void **state) {
  (void)state;
  gn_execmsg m;
  assert_int_equal(decode_msg(GN_MSG_EXEC_DATA, put_prov_data, &m), 0);
  assert_true(m.from_provider);
  assert_int_equal(m.fd, 2);
  assert_int_equal(decode_msg(GN_MSG_EXEC_DATA, put_req_data, &m), 0);
  assert_false(m.from_provider);
  assert_true(m.eof);
  assert_int_equal(decode_msg(GN_MSG_EXEC_WINDOW, put_prov_window, &m), 0);
  assert_true(m.from_provider);
  assert_int_equal(m.ack, 100);
  assert_int_equal(decode_msg(GN_MSG_EXEC_SIGNAL, put_kill, &m), 0);
  assert_int_equal(m.sig, SIGKILL);
  assert_int_equal(decode_msg(GN_MSG_EXEC_EXIT, put_exit, &m), 0);
  assert_int_equal(m.code, 130);
  assert_string_equal(m.reason, "interrupted");
}

/* The runtime's command line (sandbox/runtime.c): the container's own
 * process settings, no new privileges, the tty and env as asked, the
 * command after the id; hostile ids and env entries refused. */
static void test_runtime_argv_exec(void **state) {
  (void)state;
  gn_runtime rt = {.kind = GN_RUNTIME_RUNC};
  snprintf(rt.path, sizeof rt.path, "/usr/sbin/runc");
  char *env[] = {"TERM=xterm", NULL};
  char *cmd[] = {"sh", "-c", "--help", NULL};
  char **v = NULL;
  assert_int_equal(gn_runtime_argv_exec(&rt, "/run/x", "gn-j-0123456789ab", true, "/run/x/exec-1.pid", env, cmd, &v),
                   0);
  const char *want[] = {"/usr/sbin/runc",
                        "--root",
                        "/run/x",
                        "exec",
                        "--no-new-privs",
                        "--tty",
                        "--pid-file",
                        "/run/x/exec-1.pid",
                        "--env",
                        "TERM=xterm",
                        "gn-j-0123456789ab",
                        "sh",
                        "-c",
                        "--help",
                        NULL};
  for (size_t i = 0; want[i]; i++)
    assert_string_equal(v[i], want[i]);
  assert_null(v[sizeof want / sizeof want[0] - 1]);
  v = gn_argv_free(v);
  assert_int_equal(gn_runtime_argv_exec(&rt, "/run/x", "gn-j-0123456789ab", false, NULL, NULL, cmd, &v), 0);
  assert_string_equal(v[4], "--no-new-privs");
  assert_string_equal(v[5], "gn-j-0123456789ab"); /* no --tty, no pid file, no env */
  v = gn_argv_free(v);
  char *bad_env[] = {"=x", NULL};
  char *no_cmd[] = {NULL};
  assert_int_equal(gn_runtime_argv_exec(&rt, "/run/x", "../x", false, NULL, NULL, cmd, &v), GN_EINVAL);
  assert_int_equal(gn_runtime_argv_exec(&rt, "/run/x", "--help", false, NULL, NULL, cmd, &v), GN_EINVAL);
  assert_int_equal(gn_runtime_argv_exec(&rt, "/run/x", "c1", false, NULL, bad_env, cmd, &v), GN_EINVAL);
  assert_int_equal(gn_runtime_argv_exec(&rt, "/run/x", "c1", false, NULL, NULL, no_cmd, &v), GN_EINVAL);
  assert_null(v);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_execopen_round_trips),
      cmocka_unit_test(test_admit_accepts_the_lease_holder),
      cmocka_unit_test(test_admit_refuses_another_signer),
      cmocka_unit_test(test_admit_refuses_expired_and_far_future),
      cmocka_unit_test(test_admit_refuses_replayed_nonce),
      cmocka_unit_test(test_admit_refuses_another_leases_job),
      cmocka_unit_test(test_admit_refuses_ended_lease_and_stopped_job),
      cmocka_unit_test(test_admit_tells_a_stranger_nothing_of_the_jobs),
      cmocka_unit_test(test_admit_caps_streams_per_lease_and_total),
      cmocka_unit_test(test_execopen_refuses_oversized_argv_and_env),
      cmocka_unit_test(test_execopen_refuses_bad_ids_and_sizes),
      cmocka_unit_test(test_execmsg_bounds),
      cmocka_unit_test(test_execmsg_says_its_direction),
      cmocka_unit_test(test_runtime_argv_exec),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
