/* gpunet commands for jobs on leased GPUs: run, jobs, logs and stop. */
#include "cli.h"
#include "progress.h"
#include "train.h"

#include <getopt.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#define CLI_MAX_ENV 256
/* What gpunetd accepts for a job's limits (it refuses anything else too);
 * checked here as well so a typo is a usage error before any request. */
#define CLI_PIDS_MIN 8u
#define CLI_PIDS_MAX 4096u

bool cli_parse_memory_mib(const char *v, uint64_t *ret) {
  uint64_t n = 0;
  const char *p = v;
  for (; *p >= '0' && *p <= '9'; p++)
    n = n > UINT32_MAX ? n : n * 10 + (uint64_t)(*p - '0');
  if (p == v)
    return false;
  unsigned shift = 20;
  switch (*p) {
  case 'k':
  case 'K':
    shift = 10;
    break;
  case 'm':
  case 'M':
    shift = 20;
    break;
  case 'g':
  case 'G':
    shift = 30;
    break;
  case 't':
  case 'T':
    shift = 40;
    break;
  case '\0':
    break;
  default:
    return false;
  }
  if (*p) {
    p++;
    if (strcasecmp(p, "iB") == 0 || strcasecmp(p, "B") == 0)
      p += strlen(p);
  }
  if (*p)
    return false;
  /* n is at most about 2^34 and the shift at most 20: no overflow. */
  if (shift < 20 && n % (1u << (20 - shift)))
    return false;
  *ret = shift < 20 ? n >> (20 - shift) : n << (shift - 20);
  return true;
}

/* A whole decimal number for --pids, without sign or spaces. */
static bool parse_count(const char *v, uint64_t *ret) {
  uint64_t n = 0;
  const char *p = v;
  for (; *p >= '0' && *p <= '9'; p++) {
    if (n > UINT32_MAX)
      return false;
    n = n * 10 + (uint64_t)(*p - '0');
  }
  if (p == v || *p)
    return false;
  *ret = n;
  return true;
}

/* Exit like the job did: 0..255 as is, a signal (negative) as a shell would
 * report it, anything else as a plain failure. */
static int exit_code_of(long long code) {
  if (code >= 0 && code <= 255)
    return (int)code;
  if (code < 0 && code >= -127)
    return 128 + (int)-code;
  return CLI_FAIL;
}

/* A job that ended without an exit code (its image did not pull, it was
 * stopped...): say why, from the job list, and fail. */
static int job_outcome(cli *c, const char *job_id) {
  json_t *j;
  if (cli_call(c, "GET", "/v1/jobs", NULL, &j) != CLI_OK)
    return CLI_FAIL;
  size_t i;
  const json_t *job;
  int rc = CLI_FAIL;
  bool found = false;
  json_array_foreach(json_object_get(j, "jobs"), i, job) {
    if (!cli_str(job, "id") || strcmp(cli_str(job, "id"), job_id) != 0)
      continue;
    found = true;
    const char *state = cli_str(job, "state");
    const char *err = cli_str(job, "error");
    if (state && strcmp(state, "exited") == 0 && !err)
      rc = CLI_OK;
    else
      cli_fail("job %s %s%s%s", job_id, state ? state : "ended", err ? ": " : "", err ? err : "");
  }
  if (!found)
    cli_fail("job %s ended without an exit code", job_id);
  json_decref(j);
  return rc;
}

/* How long one logs request may wait for news. gpunetd answers as soon as
 * output arrives or the job changes state (a long poll), so a short wait
 * would only add requests, not speed. */
#define CLI_LOGS_WAIT_MS 30000
/* An answer sooner than this, with nothing new, means the daemon did not
 * hold the request (an older gpunetd): then ask again only after a pause. */
#define CLI_LOGS_EARLY_MS 50
#define CLI_LOGS_PAUSE_US (200 * 1000)

/* The image pull's progress while the job is "pending" or "pulling" (bytes
 * once the provider knows the image's size); ended when the job moves on. */
