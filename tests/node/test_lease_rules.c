/* The provider's lease acceptance rules (provider.c, docs/protocol.md),
 * against a real gpunetd with a simulated GPU: each rule refuses a request
 * that breaks it with its own reason, and a request within every rule is
 * accepted. This test is the requester, over a real Noise session.
 *
 * And the requester's rules when an agreement arrives (requester.c,
 * on_lease_accept), against a real requester gpunetd: this test is then the
 * provider, and answers the daemon's rent with an agreement whose terms are
 * not the request the daemon signed (another max_s, a price above its
 * --max-price: both re-signed with the daemon's own key, which the test
 * wrote), or that grants fewer GPUs than asked. Each is refused: the rent
 * fails saying why, no lease is made, the provider is told to release it
 * (or, for an agreement that does not verify, it is ignored) and a debit
 * note for it is never countersigned. An honest agreement is the control. */
#include <gpunet/billing.h>
#include <gpunet/identity.h>
#include <gpunet/offer.h>
#include <gpunet/transport.h>
#include <gpunet/wire.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
/* cmocka needs the above first. */
#include <cmocka.h>

#include <curl/curl.h>
#include <jansson.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
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
  tn_link link;
} W;

/* A provider gpunetd on dir listening at addr: a simulated RTX 4090 at
 * 0.40 EUR an hour, for up to 2 hours, billed every 10 to 600 s. */
static pid_t spawn_provider(const char *dir, const char *addr) {
  return tn_daemon_spawn(dir, "w", "--data-dir", dir, "--listen", addr, "--provide", "--simulate-gpu", "RTX 4090",
                         "--price", "0.40", "--max-hours", "2", "--interval-min-s", "10", "--interval-max-s", "600",
                         "--allow-no-userns", (char *)NULL);
}

static int setup(void **state) {
  (void)state;
  memset(&W, 0, sizeof W);
  snprintf(W.dir, sizeof W.dir, "/tmp/gn-rules-XXXXXX");
  assert_non_null(mkdtemp(W.dir));
  tn_identity_for(W.dir, &W.prov_id);
  snprintf(W.addr, sizeof W.addr, "127.0.0.1:%d", tn_free_port());
  W.daemon = spawn_provider(W.dir, W.addr);
  uv_loop_init(&W.loop);
  W.link = (tn_link){&W.up, &W.in, NULL};
  tn_peer_new(&W.loop, &W.link, &W.req_id, &W.tp);
  tn_dial(&W.loop, W.tp, W.addr, &W.up, NULL);
  return 0;
}

static int teardown(void **state) {
  (void)state;
  int rc = tn_world_end(&W.loop, &W.tp, 1, W.daemon, &W.in, W.dir);
  W.prov_id = gn_identity_free(W.prov_id);
  W.req_id = gn_identity_free(W.req_id);
  return rc;
}

/* Sends the request to prov and returns the provider's answer type; the
 * reason of a rejection goes to reason (256 bytes). */
