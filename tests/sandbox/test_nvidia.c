/* GPU passthrough against a FAKE NVIDIA device tree built at test time (no
 * GPU here): real character device nodes made with mknod under a temp root
 * (the driver's real numbers: 195:N for nvidiaN, 195:255 nvidiactl, 195:254
 * nvidia-modeset, a dynamic major for nvidia-uvm), fake driver library
 * files with version suffixes and soname links, a fake nvidia-smi, and
 * ld.so.cache files written by the real ldconfig, by hand, and hostile. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <ftw.h>
#include <gpunet/sandbox.h>
#include <jansson.h>
#include <sys/sysmacros.h>

#include "sandbox/helpers.h"

#define VER "550.54.15"
#define STALE "535.104.05"
#define LIBDIR "/usr/lib/x86_64-linux-gnu"
#define UVM_MAJOR 510

typedef struct tree {
  char *root;    /* the fake host root */
  char *outside; /* a folder beside it, for links that try to escape */
} tree;

static void p(const tree *t, char *out, size_t cap, const char *rel) {
  snprintf(out, cap, "%s%s", t->root, rel);
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
  mkdir(b, 0755);
}

static void put_file(const tree *t, const char *rel, mode_t mode) {
  char path[4096], dir[4096];
  p(t, path, sizeof path, rel);
  snprintf(dir, sizeof dir, "%s", path);
  *strrchr(dir, '/') = '\0';
  mkdirs(dir);
  assert_int_equal(th_write_file(path, rel, strlen(rel)), 0);
  assert_int_equal(chmod(path, mode), 0);
}

static void put_link(const tree *t, const char *rel, const char *target) {
  char path[4096];
  p(t, path, sizeof path, rel);
  unlink(path);
  assert_int_equal(symlink(target, path), 0);
}

static void put_node(const tree *t, const char *rel, unsigned maj, unsigned min) {
  char path[4096];
  p(t, path, sizeof path, rel);
  unlink(path);
  if (mknod(path, S_IFCHR | 0666, makedev(maj, min)) != 0)
    fail_msg("mknod %s: %s", path, strerror(errno));
}

static void rm(const tree *t, const char *rel) {
  char path[4096];
  p(t, path, sizeof path, rel);
  assert_int_equal(unlink(path), 0);
}

/* A driver library as the NVIDIA installer lays it out: the versioned file,
 * then the soname link (and for some, the development link). */
static void put_lib(const tree *t, const char *dir, const char *name, const char *version, const char *soname) {
  char rel[512], target[256];
  snprintf(rel, sizeof rel, "%s/%s.%s", dir, name, version);
  put_file(t, rel, 0755);
  snprintf(target, sizeof target, "%s.%s", name, version);
  if (soname) {
    snprintf(rel, sizeof rel, "%s/%s", dir, soname);
    put_link(t, rel, target);
  }
}

/* The whole fake host: two GPUs, the control, UVM and modeset nodes, the
 * driver version 550.54.15 loaded, its libraries under LIBDIR, a stale
 * libnvidia-cfg of an older driver, nvidia-smi, and no ld.so.cache. */
static int tree_setup(void **state) {
  *state = NULL;
  if (geteuid() != 0) {
    print_message("not root: the fake device tree needs mknod, so every case here is skipped\n");
    return 0;
  }
  tree *t = calloc(1, sizeof *t);
  t->root = th_mkdtemp("nvroot");
  t->outside = th_mkdtemp("nvout");
  assert_non_null(t->root);
  assert_non_null(t->outside);
  /* A job in a user namespace must reach the bind sources. */
  assert_int_equal(chmod(t->root, 0755), 0);
  char d[4096];
  p(t, d, sizeof d, "/dev");
  mkdirs(d);
  put_node(t, "/dev/nvidia0", 195, 0);
  put_node(t, "/dev/nvidia1", 195, 1);
  put_node(t, "/dev/nvidiactl", 195, 255);
  put_node(t, "/dev/nvidia-modeset", 195, 254);
  put_node(t, "/dev/nvidia-uvm", UVM_MAJOR, 0);
  put_node(t, "/dev/nvidia-uvm-tools", UVM_MAJOR, 1);
  put_file(t, "/sys/module/nvidia/version", 0644);
  char v[4096];
  p(t, v, sizeof v, "/sys/module/nvidia/version");
  assert_int_equal(th_write_file(v, VER "\n", strlen(VER) + 1), 0);

  put_lib(t, LIBDIR, "libcuda.so", VER, "libcuda.so.1");
  put_link(t, LIBDIR "/libcuda.so", "libcuda.so.1");
  put_lib(t, LIBDIR, "libnvidia-ml.so", VER, "libnvidia-ml.so.1");
  put_lib(t, LIBDIR, "libnvidia-ptxjitcompiler.so", VER, "libnvidia-ptxjitcompiler.so.1");
  put_lib(t, LIBDIR, "libnvidia-nvvm.so", VER, "libnvidia-nvvm.so.4");
  put_lib(t, LIBDIR, "libnvidia-gpucomp.so", VER, NULL); /* its soname is its versioned name */
  put_lib(t, LIBDIR, "libnvidia-cfg.so", STALE, "libnvidia-cfg.so.1");
  /* Not a driver library, though its name starts like one. */
  put_file(t, LIBDIR "/libcudart.so." VER, 0755);
  put_file(t, "/usr/bin/nvidia-smi", 0755);
  put_file(t, "/usr/bin/nvidia-persistenced", 0644); /* not executable: not passed */
  *state = t;
  return 0;
}

static int tree_teardown(void **state) {
  tree *t = *state;
  if (!t)
    return 0;
  th_rm_rf(t->root);
  th_rm_rf(t->outside);
  free(t->root);
  free(t->outside);
  free(t);
  return 0;
}

