/* Tests of gpunetd's configuration: defaults, the config file, flags, their
 * precedence and the error messages, with real files in a temporary dir. */
#include <gpunet/discovery.h>
#include <gpunet/node.h>
#include <gpunet/transport.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

typedef struct fixture {
  char dir[64];
  char data[128];
  char xdg_config[128];
} fixture;

static void write_file(const char *path, const char *text) {
  FILE *f = fopen(path, "w");
  assert_non_null(f);
  fputs(text, f);
  fclose(f);
}

static int setup(void **state) {
  fixture *f = calloc(1, sizeof(*f));
  snprintf(f->dir, sizeof(f->dir), "/tmp/gn-cfg-XXXXXX");
  assert_non_null(mkdtemp(f->dir));
  snprintf(f->data, sizeof(f->data), "%s/data", f->dir);
  snprintf(f->xdg_config, sizeof(f->xdg_config), "%s/xdgconf", f->dir);
  mkdir(f->data, 0700);
  /* Keep the developer's own files out of every test. */
  setenv("HOME", f->dir, 1);
  setenv("XDG_DATA_HOME", f->data, 1);
  setenv("XDG_CONFIG_HOME", f->xdg_config, 1);
  *state = f;
  return 0;
}

static int teardown(void **state) {
  fixture *f = *state;
  char cmd[256];
  snprintf(cmd, sizeof(cmd), "rm -rf '%s'", f->dir);
  assert_int_equal(system(cmd), 0);
  free(f);
  return 0;
}

static void test_config_defaults(void **state) {
  fixture *f = *state;
  gn_config c;
  gn_config_defaults(&c);
  char want[256];
  snprintf(want, sizeof(want), "%s/gpunet", f->data);
  assert_string_equal(c.data_dir, want);
  assert_string_equal(c.listen, "127.0.0.1:7946");
  assert_int_equal(c.price_uper_hour, 400000);
  assert_string_equal(c.currency, "EUR");
  assert_int_equal(c.max_hours, 24);
  assert_int_equal(c.interval_min_s, 10);
  assert_int_equal(c.interval_max_s, 3600);
  assert_string_equal(c.log_level, "info");
  assert_string_equal(c.runtime, "");
  assert_false(c.provide);
  assert_false(c.allow_simulated);
  assert_int_equal(c.bootstrap_count, 0);
  assert_true(c.job_memory_share == 0.5);
  assert_true(c.job_cpu_share == 0.75);
  assert_int_equal(c.job_pids_max, 16384);
  assert_int_equal(c.store_max_bytes, 64ull << 30);
  assert_int_equal(c.disk_reserve_bytes, 1ull << 30);
  assert_int_equal(c.registry_allow_count, 0); /* no private registry unless named */
  assert_false(c.allow_unenforced_limits);
  assert_false(c.allow_no_userns);
  assert_string_equal(c.metrics_listen, ""); /* no metrics over TCP unless asked */
  gn_config_done(&c);
}

static void test_config_data_dir_falls_back_to_home(void **state) {
  fixture *f = *state;
  unsetenv("XDG_DATA_HOME");
  char buf[256], want[256];
  /* The data dir is p2p's gn_data_dir_default (tests/p2p/test_paths.c). */
  gn_config c;
  gn_config_defaults(&c);
  snprintf(want, sizeof(want), "%s/.local/share/gpunet", f->dir);
  assert_string_equal(c.data_dir, want);
  gn_config_done(&c);
  unsetenv("HOME");
  gn_config_defaults(&c);
  assert_string_equal(c.data_dir, "");
  gn_config_done(&c);
  setenv("HOME", f->dir, 1);
  assert_int_equal(gn_config_default_path("/nonexistent", buf, sizeof(buf)), 0);
  snprintf(want, sizeof(want), "%s/gpunet/gpunet.conf", f->xdg_config);
  assert_string_equal(buf, want);
  unsetenv("XDG_CONFIG_HOME");
  assert_int_equal(gn_config_default_path("/nonexistent", buf, sizeof(buf)), 0);
  snprintf(want, sizeof(want), "%s/.config/gpunet/gpunet.conf", f->dir);
  assert_string_equal(buf, want);
}

