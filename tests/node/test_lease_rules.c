/* The provider's lease acceptance rules (provider.c, docs/protocol.md),
 * against a real gpunetd with a simulated GPU: each rule refuses a request
 * that breaks it with its own reason, and a request within every rule is
 * accepted. This test is the requester, over a real Noise session. */
#include <gpunet/billing.h>
#include <gpunet/identity.h>
#include <gpunet/transport.h>
#include <gpunet/wire.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
/* cmocka needs the above first. */
#include <cmocka.h>

#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "node/helpers.h"

static struct {
  char dir[PATH_MAX];
  char addr[64];
  pid_t daemon;
  uv_loop_t loop;
  gn_identity *prov_id, *req_id;
  gn_transport *tp;
  int up;
  tn_inbox in;
} W;

static void on_up(gn_transport *t, const uint8_t peer[GN_PK_LEN], const char *addr, void *ud) {
  (void)t;
  (void)peer;
  (void)addr;
  (void)ud;
  W.up = 1;
}

static void on_down(gn_transport *t, const uint8_t peer[GN_PK_LEN], void *ud) {
  (void)t;
  (void)peer;
  (void)ud;
  W.up = 0;
}

static void on_msg(gn_transport *t, const uint8_t peer[GN_PK_LEN], const gn_envelope *env, const uint8_t *raw,
                   size_t len, void *ud) {
  (void)t;
  (void)ud;
  tn_inbox_add(&W.in, peer, env, raw, len);
}

static int setup(void **state) {
  (void)state;
  memset(&W, 0, sizeof W);
  snprintf(W.dir, sizeof W.dir, "/tmp/gn-rules-XXXXXX");
  assert_non_null(mkdtemp(W.dir));
  char bin[PATH_MAX];
  tn_gpunetd_path(bin, sizeof bin);
  tn_identity_for(W.dir, &W.prov_id);
  snprintf(W.addr, sizeof W.addr, "127.0.0.1:%d", tn_free_port());
  W.daemon = fork();
  assert_true(W.daemon >= 0);
  if (W.daemon == 0) {
    char log[PATH_MAX + 32];
    snprintf(log, sizeof log, "%s/gpunetd.log", W.dir);
    if (!freopen(log, "w", stderr))
      _exit(127);
    execl(bin, bin, "--data-dir", W.dir, "--listen", W.addr, "--provide", "--simulate-gpu", "RTX 4090", "--price",
          "0.40", "--max-hours", "2", "--interval-min-s", "10", "--interval-max-s", "600", "--allow-no-userns",
          (char *)NULL);
    _exit(127);
  }
  uv_loop_init(&W.loop);
  gn_transport_cbs cbs = {.on_peer_up = on_up, .on_peer_down = on_down, .on_message = on_msg};
  assert_int_equal(gn_identity_generate(&W.req_id), 0);
  assert_int_equal(gn_transport_new(&W.loop, W.req_id, &cbs, NULL, &W.tp), 0);
  for (int i = 0; i < 50 && !W.up; i++) {
    usleep(100000);
    gn_transport_connect(W.tp, W.addr);
    tn_run_until_flag(&W.loop, &W.up, 300);
  }
  assert_true(W.up);
  return 0;
}

static int teardown(void **state) {
  (void)state;
  int rc = tn_world_end(&W.loop, &W.tp, 1, W.daemon, &W.in, W.dir);
  W.prov_id = gn_identity_free(W.prov_id);
  W.req_id = gn_identity_free(W.req_id);
  return rc;
}

/* Sends the request and returns the provider's answer type; the reason of
 * a rejection goes to reason (256 bytes). */
static uint32_t ask(const gn_lease_terms *t, char *reason) {
  gn_buf env = {0};
  tn_msg m;
  reason[0] = 0;
  assert_int_equal(gn_lease_request_seal(W.req_id, t, &env), 0);
  assert_int_equal(gn_transport_send(W.tp, W.prov_id->pk, env.data, env.len), 0);
  gn_buf_done(&env);
  for (int i = 0; i < 100; i++) {
    if (tn_inbox_take(&W.in, GN_MSG_LEASE_REJECT, &m)) {
      tn_msg_str(&m, "reason", reason, 256);
      gn_buf_done(&m.raw);
      return GN_MSG_LEASE_REJECT;
    }
    if (tn_inbox_take(&W.in, GN_MSG_LEASE_ACCEPT, &m)) {
      gn_buf_done(&m.raw);
      return GN_MSG_LEASE_ACCEPT;
    }
    tn_run_until_flag(&W.loop, &(int){0}, 50);
  }
  fail_msg("the provider did not answer lease request %s", t->lease_id);
  return 0;
}