static uint32_t ask_to(const gn_identity *prov, const gn_lease_terms *t, char *reason) {
  gn_buf env = {0};
  tn_msg m;
  reason[0] = 0;
  assert_int_equal(gn_lease_request_seal(W.req_id, t, &env), 0);
  assert_int_equal(gn_transport_send(W.tp, prov->pk, env.data, env.len), 0);
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

static uint32_t ask(const gn_lease_terms *t, char *reason) {
  return ask_to(W.prov_id, t, reason);
}

/* The first host uid of the range the daemon in dir logged for lease id, or
 * -1 when it logged none. */
static long logged_uid_base(const char *dir, const char *id) {
  char path[PATH_MAX + 32], line[2048], want[128];
  snprintf(path, sizeof path, "%s/gpunetd.log", dir);
  snprintf(want, sizeof want, "lease %s: its jobs run as host uids and gids ", id);
  FILE *f = fopen(path, "r");
  long base = -1;
  while (f && base < 0 && fgets(line, sizeof line, f)) {
    const char *p = strstr(line, want);
    if (p)
      base = strtol(p + strlen(want), NULL, 10);
  }
  if (f)
    fclose(f);
  return base;
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

/* Issue 6: two leases never share a host uid, also when they are two
 * gpunetd's on one host (each used to number its slots from 0, so both
 * first leases ran as 1048576...). A second provider daemon runs beside the
 * first; each grants a lease; the uid ranges they log differ. The slots are
 * claimed in the default, host-wide directory (node/uidalloc.h): other
 * daemons on the host may hold slots too, which changes which ones these get
 * but never lets them be the same. */
static void test_two_providers_on_a_host_never_share_uids(void **state) {
  (void)state;
  char dir2[PATH_MAX], addr2[64], reason[256];
  gn_identity *prov2 = NULL;
  snprintf(dir2, sizeof dir2, "/tmp/gn-rules-2-XXXXXX");
  assert_non_null(mkdtemp(dir2));
  tn_identity_for(dir2, &prov2);
  snprintf(addr2, sizeof addr2, "127.0.0.1:%d", tn_free_port());
  pid_t d2 = spawn_provider(dir2, addr2);
  W.up = 0;
  tn_dial(&W.loop, W.tp, addr2, &W.up, dir2);
  gn_lease_terms t1, t2;
  tn_lease_terms(&t1, W.prov_id, W.req_id, 1, true);
  tn_lease_terms(&t2, prov2, W.req_id, 1, true);
  assert_int_equal(ask_to(W.prov_id, &t1, reason), GN_MSG_LEASE_ACCEPT);
  assert_int_equal(ask_to(prov2, &t2, reason), GN_MSG_LEASE_ACCEPT);
  long b1 = logged_uid_base(W.dir, t1.lease_id), b2 = logged_uid_base(dir2, t2.lease_id);
  tn_daemon_stop(d2);
  assert_int_equal(tn_rm_rf(dir2), 0);
  prov2 = gn_identity_free(prov2);
  if (b1 < 0 && b2 < 0) {
    print_message("skipped: these daemons run jobs without user namespaces here (no uid ranges)\n");
    skip();
  }
  if (b1 < 0 || b2 < 0)
    fail_msg("only one provider logged a uid range (%ld, %ld)", b1, b2);
  if (b1 == b2)
    fail_msg("two providers on one host gave their leases the same host uids from %ld", b1);
  print_message("two providers on one host: their leases' jobs run as host uids from %ld and from %ld\n", b1, b2);
  assert_true(b1 >= 1048576 && b2 >= 1048576 && (b1 - 1048576) % 65536 == 0 && (b2 - 1048576) % 65536 == 0);
}

/* --- the requester's rules for an arriving agreement --------------------------*/

/* The requester daemon and this test as its provider P. */
static struct {
  char dir[PATH_MAX];
  char sock[PATH_MAX + 16];
  char addr[64];
  pid_t daemon;
  uv_loop_t loop;
  gn_identity *req_id, *p_id;
  gn_transport *tp;
  int up;
  tn_inbox in;
  tn_link link;
  char offer[GN_OFFER_ID_STRLEN];
} Q;

typedef tn_call call;

static void q_call_start(call *c, const char *path, const char *body) {
  tn_call_start(c, Q.sock, path, body);
}

/* Keeps the test's loop (P) running until the call returns. */
static void q_call_finish(call *c) {
  tn_call_finish(&Q.loop, c, 20000);
}

/* The daemon's leases (the caller decrefs). */
static json_t *q_leases(void) {
  call c;
  q_call_start(&c, "/v1/leases", NULL);
  q_call_finish(&c);
  assert_int_equal(c.status, 200);
  json_t *o = json_loads((const char *)c.out.data, 0, NULL);
  assert_non_null(o);
  gn_buf_done(&c.out);
  return o;
}

static bool q_has_lease(const char *id) {
  json_t *o = q_leases(), *l;
  size_t i;
  bool found = false;
  json_array_foreach(json_object_get(o, "leases"), i, l) {
    if (strcmp(json_string_value(json_object_get(l, "id")), id) == 0)
      found = true;
  }
  json_decref(o);
  return found;
}

/* P's offer of two simulated RTX 4090s at 0.40 EUR, at P's address. */
static void q_offer(void) {
  gn_offer o;
  gn_buf env = {0};
  tn_offer(&o, Q.p_id->pk, gn_transport_listen_addr(Q.tp), 2, 120, true);
  gn_offer_id(&o, Q.offer);
  assert_int_equal(gn_offer_seal(Q.p_id, &o, &env), 0);
  assert_int_equal(gn_transport_send(Q.tp, Q.req_id->pk, env.data, env.len), 0);
  gn_buf_done(&env);
  bool seen = false;
  for (int i = 0; i < 50 && !seen; i++) {
    json_t *t;
    call c;
    q_call_start(&c, "/v1/offers", NULL);
    q_call_finish(&c);
    t = json_loads((const char *)c.out.data, 0, NULL);
    gn_buf_done(&c.out);
    json_t *e;
    size_t k;
    json_array_foreach(json_object_get(t, "offers"), k, e) {
      const char *id = json_string_value(json_object_get(e, "id"));
      if (id && strcmp(id, Q.offer) == 0)
        seen = true;
    }
    json_decref(t);
    if (!seen)
      tn_run_until_flag(&Q.loop, &(int){0}, 100);
  }
  assert_true(seen);
}

static int q_setup(void **state) {
  (void)state;
  memset(&Q, 0, sizeof Q);
  snprintf(Q.dir, sizeof Q.dir, "/tmp/gn-rules-req-XXXXXX");
  assert_non_null(mkdtemp(Q.dir));
  tn_identity_for(Q.dir, &Q.req_id); /* the daemon's key: this test can sign as the requester */
  snprintf(Q.addr, sizeof Q.addr, "127.0.0.1:%d", tn_free_port());
  snprintf(Q.sock, sizeof Q.sock, "%s/gpunetd.sock", Q.dir);
  static const char *const env[] = {"GN_RENT_TIMEOUT_MS=3000", NULL};
  Q.daemon = tn_daemon_spawnv(Q.dir, "w", env, (const char *const[]){"--data-dir", Q.dir, "--listen", Q.addr, NULL});
  uv_loop_init(&Q.loop);
  Q.link = (tn_link){&Q.up, &Q.in, NULL};
  tn_peer_new(&Q.loop, &Q.link, &Q.p_id, &Q.tp);
  assert_int_equal(gn_transport_listen(Q.tp, "127.0.0.1:0"), 0);
  tn_dial(&Q.loop, Q.tp, Q.addr, &Q.up, NULL);
  for (int i = 0; i < 50 && access(Q.sock, F_OK) != 0; i++)
    usleep(100000);
  q_offer();
  return 0;
}

static int q_teardown(void **state) {
  (void)state;
  int rc = tn_world_end(&Q.loop, &Q.tp, 1, Q.daemon, &Q.in, Q.dir);
  Q.req_id = gn_identity_free(Q.req_id);
  Q.p_id = gn_identity_free(Q.p_id);
  return rc;
}

enum { A_HONEST, A_OTHER_MAX_S, A_PRICE_ABOVE_MAX, A_FEWER_GPUS };

/* An agreement with only the GPUs given, whatever the request asked for
 * (gn_agreement_seal refuses to make one). */
static void q_seal_raw_agreement(const uint8_t *req, size_t req_len, const char *const *gpus, uint32_t n, gn_buf *ret) {
  gn_wire_writer w;
  gn_buf body = {0};
  gn_wire_writer_init(&w);
  gn_wire_put_map(&w, 3);
  gn_wire_put_str(&w, "request");
  gn_wire_put_bin(&w, req, req_len);
  gn_wire_put_str(&w, "start_s");
  gn_wire_put_i64(&w, gn_unix_s());
  gn_wire_put_str(&w, "gpus");
  gn_wire_put_array(&w, n);
  for (uint32_t i = 0; i < n; i++)
    gn_wire_put_str(&w, gpus[i]);
  assert_int_equal(gn_wire_writer_take(&w, &body), 0);
  gn_wire_writer_done(&w);
  assert_int_equal(gn_envelope_seal(Q.p_id, GN_MSG_LEASE_ACCEPT, body.data, body.len, ret), 0);
  gn_buf_done(&body);
}

/* Rents P's offer (2 GPUs, --max-price 0.50) and answers the daemon's
 * request with the agreement `kind` makes; returns the rent's answer in c
 * (the caller frees c->out), the lease id and the agreement sent. */
static void q_rent(int kind, call *c, char lease_id[GN_LEASE_ID_STRLEN], gn_buf *ret_ag) {
  char body[512];
  tn_msg m;
  static const char *const gpus[] = {"GPU-sim-0", "GPU-sim-1"};
  snprintf(body, sizeof body,
           "{\"offer\": \"%s\", \"hours\": 1, \"count\": 2, \"attest\": false, \"allow_simulated\": true, "
           "\"max_price_uper_hour\": 500000}",
           Q.offer);
  q_call_start(c, "/v1/leases", body);
  assert_true(tn_wait_msg(&Q.loop, &Q.in, GN_MSG_LEASE_REQUEST, tn_call_done, c, 10000, &m));
  gn_lease_terms t;
  assert_int_equal(gn_lease_request_open(m.raw.data, m.raw.len, &t), 0);
  assert_int_equal(t.count, 2);
  assert_int_equal(t.price_uper_hour, 400000);
  snprintf(lease_id, GN_LEASE_ID_STRLEN, "%s", t.lease_id);
  gn_buf req = {0};
  switch (kind) {
  case A_HONEST:
    assert_int_equal(gn_agreement_seal(Q.p_id, m.raw.data, m.raw.len, gn_unix_s(), gpus, 2, ret_ag), 0);
    break;
  case A_OTHER_MAX_S:
  case A_PRICE_ABOVE_MAX:
    /* The same lease id and nonce, other terms, signed with the daemon's
     * own key: the signatures verify, the terms are not what it asked. */
    if (kind == A_OTHER_MAX_S)
      t.max_s = 7200;
    else
      t.price_uper_hour = 600000;
    assert_int_equal(gn_lease_request_seal(Q.req_id, &t, &req), 0);
    assert_int_equal(gn_agreement_seal(Q.p_id, req.data, req.len, gn_unix_s(), gpus, 2, ret_ag), 0);
    break;
  case A_FEWER_GPUS:
    q_seal_raw_agreement(m.raw.data, m.raw.len, gpus, 1, ret_ag);
    break;
  }
  assert_int_equal(gn_transport_send(Q.tp, Q.req_id->pk, ret_ag->data, ret_ag->len), 0);
  q_call_finish(c);
  gn_buf_done(&req);
  gn_buf_done(&m.raw);
}

/* A debit note of 10 seconds for agreement ag: the daemon must never
 * countersign it (it holds no such lease). */
static void q_expect_note_not_accepted(const gn_buf *ag) {
  gn_bill_head head, next;
  gn_buf note = {0};
  uint8_t ticks[20];
  tn_msg m;
  for (int i = 0; i < 10; i++) {
    ticks[2 * i] = 2;
    ticks[2 * i + 1] = 50;
  }
  assert_int_equal(gn_bill_head_init(ag->data, ag->len, &head), 0);
  assert_int_equal(gn_bill_note_seal(Q.p_id, ag->data, ag->len, &head, ticks, 10, gn_unix_s(), &note, &next), 0);
  assert_int_equal(gn_transport_send(Q.tp, Q.req_id->pk, note.data, note.len), 0);
  assert_false(tn_wait_msg(&Q.loop, &Q.in, GN_MSG_DEBIT_ACCEPT, NULL, NULL, 1500, &m));
  gn_buf_done(&note);
}

static void test_requester_takes_an_honest_agreement(void **state) {
  (void)state;
  call c;
  char id[GN_LEASE_ID_STRLEN];
  gn_buf ag = {0};
  q_rent(A_HONEST, &c, id, &ag);
  if (c.status != 201)
    fail_msg("an honest agreement was not taken: %ld %s", c.status, (const char *)c.out.data);
  assert_true(q_has_lease(id));
  gn_buf_done(&c.out);
  gn_buf_done(&ag);
}

static void test_requester_refuses_agreement_not_its_request(void **state) {
  (void)state;
  static const struct {
    int kind;
    const char *what;
  } cases[] = {
      {A_OTHER_MAX_S, "another max_s"},
      /* The price is one of the signed terms: an agreement above --max-price
       * cannot embed the request the daemon signed (rent refuses an offer
       * above it before asking). */
      {A_PRICE_ABOVE_MAX, "a price above --max-price"},
  };
  for (size_t i = 0; i < GN_ARRAY_SIZE(cases); i++) {
    call c;
    char id[GN_LEASE_ID_STRLEN];
    gn_buf ag = {0};
    tn_msg m;
    q_rent(cases[i].kind, &c, id, &ag);
    const char *out = (const char *)c.out.data;
    if (c.status != 502 || !strstr(out, "is refused: it does not embed the request this node signed"))
      fail_msg("%s: the rent answered %ld: %s", cases[i].what, c.status, out);
    assert_false(q_has_lease(id));
    /* The provider is told at once, so that it stops metering. */
    assert_true(tn_wait_msg(&Q.loop, &Q.in, GN_MSG_LEASE_RELEASE, NULL, NULL, 5000, &m));
    char rid[GN_LEASE_ID_STRLEN];
    tn_msg_str(&m, "lease_id", rid, sizeof rid);
    assert_string_equal(rid, id);
    gn_buf_done(&m.raw);
    q_expect_note_not_accepted(&ag);
    assert_false(q_has_lease(id));
    gn_buf_done(&c.out);
    gn_buf_done(&ag);
  }
  assert_true(tn_log_has(Q.dir, "refusing the provider's acceptance of lease"));
}

static void test_requester_refuses_fewer_gpus_than_asked(void **state) {
  (void)state;
  call c;
  char id[GN_LEASE_ID_STRLEN];
  gn_buf ag = {0};
  q_rent(A_FEWER_GPUS, &c, id, &ag);
  /* Such an agreement does not verify (it grants 1 of the 2 GPUs the
   * embedded request asks for): it is ignored, the rent fails at its
   * timeout, no lease is made and no bill of it can be answered. */
  if (c.status == 201 || c.status == 0)
    fail_msg("an agreement for 1 of 2 GPUs: the rent answered %ld: %s", c.status, (const char *)c.out.data);
  assert_false(q_has_lease(id));
  assert_true(tn_log_has(Q.dir, "lease acceptance does not verify"));
  gn_bill_head head;
  assert_true(gn_bill_head_init(ag.data, ag.len, &head) < 0);
  gn_buf_done(&c.out);
  gn_buf_done(&ag);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_lease_rules_each_refused_with_its_reason, setup, teardown),
      cmocka_unit_test_setup_teardown(test_lease_rules_edges_accepted, setup, teardown),
      cmocka_unit_test_setup_teardown(test_two_providers_on_a_host_never_share_uids, setup, teardown),
      cmocka_unit_test_setup_teardown(test_requester_takes_an_honest_agreement, q_setup, q_teardown),
      cmocka_unit_test_setup_teardown(test_requester_refuses_agreement_not_its_request, q_setup, q_teardown),
      cmocka_unit_test_setup_teardown(test_requester_refuses_fewer_gpus_than_asked, q_setup, q_teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
