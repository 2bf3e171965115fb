/* Tests of the offer filter language: parse errors and matching, table-driven. */
#include <gpunet/filter.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>

#include <cmocka.h>

static gn_offer offer(const char *model, uint32_t vram_mib, uint64_t price, uint32_t free_gpus, bool simulated) {
  gn_offer o;
  memset(&o, 0, sizeof(o));
  snprintf(o.gpu_model, sizeof(o.gpu_model), "%s", model);
  o.vram_mib = vram_mib;
  o.price_uper_hour = price;
  o.gpus_free = free_gpus;
  o.gpus_total = free_gpus;
  o.simulated = simulated;
  snprintf(o.currency, sizeof(o.currency), "EUR");
  return o;
}

static void test_filter_matches_table(void **state) {
  (void)state;
  gn_offer o4090 = offer("NVIDIA GeForce RTX 4090", 24564, 400000, 2, false);
  gn_offer o3090 = offer("NVIDIA GeForce RTX 3090", 24576, 250000, 1, false);
  gn_offer oh100 = offer("NVIDIA H100 80GB HBM3", 81559, 2500000, 8, true);
  o3090.unenforced_limits = true; /* what its signed offer says */
  oh100.no_userns = true;
  o4090.training = true; /* takes ranks of training jobs, on these UDP ports */
  o4090.jobnet_port_lo = 51820;
  o4090.jobnet_port_hi = 51899;
  static const struct {
    const char *filter;
    bool m4090, m3090, mh100;
  } cases[] = {
      {"", true, true, true},
      {"   ,, ", true, true, true},
      {"gpu=rtx4090", true, false, false},
      {"gpu=RTX 4090", true, false, false}, /* a bare word continues the gpu model */
      {"gpu=GeForce RTX 3090 count=1", false, true, false},
      {"gpu=NVIDIA GeForce RTX 4090", true, false, false},
      {"gpu=4090", true, false, false},
      {"gpu=rtx-4090", true, false, false},
      {"gpu=NVIDIA_GeForce_RTX_4090", true, false, false},
      {"gpu=geforce-rtx4090", true, false, false},
      {"gpu=rtx", true, true, false},
      {"gpu!=4090", false, true, true},
      {"gpu==h100", false, false, true},
      {"vram>=24", true, true, true},
      {"vram=24", true, true, false},
      {"vram>24", false, false, true},
      {"vram<=24GB", true, true, false},
      {"vram=80g", false, false, true},
      {"price<=0.40", true, true, false},
      {"price<0.4", false, true, false},
      {"price>=2.5", false, false, true},
      {"price=0.25", false, true, false},
      {"price=1", false, false, false},
      {"count>=2", true, false, true},
      {"count=1", false, true, false},
      {"count!=1", true, false, true},
      {"simulated=false", true, true, false},
      {"simulated=true", false, false, true},
      {"simulated!=true", true, true, false},
      {"gpu=rtx4090 vram>=24 price<=0.50 count>=2 simulated=false", true, false, false},
      {"gpu=rtx,price<=0.30", false, true, false},
      {"confined=true", true, false, false},
      {"confined=false", false, true, true},
      {"confined!=false", true, false, false},
      {"Confined=yes gpu=rtx", true, false, false},
      {"confined=0 simulated=false", false, true, false},
      {"GPU=4090", true, false, false},
      {"training=true", true, false, false},
      {"training=false", false, true, true},
      {"training!=true", false, true, true},
      {"Training=YES vram>=24", true, false, false},
      {"training=1 gpu=3090", false, false, false},
      {"training=no confined=false", false, true, true},
  };
  for (size_t i = 0; i < GN_ARRAY_SIZE(cases); i++) {
    gn_filter f;
    char err[256] = "";
    int r = gn_filter_parse(cases[i].filter, &f, err, sizeof(err));
    if (r != 0)
      fail_msg("filter '%s' did not parse: %s", cases[i].filter, err);
    bool got[3] = {gn_filter_match(&f, &o4090), gn_filter_match(&f, &o3090), gn_filter_match(&f, &oh100)};
    bool want[3] = {cases[i].m4090, cases[i].m3090, cases[i].mh100};
    for (int k = 0; k < 3; k++)
      if (got[k] != want[k])
        fail_msg("filter '%s' offer %d: got %d want %d", cases[i].filter, k, got[k], want[k]);
  }
}

