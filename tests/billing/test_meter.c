/* Tests of the per-second meter: what is due, advancing, the cap, and the
 * time to the next tick, all on an injected monotonic clock. */
#include "billing/fixture.h"

static void test_meter_nothing_due_before_first_second(void **state) {
  (void)state;
  gn_meter m;
  gn_meter_start(&m, 5000, 10);
  assert_int_equal(gn_meter_due(&m, 5000), 0);
  assert_int_equal(gn_meter_due(&m, 5999), 0);
  assert_int_equal(gn_meter_due(&m, 6000), 1);
  assert_int_equal(gn_meter_due(&m, 4000), 0); /* clock before start */
}

static void test_meter_due_counts_whole_seconds_since_start(void **state) {
  (void)state;
  gn_meter m;
  gn_meter_start(&m, 1000, 100);
  assert_int_equal(gn_meter_due(&m, 4500), 3); /* a late timer catches up */
  gn_meter_advance(&m, 3);
  assert_int_equal(gn_meter_due(&m, 4500), 0);
  assert_int_equal(gn_meter_due(&m, 5000), 1);
  gn_meter_advance(&m, 1);
  assert_int_equal(m.ticks_done, 4);
  /* Writing fewer than due leaves the rest due. */
  assert_int_equal(gn_meter_due(&m, 11000), 6);
  gn_meter_advance(&m, 2);
  assert_int_equal(gn_meter_due(&m, 11000), 4);
}

static void test_meter_caps_at_max_s(void **state) {
  (void)state;
  gn_meter m;
  gn_meter_start(&m, 0, 5);
  assert_int_equal(gn_meter_due(&m, 60000), 5);
  assert_false(gn_meter_finished(&m));
  gn_meter_advance(&m, 9); /* never past the cap */
  assert_int_equal(m.ticks_done, 5);
  assert_true(gn_meter_finished(&m));
  assert_int_equal(gn_meter_due(&m, 120000), 0);
  assert_int_equal(gn_meter_next_ms(&m, 120000), UINT64_MAX);
}

static void test_meter_next_ms(void **state) {
  (void)state;
  gn_meter m;
  gn_meter_start(&m, 10000, 3);
  assert_int_equal(gn_meter_next_ms(&m, 10000), 1000);
  assert_int_equal(gn_meter_next_ms(&m, 10250), 750);
  assert_int_equal(gn_meter_next_ms(&m, 11000), 0); /* due now */
  gn_meter_advance(&m, 1);
  assert_int_equal(gn_meter_next_ms(&m, 11000), 1000);
  assert_int_equal(gn_meter_next_ms(&m, 11999), 1);
  assert_int_equal(gn_meter_next_ms(&m, 13500), 0); /* two due */
  gn_meter_advance(&m, 2);
  assert_true(gn_meter_finished(&m));
}

static void test_meter_zero_max_is_finished(void **state) {
  (void)state;
  gn_meter m;
  gn_meter_start(&m, 0, 0);
  assert_true(gn_meter_finished(&m));
  assert_int_equal(gn_meter_due(&m, 10000), 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_meter_nothing_due_before_first_second),
      cmocka_unit_test(test_meter_due_counts_whole_seconds_since_start),
      cmocka_unit_test(test_meter_caps_at_max_s),
      cmocka_unit_test(test_meter_next_ms),
      cmocka_unit_test(test_meter_zero_max_is_finished),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
