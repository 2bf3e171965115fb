/* gn_overlay_sim: runs the overlay scenario (tests/sim/scenario.h) at a
 * given size and prints its figures beside the Serf/memberlist model.
 * scripts/bench/overlay runs it; docs/overlay/simulator.md explains it. */
#include "scenario.h"

#include <stdlib.h>
#include <string.h>

static void usage(FILE *f) {
  fprintf(f, "usage: gn_overlay_sim [--nodes N] [--quick] [--seed S] [--max-members M] [--loss P]\n"
             "                      [--loss-s S] [--partition-s S] [--kill F] [--ci] [--twice] [--no-host]\n"
             "                      [--progress]\n"
             "  --nodes N        nodes simulated (default 10000; --quick: 1000)\n"
             "  --seed S         the one seed everything is drawn from (default 1)\n"
             "  --max-members M  members each node keeps (default 512)\n"
             "  --loss P         loss in the loss phase, 0..0.9 (default 0.10)\n"
             "  --loss-s S       how long the loss phase lasts (default 120)\n"
             "  --partition-s S  how long 10%% of the nodes are cut off (default 5; 0: no partition)\n"
             "  --kill F         fraction killed at once at the end (default 0.30)\n"
             "  --ci             the shorter timeline of the ctests (gn_sim_params_ci: no partition,\n"
             "                   30 s of loss, phases waiting at most their bound)\n"
             "  --twice          run twice with the same seed and check the results are identical\n"
             "  --no-host        leave out the host figures (wall time, RSS), so outputs compare byte for byte\n"
             "  --progress       a line on stderr per phase (with GN_SIM_TRACE=1 in the environment, also\n"
             "                   a line a second in the crash and kill phases and the first false deaths)\n");
}

static bool num(const char *s, double lo, double hi, double *ret) {
  char *end;
  double v = strtod(s, &end);
  if (!*s || *end || !(v >= lo && v <= hi))
    return false;
  *ret = v;
  return true;
}

int main(int argc, char **argv) {
  gn_sim_params p;
  gn_sim_params_default(&p, 10000);
  bool twice = false, host = true;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    const char *v = i + 1 < argc ? argv[i + 1] : NULL;
    double x;
    if (!strcmp(a, "--quick")) {
      p.nodes = 1000;
    } else if (!strcmp(a, "--ci")) {
      gn_sim_params_ci(&p);
    } else if (!strcmp(a, "--twice")) {
      twice = true;
    } else if (!strcmp(a, "--no-host")) {
      host = false;
    } else if (!strcmp(a, "--progress")) {
      p.progress = stderr;
    } else if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
      usage(stdout);
      return 0;
    } else if (v && !strcmp(a, "--nodes") && num(v, 2, 1 << 23, &x)) {
      p.nodes = (uint32_t)x;
      i++;
    } else if (v && !strcmp(a, "--seed") && num(v, 0, 1e18, &x)) {
      p.seed = (uint64_t)x;
      i++;
    } else if (v && !strcmp(a, "--max-members") && num(v, 2, 1 << 20, &x)) {
      p.swim.max_members = (uint32_t)x;
      i++;
    } else if (v && !strcmp(a, "--loss") && num(v, 0, 0.9, &x)) {
      p.loss_phase = x;
      i++;
    } else if (v && !strcmp(a, "--loss-s") && num(v, 0, 3600, &x)) {
      p.loss_ms = (uint32_t)(x * 1000);
      i++;
    } else if (v && !strcmp(a, "--partition-s") && num(v, 0, 3600, &x)) {
      p.partition_ms = (uint32_t)(x * 1000);
      i++;
    } else if (v && !strcmp(a, "--kill") && num(v, 0, 0.9, &x)) {
      p.kill_fraction = x;
      i++;
    } else {
      fprintf(stderr, "gn_overlay_sim: bad argument '%s'%s%s\n", a, v ? " " : "", v ? v : "");
      usage(stderr);
      return 2;
    }
  }
  gn_sim_report r1, r2;
  int rc = gn_sim_scenario_run(&p, &r1);
  if (rc < 0) {
    fprintf(stderr, "gn_overlay_sim: the simulation failed: %s\n", gn_strerror(rc));
    return 1;
  }
  gn_sim_report_print(stdout, &r1, &p, host);
  if (!twice)
    return 0;
  fflush(stdout);
  if ((rc = gn_sim_scenario_run(&p, &r2)) < 0) {
    fprintf(stderr, "gn_overlay_sim: the second run failed: %s\n", gn_strerror(rc));
    return 1;
  }
  bool same = gn_sim_report_same(&r1, &r2);
  printf("determinism: a second run with seed %llu gave %s (digest %016llx)\n", (unsigned long long)p.seed,
         same ? "identical results" : "DIFFERENT results", (unsigned long long)r2.digest);
  return same ? 0 : 1;
}