static void test_config_file_sets_every_key(void **state) {
  fixture *f = *state;
  char path[256];
  snprintf(path, sizeof(path), "%s/a.conf", f->dir);
  write_file(path, "# a comment\n"
                   "\n"
                   "data_dir = /srv/gpunet\n"
                   "  listen=0.0.0.0:9000   # trailing comment\n"
                   "bootstrap = 10.0.0.1:7946\n"
                   "bootstrap = peer.example:7000\n"
                   "provide = yes\n"
                   "price = 0.55\n"
                   "currency = USD\n"
                   "simulate_gpu = RTX 4090\n"
                   "simulate_gpu = 3090\n"
                   "runtime = crun\n"
                   "max_hours = 48\n"
                   "allow_simulated = true\n"
                   "log_level = debug\n"
                   "job_memory_share = 0.25\n"
                   "job_cpu_share = 1\n"
                   "job_pids_max = 2048\n"
                   "store_max = 10GiB\n"
                   "disk_reserve = 512M\n"
                   "registry_allow = 127.0.0.1\n"
                   "registry_allow = 10.0.0.0/8, registry.lan:5000\n"
                   "allow_unenforced_limits = true\n"
                   "allow_no_userns = yes\n");
  gn_config c;
  gn_config_defaults(&c);
  char err[256] = "";
  assert_int_equal(gn_config_load_file(&c, path, false, err, sizeof(err)), 0);
  assert_string_equal(c.data_dir, "/srv/gpunet");
  assert_string_equal(c.listen, "0.0.0.0:9000");
  assert_int_equal(c.bootstrap_count, 2);
  assert_string_equal(c.bootstrap[1], "peer.example:7000");
  assert_true(c.provide);
  assert_int_equal(c.price_uper_hour, 550000);
  assert_string_equal(c.currency, "USD");
  assert_int_equal(c.simulate_count, 2);
  assert_string_equal(c.simulate_gpu[0], "RTX 4090");
  assert_string_equal(c.runtime, "crun");
  assert_int_equal(c.max_hours, 48);
  assert_true(c.allow_simulated);
  assert_string_equal(c.log_level, "debug");
  assert_true(c.job_memory_share == 0.25);
  assert_true(c.job_cpu_share == 1.0);
  assert_int_equal(c.job_pids_max, 2048);
  assert_int_equal(c.store_max_bytes, 10ull << 30);
  assert_int_equal(c.disk_reserve_bytes, 512ull << 20);
  assert_int_equal(c.registry_allow_count, 3);
  assert_string_equal(c.registry_allow[0], "127.0.0.1");
  assert_string_equal(c.registry_allow[1], "10.0.0.0/8");
  assert_string_equal(c.registry_allow[2], "registry.lan:5000");
  assert_true(c.allow_unenforced_limits);
  assert_true(c.allow_no_userns);
  assert_string_equal(c.config_path, path);
  gn_config_done(&c);
}

static void test_config_unknown_key_names_the_line(void **state) {
  fixture *f = *state;
  char path[256];
  snprintf(path, sizeof(path), "%s/b.conf", f->dir);
  write_file(path, "listen = 127.0.0.1:1\n# fine\nprovdie = true\n");
  gn_config c;
  gn_config_defaults(&c);
  char err[512] = "", want[512];
  assert_int_equal(gn_config_load_file(&c, path, false, err, sizeof(err)), GN_EINVAL);
  snprintf(want, sizeof(want), "%s:3: unknown key 'provdie'", path);
  assert_string_equal(err, want);
  /* A failed load changes nothing, not even the keys before the bad line. */
  assert_string_equal(c.listen, "127.0.0.1:7946");
  gn_config_done(&c);
}

