/* libFuzzer target: the ld.so.cache parser of GPU passthrough
 * (sandbox/nvidia.c) on hostile bytes, reached the way the daemon reaches
 * it: gn_nvidia_passthrough on a root whose etc/ld.so.cache is the input.
 *
 * The root is a fake NVIDIA host built once per process (no GPU here):
 * dev/nvidia0 and dev/nvidiactl as real character devices of the driver's
 * major 195 (mknod: needs root; otherwise every run stops at the missing
 * node and only the argument checks are exercised, said once on stderr),
 * driver version 550.54.15 in sys/module/nvidia/version, libcuda only in
 * /opt/nv/lib (found through the cache alone), libnvidia-ml in the
 * standard folder, and links in and out of the root for the cache's paths
 * to meet. A folder beside the root has a libcuda too: a cache naming it
 * through "..", or a link out, must not get it bound.
 *
 * Invariants: every node and bind source lies under the root (never a
 * link), every dest is absolute, every library bound is a regular file of
 * driver 550.54.15, and a success binds libcuda.
 * GN_FUZZ_VERBOSE=1 prints each run's outcome (for checking the seeds). */
#include "../../sandbox/sandbox_int.h"

#include <errno.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#define VER "550.54.15"

static char base[4096]; /* the per-process temp dir */
static char root[4096]; /* base/root: the fake host */
static char cache[4096];

static void die(const char *what, const char *path) {
  fprintf(stderr, "fuzz_ldcache: %s: %s (%s)\n", what, path, strerror(errno));
  abort();
}

static void mkdirs(const char *path) {
  char b[4096];
  snprintf(b, sizeof b, "%s", path);
  for (char *s = b + 1; *s; s++)
    if (*s == '/') {
      *s = '\0';
      mkdir(b, 0755);
      *s = '/';
    }
  if (mkdir(b, 0755) < 0 && errno != EEXIST)
    die("mkdir", b);
}

static void put(const char *rel, const char *text, mode_t mode) {
  char path[4096], dir[4096];
  snprintf(path, sizeof path, "%s%s", root, rel);
  snprintf(dir, sizeof dir, "%s", path);
  *strrchr(dir, '/') = '\0';
  mkdirs(dir);
  FILE *f = fopen(path, "w");
  if (!f || fputs(text, f) < 0 || fclose(f) != 0 || chmod(path, mode) < 0)
    die("write", path);
}

static void put_link(const char *rel, const char *target) {
  char path[4096];
  snprintf(path, sizeof path, "%s%s", root, rel);
  if (symlink(target, path) < 0)
    die("symlink", path);
}

static void put_node(const char *rel, unsigned maj, unsigned min) {
  char path[4096];
  snprintf(path, sizeof path, "%s%s", root, rel);
  if (mknod(path, S_IFCHR | 0666, makedev(maj, min)) < 0)
    fprintf(stderr, "fuzz_ldcache: mknod %s: %s: passthrough will stop at the missing node\n", path, strerror(errno));
}

static int rm_one(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
  (void)st;
  (void)ftw;
  return flag == FTW_DP ? rmdir(path) : unlink(path);
}

static void cleanup(void) {
  if (base[0])
    nftw(base, rm_one, 32, FTW_PHYS | FTW_DEPTH);
}

