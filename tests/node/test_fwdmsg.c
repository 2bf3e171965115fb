/* Forwarded ports: the FWD_* bodies (round trips and every bound), the
 * per-stream window (a peer that sends past it, credits past it, or never
 * reads), and the provider's admission of FWD_OPEN (another identity, an
 * ended lease, another lease's job, a stopped job, the caps), on an
 * in-memory node: no I/O. */
#include "fwd.h"
#include "node_internal.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

static gn_fwdopen sample_open(void) {
  gn_fwdopen m;
  memset(&m, 0, sizeof m);
  m.stream = 7;
  strcpy(m.lease_id, "l-0123456789abcdef");
  strcpy(m.job_id, "j-0123456789ab");
  m.port = 8888;
  memset(m.nonce, 0x5a, sizeof m.nonce);
  m.issued_s = gn_unix_s();
  return m;
}

static void encode_open(const gn_fwdopen *m, gn_buf *out) {
  gn_wire_writer w;
  gn_wire_writer_init(&w);
  assert_int_equal(gn__fwdopen_encode(m, &w), 0);
  assert_int_equal(gn_wire_writer_take(&w, out), 0);
  gn_wire_writer_done(&w);
}

static void test_fwdopen_round_trip(void **state) {
  (void)state;
  gn_fwdopen m = sample_open(), got;
  gn_buf b = {0};
  encode_open(&m, &b);
  assert_int_equal(gn__fwdopen_decode(b.data, b.len, &got), 0);
  assert_memory_equal(&m, &got, sizeof m);
  /* Without a job: "" after the round trip. */
  m.job_id[0] = 0;
  gn_buf_done(&b);
  encode_open(&m, &b);
  assert_int_equal(gn__fwdopen_decode(b.data, b.len, &got), 0);
  assert_string_equal(got.job_id, "");
  gn_buf_done(&b);
}

/* A hand-written FWD_OPEN with one field changed. */
static void encode_open_raw(gn_buf *out, uint64_t v, uint64_t stream, const char *lease, const char *job, uint64_t port,
                            size_t nonce_len) {
  gn_wire_writer w;
  uint8_t nonce[32] = {0};
  gn_wire_writer_init(&w);
  gn_wire_put_map(&w, job ? 7 : 6);
  gn_wire_put_str(&w, "v");
  gn_wire_put_u64(&w, v);
  gn_wire_put_str(&w, "s");
  gn_wire_put_u64(&w, stream);
  gn_wire_put_str(&w, "lease_id");
  gn_wire_put_str(&w, lease);
  if (job) {
    gn_wire_put_str(&w, "job_id");
    gn_wire_put_str(&w, job);
  }
  gn_wire_put_str(&w, "port");
  gn_wire_put_u64(&w, port);
  gn_wire_put_str(&w, "nonce");
  gn_wire_put_bin(&w, nonce, nonce_len);
  gn_wire_put_str(&w, "issued_s");
  gn_wire_put_i64(&w, 1);
  assert_int_equal(gn_wire_writer_take(&w, out), 0);
  gn_wire_writer_done(&w);
}

static void test_fwdopen_rejects_out_of_bounds(void **state) {
  (void)state;
  static const struct {
    const char *name;
    uint64_t v, stream;
    const char *lease, *job;
    uint64_t port;
    size_t nonce_len;
    bool ok;
  } cases[] = {
      {"valid", 1, 1, "l-0123456789abcdef", "j-0123456789ab", 65535, 16, true},
      {"port 0", 1, 1, "l-0123456789abcdef", NULL, 0, 16, false},
      {"port 65536", 1, 1, "l-0123456789abcdef", NULL, 65536, 16, false},
      {"port 2^32+80", 1, 1, "l-0123456789abcdef", NULL, (1ull << 32) + 80, 16, false},
      {"stream 0", 1, 0, "l-0123456789abcdef", NULL, 80, 16, false},
      {"stream over 32 bits", 1, 1ull << 32, "l-0123456789abcdef", NULL, 80, 16, false},
      {"version 2", 2, 1, "l-0123456789abcdef", NULL, 80, 16, false},
      {"lease traversal", 1, 1, "../x", NULL, 80, 16, false},
      {"job with slash", 1, 1, "l-0123456789abcdef", "j/x", 80, 16, false},
      {"short nonce", 1, 1, "l-0123456789abcdef", NULL, 80, 15, false},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    gn_buf b = {0};
    gn_fwdopen got;
    memset(&got, 0xee, sizeof got);
    encode_open_raw(&b, cases[i].v, cases[i].stream, cases[i].lease, cases[i].job, cases[i].port, cases[i].nonce_len);
    int r = gn__fwdopen_decode(b.data, b.len, &got);
    if (cases[i].ok != (r == 0))
      fail_msg("case %s: decode gave %d", cases[i].name, r);
    if (!cases[i].ok)
      assert_int_equal(got.stream, 0xeeeeeeee); /* nothing written */
    gn_buf_done(&b);
  }
}

