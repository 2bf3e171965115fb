/* Layer unpacking: layers built here with libarchive's writer, put into a
 * real store, unpacked with gn_store_unpack(_ex). Order, whiteouts, opaque
 * directories, compression, a table of hostile archives that must be
 * refused with the entry named and nothing written outside the root, the
 * store's limits (decompression bombs, sparse giants, entry floods, the
 * free-space reserve), cancellation from another thread, and owners shifted
 * into a job's user namespace. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <archive.h>
#include <archive_entry.h>
#include <cmocka.h>
#include <gpunet/sandbox.h>
#include <pthread.h>
#include <sodium.h>
#include <sys/statvfs.h>
#include <sys/sysmacros.h>
#include <time.h>

#include "sandbox/helpers.h"

typedef struct ent {
  char type; /* f file, d dir, l symlink, h hardlink, c char dev, b block dev, p fifo */
  const char *path;
  const char *data; /* file content, or link target */
  unsigned mode;    /* 0: a default for the type */
  unsigned uid, gid;
} ent;

enum { PLAIN, GZIP, ZSTD };

typedef struct fixture {
  char *dir;
  char store_dir[512], rootfs[512], outside[512];
  gn_store *store;
  gn_image img;
  char digests[8][GN_DIGEST_STRLEN];
} fixture;

static int setup(void **state) {
  fixture *f = calloc(1, sizeof(*f));
  f->dir = th_mkdtemp("unpack");
  snprintf(f->store_dir, sizeof(f->store_dir), "%s/store", f->dir);
  snprintf(f->rootfs, sizeof(f->rootfs), "%s/rootfs", f->dir);
  snprintf(f->outside, sizeof(f->outside), "%s/outside", f->dir);
  mkdir(f->outside, 0755);
  if (gn_store_open(f->store_dir, &f->store) < 0)
    return -1;
  f->img.layers = f->digests;
  *state = f;
  return 0;
}

static int teardown(void **state) {
  fixture *f = *state;
  gn_store_free(f->store);
  th_rm_rf(f->dir);
  free(f->dir);
  free(f);
  return 0;
}

/* Moves the layer file tmp into the store under its digest and appends it
 * to the fixture's image. */
static void store_layer(fixture *f, const char *tmp) {
  char path[700];
  uint8_t h[32], chunk[65536];
  crypto_hash_sha256_state st;
  crypto_hash_sha256_init(&st);
  int fd = open(tmp, O_RDONLY);
  assert_true(fd >= 0);
  ssize_t n;
  while ((n = read(fd, chunk, sizeof(chunk))) > 0)
    crypto_hash_sha256_update(&st, chunk, (size_t)n);
  close(fd);
  crypto_hash_sha256_final(&st, h);
  char *d = f->digests[f->img.layer_count];
  strcpy(d, "sha256:");
  sodium_bin2hex(d + 7, GN_DIGEST_STRLEN - 7, h, sizeof(h));
  snprintf(path, sizeof(path), "%s/blobs/sha256/%s", f->store_dir, d + 7);
  assert_int_equal(rename(tmp, path), 0);
  f->img.layer_count++;
}

/* Writes a tar layer of the given entries, stores it under its digest and
 * appends it to the fixture's image. */
static void add_layer(fixture *f, const ent *ents, size_t n, int filter) {
  char tmp[600];
  snprintf(tmp, sizeof(tmp), "%s/layer.tmp", f->dir);
  struct archive *a = archive_write_new();
  archive_write_set_format_pax_restricted(a);
  if (filter == GZIP)
    archive_write_add_filter_gzip(a);
  else if (filter == ZSTD)
    assert_int_equal(archive_write_add_filter_zstd(a), ARCHIVE_OK);
  assert_int_equal(archive_write_open_filename(a, tmp), ARCHIVE_OK);
  for (size_t i = 0; i < n; i++) {
    const ent *e = &ents[i];
    struct archive_entry *ae = archive_entry_new();
    archive_entry_set_pathname(ae, e->path);
    archive_entry_set_mtime(ae, 1700000000, 0);
    archive_entry_set_uid(ae, e->uid);
    archive_entry_set_gid(ae, e->gid);
    size_t len = 0;
    switch (e->type) {
    case 'f':
      len = strlen(e->data);
      archive_entry_set_filetype(ae, AE_IFREG);
      archive_entry_set_perm(ae, e->mode ? e->mode : 0644);
      archive_entry_set_size(ae, (la_int64_t)len);
      break;
    case 'd':
      archive_entry_set_filetype(ae, AE_IFDIR);
      archive_entry_set_perm(ae, e->mode ? e->mode : 0755);
      break;
    case 'l':
      archive_entry_set_filetype(ae, AE_IFLNK);
      archive_entry_set_perm(ae, 0777);
      archive_entry_set_symlink(ae, e->data);
      break;
    case 'h':
      archive_entry_set_filetype(ae, AE_IFREG);
      archive_entry_set_perm(ae, 0644);
      archive_entry_set_hardlink(ae, e->data);
      break;
    case 'c':
    case 'b':
      archive_entry_set_filetype(ae, e->type == 'c' ? AE_IFCHR : AE_IFBLK);
      archive_entry_set_perm(ae, 0666);
      archive_entry_set_rdev(ae, makedev(1, 3));
      break;
    case 'p':
      archive_entry_set_filetype(ae, AE_IFIFO);
      archive_entry_set_perm(ae, 0644);
      break;
    }
    assert_int_equal(archive_write_header(a, ae), ARCHIVE_OK);
    if (len)
      assert_int_equal(archive_write_data(a, e->data, len), (la_ssize_t)len);
    archive_entry_free(ae);
  }
  assert_int_equal(archive_write_close(a), ARCHIVE_OK);
  archive_write_free(a);
  store_layer(f, tmp);
}

static char *rootfs_file(fixture *f, const char *rel) {
  char p[1024];
  snprintf(p, sizeof(p), "%s/%s", f->rootfs, rel);
  return th_read_file(p, NULL);
}

