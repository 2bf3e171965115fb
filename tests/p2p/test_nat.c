/* Tests for p2p/nat.c: the bodies' codecs, the NAT classification from
 * observed addresses (and the liars it must resist), and hole punching
 * between in-memory nodes through a rendezvous, all with injected time. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <gpunet/identity.h>
#include <gpunet/nat.h>
#include <gpunet/offer.h>
#include <gpunet/relay.h>
#include <gpunet/wire.h>

#include <stdio.h>

/* --- an in-memory network -------------------------------------------------------*/

#define NODES 4
#define QMAX 4096

typedef struct msg {
  bool dgram;
  int from;
  char to_addr[GN_NAT_ADDR_MAX];
  uint8_t to_key[GN_PK_LEN];
  uint32_t type;
  uint8_t body[512];
  size_t len;
} msg;

typedef struct node {
  int idx;
  uint8_t key[GN_PK_LEN];
  char ext[GN_NAT_ADDR_MAX]; /* where others see its datagrams come from */
  bool drop_in;              /* datagrams to it are lost (a NAT that filters) */
  gn_nat *nat;
  int punched_ok, punched_fail;
  char punched_addr[GN_NAT_ADDR_MAX];
  int tcp_dials;                  /* TCP punch connects asked of the glue */
  int tcp_fail_with;              /* what the glue says of each at once (0: stays under way) */
  char tcp_addr[GN_NAT_ADDR_MAX]; /* where the last went */
  bool tcp_initiator;
} node;

typedef struct world {
  node nodes[NODES];
  msg q[QMAX];
  size_t qn;
  uint64_t now;
  size_t dgrams_sent[NODES];
} world;

static void send_dgram(void *ud, const char *addr, uint32_t type, const uint8_t *body, size_t len) {
  node *n = ud;
  world *w = (world *)((char *)(n - n->idx) - offsetof(world, nodes));
  assert_true(w->qn < QMAX);
  assert_true(len <= sizeof w->q[0].body);
  msg *m = &w->q[w->qn++];
  *m = (msg){.dgram = true, .from = n->idx, .type = type, .len = len};
  snprintf(m->to_addr, sizeof m->to_addr, "%s", addr);
  memcpy(m->body, body, len);
  w->dgrams_sent[n->idx]++;
}

static int send_msg(void *ud, const uint8_t peer[GN_PK_LEN], uint32_t type, const uint8_t *body, size_t len) {
  node *n = ud;
  world *w = (world *)((char *)(n - n->idx) - offsetof(world, nodes));
  assert_true(w->qn < QMAX);
  msg *m = &w->q[w->qn++];
  *m = (msg){.dgram = false, .from = n->idx, .type = type, .len = len};
  memcpy(m->to_key, peer, GN_PK_LEN);
  memcpy(m->body, body, len);
  return 0;
}

static void punched(void *ud, const uint8_t peer[GN_PK_LEN], const char *addr, bool ok) {
  (void)peer;
  node *n = ud;
  if (ok) {
    n->punched_ok++;
    snprintf(n->punched_addr, sizeof n->punched_addr, "%s", addr);
  } else {
    n->punched_fail++;
  }
}

static int tcp_dial(void *ud, const uint8_t peer[GN_PK_LEN], const char *addr, bool initiator, uint64_t deadline_ms) {
  (void)peer;
  (void)deadline_ms;
  node *n = ud;
  n->tcp_dials++;
  snprintf(n->tcp_addr, sizeof n->tcp_addr, "%s", addr);
  n->tcp_initiator = initiator;
  return n->tcp_fail_with;
}

static void world_init(world *w) {
  memset(w, 0, sizeof *w);
  w->now = 1000000;
  for (int i = 0; i < NODES; i++) {
    node *n = &w->nodes[i];
    n->idx = i;
    memset(n->key, 0x10 + i, GN_PK_LEN);
    snprintf(n->ext, sizeof n->ext, "198.51.%d.7:4%d00", 10 + i, i);
    uint8_t seed[32];
    memset(seed, 0x70 + i, sizeof seed);
    gn_nat_io io = {send_dgram, send_msg, punched, n, tcp_dial};
    /* Its listen address is a private one: seen at ext, it is behind a NAT. */
    char local[GN_NAT_ADDR_MAX];
    snprintf(local, sizeof local, "10.0.%d.2:7946", i);
    assert_int_equal(gn_nat_new(n->key, local, &io, seed, w->now, &n->nat), 0);
  }
}

static void world_done(world *w) {
  for (int i = 0; i < NODES; i++)
    w->nodes[i].nat = gn_nat_free(w->nodes[i].nat);
}

/* Delivers everything queued (and what that makes), in order. */
static void world_run(world *w) {
  for (size_t i = 0; i < w->qn; i++) {
    msg m = w->q[i];
    for (int j = 0; j < NODES; j++) {
      node *to = &w->nodes[j];
      if (m.dgram && strcmp(to->ext, m.to_addr) == 0 && !to->drop_in)
        gn_nat_on_datagram(to->nat, w->nodes[m.from].ext, w->nodes[m.from].key, m.type, m.body, m.len, w->now);
      if (!m.dgram && memcmp(to->key, m.to_key, GN_PK_LEN) == 0)
        gn_nat_on_message(to->nat, w->nodes[m.from].key, m.type, m.body, m.len, w->now);
    }
  }
  w->qn = 0;
}

static void world_advance(world *w, uint64_t ms) {
  uint64_t end = w->now + ms;
  while (w->now < end) {
    w->now += 50;
    for (int i = 0; i < NODES; i++)
      gn_nat_tick(w->nodes[i].nat, w->now);
    world_run(w);
  }
}

/* --- observations without a network -----------------------------------------------*/

static uint8_t key_of(int i) {
  return (uint8_t)(0x80 + i);
}

static gn_buf g_last_body;
static char g_last_to[GN_NAT_ADDR_MAX];

/* Reporter i (key byte 0x80+i, speaking from from) says it sees us at seen:
 * the question goes out, its answer comes back. Returns the answer's code. */
static int report(gn_nat *nat, int i, const char *from, const char *seen, uint64_t now) {
  uint8_t key[GN_PK_LEN];
  memset(key, key_of(i), sizeof key);
  int r = gn_nat_ask(nat, key, from, now);
  if (r < 0)
    return r;
  /* The question's nonce, from the datagram the machine sent. */
  gn_nat_observed q;
  assert_int_equal(gn_nat_observed_decode(g_last_body.data, g_last_body.len, &q), 0);
  gn_nat_observed a = {.answer = true};
  memcpy(a.nonce, q.nonce, sizeof a.nonce);
  snprintf(a.addr, sizeof a.addr, "%s", seen);
  gn_buf b = {0};
  assert_int_equal(gn_nat_observed_encode(&a, &b), 0);
  r = gn_nat_on_datagram(nat, from, key, GN_MSG_NAT_OBSERVED, b.data, b.len, now);
  gn_buf_done(&b);
  return r;
}

static void keep_dgram(void *ud, const char *addr, uint32_t type, const uint8_t *body, size_t len) {
  (void)ud;
  (void)type;
  g_last_body.len = 0;
  gn_buf_append(&g_last_body, body, len);
  snprintf(g_last_to, sizeof g_last_to, "%s", addr);
}

static int no_msg(void *ud, const uint8_t peer[GN_PK_LEN], uint32_t type, const uint8_t *body, size_t len) {
  (void)ud;
  (void)peer;
  (void)type;
  (void)body;
  (void)len;
  return GN_ENOTFOUND;
}

static gn_nat *lone(const char *local) {
  uint8_t self[GN_PK_LEN], seed[32];
  memset(self, 1, sizeof self);
  memset(seed, 2, sizeof seed);
  gn_nat_io io = {keep_dgram, no_msg, NULL, NULL, NULL};
  gn_nat *nat = NULL;
  assert_int_equal(gn_nat_new(self, local, &io, seed, 0, &nat), 0);
  return nat;
}

static void test_codecs_round_trip(void **state) {
  (void)state;
  gn_buf b = {0};
  gn_nat_observed o = {.answer = true, .addr = "203.0.113.9:7946"}, o2;
  memset(o.nonce, 7, sizeof o.nonce);
  assert_int_equal(gn_nat_observed_encode(&o, &b), 0);
  assert_int_equal(gn_nat_observed_decode(b.data, b.len, &o2), 0);
  assert_true(o2.answer);
  assert_string_equal(o2.addr, o.addr);
  assert_memory_equal(o2.nonce, o.nonce, sizeof o.nonce);
  b.len = 0;
  gn_nat_punch_req p = {.intro = true, .addr = "[2001:db8::1]:9"}, p2;
  memset(p.peer, 3, sizeof p.peer);
  assert_int_equal(gn_nat_punch_req_encode(&p, &b), 0);
  assert_int_equal(gn_nat_punch_req_decode(b.data, b.len, &p2), 0);
  assert_true(p2.intro);
  assert_false(p2.tcp);
  assert_string_equal(p2.addr, p.addr);
  assert_memory_equal(p2.peer, p.peer, GN_PK_LEN);
  b.len = 0;
  p.tcp = true;
  assert_int_equal(gn_nat_punch_req_encode(&p, &b), 0);
  assert_int_equal(gn_nat_punch_req_decode(b.data, b.len, &p2), 0);
  assert_true(p2.intro && p2.tcp);
  b.len = 0;
  gn_nat_punch_req t = {.intro = false, .tcp = true}, t2;
  assert_int_equal(gn_nat_punch_req_encode(&t, &b), 0);
  assert_int_equal(gn_nat_punch_req_decode(b.data, b.len, &t2), 0);
  assert_true(!t2.intro && t2.tcp);
  b.len = 0;
  gn_nat_punch k = {.ack = true}, k2;
  assert_int_equal(gn_nat_punch_encode(&k, &b), 0);
  assert_int_equal(gn_nat_punch_decode(b.data, b.len, &k2), 0);
  assert_true(k2.ack);
  gn_buf_done(&b);
}

