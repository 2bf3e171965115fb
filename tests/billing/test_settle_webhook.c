/* The webhook settlement driver against a real HTTP server: libmicrohttpd on
 * 127.0.0.1, an ephemeral port, started inside the test. It records every
 * request and answers from a script (500 then 200, 400, 429, a stall past the
 * client's timeout). Checked: the idempotency key is the same on every retry,
 * the body carries the voucher and the invoice, a crash (the SQLite file
 * closed and reopened between attempts) loses nothing, a 400 is not retried. */
#include "settle_fixture.h"
#include "settle_server.h"

#include <curl/curl.h>
#include <jansson.h>

#define NOW_MS 1764700000000ll
static gn_settle_driver *webhook(const server *s, uint32_t timeout_ms) {
  char url[128];
  snprintf(url, sizeof url, "http://127.0.0.1:%u/settle/gpunet", s->port);
  gn_settle_driver *d = NULL;
  assert_int_equal(gn_settle_webhook_new(url, timeout_ms, &d), 0);
  assert_string_equal(d->name, "webhook");
  assert_true(d->off_loop);
  return d;
}

typedef struct settled_lease {
  gn_buf inv, acc;
  gn_bill_head fin;
  char key[GN_SETTLE_KEY_STRLEN];
} settled_lease;

/* Queues the final settlement of lease a on the provider's side. */
static void enqueue(sf *f, settled_lease *sl, int64_t now_ms) {
  memset(sl, 0, sizeof *sl);
  sf_final(f, &f->a, NULL, 42, &sl->inv, &sl->acc, &sl->fin);
  json_t *exp = json_pack("{s:s, s:s}", "format", "gpunet-invoice/2", "note", "a stand-in export");
  gn_settle_final fi = sf_final_item(&f->a, GN_SETTLE_PROVIDER, &sl->inv, &sl->acc);
  fi.export_doc = exp;
  assert_int_equal(gn_settle_enqueue_final(f->prov, &fi, now_ms), 0);
  json_decref(exp);
  uint8_t h[32];
  char hex[65];
  gn_bill_hash(sl->inv.data, sl->inv.len, h);
  sodium_bin2hex(hex, sizeof hex, h, 32);
  snprintf(sl->key, sizeof sl->key, "%s-%s", f->a.lease_id, hex);
}

static void settled_lease_done(settled_lease *sl) {
  gn_buf_done(&sl->inv);
  gn_buf_done(&sl->acc);
}

static gn_settle_state state_of(sf *f) {
  gn_settle_status st;
  assert_int_equal(gn_settle_status_get(f->prov, f->a.lease_id, GN_SETTLE_PROVIDER, &st), 0);
  return st.state;
}

static void expect_b64(const json_t *o, const char *key, const gn_buf *want) {
  const char *s = json_string_value(json_object_get(o, key));
  assert_non_null(s);
  uint8_t *bin = malloc(want->len + 16);
  size_t len = 0;
  assert_int_equal(
      sodium_base642bin(bin, want->len + 16, s, strlen(s), NULL, &len, NULL, sodium_base64_VARIANT_ORIGINAL), 0);
  assert_int_equal(len, want->len);
  assert_memory_equal(bin, want->data, len);
  free(bin);
}

