/* Tests for the libuv transport: real TCP on 127.0.0.1, two transports on
 * one loop, and a raw client sending bytes no session accepts. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <gpunet/transport.h>
#include <gpunet/uvutil.h>

typedef struct node {
  gn_identity *id;
  gn_transport *t;
  int ups, downs, msgs, refused;
  uint8_t refused_expected[GN_PK_LEN], refused_got[GN_PK_LEN];
  uint8_t last_peer[GN_PK_LEN];
  char last_addr[80];
  uint32_t last_type;
  gn_buf last_body;
  bool closed;
} node;

static uv_loop_t loop;
static uv_timer_t ticker;

static void on_up(gn_transport *t, const uint8_t peer[GN_PK_LEN], const char *addr, void *ud) {
  (void)t;
  node *n = ud;
  n->ups++;
  memcpy(n->last_peer, peer, GN_PK_LEN);
  snprintf(n->last_addr, sizeof(n->last_addr), "%s", addr);
}

static void on_down(gn_transport *t, const uint8_t peer[GN_PK_LEN], void *ud) {
  (void)t;
  (void)peer;
  ((node *)ud)->downs++;
}

static void on_msg(gn_transport *t, const uint8_t peer[GN_PK_LEN], const gn_envelope *env, const uint8_t *raw,
                   size_t raw_len, void *ud) {
  (void)t;
  (void)raw;
  (void)raw_len;
  node *n = ud;
  n->msgs++;
  memcpy(n->last_peer, peer, GN_PK_LEN);
  n->last_type = env->type;
  n->last_body.len = 0;
  gn_buf_append(&n->last_body, env->body, env->body_len);
}

static void on_refused(gn_transport *t, const char *addr, const uint8_t expected[GN_PK_LEN],
                       const uint8_t got[GN_PK_LEN], void *ud) {
  (void)t;
  (void)addr;
  node *n = ud;
  n->refused++;
  memcpy(n->refused_expected, expected, GN_PK_LEN);
  memcpy(n->refused_got, got, GN_PK_LEN);
}

static void on_closed(void *ud) {
  ((node *)ud)->closed = true;
}

static void noop_tick(uv_timer_t *t) {
  (void)t;
}

/* Runs the loop until cond(arg) holds or 5 s pass. */
static bool run_until(bool (*cond)(void *), void *arg) {
  uint64_t end = gn_mono_ms() + 5000;
  while (!cond(arg)) {
    if (gn_mono_ms() > end)
      return false;
    uv_run(&loop, UV_RUN_ONCE);
  }
  return true;
}

static void node_init(node *n) {
  memset(n, 0, sizeof(*n));
  assert_int_equal(gn_identity_generate(&n->id), 0);
  gn_transport_cbs cbs = {on_up, on_down, on_msg};
  assert_int_equal(gn_transport_new(&loop, n->id, &cbs, n, &n->t), 0);
  gn_transport_set_refused_cb(n->t, on_refused);
}

static bool both_closed(void *arg) {
  node **ns = arg;
  return ns[0]->closed && ns[1]->closed;
}

static void node_pair_done(node *a, node *b) {
  gn_transport_close(a->t, on_closed, a);
  gn_transport_close(b->t, on_closed, b);
  node *ns[2] = {a, b};
  assert_true(run_until(both_closed, ns));
  gn_identity_free(a->id);
  gn_identity_free(b->id);
  gn_buf_done(&a->last_body);
  gn_buf_done(&b->last_body);
}

static int setup(void **state) {
  (void)state;
  uv_loop_init(&loop);
  uv_timer_init(&loop, &ticker);
  uv_timer_start(&ticker, noop_tick, 10, 10);
  return 0;
}

static void close_left(uv_handle_t *h, void *arg) {
  (void)arg;
  if (!uv_is_closing(h))
    uv_close(h, NULL);
}

static int teardown(void **state) {
  (void)state;
  /* After a passing test only the ticker is left. A failing one jumps out
   * with its transports open: close what is left (leaking it) so that the
   * failure is reported instead of the loop running forever. */
  uv_walk(&loop, close_left, NULL);
  uv_run(&loop, UV_RUN_DEFAULT);
  return uv_loop_close(&loop) == 0 ? 0 : -1;
}

