/* Bearer token auth, end to end: a small libmicrohttpd front in this test
 * answers like a token-protected registry (401 + WWW-Authenticate: Bearer,
 * a token endpoint) and redirects authorised requests to a real
 * docker-registry, so the client's whole challenge/token/retry flow runs
 * over real sockets. docker-registry's own token auth needs a certificate
 * chain and signed JWTs, which is more machinery than this flow needs. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <gpunet/sandbox.h>
#include <microhttpd.h>

#include "sandbox/helpers.h"

#define TOKEN "tok-9f8e7d"

enum mode { MODE_BEARER, MODE_TOKEN_REFUSED, MODE_BASIC, MODE_ACCESS_TOKEN };

static th_registry reg;
static struct MHD_Daemon *front;
static int front_port;
static enum mode mode;
static int token_requests, challenges, authorised;

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
           "Bearer realm=\"http://127.0.0.1:%d/token\",service=\"gn test\",scope=\"repository:bb:pull\"",
           front_port);
  return reply(c, 401, "{\"errors\":[{\"code\":\"UNAUTHORIZED\"}]}", "WWW-Authenticate", buf);
}

static int setup(void **state) {
  (void)state;
  if (th_registry_start(&reg) < 0) {
    th_registry_stop(&reg);
    return -1;
  }
  for (int tries = 0; tries < 5 && !front; tries++) {
    front_port = th_free_port();
    front = MHD_start_daemon(MHD_USE_INTERNAL_POLLING_THREAD, (uint16_t)front_port, NULL, NULL, handle, NULL,
                             MHD_OPTION_END);
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
  assert_int_equal(gn_store_open(*ret_dir, &st), 0);
  int rc = gn_store_pull(st, &r, NULL, NULL, img, err, cap);
  gn_store_free(st);
  return rc;
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

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_pull_answers_bearer_challenge_once),
      cmocka_unit_test(test_pull_accepts_access_token_field),
      cmocka_unit_test(test_resolve_answers_bearer_challenge),
      cmocka_unit_test(test_refused_token_is_eperm),
      cmocka_unit_test(test_basic_challenge_is_eperm),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