static void test_codecs_refuse_malformed(void **state) {
  (void)state;
  gn_wire_writer w;
  gn_buf b = {0};
  gn_nat_observed o;
  gn_nat_punch_req p;
  gn_nat_punch k;
  /* An answer whose address is a name, not numeric. */
  gn_wire_writer_init(&w);
  gn_wire_put_map(&w, 2);
  gn_wire_put_str(&w, "r");
  gn_wire_put_bin(&w, "0123456789abcdef", 16);
  gn_wire_put_str(&w, "a");
  gn_wire_put_str(&w, "evil.example:80");
  assert_int_equal(gn_wire_writer_take(&w, &b), 0);
  assert_int_equal(gn_nat_observed_decode(b.data, b.len, &o), GN_EINVAL);
  /* A short nonce. */
  b.len = 0;
  gn_wire_put_map(&w, 1);
  gn_wire_put_str(&w, "q");
  gn_wire_put_bin(&w, "0123", 4);
  assert_int_equal(gn_wire_writer_take(&w, &b), 0);
  assert_int_equal(gn_nat_observed_decode(b.data, b.len, &o), GN_EINVAL);
  /* A probe with k = 2. */
  b.len = 0;
  gn_wire_put_map(&w, 2);
  gn_wire_put_str(&w, "n");
  gn_wire_put_bin(&w, "0123456789abcdef", 16);
  gn_wire_put_str(&w, "k");
  gn_wire_put_u64(&w, 2);
  assert_int_equal(gn_wire_writer_take(&w, &b), 0);
  assert_int_equal(gn_nat_punch_decode(b.data, b.len, &k), GN_EINVAL);
  /* A request with an extra key. */
  b.len = 0;
  gn_wire_put_map(&w, 3);
  gn_wire_put_str(&w, "t");
  gn_wire_put_bin(&w, b.data, 0);
  gn_wire_put_str(&w, "n");
  gn_wire_put_bin(&w, "0123456789abcdef", 16);
  gn_wire_put_str(&w, "x");
  gn_wire_put_u64(&w, 1);
  assert_int_equal(gn_wire_writer_take(&w, &b), 0);
  assert_int_equal(gn_nat_punch_req_decode(b.data, b.len, &p), GN_EINVAL);
  assert_int_equal(gn_nat_punch_req_decode((const uint8_t *)"\xc1", 1, &p), GN_EINVAL);
  /* A TCP flag that is not a boolean, and one beside an unknown key. */
  b.len = 0;
  gn_wire_put_map(&w, 3);
  gn_wire_put_str(&w, "t");
  gn_wire_put_bin(&w, "0123456789abcdef0123456789abcdef", 32);
  gn_wire_put_str(&w, "n");
  gn_wire_put_bin(&w, "0123456789abcdef", 16);
  gn_wire_put_str(&w, "c");
  gn_wire_put_u64(&w, 1);
  assert_int_equal(gn_wire_writer_take(&w, &b), 0);
  assert_int_equal(gn_nat_punch_req_decode(b.data, b.len, &p), GN_EINVAL);
  b.len = 0;
  gn_wire_put_map(&w, 4);
  gn_wire_put_str(&w, "t");
  gn_wire_put_bin(&w, "0123456789abcdef0123456789abcdef", 32);
  gn_wire_put_str(&w, "n");
  gn_wire_put_bin(&w, "0123456789abcdef", 16);
  gn_wire_put_str(&w, "c");
  gn_wire_put_bool(&w, true);
  gn_wire_put_str(&w, "x");
  gn_wire_put_u64(&w, 1);
  assert_int_equal(gn_wire_writer_take(&w, &b), 0);
  assert_int_equal(gn_nat_punch_req_decode(b.data, b.len, &p), GN_EINVAL);
  gn_wire_writer_done(&w);
  gn_buf_done(&b);
}

static void test_unknown_until_two_networks_agree(void **state) {
  (void)state;
  gn_nat *nat = lone("10.0.0.2:7946");
  assert_int_equal(gn_nat_type_get(nat, 0), GN_NAT_UNKNOWN);
  assert_int_equal(report(nat, 1, "198.51.100.1:7946", "203.0.113.5:7946", 10), 0);
  assert_int_equal(gn_nat_type_get(nat, 10), GN_NAT_UNKNOWN);
  /* A second reporter from the same /24 is no second opinion. */
  assert_int_equal(report(nat, 2, "198.51.100.2:7946", "203.0.113.5:7946", 20), 0);
  assert_int_equal(gn_nat_type_get(nat, 20), GN_NAT_UNKNOWN);
  char adv[GN_NAT_ADDR_MAX] = "";
  assert_false(gn_nat_advertised(nat, 20, adv, sizeof adv));
  assert_int_equal(report(nat, 3, "192.0.2.1:7946", "203.0.113.5:7946", 30), 0);
  assert_int_equal(gn_nat_type_get(nat, 30), GN_NAT_CONE);
  assert_true(gn_nat_advertised(nat, 30, adv, sizeof adv));
  assert_string_equal(adv, "203.0.113.5:7946");
  gn_nat_free(nat);
}

static void test_public_when_seen_at_the_listen_address(void **state) {
  (void)state;
  gn_nat *nat = lone("203.0.113.5:7946");
  assert_int_equal(report(nat, 1, "198.51.100.1:7946", "203.0.113.5:7946", 10), 0);
  assert_int_equal(report(nat, 2, "192.0.2.1:7946", "203.0.113.5:7946", 20), 0);
  assert_int_equal(gn_nat_type_get(nat, 20), GN_NAT_PUBLIC);
  gn_nat_free(nat);
}

static void test_symmetric_when_each_network_sees_another_port(void **state) {
  (void)state;
  gn_nat *nat = lone("10.0.0.2:7946");
  assert_int_equal(report(nat, 1, "198.51.100.1:7946", "203.0.113.5:40001", 10), 0);
  assert_int_equal(report(nat, 2, "192.0.2.1:7946", "203.0.113.5:52113", 20), 0);
  assert_int_equal(report(nat, 3, "192.0.3.1:7946", "203.0.113.5:61002", 30), 0);
  assert_int_equal(gn_nat_type_get(nat, 30), GN_NAT_SYMMETRIC);
  char adv[GN_NAT_ADDR_MAX] = "", host[GN_NAT_ADDR_MAX] = "";
  assert_false(gn_nat_advertised(nat, 30, adv, sizeof adv));
  assert_true(gn_nat_outside_host(nat, 30, host, sizeof host));
  assert_string_equal(host, "203.0.113.5");
  gn_nat_free(nat);
}

/* Attack: one peer lies about where it sees us; our address does not move. */
static void test_a_liar_cannot_move_the_advertised_address(void **state) {
  (void)state;
  gn_nat *nat = lone("10.0.0.2:7946");
  char adv[GN_NAT_ADDR_MAX] = "";
  /* Alone, it makes us nothing. */
  assert_int_equal(report(nat, 9, "192.0.9.1:7946", "6.6.6.6:666", 5), 0);
  assert_int_equal(gn_nat_type_get(nat, 5), GN_NAT_UNKNOWN);
  assert_int_equal(report(nat, 1, "198.51.100.1:7946", "203.0.113.5:7946", 10), 0);
  assert_int_equal(report(nat, 2, "192.0.2.1:7946", "203.0.113.5:7946", 20), 0);
  /* Against two honest networks: the right host with a wrong port, or
   * another host, changes neither the type nor the address. */
  assert_int_equal(report(nat, 8, "192.0.8.1:7946", "203.0.113.5:1234", 30), 0);
  assert_int_equal(gn_nat_type_get(nat, 30), GN_NAT_CONE);
  assert_true(gn_nat_advertised(nat, 30, adv, sizeof adv));
  assert_string_equal(adv, "203.0.113.5:7946");
  /* Thirty more identities, all in the liar's one /24 (more than the
   * table holds): still one network, and the honest reports stay. */
  for (int i = 10; i < 40; i++)
    report(nat, i, "192.0.9.1:7946", "6.6.6.6:666", 40 + (uint64_t)i);
  assert_int_equal(gn_nat_type_get(nat, 100), GN_NAT_CONE);
  assert_true(gn_nat_advertised(nat, 100, adv, sizeof adv));
  assert_string_equal(adv, "203.0.113.5:7946");
  /* And they hold at most GN_NAT_OBS_PER_NET places of the table. */
  assert_true(gn_nat_observation_count(nat, 100) <= 4 + GN_NAT_OBS_PER_NET);
  gn_nat_free(nat);
}

/* Attack: an answer nobody asked for, from another address than asked, or
 * signed by another key, changes nothing. */
static void test_unasked_answers_are_ignored(void **state) {
  (void)state;
  gn_nat *nat = lone("10.0.0.2:7946");
  uint8_t key[GN_PK_LEN], other[GN_PK_LEN];
  memset(key, key_of(1), sizeof key);
  memset(other, 0x55, sizeof other);
  gn_nat_observed a = {.answer = true, .addr = "6.6.6.6:666"};
  memset(a.nonce, 9, sizeof a.nonce);
  gn_buf b = {0};
  assert_int_equal(gn_nat_observed_encode(&a, &b), 0);
  assert_int_equal(gn_nat_on_datagram(nat, "198.51.100.1:7946", key, GN_MSG_NAT_OBSERVED, b.data, b.len, 0),
                   GN_ENOTFOUND);
  /* Now a real question; the answer carries its nonce but comes from
   * elsewhere, or is signed by someone else, or too late. */
  assert_int_equal(gn_nat_ask(nat, key, "198.51.100.1:7946", 0), 0);
  gn_nat_observed q;
  assert_int_equal(gn_nat_observed_decode(g_last_body.data, g_last_body.len, &q), 0);
  memcpy(a.nonce, q.nonce, sizeof a.nonce);
  b.len = 0;
  assert_int_equal(gn_nat_observed_encode(&a, &b), 0);
  assert_int_equal(gn_nat_on_datagram(nat, "198.51.100.9:7946", key, GN_MSG_NAT_OBSERVED, b.data, b.len, 1),
                   GN_ENOTFOUND);
  assert_int_equal(gn_nat_on_datagram(nat, "198.51.100.1:7946", other, GN_MSG_NAT_OBSERVED, b.data, b.len, 1),
                   GN_ENOTFOUND);
  assert_int_equal(
      gn_nat_on_datagram(nat, "198.51.100.1:7946", key, GN_MSG_NAT_OBSERVED, b.data, b.len, GN_NAT_ASK_TIMEOUT_MS),
      GN_ENOTFOUND);
  assert_int_equal(gn_nat_observation_count(nat, 1), 0);
  gn_nat_stats st;
  gn_nat_stats_get(nat, &st);
  assert_int_equal(st.answers_ignored, 4);
  gn_buf_done(&b);
  gn_nat_free(nat);
}

