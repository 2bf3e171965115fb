/* Partial views (p2p/views.c): one instance driven by hand for each rule and
 * each hostile peer, and a deterministic in-test network of N instances
 * (sessions modelled as links that come up when both ends exist, one FIFO
 * queue of messages and link events) for the overlay as a whole. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <gpunet/views.h>
#include <gpunet/wire.h>

#include <stdio.h>

#define T0 1000000u

/* --- ids, addresses, bodies -----------------------------------------------*/

static void mk_id(uint32_t n, uint8_t out[GN_PK_LEN]) {
  memset(out, 0xa5, GN_PK_LEN);
  out[0] = (uint8_t)(n >> 24);
  out[1] = (uint8_t)(n >> 16);
  out[2] = (uint8_t)(n >> 8);
  out[3] = (uint8_t)n;
}

static uint32_t id_num(const uint8_t id[GN_PK_LEN]) {
  return (uint32_t)id[0] << 24 | (uint32_t)id[1] << 16 | (uint32_t)id[2] << 8 | id[3];
}

static void mk_addr(uint32_t n, char out[GN_VIEWS_ADDR_MAX]) {
  snprintf(out, GN_VIEWS_ADDR_MAX, "10.%u.%u.%u:7000", (n >> 16) & 0xff, (n >> 8) & 0xff, n & 0xff);
}

static int addr_num(const char *addr) {
  unsigned a, b, c, d, port;
  if (sscanf(addr, "%u.%u.%u.%u:%u", &a, &b, &c, &d, &port) != 5 || a != 10 || port != 7000)
    return -1;
  return (int)(b << 16 | c << 8 | d);
}

typedef struct ent {
  uint32_t id;
  const char *addr; /* NULL: mk_addr(id) */
} ent;

static gn_buf take(gn_wire_writer *w) {
  gn_buf b = {0};
  assert_int_equal(gn_wire_writer_take(w, &b), 0);
  gn_wire_writer_done(w);
  return b;
}

static gn_buf join_body(const char *addr) {
  gn_wire_writer w;
  gn_wire_writer_init(&w);
  gn_wire_put_map(&w, 1);
  gn_wire_put_str(&w, "addr");
  gn_wire_put_str(&w, addr);
  return take(&w);
}

static gn_buf neighbor_body(bool high, const char *addr) {
  gn_wire_writer w;
  gn_wire_writer_init(&w);
  gn_wire_put_map(&w, 2);
  gn_wire_put_str(&w, "high");
  gn_wire_put_bool(&w, high);
  gn_wire_put_str(&w, "addr");
  gn_wire_put_str(&w, addr);
  return take(&w);
}

static gn_buf reply_accept_body(bool accept) {
  gn_wire_writer w;
  gn_wire_writer_init(&w);
  gn_wire_put_map(&w, 1);
  gn_wire_put_str(&w, "accept");
  gn_wire_put_bool(&w, accept);
  return take(&w);
}

static gn_buf fjoin_body(uint32_t id, const char *addr, uint64_t ttl) {
  uint8_t pk[GN_PK_LEN];
  mk_id(id, pk);
  gn_wire_writer w;
  gn_wire_writer_init(&w);
  gn_wire_put_map(&w, 3);
  gn_wire_put_str(&w, "id");
  gn_wire_put_bin(&w, pk, GN_PK_LEN);
  gn_wire_put_str(&w, "addr");
  gn_wire_put_str(&w, addr);
  gn_wire_put_str(&w, "ttl");
  gn_wire_put_u64(&w, ttl);
  return take(&w);
}

static void put_ents(gn_wire_writer *w, const ent *e, size_t n) {
  gn_wire_put_array(w, (uint32_t)n);
  for (size_t i = 0; i < n; i++) {
    uint8_t pk[GN_PK_LEN];
    char a[GN_VIEWS_ADDR_MAX];
    mk_id(e[i].id, pk);
    mk_addr(e[i].id, a);
    gn_wire_put_map(w, 2);
    gn_wire_put_str(w, "id");
    gn_wire_put_bin(w, pk, GN_PK_LEN);
    gn_wire_put_str(w, "addr");
    gn_wire_put_str(w, e[i].addr ? e[i].addr : a);
  }
}

static gn_buf shuffle_body(uint32_t origin, uint64_t ttl, uint64_t nonce, const ent *e, size_t n) {
  uint8_t pk[GN_PK_LEN];
  char a[GN_VIEWS_ADDR_MAX];
  mk_id(origin, pk);
  mk_addr(origin, a);
  gn_wire_writer w;
  gn_wire_writer_init(&w);
  gn_wire_put_map(&w, 5);
  gn_wire_put_str(&w, "origin");
  gn_wire_put_bin(&w, pk, GN_PK_LEN);
  gn_wire_put_str(&w, "addr");
  gn_wire_put_str(&w, a);
  gn_wire_put_str(&w, "ttl");
  gn_wire_put_u64(&w, ttl);
  gn_wire_put_str(&w, "nonce");
  gn_wire_put_u64(&w, nonce);
  gn_wire_put_str(&w, "entries");
  put_ents(&w, e, n);
  return take(&w);
}

static gn_buf shuffle_reply_body(uint64_t nonce, const ent *e, size_t n) {
  gn_wire_writer w;
  gn_wire_writer_init(&w);
  gn_wire_put_map(&w, 2);
  gn_wire_put_str(&w, "nonce");
  gn_wire_put_u64(&w, nonce);
  gn_wire_put_str(&w, "entries");
  put_ents(&w, e, n);
  return take(&w);
}

/* --- one instance with a recording io -------------------------------------*/

#define REC_MAX 4096

typedef struct sentmsg {
  uint32_t to;
  uint32_t type;
  uint8_t body[GN_VIEWS_BODY_MAX];
  size_t len;
} sentmsg;

typedef struct rec {
  sentmsg *msgs;
  size_t nmsgs;
  uint32_t connects[REC_MAX];
  size_t nconnects;
  uint32_t disconnects[REC_MAX];
  size_t ndisconnects;
  int added, removed;
  bool up[4096]; /* sessions up, by node number (below 4096) */
} rec;

static rec R;

static int rec_send(void *ud, const uint8_t peer[GN_PK_LEN], uint32_t type, const uint8_t *body, size_t len) {
  rec *r = ud;
  uint32_t n = id_num(peer);
  if (n >= 4096 || !r->up[n])
    return GN_ECLOSED;
  assert_true(r->nmsgs < REC_MAX);
  assert_true(len <= GN_VIEWS_BODY_MAX);
  sentmsg *m = &r->msgs[r->nmsgs++];
  m->to = n;
  m->type = type;
  memcpy(m->body, body, len);
  m->len = len;
  return 0;
}

static void rec_connect(void *ud, const uint8_t peer[GN_PK_LEN], const char *addr) {
  rec *r = ud;
  assert_true(gn_views_addr_valid(addr));
  assert_true(r->nconnects < REC_MAX);
  r->connects[r->nconnects++] = id_num(peer);
}

static void rec_disconnect(void *ud, const uint8_t peer[GN_PK_LEN]) {
  rec *r = ud;
  assert_true(r->ndisconnects < REC_MAX);
  r->disconnects[r->ndisconnects++] = id_num(peer);
}

static void rec_event(void *ud, const uint8_t peer[GN_PK_LEN], gn_views_event_kind kind) {
  (void)peer;
  rec *r = ud;
  if (kind == GN_VIEWS_EV_ADDED)
    r->added++;
  else
    r->removed++;
}

#define SELF 1
#define SELF_ADDR "10.0.0.1:7000"

static int setup(void **state) {
  (void)state;
  sentmsg *m = R.msgs ? R.msgs : malloc(REC_MAX * sizeof(sentmsg));
  assert_non_null(m);
  memset(&R, 0, sizeof(R));
  R.msgs = m;
  return 0;
}

static int teardown(void **state) {
  (void)state;
  free(R.msgs);
  memset(&R, 0, sizeof(R));
  return 0;
}

static gn_views *mk_views(const gn_views_config *cfg) {
  uint8_t self[GN_PK_LEN];
  mk_id(SELF, self);
  gn_views_io io = {rec_send, rec_connect, rec_disconnect, rec_event, &R};
  gn_views *v = NULL;
  assert_int_equal(gn_views_new(self, SELF_ADDR, cfg, &io, 42, T0, &v), 0);
  return v;
}

static void clear_rec(void) {
  R.nmsgs = R.nconnects = R.ndisconnects = 0;
  R.added = R.removed = 0;
}

static void up(gn_views *v, uint32_t n, uint64_t now) {
  uint8_t pk[GN_PK_LEN];
  char a[GN_VIEWS_ADDR_MAX];
  mk_id(n, pk);
  mk_addr(n, a);
  assert_true(n < GN_ARRAY_SIZE(R.up));
  R.up[n] = true;
  gn_views_peer_up(v, pk, a, now);
}

static void down(gn_views *v, uint32_t n, uint64_t now) {
  uint8_t pk[GN_PK_LEN];
  mk_id(n, pk);
  assert_true(n < GN_ARRAY_SIZE(R.up));
  R.up[n] = false;
  gn_views_peer_down(v, pk, now);
}

static int deliver(gn_views *v, uint32_t from, uint32_t type, gn_buf b, uint64_t now) {
  uint8_t pk[GN_PK_LEN];
  mk_id(from, pk);
  int r = gn_views_on_message(v, pk, type, b.data, b.len, now);
  gn_buf_done(&b);
  return r;
}

static bool active_has(gn_views *v, uint32_t n) {
  uint8_t pk[GN_PK_LEN];
  mk_id(n, pk);
  return gn_views_is_active(v, pk);
}

static bool passive_has(gn_views *v, uint32_t n) {
  uint8_t pk[GN_PK_LEN];
  mk_id(n, pk);
  return gn_views_is_passive(v, pk);
}

/* n becomes an active member: its session comes up and it asks with a
 * low-priority NEIGHBOR. */
static void make_active(gn_views *v, uint32_t n, uint64_t now) {
  char a[GN_VIEWS_ADDR_MAX];
  mk_addr(n, a);
  up(v, n, now);
  assert_int_equal(deliver(v, n, GN_MSG_VIEW_NEIGHBOR, neighbor_body(false, a), now), 0);
  assert_true(active_has(v, n));
}

static size_t count_sent(uint32_t type) {
  size_t k = 0;
  for (size_t i = 0; i < R.nmsgs; i++)
    k += R.msgs[i].type == type;
  return k;
}

static const sentmsg *last_sent(uint32_t type) {
  for (size_t i = R.nmsgs; i > 0; i--)
    if (R.msgs[i - 1].type == type)
      return &R.msgs[i - 1];
  return NULL;
}

static uint64_t sent_u64(const sentmsg *m, const char *key) {
  gn_wire_doc d;
  uint64_t x = 0;
  assert_int_equal(gn_wire_decode(m->body, m->len, &d), 0);
  assert_int_equal(gn_wire_get_u64(d.root, key, &x), 0);
  gn_wire_doc_done(&d);
  return x;
}

static bool sent_bool(const sentmsg *m, const char *key) {
  gn_wire_doc d;
  bool x = false;
  assert_int_equal(gn_wire_decode(m->body, m->len, &d), 0);
  assert_int_equal(gn_wire_get_bool(d.root, key, &x), 0);
  gn_wire_doc_done(&d);
  return x;
}

/* Fills the passive view with n hearsay entries numbered from first, through
 * FORWARD_JOINs at TTL prwl from active member via (each kept as passive; the
 * walk goes on, so v needs a second active member). */