static void setup(void) {
  snprintf(base, sizeof base, "%s/gn-fuzz-ldcache-XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
  if (!mkdtemp(base))
    die("mkdtemp", base);
  atexit(cleanup);
  snprintf(root, sizeof root, "%s/root", base);
  snprintf(cache, sizeof cache, "%s/etc/ld.so.cache", root);
  mkdirs(root);
  char p[4096];
  snprintf(p, sizeof p, "%s/dev", root);
  mkdirs(p);
  snprintf(p, sizeof p, "%s/etc", root);
  mkdirs(p);
  put_node("/dev/nvidia0", 195, 0);
  put_node("/dev/nvidiactl", 195, 255);
  put("/sys/module/nvidia/version", VER "\n", 0644);
  put("/opt/nv/lib/libcuda.so." VER, "libcuda\n", 0755);
  put_link("/opt/nv/lib/libcuda.so.1", "libcuda.so." VER);
  /* More of the table's libraries, for the cache's entries to reach. */
  static const char *const more[] = {"libnvidia-cfg.so",       "libnvidia-nvvm.so",   "libnvidia-gpucomp.so",
                                     "libnvidia-allocator.so", "libnvidia-opencl.so", "libcudadebugger.so"};
  for (size_t i = 0; i < sizeof more / sizeof more[0]; i++) {
    char rel[256], target[256];
    snprintf(rel, sizeof rel, "/opt/nv/lib/%s." VER, more[i]);
    put(rel, "lib\n", 0755);
    snprintf(rel, sizeof rel, "/opt/nv/lib/%s.1", more[i]);
    snprintf(target, sizeof target, "%s." VER, more[i]);
    put_link(rel, target);
  }
  put("/opt/nv/old/libnvidia-nvvm.so.535.104.05", "stale\n", 0755); /* another driver's: never bound */
  put_link("/opt/nv/lib64", "lib");
  put_link("/opt/nv/abs", "/opt/nv/lib");
  put_link("/opt/loop", "loop");
  put_link("/lib", "usr/lib");
  put_link("/opt/nv/lib/libnvidia-ptxjitcompiler.so.1", "../../../outside/libnvidia-ptxjitcompiler.so." VER);
  put_link("/opt/up", "/../../..");
  put("/usr/lib/x86_64-linux-gnu/libnvidia-ml.so." VER, "nvml\n", 0755);
  put_link("/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1", "libnvidia-ml.so." VER);
  put("/usr/lib/x86_64-linux-gnu/libnvidia-cfg.so.1", "stale\n", 0755);
  put("/usr/bin/nvidia-smi", "smi\n", 0755);
  /* Beside the root: what an escape would reach. */
  char out[4096];
  snprintf(out, sizeof out, "%s/outside/libcuda.so." VER, base);
  mkdirs(strcat(strcpy(p, base), "/outside"));
  FILE *f = fopen(out, "w");
  if (!f || fclose(f) != 0)
    die("write", out);
  snprintf(out, sizeof out, "%s/outside/libnvidia-ptxjitcompiler.so." VER, base);
  if (!(f = fopen(out, "w")) || fclose(f) != 0)
    die("write", out);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (!base[0])
    setup();
  FILE *f = fopen(cache, "w");
  if (!f || (size && fwrite(data, 1, size, f) != size) || fclose(f) != 0)
    die("write", cache);

  static gn_nvidia_pass pass;
  static const unsigned minors[1] = {0};
  char err[512] = "";
  memset(&pass, 0, sizeof pass);
  int r = gn_nvidia_passthrough(root, minors, 1, &pass, err, sizeof err);
  if (getenv("GN_FUZZ_VERBOSE"))
    fprintf(stderr, "fuzz_ldcache: %d %s, %zu nodes, %zu binds\n", r, err, pass.n_nodes, pass.n_binds);
  if (getenv("GN_FUZZ_VERBOSE"))
    for (size_t i = 0; i < pass.n_binds; i++)
      fprintf(stderr, "  %s -> %s\n", pass.binds[i].source, pass.binds[i].dest);
  if (r > 0) {
    fprintf(stderr, "fuzz_ldcache: positive return %d\n", r);
    abort();
  }
  if (r < 0)
    return 0;
  size_t rl = strlen(root);
  bool cuda = false;
  if (pass.n_nodes > GN_NVIDIA_MAX_NODES || pass.n_binds > GN_NVIDIA_MAX_BINDS)
    abort();
  for (size_t i = 0; i < pass.n_nodes + pass.n_binds; i++) {
    const gn_bundle_bind *b = i < pass.n_nodes ? &pass.nodes[i] : &pass.binds[i - pass.n_nodes];
    if (strncmp(b->source, root, rl) != 0 || b->source[rl] != '/' || strstr(b->source, "/../") || b->dest[0] != '/') {
      fprintf(stderr, "fuzz_ldcache: bind %s -> %s is not under the root %s\n", b->source, b->dest, root);
      abort();
    }
    struct stat st;
    if (lstat(b->source, &st) < 0 || S_ISLNK(st.st_mode)) {
      fprintf(stderr, "fuzz_ldcache: bind source %s is missing or a link\n", b->source);
      abort();
    }
    /* A library bound is the loaded driver's versioned file. */
    size_t sl = strlen(b->source), vl = strlen(".so." VER);
    if (i >= pass.n_nodes && strncmp(b->dest, "/usr/bin/", 9) != 0 &&
        (sl < vl || strcmp(b->source + sl - vl, ".so." VER) != 0 || !S_ISREG(st.st_mode))) {
      fprintf(stderr, "fuzz_ldcache: bind %s -> %s is not a library of driver " VER "\n", b->source, b->dest);
      abort();
    }
    cuda |= strcmp(b->dest, "/opt/nv/lib/libcuda.so." VER) == 0;
  }
  if (!cuda) {
    fprintf(stderr, "fuzz_ldcache: passthrough succeeded without binding libcuda\n");
    abort();
  }
  return 0;
}