static void test_fwd_data_bounds(void **state) {
  (void)state;
  static uint8_t data[GN_FWD_CHUNK + 1];
  gn_wire_writer w;
  gn_buf b = {0};
  gn_fwdmsg m;
  gn_wire_writer_init(&w);
  gn__fwd_data_encode(&w, 3, true, data, GN_FWD_CHUNK);
  assert_int_equal(gn_wire_writer_take(&w, &b), 0);
  assert_int_equal(gn__fwdmsg_decode(GN_MSG_FWD_DATA, b.data, b.len, &m), 0);
  assert_int_equal(m.stream, 3);
  assert_true(m.opener);
  assert_int_equal(m.data_len, GN_FWD_CHUNK);
  gn__fwdmsg_done(&m);
  gn_buf_done(&b);
  gn__fwd_data_encode(&w, 3, true, data, GN_FWD_CHUNK + 1);
  assert_int_equal(gn_wire_writer_take(&w, &b), 0);
  assert_int_not_equal(gn__fwdmsg_decode(GN_MSG_FWD_DATA, b.data, b.len, &m), 0);
  gn_buf_done(&b);
  gn__fwd_data_encode(&w, 3, true, data, 0);
  assert_int_equal(gn_wire_writer_take(&w, &b), 0);
  assert_int_not_equal(gn__fwdmsg_decode(GN_MSG_FWD_DATA, b.data, b.len, &m), 0);
  gn_buf_done(&b);
  /* The same body is no CREDIT or CLOSE. */
  gn__fwd_data_encode(&w, 3, true, data, 10);
  assert_int_equal(gn_wire_writer_take(&w, &b), 0);
  assert_int_not_equal(gn__fwdmsg_decode(GN_MSG_FWD_CREDIT, b.data, b.len, &m), 0);
  assert_int_not_equal(gn__fwdmsg_decode(GN_MSG_FWD_CLOSE, b.data, b.len, &m), 0);
  assert_int_not_equal(gn__fwdmsg_decode(GN_MSG_FWD_OPEN, b.data, b.len, &m), 0);
  gn_buf_done(&b);
  gn_wire_writer_done(&w);
}

/* A full chunk sealed in its envelope costs one token of the bulk class
 * (one per started 64 KiB): the pace in fwd.h counts messages. */
static void test_fwd_full_chunk_envelope_under_64k(void **state) {
  (void)state;
  static uint8_t data[GN_FWD_CHUNK];
  gn_identity *id = NULL;
  assert_int_equal(gn_identity_generate(&id), 0);
  gn_wire_writer w;
  gn_buf b = {0}, env = {0};
  gn_wire_writer_init(&w);
  gn__fwd_data_encode(&w, UINT32_MAX, false, data, sizeof data);
  assert_int_equal(gn_wire_writer_take(&w, &b), 0);
  assert_int_equal(gn_envelope_seal(id, GN_MSG_FWD_DATA, b.data, b.len, &env), 0);
  assert_true(env.len <= 65536);
  gn_buf_done(&b);
  gn_buf_done(&env);
  gn_wire_writer_done(&w);
  gn_identity_free(id);
}

