/* The provider's GPU inventory on a real NVIDIA machine: the node's own
 * NVML code (node/gpu.c, dlopen of libnvidia-ml.so.1) lists the GPUs and
 * reads their live stats, the way gpunetd does before it offers them.
 * Prints one line per GPU and exits 1 if a real GPU lacks what an offer
 * and the job sandbox need (name, memory, UUID, device node), 77 if NVML
 * finds no GPU. Built and run by scripts/bench/gpu_check. */
#include <gpunet/node.h>

#include <stdio.h>
#include <sys/stat.h>

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
  gn_gpu_list_done(&l);
  gn_gpu_shutdown();
  printf("gpu_inventory: %zu GPU(s), %s\n", count, bad ? "INCOMPLETE" : "complete");
  return bad;
}
