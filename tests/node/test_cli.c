/* Runs the built gpunet binary against a stand-in gpunetd: a real control
 * server (gn_ctl) on a real socket answering the control API contract with
 * fixed data, so the CLI's requests, output and exit codes are checked
 * end to end without the daemon core. Skipped if gpunet is not built. */
#include <gpunet/node.h>

#include <ctype.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "node/helpers.h"

#define PROVIDER "gnxdmprthsyg3xadivnqyzxpaj5ge2vieppzt3swhizbyc2dmjbmlq6wqb"

typedef struct fixture {
  char dir[64];
  char sock[128];
  char gpunet[512];
  uv_loop_t loop;
  uv_async_t stop;
  gn_ctl *ctl;
  pthread_t thread;
  /* What the last requests carried, for the tests to check. */
  pthread_mutex_t lock;
  json_t *last_body;
  char last_filter[256];
  char last_sort[32];
  char last_param[64];
  int log_calls;
} fixture;

static fixture *g_f;

/* --- the stand-in daemon (loop thread) --------------------------------------*/

static void remember(gn_ctl_req *r) {
  pthread_mutex_lock(&g_f->lock);
  json_decref(g_f->last_body);
  g_f->last_body = gn_ctl_req_body(r) ? json_deep_copy(gn_ctl_req_body(r)) : NULL;
  const char *p = gn_ctl_req_param(r, "id");
  snprintf(g_f->last_param, sizeof(g_f->last_param), "%s", p ? p : "");
  pthread_mutex_unlock(&g_f->lock);
}

static json_t *lease_json(const char *state) {
  return json_pack("{s:s, s:s, s:s, s:s, s:i, s:[s], s:i, s:s, s:s, s:i, s:i, s:i, s:s, s:n, s:i, s:i, s:b}", "id",
                   "l-00112233445566778", "role", "requester", "peer", PROVIDER, "gpu_model", "NVIDIA GeForce RTX 4090",
                   "count", 1, "gpus", "GPU-SIM-ab", "price_uper_hour", 400000, "price", "0.400000", "currency", "EUR",
                   "start_s", 1764673200, "max_s", 7200, "ends_s", 1764680400, "state", state, "ended_reason",
                   "seconds", 3725, "cost_micro", 413888, "simulated", 1);
}

static void on_status(gn_ctl_req *r, void *ud) {
  (void)ud;
  json_t *iso =
      json_pack("{s:b, s:b, s:s, s:i, s:i, s:i, s:i, s:f, s:b}", "limits_enforced", 0, "user_namespaces", 0,
                "user_namespaces_why", "max_user_namespaces is 0", "memory_used_mib", 1024, "memory_budget_mib", 12052,
                "pids_used", 64, "pids_budget", 16384, "cpu_budget", 1.5, "disk_low", 1);
  json_t *tr = json_pack("{s:b, s:s, s:i}", "enabled", 1, "jobnet_ports", "51820-51899", "ranks", 1);
  gn_ctl_reply_json(r, 200,
                    json_pack("{s:s, s:s, s:s, s:s, s:b, s:s, s:i, s:i, s:i, s:i, s:o, s:o}", "node_id", PROVIDER,
                              "version", "0.1.0", "listen", "127.0.0.1:7946", "data_dir", "/x", "provider", 1,
                              "runtime", "runc", "peers", 2, "offers", 3, "leases", 1, "jobs", 0, "isolation", iso,
                              "training", tr));
}

static void on_offers(gn_ctl_req *r, void *ud) {
  (void)ud;
  pthread_mutex_lock(&g_f->lock);
  const char *f = gn_ctl_req_query(r, "filter"), *s = gn_ctl_req_query(r, "sort");
  snprintf(g_f->last_filter, sizeof(g_f->last_filter), "%s", f ? f : "");
  snprintf(g_f->last_sort, sizeof(g_f->last_sort), "%s", s ? s : "");
  pthread_mutex_unlock(&g_f->lock);
  json_t *o1 =
      json_pack("{s:s, s:s, s:s, s:s, s:i, s:i, s:i, s:i, s:s, s:s, s:i, s:b, s:I}", "id", "o-aaaaaaaaaaaa", "provider",
                PROVIDER, "addr", "10.0.0.1:7946", "gpu_model", "NVIDIA GeForce RTX 4090", "vram_mib", 24564,
                "gpus_free", 2, "gpus_total", 2, "price_uper_hour", 400000, "price", "0.400000", "currency", "EUR",
                "max_hours", 24, "simulated", 1, "expires_s", (json_int_t)gn_unix_s() + 300);
  json_t *o2 =
      json_pack("{s:s, s:s, s:s, s:s, s:i, s:i, s:i, s:i, s:s, s:s, s:i, s:b, s:I}", "id", "o-bbbbbbbbbbbb", "provider",
                PROVIDER, "addr", "10.0.0.2:7946", "gpu_model", "NVIDIA H100 80GB HBM3", "vram_mib", 81559, "gpus_free",
                1, "gpus_total", 8, "price_uper_hour", 2450000, "price", "2.450000", "currency", "EUR", "max_hours", 8,
                "simulated", 0, "expires_s", (json_int_t)gn_unix_s() + 300);
  json_object_set_new(o1, "no_userns", json_false());
  json_object_set_new(o1, "unenforced_limits", json_false());
  json_object_set_new(o2, "no_userns", json_true());
  json_object_set_new(o2, "unenforced_limits", json_true());
  /* o1's provider takes ranks of training jobs, o2's runs --no-training. */
  json_object_set_new(o1, "training", json_true());
  json_object_set_new(o1, "jobnet_ports", json_pack("[i, i]", 51820, 51899));
  json_object_set_new(o2, "training", json_false());
  gn_ctl_reply_json(r, 200, json_pack("{s:[o,o]}", "offers", o1, o2));
}

static void on_rent(gn_ctl_req *r, void *ud) {
  (void)ud;
  remember(r);
  gn_ctl_reply_json(r, 201, json_pack("{s:o}", "lease", lease_json("active")));
}

