/* The workspace messages (node/wsmsg.c): round trips of every type, the
 * path grammar (traversal, absolute, control bytes, depth, length), hostile
 * bodies; and a real provider answering them (node/ws_prov.c): only to the
 * lease's holder (another identity's requests on the lease get nothing and
 * change nothing), never after the lease ended (the workspace is then
 * removed), and a write far past the end of a file refused. */
#include <gpunet/billing.h>
#include <gpunet/identity.h>
#include <gpunet/node.h>
#include <gpunet/transport.h>
#include <gpunet/wire.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "helpers.h"
#include "wsmsg.h"

#include <sys/stat.h>

/* --- the codec ------------------------------------------------------------------*/

static void test_ws_path_norm_cleans_and_refuses(void **state) {
  (void)state;
  static const struct {
    const char *in, *out; /* out NULL: refused */
  } cases[] = {
      {"a", "a"},
      {"a/b/c.txt", "a/b/c.txt"},
      {"./a//b/./c/", "a/b/c"},
      {"results/model.pt", "results/model.pt"},
      {"..x/y..", "..x/y.."},
      {"../x", NULL},
      {"a/../../b", NULL},
      {"a/..", NULL},
      {"/etc/passwd", NULL},
      {"", NULL},
      {".", NULL},
      {"./", NULL},
      {"a\nb", NULL},
      {"a\x7f", NULL},
      {"tab\there", NULL},
  };
  char out[GN_WS_PATH_MAX];
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    int r = gn__ws_path_norm(cases[i].in, out, sizeof out);
    if (cases[i].out) {
      assert_int_equal(r, 0);
      assert_string_equal(out, cases[i].out);
    } else {
      assert_int_equal(r, GN_EINVAL);
      assert_string_equal(out, "");
    }
  }
}

static void test_ws_path_norm_bounds_depth_and_length(void **state) {
  (void)state;
  char in[4096], out[GN_WS_PATH_MAX];
  size_t k = 0;
  for (int i = 0; i < GN_WS_DEPTH_MAX; i++)
    k += (size_t)snprintf(in + k, sizeof in - k, "d/");
  in[k - 1] = 0;
  assert_int_equal(gn__ws_path_norm(in, out, sizeof out), 0);
  snprintf(in + k - 1, sizeof in - k + 1, "/x");
  assert_int_equal(gn__ws_path_norm(in, out, sizeof out), GN_EINVAL); /* one level too deep */
  memset(in, 'n', GN_WS_NAME_MAX + 1);
  in[GN_WS_NAME_MAX + 1] = 0;
  assert_int_equal(gn__ws_path_norm(in, out, sizeof out), GN_EINVAL); /* a component too long */
  in[GN_WS_NAME_MAX] = 0;
  assert_int_equal(gn__ws_path_norm(in, out, sizeof out), 0);
  assert_int_equal(gn__ws_path_norm("abc", out, 3), GN_EINVAL); /* does not fit */
}

static void encode(uint32_t type, const gn_wsmsg *m, gn_buf *ret) {
  gn_wire_writer w;
  gn_wire_writer_init(&w);
  assert_int_equal(gn__wsmsg_encode(type, m, &w), 0);
  assert_int_equal(gn_wire_writer_take(&w, ret), 0);
  gn_wire_writer_done(&w);
}