static const char *dest_source(const gn_bundle_bind *b, size_t n, const char *dest) {
  for (size_t i = 0; i < n; i++)
    if (strcmp(b[i].dest, dest) == 0)
      return b[i].source;
  return NULL;
}

static void want_bind(const tree *t, const gn_nvidia_pass *ps, const char *dest, const char *rel_source) {
  char src[4096];
  p(t, src, sizeof src, rel_source);
  const char *got = dest_source(ps->binds, ps->n_binds, dest);
  if (!got)
    fail_msg("no bind at %s", dest);
  assert_string_equal(got, src);
}

static void want_no_bind_like(const gn_nvidia_pass *ps, const char *needle) {
  for (size_t i = 0; i < ps->n_binds; i++)
    if (strstr(ps->binds[i].dest, needle) || strstr(ps->binds[i].source, needle))
      fail_msg("unexpected bind %s -> %s", ps->binds[i].source, ps->binds[i].dest);
}

static gn_nvidia_pass *pass_ok(const tree *t, const unsigned *minors, size_t n) {
  gn_nvidia_pass *ps = calloc(1, sizeof *ps);
  char err[512] = "";
  int rc = gn_nvidia_passthrough(t->root, minors, n, ps, err, sizeof err);
  if (rc)
    fail_msg("gn_nvidia_passthrough: %s (%s)", gn_strerror(rc), err);
  return ps;
}

/* Every source lies under the root; every dest is absolute. */
static void all_under_root(const tree *t, const gn_nvidia_pass *ps) {
  size_t rl = strlen(t->root);
  for (size_t i = 0; i < ps->n_nodes + ps->n_binds; i++) {
    const gn_bundle_bind *b = i < ps->n_nodes ? &ps->nodes[i] : &ps->binds[i - ps->n_nodes];
    if (strncmp(b->source, t->root, rl) != 0 || b->source[rl] != '/')
      fail_msg("%s is outside the root %s", b->source, t->root);
    assert_true(b->dest[0] == '/');
  }
}

static void test_nvidia_passes_leased_gpu_and_control_nodes_only(void **state) {
  tree *t = *state;
  if (!t)
    skip();
  unsigned minors[] = {0};
  gn_nvidia_pass *ps = pass_ok(t, minors, 1);
  static const char *const want[] = {"/dev/nvidia0", "/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools",
                                     "/dev/nvidia-modeset"};
  assert_int_equal(ps->n_nodes, 5);
  for (size_t i = 0; i < 5; i++) {
    char src[4096];
    p(t, src, sizeof src, want[i]);
    assert_string_equal(ps->nodes[i].dest, want[i]);
    assert_string_equal(ps->nodes[i].source, src);
  }
  assert_null(dest_source(ps->nodes, ps->n_nodes, "/dev/nvidia1")); /* not leased */
  all_under_root(t, ps);
  free(ps);
}

static void test_nvidia_passes_each_leased_gpu_once(void **state) {
  tree *t = *state;
  if (!t)
    skip();
  unsigned minors[] = {1, 0, 1};
  gn_nvidia_pass *ps = pass_ok(t, minors, 3);
  assert_int_equal(ps->n_nodes, 6);
  assert_string_equal(ps->nodes[0].dest, "/dev/nvidia1");
  assert_string_equal(ps->nodes[1].dest, "/dev/nvidia0");
  assert_string_equal(ps->nodes[2].dest, "/dev/nvidiactl");
  free(ps);
}

static void test_nvidia_missing_leased_node_is_enotfound(void **state) {
  tree *t = *state;
  if (!t)
    skip();
  unsigned minors[] = {0, 3};
  gn_nvidia_pass *ps = calloc(1, sizeof *ps);
  ps->n_nodes = 77; /* written only on success */
  char err[512] = "";
  assert_int_equal(gn_nvidia_passthrough(t->root, minors, 2, ps, err, sizeof err), GN_ENOTFOUND);
  assert_non_null(strstr(err, "/dev/nvidia3"));
  assert_int_equal(ps->n_nodes, 77);
  free(ps);
}

static void test_nvidia_missing_control_node_is_enotfound(void **state) {
  tree *t = *state;
  if (!t)
    skip();
  unsigned minors[] = {0};
  gn_nvidia_pass *ps = calloc(1, sizeof *ps);
  char err[512] = "";
  rm(t, "/dev/nvidiactl");
  assert_int_equal(gn_nvidia_passthrough(t->root, minors, 1, ps, err, sizeof err), GN_ENOTFOUND);
  assert_non_null(strstr(err, "nvidiactl"));
  put_node(t, "/dev/nvidiactl", 195, 255);
  free(ps);
}

static void test_nvidia_uvm_and_modeset_nodes_are_optional(void **state) {
  tree *t = *state;
  if (!t)
    skip();
  unsigned minors[] = {0};
  rm(t, "/dev/nvidia-uvm-tools");
  rm(t, "/dev/nvidia-modeset");
  gn_nvidia_pass *ps = pass_ok(t, minors, 1);
  assert_int_equal(ps->n_nodes, 3);
  assert_string_equal(ps->nodes[2].dest, "/dev/nvidia-uvm");
  put_node(t, "/dev/nvidia-uvm-tools", UVM_MAJOR, 1);
  put_node(t, "/dev/nvidia-modeset", 195, 254);
  free(ps);
}

