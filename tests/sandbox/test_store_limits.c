/* The image store under the provider's limits, against a real
 * docker-registry on loopback: registries on loopback and private
 * addresses refused unless allow-listed, the free-space reserve, the size
 * budget and its garbage collector, shared unpacked roots, and concurrent
 * pulls of one image into one store. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <gpunet/sandbox.h>
#include <ifaddrs.h>
#include <pthread.h>
#include <sys/time.h>

#include "sandbox/helpers.h"

static th_registry reg;

static int setup(void **state) {
  (void)state;
  return th_registry_setup(&reg);
}

static int teardown(void **state) {
  (void)state;
  th_registry_stop(&reg);
  return 0;
}

static gn_store *open_store(const char *dir, const gn_store_limits *lim) {
  gn_store *s = NULL;
  assert_int_equal(gn_store_open(dir, &s), 0);
  if (lim)
    assert_int_equal(gn_store_set_limits(s, lim), 0);
  return s;
}

static void ref_bb(gn_imageref *r) {
  char s[256];
  snprintf(s, sizeof(s), "%s/bb@%s", reg.host, reg.digest);
  assert_int_equal(gn_imageref_parse(s, r), 0);
}

static const char *const allow_loopback[] = {"127.0.0.1", NULL};

static void test_loopback_registry_refused_without_allow_list(void **state) {
  (void)state;
  char *dir = th_mkdtemp("lim"), err[512] = "", path[4096];
  gn_store *s = open_store(dir, NULL);
  gn_imageref r;
  gn_image img;
  ref_bb(&r);
  assert_int_equal(gn_store_pull_ex(s, &r, NULL, &img, err, sizeof(err), NULL, 0), GN_EPERM);
  assert_non_null(strstr(err, reg.host));
  assert_non_null(strstr(err, "loopback"));
  assert_non_null(strstr(err, "registry_allow"));
  /* The plain wrapper runs under the same policy. */
  assert_int_equal(gn_store_pull(s, &r, NULL, NULL, &img, err, sizeof(err)), GN_EPERM);
  snprintf(path, sizeof(path), "%s/blobs/sha256", dir);
  assert_int_equal(th_count_entries(path), 0);
  gn_store_free(s);
  th_rm_rf(dir);
  free(dir);
}

static void test_loopback_registry_pulled_when_allow_listed(void **state) {
  (void)state;
  char hostport[80];
  snprintf(hostport, sizeof(hostport), "%s", reg.host);
  /* By address, by host:port, by CIDR. */
  const char *const by_addr[] = {"127.0.0.1", NULL};
  const char *const by_hostport[] = {"10.0.0.0/8", hostport, NULL};
  const char *const by_cidr[] = {"127.0.0.0/8", NULL};
  /* A name: resolved once, pinned for curl (CURLOPT_RESOLVE). */
  const char *const by_name[] = {"localhost", NULL};
  const char *const *lists[] = {by_addr, by_hostport, by_cidr, by_name};
  for (size_t i = 0; i < 4; i++) {
    char *dir = th_mkdtemp("lim"), err[512] = "";
    gn_store_limits lim = {.registry_allow = lists[i]};
    gn_store *s = open_store(dir, &lim);
    gn_imageref r;
    gn_image img;
    ref_bb(&r);
    if (lists[i] == by_name) {
      char ref[256];
      snprintf(ref, sizeof(ref), "localhost:%d/bb@%s", reg.port, reg.digest);
      assert_int_equal(gn_imageref_parse(ref, &r), 0);
    }
    int rc = gn_store_pull_ex(s, &r, NULL, &img, err, sizeof(err), NULL, 0);
    if (rc)
      fail_msg("allow list %zu: %d %s", i, rc, err);
    assert_string_equal(img.manifest_digest, reg.digest);
    gn_image_done(&img);
    gn_store_free(s);
    th_rm_rf(dir);
    free(dir);
  }
}