enum {
  F_NONE,
  F_CLOCK_PAST,
  F_CLOCK_FUTURE,
  F_MAX_S,
  F_MODEL_CASE,
  F_MODEL_PREFIX,
  F_PRICE,
  F_CURRENCY,
  F_INT_LOW,
  F_INT_HIGH
};

static void test_lease_rules_each_refused_with_its_reason(void **state) {
  (void)state;
  static const struct {
    int fault;
    const char *reason;
  } cases[] = {
      {F_CLOCK_PAST, "more than 5 minutes off this provider's clock"},
      {F_CLOCK_FUTURE, "more than 5 minutes off this provider's clock"},
      {F_MAX_S, "duration must be between 1 second and 2 hours"},
      {F_MODEL_CASE, "no nvidia geforce rtx 4090 here"},
      {F_MODEL_PREFIX, "no NVIDIA GeForce RTX 409 here"},
      {F_PRICE, "price below this provider's 0.400000 EUR"},
      /* A cheaper price in another currency: the currency is the reason. */
      {F_CURRENCY, "currency USD is not this provider's: it bills in EUR"},
      {F_INT_LOW, "billing interval 9s is outside this provider's 10..600s"},
      {F_INT_HIGH, "billing interval 601s is outside this provider's 10..600s"},
  };
  for (size_t i = 0; i < GN_ARRAY_SIZE(cases); i++) {
    gn_lease_terms t;
    char reason[256];
    tn_lease_terms(&t, W.prov_id, W.req_id, 1, true);
    switch (cases[i].fault) {
    case F_CLOCK_PAST:
      t.requested_s -= 301 + 5;
      break;
    case F_CLOCK_FUTURE:
      t.requested_s += 301 + 5;
      break;
    case F_MAX_S:
      t.max_s = 2 * 3600 + 1;
      break;
    case F_MODEL_CASE:
      snprintf(t.gpu_model, sizeof t.gpu_model, "nvidia geforce rtx 4090");
      break;
    case F_MODEL_PREFIX:
      snprintf(t.gpu_model, sizeof t.gpu_model, "NVIDIA GeForce RTX 409");
      break;
    case F_PRICE:
      t.price_uper_hour = 399999;
      break;
    case F_CURRENCY:
      snprintf(t.currency, sizeof t.currency, "USD");
      t.price_uper_hour = 100000;
      break;
    case F_INT_LOW:
      t.interval_s = 9;
      break;
    case F_INT_HIGH:
      t.interval_s = 601;
      break;
    }
    uint32_t got = ask(&t, reason);
    if (got != GN_MSG_LEASE_REJECT)
      fail_msg("case %zu: the provider accepted a request that breaks a rule (%s)", i, cases[i].reason);
    if (!strstr(reason, cases[i].reason))
      fail_msg("case %zu: reason '%s' does not say '%s'", i, reason, cases[i].reason);
  }
}

/* The edges of every window are inside it: the request is accepted. */
static void test_lease_rules_edges_accepted(void **state) {
  (void)state;
  gn_lease_terms t;
  char reason[256];
  tn_lease_terms(&t, W.prov_id, W.req_id, 1, true);
  t.requested_s -= 290; /* within the window, a few seconds of slack for a slow run */
  t.max_s = 2 * 3600;
  t.interval_s = 10;
  t.price_uper_hour = 400000;
  if (ask(&t, reason) != GN_MSG_LEASE_ACCEPT)
    fail_msg("a request within every rule was refused: %s", reason);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_lease_rules_each_refused_with_its_reason, setup, teardown),
      cmocka_unit_test_setup_teardown(test_lease_rules_edges_accepted, setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
