/* Tests for the daemon's log: lines a peer can trigger are rate-limited per
 * key, with injected time. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <gpunet/node.h>

#include <stdio.h>

static FILE *out;

static int setup(void **state) {
  (void)state;
  out = tmpfile();
  gn_log_set_output(out);
  return out ? gn_log_set_level("info") : -1;
}

static int teardown(void **state) {
  (void)state;
  gn_log_set_output(NULL);
  fclose(out);
  return 0;
}

/* Lines written since the last call, and the last of them in last. */
static int lines_since(long *pos, char *last, size_t cap) {
  int n = 0;
  char line[4096];
  fflush(out);
  fseek(out, *pos, SEEK_SET);
  while (fgets(line, sizeof(line), out)) {
    n++;
    snprintf(last, cap, "%s", line);
  }
  *pos = ftell(out);
  return n;
}

static void test_log_ratelimited_burst_then_summary(void **state) {
  (void)state;
  long pos = ftell(out);
  char last[4096] = "";
  for (int i = 0; i < 100; i++)
    gn_log_ratelimited_at(1000, "flood", GN_LOG_WARN, "peer %d misbehaved", i);
  assert_int_equal(lines_since(&pos, last, sizeof(last)), GN_LOG_RL_BURST);
  assert_non_null(strstr(last, "peer 9 misbehaved"));
  /* Another key is not held back by this one. */
  gn_log_ratelimited_at(1000, "other", GN_LOG_WARN, "something else");
  assert_int_equal(lines_since(&pos, last, sizeof(last)), 1);
  /* 6 s later one more line, saying how many were left out. */
  gn_log_ratelimited_at(7000, "flood", GN_LOG_WARN, "peer %d misbehaved", 100);
  gn_log_ratelimited_at(7000, "flood", GN_LOG_WARN, "peer %d misbehaved", 101);
  assert_int_equal(lines_since(&pos, last, sizeof(last)), 1);
  assert_non_null(strstr(last, "peer 100 misbehaved (90 similar lines suppressed)"));
  /* The count starts again after the summary. */
  gn_log_ratelimited_at(13000, "flood", GN_LOG_WARN, "peer %d misbehaved", 102);
  assert_int_equal(lines_since(&pos, last, sizeof(last)), 1);
  assert_non_null(strstr(last, "peer 102 misbehaved (1 similar lines suppressed)"));
}

static void test_log_ratelimited_below_level_is_not_counted(void **state) {
  (void)state;
  long pos = ftell(out);
  char last[4096] = "";
  for (int i = 0; i < 50; i++)
    gn_log_ratelimited_at(1000, "quiet", GN_LOG_DEBUG, "debug %d", i);
  assert_int_equal(lines_since(&pos, last, sizeof(last)), 0);
  gn_log_ratelimited_at(1000, "quiet", GN_LOG_INFO, "shown");
  assert_int_equal(lines_since(&pos, last, sizeof(last)), 1);
  assert_null(strstr(last, "suppressed"));
}

/* Keys past the table's 64 share one slot: the table does not grow. */
static void test_log_ratelimited_many_keys_share_the_last_slot(void **state) {
  (void)state;
  long pos = ftell(out);
  char last[4096] = "", key[32];
  for (int i = 0; i < 1000; i++) {
    snprintf(key, sizeof(key), "key-%d", i);
    gn_log_ratelimited_at(1000, key, GN_LOG_WARN, "line %d", i);
  }
  int n = lines_since(&pos, last, sizeof(last));
  /* at most one line per slot's burst: 64 slots of 10, far fewer than 1000 */
  assert_true(n < 64 * GN_LOG_RL_BURST);
  assert_true(n >= 50);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_log_ratelimited_burst_then_summary),
      cmocka_unit_test(test_log_ratelimited_below_level_is_not_counted),
      cmocka_unit_test(test_log_ratelimited_many_keys_share_the_last_slot),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