static void on_leases(gn_ctl_req *r, void *ud) {
  (void)ud;
  gn_ctl_reply_error(r, 500, "ledger is locked");
}

static void on_release(gn_ctl_req *r, void *ud) {
  (void)ud;
  remember(r);
  json_t *inv = json_pack("{s:s, s:s, s:s, s:s, s:i, s:i, s:s, s:s, s:i}", "id", "i-0011", "lease",
                          "l-00112233445566778", "role", "requester", "status", "accepted", "seconds", 3725,
                          "total_micro", 413888, "total", "0.413888", "currency", "EUR", "created_s", 1764677000);
  gn_ctl_reply_json(r, 200, json_pack("{s:o, s:o}", "lease", lease_json("ended"), "invoice", inv));
}

static void on_run(gn_ctl_req *r, void *ud) {
  (void)ud;
  remember(r);
  gn_ctl_reply_json(r, 201,
                    json_pack("{s:{s:s, s:s, s:s, s:n, s:[s], s:s, s:n, s:n, s:i, s:n}}", "job", "id", "j-1", "lease",
                              "l-00112233445566778", "image", "busybox", "digest", "cmd", "true", "state", "pending",
                              "exit_code", "error", "created_s", 1764677000, "ended_s"));
}

/* Output in two pieces with an empty, immediate answer between them. */
static void on_jobs(gn_ctl_req *r, void *ud) {
  (void)ud;
  gn_ctl_reply_json(r, 200,
                    json_pack("{s:[{s:s, s:s, s:s, s:s, s:n, s:s}]}", "jobs", "id", "j-9", "lease", "l-1", "image",
                              "nosuch:latest", "state", "failed", "exit_code", "error",
                              "image nosuch:latest not found in the registry"));
}

static void on_logs(gn_ctl_req *r, void *ud) {
  (void)ud;
  if (strcmp(gn_ctl_req_param(r, "id"), "j-9") == 0) {
    gn_ctl_reply_json(r, 200, json_pack("{s:s, s:i, s:b, s:n}", "data", "", "offset", 0, "done", 1, "exit_code"));
    return;
  }
  const char *off = gn_ctl_req_query(r, "offset");
  long offset = off ? strtol(off, NULL, 10) : -1;
  pthread_mutex_lock(&g_f->lock);
  int calls = ++g_f->log_calls;
  pthread_mutex_unlock(&g_f->lock);
  if (offset == 0)
    gn_ctl_reply_json(r, 200, json_pack("{s:s, s:i, s:b, s:n}", "data", "hello ", "offset", 6, "done", 0, "exit_code"));
  else if (offset == 6 && calls < 4)
    gn_ctl_reply_json(r, 200, json_pack("{s:s, s:i, s:b, s:n}", "data", "", "offset", 6, "done", 0, "exit_code"));
  else if (offset == 6)
    gn_ctl_reply_json(r, 200,
                      json_pack("{s:s, s:i, s:b, s:i}", "data", "world\n", "offset", 12, "done", 1, "exit_code", 3));
  else
    gn_ctl_reply_error(r, 400, "bad offset %s", off ? off : "(none)");
}

static void on_stop(gn_ctl_req *r, void *ud) {
  (void)ud;
  remember(r);
  gn_ctl_reply_json(r, 200, json_pack("{s:{s:s, s:s}}", "job", "id", gn_ctl_req_param(r, "id"), "state", "stopped"));
}

/* POST /v1/train: the plan of one provider; GET /v1/train/ID: running (for
 * that id only). */
static void on_train(gn_ctl_req *r, void *ud) {
  (void)ud;
  remember(r);
  json_t *p =
      json_pack("{s:i, s:s, s:s, s:s, s:i, s:i, s:i, s:i}", "node", 0, "provider", PROVIDER, "offer", "o-aaaaaaaaaaaa",
                "addr", "10.0.0.1:7946", "gpus", 2, "price_uper_hour", 400000, "rtt_ms", 3, "first_rank", 0);
  gn_ctl_reply_json(r, 202,
                    json_pack("{s:s, s:{s:i, s:i, s:i, s:s, s:i, s:[o]}}", "id", "j-00aa11bb22cc", "plan", "gpus", 2,
                              "nodes", 1, "per_node", 2, "currency", "EUR", "total_uper_hour", 800000, "providers", p));
}

static void on_train_get(gn_ctl_req *r, void *ud) {
  (void)ud;
  if (strcmp(gn_ctl_req_param(r, "id"), "j-00aa11bb22cc") != 0) { /* logs and stop ask first: not a training job */
    gn_ctl_reply_error(r, 404, "no training job %s", gn_ctl_req_param(r, "id"));
    return;
  }
  gn_ctl_reply_json(r, 200,
                    json_pack("{s:{s:s, s:s, s:[], s:[]}}", "train", "id", gn_ctl_req_param(r, "id"), "state",
                              "running", "members", "ranks"));
}

/* POST /v1/attest: the figures as gpunetd gives them, full doubles. */
static void on_attest(gn_ctl_req *r, void *ud) {
  (void)ud;
  remember(r);
  json_t *mem = json_pack("{s:s, s:s, s:f, s:f, s:i}", "verdict", "memory simulated", "outcome", "simulated",
                          "measured_gbs", 1234.5678, "expected_gbs", 123456.789, "elapsed_ms", 12);
  gn_ctl_reply_json(r, 200,
                    json_pack("{s:s, s:s, s:s, s:f, s:f, s:i, s:i, s:b, s:o}", "verdict", "simulated", "outcome",
                              "simulated", "class", "RTX 4090", "measured_tops", 0.0168, "expected_tops",
                              3.14159265358979, "elapsed_ms", 40, "prover_ms", 31, "simulated", 1, "memory", mem));
}

static const char export_doc[] = "{\"format\": \"gpunet-invoice/1\",   \"odd spacing\": [1, 2]}\n";

