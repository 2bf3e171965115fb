/* cli/progress.c: when a wait shows, how often, and what each mode prints
 * (an injected clock; output into a memory stream). */
#include "progress.h"

#include <jansson.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

static uint64_t fake_now;
static uint64_t clock_fn(void) {
  return fake_now;
}

typedef struct out {
  char *buf;
  size_t len;
  FILE *f;
} out;

static void out_open(out *o) {
  memset(o, 0, sizeof *o);
  o->f = open_memstream(&o->buf, &o->len);
  assert_non_null(o->f);
}

static const char *out_text(out *o) {
  fflush(o->f);
  return o->buf ? o->buf : "";
}

static void out_close(out *o) {
  fclose(o->f);
  free(o->buf);
}

static unsigned count_lines(const char *s) {
  unsigned n = 0;
  for (; *s; s++)
    n += *s == '\n';
  return n;
}

static void test_wait_under_a_second_shows_nothing_in_any_mode(void **state) {
  (void)state;
  cli_progress_mode modes[] = {CLI_PROGRESS_BAR, CLI_PROGRESS_PLAIN, CLI_PROGRESS_JSON};
  for (size_t i = 0; i < 3; i++) {
    out o;
    out_open(&o);
    fake_now = 5000;
    cli_progress *p = cli_progress_start(modes[i], "pull", "Pulling image", CLI_PROGRESS_BYTES, 1000, o.f, clock_fn);
    fake_now = 5500;
    cli_progress_update(p, 500, 0, NULL);
    fake_now = 5999;
    cli_progress_update(p, 999, 0, NULL);
    cli_progress_end(p, true, NULL);
    assert_string_equal(out_text(&o), "");
    out_close(&o);
  }
}

static void test_plain_prints_at_most_every_five_seconds_and_on_new_detail(void **state) {
  (void)state;
  out o;
  out_open(&o);
  fake_now = 0;
  cli_progress *p =
      cli_progress_start(CLI_PROGRESS_PLAIN, "pull", "Pulling", CLI_PROGRESS_BYTES, 4u << 20, o.f, clock_fn);
  fake_now = 1000;
  cli_progress_update(p, 1u << 20, 0, NULL);
  assert_int_equal(count_lines(out_text(&o)), 1);
  assert_non_null(strstr(out_text(&o), " 25% 1.00 MiB of 4.00 MiB"));
  for (fake_now = 1100; fake_now < 6000; fake_now += 100)
    cli_progress_update(p, 2u << 20, 0, NULL);
  assert_int_equal(count_lines(out_text(&o)), 1);
  cli_progress_update(p, 2u << 20, 0, "layer 2 of 3");
  assert_int_equal(count_lines(out_text(&o)), 2);
  assert_non_null(strstr(out_text(&o), "layer 2 of 3"));
  fake_now = 10900; /* 4.9 s after the detail's line (at 6.0 s): not yet */
  cli_progress_update(p, 3u << 20, 0, NULL);
  assert_int_equal(count_lines(out_text(&o)), 2);
  fake_now = 11000;
  cli_progress_update(p, 3u << 20, 0, NULL);
  assert_int_equal(count_lines(out_text(&o)), 3);
  cli_progress_end(p, true, NULL);
  assert_int_equal(count_lines(out_text(&o)), 4);
  assert_non_null(strstr(out_text(&o), "Pulling: done after 11.0s (4.00 MiB"));
  assert_null(strchr(out_text(&o), '\r')); /* no terminal control in plain mode */
  out_close(&o);
}

