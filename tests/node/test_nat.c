/* Tests of gpunetd's home networks (node/nat.c, docs/nat.md) against a real
 * daemon that volunteers as a relay, with played peers: the address it
 * tells a peer it sees, the slots it grants (bounded per network, only to a
 * peer whose datagrams it has seen), a caller's flood of calls, a splice
 * that paces bytes over its budget, and a splice connection with a token
 * nobody was given. Each attack is a test; the relay's limits are made
 * small (8 pairs, 64 KiB/s a pair) so that they show. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "node/helpers.h"

#include <gpunet/nat.h>
#include <gpunet/relay.h>

#include <poll.h>
#include <sys/stat.h>

#define DEADLINE_MS 30000
#define PAIR_RATE 65536

static struct {
  char dir[PATH_MAX];
  char addr[64];
  int port;
  pid_t pid;
  gn_identity *id;
  uv_loop_t loop;
} W;

static void sleep_ms(unsigned ms) {
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

static int group_setup(void **state) {
  (void)state;
  snprintf(W.dir, sizeof W.dir, "/tmp/gn-test-nat-XXXXXX");
  assert_non_null(mkdtemp(W.dir));
  tn_identity_for(W.dir, &W.id);
  W.port = tn_free_port();
  snprintf(W.addr, sizeof W.addr, "127.0.0.5:%d", W.port);
  char rate[16];
  snprintf(rate, sizeof rate, "%d", PAIR_RATE);
  W.pid = tn_daemon_spawn(W.dir, "w", "--data-dir", W.dir, "--listen", W.addr, "--no-training", "--relay", "on",
                          "--relay-sessions", "8", "--relay-pair-rate", rate, (char *)NULL);
  uint64_t end = gn_mono_ms() + DEADLINE_MS;
  json_t *j = NULL;
  while (!(j = tn_api_try_get(W.dir, "/v1/nat")) && gn_mono_ms() < end)
    sleep_ms(100);
  if (!j) {
    tn_print_log(W.dir, 30);
    fail_msg("gpunetd did not answer GET /v1/nat");
  }
  json_decref(j);
  assert_int_equal(uv_loop_init(&W.loop), 0);
  return 0;
}

static int group_teardown(void **state) {
  (void)state;
  uv_run(&W.loop, UV_RUN_NOWAIT);
  uv_loop_close(&W.loop);
  tn_daemon_stop(W.pid);
  W.id = gn_identity_free(W.id);
  tn_rm_rf(W.dir);
  return 0;
}

/* --- played peers -------------------------------------------------------------*/

typedef struct peer {
  gn_identity *id;
  gn_transport *tp;
  tn_inbox in;
  tn_link link;
  int up;
} peer;

static void peer_up(peer *p) {
  memset(p, 0, sizeof *p);
  p->link = (tn_link){&p->up, &p->in, NULL};
  tn_peer_new(&W.loop, &p->link, &p->id, &p->tp);
  tn_dial(&W.loop, p->tp, W.addr, &p->up, W.dir);
}

static void peers_done(peer *ps, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (ps[i].tp)
      gn_transport_close(ps[i].tp, NULL, NULL);
  uv_run(&W.loop, UV_RUN_DEFAULT);
  for (size_t i = 0; i < n; i++) {
    tn_inbox_done(&ps[i].in);
    ps[i].id = gn_identity_free(ps[i].id);
    ps[i].tp = NULL;
  }
}

/* p asks the daemon, from a UDP socket on ip, where it sees it: the signed
 * answer's address, or "" when none came. */