/* A node that is a file, a link, or another device is refused, not passed. */
static void test_nvidia_refuses_what_is_not_the_drivers_node(void **state) {
  tree *t = *state;
  if (!t)
    skip();
  unsigned minors[] = {0};
  char err[512];
  gn_nvidia_pass *ps = calloc(1, sizeof *ps);
  for (int c = 0; c < 4; c++) {
    rm(t, "/dev/nvidia0");
    if (c == 0)
      put_file(t, "/dev/nvidia0", 0666);
    else if (c == 1)
      put_link(t, "/dev/nvidia0", "/dev/null");
    else if (c == 2)
      put_node(t, "/dev/nvidia0", 1, 3); /* /dev/null's numbers */
    else
      put_node(t, "/dev/nvidia0", 195, 7); /* another GPU's */
    err[0] = '\0';
    assert_int_equal(gn_nvidia_passthrough(t->root, minors, 1, ps, err, sizeof err), GN_EINVAL);
    assert_non_null(strstr(err, "/dev/nvidia0"));
  }
  rm(t, "/dev/nvidia0");
  put_node(t, "/dev/nvidia0", 195, 0);
  free(ps);
}

static void test_nvidia_refuses_bad_arguments(void **state) {
  tree *t = *state;
  if (!t)
    skip();
  gn_nvidia_pass *ps = calloc(1, sizeof *ps);
  unsigned ok[] = {0}, ctl[] = {255}, many[GN_NVIDIA_MAX_NODES];
  for (unsigned i = 0; i < GN_NVIDIA_MAX_NODES; i++)
    many[i] = i;
  assert_int_equal(gn_nvidia_passthrough(t->root, ok, 0, ps, NULL, 0), GN_EINVAL);
  assert_int_equal(gn_nvidia_passthrough(t->root, NULL, 1, ps, NULL, 0), GN_EINVAL);
  assert_int_equal(gn_nvidia_passthrough("relative/root", ok, 1, ps, NULL, 0), GN_EINVAL);
  assert_int_equal(gn_nvidia_passthrough("/tmp/a,b", ok, 1, ps, NULL, 0), GN_EINVAL);
  assert_int_equal(gn_nvidia_passthrough(NULL, ok, 1, ps, NULL, 0), GN_EINVAL);
  assert_int_equal(gn_nvidia_passthrough(t->root, ok, 1, NULL, NULL, 0), GN_EINVAL);
  assert_int_equal(gn_nvidia_passthrough(t->root, ctl, 1, ps, NULL, 0), GN_EINVAL); /* nvidiactl is no GPU */
  assert_int_equal(gn_nvidia_passthrough(t->root, many, GN_NVIDIA_MAX_NODES, ps, NULL, 0), GN_ETOOBIG);
  free(ps);
}

static void test_nvidia_libraries_resolve_to_versioned_files(void **state) {
  tree *t = *state;
  if (!t)
    skip();
  unsigned minors[] = {0};
  gn_nvidia_pass *ps = pass_ok(t, minors, 1);
  /* The versioned file at its own path, and under the names the loader asks for. */
  want_bind(t, ps, LIBDIR "/libcuda.so." VER, LIBDIR "/libcuda.so." VER);
  want_bind(t, ps, LIBDIR "/libcuda.so.1", LIBDIR "/libcuda.so." VER);
  want_bind(t, ps, LIBDIR "/libcuda.so", LIBDIR "/libcuda.so." VER);
  want_bind(t, ps, LIBDIR "/libnvidia-ml.so." VER, LIBDIR "/libnvidia-ml.so." VER);
  want_bind(t, ps, LIBDIR "/libnvidia-ml.so.1", LIBDIR "/libnvidia-ml.so." VER);
  want_bind(t, ps, LIBDIR "/libnvidia-ptxjitcompiler.so.1", LIBDIR "/libnvidia-ptxjitcompiler.so." VER);
  want_bind(t, ps, LIBDIR "/libnvidia-nvvm.so.4", LIBDIR "/libnvidia-nvvm.so." VER);
  want_bind(t, ps, LIBDIR "/libnvidia-gpucomp.so." VER, LIBDIR "/libnvidia-gpucomp.so." VER);
  want_bind(t, ps, "/usr/bin/nvidia-smi", "/usr/bin/nvidia-smi");
  /* 3 for libcuda, 2 each for nvml, ptxjit and nvvm, 1 for gpucomp, nvidia-smi. */
  assert_int_equal(ps->n_binds, 11);
  /* A library of another driver version, a runtime library that only
   * starts like a driver one, a tool that is not executable: left out. */
  want_no_bind_like(ps, "libnvidia-cfg");
  want_no_bind_like(ps, "libcudart");
  want_no_bind_like(ps, "nvidia-persistenced");
  all_under_root(t, ps);
  free(ps);
}

/* Without /sys/module/nvidia/version, the version comes from
 * /proc/driver/nvidia/version; without either, any versioned file goes. */
static void test_nvidia_driver_version_sources(void **state) {
  tree *t = *state;
  if (!t)
    skip();
  unsigned minors[] = {0};
  char sysv[4096], procv[4096];
  p(t, sysv, sizeof sysv, "/sys/module/nvidia/version");
  p(t, procv, sizeof procv, "/proc/driver/nvidia/version");
  rm(t, "/sys/module/nvidia/version");
  put_file(t, "/proc/driver/nvidia/version", 0444);
  const char *text = "NVRM version: NVIDIA UNIX x86_64 Kernel Module  " VER "  Tue Feb 27 18:02:57 UTC 2024\n"
                     "GCC version:  gcc version 12.2.0 (Debian 12.2.0-14)\n";
  assert_int_equal(th_write_file(procv, text, strlen(text)), 0);
  gn_nvidia_pass *ps = pass_ok(t, minors, 1);
  want_no_bind_like(ps, "libnvidia-cfg");
  want_bind(t, ps, LIBDIR "/libcuda.so.1", LIBDIR "/libcuda.so." VER);
  free(ps);
  rm(t, "/proc/driver/nvidia/version");
  ps = pass_ok(t, minors, 1);
  want_bind(t, ps, LIBDIR "/libnvidia-cfg.so.1", LIBDIR "/libnvidia-cfg.so." STALE);
  want_bind(t, ps, LIBDIR "/libcuda.so.1", LIBDIR "/libcuda.so." VER);
  free(ps);
  assert_int_equal(th_write_file(sysv, VER "\n", strlen(VER) + 1), 0);
}

