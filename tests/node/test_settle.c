/* The daemon's settlement glue (node/settle.c) and its configuration: a real
 * gpunetd whose database holds a countersigned final voucher settles it on
 * its own, through the webhook driver (a real libmicrohttpd server on
 * loopback that first answers 500: the retry comes from the daemon's timer,
 * the request from its thread pool) or the default ledger driver, and GET
 * /v1/balance says so; settle_driver/settle_url are validated. */
#include "billing/settle_fixture.h"
#include "billing/settle_server.h"
#include "helpers.h"

#include <curl/curl.h>
#include <gpunet/node.h>
#include <signal.h>
#include <sys/wait.h>

typedef struct world {
  sf f; /* identities and lease a; f.requester is the daemon */
  char dir[64];
  pid_t daemon;
  int64_t amount;
} world;

/* GET path on the daemon's control socket; NULL while it does not answer. */
static json_t *api_get(world *w, const char *path) {
  return tn_api_try_get(w->dir, path);
}

static int setup(void **state) {
  world *w = calloc(1, sizeof(*w));
  assert_non_null(w);
  assert_true(sodium_init() >= 0);
  snprintf(w->dir, sizeof w->dir, "/tmp/gn-settle-node-XXXXXX");
  assert_non_null(mkdtemp(w->dir));
  tn_identity_for(w->dir, &w->f.requester);
  assert_int_equal(gn_identity_generate(&w->f.provider), 0);
  sf_agree(&w->f, w->f.provider, w->f.requester, "EUR", &w->f.a);
  *state = w;
  return 0;
}

static int teardown(void **state) {
  world *w = *state;
  tn_daemon_stop(w->daemon);
  gn_identity_free(w->f.provider);
  gn_identity_free(w->f.requester);
  sf_lease_done(&w->f.a);
  if (tn_rm_rf(w->dir) < 0)
    fprintf(stderr, "could not remove %s\n", w->dir);
  free(w);
  return 0;
}

/* Puts the requester's countersigned final invoice of lease a in the
 * daemon's database, queued for settlement, as its glue would have. */
static void queue_final(world *w) {
  char path[128];
  snprintf(path, sizeof path, "%s/gpunet.db", w->dir);
  sqlite3 *db = sf_db_open(path);
  gn_settle *s = NULL;
  assert_int_equal(gn_settle_open(db, w->f.requester->pk, &s), 0);
  gn_buf inv = {0}, acc = {0};
  gn_bill_head fin;
  sf_final(&w->f, &w->f.a, NULL, 25, &inv, &acc, &fin);
  gn_settle_final fi = sf_final_item(&w->f.a, GN_SETTLE_REQUESTER, &inv, &acc);
  assert_int_equal(gn_settle_enqueue_final(s, &fi, gn_unix_s() * 1000), 0);
  w->amount = (int64_t)fin.total_micro;
  gn_settle_free(s);
  assert_int_equal(sqlite3_close(db), SQLITE_OK);
  gn_buf_done(&inv);
  gn_buf_done(&acc);
}

static void start_daemon(world *w, const char *const *extra) {
  char addr[64];
  snprintf(addr, sizeof addr, "127.0.0.1:%d", tn_free_port());
  const char *args[16] = {"--data-dir", w->dir, "--listen", addr, "--log-level", "debug"};
  size_t n = 6;
  for (size_t i = 0; extra && extra[i]; i++) {
    assert_true(n + 1 < GN_ARRAY_SIZE(args));
    args[n++] = extra[i];
  }
  args[n] = NULL;
  w->daemon = tn_daemon_spawnv(w->dir, "w", NULL, args);
}

/* Runs the gpunet CLI built beside the tests against the daemon; its stdout
 * into out. */