static void ask_from(const peer *p, const char *ip, char *ret_addr, size_t cap) {
  int fd = socket(AF_INET, SOCK_DGRAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET}, to = {.sin_family = AF_INET, .sin_port = htons((uint16_t)W.port)};
  assert_true(fd >= 0);
  assert_int_equal(inet_pton(AF_INET, ip, &a.sin_addr), 1);
  assert_int_equal(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
  assert_int_equal(inet_pton(AF_INET, "127.0.0.5", &to.sin_addr), 1);
  gn_nat_observed q = {.answer = false};
  randombytes_buf(q.nonce, sizeof q.nonce);
  gn_buf body = {0}, env = {0};
  assert_int_equal(gn_nat_observed_encode(&q, &body), 0);
  assert_int_equal(gn_envelope_seal(p->id, GN_MSG_NAT_OBSERVED, body.data, body.len, &env), 0);
  ret_addr[0] = '\0';
  uint8_t buf[2048];
  for (int tries = 0; tries < 10 && !ret_addr[0]; tries++) {
    assert_int_equal(sendto(fd, env.data, env.len, 0, (struct sockaddr *)&to, sizeof to), (ssize_t)env.len);
    struct pollfd pfd = {fd, POLLIN, 0};
    if (poll(&pfd, 1, 1000) <= 0)
      continue;
    ssize_t n = recv(fd, buf, sizeof buf, 0);
    gn_envelope e;
    gn_nat_observed ans;
    if (n > 0 && gn_envelope_open(buf, (size_t)n, &e) == 0 && e.type == GN_MSG_NAT_OBSERVED &&
        memcmp(e.signer, W.id->pk, GN_PK_LEN) == 0 && gn_nat_observed_decode(e.body, e.body_len, &ans) == 0 &&
        ans.answer && memcmp(ans.nonce, q.nonce, sizeof q.nonce) == 0)
      snprintf(ret_addr, cap, "%s", ans.addr);
  }
  gn_buf_done(&body);
  gn_buf_done(&env);
  close(fd);
}

static void send_reserve(peer *p) {
  gn_relay_reserve_msg m = {.reserve = true};
  gn_buf b = {0};
  assert_int_equal(gn_relay_reserve_encode(&m, &b), 0);
  tn_send(p->tp, p->id, GN_MSG_RELAY_RESERVE, &b, W.id->pk);
  gn_buf_done(&b);
}

static void send_call(peer *p, const uint8_t target[GN_PK_LEN]) {
  gn_relay_call_msg m = {.from_relay = false};
  memcpy(m.peer, target, GN_PK_LEN);
  gn_buf b = {0};
  assert_int_equal(gn_relay_call_encode(&m, &b), 0);
  tn_send(p->tp, p->id, GN_MSG_RELAY_CALL, &b, W.id->pk);
  gn_buf_done(&b);
}

/* The next RELAY_STATUS p got (fails the test when none comes). */
static void wait_status(peer *p, gn_relay_status_msg *ret) {
  tn_msg m;
  if (!tn_wait_msg(&W.loop, &p->in, GN_MSG_RELAY_STATUS, NULL, NULL, DEADLINE_MS, &m)) {
    tn_print_log(W.dir, 30);
    fail_msg("no RELAY_STATUS came");
  }
  gn_envelope e;
  assert_int_equal(gn_envelope_open(m.raw.data, m.raw.len, &e), 0);
  assert_int_equal(gn_relay_status_decode(e.body, e.body_len, ret), 0);
  gn_buf_done(&m.raw);
}

/* p, seen at ip, reserves a slot: whether it was granted. */
static bool reserve_from(peer *p, const char *ip) {
  char seen[GN_NAT_ADDR_MAX];
  ask_from(p, ip, seen, sizeof seen);
  assert_true(seen[0] != '\0');
  send_reserve(p);
  gn_relay_status_msg st;
  wait_status(p, &st);
  return st.ok;
}

static long long relay_figure(const char *key) {
  json_t *j = tn_api_get(W.dir, "/v1/nat");
  json_t *v = json_object_get(json_object_get(j, "relay"), key);
  long long x = json_is_integer(v) ? json_integer_value(v) : -1;
  json_decref(j);
  return x;
}

/* --- tests ---------------------------------------------------------------------*/

/* The answer to "where do you see me" is signed by the daemon and names the
 * UDP source the question came from. */
static void test_observed_address_is_the_source(void **state) {
  (void)state;
  peer p = {0};
  assert_int_equal(gn_identity_generate(&p.id), 0);
  char seen[GN_NAT_ADDR_MAX];
  ask_from(&p, "127.0.0.8", seen, sizeof seen);
  assert_true(strncmp(seen, "127.0.0.8:", 10) == 0);
  p.id = gn_identity_free(p.id);
}

/* A slot goes only to a peer whose datagrams the relay has seen (its
 * network is what the per-network bound counts). */
static void test_reservation_needs_an_observed_address(void **state) {
  (void)state;
  peer p;
  peer_up(&p);
  send_reserve(&p);
  gn_relay_status_msg st;
  wait_status(&p, &st);
  assert_false(st.ok);
  assert_non_null(strstr(st.why, "ask where you are seen first"));
  peers_done(&p, 1);
}

/* Attack: six identities from one /24 each reserve a slot: two get one;
 * a peer of another network still does. */
static void test_slot_hog_from_one_network_is_bounded(void **state) {
  (void)state;
  peer ps[7];
  int granted = 0;
  for (int i = 0; i < 6; i++) {
    peer_up(&ps[i]);
    granted += reserve_from(&ps[i], "127.0.0.9");
  }
  assert_int_equal(granted, GN_RELAY_PER_NET);
  peer_up(&ps[6]);
  assert_true(reserve_from(&ps[6], "127.1.0.9"));
  assert_int_equal(relay_figure("reservations"), GN_RELAY_PER_NET + 1);
  assert_true(relay_figure("reserve_refused") >= 4);
  peers_done(ps, 7);
}

/* Attack: a caller floods the relay with calls to a reserved peer: the
 * first GN_RELAY_CALL_BURST are put through, the rest refused, and the
 * target is called only that often. */
static void test_call_flood_is_bounded(void **state) {
  (void)state;
  peer target, caller;
  peer_up(&target);
  assert_true(reserve_from(&target, "127.2.0.9"));
  peer_up(&caller);
  long long refused0 = relay_figure("calls_refused");
  /* 12: within the session's own rate for these messages (the transport's
   * "other" class, a burst of 16), so the relay's limit is what shows. */
  for (int i = 0; i < 12; i++)
    send_call(&caller, target.id->pk);
  int ok = 0;
  for (int i = 0; i < 12; i++) {
    gn_relay_status_msg st;
    wait_status(&caller, &st);
    assert_true(st.has_call);
    ok += st.ok;
  }
  assert_int_equal(ok, GN_RELAY_CALL_BURST);
  assert_int_equal(relay_figure("calls_refused") - refused0, 12 - GN_RELAY_CALL_BURST);
  int calls = 0;
  tn_msg m;
  while (tn_wait_msg(&W.loop, &target.in, GN_MSG_RELAY_CALL, NULL, NULL, calls < ok ? DEADLINE_MS : 300, &m)) {
    calls++;
    gn_buf_done(&m.raw);
  }
  assert_int_equal(calls, GN_RELAY_CALL_BURST);
  assert_true(relay_figure("sessions") <= 8);
  peers_done(&target, 1);
  peers_done(&caller, 1);
}

static int tcp_to(const char *addr) {
  char host[64];
  const char *colon = strrchr(addr, ':');
  assert_non_null(colon);
  snprintf(host, sizeof host, "%.*s", (int)(colon - addr), addr);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)atoi(colon + 1))};
  assert_int_equal(inet_pton(AF_INET, host, &a.sin_addr), 1);
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  assert_true(fd >= 0);
  assert_int_equal(connect(fd, (struct sockaddr *)&a, sizeof a), 0);
  return fd;
}

