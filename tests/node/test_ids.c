/* Hostile identifiers through every entry point reachable in-process: the id
 * grammar and the one path helper, the job manifest and job message
 * decoders, lease requests and agreements, and the control server's route
 * parameters (a real Unix socket, libcurl as the client). Each hostile id is
 * refused; the valid one in the same table passes, so a check that refused
 * everything would fail here too. */
#include "node_internal.h"

#include <curl/curl.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <unistd.h>

#include <cmocka.h>

#include "node/helpers.h"

#define VALID_ID "j-0123456789ab"

static char long_id[GN_ID_MAX + 2]; /* 65 letters: one over the limit */

typedef struct hostile {
  const char *name; /* for failure messages */
  const char *id;
} hostile;

static const hostile hostiles[] = {
    {"dot-dot", ".."},
    {"dot", "."},
    {"traversal", "../../x"},
    {"slash", "a/b"},
    {"empty", ""},
    {"65 chars", long_id},
    {"newline", "a\n"},
    {"space", "a b"},
    {"leading dash", "-x"},
    {"DEL", "\x7f"},
    {"dot inside", "a.b"},
    {"leading underscore", "_x"},
    {"trailing dot-dot", "x/.."},
};

static int setup_ids(void **state) {
  (void)state;
  memset(long_id, 'a', GN_ID_MAX + 1);
  long_id[GN_ID_MAX + 1] = 0;
  return 0;
}

/* --- the grammar and the path helper -----------------------------------------*/

static void test_id_grammar_refuses_hostile_and_takes_generated(void **state) {
  (void)state;
  for (size_t i = 0; i < GN_ARRAY_SIZE(hostiles); i++)
    if (gn_id_valid(hostiles[i].id))
      fail_msg("id '%s' (%s) passed the grammar", hostiles[i].id, hostiles[i].name);
  assert_false(gn_id_valid(NULL));
  /* What this project generates: "j-"/"l-"/"o-"/"i-" + hex, node ids, and
   * exactly GN_ID_MAX bytes. */
  char max[GN_ID_MAX + 1];
  memset(max, 'Z', GN_ID_MAX);
  max[GN_ID_MAX] = 0;
  const char *good[] = {VALID_ID,
                        "l-00c0ffee00c0ffee",
                        "o-3f2a9c1d7e4b",
                        "i-0011223344556677",
                        "gnxdmprthsyg3xadivnqyzxpaj5ge2vieppzt3swhizbyc2dmjbmlq6wqb",
                        "A_b-9",
                        max};
  for (size_t i = 0; i < GN_ARRAY_SIZE(good); i++)
    if (!gn_id_valid(good[i]))
      fail_msg("generated id '%s' refused", good[i]);
  gn_lease_terms t;
  gn_lease_terms_init(&t);
  assert_true(gn_id_valid(t.lease_id));
}

/* What an error message shows of a refused id: control and non-ASCII bytes
 * as '?', a long one cut with "...", always terminated within cap. */
static void test_printable_copy_masks_and_cuts(void **state) {
  (void)state;
  char out[GN_ID_MAX + 4], cut[GN_ID_MAX];
  gn_printable_copy("j-1\n\x1b[2J\xff", out, sizeof(out));
  assert_string_equal(out, "j-1??[2J?");
  gn_printable_copy(long_id, out, sizeof(out)); /* 65 bytes fit in 68 */
  assert_string_equal(out, long_id);
  gn_printable_copy(long_id, cut, sizeof(cut));
  assert_int_equal(strlen(cut), sizeof(cut) - 1);
  assert_string_equal(cut + sizeof(cut) - 4, "...");
  assert_memory_equal(cut, long_id, sizeof(cut) - 4);
  char small[8];
  gn_printable_copy("abcdefghij", small, sizeof(small));
  assert_string_equal(small, "abcd...");
  gn_printable_copy("abc", small, sizeof(small));
  assert_string_equal(small, "abc");
}

