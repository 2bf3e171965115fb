/* GPU passthrough: finds what a job on leased NVIDIA GPUs needs from the
 * host (the GPUs' device nodes, the control and UVM nodes, the driver's
 * user-space libraries and tools) the way the NVIDIA container toolkit
 * (libnvidia-container) finds them, without running anything: the libraries
 * through the host's ld.so.cache, else the standard library folders.
 *
 * Everything is looked up under a root ("/" on a real host, a fake tree in
 * tests) and every symlink is resolved as a chroot would resolve it: ".."
 * stops at the root and absolute targets start again from it, so no path
 * handed back can lie outside the root. */
#include "sandbox_int.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#define NV_MAJOR 195u         /* the driver's fixed character major (nvidiaN, ctl, modeset) */
#define NV_CTL_MINOR 255u     /* /dev/nvidiactl */
#define NV_MODESET_MINOR 254u /* /dev/nvidia-modeset */
#define NV_GPU_MINOR_MAX 253u /* GPUs are /dev/nvidia0../dev/nvidia253 */

#define LINKS_MAX 40                  /* symlinks followed in one lookup, as the kernel does */
#define LDCACHE_MAX_BYTES (64u << 20) /* a real cache is a few hundred KiB */
#define LDCACHE_MAX_ENTRIES 1000000u
#define SCAN_MAX_ENTRIES 200000u /* directory entries read per library folder */
#define CANDS_MAX 16u            /* names considered per library */
#define DESTS_PER_LIB 4u         /* the versioned file plus up to three link names */
#define NAME_MAX_LEN 127u
#define VERSION_MAX_LEN 31u

/* glibc's ld.so.cache ("new" format; see glibc's sysdeps/generic/dl-cache.h). */
#define LDC_OLD_MAGIC "ld.so-1.7.0"
#define LDC_NEW_MAGIC "glibc-ld.so.cache1.1"
#define LDC_OLD_HEADER 16u /* magic[11], padding, nlibs */
#define LDC_OLD_ENTRY 12u  /* flags, key, value */
#define LDC_NEW_HEADER 48u /* magic+version[20], nlibs, len_strings, flags, extension, unused */
#define LDC_NEW_ENTRY 24u  /* flags, key, value, osversion, hwcap */
#define LDC_FLAG_TYPE_MASK 0x00ffu
#define LDC_FLAG_ELF_LIBC6 0x0003u
#define LDC_FLAG_ARCH_MASK 0xff00u

#if defined(__x86_64__)
#define LDC_ARCH 0x0300u /* FLAG_X8664_LIB64 */
static const char *const lib_dirs[] = {"/usr/lib/x86_64-linux-gnu", "/usr/lib64", "/usr/lib"};
#elif defined(__aarch64__)
#define LDC_ARCH 0x0a00u /* FLAG_AARCH64_LIB64 */
static const char *const lib_dirs[] = {"/usr/lib/aarch64-linux-gnu", "/usr/lib64", "/usr/lib"};
#else
#define LDC_ARCH 0xffffu /* no cache entry matches: the folders are scanned */
static const char *const lib_dirs[] = {"/usr/lib64", "/usr/lib"};
#endif

/* The driver libraries of the toolkit's "utility" and "compute"
 * capabilities (its default for CUDA images). Graphics, video and display
 * libraries are left out: a job here is a compute job. */
static const struct {
  const char *name;
  bool required;
} libs[] = {
    /* utility */
    {"libnvidia-ml.so", false}, /* NVML: nvidia-smi, frameworks' device queries */
    {"libnvidia-cfg.so", false},
    {"libnvidia-nscq.so", false}, /* NVSwitch topology */
    /* compute */
    {"libcuda.so", true}, /* the CUDA driver API: nothing CUDA runs without it */
    {"libcudadebugger.so", false},
    {"libnvidia-ptxjitcompiler.so", false}, /* PTX JIT, loaded by libcuda */
    {"libnvidia-nvvm.so", false},
    {"libnvidia-gpucomp.so", false},
    {"libnvidia-fatbinaryloader.so", false}, /* older drivers */
    {"libnvidia-allocator.so", false},
    {"libnvidia-opencl.so", false},
    {"libnvidia-compiler.so", false}, /* older drivers */
    {"libnvidia-pkcs11.so", false},   /* confidential computing */
    {"libnvidia-pkcs11-openssl3.so", false},
    {"libnvidia-tileiras.so", false},
};
#define NLIBS (sizeof(libs) / sizeof(libs[0]))