static void test_questions_are_bounded_and_not_repeated(void **state) {
  (void)state;
  gn_nat *nat = lone("10.0.0.2:7946");
  uint8_t key[GN_PK_LEN];
  memset(key, 4, sizeof key);
  assert_int_equal(gn_nat_ask(nat, key, "198.51.100.1:7946", 0), 0);
  assert_int_equal(gn_nat_ask(nat, key, "198.51.100.1:7946", 10), GN_EBUSY);
  assert_int_equal(gn_nat_ask(nat, key, "evil.example:80", 10), GN_EINVAL);
  int sent = 1;
  for (int i = 2; i < 100; i++) {
    char addr[32];
    snprintf(addr, sizeof addr, "198.51.100.%d:7946", i);
    sent += gn_nat_ask(nat, key, addr, 10) == 0;
  }
  assert_int_equal(sent, GN_NAT_ASKS_MAX);
  /* Past the interval the table has room again. */
  assert_int_equal(gn_nat_ask(nat, key, "198.51.100.1:7946", GN_NAT_ASK_AGAIN_MS), 0);
  gn_nat_free(nat);
}

static void test_observations_expire(void **state) {
  (void)state;
  gn_nat *nat = lone("10.0.0.2:7946");
  assert_int_equal(report(nat, 1, "198.51.100.1:7946", "203.0.113.5:7946", 10), 0);
  assert_int_equal(report(nat, 2, "192.0.2.1:7946", "203.0.113.5:7946", 20), 0);
  assert_int_equal(gn_nat_type_get(nat, 20), GN_NAT_CONE);
  assert_int_equal(gn_nat_type_get(nat, 10 + GN_NAT_OBS_TTL_MS), GN_NAT_UNKNOWN);
  assert_int_equal(gn_nat_observation_count(nat, 20 + GN_NAT_OBS_TTL_MS), 0);
  gn_nat_free(nat);
}

/* Attack: identities from many networks fill the table; it stays bounded. */
static void test_observation_table_is_bounded(void **state) {
  (void)state;
  gn_nat *nat = lone("10.0.0.2:7946");
  for (int i = 0; i < 200; i++) {
    char from[32];
    snprintf(from, sizeof from, "10.%d.%d.1:7946", i / 250, i % 250);
    uint8_t key[GN_PK_LEN];
    memset(key, 0, sizeof key);
    key[0] = (uint8_t)i;
    key[1] = (uint8_t)(i >> 8);
    gn_nat_ask(nat, key, from, (uint64_t)i * GN_NAT_ASK_AGAIN_MS);
  }
  assert_true(gn_nat_observation_count(nat, 0) <= GN_NAT_OBS_MAX);
  for (int i = 1; i < 40; i++) {
    char from[32];
    snprintf(from, sizeof from, "10.9.%d.1:7946", i);
    report(nat, i, from, "203.0.113.5:7946", 1000 + (uint64_t)i * GN_NAT_ASK_AGAIN_MS);
  }
  assert_int_equal(gn_nat_observation_count(nat, 1000 + 40ull * GN_NAT_ASK_AGAIN_MS), GN_NAT_OBS_MAX);
  gn_nat_free(nat);
}

/* --- punching ---------------------------------------------------------------------*/

/* Node i asks rendezvous r where it sees it (so r knows its endpoint). */
static void observe_via(world *w, int i, int r) {
  assert_int_equal(gn_nat_ask(w->nodes[i].nat, w->nodes[r].key, w->nodes[r].ext, w->now), 0);
  world_run(w);
}

static void test_punch_through_a_rendezvous_connects_both_sides(void **state) {
  (void)state;
  static world w;
  world_init(&w);
  observe_via(&w, 0, 2);
  observe_via(&w, 1, 2);
  assert_int_equal(gn_nat_punch_start(w.nodes[0].nat, w.nodes[1].key, w.nodes[2].key, w.now), 0);
  world_run(&w);
  world_advance(&w, 1000);
  assert_int_equal(w.nodes[0].punched_ok, 1);
  assert_int_equal(w.nodes[1].punched_ok, 1);
  assert_string_equal(w.nodes[0].punched_addr, w.nodes[1].ext);
  assert_string_equal(w.nodes[1].punched_addr, w.nodes[0].ext);
  char ep[GN_NAT_ADDR_MAX];
  assert_true(gn_nat_punched_addr(w.nodes[0].nat, w.nodes[1].key, w.now, ep, sizeof ep));
  assert_string_equal(ep, w.nodes[1].ext);
  assert_int_equal(gn_nat_punch_start(w.nodes[0].nat, w.nodes[1].key, w.nodes[2].key, w.now), GN_EEXIST);
  /* Established, probing stops. */
  size_t sent = w.dgrams_sent[0];
  world_advance(&w, 5000);
  assert_int_equal(w.dgrams_sent[0], sent);
  /* The hole is forgotten after its time. */
  world_advance(&w, GN_NAT_PUNCHED_TTL_MS);
  assert_false(gn_nat_punched_addr(w.nodes[0].nat, w.nodes[1].key, w.now, ep, sizeof ep));
  assert_int_equal(gn_nat_punch_count(w.nodes[0].nat), 0);
  world_done(&w);
}

static void test_punch_fails_when_nothing_gets_through(void **state) {
  (void)state;
  static world w;
  world_init(&w);
  observe_via(&w, 0, 2);
  observe_via(&w, 1, 2);
  w.nodes[0].drop_in = w.nodes[1].drop_in = true; /* two filtering NATs whose mappings were wrong */
  assert_int_equal(gn_nat_punch_start(w.nodes[0].nat, w.nodes[1].key, w.nodes[2].key, w.now), 0);
  world_run(&w);
  world_advance(&w, (GN_NAT_PUNCH_TRIES + 2) * GN_NAT_PUNCH_EVERY_MS);
  assert_int_equal(w.nodes[0].punched_fail, 1);
  assert_int_equal(w.nodes[1].punched_fail, 1);
  assert_int_equal(w.nodes[0].punched_ok, 0);
  assert_int_equal(w.dgrams_sent[0], GN_NAT_PUNCH_TRIES + 1); /* the question, then the probes */
  assert_int_equal(gn_nat_punch_count(w.nodes[0].nat), 0);
  world_done(&w);
}

static void test_punch_to_an_unknown_peer_fails_at_once(void **state) {
  (void)state;
  static world w;
  world_init(&w);
  observe_via(&w, 0, 2); /* node 1 never spoke to the rendezvous */
  assert_int_equal(gn_nat_punch_start(w.nodes[0].nat, w.nodes[1].key, w.nodes[2].key, w.now), 0);
  world_run(&w);
  assert_int_equal(w.nodes[0].punched_fail, 1);
  assert_int_equal(w.dgrams_sent[1], 0);
  world_done(&w);
}

/* Attack: a peer floods the rendezvous with PUNCH_REQs: at most the burst
 * is forwarded, then one per GN_NAT_REQ_EVERY_S. */
static void test_punch_request_flood_is_rate_limited(void **state) {
  (void)state;
  static world w;
  world_init(&w);
  observe_via(&w, 0, 2);
  observe_via(&w, 1, 2);
  int forwarded = 0;
  for (int i = 0; i < 200; i++) {
    gn_nat_punch_req m = {.intro = false};
    memcpy(m.peer, w.nodes[1].key, GN_PK_LEN);
    memset(m.nonce, i, sizeof m.nonce);
    gn_buf b = {0};
    assert_int_equal(gn_nat_punch_req_encode(&m, &b), 0);
    forwarded += gn_nat_on_message(w.nodes[2].nat, w.nodes[0].key, GN_MSG_NAT_PUNCH_REQ, b.data, b.len, w.now) == 0;
    gn_buf_done(&b);
  }
  assert_int_equal(forwarded, GN_NAT_REQ_BURST);
  gn_nat_stats st;
  gn_nat_stats_get(w.nodes[2].nat, &st);
  assert_int_equal(st.punch_reqs_refused, 200 - GN_NAT_REQ_BURST);
  w.qn = 0;
  world_done(&w);
}

/* Attack: a rendezvous floods a node with introductions (each would make
 * it send probes): the rate and the table bound what it takes. */
static void test_introduction_flood_is_bounded(void **state) {
  (void)state;
  static world w;
  world_init(&w);
  int taken = 0;
  for (int i = 0; i < 500; i++) {
    gn_nat_punch_req m = {.intro = true, .addr = "192.0.2.99:9"};
    memset(m.peer, 0, sizeof m.peer);
    m.peer[0] = (uint8_t)i;
    m.peer[1] = (uint8_t)(i >> 8);
    m.peer[2] = 0xee;
    memset(m.nonce, i, sizeof m.nonce);
    gn_buf b = {0};
    assert_int_equal(gn_nat_punch_req_encode(&m, &b), 0);
    taken += gn_nat_on_message(w.nodes[0].nat, w.nodes[2].key, GN_MSG_NAT_PUNCH_REQ, b.data, b.len,
                               w.now + (uint64_t)i * 100) == 0;
    gn_buf_done(&b);
  }
  /* 50 s at one every 2 s after a burst of 4, and never over the table. */
  assert_true(taken <= GN_NAT_REQ_BURST + 50 / GN_NAT_REQ_EVERY_S + 1);
  assert_true(gn_nat_punch_count(w.nodes[0].nat) <= GN_NAT_PUNCH_MAX);
  w.qn = 0;
  world_done(&w);
}