static bool both_up(void *arg) {
  node **ns = arg;
  return ns[0]->ups >= 1 && ns[1]->ups >= 1;
}

static bool got_msgs(void *arg) {
  node **ns = arg;
  return ns[0]->msgs >= 1 && ns[1]->msgs >= 1;
}

static void connect_pair(node *a, node *b) {
  assert_int_equal(gn_transport_listen(a->t, "127.0.0.1:0"), 0);
  const char *la = gn_transport_listen_addr(a->t);
  assert_true(strncmp(la, "127.0.0.1:", 10) == 0);
  assert_string_not_equal(la, "127.0.0.1:0");
  assert_int_equal(gn_transport_connect(b->t, la), 0);
  node *ns[2] = {a, b};
  assert_true(run_until(both_up, ns));
}

static void test_transport_connects_and_exchanges_envelopes(void **state) {
  (void)state;
  node a, b;
  node_init(&a);
  node_init(&b);
  connect_pair(&a, &b);
  assert_memory_equal(a.last_peer, b.id->pk, GN_PK_LEN);
  assert_memory_equal(b.last_peer, a.id->pk, GN_PK_LEN);
  /* b dialled and a listens: b learns a's advertised listen address. */
  assert_string_equal(b.last_addr, gn_transport_listen_addr(a.t));
  assert_true(gn_transport_is_up(a.t, b.id->pk));
  assert_int_equal(gn_transport_peer_count(a.t), 1);

  gn_buf e1 = {0}, e2 = {0};
  size_t big = 3u << 20;
  uint8_t *body = malloc(big);
  for (size_t i = 0; i < big; i++)
    body[i] = (uint8_t)(i * 7);
  assert_int_equal(gn_envelope_seal(a.id, GN_MSG_JOB_LOG, body, big, &e1), 0);
  assert_int_equal(gn_envelope_seal(b.id, GN_MSG_PEERS, (const uint8_t *)"\x80", 1, &e2), 0);
  assert_int_equal(gn_transport_send(a.t, b.id->pk, e1.data, e1.len), 0);
  assert_int_equal(gn_transport_send(b.t, a.id->pk, e2.data, e2.len), 0);
  node *ns[2] = {&a, &b};
  assert_true(run_until(got_msgs, ns));
  assert_int_equal(b.last_type, GN_MSG_JOB_LOG);
  assert_int_equal(b.last_body.len, big);
  assert_memory_equal(b.last_body.data, body, big);
  assert_int_equal(a.last_type, GN_MSG_PEERS);
  free(body);
  gn_buf_done(&e1);
  gn_buf_done(&e2);
  node_pair_done(&a, &b);
}

static void test_transport_send_to_unknown_peer_not_found(void **state) {
  (void)state;
  node a, b;
  node_init(&a);
  node_init(&b);
  assert_int_equal(gn_transport_send(a.t, b.id->pk, (const uint8_t *)"x", 1), GN_ENOTFOUND);
  assert_false(gn_transport_is_up(a.t, b.id->pk));
  node_pair_done(&a, &b);
}

static void test_transport_second_connect_is_harmless(void **state) {
  (void)state;
  node a, b;
  node_init(&a);
  node_init(&b);
  connect_pair(&a, &b);
  /* Dial again by address, and cross-dial the other way: still one peer. */
  assert_int_equal(gn_transport_connect(b.t, gn_transport_listen_addr(a.t)), 0);
  assert_int_equal(gn_transport_listen(b.t, "127.0.0.1:0"), 0);
  assert_int_equal(gn_transport_connect(a.t, gn_transport_listen_addr(b.t)), 0);
  uint64_t end = gn_mono_ms() + 300;
  while (gn_mono_ms() < end)
    uv_run(&loop, UV_RUN_ONCE);
  assert_int_equal(gn_transport_peer_count(a.t), 1);
  assert_int_equal(gn_transport_peer_count(b.t), 1);
  assert_int_equal(a.downs, 0);
  assert_int_equal(b.downs, 0);
  /* and the surviving session works */
  gn_buf e = {0};
  assert_int_equal(gn_envelope_seal(a.id, GN_MSG_PEERS, (const uint8_t *)"\x80", 1, &e), 0);
  assert_int_equal(gn_transport_send(a.t, b.id->pk, e.data, e.len), 0);
  assert_int_equal(gn_transport_send(b.t, a.id->pk, e.data, e.len), 0);
  node *ns[2] = {&a, &b};
  assert_true(run_until(got_msgs, ns));
  gn_buf_done(&e);
  node_pair_done(&a, &b);
}