static void test_500_then_200_same_key_and_body(void **state) {
  sf *f = *state;
  server s;
  static const unsigned script[] = {500, 200};
  server_start(&s, script, 2);
  gn_settle_driver *d = webhook(&s, 5000);
  settled_lease sl;
  enqueue(f, &sl, NOW_MS);
  size_t n = 0;
  assert_int_equal(gn_settle_drain(f->prov, d, NOW_MS, 10, &n), 0);
  assert_int_equal(n, 1);
  assert_int_equal(server_count(&s), 1);
  assert_int_equal(state_of(f), GN_SETTLE_PENDING);
  /* Not again before the backoff (100 ms in these tests). */
  assert_int_equal(gn_settle_drain(f->prov, d, NOW_MS + 99, 10, &n), 0);
  assert_int_equal(server_count(&s), 1);
  assert_int_equal(gn_settle_drain(f->prov, d, NOW_MS + 100, 10, &n), 0);
  assert_int_equal(server_count(&s), 2);
  assert_int_equal(state_of(f), GN_SETTLE_SETTLED);
  /* Later drains send nothing. */
  assert_int_equal(gn_settle_drain(f->prov, d, NOW_MS + 10000000, 10, &n), 0);
  assert_int_equal(server_count(&s), 2);

  for (int i = 0; i < 2; i++) {
    assert_string_equal(s.reqs[i].method, "POST");
    assert_string_equal(s.reqs[i].url, "/settle/gpunet");
    assert_string_equal(s.reqs[i].key, sl.key);
    assert_string_equal(s.reqs[i].content_type, "application/json");
  }
  assert_int_equal(s.reqs[0].body_len, s.reqs[1].body_len);
  assert_memory_equal(s.reqs[0].body, s.reqs[1].body, s.reqs[0].body_len);
  json_error_t je;
  json_t *body = json_loads(s.reqs[1].body, 0, &je);
  assert_non_null(body);
  assert_string_equal(json_string_value(json_object_get(body, "format")), "gpunet-settlement/1");
  assert_string_equal(json_string_value(json_object_get(body, "key")), sl.key);
  assert_string_equal(json_string_value(json_object_get(body, "lease")), f->a.lease_id);
  assert_string_equal(json_string_value(json_object_get(body, "role")), "provider");
  assert_string_equal(json_string_value(json_object_get(body, "currency")), "EUR");
  assert_int_equal(json_integer_value(json_object_get(body, "amount_micro")), sl.fin.total_micro);
  assert_int_equal(json_integer_value(json_object_get(body, "amount_micro")), 42000);
  assert_int_equal(json_integer_value(json_object_get(body, "seconds")), 42);
  char pid[GN_NODE_ID_STRLEN], rid[GN_NODE_ID_STRLEN];
  gn_node_id_format(f->provider->pk, pid);
  gn_node_id_format(f->requester->pk, rid);
  assert_string_equal(json_string_value(json_object_get(body, "provider")), pid);
  assert_string_equal(json_string_value(json_object_get(body, "requester")), rid);
  expect_b64(body, "voucher", &sl.acc);
  expect_b64(body, "invoice", &sl.inv);
  assert_string_equal(json_string_value(json_object_get(json_object_get(body, "export"), "format")),
                      "gpunet-invoice/2");
  json_decref(body);
  gn_settle_driver_free(d);
  server_stop(&s);
  settled_lease_done(&sl);
}

static void test_crash_between_attempts_loses_nothing(void **state) {
  sf *f = *state;
  server s;
  static const unsigned script[] = {503, 200};
  server_start(&s, script, 2);
  gn_settle_driver *d = webhook(&s, 5000);
  settled_lease sl;
  enqueue(f, &sl, NOW_MS);
  /* A crash right after the enqueue's commit: the item is on disk. */
  sf_close_dbs(f);
  sf_open_dbs(f);
  gn_settle_set_backoff(f->prov, 100, 1000);
  size_t n = 0;
  assert_int_equal(gn_settle_drain(f->prov, d, NOW_MS, 10, &n), 0);
  assert_int_equal(server_count(&s), 1);
  /* Another crash, after the failed attempt was recorded. */
  sf_close_dbs(f);
  sf_open_dbs(f);
  gn_settle_set_backoff(f->prov, 100, 1000);
  assert_int_equal(state_of(f), GN_SETTLE_PENDING);
  int64_t due = 0;
  assert_int_equal(gn_settle_outbox_next_due(f->prov, &due), 0);
  assert_int_equal(due, NOW_MS + 100); /* the schedule survived too */
  assert_int_equal(gn_settle_drain(f->prov, d, due, 10, &n), 0);
  assert_int_equal(server_count(&s), 2);
  assert_int_equal(state_of(f), GN_SETTLE_SETTLED);
  assert_string_equal(s.reqs[0].key, sl.key);
  assert_string_equal(s.reqs[1].key, sl.key);
  assert_int_equal(s.reqs[0].body_len, s.reqs[1].body_len);
  assert_memory_equal(s.reqs[0].body, s.reqs[1].body, s.reqs[0].body_len);
  gn_settle_driver_free(d);
  server_stop(&s);
  settled_lease_done(&sl);
}

