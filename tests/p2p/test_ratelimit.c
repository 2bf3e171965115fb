/* Tests for token buckets, keyed bucket tables, back-offs and the rate class
 * table, all with injected time. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <gpunet/attest.h>
#include <gpunet/ratelimit.h>
#include <gpunet/wire.h>

#include <arpa/inet.h>
#include <netinet/in.h>

#include "rateclass.h"

static void test_token_bucket_allows_burst_then_rate(void **state) {
  (void)state;
  gn_rate rate = GN_RATE(10, 5); /* 10/s, bursts of 5 */
  gn_token_bucket b;
  gn_token_bucket_init(&b, rate, 1000);
  for (int i = 0; i < 5; i++)
    assert_true(gn_token_bucket_take(&b, rate, 1, 1000));
  assert_false(gn_token_bucket_take(&b, rate, 1, 1000));
  assert_false(gn_token_bucket_take(&b, rate, 1, 1099)); /* 0.99 of a token */
  assert_true(gn_token_bucket_take(&b, rate, 1, 1100));
  assert_false(gn_token_bucket_take(&b, rate, 1, 1100));
  /* A long pause refills to the burst, no further. */
  assert_int_equal(gn_token_bucket_level(&b, rate, 1000000), 5);
  assert_false(gn_token_bucket_take(&b, rate, 6, 1000000));
  assert_true(gn_token_bucket_take(&b, rate, 5, 1000000));
}

static void test_token_bucket_clock_going_back_adds_nothing(void **state) {
  (void)state;
  gn_rate rate = GN_RATE(1, 2);
  gn_token_bucket b;
  gn_token_bucket_init(&b, rate, 50000);
  assert_true(gn_token_bucket_take(&b, rate, 2, 50000));
  assert_false(gn_token_bucket_take(&b, rate, 1, 10));
  assert_false(gn_token_bucket_take(&b, rate, 1, 50999));
  assert_true(gn_token_bucket_take(&b, rate, 1, 51000));
}

static void test_token_bucket_slow_rates_are_exact(void **state) {
  (void)state;
  gn_rate rate = GN_RATE_EVERY_S(10, 1); /* one every 10 s */
  gn_token_bucket b;
  gn_token_bucket_init(&b, rate, 0);
  assert_true(gn_token_bucket_take(&b, rate, 1, 0));
  assert_false(gn_token_bucket_take(&b, rate, 1, 9999));
  assert_true(gn_token_bucket_take(&b, rate, 1, 10000));
}

static void test_ratelimit_limits_each_key_alone(void **state) {
  (void)state;
  gn_ratelimit *rl = NULL;
  assert_int_equal(gn_ratelimit_new(64, GN_RATE(1, 3), &rl), 0);
  for (int i = 0; i < 3; i++)
    assert_true(gn_ratelimit_allow(rl, "a", 1, 1, 0));
  assert_false(gn_ratelimit_allow(rl, "a", 1, 1, 0));
  assert_true(gn_ratelimit_allow(rl, "b", 1, 1, 0)); /* another key has its own */
  assert_true(gn_ratelimit_allow(rl, "a", 1, 1, 1000));
  assert_false(gn_ratelimit_allow(rl, "", 0, 1, 0));
  uint8_t big[GN_RATELIMIT_KEY_MAX + 1] = {0};
  assert_false(gn_ratelimit_allow(rl, big, sizeof(big), 1, 0));
  assert_int_equal(gn_ratelimit_count(rl), 2);
  rl = gn_ratelimit_free(rl);
  assert_null(rl);
}

/* 100,000 source keys through a table of 64 keep it at 64, and a key that
 * keeps flooding is still held (its bucket is not full, fresh ones are). */