static void test_filter_rejects_bad_input_table(void **state) {
  (void)state;
  static const struct {
    const char *filter;
    int code;
    const char *msg; /* must appear in the error */
  } cases[] = {
      {"vrm>=24", GN_EINVAL,
       "unknown filter key 'vrm' (known: gpu, vram, price, count, simulated, confined, training)"},
      {"vram24", GN_EINVAL, "bad filter term 'vram24'"},
      {"count>=1 4090", GN_EINVAL, "bad filter term '4090'"},
      {">=24", GN_EINVAL, "bad filter term"},
      {"vram>=", GN_EINVAL, "has no value"},
      {"vram>=2x", GN_EINVAL, "bad number '2x' for vram"},
      {"count>=-1", GN_EINVAL, "bad number"},
      {"count>=99999999999999999999", GN_EINVAL, "bad number"},
      {"price<=0.1234567", GN_EINVAL, "bad price"},
      {"price<=abc", GN_EINVAL, "bad price"},
      {"price<=.", GN_EINVAL, "bad price"},
      {"price<=.5", GN_EINVAL, "bad price"},
      {"gpu>4090", GN_EINVAL, "operator '>' does not apply to gpu"},
      {"simulated<=true", GN_EINVAL, "does not apply to simulated"},
      {"simulated=maybe", GN_EINVAL, "simulated must be true or false"},
      {"confined>=1", GN_EINVAL, "operator '>=' does not apply to confined"},
      {"confined=sandboxed", GN_EINVAL, "confined must be true or false, not 'sandboxed'"},
      {"training<1", GN_EINVAL, "operator '<' does not apply to training"},
      {"training=maybe", GN_EINVAL, "training must be true or false, not 'maybe'"},
      {"training=", GN_EINVAL, "has no value"},
      {"gpu=nvidia", GN_EINVAL, "names no model"},
      {"gpu=rtx4090aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa", GN_ETOOBIG, "too long"},
      {"count=1 count=1 count=1 count=1 count=1 count=1 count=1 count=1 count=1 count=1 count=1 count=1 "
       "count=1 count=1 count=1 count=1 count=1",
       GN_ETOOBIG, "too many filter terms (at most 16)"},
  };
  for (size_t i = 0; i < GN_ARRAY_SIZE(cases); i++) {
    gn_filter f;
    memset(&f, 0xab, sizeof(f));
    gn_filter before = f;
    char err[256] = "";
    int r = gn_filter_parse(cases[i].filter, &f, err, sizeof(err));
    if (r != cases[i].code)
      fail_msg("filter '%s': got %d want %d (%s)", cases[i].filter, r, cases[i].code, err);
    if (!strstr(err, cases[i].msg))
      fail_msg("filter '%s': error '%s' lacks '%s'", cases[i].filter, err, cases[i].msg);
    assert_memory_equal(&f, &before, sizeof(f)); /* ret untouched on failure */
  }
}

static void test_filter_rejects_overlong_input(void **state) {
  (void)state;
  char s[GN_FILTER_MAX_LEN + 2];
  memset(s, ' ', sizeof(s) - 1);
  s[sizeof(s) - 1] = '\0';
  gn_filter f;
  char err[128];
  assert_int_equal(gn_filter_parse(s, &f, err, sizeof(err)), GN_ETOOBIG);
  s[GN_FILTER_MAX_LEN] = '\0'; /* exactly at the limit: fine */
  assert_int_equal(gn_filter_parse(s, &f, err, sizeof(err)), 0);
  assert_int_equal(f.count, 0);
}

static void test_filter_sixteen_terms_is_the_limit(void **state) {
  (void)state;
  char s[512] = "";
  for (int i = 0; i < GN_FILTER_MAX_TERMS; i++)
    strcat(s, "count>=0 ");
  gn_filter f;
  char err[128];
  assert_int_equal(gn_filter_parse(s, &f, err, sizeof(err)), 0);
  assert_int_equal(f.count, GN_FILTER_MAX_TERMS);
}

static void test_filter_vram_rounds_to_nearest_gib(void **state) {
  (void)state;
  gn_filter f;
  char err[128];
  assert_int_equal(gn_filter_parse("vram=24", &f, err, sizeof(err)), 0);
  static const struct {
    uint32_t mib;
    bool match;
  } cases[] = {{24564, true}, {24576, true}, {24063, false}, {24064, true}, {25087, true}, {25088, false}};
  for (size_t i = 0; i < GN_ARRAY_SIZE(cases); i++) {
    gn_offer o = offer("RTX", cases[i].mib, 0, 1, false);
    if (gn_filter_match(&f, &o) != cases[i].match)
      fail_msg("vram=24 on %u MiB: want %d", cases[i].mib, cases[i].match);
  }
}

static void test_filter_unterminated_model_is_safe(void **state) {
  (void)state;
  gn_offer o = offer("", 0, 0, 1, false);
  memset(o.gpu_model, 'a', sizeof(o.gpu_model)); /* no NUL, as a hostile decode might leave it */
  gn_filter f;
  char err[128];
  assert_int_equal(gn_filter_parse("gpu=aaaa", &f, err, sizeof(err)), 0);
  assert_true(gn_filter_match(&f, &o));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_filter_matches_table),
      cmocka_unit_test(test_filter_rejects_bad_input_table),
      cmocka_unit_test(test_filter_rejects_overlong_input),
      cmocka_unit_test(test_filter_sixteen_terms_is_the_limit),
      cmocka_unit_test(test_filter_vram_rounds_to_nearest_gib),
      cmocka_unit_test(test_filter_unterminated_model_is_safe),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