/* Attack: a relayed pair pushes 256 KiB through a relay that allows 64
 * KiB/s a pair: every byte arrives, in order, but no faster than the
 * budget lets (at least 2 s here). */
static void test_relayed_bytes_over_the_limit_are_paced(void **state) {
  (void)state;
  peer target, caller;
  peer_up(&target);
  assert_true(reserve_from(&target, "127.3.0.9"));
  peer_up(&caller);
  send_call(&caller, target.id->pk);
  gn_relay_status_msg st;
  wait_status(&caller, &st);
  assert_true(st.ok && st.has_call);
  tn_msg m;
  assert_true(tn_wait_msg(&W.loop, &target.in, GN_MSG_RELAY_CALL, NULL, NULL, DEADLINE_MS, &m));
  gn_envelope e;
  gn_relay_call_msg call;
  assert_int_equal(gn_envelope_open(m.raw.data, m.raw.len, &e), 0);
  assert_int_equal(gn_relay_call_decode(e.body, e.body_len, &call), 0);
  gn_buf_done(&m.raw);
  assert_true(call.from_relay);
  assert_memory_equal(call.peer, caller.id->pk, GN_PK_LEN);
  assert_string_equal(call.addr, st.addr);
  int a = tcp_to(st.addr), b = tcp_to(call.addr);
  assert_int_equal(write(a, st.token, GN_RELAY_TOKEN_LEN), GN_RELAY_TOKEN_LEN);
  assert_int_equal(write(b, call.token, GN_RELAY_TOKEN_LEN), GN_RELAY_TOKEN_LEN);
  enum { TOTAL = 256 * 1024 };
  static uint8_t out[TOTAL], in[TOTAL];
  for (size_t i = 0; i < TOTAL; i++)
    out[i] = (uint8_t)(i * 7 + 3);
  uint64_t t0 = gn_mono_ms();
  size_t sent = 0, got = 0;
  while (got < TOTAL && gn_mono_ms() < t0 + 60000) {
    struct pollfd pfd[2] = {{a, sent < TOTAL ? POLLOUT : 0, 0}, {b, POLLIN, 0}};
    if (poll(pfd, 2, 1000) <= 0)
      continue;
    if (pfd[0].revents & POLLOUT) {
      ssize_t n = write(a, out + sent, TOTAL - sent > 16384 ? 16384 : TOTAL - sent);
      assert_true(n > 0);
      sent += (size_t)n;
    }
    if (pfd[1].revents & POLLIN) {
      ssize_t n = read(b, in + got, TOTAL - got);
      assert_true(n > 0);
      got += (size_t)n;
    }
  }
  uint64_t took = gn_mono_ms() - t0;
  assert_int_equal(got, TOTAL);
  assert_memory_equal(in, out, TOTAL);
  /* A second's burst (64 KiB) passes at once, and the relay charges a read
   * after forwarding it, so one read (at most 64 KiB) may run ahead of the
   * budget: the other 128 KiB take at least 2 s at 64 KiB/s (3 s without
   * the pacing's bound would be the rate alone; unpaced it takes ms). */
  if (took < 1900)
    fail_msg("256 KiB took only %llu ms (relay: paused %lld times, %lld bytes)", (unsigned long long)took,
             relay_figure("paused"), relay_figure("bytes"));
  assert_true(relay_figure("paused") > 0);
  close(a);
  close(b);
  peers_done(&target, 1);
  peers_done(&caller, 1);
}