/* Attack: a stranger's probe (no punch with it) gets no answer. */
static void test_stranger_probe_is_not_answered(void **state) {
  (void)state;
  static world w;
  world_init(&w);
  gn_nat_punch m = {.ack = false};
  memset(m.nonce, 1, sizeof m.nonce);
  gn_buf b = {0};
  assert_int_equal(gn_nat_punch_encode(&m, &b), 0);
  assert_int_equal(
      gn_nat_on_datagram(w.nodes[0].nat, w.nodes[3].ext, w.nodes[3].key, GN_MSG_NAT_PUNCH, b.data, b.len, w.now),
      GN_ENOTFOUND);
  assert_int_equal(w.qn, 0);
  gn_buf_done(&b);
  world_done(&w);
}

/* A rendezvous cannot redirect a punch in progress to another address. */
static void test_introduction_cannot_redirect_a_punch_in_progress(void **state) {
  (void)state;
  static world w;
  world_init(&w);
  observe_via(&w, 0, 2);
  observe_via(&w, 1, 2);
  assert_int_equal(gn_nat_punch_start(w.nodes[0].nat, w.nodes[1].key, w.nodes[2].key, w.now), 0);
  w.qn = 0; /* the request is lost: node 0 waits for its introduction */
  gn_nat_punch_req m = {.intro = true, .addr = "192.0.2.66:66"};
  memcpy(m.peer, w.nodes[1].key, GN_PK_LEN);
  memset(m.nonce, 0x42, sizeof m.nonce); /* not the nonce node 0 chose */
  gn_buf b = {0};
  assert_int_equal(gn_nat_punch_req_encode(&m, &b), 0);
  assert_int_equal(gn_nat_on_message(w.nodes[0].nat, w.nodes[3].key, GN_MSG_NAT_PUNCH_REQ, b.data, b.len, w.now),
                   GN_EBUSY);
  assert_int_equal(w.qn, 0);
  gn_buf_done(&b);
  world_done(&w);
}

/* --- TCP punching -------------------------------------------------------------------*/

/* Node i is told by two reporters in two /24s that they see it at its ext
 * (not its listen address): it is behind a cone NAT. */
static void make_cone(world *w, int i) {
  node *n = &w->nodes[i];
  for (int k = 0; k < 2; k++) {
    char from[GN_NAT_ADDR_MAX];
    snprintf(from, sizeof from, "203.0.%d.1:7946", 100 + k);
    uint8_t key[GN_PK_LEN];
    memset(key, 0xc0 + k, sizeof key);
    assert_int_equal(gn_nat_ask(n->nat, key, from, w->now), 0);
    msg *q = &w->q[--w->qn]; /* the question, answered here rather than sent */
    gn_nat_observed ask;
    assert_int_equal(gn_nat_observed_decode(q->body, q->len, &ask), 0);
    gn_nat_observed a = {.answer = true};
    memcpy(a.nonce, ask.nonce, sizeof a.nonce);
    snprintf(a.addr, sizeof a.addr, "%s", n->ext);
    gn_buf b = {0};
    assert_int_equal(gn_nat_observed_encode(&a, &b), 0);
    assert_int_equal(gn_nat_on_datagram(n->nat, from, key, GN_MSG_NAT_OBSERVED, b.data, b.len, w->now), 0);
    gn_buf_done(&b);
  }
  assert_int_equal(gn_nat_type_get(n->nat, w->now), GN_NAT_CONE);
}

/* Nodes 0 and 1 behind cone NATs, both known to the rendezvous, node 2. */
static void cone_pair_world(world *w) {
  world_init(w);
  make_cone(w, 0);
  make_cone(w, 1);
  observe_via(w, 0, 2);
  observe_via(w, 1, 2);
}

static size_t tcp_held(const gn_nat *nat, uint64_t now) {
  size_t n = 0;
  gn_nat_tcp_info ti;
  while (gn_nat_tcp_get(nat, n, now, &ti))
    n++;
  return n;
}

/* Two cone nodes: each connects to the other's endpoint once the UDP hole
 * is open, the smaller key as the handshake's initiator. */
static void test_tcp_punch_connects_both_sides(void **state) {
  (void)state;
  static world w;
  cone_pair_world(&w);
  assert_int_equal(gn_nat_tcp_punch_start(w.nodes[0].nat, w.nodes[1].key, w.nodes[2].key, w.now), 0);
  assert_true(gn_nat_tcp_active(w.nodes[0].nat, w.nodes[1].key, w.now));
  world_run(&w);
  world_advance(&w, 1000);
  assert_int_equal(w.nodes[0].tcp_dials, 1);
  assert_int_equal(w.nodes[1].tcp_dials, 1);
  assert_string_equal(w.nodes[0].tcp_addr, w.nodes[1].ext);
  assert_string_equal(w.nodes[1].tcp_addr, w.nodes[0].ext);
  assert_true(w.nodes[0].tcp_initiator); /* key 0x10.. < 0x11.. */
  assert_false(w.nodes[1].tcp_initiator);
  assert_int_equal(w.nodes[2].tcp_dials, 0); /* the rendezvous only introduces */
  gn_nat_tcp_result(w.nodes[0].nat, w.nodes[1].key, 0, w.now);
  gn_nat_tcp_result(w.nodes[1].nat, w.nodes[0].key, 0, w.now);
  assert_false(gn_nat_tcp_active(w.nodes[0].nat, w.nodes[1].key, w.now));
  gn_nat_tcp_info ti;
  assert_true(gn_nat_tcp_get(w.nodes[0].nat, 0, w.now, &ti));
  assert_string_equal(ti.state, "connected");
  gn_nat_stats st;
  gn_nat_stats_get(w.nodes[1].nat, &st);
  assert_int_equal(st.tcp_ok, 1);
  /* The UDP hole stays open for the job network. */
  assert_int_equal(w.nodes[0].punched_ok, 1);
  /* Once per peer per GN_NAT_TCP_AGAIN_MS, then again. */
  assert_int_equal(gn_nat_tcp_punch_start(w.nodes[0].nat, w.nodes[1].key, w.nodes[2].key, w.now), GN_ETIMEDOUT);
  world_advance(&w, GN_NAT_TCP_AGAIN_MS);
  assert_int_equal(gn_nat_tcp_punch_start(w.nodes[0].nat, w.nodes[1].key, w.nodes[2].key, w.now), 0);
  world_run(&w);
  world_advance(&w, 1000);
  assert_int_equal(w.nodes[0].tcp_dials, 2);
  assert_int_equal(w.nodes[1].tcp_dials, 2);
  world_done(&w);
}

/* Only behind a cone NAT: a node of unknown or symmetric type does not
 * start one, nor takes the TCP part of an introduction. */
static void test_tcp_punch_needs_a_cone_nat(void **state) {
  (void)state;
  static world w;
  world_init(&w);
  observe_via(&w, 0, 2);
  observe_via(&w, 1, 2);
  assert_int_equal(gn_nat_tcp_punch_start(w.nodes[0].nat, w.nodes[1].key, w.nodes[2].key, w.now), GN_EPERM);
  make_cone(&w, 0);
  assert_int_equal(gn_nat_tcp_punch_start(w.nodes[0].nat, w.nodes[1].key, w.nodes[2].key, w.now), 0);
  world_run(&w);
  world_advance(&w, 1000);
  assert_int_equal(w.nodes[1].punched_ok, 1); /* the UDP hole, as before */
  assert_int_equal(w.nodes[1].tcp_dials, 0);
  gn_nat_stats st;
  gn_nat_stats_get(w.nodes[1].nat, &st);
  assert_int_equal(st.tcp_refused, 1);
  assert_int_equal(tcp_held(w.nodes[1].nat, w.now), 0);
  /* Without a glue that can connect, nothing either. */
  gn_nat *plain = lone("10.0.0.2:7946");
  assert_int_equal(gn_nat_tcp_punch_start(plain, w.nodes[1].key, w.nodes[2].key, 0), GN_EUNSUPPORTED);
  gn_nat_free(plain);
  world_done(&w);
}

/* Attack: a hostile rendezvous introduces us, with the TCP flag, to a
 * victim's address, over and over, under made-up keys: nothing signed
 * ever answers from there, so no connection is made, and the table of TCP
 * punches stays bounded. */
static void test_tcp_punch_hostile_rendezvous_cannot_aim_connects(void **state) {
  (void)state;
  static world w;
  world_init(&w);
  make_cone(&w, 0);
  for (int i = 0; i < 500; i++) {
    gn_nat_punch_req m = {.intro = true, .tcp = true, .addr = "192.0.2.99:80"};
    memset(m.peer, 0, sizeof m.peer);
    m.peer[0] = (uint8_t)i;
    m.peer[1] = (uint8_t)(i >> 8);
    m.peer[2] = 0xee;
    memset(m.nonce, i, sizeof m.nonce);
    gn_buf b = {0};
    assert_int_equal(gn_nat_punch_req_encode(&m, &b), 0);
    gn_nat_on_message(w.nodes[0].nat, w.nodes[3].key, GN_MSG_NAT_PUNCH_REQ, b.data, b.len, w.now);
    gn_buf_done(&b);
    assert_true(tcp_held(w.nodes[0].nat, w.now) <= GN_NAT_TCP_MAX);
    world_advance(&w, 100);
  }
  world_advance(&w, 10000);
  assert_int_equal(w.nodes[0].tcp_dials, 0);
  gn_nat_stats st;
  gn_nat_stats_get(w.nodes[0].nat, &st);
  assert_true(st.tcp_punches <= GN_NAT_TCP_MAX + 50000 / GN_NAT_TCP_AGAIN_MS * GN_NAT_TCP_MAX);
  assert_int_equal(st.tcp_ok, 0);
  world_done(&w);
}