static void on_export(gn_ctl_req *r, void *ud) {
  (void)ud;
  remember(r);
  gn_ctl_reply_text(r, 200, "application/json", export_doc);
}

/* An invoice whose energy claim depends on its id: i-energy 1.234 kWh over
 * an hour on 2 GPUs, i-1mw a provider's claim of 1 MW (flagged
 * implausible by the daemon), anything else none (simulated GPUs). */
static void on_invoice(gn_ctl_req *r, void *ud) {
  (void)ud;
  remember(r);
  const char *id = gn_ctl_req_param(r, "id");
  json_t *inv = json_pack("{s:s, s:s, s:i, s:I}", "id", id, "status", "accepted", "gpus", 2, "seconds", 3600);
  bool measured = strcmp(id, "i-energy") == 0 || strcmp(id, "i-1mw") == 0;
  json_object_set_new(inv, "energy_mj",
                      measured ? json_integer(strcmp(id, "i-1mw") == 0 ? 3600000000000ll : 4442400000ll) : json_null());
  json_object_set_new(inv, "energy_measured_s", measured ? json_integer(1800) : json_null());
  json_object_set_new(inv, "energy_plausible", measured ? json_boolean(strcmp(id, "i-1mw") != 0) : json_null());
  gn_ctl_reply_json(r, 200, json_pack("{s:o}", "invoice", inv));
}

static void on_stop_loop(uv_async_t *a) {
  fixture *f = a->data;
  gn_ctl_close(f->ctl);
  uv_close((uv_handle_t *)a, NULL);
}

static void *loop_main(void *arg) {
  fixture *f = arg;
  uv_run(&f->loop, UV_RUN_DEFAULT);
  return NULL;
}

static int setup(void **state) {
  const char *build = getenv("GN_BUILD_DIR");
  char bin[512];
  snprintf(bin, sizeof(bin), "%s/gpunet", build ? build : ".");
  if (!build || access(bin, X_OK) != 0) {
    *state = NULL;
    return 0;
  }
  fixture *f = calloc(1, sizeof(*f));
  g_f = f;
  snprintf(f->gpunet, sizeof(f->gpunet), "%s", bin);
  pthread_mutex_init(&f->lock, NULL);
  snprintf(f->dir, sizeof(f->dir), "/tmp/gn-cli-XXXXXX");
  assert_non_null(mkdtemp(f->dir));
  snprintf(f->sock, sizeof(f->sock), "%s/gpunetd.sock", f->dir);
  uv_loop_init(&f->loop);
  uv_async_init(&f->loop, &f->stop, on_stop_loop);
  f->stop.data = f;
  assert_int_equal(gn_ctl_new(&f->loop, f->sock, &f->ctl), 0);
  gn_ctl_route(f->ctl, "GET", "/v1/status", on_status, f);
  gn_ctl_route(f->ctl, "GET", "/v1/offers", on_offers, f);
  gn_ctl_route(f->ctl, "POST", "/v1/leases", on_rent, f);
  gn_ctl_route(f->ctl, "GET", "/v1/leases", on_leases, f);
  gn_ctl_route(f->ctl, "DELETE", "/v1/leases/:id", on_release, f);
  gn_ctl_route(f->ctl, "POST", "/v1/jobs", on_run, f);
  gn_ctl_route(f->ctl, "GET", "/v1/jobs/:id/logs", on_logs, f);
  gn_ctl_route(f->ctl, "GET", "/v1/jobs", on_jobs, f);
  gn_ctl_route(f->ctl, "POST", "/v1/jobs/:id/stop", on_stop, f);
  gn_ctl_route(f->ctl, "GET", "/v1/invoices/:id/export", on_export, f);
  gn_ctl_route(f->ctl, "GET", "/v1/invoices/:id", on_invoice, f);
  gn_ctl_route(f->ctl, "POST", "/v1/train", on_train, f);
  gn_ctl_route(f->ctl, "GET", "/v1/train/:id", on_train_get, f);
  gn_ctl_route(f->ctl, "POST", "/v1/attest", on_attest, f);
  pthread_create(&f->thread, NULL, loop_main, f);
  *state = f;
  return 0;
}

static int teardown(void **state) {
  fixture *f = *state;
  if (!f)
    return 0;
  uv_async_send(&f->stop);
  pthread_join(f->thread, NULL);
  uv_loop_close(&f->loop);
  json_decref(f->last_body);
  pthread_mutex_destroy(&f->lock);
  assert_int_equal(tn_rm_rf(f->dir), 0);
  free(f);
  g_f = NULL;
  return 0;
}

typedef tn_run run_result;

/* Runs gpunet --data-dir DIR ARGS; returns its exit code, output in out/err. */
static run_result *run(fixture *f, const char *args) {
  static run_result rr;
  char line[2048];
  snprintf(line, sizeof(line), "--data-dir '%s' %s", f->dir, args);
  tn_cli_run(f->gpunet, f->dir, line, &rr);
  if (getenv("GN_TEST_VERBOSE"))
    print_message("$ gpunet %s -> %d\n%s%s", args, rr.code, rr.out, rr.err);
  return &rr;
}

/* The same with the global options last: gpunet ARGS --data-dir DIR. */
static run_result *run_after(fixture *f, const char *args) {
  static run_result rr;
  char line[2048];
  snprintf(line, sizeof(line), "%s --data-dir '%s'", args, f->dir);
  tn_cli_run(f->gpunet, f->dir, line, &rr);
  return &rr;
}

#define SKIP_IF_NO_BINARY()                                                                                            \
  do {                                                                                                                 \
    if (!*state) {                                                                                                     \
      print_message("gpunet not built (GN_BUILD_DIR): skipped\n");                                                     \
      skip();                                                                                                          \
    }                                                                                                                  \
  } while (0)

static void assert_contains(const char *hay, const char *needle) {
  if (!strstr(hay, needle))
    fail_msg("'%s' not found in:\n%s", needle, hay);
}

/* --- tests -------------------------------------------------------------------*/