static void fill_passive_hearsay(gn_views *v, uint32_t via, uint32_t first, size_t n, uint64_t *now) {
  for (size_t i = 0; i < n; i++) {
    char a[GN_VIEWS_ADDR_MAX];
    mk_addr(first + (uint32_t)i, a);
    if (i % 10 == 0)
      *now += 10001; /* past the per-peer and replacement windows */
    assert_int_equal(deliver(v, via, GN_MSG_VIEW_FORWARD_JOIN, fjoin_body(first + (uint32_t)i, a, 3), *now), 0);
  }
}

/* --- addresses and config -------------------------------------------------*/

static void test_views_addr_grammar(void **state) {
  (void)state;
  static const struct {
    const char *addr;
    bool ok;
  } cases[] = {
      {"10.0.0.1:7000", true},
      {"127.0.0.1:1", true},
      {"[2001:db8::1]:65535", true},
      {"[::1]:7000", true},
      {"", false},
      {"10.0.0.1", false},
      {"10.0.0.1:", false},
      {"10.0.0.1:0", false},
      {"10.0.0.1:65536", false},
      {"10.0.0.1:123456", false},
      {"10.0.0.1:7a", false},
      {"10.0.0.1:+70", false},
      {"localhost:7000", false},
      {"example.com:7000", false},
      {"10.0.0:7000", false},
      {"010.0.0.1:7000", false},
      {"0.0.0.0:7000", false},
      {"255.255.255.255:7000", false},
      {"224.0.0.1:7000", false},
      {"2001:db8::1:7000", false},
      {"[2001:db8::1:7000", false},
      {"[::]:7000", false},
      {"[ff02::1]:7000", false},
      {":7000", false},
      {"10.0.0.1:7000\n", false},
      {"1111111111111111111111111111111111111111111111111111111111.1:7000", false},
  };
  for (size_t i = 0; i < GN_ARRAY_SIZE(cases); i++) {
    if (gn_views_addr_valid(cases[i].addr) != cases[i].ok)
      fail_msg("address \"%s\": expected %s", cases[i].addr, cases[i].ok ? "valid" : "invalid");
  }
  char longa[GN_VIEWS_ADDR_MAX + 8];
  memset(longa, '1', sizeof(longa) - 1);
  longa[sizeof(longa) - 1] = 0;
  assert_false(gn_views_addr_valid(longa));
  assert_false(gn_views_addr_valid(NULL));
}

static void test_views_config_bounds(void **state) {
  (void)state;
  uint8_t self[GN_PK_LEN];
  mk_id(SELF, self);
  gn_views_io io = {rec_send, rec_connect, rec_disconnect, rec_event, &R};
  gn_views *v = NULL;
  gn_views_config c;
  gn_views_config_default(&c);
  assert_int_equal(c.active_size, 6);
  assert_int_equal(c.passive_size, 48);
  c.active_size = GN_VIEWS_ACTIVE_MAX + 1;
  assert_int_equal(gn_views_new(self, SELF_ADDR, &c, &io, 1, T0, &v), GN_EINVAL);
  gn_views_config_default(&c);
  c.passive_size = GN_VIEWS_PASSIVE_MAX + 1;
  assert_int_equal(gn_views_new(self, SELF_ADDR, &c, &io, 1, T0, &v), GN_EINVAL);
  gn_views_config_default(&c);
  c.prwl = c.arwl + 1;
  assert_int_equal(gn_views_new(self, SELF_ADDR, &c, &io, 1, T0, &v), GN_EINVAL);
  gn_views_config_default(&c);
  c.shuffle_kp = GN_VIEWS_SHUFFLE_MAX;
  assert_int_equal(gn_views_new(self, SELF_ADDR, &c, &io, 1, T0, &v), GN_EINVAL);
  assert_int_equal(gn_views_new(self, "localhost:1", NULL, &io, 1, T0, &v), GN_EINVAL);
  assert_null(v);
  assert_int_equal(gn_views_new(self, "", NULL, &io, 1, T0, &v), 0);
  v = gn_views_free(v);
  assert_null(v);
}

/* --- joining --------------------------------------------------------------*/

static void test_views_contact_gets_join_and_enters_active(void **state) {
  (void)state;
  gn_views *v = mk_views(NULL);
  uint8_t c[GN_PK_LEN];
  char a[GN_VIEWS_ADDR_MAX];
  mk_id(2, c);
  mk_addr(2, a);
  up(v, 2, T0);
  assert_int_equal(gn_views_add_contact(v, c, a, T0), 0);
  const sentmsg *m = last_sent(GN_MSG_VIEW_JOIN);
  assert_non_null(m);
  assert_int_equal(m->to, 2);
  assert_true(active_has(v, 2));
  assert_int_equal(R.added, 1);
  gn_views_free(v);
}

/* The daemon asks before calling gn_views_add_contact again for a session
 * that came back (each JOIN makes the contact evict a member when full). */
static void test_views_contact_is_remembered(void **state) {
  (void)state;
  gn_views *v = mk_views(NULL);
  uint8_t c[GN_PK_LEN], o[GN_PK_LEN];
  char a[GN_VIEWS_ADDR_MAX];
  mk_id(2, c);
  mk_id(3, o);
  mk_addr(2, a);
  assert_false(gn_views_is_contact(v, c));
  up(v, 2, T0);
  assert_int_equal(gn_views_add_contact(v, c, a, T0), 0);
  assert_true(gn_views_is_contact(v, c));
  assert_false(gn_views_is_contact(v, o));
  gn_views_free(v);
}

static void test_views_contact_without_session_is_dialled_first(void **state) {
  (void)state;
  gn_views *v = mk_views(NULL);
  uint8_t c[GN_PK_LEN];
  char a[GN_VIEWS_ADDR_MAX];
  mk_id(2, c);
  mk_addr(2, a);
  assert_int_equal(gn_views_add_contact(v, c, a, T0), 0);
  assert_int_equal(R.nconnects, 1);
  assert_int_equal(count_sent(GN_MSG_VIEW_JOIN), 0);
  assert_false(active_has(v, 2));
  up(v, 2, T0 + 10);
  assert_int_equal(count_sent(GN_MSG_VIEW_JOIN), 1);
  assert_true(active_has(v, 2));
  gn_views_free(v);
}

static void test_views_join_is_accepted_and_forwarded(void **state) {
  (void)state;
  gn_views *v = mk_views(NULL);
  for (uint32_t n = 2; n <= 4; n++)
    make_active(v, n, T0);
  clear_rec();
  up(v, 9, T0);
  char a[GN_VIEWS_ADDR_MAX];
  mk_addr(9, a);
  assert_int_equal(deliver(v, 9, GN_MSG_VIEW_JOIN, join_body(a), T0), 0);
  assert_true(active_has(v, 9));
  assert_int_equal(count_sent(GN_MSG_VIEW_FORWARD_JOIN), 3);
  for (size_t i = 0; i < R.nmsgs; i++) {
    assert_int_not_equal(R.msgs[i].to, 9); /* not back to the joiner */
    assert_int_equal(sent_u64(&R.msgs[i], "ttl"), 6);
  }
  gn_views_free(v);
}

static void test_views_join_when_full_evicts_one_with_disconnect(void **state) {
  (void)state;
  gn_views *v = mk_views(NULL);
  for (uint32_t n = 2; n <= 7; n++)
    make_active(v, n, T0);
  assert_int_equal(gn_views_active_count(v), 6);
  clear_rec();
  up(v, 9, T0);
  char a[GN_VIEWS_ADDR_MAX];
  mk_addr(9, a);
  assert_int_equal(deliver(v, 9, GN_MSG_VIEW_JOIN, join_body(a), T0), 0);
  assert_int_equal(gn_views_active_count(v), 6);
  assert_true(active_has(v, 9));
  assert_int_equal(count_sent(GN_MSG_VIEW_DISCONNECT), 1);
  uint32_t victim = last_sent(GN_MSG_VIEW_DISCONNECT)->to;
  assert_false(active_has(v, victim));
  assert_true(passive_has(v, victim)); /* kept as a passive member we know */
  assert_int_equal(R.ndisconnects, 1);
  assert_int_equal(R.disconnects[0], victim);
  gn_views_free(v);
}

/* Hostile: a peer repeating JOIN makes a new walk each time (six
 * FORWARD_JOINs, each dialling). One per join_interval_ms is taken. */
static void test_views_join_rate_bound(void **state) {
  (void)state;
  gn_views *v = mk_views(NULL);
  for (uint32_t n = 2; n <= 4; n++)
    make_active(v, n, T0);
  up(v, 9, T0);
  char a[GN_VIEWS_ADDR_MAX];
  mk_addr(9, a);
  assert_int_equal(deliver(v, 9, GN_MSG_VIEW_JOIN, join_body(a), T0), 0);
  /* It leaves and joins again at once, then again and again. */
  uint8_t pk[GN_PK_LEN];
  mk_id(9, pk);
  down(v, 9, T0 + 1);
  up(v, 9, T0 + 1);
  clear_rec();
  for (int i = 0; i < 10; i++)
    assert_int_equal(deliver(v, 9, GN_MSG_VIEW_JOIN, join_body(a), T0 + 2 + (uint64_t)i * 100), GN_EBUSY);
  assert_int_equal(count_sent(GN_MSG_VIEW_FORWARD_JOIN), 0);
  assert_false(active_has(v, 9));
  assert_true(count_sent(GN_MSG_VIEW_DISCONNECT) >= 1); /* it is told it is not in */
  gn_views_stats st;
  gn_views_stats_get(v, &st);
  assert_int_equal(st.rate_limited, 10);
  /* After the interval it is taken again. */
  assert_int_equal(deliver(v, 9, GN_MSG_VIEW_JOIN, join_body(a), T0 + 3001), 0);
  assert_true(active_has(v, 9));
  assert_int_equal(count_sent(GN_MSG_VIEW_FORWARD_JOIN), 3);
  gn_views_free(v);
}

/* --- NEIGHBOR -------------------------------------------------------------*/

static void test_views_low_neighbor_refused_when_full(void **state) {
  (void)state;
  gn_views *v = mk_views(NULL);
  for (uint32_t n = 2; n <= 7; n++)
    make_active(v, n, T0);
  clear_rec();
  up(v, 9, T0);
  char a[GN_VIEWS_ADDR_MAX];
  mk_addr(9, a);
  assert_int_equal(deliver(v, 9, GN_MSG_VIEW_NEIGHBOR, neighbor_body(false, a), T0), 0);
  assert_false(active_has(v, 9));
  const sentmsg *m = last_sent(GN_MSG_VIEW_NEIGHBOR_REPLY);
  assert_non_null(m);
  assert_false(sent_bool(m, "accept"));
  assert_int_equal(count_sent(GN_MSG_VIEW_DISCONNECT), 0);
  /* The session served only this request: released. */
  assert_int_equal(R.ndisconnects, 1);
  assert_int_equal(R.disconnects[0], 9);
  gn_views_free(v);
}

static void test_views_high_neighbor_accepted_when_full(void **state) {
  (void)state;
  gn_views *v = mk_views(NULL);
  for (uint32_t n = 2; n <= 7; n++)
    make_active(v, n, T0);
  clear_rec();
  up(v, 9, T0);
  char a[GN_VIEWS_ADDR_MAX];
  mk_addr(9, a);
  assert_int_equal(deliver(v, 9, GN_MSG_VIEW_NEIGHBOR, neighbor_body(true, a), T0), 0);
  assert_true(active_has(v, 9));
  assert_int_equal(gn_views_active_count(v), 6);
  assert_true(sent_bool(last_sent(GN_MSG_VIEW_NEIGHBOR_REPLY), "accept"));
  assert_int_equal(count_sent(GN_MSG_VIEW_DISCONNECT), 1);
  gn_views_free(v);
}