/* Attack: a rendezvous names one address and the peer's signed datagrams
 * come from another (a liar on either side): the UDP hole may open, but no
 * TCP connection is made to either address. */
static void test_tcp_punch_only_where_rendezvous_and_peer_agree(void **state) {
  (void)state;
  static world w;
  cone_pair_world(&w);
  assert_int_equal(gn_nat_tcp_punch_start(w.nodes[0].nat, w.nodes[1].key, w.nodes[2].key, w.now), 0);
  /* The request's nonce; the rendezvous answers with another address. */
  gn_nat_punch_req req;
  assert_int_equal(gn_nat_punch_req_decode(w.q[w.qn - 1].body, w.q[w.qn - 1].len, &req), 0);
  w.qn = 0;
  gn_nat_punch_req m = {.intro = true, .tcp = true, .addr = "192.0.2.50:7"};
  memcpy(m.peer, w.nodes[1].key, GN_PK_LEN);
  memcpy(m.nonce, req.nonce, sizeof m.nonce);
  gn_buf b = {0};
  assert_int_equal(gn_nat_punch_req_encode(&m, &b), 0);
  assert_int_equal(gn_nat_on_message(w.nodes[0].nat, w.nodes[2].key, GN_MSG_NAT_PUNCH_REQ, b.data, b.len, w.now), 0);
  gn_buf_done(&b);
  w.qn = 0; /* the probes to 192.0.2.50 go nowhere */
  /* The peer answers from its own address, under the nonce. */
  gn_nat_punch k = {.ack = true};
  memcpy(k.nonce, req.nonce, sizeof k.nonce);
  assert_int_equal(gn_nat_punch_encode(&k, &b), 0);
  assert_int_equal(
      gn_nat_on_datagram(w.nodes[0].nat, w.nodes[1].ext, w.nodes[1].key, GN_MSG_NAT_PUNCH, b.data, b.len, w.now), 0);
  gn_buf_done(&b);
  world_advance(&w, GN_NAT_TCP_WAIT_MS);
  assert_int_equal(w.nodes[0].punched_ok, 1);
  assert_int_equal(w.nodes[0].tcp_dials, 0);
  gn_nat_stats st;
  gn_nat_stats_get(w.nodes[0].nat, &st);
  assert_int_equal(st.tcp_refused, 1);
  assert_int_equal(st.tcp_failed, 1);
  world_done(&w);
}

/* Attack: a peer has the rendezvous introduce it, with the TCP flag, every
 * 2 s for a minute (answering our probes each time): we connect to it once
 * per GN_NAT_TCP_AGAIN_MS, whatever it asks. */
static void test_tcp_punch_once_per_peer_per_window(void **state) {
  (void)state;
  static world w;
  cone_pair_world(&w);
  for (int i = 0; i < 30; i++) {
    gn_nat_punch_req m = {.intro = false, .tcp = true};
    memcpy(m.peer, w.nodes[0].key, GN_PK_LEN);
    memset(m.nonce, 0x30 + i, sizeof m.nonce);
    gn_buf b = {0};
    assert_int_equal(gn_nat_punch_req_encode(&m, &b), 0);
    gn_nat_on_message(w.nodes[2].nat, w.nodes[1].key, GN_MSG_NAT_PUNCH_REQ, b.data, b.len, w.now);
    gn_buf_done(&b);
    world_run(&w);
    world_advance(&w, 2000);
  }
  assert_true(w.nodes[0].tcp_dials >= 1);
  assert_true(w.nodes[0].tcp_dials <= 60000 / GN_NAT_TCP_AGAIN_MS);
  world_done(&w);
}

/* A connect that fails at once is made again every GN_NAT_TCP_RETRY_MS
 * until GN_NAT_TCP_WAIT_MS, then the punch has failed. */
static void test_tcp_punch_retries_until_its_wait(void **state) {
  (void)state;
  static world w;
  cone_pair_world(&w);
  w.nodes[0].tcp_fail_with = GN_EIO;
  assert_int_equal(gn_nat_tcp_punch_start(w.nodes[0].nat, w.nodes[1].key, w.nodes[2].key, w.now), 0);
  world_run(&w);
  world_advance(&w, GN_NAT_TCP_WAIT_MS + 2000);
  assert_true(w.nodes[0].tcp_dials >= GN_NAT_TCP_WAIT_MS / GN_NAT_TCP_RETRY_MS - 2);
  assert_true(w.nodes[0].tcp_dials <= GN_NAT_TCP_WAIT_MS / GN_NAT_TCP_RETRY_MS + 1);
  assert_false(gn_nat_tcp_active(w.nodes[0].nat, w.nodes[1].key, w.now));
  /* Node 1's connect stayed under way and no one reported: it ends too. */
  assert_int_equal(w.nodes[1].tcp_dials, 1);
  assert_false(gn_nat_tcp_active(w.nodes[1].nat, w.nodes[0].key, w.now));
  gn_nat_stats st;
  gn_nat_stats_get(w.nodes[1].nat, &st);
  assert_int_equal(st.tcp_failed, 1);
  int before = w.nodes[0].tcp_dials;
  world_advance(&w, 5000);
  assert_int_equal(w.nodes[0].tcp_dials, before);
  world_done(&w);
}

/* At most GN_NAT_TCP_MAX TCP punches at once. */
static void test_tcp_punch_table_is_bounded(void **state) {
  (void)state;
  static world w;
  world_init(&w);
  make_cone(&w, 0);
  int taken = 0;
  for (int i = 0; i < 3 * GN_NAT_TCP_MAX; i++) {
    uint8_t peer[GN_PK_LEN];
    memset(peer, 0, sizeof peer);
    peer[0] = (uint8_t)(i + 1);
    peer[31] = 0x77;
    int r = gn_nat_tcp_punch_start(w.nodes[0].nat, peer, w.nodes[2].key, w.now);
    assert_true(r == 0 || r == GN_EBUSY);
    taken += r == 0;
  }
  assert_int_equal(taken, GN_NAT_TCP_MAX);
  w.qn = 0;
  world_done(&w);
}

static void test_private_addresses(void **state) {
  (void)state;
  const char *priv[] = {"10.1.0.2:7946", "192.168.1.5:1", "172.16.0.1:2", "172.31.255.1:3",
                        "127.0.0.1:4",   "169.254.1.1:5", "100.64.0.1:6", "0.0.0.0:7",
                        "[::1]:8",       "[fd00::1]:9",   "[fe80::1]:10", "[::]:11"};
  const char *pub[] = {"198.18.101.2:7946", "172.32.0.1:1", "8.8.8.8:53", "100.128.0.1:2", "[2001:db8::1]:3"};
  for (size_t i = 0; i < sizeof priv / sizeof *priv; i++)
    assert_true(gn_nat_addr_private(priv[i]));
  for (size_t i = 0; i < sizeof pub / sizeof *pub; i++)
    assert_false(gn_nat_addr_private(pub[i]));
  assert_false(gn_nat_addr_private("not an address"));
}

/* --- the relay's book-keeping -------------------------------------------------------*/

static gn_relay *relay_new(size_t reservations, size_t sessions) {
  gn_relay_limits l;
  gn_relay_limits_default(&l);
  l.max_reservations = reservations;
  l.max_sessions = sessions;
  uint8_t seed[32] = {9};
  gn_relay *r = NULL;
  assert_int_equal(gn_relay_new(&l, seed, 0, &r), 0);
  return r;
}

static void key_n(uint8_t key[GN_PK_LEN], int i) {
  memset(key, 0, GN_PK_LEN);
  key[0] = (uint8_t)i;
  key[1] = (uint8_t)(i >> 8);
  key[31] = 0x5a;
}

static void test_relay_call_pairs_two_one_time_tokens(void **state) {
  (void)state;
  gn_relay *r = relay_new(8, 4);
  uint8_t a[GN_PK_LEN], b[GN_PK_LEN], ta[GN_RELAY_TOKEN_LEN], tb[GN_RELAY_TOKEN_LEN];
  key_n(a, 1);
  key_n(b, 2);
  uint64_t pair = 0, p2 = 0, exp = 0;
  int side = -1;
  /* Nobody to call before the target reserves. */
  assert_int_equal(gn_relay_call(r, a, b, 0, &pair, ta, tb), GN_ENOTFOUND);
  assert_int_equal(gn_relay_reserve(r, b, "192.0.2.7:40000", 0, &exp), 0);
  assert_int_equal(exp, GN_RELAY_RESERVE_TTL_MS);
  assert_int_equal(gn_relay_call(r, a, b, 10, &pair, ta, tb), 0);
  assert_memory_not_equal(ta, tb, GN_RELAY_TOKEN_LEN);
  assert_int_equal(gn_relay_claim(r, tb, 20, &p2, &side), 0);
  assert_int_equal(side, 1);
  assert_false(gn_relay_pair_ready(r, pair));
  assert_int_equal(gn_relay_claim(r, ta, 30, &p2, &side), 0);
  assert_int_equal(side, 0);
  assert_true(p2 == pair);
  assert_true(gn_relay_pair_ready(r, pair));
  /* Each token works once. */
  assert_int_equal(gn_relay_claim(r, ta, 40, &p2, &side), GN_ENOTFOUND);
  assert_int_equal(gn_relay_sessions(r, 40), 1);
  gn_relay_pair_end(r, pair);
  assert_int_equal(gn_relay_sessions(r, 40), 0);
  assert_false(gn_relay_pair_live(r, pair, 40));
  gn_relay_free(r);
}

