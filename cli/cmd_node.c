/* gpunet commands about this node: init and id (no daemon needed), status,
 * gpus, peers and attest. */
#include "cli.h"

#include <errno.h>
#include <getopt.h>
#include <gpunet/identity.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static int load_identity(cli *c, gn_identity **ret, char *path, size_t cap) {
  snprintf(path, cap, "%s/identity.key", c->data_dir);
  int r = gn_identity_load(path, ret);
  if (r == -ENOENT || r == GN_ENOTFOUND)
    return cli_fail("no node identity in %s: create one with gpunet --data-dir %s init", c->data_dir, c->data_dir);
  if (r == GN_EPERM)
    return cli_fail("%s is accessible by other users; refusing to use it (fix with: chmod 600 %s)", path, path);
  if (r < 0)
    return cli_fail("cannot load %s: %s", path, gn_strerror(r));
  return CLI_OK;
}

static const struct option init_longs[] = {
    {"force", no_argument, NULL, 'f'},          {"systemd", no_argument, NULL, 's'},
    {"unit-dir", required_argument, NULL, 'u'}, {"gpunetd", required_argument, NULL, 'g'},
    {"help", no_argument, NULL, 'h'},           {0}};
const cli_opts cli_init_opts = {":h", init_longs};

int cmd_init(cli *c, int argc, char **argv) {
  bool force = false, systemd = false;
  const char *unit_dir = NULL, *gpunetd = NULL;
  int o;
  optind = 0;
  opterr = 0;
  while ((o = getopt_long(argc, argv, cli_init_opts.shorts, cli_init_opts.longs, NULL)) != -1) {
    if (o == 'f')
      force = true;
    else if (o == 's')
      systemd = true;
    else if (o == 'u')
      unit_dir = optarg;
    else if (o == 'g')
      gpunetd = optarg;
    else if (o == 'h')
      return cli_print_usage(cli_find_cmd("init"));
    else
      return cli_bad_option("init", o, argv);
  }
  int r = cli_want_args(argc, argv, 0, "");
  if (r >= 0)
    return r;
  if ((unit_dir || gpunetd) && !systemd)
    return cli_usage_error("init", "--unit-dir and --gpunetd go with --systemd");
  if (systemd)
    return cli_init_systemd(c, unit_dir ? unit_dir : "/etc/systemd/system", gpunetd, force);
  r = cli_mkdirs(c->data_dir);
  if (r < 0)
    return cli_fail("cannot create %s: %s", c->data_dir, strerror(-r));
  char key_path[PATH_MAX + 32], conf_path[PATH_MAX + 32];
  snprintf(key_path, sizeof(key_path), "%s/identity.key", c->data_dir);
  snprintf(conf_path, sizeof(conf_path), "%s/gpunet.conf", c->data_dir);
  gn_identity *id = NULL;
  bool created = false, wrote = false;
  if (access(key_path, F_OK) == 0) {
    /* A node key is never replaced: peers and ledgers know this node by it. */
    if (!force)
      return cli_fail("%s already exists; refusing to overwrite a node key (gpunet id shows it; --force only "
                      "rewrites the config)",
                      key_path);
    if ((r = load_identity(c, &id, key_path, sizeof(key_path))) != CLI_OK)
      return r;
  } else {
    r = gn_identity_generate(&id);
    if (r == 0)
      r = gn_identity_save(id, key_path);
    if (r < 0) {
      gn_identity_free(id);
      return cli_fail("cannot create %s: %s", key_path, gn_strerror(r));
    }
    created = true;
  }
  if (force || access(conf_path, F_OK) != 0) {
    r = cli_write_default_config(conf_path);
    if (r < 0) {
      gn_identity_free(id);
      return cli_fail("cannot write %s: %s", conf_path, strerror(-r));
    }
    wrote = true;
  }
  char node_id[GN_NODE_ID_STRLEN];
  gn_node_id_format(id->pk, node_id);
  gn_identity_free(id);
  if (c->json) {
    return cli_print_json_new(json_pack("{s:s, s:s, s:s, s:s, s:b, s:b}", "node_id", node_id, "data_dir", c->data_dir,
                                        "identity", key_path, "config", conf_path, "created_identity", created,
                                        "wrote_config", wrote));
  }
  if (created)
    fprintf(stderr, "created node identity %s\n", key_path);
  if (wrote)
    fprintf(stderr, "wrote config %s\n", conf_path);
  else
    fprintf(stderr, "kept existing config %s\n", conf_path);
  printf("%s\n", node_id);
  return CLI_OK;
}