/* Hostile: NEIGHBOR (each a possible eviction) from one peer over and over. */
static void test_views_neighbor_rate_bound(void **state) {
  (void)state;
  gn_views *v = mk_views(NULL);
  for (uint32_t n = 2; n <= 7; n++)
    make_active(v, n, T0);
  up(v, 9, T0);
  char a[GN_VIEWS_ADDR_MAX];
  mk_addr(9, a);
  assert_int_equal(deliver(v, 9, GN_MSG_VIEW_NEIGHBOR, neighbor_body(true, a), T0), 0);
  assert_true(active_has(v, 9));
  /* It drops its session and comes back high-priority at once, ten times. */
  down(v, 9, T0 + 1);
  up(v, 9, T0 + 1);
  clear_rec();
  for (int i = 0; i < 10; i++)
    assert_int_equal(deliver(v, 9, GN_MSG_VIEW_NEIGHBOR, neighbor_body(true, a), T0 + 2 + (uint64_t)i), GN_EBUSY);
  assert_false(active_has(v, 9));
  assert_int_equal(count_sent(GN_MSG_VIEW_DISCONNECT), 0); /* nobody was evicted for it */
  assert_int_equal(count_sent(GN_MSG_VIEW_NEIGHBOR_REPLY), 10);
  assert_false(sent_bool(last_sent(GN_MSG_VIEW_NEIGHBOR_REPLY), "accept"));
  assert_int_equal(deliver(v, 9, GN_MSG_VIEW_NEIGHBOR, neighbor_body(true, a), T0 + 3001), 0);
  assert_true(active_has(v, 9));
  /* JOIN and NEIGHBOR share the interval: alternating them gains nothing. */
  down(v, 9, T0 + 3002);
  up(v, 9, T0 + 3002);
  assert_int_equal(deliver(v, 9, GN_MSG_VIEW_JOIN, join_body(a), T0 + 3003), GN_EBUSY);
  assert_false(active_has(v, 9));
  gn_views_free(v);
}

/* Hostile: 500 identities each JOIN and send high-priority NEIGHBORs; the
 * active view stays at its size throughout. */
static void test_views_active_never_exceeds_size(void **state) {
  (void)state;
  gn_views *v = mk_views(NULL);
  uint64_t now = T0;
  for (uint32_t n = 100; n < 600; n++) {
    char a[GN_VIEWS_ADDR_MAX];
    mk_addr(n, a);
    up(v, n, now);
    deliver(v, n, n % 2 ? GN_MSG_VIEW_JOIN : GN_MSG_VIEW_NEIGHBOR, n % 2 ? join_body(a) : neighbor_body(true, a), now);
    assert_true(gn_views_active_count(v) <= 6);
    assert_true(gn_views_passive_count(v) <= 48);
    /* Answers accepting what we never asked change nothing either. */
    deliver(v, n, GN_MSG_VIEW_NEIGHBOR_REPLY, reply_accept_body(true), now);
    assert_true(gn_views_active_count(v) <= 6);
    now += 7;
    clear_rec();
  }
  assert_int_equal(gn_views_active_count(v), 6);
  gn_views_free(v);
}

/* Hostile: the same crowd cannot push out the three links that have lasted
 * longest; evictions take the newer half of the view only. */
static void test_views_eviction_spares_older_half(void **state) {
  (void)state;
  gn_views *v = mk_views(NULL);
  uint64_t now = T0;
  for (uint32_t n = 2; n <= 7; n++)
    make_active(v, n, now++);
  for (uint32_t n = 100; n < 600; n++) {
    char a[GN_VIEWS_ADDR_MAX];
    mk_addr(n, a);
    up(v, n, now);
    assert_int_equal(deliver(v, n, n % 2 ? GN_MSG_VIEW_JOIN : GN_MSG_VIEW_NEIGHBOR,
                             n % 2 ? join_body(a) : neighbor_body(true, a), now),
                     0);
    for (uint32_t k = 2; k <= 4; k++)
      assert_true(active_has(v, k));
    now += 40; /* past the rate table's 10 s windows now and then */
    clear_rec();
  }
  gn_views_stats st;
  gn_views_stats_get(v, &st);
  assert_int_equal(st.evictions, 500);
  gn_views_free(v);
}

/* Hostile: 300 fresh identities each open a session, get into the active
 * view with a high-priority NEIGHBOR and send a SHUFFLE of 8 fresh entries,
 * all within one period: at most replace_per_period passive entries are
 * evicted, and the members we have had sessions with all stay. */
static void test_views_shuffle_flood_from_fresh_identities(void **state) {
  (void)state;
  gn_views *v = mk_views(NULL);
  uint64_t now = T0;
  make_active(v, 2, now);
  make_active(v, 3, now);
  /* Eight real neighbours of five seconds each, now passive. */
  for (uint32_t n = 10; n < 18; n++) {
    make_active(v, n, now);
    now += 5000;
    assert_int_equal(deliver(v, n, GN_MSG_VIEW_DISCONNECT, join_body(SELF_ADDR), now), 0);
  }
  fill_passive_hearsay(v, 2, 1000, 40, &now);
  assert_int_equal(gn_views_passive_count(v), 48);
  now += 10001;
  gn_views_stats s0, s1;
  gn_views_stats_get(v, &s0);
  uint32_t fresh = 100000;
  int taken = 0;
  for (uint32_t n = 3000; n < 3300; n++) {
    char a[GN_VIEWS_ADDR_MAX];
    mk_addr(n, a);
    up(v, n, now);
    deliver(v, n, GN_MSG_VIEW_NEIGHBOR, neighbor_body(true, a), now);
    ent e[8];
    for (int i = 0; i < 8; i++)
      e[i] = (ent){fresh++, NULL};
    taken += deliver(v, n, GN_MSG_VIEW_SHUFFLE, shuffle_body(n, 0, n, e, 8), now + 1) == 0;
    now += 20;
    clear_rec();
  }
  gn_views_stats_get(v, &s1);
  assert_true(taken > 200);                                     /* they were members when they shuffled... */
  assert_true(s1.passive_replaced - s0.passive_replaced <= 12); /* ...yet replaced 12 at most */
  for (uint32_t n = 10; n < 18; n++)
    assert_true(passive_has(v, n));
  assert_int_equal(gn_views_passive_count(v), 48);
  gn_views_free(v);
}

/* Messages act on their sender only: a DISCONNECT or an answer from one
 * peer does nothing to another's link or request, and a peer claiming a
 * member's address does not take it over. */
static void test_views_messages_act_on_their_sender_only(void **state) {
  (void)state;
  gn_views *v = mk_views(NULL);
  make_active(v, 2, T0);
  make_active(v, 3, T0);
  uint64_t now = T0;
  fill_passive_hearsay(v, 2, 800, 1, &now);
  up(v, 800, now);
  clear_rec();
  gn_views_tick(v, now); /* NEIGHBOR to 800 */
  assert_int_equal(count_sent(GN_MSG_VIEW_NEIGHBOR), 1);
  up(v, 9, now);
  assert_int_equal(deliver(v, 9, GN_MSG_VIEW_DISCONNECT, join_body(SELF_ADDR), now), 0);
  assert_true(active_has(v, 2) && active_has(v, 3));
  assert_int_equal(deliver(v, 9, GN_MSG_VIEW_NEIGHBOR_REPLY, reply_accept_body(true), now), GN_ESTATE);
  assert_false(active_has(v, 800));
  assert_int_equal(gn_views_pending_count(v), 1); /* still waiting for 800 itself */
  /* 9 joins claiming 2's address: it is taken in, without an address. */
  char a2[GN_VIEWS_ADDR_MAX];
  mk_addr(2, a2);
  assert_int_equal(deliver(v, 9, GN_MSG_VIEW_JOIN, join_body(a2), now), 0);
  gn_views_peer act[6];
  size_t na = gn_views_active(v, act, 6);
  for (size_t i = 0; i < na; i++) {
    if (id_num(act[i].id) == 9)
      assert_string_equal(act[i].addr, "");
    if (id_num(act[i].id) == 2)
      assert_string_equal(act[i].addr, a2);
  }
  /* Demoted, it does not enter the passive view under that address. */
  assert_int_equal(deliver(v, 9, GN_MSG_VIEW_DISCONNECT, join_body(SELF_ADDR), now + 1), 0);
  assert_false(passive_has(v, 9));
  gn_views_free(v);
}

/* --- FORWARD_JOIN ---------------------------------------------------------*/

static void test_views_forward_join_ttl_clamped(void **state) {
  (void)state;
  gn_views *v = mk_views(NULL);
  for (uint32_t n = 2; n <= 4; n++)
    make_active(v, n, T0);
  clear_rec();
  char a[GN_VIEWS_ADDR_MAX];
  mk_addr(50, a);
  assert_int_equal(deliver(v, 2, GN_MSG_VIEW_FORWARD_JOIN, fjoin_body(50, a, 1000000), T0), 0);
  const sentmsg *m = last_sent(GN_MSG_VIEW_FORWARD_JOIN);
  assert_non_null(m);
  assert_int_equal(sent_u64(m, "ttl"), 5); /* arwl - 1, not 999999 */
  assert_int_not_equal(m->to, 2);
  /* A TTL beyond 32 bits is clamped the same way. */
  clear_rec();
  mk_addr(51, a);
  assert_int_equal(deliver(v, 2, GN_MSG_VIEW_FORWARD_JOIN, fjoin_body(51, a, UINT64_MAX), T0), 0);
  assert_int_equal(sent_u64(last_sent(GN_MSG_VIEW_FORWARD_JOIN), "ttl"), 5);
  gn_views_free(v);
}

static void test_views_forward_join_at_ttl_zero_takes_joiner(void **state) {
  (void)state;
  gn_views *v = mk_views(NULL);
  for (uint32_t n = 2; n <= 4; n++)
    make_active(v, n, T0);
  clear_rec();
  char a[GN_VIEWS_ADDR_MAX];
  mk_addr(50, a);
  assert_int_equal(deliver(v, 2, GN_MSG_VIEW_FORWARD_JOIN, fjoin_body(50, a, 0), T0), 0);
  assert_int_equal(count_sent(GN_MSG_VIEW_FORWARD_JOIN), 0);
  assert_int_equal(R.nconnects, 1); /* no session yet: dial it */
  assert_int_equal(R.connects[0], 50);
  up(v, 50, T0 + 5);
  const sentmsg *m = last_sent(GN_MSG_VIEW_NEIGHBOR);
  assert_non_null(m);
  assert_int_equal(m->to, 50);
  assert_true(sent_bool(m, "high"));
  assert_int_equal(deliver(v, 50, GN_MSG_VIEW_NEIGHBOR_REPLY, reply_accept_body(true), T0 + 10), 0);
  assert_true(active_has(v, 50));
  gn_views_free(v);
}

static void test_views_forward_join_at_prwl_kept_as_passive(void **state) {
  (void)state;
  gn_views *v = mk_views(NULL);
  for (uint32_t n = 2; n <= 4; n++)
    make_active(v, n, T0);
  char a[GN_VIEWS_ADDR_MAX];
  mk_addr(50, a);
  assert_int_equal(deliver(v, 2, GN_MSG_VIEW_FORWARD_JOIN, fjoin_body(50, a, 3), T0), 0);
  assert_true(passive_has(v, 50));
  mk_addr(51, a);
  assert_int_equal(deliver(v, 2, GN_MSG_VIEW_FORWARD_JOIN, fjoin_body(51, a, 4), T0), 0);
  assert_false(passive_has(v, 51));
  gn_views_free(v);
}