static void test_wsmsg_round_trips(void **state) {
  (void)state;
  static uint8_t data[GN_WS_CHUNK];
  for (size_t i = 0; i < sizeof data; i++)
    data[i] = (uint8_t)i;
  for (uint32_t type = GN_MSG_WS_PUT; type <= GN_MSG_WS_STAT_REPLY; type++) {
    gn_wsmsg m, d;
    memset(&m, 0, sizeof m);
    snprintf(m.lease_id, sizeof m.lease_id, "l-0011223344556677");
    snprintf(m.path, sizeof m.path, "dir/file.bin");
    m.seq = 77;
    m.offset = type == GN_MSG_WS_STAT || type == GN_MSG_WS_STAT_REPLY ? 0 : 65536;
    m.size = type == GN_MSG_WS_DATA ? 65536 + sizeof data : 5;
    if (type == GN_MSG_WS_PUT || type == GN_MSG_WS_DATA) {
      m.data = data;
      m.data_len = sizeof data;
    }
    m.eof = type == GN_MSG_WS_DATA;
    m.hash = type == GN_MSG_WS_STAT;
    m.exists = type == GN_MSG_WS_STAT_REPLY;
    m.has_sha256 = type == GN_MSG_WS_STAT_REPLY;
    memset(m.sha256, 0xab, sizeof m.sha256);
    gn_buf b = {0};
    encode(type, &m, &b);
    assert_int_equal(gn__wsmsg_decode(type, b.data, b.len, &d), 0);
    assert_string_equal(d.lease_id, m.lease_id);
    assert_int_equal(d.seq, 77);
    assert_int_equal(d.offset, m.offset);
    if (type == GN_MSG_WS_PUT || type == GN_MSG_WS_GET || type == GN_MSG_WS_STAT)
      assert_string_equal(d.path, "dir/file.bin");
    if (type == GN_MSG_WS_PUT || type == GN_MSG_WS_DATA) {
      assert_int_equal(d.data_len, sizeof data);
      assert_memory_equal(d.data, data, sizeof data);
    }
    if (type == GN_MSG_WS_PUT_ACK || type == GN_MSG_WS_DATA || type == GN_MSG_WS_STAT_REPLY)
      assert_int_equal(d.size, m.size);
    assert_int_equal(d.eof, m.eof);
    assert_int_equal(d.hash, m.hash);
    assert_int_equal(d.exists, m.exists);
    assert_int_equal(d.has_sha256, m.has_sha256);
    if (d.has_sha256)
      assert_memory_equal(d.sha256, m.sha256, 32);
    gn__wsmsg_done(&d);
    gn_buf_done(&b);
  }
}

/* A body of type with the given path, offset and data length, written by
 * hand (the encoder refuses what these tests need). */
static void raw_put(gn_buf *ret, const char *lease, const char *path, uint64_t offset, size_t data_len) {
  static uint8_t data[GN_WS_CHUNK + 1];
  gn_wire_writer w;
  gn_wire_writer_init(&w);
  gn_wire_put_map(&w, 5);
  gn_wire_put_str(&w, "lease_id");
  gn_wire_put_str(&w, lease);
  gn_wire_put_str(&w, "seq");
  gn_wire_put_u64(&w, 1);
  gn_wire_put_str(&w, "path");
  gn_wire_put_str(&w, path);
  gn_wire_put_str(&w, "offset");
  gn_wire_put_u64(&w, offset);
  gn_wire_put_str(&w, "data");
  gn_wire_put_bin(&w, data, data_len);
  assert_int_equal(gn_wire_writer_take(&w, ret), 0);
  gn_wire_writer_done(&w);
}

static void test_wsmsg_decoder_refuses_hostile_bodies(void **state) {
  (void)state;
  gn_wsmsg d;
  gn_buf b = {0};
  static const char *const bad_paths[] = {"../x", "/etc/passwd", "a/../../b", "", "."};
  for (size_t i = 0; i < sizeof bad_paths / sizeof bad_paths[0]; i++) {
    raw_put(&b, "l-1", bad_paths[i], 0, 1);
    assert_true(gn__wsmsg_decode(GN_MSG_WS_PUT, b.data, b.len, &d) < 0);
    gn_buf_done(&b);
  }
  raw_put(&b, "../l", "x", 0, 1); /* a lease id outside the id grammar */
  assert_true(gn__wsmsg_decode(GN_MSG_WS_PUT, b.data, b.len, &d) < 0);
  gn_buf_done(&b);
  raw_put(&b, "l-1", "x", 0, GN_WS_CHUNK + 1); /* too much data */
  assert_true(gn__wsmsg_decode(GN_MSG_WS_PUT, b.data, b.len, &d) < 0);
  gn_buf_done(&b);
  raw_put(&b, "l-1", "x", GN_WS_OFFSET_MAX + 1, 1); /* an offset past any file */
  assert_true(gn__wsmsg_decode(GN_MSG_WS_PUT, b.data, b.len, &d) < 0);
  gn_buf_done(&b);
  raw_put(&b, "l-1", "x", 0, 1); /* the same, well formed, passes */
  assert_int_equal(gn__wsmsg_decode(GN_MSG_WS_PUT, b.data, b.len, &d), 0);
  gn__wsmsg_done(&d);
  assert_int_equal(gn__wsmsg_decode(GN_MSG_JOB_LOG, b.data, b.len, &d), GN_EPROTO); /* not a workspace type */
  gn_buf_done(&b);
  /* a WS_DATA claiming more bytes than the file it says it reads holds */
  gn_wsmsg m;
  memset(&m, 0, sizeof m);
  snprintf(m.lease_id, sizeof m.lease_id, "l-1");
  m.offset = 10;
  m.size = 12;
  m.data = (const uint8_t *)"abcd";
  m.data_len = 4;
  encode(GN_MSG_WS_DATA, &m, &b);
  assert_true(gn__wsmsg_decode(GN_MSG_WS_DATA, b.data, b.len, &d) < 0);
  gn_buf_done(&b);
  /* the encoder refuses what the decoder would */
  gn_wire_writer w;
  gn_wire_writer_init(&w);
  snprintf(m.path, sizeof m.path, "../escape");
  assert_int_equal(gn__wsmsg_encode(GN_MSG_WS_GET, &m, &w), GN_EINVAL);
  gn_wire_writer_done(&w);
}