static void test_cli_status_table_and_json(void **state) {
  SKIP_IF_NO_BINARY();
  fixture *f = *state;
  run_result *r = run(f, "status");
  assert_int_equal(r->code, 0);
  assert_contains(r->out, "node id    " PROVIDER);
  assert_contains(r->out, "provider   yes");
  assert_contains(r->out, "offers     3");
  /* A provider that runs jobs unconfined says so in plain words. */
  assert_contains(r->out, "isolation  NO USER NAMESPACES (jobs' root is host root), LIMITS NOT ENFORCED: "
                          "max_user_namespaces is 0");
  assert_contains(r->out, "budgets    memory 1024/12052 MiB, pids 64/16384, cpu 1.50, DISK BELOW RESERVE");
  assert_contains(r->out, "training   on, job network UDP ports 51820-51899, 1 rank running\n");
  r = run(f, "--json status");
  assert_int_equal(r->code, 0);
  json_t *j = json_loads(r->out, 0, NULL);
  assert_non_null(j);
  assert_int_equal(json_integer_value(json_object_get(j, "peers")), 2);
  json_decref(j);
}

/* The longest run of significant digits in any number of s (leading zeros
 * and the digits of an exponent not counted). */
static int max_significant_digits(const char *s) {
  int best = 0;
  for (const char *p = s; *p;) {
    if (!isdigit((unsigned char)*p) || (p > s && (isalnum((unsigned char)p[-1]) || p[-1] == '-'))) {
      p++;
      continue;
    }
    int n = 0;
    bool started = false;
    for (; isdigit((unsigned char)*p) || *p == '.'; p++) {
      if (*p == '.')
        continue;
      if (*p != '0')
        started = true;
      if (started)
        n++;
    }
    if (n > best)
      best = n;
  }
  return best;
}

/* gpunet attest rounds its measured figures for people, the nested memory
 * challenge's too; --json keeps the daemon's exact values. */
static void test_cli_attest_rounds_figures_but_json_is_exact(void **state) {
  SKIP_IF_NO_BINARY();
  fixture *f = *state;
  run_result *r = run(f, "attest o-aaaaaaaaaaaa");
  assert_int_equal(r->code, 0);
  assert_contains(r->out, "measured_tops: 0.0168\n");
  assert_contains(r->out, "expected_tops: 3.142\n");
  assert_contains(r->out, "\"measured_gbs\":1235");
  assert_contains(r->out, "\"expected_gbs\":123457");
  assert_contains(r->out, "elapsed_ms:    40\n");
  if (max_significant_digits(r->out) > 6)
    fail_msg("a figure with more than 6 significant digits in:\n%s", r->out);
  r = run(f, "--json attest o-aaaaaaaaaaaa");
  assert_int_equal(r->code, 0);
  json_t *j = json_loads(r->out, 0, NULL);
  assert_non_null(j);
  assert_true(json_real_value(json_object_get(j, "measured_tops")) == 0.0168);
  assert_true(json_real_value(json_object_get(j, "expected_tops")) == 3.14159265358979);
  assert_true(json_real_value(json_object_get(json_object_get(j, "memory"), "expected_gbs")) == 123456.789);
  json_decref(j);
}

static void test_cli_offers_sends_filter_and_marks_simulated(void **state) {
  SKIP_IF_NO_BINARY();
  fixture *f = *state;
  run_result *r = run(f, "offers gpu=rtx4090 'vram>=24' --sort price");
  assert_int_equal(r->code, 0);
  assert_string_equal(f->last_filter, "gpu=rtx4090 vram>=24");
  assert_string_equal(f->last_sort, "price");
  assert_contains(r->out, "o-aaaaaaaaaaaa");
  assert_contains(r->out, "SIMULATED");
  assert_contains(r->out, "0.40 EUR/h");
  assert_contains(r->out, "2.45 EUR/h");
  assert_contains(r->out, "24 GiB");
  assert_contains(r->out, "80 GiB");
  assert_contains(r->out, "1/8");
  /* What each provider's offer says it does not confine. */
  assert_contains(r->out, "ISOLATION");
  assert_contains(r->out, "NO-USERNS,NO-LIMITS");
  const char *line1 = strstr(r->out, "o-aaaaaaaaaaaa");
  assert_non_null(line1);
  const char *eol = strchr(line1, '\n');
  assert_non_null(eol);
  const char *full = strstr(line1, " full ");
  assert_true(full && full < eol);
  /* Whether each provider takes ranks of training jobs, and on which ports. */
  assert_contains(r->out, "TRAINING");
  const char *tr1 = strstr(line1, " yes 51820-51899 ");
  assert_true(tr1 && tr1 < eol);
  const char *line2 = strstr(r->out, "o-bbbbbbbbbbbb");
  assert_non_null(line2);
  const char *eol2 = strchr(line2, '\n'), *tr2 = strstr(line2, " no ");
  assert_true(tr2 && eol2 && tr2 < eol2);
  assert_null(strstr(line2, "yes"));
  /* Columns line up: every line has the PRICE column at the same place. */
  const char *hdr = strstr(r->out, "PRICE");
  const char *row = strstr(r->out, "0.40 EUR/h");
  const char *line0 = r->out;
  const char *row_start = row;
  while (row_start > r->out && row_start[-1] != '\n')
    row_start--;
  /* Byte offsets differ by the UTF-8 ellipsis in the provider column. */
  assert_int_equal(hdr - line0, row - row_start - 2);
  /* --json passes the offer's fields through. */
  r = run(f, "--json offers");
  assert_int_equal(r->code, 0);
  assert_contains(r->out, "\"no_userns\": true");
  assert_contains(r->out, "\"unenforced_limits\": true");
  assert_contains(r->out, "\"jobnet_ports\": [");
  /* The training key goes to gpunetd as written; a bad one never leaves. */
  r = run(f, "offers training=true");
  assert_int_equal(r->code, 0);
  assert_string_equal(f->last_filter, "training=true");
  r = run(f, "offers 'gpu=rtx training=false'");
  assert_int_equal(r->code, 0);
  assert_string_equal(f->last_filter, "gpu=rtx training=false");
  static const char *const bad[] = {"offers training=maybe", "offers 'training>=1'", "offers training="};
  for (size_t i = 0; i < GN_ARRAY_SIZE(bad); i++) {
    snprintf(f->last_filter, sizeof(f->last_filter), "untouched");
    r = run(f, bad[i]);
    if (r->code != 2 || !strstr(r->err, "training"))
      fail_msg("'gpunet %s' exited %d, want 2 naming training: %s", bad[i], r->code, r->err);
    assert_string_equal(f->last_filter, "untouched");
  }
}