/* The first IPv4 address of an interface other than lo, or "". */
static void own_address(char out[64]) {
  struct ifaddrs *ifa = NULL, *i;
  out[0] = '\0';
  if (getifaddrs(&ifa) < 0)
    return;
  for (i = ifa; i; i = i->ifa_next) {
    if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET || strcmp(i->ifa_name, "lo") == 0)
      continue;
    inet_ntop(AF_INET, &((struct sockaddr_in *)i->ifa_addr)->sin_addr, out, 64);
    break;
  }
  freeifaddrs(ifa);
}

static void test_private_and_special_addresses_refused(void **state) {
  (void)state;
  char own[64], ownref[128] = "";
  own_address(own);
  if (own[0])
    snprintf(ownref, sizeof(ownref), "%s:5000", own);
  const char *hosts[] = {"10.1.2.3:5000",  "172.16.0.1",      "192.168.1.1:5000",
                         "100.64.0.1",     "169.254.169.254", "0.0.0.0",
                         "224.0.0.1",      "255.255.255.255", "[::1]:5000",
                         "[fe80::1]",      "[fd00::1]:5000",  "[::ffff:192.168.0.1]",
                         "localhost:5000", "127.8.9.10",      ownref[0] ? ownref : "10.9.9.9"};
  /* An allow list that holds none of them: a neighbouring network. */
  const char *const allow[] = {"10.0.0.0/16", "192.168.2.1", NULL};
  char *dir = th_mkdtemp("lim");
  gn_store_limits lim = {.registry_allow = allow};
  gn_store *s = open_store(dir, &lim);
  for (size_t i = 0; i < sizeof(hosts) / sizeof(hosts[0]); i++) {
    char ref[256], err[512] = "";
    gn_imageref r;
    gn_image img;
    snprintf(ref, sizeof(ref), "%s/bb@%s", hosts[i], reg.digest);
    assert_int_equal(gn_imageref_parse(ref, &r), 0);
    struct timeval t0, t1;
    gettimeofday(&t0, NULL);
    int rc = gn_store_pull_ex(s, &r, NULL, &img, err, sizeof(err), NULL, 0);
    gettimeofday(&t1, NULL);
    if (rc != GN_EPERM)
      fail_msg("%s: %d (%s), wanted GN_EPERM", hosts[i], rc, err);
    if (!strstr(err, "registry_allow"))
      fail_msg("%s: the refusal does not name the config key: %s", hosts[i], err);
    /* Refused before any connection: no connect timeout. */
    assert_true(t1.tv_sec - t0.tv_sec < 3);
  }
  gn_store_free(s);
  th_rm_rf(dir);
  free(dir);
}

static void test_reserve_refuses_blob_that_would_cut_into_it(void **state) {
  (void)state;
  char *dir = th_mkdtemp("lim"), err[512] = "", path[4096];
  gn_store_limits lim = {.registry_allow = allow_loopback, .reserve_bytes = 1ull << 62};
  gn_store *s = open_store(dir, &lim);
  gn_imageref r;
  gn_image img;
  ref_bb(&r);
  assert_int_equal(gn_store_pull_ex(s, &r, NULL, &img, err, sizeof(err), NULL, 0), GN_ENOSPACE);
  assert_non_null(strstr(err, "reserve"));
  /* Only the manifest (fetched to learn the sizes) is kept; no layer. */
  snprintf(path, sizeof(path), "%s/blobs/sha256", dir);
  assert_true(th_count_entries(path) <= 1);
  snprintf(path, sizeof(path), "%s/tmp", dir);
  assert_int_equal(th_count_entries(path), 0);
  gn_store_free(s);
  th_rm_rf(dir);
  free(dir);
}

