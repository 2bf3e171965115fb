/* gpunet train: one training job over GPUs rented from several providers
 * (issue 8). Asks gpunetd for a plan and a gang lease (POST /v1/train),
 * prints the plan, the group forming, then the ranks' output with a rank
 * prefix, the running cost and the final total. The logs of a training job
 * (`gpunet logs TRAINID [--rank R]`) are followed here too. */
#include "train.h"
#include "progress.h"

#include <errno.h>
#include <getopt.h>
#include <gpunet/billing.h>
#include <math.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define TRAIN_MAX_GPUS 64
#define TRAIN_MAX_ENV 64
#define TRAIN_MAX_RESTARTS 100
#define TRAIN_POLL_US (300 * 1000)
#define TRAIN_SETTLE_WAIT_S 10 /* how long the end waits for the final invoices */
#define TRAIN_COST_EVERY_S 10  /* the running cost, at most this often */
/* The largest --max-price and --max-spend in micro-units: what gpunetd takes
 * (max_price up to INT64_MAX / 1024), and a group cap that stays far from
 * overflow when gpunetd splits it over the leases by their GPUs. */
#define TRAIN_MAX_PRICE_MICRO ((uint64_t)INT64_MAX / 1024)
#define TRAIN_MAX_SPEND_MICRO ((uint64_t)INT64_MAX / 1024)

/* A whole number in [lo, hi], nothing else. */
static bool parse_uint(const char *v, long lo, long hi, long *ret) {
  char *end;
  if (!v[0] || v[0] == '-' || v[0] == '+' || v[0] == ' ')
    return false;
  long n = strtol(v, &end, 10);
  if (*end || n < lo || n > hi)
    return false;
  *ret = n;
  return true;
}

json_t *cli_train_get(cli *c, const char *id) {
  char *path = cli_path("/v1/train", id, "");
  if (!path)
    return NULL;
  bool quiet = c->quiet;
  c->quiet = true;
  json_t *j = NULL, *t = NULL;
  if (cli_call(c, "GET", path, NULL, &j) == CLI_OK)
    t = json_incref(json_object_get(j, "train"));
  c->quiet = quiet;
  json_decref(j);
  free(path);
  return json_is_object(t) ? t : (json_decref(t), NULL);
}

static const char *str_or(const json_t *o, const char *key, const char *dflt) {
  const char *s = cli_str(o, key);
  return s ? s : dflt;
}

static void fmt_rtt(const json_t *v, char *buf, size_t cap) {
  if (json_is_integer(v))
    snprintf(buf, cap, "%lldms", (long long)json_integer_value(v));
  else
    snprintf(buf, cap, "?");
}

static void print_plan(FILE *out, const char *id, const json_t *plan) {
  const char *cur = str_or(plan, "currency", "");
  char total[48];
  cli_fmt_price((uint64_t)cli_int(plan, "total_uper_hour", 0), cur, total, sizeof total);
  long long nodes = cli_int(plan, "nodes", 0);
  fprintf(out, "training %s: %lld GPUs on %lld provider%s (%lld per node), %s in total\n", id,
          (long long)cli_int(plan, "gpus", 0), nodes, nodes == 1 ? "" : "s", (long long)cli_int(plan, "per_node", 0),
          total);
  static const char *const hdr[] = {"NODE", "PROVIDER", "OFFER", "ADDRESS", "GPUS", "PRICE", "RTT", "RANKS"};
  cli_table *t = cli_table_new(8, hdr);
  size_t i;
  const json_t *p;
  json_array_foreach(json_object_get(plan, "providers"), i, p) {
    char node[16], prov[64], gpus[16], price[48], rtt[24], ranks[32];
    long long g = cli_int(p, "gpus", 0), first = cli_int(p, "first_rank", 0);
    snprintf(node, sizeof node, "%lld", (long long)cli_int(p, "node", 0));
    cli_fmt_node(str_or(p, "provider", "?"), prov, sizeof prov);
    snprintf(gpus, sizeof gpus, "%lld", g);
    cli_fmt_price((uint64_t)cli_int(p, "price_uper_hour", 0), cur, price, sizeof price);
    fmt_rtt(json_object_get(p, "rtt_ms"), rtt, sizeof rtt);
    if (g > 1)
      snprintf(ranks, sizeof ranks, "%lld-%lld", first, first + g - 1);
    else
      snprintf(ranks, sizeof ranks, "%lld", first);
    const char *row[] = {node, prov, cli_str(p, "offer"), cli_str(p, "addr"), gpus, price, rtt, ranks};
    cli_table_row(t, row);
  }
  fflush(out);
  if (out == stdout)
    cli_table_print(t);
  else {
    fflush(stdout);
    cli_table_print(t); /* tables go to stdout */
  }
  if (nodes > 1) {
    char w[24];
    fmt_rtt(json_object_get(plan, "worst_rtt_ms"), w, sizeof w);
    fprintf(out, "worst pair RTT: %s (%s)\n", w, str_or(plan, "worst_kind", "?"));
    fprintf(out, "RTT matrix (ms; pairs not measured between the nodes are estimated as the sum\n"
                 "of both nodes' connect times from here, see --json rtt_kind; ? unknown):\n      ");
    for (long long k = 0; k < nodes; k++)
      fprintf(out, "%6lld", k);
    fputc('\n', out);
    const json_t *row;
    json_array_foreach(json_object_get(plan, "rtt_ms"), i, row) {
      fprintf(out, "%6zu", i);
      size_t k;
      const json_t *v;
      json_array_foreach(row, k, v) {
        if (json_is_integer(v))
          fprintf(out, "%6lld", (long long)json_integer_value(v));
        else
          fprintf(out, "%6s", "?");
      }
      fputc('\n', out);
    }
  }
  fflush(out);
}