static void test_cli_rent_body_matches_contract(void **state) {
  SKIP_IF_NO_BINARY();
  fixture *f = *state;
  run_result *r = run(f, "rent --gpu rtx4090 --hours 2");
  assert_int_equal(r->code, 0);
  assert_contains(r->err, "negotiating lease with");
  assert_contains(r->out, "lease l-00112233445566778 active");
  assert_contains(r->out, "SIMULATED");
  json_t *b = f->last_body;
  assert_true(json_is_null(json_object_get(b, "offer")));
  assert_string_equal(json_string_value(json_object_get(b, "gpu")), "rtx4090");
  assert_int_equal(json_number_value(json_object_get(b, "hours")), 2);
  assert_int_equal(json_integer_value(json_object_get(b, "count")), 1);
  assert_true(json_is_false(json_object_get(b, "allow_simulated")));
  assert_true(json_is_true(json_object_get(b, "attest")));

  r = run(f, "rent o-aaaaaaaaaaaa --hours 0.5 --count 2 --allow-simulated --no-attest");
  assert_int_equal(r->code, 0);
  assert_contains(r->err, "negotiating lease with " PROVIDER "\xe2\x80\xa6\n");
  b = f->last_body;
  assert_string_equal(json_string_value(json_object_get(b, "offer")), "o-aaaaaaaaaaaa");
  assert_true(json_is_null(json_object_get(b, "gpu")));
  assert_true(json_number_value(json_object_get(b, "hours")) == 0.5);
  assert_int_equal(json_integer_value(json_object_get(b, "count")), 2);
  assert_true(json_is_true(json_object_get(b, "allow_simulated")));
  assert_true(json_is_false(json_object_get(b, "attest")));
}

static void test_cli_daemon_error_is_one_line_exit_1(void **state) {
  SKIP_IF_NO_BINARY();
  fixture *f = *state;
  run_result *r = run(f, "leases");
  assert_int_equal(r->code, 1);
  assert_string_equal(r->err, "gpunet: ledger is locked\n");
  r = run(f, "gpus"); /* not served here: the server's 404 message */
  assert_int_equal(r->code, 1);
  assert_string_equal(r->err, "gpunet: no such endpoint: GET /v1/gpus\n");
}

static void test_cli_release_prints_bill(void **state) {
  SKIP_IF_NO_BINARY();
  fixture *f = *state;
  run_result *r = run(f, "release l-00112233445566778");
  assert_int_equal(r->code, 0);
  assert_string_equal(f->last_param, "l-00112233445566778");
  assert_contains(r->out, "ran 1h02m, cost 0.413888 EUR");
  assert_contains(r->out, "invoice i-0011: 0.413888 EUR for 1h02m (3725 s), accepted");
}

static void test_cli_run_follow_streams_and_exits_with_job_code(void **state) {
  SKIP_IF_NO_BINARY();
  fixture *f = *state;
  run_result *r = run(f, "run l-00112233445566778 --image busybox --env A=1 -f -- sh -c 'exit 3'");
  assert_int_equal(r->code, 3);
  assert_string_equal(r->out, "j-1\nhello world\n");
  json_t *b = f->last_body;
  assert_string_equal(json_string_value(json_object_get(b, "lease")), "l-00112233445566778");
  assert_string_equal(json_string_value(json_object_get(b, "image")), "busybox");
  json_t *cmd = json_object_get(b, "cmd");
  assert_int_equal(json_array_size(cmd), 3);
  assert_string_equal(json_string_value(json_array_get(cmd, 1)), "-c");
  assert_string_equal(json_string_value(json_array_get(cmd, 2)), "exit 3");
  assert_string_equal(json_string_value(json_array_get(json_object_get(b, "env"), 0)), "A=1");
  assert_true(f->log_calls >= 4);
}