int cmd_id(cli *c, int argc, char **argv) {
  int r = cli_simple_args(argc, argv, 0, "");
  if (r >= 0)
    return r;
  char path[PATH_MAX + 32];
  gn_identity *id = NULL;
  if ((r = load_identity(c, &id, path, sizeof(path))) != CLI_OK)
    return r;
  char node_id[GN_NODE_ID_STRLEN];
  gn_node_id_format(id->pk, node_id);
  gn_identity_free(id);
  if (c->json) {
    cli_print_json_new(json_pack("{s:s}", "node_id", node_id));
  } else {
    printf("%s\n", node_id);
  }
  return CLI_OK;
}

/* A provider's training setting: whether ranks of gpunet train jobs run here,
 * their job network's UDP ports and how many run now. */
static void show_training(const json_t *tr) {
  if (!json_is_object(tr))
    return;
  const char *ports = json_string_value(json_object_get(tr, "jobnet_ports"));
  if (!json_is_true(json_object_get(tr, "enabled"))) {
    printf("%-10s off: this provider takes no ranks of training jobs\n", "training");
    return;
  }
  long long ranks = (long long)json_integer_value(json_object_get(tr, "ranks"));
  printf("%-10s on, job network UDP ports %s, %lld rank%s running\n", "training", ports ? ports : "?", ranks,
         ranks == 1 ? "" : "s");
}

/* Membership in one line: members by state and Lifeguard's local health
 * (0 is healthy), or why there is none. */
static void show_members(const json_t *j) {
  const char *overlay = json_string_value(json_object_get(j, "overlay"));
  const json_t *m = json_object_get(j, "members");
  if (!overlay)
    return;
  if (!json_is_object(m)) {
    printf("%-10s %s\n", "members", strcmp(overlay, "off") == 0 ? "off (overlay = off)" : overlay);
    return;
  }
  printf("%-10s %lld alive, %lld suspect, %lld dead, %lld left (health %lld)\n", "members",
         (long long)json_integer_value(json_object_get(m, "alive")),
         (long long)json_integer_value(json_object_get(m, "suspect")),
         (long long)json_integer_value(json_object_get(m, "dead")),
         (long long)json_integer_value(json_object_get(m, "left")),
         (long long)json_integer_value(json_object_get(j, "health")));
}

static void show_status(const json_t *j, const void *ctx) {
  (void)ctx;
  static const struct {
    const char *key, *label;
  } rows[] = {{"node_id", "node id"},   {"version", "version"}, {"listen", "listen"}, {"data_dir", "data dir"},
              {"provider", "provider"}, {"runtime", "runtime"}, {"peers", "peers"},   {"offers", "offers"},
              {"leases", "leases"},     {"jobs", "jobs"}};
  for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++) {
    const json_t *v = json_object_get(j, rows[i].key);
    char buf[64];
    const char *text = "-";
    if (json_is_string(v))
      text = json_string_value(v)[0] ? json_string_value(v) : "-";
    else if (json_is_boolean(v))
      text = json_is_true(v) ? "yes" : "no";
    else if (json_is_integer(v) && snprintf(buf, sizeof(buf), "%lld", (long long)json_integer_value(v)) > 0)
      text = buf;
    printf("%-10s %s\n", rows[i].label, text);
  }
  show_training(json_object_get(j, "training"));
  show_members(j);
  /* A provider's isolation in one line each: what a renter's job gets, and
   * how much of the provider's budgets its jobs hold now. */
  const json_t *iso = json_object_get(j, "isolation");
  if (!json_is_object(iso))
    return;
  bool userns = json_is_true(json_object_get(iso, "user_namespaces"));
  bool limits = json_is_true(json_object_get(iso, "limits_enforced"));
  const char *why = json_string_value(json_object_get(iso, "user_namespaces_why"));
  printf("%-10s %s, %s%s%s\n", "isolation", userns ? "user namespaces" : "NO USER NAMESPACES (jobs' root is host root)",
         limits ? "limits enforced" : "LIMITS NOT ENFORCED", !userns && why ? ": " : "", !userns && why ? why : "");
  printf("%-10s memory %lld/%lld MiB, pids %lld/%lld, cpu %.2f%s\n", "budgets",
         (long long)json_integer_value(json_object_get(iso, "memory_used_mib")),
         (long long)json_integer_value(json_object_get(iso, "memory_budget_mib")),
         (long long)json_integer_value(json_object_get(iso, "pids_used")),
         (long long)json_integer_value(json_object_get(iso, "pids_budget")),
         json_number_value(json_object_get(iso, "cpu_budget")),
         json_is_true(json_object_get(iso, "disk_low")) ? ", DISK BELOW RESERVE: new jobs refused" : "");
}

