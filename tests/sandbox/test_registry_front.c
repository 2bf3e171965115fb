/* The registry client against a small libmicrohttpd front that sits before
 * a real docker-registry. In its auth modes the front answers like a
 * token-protected registry (401 + WWW-Authenticate: Bearer, a token
 * endpoint) and redirects authorised requests to the real registry, so the
 * whole challenge/token/retry flow runs over real sockets (docker-registry's
 * own token auth needs a certificate chain and signed JWTs, more machinery
 * than this flow needs). In its hostile modes it answers as a broken or
 * malicious registry would: oversized manifests, redirect loops, a lying
 * Docker-Content-Digest, a blob longer than its descriptor, a blob that
 * drips a byte at a time, an error body holding a secret, a redirect to the
 * cloud metadata address. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <gpunet/sandbox.h>
#include <microhttpd.h>
#include <pthread.h>
#include <time.h>

#include "sandbox/helpers.h"

#define TOKEN "tok-9f8e7d"

enum mode {
  MODE_BEARER,
  MODE_TOKEN_REFUSED,
  MODE_BASIC,
  MODE_ACCESS_TOKEN,
  MODE_HUGE_MANIFEST,
  MODE_REDIRECT_LOOP,
  MODE_LYING_DIGEST_HEADER,
  MODE_LONG_BLOB,
  MODE_NO_RANGE,
  MODE_DRIP,              /* the layer blob, one byte every 200 ms */
  MODE_ERROR_BODY,        /* manifests: 404 with a body that holds a secret */
  MODE_REDIRECT_METADATA, /* blobs: redirected to the cloud metadata address */
};

#define SECRET "internal-token-5ec7e7"

static th_registry reg;
static struct MHD_Daemon *front;
static int front_port;
static enum mode mode;
static int token_requests, challenges, authorised;
static enum MHD_Result reply(struct MHD_Connection *c, unsigned code, const char *body, const char *hname,
                             const char *hval);
static char layer_digest[80];
static uint64_t layer_size;

/* One zero byte every 200 ms: a registry that never quite stalls. */
static ssize_t drip(void *cls, uint64_t pos, char *buf, size_t max) {
  (void)cls, (void)pos;
  if (max == 0)
    return 0;
  struct timespec ts = {0, 200 * 1000 * 1000};
  nanosleep(&ts, NULL);
  buf[0] = 0;
  return 1;
}