static void test_transport_rejects_bad_addresses(void **state) {
  (void)state;
  node a, b;
  node_init(&a);
  node_init(&b);
  const char *bad[] = {"",    "1.2.3.4", "host.example:80", "1.2.3.4:99999", "1.2.3.4:-1",
                       ":80", "[::1:80", "1.2.3:80",        "1.2.3.4:8a"};
  for (size_t i = 0; i < GN_ARRAY_SIZE(bad); i++)
    if (gn_transport_connect(a.t, bad[i]) != GN_EINVAL)
      fail_msg("accepted '%s'", bad[i]);
  assert_int_equal(gn_transport_listen(b.t, "[::1]:0"), 0);
  assert_true(strncmp(gn_transport_listen_addr(b.t), "[::1]:", 6) == 0);
  node_pair_done(&a, &b);
}

static bool refused_once(void *arg) {
  return ((node *)arg)->refused >= 1;
}

static bool one_down(void *arg) {
  return ((node *)arg)->downs >= 1;
}

static bool one_msg(void *arg) {
  return ((node *)arg)->msgs >= 1;
}

static bool one_closed(void *arg) {
  return ((node *)arg)->closed;
}

/* An address learnt for one key (b's) is answered by another node (a): the
 * dialler refuses the session; dialled for a's own key, it comes up. */
static void test_transport_dial_refuses_another_key(void **state) {
  (void)state;
  node a, b, c;
  node_init(&a);
  node_init(&b);
  node_init(&c);
  assert_int_equal(gn_transport_listen(a.t, "127.0.0.1:0"), 0);
  const char *la = gn_transport_listen_addr(a.t);
  assert_int_equal(gn_transport_connect_peer(c.t, la, b.id->pk), 0);
  assert_true(run_until(refused_once, &c));
  assert_memory_equal(c.refused_expected, b.id->pk, GN_PK_LEN);
  assert_memory_equal(c.refused_got, a.id->pk, GN_PK_LEN);
  assert_int_equal(c.ups, 0);
  assert_false(gn_transport_is_up(c.t, a.id->pk));
  assert_int_equal(gn_transport_send(c.t, a.id->pk, (const uint8_t *)"x", 1), GN_ENOTFOUND);
  /* a may have finished its side of the handshake; then it lost the session */
  if (a.ups)
    assert_true(run_until(one_down, &a));
  assert_int_equal(gn_transport_peer_count(a.t), 0);
  /* the same address dialled for the key it really serves */
  assert_int_equal(gn_transport_connect_peer(c.t, la, a.id->pk), 0);
  node *ns[2] = {&a, &c};
  assert_true(run_until(both_up, ns));
  assert_true(gn_transport_is_up(c.t, a.id->pk));
  assert_int_equal(c.refused, 1);
  /* up under a's key, the address is refused at once for b's */
  assert_int_equal(gn_transport_connect_peer(c.t, la, b.id->pk), GN_EPERM);
  gn_transport_close(c.t, on_closed, &c);
  assert_true(run_until(one_closed, &c));
  gn_identity_free(c.id);
  gn_buf_done(&c.last_body);
  node_pair_done(&a, &b);
}

static bool both_down(void *arg) {
  node **ns = arg;
  return ns[0]->downs >= 1 && ns[1]->downs >= 1;
}

/* One envelope whose signature does not verify ends the whole session: it
 * is not delivered, and both ends see the peer go down. */