static bool rootfs_has(fixture *f, const char *rel) {
  char p[1024];
  snprintf(p, sizeof(p), "%s/%s", f->rootfs, rel);
  return th_exists(p);
}

static int unpack(fixture *f, char *err, size_t cap) {
  return gn_store_unpack(f->store, &f->img, f->rootfs, err, cap);
}

static void expect_unpacked(fixture *f) {
  char err[512] = "";
  int rc = unpack(f, err, sizeof(err));
  if (rc)
    fail_msg("unpack: %d %s", rc, err);
}

static void assert_file(fixture *f, const char *rel, const char *content) {
  char *got = rootfs_file(f, rel);
  if (!got)
    fail_msg("%s missing from the rootfs", rel);
  assert_string_equal(got, content);
  free(got);
}

static void test_unpack_applies_layers_in_order(void **state) {
  fixture *f = *state;
  const ent l1[] = {{'d', "a", NULL, 0, 0, 0},
                    {'f', "a/f1", "one", 0, 0, 0},
                    {'f', "a/f2", "two", 0, 0, 0},
                    {'f', "./keep", "k", 0, 0, 0}};
  const ent l2[] = {{'f', "a/f1", "uno", 0, 0, 0}, {'f', "a/new", "new", 0, 0, 0}};
  add_layer(f, l1, 4, GZIP);
  add_layer(f, l2, 2, ZSTD);
  expect_unpacked(f);
  assert_file(f, "a/f1", "uno");
  assert_file(f, "a/f2", "two");
  assert_file(f, "a/new", "new");
  assert_file(f, "keep", "k");
}

static void test_unpack_detects_compression(void **state) {
  fixture *f = *state;
  const ent p[] = {{'f', "plain", "p", 0, 0, 0}};
  const ent g[] = {{'f', "gzip", "g", 0, 0, 0}};
  const ent z[] = {{'f', "zstd", "z", 0, 0, 0}};
  add_layer(f, p, 1, PLAIN);
  add_layer(f, g, 1, GZIP);
  add_layer(f, z, 1, ZSTD);
  expect_unpacked(f);
  assert_file(f, "plain", "p");
  assert_file(f, "gzip", "g");
  assert_file(f, "zstd", "z");
}

static void test_unpack_whiteout_deletes_lower_entries(void **state) {
  fixture *f = *state;
  const ent l1[] = {
      {'f', "a/x", "x", 0, 0, 0}, {'f', "a/y", "y", 0, 0, 0}, {'f', "b/dir/z", "z", 0, 0, 0}, {'f', "c", "c", 0, 0, 0}};
  const ent l2[] = {
      {'f', "a/.wh.x", "", 0, 0, 0}, {'f', ".wh.b", "", 0, 0, 0}, {'f', ".wh.nothing-there", "", 0, 0, 0}};
  add_layer(f, l1, 4, GZIP);
  add_layer(f, l2, 3, GZIP);
  expect_unpacked(f);
  assert_false(rootfs_has(f, "a/x"));
  assert_false(rootfs_has(f, "a/.wh.x"));
  assert_file(f, "a/y", "y");
  assert_false(rootfs_has(f, "b"));
  assert_false(rootfs_has(f, ".wh.b"));
  assert_file(f, "c", "c");
}

static void test_unpack_whiteout_then_recreate_in_same_layer(void **state) {
  fixture *f = *state;
  const ent l1[] = {{'f', "d/old", "old", 0, 0, 0}};
  /* Replacing a directory by a file: whiteout and new entry in one layer. */
  const ent l2[] = {{'f', "d2", "file", 0, 0, 0}, {'f', ".wh.d", "", 0, 0, 0}, {'f', "d", "now a file", 0, 0, 0}};
  add_layer(f, l1, 1, GZIP);
  add_layer(f, l2, 3, GZIP);
  expect_unpacked(f);
  assert_file(f, "d", "now a file");
}

static void test_unpack_opaque_dir_hides_lower_contents(void **state) {
  fixture *f = *state;
  const ent l1[] = {{'f', "d/old1", "1", 0, 0, 0}, {'f', "d/sub/old2", "2", 0, 0, 0}, {'f', "e/keep", "k", 0, 0, 0}};
  /* The marker comes after the new file: order inside a layer must not
   * matter. */
  const ent l2[] = {{'d', "d", NULL, 0, 0, 0}, {'f', "d/new", "n", 0, 0, 0}, {'f', "d/.wh..wh..opq", "", 0, 0, 0}};
  add_layer(f, l1, 3, GZIP);
  add_layer(f, l2, 3, GZIP);
  expect_unpacked(f);
  char p[1024];
  snprintf(p, sizeof(p), "%s/d", f->rootfs);
  assert_int_equal(th_count_entries(p), 1);
  assert_file(f, "d/new", "n");
  assert_file(f, "e/keep", "k");
}

static void test_unpack_keeps_symlinks_as_symlinks(void **state) {
  fixture *f = *state;
  const ent l1[] = {{'f', "bin/busybox", "bb", 0755, 0, 0},
                    {'l', "bin/sh", "busybox", 0, 0, 0},
                    {'l', "etc/abs", "/etc/passwd", 0, 0, 0},
                    {'h', "bin/hard", "bin/busybox", 0, 0, 0}};
  add_layer(f, l1, 4, GZIP);
  expect_unpacked(f);
  char p[1024], target[256];
  snprintf(p, sizeof(p), "%s/bin/sh", f->rootfs);
  ssize_t n = readlink(p, target, sizeof(target) - 1);
  assert_true(n > 0);
  target[n] = '\0';
  assert_string_equal(target, "busybox");
  snprintf(p, sizeof(p), "%s/etc/abs", f->rootfs);
  n = readlink(p, target, sizeof(target) - 1);
  assert_true(n > 0);
  target[n] = '\0';
  assert_string_equal(target, "/etc/passwd"); /* stored, never followed */
  struct stat st;
  snprintf(p, sizeof(p), "%s/bin/hard", f->rootfs);
  assert_int_equal(stat(p, &st), 0);
  assert_int_equal(st.st_nlink, 2);
}