static cli_progress *pull_progress(const cli *c, cli_progress *p, const char *state, const json_t *pull) {
  bool waiting = strcmp(state, "pending") == 0 || strcmp(state, "pulling") == 0;
  if (!waiting) {
    cli_progress_end(p, strcmp(state, "failed") != 0 && strcmp(state, "rejected") != 0, NULL);
    return NULL;
  }
  uint64_t total = (uint64_t)cli_int(pull, "total", 0), done = (uint64_t)cli_int(pull, "done", 0);
  if (!p)
    p = cli_progress_start(cli_progress_mode_for(c->json), "pull", "Pulling image", CLI_PROGRESS_BYTES, total, NULL,
                           NULL);
  cli_progress_update(p, done, total, total ? NULL : "waiting for the provider");
  return p;
}

int cli_follow_logs(cli *c, const char *job_id, bool follow) {
  char *base = cli_path("/v1/jobs", job_id, "/logs");
  if (!base)
    return cli_fail("out of memory");
  long long offset = 0;
  char state[32] = "";
  int rc = CLI_OK;
  cli_progress *pull = NULL; /* while the provider pulls the image */
  for (;;) {
    char path[1024];
    snprintf(path, sizeof(path), "%s?offset=%lld&wait_ms=%d", base, offset, follow ? CLI_LOGS_WAIT_MS : 0);
    json_t *j;
    uint64_t asked_ms = cli_mono_ms();
    if ((rc = cli_call(c, "GET", path, NULL, &j)) != CLI_OK)
      break;
    const char *data = cli_str(j, "data");
    size_t len = data ? json_string_length(json_object_get(j, "data")) : 0;
    if (c->json) {
      json_dumpf(j, stdout, JSON_COMPACT);
      fputc('\n', stdout);
    } else if (len) {
      fwrite(data, 1, len, stdout);
    }
    fflush(stdout);
    long long next = cli_int(j, "offset", offset);
    bool done = cli_bool(j, "done");
    bool have_code = cli_has_int(j, "exit_code");
    long long code = cli_int(j, "exit_code", 0);
    const char *st = cli_str(j, "state");
    bool state_changed = st && strcmp(st, state) != 0;
    if (st)
      snprintf(state, sizeof(state), "%s", st);
    if (follow)
      pull = pull_progress(c, pull, state, json_object_get(j, "pull"));
    json_decref(j);
    if (next < offset) {
      rc = cli_fail("gpunetd moved the log offset of %s backwards (%lld after %lld)", job_id, next, offset);
      break;
    }
    bool progressed = next > offset || state_changed;
    offset = next;
    if (!follow)
      break;
    if (done) {
      rc = have_code ? exit_code_of(code) : job_outcome(c, job_id);
      break;
    }
    if (!progressed && cli_mono_ms() - asked_ms < CLI_LOGS_EARLY_MS)
      usleep(CLI_LOGS_PAUSE_US);
  }
  cli_progress_end(pull, rc == CLI_OK, NULL);
  free(base);
  return rc;
}

static const struct option run_longs[] = {{"image", required_argument, NULL, 'i'},
                                          {"env", required_argument, NULL, 'e'},
                                          {"follow", no_argument, NULL, 'f'},
                                          {"memory", required_argument, NULL, 'm'},
                                          {"pids", required_argument, NULL, 'p'},
                                          {"help", no_argument, NULL, 'h'},
                                          {0}};
const cli_opts cli_run_opts = {":hfe:", run_longs};