/* The toolkit's utility and compute binaries, less the fabric manager (a
 * host daemon). Looked for in /usr/bin and bound at /usr/bin. */
static const char *const bins[] = {
    "nvidia-smi", "nvidia-debugdump", "nvidia-persistenced", "nvidia-cuda-mps-control", "nvidia-cuda-mps-server",
};
#define NBINS (sizeof(bins) / sizeof(bins[0]))

typedef struct cand {
  char key[NAME_MAX_LEN + 1]; /* the name the loader knows: libcuda.so.1 */
  char path[PATH_MAX];        /* where that name is, inside the root */
  bool is_link;               /* found in a folder as a symlink */
} cand;

typedef struct lib_cands {
  size_t n;
  cand c[CANDS_MAX];
  char chosen[PATH_MAX]; /* the in-root path of the file picked, "" before */
} lib_cands;

typedef struct ctx {
  char root[PATH_MAX]; /* without a trailing slash: "" for "/" */
  char version[VERSION_MAX_LEN + 1];
  gn_nvidia_pass *pass; /* being filled; copied to ret on success */
  lib_cands *cands;     /* NLIBS of them */
} ctx;

/* --- paths under the root --------------------------------------------------*/

static int join(char *out, size_t cap, const char *a, const char *b) {
  int n = snprintf(out, cap, "%s%s", a, b);
  return n < 0 || (size_t)n >= cap ? GN_ETOOBIG : 0;
}

/* Resolves path (absolute, as seen from inside the root) to the in-root path
 * of what it names, with every symlink followed the way a chroot would
 * follow it, so the result cannot leave the root. ret_path starts with "/"
 * ("/" for the root itself). GN_ENOTFOUND when a component is missing or
 * not a folder, GN_ETOOBIG on overlong paths, GN_EINVAL on a link loop. */
static int resolve_in_root(const ctx *c, const char *path, char ret_path[PATH_MAX]) {
  char cur[PATH_MAX] = "", rest[PATH_MAX], host[PATH_MAX], target[PATH_MAX], tmp[PATH_MAX];
  int links = 0;
  if (path[0] != '/' || join(rest, sizeof rest, path, "") < 0)
    return GN_EINVAL;
  char *p = rest;
  while (*p) {
    while (*p == '/')
      p++;
    if (!*p)
      break;
    char *end = strchr(p, '/');
    size_t len = end ? (size_t)(end - p) : strlen(p);
    if (len == 1 && p[0] == '.') {
      p += len;
      continue;
    }
    if (len == 2 && p[0] == '.' && p[1] == '.') {
      char *slash = strrchr(cur, '/');
      if (slash)
        *slash = '\0'; /* at the root, ".." is the root */
      p += len;
      continue;
    }
    size_t cl = strlen(cur);
    if (cl + 1 + len >= sizeof cur)
      return GN_ETOOBIG;
    char next[PATH_MAX];
    memcpy(next, cur, cl);
    next[cl] = '/';
    memcpy(next + cl + 1, p, len);
    next[cl + 1 + len] = '\0';
    p += len;
    if (join(host, sizeof host, c->root, next) < 0)
      return GN_ETOOBIG;
    struct stat st;
    if (lstat(host, &st) < 0)
      return errno == ENOENT || errno == ENOTDIR || errno == EACCES ? GN_ENOTFOUND : -errno;
    if (S_ISLNK(st.st_mode)) {
      if (++links > LINKS_MAX)
        return GN_EINVAL;
      ssize_t tl = readlink(host, target, sizeof target - 1);
      if (tl <= 0)
        return GN_ENOTFOUND;
      target[tl] = '\0';
      /* What remains of the path is looked up after the link's target. */
      int n = snprintf(tmp, sizeof tmp, "%s/%s", target, p);
      if (n < 0 || (size_t)n >= sizeof tmp)
        return GN_ETOOBIG;
      memcpy(rest, tmp, (size_t)n + 1);
      p = rest;
      if (target[0] == '/')
        cur[0] = '\0';
      continue;
    }
    /* Only a folder may have more components after it. */
    const char *q = p;
    while (*q == '/')
      q++;
    if (*q && !S_ISDIR(st.st_mode))
      return GN_ENOTFOUND;
    memcpy(cur, next, strlen(next) + 1);
  }
  if (!cur[0])
    return join(ret_path, PATH_MAX, "/", "");
  return join(ret_path, PATH_MAX, cur, "");
}