static void test_crash_after_delivery_resends_same_key(void **state) {
  sf *f = *state;
  server s;
  static const unsigned script[] = {200};
  server_start(&s, script, 1);
  gn_settle_driver *d = webhook(&s, 5000);
  settled_lease sl;
  enqueue(f, &sl, NOW_MS);
  /* The server took it, then the node died before recording the outcome. */
  gn_settle_item it;
  gn_settle_outcome o;
  memset(&o, 0, sizeof o);
  assert_int_equal(gn_settle_outbox_next(f->prov, NOW_MS, &it), 0);
  assert_int_equal(d->submit(d, &it, &o), 0);
  gn_settle_item_done(&it);
  sf_close_dbs(f);
  sf_open_dbs(f);
  assert_int_equal(state_of(f), GN_SETTLE_PENDING);
  size_t n = 0;
  assert_int_equal(gn_settle_drain(f->prov, d, NOW_MS, 10, &n), 0);
  assert_int_equal(state_of(f), GN_SETTLE_SETTLED);
  /* Delivered twice, under one key: the server de-duplicates by it. */
  assert_int_equal(server_count(&s), 2);
  assert_string_equal(s.reqs[0].key, s.reqs[1].key);
  gn_settle_driver_free(d);
  server_stop(&s);
  settled_lease_done(&sl);
}

static void test_400_is_not_retried(void **state) {
  sf *f = *state;
  server s;
  static const unsigned script[] = {400};
  server_start(&s, script, 1);
  s.answer_body = "{\"error\":\"unknown lease\"}\n";
  gn_settle_driver *d = webhook(&s, 5000);
  settled_lease sl;
  enqueue(f, &sl, NOW_MS);
  size_t n = 0;
  assert_int_equal(gn_settle_drain(f->prov, d, NOW_MS, 10, &n), 0);
  assert_int_equal(gn_settle_drain(f->prov, d, NOW_MS + 86400000, 10, &n), 0);
  assert_int_equal(n, 0);
  assert_int_equal(server_count(&s), 1);
  gn_settle_status st;
  assert_int_equal(gn_settle_status_get(f->prov, f->a.lease_id, GN_SETTLE_PROVIDER, &st), 0);
  assert_int_equal(st.state, GN_SETTLE_FAILED);
  assert_non_null(strstr(st.reason, "400"));
  assert_non_null(strstr(st.reason, "unknown lease"));
  assert_null(strchr(st.reason, '\n'));        /* the server's bytes made printable */
  assert_null(strstr(st.reason, "127.0.0.1")); /* no URL in reasons */
  gn_settle_driver_free(d);
  server_stop(&s);
  settled_lease_done(&sl);
}

static void test_408_and_429_are_retried(void **state) {
  sf *f = *state;
  server s;
  static const unsigned script[] = {429, 408, 302, 200};
  server_start(&s, script, 4);
  gn_settle_driver *d = webhook(&s, 5000);
  settled_lease sl;
  enqueue(f, &sl, NOW_MS);
  size_t n = 0;
  assert_int_equal(gn_settle_drain(f->prov, d, NOW_MS, 10, &n), 0);
  assert_int_equal(state_of(f), GN_SETTLE_PENDING);
  assert_int_equal(gn_settle_drain(f->prov, d, NOW_MS + 100, 10, &n), 0);
  assert_int_equal(state_of(f), GN_SETTLE_PENDING);
  /* A redirect is not followed and not retried. */
  assert_int_equal(gn_settle_drain(f->prov, d, NOW_MS + 300, 10, &n), 0);
  assert_int_equal(server_count(&s), 3);
  assert_int_equal(state_of(f), GN_SETTLE_FAILED);
  gn_settle_driver_free(d);
  server_stop(&s);
  settled_lease_done(&sl);
}