/* Hostile: walks travel over active links; anyone else is refused. */
static void test_views_forward_join_from_non_member_refused(void **state) {
  (void)state;
  gn_views *v = mk_views(NULL);
  make_active(v, 2, T0);
  up(v, 9, T0);
  clear_rec();
  char a[GN_VIEWS_ADDR_MAX];
  mk_addr(50, a);
  assert_int_equal(deliver(v, 9, GN_MSG_VIEW_FORWARD_JOIN, fjoin_body(50, a, 0), T0), GN_EPERM);
  assert_int_equal(R.nconnects, 0);
  assert_int_equal(R.nmsgs, 0);
  assert_int_equal(gn_views_pending_count(v), 0);
  gn_views_free(v);
}

/* Hostile: an active member sends FORWARD_JOINs that end here for 1,000
 * made-up joiners; the dials in flight stay bounded. */
static void test_views_pending_dials_bounded(void **state) {
  (void)state;
  gn_views_config c;
  gn_views_config_default(&c);
  c.fjoin_per_peer = 100000; /* only the pending table is tested here */
  gn_views *v = mk_views(&c);
  make_active(v, 2, T0);
  for (uint32_t n = 1000; n < 2000; n++) {
    char a[GN_VIEWS_ADDR_MAX];
    mk_addr(n, a);
    assert_int_equal(deliver(v, 2, GN_MSG_VIEW_FORWARD_JOIN, fjoin_body(n, a, 0), T0), 0);
    assert_true(gn_views_pending_count(v) <= GN_VIEWS_PENDING_MAX);
  }
  assert_int_equal(R.nconnects, GN_VIEWS_PENDING_MAX);
  /* They time out and make room again. */
  gn_views_tick(v, T0 + 5001);
  assert_int_equal(gn_views_pending_count(v), 0);
  gn_views_free(v);
}

static void test_views_forward_join_per_peer_bound(void **state) {
  (void)state;
  gn_views *v = mk_views(NULL);
  for (uint32_t n = 2; n <= 4; n++)
    make_active(v, n, T0);
  clear_rec();
  int ok = 0, busy = 0;
  for (uint32_t n = 1000; n < 2100; n++) {
    char a[GN_VIEWS_ADDR_MAX];
    mk_addr(n, a);
    int r = deliver(v, 2, GN_MSG_VIEW_FORWARD_JOIN, fjoin_body(n, a, 6), T0);
    ok += r == 0;
    busy += r == GN_EBUSY;
  }
  assert_int_equal(ok, 1000);
  assert_int_equal(busy, 100);
  assert_int_equal(count_sent(GN_MSG_VIEW_FORWARD_JOIN), 1000);
  /* The next period takes more. */
  char a[GN_VIEWS_ADDR_MAX];
  mk_addr(3000, a);
  assert_int_equal(deliver(v, 2, GN_MSG_VIEW_FORWARD_JOIN, fjoin_body(3000, a, 6), T0 + 10000), 0);
  gn_views_free(v);
}

/* --- hostile entries ------------------------------------------------------*/

static void test_views_shuffle_over_entry_bound_refused(void **state) {
  (void)state;
  gn_views *v = mk_views(NULL);
  make_active(v, 2, T0);
  clear_rec();
  ent e[9];
  for (uint32_t i = 0; i < 9; i++)
    e[i] = (ent){200 + i, NULL};
  assert_int_equal(deliver(v, 2, GN_MSG_VIEW_SHUFFLE, shuffle_body(3, 0, 7, e, 9), T0), GN_ETOOBIG);
  assert_int_equal(gn_views_passive_count(v), 0);
  assert_int_equal(R.nmsgs, 0);
  assert_int_equal(R.nconnects, 0);
  /* ka + kp + 1 = 8 is the bound itself. */
  assert_int_equal(deliver(v, 2, GN_MSG_VIEW_SHUFFLE, shuffle_body(3, 0, 7, e, 8), T0), 0);
  assert_int_equal(gn_views_passive_count(v), 8);
  gn_views_free(v);
}

static void test_views_shuffle_reply_over_entry_bound_refused(void **state) {
  (void)state;
  gn_views *v = mk_views(NULL);
  make_active(v, 2, T0);
  clear_rec();
  gn_views_tick(v, T0 + 10001); /* starts our shuffle */
  const sentmsg *m = last_sent(GN_MSG_VIEW_SHUFFLE);
  assert_non_null(m);
  uint64_t nonce = sent_u64(m, "nonce");
  ent e[9];
  for (uint32_t i = 0; i < 9; i++)
    e[i] = (ent){200 + i, NULL};
  up(v, 3, T0 + 10002);
  assert_int_equal(deliver(v, 3, GN_MSG_VIEW_SHUFFLE_REPLY, shuffle_reply_body(nonce, e, 9), T0 + 10002), GN_ETOOBIG);
  assert_int_equal(gn_views_passive_count(v), 0);
  /* The refused one did not use up the answer. */
  assert_int_equal(deliver(v, 3, GN_MSG_VIEW_SHUFFLE_REPLY, shuffle_reply_body(nonce, e, 8), T0 + 10003), 0);
  assert_int_equal(gn_views_passive_count(v), 8);
  gn_views_free(v);
}

static void test_views_bad_addresses_refused(void **state) {
  (void)state;
  static const char *bad[] = {
      "example.com:7000", "10.0.0.9",       "10.0.0.9:0", "10.0.0.9:99999", "0.0.0.0:7000",   "10.0.0.9:70 0",
      "[::1:7000",        "224.1.1.1:7000", "",           "10.0.0.9:7000 ", "10.0.0.9:-7000", "256.0.0.1:7000"};
  gn_views *v = mk_views(NULL);
  for (uint32_t n = 2; n <= 4; n++)
    make_active(v, n, T0);
  uint64_t now = T0;
  for (size_t i = 0; i < GN_ARRAY_SIZE(bad); i++) {
    clear_rec();
    now += 10001;
    ent e[3] = {{300, NULL}, {301, bad[i]}, {302, NULL}};
    assert_int_equal(deliver(v, 2, GN_MSG_VIEW_SHUFFLE, shuffle_body(3, 0, 7, e, 3), now), GN_EINVAL);
    assert_int_equal(deliver(v, 2, GN_MSG_VIEW_FORWARD_JOIN, fjoin_body(301, bad[i], 0), now), GN_EINVAL);
    up(v, 60, now);
    assert_int_equal(deliver(v, 60, GN_MSG_VIEW_JOIN, join_body(bad[i]), now), GN_EINVAL);
    assert_int_equal(gn_views_passive_count(v), 0); /* not even the good entries */
    assert_false(active_has(v, 60));
    assert_int_equal(R.nmsgs, 0);
    assert_int_equal(R.nconnects, 0);
  }
  /* An address over GN_VIEWS_ADDR_MAX. */
  char longa[200];
  memset(longa, '1', sizeof(longa) - 1);
  longa[sizeof(longa) - 1] = 0;
  ent e[1] = {{300, longa}};
  assert_int_equal(deliver(v, 2, GN_MSG_VIEW_SHUFFLE, shuffle_body(3, 0, 7, e, 1), now + 10001), GN_EINVAL);
  assert_int_equal(gn_views_passive_count(v), 0);
  gn_views_free(v);
}

static void test_views_self_never_enters_views(void **state) {
  (void)state;
  gn_views *v = mk_views(NULL);
  for (uint32_t n = 2; n <= 4; n++)
    make_active(v, n, T0);
  clear_rec();
  /* Our id under another address, and another id under our address. */
  ent e[3] = {{SELF, "10.9.9.9:7000"}, {400, SELF_ADDR}, {401, NULL}};
  assert_int_equal(deliver(v, 2, GN_MSG_VIEW_SHUFFLE, shuffle_body(3, 0, 7, e, 3), T0), 0);
  assert_int_equal(gn_views_passive_count(v), 1);
  assert_true(passive_has(v, 401));
  assert_false(passive_has(v, 400));
  /* FORWARD_JOIN for ourselves, or for our address: no dial, no entry. */
  assert_int_equal(deliver(v, 2, GN_MSG_VIEW_FORWARD_JOIN, fjoin_body(SELF, "10.9.9.9:7000", 0), T0), 0);
  assert_int_equal(deliver(v, 2, GN_MSG_VIEW_FORWARD_JOIN, fjoin_body(402, SELF_ADDR, 3), T0), 0);
  assert_int_equal(R.nconnects, 0);
  assert_false(passive_has(v, 402));
  /* Our own id as the peer of a message, or as a contact. */
  uint8_t me[GN_PK_LEN];
  mk_id(SELF, me);
  gn_buf b = join_body("10.9.9.9:7000");
  assert_int_equal(gn_views_on_message(v, me, GN_MSG_VIEW_JOIN, b.data, b.len, T0), GN_EPERM);
  gn_buf_done(&b);
  assert_int_equal(gn_views_add_contact(v, me, "10.9.9.9:7000", T0), GN_EINVAL);
  gn_views_peer_up(v, me, "10.9.9.9:7000", T0);
  assert_false(gn_views_is_active(v, me));
  assert_false(gn_views_is_passive(v, me));
  gn_views_free(v);
}

static void test_views_duplicate_entries_kept_once(void **state) {
  (void)state;
  gn_views *v = mk_views(NULL);
  make_active(v, 2, T0);
  ent e[6] = {{500, NULL}, {500, NULL}, {500, "10.7.7.7:7000"}, {501, "10.0.1.244:7000"}, {502, NULL}, {2, NULL}};
  /* 501 claims 500's address; 2 is already active. */
  assert_int_equal(deliver(v, 2, GN_MSG_VIEW_SHUFFLE, shuffle_body(3, 0, 7, e, 6), T0), 0);
  assert_int_equal(gn_views_passive_count(v), 2);
  assert_true(passive_has(v, 500));
  assert_true(passive_has(v, 502));
  assert_false(passive_has(v, 501));
  assert_false(passive_has(v, 2));
  gn_views_free(v);
}

static void test_views_shuffle_from_non_member_refused(void **state) {
  (void)state;
  gn_views *v = mk_views(NULL);
  make_active(v, 2, T0);
  up(v, 9, T0);
  clear_rec();
  ent e[2] = {{600, NULL}, {601, NULL}};
  assert_int_equal(deliver(v, 9, GN_MSG_VIEW_SHUFFLE, shuffle_body(9, 6, 7, e, 2), T0), GN_EPERM);
  assert_int_equal(gn_views_passive_count(v), 0);
  assert_int_equal(R.nmsgs, 0);
  gn_views_free(v);
}

static void test_views_unsolicited_shuffle_reply_refused(void **state) {
  (void)state;
  gn_views *v = mk_views(NULL);
  make_active(v, 2, T0);
  ent e[2] = {{600, NULL}, {601, NULL}};
  assert_int_equal(deliver(v, 2, GN_MSG_VIEW_SHUFFLE_REPLY, shuffle_reply_body(7, e, 2), T0), GN_ESTATE);
  assert_int_equal(gn_views_passive_count(v), 0);
  /* After our shuffle, a wrong nonce is refused, the right one taken once. */
  gn_views_tick(v, T0 + 10001);
  uint64_t nonce = sent_u64(last_sent(GN_MSG_VIEW_SHUFFLE), "nonce");
  assert_int_equal(deliver(v, 2, GN_MSG_VIEW_SHUFFLE_REPLY, shuffle_reply_body(nonce + 1, e, 2), T0 + 10002),
                   GN_ESTATE);
  assert_int_equal(deliver(v, 2, GN_MSG_VIEW_SHUFFLE_REPLY, shuffle_reply_body(nonce, e, 1), T0 + 10002), 0);
  assert_int_equal(deliver(v, 2, GN_MSG_VIEW_SHUFFLE_REPLY, shuffle_reply_body(nonce, e + 1, 1), T0 + 10003),
                   GN_ESTATE);
  assert_int_equal(gn_views_passive_count(v), 1);
  gn_views_free(v);
}

