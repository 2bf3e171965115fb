/* Tests of lease requests and agreements: round trips, forged signatures on
 * either envelope, swapped signers, and term validation. */
#include "billing/fixture.h"

/* Re-seals the body of a valid envelope under another identity and type. */
static void reseal(const gn_buf *env, const gn_identity *id, uint32_t type, gn_buf *ret) {
  gn_envelope e;
  assert_int_equal(gn_envelope_open(env->data, env->len, &e), 0);
  assert_int_equal(gn_envelope_seal(id, type, e.body, e.body_len, ret), 0);
}

/* An agreement body built by hand, so a test can embed any request bytes. */
static void agreement_at(const gn_identity *signer, const uint8_t *req, size_t req_len, uint32_t ngpus, int64_t start_s,
                         gn_buf *ret) {
  gn_wire_writer w;
  gn_buf body = {0};
  gn_wire_writer_init(&w);
  gn_wire_put_map(&w, 3);
  gn_wire_put_str(&w, "request");
  gn_wire_put_bin(&w, req, req_len);
  gn_wire_put_str(&w, "start_s");
  gn_wire_put_i64(&w, start_s);
  gn_wire_put_str(&w, "gpus");
  gn_wire_put_array(&w, ngpus);
  for (uint32_t i = 0; i < ngpus; i++)
    gn_wire_put_str(&w, fx_gpus[i]);
  assert_int_equal(gn_wire_writer_take(&w, &body), 0);
  gn_wire_writer_done(&w);
  assert_int_equal(gn_envelope_seal(signer, GN_MSG_LEASE_ACCEPT, body.data, body.len, ret), 0);
  gn_buf_done(&body);
}

static void agreement_by_hand(const gn_identity *signer, const uint8_t *req, size_t req_len, uint32_t ngpus,
                              gn_buf *ret) {
  agreement_at(signer, req, req_len, ngpus, FX_START_S, ret);
}

static void test_agreement_round_trip(void **state) {
  fixture *f = *state;
  gn_lease_terms t;
  gn_agreement ag;
  assert_int_equal(gn_lease_request_open(f->request.data, f->request.len, &t), 0);
  assert_memory_equal(&t, &f->terms, sizeof(t));
  assert_int_equal(gn_agreement_open(f->agreement.data, f->agreement.len, &ag), 0);
  assert_memory_equal(&ag.terms, &f->terms, sizeof(t));
  assert_int_equal(ag.start_s, FX_START_S);
  assert_int_equal(ag.gpu_count, 1);
  assert_string_equal(ag.gpus[0], fx_gpus[0]);
  assert_string_equal(ag.terms.currency, "EUR");
  assert_true(ag.terms.simulated);
}

static void test_agreement_terms_init_is_fresh(void **state) {
  (void)state;
  gn_lease_terms a, b;
  memset(&a, 0, sizeof(a));
  memset(&b, 0, sizeof(b));
  gn_lease_terms_init(&a);
  gn_lease_terms_init(&b);
  assert_int_equal(strlen(a.lease_id), 18);
  assert_memory_equal(a.lease_id, "l-", 2);
  assert_string_not_equal(a.lease_id, b.lease_id);
  assert_memory_not_equal(a.nonce, b.nonce, sizeof(a.nonce));
}

static void test_agreement_rejects_forged_outer_signature(void **state) {
  fixture *f = *state;
  gn_agreement ag;
  char reason[256];
  f->agreement.data[f->agreement.len - 1] ^= 0x01;
  assert_int_equal(gn_agreement_open(f->agreement.data, f->agreement.len, &ag), GN_ESIG);
  assert_int_equal(gn__agreement_open(f->agreement.data, f->agreement.len, &ag, reason, sizeof(reason)), GN_ESIG);
  char id[GN_NODE_ID_STRLEN];
  gn_node_id_format(f->provider->pk, id);
  assert_non_null(strstr(reason, "agreement signature does not verify against provider"));
  assert_non_null(strstr(reason, id));
}