static void test_transport_bad_signature_closes_session(void **state) {
  (void)state;
  node a, b;
  node_init(&a);
  node_init(&b);
  connect_pair(&a, &b);
  gn_buf e = {0};
  assert_int_equal(gn_envelope_seal(b.id, GN_MSG_PEERS, (const uint8_t *)"\x80", 1, &e), 0);
  e.data[e.len - 1] ^= 1; /* the last signature byte */
  assert_int_equal(gn_transport_send(b.t, a.id->pk, e.data, e.len), 0);
  node *ns[2] = {&a, &b};
  assert_true(run_until(both_down, ns));
  assert_int_equal(a.msgs, 0);
  assert_false(gn_transport_is_up(a.t, b.id->pk));
  assert_false(gn_transport_is_up(b.t, a.id->pk));
  /* the same envelope signed properly is delivered on a new session */
  e.len = 0;
  assert_int_equal(gn_envelope_seal(b.id, GN_MSG_PEERS, (const uint8_t *)"\x80", 1, &e), 0);
  a.ups = b.ups = 0;
  assert_int_equal(gn_transport_connect(b.t, gn_transport_listen_addr(a.t)), 0);
  assert_true(run_until(both_up, ns));
  assert_int_equal(gn_transport_send(b.t, a.id->pk, e.data, e.len), 0);
  assert_true(run_until(one_msg, &a));
  assert_int_equal(a.last_type, GN_MSG_PEERS);
  gn_buf_done(&e);
  node_pair_done(&a, &b);
}

static bool got_error_and_down(void *arg) {
  node *n = arg;
  return n->msgs >= 1 && n->downs >= 1;
}

/* An envelope of another protocol version is answered with an ERROR (type
 * 40, signed by the receiver, naming both versions) before the session
 * closes. */
static void test_transport_unknown_version_answers_error_then_closes(void **state) {
  (void)state;
  node a, b;
  node_init(&a);
  node_init(&b);
  connect_pair(&a, &b);
  /* [2, 1, signer, body, sig]: the layout of version 1 under version 2 */
  gn_wire_writer w;
  gn_buf e = {0};
  uint8_t sig[GN_SIG_LEN] = {0};
  gn_wire_writer_init(&w);
  gn_wire_put_array(&w, 5);
  gn_wire_put_u64(&w, 2);
  gn_wire_put_u64(&w, GN_MSG_PEERS);
  gn_wire_put_bin(&w, b.id->pk, GN_PK_LEN);
  gn_wire_put_bin(&w, "\x80", 1);
  gn_wire_put_bin(&w, sig, GN_SIG_LEN);
  assert_int_equal(gn_wire_writer_take(&w, &e), 0);
  gn_wire_writer_done(&w);
  assert_int_equal(gn_transport_send(b.t, a.id->pk, e.data, e.len), 0);
  assert_true(run_until(got_error_and_down, &b));
  assert_int_equal(b.msgs, 1);
  assert_int_equal(b.last_type, GN_MSG_ERROR);
  assert_memory_equal(b.last_peer, a.id->pk, GN_PK_LEN);
  gn_wire_doc doc;
  char reason[256];
  uint64_t v = 0;
  assert_int_equal(gn_wire_decode(b.last_body.data, b.last_body.len, &doc), 0);
  assert_int_equal(gn_wire_get_str(doc.root, "reason", reason, sizeof(reason)), 0);
  assert_int_equal(gn_wire_get_u64(doc.root, "v", &v), 0);
  gn_wire_doc_done(&doc);
  assert_string_equal(reason, "unsupported protocol version 2; this node speaks version 1");
  assert_int_equal(v, GN_PROTO_VERSION);
  assert_int_equal(a.msgs, 0);
  assert_true(run_until(one_down, &a));
  assert_false(gn_transport_is_up(a.t, b.id->pk));
  gn_buf_done(&e);
  node_pair_done(&a, &b);
}

/* --- a raw TCP client -----------------------------------------------------*/

typedef struct raw {
  uv_tcp_t *tcp;
  uv_connect_t req;
  uv_write_t w;
  const uint8_t *bytes;
  size_t len;
  bool eof;
  size_t got;
  char rbuf[4096];
} raw;

static void raw_alloc(uv_handle_t *h, size_t s, uv_buf_t *b) {
  (void)s;
  raw *r = h->data;
  *b = uv_buf_init(r->rbuf, sizeof(r->rbuf));
}

static void raw_read(uv_stream_t *s, ssize_t n, const uv_buf_t *b) {
  (void)b;
  raw *r = s->data;
  if (n < 0)
    r->eof = true;
  else
    r->got += (size_t)n;
}

static void raw_written(uv_write_t *w, int status) {
  (void)w;
  (void)status;
}