/* --- following the ranks ----------------------------------------------------------*/

typedef struct rank_log {
  char job[32];
  long long offset;
  char partial[4096];
  size_t plen;
  bool done;
} rank_log;

typedef struct follow_state {
  rank_log r[TRAIN_MAX_GPUS];
  size_t n;
} follow_state;

static rank_log *rank_slot(follow_state *f, size_t rank, const char *job) {
  if (rank >= TRAIN_MAX_GPUS)
    return NULL;
  rank_log *l = &f->r[rank];
  if (strcmp(l->job, job) != 0) { /* a restart gave this rank a new job */
    if (l->plen)
      fprintf(stdout, "[rank %zu] %.*s\n", rank, (int)l->plen, l->partial);
    memset(l, 0, sizeof *l);
    snprintf(l->job, sizeof l->job, "%s", job);
  }
  if (rank + 1 > f->n)
    f->n = rank + 1;
  return l;
}

/* Writes data with the rank prefix at the start of every line. */
static void emit(rank_log *l, long rank, bool prefix, const char *data, size_t len, bool flush_partial) {
  for (size_t i = 0; i < len; i++) {
    if (data[i] == '\n' || l->plen == sizeof l->partial) {
      if (prefix)
        fprintf(stdout, "[rank %ld] ", rank);
      fwrite(l->partial, 1, l->plen, stdout);
      fputc('\n', stdout);
      l->plen = 0;
      if (data[i] == '\n')
        continue;
    }
    l->partial[l->plen++] = data[i];
  }
  if (flush_partial && l->plen) {
    if (prefix)
      fprintf(stdout, "[rank %ld] ", rank);
    fwrite(l->partial, 1, l->plen, stdout);
    fputc('\n', stdout);
    l->plen = 0;
  }
}

/* One round of every rank's new output: true when something came. */
static bool logs_round(cli *c, follow_state *f, const json_t *t, long only, bool final) {
  size_t i;
  const json_t *r;
  bool got = false;
  json_array_foreach(json_object_get(t, "ranks"), i, r) {
    long rank = (long)cli_int(r, "rank", (json_int_t)i);
    const char *job = cli_str(r, "job");
    if (!job || !job[0] || (only >= 0 && rank != only))
      continue;
    rank_log *l = rank_slot(f, (size_t)rank, job);
    if (!l)
      continue;
    for (int guard = 0; guard < 64; guard++) { /* at most 2 MiB per rank and round */
      char *base = cli_path("/v1/jobs", job, "/logs");
      char path[1024];
      snprintf(path, sizeof path, "%s?offset=%lld&wait_ms=0", base ? base : "", l->offset);
      free(base);
      json_t *j = NULL;
      bool quiet = c->quiet;
      c->quiet = true;
      int rc = cli_call(c, "GET", path, NULL, &j);
      c->quiet = quiet;
      if (rc != CLI_OK)
        break;
      const char *data = cli_str(j, "data");
      size_t len = data ? json_string_length(json_object_get(j, "data")) : 0;
      long long next = cli_int(j, "offset", l->offset);
      l->done = cli_bool(j, "done");
      if (len)
        emit(l, rank, only < 0, data, len, false);
      json_decref(j);
      bool more = next > l->offset;
      if (next > l->offset)
        l->offset = next;
      got |= more;
      if (!more)
        break;
    }
    if (final || l->done)
      emit(l, rank, only < 0, "", 0, true);
  }
  fflush(stdout);
  return got;
}

