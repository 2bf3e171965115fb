/* Tests of the provider dashboard (node/dashboard.c): the token and Host
 * checks, the history ring, the token file, and a real TCP control server
 * with the dashboard's checks as its guard, asked by libcurl. */
#include "dashboard.h"

#include <gpunet/node.h>

#include <curl/curl.h>
#include <fcntl.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

static const char TOKEN[] = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

/* --- token and Host -----------------------------------------------------------*/

static void test_dash_token_accepts_only_the_exact_bearer_token(void **state) {
  (void)state;
  char auth[128];
  snprintf(auth, sizeof auth, "Bearer %s", TOKEN);
  assert_true(gn__dash_token_ok(auth, TOKEN));
  snprintf(auth, sizeof auth, "bearer %s", TOKEN); /* the scheme is case-insensitive (RFC 9110) */
  assert_true(gn__dash_token_ok(auth, TOKEN));
  snprintf(auth, sizeof auth, "Bearer %s", TOKEN);
  auth[sizeof "Bearer " - 1 + 63] = '0'; /* last digit changed */
  assert_false(gn__dash_token_ok(auth, TOKEN));
  snprintf(auth, sizeof auth, "Bearer %.63s", TOKEN); /* one digit short */
  assert_false(gn__dash_token_ok(auth, TOKEN));
  snprintf(auth, sizeof auth, "Bearer %s0", TOKEN); /* one digit more */
  assert_false(gn__dash_token_ok(auth, TOKEN));
  snprintf(auth, sizeof auth, "Basic %s", TOKEN);
  assert_false(gn__dash_token_ok(auth, TOKEN));
  assert_false(gn__dash_token_ok(TOKEN, TOKEN)); /* no scheme */
  assert_false(gn__dash_token_ok("Bearer ", TOKEN));
  assert_false(gn__dash_token_ok(NULL, TOKEN));
}

static void test_dash_host_accepts_loopback_names_only(void **state) {
  (void)state;
  static const struct {
    const char *host;
    bool ok;
  } cases[] = {
      {"127.0.0.1:8080", true},
      {"127.0.0.1", true},
      {"127.1.2.3:80", true},
      {"localhost:8080", true},
      {"LocalHost:8080", true},
      {"[::1]:8080", true},
      {"[::1]", true},
      {"evil.example:8080", false},      /* DNS rebinding: the attacker's name */
      {"localhost.evil.example", false}, /* a name that only starts like ours */
      {"127.0.0.1.evil.example:80", false},
      {"10.0.0.1:8080", false},
      {"[::2]:8080", false},
      {"[::1]x", false},
      {"localhost:", false},
      {"localhost:80a", false},
      {"localhost:123456", false},
      {"", false},
      {NULL, false},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    if (gn__dash_host_ok(cases[i].host) != cases[i].ok)
      fail_msg("host '%s': want %s", cases[i].host ? cases[i].host : "(null)", cases[i].ok ? "ok" : "refused");
  }
}

static void test_dash_check_refuses_in_order(void **state) {
  (void)state;
  char auth[128], msg[256];
  snprintf(auth, sizeof auth, "Bearer %s", TOKEN);
  /* A foreign Host is refused even with the token. */
  assert_int_equal(gn__dash_check("GET", "/v1/status", "evil.example:80", auth, TOKEN, msg, sizeof msg), 421);
  assert_non_null(strstr(msg, "evil.example"));
  assert_int_equal(gn__dash_check("POST", "/v1/status", "127.0.0.1:80", auth, TOKEN, msg, sizeof msg), 405);
  assert_int_equal(gn__dash_check("HEAD", "/", "127.0.0.1:80", NULL, TOKEN, msg, sizeof msg), 405);
  assert_int_equal(gn__dash_check("GET", "/v1/status", "127.0.0.1:80", NULL, TOKEN, msg, sizeof msg), 401);
  assert_int_equal(gn__dash_check("GET", "/v1/history", "localhost:80", "Bearer nope", TOKEN, msg, sizeof msg), 401);
  /* The page and its files hold no data: no token needed. */
  assert_int_equal(gn__dash_check("GET", "/", "127.0.0.1:80", NULL, TOKEN, msg, sizeof msg), 0);
  assert_int_equal(gn__dash_check("GET", "/app.js", "[::1]:80", NULL, TOKEN, msg, sizeof msg), 0);
  assert_int_equal(gn__dash_check("GET", "/v1/leases", "127.0.0.1:80", auth, TOKEN, msg, sizeof msg), 0);
}

/* --- the history ring -----------------------------------------------------------*/

static void push(gn__dash_ring *r, int64_t t, uint64_t earned, int16_t u0, int16_t u1, int32_t p0, int32_t p1) {
  int16_t u[2] = {u0, u1};
  int32_t p[2] = {p0, p1};
  gn__dash_ring_push(r, t, earned, u, p);
}