static void raw_connected(uv_connect_t *req, int status) {
  raw *r = req->data;
  assert_int_equal(status, 0);
  uv_read_start((uv_stream_t *)r->tcp, raw_alloc, raw_read);
  uv_buf_t b = uv_buf_init((char *)r->bytes, (unsigned)r->len);
  uv_write(&r->w, (uv_stream_t *)r->tcp, &b, 1, raw_written);
}

static bool raw_eof(void *arg) {
  return ((raw *)arg)->eof;
}

static void raw_send(const char *addr, const uint8_t *bytes, size_t len, raw *r) {
  struct sockaddr_in sa;
  const char *colon = strrchr(addr, ':');
  uv_ip4_addr("127.0.0.1", atoi(colon + 1), &sa);
  memset(r, 0, sizeof(*r));
  r->bytes = bytes;
  r->len = len;
  r->tcp = gn_uv_handle_alloc(sizeof(uv_tcp_t));
  uv_tcp_init(&loop, r->tcp);
  r->tcp->data = r;
  r->req.data = r;
  assert_int_equal(uv_tcp_connect(&r->req, r->tcp, (const struct sockaddr *)&sa, raw_connected), 0);
}

static void test_transport_closes_garbage_and_oversized_clients(void **state) {
  (void)state;
  node a, b;
  node_init(&a);
  node_init(&b);
  assert_int_equal(gn_transport_listen(a.t, "127.0.0.1:0"), 0);
  static uint8_t oversized[70000];
  memset(oversized, 0x41, sizeof(oversized));
  oversized[0] = 0xff; /* a 65535-byte first handshake message */
  oversized[1] = 0xff;
  static const uint8_t empty_frame[] = {0, 0, 1, 2, 3};
  static uint8_t garbage[100];
  for (size_t i = 0; i < sizeof(garbage); i++)
    garbage[i] = (uint8_t)(i * 37 + 11);
  garbage[0] = 0;
  garbage[1] = 40; /* a first message of 40 bytes: 32-byte key + 8 bytes payload */
  const struct {
    const char *what;
    const uint8_t *bytes;
    size_t len;
  } cases[] = {
      {"oversized", oversized, sizeof(oversized)},
      {"empty frame", empty_frame, sizeof(empty_frame)},
      {"garbage", garbage, sizeof(garbage)},
  };
  for (size_t k = 0; k < GN_ARRAY_SIZE(cases); k++) {
    raw r;
    raw_send(gn_transport_listen_addr(a.t), cases[k].bytes, cases[k].len, &r);
    if (!run_until(raw_eof, &r))
      fail_msg("case '%s': server did not close", cases[k].what);
    gn_uv_close_free((uv_handle_t *)r.tcp, NULL, NULL);
    uv_run(&loop, UV_RUN_NOWAIT);
  }
  assert_int_equal(a.ups, 0);
  /* The listener still serves real peers afterwards. */
  assert_int_equal(gn_transport_connect(b.t, gn_transport_listen_addr(a.t)), 0);
  node *ns[2] = {&a, &b};
  assert_true(run_until(both_up, ns));
  node_pair_done(&a, &b);
}

static void test_transport_peer_down_when_other_side_closes(void **state) {
  (void)state;
  node a, b;
  node_init(&a);
  node_init(&b);
  connect_pair(&a, &b);
  gn_transport_close(b.t, on_closed, &b);
  assert_true(run_until(one_down, &a));
  assert_false(gn_transport_is_up(a.t, b.id->pk));
  assert_int_equal(b.downs, 0); /* closing our own transport reports nothing */
  gn_transport_close(a.t, on_closed, &a);
  node *ns[2] = {&a, &b};
  assert_true(run_until(both_closed, ns));
  gn_identity_free(a.id);
  gn_identity_free(b.id);
}

/* b runs on a loop of its own that stops turning once the session is up, so
 * it reads nothing: a's queue to it must hit the bound and close. */