static void test_env_grammar(void **state) {
  (void)state;
  const char *good[] = {"A=1", "_X=", "PATH=/bin:/usr/bin", "a9_b=x=y", "CUDA_VISIBLE_DEVICES=0"};
  const char *bad[] = {"", "=x", "1A=1", "A", "A B=1", "A-B=1", "A\n=1", "A.B=1", "../x=1", "\x7f=1"};
  for (size_t i = 0; i < GN_ARRAY_SIZE(good); i++)
    if (!gn_env_entry_valid(good[i]))
      fail_msg("env '%s' refused", good[i]);
  for (size_t i = 0; i < GN_ARRAY_SIZE(bad); i++)
    if (gn_env_entry_valid(bad[i]))
      fail_msg("env '%s' passed", bad[i]);
  assert_false(gn_env_entry_valid(NULL));
}

static void test_path_join_one_component_only(void **state) {
  (void)state;
  char buf[128];
  for (size_t i = 0; i < GN_ARRAY_SIZE(hostiles); i++) {
    memcpy(buf, "stale", 6);
    int r = gn_path_join(buf, sizeof buf, "/data/run", "bundle-", hostiles[i].id, NULL);
    if (r != GN_EINVAL || buf[0])
      fail_msg("gn_path_join took '%s' (%s): %d '%s'", hostiles[i].id, hostiles[i].name, r, buf);
  }
  assert_int_equal(gn_path_join(buf, sizeof buf, "/data/run", "bundle-", VALID_ID, NULL), 0);
  assert_string_equal(buf, "/data/run/bundle-" VALID_ID);
  assert_int_equal(gn_path_join(buf, sizeof buf, "/data/run/jobs", NULL, VALID_ID, ".log"), 0);
  assert_string_equal(buf, "/data/run/jobs/" VALID_ID ".log");
  /* The caller's constants cannot smuggle a separator either. */
  assert_int_equal(gn_path_join(buf, sizeof buf, "/d", "../", VALID_ID, NULL), GN_EINVAL);
  assert_int_equal(gn_path_join(buf, sizeof buf, "/d", NULL, VALID_ID, "/x"), GN_EINVAL);
  assert_int_equal(gn_path_join(buf, sizeof buf, "/d", NULL, VALID_ID, "\n"), GN_EINVAL);
  assert_int_equal(gn_path_join(buf, sizeof buf, "", NULL, VALID_ID, NULL), GN_EINVAL);
  assert_int_equal(gn_path_join(buf, sizeof buf, NULL, NULL, VALID_ID, NULL), GN_EINVAL);
  /* Exactly full fits; one byte less is GN_ETOOBIG with nothing joined. */
  size_t need = strlen("/d/" VALID_ID) + 1;
  assert_int_equal(gn_path_join(buf, need, "/d", NULL, VALID_ID, NULL), 0);
  assert_int_equal(gn_path_join(buf, need - 1, "/d", NULL, VALID_ID, NULL), GN_ETOOBIG);
  assert_string_equal(buf, "");
}

/* --- the job manifest and job messages ---------------------------------------*/

/* A manifest body as a requester would send it, with any job id, lease id
 * and one env entry (NULL for none). */
static void manifest_body(const char *job_id, const char *lease_id, const char *env, gn_buf *ret) {
  static const uint8_t nonce[16] = {1};
  tn_manifest m = {.job_id = job_id,
                   .lease_id = lease_id,
                   .image = "127.0.0.1:5000/busybox@sha256:"
                            "0000000000000000000000000000000000000000000000000000000000000000",
                   .env = env,
                   .memory_mib = 64,
                   .pids = 64,
                   .nonce = nonce,
                   .issued_s = 1000,
                   .expires_s = 2000};
  tn_manifest_body(&m, ret);
}

static int decode_manifest(const char *job_id, const char *lease_id, const char *env) {
  gn_buf b = {0};
  gn_jobman m;
  manifest_body(job_id, lease_id, env, &b);
  int r = gn__jobman_decode(b.data, b.len, &m);
  if (r == 0)
    gn__jobman_done(&m);
  gn_buf_done(&b);
  return r;
}