static void test_unpack_strips_setuid_and_skips_fifos(void **state) {
  fixture *f = *state;
  const ent l1[] = {{'f', "bin/su", "x", 04755, 0, 0},
                    {'f', "bin/sg", "x", 02755, 0, 0},
                    {'p', "run/fifo", NULL, 0, 0, 0},
                    {'f', "run/after", "a", 0, 0, 0}};
  add_layer(f, l1, 4, GZIP);
  expect_unpacked(f);
  struct stat st;
  char p[1024];
  snprintf(p, sizeof(p), "%s/bin/su", f->rootfs);
  assert_int_equal(stat(p, &st), 0);
  assert_int_equal(st.st_mode & 07777, 0755);
  snprintf(p, sizeof(p), "%s/bin/sg", f->rootfs);
  assert_int_equal(stat(p, &st), 0);
  assert_int_equal(st.st_mode & 07777, 0755);
  assert_int_equal(st.st_uid, getuid());
  assert_false(rootfs_has(f, "run/fifo"));
  assert_file(f, "run/after", "a");
}

static void test_unpack_refuses_existing_rootfs(void **state) {
  fixture *f = *state;
  const ent l1[] = {{'f', "x", "x", 0, 0, 0}};
  add_layer(f, l1, 1, GZIP);
  assert_int_equal(mkdir(f->rootfs, 0755), 0);
  char err[512] = "";
  assert_int_equal(unpack(f, err, sizeof(err)), GN_EEXIST);
  assert_true(th_exists(f->rootfs)); /* not ours: left alone */
}

static void test_unpack_refuses_layer_not_matching_digest(void **state) {
  fixture *f = *state;
  const ent l1[] = {{'f', "x", "x", 0, 0, 0}};
  add_layer(f, l1, 1, PLAIN);
  char p[1024], err[512] = "";
  snprintf(p, sizeof(p), "%s/blobs/sha256/%s", f->store_dir, f->digests[0] + 7);
  int fd = open(p, O_WRONLY | O_APPEND);
  assert_true(fd >= 0);
  assert_int_equal(write(fd, "\0", 1), 1); /* still a valid tar, another digest */
  close(fd);
  assert_int_equal(unpack(f, err, sizeof(err)), GN_EDIGEST);
  assert_non_null(strstr(err, "does not match its digest"));
  assert_false(th_exists(f->rootfs));
}

static void test_unpack_refuses_non_tar_blob(void **state) {
  fixture *f = *state;
  char tmp[600], p[700], err[512] = "";
  const char junk[] = "this is not a tar archive at all, just some bytes in a blob";
  uint8_t h[32];
  crypto_hash_sha256(h, (const uint8_t *)junk, sizeof(junk));
  strcpy(f->digests[0], "sha256:");
  sodium_bin2hex(f->digests[0] + 7, GN_DIGEST_STRLEN - 7, h, sizeof(h));
  snprintf(tmp, sizeof(tmp), "%s/blobs/sha256/%s", f->store_dir, f->digests[0] + 7);
  assert_int_equal(th_write_file(tmp, junk, sizeof(junk)), 0);
  f->img.layer_count = 1;
  (void)p;
  assert_int_equal(unpack(f, err, sizeof(err)), GN_EINVAL);
  assert_false(th_exists(f->rootfs));
}

/* Hostile archives. %O in a path or target is replaced by the fixture's
 * "outside" directory, a sibling of the rootfs. */
typedef struct hostile {
  const char *what;
  ent lower[3]; /* an optional first layer */
  size_t lower_n;
  ent upper[3];
  size_t upper_n;
  int code;
  const char *named;        /* must appear in err */
  const char *outside_file; /* must not exist in outside/ afterwards */
} hostile;

static const hostile hostiles[] = {
    {"absolute path", {{0}}, 0, {{'f', "%O/abs", "pwned", 0, 0, 0}}, 1, GN_EPERM, "/abs", "abs"},
    {"dotdot escape",
     {{0}},
     0,
     {{'f', "../outside/dotdot", "pwned", 0, 0, 0}},
     1,
     GN_EPERM,
     "../outside/dotdot",
     "dotdot"},
    {"inner dotdot",
     {{0}},
     0,
     {{'f', "a/../../outside/inner", "pwned", 0, 0, 0}},
     1,
     GN_EPERM,
     "a/../../outside/inner",
     "inner"},
    {"write through an absolute symlink in one layer",
     {{0}},
     0,
     {{'l', "link", "%O", 0, 0, 0}, {'f', "link/pwned", "pwned", 0, 0, 0}},
     2,
     GN_EPERM,
     "link/pwned",
     "pwned"},
    {"write through a relative symlink in one layer",
     {{0}},
     0,
     {{'l', "rel", "../outside", 0, 0, 0}, {'f', "rel/pwned2", "pwned", 0, 0, 0}},
     2,
     GN_EPERM,
     "rel/pwned2",
     "pwned2"},
    {"write through a symlink from a lower layer",
     {{'l', "lower", "%O", 0, 0, 0}},
     1,
     {{'f', "lower/pwned3", "pwned", 0, 0, 0}},
     1,
     GN_EPERM,
     "lower/pwned3",
     "pwned3"},
    {"write through a symlinked parent deeper down",
     {{'d', "d", NULL, 0, 0, 0}, {'l', "d/l", "%O", 0, 0, 0}},
     2,
     {{'f', "d/l/sub/pwned4", "pwned", 0, 0, 0}},
     1,
     GN_EPERM,
     "d/l/sub/pwned4",
     "sub"},
    {"hardlink with dotdot", {{0}}, 0, {{'h', "hl", "../outside/secret", 0, 0, 0}}, 1, GN_EPERM, "hl", NULL},
    {"hardlink through a symlink",
     {{'l', "s", "%O", 0, 0, 0}},
     1,
     {{'h', "h", "s/secret", 0, 0, 0}},
     1,
     GN_EPERM,
     "\"h\"",
     NULL},
    {"hardlink to an absolute path", {{0}}, 0, {{'h', "h2", "%O/secret", 0, 0, 0}}, 1, GN_EPERM, "h2", NULL},
    {"char device",
     {{0}},
     0,
     {{'f', "ok", "ok", 0, 0, 0}, {'c', "dev/null", NULL, 0, 0, 0}},
     2,
     GN_EPERM,
     "dev/null",
     NULL},
    {"block device", {{0}}, 0, {{'b', "dev/sda", NULL, 0, 0, 0}}, 1, GN_EPERM, "dev/sda", NULL},
    {"control bytes in a name are not echoed",
     {{0}},
     0,
     {{'b', "dev/evil\nforged log line", NULL, 0, 0, 0}},
     1,
     GN_EPERM,
     "dev/evil?forged log line",
     NULL},
};

