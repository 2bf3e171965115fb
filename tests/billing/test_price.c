/* Tests of the money rules: the cumulative cost rule, price parsing and
 * formatting. */
#include "billing/fixture.h"

typedef struct cost_case {
  uint64_t price;
  uint32_t gpus;
  uint64_t seconds;
  uint64_t want;
} cost_case;

static void test_price_cost_table(void **state) {
  (void)state;
  static const cost_case cases[] = {
      {400000, 1, 0, 0},
      {400000, 1, 1, 111},       /* 111.11 rounds down */
      {400000, 1, 5, 555},       /* 555.55 */
      {400000, 1, 9, 1000},      /* exact */
      {400000, 1, 3600, 400000}, /* one hour is the price */
      {400000, 2, 3600, 800000},
      {400000, 16, 86400, 153600000},
      {1, 1, 3599, 0}, /* less than one micro-unit */
      {1, 1, 3600, 1},
      {999999, 3, 7, 5833}, /* 5833.32 */
      {UINT64_MAX, 1, 3600, UINT64_MAX},
      {UINT64_MAX, 16, 3600, UINT64_MAX}, /* saturates, never wraps */
      {UINT64_MAX, UINT32_MAX, UINT64_MAX, UINT64_MAX},
      {10000000000000ull, 16, 604800, 26880000000000000ull},
  };
  for (size_t i = 0; i < GN_ARRAY_SIZE(cases); i++) {
    uint64_t got = gn_price_cost(cases[i].price, cases[i].gpus, cases[i].seconds);
    if (got != cases[i].want)
      fail_msg("case %zu: cost(%llu, %u, %llu) = %llu, want %llu", i, (unsigned long long)cases[i].price, cases[i].gpus,
               (unsigned long long)cases[i].seconds, (unsigned long long)got, (unsigned long long)cases[i].want);
  }
}

/* Billing second by second and summing would lose up to a micro-unit per
 * second; the cumulative rule does not drift. */
static void test_price_cumulative_does_not_drift(void **state) {
  (void)state;
  uint64_t sum_per_second = 0;
  for (uint64_t s = 1; s <= 3600; s++)
    sum_per_second += gn_price_cost(400000, 1, 1);
  assert_int_equal(sum_per_second, 399600); /* 111 * 3600: drifted 400 */
  assert_int_equal(gn_price_cost(400000, 1, 3600), 400000);
  /* The cumulative difference at each second is the bill for that second:
   * the per-second amounts sum to the cumulative total exactly. */
  uint64_t sum_diff = 0;
  for (uint64_t s = 1; s <= 86400; s++)
    sum_diff += gn_price_cost(400000, 1, s) - gn_price_cost(400000, 1, s - 1);
  assert_int_equal(sum_diff, gn_price_cost(400000, 1, 86400));
  assert_int_equal(sum_diff, 9600000);
}

typedef struct parse_case {
  const char *s;
  int rc;
  uint64_t want;
} parse_case;

static void test_price_parse_table(void **state) {
  (void)state;
  static const parse_case cases[] = {
      {"0.40", 0, 400000},
      {"0.4", 0, 400000},
      {"1", 0, 1000000},
      {"0", 0, 0},
      {"0.000001", 0, 1},
      {"12.345678", 0, 12345678},
      {"18446744073709.551615", 0, UINT64_MAX},
      {"18446744073709.551616", GN_EINVAL, 0}, /* one micro-unit over */
      {"99999999999999999999", GN_EINVAL, 0},
      {"0.1234567", GN_EINVAL, 0}, /* 7 decimals */
      {"-0.40", GN_EINVAL, 0},
      {"+0.40", GN_EINVAL, 0},
      {".40", GN_EINVAL, 0},
      {"1.", GN_EINVAL, 0},
      {"", GN_EINVAL, 0},
      {" 1", GN_EINVAL, 0},
      {"1 ", GN_EINVAL, 0},
      {"0,40", GN_EINVAL, 0},
      {"1e3", GN_EINVAL, 0},
      {"0x10", GN_EINVAL, 0},
      {"1.2.3", GN_EINVAL, 0},
      {"abc", GN_EINVAL, 0},
  };
  for (size_t i = 0; i < GN_ARRAY_SIZE(cases); i++) {
    uint64_t got = 424242;
    int rc = gn_price_parse(cases[i].s, &got);
    if (rc != cases[i].rc)
      fail_msg("parse(\"%s\") returned %d, want %d", cases[i].s, rc, cases[i].rc);
    if (rc == 0 && got != cases[i].want)
      fail_msg("parse(\"%s\") = %llu, want %llu", cases[i].s, (unsigned long long)got,
               (unsigned long long)cases[i].want);
    if (rc != 0 && got != 424242)
      fail_msg("parse(\"%s\") wrote its output on failure", cases[i].s);
  }
  assert_int_equal(gn_price_parse(NULL, &(uint64_t){0}), GN_EINVAL);
}

static void test_price_format_round_trips(void **state) {
  (void)state;
  char buf[32];
  gn_price_format(400000, buf, sizeof(buf));
  assert_string_equal(buf, "0.400000");
  gn_price_format(555, buf, sizeof(buf));
  assert_string_equal(buf, "0.000555");
  gn_price_format(12345678, buf, sizeof(buf));
  assert_string_equal(buf, "12.345678");
  gn_price_format(UINT64_MAX, buf, sizeof(buf));
  assert_string_equal(buf, "18446744073709.551615");
  static const uint64_t vals[] = {0, 1, 999999, 1000000, 400000, 987654321012};
  for (size_t i = 0; i < GN_ARRAY_SIZE(vals); i++) {
    uint64_t back = 0;
    gn_price_format(vals[i], buf, sizeof(buf));
    assert_int_equal(gn_price_parse(buf, &back), 0);
    assert_int_equal(back, vals[i]);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_price_cost_table),
      cmocka_unit_test(test_price_cumulative_does_not_drift),
      cmocka_unit_test(test_price_parse_table),
      cmocka_unit_test(test_price_format_round_trips),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