static void test_agreement_rejects_forged_inner_signature(void **state) {
  fixture *f = *state;
  gn_agreement ag;
  gn_buf forged = {0};
  char reason[256];
  /* The provider honestly signs an agreement around a request whose own
   * signature was tampered with: the requester never agreed. */
  f->request.data[f->request.len - 5] ^= 0x40;
  assert_int_equal(gn_agreement_seal(f->provider, f->request.data, f->request.len, FX_START_S, fx_gpus, 1, &forged),
                   GN_ESIG);
  agreement_by_hand(f->provider, f->request.data, f->request.len, 1, &forged);
  assert_int_equal(gn_agreement_open(forged.data, forged.len, &ag), GN_ESIG);
  assert_int_equal(gn__agreement_open(forged.data, forged.len, &ag, reason, sizeof(reason)), GN_ESIG);
  assert_non_null(strstr(reason, "lease request signature does not verify against requester"));
  gn_buf_done(&forged);
}

/* The provider may not sign a request on the requester's behalf, nor anyone
 * but the named provider accept one. */
static void test_agreement_rejects_swapped_signers(void **state) {
  fixture *f = *state;
  gn_agreement ag;
  gn_lease_terms t;
  gn_buf req = {0}, ag_env = {0}, outer = {0};
  assert_int_equal(gn_lease_request_seal(f->provider, &f->terms, &req), GN_EPERM);
  /* Request re-signed by the provider (valid signature, wrong signer). */
  reseal(&f->request, f->provider, GN_MSG_LEASE_REQUEST, &req);
  assert_int_equal(gn_lease_request_open(req.data, req.len, &t), GN_EPERM);
  agreement_by_hand(f->provider, req.data, req.len, 1, &ag_env);
  assert_int_equal(gn_agreement_open(ag_env.data, ag_env.len, &ag), GN_EPERM);
  /* Acceptance signed by the requester, or by a third party. */
  assert_int_equal(gn_agreement_seal(f->other, f->request.data, f->request.len, FX_START_S, fx_gpus, 1, &outer),
                   GN_EPERM);
  reseal(&f->agreement, f->requester, GN_MSG_LEASE_ACCEPT, &outer);
  assert_int_equal(gn_agreement_open(outer.data, outer.len, &ag), GN_EPERM);
  gn_buf_done(&outer);
  reseal(&f->agreement, f->other, GN_MSG_LEASE_ACCEPT, &outer);
  char reason[256];
  assert_int_equal(gn__agreement_open(outer.data, outer.len, &ag, reason, sizeof(reason)), GN_EPERM);
  assert_non_null(strstr(reason, "not by the provider named in the terms"));
  gn_buf_done(&req);
  gn_buf_done(&ag_env);
  gn_buf_done(&outer);
}

static void test_agreement_rejects_wrong_types(void **state) {
  fixture *f = *state;
  gn_agreement ag;
  gn_lease_terms t;
  gn_buf env = {0};
  assert_int_equal(gn_agreement_open(f->request.data, f->request.len, &ag), GN_EPROTO);
  assert_int_equal(gn_lease_request_open(f->agreement.data, f->agreement.len, &t), GN_EPROTO);
  reseal(&f->agreement, f->provider, GN_MSG_INVOICE, &env);
  assert_int_equal(gn_agreement_open(env.data, env.len, &ag), GN_EPROTO);
  gn_buf_done(&env);
}

static void test_agreement_requires_the_requested_gpu_count(void **state) {
  fixture *f = *state;
  gn_agreement ag;
  gn_buf env = {0};
  assert_int_equal(gn_agreement_seal(f->provider, f->request.data, f->request.len, FX_START_S, fx_gpus, 2, &env),
                   GN_EINVAL);
  assert_int_equal(gn_agreement_seal(f->provider, f->request.data, f->request.len, FX_START_S, fx_gpus, 0, &env),
                   GN_EINVAL);
  agreement_by_hand(f->provider, f->request.data, f->request.len, 2, &env);
  assert_int_equal(gn_agreement_open(env.data, env.len, &ag), GN_EINVAL);
  gn_buf_done(&env);
  /* A start time that would overflow t_s arithmetic later. */
  assert_int_equal(gn_agreement_seal(f->provider, f->request.data, f->request.len, INT64_MAX, fx_gpus, 1, &env),
                   GN_EINVAL);
  assert_int_equal(gn_agreement_seal(f->provider, f->request.data, f->request.len, -1, fx_gpus, 1, &env), GN_EINVAL);
  agreement_at(f->provider, f->request.data, f->request.len, 1, INT64_MAX, &env);
  assert_int_equal(gn_agreement_open(env.data, env.len, &ag), GN_EINVAL);
  gn_buf_done(&env);
  const char *bad[] = {"GPU-1\n"};
  gn_lease_terms t;
  gn_buf req = {0};
  fx_terms(f, &t, 1, 1, 10);
  fx_agree(f, &t, &req, &env);
  gn_buf_done(&env);
  assert_int_equal(gn_agreement_seal(f->provider, req.data, req.len, FX_START_S, bad, 1, &env), GN_EINVAL);
  gn_buf_done(&req);
  gn_buf_done(&env);
}