static void test_manifest_refuses_hostile_ids(void **state) {
  (void)state;
  assert_int_equal(decode_manifest(VALID_ID, "l-00c0ffee00c0ffee", "A=1"), 0);
  for (size_t i = 0; i < GN_ARRAY_SIZE(hostiles); i++) {
    if (decode_manifest(hostiles[i].id, "l-00c0ffee00c0ffee", NULL) >= 0)
      fail_msg("manifest with job_id '%s' (%s) decoded", hostiles[i].id, hostiles[i].name);
    if (decode_manifest(VALID_ID, hostiles[i].id, NULL) >= 0)
      fail_msg("manifest with lease_id '%s' (%s) decoded", hostiles[i].id, hostiles[i].name);
  }
}

static void test_manifest_refuses_bad_env_names(void **state) {
  (void)state;
  const char *bad[] = {"=x", "1A=1", "A", "A B=1", "A-B=1", "LD_PRELOAD\n=1", "../x=1", ""};
  for (size_t i = 0; i < GN_ARRAY_SIZE(bad); i++)
    if (decode_manifest(VALID_ID, "l-1", bad[i]) >= 0)
      fail_msg("manifest with env '%s' decoded", bad[i]);
  assert_int_equal(decode_manifest(VALID_ID, "l-1", "_OK=a b/../c"), 0);
}

/* A job message body: {job_id?, lease_id?, ...the fields its type needs}. */
static int decode_jobmsg(uint32_t type, const char *job_id, const char *lease_id) {
  gn_wire_writer w;
  gn_buf b = {0};
  gn_jobmsg m;
  uint32_t n = (job_id ? 1 : 0) + (lease_id ? 1 : 0);
  n += type == GN_MSG_JOB_STATUS ? 2 : type == GN_MSG_JOB_LOG ? 2 : type == GN_MSG_LEASE_END ? 1 : 0;
  gn_wire_writer_init(&w);
  gn_wire_put_map(&w, n);
  if (job_id) {
    gn_wire_put_str(&w, "job_id");
    gn_wire_put_str(&w, job_id);
  }
  if (lease_id) {
    gn_wire_put_str(&w, "lease_id");
    gn_wire_put_str(&w, lease_id);
  }
  if (type == GN_MSG_JOB_STATUS) {
    gn_wire_put_str(&w, "state");
    gn_wire_put_str(&w, "running");
    gn_wire_put_str(&w, "exit_code");
    gn_wire_put_i64(&w, -1);
  } else if (type == GN_MSG_JOB_LOG) {
    gn_wire_put_str(&w, "offset");
    gn_wire_put_u64(&w, 0);
    gn_wire_put_str(&w, "data");
    gn_wire_put_bin(&w, "hi", 2);
  } else if (type == GN_MSG_LEASE_END) {
    gn_wire_put_str(&w, "end_s");
    gn_wire_put_i64(&w, 5);
  }
  assert_int_equal(gn_wire_writer_take(&w, &b), 0);
  gn_wire_writer_done(&w);
  int r = gn__jobmsg_decode(type, b.data, b.len, &m);
  if (r == 0)
    gn__jobmsg_done(&m);
  gn_buf_done(&b);
  return r;
}