/* The hostile modes: answers a broken or malicious registry might give. */
static enum MHD_Result hostile(struct MHD_Connection *c, const char *url) {
  char buf[1024];
  if (mode == MODE_DRIP && strstr(url, layer_digest)) {
    struct MHD_Response *r = MHD_create_response_from_callback(layer_size, 1, drip, NULL, NULL);
    enum MHD_Result ret = MHD_queue_response(c, 200, r);
    MHD_destroy_response(r);
    return ret;
  }
  if (mode == MODE_ERROR_BODY && strstr(url, "/manifests/"))
    return reply(c, 404,
                 "{\"errors\":[{\"code\":\"MANIFEST_UNKNOWN\",\"detail\":\"upstream auth " SECRET " rejected\"}]}",
                 "Content-Type", "application/json");
  if (mode == MODE_REDIRECT_METADATA && strstr(url, "/blobs/")) {
    snprintf(buf, sizeof(buf), "http://169.254.169.254/latest/meta-data%s", url);
    return reply(c, 302, "", "Location", buf);
  }
  if (mode == MODE_HUGE_MANIFEST && strstr(url, "/manifests/")) {
    size_t n = 5u << 20; /* over the 4 MiB manifest limit */
    char *body = malloc(n);
    memset(body, ' ', n);
    body[0] = '{';
    body[n - 1] = '}';
    struct MHD_Response *r = MHD_create_response_from_buffer(n, body, MHD_RESPMEM_MUST_FREE);
    MHD_add_response_header(r, "Content-Type", "application/vnd.oci.image.manifest.v1+json");
    enum MHD_Result ret = MHD_queue_response(c, 200, r);
    MHD_destroy_response(r);
    return ret;
  }
  if (mode == MODE_REDIRECT_LOOP)
    return reply(c, 302, "", "Location", url);
  if (mode == MODE_LYING_DIGEST_HEADER && strstr(url, "/manifests/")) {
    char path[4096];
    th_registry_blob_path(&reg, reg.digest, path, sizeof(path));
    size_t n = 0;
    char *body = th_read_file(path, &n);
    struct MHD_Response *r = MHD_create_response_from_buffer(n, body, MHD_RESPMEM_MUST_FREE);
    MHD_add_response_header(r, "Content-Type", "application/vnd.oci.image.manifest.v1+json");
    MHD_add_response_header(r, "Docker-Content-Digest",
                            "sha256:0000000000000000000000000000000000000000000000000000000000000000");
    enum MHD_Result ret = MHD_queue_response(c, 200, r);
    MHD_destroy_response(r);
    return ret;
  }
  if (mode == MODE_LONG_BLOB && strstr(url, layer_digest)) {
    size_t n = (size_t)layer_size + 65536;
    char *body = calloc(1, n);
    struct MHD_Response *r = MHD_create_response_from_buffer(n, body, MHD_RESPMEM_MUST_FREE);
    enum MHD_Result ret = MHD_queue_response(c, 200, r);
    MHD_destroy_response(r);
    return ret;
  }
  if (mode == MODE_NO_RANGE && strstr(url, layer_digest)) {
    /* A server that ignores Range: the whole blob, 200. */
    char path[4096];
    th_registry_blob_path(&reg, layer_digest, path, sizeof(path));
    size_t n = 0;
    char *body = th_read_file(path, &n);
    struct MHD_Response *r = MHD_create_response_from_buffer(n, body, MHD_RESPMEM_MUST_FREE);
    enum MHD_Result ret = MHD_queue_response(c, 200, r);
    MHD_destroy_response(r);
    return ret;
  }
  /* Everything else goes to the real registry. */
  snprintf(buf, sizeof(buf), "http://%s%s", reg.host, url);
  return reply(c, 307, "", "Location", buf);
}

static enum MHD_Result reply(struct MHD_Connection *c, unsigned code, const char *body, const char *hname,
                             const char *hval) {
  struct MHD_Response *r = MHD_create_response_from_buffer(strlen(body), (void *)body, MHD_RESPMEM_MUST_COPY);
  if (hname)
    MHD_add_response_header(r, hname, hval);
  enum MHD_Result ret = MHD_queue_response(c, code, r);
  MHD_destroy_response(r);
  return ret;
}

static enum MHD_Result handle(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                              const char *version, const char *upload, size_t *upload_size, void **con_cls) {
  (void)cls, (void)method, (void)version, (void)upload, (void)upload_size, (void)con_cls;
  char buf[1024];
  if (strcmp(url, "/token") == 0) {
    token_requests++;
    const char *service = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "service");
    const char *scope = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "scope");
    if (mode == MODE_TOKEN_REFUSED || !service || strcmp(service, "gn test") != 0 || !scope ||
        strcmp(scope, "repository:bb:pull") != 0)
      return reply(c, 403, "{\"errors\":[{\"code\":\"DENIED\"}]}", NULL, NULL);
    snprintf(buf, sizeof(buf), "{\"%s\":\"%s\",\"expires_in\":300}",
             mode == MODE_ACCESS_TOKEN ? "access_token" : "token", TOKEN);
    return reply(c, 200, buf, "Content-Type", "application/json");
  }
  if (mode >= MODE_HUGE_MANIFEST)
    return hostile(c, url);
  const char *authz = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization");
  if (mode != MODE_BASIC && authz && strcmp(authz, "Bearer " TOKEN) == 0) {
    authorised++;
    snprintf(buf, sizeof(buf), "http://%s%s", reg.host, url);
    return reply(c, 307, "", "Location", buf);
  }
  challenges++;
  if (mode == MODE_BASIC)
    return reply(c, 401, "{}", "WWW-Authenticate", "Basic realm=\"registry\"");
  snprintf(buf, sizeof(buf),
           "Bearer realm=\"http://127.0.0.1:%d/token\",service=\"gn test\",scope=\"repository:bb:pull\"", front_port);
  return reply(c, 401, "{\"errors\":[{\"code\":\"UNAUTHORIZED\"}]}", "WWW-Authenticate", buf);
}