static void subst(char *out, size_t cap, const char *in, const char *outside) {
  const char *o = in ? strstr(in, "%O") : NULL;
  if (!in)
    out[0] = '\0';
  else if (!o)
    snprintf(out, cap, "%s", in);
  else
    snprintf(out, cap, "%.*s%s%s", (int)(o - in), in, outside, o + 2);
}

static void test_unpack_refuses_hostile_archives(void **state) {
  fixture *f = *state;
  for (size_t i = 0; i < sizeof(hostiles) / sizeof(hostiles[0]); i++) {
    const hostile *h = &hostiles[i];
    char paths[6][600], datas[6][600], err[512] = "", secret[700], p[1024];
    ent lower[3], upper[3];
    for (size_t j = 0; j < h->lower_n; j++) {
      lower[j] = h->lower[j];
      subst(paths[j], sizeof(paths[j]), h->lower[j].path, f->outside);
      subst(datas[j], sizeof(datas[j]), h->lower[j].data, f->outside);
      lower[j].path = paths[j];
      lower[j].data = h->lower[j].data ? datas[j] : NULL;
    }
    for (size_t j = 0; j < h->upper_n; j++) {
      upper[j] = h->upper[j];
      subst(paths[3 + j], sizeof(paths[3 + j]), h->upper[j].path, f->outside);
      subst(datas[3 + j], sizeof(datas[3 + j]), h->upper[j].data, f->outside);
      upper[j].path = paths[3 + j];
      upper[j].data = h->upper[j].data ? datas[3 + j] : NULL;
    }
    /* A host file the hardlink cases try to reach. */
    snprintf(secret, sizeof(secret), "%s/secret", f->outside);
    assert_int_equal(th_write_file(secret, "host secret", 11), 0);

    f->img.layer_count = 0;
    if (h->lower_n)
      add_layer(f, lower, h->lower_n, GZIP);
    add_layer(f, upper, h->upper_n, GZIP);
    int rc = unpack(f, err, sizeof(err));
    if (rc != h->code)
      fail_msg("%s: unpack gave %d (%s), wanted %d", h->what, rc, err, h->code);
    if (!strstr(err, h->named))
      fail_msg("%s: message \"%s\" does not name \"%s\"", h->what, err, h->named);
    /* Nothing outside the root changed, and the half-made root is gone. */
    if (h->outside_file) {
      snprintf(p, sizeof(p), "%s/%s", f->outside, h->outside_file);
      if (th_exists(p))
        fail_msg("%s: wrote %s outside the root", h->what, p);
    }
    snprintf(p, sizeof(p), "%s/dotdot", f->dir);
    assert_false(th_exists(p));
    struct stat st;
    assert_int_equal(stat(secret, &st), 0);
    if (st.st_nlink != 1)
      fail_msg("%s: the host file gained a hardlink", h->what);
    assert_int_equal(th_count_entries(f->outside), 1);
    if (th_exists(f->rootfs))
      fail_msg("%s: the refused rootfs was left behind", h->what);
  }
}

/* --- limits, cancellation, free space -------------------------------------*/

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* A gzip layer of nfiles regular files of each_bytes zeros: the classic
 * decompression bomb (a GiB of zeros is about 4 MB at level 1). */
static void add_zeros_layer(fixture *f, unsigned nfiles, uint64_t each_bytes) {
  char tmp[600], name[64];
  static const char zeros[1 << 20];
  snprintf(tmp, sizeof(tmp), "%s/layer.tmp", f->dir);
  struct archive *a = archive_write_new();
  archive_write_set_format_pax_restricted(a);
  archive_write_add_filter_gzip(a);
  archive_write_set_filter_option(a, "gzip", "compression-level", "1");
  assert_int_equal(archive_write_open_filename(a, tmp), ARCHIVE_OK);
  for (unsigned i = 0; i < nfiles; i++) {
    struct archive_entry *ae = archive_entry_new();
    snprintf(name, sizeof(name), "zeros/%u", i);
    archive_entry_set_pathname(ae, name);
    archive_entry_set_filetype(ae, AE_IFREG);
    archive_entry_set_perm(ae, 0644);
    archive_entry_set_size(ae, (la_int64_t)each_bytes);
    assert_int_equal(archive_write_header(a, ae), ARCHIVE_OK);
    for (uint64_t done = 0; done < each_bytes;) {
      size_t n = each_bytes - done < sizeof(zeros) ? (size_t)(each_bytes - done) : sizeof(zeros);
      assert_int_equal(archive_write_data(a, zeros, n), (la_ssize_t)n);
      done += n;
    }
    archive_entry_free(ae);
  }
  assert_int_equal(archive_write_close(a), ARCHIVE_OK);
  archive_write_free(a);
  struct stat st;
  assert_int_equal(stat(tmp, &st), 0);
  assert_true((uint64_t)st.st_size < (uint64_t)nfiles * each_bytes / 100 + 65536); /* really a bomb */
  store_layer(f, tmp);
}