static void test_job_messages_refuse_hostile_ids(void **state) {
  (void)state;
  static const uint32_t with_job[] = {GN_MSG_JOB_STATUS, GN_MSG_JOB_LOG, GN_MSG_JOB_STOP};
  static const uint32_t lease_only[] = {GN_MSG_LEASE_RELEASE, GN_MSG_LEASE_END, GN_MSG_LEASE_REJECT};
  const char *lease = "l-00c0ffee00c0ffee";
  for (size_t t = 0; t < GN_ARRAY_SIZE(with_job); t++) {
    assert_int_equal(decode_jobmsg(with_job[t], VALID_ID, lease), 0);
    for (size_t i = 0; i < GN_ARRAY_SIZE(hostiles); i++) {
      if (decode_jobmsg(with_job[t], hostiles[i].id, lease) >= 0)
        fail_msg("message %u with job_id '%s' (%s) decoded", with_job[t], hostiles[i].id, hostiles[i].name);
      if (decode_jobmsg(with_job[t], VALID_ID, hostiles[i].id) >= 0 && hostiles[i].id[0])
        fail_msg("message %u with lease_id '%s' (%s) decoded", with_job[t], hostiles[i].id, hostiles[i].name);
    }
  }
  for (size_t t = 0; t < GN_ARRAY_SIZE(lease_only); t++) {
    assert_int_equal(decode_jobmsg(lease_only[t], NULL, lease), 0);
    for (size_t i = 0; i < GN_ARRAY_SIZE(hostiles); i++)
      if (decode_jobmsg(lease_only[t], NULL, hostiles[i].id) >= 0)
        fail_msg("message %u with lease_id '%s' (%s) decoded", lease_only[t], hostiles[i].id, hostiles[i].name);
  }
}

/* --- lease requests and agreements --------------------------------------------*/

/* A signed lease request whose terms carry any lease and offer id: built by
 * hand, since gn_lease_request_seal itself refuses bad terms. */
static void request_env(const gn_identity *req, const uint8_t provider[GN_PK_LEN], const char *lease_id,
                        const char *offer_id, gn_buf *ret) {
  gn_wire_writer w;
  gn_buf body = {0};
  uint8_t nonce[16] = {7};
  gn_wire_writer_init(&w);
  gn_wire_put_map(&w, 13);
  gn_wire_put_str(&w, "lease_id");
  gn_wire_put_str(&w, lease_id);
  gn_wire_put_str(&w, "provider");
  gn_wire_put_bin(&w, provider, GN_PK_LEN);
  gn_wire_put_str(&w, "requester");
  gn_wire_put_bin(&w, req->pk, GN_PK_LEN);
  gn_wire_put_str(&w, "offer_id");
  gn_wire_put_str(&w, offer_id);
  gn_wire_put_str(&w, "gpu_model");
  gn_wire_put_str(&w, "NVIDIA GeForce RTX 4090");
  gn_wire_put_str(&w, "count");
  gn_wire_put_u64(&w, 1);
  gn_wire_put_str(&w, "price_uper_hour");
  gn_wire_put_u64(&w, 400000);
  gn_wire_put_str(&w, "currency");
  gn_wire_put_str(&w, "EUR");
  gn_wire_put_str(&w, "max_s");
  gn_wire_put_u64(&w, 3600);
  gn_wire_put_str(&w, "interval_s");
  gn_wire_put_u64(&w, 60);
  gn_wire_put_str(&w, "requested_s");
  gn_wire_put_i64(&w, 1000);
  gn_wire_put_str(&w, "nonce");
  gn_wire_put_bin(&w, nonce, sizeof nonce);
  gn_wire_put_str(&w, "simulated");
  gn_wire_put_bool(&w, true);
  assert_int_equal(gn_wire_writer_take(&w, &body), 0);
  gn_wire_writer_done(&w);
  assert_int_equal(gn_envelope_seal(req, GN_MSG_LEASE_REQUEST, body.data, body.len, ret), 0);
  gn_buf_done(&body);
}

/* The provider's acceptance of any request bytes, built by hand likewise. */
static void agreement_env(const gn_identity *prov, const gn_buf *req, gn_buf *ret) {
  gn_wire_writer w;
  gn_buf body = {0};
  gn_wire_writer_init(&w);
  gn_wire_put_map(&w, 3);
  gn_wire_put_str(&w, "request");
  gn_wire_put_bin(&w, req->data, req->len);
  gn_wire_put_str(&w, "start_s");
  gn_wire_put_i64(&w, 1000);
  gn_wire_put_str(&w, "gpus");
  gn_wire_put_array(&w, 1);
  gn_wire_put_str(&w, "GPU-SIM-0");
  assert_int_equal(gn_wire_writer_take(&w, &body), 0);
  gn_wire_writer_done(&w);
  assert_int_equal(gn_envelope_seal(prov, GN_MSG_LEASE_ACCEPT, body.data, body.len, ret), 0);
  gn_buf_done(&body);
}