static void test_json_events_parse_and_carry_rate(void **state) {
  (void)state;
  out o;
  out_open(&o);
  fake_now = 0;
  cli_progress *p =
      cli_progress_start(CLI_PROGRESS_JSON, "cp", "Copying", CLI_PROGRESS_BYTES, 50u << 20, o.f, clock_fn);
  /* 10 MiB a second for 5 s, updated every 100 ms */
  for (fake_now = 100; fake_now <= 5000; fake_now += 100)
    cli_progress_update(p, (uint64_t)fake_now * (10u << 20) / 1000u, 0, NULL);
  cli_progress_end(p, true, NULL);
  const char *text = out_text(&o);
  assert_non_null(strstr(text, "\"elapsed_s\":1,")
                      ? text
                      : strstr(text, "\"elapsed_s\":1.0,")); /* 7 digits, no 1.0000000000000002 */
  unsigned lines = count_lines(text);
  assert_true(lines >= 4 && lines <= 6); /* once a second from 1 s, and the end */
  char *copy = strdup(text), *save = NULL;
  json_t *last = NULL;
  double progress_rate = 0;
  for (char *line = strtok_r(copy, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
    if (last && strcmp(json_string_value(json_object_get(last, "event")), "progress") == 0)
      progress_rate = json_real_value(json_object_get(last, "rate"));
    json_decref(last);
    last = json_loads(line, 0, NULL);
    assert_non_null(last);
    assert_string_equal(json_string_value(json_object_get(last, "what")), "cp");
    assert_string_equal(json_string_value(json_object_get(last, "unit")), "bytes");
    assert_int_equal(json_integer_value(json_object_get(last, "total")), 50 << 20);
  }
  assert_string_equal(json_string_value(json_object_get(last, "event")), "done");
  assert_int_equal(json_integer_value(json_object_get(last, "done")), 50 << 20);
  /* the last progress event: the last seconds' rate; the end: the average */
  assert_true(progress_rate > 9.5 * (1 << 20) && progress_rate < 10.5 * (1 << 20));
  double rate = json_real_value(json_object_get(last, "rate"));
  assert_true(rate > 9.5 * (1 << 20) && rate < 10.5 * (1 << 20));
  json_decref(last);
  free(copy);
  out_close(&o);
}

static void test_json_failure_is_reported_even_when_quick(void **state) {
  (void)state;
  out o;
  out_open(&o);
  fake_now = 0;
  cli_progress *p =
      cli_progress_start(CLI_PROGRESS_JSON, "offers", "Waiting for offers", CLI_PROGRESS_NONE, 0, o.f, clock_fn);
  fake_now = 200;
  cli_progress_end(p, false, "no provider answered");
  json_t *j = json_loads(out_text(&o), 0, NULL);
  assert_non_null(j);
  assert_string_equal(json_string_value(json_object_get(j, "event")), "failed");
  assert_string_equal(json_string_value(json_object_get(j, "detail")), "no provider answered");
  assert_true(json_is_null(json_object_get(j, "rate")));
  json_decref(j);
  out_close(&o);
}

static void test_bar_redraws_one_line_and_ends_with_a_newline(void **state) {
  (void)state;
  out o;
  out_open(&o);
  fake_now = 0;
  cli_progress *p = cli_progress_start(CLI_PROGRESS_BAR, "gang", "Leasing", CLI_PROGRESS_ITEMS, 4, o.f, clock_fn);
  fake_now = 1000;
  cli_progress_update(p, 2, 0, "2 of 4 providers agreed");
  fake_now = 1050; /* within 100 ms: not redrawn */
  cli_progress_update(p, 3, 0, NULL);
  fake_now = 1200;
  cli_progress_update(p, 3, 0, NULL);
  const char *t = out_text(&o);
  assert_int_equal(count_lines(t), 0);
  assert_non_null(strstr(t, "\r\033[KLeasing [############------------] 2/4  2 of 4 providers agreed"));
  assert_non_null(strstr(t, "[##################------] 3/4"));
  cli_progress_end(p, true, "4 leases");
  t = out_text(&o);
  assert_int_equal(count_lines(t), 1);
  assert_non_null(strstr(t, "\r\033[KLeasing: done after 1.2s (4/4): 4 leases\n"));
  out_close(&o);
}

static void test_bar_clear_erases_and_next_update_redraws_at_once(void **state) {
  (void)state;
  out o;
  out_open(&o);
  fake_now = 0;
  cli_progress *p = cli_progress_start(CLI_PROGRESS_BAR, "gang", "Leasing", CLI_PROGRESS_ITEMS, 0, o.f, clock_fn);
  cli_progress_clear(p); /* nothing shown yet: nothing to erase */
  assert_string_equal(out_text(&o), "");
  fake_now = 1000;
  cli_progress_update(p, 0, 0, "planning");
  assert_non_null(strstr(out_text(&o), "Leasing | 1.0s  planning")); /* no total yet: elapsed time */
  size_t before = strlen(out_text(&o));
  cli_progress_clear(p);
  assert_string_equal(out_text(&o) + before, "\r\033[K");
  fake_now = 1010; /* within 100 ms of the last draw, yet drawn again */
  cli_progress_update(p, 1, 2, "forming");
  assert_non_null(strstr(out_text(&o) + before, "1/2  forming"));
  cli_progress_end(p, true, "running");
  assert_non_null(strstr(out_text(&o), "Leasing: done after 1.0s (2/2): running\n"));
  out_close(&o);
}

static void test_mode_for_json_wins_then_environment(void **state) {
  (void)state;
  setenv("GN_PROGRESS", "plain", 1);
  assert_int_equal(cli_progress_mode_for(true), CLI_PROGRESS_JSON);
  assert_int_equal(cli_progress_mode_for(false), CLI_PROGRESS_PLAIN);
  setenv("GN_PROGRESS", "off", 1);
  assert_int_equal(cli_progress_mode_for(false), CLI_PROGRESS_OFF);
  setenv("GN_PROGRESS", "nonsense", 1);
  assert_int_equal(cli_progress_mode_for(false), CLI_PROGRESS_AUTO);
  unsetenv("GN_PROGRESS");
  assert_int_equal(cli_progress_mode_for(false), CLI_PROGRESS_AUTO);
}

static void test_off_prints_nothing_even_on_failure(void **state) {
  (void)state;
  out o;
  out_open(&o);
  fake_now = 0;
  cli_progress *p = cli_progress_start(CLI_PROGRESS_OFF, "pull", "Pulling", CLI_PROGRESS_BYTES, 10, o.f, clock_fn);
  fake_now = 9000;
  cli_progress_update(p, 5, 0, "x");
  cli_progress_end(p, false, "broken");
  assert_string_equal(out_text(&o), "");
  out_close(&o);
}

static void test_fmt_bytes(void **state) {
  (void)state;
  char b[32];
  cli_progress_fmt_bytes(0, b, sizeof b);
  assert_string_equal(b, "0 B");
  cli_progress_fmt_bytes(1536, b, sizeof b);
  assert_string_equal(b, "1.50 KiB");
  cli_progress_fmt_bytes(100ull << 20, b, sizeof b);
  assert_string_equal(b, "100 MiB");
  cli_progress_fmt_bytes(UINT64_MAX, b, sizeof b);
  assert_non_null(strstr(b, "TiB"));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_wait_under_a_second_shows_nothing_in_any_mode),
      cmocka_unit_test(test_plain_prints_at_most_every_five_seconds_and_on_new_detail),
      cmocka_unit_test(test_json_events_parse_and_carry_rate),
      cmocka_unit_test(test_json_failure_is_reported_even_when_quick),
      cmocka_unit_test(test_bar_redraws_one_line_and_ends_with_a_newline),
      cmocka_unit_test(test_bar_clear_erases_and_next_update_redraws_at_once),
      cmocka_unit_test(test_mode_for_json_wins_then_environment),
      cmocka_unit_test(test_off_prints_nothing_even_on_failure),
      cmocka_unit_test(test_fmt_bytes),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