static void test_stalled_server_times_out_and_is_retried(void **state) {
  sf *f = *state;
  server s;
  static const unsigned script[] = {0, 200}; /* 0: stall */
  server_start(&s, script, 2);
  s.stall_ms = 2000;
  gn_settle_driver *d = webhook(&s, 300);
  settled_lease sl;
  enqueue(f, &sl, NOW_MS);
  uint64_t t0 = gn_mono_ms();
  gn_settle_item it;
  gn_settle_outcome o;
  memset(&o, 0, sizeof o);
  assert_int_equal(gn_settle_outbox_next(f->prov, NOW_MS, &it), 0);
  assert_int_equal(d->submit(d, &it, &o), GN_ETIMEDOUT);
  uint64_t took = gn_mono_ms() - t0;
  assert_true(took >= 250 && took < 1500);
  assert_true(o.retry);
  assert_int_equal(gn_settle_outbox_finish(f->prov, it.id, GN_ETIMEDOUT, &o, d->name, NOW_MS), 0);
  gn_settle_item_done(&it);
  size_t n = 0;
  assert_int_equal(gn_settle_drain(f->prov, d, NOW_MS + 100, 10, &n), 0);
  assert_int_equal(state_of(f), GN_SETTLE_SETTLED);
  assert_int_equal(server_count(&s), 2);
  assert_string_equal(s.reqs[0].key, s.reqs[1].key);
  gn_settle_driver_free(d);
  server_stop(&s); /* waits for the stalled handler */
  settled_lease_done(&sl);
}

static void *cancel_later(void *ud) {
  usleep(200 * 1000);
  gn_settle_driver *d = ud;
  d->cancel(d);
  return NULL;
}

static void test_cancel_stops_a_request_in_flight(void **state) {
  sf *f = *state;
  server s;
  static const unsigned script[] = {0};
  server_start(&s, script, 1);
  s.stall_ms = 3000;
  gn_settle_driver *d = webhook(&s, 10000);
  settled_lease sl;
  enqueue(f, &sl, NOW_MS);
  gn_settle_item it;
  gn_settle_outcome o;
  memset(&o, 0, sizeof o);
  assert_int_equal(gn_settle_outbox_next(f->prov, NOW_MS, &it), 0);
  pthread_t th;
  uint64_t t0 = gn_mono_ms();
  assert_int_equal(pthread_create(&th, NULL, cancel_later, d), 0);
  /* The daemon's shutdown: the request stops long before its timeout. */
  assert_int_equal(d->submit(d, &it, &o), GN_ECANCELED);
  uint64_t took = gn_mono_ms() - t0;
  pthread_join(th, NULL);
  assert_true(took < 2000);
  assert_true(o.retry);
  assert_int_equal(gn_settle_outbox_finish(f->prov, it.id, GN_ECANCELED, &o, d->name, NOW_MS), 0);
  gn_settle_item_done(&it);
  assert_int_equal(state_of(f), GN_SETTLE_PENDING); /* still queued */
  gn_settle_driver_free(d);
  server_stop(&s);
  settled_lease_done(&sl);
}