/* 0 when both the request and an agreement around it open. */
static int open_lease(const gn_identity *req, const gn_identity *prov, const char *lease_id, const char *offer_id) {
  gn_buf r = {0}, a = {0};
  gn_lease_terms t;
  gn_agreement ag;
  request_env(req, prov->pk, lease_id, offer_id, &r);
  agreement_env(prov, &r, &a);
  int r1 = gn_lease_request_open(r.data, r.len, &t);
  int r2 = gn_agreement_open(a.data, a.len, &ag);
  const char *gpus[] = {"GPU-SIM-0"};
  gn_buf sealed = {0};
  int r3 = gn_agreement_seal(prov, r.data, r.len, 1000, gpus, 1, &sealed);
  gn_buf_done(&sealed);
  gn_buf_done(&r);
  gn_buf_done(&a);
  if ((r1 == 0) != (r2 == 0) || (r1 == 0) != (r3 == 0))
    fail_msg("request %d, agreement %d and seal %d disagree on lease '%s' offer '%s'", r1, r2, r3, lease_id, offer_id);
  return r1;
}

static void test_lease_terms_refuse_hostile_ids(void **state) {
  (void)state;
  gn_identity *req = NULL, *prov = NULL;
  assert_int_equal(gn_identity_generate(&req), 0);
  assert_int_equal(gn_identity_generate(&prov), 0);
  assert_int_equal(open_lease(req, prov, "l-00c0ffee00c0ffee", "o-3f2a9c1d7e4b"), 0);
  assert_int_equal(open_lease(req, prov, "l-00c0ffee00c0ffee", ""), 0);
  for (size_t i = 0; i < GN_ARRAY_SIZE(hostiles); i++) {
    if (open_lease(req, prov, hostiles[i].id, "o-3f2a9c1d7e4b") >= 0)
      fail_msg("lease request with lease_id '%s' (%s) opened", hostiles[i].id, hostiles[i].name);
    if (hostiles[i].id[0] && open_lease(req, prov, "l-00c0ffee00c0ffee", hostiles[i].id) >= 0)
      fail_msg("lease request with offer_id '%s' (%s) opened", hostiles[i].id, hostiles[i].name);
  }
  gn_lease_terms t;
  gn_buf out = {0};
  memset(&t, 0, sizeof t);
  gn_lease_terms_init(&t);
  memcpy(t.provider, prov->pk, GN_PK_LEN);
  memcpy(t.requester, req->pk, GN_PK_LEN);
  snprintf(t.gpu_model, sizeof t.gpu_model, "RTX");
  snprintf(t.currency, sizeof t.currency, "EUR");
  t.count = 1;
  t.max_s = 60;
  assert_int_equal(gn_lease_request_seal(req, &t, &out), 0);
  gn_buf_done(&out);
  snprintf(t.lease_id, sizeof t.lease_id, "..");
  assert_int_equal(gn_lease_request_seal(req, &t, &out), GN_EINVAL);
  gn_identity_free(req);
  gn_identity_free(prov);
}

static void test_offer_table_finds_no_hostile_id(void **state) {
  (void)state;
  gn_offer_table *t = gn_offer_table_new(8);
  assert_non_null(t);
  for (size_t i = 0; i < GN_ARRAY_SIZE(hostiles); i++)
    assert_null(gn_offer_table_find(t, hostiles[i].id));
  assert_null(gn_offer_table_find(t, NULL));
  gn_offer_table_free(t);
}

/* --- image references ---------------------------------------------------------*/

/* gn_imageref_parse is the check for the image a manifest names (the
 * provider refuses what it does not parse): no traversal, whitespace or
 * control bytes reach the registry URL or the store. */
