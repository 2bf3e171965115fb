/* libFuzzer target: layer unpacking (sandbox/unpack.c) on hostile bytes. A
 * renter's image layer is whatever they push: a tar, maybe gzipped. The
 * input is written as a layer file (or, after a "GNL2" header giving the
 * first one's length, as two layers, so whiteouts meet a lower layer),
 * unpacked with its true digest into a fresh rootfs under a per-process
 * temp dir, with small limits so each run is fast, then removed.
 *
 * Invariants checked on every run:
 * - nothing appears beside the rootfs: the canary directory holds only its
 *   file, and that file (and the layer files) gained no hard link;
 * - a failed unpack leaves no rootfs behind;
 * - a successful one holds no device node, and, without an id shift, no
 *   setuid or setgid file. Odd sizes unpack with an id shift (as root, the
 *   files go to uid 100000+), even sizes without.
 * GN_FUZZ_VERBOSE=1 prints each run's outcome (for checking the seeds). */
#include "../../sandbox/sandbox_int.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char tmp[4096];           /* the per-process temp dir */
static char layer_path[2][4096]; /* tmp/l0, tmp/l1 */
static char rootfs[4096];        /* tmp/rootfs, made and removed per run */
static char canary_dir[4096];    /* tmp/canary */
static char canary_file[4096];   /* tmp/canary/f */
static bool bad_found;           /* set by the removal walk */
static bool no_setid;            /* this run: setuid/setgid files are a fault */
static char bad_path[4096];      /* what the walk found */

static void die(const char *what, const char *path) {
  fprintf(stderr, "fuzz_unpack: %s: %s (%s)\n", what, path, strerror(errno));
  abort();
}

static void check(const char *name, const struct stat *st) {
  if (S_ISCHR(st->st_mode) || S_ISBLK(st->st_mode) ||
      (no_setid && !S_ISLNK(st->st_mode) && (st->st_mode & (S_ISUID | S_ISGID)))) {
    bad_found = true;
    snprintf(bad_path, sizeof bad_path, "%s (mode %o)", name, (unsigned)st->st_mode);
  }
}

/* Removes name under dfd recursively, never following a symlink, checking
 * what it removes. Read-only directories are made the owner's again first
 * (an unprivileged run owns them). False if anything could not go. */
static bool rm_at(int dfd, const char *name) {
  struct stat st;
  if (fstatat(dfd, name, &st, AT_SYMLINK_NOFOLLOW) < 0)
    return errno == ENOENT;
  check(name, &st);
  if (!S_ISDIR(st.st_mode))
    return unlinkat(dfd, name, 0) == 0;
  if ((st.st_mode & 0700) != 0700)
    fchmodat(dfd, name, 0700, AT_SYMLINK_NOFOLLOW);
  int fd = openat(dfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
  if (!d) {
    if (fd >= 0)
      close(fd);
    return false;
  }
  bool ok = true;
  struct dirent *e;
  while (ok && (e = readdir(d)))
    if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0)
      ok = rm_at(fd, e->d_name);
  closedir(d);
  return ok && unlinkat(dfd, name, AT_REMOVEDIR) == 0;
}

static bool rm_tree(const char *path) {
  return rm_at(AT_FDCWD, path);
}

static void cleanup(void) {
  if (tmp[0])
    rm_tree(tmp);
}