static int setup(void **state) {
  (void)state;
  if (th_registry_start(&reg) < 0) {
    th_registry_stop(&reg);
    return -1;
  }
  /* Learn the layer's digest and size from a direct pull. */
  char ref[256], err[256] = "";
  gn_imageref r;
  gn_image img;
  gn_store *st = NULL;
  char *dir = th_mkdtemp("frontstore");
  snprintf(ref, sizeof(ref), "%s/bb@%s", reg.host, reg.digest);
  if (gn_imageref_parse(ref, &r) < 0 || th_store_open_loopback(dir, &st) < 0 ||
      gn_store_pull(st, &r, NULL, NULL, &img, err, sizeof(err)) < 0) {
    fprintf(stderr, "direct pull failed: %s\n", err);
    return -1;
  }
  snprintf(layer_digest, sizeof(layer_digest), "%s", img.layers[0]);
  char path[4096];
  struct stat sb;
  th_registry_blob_path(&reg, layer_digest, path, sizeof(path));
  if (stat(path, &sb) < 0)
    return -1;
  layer_size = (uint64_t)sb.st_size;
  gn_image_done(&img);
  gn_store_free(st);
  th_rm_rf(dir);
  free(dir);
  for (int tries = 0; tries < 5 && !front; tries++) {
    front_port = th_free_port();
    front = MHD_start_daemon(MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_THREAD_PER_CONNECTION, (uint16_t)front_port,
                             NULL, NULL, handle, NULL, MHD_OPTION_END);
  }
  return front ? 0 : -1;
}

static int teardown(void **state) {
  (void)state;
  if (front)
    MHD_stop_daemon(front);
  th_registry_stop(&reg);
  return 0;
}

static void reset(enum mode m) {
  mode = m;
  token_requests = challenges = authorised = 0;
}

static int pull_via_front(char *err, size_t cap, gn_image *img, char **ret_dir) {
  char s[256];
  gn_imageref r;
  gn_store *st = NULL;
  snprintf(s, sizeof(s), "127.0.0.1:%d/bb@%s", front_port, reg.digest);
  assert_int_equal(gn_imageref_parse(s, &r), 0);
  *ret_dir = th_mkdtemp("authstore");
  assert_int_equal(th_store_open_loopback(*ret_dir, &st), 0);
  int rc = gn_store_pull(st, &r, NULL, NULL, img, err, cap);
  gn_store_free(st);
  return rc;
}

/* A pull through the front under the given limits and options. */
static int pull_front_ex(const gn_store_limits *lim, const gn_pull_opts *o, char *err, size_t cap, char *err_log,
                         size_t log_cap, gn_image *img, char **ret_dir) {
  char s[256];
  gn_imageref r;
  gn_store *st = NULL;
  snprintf(s, sizeof(s), "127.0.0.1:%d/bb@%s", front_port, reg.digest);
  assert_int_equal(gn_imageref_parse(s, &r), 0);
  *ret_dir = th_mkdtemp("limstore");
  assert_int_equal(gn_store_open(*ret_dir, &st), 0);
  assert_int_equal(gn_store_set_limits(st, lim), 0);
  int rc = gn_store_pull_ex(st, &r, o, img, err, cap, err_log, log_cap);
  gn_store_free(st);
  return rc;
}

static const char *const allow_loopback[] = {"127.0.0.1", NULL};

static uint64_t now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static void test_slow_drip_blob_hits_blob_deadline(void **state) {
  (void)state;
  char err[512] = "", *dir = NULL, path[4096];
  gn_image img;
  gn_store_limits lim = {.registry_allow = allow_loopback, .blob_timeout_s = 2};
  reset(MODE_DRIP);
  uint64_t t0 = now_ms();
  assert_int_equal(pull_front_ex(&lim, NULL, err, sizeof(err), NULL, 0, &img, &dir), GN_ETIMEDOUT);
  uint64_t took = now_ms() - t0;
  if (took < 1500 || took > 6000)
    fail_msg("a 2 s blob deadline ended the pull after %llu ms", (unsigned long long)took);
  snprintf(path, sizeof(path), "%s/tmp", dir);
  assert_int_equal(th_count_entries(path), 0); /* no partial file kept */
  th_rm_rf(dir);
  free(dir);
}