/* The host path of an in-root path. */
static int host_path(const ctx *c, const char *in_root, char out[PATH_MAX]) {
  return join(out, PATH_MAX, c->root, in_root);
}

/* --- the driver's version --------------------------------------------------*/

static bool version_valid(const char *v, size_t n) {
  if (n == 0 || n > VERSION_MAX_LEN || v[0] < '0' || v[0] > '9' || v[n - 1] == '.')
    return false;
  for (size_t i = 0; i < n; i++)
    if (!((v[i] >= '0' && v[i] <= '9') || (v[i] == '.' && v[i - 1] != '.')))
      return false;
  return true;
}

/* Reads at most cap-1 bytes of an in-root file (links resolved in the root). */
static ssize_t read_small(const ctx *c, const char *path, char *buf, size_t cap) {
  char r[PATH_MAX], h[PATH_MAX];
  if (resolve_in_root(c, path, r) < 0 || host_path(c, r, h) < 0)
    return -1;
  int fd = open(h, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
  if (fd < 0)
    return -1;
  struct stat st;
  ssize_t n = -1;
  if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode))
    n = read(fd, buf, cap - 1);
  close(fd);
  if (n >= 0)
    buf[n] = '\0';
  return n;
}

/* The loaded kernel module's version ("550.54.15"), as libnvidia-container
 * reads it, so that libraries left behind by an older driver are not
 * passed: they would fail with a version mismatch. "" when no module is
 * loaded (then any versioned library is taken). */
static void driver_version(ctx *c) {
  char buf[512];
  c->version[0] = '\0';
  ssize_t n = read_small(c, "/sys/module/nvidia/version", buf, sizeof buf);
  if (n > 0) {
    size_t l = strcspn(buf, "\n");
    if (version_valid(buf, l)) {
      memcpy(c->version, buf, l);
      c->version[l] = '\0';
      return;
    }
  }
  /* "NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15  Tue Mar ..." */
  n = read_small(c, "/proc/driver/nvidia/version", buf, sizeof buf);
  const char *k = n > 0 ? strstr(buf, "Kernel Module") : NULL;
  if (!k)
    return;
  k += strlen("Kernel Module");
  k += strspn(k, " \t");
  size_t l = strspn(k, "0123456789.");
  if (version_valid(k, l)) {
    memcpy(c->version, k, l);
    c->version[l] = '\0';
  }
}

/* --- device nodes ----------------------------------------------------------*/

/* Adds ROOT/dev/name as /dev/name. want_major/want_minor: the numbers the
 * driver always gives the node, or -1 where it picks one at load time.
 * GN_ENOTFOUND when missing, with a message only when missing is given
 * (what to tell the provider). */