/* Hostile: an active member floods shuffles carrying fresh identities, many
 * per period and over many periods. Per period at most shuffle_per_peer
 * shuffles are taken and at most replace_per_period (12 of 48) passive
 * entries are evicted; entries we have had a session with are never pushed
 * out by hearsay. */
static void test_views_shuffle_flood_replaces_bounded_share(void **state) {
  (void)state;
  gn_views *v = mk_views(NULL);
  make_active(v, 2, T0);
  make_active(v, 3, T0);
  uint64_t now = T0;
  /* 8 verified passive members (active once, then disconnected), 40 hearsay. */
  for (uint32_t n = 10; n < 18; n++) {
    make_active(v, n, now);
    assert_int_equal(deliver(v, n, GN_MSG_VIEW_DISCONNECT, join_body(SELF_ADDR), now), 0);
    now += 3001; /* NEIGHBOR rate state of the next */
  }
  fill_passive_hearsay(v, 2, 1000, 40, &now);
  assert_int_equal(gn_views_passive_count(v), 48);
  gn_views_peer before[48];
  gn_views_passive(v, before, 48);
  now += 10001;
  uint32_t fresh = 100000;
  for (int period = 0; period < 5; period++) {
    gn_views_stats s0, s1;
    gn_views_stats_get(v, &s0);
    int taken = 0;
    for (int k = 0; k < 50; k++) {
      ent e[8];
      for (int i = 0; i < 8; i++)
        e[i] = (ent){fresh++, NULL};
      taken += deliver(v, 2, GN_MSG_VIEW_SHUFFLE, shuffle_body(fresh++, 0, (uint64_t)k, e, 8), now + (uint64_t)k) == 0;
    }
    gn_views_stats_get(v, &s1);
    assert_int_equal(taken, 10);
    assert_true(s1.passive_replaced - s0.passive_replaced <= 12);
    assert_true(s1.passive_replaced - s0.passive_replaced >= 1);
    for (uint32_t n = 10; n < 18; n++)
      assert_true(passive_has(v, n));
    assert_int_equal(gn_views_passive_count(v), 48);
    now += 10001;
  }
  /* Over five periods at most 5 x 12 of the first 48 entries went. */
  size_t kept = 0;
  for (size_t i = 0; i < 48; i++)
    kept += gn_views_is_passive(v, before[i].id);
  gn_views_stats st;
  gn_views_stats_get(v, &st);
  assert_true(st.passive_replaced <= 5 * 12);
  assert_true(48 - kept <= st.passive_replaced);
  gn_views_free(v);
}

static void test_views_verified_outrank_hearsay(void **state) {
  (void)state;
  gn_views_config c;
  gn_views_config_default(&c);
  c.passive_size = 8;
  c.replace_per_period = 100;
  gn_views *v = mk_views(&c);
  make_active(v, 2, T0);
  uint64_t now = T0;
  for (uint32_t n = 10; n < 18; n++) {
    make_active(v, n, now);
    assert_int_equal(deliver(v, n, GN_MSG_VIEW_DISCONNECT, join_body(SELF_ADDR), now), 0);
    now += 3001;
  }
  assert_int_equal(gn_views_passive_count(v), 8);
  now += 10001;
  ent e[8];
  for (int i = 0; i < 8; i++)
    e[i] = (ent){700 + (uint32_t)i, NULL};
  assert_int_equal(deliver(v, 2, GN_MSG_VIEW_SHUFFLE, shuffle_body(3, 0, 1, e, 8), now), 0);
  for (uint32_t n = 10; n < 18; n++)
    assert_true(passive_has(v, n));
  for (uint32_t n = 700; n < 708; n++)
    assert_false(passive_has(v, n));
  gn_views_free(v);
}

/* Hostile: 1,000 identities each send one JOIN; the per-peer rate state stays
 * within its table, newcomers are not locked out, and the records of the
 * latest senders still hold. */
static void test_views_rate_state_bounded(void **state) {
  (void)state;
  gn_views *v = mk_views(NULL);
  uint64_t now = T0;
  int busy = 0;
  for (uint32_t n = 1000; n < 2000; n++) {
    char a[GN_VIEWS_ADDR_MAX];
    mk_addr(n, a);
    up(v, n, now);
    busy += deliver(v, n, GN_MSG_VIEW_JOIN, join_body(a), now++) == GN_EBUSY;
    assert_true(gn_views_rate_count(v) <= GN_VIEWS_RATE_MAX);
    clear_rec();
  }
  assert_int_equal(busy, 0);
  assert_int_equal(gn_views_rate_count(v), GN_VIEWS_RATE_MAX);
  char a[GN_VIEWS_ADDR_MAX];
  mk_addr(1999, a);
  assert_int_equal(deliver(v, 1999, GN_MSG_VIEW_JOIN, join_body(a), now), GN_EBUSY);
  gn_views_tick(v, now + 10001);
  assert_int_equal(gn_views_rate_count(v), 0);
  gn_views_free(v);
}

static void test_views_malformed_bodies_change_nothing(void **state) {
  (void)state;
  static const uint8_t garbage[] = {0xc1, 0x00};
  static const uint8_t not_map[] = {0x93, 0x01, 0x02, 0x03};
  static const uint8_t empty_map[] = {0x80};
  static const uint8_t trailing[] = {0x80, 0x80};
  static const struct {
    const uint8_t *p;
    size_t n;
  } bodies[] = {{garbage, sizeof(garbage)}, {not_map, sizeof(not_map)}, {trailing, sizeof(trailing)}, {NULL, 0}};
  gn_views *v = mk_views(NULL);
  for (uint32_t n = 2; n <= 4; n++)
    make_active(v, n, T0);
  clear_rec();
  uint8_t pk[GN_PK_LEN];
  mk_id(2, pk);
  for (uint32_t t = GN_MSG_VIEW_JOIN; t <= GN_MSG_VIEW_SHUFFLE_REPLY; t++) {
    for (size_t i = 0; i < GN_ARRAY_SIZE(bodies); i++)
      assert_int_equal(gn_views_on_message(v, pk, t, bodies[i].p, bodies[i].n, T0), GN_EINVAL);
    if (t != GN_MSG_VIEW_DISCONNECT) /* DISCONNECT has no keys */
      assert_int_equal(gn_views_on_message(v, pk, t, empty_map, 1, T0), GN_EINVAL);
  }
  static uint8_t big[GN_VIEWS_BODY_MAX + 1];
  assert_int_equal(gn_views_on_message(v, pk, GN_MSG_VIEW_SHUFFLE, big, sizeof(big), T0), GN_ETOOBIG);
  assert_int_equal(gn_views_on_message(v, pk, GN_MSG_OFFER, empty_map, 1, T0), GN_ENOTFOUND);
  /* Keys of the wrong type. */
  gn_wire_writer w;
  gn_wire_writer_init(&w);
  gn_wire_put_map(&w, 2);
  gn_wire_put_str(&w, "high");
  gn_wire_put_u64(&w, 1);
  gn_wire_put_str(&w, "addr");
  gn_wire_put_str(&w, "10.0.0.9:7000");
  assert_int_equal(deliver(v, 2, GN_MSG_VIEW_NEIGHBOR, take(&w), T0), GN_EINVAL);
  assert_int_equal(gn_views_active_count(v), 3);
  assert_int_equal(gn_views_passive_count(v), 0);
  assert_int_equal(R.nmsgs, 0);
  assert_int_equal(R.nconnects, 0);
  gn_views_free(v);
}

/* One message evicts at most kp entries, even with budget left. */
static void test_views_merge_evicts_at_most_kp_per_message(void **state) {
  (void)state;
  gn_views *v = mk_views(NULL);
  make_active(v, 2, T0);
  make_active(v, 3, T0);
  uint64_t now = T0;
  fill_passive_hearsay(v, 2, 1000, 48, &now);
  assert_int_equal(gn_views_passive_count(v), 48);
  now += 10001;
  ent e[8];
  for (uint32_t i = 0; i < 8; i++)
    e[i] = (ent){2000 + i, NULL};
  assert_int_equal(deliver(v, 2, GN_MSG_VIEW_SHUFFLE, shuffle_body(70, 0, 1, e, 8), now), 0);
  int in = 0;
  for (uint32_t n = 2000; n < 2008; n++)
    in += passive_has(v, n);
  assert_int_equal(in, 4);
  assert_int_equal(gn_views_passive_count(v), 48);
  gn_views_free(v);
}

/* An accepting answer to a request we gave up on: the other side took us in,
 * so it is told DISCONNECT rather than left with a one-sided link. */
static void test_views_late_accept_answered_with_disconnect(void **state) {
  (void)state;
  gn_views *v = mk_views(NULL);
  make_active(v, 2, T0);
  make_active(v, 3, T0);
  uint64_t now = T0;
  fill_passive_hearsay(v, 2, 800, 1, &now);
  up(v, 800, now);
  clear_rec();
  gn_views_tick(v, now);
  assert_int_equal(count_sent(GN_MSG_VIEW_NEIGHBOR), 1);
  gn_views_tick(v, now + 5001); /* timed out */
  clear_rec();
  assert_int_equal(deliver(v, 800, GN_MSG_VIEW_NEIGHBOR_REPLY, reply_accept_body(true), now + 5002), GN_ESTATE);
  assert_false(active_has(v, 800));
  const sentmsg *m = last_sent(GN_MSG_VIEW_DISCONNECT);
  assert_non_null(m);
  assert_int_equal(m->to, 800);
  gn_views_free(v);
}

static void test_views_add_passive_follows_merge_rules(void **state) {
  (void)state;
  gn_views_config c;
  gn_views_config_default(&c);
  c.passive_size = 4;
  c.replace_per_period = 2;
  gn_views *v = mk_views(&c);
  make_active(v, 2, T0);
  uint8_t pk[GN_PK_LEN];
  char a[GN_VIEWS_ADDR_MAX];
  mk_id(SELF, pk);
  assert_int_equal(gn_views_add_passive(v, pk, "10.9.9.9:7000", T0), GN_EINVAL);
  mk_id(900, pk);
  assert_int_equal(gn_views_add_passive(v, pk, SELF_ADDR, T0), GN_EINVAL);
  assert_int_equal(gn_views_add_passive(v, pk, "example.com:7000", T0), GN_EINVAL);
  mk_id(2, pk);
  mk_addr(2, a);
  assert_int_equal(gn_views_add_passive(v, pk, a, T0), GN_EEXIST);
  for (uint32_t n = 900; n < 904; n++) {
    mk_id(n, pk);
    mk_addr(n, a);
    assert_int_equal(gn_views_add_passive(v, pk, a, T0), 0);
  }
  mk_id(901, pk);
  mk_addr(950, a);
  assert_int_equal(gn_views_add_passive(v, pk, a, T0), GN_EEXIST);
  mk_id(950, pk);
  mk_addr(901, a);
  assert_int_equal(gn_views_add_passive(v, pk, a, T0), GN_EBUSY); /* 901's address */
  /* Full: two more replace hearsay within the budget, the third waits. */
  int ok = 0;
  for (uint32_t n = 960; n < 963; n++) {
    mk_id(n, pk);
    mk_addr(n, a);
    ok += gn_views_add_passive(v, pk, a, T0) == 0;
  }
  assert_int_equal(ok, 2);
  assert_int_equal(gn_views_passive_count(v), 4);
  gn_views_free(v);
}

