/* A job's argv and environment from its image: Docker's entrypoint/cmd
 * rules and environment overrides. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <gpunet/sandbox.h>

static void assert_strv(char **got, const char *const *want) {
  size_t i = 0;
  for (; want[i]; i++) {
    if (!got[i])
      fail_msg("entry %zu missing, wanted %s", i, want[i]);
    assert_string_equal(got[i], want[i]);
  }
  assert_null(got[i]);
}

static void test_image_argv_follows_entrypoint_and_cmd(void **state) {
  (void)state;
  char *ep[] = {"/entry", "--flag", NULL};
  char *cmd[] = {"/bin/sh", NULL};
  const char *const job[] = {"echo", "hi", NULL};
  const char *const empty[] = {NULL};
  gn_image with_ep = {.entrypoint = ep, .cmd = cmd};
  gn_image no_ep = {.cmd = cmd};
  gn_image nothing = {0};
  char **v = NULL;

  assert_int_equal(gn_image_argv(&no_ep, NULL, &v), 0);
  assert_strv(v, (const char *const[]){"/bin/sh", NULL});
  v = gn_argv_free(v);
  assert_int_equal(gn_image_argv(&no_ep, job, &v), 0);
  assert_strv(v, (const char *const[]){"echo", "hi", NULL});
  v = gn_argv_free(v);
  assert_int_equal(gn_image_argv(&with_ep, NULL, &v), 0);
  assert_strv(v, (const char *const[]){"/entry", "--flag", "/bin/sh", NULL});
  v = gn_argv_free(v);
  assert_int_equal(gn_image_argv(&with_ep, job, &v), 0);
  assert_strv(v, (const char *const[]){"/entry", "--flag", "echo", "hi", NULL});
  v = gn_argv_free(v);
  assert_int_equal(gn_image_argv(&with_ep, empty, &v), 0); /* empty job cmd: the image's */
  assert_strv(v, (const char *const[]){"/entry", "--flag", "/bin/sh", NULL});
  v = gn_argv_free(v);
  assert_int_equal(gn_image_argv(&nothing, NULL, &v), GN_EINVAL);
  assert_null(v);
}

static void test_image_env_job_overrides_image(void **state) {
  (void)state;
  char *env[] = {"PATH=/bin", "LANG=C", NULL};
  gn_image img = {.env = env};
  const char *const job[] = {"LANG=C.UTF-8", "RANK=3", "RANK=4", NULL};
  char **v = NULL;
  assert_int_equal(gn_image_env(&img, job, &v), 0);
  assert_strv(v, (const char *const[]){"PATH=/bin", "LANG=C.UTF-8", "RANK=4", NULL});
  v = gn_argv_free(v);
  assert_int_equal(gn_image_env(&img, NULL, &v), 0);
  assert_strv(v, (const char *const[]){"PATH=/bin", "LANG=C", NULL});
  v = gn_argv_free(v);
  const char *const bad[] = {"NOVALUE", NULL};
  const char *const bad2[] = {"=x", NULL};
  assert_int_equal(gn_image_env(&img, bad, &v), GN_EINVAL);
  assert_int_equal(gn_image_env(&img, bad2, &v), GN_EINVAL);
  assert_null(v);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_image_argv_follows_entrypoint_and_cmd),
      cmocka_unit_test(test_image_env_job_overrides_image),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
