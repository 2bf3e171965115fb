/* libFuzzer target: the membership state machine (p2p/swim.c) fed arbitrary
 * bodies of each SWIM type from members, a stranger and its own id, with
 * its timers run between them. The input is a list of records:
 * [type][signer][dt][len lo][len hi][body...]; type picks PING, ACK,
 * PING_REQ or NACK, signer one of six ids (0 itself, 1-4 members, 5 a
 * stranger), dt advances the clock in 10 ms steps. Checked after each: a
 * refused body changed nothing and sent nothing; the table stays within
 * max_members; every body sent fits max_datagram and decodes. */
#include <gpunet/swim.h>
#include <gpunet/wire.h>

#include <stdio.h>

#define FZ_MAX_MEMBERS 16

static size_t sent;

static void io_send(void *ud, const char *addr, uint32_t type, const uint8_t *body, size_t len) {
  (void)ud;
  gn_wire_doc doc;
  if (!gn_swim_addr_valid(addr) || type < GN_MSG_SWIM_PING || type > GN_MSG_SWIM_NACK || len > 1200 ||
      gn_wire_decode(body, len, &doc) < 0)
    __builtin_trap();
  gn_wire_doc_done(&doc);
  sent++;
}

static void io_event(void *ud, const gn_swim_event *ev) {
  (void)ud;
  if ((unsigned)ev->kind > GN_SWIM_EV_LEFT || (unsigned)ev->member.state > GN_SWIM_LEFT ||
      !memchr(ev->member.addr, 0, sizeof ev->member.addr))
    __builtin_trap();
}

static void mkid(uint8_t id[GN_PK_LEN], uint32_t n) {
  memset(id, 0, GN_PK_LEN);
  id[0] = 0xee;
  memcpy(id + 1, &n, sizeof n);
}

typedef struct snap {
  size_t n;
  gn_swim_member m[FZ_MAX_MEMBERS + 1];
  uint32_t inc, health;
} snap;

static void take(const gn_swim *s, snap *sn) {
  memset(sn, 0, sizeof *sn);
  sn->n = gn_swim_members(s, sn->m, FZ_MAX_MEMBERS + 1);
  sn->inc = gn_swim_incarnation(s);
  sn->health = gn_swim_health(s);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  gn_swim_config cfg;
  gn_swim_config_default(&cfg);
  cfg.max_members = FZ_MAX_MEMBERS;
  uint8_t ids[6][GN_PK_LEN];
  char addrs[6][GN_SWIM_ADDR_MAX];
  for (uint32_t i = 0; i < 6; i++) {
    mkid(ids[i], i);
    snprintf(addrs[i], sizeof addrs[i], "10.8.0.%u:7946", i + 1);
  }
  gn_swim_io io = {io_send, io_event, NULL};
  gn_swim *s = NULL;
  if (gn_swim_new(ids[0], addrs[0], &cfg, &io, 42, 0, &s) < 0)
    __builtin_trap();
  for (uint32_t i = 1; i <= 4; i++)
    if (gn_swim_add(s, ids[i], addrs[i], 0) < 0)
      __builtin_trap();
  uint64_t now = 0;
  gn_swim_tick(s, now);
  static snap before, after;
  for (int rec = 0; rec < 16 && size >= 5; rec++) {
    uint32_t type = GN_MSG_SWIM_PING + data[0] % 4, who = data[1] % 6;
    now += (uint64_t)data[2] * 10;
    size_t len = (size_t)data[3] | (size_t)data[4] << 8;
    data += 5;
    size -= 5;
    if (len > size)
      len = size;
    take(s, &before);
    size_t sent0 = sent;
    int r = gn_swim_on_datagram(s, addrs[who], ids[who], type, data, len, now);
    if (r < 0) {
      take(s, &after);
      if (sent != sent0 || memcmp(&before, &after, sizeof before) != 0)
        __builtin_trap();
    }
    data += len;
    size -= len;
    gn_swim_tick(s, now);
    size_t total = 0;
    for (int st = GN_SWIM_ALIVE; st <= GN_SWIM_LEFT; st++)
      total += gn_swim_count(s, (gn_swim_state)st);
    if (total > FZ_MAX_MEMBERS || total != gn_swim_members(s, NULL, 0) || gn_swim_health(s) > cfg.awareness_max)
      __builtin_trap();
    if (gn_swim_next_deadline_ms(s) <= now)
      __builtin_trap();
  }
  gn_swim_free(s);
  return 0;
}
