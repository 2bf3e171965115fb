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

#include <fcntl.h>
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

/* A count in GET /v1/nat: section.key (-1 when absent). */
static long long nat_figure(const char *section, const char *key) {
  json_t *j = tn_api_get(W.dir, "/v1/nat");
  json_t *v = json_object_get(json_object_get(j, section), key);
  long long x = json_is_integer(v) ? json_integer_value(v) : -1;
  json_decref(j);
  return x;
}

static long long relay_figure(const char *key) {
  return nat_figure("relay", key);
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

/* --- reaching a NATed provider through the relay its offer names --------------------*/

static bool never(void *ud) {
  (void)ud;
  return false;
}

static void spin(uint64_t ms) {
  tn_run_until(&W.loop, never, NULL, ms);
}

/* A TCP socket on 127.0.0.1 with a port of its own, listening or not (a
 * bound socket that does not listen refuses connections): its address to
 * ret_addr. Non-blocking. */
static int tcp_socket(bool listening, char *ret_addr, size_t cap) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
  struct sockaddr_in a = {.sin_family = AF_INET};
  socklen_t len = sizeof a;
  assert_true(fd >= 0);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  assert_int_equal(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
  if (listening)
    assert_int_equal(listen(fd, 8), 0);
  assert_int_equal(getsockname(fd, (struct sockaddr *)&a, &len), 0);
  snprintf(ret_addr, cap, "127.0.0.1:%u", ntohs(a.sin_port));
  return fd;
}

/* Accepts on fd within ms, running the test's loop meanwhile: the socket
 * (blocking), or -1. */
static int accept_within(int fd, uint64_t ms) {
  uint64_t end = gn_mono_ms() + ms;
  while (gn_mono_ms() < end) {
    int c = accept(fd, NULL, NULL);
    if (c >= 0) {
      int fl = fcntl(c, F_GETFL);
      fcntl(c, F_SETFL, fl & ~O_NONBLOCK);
      return c;
    }
    spin(50);
  }
  return -1;
}

/* The offer of prov (signed by it) naming direct_addr and the relay
 * relay_id at relay_addr, handed to the daemon by `by`; its id. */
static void give_offer(peer *by, const gn_identity *prov, const char *direct_addr, const uint8_t relay_id[GN_PK_LEN],
                       const char *relay_addr, char ret_id[GN_OFFER_ID_STRLEN]) {
  gn_offer o;
  gn_buf env = {0};
  tn_offer(&o, prov->pk, direct_addr, 1, 60, true);
  memcpy(o.relay_id, relay_id, GN_PK_LEN);
  snprintf(o.relay_addr, sizeof o.relay_addr, "%s", relay_addr);
  gn_offer_id(&o, ret_id);
  assert_int_equal(gn_offer_seal(prov, &o, &env), 0);
  assert_int_equal(gn_transport_send(by->tp, W.id->pk, env.data, env.len), 0);
  gn_buf_done(&env);
  bool seen = false;
  for (int i = 0; i < 100 && !seen; i++) {
    spin(50);
    json_t *t = tn_api_get(W.dir, "/v1/offers"), *e;
    size_t k;
    json_array_foreach(json_object_get(t, "offers"), k, e) {
      const char *id = json_string_value(json_object_get(e, "id"));
      seen = seen || (id && strcmp(id, ret_id) == 0);
    }
    json_decref(t);
  }
  assert_true(seen);
}

static long long reach_figure(const char *key) {
  return nat_figure("reach_stats", key);
}

/* The daemon rents from a provider B whose offer names a relay R it has no
 * session with, and as its own address a private one where, in the
 * daemon's network, another node answers (a home LAN's address is
 * someone else's in another LAN): that session is refused for its key,
 * and with no call to /v1/nat/relay the daemon dials R (the offer's relay
 * address, R's key held), asks it to call B, dials the splice R names with
 * R's token, and the session that comes up there, B's key proven, carries
 * the lease request. */
static void test_rent_reaches_a_natted_provider_through_its_relay(void **state) {
  (void)state;
  peer gossip, relay, prov, other;
  char direct[64], splice[64], offer[GN_OFFER_ID_STRLEN], body[256];
  peer_up(&gossip); /* hands the offer over */
  memset(&other, 0, sizeof other);
  other.link = (tn_link){&other.up, &other.in, NULL};
  tn_peer_new(&W.loop, &other.link, &other.id, &other.tp);
  assert_int_equal(gn_transport_listen(other.tp, "127.0.0.1:0"), 0);
  snprintf(direct, sizeof direct, "%s", gn_transport_listen_addr(other.tp));
  memset(&relay, 0, sizeof relay);
  relay.link = (tn_link){&relay.up, &relay.in, NULL};
  tn_peer_new(&W.loop, &relay.link, &relay.id, &relay.tp);
  assert_int_equal(gn_transport_listen(relay.tp, "127.0.0.1:0"), 0);
  memset(&prov, 0, sizeof prov);
  prov.link = (tn_link){&prov.up, &prov.in, NULL};
  tn_peer_new(&W.loop, &prov.link, &prov.id, &prov.tp);
  int lsn = tcp_socket(true, splice, sizeof splice);
  long long relayed0 = reach_figure("relayed");
  give_offer(&gossip, prov.id, direct, relay.id->pk, gn_transport_listen_addr(relay.tp), offer);

  snprintf(body, sizeof body, "{\"offer\": \"%s\", \"hours\": 1, \"attest\": false, \"allow_simulated\": true}", offer);
  char sock[PATH_MAX + 16];
  snprintf(sock, sizeof sock, "%.*s/gpunetd.sock", PATH_MAX - 16, W.dir);
  tn_call c;
  tn_call_start(&c, sock, "/v1/leases", body);
  /* R is dialled and asked to call B. */
  tn_msg m;
  if (!tn_wait_msg(&W.loop, &relay.in, GN_MSG_RELAY_CALL, NULL, NULL, DEADLINE_MS, &m)) {
    tn_print_log(W.dir, 30);
    fail_msg("the daemon did not ask the relay its provider's offer names");
  }
  assert_memory_equal(m.peer, W.id->pk, GN_PK_LEN);
  gn_envelope e;
  gn_relay_call_msg cm;
  assert_int_equal(gn_envelope_open(m.raw.data, m.raw.len, &e), 0);
  assert_int_equal(gn_relay_call_decode(e.body, e.body_len, &cm), 0);
  assert_false(cm.from_relay);
  assert_memory_equal(cm.peer, prov.id->pk, GN_PK_LEN);
  gn_buf_done(&m.raw);
  /* R puts it through: the caller's token and the splice address. */
  gn_relay_status_msg st = {.ok = true, .has_call = true};
  memcpy(st.peer, prov.id->pk, GN_PK_LEN);
  randombytes_buf(st.token, sizeof st.token);
  snprintf(st.addr, sizeof st.addr, "%s", splice);
  gn_buf b = {0};
  assert_int_equal(gn_relay_status_encode(&st, &b), 0);
  tn_send(relay.tp, relay.id, GN_MSG_RELAY_STATUS, &b, W.id->pk);
  gn_buf_done(&b);
  int fd = accept_within(lsn, DEADLINE_MS);
  assert_true(fd >= 0);
  uint8_t tok[GN_RELAY_TOKEN_LEN];
  size_t got = 0;
  for (int i = 0; i < 100 && got < sizeof tok; i++) {
    ssize_t k = recv(fd, tok + got, sizeof tok - got, MSG_DONTWAIT);
    if (k > 0)
      got += (size_t)k;
    else
      spin(50);
  }
  assert_int_equal(got, sizeof tok);
  assert_memory_equal(tok, st.token, sizeof tok);
  /* The splice's other end is B: the handshake proves B's key to the
   * daemon, and the lease request follows over it. */
  assert_int_equal(gn_transport_adopt(prov.tp, fd, false, W.id->pk), 0);
  if (!tn_wait_msg(&W.loop, &prov.in, GN_MSG_LEASE_REQUEST, tn_call_done, &c, DEADLINE_MS, &m)) {
    tn_print_log(W.dir, 30);
    fail_msg("no lease request came through the relayed session");
  }
  assert_memory_equal(m.peer, W.id->pk, GN_PK_LEN);
  gn_lease_terms t;
  assert_int_equal(gn_lease_request_open(m.raw.data, m.raw.len, &t), 0);
  assert_memory_equal(t.provider, prov.id->pk, GN_PK_LEN);
  gn_buf_done(&m.raw);
  tn_send_lease_end(prov.tp, prov.id, GN_MSG_LEASE_REJECT, t.lease_id, "B says no", W.id->pk);
  tn_call_finish(&W.loop, &c, DEADLINE_MS);
  tn_call_expect(&c, 409, "B says no");
  gn_buf_done(&c.out);
  assert_int_equal(reach_figure("relayed"), relayed0 + 1);
  assert_true(tn_log_has(W.dir, "asking relay"));
  assert_true(tn_log_has(W.dir, "refused the session with")); /* the other node's */
  assert_false(tn_inbox_has(&other.in, GN_MSG_LEASE_REQUEST));
  close(lsn);
  peer ps[] = {gossip, relay, prov, other};
  peers_done(ps, 4);
}

/* Attack: a provider's offer names as its relay a victim's address (any
 * key: nothing there proves it). Renting from it dials the victim once,
 * like the offer's own address would, then gives up saying why; the rent
 * fails in its time and the daemon goes on. */
static void test_hostile_relay_address_is_dialled_once(void **state) {
  (void)state;
  peer gossip;
  gn_identity *evil = NULL, *fake = NULL;
  char direct[64], victim[64], offer[GN_OFFER_ID_STRLEN], body[256];
  peer_up(&gossip);
  assert_int_equal(gn_identity_generate(&evil), 0);
  assert_int_equal(gn_identity_generate(&fake), 0);
  int closed = tcp_socket(false, direct, sizeof direct);
  int lsn = tcp_socket(true, victim, sizeof victim);
  give_offer(&gossip, evil, direct, fake->pk, victim, offer);
  long long gave0 = reach_figure("gave_up");
  snprintf(body, sizeof body, "{\"offer\": \"%s\", \"hours\": 1, \"attest\": false, \"allow_simulated\": true}", offer);
  char sock[PATH_MAX + 16];
  snprintf(sock, sizeof sock, "%.*s/gpunetd.sock", PATH_MAX - 16, W.dir);
  tn_call c;
  tn_call_start(&c, sock, "/v1/leases", body);
  int dials = 0;
  uint64_t end = gn_mono_ms() + 40000;
  while (!tn_call_done(&c) && gn_mono_ms() < end) {
    int fd = accept_within(lsn, 200);
    if (fd >= 0) {
      dials++;
      close(fd);
    }
  }
  tn_call_finish(&W.loop, &c, DEADLINE_MS);
  assert_true(c.status >= 500); /* in its time: nobody answered as the provider */
  gn_buf_done(&c.out);
  for (int i = 0; i < 20; i++) { /* nothing more comes */
    int fd = accept_within(lsn, 100);
    if (fd >= 0) {
      dials++;
      close(fd);
    }
  }
  assert_int_equal(dials, 1);
  assert_int_equal(reach_figure("gave_up"), gave0 + 1);
  assert_true(tn_log_has(W.dir, "gave up reaching"));
  json_t *j = tn_api_get(W.dir, "/v1/nat"), *a;
  size_t k;
  bool listed = false;
  json_array_foreach(json_object_get(j, "reach"), k, a) {
    listed = listed || (strcmp(json_string_value(json_object_get(a, "relay_addr")), victim) == 0 &&
                        strcmp(json_string_value(json_object_get(a, "state")), "gave-up") == 0);
  }
  json_decref(j);
  assert_true(listed);
  close(closed);
  close(lsn);
  evil = gn_identity_free(evil);
  fake = gn_identity_free(fake);
  peers_done(&gossip, 1);
}

/* Attack: the relay a provider's offer names proves its key but does not
 * relay (or refuses every call): the daemon calls it GN_REACH_CALLS times,
 * backing off between, then gives up with the relay's reason. */
static void test_relay_that_refuses_is_called_a_bounded_number_of_times(void **state) {
  (void)state;
  peer gossip, relay;
  gn_identity *prov = NULL;
  char direct[64], offer[GN_OFFER_ID_STRLEN], body[256];
  peer_up(&gossip);
  memset(&relay, 0, sizeof relay);
  relay.link = (tn_link){&relay.up, &relay.in, NULL};
  tn_peer_new(&W.loop, &relay.link, &relay.id, &relay.tp);
  assert_int_equal(gn_transport_listen(relay.tp, "127.0.0.1:0"), 0);
  assert_int_equal(gn_identity_generate(&prov), 0);
  int closed = tcp_socket(false, direct, sizeof direct);
  give_offer(&gossip, prov, direct, relay.id->pk, gn_transport_listen_addr(relay.tp), offer);
  long long gave0 = reach_figure("gave_up");
  snprintf(body, sizeof body, "{\"offer\": \"%s\", \"hours\": 1, \"attest\": false, \"allow_simulated\": true}", offer);
  char sock[PATH_MAX + 16];
  snprintf(sock, sizeof sock, "%.*s/gpunetd.sock", PATH_MAX - 16, W.dir);
  tn_call c;
  tn_call_start(&c, sock, "/v1/leases", body);
  int calls = 0;
  tn_msg m;
  uint64_t last = 0, gap_min = UINT64_MAX;
  while (tn_wait_msg(&W.loop, &relay.in, GN_MSG_RELAY_CALL, NULL, NULL, calls ? 12000 : DEADLINE_MS, &m)) {
    uint64_t now = gn_mono_ms();
    if (calls && now - last < gap_min)
      gap_min = now - last;
    last = now;
    calls++;
    gn_buf_done(&m.raw);
    gn_relay_status_msg st = {.ok = false, .has_call = true};
    memcpy(st.peer, prov->pk, GN_PK_LEN);
    snprintf(st.why, sizeof st.why, "this node does not relay");
    gn_buf b = {0};
    assert_int_equal(gn_relay_status_encode(&st, &b), 0);
    tn_send(relay.tp, relay.id, GN_MSG_RELAY_STATUS, &b, W.id->pk);
    gn_buf_done(&b);
  }
  assert_int_equal(calls, GN_REACH_CALLS);
  assert_true(gap_min >= GN_REACH_BACKOFF_MS - 200); /* backed off between */
  tn_call_finish(&W.loop, &c, DEADLINE_MS);
  assert_true(c.status >= 500);
  gn_buf_done(&c.out);
  assert_int_equal(reach_figure("gave_up"), gave0 + 1);
  assert_true(tn_log_has(W.dir, "this node does not relay"));
  close(closed);
  prov = gn_identity_free(prov);
  peer ps[] = {gossip, relay};
  peers_done(ps, 2);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_observed_address_is_the_source),
      cmocka_unit_test(test_reservation_needs_an_observed_address),
      cmocka_unit_test(test_slot_hog_from_one_network_is_bounded),
      cmocka_unit_test(test_call_flood_is_bounded),
      cmocka_unit_test(test_relayed_bytes_over_the_limit_are_paced),
      cmocka_unit_test(test_unknown_token_is_closed),
      cmocka_unit_test(test_rent_reaches_a_natted_provider_through_its_relay),
      cmocka_unit_test(test_hostile_relay_address_is_dialled_once),
      cmocka_unit_test(test_relay_that_refuses_is_called_a_bounded_number_of_times),
  };
  return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