static void test_ratelimit_table_is_bounded(void **state) {
  (void)state;
  gn_ratelimit *rl = NULL;
  assert_int_equal(gn_ratelimit_new(64, GN_RATE(1, 4), &rl), 0);
  for (int i = 0; i < 4; i++)
    assert_true(gn_ratelimit_allow(rl, "flooder", 7, 1, 0));
  for (uint32_t i = 0; i < 100000; i++) {
    /* Each passes by once, spends nothing and is full again at once. */
    assert_true(gn_ratelimit_allow(rl, &i, sizeof(i), 0, 0));
    assert_false(gn_ratelimit_allow(rl, "flooder", 7, 1, 0));
  }
  assert_true(gn_ratelimit_count(rl) <= 64);
  gn_ratelimit_free(rl);
}

static void test_backoff_doubles_up_to_max_then_forgets(void **state) {
  (void)state;
  gn_backoff *b = NULL;
  assert_int_equal(gn_backoff_new(16, 1000, 8000, &b), 0);
  assert_false(gn_backoff_refused(b, "k", 1, 0));
  assert_int_equal(gn_backoff_punish(b, "k", 1, 0), 1000);
  assert_true(gn_backoff_refused(b, "k", 1, 999));
  assert_false(gn_backoff_refused(b, "k", 1, 1000));
  assert_false(gn_backoff_refused(b, "other", 5, 500));
  assert_int_equal(gn_backoff_punish(b, "k", 1, 1000), 2000);
  assert_int_equal(gn_backoff_punish(b, "k", 1, 3000), 4000);
  assert_int_equal(gn_backoff_punish(b, "k", 1, 7000), 8000);
  assert_int_equal(gn_backoff_punish(b, "k", 1, 15000), 8000); /* capped */
  assert_true(gn_backoff_refused(b, "k", 1, 22999));
  /* Remembered until max_ms after the refusal ended (23000 + 8000). */
  assert_int_equal(gn_backoff_punish(b, "k", 1, 30999), 8000);
  assert_int_equal(gn_backoff_punish(b, "k", 1, 30999 + 8000 + 8000), 1000);
  assert_int_equal(gn_backoff_punish(b, NULL, 0, 0), 0);
  gn_backoff_free(b);
}

static void test_backoff_table_is_bounded(void **state) {
  (void)state;
  gn_backoff *b = NULL;
  assert_int_equal(gn_backoff_new(32, 60000, 3600000, &b), 0);
  for (uint32_t i = 0; i < 50000; i++)
    gn_backoff_punish(b, &i, sizeof(i), i);
  assert_true(gn_backoff_count(b) <= 32);
  assert_true(gn_backoff_count(b) >= 8);
  /* The latest offender is held and refused. */
  uint32_t last = 49999;
  assert_true(gn_backoff_refused(b, &last, sizeof(last), 50000));
  gn_backoff_free(b);
}

