/* libFuzzer target: the decoders of the NAT messages (p2p/nat.c,
 * docs/protocol.md §2.16) on arbitrary bytes, and the state machine fed
 * them as datagrams and session messages. The first byte picks the message:
 * NAT_OBSERVED, NAT_PUNCH_REQ, NAT_PUNCH, RELAY_RESERVE, RELAY_STATUS or
 * RELAY_CALL (p2p/relay.c). What decodes encodes and decodes
 * again to the same; the machine's tables stay within their bounds. The
 * same bytes then drive the relay-reaching machine (gn_reach) as a list of
 * operations: it never dials or calls more than its bounds allow. */
#include <gpunet/nat.h>
#include <gpunet/relay.h>
#include <gpunet/wire.h>

static size_t sent;

/* The reach machine (p2p/relay.c) driven by the same bytes: which keys are
 * up, and what it dialled and called. */
static bool up_keys[4];
static size_t reach_dials, reach_calls;

static bool reach_is_up(void *ud, const uint8_t key[GN_PK_LEN]) {
  (void)ud;
  return up_keys[key[0] & 3];
}

static int reach_dial(void *ud, const char *addr, const uint8_t key[GN_PK_LEN]) {
  (void)ud;
  (void)key;
  if (!gn_nat_addr_valid(addr))
    __builtin_trap();
  reach_dials++;
  return 0;
}

static int reach_call(void *ud, const uint8_t relay[GN_PK_LEN], const uint8_t peer[GN_PK_LEN]) {
  (void)ud;
  if (!up_keys[relay[0] & 3] || memcmp(relay, peer, GN_PK_LEN) == 0)
    __builtin_trap();
  reach_calls++;
  return 0;
}

/* Each byte an operation on keys 0..3 (peers and relays alike): want,
 * refused, a session up or down, time passing. Each attempt dials its
 * relay at most once and calls it at most GN_REACH_CALLS times. */
static void fuzz_reach(const uint8_t *data, size_t size) {
  gn_reach_io io = {reach_is_up, reach_dial, reach_call, NULL, NULL};
  gn_reach *r = NULL;
  if (gn_reach_new(&io, &r) != 0)
    __builtin_trap();
  memset(up_keys, 0, sizeof up_keys);
  reach_dials = reach_calls = 0;
  size_t wanted = 0;
  uint64_t now = 1000;
  uint8_t k1[GN_PK_LEN], k2[GN_PK_LEN];
  for (size_t i = 0; i < size; i++) {
    uint8_t op = data[i] >> 5, x = data[i] & 3, y = (data[i] >> 2) & 3;
    memset(k1, x, sizeof k1);
    memset(k2, y, sizeof k2);
    switch (op) {
    case 0:
    case 1:
      wanted += gn_reach_want(r, k1, k2, "192.0.2.7:7946", op == 0, now) == 0;
      break;
    case 2:
      gn_reach_refused(r, k2, k1, "no", now);
      break;
    case 3:
      up_keys[x] = true;
      gn_reach_up(r, k1, now);
      break;
    case 4:
      up_keys[x] = false;
      break;
    default:
      now += (uint64_t)(data[i] & 31) * 500;
      gn_reach_tick(r, now);
      break;
    }
    if (gn_reach_next_deadline_ms(r) != UINT64_MAX && gn_reach_next_deadline_ms(r) > now + 60000)
      __builtin_trap();
  }
  gn_reach_tick(r, now + 100000);
  if (reach_dials > wanted || reach_calls > wanted * GN_REACH_CALLS)
    __builtin_trap();
  gn_reach_free(r);
}

static void dgram(void *ud, const char *addr, uint32_t type, const uint8_t *body, size_t len) {
  (void)ud;
  (void)type;
  (void)body;
  if (!gn_nat_addr_valid(addr) || len > 512)
    __builtin_trap();
  sent++;
}