static void run_cli(world *w, const char *args, char *out, size_t cap) {
  const char *bd = getenv("GN_BUILD_DIR");
  assert_non_null(bd);
  char cmd[512];
  snprintf(cmd, sizeof cmd, "%s/gpunet --data-dir %s %s", bd, w->dir, args);
  FILE *p = popen(cmd, "r");
  assert_non_null(p);
  size_t n = fread(out, 1, cap - 1, p);
  out[n] = '\0';
  int st = pclose(p);
  if (st != 0)
    fail_msg("%s exited %d: %s", cmd, st, out);
}

/* Polls GET /v1/balance until the lease's voucher is settled (or 20 s). */
static json_t *wait_settled(world *w) {
  for (int i = 0; i < 200; i++) {
    json_t *j = api_get(w, "/v1/balance");
    const json_t *b = j ? json_array_get(json_object_get(j, "balances"), 0) : NULL;
    if (b && json_integer_value(json_object_get(b, "settled_micro")) == w->amount)
      return j;
    json_decref(j);
    usleep(100 * 1000);
  }
  fail_msg("the daemon did not settle lease %s within 20 s (see %s/gpunetd.log)", w->f.a.lease_id, w->dir);
  return NULL;
}

static void test_daemon_settles_through_the_webhook(void **state) {
  world *w = *state;
  server s;
  static const unsigned script[] = {500, 200};
  server_start(&s, script, 2);
  char url[96];
  snprintf(url, sizeof url, "http://127.0.0.1:%u/hook", s.port);
  queue_final(w);
  const char *extra[] = {"--settle-driver", "webhook", "--settle-url", url, NULL};
  start_daemon(w, extra);
  json_t *j = wait_settled(w);
  const json_t *b = json_array_get(json_object_get(j, "balances"), 0);
  assert_string_equal(json_string_value(json_object_get(j, "driver")), "webhook");
  assert_int_equal(json_integer_value(json_object_get(j, "pending")), 0);
  assert_string_equal(json_string_value(json_object_get(b, "direction")), "we_owe");
  char pid[GN_NODE_ID_STRLEN];
  gn_node_id_format(w->f.provider->pk, pid);
  assert_string_equal(json_string_value(json_object_get(b, "peer")), pid);
  assert_int_equal(json_integer_value(json_object_get(b, "vouched_micro")), w->amount);
  assert_int_equal(json_integer_value(json_object_get(b, "outstanding_micro")), 0);
  json_decref(j);
  /* The 500 was retried by the daemon's timer, under the same key. */
  assert_int_equal(server_count(&s), 2);
  assert_string_equal(s.reqs[0].key, s.reqs[1].key);
  assert_non_null(strstr(s.reqs[0].key, w->f.a.lease_id));
  assert_string_equal(s.reqs[1].url, "/hook");
  tn_daemon_stop(w->daemon);
  w->daemon = 0;
  server_stop(&s);
}

static void test_daemon_shutdown_stops_a_stalled_request(void **state) {
  world *w = *state;
  server s;
  static const unsigned script[] = {0}; /* never answers in time */
  server_start(&s, script, 1);
  s.stall_ms = 60000;
  char url[96];
  snprintf(url, sizeof url, "http://127.0.0.1:%u/hook", s.port);
  queue_final(w);
  const char *extra[] = {"--settle-driver", "webhook", "--settle-url", url, NULL};
  start_daemon(w, extra);
  for (int i = 0; i < 100 && server_count(&s) == 0; i++)
    usleep(100 * 1000);
  assert_int_equal(server_count(&s), 1);
  /* The request waits (30 s timeout); a shutdown does not. */
  uint64_t t0 = gn_mono_ms();
  tn_daemon_stop(w->daemon);
  w->daemon = 0;
  uint64_t took = gn_mono_ms() - t0;
  if (took > 5000)
    fail_msg("gpunetd took %llu ms to stop with a settlement request in flight", (unsigned long long)took);
  /* The item is still queued for the next start. */
  char path[128];
  snprintf(path, sizeof path, "%s/gpunet.db", w->dir);
  sqlite3 *db = sf_db_open(path);
  assert_int_equal(sf_count(db, "SELECT count(*) FROM settle_outbox WHERE state = 1"), 1);
  sqlite3_close(db);
  server_stop(&s);
}