static int add_node(ctx *c, const char *name, int want_major, int want_minor, const char *missing, char *err,
                    size_t err_cap) {
  gn_nvidia_pass *p = c->pass;
  char dest[64], src[PATH_MAX];
  snprintf(dest, sizeof dest, "/dev/%s", name);
  if (host_path(c, dest, src) < 0 || strlen(src) >= sizeof p->strings[0][0])
    return gn__err(err, err_cap, GN_ETOOBIG, "the root path is too long");
  struct stat st;
  /* lstat: a device node is never a link, and one that is is not followed. */
  if (lstat(src, &st) < 0) {
    if (errno != ENOENT)
      return gn__err(err, err_cap, -errno, "%s: %s", src, strerror(errno));
    if (!missing)
      return GN_ENOTFOUND;
    return gn__err(err, err_cap, GN_ENOTFOUND, "%s is missing: %s", src, missing);
  }
  if (!S_ISCHR(st.st_mode))
    return gn__err(err, err_cap, GN_EINVAL, "%s is not a character device; refusing to pass it to a job", src);
  if ((want_major >= 0 && major(st.st_rdev) != (unsigned)want_major) ||
      (want_minor >= 0 && minor(st.st_rdev) != (unsigned)want_minor))
    return gn__err(err, err_cap, GN_EINVAL, "%s is device %u:%u, not the NVIDIA driver's; refusing to pass it to a job",
                   src, major(st.st_rdev), minor(st.st_rdev));
  if (p->n_nodes >= GN_NVIDIA_MAX_NODES)
    return gn__err(err, err_cap, GN_ETOOBIG, "more than %d device nodes", GN_NVIDIA_MAX_NODES);
  size_t i = p->n_nodes++;
  memcpy(p->strings[i][0], src, strlen(src) + 1);
  memcpy(p->strings[i][1], dest, strlen(dest) + 1);
  return 0;
}

/* --- binds -----------------------------------------------------------------*/

/* True for a path a runtime's mount options can carry: printable, no comma
 * (it would split the options on some runtimes), no newline. */
static bool path_usable(const char *s) {
  for (; *s; s++)
    if ((unsigned char)*s < 0x20 || *s == 0x7f || *s == ',')
      return false;
  return true;
}

/* 0: bound (or dest already bound: the first, preferred, source wins);
 * 1: skipped, a path too long for the storage or with bytes no driver's
 * path has; GN_ETOOBIG: no room left. */
static int add_bind(ctx *c, const char *src, const char *dest, char *err, size_t err_cap) {
  gn_nvidia_pass *p = c->pass;
  if (strlen(src) >= sizeof p->strings[0][0] || strlen(dest) >= sizeof p->strings[0][1] || !path_usable(src) ||
      !path_usable(dest))
    return 1;
  for (size_t i = 0; i < p->n_binds; i++)
    if (strcmp(p->strings[GN_NVIDIA_MAX_NODES + i][1], dest) == 0)
      return 0;
  if (p->n_binds >= GN_NVIDIA_MAX_BINDS)
    return gn__err(err, err_cap, GN_ETOOBIG, "more than %d driver files to bind", GN_NVIDIA_MAX_BINDS);
  size_t i = GN_NVIDIA_MAX_NODES + p->n_binds++;
  memcpy(p->strings[i][0], src, strlen(src) + 1);
  memcpy(p->strings[i][1], dest, strlen(dest) + 1);
  return 0;
}