static void test_relay_unclaimed_call_expires(void **state) {
  (void)state;
  gn_relay *r = relay_new(8, 1);
  uint8_t a[GN_PK_LEN], b[GN_PK_LEN], ta[GN_RELAY_TOKEN_LEN], tb[GN_RELAY_TOKEN_LEN];
  key_n(a, 1);
  key_n(b, 2);
  uint64_t pair = 0, p2 = 0;
  int side;
  assert_int_equal(gn_relay_reserve(r, b, "192.0.2.7:40000", 0, NULL), 0);
  assert_int_equal(gn_relay_call(r, a, b, 0, &pair, ta, tb), 0);
  assert_int_equal(gn_relay_claim(r, ta, 5, &p2, &side), 0);
  assert_true(gn_relay_pair_live(r, pair, GN_RELAY_CALL_WAIT_MS - 1));
  assert_false(gn_relay_pair_live(r, pair, GN_RELAY_CALL_WAIT_MS));
  assert_int_equal(gn_relay_claim(r, tb, GN_RELAY_CALL_WAIT_MS, &p2, &side), GN_ENOTFOUND);
  /* Its place is free again. */
  assert_int_equal(gn_relay_call(r, a, b, GN_RELAY_CALL_WAIT_MS, &pair, ta, tb), 0);
  gn_relay_free(r);
}

/* Attack: one network reserves slot after slot under fresh keys; then many
 * networks fill the table. Bounded both ways, and renewing takes no room. */
static void test_relay_slot_hog_is_bounded(void **state) {
  (void)state;
  gn_relay *r = relay_new(8, 4);
  int got = 0;
  for (int i = 0; i < 100; i++) {
    uint8_t k[GN_PK_LEN];
    key_n(k, i);
    got += gn_relay_reserve(r, k, "198.51.100.9:1000", 0, NULL) == 0;
  }
  assert_int_equal(got, GN_RELAY_PER_NET);
  uint8_t k0[GN_PK_LEN];
  key_n(k0, 0);
  for (int i = 0; i < 10; i++)
    assert_int_equal(gn_relay_reserve(r, k0, "198.51.100.9:1000", (uint64_t)i, NULL), 0);
  assert_int_equal(gn_relay_reservations(r, 10), GN_RELAY_PER_NET);
  got = 0;
  for (int i = 100; i < 200; i++) {
    uint8_t k[GN_PK_LEN];
    char addr[32];
    key_n(k, i);
    snprintf(addr, sizeof addr, "10.%d.%d.1:1", i / 200, i % 200);
    got += gn_relay_reserve(r, k, addr, 10, NULL) == 0;
  }
  assert_int_equal(got, 8 - GN_RELAY_PER_NET);
  assert_int_equal(gn_relay_reservations(r, 10), 8);
  gn_relay_stats st;
  gn_relay_stats_get(r, &st);
  assert_true(st.reserve_refused >= 98 + 94);
  /* Slots lapse unless renewed. */
  assert_int_equal(gn_relay_reservations(r, 10 + GN_RELAY_RESERVE_TTL_MS), 0);
  gn_relay_free(r);
}

/* Attack: a caller floods the relay with calls: its rate, then the session
 * table, stop it; another caller still gets through once room is back. */
static void test_relay_call_flood_is_bounded(void **state) {
  (void)state;
  gn_relay *r = relay_new(8, 16);
  uint8_t a[GN_PK_LEN], b[GN_PK_LEN], c[GN_PK_LEN], ta[GN_RELAY_TOKEN_LEN], tb[GN_RELAY_TOKEN_LEN];
  key_n(a, 1);
  key_n(b, 2);
  key_n(c, 3);
  uint64_t pair;
  assert_int_equal(gn_relay_reserve(r, b, "192.0.2.7:40000", 0, NULL), 0);
  int ok = 0;
  for (int i = 0; i < 1000; i++)
    ok += gn_relay_call(r, a, b, 0, &pair, ta, tb) == 0;
  assert_int_equal(ok, GN_RELAY_CALL_BURST);
  assert_int_equal(gn_relay_call(r, c, b, 0, &pair, ta, tb), 0);
  /* Spread over time, the session table is the bound. */
  ok = 0;
  for (int i = 0; i < 1000; i++) {
    uint8_t k[GN_PK_LEN];
    key_n(k, 1000 + i);
    ok += gn_relay_call(r, k, b, 1, &pair, ta, tb) == 0;
  }
  assert_int_equal(ok, 16 - GN_RELAY_CALL_BURST - 1);
  assert_int_equal(gn_relay_sessions(r, 1), 16);
  gn_relay_free(r);
}

/* Attack: a relayed pair pushes more than its bytes per second: the relay
 * pauses it so that over 10 s it passes at most 10 s of its rate plus one
 * second's burst, and the total rate holds across pairs. */
static void test_relay_bytes_over_the_limit_pause_the_pair(void **state) {
  (void)state;
  gn_relay_limits l;
  gn_relay_limits_default(&l);
  l.pair_bytes_per_s = 100000;
  l.total_bytes_per_s = 150000;
  uint8_t seed[32] = {1};
  gn_relay *r = NULL;
  assert_int_equal(gn_relay_new(&l, seed, 0, &r), 0);
  uint8_t a[GN_PK_LEN], b[GN_PK_LEN], c[GN_PK_LEN], ta[GN_RELAY_TOKEN_LEN], tb[GN_RELAY_TOKEN_LEN];
  key_n(a, 1);
  key_n(b, 2);
  key_n(c, 3);
  uint64_t p1, p2, x;
  int side;
  assert_int_equal(gn_relay_reserve(r, b, "192.0.2.7:40000", 0, NULL), 0);
  assert_int_equal(gn_relay_call(r, a, b, 0, &p1, ta, tb), 0);
  gn_relay_claim(r, ta, 0, &x, &side);
  gn_relay_claim(r, tb, 0, &x, &side);
  assert_int_equal(gn_relay_pair_charge(r, p1, 50000, 0), 0);
  assert_int_equal(gn_relay_pair_charge(r, p1, 50000, 0), 0);
  /* 100 kB over: a second's pause at 100 kB/s. */
  assert_int_equal(gn_relay_pair_charge(r, p1, 100000, 0), 1000);
  /* A reader that obeys the pauses passes at most rate x time + burst. */
  uint64_t now = 1000, passed = 0;
  while (now < 11000) {
    uint64_t wait = gn_relay_pair_charge(r, p1, 16384, now);
    passed += 16384;
    now += wait ? wait : 1;
  }
  assert_true(passed <= 10 * 100000 + 100000 + 16384);
  assert_true(passed >= 9 * 100000);
  /* A second pair shares the total: together they are held to 150 kB/s. */
  assert_int_equal(gn_relay_call(r, c, b, now, &p2, ta, tb), 0);
  gn_relay_claim(r, ta, now, &x, &side);
  gn_relay_claim(r, tb, now, &x, &side);
  uint64_t start = now, both = 0, t1 = now, t2 = now;
  while (now < start + 10000) {
    now = t1 < t2 ? t1 : t2;
    uint64_t w = gn_relay_pair_charge(r, t1 <= t2 ? p1 : p2, 16384, now);
    both += 16384;
    *(t1 <= t2 ? &t1 : &t2) = now + (w ? w : 1);
  }
  assert_true(both <= 10 * 150000 + 150000 + 2 * 16384 + 100000);
  gn_relay_stats st;
  gn_relay_stats_get(r, &st);
  assert_true(st.paused > 0);
  gn_relay_free(r);
}

static void test_relay_codecs_round_trip(void **state) {
  (void)state;
  gn_buf b = {0};
  gn_relay_status_msg s = {.ok = true, .addr = "198.51.100.1:40404", .has_call = true}, s2;
  memset(s.peer, 4, sizeof s.peer);
  memset(s.token, 5, sizeof s.token);
  assert_int_equal(gn_relay_status_encode(&s, &b), 0);
  assert_int_equal(gn_relay_status_decode(b.data, b.len, &s2), 0);
  assert_true(s2.ok && s2.has_call);
  assert_string_equal(s2.addr, s.addr);
  assert_memory_equal(s2.token, s.token, GN_RELAY_TOKEN_LEN);
  b.len = 0;
  gn_relay_call_msg c = {.from_relay = true, .addr = "198.51.100.1:40404"}, c2;
  memset(c.peer, 6, sizeof c.peer);
  assert_int_equal(gn_relay_call_encode(&c, &b), 0);
  assert_int_equal(gn_relay_call_decode(b.data, b.len, &c2), 0);
  assert_true(c2.from_relay);
  assert_string_equal(c2.addr, c.addr);
  b.len = 0;
  gn_relay_reserve_msg rv = {.reserve = true}, rv2;
  assert_int_equal(gn_relay_reserve_encode(&rv, &b), 0);
  assert_int_equal(gn_relay_reserve_decode(b.data, b.len, &rv2), 0);
  assert_true(rv2.reserve);
  /* A status whose address is a name is refused. */
  gn_relay_status_msg bad = {.ok = true, .addr = "relay.example:1"};
  b.len = 0;
  assert_int_equal(gn_relay_status_encode(&bad, &b), GN_EINVAL);
  gn_buf_done(&b);
}

/* --- reaching a peer through the relay its offer names ------------------------------*/

typedef struct reach_world {
  bool peer_up, relay_up;
  bool refuse; /* the relay refuses every call at once */
  int dials, calls, done;
  gn_reach_outcome outcome;
  char why[GN_RELAY_WHY_MAX];
  char dialled[64];
  uint8_t peer[GN_PK_LEN], relay[GN_PK_LEN];
  uint64_t now;
  gn_reach *r;
} reach_world;

static reach_world RW;

static bool rw_is_up(void *ud, const uint8_t key[GN_PK_LEN]) {
  reach_world *w = ud;
  return memcmp(key, w->peer, GN_PK_LEN) == 0 ? w->peer_up : memcmp(key, w->relay, GN_PK_LEN) == 0 && w->relay_up;
}

static int rw_dial(void *ud, const char *addr, const uint8_t key[GN_PK_LEN]) {
  reach_world *w = ud;
  assert_memory_equal(key, w->relay, GN_PK_LEN);
  snprintf(w->dialled, sizeof w->dialled, "%s", addr);
  w->dials++;
  return 0;
}