static void test_daemon_failed_settlement_retried_on_request(void **state) {
  world *w = *state;
  server s;
  static const unsigned script[] = {400};
  server_start(&s, script, 1);
  char url[96];
  snprintf(url, sizeof url, "http://127.0.0.1:%u/hook", s.port);
  queue_final(w);
  const char *extra[] = {"--settle-driver", "webhook", "--settle-url", url, NULL};
  start_daemon(w, extra);
  json_t *j = NULL;
  for (int i = 0; i < 100; i++) {
    json_decref(j);
    j = api_get(w, "/v1/balance");
    if (j && json_integer_value(json_object_get(j, "failed")) == 1)
      break;
    usleep(100 * 1000);
  }
  assert_non_null(j);
  assert_int_equal(json_integer_value(json_object_get(j, "failed")), 1);
  json_decref(j);
  usleep(300 * 1000);
  assert_int_equal(server_count(&s), 1); /* a 400 is not retried by itself */
  /* The operator fixes the endpoint and asks again. */
  pthread_mutex_lock(&s.mu);
  s.script[0] = 200;
  pthread_mutex_unlock(&s.mu);
  char out[1024];
  run_cli(w, "balance --retry", out, sizeof out);
  assert_non_null(strstr(out, "1 failed settlement queued again (webhook driver)"));
  json_decref(wait_settled(w));
  assert_int_equal(server_count(&s), 2);
  assert_string_equal(s.reqs[0].key, s.reqs[1].key);
  tn_daemon_stop(w->daemon);
  w->daemon = 0;
  server_stop(&s);
}

static void test_daemon_ledger_driver_is_the_default(void **state) {
  world *w = *state;
  queue_final(w);
  start_daemon(w, NULL);
  json_t *j = wait_settled(w);
  assert_string_equal(json_string_value(json_object_get(j, "driver")), "ledger");
  json_decref(j);
  /* gpunet balance: the table, and --json (the daemon's answer). */
  char out[4096], want[64];
  run_cli(w, "balance", out, sizeof out);
  assert_non_null(strstr(out, "DIRECTION"));
  assert_non_null(strstr(out, "OUTSTANDING"));
  assert_non_null(strstr(out, "we owe"));
  snprintf(want, sizeof want, "0.025 EUR"); /* 25 s at 1000 micro per second */
  assert_int_equal(w->amount, 25000);
  assert_non_null(strstr(out, want));
  assert_non_null(strstr(out, "ledger driver, 0 pending, 0 failed"));
  run_cli(w, "--json balance", out, sizeof out);
  j = json_loads(out, 0, NULL);
  assert_non_null(j);
  assert_int_equal(
      json_integer_value(json_object_get(json_array_get(json_object_get(j, "balances"), 0), "settled_micro")), 25000);
  json_decref(j);
  tn_daemon_stop(w->daemon);
  w->daemon = 0;
  char path[128];
  snprintf(path, sizeof path, "%s/gpunet.db", w->dir);
  sqlite3 *db = sf_db_open(path);
  assert_int_equal(sf_count(db, "SELECT count(*) FROM settle_book"), 1);
  assert_int_equal(sf_count(db, "SELECT amount_micro FROM settle_book"), (uint64_t)w->amount);
  sqlite3_close(db);
}

static void test_daemon_refuses_a_webhook_without_url(void **state) {
  world *w = *state;
  const char *extra[] = {"--settle-driver", "webhook", NULL};
  start_daemon(w, extra);
  int status = 0;
  assert_int_equal(waitpid(w->daemon, &status, 0), w->daemon);
  w->daemon = 0;
  assert_true(WIFEXITED(status));
  assert_int_equal(WEXITSTATUS(status), 2);
  char path[128], buf[1024] = "";
  snprintf(path, sizeof path, "%s/gpunetd.log", w->dir);
  FILE *f = fopen(path, "r");
  assert_non_null(f);
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  buf[n] = '\0';
  fclose(f);
  assert_non_null(strstr(buf, "settle_url"));
}