int cmd_run(cli *c, int argc, char **argv) {
  /* Options end at "--": what follows is the job's command, untouched. */
  int dd = argc;
  for (int i = 1; i < argc; i++)
    if (strcmp(argv[i], "--") == 0) {
      dd = i;
      break;
    }
  const char *image = NULL;
  bool follow = false;
  uint64_t memory_mib = 0, pids = 0; /* 0: not given, gpunetd's default */
  json_t *env = json_array();
  json_t *cmd = json_array();
  json_t *body = NULL;
  int rc = CLI_FAIL, o;
  if (!env || !cmd) {
    rc = cli_fail("out of memory");
    goto out;
  }
  optind = 0;
  opterr = 0;
  while ((o = getopt_long(dd, argv, cli_run_opts.shorts, cli_run_opts.longs, NULL)) != -1) {
    switch (o) {
    case 'i':
      image = optarg;
      break;
    case 'f':
      follow = true;
      break;
    case 'm':
      if (!cli_parse_memory_mib(optarg, &memory_mib)) {
        rc = cli_usage_error("run", "--memory '%s' is not a size such as 512M or 2G (whole MiB)", optarg);
        goto out;
      }
      if (memory_mib < CLI_MEMORY_MIB_MIN || memory_mib > CLI_MEMORY_MIB_MAX) {
        rc = cli_usage_error("run", "--memory '%s' is outside %uM..%uG", optarg, CLI_MEMORY_MIB_MIN,
                             CLI_MEMORY_MIB_MAX >> 10);
        goto out;
      }
      break;
    case 'p':
      if (!parse_count(optarg, &pids) || pids < CLI_PIDS_MIN || pids > CLI_PIDS_MAX) {
        rc = cli_usage_error("run", "--pids '%s' is not a number of processes from %u to %u", optarg, CLI_PIDS_MIN,
                             CLI_PIDS_MAX);
        goto out;
      }
      break;
    case 'e':
      if (cli_check_env("run", optarg) >= 0) {
        rc = CLI_USAGE;
        goto out;
      }
      if (json_array_size(env) == CLI_MAX_ENV) {
        rc = cli_usage_error("run", "more than %d --env variables", CLI_MAX_ENV);
        goto out;
      }
      if (json_array_append_new(env, json_string(optarg)) < 0) {
        rc = cli_usage_error("run", "--env '%s' is not valid UTF-8", optarg);
        goto out;
      }
      break;
    case 'h':
      rc = cli_print_usage(cli_find_cmd("run"));
      goto out;
    default:
      rc = cli_bad_option("run", o, argv);
      goto out;
    }
  }
  /* Before "--": the lease, and (without "--") the command after it. */
  if (optind >= dd) {
    rc = cli_usage_error("run", "missing LEASE");
    goto out;
  }
  const char *lease = argv[optind];
  if (cli_check_id("run", "lease", lease) >= 0) {
    rc = CLI_USAGE;
    goto out;
  }
  if (dd < argc && optind + 1 < dd) {
    rc = cli_usage_error("run", "unexpected argument '%s' before --", argv[optind + 1]);
    goto out;
  }
  for (int i = dd < argc ? dd + 1 : optind + 1; i < argc; i++) {
    if (json_array_append_new(cmd, json_string(argv[i])) < 0) {
      rc = cli_usage_error("run", "argument '%s' is not valid UTF-8", argv[i]);
      goto out;
    }
  }
  if (!image) {
    rc = cli_usage_error("run", "missing --image REF");
    goto out;
  }
  if (!json_array_size(cmd)) {
    rc = cli_usage_error("run", "missing the command to run (after --)");
    goto out;
  }
  body = json_pack("{s:s, s:s, s:O, s:O}", "lease", lease, "image", image, "env", env, "cmd", cmd);
  if (body && ((memory_mib && json_object_set_new(body, "memory_mib", json_integer((json_int_t)memory_mib)) < 0) ||
               (pids && json_object_set_new(body, "pids", json_integer((json_int_t)pids)) < 0))) {
    json_decref(body);
    body = NULL;
  }
  if (!body) {
    rc = cli_fail("out of memory (or an argument is not valid UTF-8)");
    goto out;
  }
  json_t *j;
  rc = cli_call(c, "POST", "/v1/jobs", body, &j);
  body = NULL;
  if (rc != CLI_OK)
    goto out;
  const json_t *job = json_object_get(j, "job");
  const char *id = cli_str(job, "id");
  if (c->json) {
    cli_print_json(j);
  } else {
    printf("%s\n", id ? id : "?");
    fflush(stdout);
  }
  if (follow && id) {
    char *idc = strdup(id);
    json_decref(j);
    rc = idc ? cli_follow_logs(c, idc, true) : cli_fail("out of memory");
    free(idc);
    goto out;
  }
  json_decref(j);
  rc = CLI_OK;
out:
  json_decref(body);
  json_decref(env);
  json_decref(cmd);
  return rc;
}

