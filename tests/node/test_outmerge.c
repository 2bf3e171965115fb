/* Tests for merging a job's stdout and stderr into one log (node/outmerge.c).
 * The attack is the job's own: two streams written at once, one line cut
 * by the other's output, or a line without end to hold the provider's
 * memory. The last CI saw "...No space left on devicerefused=1034". */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
/* cmocka needs the above first. */
#include <cmocka.h>

#include "outmerge.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
  char log[65536];
  size_t len;
  int calls;
} sink;

static void to_sink(void *ctx, const uint8_t *data, size_t len) {
  sink *s = ctx;
  assert_true(s->len + len <= sizeof s->log);
  memcpy(s->log + s->len, data, len);
  s->len += len;
  s->calls++;
}

static void take(gn_out_partial *p, sink *s, const char *text, uint64_t now) {
  gn__out_take(p, (const uint8_t *)text, strlen(text), now, to_sink, s);
}

static void test_lines_of_two_streams_stay_whole(void **state) {
  (void)state;
  static gn_out_partial out, err;
  static sink s;
  memset(&out, 0, sizeof out), memset(&err, 0, sizeof err), memset(&s, 0, sizeof s);
  /* What a read of each stream could return, interleaved. */
  take(&err, &s, "sh: can't create f1: No space", 0);
  take(&out, &s, "refused=1034\n", 1);
  take(&err, &s, " left on device\nsh: can't", 2);
  take(&err, &s, " create f2: No space left on device\n", 3);
  take(&out, &s, "/dev/loop0 63205", 4);
  gn__out_flush(&out, 5, 1, to_sink, &s); /* stdout ends without a newline */
  s.log[s.len] = 0;
  assert_string_equal(s.log, "refused=1034\n"
                             "sh: can't create f1: No space left on device\n"
                             "sh: can't create f2: No space left on device\n"
                             "/dev/loop0 63205");
}

static void test_held_end_goes_after_its_wait(void **state) {
  (void)state;
  static gn_out_partial out;
  static sink s;
  memset(&out, 0, sizeof out), memset(&s, 0, sizeof s);
  take(&out, &s, "Epoch 1: 40%", 1000);
  gn__out_flush(&out, 1000 + GN_OUT_HOLD_MS - 1, 0, to_sink, &s);
  assert_int_equal(s.len, 0);  /* not yet */
  take(&out, &s, "...", 1100); /* more of the same line: still since 1000 */
  gn__out_flush(&out, 1000 + GN_OUT_HOLD_MS, 0, to_sink, &s);
  assert_int_equal(s.len, strlen("Epoch 1: 40%..."));
  gn__out_flush(&out, 5000, 0, to_sink, &s);
  assert_int_equal(s.len, strlen("Epoch 1: 40%...")); /* nothing twice */
  /* A clock read before the stamp (a tick that began earlier) waits. */
  take(&out, &s, "x", 9000);
  gn__out_flush(&out, 8999, 0, to_sink, &s);
  assert_int_equal(s.len, strlen("Epoch 1: 40%..."));
}

static void test_carriage_return_ends_a_line(void **state) {
  (void)state;
  static gn_out_partial out;
  static sink s;
  memset(&out, 0, sizeof out), memset(&s, 0, sizeof s);
  take(&out, &s, "\r 10%\r 20%", 0);
  assert_int_equal(s.len, strlen("\r 10%\r"));
  assert_int_equal(out.len, strlen(" 20%"));
}

static void test_a_line_without_end_is_not_held_past_the_bound(void **state) {
  (void)state;
  static gn_out_partial out;
  static sink s;
  memset(&out, 0, sizeof out), memset(&s, 0, sizeof s);
  static char big[3 * GN_OUT_PARTIAL_MAX];
  memset(big, 'a', sizeof big - 1);
  /* In pieces of 1000: the hold never passes its bound, nothing is lost. */
  size_t fed = 0;
  for (; fed + 1000 <= sizeof big - 1; fed += 1000) {
    gn__out_take(&out, (const uint8_t *)big + fed, 1000, 0, to_sink, &s);
    assert_true(out.len <= GN_OUT_PARTIAL_MAX);
    assert_int_equal(s.len + out.len, fed + 1000);
  }
  /* In one piece larger than the hold: it goes at once. */
  static gn_out_partial err;
  gn__out_take(&err, (const uint8_t *)big, sizeof big - 1, 0, to_sink, &s);
  assert_int_equal(err.len, 0);
  assert_int_equal(s.len + out.len, fed + sizeof big - 1);
  for (size_t i = 0; i < s.len; i++)
    assert_int_equal(s.log[i], 'a');
}

static void test_empty_and_newline_only(void **state) {
  (void)state;
  static gn_out_partial out;
  static sink s;
  memset(&out, 0, sizeof out), memset(&s, 0, sizeof s);
  gn__out_take(&out, (const uint8_t *)"", 0, 0, to_sink, &s);
  gn__out_flush(&out, 0, 1, to_sink, &s);
  assert_int_equal(s.calls, 0);
  take(&out, &s, "\n", 0);
  assert_int_equal(s.len, 1);
  assert_int_equal(out.len, 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_lines_of_two_streams_stay_whole),
      cmocka_unit_test(test_held_end_goes_after_its_wait),
      cmocka_unit_test(test_carriage_return_ends_a_line),
      cmocka_unit_test(test_a_line_without_end_is_not_held_past_the_bound),
      cmocka_unit_test(test_empty_and_newline_only),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