static bool state_final(const char *s) {
  return s && (strcmp(s, "failed") == 0 || strcmp(s, "ended") == 0 || strcmp(s, "done") == 0);
}

/* What went wrong, per member and rank, on stderr. */
static void print_reasons(const json_t *t) {
  size_t i;
  const json_t *m;
  fprintf(stderr, "gpunet: training %s %s: %s\n", str_or(t, "id", "?"), str_or(t, "state", "?"),
          str_or(t, "reason", ""));
  json_array_foreach(json_object_get(t, "members"), i, m) {
    char prov[64];
    cli_fmt_node(str_or(m, "provider", "?"), prov, sizeof prov);
    const char *why = str_or(m, "reason", ""), *ms = str_or(m, "state", "?");
    bool same = strncmp(why, ms, strlen(ms)) == 0; /* "refused: ..." says its state itself */
    fprintf(stderr, "  member %lld (%s, lease %s): %s%s%s\n", (long long)cli_int(m, "member", (json_int_t)i), prov,
            str_or(m, "lease", "?"), same ? "" : ms, !same && why[0] ? ": " : "", why);
  }
  json_array_foreach(json_object_get(t, "ranks"), i, m) {
    const char *st = cli_str(m, "state");
    if (st && (strcmp(st, "failed") == 0 || strcmp(st, "rejected") == 0 ||
               (strcmp(st, "exited") == 0 && cli_int(m, "exit_code", 0) != 0)))
      fprintf(stderr, "  rank %lld (job %s): %s%s%s\n", (long long)cli_int(m, "rank", (json_int_t)i),
              str_or(m, "job", "?"), st, cli_str(m, "error") ? ": " : "", str_or(m, "error", ""));
  }
}

/* Copies every rank's /output (a tar stream per rank, made by its provider)
 * to DIR/rank-R.tar while the group holds its leases ("collecting"). */