static void test_config_bad_values_table(void **state) {
  fixture *f = *state;
  static const struct {
    const char *line;
    const char *msg;
  } cases[] = {
      {"price = 0.4.0", "bad price '0.4.0'"},
      {"price = 0.1234567", "bad price"},
      {"price = -1", "bad price"},
      {"price = .5", "bad price"},
      {"listen = nowhere", "bad listen address 'nowhere'"},
      {"listen = host:70000", "bad listen address"},
      {"bootstrap = :7946", "bad bootstrap address"},
      {"provide = perhaps", "provide must be true or false"},
      {"max_hours = 0", "bad max_hours '0'"},
      {"max_hours = 9999", "bad max_hours"},
      {"max_hours = 961", "bad max_hours '961': want a whole number of hours from 1 to 960"},
      {"max_hours = 8760", "bad max_hours '8760'"},
      {"max_hours = 1x", "bad max_hours"},
      {"currency = eur", "bad currency 'eur'"},
      {"log_level = loud", "bad log_level 'loud'"},
      {"just words", "expected `key = value`"},
      {"simulate_gpu = RTX 9999", "unknown simulated GPU 'RTX 9999' (known: RTX 3090"},
      {"job_memory_share = 0", "bad job_memory_share '0': want a share of the host above 0 and at most 1"},
      {"job_memory_share = 1.5", "bad job_memory_share '1.5'"},
      {"job_memory_share = half", "bad job_memory_share 'half'"},
      {"job_memory_share = -0.5", "bad job_memory_share"},
      {"job_memory_share = nan", "bad job_memory_share"},
      {"job_cpu_share = 0.75x", "bad job_cpu_share '0.75x'"},
      {"job_pids_max = 4", "bad job_pids_max '4': want a whole number of processes from 8"},
      {"job_pids_max = -100", "bad job_pids_max"},
      {"store_max = 64X", "bad store_max '64X': want a size like 64G"},
      {"store_max = 1M", "store_max '1M' is too small"},
      {"store_max = G", "bad store_max"},
      {"disk_reserve = 99999999999T", "bad disk_reserve"},
      {"disk_reserve = 1GiBs", "bad disk_reserve"},
      {"registry_allow = 127.0.0.1/33", "bad registry_allow entry '127.0.0.1/33'"},
      {"registry_allow = http://evil", "bad registry_allow entry 'http://evil'"},
      {"registry_allow = a;b", "bad registry_allow entry 'a;b'"},
      {"allow_no_userns = maybe", "allow_no_userns must be true or false"},
      {"allow_unenforced_limits = 2", "allow_unenforced_limits must be true or false"},
      {"interval_min_s = 0", "bad interval_min_s '0': want a whole number of seconds from 1 to 86400"},
      {"interval_max_s = 86401", "bad interval_max_s '86401'"},
      {"interval_max_s = 10s", "bad interval_max_s '10s'"},
      {"metrics_listen = 0", "metrics_listen must be PORT or IP:PORT"},
      {"metrics_listen = 65536", "metrics_listen must be PORT or IP:PORT"},
      {"metrics_listen = localhost:9464", "metrics_listen must be PORT or IP:PORT (IPv6 as [IP]:PORT), not "
                                          "'localhost:9464'"},
      {"metrics_listen = 127.0.0.1", "metrics_listen must be"},
      {"metrics_listen = ::1:9464", "metrics_listen must be"},
      {"metrics_listen = 10.0.0.300:9464", "metrics_listen must be"},
  };
  char path[256];
  snprintf(path, sizeof(path), "%s/c.conf", f->dir);
  for (size_t i = 0; i < GN_ARRAY_SIZE(cases); i++) {
    char text[256];
    snprintf(text, sizeof(text), "\n%s\n", cases[i].line);
    write_file(path, text);
    gn_config c;
    gn_config_defaults(&c);
    char err[512] = "";
    if (gn_config_load_file(&c, path, false, err, sizeof(err)) >= 0)
      fail_msg("'%s' was accepted", cases[i].line);
    if (!strstr(err, cases[i].msg) || !strstr(err, ":2: "))
      fail_msg("'%s': error '%s' lacks '%s' or the line number", cases[i].line, err, cases[i].msg);
    gn_config_done(&c);
  }
}

/* A bare port is loopback; an address is kept as given (the daemon warns
 * when it is not loopback). */
static void test_config_metrics_listen_bare_port_is_loopback(void **state) {
  (void)state;
  static const struct {
    const char *arg, *want;
  } cases[] = {
      {"9464", "127.0.0.1:9464"},
      {"0.0.0.0:9100", "0.0.0.0:9100"},
      {"[::1]:9464", "[::1]:9464"},
  };
  for (size_t i = 0; i < GN_ARRAY_SIZE(cases); i++) {
    gn_config c;
    gn_config_defaults(&c);
    char *argv[] = {"gpunetd", "--metrics-listen", (char *)cases[i].arg, NULL};
    char err[512] = "";
    if (gn_config_parse_args(&c, 3, argv, err, sizeof(err)) < 0)
      fail_msg("'%s' refused: %s", cases[i].arg, err);
    assert_string_equal(c.metrics_listen, cases[i].want);
    gn_config_done(&c);
  }
}

static void test_config_price_parse_table(void **state) {
  fixture *f = *state;
  static const struct {
    const char *text;
    uint64_t micro;
  } cases[] = {{"0.40", 400000},        {"0.4", 400000}, {"1", 1000000},       {"0.5", 500000},
               {"12.345678", 12345678}, {"0", 0},        {"3.000001", 3000001}};
  char path[256];
  snprintf(path, sizeof(path), "%s/p.conf", f->dir);
  for (size_t i = 0; i < GN_ARRAY_SIZE(cases); i++) {
    char text[64];
    snprintf(text, sizeof(text), "price = %s\n", cases[i].text);
    write_file(path, text);
    gn_config c;
    gn_config_defaults(&c);
    char err[256] = "";
    if (gn_config_load_file(&c, path, false, err, sizeof(err)) != 0)
      fail_msg("price %s: %s", cases[i].text, err);
    if (c.price_uper_hour != cases[i].micro)
      fail_msg("price %s: got %llu", cases[i].text, (unsigned long long)c.price_uper_hour);
    gn_config_done(&c);
  }
}