/* True for a plain file name the loader could know a library by. */
static bool name_valid(const char *s, size_t n) {
  if (n == 0 || n > NAME_MAX_LEN || s[0] == '.')
    return false;
  for (size_t i = 0; i < n; i++) {
    char ch = s[i];
    if (!((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') || ch == '.' || ch == '_' ||
          ch == '-' || ch == '+'))
      return false;
  }
  return true;
}

/* The library in the table that key names ("libcuda.so", "libcuda.so.1",
 * "libcuda.so.550.54.15"), or -1. */
static int lib_of(const char *key) {
  size_t kl = strlen(key);
  if (!name_valid(key, kl))
    return -1;
  for (size_t i = 0; i < NLIBS; i++) {
    size_t l = strlen(libs[i].name);
    if (kl >= l && memcmp(key, libs[i].name, l) == 0 && (key[l] == '\0' || key[l] == '.'))
      return (int)i;
  }
  return -1;
}

/* Adds the candidate dir/name, known to the loader as key. */
static void add_cand(ctx *c, int lib, const char *key, const char *dir, const char *name, bool is_link) {
  lib_cands *lc = &c->cands[lib];
  if (lc->n >= CANDS_MAX)
    return;
  cand *k = &lc->c[lc->n];
  int n = snprintf(k->path, sizeof k->path, "%s/%s", strcmp(dir, "/") == 0 ? "" : dir, name);
  if (n < 0 || (size_t)n >= sizeof k->path)
    return;
  snprintf(k->key, sizeof k->key, "%s", key);
  k->is_link = is_link;
  lc->n++;
}

/* --- the ld cache ----------------------------------------------------------*/

static uint32_t rd32(const uint8_t *p) {
  uint32_t v;
  memcpy(&v, p, 4);
  return v;
}

/* A NUL-terminated string at off in [0, n), or NULL. */
static const char *ldc_str(const uint8_t *b, size_t n, uint32_t off) {
  if (off >= n)
    return NULL;
  const void *z = memchr(b + off, '\0', n - off);
  return z ? (const char *)(b + off) : NULL;
}

/* Adds a candidate for every entry of this architecture whose name is one
 * of the table's libraries, in the cache's order (the loader's order of
 * preference). The whole cache is checked before anything is taken from
 * it: GN_EINVAL for a cache that is not glibc's, or whose counts or
 * offsets point outside the file. */
static int ldcache_parse(ctx *c, const uint8_t *b, size_t n) {
  size_t off = 0;
  if (n >= LDC_OLD_HEADER && memcmp(b, LDC_OLD_MAGIC, strlen(LDC_OLD_MAGIC)) == 0) {
    /* The old libc5 table first, the new format after it, 8-aligned. */
    uint32_t nold = rd32(b + 12);
    if (nold > (n - LDC_OLD_HEADER) / LDC_OLD_ENTRY)
      return GN_EINVAL;
    off = LDC_OLD_HEADER + (size_t)nold * LDC_OLD_ENTRY;
    off = (off + 7u) & ~(size_t)7u;
  }
  if (off > n || n - off < LDC_NEW_HEADER || memcmp(b + off, LDC_NEW_MAGIC, strlen(LDC_NEW_MAGIC)) != 0)
    return GN_EINVAL;
  const uint8_t *h = b + off;
  size_t hn = n - off; /* string offsets count from the new header */
  uint32_t nlibs = rd32(h + 20);
  if (nlibs > LDCACHE_MAX_ENTRIES || nlibs > (hn - LDC_NEW_HEADER) / LDC_NEW_ENTRY)
    return GN_EINVAL;
  for (int pass = 0; pass < 2; pass++) {
    for (uint32_t i = 0; i < nlibs; i++) {
      const uint8_t *e = h + LDC_NEW_HEADER + (size_t)i * LDC_NEW_ENTRY;
      uint32_t flags = rd32(e);
      const char *key = ldc_str(h, hn, rd32(e + 4));
      const char *value = ldc_str(h, hn, rd32(e + 8));
      if (!key || !value)
        return GN_EINVAL;
      if (pass == 0)
        continue; /* the first pass only checks */
      if ((flags & LDC_FLAG_TYPE_MASK) != LDC_FLAG_ELF_LIBC6 || (flags & LDC_FLAG_ARCH_MASK) != LDC_ARCH)
        continue;
      int lib = lib_of(key);
      size_t vl = strlen(value);
      if (lib < 0 || value[0] != '/' || vl >= PATH_MAX)
        continue;
      /* The value is the folder where the loader finds the key. */
      char dir[PATH_MAX];
      memcpy(dir, value, vl + 1);
      char *slash = strrchr(dir, '/');
      const char *base = slash + 1;
      if (slash == dir)
        dir[1] = '\0';
      else
        *slash = '\0';
      if (!name_valid(base, strlen(base)))
        continue;
      /* Link the key's name in the folder of the value, as the loader sees it. */
      char name[NAME_MAX_LEN + 1];
      snprintf(name, sizeof name, "%s", base);
      add_cand(c, lib, key, dir, name, false);
    }
  }
  return 0;
}

/* Reads ROOT/etc/ld.so.cache and takes candidates from it. GN_ENOTFOUND
 * when there is none; GN_EINVAL when it is not one we trust to read. */
static int ldcache_load(ctx *c) {
  char r[PATH_MAX], h[PATH_MAX];
  int rc = resolve_in_root(c, "/etc/ld.so.cache", r);
  if (rc < 0)
    return rc;
  if ((rc = host_path(c, r, h)) < 0)
    return rc;
  int fd = open(h, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
  if (fd < 0)
    return GN_ENOTFOUND;
  uint8_t *b = NULL;
  struct stat st;
  rc = GN_EINVAL;
  if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode) || st.st_size <= 0 || (uint64_t)st.st_size > LDCACHE_MAX_BYTES)
    goto out;
  size_t n = (size_t)st.st_size, got = 0;
  if (!(b = malloc(n))) {
    rc = GN_ENOMEM;
    goto out;
  }
  while (got < n) {
    ssize_t k = read(fd, b + got, n - got);
    if (k < 0 && errno == EINTR)
      continue;
    if (k <= 0)
      break;
    got += (size_t)k;
  }
  if (got == n)
    rc = ldcache_parse(c, b, n);
out:
  free(b);
  close(fd);
  return rc;
}