static void test_fwd_credit_bounds(void **state) {
  (void)state;
  static const struct {
    uint32_t n;
    bool ok;
  } cases[] = {{1, true}, {GN_FWD_WINDOW, true}, {0, false}, {GN_FWD_WINDOW + 1, false}};
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    gn_wire_writer w;
    gn_buf b = {0};
    gn_fwdmsg m;
    gn_wire_writer_init(&w);
    gn__fwd_credit_encode(&w, 1, false, cases[i].n);
    assert_int_equal(gn_wire_writer_take(&w, &b), 0);
    int r = gn__fwdmsg_decode(GN_MSG_FWD_CREDIT, b.data, b.len, &m);
    assert_int_equal(r == 0, cases[i].ok);
    if (r == 0) {
      assert_int_equal(m.credit, cases[i].n);
      assert_false(m.opener);
      gn__fwdmsg_done(&m);
    }
    gn_buf_done(&b);
    gn_wire_writer_done(&w);
  }
}

static void test_fwd_close_fin_rst_and_reason(void **state) {
  (void)state;
  gn_wire_writer w;
  gn_buf b = {0};
  gn_fwdmsg m;
  char lng[400];
  memset(lng, 'x', sizeof lng - 1);
  lng[sizeof lng - 1] = 0;
  gn_wire_writer_init(&w);
  gn__fwd_close_encode(&w, 9, false, true, "nothing listens on port 8 in the sandbox");
  assert_int_equal(gn_wire_writer_take(&w, &b), 0);
  assert_int_equal(gn__fwdmsg_decode(GN_MSG_FWD_CLOSE, b.data, b.len, &m), 0);
  assert_true(m.reset);
  assert_string_equal(m.reason, "nothing listens on port 8 in the sandbox");
  gn__fwdmsg_done(&m);
  gn_buf_done(&b);
  gn__fwd_close_encode(&w, 9, true, false, NULL);
  assert_int_equal(gn_wire_writer_take(&w, &b), 0);
  assert_int_equal(gn__fwdmsg_decode(GN_MSG_FWD_CLOSE, b.data, b.len, &m), 0);
  assert_false(m.reset);
  gn__fwdmsg_done(&m);
  gn_buf_done(&b);
  /* The encoder cuts a long reason to what the decoder takes. */
  gn__fwd_close_encode(&w, 9, true, true, lng);
  assert_int_equal(gn_wire_writer_take(&w, &b), 0);
  assert_int_equal(gn__fwdmsg_decode(GN_MSG_FWD_CLOSE, b.data, b.len, &m), 0);
  assert_int_equal(strlen(m.reason), GN_FWD_REASON_LEN);
  gn__fwdmsg_done(&m);
  gn_buf_done(&b);
  /* "how" other than fin or rst, and a reason over the limit, are refused. */
  gn_wire_put_map(&w, 4);
  gn_wire_put_str(&w, "s");
  gn_wire_put_u64(&w, 9);
  gn_wire_put_str(&w, "o");
  gn_wire_put_bool(&w, true);
  gn_wire_put_str(&w, "how");
  gn_wire_put_str(&w, "half");
  gn_wire_put_str(&w, "reason");
  gn_wire_put_str(&w, "");
  assert_int_equal(gn_wire_writer_take(&w, &b), 0);
  assert_int_not_equal(gn__fwdmsg_decode(GN_MSG_FWD_CLOSE, b.data, b.len, &m), 0);
  gn_buf_done(&b);
  gn_wire_put_map(&w, 4);
  gn_wire_put_str(&w, "s");
  gn_wire_put_u64(&w, 9);
  gn_wire_put_str(&w, "o");
  gn_wire_put_bool(&w, true);
  gn_wire_put_str(&w, "how");
  gn_wire_put_str(&w, "rst");
  gn_wire_put_str(&w, "reason");
  gn_wire_put_str(&w, lng);
  assert_int_equal(gn_wire_writer_take(&w, &b), 0);
  assert_int_not_equal(gn__fwdmsg_decode(GN_MSG_FWD_CLOSE, b.data, b.len, &m), 0);
  gn_buf_done(&b);
  gn_wire_writer_done(&w);
}