/* Links that lead out of the root, by ".." or by an absolute target, are
 * resolved as in a chroot: they land inside the root, where nothing is, so
 * the library is left out even though the file exists outside. */
static void test_nvidia_symlink_escaping_root_is_ignored(void **state) {
  tree *t = *state;
  if (!t)
    skip();
  unsigned minors[] = {0};
  char out_file[4096], rel[4096];
  snprintf(out_file, sizeof out_file, "%s/libnvidia-opencl.so." VER, t->outside);
  assert_int_equal(th_write_file(out_file, "x", 1), 0);
  snprintf(out_file, sizeof out_file, "%s/libcudadebugger.so." VER, t->outside);
  assert_int_equal(th_write_file(out_file, "x", 1), 0);
  snprintf(out_file, sizeof out_file, "%s/nvidia-debugdump", t->outside);
  assert_int_equal(th_write_file(out_file, "x", 1), 0);
  assert_int_equal(chmod(out_file, 0755), 0);
  /* ../../../../../../../../tmp/gn-nvout-XXXXXX/libnvidia-opencl.so.VER */
  snprintf(rel, sizeof rel, "../../../../../../../..%s/libnvidia-opencl.so." VER, t->outside);
  put_link(t, LIBDIR "/libnvidia-opencl.so.1", rel);
  snprintf(rel, sizeof rel, "%s/libcudadebugger.so." VER, t->outside);
  put_link(t, LIBDIR "/libcudadebugger.so.1", rel);
  snprintf(rel, sizeof rel, "%s/nvidia-debugdump", t->outside);
  put_link(t, "/usr/bin/nvidia-debugdump", rel);
  /* A link loop is no library either. */
  put_link(t, LIBDIR "/libnvidia-allocator.so.1", "libnvidia-allocator.so.1");
  gn_nvidia_pass *ps = pass_ok(t, minors, 1);
  want_no_bind_like(ps, "opencl");
  want_no_bind_like(ps, "debugger");
  want_no_bind_like(ps, "debugdump");
  want_no_bind_like(ps, "allocator");
  want_bind(t, ps, LIBDIR "/libcuda.so.1", LIBDIR "/libcuda.so." VER);
  all_under_root(t, ps);
  free(ps);
  /* An absolute link that stays inside the root is followed inside it. */
  put_file(t, "/opt/nvidia/libnvidia-opencl.so." VER, 0755);
  put_link(t, LIBDIR "/libnvidia-opencl.so.1", "/opt/nvidia/libnvidia-opencl.so." VER);
  ps = pass_ok(t, minors, 1);
  want_bind(t, ps, LIBDIR "/libnvidia-opencl.so.1", "/opt/nvidia/libnvidia-opencl.so." VER);
  want_bind(t, ps, "/opt/nvidia/libnvidia-opencl.so." VER, "/opt/nvidia/libnvidia-opencl.so." VER);
  free(ps);
  rm(t, LIBDIR "/libnvidia-opencl.so.1");
  rm(t, LIBDIR "/libcudadebugger.so.1");
  rm(t, LIBDIR "/libnvidia-allocator.so.1");
  rm(t, "/usr/bin/nvidia-debugdump");
  rm(t, "/opt/nvidia/libnvidia-opencl.so." VER);
}

static void test_nvidia_no_libcuda_is_enotfound(void **state) {
  tree *t = *state;
  if (!t)
    skip();
  unsigned minors[] = {0};
  char err[512] = "";
  gn_nvidia_pass *ps = calloc(1, sizeof *ps);
  rm(t, LIBDIR "/libcuda.so." VER);
  assert_int_equal(gn_nvidia_passthrough(t->root, minors, 1, ps, err, sizeof err), GN_ENOTFOUND);
  assert_non_null(strstr(err, "libcuda.so"));
  put_file(t, LIBDIR "/libcuda.so." VER, 0755);
  free(ps);
}

/* --- ld.so.cache ----------------------------------------------------------*/

typedef struct ldc_entry {
  uint32_t flags;
  const char *key, *value;
} ldc_entry;

/* Writes a cache in glibc's new format ("glibc-ld.so.cache1.1": a 48-byte
 * header, 24-byte entries, then the strings; offsets count from the
 * header), as glibc's sysdeps/generic/dl-cache.h describes it. */
static size_t ldc_build(uint8_t *b, size_t cap, const ldc_entry *e, size_t n) {
  size_t strings = 48 + 24 * n, off = strings;
  memset(b, 0, cap);
  memcpy(b, "glibc-ld.so.cache1.1", 20);
  uint32_t nl = (uint32_t)n;
  memcpy(b + 20, &nl, 4);
  for (size_t i = 0; i < n; i++) {
    uint32_t k, v, f = e[i].flags;
    k = (uint32_t)off;
    memcpy(b + off, e[i].key, strlen(e[i].key) + 1);
    off += strlen(e[i].key) + 1;
    v = (uint32_t)off;
    memcpy(b + off, e[i].value, strlen(e[i].value) + 1);
    off += strlen(e[i].value) + 1;
    memcpy(b + 48 + 24 * i, &f, 4);
    memcpy(b + 48 + 24 * i + 4, &k, 4);
    memcpy(b + 48 + 24 * i + 8, &v, 4);
  }
  uint32_t sl = (uint32_t)(off - strings);
  memcpy(b + 24, &sl, 4);
  assert_true(off <= cap);
  return off;
}