static void test_transport_closes_peer_over_send_queue_bound(void **state) {
  (void)state;
  uv_loop_t loop2;
  uv_loop_init(&loop2);
  node a, b;
  node_init(&a);
  memset(&b, 0, sizeof(b));
  assert_int_equal(gn_identity_generate(&b.id), 0);
  gn_transport_cbs cbs = {on_up, on_down, on_msg};
  assert_int_equal(gn_transport_new(&loop2, b.id, &cbs, &b, &b.t), 0);
  assert_int_equal(gn_transport_listen(a.t, "127.0.0.1:0"), 0);
  assert_int_equal(gn_transport_connect(b.t, gn_transport_listen_addr(a.t)), 0);
  uint64_t end = gn_mono_ms() + 5000;
  while ((a.ups < 1 || b.ups < 1) && gn_mono_ms() < end) {
    uv_run(&loop, UV_RUN_NOWAIT);
    uv_run(&loop2, UV_RUN_NOWAIT);
  }
  assert_int_equal(a.ups, 1);
  size_t n = GN_MSG_MAX - 128;
  uint8_t *body = calloc(1, n);
  gn_buf env = {0};
  assert_int_equal(gn_envelope_seal(a.id, GN_MSG_JOB_LOG, body, n, &env), 0);
  int r = 0, sent = 0;
  for (int i = 0; i < 16 && r == 0; i++) {
    r = gn_transport_send(a.t, b.id->pk, env.data, env.len);
    if (r == 0)
      sent++;
    uv_run(&loop, UV_RUN_NOWAIT);
  }
  assert_int_equal(r, GN_ETOOBIG);
  assert_true(sent >= 7); /* 64 MiB of 8 MiB messages, some already in the kernel */
  assert_false(gn_transport_is_up(a.t, b.id->pk));
  assert_int_equal(a.downs, 1);
  free(body);
  gn_buf_done(&env);
  gn_transport_close(a.t, on_closed, &a);
  gn_transport_close(b.t, on_closed, &b);
  end = gn_mono_ms() + 5000;
  while ((!a.closed || !b.closed) && gn_mono_ms() < end) {
    uv_run(&loop, UV_RUN_NOWAIT);
    uv_run(&loop2, UV_RUN_NOWAIT);
  }
  assert_true(a.closed && b.closed);
  uv_run(&loop2, UV_RUN_DEFAULT);
  assert_int_equal(uv_loop_close(&loop2), 0);
  gn_identity_free(a.id);
  gn_identity_free(b.id);
  gn_buf_done(&a.last_body);
  gn_buf_done(&b.last_body);
}

static void test_transport_handshake_times_out(void **state) {
  (void)state;
  node a, b;
  node_init(&a);
  node_init(&b);
  assert_int_equal(gn_transport_listen(a.t, "127.0.0.1:0"), 0);
  /* a client that connects and then says nothing */
  raw r;
  raw_send(gn_transport_listen_addr(a.t), (const uint8_t *)"", 0, &r);
  uint64_t start = gn_mono_ms(), end = start + 15000;
  while (!r.eof && gn_mono_ms() < end)
    uv_run(&loop, UV_RUN_ONCE);
  uint64_t took = gn_mono_ms() - start;
  assert_true(r.eof);
  assert_true(took >= 9000 && took <= 12500);
  gn_uv_close_free((uv_handle_t *)r.tcp, NULL, NULL);
  node_pair_done(&a, &b);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_transport_connects_and_exchanges_envelopes, setup, teardown),
      cmocka_unit_test_setup_teardown(test_transport_send_to_unknown_peer_not_found, setup, teardown),
      cmocka_unit_test_setup_teardown(test_transport_second_connect_is_harmless, setup, teardown),
      cmocka_unit_test_setup_teardown(test_transport_rejects_bad_addresses, setup, teardown),
      cmocka_unit_test_setup_teardown(test_transport_closes_garbage_and_oversized_clients, setup, teardown),
      cmocka_unit_test_setup_teardown(test_transport_peer_down_when_other_side_closes, setup, teardown),
      cmocka_unit_test_setup_teardown(test_transport_closes_peer_over_send_queue_bound, setup, teardown),
      cmocka_unit_test_setup_teardown(test_transport_handshake_times_out, setup, teardown),
      cmocka_unit_test_setup_teardown(test_transport_dial_refuses_another_key, setup, teardown),
      cmocka_unit_test_setup_teardown(test_transport_bad_signature_closes_session, setup, teardown),
      cmocka_unit_test_setup_teardown(test_transport_unknown_version_answers_error_then_closes, setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