static int collect_outputs(cli *c, const char *id, const json_t *t, const char *dir, long only, FILE *msg) {
  size_t nr = json_array_size(json_object_get(t, "ranks"));
  char *base = cli_path("/v1/train", id, "/output");
  size_t cap = 48 * 1024;
  uint8_t *bin = malloc(cap);
  int rc = CLI_OK;
  if (!base || !bin) {
    free(base);
    free(bin);
    return cli_fail("out of memory");
  }
  for (size_t r = 0; r < nr && r < TRAIN_MAX_GPUS; r++) {
    if (only >= 0 && (size_t)only != r)
      continue;
    char path[PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/rank-%zu.tar", dir, r);
    FILE *f = fopen(path, "wb");
    if (!f) {
      rc = cli_fail("cannot write %s", path);
      continue;
    }
    long long off = 0;
    bool eof = false;
    for (int guard = 0; !eof && guard < 1 << 20; guard++) {
      char url[1024];
      snprintf(url, sizeof url, "%s?rank=%zu&offset=%lld", base, r, off);
      json_t *j = NULL;
      if (cli_call(c, "GET", url, NULL, &j) != CLI_OK) {
        rc = CLI_FAIL;
        break;
      }
      const char *b64 = cli_str(j, "data");
      size_t got = 0;
      if (b64 && sodium_base642bin(bin, cap, b64, strlen(b64), NULL, &got, NULL, sodium_base64_VARIANT_ORIGINAL) < 0) {
        json_decref(j);
        rc = cli_fail("rank %zu's output is not base64", r);
        break;
      }
      eof = cli_bool(j, "eof");
      json_decref(j);
      if (got && fwrite(bin, 1, got, f) != got) {
        rc = cli_fail("cannot write %s", path);
        break;
      }
      off += (long long)got;
      if (!got && !eof) {
        rc = cli_fail("rank %zu's provider sent an empty chunk before the end", r);
        break;
      }
    }
    if (fclose(f) != 0 && rc == CLI_OK)
      rc = cli_fail("cannot write %s", path);
    if (eof)
      fprintf(msg, "training %s: rank %zu's /output -> %s (%lld bytes)\n", id, r, path, off);
    fflush(msg);
  }
  free(base);
  free(bin);
  return rc;
}

/* The gang of leases being formed (planning, forming, attesting,
 * restarting): members agreed of members asked, on stderr (cli/progress),
 * ended when the group runs or ends. */
static cli_progress *gang_progress(const cli *c, cli_progress *p, const char *st, const json_t *t) {
  bool forming = strcmp(st, "planning") == 0 || strcmp(st, "forming") == 0 || strcmp(st, "attesting") == 0 ||
                 strcmp(st, "restarting") == 0;
  if (!forming) {
    cli_progress_end(p, strcmp(st, "running") == 0 || strcmp(st, "collecting") == 0 || strcmp(st, "done") == 0, st);
    return NULL;
  }
  size_t i, agreed = 0;
  const json_t *m, *members = json_object_get(t, "members");
  json_array_foreach(members, i, m) agreed += strcmp(str_or(m, "state", ""), "agreed") == 0;
  if (!p)
    p = cli_progress_start(cli_progress_mode_for(c->json), "gang", "Leasing the training group", CLI_PROGRESS_ITEMS,
                           json_array_size(members), NULL, NULL);
  char detail[64];
  snprintf(detail, sizeof detail, "%s: %zu of %zu leases agreed", st, agreed, json_array_size(members));
  cli_progress_update(p, agreed, json_array_size(members), detail);
  return p;
}

/* Follows training id: progress (members agreeing, state) on `msg`, the
 * ranks' output on stdout when logs, the running cost, and the total. */
static int follow_train(cli *c, const char *id, long only, bool logs, bool progress, bool follow, const char *outdir,
                        cli_progress *gang, json_t **ret_last) {
  bool collected = false;
  int fin_rounds = 0; /* log rounds since the group ended: output sent just before the end still comes */
  int collect_rc = CLI_OK;
  follow_state *f = calloc(1, sizeof *f);
  if (!f)
    return cli_fail("out of memory");
  FILE *msg = c->json ? stderr : stdout;
  char state[32] = "", mstates[TRAIN_MAX_GPUS][24];
  memset(mstates, 0, sizeof mstates);
  long long cost = -1, seen_restarts = 0;
  uint64_t cost_at = 0, settle_until = 0;
  int rc = CLI_FAIL;
  json_t *t = NULL;
  /* gang: while the group's leases are formed (from before the plan) */
  for (;;) {
    json_decref(t);
    t = cli_train_get(c, id);
    if (!t) {
      rc = cli_fail("training job %s is gone from gpunetd", id);
      break;
    }
    const char *st = str_or(t, "state", "?");
    cli_progress_clear(gang); /* member lines may follow on the same terminal */
    if (progress) {
      size_t i;
      const json_t *m;
      json_array_foreach(json_object_get(t, "members"), i, m) {
        const char *ms = str_or(m, "state", "?");
        if (i < TRAIN_MAX_GPUS && strcmp(mstates[i], ms) != 0) {
          char prov[64];
          cli_fmt_node(str_or(m, "provider", "?"), prov, sizeof prov);
          const char *why = cli_str(m, "reason");
          if (!why || strcmp(ms, "agreed") == 0 || strncmp(why, ms, strlen(ms)) == 0)
            why = strncmp(why ? why : "", ms, strlen(ms)) == 0 && strcmp(ms, "agreed") != 0 ? why : "";
          if (why[0])
            fprintf(msg, "member %zu (%s, lease %s): %s%s%s\n", i, prov, str_or(m, "lease", "?"),
                    strncmp(why, ms, strlen(ms)) == 0 ? "" : ms, strncmp(why, ms, strlen(ms)) == 0 ? "" : ": ", why);
          else
            fprintf(msg, "member %zu (%s, lease %s): %s\n", i, prov, str_or(m, "lease", "?"), ms);
          snprintf(mstates[i], sizeof mstates[i], "%s", ms);
        }
      }
      long long restarted = cli_int(t, "restarted", 0);
      if (restarted > seen_restarts && strcmp(st, "restarting") != 0 && strcmp(state, "restarting") != 0)
        fprintf(msg, "training %s: restarting (restart %lld)\n", id, restarted);
      if (restarted > seen_restarts)
        seen_restarts = restarted;
      if (strcmp(st, state) != 0) {
        if (strcmp(st, "running") == 0)
          fprintf(msg, "training %s: running %zu ranks\n", id, json_array_size(json_object_get(t, "ranks")));
        else
          fprintf(msg, "training %s: %s\n", id, st);
      }
      fflush(msg);
      gang = gang_progress(c, gang, st, t);
    }
    snprintf(state, sizeof state, "%s", st);
    bool fin = state_final(st);
    if (progress && outdir && !collected && strcmp(st, "collecting") == 0) {
      if (logs)
        logs_round(c, f, t, only, true);
      collect_rc = collect_outputs(c, id, t, outdir, -1, msg);
      collected = true;
      char *dp = cli_path("/v1/train", id, "");
      json_t *dj = NULL;
      if (dp && cli_call(c, "DELETE", dp, NULL, &dj) == CLI_OK)
        fprintf(msg, "training %s: outputs copied; leases released\n", id);
      json_decref(dj);
      free(dp);
      usleep(TRAIN_POLL_US);
      continue;
    }
    if (logs)
      logs_round(c, f, t, only, fin || !follow);
    long long now_cost = cli_int(t, "cost_micro", 0);
    if (progress && now_cost != cost && (cli_mono_ms() - cost_at >= TRAIN_COST_EVERY_S * 1000u || fin) &&
        now_cost > 0) {
      char m[48];
      cli_fmt_money((uint64_t)now_cost, str_or(t, "currency", ""), m, sizeof m);
      fprintf(msg, "training %s: cost so far %s\n", id, m);
      fflush(msg);
      cost = now_cost;
      cost_at = cli_mono_ms();
    }
    if (!follow && !fin && !(progress && strcmp(st, "running") == 0)) {
      if (!progress) { /* a snapshot of the logs */
        rc = CLI_OK;
        break;
      }
    } else if (!follow && !fin) {
      rc = CLI_OK; /* train without -f: the group runs */
      break;
    }
    if (fin) {
      if (!settle_until)
        settle_until = cli_mono_ms() + TRAIN_SETTLE_WAIT_S * 1000u;
      fin_rounds++;
      if ((cli_has_int(t, "total_micro") && (fin_rounds >= 3 || !logs)) || cli_mono_ms() >= settle_until ||
          (!progress && (fin_rounds >= 3 || !follow))) {
        if (progress) {
          char m[48];
          long long tot = cli_has_int(t, "total_micro") ? cli_int(t, "total_micro", 0) : cli_int(t, "cost_micro", 0);
          cli_fmt_money((uint64_t)tot, str_or(t, "currency", ""), m, sizeof m);
          fprintf(msg, "training %s: total %s%s\n", id, m,
                  cli_has_int(t, "total_micro") ? "" : " (final invoices not all in yet)");
        }
        rc = (strcmp(st, "done") == 0 && collect_rc == CLI_OK) || (!follow && !progress) ? CLI_OK : CLI_FAIL;
        if (rc != CLI_OK && progress)
          print_reasons(t);
        else if (rc != CLI_OK)
          fprintf(stderr, "gpunet: training %s %s: %s\n", id, st, str_or(t, "reason", ""));
        break;
      }
    }
    usleep(TRAIN_POLL_US);
  }
  cli_progress_end(gang, false, NULL); /* only when the follow ends while forming */
  free(f);
  if (ret_last)
    *ret_last = t;
  else
    json_decref(t);
  return rc;
}

int cli_train_logs(cli *c, const char *id, long rank, bool follow) {
  return follow_train(c, id, rank, true, false, follow, NULL, NULL, NULL);
}

/* --- the command ----------------------------------------------------------------------*/

static int too_large(const char *opt, const char *v, uint64_t max_micro) {
  return cli_usage_error("train", "%s '%s' is too large (at most %llu.%06llu)", opt, v,
                         (unsigned long long)(max_micro / 1000000u), (unsigned long long)(max_micro % 1000000u));
}

static const struct option train_longs[] = {{"gpus", required_argument, NULL, 'g'},
                                            {"per-node", required_argument, NULL, 'k'},
                                            {"image", required_argument, NULL, 'i'},
                                            {"max-price", required_argument, NULL, 'P'},
                                            {"max-spend", required_argument, NULL, 'M'},
                                            {"memory", required_argument, NULL, 'm'},
                                            {"no-attest", no_argument, NULL, 'A'},
                                            {"hours", required_argument, NULL, 'H'},
                                            {"output", required_argument, NULL, 'o'},
                                            {"env", required_argument, NULL, 'e'},
                                            {"restarts", required_argument, NULL, 'r'},
                                            {"allow-simulated", no_argument, NULL, 'S'},
                                            {"follow", no_argument, NULL, 'f'},
                                            {"help", no_argument, NULL, 'h'},
                                            {0}};
const cli_opts cli_train_opts = {":hfe:", train_longs};

int cmd_train(cli *c, int argc, char **argv) {
  int dd = argc;
  for (int i = 1; i < argc; i++)
    if (strcmp(argv[i], "--") == 0) {
      dd = i;
      break;
    }
  long gpus = 0, per_node = 0, restarts = 0;
  const char *image = NULL, *output = NULL, *hours_s = NULL;
  uint64_t max_price = 0, max_spend = 0, memory_mib = 0; /* 0: not given, gpunetd's default */
  bool allow_sim = false, follow = false, attest = true;
  json_t *env = json_array(), *cmd = json_array(), *body = NULL;
  int rc = CLI_FAIL, o;
  if (!env || !cmd) {
    rc = cli_fail("out of memory");
    goto out;
  }
  optind = 0;
  opterr = 0;
  while ((o = getopt_long(dd, argv, cli_train_opts.shorts, cli_train_opts.longs, NULL)) != -1) {
    switch (o) {
    case 'g':
      if (!parse_uint(optarg, 1, TRAIN_MAX_GPUS, &gpus)) {
        rc = cli_usage_error("train", "--gpus wants a number of GPUs from 1 to %d, not '%s'", TRAIN_MAX_GPUS, optarg);
        goto out;
      }
      break;
    case 'k':
      if (!parse_uint(optarg, 1, GN_LEASE_MAX_GPUS, &per_node)) {
        rc = cli_usage_error("train", "--per-node wants a number of GPUs from 1 to %d, not '%s'", GN_LEASE_MAX_GPUS,
                             optarg);
        goto out;
      }
      break;
    case 'i':
      image = optarg;
      break;
    case 'P':
      if (gn_price_parse(optarg, &max_price) == 0 && max_price > TRAIN_MAX_PRICE_MICRO) {
        rc = too_large("--max-price", optarg, TRAIN_MAX_PRICE_MICRO);
        goto out;
      }
      if (gn_price_parse(optarg, &max_price) < 0 || max_price == 0) {
        rc = cli_usage_error("train",
                             "--max-price wants the most to pay per GPU-hour, like 0.50 (at most 6 decimals), not "
                             "'%s'",
                             optarg);
        goto out;
      }
      break;
    case 'M':
      if (gn_price_parse(optarg, &max_spend) == 0 && max_spend > TRAIN_MAX_SPEND_MICRO) {
        rc = too_large("--max-spend", optarg, TRAIN_MAX_SPEND_MICRO);
        goto out;
      }
      if (gn_price_parse(optarg, &max_spend) < 0 || max_spend == 0) {
        rc = cli_usage_error("train",
                             "--max-spend wants the most to pay for the whole group, like 20.00 (at most 6 "
                             "decimals), not '%s'",
                             optarg);
        goto out;
      }
      break;
    case 'm':
      if (!cli_parse_memory_mib(optarg, &memory_mib)) {
        rc = cli_usage_error("train", "--memory '%s' is not a size such as 512M or 4G (whole MiB)", optarg);
        goto out;
      }
      if (memory_mib < CLI_MEMORY_MIB_MIN || memory_mib > CLI_MEMORY_MIB_MAX) {
        rc = cli_usage_error("train", "--memory '%s' is outside %uM..%uG", optarg, CLI_MEMORY_MIB_MIN,
                             CLI_MEMORY_MIB_MAX >> 10);
        goto out;
      }
      break;
    case 'A':
      attest = false;
      break;
    case 'H':
      hours_s = optarg;
      break;
    case 'o':
      output = optarg;
      break;
    case 'e':
      if (cli_check_env("train", optarg) >= 0) {
        rc = CLI_USAGE;
        goto out;
      }
      if (json_array_size(env) == TRAIN_MAX_ENV) {
        rc = cli_usage_error("train", "more than %d --env variables", TRAIN_MAX_ENV);
        goto out;
      }
      if (json_array_append_new(env, json_string(optarg)) < 0) {
        rc = cli_usage_error("train", "--env '%s' is not valid UTF-8", optarg);
        goto out;
      }
      break;
    case 'r':
      if (!parse_uint(optarg, 0, TRAIN_MAX_RESTARTS, &restarts)) {
        rc = cli_usage_error("train", "--restarts wants a number from 0 to %d, not '%s'", TRAIN_MAX_RESTARTS, optarg);
        goto out;
      }
      break;
    case 'S':
      allow_sim = true;
      break;
    case 'f':
      follow = true;
      break;
    case 'h':
      rc = cli_print_usage(cli_find_cmd("train"));
      goto out;
    default:
      rc = cli_bad_option("train", o, argv);
      goto out;
    }
  }
  if (optind < dd) {
    rc = cli_usage_error("train", "unexpected argument '%s' (the command goes after --)", argv[optind]);
    goto out;
  }
  if (!gpus) {
    rc = cli_usage_error("train", "missing --gpus N");
    goto out;
  }
  if (per_node && gpus % per_node) {
    rc = cli_usage_error("train", "--per-node %ld does not divide --gpus %ld", per_node, gpus);
    goto out;
  }
  if (!image || !image[0]) {
    rc = cli_usage_error("train", "missing --image REF");
    goto out;
  }
  double hours = 1.0;
  if (hours_s) {
    char *end;
    hours = strtod(hours_s, &end);
    if (*end || end == hours_s || !(hours > 0) || hours > GN_INVOICE_MAX_S / 3600.0) {
      rc = cli_usage_error("train", "--hours wants a positive number of hours (at most %u), not '%s'",
                           GN_INVOICE_MAX_S / 3600u, hours_s);
      goto out;
    }
  }
  for (int i = dd + 1; i < argc; i++)
    if (json_array_append_new(cmd, json_string(argv[i])) < 0) {
      rc = cli_usage_error("train", "argument '%s' is not valid UTF-8", argv[i]);
      goto out;
    }
  if (!json_array_size(cmd)) {
    rc = cli_usage_error("train", "missing the command to run on every rank (after --)");
    goto out;
  }
  if (json_array_size(cmd) > 64) {
    rc = cli_usage_error("train", "at most 64 command arguments");
    goto out;
  }
  if (output) {
    struct stat sb;
    if (!output[0] || (stat(output, &sb) == 0 && !S_ISDIR(sb.st_mode))) {
      rc = cli_usage_error("train", "--output '%s' is not a directory", output);
      goto out;
    }
    if (cli_mkdirs(output) < 0) {
      rc = cli_fail("cannot create --output directory %s", output);
      goto out;
    }
  }
  json_t *jh = hours == floor(hours) ? json_integer((json_int_t)hours) : json_real(hours);
  /* "attest" like rent's body: gpunetd ignores a key it does not know. */
  body = json_pack("{s:I, s:I, s:s, s:o, s:O, s:O, s:b, s:I, s:b, s:b}", "gpus", (json_int_t)gpus, "per_node",
                   (json_int_t)per_node, "image", image, "hours", jh, "env", env, "argv", cmd, "output", output != NULL,
                   "restarts", (json_int_t)restarts, "allow_simulated", allow_sim, "attest", attest);
  if (body && ((max_price && json_object_set_new(body, "max_price", json_integer((json_int_t)max_price)) < 0) ||
               (max_spend && json_object_set_new(body, "max_spend", json_integer((json_int_t)max_spend)) < 0) ||
               (memory_mib && json_object_set_new(body, "memory_mib", json_integer((json_int_t)memory_mib)) < 0))) {
    json_decref(body);
    body = NULL;
  }
  if (!body) {
    rc = cli_fail("out of memory (or an argument is not valid UTF-8)");
    goto out;
  }
  json_t *j;
  /* One wait from the plan (round trips measured) to the group running. */
  cli_progress *gang = cli_progress_start(cli_progress_mode_for(c->json), "gang", "Leasing the training group",
                                          CLI_PROGRESS_ITEMS, 0, NULL, NULL);
  cli_progress_update(gang, 0, 0, "planning: measuring round trips");
  rc = cli_call_waiting(c, "POST", "/v1/train", body, &j, gang);
  body = NULL;
  if (rc != CLI_OK) {
    cli_progress_end(gang, false, NULL);
    goto out;
  }
  cli_progress_clear(gang); /* the plan is printed next */
  const char *id0 = cli_str(j, "id");
  char id[64];
  snprintf(id, sizeof id, "%s", id0 ? id0 : "");
  if (!id[0]) {
    json_decref(j);
    cli_progress_end(gang, false, NULL);
    rc = cli_fail("gpunetd did not name the training job");
    goto out;
  }
  if (c->json) {
    json_dumpf(j, stdout, JSON_COMPACT);
    fputc('\n', stdout);
    fflush(stdout);
  } else {
    print_plan(stdout, id, json_object_get(j, "plan"));
  }
  json_decref(j);
  json_t *last = NULL;
  /* With --output the command stays to the end: the outputs are copied
   * before the leases go. */
  rc = follow_train(c, id, -1, follow, true, follow || output, output, gang, &last);
  if (c->json && last) {
    json_dumpf(last, stdout, JSON_COMPACT);
    fputc('\n', stdout);
  }
  json_decref(last);
out:
  json_decref(body);
  json_decref(env);
  json_decref(cmd);
  return rc;
}

/* --- gpunet output: a training job's /output on request ------------------------------*/

static const struct option output_longs[] = {
    {"rank", required_argument, NULL, 'r'}, {"help", no_argument, NULL, 'h'}, {0}};
const cli_opts cli_output_opts = {":h", output_longs};

int cmd_output(cli *c, int argc, char **argv) {
  long rank = -1;
  int o;
  optind = 0;
  opterr = 0;
  while ((o = getopt_long(argc, argv, cli_output_opts.shorts, cli_output_opts.longs, NULL)) != -1) {
    if (o == 'r') {
      char *end;
      errno = 0;
      long v = strtol(optarg, &end, 10);
      if (!optarg[0] || *end || errno || v < 0 || v >= TRAIN_MAX_GPUS)
        return cli_usage_error("output", "--rank wants a rank number from 0 to %d, not '%s'", TRAIN_MAX_GPUS - 1,
                               optarg);
      rank = v;
    } else if (o == 'h')
      return cli_print_usage(cli_find_cmd("output"));
    else
      return cli_bad_option("output", o, argv);
  }
  int r = cli_want_args(argc, argv, 2, "TRAINID DIR");
  if (r < 0)
    r = cli_check_id("output", "training job", argv[optind]);
  if (r >= 0)
    return r;
  const char *id = argv[optind], *dir = argv[optind + 1];
  struct stat sb;
  if (!dir[0] || (stat(dir, &sb) == 0 && !S_ISDIR(sb.st_mode)))
    return cli_usage_error("output", "'%s' is not a directory", dir);
  json_t *t = cli_train_get(c, id);
  if (!t)
    return cli_fail("no training job %s on this node (gpunet jobs lists them)", id);
  long world = (long)json_array_size(json_object_get(t, "ranks"));
  if (!world) {
    r = cli_fail("training job %s has no ranks yet (state %s)", id, str_or(t, "state", "?"));
    json_decref(t);
    return r;
  }
  if (rank >= world) {
    json_decref(t);
    return cli_usage_error("output", "training job %s has ranks 0 to %ld, not %ld", id, world - 1, rank);
  }
  if (cli_mkdirs(dir) < 0) {
    json_decref(t);
    return cli_fail("cannot create directory %s", dir);
  }
  /* With --json the lines go to stderr and stdout gets one object. */
  r = collect_outputs(c, id, t, dir, rank, c->json ? stderr : stdout);
  json_decref(t);
  if (c->json) {
    json_t *files = json_array();
    for (long k = 0; k < world; k++) {
      if (rank >= 0 && k != rank)
        continue;
      char path[PATH_MAX + 32];
      snprintf(path, sizeof path, "%s/rank-%ld.tar", dir, k);
      if (stat(path, &sb) == 0)
        json_array_append_new(
            files, json_pack("{s:I, s:s, s:I}", "rank", (json_int_t)k, "path", path, "bytes", (json_int_t)sb.st_size));
    }
    json_t *out = json_pack("{s:s, s:b, s:o}", "train", id, "ok", r == CLI_OK, "files", files);
    cli_print_json(out);
    json_decref(out);
  }
  return r;
}