static void put_cache(const tree *t, const void *b, size_t n) {
  char path[4096];
  p(t, path, sizeof path, "/etc");
  mkdirs(path);
  p(t, path, sizeof path, "/etc/ld.so.cache");
  assert_int_equal(th_write_file(path, b, n), 0);
}

/* The cache names libraries in a folder the scan never looks in; an entry
 * for another architecture (i386) and one for a path outside the root are
 * passed over. */
static void test_nvidia_libraries_found_through_ld_cache(void **state) {
  tree *t = *state;
  if (!t)
    skip();
  unsigned minors[] = {0};
  put_lib(t, "/opt/nv/lib", "libnvidia-ml.so", VER, "libnvidia-ml.so.1");
  put_lib(t, "/opt/nv/lib32", "libnvidia-opencl.so", VER, "libnvidia-opencl.so.1");
  char esc[4096];
  snprintf(esc, sizeof esc, "%s/libcudadebugger.so." VER, t->outside);
  assert_int_equal(th_write_file(esc, "x", 1), 0);
  ldc_entry e[] = {
      {0x0303, "libnvidia-ml.so.1", "/opt/nv/lib/libnvidia-ml.so.1"},
      {0x0003, "libnvidia-opencl.so.1", "/opt/nv/lib32/libnvidia-opencl.so.1"}, /* i386 */
      {0x0303, "libcudadebugger.so.1", esc},
      {0x0303, "libz.so.1", "/usr/lib/x86_64-linux-gnu/libz.so.1"},
      /* A path no mount option list can carry: the folders' copy is taken. */
      {0x0303, "libnvidia-ptxjitcompiler.so.1", "/opt/a,b/libnvidia-ptxjitcompiler.so.1"},
  };
  put_lib(t, "/opt/a,b", "libnvidia-ptxjitcompiler.so", VER, "libnvidia-ptxjitcompiler.so.1");
  uint8_t b[4096];
  put_cache(t, b, ldc_build(b, sizeof b, e, 5));
  gn_nvidia_pass *ps = pass_ok(t, minors, 1);
  want_bind(t, ps, "/opt/nv/lib/libnvidia-ml.so.1", "/opt/nv/lib/libnvidia-ml.so." VER);
  want_bind(t, ps, "/opt/nv/lib/libnvidia-ml.so." VER, "/opt/nv/lib/libnvidia-ml.so." VER);
  assert_null(dest_source(ps->binds, ps->n_binds, LIBDIR "/libnvidia-ml.so.1")); /* the cache wins */
  want_no_bind_like(ps, "opencl");
  want_no_bind_like(ps, "debugger");
  want_no_bind_like(ps, ",");
  want_bind(t, ps, LIBDIR "/libnvidia-ptxjitcompiler.so.1", LIBDIR "/libnvidia-ptxjitcompiler.so." VER);
  /* What the cache lacks, the folders give. */
  want_bind(t, ps, LIBDIR "/libcuda.so.1", LIBDIR "/libcuda.so." VER);
  all_under_root(t, ps);
  free(ps);
  rm(t, "/etc/ld.so.cache");
}

/* A cache from the real ldconfig (-r: under the fake root) over real ELF
 * stubs with their sonames: what a provider's host has. */
static void test_nvidia_ld_cache_written_by_ldconfig(void **state) {
  tree *t = *state;
  if (!t)
    skip();
  unsigned minors[] = {0};
  char cmd[8192], path[4096];
  if (th_run("command -v cc >/dev/null && command -v ldconfig >/dev/null", NULL, 0) != 0) {
    print_message("no cc or ldconfig here: the real-ldconfig case is skipped\n");
    skip();
  }
  p(t, path, sizeof path, "/opt/nvidia/lib");
  mkdirs(path);
  static const char *const stubs[][2] = {{"libcuda.so", "libcuda.so.1"}, {"libnvidia-ml.so", "libnvidia-ml.so.1"}};
  for (size_t i = 0; i < 2; i++) {
    snprintf(cmd, sizeof cmd, "cc -shared -nostdlib -Wl,-soname,%s -o '%s/%s.%s' -x c /dev/null", stubs[i][1], path,
             stubs[i][0], VER);
    assert_int_equal(th_run(cmd, NULL, 0), 0);
  }
  p(t, path, sizeof path, "/etc");
  mkdirs(path);
  p(t, path, sizeof path, "/etc/ld.so.conf");
  assert_int_equal(th_write_file(path, "/opt/nvidia/lib\n", 16), 0);
  /* The folder the scan would look in holds a copy the cache does not name. */
  snprintf(cmd, sizeof cmd, "ldconfig -r '%s' 2>&1", t->root);
  assert_int_equal(th_run(cmd, NULL, 0), 0);
  gn_nvidia_pass *ps = pass_ok(t, minors, 1);
  want_bind(t, ps, "/opt/nvidia/lib/libcuda.so.1", "/opt/nvidia/lib/libcuda.so." VER);
  want_bind(t, ps, "/opt/nvidia/lib/libcuda.so." VER, "/opt/nvidia/lib/libcuda.so." VER);
  want_bind(t, ps, "/opt/nvidia/lib/libcuda.so", "/opt/nvidia/lib/libcuda.so." VER);
  want_bind(t, ps, "/opt/nvidia/lib/libnvidia-ml.so.1", "/opt/nvidia/lib/libnvidia-ml.so." VER);
  assert_null(dest_source(ps->binds, ps->n_binds, LIBDIR "/libcuda.so.1"));
  all_under_root(t, ps);
  free(ps);
  rm(t, "/etc/ld.so.cache");
  rm(t, "/etc/ld.so.conf");
}

/* Hostile or broken caches are not read past their bounds: each is refused
 * whole and the folders are scanned instead. */