/* A pax layer: first an optional small file, then a sparse file declaring
 * declared bytes, of which only 4 KiB at its end is data. */
static void add_sparse_layer(fixture *f, uint64_t small_bytes, uint64_t declared) {
  char tmp[600];
  static const char data[4096] = "tail";
  static const char zeros[1 << 20];
  snprintf(tmp, sizeof(tmp), "%s/layer.tmp", f->dir);
  struct archive *a = archive_write_new();
  archive_write_set_format_pax(a);
  archive_write_add_filter_gzip(a);
  assert_int_equal(archive_write_open_filename(a, tmp), ARCHIVE_OK);
  struct archive_entry *ae = archive_entry_new();
  if (small_bytes) {
    archive_entry_set_pathname(ae, "small");
    archive_entry_set_filetype(ae, AE_IFREG);
    archive_entry_set_perm(ae, 0644);
    archive_entry_set_size(ae, (la_int64_t)small_bytes);
    assert_int_equal(archive_write_header(a, ae), ARCHIVE_OK);
    for (uint64_t done = 0; done < small_bytes;) {
      size_t n = small_bytes - done < sizeof(zeros) ? (size_t)(small_bytes - done) : sizeof(zeros);
      assert_int_equal(archive_write_data(a, zeros, n), (la_ssize_t)n);
      done += n;
    }
    archive_entry_clear(ae);
  }
  archive_entry_set_pathname(ae, "giant");
  archive_entry_set_filetype(ae, AE_IFREG);
  archive_entry_set_perm(ae, 0644);
  archive_entry_set_size(ae, (la_int64_t)declared);
  archive_entry_sparse_add_entry(ae, (la_int64_t)(declared - sizeof(data)), (la_int64_t)sizeof(data));
  assert_int_equal(archive_write_header(a, ae), ARCHIVE_OK);
  assert_int_equal(archive_write_data(a, data, sizeof(data)), (la_ssize_t)sizeof(data));
  archive_entry_free(ae);
  assert_int_equal(archive_write_close(a), ARCHIVE_OK);
  archive_write_free(a);
  struct stat st;
  assert_int_equal(stat(tmp, &st), 0);
  assert_true(st.st_size < (off_t)(small_bytes / 100 + (1 << 20)));
  store_layer(f, tmp);
}

/* A plain layer of n empty files. */
static void add_many_layer(fixture *f, unsigned n, const char *prefix) {
  char tmp[600], name[64];
  snprintf(tmp, sizeof(tmp), "%s/layer.tmp", f->dir);
  struct archive *a = archive_write_new();
  archive_write_set_format_pax_restricted(a);
  assert_int_equal(archive_write_open_filename(a, tmp), ARCHIVE_OK);
  for (unsigned i = 0; i < n; i++) {
    struct archive_entry *ae = archive_entry_new();
    snprintf(name, sizeof(name), "%s%u", prefix, i);
    archive_entry_set_pathname(ae, name);
    archive_entry_set_filetype(ae, AE_IFREG);
    archive_entry_set_perm(ae, 0644);
    archive_entry_set_size(ae, 0);
    assert_int_equal(archive_write_header(a, ae), ARCHIVE_OK);
    archive_entry_free(ae);
  }
  assert_int_equal(archive_write_close(a), ARCHIVE_OK);
  archive_write_free(a);
  store_layer(f, tmp);
}

static void set_limits(fixture *f, const gn_store_limits *l) {
  assert_int_equal(gn_store_set_limits(f->store, l), 0);
}

static void expect_refused(fixture *f, const gn_unpack_opts *opts, int code, const char *in_err) {
  char err[512] = "";
  int rc = gn_store_unpack_ex(f->store, &f->img, f->rootfs, opts, err, sizeof(err));
  if (rc != code)
    fail_msg("unpack gave %d (%s), wanted %d", rc, err, code);
  if (in_err && !strstr(err, in_err))
    fail_msg("message \"%s\" does not say \"%s\"", err, in_err);
  if (th_exists(f->rootfs))
    fail_msg("the refused rootfs was left behind");
}

static void test_unpack_refuses_gzip_bomb_over_layer_limit(void **state) {
  fixture *f = *state;
  /* One file of 1 GiB of zeros (4 MB of gzip) under a 64 MiB cap. */
  add_zeros_layer(f, 1, 1ull << 30);
  gn_store_limits l = {.layer_max_bytes = 64ull << 20};
  set_limits(f, &l);
  char want[128], shortd[32];
  snprintf(shortd, sizeof(shortd), "%.15s", f->digests[0]);
  snprintf(want, sizeof(want), "layer %s", shortd);
  double t0 = now_s();
  expect_refused(f, NULL, GN_ETOOBIG, "unpacks to more than 64 MiB; refusing");
  expect_refused(f, NULL, GN_ETOOBIG, want);
  double dt = now_s() - t0;
  print_message("a 1 GiB gzip bomb refused twice in %.0f ms\n", dt * 1000);
  assert_true(dt < 2.0);
}

static void test_unpack_counts_bytes_written_across_files(void **state) {
  fixture *f = *state;
  /* 64 files of 4 MiB: each under the cap, together four times over it.
   * Refused at the 17th file, so at most 64 MiB ever reached the disk. */
  add_zeros_layer(f, 64, 4ull << 20);
  gn_store_limits l = {.layer_max_bytes = 64ull << 20};
  set_limits(f, &l);
  expect_refused(f, NULL, GN_ETOOBIG, "unpacks to more than 64 MiB");
  /* The same layer fits a 256 MiB cap. */
  l.layer_max_bytes = 256ull << 20;
  set_limits(f, &l);
  expect_unpacked(f);
  char p[1024];
  snprintf(p, sizeof(p), "%s/zeros", f->rootfs);
  assert_int_equal(th_count_entries(p), 64);
}