/* The workspace budget is a config key and a flag, a size like store_max. */
static void test_config_workspace_max(void **state) {
  (void)state;
  gn_config c;
  char err[256] = "", path[] = "/tmp/gn-wsconf-XXXXXX";
  gn_config_defaults(&c);
  assert_int_equal(c.workspace_max_bytes, 10ull << 30);
  int fd = mkstemp(path);
  assert_true(fd >= 0);
  assert_int_equal(write(fd, "workspace_max = 512M\n", 21), 21);
  close(fd);
  assert_int_equal(gn_config_load_file(&c, path, false, err, sizeof err), 0);
  assert_int_equal(c.workspace_max_bytes, 512ull << 20);
  const char *const argv[] = {"gpunetd", "--workspace-max", "2G", NULL};
  assert_int_equal(gn_config_parse_args(&c, 3, (char *const *)argv, err, sizeof err), 0);
  assert_int_equal(c.workspace_max_bytes, 2ull << 30);
  const char *const bad[] = {"gpunetd", "--workspace-max", "lots", NULL};
  assert_int_equal(gn_config_parse_args(&c, 3, (char *const *)bad, err, sizeof err), GN_EINVAL);
  assert_non_null(strstr(err, "workspace_max"));
  assert_int_equal(c.workspace_max_bytes, 2ull << 30);
  /* workspace_fs: auto (a file system per lease) unless dir is asked */
  assert_false(c.workspace_fs_dir);
  const char *const dir[] = {"gpunetd", "--workspace-fs", "dir", NULL};
  assert_int_equal(gn_config_parse_args(&c, 3, (char *const *)dir, err, sizeof err), 0);
  assert_true(c.workspace_fs_dir);
  const char *const bad_fs[] = {"gpunetd", "--workspace-fs", "xfs", NULL};
  assert_int_equal(gn_config_parse_args(&c, 3, (char *const *)bad_fs, err, sizeof err), GN_EINVAL);
  assert_non_null(strstr(err, "bad workspace_fs 'xfs'"));
  assert_true(c.workspace_fs_dir); /* unchanged */
  const char *const autofs[] = {"gpunetd", "--workspace-fs", "auto", NULL};
  assert_int_equal(gn_config_parse_args(&c, 3, (char *const *)autofs, err, sizeof err), 0);
  assert_false(c.workspace_fs_dir);
  unlink(path);
  gn_config_done(&c);
}

/* --- a real provider --------------------------------------------------------------*/

typedef struct world {
  char dir[64];
  char addr[64];
  pid_t daemon;
  uv_loop_t loop;
  gn_identity *prov_id, *req_id, *other_id;
  gn_transport *req_tp, *other_tp;
  int up, other_up;
  tn_inbox in, other_in;
  tn_link link, other_link;
  char lease[GN_LEASE_ID_STRLEN];
} world;

static world W;
static const char *skip_why;

static bool have_runtime(void) {
  return access("/usr/sbin/runc", X_OK) == 0 || access("/usr/bin/runc", X_OK) == 0 ||
         access("/usr/bin/crun", X_OK) == 0 || access("/usr/sbin/crun", X_OK) == 0;
}