static void test_views_next_deadline_covers_timers(void **state) {
  (void)state;
  gn_views *v = mk_views(NULL);
  uint64_t d = gn_views_next_deadline_ms(v);
  assert_true(d > T0 && d <= T0 + 10001); /* the first shuffle, or the first refill */
  make_active(v, 2, T0);
  char a[GN_VIEWS_ADDR_MAX];
  mk_addr(50, a);
  gn_views_tick(v, T0 + 1);
  assert_int_equal(deliver(v, 2, GN_MSG_VIEW_FORWARD_JOIN, fjoin_body(50, a, 0), T0 + 1), 0);
  d = gn_views_next_deadline_ms(v);
  assert_true(d <= T0 + 1 + 5000); /* the dial's timeout */
  gn_views_free(v);
}

/* --- failures and refills -------------------------------------------------*/

static void test_views_peer_down_promotes_from_passive(void **state) {
  (void)state;
  gn_views *v = mk_views(NULL);
  make_active(v, 2, T0);
  make_active(v, 3, T0);
  make_active(v, 4, T0);
  uint64_t now = T0;
  fill_passive_hearsay(v, 2, 800, 5, &now);
  assert_int_equal(gn_views_passive_count(v), 5);
  now += 10;
  clear_rec();
  down(v, 3, now);
  assert_false(active_has(v, 3));
  assert_false(passive_has(v, 3)); /* it may be dead */
  assert_int_equal(R.removed, 1);
  gn_views_tick(v, now);
  /* Bounded attempts per refill: fill_burst dials. */
  assert_int_equal(R.nconnects, 2);
  uint32_t target = R.connects[0];
  assert_true(target >= 800 && target < 805);
  up(v, target, now + 5);
  assert_false(sent_bool(last_sent(GN_MSG_VIEW_NEIGHBOR), "high")); /* 2 and 4 are still active */
  assert_int_equal(deliver(v, target, GN_MSG_VIEW_NEIGHBOR_REPLY, reply_accept_body(true), now + 10), 0);
  assert_true(active_has(v, target));
  assert_false(passive_has(v, target));
  gn_views_free(v);
}

/* With one member left (or none) the request is high priority: two nodes
 * left only with each other, among full nodes, must not stay an island. */
static void test_views_lone_member_asks_high(void **state) {
  (void)state;
  gn_views *v = mk_views(NULL);
  make_active(v, 2, T0);
  make_active(v, 3, T0);
  uint64_t now = T0;
  fill_passive_hearsay(v, 2, 800, 2, &now);
  down(v, 3, now);
  up(v, 800, now);
  up(v, 801, now);
  clear_rec();
  gn_views_tick(v, now);
  assert_int_equal(count_sent(GN_MSG_VIEW_NEIGHBOR), 2);
  for (size_t i = 0; i < R.nmsgs; i++)
    if (R.msgs[i].type == GN_MSG_VIEW_NEIGHBOR)
      assert_true(sent_bool(&R.msgs[i], "high"));
  gn_views_free(v);
}

/* A node left without any active member JOINs a contact again once the
 * passive view has had rejoin_interval_ms to refill the active one. */
static void test_views_rejoins_contact_when_alone(void **state) {
  (void)state;
  gn_views *v = mk_views(NULL);
  uint8_t c[GN_PK_LEN];
  char a[GN_VIEWS_ADDR_MAX];
  mk_id(2, c);
  mk_addr(2, a);
  up(v, 2, T0);
  assert_int_equal(gn_views_add_contact(v, c, a, T0), 0);
  make_active(v, 3, T0);
  uint64_t now = T0;
  fill_passive_hearsay(v, 2, 800, 3, &now); /* unreachable hearsay */
  down(v, 2, now);
  down(v, 3, now);
  assert_int_equal(gn_views_active_count(v), 0);
  clear_rec();
  for (uint64_t t = now; t < now + 5000; t += 100)
    gn_views_tick(v, t);
  assert_int_equal(R.nconnects, 3); /* the passive view first */
  up(v, 2, now + 5000);
  gn_views_tick(v, now + 5000);
  assert_int_equal(count_sent(GN_MSG_VIEW_JOIN), 1);
  assert_int_equal(last_sent(GN_MSG_VIEW_JOIN)->to, 2);
  assert_true(active_has(v, 2));
  gn_views_free(v);
}

static void test_views_refused_member_backs_off(void **state) {
  (void)state;
  gn_views *v = mk_views(NULL);
  make_active(v, 2, T0);
  make_active(v, 3, T0);
  uint64_t now = T0;
  fill_passive_hearsay(v, 2, 800, 1, &now);
  up(v, 800, now);
  clear_rec();
  gn_views_tick(v, now);
  assert_int_equal(count_sent(GN_MSG_VIEW_NEIGHBOR), 1);
  assert_int_equal(deliver(v, 800, GN_MSG_VIEW_NEIGHBOR_REPLY, reply_accept_body(false), now + 1), 0);
  assert_true(passive_has(v, 800));
  /* Refused: the session dialled for the request is released. */
  assert_int_equal(R.ndisconnects, 1);
  assert_int_equal(R.disconnects[0], 800);
  clear_rec();
  for (uint64_t t = now + 1000; t < now + 2000; t += 100)
    gn_views_tick(v, t);
  assert_int_equal(count_sent(GN_MSG_VIEW_NEIGHBOR), 0); /* backing off 2 s */
  gn_views_tick(v, now + 2100);
  assert_int_equal(count_sent(GN_MSG_VIEW_NEIGHBOR), 1);
  /* Refused again: the back-off doubles. */
  assert_int_equal(deliver(v, 800, GN_MSG_VIEW_NEIGHBOR_REPLY, reply_accept_body(false), now + 2101), 0);
  clear_rec();
  for (uint64_t t = now + 2200; t < now + 6000; t += 100)
    gn_views_tick(v, t);
  assert_int_equal(count_sent(GN_MSG_VIEW_NEIGHBOR), 0);
  gn_views_tick(v, now + 6200);
  assert_int_equal(count_sent(GN_MSG_VIEW_NEIGHBOR), 1);
  gn_views_free(v);
}

static void test_views_unreachable_member_forgotten(void **state) {
  (void)state;
  gn_views *v = mk_views(NULL);
  make_active(v, 2, T0);
  make_active(v, 3, T0);
  uint64_t now = T0;
  fill_passive_hearsay(v, 2, 800, 1, &now);
  clear_rec();
  gn_views_tick(v, now);
  assert_int_equal(R.nconnects, 1);
  gn_views_tick(v, now + 5001); /* the dial never came up */
  assert_false(passive_has(v, 800));
  assert_int_equal(gn_views_pending_count(v), 0);
  gn_views_free(v);
}

static void test_views_disconnect_moves_to_passive(void **state) {
  (void)state;
  gn_views *v = mk_views(NULL);
  make_active(v, 2, T0);
  make_active(v, 3, T0);
  clear_rec();
  assert_int_equal(deliver(v, 2, GN_MSG_VIEW_DISCONNECT, join_body(SELF_ADDR), T0 + 1), 0);
  assert_false(active_has(v, 2));
  assert_true(passive_has(v, 2));
  assert_int_equal(R.ndisconnects, 1);
  assert_int_equal(R.removed, 1);
  gn_views_free(v);
}

/* Hostile: a flood of DISCONNECTs. The first from an active member moves
 * it to the passive view and releases its session once; the rest, and any
 * from peers not in the active view, change nothing and release nothing
 * (each release would be a session closed by the daemon). */
static void test_views_disconnect_flood_releases_once(void **state) {
  (void)state;
  gn_views *v = mk_views(NULL);
  make_active(v, 2, T0);
  make_active(v, 3, T0);
  up(v, 9, T0);
  clear_rec();
  for (int i = 0; i < 1000; i++) {
    assert_int_equal(deliver(v, 2, GN_MSG_VIEW_DISCONNECT, join_body(SELF_ADDR), T0 + 1 + (uint64_t)i), 0);
    assert_int_equal(deliver(v, 9, GN_MSG_VIEW_DISCONNECT, join_body(SELF_ADDR), T0 + 1 + (uint64_t)i), 0);
  }
  assert_int_equal(R.ndisconnects, 1);
  assert_int_equal(R.disconnects[0], 2);
  assert_int_equal(R.removed, 1);
  assert_true(active_has(v, 3));
  assert_true(passive_has(v, 2));
  assert_false(passive_has(v, 9));
  gn_views_free(v);
}

/* A full shuffle round: our walk goes out with ourselves, ka active and kp
 * passive entries; the reply's entries replace the ones we sent first. */
static void test_views_shuffle_exchange(void **state) {
  (void)state;
  gn_views_config c;
  gn_views_config_default(&c);
  c.passive_size = 6;
  gn_views *v = mk_views(&c);
  for (uint32_t n = 2; n <= 5; n++)
    make_active(v, n, T0);
  uint64_t now = T0;
  fill_passive_hearsay(v, 2, 800, 6, &now);
  assert_int_equal(gn_views_passive_count(v), 6);
  clear_rec();
  now += 10001;
  gn_views_tick(v, now);
  const sentmsg *m = last_sent(GN_MSG_VIEW_SHUFFLE);
  assert_non_null(m);
  gn_wire_doc d;
  assert_int_equal(gn_wire_decode(m->body, m->len, &d), 0);
  const msgpack_object_array *arr;
  assert_int_equal(gn_wire_get_array(d.root, "entries", 100, &arr), 0);
  assert_int_equal(arr->size, 1 + 3 + 4);
  uint8_t first[GN_PK_LEN], me[GN_PK_LEN];
  mk_id(SELF, me);
  assert_int_equal(gn_wire_get_bin_exact(&arr->ptr[0], "id", first, GN_PK_LEN), 0);
  assert_memory_equal(first, me, GN_PK_LEN);
  uint32_t sent_passive[4];
  for (int i = 0; i < 4; i++) {
    uint8_t pk[GN_PK_LEN];
    assert_int_equal(gn_wire_get_bin_exact(&arr->ptr[4 + i], "id", pk, GN_PK_LEN), 0);
    sent_passive[i] = id_num(pk);
    assert_true(sent_passive[i] >= 800 && sent_passive[i] < 806);
  }
  uint64_t nonce = sent_u64(m, "nonce");
  assert_int_equal(sent_u64(m, "ttl"), 6);
  gn_wire_doc_done(&d);
  up(v, 77, now);
  ent e[3] = {{900, NULL}, {901, NULL}, {902, NULL}};
  assert_int_equal(deliver(v, 77, GN_MSG_VIEW_SHUFFLE_REPLY, shuffle_reply_body(nonce, e, 3), now + 5), 0);
  assert_int_equal(gn_views_passive_count(v), 6);
  for (uint32_t n = 900; n < 903; n++)
    assert_true(passive_has(v, n));
  /* The three evicted were among the four we sent. */
  int gone = 0;
  for (int i = 0; i < 4; i++)
    gone += !passive_has(v, sent_passive[i]);
  assert_int_equal(gone, 3);
  gn_views_free(v);
}

/* The walk ends here (TTL 1): we answer the origin over a dial, with as many
 * of our passive entries, and keep theirs. */
