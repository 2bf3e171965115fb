/* The GPU inventory: real NVIDIA GPUs through NVML loaded with dlopen (so one
 * binary runs with or without a driver), plus simulated GPUs for development. */
#include <gpunet/node.h>

#include <dlfcn.h>
#include <pthread.h>
#include <sodium.h>
#include <stdio.h>

/* The few NVML types and entry points we use, declared here because NVML's
 * header is not part of the toolkit headers we build against. The layouts are
 * NVML's stable ABI. */
typedef int nvmlReturn_t; /* NVML_SUCCESS is 0 */
typedef struct nvmlDevice_st *nvmlDevice_t;
typedef struct {
  unsigned long long total, free, used; /* bytes */
} nvmlMemory_t;
typedef struct {
  unsigned int gpu, memory; /* percent */
} nvmlUtilization_t;
typedef struct {
  char busIdLegacy[16];
  unsigned int domain, bus, device, pciDeviceId, pciSubSystemId;
  char busId[32];
} nvmlPciInfo_t;
enum { NVML_CLOCK_SM = 1 };
enum { NVML_TEMPERATURE_GPU = 0 };

#define NVML_MAX_GPUS 64

typedef struct nvml {
  void *lib;
  char path[PATH_MAX];
  bool inited;
  nvmlReturn_t (*init)(void);
  nvmlReturn_t (*shutdown)(void);
  nvmlReturn_t (*count)(unsigned int *);
  nvmlReturn_t (*handle)(unsigned int, nvmlDevice_t *);
  nvmlReturn_t (*name)(nvmlDevice_t, char *, unsigned int);
  nvmlReturn_t (*uuid)(nvmlDevice_t, char *, unsigned int);
  nvmlReturn_t (*memory)(nvmlDevice_t, nvmlMemory_t *);
  nvmlReturn_t (*driver)(char *, unsigned int);
  nvmlReturn_t (*minor)(nvmlDevice_t, unsigned int *);
  nvmlReturn_t (*pci)(nvmlDevice_t, nvmlPciInfo_t *);
  nvmlReturn_t (*util)(nvmlDevice_t, nvmlUtilization_t *);
  nvmlReturn_t (*clock)(nvmlDevice_t, int, unsigned int *);
  nvmlReturn_t (*max_clock)(nvmlDevice_t, int, unsigned int *);
  nvmlReturn_t (*power)(nvmlDevice_t, unsigned int *);
  nvmlReturn_t (*temperature)(nvmlDevice_t, int, unsigned int *);
} nvml;

/* NVML stays loaded between calls (initialising it takes long on a real
 * driver); the mutex makes it usable from the thread pool as well. */
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static nvml g_nvml;

static const char *nvml_path(void) {
  const char *p = getenv("GN_NVML_LIB");
  return p && p[0] ? p : "libnvidia-ml.so.1";
}

static void nvml_close(nvml *n) {
  if (n->inited && n->shutdown)
    n->shutdown();
  if (n->lib)
    dlclose(n->lib);
  memset(n, 0, sizeof(*n));
}

/* Each symbol on its own: an old or partial library gives unknown fields. */
#define NVML_SYM(field, name) (*(void **)&n->field = dlsym(n->lib, name))

/* Opens (or keeps) NVML for the current GN_NVML_LIB; false when there is no
 * usable library. Called with g_lock held. */
static bool nvml_open(nvml *n) {
  const char *path = nvml_path();
  if (n->lib && strcmp(n->path, path) == 0)
    return n->inited;
  nvml_close(n);
  if (strlen(path) >= sizeof(n->path))
    return false;
  n->lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!n->lib)
    return false;
  memcpy(n->path, path, strlen(path) + 1);
  NVML_SYM(init, "nvmlInit_v2");
  NVML_SYM(shutdown, "nvmlShutdown");
  NVML_SYM(count, "nvmlDeviceGetCount_v2");
  NVML_SYM(handle, "nvmlDeviceGetHandleByIndex_v2");
  NVML_SYM(name, "nvmlDeviceGetName");
  NVML_SYM(uuid, "nvmlDeviceGetUUID");
  NVML_SYM(memory, "nvmlDeviceGetMemoryInfo");
  NVML_SYM(driver, "nvmlSystemGetDriverVersion");
  NVML_SYM(minor, "nvmlDeviceGetMinorNumber");
  NVML_SYM(pci, "nvmlDeviceGetPciInfo_v3");
  NVML_SYM(util, "nvmlDeviceGetUtilizationRates");
  NVML_SYM(clock, "nvmlDeviceGetClockInfo");
  NVML_SYM(max_clock, "nvmlDeviceGetMaxClockInfo");
  NVML_SYM(power, "nvmlDeviceGetPowerUsage");
  NVML_SYM(temperature, "nvmlDeviceGetTemperature");
  /* Without init, count and handles nothing else can be asked. */
  n->inited = n->init && n->count && n->handle && n->init() == 0;
  return n->inited;
}

/* Copies an NVML string, which NVML promises to terminate but which we do
 * not trust to. */