static int world_start(void **state) {
  (void)state;
  memset(&W, 0, sizeof W);
  if (!have_runtime()) {
    skip_why = "a provider needs runc or crun";
    return 0;
  }
  snprintf(W.dir, sizeof W.dir, "/tmp/gn-wsmsg-XXXXXX");
  assert_non_null(mkdtemp(W.dir));
  tn_identity_for(W.dir, &W.prov_id);
  snprintf(W.addr, sizeof W.addr, "127.0.0.1:%d", tn_free_port());
  W.daemon = tn_daemon_spawn(W.dir, "w", "--data-dir", W.dir, "--listen", W.addr, "--provide", "--simulate-gpu",
                             "RTX 4090", "--price", "0.40", "--max-hours", "2", "--allow-no-userns", (char *)NULL);
  uv_loop_init(&W.loop);
  W.link = (tn_link){&W.up, &W.in, NULL};
  W.other_link = (tn_link){&W.other_up, &W.other_in, NULL};
  tn_peer_new(&W.loop, &W.link, &W.req_id, &W.req_tp);
  tn_peer_new(&W.loop, &W.other_link, &W.other_id, &W.other_tp);
  tn_dial(&W.loop, W.req_tp, W.addr, &W.up, W.dir);
  tn_dial(&W.loop, W.other_tp, W.addr, &W.other_up, W.dir);
  gn_lease_terms t;
  gn_agreement ag;
  tn_lease_terms(&t, W.prov_id, W.req_id, 1, true);
  tn_rent(&W.loop, &W.in, W.req_tp, W.req_id, W.prov_id, &t, &ag, NULL);
  snprintf(W.lease, sizeof W.lease, "%s", ag.terms.lease_id);
  return 0;
}

static int world_end(void **state) {
  (void)state;
  if (skip_why)
    return 0;
  gn_transport *tps[] = {W.req_tp, W.other_tp};
  tn_inbox_done(&W.other_in);
  tn_world_end(&W.loop, tps, 2, W.daemon, &W.in, W.dir);
  W.prov_id = gn_identity_free(W.prov_id);
  W.req_id = gn_identity_free(W.req_id);
  W.other_id = gn_identity_free(W.other_id);
  return 0;
}

/* Sends a request of type (signed by signer over tp), its seq and path,
 * with data for a WS_PUT. */
static void send_req(gn_transport *tp, const gn_identity *signer, uint32_t type, uint64_t seq, const char *path,
                     uint64_t offset, const char *data) {
  gn_wsmsg m;
  memset(&m, 0, sizeof m);
  snprintf(m.lease_id, sizeof m.lease_id, "%s", W.lease);
  snprintf(m.path, sizeof m.path, "%s", path);
  m.seq = seq;
  m.offset = offset;
  m.data = (const uint8_t *)data;
  m.data_len = data ? strlen(data) : 0;
  gn_buf b = {0};
  encode(type, &m, &b);
  tn_send(tp, signer, type, &b, W.prov_id->pk);
  gn_buf_done(&b);
}

/* Waits for the reply of type and decodes it into ret (caller: done). */
static bool wait_reply(tn_inbox *in, uint32_t type, uint64_t timeout_ms, gn_wsmsg *ret, gn_buf *keep) {
  tn_msg msg;
  if (!tn_wait_msg(&W.loop, in, type, NULL, NULL, timeout_ms, &msg))
    return false;
  gn_envelope env;
  assert_int_equal(gn_envelope_open(msg.raw.data, msg.raw.len, &env), 0);
  *keep = msg.raw;
  assert_int_equal(gn__wsmsg_decode(type, env.body, env.body_len, ret), 0);
  return true;
}

/* The files as they lie on disk (the test only looks): in the lease's own
 * file system, mounted at the data dir's alias in the provider's mount
 * namespace (reached through /proc/PID/root), or, where the host could not
 * make one, in the upper dir the daemon writes through its view
 * (ws_prov.c). */
static void ws_path(const char *name, char *out, size_t cap) {
  struct stat st;
  snprintf(out, cap, "/proc/%d/root/run/gpunet/data/workspace/%s/fs/upper", (int)W.daemon, W.lease);
  if (stat(out, &st) == 0 && S_ISDIR(st.st_mode))
    snprintf(out, cap, "/proc/%d/root/run/gpunet/data/workspace/%s/fs/upper/%s", (int)W.daemon, W.lease, name);
  else
    snprintf(out, cap, "%s/workspace/%s/upper/%s", W.dir, W.lease, name);
}

