/* gpunet members: the overlay's membership as this node sees it (GET
 * /v1/members): each member's address, SWIM state, incarnation and how long
 * it has been in that state, filtered by state, with a summary line. */
#include "cli.h"

#include <getopt.h>
#include <gpunet/base.h>
#include <stdio.h>
#include <string.h>

static const char *const states[] = {"alive", "suspect", "dead", "left"};
#define NSTATES (sizeof(states) / sizeof(states[0]))

static const struct option members_longs[] = {
    {"state", required_argument, NULL, 's'}, {"help", no_argument, NULL, 'h'}, {0}};
const cli_opts cli_members_opts = {":hs:", members_longs};

/* The index of a state name in states, or -1. */
static int state_index(const char *s) {
  for (size_t i = 0; s && i < NSTATES; i++)
    if (strcmp(s, states[i]) == 0)
      return (int)i;
  return -1;
}

/* "3m05s ago" from milliseconds, rounded to the second; "just now" under
 * half a second. */
static void fmt_since(int64_t ms, char *buf, size_t cap) {
  if (ms < 500) {
    snprintf(buf, cap, "just now");
    return;
  }
  char d[32];
  cli_fmt_duration((ms + 500) / 1000, d, sizeof(d));
  snprintf(buf, cap, "%s ago", d);
}

/* Lifeguard's local health in words: 0 is healthy; it rises (up to 8) as
 * this node's own probes go unanswered, and the node then waits longer
 * before it suspects others. */
static const char *health_words(int64_t h) {
  return h <= 0 ? "healthy" : "of 8: probes from here went unanswered lately";
}

/* Why the members cannot be shown, once GET /v1/members failed quietly:
 * the daemon is not running (cli_call says so), or runs without
 * membership (then the status says why). */
static int explain_failure(cli *c) {
  json_t *st;
  int r = cli_call(c, "GET", "/v1/status", NULL, &st);
  if (r != CLI_OK)
    return r;
  const char *overlay = cli_str(st, "overlay");
  if (overlay && strcmp(overlay, "off") == 0)
    r = cli_fail("this node runs without membership (overlay = off): start gpunetd with --overlay on, or set "
                 "overlay = on in gpunet.conf");
  else if (overlay && strcmp(overlay, "on") != 0)
    r = cli_fail("this node has no membership (overlay %s)", overlay);
  json_decref(st);
  if (r != CLI_OK)
    return r;
  /* Not the overlay: the daemon's own answer says what went wrong. */
  json_t *j;
  if ((r = cli_call(c, "GET", "/v1/members", NULL, &j)) == CLI_OK) {
    json_decref(j);
    r = cli_fail("gpunetd did not list its members a moment ago; try again");
  }
  return r;
}

int cmd_members(cli *c, int argc, char **argv) {
  int want = -1, o;
  optind = 0;
  opterr = 0;
  while ((o = getopt_long(argc, argv, cli_members_opts.shorts, cli_members_opts.longs, NULL)) != -1) {
    if (o == 'h')
      return cli_print_usage(cli_find_cmd("members"));
    if (o != 's')
      return cli_bad_option("members", o, argv);
    if ((want = state_index(optarg)) < 0) {
      char shown[40];
      gn_printable_copy(optarg, shown, sizeof(shown));
      return cli_usage_error("members", "unknown state '%s': want alive, suspect, dead or left", shown);
    }
  }
  int r = cli_want_args(argc, argv, 0, "");
  if (r >= 0)
    return r;
  json_t *j;
  bool quiet = c->quiet;
  c->quiet = true;
  r = cli_call(c, "GET", "/v1/members", NULL, &j);
  c->quiet = quiet;
  if (r != CLI_OK)
    return quiet ? r : explain_failure(c);
  const json_t *all = json_object_get(j, "members");
  int64_t health = cli_int(j, "health", 0);
  int64_t counts[NSTATES] = {0};
  json_t *shown = json_array();
  size_t i;
  const json_t *m;
  json_array_foreach(all, i, m) {
    int s = state_index(cli_str(m, "state"));
    if (s >= 0)
      counts[s]++;
    if (want < 0 || s == want)
      json_array_append(shown, (json_t *)m);
  }
  if (c->json) {
    json_t *out =
        json_pack("{s:O, s:I, s:{s:I, s:I, s:I, s:I}, s:I}", "members", shown, "health", (json_int_t)health, "counts",
                  "alive", (json_int_t)counts[0], "suspect", (json_int_t)counts[1], "dead", (json_int_t)counts[2],
                  "left", (json_int_t)counts[3], "total", (json_int_t)json_array_size(all));
    if (out && want >= 0)
      json_object_set_new(out, "state", json_string(states[want]));
    if (out)
      cli_print_json_new(out);
    else
      r = cli_fail("out of memory");
  } else {
    if (json_array_size(shown)) {
      static const char *const hdr[] = {"NODE", "ADDRESS", "STATE", "INCARNATION", "SINCE"};
      cli_table *t = cli_table_new(5, hdr);
      json_array_foreach(shown, i, m) {
        char inc[24], since[48];
        snprintf(inc, sizeof(inc), "%lld", (long long)cli_int(m, "incarnation", 0));
        fmt_since(cli_int(m, "for_ms", 0), since, sizeof(since));
        const char *row[] = {cli_str(m, "node_id"), cli_str(m, "addr"), cli_str(m, "state"), inc, since};
        cli_table_row(t, row);
      }
      cli_table_print(t);
    } else if (json_array_size(all)) {
      printf("no %s members\n", states[want]);
    } else {
      printf("no members yet (this node has not met another: is a bootstrap peer configured? gpunetd "
             "--bootstrap HOST:PORT)\n");
    }
    printf("%zu member%s besides this node: %lld alive, %lld suspect, %lld dead, %lld left; local health %lld "
           "(%s)\n",
           json_array_size(all), json_array_size(all) == 1 ? "" : "s", (long long)counts[0], (long long)counts[1],
           (long long)counts[2], (long long)counts[3], (long long)health, health_words(health));
  }
  json_decref(shown);
  json_decref(j);
  return r;
}