static void test_connection_refused_is_retried(void **state) {
  sf *f = *state;
  /* A port that was just free: nobody listens. */
  server s;
  static const unsigned script[] = {200};
  server_start(&s, script, 1);
  uint16_t port = s.port;
  server_stop(&s);
  char url[64];
  snprintf(url, sizeof url, "http://127.0.0.1:%u/", port);
  gn_settle_driver *d = NULL;
  assert_int_equal(gn_settle_webhook_new(url, 2000, &d), 0);
  settled_lease sl;
  enqueue(f, &sl, NOW_MS);
  gn_settle_item it;
  gn_settle_outcome o;
  memset(&o, 0, sizeof o);
  assert_int_equal(gn_settle_outbox_next(f->prov, NOW_MS, &it), 0);
  assert_int_equal(d->submit(d, &it, &o), GN_EIO);
  assert_true(o.retry);
  assert_int_equal(o.http_status, 0);
  gn_settle_item_done(&it);
  size_t n = 0;
  assert_int_equal(gn_settle_drain(f->prov, d, NOW_MS, 10, &n), 0);
  assert_int_equal(state_of(f), GN_SETTLE_PENDING);
  gn_settle_driver_free(d);
  settled_lease_done(&sl);
}

static void test_url_must_be_http(void **state) {
  (void)state;
  static const struct {
    const char *url;
    int want;
  } cases[] = {
      {"http://127.0.0.1:8080/settle", 0},
      {"https://billing.example/gpunet?x=1", 0},
      {"HTTPS://billing.example/", 0},
      {"http://user:secret@billing.example/", 0},
      {"ftp://billing.example/", GN_EINVAL},
      {"file:///etc/passwd", GN_EINVAL},
      {"gopher://billing.example/", GN_EINVAL},
      {"billing.example/settle", GN_EINVAL},
      {"http://", GN_EINVAL},
      {"http:///path", GN_EINVAL},
      {"http://bill ing.example/", GN_EINVAL},
      {"http://billing.example/\r\nX-Injected: 1", GN_EINVAL},
      {"", GN_EINVAL},
  };
  for (size_t i = 0; i < GN_ARRAY_SIZE(cases); i++) {
    int r = gn_settle_url_check(cases[i].url);
    if (r != cases[i].want)
      fail_msg("%s: %d, want %d", cases[i].url, r, cases[i].want);
  }
  char long_url[1100];
  memset(long_url, 'a', sizeof long_url - 1);
  long_url[sizeof long_url - 1] = '\0';
  memcpy(long_url, "http://", 7);
  assert_int_equal(gn_settle_url_check(long_url), GN_EINVAL);
  gn_settle_driver *d = (gn_settle_driver *)0x1;
  assert_int_equal(gn_settle_webhook_new("ftp://x/", 0, &d), GN_EINVAL);
  assert_ptr_equal(d, (gn_settle_driver *)0x1);
  assert_int_equal(gn_settle_webhook_new(NULL, 0, &d), GN_EINVAL);
}

int main(void) {
  curl_global_init(CURL_GLOBAL_DEFAULT);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_500_then_200_same_key_and_body, sf_setup, sf_teardown),
      cmocka_unit_test_setup_teardown(test_crash_between_attempts_loses_nothing, sf_setup, sf_teardown),
      cmocka_unit_test_setup_teardown(test_crash_after_delivery_resends_same_key, sf_setup, sf_teardown),
      cmocka_unit_test_setup_teardown(test_400_is_not_retried, sf_setup, sf_teardown),
      cmocka_unit_test_setup_teardown(test_408_and_429_are_retried, sf_setup, sf_teardown),
      cmocka_unit_test_setup_teardown(test_stalled_server_times_out_and_is_retried, sf_setup, sf_teardown),
      cmocka_unit_test_setup_teardown(test_cancel_stops_a_request_in_flight, sf_setup, sf_teardown),
      cmocka_unit_test_setup_teardown(test_connection_refused_is_retried, sf_setup, sf_teardown),
      cmocka_unit_test(test_url_must_be_http),
  };
  int r = cmocka_run_group_tests(tests, NULL, NULL);
  curl_global_cleanup();
  return r;
}