static void test_unpack_refuses_image_over_image_limit(void **state) {
  fixture *f = *state;
  add_zeros_layer(f, 10, 4ull << 20);
  add_zeros_layer(f, 10, 4ull << 20);
  gn_store_limits l = {.layer_max_bytes = 48ull << 20, .image_max_bytes = 64ull << 20};
  set_limits(f, &l);
  expect_refused(f, NULL, GN_ETOOBIG, "the image unpacks to more than 64 MiB");
}

static void test_unpack_refuses_sparse_giant(void **state) {
  fixture *f = *state;
  /* A terabyte declared, 4 KiB of data: under the default limits. */
  add_sparse_layer(f, 0, 1ull << 40);
  double t0 = now_s();
  expect_refused(f, NULL, GN_ETOOBIG, "unpacks to more than 8 GiB");
  assert_true(now_s() - t0 < 2.0);
}

static void test_unpack_keeps_small_sparse_file(void **state) {
  fixture *f = *state;
  add_sparse_layer(f, 0, 1ull << 20);
  expect_unpacked(f);
  char p[1024];
  struct stat st;
  snprintf(p, sizeof(p), "%s/giant", f->rootfs);
  assert_int_equal(stat(p, &st), 0);
  assert_int_equal(st.st_size, 1 << 20);
}

static void test_unpack_refuses_too_many_entries(void **state) {
  fixture *f = *state;
  add_many_layer(f, 150, "f");
  gn_store_limits l = {.layer_max_entries = 100};
  set_limits(f, &l);
  expect_refused(f, NULL, GN_ETOOBIG, "more than 100 entries");
}

static void test_unpack_refuses_too_many_entries_in_image(void **state) {
  fixture *f = *state;
  add_many_layer(f, 60, "a");
  add_many_layer(f, 60, "b");
  gn_store_limits l = {.layer_max_entries = 100, .image_max_entries = 100};
  set_limits(f, &l);
  expect_refused(f, NULL, GN_ETOOBIG, "the image has more than 100 entries");
}

static void test_unpack_counts_created_parents_as_entries(void **state) {
  fixture *f = *state;
  /* One entry 200 directories deep: an inode bomb if parents were free. */
  char deep[1024] = "";
  for (int i = 0; i < 200; i++)
    strcat(deep, "d/");
  strcat(deep, "f");
  const ent l1[] = {{'f', deep, "x", 0, 0, 0}};
  add_layer(f, l1, 1, GZIP);
  gn_store_limits l = {.layer_max_entries = 100};
  set_limits(f, &l);
  expect_refused(f, NULL, GN_ETOOBIG, "more than 100 entries");
}

static void test_unpack_refuses_into_free_space_reserve(void **state) {
  fixture *f = *state;
  const ent l1[] = {{'f', "x", "x", 0, 0, 0}};
  add_layer(f, l1, 1, GZIP);
  struct statvfs sv;
  assert_int_equal(statvfs(f->dir, &sv), 0);
  uint64_t avail = (uint64_t)sv.f_bavail * sv.f_frsize;
  /* A reserve larger than what is free: refused before the first byte. */
  gn_store_limits l = {.reserve_bytes = avail + (1ull << 40)};
  set_limits(f, &l);
  expect_refused(f, NULL, GN_ENOSPACE, "keeps free");
}

static void test_unpack_stops_before_the_reserve_mid_layer(void **state) {
  fixture *f = *state;
  /* 32 MiB of real data, then a sparse file declaring 7 GiB, with 1 GiB
   * free above the reserve: the second is refused before it is written. */
  add_sparse_layer(f, 32ull << 20, 7ull << 30);
  struct statvfs sv;
  assert_int_equal(statvfs(f->dir, &sv), 0);
  uint64_t avail = (uint64_t)sv.f_bavail * sv.f_frsize;
  if (avail < (3ull << 30))
    skip(); /* needs some room to leave a GiB above the reserve */
  gn_store_limits l = {.reserve_bytes = avail - (1ull << 30)};
  set_limits(f, &l);
  expect_refused(f, NULL, GN_ENOSPACE, "keeps free");
}

typedef struct canceler {
  volatile int flag;
  double set_at;
} canceler;

static void *cancel_after_200ms(void *ud) {
  canceler *c = ud;
  struct timespec ts = {0, 200 * 1000 * 1000};
  nanosleep(&ts, NULL);
  c->set_at = now_s();
  c->flag = 1;
  return NULL;
}

static void test_unpack_cancel_from_another_thread(void **state) {
  fixture *f = *state;
  add_zeros_layer(f, 2, 1ull << 30); /* 2 GiB to inflate and write: seconds of work */
  canceler c = {0};
  gn_unpack_opts o = {.cancel = &c.flag};
  pthread_t t;
  assert_int_equal(pthread_create(&t, NULL, cancel_after_200ms, &c), 0);
  char err[512] = "";
  int rc = gn_store_unpack_ex(f->store, &f->img, f->rootfs, &o, err, sizeof(err));
  double done = now_s();
  pthread_join(t, NULL);
  if (rc != GN_ECANCELED)
    fail_msg("unpack gave %d (%s), wanted GN_ECANCELED", rc, err);
  assert_non_null(strstr(err, "canceled"));
  if (done - c.set_at > 1.0)
    fail_msg("took %.2f s to stop after the cancel", done - c.set_at);
  print_message("stopped %.0f ms after the cancel\n", (done - c.set_at) * 1000);
  assert_false(th_exists(f->rootfs));
}

static void test_unpack_canceled_before_start_creates_nothing(void **state) {
  fixture *f = *state;
  const ent l1[] = {{'f', "x", "x", 0, 0, 0}};
  add_layer(f, l1, 1, GZIP);
  volatile int flag = 1;
  gn_unpack_opts o = {.cancel = &flag};
  expect_refused(f, &o, GN_ECANCELED, "canceled");
}

/* --- owners and the job's user namespace ----------------------------------*/