static void job_row(cli_table *t, const json_t *job, size_t i) {
  (void)i;
  char exitc[16], created[32], ran[24], cmdline[80] = "";
  int64_t now = (int64_t)time(NULL);
  if (cli_has_int(job, "exit_code"))
    snprintf(exitc, sizeof(exitc), "%lld", (long long)cli_int(job, "exit_code", 0));
  else
    snprintf(exitc, sizeof(exitc), "-");
  int64_t c0 = cli_int(job, "created_s", 0);
  cli_fmt_time(c0, created, sizeof(created));
  int64_t end = cli_has_int(job, "ended_s") ? cli_int(job, "ended_s", now) : now;
  cli_fmt_duration(c0 ? end - c0 : 0, ran, sizeof(ran));
  size_t k;
  const json_t *arg;
  json_array_foreach(json_object_get(job, "cmd"), k, arg) {
    size_t have = strlen(cmdline);
    if (json_is_string(arg) && have + 2 < sizeof(cmdline))
      snprintf(cmdline + have, sizeof(cmdline) - have, "%s%s", have ? " " : "", json_string_value(arg));
  }
  const char *state = cli_str(job, "state");
  char st[160];
  if (state && cli_str(job, "error"))
    snprintf(st, sizeof(st), "%s (%s)", state, cli_str(job, "error"));
  else
    snprintf(st, sizeof(st), "%s", state ? state : "?");
  const char *row[] = {
      cli_str(job, "id"), cli_str(job, "lease"), cli_str(job, "image"), st, exitc, created, ran, cmdline};
  cli_table_row(t, row);
}

int cmd_jobs(cli *c, int argc, char **argv) {
  static const char *const hdr[] = {"JOB", "LEASE", "IMAGE", "STATE", "EXIT", "CREATED", "RAN", "COMMAND"};
  static const cli_list_spec spec = {"jobs", "no jobs (start one with: gpunet run LEASE --image REF -- CMD)", 8, hdr,
                                     job_row};
  int r = cli_simple_args(argc, argv, 0, "");
  if (r >= 0)
    return r;
  if (c->json) { /* {"jobs": [...], "trains": [...]}: the training jobs too */
    json_t *jobs = NULL, *trains = NULL;
    if ((r = cli_call(c, "GET", "/v1/jobs", NULL, &jobs)) != CLI_OK)
      return r;
    bool quiet = c->quiet;
    c->quiet = true;
    if (cli_call(c, "GET", "/v1/train", NULL, &trains) == CLI_OK && json_is_array(json_object_get(trains, "trains")))
      json_object_set(jobs, "trains", json_object_get(trains, "trains"));
    else
      json_object_set_new(jobs, "trains", json_array());
    c->quiet = quiet;
    cli_print_json(jobs);
    json_decref(jobs);
    json_decref(trains);
    return CLI_OK;
  }
  r = cli_list(c, "/v1/jobs", &spec);
  if (r != CLI_OK)
    return r;
  /* Training jobs: each one's ranks (their jobs are in the list above). */
  json_t *j = NULL;
  bool quiet = c->quiet;
  c->quiet = true;
  int tr = cli_call(c, "GET", "/v1/train", NULL, &j);
  c->quiet = quiet;
  if (tr != CLI_OK || !json_array_size(json_object_get(j, "trains"))) {
    json_decref(j);
    return r;
  }
  static const char *const thdr[] = {"TRAINING", "STATE", "RANK", "JOB", "PROVIDER", "LEASE", "RANK STATE"};
  cli_table *t = cli_table_new(7, thdr);
  size_t i, k;
  const json_t *g, *rk;
  json_array_foreach(json_object_get(j, "trains"), i, g) {
    if (!json_array_size(json_object_get(g, "ranks"))) {
      const char *row[] = {cli_str(g, "id"), cli_str(g, "state"), NULL, NULL, NULL, NULL, NULL};
      cli_table_row(t, row);
    }
    json_array_foreach(json_object_get(g, "ranks"), k, rk) {
      char rank[16], prov[64] = "-", st[160];
      snprintf(rank, sizeof(rank), "%lld", (long long)cli_int(rk, "rank", (json_int_t)k));
      if (cli_str(rk, "provider"))
        cli_fmt_node(cli_str(rk, "provider"), prov, sizeof(prov));
      snprintf(st, sizeof(st), "%s%s%s", cli_str(rk, "state") ? cli_str(rk, "state") : "?",
               cli_str(rk, "error") ? ": " : "", cli_str(rk, "error") ? cli_str(rk, "error") : "");
      const char *row[] = {
          cli_str(g, "id"), cli_str(g, "state"), rank, cli_str(rk, "job"), prov, cli_str(rk, "lease"), st};
      cli_table_row(t, row);
    }
  }
  printf("\n");
  cli_table_print(t);
  json_decref(j);
  return r;
}