static int rw_call(void *ud, const uint8_t relay[GN_PK_LEN], const uint8_t peer[GN_PK_LEN]) {
  reach_world *w = ud;
  assert_memory_equal(relay, w->relay, GN_PK_LEN);
  assert_memory_equal(peer, w->peer, GN_PK_LEN);
  w->calls++;
  return 0;
}

static void rw_done(void *ud, const uint8_t peer[GN_PK_LEN], const uint8_t relay[GN_PK_LEN], gn_reach_outcome o,
                    const char *why) {
  reach_world *w = ud;
  assert_memory_equal(peer, w->peer, GN_PK_LEN);
  assert_memory_equal(relay, w->relay, GN_PK_LEN);
  w->done++;
  w->outcome = o;
  snprintf(w->why, sizeof w->why, "%s", why);
}

static void rw_init(void) {
  memset(&RW, 0, sizeof RW);
  memset(RW.peer, 0xb0, GN_PK_LEN);
  memset(RW.relay, 0x4e, GN_PK_LEN);
  RW.now = 1000000;
  gn_reach_io io = {rw_is_up, rw_dial, rw_call, rw_done, &RW};
  assert_int_equal(gn_reach_new(&io, &RW.r), 0);
}

/* Runs the machine in 100 ms steps for ms, refusing calls when asked to. */
static void rw_run(uint64_t ms) {
  for (uint64_t end = RW.now + ms; RW.now < end;) {
    RW.now += 100;
    int calls = RW.calls;
    gn_reach_tick(RW.r, RW.now);
    if (RW.refuse && RW.calls > calls)
      gn_reach_refused(RW.r, RW.relay, RW.peer, "that peer holds no slot here", RW.now);
  }
}

static void test_reach_direct_session_needs_no_relay(void **state) {
  (void)state;
  rw_init();
  RW.relay_up = true;
  assert_int_equal(gn_reach_want(RW.r, RW.peer, RW.relay, "192.0.2.7:7946", true, RW.now), 0);
  rw_run(1500);
  RW.peer_up = true;
  rw_run(100);
  assert_int_equal(RW.done, 1);
  assert_int_equal(RW.outcome, GN_REACH_DIRECT);
  assert_int_equal(RW.calls + RW.dials, 0);
  gn_reach_stats st;
  gn_reach_stats_get(RW.r, &st);
  assert_int_equal(st.direct, 1);
  RW.r = gn_reach_free(RW.r);
}

static void test_reach_calls_the_relay_after_the_grace(void **state) {
  (void)state;
  rw_init();
  RW.relay_up = true;
  assert_int_equal(gn_reach_want(RW.r, RW.peer, RW.relay, "192.0.2.7:7946", true, RW.now), 0);
  rw_run(GN_REACH_GRACE_MS - 100);
  assert_int_equal(RW.calls, 0);
  assert_true(gn_reach_active(RW.r, RW.peer));
  assert_false(gn_reach_active(RW.r, RW.relay));
  rw_run(100);
  assert_int_equal(RW.calls, 1);
  assert_int_equal(RW.dials, 0); /* its session was up: no dial */
  RW.peer_up = true;             /* the splice's session */
  gn_reach_up(RW.r, RW.peer, RW.now);
  assert_int_equal(RW.done, 1);
  assert_int_equal(RW.outcome, GN_REACH_RELAYED);
  gn_reach_stats st;
  gn_reach_stats_get(RW.r, &st);
  assert_int_equal(st.relayed, 1);
  assert_false(gn_reach_get(RW.r, 0, &(gn_reach_info){0}));
  RW.r = gn_reach_free(RW.r);
}

/* Without a direct dial (it could not start) the relay is asked at once;
 * with no session to the relay it is dialled first, and called once up. */
static void test_reach_dials_the_relay_then_calls(void **state) {
  (void)state;
  rw_init();
  assert_int_equal(gn_reach_want(RW.r, RW.peer, RW.relay, "192.0.2.7:7946", false, RW.now), 0);
  assert_int_equal(RW.dials, 1);
  assert_string_equal(RW.dialled, "192.0.2.7:7946");
  assert_int_equal(RW.calls, 0);
  rw_run(1000);
  RW.relay_up = true;
  gn_reach_up(RW.r, RW.relay, RW.now);
  assert_int_equal(RW.calls, 1);
  assert_int_equal(RW.dials, 1);
  RW.r = gn_reach_free(RW.r);
}

/* An offer naming a victim's address (or a node that is not its relay)
 * as relay: one dial, then the attempt is given up, and the peer is not
 * tried again for GN_REACH_FORGET_MS whatever asks for it. */
static void test_reach_hostile_relay_address_costs_one_dial(void **state) {
  (void)state;
  rw_init();
  assert_int_equal(gn_reach_want(RW.r, RW.peer, RW.relay, "198.51.100.9:22", true, RW.now), 0);
  rw_run(GN_REACH_GRACE_MS + GN_REACH_RELAY_WAIT_MS + 1000);
  assert_int_equal(RW.dials, 1);
  assert_int_equal(RW.calls, 0);
  assert_int_equal(RW.done, 1);
  assert_int_equal(RW.outcome, GN_REACH_GAVE_UP);
  assert_non_null(strstr(RW.why, "did not answer"));
  assert_false(gn_reach_active(RW.r, RW.peer)); /* given up */
  for (int i = 0; i < 50; i++) {
    assert_int_equal(gn_reach_want(RW.r, RW.peer, RW.relay, "198.51.100.9:22", true, RW.now), GN_ETIMEDOUT);
    rw_run(100);
  }
  assert_int_equal(RW.dials, 1);
  rw_run(GN_REACH_FORGET_MS);
  assert_int_equal(gn_reach_want(RW.r, RW.peer, RW.relay, "198.51.100.9:22", true, RW.now), 0);
  rw_run(GN_REACH_GRACE_MS);
  assert_int_equal(RW.dials, 2);
  RW.r = gn_reach_free(RW.r);
}

/* A relay that refuses: calls after 2 s, then 4 s, and no more than
 * GN_REACH_CALLS, then given up with the relay's reason. */
static void test_reach_refusals_back_off_and_give_up(void **state) {
  (void)state;
  rw_init();
  RW.relay_up = true;
  RW.refuse = true;
  assert_int_equal(gn_reach_want(RW.r, RW.peer, RW.relay, "192.0.2.7:7946", true, RW.now), 0);
  rw_run(GN_REACH_GRACE_MS);
  assert_int_equal(RW.calls, 1);
  rw_run(GN_REACH_BACKOFF_MS - 100);
  assert_int_equal(RW.calls, 1);
  rw_run(100);
  assert_int_equal(RW.calls, 2);
  rw_run(2 * GN_REACH_BACKOFF_MS - 100);
  assert_int_equal(RW.calls, 2);
  rw_run(100);
  assert_int_equal(RW.calls, GN_REACH_CALLS);
  rw_run(60000);
  assert_int_equal(RW.calls, GN_REACH_CALLS);
  assert_int_equal(RW.done, 1);
  assert_int_equal(RW.outcome, GN_REACH_GAVE_UP);
  assert_string_equal(RW.why, "that peer holds no slot here");
  RW.r = gn_reach_free(RW.r);
}

/* Calls that bring no session are repeated GN_REACH_CALL_WAIT_MS apart. */
static void test_reach_unanswered_calls_are_bounded(void **state) {
  (void)state;
  rw_init();
  RW.relay_up = true;
  assert_int_equal(gn_reach_want(RW.r, RW.peer, RW.relay, "192.0.2.7:7946", true, RW.now), 0);
  rw_run(GN_REACH_GRACE_MS + GN_REACH_CALL_WAIT_MS - 100);
  assert_int_equal(RW.calls, 1);
  rw_run(100);
  assert_int_equal(RW.calls, 2);
  rw_run(2 * GN_REACH_CALL_WAIT_MS + 100); /* the last call unanswered too */
  assert_int_equal(RW.calls, GN_REACH_CALLS);
  assert_int_equal(RW.outcome, GN_REACH_GAVE_UP);
  gn_reach_info ri;
  assert_true(gn_reach_get(RW.r, 0, &ri));
  assert_string_equal(ri.state, "gave-up");
  RW.r = gn_reach_free(RW.r);
}

/* A TCP punch holds the call past the grace, until it ends (or at most
 * GN_REACH_HOLD_MAX_MS after the want). */
static void test_reach_hold_waits_for_a_punch(void **state) {
  (void)state;
  rw_init();
  RW.relay_up = true;
  uint64_t t0 = RW.now;
  assert_int_equal(gn_reach_want(RW.r, RW.peer, RW.relay, "192.0.2.7:7946", true, RW.now), 0);
  gn_reach_hold(RW.r, RW.peer, RW.now + 60000, RW.now);
  rw_run(GN_REACH_GRACE_MS + 1000);
  assert_int_equal(RW.calls, 0);
  gn_reach_hold(RW.r, RW.peer, RW.now, RW.now); /* the punch failed */
  assert_int_equal(RW.calls, 1);
  gn_reach_hold(RW.r, RW.peer, RW.now + 60000, RW.now); /* a call was made: no hold */
  assert_int_equal(gn_reach_next_deadline_ms(RW.r), RW.now + GN_REACH_CALL_WAIT_MS);
  RW.r = gn_reach_free(RW.r);
  /* Capped. */
  rw_init();
  RW.relay_up = true;
  t0 = RW.now;
  assert_int_equal(gn_reach_want(RW.r, RW.peer, RW.relay, "192.0.2.7:7946", true, RW.now), 0);
  gn_reach_hold(RW.r, RW.peer, RW.now + 60000, RW.now);
  assert_int_equal(gn_reach_next_deadline_ms(RW.r), t0 + GN_REACH_HOLD_MAX_MS);
  rw_run(GN_REACH_HOLD_MAX_MS);
  assert_int_equal(RW.calls, 1);
  RW.r = gn_reach_free(RW.r);
}