static void assert_owner(fixture *f, const char *rel, unsigned uid, unsigned gid) {
  char p[1024];
  struct stat st;
  snprintf(p, sizeof(p), "%s/%s", f->rootfs, rel);
  assert_int_equal(lstat(p, &st), 0);
  if (st.st_uid != uid || st.st_gid != gid)
    fail_msg("%s is owned by %u:%u, wanted %u:%u", rel, (unsigned)st.st_uid, (unsigned)st.st_gid, uid, gid);
}

static void test_unpack_shifts_owners_into_user_namespace(void **state) {
  fixture *f = *state;
  if (geteuid() != 0) {
    print_message("skipped: giving files to other uids needs root (CAP_CHOWN)\n");
    skip();
  }
  const ent l1[] = {{'d', "home/u", NULL, 0700, 1000, 1000},
                    {'f', "home/u/file", "mine", 0600, 1000, 1001},
                    {'f', "etc/passwd", "root:x:0:0", 0644, 0, 0},
                    {'l', "home/u/link", "file", 0, 1000, 1000},
                    {'f', "bin/su", "x", 04755, 0, 0},
                    {'f', "bin/sg", "x", 02755, 0, 50}};
  add_layer(f, l1, 6, GZIP);
  const ent l2[] = {{'f', "etc/passwd", "root:x:0:0\nu:x:1000:1000", 0644, 0, 0}};
  add_layer(f, l2, 1, ZSTD);
  const uint32_t base = 200000;
  gn_unpack_opts o = {.uid_base = base, .gid_base = base + 100000, .id_count = 65536};
  char err[512] = "";
  int rc = gn_store_unpack_ex(f->store, &f->img, f->rootfs, &o, err, sizeof(err));
  if (rc)
    fail_msg("unpack: %d %s", rc, err);
  assert_owner(f, ".", base, base + 100000);    /* the rootfs itself */
  assert_owner(f, "home", base, base + 100000); /* a parent the tar never listed */
  assert_owner(f, "etc", base, base + 100000);
  assert_owner(f, "home/u", base + 1000, base + 101000);
  assert_owner(f, "home/u/file", base + 1000, base + 101001);
  assert_owner(f, "home/u/link", base + 1000, base + 101000); /* the link itself, not its target */
  assert_owner(f, "etc/passwd", base, base + 100000);
  assert_owner(f, "bin/su", base, base + 100000);
  assert_owner(f, "bin/sg", base, base + 100050);
  /* setuid/setgid kept: they only name the job's own ids now. */
  struct stat st;
  char p[1024];
  snprintf(p, sizeof(p), "%s/bin/su", f->rootfs);
  assert_int_equal(stat(p, &st), 0);
  assert_int_equal(st.st_mode & 07777, 04755);
  snprintf(p, sizeof(p), "%s/bin/sg", f->rootfs);
  assert_int_equal(stat(p, &st), 0);
  assert_int_equal(st.st_mode & 07777, 02755);
  snprintf(p, sizeof(p), "%s/home/u", f->rootfs);
  assert_int_equal(stat(p, &st), 0);
  assert_int_equal(st.st_mode & 07777, 0700);
  assert_file(f, "etc/passwd", "root:x:0:0\nu:x:1000:1000");
}

static void test_unpack_refuses_owner_outside_the_id_range(void **state) {
  fixture *f = *state;
  const ent l1[] = {{'f', "ok", "ok", 0, 999, 999}, {'f', "home/too-high", "x", 0, 1000, 0}};
  add_layer(f, l1, 2, GZIP);
  gn_unpack_opts o = {.uid_base = 300000, .gid_base = 300000, .id_count = 1000};
  if (geteuid() != 0) {
    print_message("skipped: giving files to other uids needs root (CAP_CHOWN)\n");
    skip();
  }
  expect_refused(f, &o, GN_EPERM, "home/too-high");
  /* The group counts as much as the owner. */
  f->img.layer_count = 0;
  const ent l2[] = {{'f', "group-too-high", "x", 0, 0, 4000}};
  add_layer(f, l2, 1, GZIP);
  expect_refused(f, &o, GN_EPERM, "group-too-high");
}

static void test_unpack_whiteout_spares_entries_of_its_own_layer(void **state) {
  fixture *f = *state;
  const ent l1[] = {{'f', "a/x", "old", 0, 0, 0}, {'f', "a/y", "y", 0, 0, 0}};
  /* The whiteout comes after this layer's own a/x: it hides only the lower
   * one, which a/x replaced anyway; a/y is untouched. */
  const ent l2[] = {{'f', "a/x", "new", 0, 0, 0}, {'f', "a/.wh.x", "", 0, 0, 0}, {'f', "b/.wh.x", "", 0, 0, 0}};
  add_layer(f, l1, 2, GZIP);
  add_layer(f, l2, 3, GZIP);
  expect_unpacked(f);
  assert_file(f, "a/x", "new");
  assert_file(f, "a/y", "y");
  assert_false(rootfs_has(f, "b")); /* a whiteout creates no directories */
}

static void test_unpack_replaces_directory_by_file_and_back(void **state) {
  fixture *f = *state;
  const ent l1[] = {{'f', "p/q", "q", 0, 0, 0}, {'f', "r", "r", 0, 0, 0}};
  const ent l2[] = {{'f', "p", "now a file", 0, 0, 0}, {'f', "r/s", "under r", 0, 0, 0}};
  add_layer(f, l1, 2, GZIP);
  add_layer(f, l2, 2, GZIP);
  /* "r/s" needs r to be a directory: an image writing under a file is
   * malformed and refused. */
  expect_refused(f, NULL, GN_EPERM, "r/s");
  f->img.layer_count = 0;
  const ent l3[] = {{'f', "p", "now a file", 0, 0, 0}, {'d', "r", NULL, 0, 0, 0}, {'f', "r/s", "under r", 0, 0, 0}};
  add_layer(f, l1, 2, GZIP);
  add_layer(f, l3, 3, GZIP);
  expect_unpacked(f);
  assert_file(f, "p", "now a file");
  assert_file(f, "r/s", "under r");
}