static void test_views_shuffle_walk_ends_and_replies(void **state) {
  (void)state;
  gn_views *v = mk_views(NULL);
  make_active(v, 2, T0);
  make_active(v, 3, T0);
  uint64_t now = T0;
  fill_passive_hearsay(v, 2, 800, 4, &now);
  clear_rec();
  ent e[2] = {{900, NULL}, {901, NULL}};
  assert_int_equal(deliver(v, 2, GN_MSG_VIEW_SHUFFLE, shuffle_body(70, 1, 99, e, 2), now), 0);
  assert_int_equal(count_sent(GN_MSG_VIEW_SHUFFLE), 0);
  assert_int_equal(R.nconnects, 1);
  assert_int_equal(R.connects[0], 70);
  up(v, 70, now + 5);
  const sentmsg *m = last_sent(GN_MSG_VIEW_SHUFFLE_REPLY);
  assert_non_null(m);
  assert_int_equal(m->to, 70);
  assert_int_equal(sent_u64(m, "nonce"), 99);
  assert_true(passive_has(v, 900) && passive_has(v, 901));
  assert_int_equal(R.ndisconnects, 1); /* the session was only for the reply */
  /* With TTL left, it walks on to another active member instead. */
  clear_rec();
  assert_int_equal(deliver(v, 2, GN_MSG_VIEW_SHUFFLE, shuffle_body(71, 5, 98, e, 2), now + 6), 0);
  m = last_sent(GN_MSG_VIEW_SHUFFLE);
  assert_non_null(m);
  assert_int_equal(m->to, 3);
  assert_int_equal(sent_u64(m, "ttl"), 4);
  gn_views_free(v);
}

/* --- the in-test network --------------------------------------------------*/

#define SIM_MAX 256
#define SIM_STEP_MS 10
#define SIM_TICK_MS 100

enum { LINK_DOWN, LINK_UP, LINK_CLOSING };
enum { EV_MSG, EV_UP, EV_DOWN };

typedef struct simev {
  uint64_t at, seq;
  int kind;
  int from, to;
  uint32_t type;
  uint8_t *body;
  size_t len;
} simev;

typedef struct simnode {
  gn_views *v;
  uint8_t id[GN_PK_LEN];
  char addr[GN_VIEWS_ADDR_MAX];
  bool alive;
  int bad;
} simnode;

typedef struct sim {
  simnode n[SIM_MAX];
  int count;
  uint8_t link[SIM_MAX][SIM_MAX];
  simev *q; /* a binary heap on (at, seq) */
  size_t qlen, qcap;
  uint64_t seq;
  uint64_t pair_at[SIM_MAX][SIM_MAX]; /* last delivery time per pair of nodes */
  uint64_t jitter_ms;                 /* extra delay drawn in [0, jitter_ms) */
  uint64_t rng;
  uint64_t now;
  uint64_t msgs;
} sim;

static sim *S;

static bool ev_before(const simev *x, const simev *y) {
  return x->at < y->at || (x->at == y->at && x->seq < y->seq);
}

/* Everything between two nodes (messages both ways, the link coming up or
 * going down) is delivered in the order it was sent, as over one TCP
 * connection; with jitter, different pairs overtake each other. */
static void sim_push(int kind, int from, int to, uint32_t type, const uint8_t *body, size_t len) {
  if (S->qlen == S->qcap) {
    S->qcap = S->qcap ? S->qcap * 2 : 4096;
    S->q = realloc(S->q, S->qcap * sizeof(simev));
    assert_non_null(S->q);
  }
  uint64_t delay = SIM_STEP_MS;
  if (S->jitter_ms) {
    S->rng = S->rng * 6364136223846793005ull + 1442695040888963407ull;
    delay += (S->rng >> 33) % S->jitter_ms;
  }
  int lo = from < to ? from : to, hi = from < to ? to : from;
  uint64_t at = S->now + delay;
  if (at < S->pair_at[lo][hi])
    at = S->pair_at[lo][hi];
  S->pair_at[lo][hi] = at;
  simev e = {at, S->seq++, kind, from, to, type, NULL, len};
  if (len) {
    e.body = malloc(len);
    assert_non_null(e.body);
    memcpy(e.body, body, len);
  }
  size_t i = S->qlen++;
  while (i > 0 && ev_before(&e, &S->q[(i - 1) / 2])) {
    S->q[i] = S->q[(i - 1) / 2];
    i = (i - 1) / 2;
  }
  S->q[i] = e;
}

static simev sim_pop(void) {
  simev top = S->q[0], last = S->q[--S->qlen];
  size_t i = 0;
  for (;;) {
    size_t c = 2 * i + 1;
    if (c >= S->qlen)
      break;
    if (c + 1 < S->qlen && ev_before(&S->q[c + 1], &S->q[c]))
      c++;
    if (!ev_before(&S->q[c], &last))
      break;
    S->q[i] = S->q[c];
    i = c;
  }
  if (S->qlen)
    S->q[i] = last;
  return top;
}

static int sim_idx(const uint8_t id[GN_PK_LEN]) {
  uint32_t n = id_num(id);
  return n < (uint32_t)S->count && memcmp(S->n[n].id, id, GN_PK_LEN) == 0 ? (int)n : -1;
}

static int sim_send(void *ud, const uint8_t peer[GN_PK_LEN], uint32_t type, const uint8_t *body, size_t len) {
  int a = (int)(intptr_t)ud, b = sim_idx(peer);
  assert_true(len <= GN_VIEWS_BODY_MAX);
  if (b < 0 || S->link[a][b] != LINK_UP)
    return GN_ECLOSED;
  sim_push(EV_MSG, a, b, type, body, len);
  S->msgs++;
  return 0;
}

static void sim_connect(void *ud, const uint8_t peer[GN_PK_LEN], const char *addr) {
  int a = (int)(intptr_t)ud, b = addr_num(addr);
  assert_true(gn_views_addr_valid(addr));
  if (b < 0 || b >= S->count || memcmp(S->n[b].id, peer, GN_PK_LEN) != 0)
    return; /* nobody with that key answers there: the dial fails silently */
  sim_push(EV_UP, a, b, 0, NULL, 0);
}

static void sim_disconnect(void *ud, const uint8_t peer[GN_PK_LEN]) {
  int a = (int)(intptr_t)ud, b = sim_idx(peer);
  if (b < 0 || S->link[a][b] != LINK_UP)
    return;
  S->link[a][b] = S->link[b][a] = LINK_CLOSING;
  sim_push(EV_DOWN, a, b, 0, NULL, 0);
}

static void sim_deliver(simev *e) {
  simnode *A = &S->n[e->from], *B = &S->n[e->to];
  switch (e->kind) {
  case EV_MSG:
    if (B->alive && S->link[e->from][e->to] != LINK_DOWN) {
      int r = gn_views_on_message(B->v, A->id, e->type, e->body, e->len, S->now);
      if (r == GN_EINVAL || r == GN_ETOOBIG)
        B->bad++; /* EPERM, EBUSY and ESTATE happen in honest races */
    }
    break;
  case EV_UP:
    if (!A->alive || !B->alive)
      break;
    if (S->link[e->from][e->to] == LINK_UP) {
      gn_views_peer_up(A->v, B->id, B->addr, S->now);
      break;
    }
    if (S->link[e->from][e->to] == LINK_CLOSING) {
      sim_push(EV_UP, e->from, e->to, 0, NULL, 0); /* after the close */
      break;
    }
    S->link[e->from][e->to] = S->link[e->to][e->from] = LINK_UP;
    gn_views_peer_up(A->v, B->id, B->addr, S->now);
    gn_views_peer_up(B->v, A->id, A->addr, S->now);
    break;
  default:
    if (S->link[e->from][e->to] == LINK_DOWN)
      break;
    S->link[e->from][e->to] = S->link[e->to][e->from] = LINK_DOWN;
    if (A->alive)
      gn_views_peer_down(A->v, B->id, S->now);
    if (B->alive)
      gn_views_peer_down(B->v, A->id, S->now);
    break;
  }
  free(e->body);
}

/* Delivers what is due by now (drain: everything, however late). */
static void sim_run_queue(bool drain) {
  size_t guard = 0;
  while (S->qlen && (drain || S->q[0].at <= S->now)) {
    simev e = sim_pop();
    if (drain && e.at > S->now)
      S->now = e.at;
    sim_deliver(&e);
    assert_true(++guard < 50000000);
  }
}

static void sim_init(int count, const gn_views_config *cfg, uint64_t seed) {
  S = calloc(1, sizeof(*S));
  assert_non_null(S);
  S->count = count;
  S->now = T0;
  S->rng = seed;
  for (int i = 0; i < count; i++) {
    simnode *n = &S->n[i];
    mk_id((uint32_t)i, n->id);
    mk_addr((uint32_t)i, n->addr);
    n->alive = true;
    gn_views_io io = {sim_send, sim_connect, sim_disconnect, NULL, (void *)(intptr_t)i};
    assert_int_equal(gn_views_new(n->id, n->addr, cfg, &io, seed * 1000003u + (uint64_t)i, T0, &n->v), 0);
  }
}

static void sim_free(void) {
  for (size_t i = 0; i < S->qlen; i++)
    free(S->q[i].body);
  free(S->q);
  for (int i = 0; i < S->count; i++)
    gn_views_free(S->n[i].v);
  free(S);
  S = NULL;
}

/* Node i finds node 0 the way gpunetd does with a bootstrap address: a
 * session comes up, then it is told the contact. */
static void sim_bootstrap(int i) {
  S->link[i][0] = S->link[0][i] = LINK_UP;
  gn_views_peer_up(S->n[i].v, S->n[0].id, S->n[0].addr, S->now);
  gn_views_peer_up(S->n[0].v, S->n[i].id, S->n[i].addr, S->now);
  assert_int_equal(gn_views_add_contact(S->n[i].v, S->n[0].id, S->n[0].addr, S->now), 0);
}

static void sim_step(void) {
  S->now += SIM_STEP_MS;
  sim_run_queue(false);
  uint64_t slot = (S->now / SIM_STEP_MS) % (SIM_TICK_MS / SIM_STEP_MS);
  for (int i = 0; i < S->count; i++)
    if (S->n[i].alive && (uint64_t)i % (SIM_TICK_MS / SIM_STEP_MS) == slot)
      gn_views_tick(S->n[i].v, S->now);
}

static void sim_run_ms(uint64_t ms) {
  uint64_t end = S->now + ms;
  while (S->now < end)
    sim_step();
}

static void sim_kill(int k) {
  S->n[k].alive = false;
  for (int j = 0; j < S->count; j++)
    if (S->link[k][j] == LINK_UP) {
      S->link[k][j] = S->link[j][k] = LINK_CLOSING;
      sim_push(EV_DOWN, j, k, 0, NULL, 0);
    }
}

/* Joins 1..count-1 through node 0, one every 50 ms, then runs settle_ms. */
static void sim_join_all(uint64_t settle_ms) {
  for (int i = 1; i < S->count; i++) {
    sim_bootstrap(i);
    sim_run_ms(50);
  }
  sim_run_ms(settle_ms);
}

/* Checks, after draining every message in flight: active views within size,
 * only live members, symmetric; returns how many live nodes a BFS over the
 * active views reaches from the first live one, and how many are live. */
static int sim_check(int *ret_live, size_t active_size) {
  sim_run_queue(true);
  gn_views_peer p[GN_VIEWS_ACTIVE_MAX];
  int live = 0, first = -1;
  for (int i = 0; i < S->count; i++) {
    if (!S->n[i].alive)
      continue;
    live++;
    if (first < 0)
      first = i;
    size_t na = gn_views_active(S->n[i].v, p, GN_VIEWS_ACTIVE_MAX);
    assert_true(na <= active_size);
    for (size_t k = 0; k < na; k++) {
      int j = sim_idx(p[k].id);
      assert_true(j >= 0);
      if (!S->n[j].alive)
        fail_msg("node %d keeps dead node %d active", i, j);
      if (!gn_views_is_active(S->n[j].v, S->n[i].id))
        fail_msg("node %d has %d active, not the other way round", i, j);
      assert_int_equal(S->link[i][j], LINK_UP);
    }
  }
  static int queue[SIM_MAX];
  bool seen[SIM_MAX] = {0};
  int qh = 0, qt = 0, reached = 0;
  queue[qt++] = first;
  seen[first] = true;
  while (qh < qt) {
    int i = queue[qh++];
    reached++;
    size_t na = gn_views_active(S->n[i].v, p, GN_VIEWS_ACTIVE_MAX);
    for (size_t k = 0; k < na; k++) {
      int j = sim_idx(p[k].id);
      if (!seen[j]) {
        seen[j] = true;
        queue[qt++] = j;
      }
    }
  }
  *ret_live = live;
  return reached;
}