static void copy_bounded(char *dst, size_t cap, const char *src, size_t src_cap) {
  size_t len = strnlen(src, src_cap);
  if (len >= cap)
    len = cap - 1;
  memcpy(dst, src, len);
  dst[len] = '\0';
}

static void nvml_fill(nvml *n, unsigned int i, nvmlDevice_t d, const char *driver, gn_gpu *g) {
  memset(g, 0, sizeof(*g));
  g->index = (int)i;
  g->minor = -1;
  char buf[96];
  memset(buf, 0, sizeof(buf));
  if (n->name && n->name(d, buf, sizeof(buf)) == 0)
    copy_bounded(g->name, sizeof(g->name), buf, sizeof(buf));
  memset(buf, 0, sizeof(buf));
  if (n->uuid && n->uuid(d, buf, sizeof(buf)) == 0)
    copy_bounded(g->uuid, sizeof(g->uuid), buf, sizeof(buf));
  nvmlMemory_t mem;
  if (n->memory && n->memory(d, &mem) == 0)
    g->memory_mib = mem.total / (1024 * 1024);
  snprintf(g->driver, sizeof(g->driver), "%s", driver);
  nvmlPciInfo_t pci;
  memset(&pci, 0, sizeof(pci));
  if (n->pci && n->pci(d, &pci) == 0)
    copy_bounded(g->pci_bus_id, sizeof(g->pci_bus_id), pci.busId, sizeof(pci.busId));
  unsigned int minor;
  if (n->minor && n->minor(d, &minor) == 0 && minor < 4096) {
    g->minor = (int)minor;
    snprintf(g->dev_path, sizeof(g->dev_path), "/dev/nvidia%u", minor);
  }
  unsigned int mhz;
  if (n->max_clock && n->max_clock(d, NVML_CLOCK_SM, &mhz) == 0)
    g->max_sm_clock_mhz = mhz;
}

/* --- simulated GPUs ----------------------------------------------------------*/

static const struct {
  const char *key; /* normalized: what gn_gpu_model_norm makes of the name */
  const char *name;
  uint64_t memory_mib;
  uint32_t max_sm_clock_mhz;
} sim_models[] = {
    {"rtx3090", "NVIDIA GeForce RTX 3090", 24576, 2100},
    {"rtx4080", "NVIDIA GeForce RTX 4080", 16376, 3105},
    {"rtx4090", "NVIDIA GeForce RTX 4090", 24564, 3105},
    {"rtx5090", "NVIDIA GeForce RTX 5090", 32607, 3090},
    {"a100", "NVIDIA A100-SXM4-80GB", 81920, 1410},
    {"h100", "NVIDIA H100 80GB HBM3", 81559, 1980},
    {"h200", "NVIDIA H200", 143771, 1980},
};

const char *gn_gpu_sim_models(void) {
  return "RTX 3090, RTX 4080, RTX 4090, RTX 5090, A100, H100, H200";
}

/* "RTX 4090", "rtx4090", "4090", "NVIDIA GeForce RTX 4090" all find the 4090. */
static int sim_lookup(const char *name) {
  char norm[128];
  gn_gpu_model_norm(name, norm, sizeof(norm));
  if (!norm[0])
    return -1;
  for (size_t i = 0; i < GN_ARRAY_SIZE(sim_models); i++) {
    const char *k = sim_models[i].key;
    size_t kl = strlen(k), nl = strlen(norm);
    bool exact = strcmp(norm, k) == 0;
    /* The bare number: "4090" is the tail of "rtx4090". */
    bool tail = strncmp(k, "rtx", 3) == 0 && strcmp(norm, k + 3) == 0;
    /* Full NVML names such as "a100sxm480gb" start with the key. */
    bool full = nl > kl && strncmp(norm, k, kl) == 0 && !(norm[kl] >= '0' && norm[kl] <= '9');
    if (exact || tail || full)
      return (int)i;
  }
  return -1;
}

bool gn_gpu_sim_known(const char *name) {
  return name && sim_lookup(name) >= 0;
}

static void sim_fill(size_t model, int index, gn_gpu *g) {
  memset(g, 0, sizeof(*g));
  g->index = index;
  g->minor = -1;
  snprintf(g->name, sizeof(g->name), "%s", sim_models[model].name);
  g->memory_mib = sim_models[model].memory_mib;
  g->max_sm_clock_mhz = sim_models[model].max_sm_clock_mhz;
  snprintf(g->driver, sizeof(g->driver), "simulated");
  g->simulated = true;
  /* Deterministic, so a restarted simulated provider keeps its GPU ids. */
  uint8_t h[16];
  char in[160];
  int n = snprintf(in, sizeof(in), "gpunet-sim-gpu|%s|%d", g->name, index);
  crypto_generichash(h, sizeof(h), (const uint8_t *)in, (size_t)n, NULL, 0);
  char hex[33];
  sodium_bin2hex(hex, sizeof(hex), h, sizeof(h));
  snprintf(g->uuid, sizeof(g->uuid), "GPU-SIM-%s", hex);
}

