/* Tests for the fixed-bucket histogram (node/histogram.c): where an
 * observation lands, and the Prometheus lines it writes. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
/* cmocka needs the above first. */
#include <cmocka.h>

#include "histogram.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static char *write_to_string(const gn_histo *h) {
  char *buf = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&buf, &len);
  assert_non_null(f);
  gn_histo_write(h, f, "x_seconds", "Test.");
  assert_int_equal(fclose(f), 0);
  return buf;
}

static void test_histo_bound_is_inclusive(void **state) {
  (void)state;
  gn_histo h = {0};
  gn_histo_observe_ms(&h, 10); /* le="0.01" holds exactly 10 ms */
  gn_histo_observe_ms(&h, 11); /* the next bucket */
  gn_histo_observe_ms(&h, 0);
  assert_int_equal(h.in[0], 2);
  assert_int_equal(h.in[1], 1);
  assert_int_equal(h.count, 3);
  assert_int_equal(h.sum_ms, 21);
}

static void test_histo_over_last_bound_goes_to_inf(void **state) {
  (void)state;
  gn_histo h = {0};
  gn_histo_observe_ms(&h, 10000);
  gn_histo_observe_ms(&h, 10001);
  assert_int_equal(h.in[GN_HISTO_BUCKETS - 1], 1);
  assert_int_equal(h.in[GN_HISTO_BUCKETS], 1);
}

static void test_histo_sum_saturates(void **state) {
  (void)state;
  gn_histo h = {0};
  gn_histo_observe_ms(&h, UINT64_MAX - 5);
  gn_histo_observe_ms(&h, 100);
  assert_true(h.sum_ms == UINT64_MAX);
  assert_int_equal(h.count, 2);
}

static void test_histo_writes_cumulative_buckets_sum_count(void **state) {
  (void)state;
  gn_histo h = {0};
  gn_histo_observe_ms(&h, 40);    /* le 0.05 */
  gn_histo_observe_ms(&h, 700);   /* le 1 */
  gn_histo_observe_ms(&h, 20000); /* +Inf only */
  char *s = write_to_string(&h);
  assert_non_null(strstr(s, "# HELP x_seconds Test.\n# TYPE x_seconds histogram\n"));
  assert_non_null(strstr(s, "x_seconds_bucket{le=\"0.025\"} 0\n"));
  assert_non_null(strstr(s, "x_seconds_bucket{le=\"0.05\"} 1\n"));
  assert_non_null(strstr(s, "x_seconds_bucket{le=\"0.5\"} 1\n"));
  assert_non_null(strstr(s, "x_seconds_bucket{le=\"1\"} 2\n"));
  assert_non_null(strstr(s, "x_seconds_bucket{le=\"10\"} 2\n"));
  assert_non_null(strstr(s, "x_seconds_bucket{le=\"+Inf\"} 3\n"));
  assert_non_null(strstr(s, "x_seconds_sum 20.740\nx_seconds_count 3\n"));
  free(s);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_histo_bound_is_inclusive),
      cmocka_unit_test(test_histo_over_last_bound_goes_to_inf),
      cmocka_unit_test(test_histo_sum_saturates),
      cmocka_unit_test(test_histo_writes_cumulative_buckets_sum_count),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