static void test_slow_drip_blob_hits_pull_deadline(void **state) {
  (void)state;
  char err[512] = "", *dir = NULL;
  gn_image img;
  gn_store_limits lim = {.registry_allow = allow_loopback, .blob_timeout_s = 600, .pull_timeout_s = 2};
  reset(MODE_DRIP);
  uint64_t t0 = now_ms();
  assert_int_equal(pull_front_ex(&lim, NULL, err, sizeof(err), NULL, 0, &img, &dir), GN_ETIMEDOUT);
  uint64_t took = now_ms() - t0;
  if (took < 1500 || took > 6000)
    fail_msg("a 2 s pull deadline ended the pull after %llu ms", (unsigned long long)took);
  th_rm_rf(dir);
  free(dir);
}

typedef struct canceler {
  volatile int flag;
  uint64_t at_ms;
} canceler;

static void *cancel_after_1s(void *p) {
  canceler *c = p;
  struct timespec ts = {1, 0};
  nanosleep(&ts, NULL);
  c->at_ms = now_ms();
  c->flag = 1;
  return NULL;
}

static void test_cancel_during_blob_stops_within_a_second(void **state) {
  (void)state;
  char err[512] = "", *dir = NULL, path[4096];
  gn_image img;
  canceler cn = {0};
  gn_store_limits lim = {.registry_allow = allow_loopback};
  gn_pull_opts o = {.cancel = &cn.flag};
  pthread_t t;
  reset(MODE_DRIP);
  assert_int_equal(pthread_create(&t, NULL, cancel_after_1s, &cn), 0);
  int rc = pull_front_ex(&lim, &o, err, sizeof(err), NULL, 0, &img, &dir);
  uint64_t done = now_ms();
  pthread_join(t, NULL);
  assert_int_equal(rc, GN_ECANCELED);
  if (done - cn.at_ms > 1000)
    fail_msg("the pull stopped %llu ms after the cancel", (unsigned long long)(done - cn.at_ms));
  snprintf(path, sizeof(path), "%s/tmp", dir);
  assert_int_equal(th_count_entries(path), 0); /* the partial layer is gone */
  snprintf(path, sizeof(path), "%s/blobs/sha256/%s", dir, layer_digest + 7);
  assert_false(th_exists(path));
  th_rm_rf(dir);
  free(dir);
}

static void test_error_body_goes_to_err_log_only(void **state) {
  (void)state;
  char err[512] = "", err_log[1024] = "", *dir = NULL;
  gn_image img;
  gn_store_limits lim = {.registry_allow = allow_loopback};
  reset(MODE_ERROR_BODY);
  assert_int_equal(pull_front_ex(&lim, NULL, err, sizeof(err), err_log, sizeof(err_log), &img, &dir), GN_ENOTFOUND);
  assert_null(strstr(err, SECRET));
  assert_non_null(strstr(err, "answered HTTP 404 for manifest sha256:"));
  assert_non_null(strstr(err_log, SECRET));
  assert_non_null(strstr(err_log, "404"));
  th_rm_rf(dir);
  free(dir);
}

static void test_redirect_to_metadata_address_is_refused(void **state) {
  (void)state;
  char err[512] = "", *dir = NULL, front_host[64];
  gn_image img;
  /* Only the front itself is allowed, by host:port. */
  snprintf(front_host, sizeof(front_host), "127.0.0.1:%d", front_port);
  const char *const allow[] = {front_host, NULL};
  gn_store_limits lim = {.registry_allow = allow};
  reset(MODE_REDIRECT_METADATA);
  uint64_t t0 = now_ms();
  assert_int_equal(pull_front_ex(&lim, NULL, err, sizeof(err), NULL, 0, &img, &dir), GN_EPERM);
  assert_true(now_ms() - t0 < 5000); /* refused, not a connect timeout */
  assert_non_null(strstr(err, "169.254.169.254"));
  assert_non_null(strstr(err, "link-local"));
  assert_non_null(strstr(err, "registry_allow"));
  th_rm_rf(dir);
  free(dir);
}