/* A file under blobs/sha256 named like a digest, last used `age_s` ago. */
static void fake_blob(const char *dir, char c, size_t n, int age_s) {
  char path[4096], hex[65];
  memset(hex, c, 64);
  hex[64] = '\0';
  snprintf(path, sizeof(path), "%s/blobs/sha256/%s", dir, hex);
  char *b = calloc(1, n);
  assert_int_equal(th_write_file(path, b, n), 0);
  free(b);
  struct timeval tv[2];
  gettimeofday(&tv[0], NULL);
  tv[0].tv_sec -= age_s;
  tv[1] = tv[0];
  assert_int_equal(utimes(path, tv), 0);
}

static bool fake_exists(const char *dir, char c) {
  char path[4096], hex[65];
  memset(hex, c, 64);
  hex[64] = '\0';
  snprintf(path, sizeof(path), "%s/blobs/sha256/%s", dir, hex);
  return th_exists(path);
}

static void test_gc_removes_least_recently_used_down_to_budget(void **state) {
  (void)state;
  char *dir = th_mkdtemp("lim");
  gn_store_limits lim = {.store_max_bytes = 25000, .reserve_bytes = 1};
  gn_store *s = open_store(dir, &lim);
  fake_blob(dir, 'a', 10000, 3000); /* oldest */
  fake_blob(dir, 'b', 10000, 2000);
  fake_blob(dir, 'c', 10000, 1000);
  uint64_t freed = 0;
  assert_int_equal(gn_store_gc(s, &freed), 0);
  assert_int_equal(freed, 10000);
  assert_false(fake_exists(dir, 'a'));
  assert_true(fake_exists(dir, 'b'));
  assert_true(fake_exists(dir, 'c'));
  /* Within budget: nothing more goes. */
  assert_int_equal(gn_store_gc(s, &freed), 0);
  assert_int_equal(freed, 0);
  gn_store_free(s);
  th_rm_rf(dir);
  free(dir);
}

static void test_pull_over_budget_collects_old_blobs_first(void **state) {
  (void)state;
  char *dir = th_mkdtemp("lim"), err[512] = "";
  /* Room for the image (a couple of MB) but not for it and the old blobs. */
  gn_store_limits lim = {.registry_allow = allow_loopback, .store_max_bytes = 6u << 20, .reserve_bytes = 1};
  gn_store *s = open_store(dir, &lim);
  fake_blob(dir, 'd', 3u << 20, 5000);
  fake_blob(dir, 'e', 3u << 20, 4000);
  gn_imageref r;
  gn_image img;
  ref_bb(&r);
  int rc = gn_store_pull_ex(s, &r, NULL, &img, err, sizeof(err), NULL, 0);
  if (rc)
    fail_msg("pull: %d %s", rc, err);
  assert_false(fake_exists(dir, 'd')); /* the oldest went */
  char path[4096];
  snprintf(path, sizeof(path), "%s/blobs/sha256/%s", dir, img.layers[0] + 7);
  assert_true(th_exists(path));
  gn_image_done(&img);
  gn_store_free(s);
  th_rm_rf(dir);
  free(dir);
}

static void test_image_over_budget_is_refused(void **state) {
  (void)state;
  char *dir = th_mkdtemp("lim"), err[512] = "";
  gn_store_limits lim = {.registry_allow = allow_loopback, .store_max_bytes = 100000, .reserve_bytes = 1};
  gn_store *s = open_store(dir, &lim);
  gn_imageref r;
  gn_image img;
  ref_bb(&r);
  assert_int_equal(gn_store_pull_ex(s, &r, NULL, &img, err, sizeof(err), NULL, 0), GN_ENOSPACE);
  assert_non_null(strstr(err, "budget"));
  gn_store_free(s);
  th_rm_rf(dir);
  free(dir);
}