static void test_nvidia_hostile_ld_cache_falls_back_to_folders(void **state) {
  tree *t = *state;
  if (!t)
    skip();
  unsigned minors[] = {0};
  uint8_t b[4096];
  ldc_entry e[] = {{0x0303, "libcuda.so.1", "/opt/evil/libcuda.so.1"}};
  put_lib(t, "/opt/evil", "libcuda.so", VER, "libcuda.so.1");
  size_t good = ldc_build(b, sizeof b, e, 1);
  /* The well-formed one is used: the control case for the broken ones. */
  put_cache(t, b, good);
  gn_nvidia_pass *ps = pass_ok(t, minors, 1);
  want_bind(t, ps, "/opt/evil/libcuda.so.1", "/opt/evil/libcuda.so." VER);
  free(ps);
  for (int c = 0; c < 7; c++) {
    uint8_t h[4096];
    size_t n = good;
    memcpy(h, b, sizeof h);
    uint32_t v;
    switch (c) {
    case 0: /* more entries than the file holds */
      v = 0xffffffffu;
      memcpy(h + 20, &v, 4);
      break;
    case 1: /* a key offset past the end */
      v = 1u << 30;
      memcpy(h + 48 + 4, &v, 4);
      break;
    case 2: /* a value offset past the end */
      v = (uint32_t)n;
      memcpy(h + 48 + 8, &v, 4);
      break;
    case 3: /* the last string runs off the end of the file */
      n -= 1;
      break;
    case 4: /* cut inside the header */
      n = 30;
      break;
    case 5: /* the wrong magic */
      h[0] = 'X';
      break;
    case 6: /* an old-format count that overruns the file */
      memcpy(h, "ld.so-1.7.0", 11);
      v = 0x7fffffffu;
      memcpy(h + 12, &v, 4);
      break;
    }
    put_cache(t, h, n);
    ps = pass_ok(t, minors, 1);
    if (!dest_source(ps->binds, ps->n_binds, LIBDIR "/libcuda.so.1"))
      fail_msg("case %d: libcuda not found in the folders", c);
    want_no_bind_like(ps, "/opt/evil");
    free(ps);
  }
  rm(t, "/etc/ld.so.cache");
}

/* Thousands of caches with random bytes changed in the header, the entries
 * and the strings (seeded: the same every run), and the host's own cache:
 * never a read out of bounds (the sanitizer build checks), never a path
 * outside the root, and libcuda always found. */
static void test_nvidia_mutated_ld_caches_are_read_safely(void **state) {
  tree *t = *state;
  if (!t)
    skip();
  unsigned minors[] = {0};
  uint8_t b[4096], h[4096];
  ldc_entry e[] = {{0x0303, "libcuda.so.1", "/opt/evil/libcuda.so.1"},
                   {0x0303, "libnvidia-ml.so.1", "/opt/evil/libnvidia-ml.so.1"}};
  size_t n = ldc_build(b, sizeof b, e, 2);
  put_lib(t, "/opt/evil", "libcuda.so", VER, "libcuda.so.1");
  size_t host_len = 0;
  char *host = th_read_file("/etc/ld.so.cache", &host_len);
  if (host) {
    put_cache(t, host, host_len);
    gn_nvidia_pass *ps = pass_ok(t, minors, 1);
    assert_non_null(dest_source(ps->binds, ps->n_binds, LIBDIR "/libcuda.so.1"));
    free(ps);
    free(host);
  }
  uint32_t seed = 42;
  for (int round = 0; round < 2000; round++) {
    memcpy(h, b, n);
    int flips = 1 + round % 4;
    for (int f = 0; f < flips; f++) {
      seed = seed * 1103515245u + 12345u;
      size_t at = (seed >> 8) % n;
      seed = seed * 1103515245u + 12345u;
      h[at] = (uint8_t)(seed >> 16);
    }
    size_t len = n;
    if (round % 7 == 0)
      len = (seed >> 4) % (n + 1); /* and cut short */
    put_cache(t, h, len);
    gn_nvidia_pass *ps = calloc(1, sizeof *ps);
    char err[512] = "";
    int rc = gn_nvidia_passthrough(t->root, minors, 1, ps, err, sizeof err);
    if (rc)
      fail_msg("round %d: %s (%s)", round, gn_strerror(rc), err);
    if (!dest_source(ps->binds, ps->n_binds, LIBDIR "/libcuda.so.1") &&
        !dest_source(ps->binds, ps->n_binds, "/opt/evil/libcuda.so.1"))
      fail_msg("round %d: no libcuda.so.1", round);
    all_under_root(t, ps);
    free(ps);
  }
  rm(t, "/etc/ld.so.cache");
}

/* --- the bundle -----------------------------------------------------------*/

/* What gn_nvidia_passthrough found, handed to gn_bundle_write: each node in
 * linux.devices with its numbers and an allow rule, each file a read-only
 * bind mount. */