static int msg(void *ud, const uint8_t peer[GN_PK_LEN], uint32_t type, const uint8_t *body, size_t len) {
  (void)ud;
  (void)peer;
  (void)type;
  (void)body;
  if (len > 512)
    __builtin_trap();
  sent++;
  return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1)
    return 0;
  uint8_t which = data[0] % 6;
  data++;
  size--;
  gn_buf b = {0};
  if (which == 0) {
    gn_nat_observed m, m2;
    if (gn_nat_observed_decode(data, size, &m) == 0) {
      if (gn_nat_observed_encode(&m, &b) != 0 || gn_nat_observed_decode(b.data, b.len, &m2) != 0 ||
          m2.answer != m.answer || memcmp(m2.nonce, m.nonce, sizeof m.nonce) != 0 || strcmp(m2.addr, m.addr) != 0)
        __builtin_trap();
    }
  } else if (which == 1) {
    gn_nat_punch_req m, m2;
    if (gn_nat_punch_req_decode(data, size, &m) == 0) {
      if (gn_nat_punch_req_encode(&m, &b) != 0 || gn_nat_punch_req_decode(b.data, b.len, &m2) != 0 ||
          m2.intro != m.intro || m2.tcp != m.tcp || memcmp(m2.peer, m.peer, GN_PK_LEN) != 0 ||
          strcmp(m2.addr, m.addr) != 0)
        __builtin_trap();
    }
  } else if (which == 3) {
    gn_relay_reserve_msg m, m2;
    if (gn_relay_reserve_decode(data, size, &m) == 0) {
      if (gn_relay_reserve_encode(&m, &b) != 0 || gn_relay_reserve_decode(b.data, b.len, &m2) != 0 ||
          m2.reserve != m.reserve)
        __builtin_trap();
    }
  } else if (which == 4) {
    gn_relay_status_msg m, m2;
    if (gn_relay_status_decode(data, size, &m) == 0) {
      if (gn_relay_status_encode(&m, &b) != 0 || gn_relay_status_decode(b.data, b.len, &m2) != 0 || m2.ok != m.ok ||
          m2.has_call != m.has_call || strcmp(m2.addr, m.addr) != 0 || strcmp(m2.why, m.why) != 0)
        __builtin_trap();
    }
  } else if (which == 5) {
    gn_relay_call_msg m, m2;
    if (gn_relay_call_decode(data, size, &m) == 0) {
      if (gn_relay_call_encode(&m, &b) != 0 || gn_relay_call_decode(b.data, b.len, &m2) != 0 ||
          m2.from_relay != m.from_relay || memcmp(m2.peer, m.peer, GN_PK_LEN) != 0 || strcmp(m2.addr, m.addr) != 0)
        __builtin_trap();
    }
  } else {
    gn_nat_punch m, m2;
    if (gn_nat_punch_decode(data, size, &m) == 0) {
      if (gn_nat_punch_encode(&m, &b) != 0 || gn_nat_punch_decode(b.data, b.len, &m2) != 0 || m2.ack != m.ack)
        __builtin_trap();
    }
  }
  gn_buf_done(&b);
  /* The machine: the same bytes as each kind of input, from two peers. */
  uint8_t self[GN_PK_LEN], a[GN_PK_LEN], seed[32] = {1};
  memset(self, 1, sizeof self);
  memset(a, 2, sizeof a);
  gn_nat_io io = {dgram, msg, NULL, NULL, NULL};
  gn_nat *nat = NULL;
  if (gn_nat_new(self, "10.0.0.1:7946", &io, seed, 0, &nat) != 0)
    __builtin_trap();
  gn_nat_ask(nat, a, "192.0.2.1:7946", 0);
  sent = 0;
  gn_nat_on_datagram(nat, "192.0.2.1:7946", a, GN_MSG_NAT_OBSERVED, data, size, 1);
  gn_nat_on_datagram(nat, "192.0.2.1:7946", a, GN_MSG_NAT_PUNCH, data, size, 2);
  gn_nat_on_message(nat, a, GN_MSG_NAT_PUNCH_REQ, data, size, 3);
  gn_nat_tick(nat, 10000);
  if (sent > 3 || gn_nat_punch_count(nat) > 1 || gn_nat_observation_count(nat, 10) > 1)
    __builtin_trap();
  char buf[GN_NAT_ADDR_MAX];
  gn_nat_advertised(nat, 10, buf, sizeof buf);
  gn_nat_free(nat);
  fuzz_reach(data, size);
  return 0;
}