static void test_cli_run_sends_memory_and_pids(void **state) {
  SKIP_IF_NO_BINARY();
  fixture *f = *state;
  /* Without the options the body names no limits: gpunetd's defaults apply. */
  run_result *r = run(f, "run l-00112233445566778 --image busybox -- true");
  assert_int_equal(r->code, 0);
  assert_null(json_object_get(f->last_body, "memory_mib"));
  assert_null(json_object_get(f->last_body, "pids"));
  static const struct {
    const char *args;
    json_int_t memory_mib, pids;
  } good[] = {
      {"--memory 512M --pids 64", 512, 64}, {"--memory 2G", 2048, 0},       {"--memory 2GiB", 2048, 0},
      {"--memory=1536", 1536, 0},           {"--memory 1048576K", 1024, 0}, {"--memory 1T", 1048576, 0},
      {"--memory 16m --pids 8", 16, 8},     {"--pids 4096", 0, 4096},
  };
  for (size_t i = 0; i < GN_ARRAY_SIZE(good); i++) {
    char args[256];
    snprintf(args, sizeof(args), "run l-00112233445566778 --image busybox %s -- true", good[i].args);
    r = run(f, args);
    if (r->code != 0)
      fail_msg("'gpunet %s' exited %d: %s", args, r->code, r->err);
    const json_t *m = json_object_get(f->last_body, "memory_mib"), *p = json_object_get(f->last_body, "pids");
    if (good[i].memory_mib ? json_integer_value(m) != good[i].memory_mib : m != NULL)
      fail_msg("'%s' sent memory_mib %lld, want %lld", good[i].args, (long long)json_integer_value(m),
               (long long)good[i].memory_mib);
    if (good[i].pids ? json_integer_value(p) != good[i].pids : p != NULL)
      fail_msg("'%s' sent pids %lld, want %lld", good[i].args, (long long)json_integer_value(p),
               (long long)good[i].pids);
  }
  /* Bad values: a usage error that names the value, and no request. */
  static const struct {
    const char *args, *says;
  } bad[] = {
      {"--memory 0", "--memory '0' is outside 16M..1024G"},
      {"--memory 8M", "--memory '8M' is outside"},
      {"--memory 2T", "--memory '2T' is outside"},
      {"--memory 99999999999999999999999G", "is outside"},
      {"--memory 1.5G", "--memory '1.5G' is not a size"},
      {"--memory 1000K", "--memory '1000K' is not a size"},
      {"--memory 512X", "is not a size"},
      {"--memory ''", "is not a size"},
      {"--memory -1G", "is not a size"},
      {"--memory", "option '--memory' needs a value"},
      {"--pids 7", "--pids '7' is not a number of processes from 8 to 4096"},
      {"--pids 4097", "--pids '4097'"},
      {"--pids -5", "--pids '-5'"},
      {"--pids 12abc", "--pids '12abc'"},
      {"--pids 99999999999999999999", "--pids '99999999999999999999'"},
  };
  for (size_t i = 0; i < GN_ARRAY_SIZE(bad); i++) {
    pthread_mutex_lock(&f->lock);
    json_decref(f->last_body);
    f->last_body = NULL;
    pthread_mutex_unlock(&f->lock);
    char args[256];
    snprintf(args, sizeof(args), "run l-00112233445566778 --image busybox %s -- true", bad[i].args);
    if (strcmp(bad[i].args, "--memory") == 0)
      snprintf(args, sizeof(args), "run l-00112233445566778 --image busybox --memory");
    r = run(f, args);
    if (r->code != 2 || !strstr(r->err, bad[i].says))
      fail_msg("'gpunet %s' exited %d, want 2 and '%s': %s", args, r->code, bad[i].says, r->err);
    assert_null(f->last_body);
  }
}

static void forget_body(fixture *f) {
  pthread_mutex_lock(&f->lock);
  json_decref(f->last_body);
  f->last_body = NULL;
  pthread_mutex_unlock(&f->lock);
}

/* gpunet train's --max-spend, --memory and --no-attest reach POST /v1/train
 * as max_spend (micro-units), memory_mib and attest; bad values are usage
 * errors and nothing is sent. */
static void test_cli_train_sends_spend_memory_and_attest(void **state) {
  SKIP_IF_NO_BINARY();
  fixture *f = *state;
  /* Without them: no cap, gpunetd's default memory, attestation asked. */
  run_result *r = run(f, "train --gpus 2 --image 127.0.0.1:5000/x:1 -- true");
  if (r->code != 0)
    fail_msg("train exited %d: %s", r->code, r->err);
  assert_contains(r->out, "training j-00aa11bb22cc: 2 GPUs on 1 provider");
  assert_int_equal(json_integer_value(json_object_get(f->last_body, "gpus")), 2);
  assert_null(json_object_get(f->last_body, "max_spend"));
  assert_null(json_object_get(f->last_body, "memory_mib"));
  assert_true(json_is_true(json_object_get(f->last_body, "attest")));
  static const struct {
    const char *args;
    json_int_t max_spend, memory_mib;
    bool attest;
  } good[] = {
      {"--max-spend 20", 20000000, 0, true},
      {"--max-spend 0.000001", 1, 0, true},
      {"--max-spend=2.5 --memory 4G --no-attest", 2500000, 4096, false},
      {"--memory 512M", 0, 512, true},
      {"--memory=1536", 0, 1536, true},
      {"--memory 16m --no-attest", 0, 16, false},
      {"--memory 1T", 0, 1048576, true},
      {"--max-price 0.50 --max-spend 9007199254.740991", 9007199254740991, 0, true}, /* the largest */
  };
  for (size_t i = 0; i < GN_ARRAY_SIZE(good); i++) {
    char args[256];
    snprintf(args, sizeof(args), "train --gpus 2 --image 127.0.0.1:5000/x:1 %s -- true", good[i].args);
    forget_body(f);
    r = run(f, args);
    if (r->code != 0 || !f->last_body)
      fail_msg("'gpunet %s' exited %d: %s", args, r->code, r->err);
    const json_t *s = json_object_get(f->last_body, "max_spend"), *m = json_object_get(f->last_body, "memory_mib");
    if (good[i].max_spend ? json_integer_value(s) != good[i].max_spend : s != NULL)
      fail_msg("'%s' sent max_spend %lld, want %lld", good[i].args, (long long)json_integer_value(s),
               (long long)good[i].max_spend);
    if (good[i].memory_mib ? json_integer_value(m) != good[i].memory_mib : m != NULL)
      fail_msg("'%s' sent memory_mib %lld, want %lld", good[i].args, (long long)json_integer_value(m),
               (long long)good[i].memory_mib);
    if (json_is_true(json_object_get(f->last_body, "attest")) != good[i].attest ||
        !json_is_boolean(json_object_get(f->last_body, "attest")))
      fail_msg("'%s' sent attest %s", good[i].args,
               json_is_true(json_object_get(f->last_body, "attest")) ? "true" : "not true");
  }
  static const struct {
    const char *args, *says;
  } bad[] = {
      {"--max-spend 0", "--max-spend wants the most to pay for the whole group, like 20.00"},
      {"--max-spend 0.000000", "--max-spend wants"},
      {"--max-spend -1", "--max-spend wants"},
      {"--max-spend 1.1234567", "--max-spend wants"},
      {"--max-spend 2,50", "--max-spend wants"},
      {"--max-spend ''", "--max-spend wants"},
      {"--max-spend 'EUR 5'", "--max-spend wants"},
      {"--max-spend 9007199254.740992", "--max-spend '9007199254.740992' is too large (at most 9007199254.740991)"},
      {"--max-spend 99999999999999999999999", "--max-spend wants"},
      {"--max-price 9007199254.740992", "--max-price '9007199254.740992' is too large"},
      {"--memory 0", "--memory '0' is outside 16M..1024G"},
      {"--memory 8M", "--memory '8M' is outside"},
      {"--memory 2T", "--memory '2T' is outside"},
      {"--memory 1.5G", "--memory '1.5G' is not a size"},
      {"--memory 1000K", "is not a size"},
      {"--memory 4X", "is not a size"},
      {"--memory ''", "is not a size"},
      {"--memory -1G", "is not a size"},
      {"--no-attest=yes", "unknown option '--no-attest=yes'"},
      {"--memory", "option '--memory' needs a value"},
      {"--max-spend", "option '--max-spend' needs a value"},
  };
  for (size_t i = 0; i < GN_ARRAY_SIZE(bad); i++) {
    forget_body(f);
    char args[256];
    snprintf(args, sizeof(args), "train --gpus 2 --image 127.0.0.1:5000/x:1 %s -- true", bad[i].args);
    r = run(f, args);
    if (r->code != 2 || !strstr(r->err, bad[i].says))
      fail_msg("'gpunet %s' exited %d, want 2 and '%s': %s", args, r->code, bad[i].says, r->err);
    assert_null(f->last_body);
  }
}