static void test_win_sender_stops_at_window(void **state) {
  (void)state;
  gn_fwd_win w;
  gn__fwd_win_init(&w);
  size_t sent = 0;
  while (gn__fwd_win_sent(&w, 1000) == 0)
    sent += 1000;
  assert_true(sent <= GN_FWD_WINDOW);
  assert_true(sent > GN_FWD_WINDOW - 1000);
  assert_int_equal(gn__fwd_win_credit(&w, 5000), 0);
  assert_int_equal(gn__fwd_win_sent(&w, 5000), 0);
}

static void test_win_refuses_data_past_window(void **state) {
  (void)state;
  gn_fwd_win w;
  gn__fwd_win_init(&w);
  assert_int_equal(gn__fwd_win_recv(&w, GN_FWD_WINDOW), 0);
  assert_int_equal(gn__fwd_win_recv(&w, 1), GN_EPROTO);
  assert_int_equal(w.recv_left, 0); /* the refused byte counted nothing */
}

static void test_win_refuses_credit_past_window(void **state) {
  (void)state;
  gn_fwd_win w;
  gn__fwd_win_init(&w);
  assert_int_equal(gn__fwd_win_credit(&w, 1), GN_EPROTO);
  assert_int_equal(gn__fwd_win_sent(&w, 100), 0);
  assert_int_equal(gn__fwd_win_credit(&w, 101), GN_EPROTO);
  assert_int_equal(gn__fwd_win_credit(&w, 100), 0);
  assert_int_equal(w.send_left, GN_FWD_WINDOW);
}

static void test_win_credits_after_a_quarter(void **state) {
  (void)state;
  gn_fwd_win w;
  gn__fwd_win_init(&w);
  assert_int_equal(gn__fwd_win_recv(&w, GN_FWD_WINDOW), 0);
  assert_int_equal(gn__fwd_win_delivered(&w, GN_FWD_WINDOW / 4 - 1), 0);
  assert_int_equal(gn__fwd_win_delivered(&w, 1), GN_FWD_WINDOW / 4);
  assert_int_equal(w.recv_left, GN_FWD_WINDOW / 4);
}

/* The attack "a renter that never reads while the sandbox streams 100 MB":
 * two windows in a simulated pipe. The provider reads from the sandbox only
 * while its window allows; the renter's end receives but never delivers, so
 * it never credits. What the renter end holds stays within one window
 * however much the sandbox offers, and with a reader it all arrives. */
static uint64_t pipe_run(bool reader_reads, uint64_t offered, uint64_t *ret_held_max) {
  gn_fwd_win prov, rent;
  gn__fwd_win_init(&prov);
  gn__fwd_win_init(&rent);
  uint64_t moved = 0, held = 0, held_max = 0;
  for (int round = 0; round < 100000 && moved < offered; round++) {
    size_t n = prov.send_left < GN_FWD_CHUNK ? (size_t)prov.send_left : GN_FWD_CHUNK;
    if (n == 0 && !reader_reads)
      break; /* the provider stops reading the sandbox */
    if (n > 0) {
      assert_int_equal(gn__fwd_win_sent(&prov, n), 0);
      assert_int_equal(gn__fwd_win_recv(&rent, n), 0);
      held += n;
      moved += n;
    }
    held_max = held > held_max ? held : held_max;
    if (reader_reads) {
      uint32_t c = gn__fwd_win_delivered(&rent, held);
      held = 0;
      if (c)
        assert_int_equal(gn__fwd_win_credit(&prov, c), 0);
    }
  }
  *ret_held_max = held_max;
  return moved;
}

static void test_win_bounds_memory_when_the_renter_never_reads(void **state) {
  (void)state;
  uint64_t held_max;
  uint64_t moved = pipe_run(false, 100u << 20, &held_max);
  assert_true(held_max <= GN_FWD_WINDOW);
  assert_int_equal(moved, GN_FWD_WINDOW);
  moved = pipe_run(true, 100u << 20, &held_max);
  assert_true(moved >= 100u << 20);
  assert_true(held_max <= GN_FWD_WINDOW);
}

/* --- admission ------------------------------------------------------------*/

typedef struct world {
  gn_node n;
  gn__fwd f;
  gn_lease lease, other_lease;
  gn_job job, other_job;
  uint8_t holder[GN_PK_LEN], stranger[GN_PK_LEN];
  gn__fwd_stream streams[GN_FWD_STREAMS_PER_LEASE];
} world;