static void test_provider_answers_only_the_lease_holder(void **state) {
  (void)state;
  if (skip_why)
    skip();
  gn_wsmsg r;
  gn_buf keep = {0};
  char path[512];
  /* another identity, over its own session, on the holder's lease */
  send_req(W.other_tp, W.other_id, GN_MSG_WS_PUT, 1, "planted", 0, "from a stranger");
  send_req(W.other_tp, W.other_id, GN_MSG_WS_STAT, 2, "planted", 0, NULL);
  assert_false(wait_reply(&W.other_in, GN_MSG_WS_PUT_ACK, 1500, &r, &keep));
  assert_false(tn_inbox_has(&W.other_in, GN_MSG_WS_STAT_REPLY));
  ws_path("planted", path, sizeof path);
  assert_int_equal(access(path, F_OK), -1);
  /* the holder is answered */
  send_req(W.req_tp, W.req_id, GN_MSG_WS_PUT, 3, "mine", 0, "hello");
  assert_true(wait_reply(&W.in, GN_MSG_WS_PUT_ACK, 5000, &r, &keep));
  assert_string_equal(r.reason, "");
  assert_int_equal(r.seq, 3);
  assert_int_equal(r.size, 5);
  gn__wsmsg_done(&r);
  gn_buf_done(&keep);
  ws_path("mine", path, sizeof path);
  assert_int_equal(access(path, F_OK), 0);
  ws_path("planted", path, sizeof path);
  assert_int_equal(access(path, F_OK), -1);
}

static void test_provider_refuses_a_write_far_past_the_end(void **state) {
  (void)state;
  if (skip_why)
    skip();
  gn_wsmsg r;
  gn_buf keep = {0};
  send_req(W.req_tp, W.req_id, GN_MSG_WS_PUT, 10, "sparse", 0, "abc");
  assert_true(wait_reply(&W.in, GN_MSG_WS_PUT_ACK, 5000, &r, &keep));
  gn__wsmsg_done(&r);
  gn_buf_done(&keep);
  send_req(W.req_tp, W.req_id, GN_MSG_WS_PUT, 11, "sparse", 1ull << 40, "x");
  assert_true(wait_reply(&W.in, GN_MSG_WS_PUT_ACK, 5000, &r, &keep));
  assert_non_null(strstr(r.reason, "past the end"));
  gn__wsmsg_done(&r);
  gn_buf_done(&keep);
  char path[512];
  struct stat st;
  ws_path("sparse", path, sizeof path);
  assert_int_equal(stat(path, &st), 0);
  assert_int_equal(st.st_size, 3);
}

static bool gone(void *ud) {
  return access((const char *)ud, F_OK) < 0;
}

static void test_provider_refuses_after_the_lease_ended_and_removes_it(void **state) {
  (void)state;
  if (skip_why)
    skip();
  gn_wsmsg r;
  gn_buf keep = {0};
  char dir[256];
  snprintf(dir, sizeof dir, "%s/workspace/%s", W.dir, W.lease);
  assert_int_equal(access(dir, F_OK), 0);
  tn_send_lease_end(W.req_tp, W.req_id, GN_MSG_LEASE_RELEASE, W.lease, "done", W.prov_id->pk);
  tn_msg end;
  assert_true(tn_wait_msg(&W.loop, &W.in, GN_MSG_LEASE_END, NULL, NULL, 5000, &end));
  gn_buf_done(&end.raw);
  send_req(W.req_tp, W.req_id, GN_MSG_WS_PUT, 20, "late", 0, "too late");
  assert_true(wait_reply(&W.in, GN_MSG_WS_PUT_ACK, 5000, &r, &keep));
  assert_non_null(strstr(r.reason, "ended"));
  gn__wsmsg_done(&r);
  gn_buf_done(&keep);
  /* the provider's tick removes it within a few seconds */
  assert_true(tn_run_until(&W.loop, gone, dir, 20000));
}

int main(void) {
  const struct CMUnitTest codec[] = {
      cmocka_unit_test(test_ws_path_norm_cleans_and_refuses),
      cmocka_unit_test(test_ws_path_norm_bounds_depth_and_length),
      cmocka_unit_test(test_wsmsg_round_trips),
      cmocka_unit_test(test_wsmsg_decoder_refuses_hostile_bodies),
      cmocka_unit_test(test_config_workspace_max),
  };
  const struct CMUnitTest provider[] = {
      cmocka_unit_test(test_provider_answers_only_the_lease_holder),
      cmocka_unit_test(test_provider_refuses_a_write_far_past_the_end),
      cmocka_unit_test(test_provider_refuses_after_the_lease_ended_and_removes_it),
  };
  int r = cmocka_run_group_tests(codec, NULL, NULL);
  return r | cmocka_run_group_tests(provider, world_start, world_end);
}