static void test_cli_logs_without_follow_prints_once(void **state) {
  SKIP_IF_NO_BINARY();
  fixture *f = *state;
  run_result *r = run(f, "logs j-1");
  assert_int_equal(r->code, 0);
  assert_string_equal(r->out, "hello ");
  assert_int_equal(f->log_calls, 1);
}

static void test_cli_follow_of_failed_job_says_why(void **state) {
  SKIP_IF_NO_BINARY();
  fixture *f = *state;
  run_result *r = run(f, "logs -f j-9");
  assert_int_equal(r->code, 1);
  assert_string_equal(r->err, "gpunet: job j-9 failed: image nosuch:latest not found in the registry\n");
  r = run(f, "jobs");
  assert_int_equal(r->code, 0);
  assert_contains(r->out, "failed (image nosuch:latest not found in the registry)");
}

static void test_cli_stop(void **state) {
  SKIP_IF_NO_BINARY();
  fixture *f = *state;
  run_result *r = run(f, "stop j-7");
  assert_int_equal(r->code, 0);
  assert_string_equal(r->out, "job j-7: stopped\n");
}

static void test_cli_invoice_export_writes_bytes_as_received(void **state) {
  SKIP_IF_NO_BINARY();
  fixture *f = *state;
  char args[256], path[128];
  snprintf(path, sizeof(path), "%s/inv.json", f->dir);
  snprintf(args, sizeof(args), "invoice export i-0011 --out '%s'", path);
  run_result *r = run(f, args);
  assert_int_equal(r->code, 0);
  assert_string_equal(f->last_param, "i-0011");
  char want[160];
  snprintf(want, sizeof(want), "%s\n", path);
  assert_string_equal(r->out, want);
  char got[256];
  tn_slurp(path, got, sizeof(got));
  assert_string_equal(got, export_doc);
  struct stat st;
  assert_int_equal(stat(path, &st), 0);
  assert_int_equal(st.st_mode & 0777, 0644);
}

static void test_cli_invoice_show_states_energy(void **state) {
  SKIP_IF_NO_BINARY();
  fixture *f = *state;
  run_result *r = run(f, "invoice show i-energy");
  assert_int_equal(r->code, 0);
  assert_contains(r->out, "1.234 kWh (4,442 kJ) over 3600 GPU-seconds\n");
  assert_null(strstr(r->out, "energy_mj"));
  r = run(f, "invoice show i-1mw");
  assert_int_equal(r->code, 0);
  assert_contains(r->out, "1000.000 kWh (3,600,000 kJ) over 3600 GPU-seconds (IMPLAUSIBLE");
  /* No claim is not 0. */
  r = run(f, "invoice show i-none");
  assert_int_equal(r->code, 0);
  assert_contains(r->out, "not measured (no power reading)\n");
  assert_null(strstr(r->out, "0.000 kWh"));
  /* --json keeps the exact integers. */
  r = run(f, "--json invoice show i-energy");
  assert_int_equal(r->code, 0);
  assert_contains(r->out, "\"energy_mj\": 4442400000");
}

static void test_cli_usage_errors_exit_2(void **state) {
  SKIP_IF_NO_BINARY();
  fixture *f = *state;
  static const char *const bad[] = {"rent --hours 2",
                                    "rent o-1 --gpu x --hours 1",
                                    "rent o-1",
                                    "rent o-1 --hours -1",
                                    "run l-1 -- true",
                                    "run l-1 --image x",
                                    "logs",
                                    "offers --sort cost",
                                    "invoice frob 1",
                                    "invoice export i-1",
                                    "status extra",
                                    "--bogus status",
                                    "run l-1 --env NOEQ --image x -- true"};
  for (size_t i = 0; i < GN_ARRAY_SIZE(bad); i++) {
    run_result *r = run(f, bad[i]);
    if (r->code != 2)
      fail_msg("'gpunet %s' exited %d, want 2 (%s)", bad[i], r->code, r->err);
  }
}

static void test_cli_global_options_after_the_command(void **state) {
  SKIP_IF_NO_BINARY();
  fixture *f = *state;
  /* --data-dir after the command reaches the stand-in daemon's socket. */
  run_result *r = run_after(f, "status --json");
  assert_int_equal(r->code, 0);
  assert_contains(r->out, "\"node_id\": \"" PROVIDER "\"");
  r = run_after(f, "status");
  assert_int_equal(r->code, 0);
  assert_null(strstr(r->out, "\"node_id\""));
  assert_contains(r->out, PROVIDER);
  r = run_after(f, "--json status");
  assert_int_equal(r->code, 0);
  assert_contains(r->out, "\"node_id\"");
  char args[256];
  snprintf(args, sizeof(args), "status --data-dir=%s --json", f->dir);
  r = run_after(f, args);
  assert_int_equal(r->code, 0);
  assert_contains(r->out, "\"node_id\"");
  /* An unknown option after the command is still the command's error. */
  r = run_after(f, "status --bogus");
  assert_int_equal(r->code, 2);
  assert_contains(r->err, "gpunet status: unknown option '--bogus'");
  r = run(f, "status --data-dir");
  assert_int_equal(r->code, 2);
  assert_contains(r->err, "option '--data-dir' needs a directory");
}