static void setup(void) {
  snprintf(tmp, sizeof tmp, "%s/gn-fuzz-unpack-XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
  if (!mkdtemp(tmp))
    die("mkdtemp", tmp);
  atexit(cleanup);
  for (int i = 0; i < 2; i++)
    snprintf(layer_path[i], sizeof layer_path[i], "%s/l%d", tmp, i);
  snprintf(rootfs, sizeof rootfs, "%s/rootfs", tmp);
  snprintf(canary_dir, sizeof canary_dir, "%s/canary", tmp);
  snprintf(canary_file, sizeof canary_file, "%s/f", canary_dir);
  if (mkdir(canary_dir, 0755) < 0)
    die("mkdir", canary_dir);
  FILE *f = fopen(canary_file, "w");
  if (!f || fputs("canary\n", f) < 0 || fclose(f) != 0)
    die("write", canary_file);
}

static void write_layer(const char *path, const uint8_t *p, size_t n) {
  FILE *f = fopen(path, "w");
  if (!f || (n && fwrite(p, 1, n, f) != n) || fclose(f) != 0)
    die("write", path);
}

static void want_one_link(const char *path) {
  struct stat st;
  if (lstat(path, &st) < 0)
    die("lstat", path);
  if (st.st_nlink != 1 || !S_ISREG(st.st_mode)) {
    fprintf(stderr, "fuzz_unpack: %s gained a link (nlink %lu) or changed type\n", path, (unsigned long)st.st_nlink);
    abort();
  }
}

/* Only the names the harness made may be in dir. */
static void want_only(const char *dir, const char *const *names, size_t n) {
  DIR *d = opendir(dir);
  if (!d)
    die("opendir", dir);
  struct dirent *e;
  while ((e = readdir(d))) {
    if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
      continue;
    bool ok = false;
    for (size_t i = 0; i < n; i++)
      ok |= strcmp(e->d_name, names[i]) == 0;
    if (!ok) {
      fprintf(stderr, "fuzz_unpack: %s/%s appeared outside the rootfs\n", dir, e->d_name);
      abort();
    }
  }
  closedir(d);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (!tmp[0])
    setup();
  const uint8_t *part[2] = {data, NULL};
  size_t len[2] = {size, 0}, n = 1;
  if (size >= 8 && memcmp(data, "GNL2", 4) == 0) {
    uint32_t l0 = (uint32_t)data[4] | (uint32_t)data[5] << 8 | (uint32_t)data[6] << 16 | (uint32_t)data[7] << 24;
    if (l0 <= size - 8) {
      part[0] = data + 8;
      len[0] = l0;
      part[1] = data + 8 + l0;
      len[1] = size - 8 - l0;
      n = 2;
    }
  }
  char digest[2][GN_DIGEST_STRLEN];
  const char *paths[2], *digests[2];
  for (size_t i = 0; i < n; i++) {
    write_layer(layer_path[i], part[i], len[i]);
    gn__digest_of(part[i], len[i], digest[i]);
    paths[i] = layer_path[i];
    digests[i] = digest[i];
  }

  gn_store_limits lim = {.layer_max_bytes = 8u << 20,
                         .image_max_bytes = 8u << 20,
                         .layer_max_entries = 2000,
                         .image_max_entries = 2000,
                         .reserve_bytes = 1}; /* 0 would mean the default GiB */
  gn_unpack_opts opts = {0};
  bool shift = size & 1;
  if (shift) {
    opts.uid_base = 100000;
    opts.gid_base = 100000;
    opts.id_count = 65536;
  }
  char err[512] = "";
  int r = gn__unpack_layer_files(paths, digests, n, rootfs, &lim, &opts, err, sizeof err);

  if (getenv("GN_FUZZ_VERBOSE"))
    fprintf(stderr, "fuzz_unpack: %zu layer(s), shift %d: %d %s\n", n, shift, r, err);
  struct stat st;
  if (r < 0 && lstat(rootfs, &st) == 0) {
    fprintf(stderr, "fuzz_unpack: failed unpack (%d: %s) left %s behind\n", r, err, rootfs);
    abort();
  }
  if (r == 0 && (lstat(rootfs, &st) < 0 || !S_ISDIR(st.st_mode))) {
    fprintf(stderr, "fuzz_unpack: unpack succeeded but %s is not a directory\n", rootfs);
    abort();
  }
  if (r > 0) {
    fprintf(stderr, "fuzz_unpack: positive return %d\n", r);
    abort();
  }
  bad_found = false;
  no_setid = !shift;
  if (!rm_tree(rootfs))
    die("cannot remove", rootfs);
  if (bad_found) {
    fprintf(stderr, "fuzz_unpack: the unpacked rootfs holds %s\n", bad_path);
    abort();
  }
  static const char *const tmp_names[] = {"l0", "l1", "canary"};
  static const char *const canary_names[] = {"f"};
  want_only(tmp, tmp_names, 3);
  want_only(canary_dir, canary_names, 1);
  want_one_link(canary_file);
  for (size_t i = 0; i < n; i++)
    want_one_link(layer_path[i]);
  return 0;
}