/* --- the library folders ---------------------------------------------------*/

/* Links before files (a link is the installer's choice), then higher
 * versions first: a fixed order for what readdir returns in any order. */
static int cand_cmp(const void *a, const void *b) {
  const cand *x = a, *y = b;
  if (x->is_link != y->is_link)
    return x->is_link ? -1 : 1;
  return -strverscmp(x->key, y->key);
}

/* Replaces the candidates of every library still without a file (none in
 * the cache, or none there of the loaded driver) with what the standard
 * folders hold, folder by folder. */
static void scan_dirs(ctx *c) {
  enum { NDIRS = sizeof(lib_dirs) / sizeof(lib_dirs[0]) };
  bool want[NLIBS], any = false;
  for (size_t i = 0; i < NLIBS; i++) {
    want[i] = !c->cands[i].chosen[0];
    if (want[i])
      c->cands[i].n = 0;
    any |= want[i];
  }
  char seen[NDIRS][PATH_MAX];
  for (size_t d = 0; any && d < NDIRS; d++) {
    char r[PATH_MAX], h[PATH_MAX];
    seen[d][0] = '\0';
    if (resolve_in_root(c, lib_dirs[d], r) < 0 || host_path(c, r, h) < 0)
      continue;
    bool dup = false;
    for (size_t e = 0; e < d; e++)
      dup |= strcmp(seen[e], r) == 0; /* /usr/lib64 -> lib: one folder */
    memcpy(seen[d], r, strlen(r) + 1);
    DIR *dir = dup ? NULL : opendir(h);
    if (!dir)
      continue;
    size_t start[NLIBS];
    for (size_t i = 0; i < NLIBS; i++)
      start[i] = c->cands[i].n;
    struct dirent *de;
    for (unsigned k = 0; k < SCAN_MAX_ENTRIES && (de = readdir(dir)); k++) {
      int lib = lib_of(de->d_name);
      struct stat st;
      if (lib < 0 || !want[lib] || fstatat(dirfd(dir), de->d_name, &st, AT_SYMLINK_NOFOLLOW) < 0)
        continue;
      add_cand(c, lib, de->d_name, r, de->d_name, S_ISLNK(st.st_mode));
    }
    closedir(dir);
    for (size_t i = 0; i < NLIBS; i++)
      if (c->cands[i].n > start[i])
        qsort(c->cands[i].c + start[i], c->cands[i].n - start[i], sizeof(cand), cand_cmp);
  }
}

/* True when the resolved file's name is this library's versioned file:
 * "libcuda.so.550.54.15" for the loaded driver, or any "libcuda.so.N[.N]"
 * when no driver version is known. */
static bool versioned_name_ok(const ctx *c, const char *lib, const char *base) {
  size_t l = strlen(lib);
  if (strncmp(base, lib, l) != 0 || base[l] != '.')
    return false;
  const char *v = base + l + 1;
  if (c->version[0])
    return strcmp(v, c->version) == 0;
  return version_valid(v, strlen(v));
}

/* Picks each library's file: the first candidate, in the loader's order,
 * that resolves inside the root to a regular file of the loaded driver
 * whose path a mount can carry. */