static void test_config_missing_file(void **state) {
  fixture *f = *state;
  char path[256];
  snprintf(path, sizeof(path), "%s/none.conf", f->dir);
  gn_config c;
  gn_config_defaults(&c);
  char err[256] = "";
  assert_int_equal(gn_config_load_file(&c, path, true, err, sizeof(err)), 0);
  assert_int_equal(gn_config_load_file(&c, path, false, err, sizeof(err)), -ENOENT);
  assert_non_null(strstr(err, "none.conf"));
  gn_config_done(&c);
}

/* defaults < file < flags, and a flag list replaces the file's list. */
static void test_config_flags_override_file(void **state) {
  fixture *f = *state;
  char ddir[256], path[300];
  snprintf(ddir, sizeof(ddir), "%s/node1", f->dir);
  mkdir(ddir, 0700);
  snprintf(path, sizeof(path), "%s/gpunet.conf", ddir);
  write_file(path, "listen = 127.0.0.1:8000\nprice = 0.30\nbootstrap = 10.0.0.1:1\nmax_hours = 5\n");
  char *argv[] = {"gpunetd",     "--data-dir", ddir,        "--price",        "0.45",     "--bootstrap", "10.0.0.2:2",
                  "--bootstrap", "10.0.0.3:3", "--provide", "--simulate-gpu", "RTX 4090", NULL};
  gn_config c;
  char err[256] = "";
  int r = gn_config_load(&c, GN_ARRAY_SIZE(argv) - 1, argv, err, sizeof(err));
  if (r != 0)
    fail_msg("load: %s", err);
  assert_string_equal(c.data_dir, ddir);
  assert_string_equal(c.config_path, path);        /* DATA_DIR/gpunet.conf is read */
  assert_string_equal(c.listen, "127.0.0.1:8000"); /* from the file */
  assert_int_equal(c.max_hours, 5);                /* from the file */
  assert_int_equal(c.price_uper_hour, 450000);     /* the flag wins */
  assert_int_equal(c.bootstrap_count, 2);
  assert_string_equal(c.bootstrap[0], "10.0.0.2:2");
  assert_string_equal(c.bootstrap[1], "10.0.0.3:3");
  assert_true(c.provide);
  assert_int_equal(c.simulate_count, 1);
  assert_string_equal(c.currency, "EUR"); /* the default */
  gn_config_done(&c);
}

static void test_config_xdg_file_used_when_data_dir_has_none(void **state) {
  fixture *f = *state;
  char dir[256], path[300];
  snprintf(dir, sizeof(dir), "%s/gpunet", f->xdg_config);
  mkdir(f->xdg_config, 0700);
  mkdir(dir, 0700);
  snprintf(path, sizeof(path), "%s/gpunet.conf", dir);
  write_file(path, "currency = CHF\n");
  char *argv[] = {"gpunetd", NULL};
  gn_config c;
  char err[256] = "";
  assert_int_equal(gn_config_load(&c, 1, argv, err, sizeof(err)), 0);
  assert_string_equal(c.currency, "CHF");
  gn_config_done(&c);
}

static void test_config_explicit_config_flag(void **state) {
  fixture *f = *state;
  char path[256];
  snprintf(path, sizeof(path), "%s/explicit.conf", f->dir);
  write_file(path, "max_hours = 7\n");
  char *argv[] = {"gpunetd", "--config", path, NULL};
  gn_config c;
  char err[256] = "";
  assert_int_equal(gn_config_load(&c, 3, argv, err, sizeof(err)), 0);
  assert_int_equal(c.max_hours, 7);
  gn_config_done(&c);
  /* A named file must exist. */
  snprintf(path, sizeof(path), "%s/missing.conf", f->dir);
  assert_int_equal(gn_config_load(&c, 3, argv, err, sizeof(err)), -ENOENT);
  gn_config_done(&c);
}