static void test_dash_ring_is_bounded_and_wraps(void **state) {
  (void)state;
  gn__dash_ring r;
  assert_int_equal(gn__dash_ring_init(&r, 4, 2), 0);
  for (int t = 1; t <= 6; t++)
    push(&r, t, (uint64_t)t * 10, (int16_t)t, -1, t * 1000, -1);
  assert_int_equal(r.count, 4); /* never more than cap */
  json_t *o = gn__dash_ring_json(&r, 0, 100);
  char *s = json_dumps(o, JSON_COMPACT);
  assert_string_equal(s, "{\"t_s\":[3,4,5,6],\"earned_micro\":[30,40,50,60],\"gpus\":[{\"util_pct\":[3,4,5,6],"
                         "\"power_w\":[3.0,4.0,5.0,6.0]},{\"util_pct\":[null,null,null,null],\"power_w\":[null,"
                         "null,null,null]}]}");
  free(s);
  json_decref(o);
  gn__dash_ring_done(&r);
}

static void test_dash_ring_json_thins_and_keeps_the_newest(void **state) {
  (void)state;
  gn__dash_ring r;
  assert_int_equal(gn__dash_ring_init(&r, 1000, 0), 0);
  for (int t = 1; t <= 1000; t++)
    gn__dash_ring_push(&r, t, (uint64_t)t, NULL, NULL);
  json_t *o = gn__dash_ring_json(&r, 0, 7);
  json_t *ts = json_object_get(o, "t_s");
  assert_true(json_array_size(ts) <= 7);
  assert_true(json_array_size(ts) >= 6);
  assert_int_equal(json_integer_value(json_array_get(ts, json_array_size(ts) - 1)), 1000);
  json_decref(o);
  /* since_s: only later samples. */
  o = gn__dash_ring_json(&r, 997, 100);
  char *s = json_dumps(json_object_get(o, "t_s"), JSON_COMPACT);
  assert_string_equal(s, "[998,999,1000]");
  free(s);
  json_decref(o);
  o = gn__dash_ring_json(&r, 1000, 100);
  assert_int_equal(json_array_size(json_object_get(o, "t_s")), 0);
  json_decref(o);
  gn__dash_ring_done(&r);
}

static void test_dash_ring_refuses_zero_capacity(void **state) {
  (void)state;
  gn__dash_ring r;
  assert_int_equal(gn__dash_ring_init(&r, 0, 1), GN_EINVAL);
}

/* --- the token file ---------------------------------------------------------------*/

static void make_dir(char *dir, size_t cap) {
  snprintf(dir, cap, "/tmp/gn-test-dash-XXXXXX");
  assert_non_null(mkdtemp(dir));
}

static void remove_dir(const char *dir) {
  char p[256];
  snprintf(p, sizeof p, "%s/dashboard.token", dir);
  unlink(p);
  rmdir(dir);
}

static void test_dash_token_file_made_0600_then_reused(void **state) {
  (void)state;
  char dir[64], path[128], a[GN_DASH_TOKEN_HEX + 1], b[GN_DASH_TOKEN_HEX + 1];
  make_dir(dir, sizeof dir);
  bool created = false;
  assert_int_equal(gn__dash_token_load(dir, a, &created), 0);
  assert_true(created);
  assert_int_equal(strlen(a), GN_DASH_TOKEN_HEX);
  assert_int_equal(strspn(a, "0123456789abcdef"), GN_DASH_TOKEN_HEX);
  snprintf(path, sizeof path, "%s/dashboard.token", dir);
  struct stat st;
  assert_int_equal(stat(path, &st), 0);
  assert_int_equal(st.st_mode & 0777, 0600);
  assert_int_equal(gn__dash_token_load(dir, b, &created), 0);
  assert_false(created);
  assert_string_equal(a, b);
  /* No temporary file left behind. */
  snprintf(path, sizeof path, "%s/dashboard.token.tmp", dir);
  assert_int_equal(access(path, F_OK), -1);
  remove_dir(dir);
}

static void test_dash_token_file_with_garbage_is_refused_and_kept(void **state) {
  (void)state;
  char dir[64], path[128], tok[GN_DASH_TOKEN_HEX + 1], buf[64];
  make_dir(dir, sizeof dir);
  snprintf(path, sizeof path, "%s/dashboard.token", dir);
  int fd = open(path, O_WRONLY | O_CREAT | O_EXCL, 0600);
  assert_true(fd >= 0);
  assert_int_equal(write(fd, "not a token\n", 12), 12);
  close(fd);
  bool created = false;
  assert_int_equal(gn__dash_token_load(dir, tok, &created), GN_EPROTO);
  fd = open(path, O_RDONLY);
  assert_int_equal(read(fd, buf, sizeof buf), 12);
  close(fd);
  assert_memory_equal(buf, "not a token\n", 12);
  remove_dir(dir);
}