static void test_pull_answers_bearer_challenge_once(void **state) {
  (void)state;
  char err[256] = "", *dir = NULL;
  gn_image img;
  reset(MODE_BEARER);
  int rc = pull_via_front(err, sizeof(err), &img, &dir);
  if (rc)
    fail_msg("pull through Bearer auth: %d %s", rc, err);
  assert_string_equal(img.manifest_digest, reg.digest);
  /* One challenge, one token, then the token is reused for every request:
   * the manifest, the config and the layer. */
  assert_int_equal(challenges, 1);
  assert_int_equal(token_requests, 1);
  assert_int_equal(authorised, 3);
  gn_image_done(&img);
  th_rm_rf(dir);
  free(dir);
}

static void test_pull_accepts_access_token_field(void **state) {
  (void)state;
  char err[256] = "", *dir = NULL;
  gn_image img;
  reset(MODE_ACCESS_TOKEN);
  int rc = pull_via_front(err, sizeof(err), &img, &dir);
  if (rc)
    fail_msg("pull with access_token: %d %s", rc, err);
  assert_int_equal(token_requests, 1);
  gn_image_done(&img);
  th_rm_rf(dir);
  free(dir);
}

static void test_resolve_answers_bearer_challenge(void **state) {
  (void)state;
  char s[256], err[256] = "", digest[GN_DIGEST_STRLEN];
  gn_imageref r;
  reset(MODE_BEARER);
  snprintf(s, sizeof(s), "127.0.0.1:%d/bb:latest", front_port);
  assert_int_equal(gn_imageref_parse(s, &r), 0);
  int rc = gn_registry_resolve(&r, digest, err, sizeof(err));
  if (rc)
    fail_msg("resolve: %d %s", rc, err);
  assert_string_equal(digest, reg.digest);
  assert_int_equal(token_requests, 1);
}

static void test_refused_token_is_eperm(void **state) {
  (void)state;
  char err[256] = "", *dir = NULL;
  gn_image img;
  reset(MODE_TOKEN_REFUSED);
  assert_int_equal(pull_via_front(err, sizeof(err), &img, &dir), GN_EPERM);
  assert_non_null(strstr(err, "token"));
  assert_int_equal(authorised, 0);
  th_rm_rf(dir);
  free(dir);
}

static void test_basic_challenge_is_eperm(void **state) {
  (void)state;
  char err[256] = "", *dir = NULL;
  gn_image img;
  reset(MODE_BASIC);
  assert_int_equal(pull_via_front(err, sizeof(err), &img, &dir), GN_EPERM);
  assert_non_null(strstr(err, "credentials"));
  assert_int_equal(token_requests, 0);
  th_rm_rf(dir);
  free(dir);
}

static void test_oversized_manifest_is_refused(void **state) {
  (void)state;
  char err[256] = "", *dir = NULL;
  gn_image img;
  reset(MODE_HUGE_MANIFEST);
  assert_int_equal(pull_via_front(err, sizeof(err), &img, &dir), GN_ETOOBIG);
  assert_non_null(strstr(err, "more bytes than allowed"));
  th_rm_rf(dir);
  free(dir);
}

static void test_redirect_loop_is_bounded(void **state) {
  (void)state;
  char err[256] = "", *dir = NULL;
  gn_image img;
  reset(MODE_REDIRECT_LOOP);
  assert_int_equal(pull_via_front(err, sizeof(err), &img, &dir), GN_EPROTO);
  assert_non_null(strstr(err, "redirects"));
  th_rm_rf(dir);
  free(dir);
}