static void test_config_flag_errors_table(void **state) {
  (void)state;
  static const struct {
    const char *args[4];
    int code;
    const char *msg;
  } cases[] = {
      {{"--bogus"}, GN_EINVAL, "unknown option '--bogus'"},
      {{"--price"}, GN_EINVAL, "option '--price' needs a value"},
      {{"--price", "cheap"}, GN_EINVAL, "--price: bad price 'cheap'"},
      {{"--listen", "x"}, GN_EINVAL, "--listen: bad listen address"},
      {{"stray"}, GN_EINVAL, "unexpected argument 'stray'"},
      {{"--max-hours", "0"}, GN_EINVAL, "--max-hours: bad max_hours"},
      {{"--max-hours", "2000"},
       GN_EINVAL,
       "--max-hours: bad max_hours '2000': want a whole number of hours from 1 to 960"},
      {{"--max-hours", "960"}, 0, ""},
      {{"--help"}, GN_CONFIG_HELP, ""},
      {{"-h"}, GN_CONFIG_HELP, ""},
      {{"--version"}, GN_CONFIG_VERSION, ""},
      {{"--log-level", "debug"}, 0, ""},
      {{"--job-memory-share", "2"}, GN_EINVAL, "--job-memory-share: bad job_memory_share '2'"},
      {{"--job-cpu-share"}, GN_EINVAL, "option '--job-cpu-share' needs a value"},
      {{"--store-max", "lots"}, GN_EINVAL, "--store-max: bad store_max 'lots'"},
      {{"--registry-allow", "a b/c"}, GN_EINVAL, "--registry-allow: bad registry_allow entry 'b/c'"},
      {{"--allow-no-userns", "--allow-unenforced-limits"}, 0, ""},
      {{"--interval-min-s", "2", "--interval-max-s", "5"}, 0, ""},
      {{"--interval-min-s", "600", "--interval-max-s", "60"},
       GN_EINVAL,
       "interval_min_s (600) is above interval_max_s (60)"},
      {{"--interval-min-s", "-1"}, GN_EINVAL, "--interval-min-s: bad interval_min_s '-1'"},
  };
  for (size_t i = 0; i < GN_ARRAY_SIZE(cases); i++) {
    char *argv[6] = {"gpunetd"};
    int argc = 1;
    for (int k = 0; k < 4 && cases[i].args[k]; k++)
      argv[argc++] = (char *)cases[i].args[k];
    gn_config c;
    char err[256] = "";
    int r = gn_config_load(&c, argc, argv, err, sizeof(err));
    if (r != cases[i].code)
      fail_msg("case %zu (%s): got %d want %d (%s)", i, cases[i].args[0], r, cases[i].code, err);
    if (!strstr(err, cases[i].msg))
      fail_msg("case %zu: error '%s' lacks '%s'", i, err, cases[i].msg);
    gn_config_done(&c);
  }
  assert_non_null(strstr(gn_config_usage(), "--simulate-gpu"));
  assert_non_null(strstr(gn_config_usage(), "--job-memory-share"));
  assert_non_null(strstr(gn_config_usage(), "--registry-allow"));
  assert_non_null(strstr(gn_config_usage(), "--allow-no-userns"));
  assert_non_null(strstr(gn_config_usage(), "--interval-min-s"));
}

/* The budgets and the allow list come from flags as well, a flag list
 * replaces the file's, and sizes take binary suffixes. */
static void test_config_budget_flags(void **state) {
  fixture *f = *state;
  char path[256];
  snprintf(path, sizeof(path), "%s/budget.conf", f->dir);
  write_file(path, "registry_allow = 10.1.2.3\njob_pids_max = 100\n");
  char *argv[] = {"gpunetd",   "--config",         path,         "--job-memory-share", "0.3",  "--job-cpu-share",
                  "0.5",       "--store-max",      "2T",         "--disk-reserve",     "4096", "--registry-allow",
                  "127.0.0.1", "--registry-allow", "[::1]:5000", "--allow-no-userns",  NULL};
  gn_config c;
  char err[256] = "";
  int r = gn_config_load(&c, GN_ARRAY_SIZE(argv) - 1, argv, err, sizeof(err));
  if (r != 0)
    fail_msg("load: %s", err);
  assert_true(c.job_memory_share == 0.3);
  assert_true(c.job_cpu_share == 0.5);
  assert_int_equal(c.job_pids_max, 100); /* from the file */
  assert_int_equal(c.store_max_bytes, 2ull << 40);
  assert_int_equal(c.disk_reserve_bytes, 4096);
  assert_int_equal(c.registry_allow_count, 2); /* the flags replace the file's entry */
  assert_string_equal(c.registry_allow[0], "127.0.0.1");
  assert_string_equal(c.registry_allow[1], "[::1]:5000");
  assert_true(c.allow_no_userns);
  assert_false(c.allow_unenforced_limits);
  gn_config_done(&c);
}