static void test_dash_token_file_readable_by_others_is_made_0600(void **state) {
  (void)state;
  char dir[64], path[128], tok[GN_DASH_TOKEN_HEX + 1];
  make_dir(dir, sizeof dir);
  snprintf(path, sizeof path, "%s/dashboard.token", dir);
  int fd = open(path, O_WRONLY | O_CREAT | O_EXCL, 0644);
  assert_true(fd >= 0);
  assert_int_equal(fchmod(fd, 0644), 0);
  assert_int_equal(write(fd, TOKEN, GN_DASH_TOKEN_HEX), GN_DASH_TOKEN_HEX);
  close(fd);
  bool created = true;
  assert_int_equal(gn__dash_token_load(dir, tok, &created), 0);
  assert_false(created);
  assert_string_equal(tok, TOKEN);
  struct stat st;
  assert_int_equal(stat(path, &st), 0);
  assert_int_equal(st.st_mode & 0777, 0600);
  remove_dir(dir);
}

/* --- a real server guarded by the dashboard's checks ---------------------------------*/

typedef struct srv {
  uv_loop_t loop;
  uv_async_t async;
  gn_ctl *ctl;
  pthread_t thread;
  atomic_int calls;
} srv;

static unsigned test_guard(const gn_ctl_req *r, void *ud, char *msg, size_t cap) {
  (void)ud;
  return gn__dash_check(gn_ctl_req_method(r), gn_ctl_req_path(r), gn_ctl_req_header(r, "Host"),
                        gn_ctl_req_header(r, "Authorization"), TOKEN, msg, cap);
}

static void on_status(gn_ctl_req *r, void *ud) {
  srv *s = ud;
  atomic_fetch_add(&s->calls, 1);
  gn_ctl_reply_json(r, 200, json_pack("{s:s}", "node_id", "gn-test"));
}

static void srv_on_async(uv_async_t *a) {
  srv *s = a->data;
  gn_ctl_close(s->ctl);
  s->ctl = NULL;
  uv_close((uv_handle_t *)&s->async, NULL);
}

static void *srv_main(void *arg) {
  srv *s = arg;
  uv_run(&s->loop, UV_RUN_DEFAULT);
  return NULL;
}

typedef struct answer {
  long status;
  bool csp, nosniff, cors;
} answer;

static size_t on_header(char *b, size_t size, size_t n, void *ud) {
  answer *a = ud;
  size_t len = size * n;
  if (len >= 24 && strncasecmp(b, "Content-Security-Policy:", 24) == 0)
    a->csp = true;
  if (len >= 31 && strncasecmp(b, "X-Content-Type-Options: nosniff", 31) == 0)
    a->nosniff = true;
  if (len >= 28 && strncasecmp(b, "Access-Control-Allow-Origin:", 28) == 0)
    a->cors = true;
  return len;
}

static size_t on_body(char *b, size_t size, size_t n, void *ud) {
  (void)b;
  (void)ud;
  return size * n;
}

static answer ask(int port, const char *method, const char *path, const char *host, const char *auth) {
  CURL *c = curl_easy_init();
  char url[128], hh[128], ah[128];
  snprintf(url, sizeof url, "http://127.0.0.1:%d%s", port, path);
  struct curl_slist *hdrs = NULL;
  if (host) {
    snprintf(hh, sizeof hh, "Host: %s", host);
    hdrs = curl_slist_append(hdrs, hh);
  }
  if (auth) {
    snprintf(ah, sizeof ah, "Authorization: %s", auth);
    hdrs = curl_slist_append(hdrs, ah);
  }
  answer a = {0};
  curl_easy_setopt(c, CURLOPT_URL, url);
  curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, method);
  curl_easy_setopt(c, CURLOPT_HTTPHEADER, hdrs);
  curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, on_header);
  curl_easy_setopt(c, CURLOPT_HEADERDATA, &a);
  curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_body);
  curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, 10000L);
  if (strcmp(method, "POST") == 0)
    curl_easy_setopt(c, CURLOPT_POSTFIELDS, "{}");
  if (curl_easy_perform(c) == CURLE_OK)
    curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &a.status);
  else
    a.status = -1;
  curl_slist_free_all(hdrs);
  curl_easy_cleanup(c);
  return a;
}

