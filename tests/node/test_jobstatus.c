/* JOB_STATUS's pull progress (node/jobmsg.c): optional, both fields or
 * none, numbers only. */
#include "jobmsg.h"
#include "records.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <string.h>

#include <cmocka.h>

/* {job_id, state, exit_code} and then pulled / pull_total when given (a
 * negative value: a string in its place). */
static int decode_status(const char *state, int have_pulled, long long pulled, int have_total, long long total,
                         gn_jobmsg *ret) {
  gn_wire_writer w;
  gn_buf b = {0};
  gn_wire_writer_init(&w);
  gn_wire_put_map(&w, 3u + (unsigned)have_pulled + (unsigned)have_total);
  gn_wire_put_str(&w, "job_id");
  gn_wire_put_str(&w, "j-0123456789ab");
  gn_wire_put_str(&w, "state");
  gn_wire_put_str(&w, state);
  gn_wire_put_str(&w, "exit_code");
  gn_wire_put_i64(&w, -1);
  if (have_pulled) {
    gn_wire_put_str(&w, "pulled");
    if (pulled < 0)
      gn_wire_put_str(&w, "lots");
    else
      gn_wire_put_u64(&w, (uint64_t)pulled);
  }
  if (have_total) {
    gn_wire_put_str(&w, "pull_total");
    if (total < 0)
      gn_wire_put_str(&w, "lots");
    else
      gn_wire_put_u64(&w, (uint64_t)total);
  }
  assert_int_equal(gn_wire_writer_take(&w, &b), 0);
  gn_wire_writer_done(&w);
  int r = gn__jobmsg_decode(GN_MSG_JOB_STATUS, b.data, b.len, ret);
  gn_buf_done(&b);
  return r;
}

static void test_status_with_pull_progress_decodes_both_fields(void **state) {
  (void)state;
  gn_jobmsg m;
  assert_int_equal(decode_status("pulling", 1, 4096, 1, 1 << 20, &m), 0);
  assert_true(m.has_pull);
  assert_int_equal(m.pulled, 4096);
  assert_int_equal(m.pull_total, 1 << 20);
  gn__jobmsg_done(&m);
}

static void test_status_without_pull_progress_has_none(void **state) {
  (void)state;
  gn_jobmsg m;
  assert_int_equal(decode_status("running", 0, 0, 0, 0, &m), 0);
  assert_false(m.has_pull);
  assert_int_equal(m.pulled, 0);
  gn__jobmsg_done(&m);
}

static void test_status_with_half_or_mistyped_pull_progress_is_refused(void **state) {
  (void)state;
  gn_jobmsg m;
  assert_true(decode_status("pulling", 1, 10, 0, 0, &m) < 0); /* pulled without its total */
  assert_true(decode_status("pulling", 1, -1, 1, 100, &m) < 0);
  assert_true(decode_status("pulling", 1, 10, 1, -1, &m) < 0);
}

/* What the renter's API shows of a pull (gn__job_pull_json): a provider
 * that claims more pulled than its total is shown at the total, never
 * past it; nothing while the total is unknown or once the job runs. */
static void test_pull_json_clamps_a_provider_claiming_more_than_the_total(void **state) {
  (void)state;
  static gn_job j; /* static: the record is large */
  memset(&j, 0, sizeof j);
  j.state = GN_JOB_PULLING;
  j.pull_total = 100;
  j.pull_done = 5000;
  json_t *o = json_object();
  gn__job_pull_json(&j, o);
  json_t *p = json_object_get(o, "pull");
  assert_non_null(p);
  assert_int_equal(json_integer_value(json_object_get(p, "done")), 100);
  assert_int_equal(json_integer_value(json_object_get(p, "total")), 100);
  json_decref(o);

  o = json_object();
  j.pull_total = 0; /* not known yet */
  gn__job_pull_json(&j, o);
  assert_null(json_object_get(o, "pull"));
  j.pull_total = 100;
  j.state = GN_JOB_RUNNING;
  gn__job_pull_json(&j, o);
  assert_null(json_object_get(o, "pull"));
  json_decref(o);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_status_with_pull_progress_decodes_both_fields),
      cmocka_unit_test(test_status_without_pull_progress_has_none),
      cmocka_unit_test(test_status_with_half_or_mistyped_pull_progress_is_refused),
      cmocka_unit_test(test_pull_json_clamps_a_provider_claiming_more_than_the_total),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