static void test_cli_job_arguments_are_not_global_options(void **state) {
  SKIP_IF_NO_BINARY();
  fixture *f = *state;
  /* --json before "--" is gpunet's; after it, the job's, like --data-dir. */
  run_result *r = run(f, "run l-00112233445566778 --image busybox --json -- echo --json --data-dir /x");
  assert_int_equal(r->code, 0);
  assert_contains(r->out, "\"job\"");
  json_t *cmd = json_object_get(f->last_body, "cmd");
  assert_int_equal(json_array_size(cmd), 4);
  assert_string_equal(json_string_value(json_array_get(cmd, 1)), "--json");
  assert_string_equal(json_string_value(json_array_get(cmd, 2)), "--data-dir");
  assert_string_equal(json_string_value(json_array_get(cmd, 3)), "/x");
  /* The value of a command's option is never taken for a global one. */
  r = run(f, "offers --sort --json");
  assert_int_equal(r->code, 2);
  assert_contains(r->err, "--json");
  /* Which options take a value comes from each command's getopt table:
   * train's --image (also as getopt_long's prefix --ima), logs' --rank, a
   * short cluster ending in run's -e. */
  forget_body(f);
  r = run(f, "train --gpus 2 --image --json -- true");
  assert_int_equal(r->code, 0);
  assert_string_equal(json_string_value(json_object_get(f->last_body, "image")), "--json");
  assert_contains(r->out, "training j-00aa11bb22cc: 2 GPUs"); /* the plan as text, not JSON */
  forget_body(f);
  r = run(f, "train --gpus 2 --ima --data-dir -- true");
  assert_int_equal(r->code, 0);
  assert_string_equal(json_string_value(json_object_get(f->last_body, "image")), "--data-dir");
  r = run(f, "logs --rank --json j-1");
  assert_int_equal(r->code, 2);
  assert_contains(r->err, "--rank wants a rank number from 0 to 63, not '--json'");
  r = run(f, "run l-00112233445566778 -fe --json --image busybox -- true");
  assert_int_equal(r->code, 2);
  assert_contains(r->err, "not '--json'");
  /* A value missing before "--" is a usage error ("--" is never a value). */
  forget_body(f);
  r = run(f, "train --gpus 2 --image busybox --memory -- echo --json");
  assert_int_equal(r->code, 2);
  assert_contains(r->err, "option '--memory' needs a value");
  assert_null(f->last_body);
}

static void test_cli_hostile_ids_refused_before_any_request(void **state) {
  SKIP_IF_NO_BINARY();
  fixture *f = *state;
  static const char *const ids[] = {"..", ".", "../../x", "a/b", "a.b", "'a b'", "''", "$'a\\n'"};
  static const char *const cmds[] = {"logs %s",          "logs -f %s",      "stop %s",
                                     "release %s",       "invoice show %s", "run %s --image x -- true",
                                     "rent %s --hours 1"};
  for (size_t i = 0; i < GN_ARRAY_SIZE(ids); i++) {
    for (size_t k = 0; k < GN_ARRAY_SIZE(cmds); k++) {
      char args[256];
      snprintf(args, sizeof(args), cmds[k], ids[i]);
      run_result *r = run(f, args);
      if (r->code != 2 || !strstr(r->err, "id: ids are 1 to 64 letters"))
        fail_msg("'gpunet %s' exited %d: %s", args, r->code, r->err);
    }
  }
  assert_string_equal(f->last_param, "");
  assert_null(f->last_body);
  assert_int_equal(f->log_calls, 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_cli_status_table_and_json, setup, teardown),
      cmocka_unit_test_setup_teardown(test_cli_attest_rounds_figures_but_json_is_exact, setup, teardown),
      cmocka_unit_test_setup_teardown(test_cli_offers_sends_filter_and_marks_simulated, setup, teardown),
      cmocka_unit_test_setup_teardown(test_cli_rent_body_matches_contract, setup, teardown),
      cmocka_unit_test_setup_teardown(test_cli_daemon_error_is_one_line_exit_1, setup, teardown),
      cmocka_unit_test_setup_teardown(test_cli_release_prints_bill, setup, teardown),
      cmocka_unit_test_setup_teardown(test_cli_run_follow_streams_and_exits_with_job_code, setup, teardown),
      cmocka_unit_test_setup_teardown(test_cli_run_sends_memory_and_pids, setup, teardown),
      cmocka_unit_test_setup_teardown(test_cli_train_sends_spend_memory_and_attest, setup, teardown),
      cmocka_unit_test_setup_teardown(test_cli_logs_without_follow_prints_once, setup, teardown),
      cmocka_unit_test_setup_teardown(test_cli_follow_of_failed_job_says_why, setup, teardown),
      cmocka_unit_test_setup_teardown(test_cli_stop, setup, teardown),
      cmocka_unit_test_setup_teardown(test_cli_invoice_export_writes_bytes_as_received, setup, teardown),
      cmocka_unit_test_setup_teardown(test_cli_invoice_show_states_energy, setup, teardown),
      cmocka_unit_test_setup_teardown(test_cli_usage_errors_exit_2, setup, teardown),
      cmocka_unit_test_setup_teardown(test_cli_global_options_after_the_command, setup, teardown),
      cmocka_unit_test_setup_teardown(test_cli_job_arguments_are_not_global_options, setup, teardown),
      cmocka_unit_test_setup_teardown(test_cli_hostile_ids_refused_before_any_request, setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