/* At most GN_CONFIG_MAX_REGISTRY_ALLOW entries, said clearly. */
static void test_config_registry_allow_is_bounded(void **state) {
  fixture *f = *state;
  char path[256], text[4096] = "";
  snprintf(path, sizeof(path), "%s/many.conf", f->dir);
  for (int i = 0; i <= GN_CONFIG_MAX_REGISTRY_ALLOW; i++) {
    size_t used = strlen(text);
    snprintf(text + used, sizeof(text) - used, "registry_allow = 10.0.0.%d\n", i);
  }
  write_file(path, text);
  gn_config c;
  gn_config_defaults(&c);
  char err[512] = "";
  assert_int_equal(gn_config_load_file(&c, path, false, err, sizeof(err)), GN_ETOOBIG);
  assert_non_null(strstr(err, "too many registry_allow entries"));
  assert_int_equal(c.registry_allow_count, 0);
  gn_config_done(&c);
}

static void test_config_parse_does_not_reorder_argv(void **state) {
  (void)state;
  char *argv[] = {"gpunetd", "--provide", "stray", "--listen", "1.2.3.4:5", NULL};
  char *copy[6];
  memcpy(copy, argv, sizeof(argv));
  gn_config c;
  gn_config_defaults(&c);
  char err[256];
  assert_int_equal(gn_config_parse_args(&c, 5, argv, err, sizeof(err)), GN_EINVAL);
  assert_memory_equal(copy, argv, sizeof(argv));
  gn_config_done(&c);
}

/* Every limit key defaults to the value compiled in before it was a key:
 * the transport's, discovery's and the offer table's own defaults. */
static void test_config_limits_default_to_compiled_values(void **state) {
  (void)state;
  gn_config c;
  gn_config_defaults(&c);
  gn_transport_limits tl;
  gn_transport_limits_default(&tl);
  gn_discovery_config dc;
  gn_discovery_config_default(&dc);
  const gn_config_limits *l = &c.limits;
  assert_int_equal(l->max_connections, tl.max_conns);
  assert_int_equal(l->dial_reserve, tl.dial_reserve);
  assert_int_equal(l->max_inbound_per_ip, tl.max_inbound_per_host);
  assert_int_equal(l->max_inbound_per_net, tl.max_inbound_per_net);
  assert_int_equal(l->max_handshaking, tl.max_unauth);
  assert_int_equal(l->transport_memory, tl.mem_budget);
  assert_int_equal(l->handshake_timeout_s * 1000, tl.handshake_timeout_ms);
  assert_int_equal(l->idle_timeout_s * 1000, tl.idle_timeout_ms);
  assert_int_equal(l->progress_timeout_s * 1000, tl.msg_timeout_ms);
  assert_int_equal(l->send_stall_s * 1000, tl.send_stall_ms);
  assert_int_equal(l->overlay_source_rate, 100); /* node/overlay.h GN_OVERLAY_SRC_RATE_PER_S */
  assert_int_equal(l->overlay_rate, 2000);       /* GN_OVERLAY_ALL_RATE_PER_S */
  assert_int_equal(l->offer_table_size, 4096);
  assert_int_equal(l->offers_per_provider, 16);
  assert_int_equal(l->gossip_peer_digests, dc.peer_digests);
  assert_int_equal(l->gossip_peer_wants, dc.peer_wants);
  assert_int_equal(l->gossip_peer_bytes, dc.peer_sync_bytes);
  gn_config_done(&c);
}

/* The file sets them (sizes with suffixes), the flags override the file. */
static void test_config_limits_from_file_and_flags(void **state) {
  fixture *f = *state;
  char path[256];
  snprintf(path, sizeof(path), "%s/limits.conf", f->dir);
  write_file(path, "max_inbound_per_ip = 2\nmax_inbound_per_net = 4\ntransport_memory = 32M\n"
                   "idle_timeout_s = 600\noverlay_source_rate = 50\noffer_table_size = 100000\n"
                   "gossip_peer_bytes = 512K\nmax_connections = 1000\ndial_reserve = 100\n");
  char *argv[] = {"gpunetd", "--config", path, "--max-inbound-per-ip", "3", "--send-stall-s", "5", NULL};
  gn_config c;
  char err[256] = "";
  int r = gn_config_load(&c, GN_ARRAY_SIZE(argv) - 1, argv, err, sizeof(err));
  if (r != 0)
    fail_msg("load: %s", err);
  assert_int_equal(c.limits.max_inbound_per_ip, 3); /* the flag */
  assert_int_equal(c.limits.max_inbound_per_net, 4);
  assert_int_equal(c.limits.transport_memory, 32u << 20);
  assert_int_equal(c.limits.idle_timeout_s, 600);
  assert_int_equal(c.limits.overlay_source_rate, 50);
  assert_int_equal(c.limits.offer_table_size, 100000);
  assert_int_equal(c.limits.gossip_peer_bytes, 512u << 10);
  assert_int_equal(c.limits.max_connections, 1000);
  assert_int_equal(c.limits.dial_reserve, 100);
  assert_int_equal(c.limits.send_stall_s, 5);
  assert_int_equal(c.limits.handshake_timeout_s, 10); /* untouched: the default */
  gn_config_done(&c);
}

