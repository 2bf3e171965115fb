/* libFuzzer target: the partial views driven by a hostile script. The input
 * is a sequence of records {op, peer, len, len bytes}: op picks a view
 * message (types 76-82, the bytes its body, from one of 16 peers), a session
 * coming up or going down, time passing, a contact or a passive entry being
 * added. A single record is an arbitrary body of one type on a fresh
 * instance; longer scripts reach the states between. After every step the
 * views' invariants are checked: sizes within bounds, never ourselves, no
 * peer in both views, only valid addresses handed out. */
#include <gpunet/views.h>
#include <gpunet/wire.h>

#include <stdio.h>

#define NPEERS 16

static const uint8_t self[GN_PK_LEN] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1,
                                        1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1};

static void check(bool ok) {
  if (!ok)
    __builtin_trap();
}

static bool is_self(const uint8_t id[GN_PK_LEN]) {
  return memcmp(id, self, GN_PK_LEN) == 0;
}

static int io_send(void *ud, const uint8_t peer[GN_PK_LEN], uint32_t type, const uint8_t *body, size_t len) {
  (void)ud;
  check(!is_self(peer));
  check(type >= GN_MSG_VIEW_JOIN && type <= GN_MSG_VIEW_SHUFFLE_REPLY && len <= GN_VIEWS_BODY_MAX && (body || !len));
  return peer[1] & 1 ? GN_ECLOSED : 0; /* peers with an odd second byte have no session: dialled */
}

static void io_connect(void *ud, const uint8_t peer[GN_PK_LEN], const char *addr) {
  (void)ud;
  check(!is_self(peer) && gn_views_addr_valid(addr));
}

static void peer_of(uint8_t n, uint8_t id[GN_PK_LEN], char addr[GN_VIEWS_ADDR_MAX]) {
  memset(id, 2, GN_PK_LEN);
  id[1] = n;
  snprintf(addr, GN_VIEWS_ADDR_MAX, "10.0.1.%u:7000", (unsigned)n);
}

static void check_invariants(const gn_views *v) {
  static gn_views_peer a[GN_VIEWS_ACTIVE_MAX], p[GN_VIEWS_PASSIVE_MAX];
  size_t na = gn_views_active(v, a, GN_VIEWS_ACTIVE_MAX), np = gn_views_passive(v, p, GN_VIEWS_PASSIVE_MAX);
  check(na <= 6 && np <= 48 && gn_views_pending_count(v) <= GN_VIEWS_PENDING_MAX &&
        gn_views_rate_count(v) <= GN_VIEWS_RATE_MAX);
  for (size_t i = 0; i < na; i++) {
    check(!is_self(a[i].id) && strcmp(a[i].addr, "10.0.0.1:7000") != 0);
    check(a[i].addr[0] == 0 || gn_views_addr_valid(a[i].addr));
    check(!gn_views_is_passive(v, a[i].id));
  }
  for (size_t i = 0; i < np; i++) {
    check(!is_self(p[i].id) && gn_views_addr_valid(p[i].addr) && strcmp(p[i].addr, "10.0.0.1:7000") != 0);
    for (size_t j = 0; j < i; j++)
      check(memcmp(p[i].id, p[j].id, GN_PK_LEN) != 0 && strcmp(p[i].addr, p[j].addr) != 0);
  }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  gn_views_io io = {io_send, io_connect, NULL, NULL, NULL};
  gn_views *v = NULL;
  check(gn_views_new(self, "10.0.0.1:7000", NULL, &io, 7, 1000, &v) == 0);
  uint64_t now = 1000;
  size_t off = 0;
  while (off + 4 <= size) {
    uint8_t op = data[off] % 12, who = data[off + 1] % NPEERS;
    size_t len = (size_t)data[off + 2] | (size_t)data[off + 3] << 8;
    off += 4;
    if (len > size - off)
      len = size - off;
    const uint8_t *body = data + off;
    off += len;
    uint8_t id[GN_PK_LEN];
    char addr[GN_VIEWS_ADDR_MAX];
    peer_of(who, id, addr);
    if (op < 7) {
      int r = gn_views_on_message(v, id, GN_MSG_VIEW_JOIN + op, body, len, now);
      check(r <= 0 && r != GN_ENOTFOUND);
    } else if (op == 7) {
      gn_views_peer_up(v, id, addr, now);
    } else if (op == 8) {
      gn_views_peer_down(v, id, now);
    } else if (op == 9) {
      now += (uint64_t)(len ? body[0] : 1) * 100;
      gn_views_tick(v, now);
      check(gn_views_next_deadline_ms(v) > 0);
    } else if (op == 10) {
      gn_views_add_contact(v, id, addr, now);
    } else {
      gn_views_add_passive(v, id, addr, now);
    }
    check_invariants(v);
  }
  gn_views_free(v);
  return 0;
}