static void test_imageref_refuses_path_games(void **state) {
  (void)state;
  static const char *const bad[] = {
      "127.0.0.1:5000/../x:1",
      "127.0.0.1:5000/a/../b:1",
      "127.0.0.1:5000/./x:1",
      "127.0.0.1:5000/x/..:1",
      "127.0.0.1:5000/x/.:1",
      "127.0.0.1:5000//x:1",
      "127.0.0.1:5000/x/:1",
      "127.0.0.1:5000/%2e%2e/x:1",
      "127.0.0.1:5000/a b:1",
      " 127.0.0.1:5000/x:1",
      "127.0.0.1:5000/x:1 ",
      "127.0.0.1:5000/x\n:1",
      "127.0.0.1:5000/x:1\n",
      "127.0.0.1:5000/x\x7f:1",
      "127.0.0.1:5000/x:../1",
      "127.0.0.1:5000/x:..",
      "127.0.0.1:5000/x:-t",
      "127.0.0.1:5000/-x:1",
      "127.0.0.1:5000/x?y=1:1",
      "127.0.0.1:5000/x#f:1",
      "127.0.0.1:5000/x@sha256:../../../../etc/passwd",
      "127.0.0.1:5000/x@sha256:0000000000000000000000000000000000000000000000000000000000000000/..",
      "..:5000/x:1",
      "../x:1",
      "user@127.0.0.1:5000/x:1",
  };
  gn_imageref ref;
  for (size_t i = 0; i < GN_ARRAY_SIZE(bad); i++)
    if (gn_imageref_parse(bad[i], &ref) >= 0)
      fail_msg("image reference '%s' parsed", bad[i]);
  assert_int_equal(gn_imageref_parse("127.0.0.1:5000/a.b/c_d-e:v1.2", &ref), 0);
  assert_string_equal(ref.repository, "a.b/c_d-e");
}

/* --- the control server ------------------------------------------------------*/

typedef struct ctl_fixture {
  char dir[64];
  char sock[128];
  uv_loop_t loop;
  uv_async_t stop;
  gn_ctl *ctl;
  pthread_t thread;
  atomic_int calls; /* handler calls: a refused id never reaches one */
} ctl_fixture;

static void on_route(gn_ctl_req *r, void *ud) {
  ctl_fixture *f = ud;
  atomic_fetch_add(&f->calls, 1);
  gn_ctl_reply_json(r, 200, json_pack("{s:s}", "id", gn_ctl_req_param(r, "id")));
}

static void on_stop(uv_async_t *a) {
  ctl_fixture *f = a->data;
  gn_ctl_close(f->ctl);
  uv_close((uv_handle_t *)&f->stop, NULL);
}

static void *loop_main(void *arg) {
  ctl_fixture *f = arg;
  uv_run(&f->loop, UV_RUN_DEFAULT);
  return NULL;
}

static long ctl_get(ctl_fixture *f, const char *path, gn_buf *body) {
  CURL *c = curl_easy_init();
  char url[512];
  long status = 0;
  snprintf(url, sizeof url, "http://gpunetd%s", path);
  curl_easy_setopt(c, CURLOPT_UNIX_SOCKET_PATH, f->sock);
  curl_easy_setopt(c, CURLOPT_URL, url);
  curl_easy_setopt(c, CURLOPT_PATH_AS_IS, 1L); /* send "/../" as is, as a hostile client would */
  curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, 10000L);
  char *text = NULL;
  size_t len = 0;
  FILE *mem = open_memstream(&text, &len);
  assert_non_null(mem);
  curl_easy_setopt(c, CURLOPT_WRITEDATA, mem); /* the default write function fwrite()s there */
  assert_int_equal(curl_easy_perform(c), CURLE_OK);
  curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
  curl_easy_cleanup(c);
  fclose(mem);
  gn_buf_append(body, text, len);
  gn_buf_append(body, "", 1);
  free(text);
  return status;
}