static void test_nvidia_bundle_passes_nodes_and_driver_files(void **state) {
  tree *t = *state;
  if (!t)
    skip();
  unsigned minors[] = {1};
  gn_nvidia_pass *ps = pass_ok(t, minors, 1);
  static const char *const argv[] = {"/cuda_job", NULL};
  gn_bundle_spec spec = {.argv = argv,
                         .rootfs = "rootfs",
                         .visible_devices = "GPU-00000000-0000-0000-0000-000000000001",
                         .dev_nodes = ps->nodes,
                         .n_dev_nodes = ps->n_nodes,
                         .ro_binds = ps->binds,
                         .n_ro_binds = ps->n_binds,
                         .no_seccomp = true};
  char *dir = th_mkdtemp("nvbundle"), path[4096];
  assert_non_null(dir);
  int rc = gn_bundle_write(dir, &spec);
  if (rc)
    fail_msg("gn_bundle_write: %s", gn_strerror(rc));
  snprintf(path, sizeof path, "%s/config.json", dir);
  json_error_t je;
  json_t *j = json_load_file(path, 0, &je);
  if (!j)
    fail_msg("config.json: %s", je.text);
  json_t *lx = json_object_get(j, "linux");
  json_t *devs = json_object_get(lx, "devices");
  json_t *rules = json_object_get(json_object_get(lx, "resources"), "devices");
  static const struct {
    const char *path;
    int major, minor;
  } want[] = {{"/dev/nvidia1", 195, 1},
              {"/dev/nvidiactl", 195, 255},
              {"/dev/nvidia-uvm", UVM_MAJOR, 0},
              {"/dev/nvidia-uvm-tools", UVM_MAJOR, 1},
              {"/dev/nvidia-modeset", 195, 254}};
  for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
    json_t *d = th_json_find_by(devs, "path", want[i].path);
    if (!d)
      fail_msg("%s not in linux.devices", want[i].path);
    assert_string_equal(json_string_value(json_object_get(d, "type")), "c");
    assert_int_equal(json_integer_value(json_object_get(d, "major")), want[i].major);
    assert_int_equal(json_integer_value(json_object_get(d, "minor")), want[i].minor);
    bool allowed = false;
    size_t k;
    json_t *r;
    json_array_foreach(rules, k, r) {
      if (json_is_true(json_object_get(r, "allow")) &&
          json_integer_value(json_object_get(r, "major")) == want[i].major &&
          json_integer_value(json_object_get(r, "minor")) == want[i].minor &&
          json_is_string(json_object_get(r, "type")) && strcmp(json_string_value(json_object_get(r, "type")), "c") == 0)
        allowed = true;
    }
    if (!allowed)
      fail_msg("no device cgroup rule allows %s (%d:%d)", want[i].path, want[i].major, want[i].minor);
  }
  assert_null(th_json_find_by(devs, "path", "/dev/nvidia0"));
  /* The first rule denies everything else. */
  json_t *r0 = json_array_get(rules, 0);
  assert_true(json_is_false(json_object_get(r0, "allow")));
  assert_null(json_object_get(r0, "major"));

  json_t *mounts = json_object_get(j, "mounts");
  for (size_t i = 0; i < ps->n_binds; i++) {
    json_t *m = th_json_find_by(mounts, "destination", ps->binds[i].dest);
    if (!m)
      fail_msg("no mount at %s", ps->binds[i].dest);
    assert_string_equal(json_string_value(json_object_get(m, "source")), ps->binds[i].source);
    json_t *o = json_object_get(m, "options");
    assert_true(th_json_has_string(o, "ro"));
    assert_true(th_json_has_string(o, "bind") || th_json_has_string(o, "rbind"));
    assert_true(th_json_has_string(o, "nosuid"));
  }
  assert_non_null(th_json_find_by(mounts, "destination", LIBDIR "/libcuda.so.1"));
  json_decref(j);

  /* In a user namespace nobody can make nodes: each is bind-mounted from
   * its source, and the cgroup still allows exactly its numbers. */
  spec.uid_base = spec.gid_base = 100000;
  spec.id_count = 65536;
  if ((rc = gn_bundle_write(dir, &spec)) != 0)
    fail_msg("gn_bundle_write with a user namespace: %s", gn_strerror(rc));
  if (!(j = json_load_file(path, 0, &je)))
    fail_msg("config.json: %s", je.text);
  lx = json_object_get(j, "linux");
  rules = json_object_get(json_object_get(lx, "resources"), "devices");
  mounts = json_object_get(j, "mounts");
  for (size_t i = 0; i < ps->n_nodes; i++) {
    json_t *m = th_json_find_by(mounts, "destination", ps->nodes[i].dest);
    if (!m)
      fail_msg("no bind mount of %s", ps->nodes[i].dest);
    assert_string_equal(json_string_value(json_object_get(m, "source")), ps->nodes[i].source);
    assert_true(th_json_has_string(json_object_get(m, "options"), "bind"));
  }
  assert_int_equal(json_array_size(rules), 1 + ps->n_nodes);
  json_decref(j);
  th_rm_rf(dir);
  free(dir);
  free(ps);
}

/* --- in a real container --------------------------------------------------*/

static uid_t chown_id;

static int chown_one(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
  (void)st;
  (void)flag;
  (void)ftw;
  return lchown(path, chown_id, chown_id) < 0 ? -1 : 0;
}

/* The fake tree's nodes and files, handed through gn_bundle_write to the
 * real runtime (runc or crun) with a busybox root that has no /usr/lib at
 * all: the job sees the leased GPU's node with the driver's numbers, not
 * the other GPU, the control and UVM nodes, the driver library under its
 * soname (read-only) and nvidia-smi. With and without a user namespace. */