static int world_setup(void **state) {
  world *w = calloc(1, sizeof *w);
  memset(w->holder, 0x11, GN_PK_LEN);
  memset(w->stranger, 0x22, GN_PK_LEN);
  strcpy(w->lease.id, "l-0123456789abcdef");
  w->lease.role = GN_ROLE_PROVIDER;
  w->lease.state = GN_LEASE_ACTIVE;
  memcpy(w->lease.peer, w->holder, GN_PK_LEN);
  strcpy(w->other_lease.id, "l-fedcba9876543210");
  w->other_lease.role = GN_ROLE_PROVIDER;
  w->other_lease.state = GN_LEASE_ACTIVE;
  memcpy(w->other_lease.peer, w->stranger, GN_PK_LEN);
  w->lease.next = &w->other_lease;
  strcpy(w->job.id, "j-0123456789ab");
  strcpy(w->job.lease_id, w->lease.id);
  w->job.role = GN_ROLE_PROVIDER;
  w->job.state = GN_JOB_RUNNING;
  strcpy(w->other_job.id, "j-ba9876543210");
  strcpy(w->other_job.lease_id, w->other_lease.id);
  w->other_job.role = GN_ROLE_PROVIDER;
  w->other_job.state = GN_JOB_RUNNING;
  w->job.next = &w->other_job;
  w->n.leases = &w->lease;
  w->n.jobs = &w->job;
  w->f.n = &w->n;
  w->n.fwd = &w->f;
  *state = w;
  return 0;
}

static int world_teardown(void **state) {
  free(*state);
  return 0;
}

static int admit(world *w, const uint8_t *peer, const gn_fwdopen *m, char *why) {
  gn_job *j = NULL;
  int r = gn__fwd_admit(&w->n, peer, m, &j, why, 200);
  if (r == 0)
    assert_ptr_equal(j, gn__job_find(&w->n, m->job_id[0] ? m->job_id : "j-0123456789ab"));
  else
    assert_null(j);
  return r;
}

static void test_admit_holder_of_running_job(void **state) {
  world *w = *state;
  char why[200];
  gn_fwdopen m = sample_open();
  assert_int_equal(admit(w, w->holder, &m, why), 0);
  m.job_id[0] = 0; /* the lease's one running job */
  assert_int_equal(admit(w, w->holder, &m, why), 0);
}

static void test_admit_refuses_another_identity(void **state) {
  world *w = *state;
  char why[200];
  gn_fwdopen m = sample_open();
  assert_int_equal(admit(w, w->stranger, &m, why), GN_EPERM);
  assert_non_null(strstr(why, "held by another node"));
}

static void test_admit_refuses_ended_lease(void **state) {
  world *w = *state;
  char why[200];
  gn_fwdopen m = sample_open();
  w->lease.state = GN_LEASE_ENDED;
  assert_int_equal(admit(w, w->holder, &m, why), GN_EPERM);
  assert_non_null(strstr(why, "has ended"));
}

static void test_admit_refuses_requester_side_lease(void **state) {
  world *w = *state;
  char why[200];
  gn_fwdopen m = sample_open();
  w->lease.role = GN_ROLE_REQUESTER;
  assert_int_equal(admit(w, w->holder, &m, why), GN_ENOTFOUND);
}

static void test_admit_refuses_job_of_another_lease(void **state) {
  world *w = *state;
  char why[200];
  gn_fwdopen m = sample_open();
  strcpy(m.job_id, w->other_job.id); /* the stranger's job, named on our lease */
  assert_int_equal(admit(w, w->holder, &m, why), GN_ENOTFOUND);
}

static void test_admit_refuses_stopped_job(void **state) {
  world *w = *state;
  char why[200];
  gn_fwdopen m = sample_open();
  w->job.state = GN_JOB_EXITED;
  assert_int_equal(admit(w, w->holder, &m, why), GN_EPERM);
  m.job_id[0] = 0;
  assert_int_equal(admit(w, w->holder, &m, why), GN_ENOTFOUND);
}

static void test_admit_refuses_stale_open(void **state) {
  world *w = *state;
  char why[200];
  gn_fwdopen m = sample_open();
  m.issued_s -= 3600;
  assert_int_equal(admit(w, w->holder, &m, why), GN_EPERM);
}