static int load(const char *const *args, size_t n, gn_config *cfg, char *err, size_t cap) {
  char *argv[16];
  argv[0] = "gpunetd";
  for (size_t i = 0; i < n; i++)
    argv[i + 1] = (char *)args[i];
  argv[n + 1] = NULL;
  optind = 0;
  return gn_config_load(cfg, (int)n + 1, argv, err, cap);
}

static void test_config_settle_keys(void **state) {
  world *w = *state;
  gn_config cfg;
  char err[512];
  const char *none[] = {"--data-dir", w->dir};
  assert_int_equal(load(none, 2, &cfg, err, sizeof err), 0);
  assert_string_equal(cfg.settle_driver, "ledger");
  assert_string_equal(cfg.settle_url, "");
  gn_config_done(&cfg);

  const char *hook[] = {"--data-dir", w->dir, "--settle-driver", "webhook", "--settle-url", "https://bill.example/x"};
  assert_int_equal(load(hook, 6, &cfg, err, sizeof err), 0);
  assert_string_equal(cfg.settle_driver, "webhook");
  assert_string_equal(cfg.settle_url, "https://bill.example/x");
  gn_config_done(&cfg);

  static const struct {
    const char *k, *v, *want;
  } bad[] = {
      {"--settle-driver", "paypal", "settle_driver"},
      {"--settle-url", "ftp://bill.example/", "settle_url"},
      {"--settle-url", "file:///etc/passwd", "settle_url"},
      {"--settle-driver", "webhook", "needs settle_url"},
  };
  for (size_t i = 0; i < GN_ARRAY_SIZE(bad); i++) {
    const char *args[] = {"--data-dir", w->dir, bad[i].k, bad[i].v};
    err[0] = '\0';
    assert_int_equal(load(args, 4, &cfg, err, sizeof err), GN_EINVAL);
    if (!strstr(err, bad[i].want))
      fail_msg("%s %s: '%s' does not say %s", bad[i].k, bad[i].v, err, bad[i].want);
    gn_config_done(&cfg);
  }

  /* The same keys in the config file. */
  char conf[128];
  snprintf(conf, sizeof conf, "%s/gpunet.conf", w->dir);
  FILE *f = fopen(conf, "w");
  assert_non_null(f);
  fprintf(f, "settle_driver = webhook\nsettle_url = http://127.0.0.1:9/settle\n");
  fclose(f);
  assert_int_equal(load(none, 2, &cfg, err, sizeof err), 0);
  assert_string_equal(cfg.settle_driver, "webhook");
  assert_string_equal(cfg.settle_url, "http://127.0.0.1:9/settle");
  gn_config_done(&cfg);
  f = fopen(conf, "w");
  assert_non_null(f);
  fprintf(f, "settle_url = gopher://127.0.0.1/\n");
  fclose(f);
  assert_int_equal(load(none, 2, &cfg, err, sizeof err), GN_EINVAL);
  assert_non_null(strstr(err, "gpunet.conf:1"));
  gn_config_done(&cfg);
  unlink(conf);
}

int main(void) {
  curl_global_init(CURL_GLOBAL_DEFAULT);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_daemon_settles_through_the_webhook, setup, teardown),
      cmocka_unit_test_setup_teardown(test_daemon_shutdown_stops_a_stalled_request, setup, teardown),
      cmocka_unit_test_setup_teardown(test_daemon_failed_settlement_retried_on_request, setup, teardown),
      cmocka_unit_test_setup_teardown(test_daemon_ledger_driver_is_the_default, setup, teardown),
      cmocka_unit_test_setup_teardown(test_daemon_refuses_a_webhook_without_url, setup, teardown),
      cmocka_unit_test_setup_teardown(test_config_settle_keys, setup, teardown),
  };
  int r = cmocka_run_group_tests(tests, NULL, NULL);
  curl_global_cleanup();
  return r;
}