static void test_nvidia_job_sees_nodes_and_driver_files(void **state) {
  tree *t = *state;
  if (!t)
    skip();
  gn_runtime rt;
  char err[512] = "";
  if (gn_runtime_detect(NULL, &rt, err, sizeof err) < 0 || !th_exists("/bin/busybox")) {
    print_message("skipped: no OCI runtime or no /bin/busybox here (%s)\n", err);
    skip();
  }
  unsigned minors[] = {0};
  gn_nvidia_pass *ps = pass_ok(t, minors, 1);
  char *work = th_mkdtemp("nvrun");
  assert_non_null(work);
  assert_int_equal(chmod(work, 0711), 0);
  static const char *const script =
      "stat -c '%n %F %t:%T' /dev/nvidia0 /dev/nvidiactl /dev/nvidia-uvm /dev/nvidia-uvm-tools /dev/nvidia-modeset; "
      "ls /dev/nvidia1 >/dev/null 2>&1 && echo LEAK nvidia1; "
      "echo lib $(cat " LIBDIR "/libcuda.so.1) $(cat " LIBDIR "/libcuda.so); "
      "echo smi $(cat /usr/bin/nvidia-smi); "
      "(echo x >" LIBDIR "/libcuda.so.1) 2>/dev/null && echo WRITABLE; "
      "echo done";
  const char *const argv[] = {"/bin/sh", "-c", script, NULL};
  for (int userns = 0; userns < 2; userns++) {
    char bundle[512], rootfs[600], cmd[8192], outp[600], errp[600], id[64], state_dir[600];
    snprintf(bundle, sizeof bundle, "%s/b%d", work, userns);
    snprintf(rootfs, sizeof rootfs, "%s/rootfs", bundle);
    snprintf(state_dir, sizeof state_dir, "%s/state", work);
    snprintf(id, sizeof id, "gn-nv-%d-%d", (int)getpid(), userns);
    assert_int_equal(mkdir(bundle, 0711), 0);
    snprintf(cmd, sizeof cmd,
             "mkdir -p '%s/bin' '%s/dev' '%s/proc' '%s/sys' '%s/tmp' && cp /bin/busybox '%s/bin/' && "
             "for a in sh cat ls stat echo; do ln -s busybox '%s/bin/'$a; done",
             rootfs, rootfs, rootfs, rootfs, rootfs, rootfs, rootfs);
    assert_int_equal(th_run(cmd, NULL, 0), 0);
    gn_bundle_spec spec = {.argv = argv,
                           .rootfs = "rootfs",
                           .dev_nodes = ps->nodes,
                           .n_dev_nodes = ps->n_nodes,
                           .ro_binds = ps->binds,
                           .n_ro_binds = ps->n_binds};
    if (userns) {
      spec.uid_base = spec.gid_base = 3100000;
      spec.id_count = 65536;
      chown_id = 3100000;
      assert_int_equal(nftw(rootfs, chown_one, 16, FTW_PHYS), 0);
    }
    int rc = gn_bundle_write(bundle, &spec);
    if (rc)
      fail_msg("gn_bundle_write: %s", gn_strerror(rc));
    char **rargv = NULL;
    assert_int_equal(gn_runtime_argv_run(&rt, state_dir, bundle, id, &rargv), 0);
    snprintf(outp, sizeof outp, "%s/out", work);
    snprintf(errp, sizeof errp, "%s/err", work);
    int in = open("/dev/null", O_RDONLY), out = open(outp, O_WRONLY | O_CREAT | O_TRUNC, 0600),
        ef = open(errp, O_WRONLY | O_CREAT | O_TRUNC, 0600), status = -1;
    assert_true(in >= 0 && out >= 0 && ef >= 0);
    assert_int_equal(gn_runtime_exec_io(rargv, in, out, ef, &status), 0);
    close(in);
    close(out);
    close(ef);
    gn_argv_free(rargv);
    char *o = th_read_file(outp, NULL), *e = th_read_file(errp, NULL);
    if (status != 0 || !strstr(o, "done"))
      fail_msg("%s job (user namespace: %d) exit %d\nstdout: %s\nstderr: %s", rt.path, userns, status, o, e);
    static const char *const want[] = {
        "/dev/nvidia0 character special file c3:0",
        "/dev/nvidiactl character special file c3:ff",
        "/dev/nvidia-uvm character special file 1fe:0",
        "/dev/nvidia-uvm-tools character special file 1fe:1",
        "/dev/nvidia-modeset character special file c3:fe",
        "lib " LIBDIR "/libcuda.so." VER " " LIBDIR "/libcuda.so." VER "\n",
        "smi /usr/bin/nvidia-smi\n",
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
      if (!strstr(o, want[i]))
        fail_msg("user namespace %d: no \"%s\" in the job's output:\n%s", userns, want[i], o);
    assert_null(strstr(o, "LEAK"));
    assert_null(strstr(o, "WRITABLE"));
    free(o);
    free(e);
  }
  th_rm_rf(work);
  free(work);
  free(ps);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_nvidia_passes_leased_gpu_and_control_nodes_only),
      cmocka_unit_test(test_nvidia_passes_each_leased_gpu_once),
      cmocka_unit_test(test_nvidia_missing_leased_node_is_enotfound),
      cmocka_unit_test(test_nvidia_missing_control_node_is_enotfound),
      cmocka_unit_test(test_nvidia_uvm_and_modeset_nodes_are_optional),
      cmocka_unit_test(test_nvidia_refuses_what_is_not_the_drivers_node),
      cmocka_unit_test(test_nvidia_refuses_bad_arguments),
      cmocka_unit_test(test_nvidia_libraries_resolve_to_versioned_files),
      cmocka_unit_test(test_nvidia_driver_version_sources),
      cmocka_unit_test(test_nvidia_symlink_escaping_root_is_ignored),
      cmocka_unit_test(test_nvidia_no_libcuda_is_enotfound),
      cmocka_unit_test(test_nvidia_libraries_found_through_ld_cache),
      cmocka_unit_test(test_nvidia_ld_cache_written_by_ldconfig),
      cmocka_unit_test(test_nvidia_hostile_ld_cache_falls_back_to_folders),
      cmocka_unit_test(test_nvidia_mutated_ld_caches_are_read_safely),
      cmocka_unit_test(test_nvidia_bundle_passes_nodes_and_driver_files),
      cmocka_unit_test(test_nvidia_job_sees_nodes_and_driver_files),
  };
  /* One fake tree for the group; tests that change it put it back. */
  return cmocka_run_group_tests(tests, tree_setup, tree_teardown);
}