static void pick(ctx *c) {
  for (size_t i = 0; i < NLIBS; i++) {
    lib_cands *lc = &c->cands[i];
    for (size_t k = 0; k < lc->n && !lc->chosen[0]; k++) {
      char r[PATH_MAX], h[PATH_MAX];
      struct stat st;
      if (resolve_in_root(c, lc->c[k].path, r) == 0 && path_usable(r) && host_path(c, r, h) == 0 && stat(h, &st) == 0 &&
          S_ISREG(st.st_mode) && versioned_name_ok(c, libs[i].name, strrchr(r, '/') + 1))
        memcpy(lc->chosen, r, strlen(r) + 1);
    }
  }
}

/* Binds each library's file at its own path and under every candidate name
 * that resolves to it (libcuda.so.1 in the folder the loader looks in:
 * the container has no ldconfig run to make the links), plus libcuda.so,
 * which the toolkit always links. */
static int add_libraries(ctx *c, char *err, size_t err_cap) {
  for (size_t i = 0; i < NLIBS; i++) {
    const lib_cands *lc = &c->cands[i];
    char src[PATH_MAX], r[PATH_MAX], dir[PATH_MAX], dest[PATH_MAX];
    int rc;
    if (!lc->chosen[0]) {
      if (libs[i].required)
        return gn__err(err, err_cap, GN_ENOTFOUND,
                       "%s%s%s is in neither %s/etc/ld.so.cache nor the library folders: is the NVIDIA driver's "
                       "user-space part installed?",
                       libs[i].name, c->version[0] ? " of driver " : "", c->version, c->root);
      continue;
    }
    if (host_path(c, lc->chosen, src) < 0 || (rc = add_bind(c, src, lc->chosen, err, err_cap)) == 1)
      continue;
    if (rc < 0)
      return rc;
    size_t ndest = 1;
    for (size_t k = 0; k < lc->n && ndest < DESTS_PER_LIB; k++) {
      if (resolve_in_root(c, lc->c[k].path, r) < 0 || strcmp(r, lc->chosen) != 0)
        continue;
      /* The candidate's folder, links resolved. */
      size_t dl = (size_t)(strrchr(lc->c[k].path, '/') - lc->c[k].path);
      memcpy(dir, lc->c[k].path, dl);
      dir[dl] = '\0';
      if (resolve_in_root(c, dl ? dir : "/", r) < 0)
        continue;
      int n = snprintf(dest, sizeof dest, "%s/%s", strcmp(r, "/") == 0 ? "" : r, lc->c[k].key);
      if (n < 0 || (size_t)n >= sizeof dest || strcmp(dest, lc->chosen) == 0)
        continue;
      size_t before = c->pass->n_binds;
      if ((rc = add_bind(c, src, dest, err, err_cap)) < 0)
        return rc;
      ndest += c->pass->n_binds > before;
    }
    if (strcmp(libs[i].name, "libcuda.so") == 0) {
      memcpy(dest, lc->chosen, strlen(lc->chosen) + 1);
      strcpy(strrchr(dest, '/') + 1, "libcuda.so"); /* shorter than the versioned name it replaces */
      if ((rc = add_bind(c, src, dest, err, err_cap)) < 0)
        return rc;
    }
  }
  return 0;
}

static int add_binaries(ctx *c, char *err, size_t err_cap) {
  for (size_t i = 0; i < NBINS; i++) {
    char path[64], r[PATH_MAX], h[PATH_MAX];
    struct stat st;
    snprintf(path, sizeof path, "/usr/bin/%s", bins[i]);
    if (resolve_in_root(c, path, r) < 0 || host_path(c, r, h) < 0 || stat(h, &st) < 0 || !S_ISREG(st.st_mode) ||
        !(st.st_mode & 0111))
      continue;
    int rc = add_bind(c, h, path, err, err_cap);
    if (rc < 0)
      return rc;
  }
  return 0;
}

/* --- the whole ---------------------------------------------------------------*/