static void test_lying_digest_header_is_refused(void **state) {
  (void)state;
  char s[256], err[256] = "", digest[GN_DIGEST_STRLEN] = "unchanged", *dir = NULL;
  gn_imageref r;
  gn_image img;
  reset(MODE_LYING_DIGEST_HEADER);
  snprintf(s, sizeof(s), "127.0.0.1:%d/bb:latest", front_port);
  assert_int_equal(gn_imageref_parse(s, &r), 0);
  assert_int_equal(gn_registry_resolve(&r, digest, err, sizeof(err)), GN_EDIGEST);
  assert_string_equal(digest, "unchanged");
  /* A pinned pull refuses it too, though the body itself is right. */
  assert_int_equal(pull_via_front(err, sizeof(err), &img, &dir), GN_EDIGEST);
  th_rm_rf(dir);
  free(dir);
}

static void test_blob_longer_than_descriptor_is_refused(void **state) {
  (void)state;
  char err[256] = "", *dir = NULL, path[4096];
  gn_image img;
  reset(MODE_LONG_BLOB);
  assert_int_equal(pull_via_front(err, sizeof(err), &img, &dir), GN_ETOOBIG);
  snprintf(path, sizeof(path), "%s/tmp", dir);
  assert_int_equal(th_count_entries(path), 0);
  snprintf(path, sizeof(path), "%s/blobs/sha256/%s", dir, layer_digest + 7);
  assert_false(th_exists(path));
  th_rm_rf(dir);
  free(dir);
}

static void test_resume_restarts_when_server_ignores_range(void **state) {
  (void)state;
  char s[256], err[256] = "", path[4096];
  gn_imageref r;
  gn_store *st = NULL;
  gn_image img;
  reset(MODE_NO_RANGE);
  char *dir = th_mkdtemp("norange");
  assert_int_equal(th_store_open_loopback(dir, &st), 0);
  /* A partial download of the first half is there from an earlier try. */
  th_registry_blob_path(&reg, layer_digest, path, sizeof(path));
  size_t n = 0;
  char *layer = th_read_file(path, &n);
  snprintf(path, sizeof(path), "%s/tmp/%s.partial", dir, layer_digest + 7);
  assert_int_equal(th_write_file(path, layer, n / 2), 0);
  snprintf(s, sizeof(s), "127.0.0.1:%d/bb@%s", front_port, reg.digest);
  assert_int_equal(gn_imageref_parse(s, &r), 0);
  int rc = gn_store_pull(st, &r, NULL, NULL, &img, err, sizeof(err));
  if (rc)
    fail_msg("pull: %d %s", rc, err);
  /* The whole layer came again, and what is stored is exactly the layer. */
  assert_true(img.bytes_fetched >= n);
  snprintf(path, sizeof(path), "%s/blobs/sha256/%s", dir, layer_digest + 7);
  size_t got_n = 0;
  char *got = th_read_file(path, &got_n);
  assert_int_equal(got_n, n);
  assert_memory_equal(got, layer, n);
  free(got);
  free(layer);
  gn_image_done(&img);
  gn_store_free(st);
  th_rm_rf(dir);
  free(dir);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_pull_answers_bearer_challenge_once),
      cmocka_unit_test(test_pull_accepts_access_token_field),
      cmocka_unit_test(test_resolve_answers_bearer_challenge),
      cmocka_unit_test(test_refused_token_is_eperm),
      cmocka_unit_test(test_basic_challenge_is_eperm),
      cmocka_unit_test(test_oversized_manifest_is_refused),
      cmocka_unit_test(test_redirect_loop_is_bounded),
      cmocka_unit_test(test_lying_digest_header_is_refused),
      cmocka_unit_test(test_blob_longer_than_descriptor_is_refused),
      cmocka_unit_test(test_resume_restarts_when_server_ignores_range),
      cmocka_unit_test(test_slow_drip_blob_hits_blob_deadline),
      cmocka_unit_test(test_slow_drip_blob_hits_pull_deadline),
      cmocka_unit_test(test_cancel_during_blob_stops_within_a_second),
      cmocka_unit_test(test_error_body_goes_to_err_log_only),
      cmocka_unit_test(test_redirect_to_metadata_address_is_refused),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