static void test_admit_caps_streams_per_lease_and_in_all(void **state) {
  world *w = *state;
  char why[200];
  gn_fwdopen m = sample_open();
  for (int i = 0; i < GN_FWD_STREAMS_PER_LEASE - 1; i++) {
    strcpy(w->streams[i].lease_id, w->lease.id);
    w->streams[i].next = w->f.streams;
    w->f.streams = &w->streams[i];
    w->f.nstreams++;
  }
  assert_int_equal(admit(w, w->holder, &m, why), 0); /* the 16th */
  strcpy(w->streams[GN_FWD_STREAMS_PER_LEASE - 1].lease_id, w->lease.id);
  w->streams[GN_FWD_STREAMS_PER_LEASE - 1].next = w->f.streams;
  w->f.streams = &w->streams[GN_FWD_STREAMS_PER_LEASE - 1];
  w->f.nstreams++;
  assert_int_equal(admit(w, w->holder, &m, why), GN_EBUSY); /* the 17th */
  /* Another lease still gets streams, until the node's cap. */
  gn_fwdopen o = sample_open();
  strcpy(o.lease_id, w->other_lease.id);
  strcpy(o.job_id, w->other_job.id);
  gn_job *j = NULL;
  assert_int_equal(gn__fwd_admit(&w->n, w->stranger, &o, &j, why, sizeof why), 0);
  w->f.nstreams = GN_FWD_STREAMS_MAX;
  assert_int_equal(gn__fwd_admit(&w->n, w->stranger, &o, &j, why, sizeof why), GN_EBUSY);
}

/* --- the provider's end on a real loop (no session: sends fail quietly) ---*/

typedef struct live {
  world w;
  uv_loop_t loop;
} live;

static int live_setup(void **state) {
  world_setup(state);
  live *l = calloc(1, sizeof *l);
  l->w = *(world *)*state;
  free(*state);
  l->w.lease.next = &l->w.other_lease;
  l->w.job.next = &l->w.other_job;
  l->w.n.leases = &l->w.lease;
  l->w.n.jobs = &l->w.job;
  assert_int_equal(uv_loop_init(&l->loop), 0);
  l->w.n.loop = &l->loop;
  strcpy(l->w.n.run_dir, "/nonexistent");
  assert_int_equal(gn__fwd_start(&l->w.n), 0);
  *state = l;
  return 0;
}

static int live_teardown(void **state) {
  live *l = *state;
  gn__fwd_close(&l->w.n);
  uv_run(&l->loop, UV_RUN_DEFAULT);
  gn__fwd_free(&l->w.n);
  assert_int_equal(uv_loop_close(&l->loop), 0);
  free(l);
  return 0;
}

static void deliver_open(live *l, const uint8_t *peer, const gn_fwdopen *m) {
  gn_buf b = {0};
  encode_open(m, &b);
  gn_envelope env;
  memset(&env, 0, sizeof env);
  env.type = GN_MSG_FWD_OPEN;
  memcpy(env.signer, peer, GN_PK_LEN);
  env.body = b.data;
  env.body_len = b.len;
  gn__fwd_on_message(&l->w.n, peer, &env);
  gn_buf_done(&b);
}

static void test_open_from_another_identity_connects_nothing(void **state) {
  live *l = *state;
  gn_fwdopen m = sample_open();
  deliver_open(l, l->w.stranger, &m);
  assert_int_equal(l->w.n.fwd->refused, 1);
  assert_int_equal(l->w.n.fwd->opened, 0);
  assert_int_equal(l->w.n.fwd->nstreams, 0);
}

static void test_open_without_a_container_connects_nothing(void **state) {
  live *l = *state;
  gn_fwdopen m = sample_open(); /* admitted, but run_dir holds no runtime state */
  deliver_open(l, l->w.holder, &m);
  assert_int_equal(l->w.n.fwd->refused, 1);
  assert_int_equal(l->w.n.fwd->nstreams, 0);
}

