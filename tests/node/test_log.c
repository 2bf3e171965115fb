/* Tests for the daemon's log: lines a peer can trigger are rate-limited per
 * key, with injected time. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <gpunet/node.h>

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

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

/* Points JOURNAL_STREAM at out's device and inode plus ino_delta (0: out is
 * the journal stream) and has the log decide again. */
static void journal_stream_is(intmax_t ino_delta) {
  struct stat st;
  assert_int_equal(fstat(fileno(out), &st), 0);
  char v[64];
  snprintf(v, sizeof(v), "%ju:%ju", (uintmax_t)st.st_dev, (uintmax_t)st.st_ino + (uintmax_t)ino_delta);
  setenv("JOURNAL_STREAM", v, 1);
  gn_log_set_output(out);
}

static void journal_off(void) {
  unsetenv("JOURNAL_STREAM");
  gn_log_set_output(out);
  gn_log_set_level("info");
}

static void test_log_to_journal_stream_has_priority_and_no_timestamp(void **state) {
  (void)state;
  long pos = ftell(out);
  char last[4096] = "";
  journal_stream_is(0);
  gn_log_set_level("debug");
  static const struct {
    enum gn_log_level level;
    const char *want;
  } cases[] = {{GN_LOG_ERROR, "<3>disk full\n"},
               {GN_LOG_WARN, "<4>disk full\n"},
               {GN_LOG_INFO, "<6>disk full\n"},
               {GN_LOG_DEBUG, "<7>disk full\n"}};
  for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
    gn_log(cases[i].level, "disk %s", "full");
    assert_int_equal(lines_since(&pos, last, sizeof(last)), 1);
    assert_string_equal(last, cases[i].want);
  }
  journal_off();
}

static void test_log_other_stream_keeps_timestamped_lines(void **state) {
  (void)state;
  long pos = ftell(out);
  char last[4096] = "";
  /* Another stream (stderr redirected after systemd set it), a value that
   * is not DEVICE:INODE, and none at all: the usual line. */
  for (int i = 0; i < 3; i++) {
    if (i == 0) {
      journal_stream_is(1);
    } else if (i == 1) {
      setenv("JOURNAL_STREAM", "12:34x", 1);
      gn_log_set_output(out);
    } else {
      journal_off();
    }
    gn_log(GN_LOG_ERROR, "disk full");
    assert_int_equal(lines_since(&pos, last, sizeof(last)), 1);
    assert_int_equal(last[0], '2'); /* 20YY-MM-DDTHH:MM:SSZ */
    assert_int_equal(strlen(last), strlen("2026-12-04T21:00:00Z error disk full\n"));
    assert_string_equal(last + 20, " error disk full\n");
  }
  journal_off();
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_log_ratelimited_burst_then_summary),
      cmocka_unit_test(test_log_to_journal_stream_has_priority_and_no_timestamp),
      cmocka_unit_test(test_log_other_stream_keeps_timestamped_lines),
      cmocka_unit_test(test_log_ratelimited_below_level_is_not_counted),
      cmocka_unit_test(test_log_ratelimited_many_keys_share_the_last_slot),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