int gn_nvidia_passthrough(const char *root, const unsigned *minors, size_t n, gn_nvidia_pass *ret, char *err,
                          size_t err_cap) {
  if (!root || root[0] != '/' || !ret || (n && !minors))
    return gn__err(err, err_cap, GN_EINVAL, "GPU passthrough needs an absolute root and the leased GPUs");
  if (n == 0)
    return gn__err(err, err_cap, GN_EINVAL, "no GPU leased: nothing to pass through");
  if (n > GN_NVIDIA_MAX_NODES - 4)
    return gn__err(err, err_cap, GN_ETOOBIG, "%zu GPUs to pass; at most %d", n, GN_NVIDIA_MAX_NODES - 4);
  for (size_t i = 0; i < n; i++)
    if (minors[i] > NV_GPU_MINOR_MAX)
      return gn__err(err, err_cap, GN_EINVAL, "/dev/nvidia%u is not a GPU (GPU minors are 0..%u)", minors[i],
                     NV_GPU_MINOR_MAX);

  int rc = GN_ENOMEM;
  ctx *c = calloc(1, sizeof *c);
  gn_nvidia_pass *p = calloc(1, sizeof *p);
  lib_cands *cands = calloc(NLIBS, sizeof *cands);
  if (!c || !p || !cands) {
    gn__err(err, err_cap, rc, "out of memory");
    goto out;
  }
  c->pass = p;
  c->cands = cands;
  size_t rl = strlen(root);
  while (rl > 0 && root[rl - 1] == '/')
    rl--;
  if (rl >= sizeof c->root - 256) {
    rc = gn__err(err, err_cap, GN_ETOOBIG, "the root path is too long");
    goto out;
  }
  memcpy(c->root, root, rl);
  c->root[rl] = '\0';
  if (!path_usable(c->root)) {
    rc = gn__err(err, err_cap, GN_EINVAL, "the root path has a comma or a control byte");
    goto out;
  }

  /* The leased GPUs' nodes, each once, then the control and UVM nodes. */
  for (size_t i = 0; i < n; i++) {
    bool dup = false;
    for (size_t j = 0; j < i; j++)
      dup |= minors[j] == minors[i];
    if (dup)
      continue;
    char name[32];
    snprintf(name, sizeof name, "nvidia%u", minors[i]);
    if ((rc = add_node(c, name, NV_MAJOR, (int)minors[i], "is the leased GPU still there and its driver loaded?", err,
                       err_cap)) < 0)
      goto out;
  }
  if ((rc = add_node(c, "nvidiactl", NV_MAJOR, NV_CTL_MINOR, "is the NVIDIA driver loaded?", err, err_cap)) < 0)
    goto out;
  /* UVM's major is dynamic; its minors are fixed. */
  static const struct {
    const char *name;
    int major, minor;
  } optional[] = {{"nvidia-uvm", -1, 0}, {"nvidia-uvm-tools", -1, 1}, {"nvidia-modeset", NV_MAJOR, NV_MODESET_MINOR}};
  for (size_t i = 0; i < sizeof optional / sizeof optional[0]; i++) {
    rc = add_node(c, optional[i].name, optional[i].major, optional[i].minor, NULL, err, err_cap);
    if (rc < 0 && rc != GN_ENOTFOUND)
      goto out;
  }

  driver_version(c);
  /* The cache first, as the loader; what it lacks (or has only of another
   * driver version), from the folders. A missing or malformed cache is not
   * an error: the folders are scanned for everything. */
  rc = ldcache_load(c);
  if (rc == GN_ENOMEM) {
    gn__err(err, err_cap, rc, "out of memory reading ld.so.cache");
    goto out;
  }
  pick(c);
  scan_dirs(c);
  pick(c);
  if ((rc = add_libraries(c, err, err_cap)) < 0 || (rc = add_binaries(c, err, err_cap)) < 0)
    goto out;

  /* Commit: the pointers point into ret's own storage. */
  memcpy(ret, p, sizeof *ret);
  for (size_t i = 0; i < ret->n_nodes; i++) {
    ret->nodes[i].source = ret->strings[i][0];
    ret->nodes[i].dest = ret->strings[i][1];
  }
  for (size_t i = 0; i < ret->n_binds; i++) {
    ret->binds[i].source = ret->strings[GN_NVIDIA_MAX_NODES + i][0];
    ret->binds[i].dest = ret->strings[GN_NVIDIA_MAX_NODES + i][1];
  }
  rc = 0;
out:
  free(cands);
  free(p);
  free(c);
  return rc;
}