/* A value out of range or not a number is refused, naming the key, the
 * range and the line; the load changes nothing. */
static void test_config_limits_out_of_range_table(void **state) {
  fixture *f = *state;
  static const struct {
    const char *line;
    const char *msg;
  } cases[] = {
      {"max_inbound_per_ip = 0", "out of range max_inbound_per_ip '0': want a whole number from 1 to 65536"},
      {"max_inbound_per_ip = 65537", "out of range max_inbound_per_ip '65537'"},
      {"max_inbound_per_ip = -1", "bad max_inbound_per_ip '-1': want a whole number from 1 to 65536"},
      {"max_inbound_per_ip = 2x", "bad max_inbound_per_ip '2x'"},
      {"max_inbound_per_ip =", "bad max_inbound_per_ip ''"},
      {"max_inbound_per_net = 0", "out of range max_inbound_per_net '0'"},
      {"max_connections = 15", "out of range max_connections '15': want a whole number from 16 to 65536"},
      {"dial_reserve = 65536", "out of range dial_reserve '65536'"},
      {"max_handshaking = 0", "out of range max_handshaking '0'"},
      {"transport_memory = 1M", "out of range transport_memory '1M': want a size (K, M, G or T) from 16M to 64G"},
      {"transport_memory = 65G", "out of range transport_memory '65G'"},
      {"transport_memory = lots", "bad transport_memory 'lots'"},
      {"handshake_timeout_s = 0", "out of range handshake_timeout_s '0': want a whole number from 1 to 600"},
      {"idle_timeout_s = 60", "out of range idle_timeout_s '60': want a whole number from 90 to 86400"},
      {"progress_timeout_s = 3601", "out of range progress_timeout_s '3601'"},
      {"send_stall_s = 4", "out of range send_stall_s '4'"},
      {"overlay_source_rate = 0", "out of range overlay_source_rate '0'"},
      {"overlay_rate = 1000001", "out of range overlay_rate '1000001'"},
      {"offer_table_size = 63", "out of range offer_table_size '63': want a whole number from 64 to 1048576"},
      {"offers_per_provider = 1025", "out of range offers_per_provider '1025'"},
      {"gossip_peer_digests = 0", "out of range gossip_peer_digests '0'"},
      {"gossip_peer_wants = 1001", "out of range gossip_peer_wants '1001'"},
      {"gossip_peer_bytes = 1K", "out of range gossip_peer_bytes '1K': want a size (K, M, G or T) from 64K to 1G"},
      {"gossip_peer_bytes = 99999999999999999999", "bad gossip_peer_bytes"},
      {"max_inbound_per_host = 3", "unknown key 'max_inbound_per_host'"},
  };
  char path[256];
  snprintf(path, sizeof(path), "%s/badlim.conf", f->dir);
  for (size_t i = 0; i < GN_ARRAY_SIZE(cases); i++) {
    char text[256];
    snprintf(text, sizeof(text), "max_handshaking = 7\n%s\n", cases[i].line);
    write_file(path, text);
    gn_config c;
    gn_config_defaults(&c);
    char err[512] = "";
    if (gn_config_load_file(&c, path, false, err, sizeof(err)) >= 0)
      fail_msg("'%s' was accepted", cases[i].line);
    if (!strstr(err, cases[i].msg) || !strstr(err, ":2: "))
      fail_msg("'%s': error '%s' lacks '%s' or the line number", cases[i].line, err, cases[i].msg);
    assert_int_equal(c.limits.max_handshaking, 128); /* the first line was not applied either */
    gn_config_done(&c);
  }
}

/* Limits that contradict each other are refused as a whole, and a flag
 * out of range names its flag. */