/* The relay had to be dialled first: a punch through it, once it is up,
 * holds the call the same way (from the hold, at most
 * GN_REACH_HOLD_MAX_MS), and the relay's session coming up does not call
 * past the hold. */
static void test_reach_hold_after_dialling_the_relay(void **state) {
  (void)state;
  rw_init();
  assert_int_equal(gn_reach_want(RW.r, RW.peer, RW.relay, "192.0.2.7:7946", true, RW.now), 0);
  rw_run(GN_REACH_GRACE_MS);
  assert_int_equal(RW.dials, 1);
  rw_run(1000);
  RW.relay_up = true;
  gn_reach_hold(RW.r, RW.peer, RW.now + 60000, RW.now);
  gn_reach_up(RW.r, RW.relay, RW.now);
  assert_int_equal(RW.calls, 0);
  uint64_t held = RW.now;
  rw_run(GN_REACH_HOLD_MAX_MS - 100);
  assert_int_equal(RW.calls, 0);
  rw_run(100);
  assert_int_equal(RW.calls, 1);
  assert_int_equal(RW.now, held + GN_REACH_HOLD_MAX_MS);
  RW.r = gn_reach_free(RW.r);
  /* Released early: the call follows at once. */
  rw_init();
  assert_int_equal(gn_reach_want(RW.r, RW.peer, RW.relay, "192.0.2.7:7946", true, RW.now), 0);
  rw_run(GN_REACH_GRACE_MS);
  RW.relay_up = true;
  gn_reach_hold(RW.r, RW.peer, RW.now + 60000, RW.now);
  gn_reach_up(RW.r, RW.relay, RW.now);
  rw_run(1000);
  assert_int_equal(RW.calls, 0);
  gn_reach_hold(RW.r, RW.peer, RW.now, RW.now);
  assert_int_equal(RW.calls, 1);
  RW.r = gn_reach_free(RW.r);
}

static void test_reach_table_is_bounded(void **state) {
  (void)state;
  rw_init();
  uint8_t peer[GN_PK_LEN];
  memset(peer, 0, sizeof peer);
  assert_int_equal(gn_reach_want(RW.r, RW.relay, RW.relay, "192.0.2.7:7946", true, RW.now), GN_EINVAL);
  assert_int_equal(gn_reach_want(RW.r, RW.peer, RW.relay, "relay.example:7946", true, RW.now), GN_EINVAL);
  assert_int_equal(gn_reach_want(RW.r, RW.peer, RW.relay, "192.0.2.7:0", true, RW.now), GN_EINVAL);
  for (int i = 0; i < GN_REACH_MAX; i++) {
    peer[0] = (uint8_t)i;
    assert_int_equal(gn_reach_want(RW.r, peer, RW.relay, "192.0.2.7:7946", true, RW.now), 0);
  }
  peer[0] = 0;
  assert_int_equal(gn_reach_want(RW.r, peer, RW.relay, "192.0.2.7:7946", true, RW.now), GN_EEXIST);
  peer[0] = 0xff;
  assert_int_equal(gn_reach_want(RW.r, peer, RW.relay, "192.0.2.7:7946", true, RW.now), GN_EBUSY);
  RW.r = gn_reach_free(RW.r);
}

/* The offer's relay: signed with the rest, optional, checked. */
static void test_offer_names_its_relay(void **state) {
  (void)state;
  gn_identity *id = NULL;
  assert_int_equal(gn_identity_generate(&id), 0);
  gn_offer o = {.seq = 1, .issued_s = 1000, .expires_s = 1060, .gpus_free = 1, .gpus_total = 1, .max_hours = 1};
  memcpy(o.provider, id->pk, GN_PK_LEN);
  snprintf(o.addr, sizeof o.addr, "10.0.3.2:7946");
  snprintf(o.gpu_model, sizeof o.gpu_model, "RTX 4090");
  snprintf(o.currency, sizeof o.currency, "EUR");
  gn_buf plain = {0}, body = {0}, env = {0};
  assert_int_equal(gn_offer_encode(&o, &plain), 0);
  memset(o.relay_id, 0x4e, GN_PK_LEN);
  snprintf(o.relay_addr, sizeof o.relay_addr, "192.0.2.7:7946");
  assert_int_equal(gn_offer_encode(&o, &body), 0);
  gn_offer d;
  assert_int_equal(gn_offer_decode(body.data, body.len, &d), 0);
  assert_string_equal(d.relay_addr, "192.0.2.7:7946");
  assert_memory_equal(d.relay_id, o.relay_id, GN_PK_LEN);
  assert_int_equal(gn_offer_decode(plain.data, plain.len, &d), 0); /* an offer without one */
  assert_string_equal(d.relay_addr, "");
  /* Under the signature: an envelope with the relay verifies as itself. */
  assert_int_equal(gn_offer_seal(id, &o, &env), 0);
  gn_envelope e;
  assert_int_equal(gn_envelope_open(env.data, env.len, &e), 0);
  assert_int_equal(gn_offer_decode(e.body, e.body_len, &d), 0);
  assert_string_equal(d.relay_addr, "192.0.2.7:7946");
  gn_buf bad = {0};
  snprintf(o.relay_addr, sizeof o.relay_addr, "relay.example:7946");
  assert_int_equal(gn_offer_encode(&o, &bad), GN_EINVAL);
  snprintf(o.relay_addr, sizeof o.relay_addr, "192.0.2.7:7946");
  memcpy(o.relay_id, o.provider, GN_PK_LEN);
  assert_int_equal(gn_offer_encode(&o, &bad), GN_EINVAL);
  /* relay_id without relay_addr: malformed. */
  gn_wire_doc doc;
  assert_int_equal(gn_wire_decode(body.data, body.len, &doc), 0);
  gn_wire_writer w;
  gn_wire_writer_init(&w);
  const msgpack_object_map *m = &doc.root->via.map;
  gn_wire_put_map(&w, m->size - 1);
  for (uint32_t i = 0; i < m->size; i++) {
    const msgpack_object_kv *kv = &m->ptr[i];
    if (kv->key.via.str.size == 10 && memcmp(kv->key.via.str.ptr, "relay_addr", 10) == 0)
      continue;
    msgpack_pack_object(&w.pk, kv->key);
    msgpack_pack_object(&w.pk, kv->val);
  }
  assert_int_equal(gn_wire_writer_take(&w, &bad), 0);
  gn_wire_writer_done(&w);
  gn_wire_doc_done(&doc);
  assert_int_equal(gn_offer_decode(bad.data, bad.len, &d), GN_EINVAL);
  gn_buf_done(&bad);
  gn_buf_done(&plain);
  gn_buf_done(&body);
  gn_buf_done(&env);
  gn_identity_free(id);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_codecs_round_trip),
      cmocka_unit_test(test_codecs_refuse_malformed),
      cmocka_unit_test(test_unknown_until_two_networks_agree),
      cmocka_unit_test(test_public_when_seen_at_the_listen_address),
      cmocka_unit_test(test_symmetric_when_each_network_sees_another_port),
      cmocka_unit_test(test_a_liar_cannot_move_the_advertised_address),
      cmocka_unit_test(test_unasked_answers_are_ignored),
      cmocka_unit_test(test_questions_are_bounded_and_not_repeated),
      cmocka_unit_test(test_observations_expire),
      cmocka_unit_test(test_observation_table_is_bounded),
      cmocka_unit_test(test_punch_through_a_rendezvous_connects_both_sides),
      cmocka_unit_test(test_punch_fails_when_nothing_gets_through),
      cmocka_unit_test(test_punch_to_an_unknown_peer_fails_at_once),
      cmocka_unit_test(test_punch_request_flood_is_rate_limited),
      cmocka_unit_test(test_introduction_flood_is_bounded),
      cmocka_unit_test(test_stranger_probe_is_not_answered),
      cmocka_unit_test(test_introduction_cannot_redirect_a_punch_in_progress),
      cmocka_unit_test(test_tcp_punch_connects_both_sides),
      cmocka_unit_test(test_tcp_punch_needs_a_cone_nat),
      cmocka_unit_test(test_tcp_punch_hostile_rendezvous_cannot_aim_connects),
      cmocka_unit_test(test_tcp_punch_only_where_rendezvous_and_peer_agree),
      cmocka_unit_test(test_tcp_punch_once_per_peer_per_window),
      cmocka_unit_test(test_tcp_punch_retries_until_its_wait),
      cmocka_unit_test(test_tcp_punch_table_is_bounded),
      cmocka_unit_test(test_private_addresses),
      cmocka_unit_test(test_relay_call_pairs_two_one_time_tokens),
      cmocka_unit_test(test_relay_unclaimed_call_expires),
      cmocka_unit_test(test_relay_slot_hog_is_bounded),
      cmocka_unit_test(test_relay_call_flood_is_bounded),
      cmocka_unit_test(test_relay_bytes_over_the_limit_pause_the_pair),
      cmocka_unit_test(test_relay_codecs_round_trip),
      cmocka_unit_test(test_reach_direct_session_needs_no_relay),
      cmocka_unit_test(test_reach_calls_the_relay_after_the_grace),
      cmocka_unit_test(test_reach_dials_the_relay_then_calls),
      cmocka_unit_test(test_reach_hostile_relay_address_costs_one_dial),
      cmocka_unit_test(test_reach_refusals_back_off_and_give_up),
      cmocka_unit_test(test_reach_unanswered_calls_are_bounded),
      cmocka_unit_test(test_reach_hold_waits_for_a_punch),
      cmocka_unit_test(test_reach_hold_after_dialling_the_relay),
      cmocka_unit_test(test_reach_table_is_bounded),
      cmocka_unit_test(test_offer_names_its_relay),
  };
  int r = cmocka_run_group_tests(tests, NULL, NULL);
  gn_buf_done(&g_last_body);
  return r;
}
