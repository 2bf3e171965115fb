/* TEST FAKE, not a driver: a tiny stand-in for libnvidia-ml.so.1 (there is no
 * GPU on the build machines) that exports only SOME NVML symbols, so test_gpu
 * can prove that real-GPU fields are parsed and that missing symbols or
 * failing queries degrade to "unknown" instead of crashing. */
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef int nvmlReturn_t;
typedef struct nvmlDevice_st *nvmlDevice_t;
typedef struct {
  unsigned long long total, free, used;
} nvmlMemory_t;
typedef struct {
  unsigned int gpu, memory;
} nvmlUtilization_t;

#define FAKE_ERROR 999 /* NVML_ERROR_UNKNOWN */

/* Two fake devices; the handle is the index + 1 cast to a pointer. */
static int inited;
static unsigned long long inited_ms; /* when nvmlInit_v2 was called */

static unsigned long long mono_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (unsigned long long)ts.tv_sec * 1000ULL + (unsigned long long)ts.tv_nsec / 1000000ULL;
}
static unsigned long fake_handle(nvmlDevice_t d) {
  return (unsigned long)d - 1;
}

nvmlReturn_t nvmlInit_v2(void) {
  inited = 1;
  inited_ms = mono_ms();
  return 0;
}

nvmlReturn_t nvmlShutdown(void) {
  inited = 0;
  return 0;
}

nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count) {
  if (!inited)
    return FAKE_ERROR;
  *count = 2;
  return 0;
}

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *d) {
  if (index >= 2)
    return FAKE_ERROR;
  *d = (nvmlDevice_t)(unsigned long)(index + 1);
  return 0;
}

/* Device 1's name query fails, as on a GPU that fell off the bus. */
nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t d, char *name, unsigned int len) {
  if (fake_handle(d) == 1)
    return FAKE_ERROR;
  strncpy(name, "NVIDIA GeForce RTX 4090", len);
  return 0;
}

/* Device 1 fills the whole buffer without a terminator, on purpose: the
 * caller must bound what it reads. */
nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t d, char *uuid, unsigned int len) {
  const char *u = "GPU-8f3c0000-aaaa-bbbb-cccc-0123456789ab";
  if (fake_handle(d) == 1)
    memset(uuid, 'X', len);
  else
    strncpy(uuid, u, len);
  return 0;
}

nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t d, nvmlMemory_t *m) {
  m->total = (fake_handle(d) ? 16376ull : 24564ull) * 1024 * 1024;
  m->used = 512ull * 1024 * 1024;
  m->free = m->total - m->used;
  return 0;
}

nvmlReturn_t nvmlSystemGetDriverVersion(char *v, unsigned int len) {
  strncpy(v, "999.99.fake", len);
  return 0;
}

nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t d, nvmlUtilization_t *u) {
  u->gpu = fake_handle(d) ? 101 : 37; /* device 1 reports nonsense */
  u->memory = 5;
  return 0;
}

/* Device 0 is at 61 degrees; device 1's sensor fails. */
nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t d, int sensor, unsigned int *t) {
  if (fake_handle(d) == 1 || sensor != 0)
    return FAKE_ERROR;
  *t = 61;
  return 0;
}

/* Power in milliwatts, the same on every device, from GN_NVML_SHIM_POWER_MW
 * (read at each call, so a test can change it): the energy tests' "real"
 * GPUs. Unset, empty or not a number: the query fails, as on a GPU without
 * a power sensor. */
nvmlReturn_t nvmlDeviceGetPowerUsage(nvmlDevice_t d, unsigned int *mw) {
  const char *v = getenv("GN_NVML_SHIM_POWER_MW");
  char *end = NULL;
  (void)d;
  if (!v || !*v)
    return FAKE_ERROR;
  unsigned long n = strtoul(v, &end, 10);
  if (*end || n > 0xffffffffUL)
    return FAKE_ERROR;
  *mw = (unsigned int)n;
  return 0;
}

/* The energy counter (mJ since the library was initialised) of a GPU that
 * has drawn GN_NVML_SHIM_POWER_MW all along; fails where the power does:
 * scripts/bench/gpu_inventory's energy check compares against it. */
nvmlReturn_t nvmlDeviceGetTotalEnergyConsumption(nvmlDevice_t d, unsigned long long *mj) {
  unsigned int mw;
  if (!inited || nvmlDeviceGetPowerUsage(d, &mw) != 0)
    return FAKE_ERROR;
  *mj = (unsigned long long)mw * (mono_ms() - inited_ms) / 1000ULL;
  return 0;
}

/* Deliberately absent: nvmlDeviceGetMinorNumber, nvmlDeviceGetPciInfo_v3,
 * nvmlDeviceGetClockInfo, nvmlDeviceGetMaxClockInfo. */
