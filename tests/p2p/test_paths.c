/* gn_data_dir_default: XDG_DATA_HOME when absolute, else HOME, else none. */
#include <gpunet/base.h>
#include <gpunet/paths.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

static void test_xdg_absolute_wins(void **state) {
  (void)state;
  char buf[256];
  setenv("XDG_DATA_HOME", "/srv/data", 1);
  setenv("HOME", "/home/ann", 1);
  assert_int_equal(gn_data_dir_default(buf, sizeof(buf)), 0);
  assert_string_equal(buf, "/srv/data/gpunet");
}

static void test_xdg_relative_ignored(void **state) {
  (void)state;
  char buf[256];
  /* The XDG spec: a relative path is invalid and must be ignored. */
  setenv("XDG_DATA_HOME", "relative/data", 1);
  setenv("HOME", "/home/ann", 1);
  assert_int_equal(gn_data_dir_default(buf, sizeof(buf)), 0);
  assert_string_equal(buf, "/home/ann/.local/share/gpunet");
  setenv("XDG_DATA_HOME", "", 1);
  assert_int_equal(gn_data_dir_default(buf, sizeof(buf)), 0);
  assert_string_equal(buf, "/home/ann/.local/share/gpunet");
}

static void test_no_home(void **state) {
  (void)state;
  char buf[256] = "untouched";
  unsetenv("XDG_DATA_HOME");
  unsetenv("HOME");
  assert_int_equal(gn_data_dir_default(buf, sizeof(buf)), GN_ENOTFOUND);
  setenv("HOME", "", 1);
  assert_int_equal(gn_data_dir_default(buf, sizeof(buf)), GN_ENOTFOUND);
}

static void test_too_long_is_refused_not_cut(void **state) {
  (void)state;
  char buf[24];
  unsetenv("XDG_DATA_HOME");
  setenv("HOME", "/home/ann", 1);
  /* "/home/ann/.local/share/gpunet" is 29 bytes: it must not come back cut. */
  memset(buf, 'x', sizeof(buf));
  assert_int_equal(gn_data_dir_default(buf, sizeof(buf)), GN_ETOOBIG);
  assert_string_equal(buf, "");
  char exact[30];
  assert_int_equal(gn_data_dir_default(exact, sizeof(exact)), 0);
  assert_string_equal(exact, "/home/ann/.local/share/gpunet");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_xdg_absolute_wins),
      cmocka_unit_test(test_xdg_relative_ignored),
      cmocka_unit_test(test_no_home),
      cmocka_unit_test(test_too_long_is_refused_not_cut),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