static void test_control_routes_refuse_hostile_ids(void **state) {
  (void)state;
  ctl_fixture *f = calloc(1, sizeof *f);
  assert_non_null(f);
  snprintf(f->dir, sizeof f->dir, "/tmp/gn-ids-XXXXXX");
  assert_non_null(mkdtemp(f->dir));
  snprintf(f->sock, sizeof f->sock, "%s/gpunetd.sock", f->dir);
  assert_int_equal(uv_loop_init(&f->loop), 0);
  assert_int_equal(uv_async_init(&f->loop, &f->stop, on_stop), 0);
  f->stop.data = f;
  assert_int_equal(gn_ctl_new(&f->loop, f->sock, &f->ctl), 0);
  assert_int_equal(gn_ctl_route(f->ctl, "GET", "/v1/jobs/:id/logs", on_route, f), 0);
  assert_int_equal(gn_ctl_route(f->ctl, "GET", "/v1/invoices/:id", on_route, f), 0);
  assert_int_equal(pthread_create(&f->thread, NULL, loop_main, f), 0);

  gn_buf body = {0};
  assert_int_equal(ctl_get(f, "/v1/jobs/" VALID_ID "/logs", &body), 200);
  assert_non_null(strstr((char *)body.data, VALID_ID));
  gn_buf_done(&body);
  assert_int_equal(atomic_load(&f->calls), 1);

  /* As they travel in a URL: percent-encoded where a client must encode. */
  char long_path[256];
  snprintf(long_path, sizeof long_path, "/v1/jobs/%s/logs", long_id);
  struct {
    const char *path;
    long status; /* 400: a route matched, its id refused; 404: no route */
  } cases[] = {
      {"/v1/jobs/../logs", 400},
      {"/v1/jobs/./logs", 400},
      {"/v1/jobs/%2e%2e/logs", 400},
      {"/v1/jobs/a%20b/logs", 400},
      {"/v1/jobs/a%0a/logs", 400},
      {"/v1/jobs/-x/logs", 400},
      {"/v1/jobs/%7f/logs", 400},
      {long_path, 400},
      {"/v1/invoices/..", 400},
      {"/v1/invoices/a.b", 400},
      {"/v1/jobs/..%2f..%2fx/logs", 404},
      {"/v1/jobs/a%2fb/logs", 404},
      {"/v1/jobs//logs", 404},
  };
  for (size_t i = 0; i < GN_ARRAY_SIZE(cases); i++) {
    long st = ctl_get(f, cases[i].path, &body);
    if (st != cases[i].status)
      fail_msg("GET %s: status %ld, want %ld (%s)", cases[i].path, st, cases[i].status, (char *)body.data);
    if (st == 400 && !strstr((char *)body.data, "is not a valid id"))
      fail_msg("GET %s: unclear error %s", cases[i].path, (char *)body.data);
    /* The echoed id never carries a control byte to the user's terminal. */
    for (const char *p = (const char *)body.data; *p; p++)
      if ((unsigned char)*p < 0x20 && *p != '\n')
        fail_msg("GET %s: control byte in the answer", cases[i].path);
    gn_buf_done(&body);
  }
  assert_int_equal(atomic_load(&f->calls), 1);

  uv_async_send(&f->stop);
  pthread_join(f->thread, NULL);
  assert_int_equal(uv_loop_close(&f->loop), 0);
  rmdir(f->dir);
  free(f);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_id_grammar_refuses_hostile_and_takes_generated),
      cmocka_unit_test(test_printable_copy_masks_and_cuts),
      cmocka_unit_test(test_env_grammar),
      cmocka_unit_test(test_path_join_one_component_only),
      cmocka_unit_test(test_manifest_refuses_hostile_ids),
      cmocka_unit_test(test_manifest_refuses_bad_env_names),
      cmocka_unit_test(test_job_messages_refuse_hostile_ids),
      cmocka_unit_test(test_lease_terms_refuse_hostile_ids),
      cmocka_unit_test(test_offer_table_finds_no_hostile_id),
      cmocka_unit_test(test_imageref_refuses_path_games),
      cmocka_unit_test(test_control_routes_refuse_hostile_ids),
  };
  return cmocka_run_group_tests(tests, setup_ids, NULL);
}
