/* Tests of the GPU inventory: simulated GPUs, no NVML at all, and "real" GPUs
 * read through a fake libnvidia-ml (tests/node/nvml_shim.c) that lacks some
 * symbols and fails some queries. */
#include <gpunet/billing.h>
#include <gpunet/node.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>

#include <cmocka.h>

static int no_nvml(void **state) {
  (void)state;
  setenv("GN_NVML_LIB", "/nonexistent/libnvidia-ml.so.1", 1);
  return 0;
}

static int done(void **state) {
  (void)state;
  gn_gpu_shutdown();
  return 0;
}

static void test_gpu_simulated_list(void **state) {
  (void)state;
  const char *sim[] = {"RTX 4090", "rtx4090", "4090", "H200", "nvidia geforce rtx-3090", "A100"};
  gn_gpu_list l;
  assert_int_equal(gn_gpu_discover(sim, GN_ARRAY_SIZE(sim), &l), 0);
  assert_int_equal(l.count, GN_ARRAY_SIZE(sim));
  for (size_t i = 0; i < 3; i++) {
    assert_string_equal(l.items[i].name, "NVIDIA GeForce RTX 4090");
    assert_int_equal(l.items[i].memory_mib, 24564);
  }
  assert_string_equal(l.items[3].name, "NVIDIA H200");
  assert_int_equal(l.items[3].memory_mib, 143771);
  assert_string_equal(l.items[4].name, "NVIDIA GeForce RTX 3090");
  assert_int_equal(l.items[4].memory_mib, 24576);
  assert_int_equal(l.items[5].memory_mib, 81920);
  for (size_t i = 0; i < l.count; i++) {
    const gn_gpu *g = &l.items[i];
    assert_int_equal(g->index, (int)i);
    assert_true(g->simulated);
    assert_string_equal(g->driver, "simulated");
    assert_int_equal(strncmp(g->uuid, "GPU-SIM-", 8), 0);
    assert_int_equal(strlen(g->uuid), 8 + 32);
    assert_string_equal(g->dev_path, "");
    for (size_t k = 0; k < i; k++)
      assert_string_not_equal(g->uuid, l.items[k].uuid);
  }
  /* Deterministic: the same configuration gives the same ids. */
  gn_gpu_list again;
  assert_int_equal(gn_gpu_discover(sim, GN_ARRAY_SIZE(sim), &again), 0);
  for (size_t i = 0; i < l.count; i++)
    assert_string_equal(l.items[i].uuid, again.items[i].uuid);
  gn_gpu_list_done(&again);
  gn_gpu_list_done(&l);
  assert_null(l.items);
  gn_gpu_list_done(NULL);
}

static void test_gpu_unknown_simulated_name_is_rejected(void **state) {
  (void)state;
  static const char *const bad[] = {"RTX 9999", "", "nvidia", "40", "rtx40900", "GTX 1080"};
  for (size_t i = 0; i < GN_ARRAY_SIZE(bad); i++) {
    const char *sim[] = {"RTX 4090", bad[i]};
    gn_gpu_list l = {.items = (gn_gpu *)0x1, .count = 77};
    if (gn_gpu_discover(sim, 2, &l) != GN_EINVAL)
      fail_msg("'%s' was accepted", bad[i]);
    assert_int_equal(l.count, 77); /* untouched */
  }
  assert_non_null(strstr(gn_gpu_sim_models(), "RTX 4090"));
}

static void test_gpu_no_nvml_means_no_real_gpus(void **state) {
  (void)state;
  gn_gpu_list l;
  assert_int_equal(gn_gpu_discover(NULL, 0, &l), 0);
  assert_int_equal(l.count, 0);
  gn_gpu_list_done(&l);
}

static void test_gpu_simulated_has_no_utilization(void **state) {
  (void)state;
  const char *sim[] = {"4090"};
  gn_gpu_list l;
  assert_int_equal(gn_gpu_discover(sim, 1, &l), 0);
  uint8_t pct = 200;
  assert_int_equal(gn_gpu_utilization(&l.items[0], &pct), GN_EUNSUPPORTED);
  assert_int_equal(pct, 200);
  gn_gpu_stats st;
  assert_int_equal(gn_gpu_stats_get(&l.items[0], &st), GN_EUNSUPPORTED);
  gn_gpu_list_done(&l);
}

#ifdef GN_NVML_SHIM_PATH
static int shim(void **state) {
  (void)state;
  setenv("GN_NVML_LIB", GN_NVML_SHIM_PATH, 1);
  return 0;
}

static void test_gpu_real_gpus_parsed_and_missing_fields_unknown(void **state) {
  (void)state;
  const char *sim[] = {"H100"};
  gn_gpu_list l;
  assert_int_equal(gn_gpu_discover(sim, 1, &l), 0);
  assert_int_equal(l.count, 3);
  const gn_gpu *g = &l.items[0];
  assert_int_equal(g->index, 0);
  assert_false(g->simulated);
  assert_string_equal(g->name, "NVIDIA GeForce RTX 4090");
  assert_string_equal(g->uuid, "GPU-8f3c0000-aaaa-bbbb-cccc-0123456789ab");
  assert_int_equal(g->memory_mib, 24564);
  assert_string_equal(g->driver, "999.99.fake");
  /* The shim has no PCI, minor-number or clock functions. */
  assert_string_equal(g->pci_bus_id, "");
  assert_int_equal(g->minor, -1);
  assert_string_equal(g->dev_path, "");
  assert_int_equal(g->max_sm_clock_mhz, 0);
  /* Device 1: the name query fails and the UUID comes unterminated. */
  g = &l.items[1];
  assert_string_equal(g->name, "");
  assert_int_equal(strlen(g->uuid), sizeof(g->uuid) - 1);
  assert_int_equal(g->memory_mib, 16376);
  /* Simulated GPUs come after the real ones. */
  assert_true(l.items[2].simulated);
  assert_int_equal(l.items[2].index, 2);
  gn_gpu_list_done(&l);
}