static void test_dash_server_refuses_before_the_handler_runs(void **state) {
  (void)state;
  srv s;
  memset(&s, 0, sizeof s);
  assert_int_equal(uv_loop_init(&s.loop), 0);
  assert_int_equal(uv_async_init(&s.loop, &s.async, srv_on_async), 0);
  s.async.data = &s;
  assert_int_equal(gn_ctl_new_tcp(&s.loop, "127.0.0.1", 0, &s.ctl), 0);
  assert_int_equal(gn_ctl_route(s.ctl, "GET", "/v1/status", on_status, &s), 0);
  assert_int_equal(gn_ctl_add_header(s.ctl, "Content-Security-Policy", "default-src 'self'"), 0);
  assert_int_equal(gn_ctl_add_header(s.ctl, "X-Content-Type-Options", "nosniff"), 0);
  gn_ctl_set_guard(s.ctl, test_guard, NULL);
  int port = gn_ctl_tcp_port(s.ctl);
  assert_true(port > 0);
  assert_int_equal(pthread_create(&s.thread, NULL, srv_main, &s), 0);
  char auth[128], host[64];
  snprintf(auth, sizeof auth, "Bearer %s", TOKEN);
  snprintf(host, sizeof host, "127.0.0.1:%d", port);

  answer a = ask(port, "GET", "/v1/status", NULL, NULL);
  assert_int_equal(a.status, 401);
  assert_true(a.csp && a.nosniff); /* refusals carry the headers too */
  assert_int_equal(ask(port, "GET", "/v1/status", NULL, "Bearer 0000").status, 401);
  assert_int_equal(ask(port, "GET", "/v1/status", "evil.example", auth).status, 421);
  assert_int_equal(ask(port, "POST", "/v1/status", NULL, auth).status, 405);
  assert_int_equal(ask(port, "DELETE", "/v1/status", NULL, auth).status, 405);
  assert_int_equal(atomic_load(&s.calls), 0); /* none of those reached the route */
  a = ask(port, "GET", "/v1/status", host, auth);
  assert_int_equal(a.status, 200);
  assert_true(a.csp && a.nosniff);
  assert_false(a.cors);
  assert_int_equal(atomic_load(&s.calls), 1);
  /* Past the guard, routing is as usual. */
  assert_int_equal(ask(port, "GET", "/v1/nothing", NULL, auth).status, 404);

  uv_async_send(&s.async);
  pthread_join(s.thread, NULL);
  assert_int_equal(uv_loop_close(&s.loop), 0);
}

static void on_nothing(gn_ctl_req *r, void *ud) {
  (void)ud;
  gn_ctl_reply_text(r, 200, NULL, "");
}

static void test_ctl_route_find_and_header_limit(void **state) {
  (void)state;
  uv_loop_t loop;
  assert_int_equal(uv_loop_init(&loop), 0);
  gn_ctl *c = NULL;
  assert_int_equal(gn_ctl_new_tcp(&loop, "127.0.0.1", 0, &c), 0);
  int marker = 0;
  assert_int_equal(gn_ctl_route(c, "GET", "/v1/leases/:id", on_nothing, &marker), 0);
  gn_ctl_handler fn = NULL;
  void *ud = NULL;
  assert_int_equal(gn_ctl_route_find(c, "GET", "/v1/leases/:id", &fn, &ud), 0);
  assert_ptr_equal(fn, on_nothing);
  assert_ptr_equal(ud, &marker);
  assert_int_equal(gn_ctl_route_find(c, "POST", "/v1/leases/:id", &fn, &ud), GN_ENOTFOUND);
  assert_int_equal(gn_ctl_route_find(c, "GET", "/v1/leases/x", &fn, &ud), GN_ENOTFOUND);
  for (int i = 0; i < 8; i++)
    assert_int_equal(gn_ctl_add_header(c, "X-Test", "1"), 0);
  assert_int_equal(gn_ctl_add_header(c, "X-Test", "1"), GN_ETOOBIG);
  gn_ctl_close(c);
  uv_run(&loop, UV_RUN_DEFAULT);
  assert_int_equal(uv_loop_close(&loop), 0);
}

int main(void) {
  curl_global_init(CURL_GLOBAL_DEFAULT);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_dash_token_accepts_only_the_exact_bearer_token),
      cmocka_unit_test(test_dash_host_accepts_loopback_names_only),
      cmocka_unit_test(test_dash_check_refuses_in_order),
      cmocka_unit_test(test_dash_ring_is_bounded_and_wraps),
      cmocka_unit_test(test_dash_ring_json_thins_and_keeps_the_newest),
      cmocka_unit_test(test_dash_ring_refuses_zero_capacity),
      cmocka_unit_test(test_dash_token_file_made_0600_then_reused),
      cmocka_unit_test(test_dash_token_file_with_garbage_is_refused_and_kept),
      cmocka_unit_test(test_dash_token_file_readable_by_others_is_made_0600),
      cmocka_unit_test(test_dash_server_refuses_before_the_handler_runs),
      cmocka_unit_test(test_ctl_route_find_and_header_limit),
  };
  int r = cmocka_run_group_tests(tests, NULL, NULL);
  curl_global_cleanup();
  return r;
}
