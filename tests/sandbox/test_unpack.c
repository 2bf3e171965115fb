/* Layer unpacking: layers built here with libarchive's writer, put into a
 * real store, unpacked with gn_store_unpack. Order, whiteouts, opaque
 * directories, compression, and a table of hostile archives that must be
 * refused with the entry named and nothing written outside the root. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <archive.h>
#include <archive_entry.h>
#include <cmocka.h>
#include <gpunet/sandbox.h>
#include <sodium.h>
#include <sys/sysmacros.h>

#include "sandbox/helpers.h"

typedef struct ent {
  char type; /* f file, d dir, l symlink, h hardlink, c char dev, b block dev, p fifo */
  const char *path;
  const char *data; /* file content, or link target */
  unsigned mode;    /* 0: a default for the type */
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

/* Writes a tar layer of the given entries, stores it under its digest and
 * appends it to the fixture's image. */
static void add_layer(fixture *f, const ent *ents, size_t n, int filter) {
  char tmp[600], path[700];
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

  size_t blen = 0;
  char *bytes = th_read_file(tmp, &blen);
  uint8_t h[32];
  crypto_hash_sha256(h, (const uint8_t *)bytes, blen);
  free(bytes);
  char *d = f->digests[f->img.layer_count];
  strcpy(d, "sha256:");
  sodium_bin2hex(d + 7, GN_DIGEST_STRLEN - 7, h, sizeof(h));
  snprintf(path, sizeof(path), "%s/blobs/sha256/%s", f->store_dir, d + 7);
  assert_int_equal(rename(tmp, path), 0);
  f->img.layer_count++;
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
  const ent l1[] = {{'d', "a", NULL, 0}, {'f', "a/f1", "one", 0}, {'f', "a/f2", "two", 0}, {'f', "./keep", "k", 0}};
  const ent l2[] = {{'f', "a/f1", "uno", 0}, {'f', "a/new", "new", 0}};
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
  const ent p[] = {{'f', "plain", "p", 0}};
  const ent g[] = {{'f', "gzip", "g", 0}};
  const ent z[] = {{'f', "zstd", "z", 0}};
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
  const ent l1[] = {{'f', "a/x", "x", 0}, {'f', "a/y", "y", 0}, {'f', "b/dir/z", "z", 0}, {'f', "c", "c", 0}};
  const ent l2[] = {{'f', "a/.wh.x", "", 0}, {'f', ".wh.b", "", 0}, {'f', ".wh.nothing-there", "", 0}};
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
  const ent l1[] = {{'f', "d/old", "old", 0}};
  /* Replacing a directory by a file: whiteout and new entry in one layer. */
  const ent l2[] = {{'f', "d2", "file", 0}, {'f', ".wh.d", "", 0}, {'f', "d", "now a file", 0}};
  add_layer(f, l1, 1, GZIP);
  add_layer(f, l2, 3, GZIP);
  expect_unpacked(f);
  assert_file(f, "d", "now a file");
}

static void test_unpack_opaque_dir_hides_lower_contents(void **state) {
  fixture *f = *state;
  const ent l1[] = {{'f', "d/old1", "1", 0}, {'f', "d/sub/old2", "2", 0}, {'f', "e/keep", "k", 0}};
  /* The marker comes after the new file: order inside a layer must not
   * matter. */
  const ent l2[] = {{'d', "d", NULL, 0}, {'f', "d/new", "n", 0}, {'f', "d/.wh..wh..opq", "", 0}};
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
  const ent l1[] = {{'f', "bin/busybox", "bb", 0755},
                    {'l', "bin/sh", "busybox", 0},
                    {'l', "etc/abs", "/etc/passwd", 0},
                    {'h', "bin/hard", "bin/busybox", 0}};
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
  const ent l1[] = {
      {'f', "bin/su", "x", 04755}, {'f', "bin/sg", "x", 02755}, {'p', "run/fifo", NULL, 0}, {'f', "run/after", "a", 0}};
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
  const ent l1[] = {{'f', "x", "x", 0}};
  add_layer(f, l1, 1, GZIP);
  assert_int_equal(mkdir(f->rootfs, 0755), 0);
  char err[512] = "";
  assert_int_equal(unpack(f, err, sizeof(err)), GN_EEXIST);
  assert_true(th_exists(f->rootfs)); /* not ours: left alone */
}

static void test_unpack_refuses_layer_not_matching_digest(void **state) {
  fixture *f = *state;
  const ent l1[] = {{'f', "x", "x", 0}};
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
    {"absolute path", {{0}}, 0, {{'f', "%O/abs", "pwned", 0}}, 1, GN_EPERM, "/abs", "abs"},
    {"dotdot escape", {{0}}, 0, {{'f', "../outside/dotdot", "pwned", 0}}, 1, GN_EPERM, "../outside/dotdot", "dotdot"},
    {"inner dotdot",
     {{0}},
     0,
     {{'f', "a/../../outside/inner", "pwned", 0}},
     1,
     GN_EPERM,
     "a/../../outside/inner",
     "inner"},
    {"write through an absolute symlink in one layer",
     {{0}},
     0,
     {{'l', "link", "%O", 0}, {'f', "link/pwned", "pwned", 0}},
     2,
     GN_EPERM,
     "link/pwned",
     "pwned"},
    {"write through a relative symlink in one layer",
     {{0}},
     0,
     {{'l', "rel", "../outside", 0}, {'f', "rel/pwned2", "pwned", 0}},
     2,
     GN_EPERM,
     "rel/pwned2",
     "pwned2"},
    {"write through a symlink from a lower layer",
     {{'l', "lower", "%O", 0}},
     1,
     {{'f', "lower/pwned3", "pwned", 0}},
     1,
     GN_EPERM,
     "lower/pwned3",
     "pwned3"},
    {"write through a symlinked parent deeper down",
     {{'d', "d", NULL, 0}, {'l', "d/l", "%O", 0}},
     2,
     {{'f', "d/l/sub/pwned4", "pwned", 0}},
     1,
     GN_EPERM,
     "d/l/sub/pwned4",
     "sub"},
    {"hardlink with dotdot", {{0}}, 0, {{'h', "hl", "../outside/secret", 0}}, 1, GN_EPERM, "hl", NULL},
    {"hardlink through a symlink", {{'l', "s", "%O", 0}}, 1, {{'h', "h", "s/secret", 0}}, 1, GN_EPERM, "\"h\"", NULL},
    {"hardlink to an absolute path", {{0}}, 0, {{'h', "h2", "%O/secret", 0}}, 1, GN_EPERM, "h2", NULL},
    {"char device", {{0}}, 0, {{'f', "ok", "ok", 0}, {'c', "dev/null", NULL, 0}}, 2, GN_EPERM, "dev/null", NULL},
    {"block device", {{0}}, 0, {{'b', "dev/sda", NULL, 0}}, 1, GN_EPERM, "dev/sda", NULL},
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
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