/* --- the inventory -----------------------------------------------------------*/

int gn_gpu_discover(const char *const *simulate, size_t simulate_count, gn_gpu_list *ret) {
  if (!ret || (simulate_count && !simulate) || simulate_count > NVML_MAX_GPUS)
    return GN_EINVAL;
  int models[NVML_MAX_GPUS];
  for (size_t i = 0; i < simulate_count; i++) {
    models[i] = simulate[i] ? sim_lookup(simulate[i]) : -1;
    if (models[i] < 0)
      return GN_EINVAL; /* the caller names the known ones: gn_gpu_sim_models() */
  }
  if (sodium_init() < 0)
    return GN_EIO;
  gn_gpu *items = calloc(NVML_MAX_GPUS + simulate_count, sizeof(*items));
  if (!items)
    return GN_ENOMEM;
  size_t count = 0;
  pthread_mutex_lock(&g_lock);
  nvml *n = &g_nvml;
  unsigned int real = 0;
  if (nvml_open(n) && n->count(&real) == 0) {
    if (real > NVML_MAX_GPUS)
      real = NVML_MAX_GPUS;
    char driver[80] = "";
    if (n->driver && n->driver(driver, sizeof(driver)) != 0)
      driver[0] = '\0';
    driver[sizeof(driver) - 1] = '\0';
    for (unsigned int i = 0; i < real; i++) {
      nvmlDevice_t d;
      if (n->handle(i, &d) != 0)
        continue; /* a GPU NVML cannot open (lost, or no permission) */
      nvml_fill(n, i, d, driver, &items[count]);
      count++;
    }
  }
  pthread_mutex_unlock(&g_lock);
  for (size_t i = 0; i < simulate_count; i++, count++)
    sim_fill((size_t)models[i], (int)count, &items[count]);
  ret->items = items;
  ret->count = count;
  return 0;
}

void gn_gpu_list_done(gn_gpu_list *l) {
  if (!l)
    return;
  free(l->items);
  l->items = NULL;
  l->count = 0;
}

/* Runs fn on the NVML device of g, re-found by index (and checked by UUID
 * when NVML can tell, in case the driver renumbered after a reset). */
static int with_device(const gn_gpu *g, int (*fn)(nvml *, nvmlDevice_t, void *), void *arg) {
  if (!g || g->simulated || g->index < 0)
    return GN_EUNSUPPORTED;
  int r = GN_EUNSUPPORTED;
  pthread_mutex_lock(&g_lock);
  nvml *n = &g_nvml;
  nvmlDevice_t d;
  if (nvml_open(n) && n->handle((unsigned)g->index, &d) == 0) {
    char raw[96], uuid[sizeof(g->uuid)];
    bool same = !g->uuid[0] || !n->uuid || n->uuid(d, raw, sizeof(raw)) != 0;
    if (!same) {
      copy_bounded(uuid, sizeof(uuid), raw, sizeof(raw));
      same = strcmp(uuid, g->uuid) == 0;
    }
    r = same ? fn(n, d, arg) : GN_ENOTFOUND;
  }
  pthread_mutex_unlock(&g_lock);
  return r;
}

static int get_util(nvml *n, nvmlDevice_t d, void *arg) {
  nvmlUtilization_t u;
  if (!n->util || n->util(d, &u) != 0 || u.gpu > 100)
    return GN_EUNSUPPORTED;
  *(uint8_t *)arg = (uint8_t)u.gpu;
  return 0;
}

int gn_gpu_utilization(const gn_gpu *g, uint8_t *ret_pct) {
  uint8_t pct;
  int r = with_device(g, get_util, &pct);
  if (r == 0)
    *ret_pct = pct;
  return r;
}

static int get_stats(nvml *n, nvmlDevice_t d, void *arg) {
  gn_gpu_stats *s = arg;
  nvmlUtilization_t u;
  unsigned int v;
  if (n->util && n->util(d, &u) == 0 && u.gpu <= 100)
    s->utilization_pct = (int)u.gpu;
  if (n->clock && n->clock(d, NVML_CLOCK_SM, &v) == 0)
    s->sm_clock_mhz = v;
  if (n->power && n->power(d, &v) == 0)
    s->power_mw = v;
  /* 0 degrees is a possible reading, so "unknown" is -1; a value past what
   * any GPU survives is a broken reading, not a temperature. */
  if (n->temperature && n->temperature(d, NVML_TEMPERATURE_GPU, &v) == 0 && v <= GN_GPU_TEMPERATURE_MAX_C)
    s->temperature_c = (int)v;
  return 0;
}

int gn_gpu_stats_get(const gn_gpu *g, gn_gpu_stats *ret) {
  gn_gpu_stats s = {.utilization_pct = -1, .temperature_c = -1};
  int r = with_device(g, get_stats, &s);
  if (r == 0)
    *ret = s;
  return r;
}

void gn_gpu_shutdown(void) {
  pthread_mutex_lock(&g_lock);
  nvml_close(&g_nvml);
  pthread_mutex_unlock(&g_lock);
}