static void test_stream_id_reuse_ends_the_open_stream(void **state) {
  live *l = *state;
  gn__fwd *f = l->w.n.fwd;
  gn__fwd_stream *s = gn__fwd_stream_new(f, l->w.holder, 7, false);
  assert_non_null(s);
  strcpy(s->lease_id, l->w.lease.id);
  gn_fwdopen m = sample_open(); /* stream 7 again */
  deliver_open(l, l->w.holder, &m);
  assert_int_equal(f->nstreams, 0);
  assert_null(gn__fwd_stream_find(f, l->w.holder, 7, false));
  assert_int_equal(f->opened, 0);
  uv_run(&l->loop, UV_RUN_NOWAIT);
}

static void test_data_for_an_unknown_stream_is_dropped(void **state) {
  live *l = *state;
  gn__fwd *f = l->w.n.fwd;
  gn__fwd_stream *s = gn__fwd_stream_new(f, l->w.holder, 7, false);
  assert_non_null(s);
  strcpy(s->lease_id, l->w.lease.id);
  uint8_t data[100] = {0};
  gn_wire_writer w;
  gn_buf b = {0};
  gn_wire_writer_init(&w);
  /* Stream 8 is unknown; stream 7 from the stranger is not the holder's. */
  const struct {
    uint32_t id;
    const uint8_t *peer;
  } to[] = {{8, l->w.holder}, {7, l->w.stranger}};
  for (size_t i = 0; i < 2; i++) {
    gn__fwd_data_encode(&w, to[i].id, true, data, sizeof data);
    assert_int_equal(gn_wire_writer_take(&w, &b), 0);
    gn_envelope env;
    memset(&env, 0, sizeof env);
    env.type = GN_MSG_FWD_DATA;
    env.body = b.data;
    env.body_len = b.len;
    gn__fwd_on_message(&l->w.n, to[i].peer, &env);
    gn_buf_done(&b);
  }
  gn_wire_writer_done(&w);
  assert_int_equal(s->win.recv_left, GN_FWD_WINDOW); /* nothing reached stream 7 */
  assert_int_equal(s->writes, 0);
  assert_int_equal(f->nstreams, 1);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_fwdopen_round_trip),
      cmocka_unit_test(test_fwdopen_rejects_out_of_bounds),
      cmocka_unit_test(test_fwd_data_bounds),
      cmocka_unit_test(test_fwd_full_chunk_envelope_under_64k),
      cmocka_unit_test(test_fwd_credit_bounds),
      cmocka_unit_test(test_fwd_close_fin_rst_and_reason),
      cmocka_unit_test(test_win_sender_stops_at_window),
      cmocka_unit_test(test_win_refuses_data_past_window),
      cmocka_unit_test(test_win_refuses_credit_past_window),
      cmocka_unit_test(test_win_credits_after_a_quarter),
      cmocka_unit_test(test_win_bounds_memory_when_the_renter_never_reads),
      cmocka_unit_test_setup_teardown(test_admit_holder_of_running_job, world_setup, world_teardown),
      cmocka_unit_test_setup_teardown(test_admit_refuses_another_identity, world_setup, world_teardown),
      cmocka_unit_test_setup_teardown(test_admit_refuses_ended_lease, world_setup, world_teardown),
      cmocka_unit_test_setup_teardown(test_admit_refuses_requester_side_lease, world_setup, world_teardown),
      cmocka_unit_test_setup_teardown(test_admit_refuses_job_of_another_lease, world_setup, world_teardown),
      cmocka_unit_test_setup_teardown(test_admit_refuses_stopped_job, world_setup, world_teardown),
      cmocka_unit_test_setup_teardown(test_admit_refuses_stale_open, world_setup, world_teardown),
      cmocka_unit_test_setup_teardown(test_admit_caps_streams_per_lease_and_in_all, world_setup, world_teardown),
      cmocka_unit_test_setup_teardown(test_open_from_another_identity_connects_nothing, live_setup, live_teardown),
      cmocka_unit_test_setup_teardown(test_open_without_a_container_connects_nothing, live_setup, live_teardown),
      cmocka_unit_test_setup_teardown(test_stream_id_reuse_ends_the_open_stream, live_setup, live_teardown),
      cmocka_unit_test_setup_teardown(test_data_for_an_unknown_stream_is_dropped, live_setup, live_teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