static void test_open_removes_abandoned_temp_entries(void **state) {
  (void)state;
  char *dir = th_mkdtemp("lim"), path[4096];
  gn_store *s = open_store(dir, NULL);
  gn_store_free(s);
  /* A retired tree, a day-old partial download and a fresh one. */
  snprintf(path, sizeof(path), "%s/tmp/gc-0011223344556677", dir);
  assert_int_equal(mkdir(path, 0500), 0);
  snprintf(path, sizeof(path), "%s/tmp/old.partial", dir);
  assert_int_equal(th_write_file(path, "x", 1), 0);
  struct timeval tv[2];
  gettimeofday(&tv[0], NULL);
  tv[0].tv_sec -= 3 * 24 * 3600;
  tv[1] = tv[0];
  assert_int_equal(utimes(path, tv), 0);
  snprintf(path, sizeof(path), "%s/tmp/fresh.partial", dir);
  assert_int_equal(th_write_file(path, "x", 1), 0);
  s = open_store(dir, NULL);
  snprintf(path, sizeof(path), "%s/tmp", dir);
  assert_int_equal(th_count_entries(path), 1);
  snprintf(path, sizeof(path), "%s/tmp/fresh.partial", dir);
  assert_true(th_exists(path)); /* may be a download in progress: kept */
  gn_store_free(s);
  th_rm_rf(dir);
  free(dir);
}

typedef struct rootfs_call {
  gn_store *s;
  const gn_image *img;
  int rc;
  char path[4096];
  char err[512];
} rootfs_call;

static void *rootfs_thread(void *p) {
  rootfs_call *c = p;
  gn_unpack_opts o = {0};
  c->rc = gn_store_rootfs(c->s, c->img, &o, c->path, c->err, sizeof(c->err));
  return NULL;
}

static void test_rootfs_unpacked_once_and_shared(void **state) {
  (void)state;
  char *dir = th_mkdtemp("lim"), err[512] = "", p1[4096], p2[4096], marker[4200], path[4200];
  gn_store_limits lim = {.registry_allow = allow_loopback, .reserve_bytes = 1};
  gn_store *s = open_store(dir, &lim);
  gn_imageref r;
  gn_image img;
  ref_bb(&r);
  int rc = gn_store_pull_ex(s, &r, NULL, &img, err, sizeof(err), NULL, 0);
  if (rc)
    fail_msg("pull: %d %s", rc, err);
  /* Two at once: both wait for one unpack and get the same root. */
  rootfs_call a = {.s = s, .img = &img}, b = {.s = s, .img = &img};
  pthread_t ta, tb;
  assert_int_equal(pthread_create(&ta, NULL, rootfs_thread, &a), 0);
  assert_int_equal(pthread_create(&tb, NULL, rootfs_thread, &b), 0);
  pthread_join(ta, NULL);
  pthread_join(tb, NULL);
  if (a.rc || b.rc)
    fail_msg("rootfs: %d %s / %d %s", a.rc, a.err, b.rc, b.err);
  assert_string_equal(a.path, b.path);
  snprintf(path, sizeof(path), "%s/bin/busybox", a.path);
  assert_true(th_exists(path));
  /* A third call later is the same root, not a new unpack: a marker put
   * into the root survives. */
  snprintf(marker, sizeof(marker), "%s/.unpacked-once", a.path);
  assert_int_equal(th_write_file(marker, "x", 1), 0);
  assert_int_equal(gn_store_rootfs(s, &img, NULL, p1, err, sizeof(err)), 0);
  assert_string_equal(p1, a.path);
  assert_true(th_exists(marker));
  assert_true(p1[0] == '/');
  snprintf(path, sizeof(path), "%s/tmp", dir);
  assert_int_equal(th_count_entries(path), 0);

  /* In use, the root survives a collection down to nothing. */
  gn_store_limits tiny = {.registry_allow = allow_loopback, .store_max_bytes = 1, .reserve_bytes = 1};
  assert_int_equal(gn_store_set_limits(s, &tiny), 0);
  assert_int_equal(gn_store_gc(s, NULL), 0);
  assert_true(th_exists(marker));
  /* Released by all three, it goes. */
  gn_store_rootfs_release(s, a.path);
  gn_store_rootfs_release(s, b.path);
  assert_int_equal(gn_store_gc(s, NULL), 0);
  assert_true(th_exists(marker)); /* one user left */
  gn_store_rootfs_release(s, p1);
  uint64_t freed = 0;
  assert_int_equal(gn_store_gc(s, &freed), 0);
  assert_false(th_exists(p1));
  assert_true(freed > 0);
  /* Asked for again, it is unpacked again (the blobs are pulled again
   * first, since gc took them too). */
  rc = gn_store_pull_ex(s, &r, NULL, &img, err, sizeof(err), NULL, 0);
  (void)rc;
  gn_store_limits roomy = {.registry_allow = allow_loopback, .reserve_bytes = 1};
  assert_int_equal(gn_store_set_limits(s, &roomy), 0);
  gn_image img2;
  assert_int_equal(gn_store_pull_ex(s, &r, NULL, &img2, err, sizeof(err), NULL, 0), 0);
  assert_int_equal(gn_store_rootfs(s, &img2, NULL, p2, err, sizeof(err)), 0);
  assert_string_equal(p2, p1);
  assert_false(th_exists(marker));
  gn_store_rootfs_release(s, p2);
  gn_image_done(&img2);
  gn_image_done(&img);
  gn_store_free(s);
  th_rm_rf(dir);
  free(dir);
}