static const struct option logs_longs[] = {
    {"follow", no_argument, NULL, 'f'}, {"rank", required_argument, NULL, 'r'}, {"help", no_argument, NULL, 'h'}, {0}};
const cli_opts cli_logs_opts = {":hf", logs_longs};

int cmd_logs(cli *c, int argc, char **argv) {
  bool follow = false;
  long rank = -1;
  int o;
  optind = 0;
  opterr = 0;
  while ((o = getopt_long(argc, argv, cli_logs_opts.shorts, cli_logs_opts.longs, NULL)) != -1) {
    if (o == 'f')
      follow = true;
    else if (o == 'r') {
      uint64_t v;
      if (!parse_count(optarg, &v) || v > 63)
        return cli_usage_error("logs", "--rank wants a rank number from 0 to 63, not '%s'", optarg);
      rank = (long)v;
    } else if (o == 'h')
      return cli_print_usage(cli_find_cmd("logs"));
    else
      return cli_bad_option("logs", o, argv);
  }
  int r = cli_want_args(argc, argv, 1, "JOB");
  if (r < 0)
    r = cli_check_id("logs", "job", argv[optind]);
  if (r >= 0)
    return r;
  /* A training job: its ranks' output. */
  json_t *t = cli_train_get(c, argv[optind]);
  if (t) {
    long world = (long)json_array_size(json_object_get(t, "ranks"));
    json_decref(t);
    if (rank >= 0 && world && rank >= world)
      return cli_usage_error("logs", "training job %s has ranks 0 to %ld, not %ld", argv[optind], world - 1, rank);
    return cli_train_logs(c, argv[optind], rank, follow);
  }
  if (rank >= 0)
    return cli_usage_error("logs", "--rank is for training jobs; %s is none", argv[optind]);
  return cli_follow_logs(c, argv[optind], follow);
}

static void show_stopped(const json_t *j, const void *ctx) {
  const json_t *job = json_object_get(j, "job");
  printf("job %s: %s\n", cli_str(job, "id") ? cli_str(job, "id") : (const char *)ctx,
         cli_str(job, "state") ? cli_str(job, "state") : "stopping");
}

static void show_train_stopped(const json_t *j, const void *ctx) {
  const json_t *t = json_object_get(j, "train");
  printf("training %s: %s (%zu ranks stopped, leases released)\n",
         cli_str(t, "id") ? cli_str(t, "id") : (const char *)ctx, cli_str(t, "state") ? cli_str(t, "state") : "?",
         json_array_size(json_object_get(t, "ranks")));
}

int cmd_stop(cli *c, int argc, char **argv) {
  int r = cli_simple_args(argc, argv, 1, "JOB");
  if (r < 0)
    r = cli_check_id("stop", "job", argv[optind]);
  if (r >= 0)
    return r;
  json_t *t = cli_train_get(c, argv[optind]);
  if (t) { /* a training job: every rank stopped, every lease released */
    json_decref(t);
    char *tp = cli_path("/v1/train", argv[optind], "");
    if (!tp)
      return cli_fail("out of memory");
    r = cli_show(c, "DELETE", tp, NULL, show_train_stopped, argv[optind]);
    free(tp);
    return r;
  }
  char *path = cli_path("/v1/jobs", argv[optind], "/stop");
  if (!path)
    return cli_fail("out of memory");
  r = cli_show(c, "POST", path, NULL, show_stopped, argv[optind]);
  free(path);
  return r;
}