typedef struct terms_case {
  const char *name;
  void (*mutate)(gn_lease_terms *t);
} terms_case;

static void m_count0(gn_lease_terms *t) {
  t->count = 0;
}
static void m_count17(gn_lease_terms *t) {
  t->count = GN_LEASE_MAX_GPUS + 1;
}
static void m_max0(gn_lease_terms *t) {
  t->max_s = 0;
}
static void m_max_over(gn_lease_terms *t) {
  t->max_s = GN_INVOICE_MAX_S + 1;
}
static void m_currency_lower(gn_lease_terms *t) {
  snprintf(t->currency, sizeof(t->currency), "eur");
}
static void m_currency_empty(gn_lease_terms *t) {
  t->currency[0] = 0;
}
static void m_lease_id_slash(gn_lease_terms *t) {
  snprintf(t->lease_id, sizeof(t->lease_id), "l-../x");
}
static void m_lease_id_empty(gn_lease_terms *t) {
  t->lease_id[0] = 0;
}
static void m_model_empty(gn_lease_terms *t) {
  t->gpu_model[0] = 0;
}
static void m_model_ctrl(gn_lease_terms *t) {
  t->gpu_model[0] = '\x1b';
}
static void m_model_unterminated(gn_lease_terms *t) {
  memset(t->gpu_model, 'A', sizeof(t->gpu_model));
}

static void test_agreement_request_validates_terms(void **state) {
  fixture *f = *state;
  static const terms_case cases[] = {
      {"count 0", m_count0},
      {"count 17", m_count17},
      {"max_s 0", m_max0},
      {"max_s over 7 days", m_max_over},
      {"lowercase currency", m_currency_lower},
      {"empty currency", m_currency_empty},
      {"lease id with slash", m_lease_id_slash},
      {"empty lease id", m_lease_id_empty},
      {"empty model", m_model_empty},
      {"control char in model", m_model_ctrl},
      {"unterminated model", m_model_unterminated},
  };
  for (size_t i = 0; i < GN_ARRAY_SIZE(cases); i++) {
    gn_lease_terms t = f->terms;
    gn_buf env = {0};
    cases[i].mutate(&t);
    int rc = gn_lease_request_seal(f->requester, &t, &env);
    if (rc != GN_EINVAL)
      fail_msg("%s: seal returned %d, want GN_EINVAL", cases[i].name, rc);
    gn_buf_done(&env);
  }
}

static void test_agreement_rejects_truncation_and_garbage(void **state) {
  fixture *f = *state;
  gn_agreement ag;
  for (size_t n = 0; n < f->agreement.len; n += 7)
    assert_int_not_equal(gn_agreement_open(f->agreement.data, n, &ag), 0);
  static const uint8_t junk[] = {0x95, 0x01, 0x0b, 0xc4, 0x20};
  assert_int_not_equal(gn_agreement_open(junk, sizeof(junk), &ag), 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_agreement_round_trip, fx_setup, fx_teardown),
      cmocka_unit_test(test_agreement_terms_init_is_fresh),
      cmocka_unit_test_setup_teardown(test_agreement_rejects_forged_outer_signature, fx_setup, fx_teardown),
      cmocka_unit_test_setup_teardown(test_agreement_rejects_forged_inner_signature, fx_setup, fx_teardown),
      cmocka_unit_test_setup_teardown(test_agreement_rejects_swapped_signers, fx_setup, fx_teardown),
      cmocka_unit_test_setup_teardown(test_agreement_rejects_wrong_types, fx_setup, fx_teardown),
      cmocka_unit_test_setup_teardown(test_agreement_requires_the_requested_gpu_count, fx_setup, fx_teardown),
      cmocka_unit_test_setup_teardown(test_agreement_request_validates_terms, fx_setup, fx_teardown),
      cmocka_unit_test_setup_teardown(test_agreement_rejects_truncation_and_garbage, fx_setup, fx_teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