typedef struct pull_call {
  gn_store *s;
  int rc;
  char err[512];
} pull_call;

static void *pull_thread(void *p) {
  pull_call *c = p;
  gn_imageref r;
  gn_image img;
  ref_bb(&r);
  c->rc = gn_store_pull_ex(c->s, &r, NULL, &img, c->err, sizeof(c->err), NULL, 0);
  if (c->rc == 0)
    gn_image_done(&img);
  return NULL;
}

static void test_concurrent_pulls_of_one_image(void **state) {
  (void)state;
  char *dir = th_mkdtemp("lim"), path[4096];
  gn_store_limits lim = {.registry_allow = allow_loopback, .reserve_bytes = 1};
  gn_store *s = open_store(dir, &lim);
  pull_call c[4];
  pthread_t t[4];
  for (int i = 0; i < 4; i++) {
    c[i] = (pull_call){.s = s};
    assert_int_equal(pthread_create(&t[i], NULL, pull_thread, &c[i]), 0);
  }
  for (int i = 0; i < 4; i++) {
    pthread_join(t[i], NULL);
    if (c[i].rc)
      fail_msg("pull %d: %d %s", i, c[i].rc, c[i].err);
  }
  /* One copy of each blob, verified, and nothing half-written left. */
  gn_imageref r;
  gn_image img;
  ref_bb(&r);
  char err[512] = "";
  assert_int_equal(gn_store_pull_ex(s, &r, NULL, &img, err, sizeof(err), NULL, 0), 0);
  assert_int_equal(img.bytes_fetched, 0);
  gn_image_done(&img);
  snprintf(path, sizeof(path), "%s/tmp", dir);
  assert_int_equal(th_count_entries(path), 0);
  gn_store_free(s);
  th_rm_rf(dir);
  free(dir);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_loopback_registry_refused_without_allow_list),
      cmocka_unit_test(test_loopback_registry_pulled_when_allow_listed),
      cmocka_unit_test(test_private_and_special_addresses_refused),
      cmocka_unit_test(test_reserve_refuses_blob_that_would_cut_into_it),
      cmocka_unit_test(test_gc_removes_least_recently_used_down_to_budget),
      cmocka_unit_test(test_pull_over_budget_collects_old_blobs_first),
      cmocka_unit_test(test_image_over_budget_is_refused),
      cmocka_unit_test(test_open_removes_abandoned_temp_entries),
      cmocka_unit_test(test_rootfs_unpacked_once_and_shared),
      cmocka_unit_test(test_concurrent_pulls_of_one_image),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