static void test_unpack_keeps_read_only_directory_modes_and_times(void **state) {
  fixture *f = *state;
  const ent l1[] = {{'d', "ro", NULL, 0555, 0, 0}, {'f', "ro/f", "f", 0444, 0, 0}, {'d', "ro/sub", NULL, 0500, 0, 0}};
  add_layer(f, l1, 3, GZIP);
  expect_unpacked(f);
  struct stat st;
  char p[1024];
  snprintf(p, sizeof(p), "%s/ro", f->rootfs);
  assert_int_equal(stat(p, &st), 0);
  assert_int_equal(st.st_mode & 07777, 0555);
  assert_int_equal(st.st_mtime, 1700000000); /* set after its children were made */
  snprintf(p, sizeof(p), "%s/ro/sub", f->rootfs);
  assert_int_equal(stat(p, &st), 0);
  assert_int_equal(st.st_mode & 07777, 0500);
  assert_file(f, "ro/f", "f");
}

/* gn_rm_tree removes nested read-only directories and never follows a
 * symlink out of the tree. */
static void test_rm_tree_never_follows_links(void **state) {
  (void)state;
  char *base = th_mkdtemp("rmtree");
  char tree[512], deep[600], file[700], outside[512], canary[600], link[600];
  snprintf(tree, sizeof tree, "%s/tree", base);
  snprintf(deep, sizeof deep, "%s/a", tree);
  snprintf(outside, sizeof outside, "%s/outside", base);
  snprintf(canary, sizeof canary, "%s/canary", outside);
  snprintf(link, sizeof link, "%s/link", tree);
  assert_int_equal(mkdir(tree, 0755), 0);
  assert_int_equal(mkdir(deep, 0755), 0);
  snprintf(file, sizeof file, "%s/b", deep);
  assert_int_equal(mkdir(file, 0755), 0);
  snprintf(file, sizeof file, "%s/b/f", deep);
  FILE *f = fopen(file, "w");
  assert_non_null(f);
  fclose(f);
  snprintf(file, sizeof file, "%s/b", deep);
  assert_int_equal(chmod(file, 0), 0);
  assert_int_equal(chmod(deep, 0), 0);
  assert_int_equal(mkdir(outside, 0755), 0);
  f = fopen(canary, "w");
  assert_non_null(f);
  fclose(f);
  assert_int_equal(symlink(outside, link), 0);
  assert_int_equal(gn_rm_tree(tree), 0);
  assert_false(th_exists(tree));
  assert_true(th_exists(canary));
  assert_int_equal(gn_rm_tree(tree), 0); /* already gone */
  assert_int_equal(gn_rm_tree(""), GN_EINVAL);
  th_rm_rf(base);
  free(base);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_unpack_applies_layers_in_order, setup, teardown),
      cmocka_unit_test_setup_teardown(test_unpack_detects_compression, setup, teardown),
      cmocka_unit_test_setup_teardown(test_unpack_whiteout_deletes_lower_entries, setup, teardown),
      cmocka_unit_test_setup_teardown(test_unpack_whiteout_then_recreate_in_same_layer, setup, teardown),
      cmocka_unit_test_setup_teardown(test_unpack_opaque_dir_hides_lower_contents, setup, teardown),
      cmocka_unit_test_setup_teardown(test_unpack_keeps_symlinks_as_symlinks, setup, teardown),
      cmocka_unit_test_setup_teardown(test_unpack_strips_setuid_and_skips_fifos, setup, teardown),
      cmocka_unit_test_setup_teardown(test_unpack_refuses_existing_rootfs, setup, teardown),
      cmocka_unit_test_setup_teardown(test_unpack_refuses_layer_not_matching_digest, setup, teardown),
      cmocka_unit_test_setup_teardown(test_unpack_refuses_non_tar_blob, setup, teardown),
      cmocka_unit_test_setup_teardown(test_unpack_refuses_hostile_archives, setup, teardown),
      cmocka_unit_test_setup_teardown(test_unpack_refuses_gzip_bomb_over_layer_limit, setup, teardown),
      cmocka_unit_test_setup_teardown(test_unpack_counts_bytes_written_across_files, setup, teardown),
      cmocka_unit_test_setup_teardown(test_unpack_refuses_image_over_image_limit, setup, teardown),
      cmocka_unit_test_setup_teardown(test_unpack_refuses_sparse_giant, setup, teardown),
      cmocka_unit_test_setup_teardown(test_unpack_keeps_small_sparse_file, setup, teardown),
      cmocka_unit_test_setup_teardown(test_unpack_refuses_too_many_entries, setup, teardown),
      cmocka_unit_test_setup_teardown(test_unpack_refuses_too_many_entries_in_image, setup, teardown),
      cmocka_unit_test_setup_teardown(test_unpack_counts_created_parents_as_entries, setup, teardown),
      cmocka_unit_test_setup_teardown(test_unpack_refuses_into_free_space_reserve, setup, teardown),
      cmocka_unit_test_setup_teardown(test_unpack_stops_before_the_reserve_mid_layer, setup, teardown),
      cmocka_unit_test_setup_teardown(test_unpack_cancel_from_another_thread, setup, teardown),
      cmocka_unit_test_setup_teardown(test_unpack_canceled_before_start_creates_nothing, setup, teardown),
      cmocka_unit_test_setup_teardown(test_unpack_shifts_owners_into_user_namespace, setup, teardown),
      cmocka_unit_test_setup_teardown(test_unpack_refuses_owner_outside_the_id_range, setup, teardown),
      cmocka_unit_test_setup_teardown(test_unpack_whiteout_spares_entries_of_its_own_layer, setup, teardown),
      cmocka_unit_test_setup_teardown(test_unpack_replaces_directory_by_file_and_back, setup, teardown),
      cmocka_unit_test_setup_teardown(test_unpack_keeps_read_only_directory_modes_and_times, setup, teardown),
      cmocka_unit_test(test_rm_tree_never_follows_links),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