static void test_config_limits_cross_checks(void **state) {
  (void)state;
  static const struct {
    const char *args[4];
    const char *msg;
  } cases[] = {
      {{"--dial-reserve", "512"}, "dial_reserve (512) must be below max_connections (512)"},
      {{"--max-connections", "64", "--dial-reserve", "64"}, "dial_reserve (64) must be below max_connections (64)"},
      {{"--max-inbound-per-ip", "100"}, "max_inbound_per_net (64) is below max_inbound_per_ip (100)"},
      {{"--offer-table-size", "100", "--offers-per-provider", "200"},
       "offer_table_size (100) is below offers_per_provider (200)"},
      {{"--idle-timeout-s", "30"}, "--idle-timeout-s: out of range idle_timeout_s '30'"},
      {{"--overlay-rate"}, "option '--overlay-rate' needs a value"},
  };
  for (size_t i = 0; i < GN_ARRAY_SIZE(cases); i++) {
    char *argv[6] = {"gpunetd"};
    int argc = 1;
    for (int k = 0; k < 4 && cases[i].args[k]; k++)
      argv[argc++] = (char *)cases[i].args[k];
    gn_config c;
    char err[256] = "";
    if (gn_config_load(&c, argc, argv, err, sizeof(err)) != GN_EINVAL)
      fail_msg("case %zu (%s) was accepted", i, cases[i].args[0]);
    if (!strstr(err, cases[i].msg))
      fail_msg("case %zu: error '%s' lacks '%s'", i, err, cases[i].msg);
    gn_config_done(&c);
  }
}

/* GET /v1/status's "limits": every key with its value, and its range. */
static void test_config_limits_json_lists_every_key(void **state) {
  (void)state;
  gn_config c;
  gn_config_defaults(&c);
  c.limits.max_inbound_per_ip = 2;
  json_t *j = gn_config_limits_json(&c);
  assert_non_null(j);
  assert_int_equal(json_integer_value(json_object_get(j, "max_inbound_per_ip")), 2);
  assert_int_equal(json_integer_value(json_object_get(j, "transport_memory")), 256 << 20);
  assert_int_equal(json_integer_value(json_object_get(j, "gossip_peer_wants")), 12);
  const json_t *ranges = json_object_get(j, "ranges");
  assert_int_equal(json_object_size(ranges), 17);
  assert_int_equal(json_object_size(j), 18);
  const json_t *r = json_object_get(ranges, "idle_timeout_s");
  assert_int_equal(json_integer_value(json_array_get(r, 0)), 90);
  assert_int_equal(json_integer_value(json_array_get(r, 1)), 86400);
  json_decref(j);
  assert_non_null(strstr(gn_config_usage(), "--max-inbound-per-ip"));
  assert_non_null(strstr(gn_config_usage(), "--gossip-peer-bytes"));
  gn_config_done(&c);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_config_defaults, setup, teardown),
      cmocka_unit_test_setup_teardown(test_config_metrics_listen_bare_port_is_loopback, setup, teardown),
      cmocka_unit_test_setup_teardown(test_config_data_dir_falls_back_to_home, setup, teardown),
      cmocka_unit_test_setup_teardown(test_config_file_sets_every_key, setup, teardown),
      cmocka_unit_test_setup_teardown(test_config_unknown_key_names_the_line, setup, teardown),
      cmocka_unit_test_setup_teardown(test_config_bad_values_table, setup, teardown),
      cmocka_unit_test_setup_teardown(test_config_price_parse_table, setup, teardown),
      cmocka_unit_test_setup_teardown(test_config_missing_file, setup, teardown),
      cmocka_unit_test_setup_teardown(test_config_flags_override_file, setup, teardown),
      cmocka_unit_test_setup_teardown(test_config_xdg_file_used_when_data_dir_has_none, setup, teardown),
      cmocka_unit_test_setup_teardown(test_config_explicit_config_flag, setup, teardown),
      cmocka_unit_test_setup_teardown(test_config_flag_errors_table, setup, teardown),
      cmocka_unit_test_setup_teardown(test_config_parse_does_not_reorder_argv, setup, teardown),
      cmocka_unit_test_setup_teardown(test_config_budget_flags, setup, teardown),
      cmocka_unit_test_setup_teardown(test_config_registry_allow_is_bounded, setup, teardown),
      cmocka_unit_test_setup_teardown(test_config_limits_default_to_compiled_values, setup, teardown),
      cmocka_unit_test_setup_teardown(test_config_limits_from_file_and_flags, setup, teardown),
      cmocka_unit_test_setup_teardown(test_config_limits_out_of_range_table, setup, teardown),
      cmocka_unit_test_setup_teardown(test_config_limits_cross_checks, setup, teardown),
      cmocka_unit_test_setup_teardown(test_config_limits_json_lists_every_key, setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
