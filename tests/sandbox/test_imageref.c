/* Image reference parsing and formatting: a table of valid references with
 * their parts, and a table of malformed ones that must be refused. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <gpunet/sandbox.h>
#include <stdio.h>

#define D64 "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

typedef struct valid_case {
  const char *in;
  const char *registry, *repository, *tag, *digest;
  bool plain_http;
  const char *formatted;
} valid_case;

static const valid_case valid[] = {
    {"127.0.0.1:5000/busybox:latest", "127.0.0.1:5000", "busybox", "latest", "", true, "127.0.0.1:5000/busybox:latest"},
    {"localhost:5000/a/b@sha256:" D64, "localhost:5000", "a/b", "", "sha256:" D64, true,
     "localhost:5000/a/b@sha256:" D64},
    {"host.example/repo:tag@sha256:" D64, "host.example", "repo", "tag", "sha256:" D64, false,
     "host.example/repo:tag@sha256:" D64},
    {"busybox", "registry-1.docker.io", "library/busybox", "latest", "", false,
     "registry-1.docker.io/library/busybox:latest"},
    {"nvidia/cuda:12.2.0-base", "registry-1.docker.io", "nvidia/cuda", "12.2.0-base", "", false,
     "registry-1.docker.io/nvidia/cuda:12.2.0-base"},
    {"docker.io/busybox:1", "registry-1.docker.io", "library/busybox", "1", "", false,
     "registry-1.docker.io/library/busybox:1"},
    {"localhost/x", "localhost", "x", "latest", "", true, "localhost/x:latest"},
    {"[::1]:5000/x:y", "[::1]:5000", "x", "y", "", true, "[::1]:5000/x:y"},
    {"127.9.8.7/x", "127.9.8.7", "x", "latest", "", true, "127.9.8.7/x:latest"},
    {"128.0.0.1:5000/x", "128.0.0.1:5000", "x", "latest", "", false, "128.0.0.1:5000/x:latest"},
    {"ghcr.io/a-b/c__d/e.f_g:T_1.x-y", "ghcr.io", "a-b/c__d/e.f_g", "T_1.x-y", "", false,
     "ghcr.io/a-b/c__d/e.f_g:T_1.x-y"},
    {"reg.io/a---b", "reg.io", "a---b", "latest", "", false, "reg.io/a---b:latest"},
};

static void test_imageref_parses_valid_table(void **state) {
  (void)state;
  for (size_t i = 0; i < sizeof(valid) / sizeof(valid[0]); i++) {
    const valid_case *c = &valid[i];
    gn_imageref r;
    char buf[1024];
    int rc = gn_imageref_parse(c->in, &r);
    if (rc != 0)
      fail_msg("refused valid reference %s: %d", c->in, rc);
    assert_string_equal(r.registry, c->registry);
    assert_string_equal(r.repository, c->repository);
    assert_string_equal(r.tag, c->tag);
    assert_string_equal(r.digest, c->digest);
    if (r.plain_http != c->plain_http)
      fail_msg("%s: plain_http %d, wanted %d", c->in, r.plain_http, c->plain_http);
    assert_int_equal(gn_imageref_format(&r, buf, sizeof(buf)), 0);
    assert_string_equal(buf, c->formatted);
    /* The formatted form parses back to the same reference. */
    gn_imageref again;
    assert_int_equal(gn_imageref_parse(buf, &again), 0);
    assert_memory_equal(&again, &r, sizeof(r));
  }
}

static const char *const invalid[] = {
    "",
    "UPPER/case",
    "127.0.0.1:5000/Busybox",
    "127.0.0.1:5000/busybox:",
    "127.0.0.1:5000/busybox:-tag",
    "127.0.0.1:5000/busybox:ta g",
    "127.0.0.1:5000/busybox@sha256:" D64 "0",
    "127.0.0.1:5000/busybox@sha256:0123",
    "127.0.0.1:5000/busybox@sha256:0123456789ABCDEF0123456789abcdef0123456789abcdef0123456789abcdef",
    "127.0.0.1:5000/busybox@sha512:" D64,
    "127.0.0.1:5000/busybox@",
    "127.0.0.1:5000/",
    "127.0.0.1:5000//x",
    "127.0.0.1:5000/x//y",
    "127.0.0.1:5000/x/",
    "127.0.0.1:99999/x",
    "127.0.0.1:/x",
    "-bad.host/x",
    "bad-.host/x",
    "a..b/x",
    "reg.io/.x",
    "reg.io/x.",
    "reg.io/a___b",
    "reg.io/a_.b",
    "reg.io/x:y:z",
    "[::1/x",
    "[zz::1]:5000/x",
    "reg.io/x@sha256:" D64 "@sha256:" D64,
    "reg.io/x y",
    "reg.io/x\n",
    "reg.io/../x",
};

static void test_imageref_refuses_invalid_table(void **state) {
  (void)state;
  for (size_t i = 0; i < sizeof(invalid) / sizeof(invalid[0]); i++) {
    gn_imageref r;
    memset(&r, 0x5a, sizeof(r));
    gn_imageref before = r;
    int rc = gn_imageref_parse(invalid[i], &r);
    if (rc != GN_EINVAL)
      fail_msg("accepted invalid reference \"%s\" (rc %d)", invalid[i], rc);
    assert_memory_equal(&r, &before, sizeof(r)); /* untouched on error */
  }
}

static void test_imageref_bounds_lengths(void **state) {
  (void)state;
  char s[2048];
  gn_imageref r;
  /* A repository of 255 characters is the grammar's limit. */
  memset(s, 0, sizeof(s));
  strcpy(s, "reg.io/");
  memset(s + 7, 'a', 255);
  assert_int_equal(gn_imageref_parse(s, &r), 0);
  s[7 + 255] = 'a';
  assert_int_equal(gn_imageref_parse(s, &r), GN_EINVAL);
  /* Tags: 127 characters fit the struct; more is refused, never cut. */
  memset(s, 0, sizeof(s));
  strcpy(s, "reg.io/x:");
  memset(s + 9, 't', 127);
  assert_int_equal(gn_imageref_parse(s, &r), 0);
  assert_int_equal(strlen(r.tag), 127);
  s[9 + 127] = 't';
  assert_int_equal(gn_imageref_parse(s, &r), GN_EINVAL);
  /* Input over the overall bound is refused before parsing. */
  memset(s, 'a', sizeof(s) - 1);
  s[sizeof(s) - 1] = '\0';
  assert_int_equal(gn_imageref_parse(s, &r), GN_EINVAL);
  assert_int_equal(gn_imageref_parse(NULL, &r), GN_EINVAL);
}

static void test_imageref_format_reports_short_buffer(void **state) {
  (void)state;
  gn_imageref r;
  char buf[8];
  assert_int_equal(gn_imageref_parse("127.0.0.1:5000/busybox:latest", &r), 0);
  assert_int_equal(gn_imageref_format(&r, buf, sizeof(buf)), GN_ETOOBIG);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_imageref_parses_valid_table),
      cmocka_unit_test(test_imageref_refuses_invalid_table),
      cmocka_unit_test(test_imageref_bounds_lengths),
      cmocka_unit_test(test_imageref_format_reports_short_buffer),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