static void test_addr_key_host_and_prefix(void **state) {
  (void)state;
  struct sockaddr_in a = {.sin_family = AF_INET}, c = {.sin_family = AF_INET};
  struct sockaddr_in6 m = {.sin6_family = AF_INET6}, v6 = {.sin6_family = AF_INET6}, w6 = {.sin6_family = AF_INET6};
  inet_pton(AF_INET, "10.1.2.3", &a.sin_addr);
  a.sin_port = htons(1);
  inet_pton(AF_INET, "10.1.2.99", &c.sin_addr);
  c.sin_port = htons(2);
  inet_pton(AF_INET6, "::ffff:10.1.2.3", &m.sin6_addr);
  inet_pton(AF_INET6, "2001:db8:1:2::1", &v6.sin6_addr);
  inet_pton(AF_INET6, "2001:db8:1:2::2", &w6.sin6_addr);
  uint8_t ka[GN_RATELIMIT_KEY_MAX], kc[GN_RATELIMIT_KEY_MAX], km[GN_RATELIMIT_KEY_MAX];
  size_t la = gn_ratelimit_addr_key((struct sockaddr *)&a, false, ka);
  size_t lc = gn_ratelimit_addr_key((struct sockaddr *)&c, false, kc);
  size_t lm = gn_ratelimit_addr_key((struct sockaddr *)&m, false, km);
  assert_true(la > 0 && la == lc && la == lm);
  assert_memory_not_equal(ka, kc, la);
  assert_memory_equal(ka, km, la); /* mapped v4 is v4; the port is left out */
  la = gn_ratelimit_addr_key((struct sockaddr *)&a, true, ka);
  lc = gn_ratelimit_addr_key((struct sockaddr *)&c, true, kc);
  assert_memory_equal(ka, kc, la); /* one /24 */
  size_t l6 = gn_ratelimit_addr_key((struct sockaddr *)&v6, false, ka);
  size_t w = gn_ratelimit_addr_key((struct sockaddr *)&w6, false, kc);
  assert_true(l6 == w);
  assert_memory_not_equal(ka, kc, l6);
  l6 = gn_ratelimit_addr_key((struct sockaddr *)&v6, true, ka);
  gn_ratelimit_addr_key((struct sockaddr *)&w6, true, kc);
  assert_memory_equal(ka, kc, l6); /* one /64 */
  struct sockaddr other = {.sa_family = AF_UNIX};
  assert_int_equal(gn_ratelimit_addr_key(&other, false, ka), 0);
}

/* Every type a session carries has a class of its own kind; only types this
 * version does not know (and SWIM's datagrams) fall to "other". */
static void test_rate_class_covers_every_session_type(void **state) {
  (void)state;
  for (uint32_t t = 0; t < 256; t++) {
    int c = gn__rate_class_of(t);
    assert_non_null(gn__rate_class_get(c));
    bool known = gn_msg_type_name(t) != NULL || (t >= GN_MSG_ATTEST_CHALLENGE && t <= GN_MSG_ATTEST_MEM_RESULT);
    bool swim = t >= GN_MSG_SWIM_PING && t <= GN_MSG_SWIM_NACK;
    if (known && !swim)
      assert_int_not_equal(c, GN__RC_OTHER);
    if (!known)
      assert_int_equal(c, GN__RC_OTHER);
  }
  assert_int_equal(gn__rate_class_of(GN_MSG_JOB_LOG), GN__RC_BULK);
  assert_int_equal(gn__rate_class_of(GN_MSG_DEBIT_NOTE), GN__RC_CONTROL);
  assert_int_equal(gn__rate_class_of(GN_MSG_OFFER_DIGEST), GN__RC_GOSSIP);
  assert_int_equal(gn__rate_class_of(GN_MSG_VIEW_SHUFFLE_REPLY), GN__RC_VIEW);
  assert_int_equal(gn__rate_class_of(GN_MSG_RELAY_CALL), GN__RC_NAT);
  /* a bulk message costs a token per started 64 KiB (8 MiB: 129), any
   * other one token */
  assert_int_equal(gn__rate_cost(GN__RC_BULK, GN_MSG_MAX), 129);
  assert_int_equal(gn__rate_cost(GN__RC_BULK, 100), 1);
  assert_int_equal(gn__rate_cost(GN__RC_ATTEST, GN_MSG_MAX), 1);
  assert_int_equal(gn__rate_cost(GN__RC_CONTROL, 100), 1);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_token_bucket_allows_burst_then_rate),
      cmocka_unit_test(test_token_bucket_clock_going_back_adds_nothing),
      cmocka_unit_test(test_token_bucket_slow_rates_are_exact),
      cmocka_unit_test(test_ratelimit_limits_each_key_alone),
      cmocka_unit_test(test_ratelimit_table_is_bounded),
      cmocka_unit_test(test_backoff_doubles_up_to_max_then_forgets),
      cmocka_unit_test(test_backoff_table_is_bounded),
      cmocka_unit_test(test_addr_key_host_and_prefix),
      cmocka_unit_test(test_rate_class_covers_every_session_type),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