/* Attack: a connection to the splice port with a token nobody was given is
 * closed at once. */
static void test_unknown_token_is_closed(void **state) {
  (void)state;
  json_t *j = tn_api_get(W.dir, "/v1/nat");
  const char *splice = json_string_value(json_object_get(json_object_get(j, "relay"), "splice"));
  assert_non_null(splice);
  int fd = tcp_to(splice);
  json_decref(j);
  uint8_t tok[GN_RELAY_TOKEN_LEN];
  randombytes_buf(tok, sizeof tok);
  assert_int_equal(write(fd, tok, sizeof tok), (ssize_t)sizeof tok);
  struct pollfd pfd = {fd, POLLIN, 0};
  assert_int_equal(poll(&pfd, 1, DEADLINE_MS), 1);
  char c;
  assert_true(read(fd, &c, 1) <= 0); /* end of stream or reset */
  close(fd);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_observed_address_is_the_source),
      cmocka_unit_test(test_reservation_needs_an_observed_address),
      cmocka_unit_test(test_slot_hog_from_one_network_is_bounded),
      cmocka_unit_test(test_call_flood_is_bounded),
      cmocka_unit_test(test_relayed_bytes_over_the_limit_are_paced),
      cmocka_unit_test(test_unknown_token_is_closed),
  };
  return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
