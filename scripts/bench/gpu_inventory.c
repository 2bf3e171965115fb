/* The provider's GPU inventory on a real NVIDIA machine: the node's own
 * NVML code (node/gpu.c, dlopen of libnvidia-ml.so.1) lists the GPUs and
 * reads their live stats, the way gpunetd does before it offers them.
 * Prints one line per GPU and exits 1 if a real GPU lacks what an offer
 * and the job sandbox need (name, memory, UUID, device node), 77 if NVML
 * finds no GPU. Built and run by scripts/bench/gpu_check.
 *
 * Then the energy check (issue 10, item 7): for GN_ENERGY_CHECK_S seconds
 * (default 10) it integrates each GPU's power once a second the way the
 * provider does for a lease (billing/energy.c over node/gpu.c's reading)
 * and compares the sum with NVML's own energy counter
 * (nvmlDeviceGetTotalEnergyConsumption, Volta and later) over the same
 * span: the ratio is printed, and one outside 0.8-1.25 fails the check. A
 * driver without the counter says so and leaves the ratio out. */
#include <gpunet/billing.h>
#include <gpunet/node.h>

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <time.h>

typedef int (*nvml_handle_fn)(unsigned int, void **);
typedef int (*nvml_energy_fn)(void *, unsigned long long *);

/* NVML's energy counter of GPU index in mJ; false where there is none. */
static bool counter_mj(void *lib, unsigned int index, unsigned long long *mj) {
  nvml_handle_fn handle = lib ? (nvml_handle_fn)dlsym(lib, "nvmlDeviceGetHandleByIndex_v2") : NULL;
  nvml_energy_fn energy = lib ? (nvml_energy_fn)dlsym(lib, "nvmlDeviceGetTotalEnergyConsumption") : NULL;
  void *d = NULL;
  return handle && energy && handle(index, &d) == 0 && energy(d, mj) == 0;
}

static int energy_check(const gn_gpu_list *l) {
  enum { MAX = 16 };
  const char *env = getenv("GN_ENERGY_CHECK_S");
  int seconds = env && atoi(env) > 0 ? atoi(env) : 10;
  const char *path = getenv("GN_NVML_LIB");
  /* node/gpu.c has loaded and initialised the library: this is its handle. */
  void *lib = dlopen(path && *path ? path : "libnvidia-ml.so.1", RTLD_NOW | RTLD_NOLOAD);
  size_t count = l->count < MAX ? l->count : MAX;
  gn_energy e[MAX] = {0};
  unsigned long long c0[MAX] = {0}, c1[MAX] = {0};
  bool have_counter[MAX] = {0};
  printf("== energy: %d s of power readings integrated as for a lease, against NVML's counter\n", seconds);
  for (size_t i = 0; i < count; i++) {
    have_counter[i] = counter_mj(lib, (unsigned int)l->items[i].index, &c0[i]);
    gn_energy_start(&e[i], gn_mono_ms());
  }
  for (int s = 0; s < seconds; s++) {
    nanosleep(&(struct timespec){.tv_sec = 1}, NULL);
    for (size_t i = 0; i < count; i++) {
      gn_gpu_stats st = {.utilization_pct = -1};
      bool ok = gn_gpu_stats_get(&l->items[i], &st) == 0 && st.power_mw > 0;
      gn_energy_sample(&e[i], gn_mono_ms(), ok, ok ? st.power_mw : 0);
    }
  }
  int bad = 0;
  for (size_t i = 0; i < count; i++) {
    const gn_gpu *g = &l->items[i];
    double mine = gn_energy_mj(&e[i]) / 1000.0;
    printf("energy gpu %d: %.1f J over %llu s measured", g->index, mine,
           (unsigned long long)gn_energy_measured_s(&e[i]));
    if (gn_energy_measured_s(&e[i]) == 0) {
      printf(" (no power reading: a lease on it would state no energy)\n");
      bad |= !g->simulated;
      continue;
    }
    if (!have_counter[i] || !counter_mj(lib, (unsigned int)g->index, &c1[i]) || c1[i] <= c0[i]) {
      printf("; NVML has no energy counter for it: no ratio\n");
      continue;
    }
    double nvml = (double)(c1[i] - c0[i]) / 1000.0;
    double ratio = mine / nvml;
    bool in = ratio >= 0.8 && ratio <= 1.25;
    printf("; NVML counter %.1f J; ratio %.3f%s\n", nvml, ratio, in ? "" : " (outside 0.8-1.25)");
    bad |= !in;
  }
  if (lib)
    dlclose(lib);
  return bad;
}

int main(void) {
  gn_gpu_list l = {0};
  int r = gn_gpu_discover(NULL, 0, &l);
  if (r < 0) {
    fprintf(stderr, "gpu_inventory: discovery failed (%d)\n", r);
    return 1;
  }
  if (l.count == 0) {
    printf("gpu_inventory: no GPU found through NVML (GN_NVML_LIB or libnvidia-ml.so.1)\n");
    return 77;
  }
  int bad = 0;
  size_t count = l.count;
  for (size_t i = 0; i < l.count; i++) {
    const gn_gpu *g = &l.items[i];
    gn_gpu_stats st = {.utilization_pct = -1};
    int sr = gn_gpu_stats_get(g, &st);
    struct stat sb;
    bool node = g->dev_path[0] && stat(g->dev_path, &sb) == 0 && S_ISCHR(sb.st_mode);
    printf("gpu %d: %s, %llu MiB, driver %s, uuid %s, pci %s, minor %d, %s%s, max SM %u MHz; now: util %d%%, SM "
           "%u MHz, %.1f W (stats %s)\n",
           g->index, g->name, (unsigned long long)g->memory_mib, g->driver, g->uuid, g->pci_bus_id, g->minor,
           g->dev_path[0] ? g->dev_path : "(no device node)", node ? "" : " [missing]", g->max_sm_clock_mhz,
           st.utilization_pct, st.sm_clock_mhz, st.power_mw / 1000.0, sr == 0 ? "ok" : "failed");
    if (g->simulated || !g->name[0] || g->memory_mib == 0 || !g->uuid[0] || sr != 0)
      bad = 1;
  }
  printf("gpu_inventory: %zu GPU(s), %s\n", count, bad ? "INCOMPLETE" : "complete");
  if (energy_check(&l)) {
    printf("gpu_inventory: the energy check FAILED\n");
    bad = 1;
  }
  gn_gpu_list_done(&l);
  gn_gpu_shutdown();
  return bad;
}