static void test_gpu_utilization_from_nvml(void **state) {
  (void)state;
  gn_gpu_list l;
  assert_int_equal(gn_gpu_discover(NULL, 0, &l), 0);
  assert_int_equal(l.count, 2);
  uint8_t pct = 0;
  assert_int_equal(gn_gpu_utilization(&l.items[0], &pct), 0);
  assert_int_equal(pct, 37);
  /* Over 100 percent is nonsense, not a reading. */
  assert_int_equal(gn_gpu_utilization(&l.items[1], &pct), GN_EUNSUPPORTED);
  gn_gpu_stats st;
  assert_int_equal(gn_gpu_stats_get(&l.items[0], &st), 0);
  assert_int_equal(st.utilization_pct, 37);
  assert_int_equal(st.sm_clock_mhz, 0); /* no clock function in the shim */
  /* A GPU whose UUID no longer matches the index is not measured. */
  gn_gpu other = l.items[0];
  snprintf(other.uuid, sizeof(other.uuid), "GPU-somebody-else");
  assert_int_equal(gn_gpu_utilization(&other, &pct), GN_ENOTFOUND);
  gn_gpu_list_done(&l);
}

/* Power from NVML, or unknown (0) when the query fails; a lease's energy is
 * integrated from these readings (billing/energy.c): 250 W for 10 s read
 * through NVML is 2500 J, and a GPU with no reading gives no claim. */
static void test_gpu_power_from_nvml_feeds_energy(void **state) {
  (void)state;
  const char *sim[] = {"H100"};
  gn_gpu_list l;
  gn_gpu_stats st;
  assert_int_equal(gn_gpu_discover(sim, 1, &l), 0);
  assert_int_equal(l.count, 3);
  unsetenv("GN_NVML_SHIM_POWER_MW");
  assert_int_equal(gn_gpu_stats_get(&l.items[0], &st), 0);
  assert_int_equal(st.power_mw, 0);
  setenv("GN_NVML_SHIM_POWER_MW", "250000", 1);
  gn_energy real = {0}, simulated = {0};
  gn_energy_start(&real, 0);
  gn_energy_start(&simulated, 0);
  for (uint64_t s = 1; s <= 10; s++) {
    gn_gpu_stats a = {0}, b = {0};
    bool have_a = gn_gpu_stats_get(&l.items[0], &a) == 0 && a.power_mw > 0;
    bool have_b = gn_gpu_stats_get(&l.items[2], &b) == 0 && b.power_mw > 0; /* simulated: no NVML */
    gn_energy_sample(&real, s * 1000, have_a, a.power_mw);
    gn_energy_sample(&simulated, s * 1000, have_b, b.power_mw);
  }
  assert_int_equal(gn_energy_mj(&real), 2500000);
  assert_int_equal(gn_energy_measured_s(&real), 10);
  assert_false(gn_energy_claim(&simulated).present);
  unsetenv("GN_NVML_SHIM_POWER_MW");
  gn_gpu_list_done(&l);
}

static void test_gpu_temperature_from_nvml_or_unknown(void **state) {
  (void)state;
  gn_gpu_list l;
  assert_int_equal(gn_gpu_discover(NULL, 0, &l), 0);
  assert_int_equal(l.count, 2);
  gn_gpu_stats st;
  assert_int_equal(gn_gpu_stats_get(&l.items[0], &st), 0);
  assert_int_equal(st.temperature_c, 61);
  /* Device 1's sensor fails: unknown, not 0 degrees. */
  assert_int_equal(gn_gpu_stats_get(&l.items[1], &st), 0);
  assert_int_equal(st.temperature_c, -1);
  gn_gpu_list_done(&l);
}
#endif

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_gpu_simulated_list, no_nvml, done),
      cmocka_unit_test_setup_teardown(test_gpu_unknown_simulated_name_is_rejected, no_nvml, done),
      cmocka_unit_test_setup_teardown(test_gpu_no_nvml_means_no_real_gpus, no_nvml, done),
      cmocka_unit_test_setup_teardown(test_gpu_simulated_has_no_utilization, no_nvml, done),
#ifdef GN_NVML_SHIM_PATH
      cmocka_unit_test_setup_teardown(test_gpu_real_gpus_parsed_and_missing_fields_unknown, shim, done),
      cmocka_unit_test_setup_teardown(test_gpu_utilization_from_nvml, shim, done),
      cmocka_unit_test_setup_teardown(test_gpu_temperature_from_nvml_or_unknown, shim, done),
      cmocka_unit_test_setup_teardown(test_gpu_power_from_nvml_feeds_energy, shim, done),
#endif
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