static double sim_mean_active(void) {
  double s = 0;
  int live = 0;
  for (int i = 0; i < S->count; i++)
    if (S->n[i].alive) {
      s += (double)gn_views_active_count(S->n[i].v);
      live++;
    }
  return s / live;
}

static void test_views_overlay_200_connected_and_symmetric(void **state) {
  (void)state;
  sim_init(200, NULL, 1);
  sim_join_all(30000);
  int live;
  int reached = sim_check(&live, 6);
  assert_int_equal(live, 200);
  assert_int_equal(reached, 200);
  double mean = sim_mean_active();
  print_message("200 nodes: mean active %.2f, %llu messages\n", mean, (unsigned long long)S->msgs);
  assert_true(mean >= 4.0);
  for (int i = 0; i < S->count; i++)
    assert_int_equal(S->n[i].bad, 0); /* honest nodes never refuse each other as malformed */
  sim_free();
}

static void test_views_overlay_survives_20pct_killed(void **state) {
  (void)state;
  sim_init(200, NULL, 2);
  sim_join_all(30000);
  int live;
  assert_int_equal(sim_check(&live, 6), 200);
  /* Kill 40 nodes, drawn with a fixed seed (the contact among the candidates). */
  uint64_t x = 12345;
  int killed = 0;
  while (killed < 40) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    int k = (int)((x >> 33) % 200);
    if (S->n[k].alive) {
      sim_kill(k);
      killed++;
    }
  }
  sim_run_ms(60000);
  int reached = sim_check(&live, 6);
  assert_int_equal(live, 160);
  assert_int_equal(reached, 160);
  double mean = sim_mean_active();
  int low = 0;
  for (int i = 0; i < S->count; i++)
    if (S->n[i].alive && gn_views_active_count(S->n[i].v) < 3)
      low++;
  print_message("after 20%% killed: mean active %.2f, %d survivors below 3\n", mean, low);
  assert_true(mean >= 4.0);
  assert_true(low <= 8);
  sim_free();
}

/* Links whose delays vary from 10 to 110 ms, so messages between different
 * pairs overtake each other (NEIGHBORs cross, a DISCONNECT overtakes a
 * reply sent over another link): still connected and symmetric, before and
 * after 20 % are killed. */
static void test_views_overlay_jittered_links(void **state) {
  (void)state;
  sim_init(200, NULL, 4);
  S->jitter_ms = 100;
  sim_join_all(30000);
  int live;
  assert_int_equal(sim_check(&live, 6), 200);
  for (int k = 3; k < 200; k += 5)
    sim_kill(k);
  sim_run_ms(60000);
  int reached = sim_check(&live, 6);
  assert_int_equal(live, 160);
  assert_int_equal(reached, 160);
  print_message("jittered links, 20%% killed: mean active %.2f\n", sim_mean_active());
  assert_true(sim_mean_active() >= 4.0);
  for (int i = 0; i < S->count; i++)
    assert_int_equal(S->n[i].bad, 0);
  sim_free();
}

/* One seed, one run: the same network replays exactly (every view and every
 * counter), so whatever a run finds can be replayed; another seed differs. */
static void snapshot(uint8_t *out, size_t cap, size_t *ret_len) {
  size_t len = 0;
  gn_views_peer p[GN_VIEWS_PASSIVE_MAX];
  for (int i = 0; i < S->count; i++) {
    gn_views_stats st;
    gn_views_stats_get(S->n[i].v, &st);
    size_t na = gn_views_active(S->n[i].v, p, GN_VIEWS_PASSIVE_MAX);
    size_t np = gn_views_passive(S->n[i].v, p + na, GN_VIEWS_PASSIVE_MAX - na);
    assert_true(len + sizeof(st) + (na + np) * GN_PK_LEN <= cap);
    memcpy(out + len, &st, sizeof(st));
    len += sizeof(st);
    for (size_t k = 0; k < na + np; k++, len += GN_PK_LEN)
      memcpy(out + len, p[k].id, GN_PK_LEN);
  }
  *ret_len = len;
}

static void test_views_overlay_replays_from_its_seed(void **state) {
  (void)state;
  size_t cap = 1 << 20, len[3];
  uint8_t *snap[3];
  for (int run = 0; run < 3; run++) {
    snap[run] = malloc(cap);
    assert_non_null(snap[run]);
    sim_init(60, NULL, run < 2 ? 5 : 6);
    S->jitter_ms = 50;
    sim_join_all(20000);
    sim_kill(7);
    sim_run_ms(5000);
    snapshot(snap[run], cap, &len[run]);
    sim_free();
  }
  assert_int_equal(len[0], len[1]);
  assert_memory_equal(snap[0], snap[1], len[0]);
  assert_true(len[0] != len[2] || memcmp(snap[0], snap[2], len[0]) != 0);
  for (int run = 0; run < 3; run++)
    free(snap[run]);
}

static double sim_mean_passive(size_t *ret_min) {
  double s = 0;
  int live = 0;
  size_t mn = SIZE_MAX;
  for (int i = 0; i < S->count; i++)
    if (S->n[i].alive) {
      size_t c = gn_views_passive_count(S->n[i].v);
      s += (double)c;
      mn = c < mn ? c : mn;
      live++;
    }
  *ret_min = mn;
  return s / live;
}

static void test_views_shuffles_fill_passive_views(void **state) {
  (void)state;
  /* Without shuffles, what joins and evictions alone leave... */
  gn_views_config c;
  gn_views_config_default(&c);
  c.shuffle_interval_ms = 1000000000u;
  sim_init(200, &c, 3);
  sim_join_all(120000);
  size_t min0, min1;
  double without = sim_mean_passive(&min0);
  sim_free();
  /* ...and with them. */
  sim_init(200, NULL, 3);
  sim_join_all(120000);
  double with = sim_mean_passive(&min1);
  gn_views_stats st;
  gn_views_stats_get(S->n[100].v, &st);
  print_message("passive views after 120 s: mean %.1f (min %zu) with shuffles, %.1f (min %zu) without\n", with, min1,
                without, min0);
  assert_true(with >= 0.75 * 48);
  assert_true(min1 >= 12);
  assert_true(with > without + 8);
  sim_free();
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_views_addr_grammar, setup, teardown),
      cmocka_unit_test_setup_teardown(test_views_config_bounds, setup, teardown),
      cmocka_unit_test_setup_teardown(test_views_contact_gets_join_and_enters_active, setup, teardown),
      cmocka_unit_test_setup_teardown(test_views_contact_is_remembered, setup, teardown),
      cmocka_unit_test_setup_teardown(test_views_contact_without_session_is_dialled_first, setup, teardown),
      cmocka_unit_test_setup_teardown(test_views_join_is_accepted_and_forwarded, setup, teardown),
      cmocka_unit_test_setup_teardown(test_views_join_when_full_evicts_one_with_disconnect, setup, teardown),
      cmocka_unit_test_setup_teardown(test_views_join_rate_bound, setup, teardown),
      cmocka_unit_test_setup_teardown(test_views_low_neighbor_refused_when_full, setup, teardown),
      cmocka_unit_test_setup_teardown(test_views_high_neighbor_accepted_when_full, setup, teardown),
      cmocka_unit_test_setup_teardown(test_views_neighbor_rate_bound, setup, teardown),
      cmocka_unit_test_setup_teardown(test_views_active_never_exceeds_size, setup, teardown),
      cmocka_unit_test_setup_teardown(test_views_eviction_spares_older_half, setup, teardown),
      cmocka_unit_test_setup_teardown(test_views_messages_act_on_their_sender_only, setup, teardown),
      cmocka_unit_test_setup_teardown(test_views_shuffle_flood_from_fresh_identities, setup, teardown),
      cmocka_unit_test_setup_teardown(test_views_forward_join_ttl_clamped, setup, teardown),
      cmocka_unit_test_setup_teardown(test_views_forward_join_at_ttl_zero_takes_joiner, setup, teardown),
      cmocka_unit_test_setup_teardown(test_views_forward_join_at_prwl_kept_as_passive, setup, teardown),
      cmocka_unit_test_setup_teardown(test_views_forward_join_from_non_member_refused, setup, teardown),
      cmocka_unit_test_setup_teardown(test_views_pending_dials_bounded, setup, teardown),
      cmocka_unit_test_setup_teardown(test_views_forward_join_per_peer_bound, setup, teardown),
      cmocka_unit_test_setup_teardown(test_views_shuffle_over_entry_bound_refused, setup, teardown),
      cmocka_unit_test_setup_teardown(test_views_shuffle_reply_over_entry_bound_refused, setup, teardown),
      cmocka_unit_test_setup_teardown(test_views_bad_addresses_refused, setup, teardown),
      cmocka_unit_test_setup_teardown(test_views_self_never_enters_views, setup, teardown),
      cmocka_unit_test_setup_teardown(test_views_duplicate_entries_kept_once, setup, teardown),
      cmocka_unit_test_setup_teardown(test_views_shuffle_from_non_member_refused, setup, teardown),
      cmocka_unit_test_setup_teardown(test_views_unsolicited_shuffle_reply_refused, setup, teardown),
      cmocka_unit_test_setup_teardown(test_views_shuffle_flood_replaces_bounded_share, setup, teardown),
      cmocka_unit_test_setup_teardown(test_views_verified_outrank_hearsay, setup, teardown),
      cmocka_unit_test_setup_teardown(test_views_rate_state_bounded, setup, teardown),
      cmocka_unit_test_setup_teardown(test_views_malformed_bodies_change_nothing, setup, teardown),
      cmocka_unit_test_setup_teardown(test_views_merge_evicts_at_most_kp_per_message, setup, teardown),
      cmocka_unit_test_setup_teardown(test_views_late_accept_answered_with_disconnect, setup, teardown),
      cmocka_unit_test_setup_teardown(test_views_add_passive_follows_merge_rules, setup, teardown),
      cmocka_unit_test_setup_teardown(test_views_next_deadline_covers_timers, setup, teardown),
      cmocka_unit_test_setup_teardown(test_views_peer_down_promotes_from_passive, setup, teardown),
      cmocka_unit_test_setup_teardown(test_views_lone_member_asks_high, setup, teardown),
      cmocka_unit_test_setup_teardown(test_views_rejoins_contact_when_alone, setup, teardown),
      cmocka_unit_test_setup_teardown(test_views_refused_member_backs_off, setup, teardown),
      cmocka_unit_test_setup_teardown(test_views_unreachable_member_forgotten, setup, teardown),
      cmocka_unit_test_setup_teardown(test_views_disconnect_moves_to_passive, setup, teardown),
      cmocka_unit_test_setup_teardown(test_views_disconnect_flood_releases_once, setup, teardown),
      cmocka_unit_test_setup_teardown(test_views_shuffle_exchange, setup, teardown),
      cmocka_unit_test_setup_teardown(test_views_shuffle_walk_ends_and_replies, setup, teardown),
      cmocka_unit_test(test_views_overlay_200_connected_and_symmetric),
      cmocka_unit_test(test_views_overlay_survives_20pct_killed),
      cmocka_unit_test(test_views_overlay_jittered_links),
      cmocka_unit_test(test_views_overlay_replays_from_its_seed),
      cmocka_unit_test(test_views_shuffles_fill_passive_views),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
