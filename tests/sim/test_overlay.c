/* The overlay scenario at GN_SIM_NODES nodes (set by tests/CMakeLists.txt,
 * fewer under the sanitizers) and issue 9's goals asserted on it: a crash
 * detected by every holder within the bound the suspicion timeout gives and
 * its death spread within twice the Serf model's time, a newcomer heard by
 * 99.99% of the nodes within twice the model's time, a third of the model's
 * bandwidth, no live node declared dead (no loss, 10% loss, 30% killed), the
 * 30% killed all detected within the bound, and the same seed giving the
 * same run twice (at a twentieth of the size). GN_SIM_KILL=0 leaves the
 * kill out (sim_overlay_10k: at 10,000 nodes the kill is most of the run's
 * time, and it is asserted at 1,000 nodes by sim_overlay and measured at
 * 10,000 by scripts/bench/overlay, docs/overlay/simulator.md §5). */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include "scenario.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <stdio.h>

static gn_sim_params params;
static gn_sim_report first;

/* The model's time to 99.99% at n nodes (serf's simulator, 0.2 s rounds). */
static int64_t model_ms(uint32_t n, double loss, double fail) {
  return (int64_t)(gn_sim_model_rounds(n, loss, fail, 3, 0.9999) * 200.0 + 0.5);
}

static int setup(void **state) {
  (void)state;
  const char *env = getenv("GN_SIM_NODES");
  uint32_t n = env ? (uint32_t)strtoul(env, NULL, 10) : 10000;
  gn_sim_params_default(&params, n >= 100 ? n : 100);
  params.seed = 20261204;
  gn_sim_params_ci(&params);
  const char *kill = getenv("GN_SIM_KILL");
  if (kill)
    params.kill_fraction = strtod(kill, NULL);
  int r = gn_sim_scenario_run(&params, &first);
  if (r == 0)
    gn_sim_report_print(stdout, &first, &params, true);
  return r;
}

static void test_model_reproduces_serf_figures(void **state) {
  (void)state;
  /* The figures: 2.2 s to 99.99% at 1k nodes, 2.8 s at 100k. */
  assert_true(fabs(gn_sim_model_rounds(1000, 0, 0, 3, 0.9999) * 0.2 - 2.2) < 1e-9);
  assert_true(fabs(gn_sim_model_rounds(100000, 0, 0, 3, 0.9999) * 0.2 - 2.8) < 1e-9);
  assert_true(gn_sim_model_rounds(1000, 0.5, 0, 3, 0.9999) > gn_sim_model_rounds(1000, 0, 0, 3, 0.9999));
}

static void test_warmup_converges(void **state) {
  (void)state;
  assert_true(first.converged);
  assert_int_equal(first.unknown_events, 0);
}

static void test_crash_declared_dead_within_bound(void **state) {
  (void)state;
  assert_true(first.crash_knowers > 0);
  assert_int_equal(first.crash_alive_end, 0);
  assert_true(first.crash_9999_ms >= 0 && first.crash_9999_ms <= first.crash_bound_ms);
}

static void test_crash_spreads_like_the_model(void **state) {
  (void)state;
  /* From the first DEAD to 99.99% of the holders: the dissemination the
   * model describes (the detection before it is SWIM's suspicion timeout,
   * which the model has no term for). */
  assert_true(first.crash_first_ms >= 0 && first.crash_9999_ms >= first.crash_first_ms);
  assert_true(first.crash_9999_ms - first.crash_first_ms <= 2 * model_ms(first.nodes, 0, 0));
}

static void test_newcomer_heard_like_the_model(void **state) {
  (void)state;
  assert_true(first.heard_9999_ms >= 0);
  assert_true(first.heard_9999_ms <= 2 * model_ms(first.nodes, 0, 0));
}

static void test_bandwidth_a_third_of_the_model(void **state) {
  (void)state;
  /* Serf's model: 3 x 1400 B x 5 a second, out and in: 42,000 B/s. */
  assert_true(first.bytes_node_s > 0);
  assert_true(first.bytes_node_s <= 42000.0 / 3);
}

static void test_no_live_node_dead_without_loss(void **state) {
  (void)state;
  assert_int_equal(first.false_dead[GN_SIM_PH_WARMUP], 0);
  assert_int_equal(first.false_dead[GN_SIM_PH_STEADY], 0);
}

static void test_no_live_node_dead_under_loss(void **state) {
  (void)state;
  assert_true(first.totals.lost > 0);                  /* the loss phase did drop datagrams */
  assert_true(first.suspect_live[GN_SIM_PH_LOSS] > 0); /* and made live nodes suspect */
  assert_int_equal(first.false_dead[GN_SIM_PH_LOSS], 0);
}

static void test_kill_fully_detected(void **state) {
  (void)state;
  if (params.kill_fraction == 0) {
    print_message("skipped: GN_SIM_KILL=0; the 30%% kill is asserted by the ctest sim_overlay (1,000 nodes) and "
                  "measured at 10,000 nodes by scripts/bench/overlay\n");
    skip();
  }
  assert_true(first.killed >= first.nodes / 4);
  assert_true(first.kill_pairs > 0);
  assert_int_equal(first.kill_alive_end, 0);
  assert_true(first.kill_9999_ms >= 0 && first.kill_9999_ms <= first.kill_bound_ms);
  assert_int_equal(first.false_dead[GN_SIM_PH_KILL], 0);
}

static void test_same_seed_same_run(void **state) {
  (void)state;
  /* The same scenario at a twentieth of the size (two more runs at full
   * size would not fit CI's time): twice with one seed, then another seed. */
  gn_sim_params small = params;
  small.nodes = params.nodes / 20 >= 100 ? params.nodes / 20 : 100;
  gn_sim_report a, b, c;
  assert_int_equal(gn_sim_scenario_run(&small, &a), 0);
  assert_int_equal(gn_sim_scenario_run(&small, &b), 0);
  assert_true(gn_sim_report_same(&a, &b));
  small.seed++;
  assert_int_equal(gn_sim_scenario_run(&small, &c), 0);
  assert_false(gn_sim_report_same(&a, &c));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_model_reproduces_serf_figures),
      cmocka_unit_test(test_warmup_converges),
      cmocka_unit_test(test_crash_declared_dead_within_bound),
      cmocka_unit_test(test_crash_spreads_like_the_model),
      cmocka_unit_test(test_newcomer_heard_like_the_model),
      cmocka_unit_test(test_bandwidth_a_third_of_the_model),
      cmocka_unit_test(test_no_live_node_dead_without_loss),
      cmocka_unit_test(test_no_live_node_dead_under_loss),
      cmocka_unit_test(test_kill_fully_detected),
      cmocka_unit_test(test_same_seed_same_run),
  };
  return cmocka_run_group_tests(tests, setup, NULL);
}
