/* gpunet forward: a local TCP port that reaches a port inside a lease's
 * sandbox, for as long as the command runs (POST /v1/forwards, then DELETE
 * on Ctrl-C or SIGTERM; docs/protocol.md §3.4). */
#include "cli.h"

#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static volatile sig_atomic_t stop_signal;

static void on_signal(int sig) {
  stop_signal = sig;
}

static const struct option forward_longs[] = {
    {"job", required_argument, NULL, 'j'}, {"help", no_argument, NULL, 'h'}, {0}};
const cli_opts cli_forward_opts = {":hj:", forward_longs};

/* "[ADDR:]LOCAL_PORT:PORT" -> local "[ADDR:]LOCAL_PORT" and the port. */
static bool split_spec(const char *spec, char *local, size_t cap, long *ret_port) {
  const char *colon = strrchr(spec, ':');
  if (!colon || colon == spec || (size_t)(colon - spec) >= cap)
    return false;
  char *end;
  long p = strtol(colon + 1, &end, 10);
  if (!colon[1] || *end || p < 1 || p > 65535)
    return false;
  snprintf(local, cap, "%.*s", (int)(colon - spec), spec);
  *ret_port = p;
  return true;
}

int cmd_forward(cli *c, int argc, char **argv) {
  const char *job = NULL;
  int o;
  optind = 0;
  opterr = 0;
  while ((o = getopt_long(argc, argv, cli_forward_opts.shorts, cli_forward_opts.longs, NULL)) != -1) {
    if (o == 'j')
      job = optarg;
    else if (o == 'h')
      return cli_print_usage(cli_find_cmd("forward"));
    else
      return cli_bad_option("forward", o, argv);
  }
  int r = cli_want_args(argc, argv, 2, "LEASE and [LOCAL_ADDR:]LOCAL_PORT:PORT");
  if (r < 0)
    r = cli_check_id("forward", "lease", argv[optind]);
  if (r < 0 && job)
    r = cli_check_id("forward", "job", job);
  if (r >= 0)
    return r;
  const char *lease = argv[optind];
  char local[80];
  long port;
  if (!split_spec(argv[optind + 1], local, sizeof local, &port))
    return cli_usage_error("forward", "'%s' is not [LOCAL_ADDR:]LOCAL_PORT:PORT (ports 1..65535)", argv[optind + 1]);
  json_t *body = json_pack("{s:s, s:s, s:i}", "lease", lease, "local", local, "port", (int)port);
  if (body && job)
    json_object_set_new(body, "job", json_string(job));
  json_t *ans = NULL;
  if ((r = cli_call(c, "POST", "/v1/forwards", body, &ans)) != CLI_OK)
    return r;
  json_t *fw = json_object_get(ans, "forward");
  const char *id = cli_str(fw, "id");
  char idbuf[32];
  snprintf(idbuf, sizeof idbuf, "%s", id ? id : "");
  if (cli_str(fw, "warning"))
    fprintf(stderr, "gpunet: warning: %s\n", cli_str(fw, "warning"));
  if (c->json)
    cli_print_json(fw);
  else
    printf("Forwarding %s -> lease %s port %ld (Ctrl-C to stop)\n", cli_str(fw, "local") ? cli_str(fw, "local") : local,
           lease, port);
  fflush(stdout);
  json_decref(ans);
  char *path = cli_path("/v1/forwards", idbuf, "");
  if (!path)
    return cli_fail("out of memory");

  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_signal;
  sigaction(SIGINT, &sa, NULL);
  sigaction(SIGTERM, &sa, NULL);
  sigaction(SIGHUP, &sa, NULL);
  /* Until a signal: the forward is looked at each second, to tell the user
   * why a connection was refused and to stop when the lease ends. */
  char last[256] = "";
  int rc = CLI_OK;
  c->quiet = true;
  while (!stop_signal) {
    struct timespec ts = {1, 0};
    nanosleep(&ts, NULL);
    if (stop_signal)
      break;
    json_t *g = NULL;
    if (cli_call(c, "GET", path, NULL, &g) != CLI_OK) {
      fprintf(stderr, "gpunet: forward %s ended (its lease ended, or it was removed)\n", idbuf);
      rc = CLI_FAIL;
      break;
    }
    const char *err = cli_str(json_object_get(g, "forward"), "last_error");
    if (err && strcmp(err, last) != 0) {
      fprintf(stderr, "gpunet: a connection failed: %s\n", err);
      snprintf(last, sizeof last, "%s", err);
    }
    json_decref(g);
  }
  if (stop_signal) {
    json_t *d = NULL;
    if (cli_call(c, "DELETE", path, NULL, &d) == CLI_OK && !c->json)
      printf("Stopped forwarding %s\n", idbuf);
    json_decref(d);
  }
  free(path);
  return rc;
}