int cmd_status(cli *c, int argc, char **argv) {
  int r = cli_simple_args(argc, argv, 0, "");
  return r >= 0 ? r : cli_show(c, "GET", "/v1/status", NULL, show_status, NULL);
}

static void gpu_row(cli_table *t, const json_t *g, size_t i) {
  char idx[16], mem[32], util[16], leased[64];
  snprintf(idx, sizeof(idx), "%lld", (long long)cli_int(g, "index", (json_int_t)i));
  int64_t mib = cli_int(g, "memory_mib", 0);
  if (mib > 0)
    snprintf(mem, sizeof(mem), "%lld MiB", (long long)mib);
  else
    snprintf(mem, sizeof(mem), "?");
  if (cli_has_int(g, "utilization"))
    snprintf(util, sizeof(util), "%lld%%", (long long)cli_int(g, "utilization", 0));
  else
    snprintf(util, sizeof(util), "-");
  const char *lb = cli_str(g, "leased_by");
  if (lb)
    cli_fmt_node(lb, leased, sizeof(leased));
  else
    snprintf(leased, sizeof(leased), "-");
  const char *name = cli_str(g, "name");
  const char *row[] = {idx,
                       name && name[0] ? name : "?",
                       mem,
                       cli_bool(g, "simulated") ? "SIMULATED" : "real",
                       util,
                       leased,
                       cli_str(g, "attestation"),
                       cli_str(g, "uuid")};
  cli_table_row(t, row);
}

int cmd_gpus(cli *c, int argc, char **argv) {
  static const char *const hdr[] = {"#", "GPU", "MEMORY", "KIND", "UTIL", "LEASED BY", "ATTESTATION", "UUID"};
  static const cli_list_spec spec = {
      "gpus", "no GPUs (gpunetd found no NVIDIA GPU; for development start it with --simulate-gpu \"RTX 4090\")", 8,
      hdr, gpu_row};
  int r = cli_simple_args(argc, argv, 0, "");
  return r >= 0 ? r : cli_list(c, "/v1/gpus", &spec);
}

static void peer_row(cli_table *t, const json_t *p, size_t i) {
  (void)i;
  const char *row[] = {cli_str(p, "node_id"), cli_str(p, "addr")};
  cli_table_row(t, row);
}

int cmd_peers(cli *c, int argc, char **argv) {
  static const char *const hdr[] = {"NODE", "ADDRESS"};
  static const cli_list_spec spec = {
      "peers", "no peers (is a bootstrap peer configured? gpunetd --bootstrap HOST:PORT)", 2, hdr, peer_row};
  int r = cli_simple_args(argc, argv, 0, "");
  return r >= 0 ? r : cli_list(c, "/v1/peers", &spec);
}

static void show_fields(const json_t *j, const void *ctx) {
  (void)ctx;
  cli_print_fields(j);
}

int cmd_attest(cli *c, int argc, char **argv) {
  int r = cli_simple_args(argc, argv, 1, "OFFER or NODE to attest");
  if (r < 0)
    r = cli_check_id("attest", "offer or node", argv[optind]);
  if (r >= 0)
    return r;
  const char *target = argv[optind];
  fprintf(stderr, "challenging the GPU of %s\xe2\x80\xa6\n", target);
  char label[160];
  snprintf(label, sizeof label, "Attesting %s", target);
  return cli_show_waiting(c, "POST", "/v1/attest", json_pack("{s:s}", "target", target), show_fields, NULL, "attest",
                          label);
}
