/* Registry client and image store against a real docker-registry started on a
 * free loopback port by scripts/registry: resolve, pull, no refetch, digest
 * refusals, image index platform choice, resumed downloads. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <curl/curl.h>
#include <gpunet/sandbox.h>
#include <sodium.h>

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

static void ref_for(gn_imageref *r, const char *name_tag, const char *digest) {
  char s[512];
  snprintf(s, sizeof(s), "%s/%s%s%s", reg.host, name_tag, digest ? "@" : "", digest ? digest : "");
  assert_int_equal(gn_imageref_parse(s, r), 0);
}

static char *new_store_dir(void) {
  char *d = th_mkdtemp("store");
  assert_non_null(d);
  return d;
}

static void test_resolve_returns_pushed_digest(void **state) {
  (void)state;
  gn_imageref r;
  char digest[GN_DIGEST_STRLEN], err[256] = "";
  ref_for(&r, "bb:latest", NULL);
  assert_true(r.plain_http);
  int rc = gn_registry_resolve(&r, digest, err, sizeof(err));
  if (rc)
    fail_msg("resolve: %d %s", rc, err);
  assert_string_equal(digest, reg.digest);
}

static void test_resolve_unknown_tag_is_not_found(void **state) {
  (void)state;
  gn_imageref r;
  char digest[GN_DIGEST_STRLEN] = "unchanged", err[256] = "";
  ref_for(&r, "bb:nosuchtag", NULL);
  assert_int_equal(gn_registry_resolve(&r, digest, err, sizeof(err)), GN_ENOTFOUND);
  assert_string_equal(digest, "unchanged");
  assert_non_null(strstr(err, "404"));
}

static void test_pull_stores_image_and_second_pull_fetches_nothing(void **state) {
  (void)state;
  char *dir = new_store_dir();
  gn_store *s = NULL;
  gn_imageref r;
  gn_image img, img2;
  char err[256] = "", path[4096];
  ref_for(&r, "bb", reg.digest);
  assert_int_equal(th_store_open_loopback(dir, &s), 0);
  int rc = gn_store_pull(s, &r, NULL, NULL, &img, err, sizeof(err));
  if (rc)
    fail_msg("pull: %d %s", rc, err);
  assert_string_equal(img.manifest_digest, reg.digest);
  assert_int_equal(img.layer_count, 1);
  assert_true(img.bytes_fetched > 1000000); /* busybox is a megabyte or so */
  assert_null(img.entrypoint);
  assert_non_null(img.cmd);
  assert_string_equal(img.cmd[0], "/bin/sh");
  assert_null(img.cmd[1]);
  assert_non_null(img.env);
  assert_string_equal(img.env[0], "PATH=/bin");
  assert_string_equal(img.workdir, "/");
  /* The manifest and layer are kept under their digests. */
  snprintf(path, sizeof(path), "%s/blobs/sha256/%s", dir, reg.digest + 7);
  assert_true(th_exists(path));
  snprintf(path, sizeof(path), "%s/blobs/sha256/%s", dir, img.layers[0] + 7);
  assert_true(th_exists(path));
  snprintf(path, sizeof(path), "%s/tmp", dir);
  assert_int_equal(th_count_entries(path), 0);

  rc = gn_store_pull(s, &r, NULL, NULL, &img2, err, sizeof(err));
  if (rc)
    fail_msg("second pull: %d %s", rc, err);
  assert_int_equal(img2.bytes_fetched, 0);
  assert_string_equal(img2.layers[0], img.layers[0]);
  gn_image_done(&img);
  gn_image_done(&img2);
  gn_store_free(s);
  th_rm_rf(dir);
  free(dir);
}

static void test_pull_refuses_unpinned_ref(void **state) {
  (void)state;
  char *dir = new_store_dir();
  gn_store *s = NULL;
  gn_imageref r;
  gn_image img;
  char err[256] = "";
  ref_for(&r, "bb:latest", NULL);
  assert_int_equal(th_store_open_loopback(dir, &s), 0);
  assert_int_equal(gn_store_pull(s, &r, NULL, NULL, &img, err, sizeof(err)), GN_EINVAL);
  gn_store_free(s);
  th_rm_rf(dir);
  free(dir);
}

static void test_pull_refuses_ref_pinned_to_another_digest(void **state) {
  (void)state;
  char *dir = new_store_dir();
  gn_store *s = NULL;
  gn_imageref r;
  gn_image img;
  char err[256] = "", other[GN_DIGEST_STRLEN], path[4096];
  uint8_t h[32];
  crypto_hash_sha256(h, (const uint8_t *)"not this image", 14);
  strcpy(other, "sha256:");
  sodium_bin2hex(other + 7, sizeof(other) - 7, h, sizeof(h));
  ref_for(&r, "bb", other);
  assert_int_equal(th_store_open_loopback(dir, &s), 0);
  int rc = gn_store_pull(s, &r, NULL, NULL, &img, err, sizeof(err));
  assert_true(rc < 0);
  snprintf(path, sizeof(path), "%s/blobs/sha256", dir);
  assert_int_equal(th_count_entries(path), 0);
  gn_store_free(s);
  th_rm_rf(dir);
  free(dir);
}

/* Changes one hex digit of a blob in the registry's own storage (keeping a
 * manifest valid JSON, which the registry insists on), pulls, and puts the
 * byte back before anything is asserted. */
static void pull_with_corrupted_registry_blob(const char *digest, bool json) {
  char path[4096], dir_err[256] = "", tmp[4096];
  th_registry_blob_path(&reg, digest, path, sizeof(path));
  size_t len = 0;
  char *bytes = th_read_file(path, &len);
  assert_non_null(bytes);
  size_t at = 200;
  if (json) {
    char *p = strstr(bytes, "sha256:");
    assert_non_null(p);
    at = (size_t)(p - bytes) + 7 + 10;
  }
  assert_true(at < len);
  int fd = open(path, O_RDWR);
  assert_true(fd >= 0);
  uint8_t b = (uint8_t)bytes[at];
  uint8_t flipped = json ? (b == '0' ? '1' : '0') : b ^ 0x01;
  assert_int_equal(pwrite(fd, &flipped, 1, (off_t)at), 1);

  char *dir = new_store_dir();
  gn_store *s = NULL;
  gn_imageref r;
  gn_image img;
  ref_for(&r, "bb", reg.digest);
  int rc = th_store_open_loopback(dir, &s);
  if (rc == 0)
    rc = gn_store_pull(s, &r, NULL, NULL, &img, dir_err, sizeof(dir_err));
  if (rc == 0)
    gn_image_done(&img);
  assert_int_equal(pwrite(fd, &b, 1, (off_t)at), 1);
  close(fd);
  free(bytes);

  if (rc != GN_EDIGEST)
    fail_msg("pull of a corrupted image gave %d (%s), not GN_EDIGEST", rc, dir_err);
  assert_non_null(strstr(dir_err, "does not match its digest"));
  assert_non_null(strstr(dir_err, "sha256:"));
  /* Nothing of the bad blob is kept, not even the partial download. */
  snprintf(tmp, sizeof(tmp), "%s/tmp", dir);
  assert_int_equal(th_count_entries(tmp), 0);
  snprintf(tmp, sizeof(tmp), "%s/blobs/sha256/%s", dir, digest + 7);
  assert_false(th_exists(tmp));
  gn_store_free(s);
  th_rm_rf(dir);
  free(dir);
}

static char layer_digest[GN_DIGEST_STRLEN];

static void test_pull_refuses_corrupted_layer(void **state) {
  (void)state;
  /* Learn the layer digest from a clean pull first. */
  char *dir = new_store_dir();
  gn_store *s = NULL;
  gn_imageref r;
  gn_image img;
  char err[256] = "", path[4096];
  ref_for(&r, "bb", reg.digest);
  assert_int_equal(th_store_open_loopback(dir, &s), 0);
  assert_int_equal(gn_store_pull(s, &r, NULL, NULL, &img, err, sizeof(err)), 0);
  snprintf(layer_digest, sizeof(layer_digest), "%s", img.layers[0]);
  gn_image_done(&img);
  gn_store_free(s);
  th_rm_rf(dir);
  free(dir);

  (void)path;
  pull_with_corrupted_registry_blob(layer_digest, false);
}

static void test_pull_refuses_corrupted_manifest(void **state) {
  (void)state;
  pull_with_corrupted_registry_blob(reg.digest, true);
}

static int put_manifest(const char *name, const char *ref, const char *media_type, const char *body,
                        char ret_digest[GN_DIGEST_STRLEN]) {
  char url[512], ct[256];
  uint8_t h[32];
  snprintf(url, sizeof(url), "http://%s/v2/%s/manifests/%s", reg.host, name, ref);
  snprintf(ct, sizeof(ct), "Content-Type: %s", media_type);
  CURL *c = curl_easy_init();
  struct curl_slist *hl = curl_slist_append(NULL, ct);
  curl_easy_setopt(c, CURLOPT_URL, url);
  curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, "PUT");
  curl_easy_setopt(c, CURLOPT_POSTFIELDS, body);
  curl_easy_setopt(c, CURLOPT_HTTPHEADER, hl);
  curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, fwrite);
  curl_easy_setopt(c, CURLOPT_WRITEDATA, stderr);
  CURLcode cc = curl_easy_perform(c);
  long code = 0;
  curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &code);
  curl_slist_free_all(hl);
  curl_easy_cleanup(c);
  if (cc != CURLE_OK || code != 201)
    return -1;
  crypto_hash_sha256(h, (const uint8_t *)body, strlen(body));
  strcpy(ret_digest, "sha256:");
  sodium_bin2hex(ret_digest + 7, GN_DIGEST_STRLEN - 7, h, sizeof(h));
  return 0;
}

static void manifest_size(const char *digest, long *ret) {
  char path[4096];
  struct stat st;
  th_registry_blob_path(&reg, digest, path, sizeof(path));
  assert_int_equal(stat(path, &st), 0);
  *ret = (long)st.st_size;
}

typedef struct index_case {
  const char *index_type, *manifest_type;
} index_case;

static void test_pull_index_picks_linux_amd64(void **state) {
  (void)state;
  static const index_case cases[] = {
      {"application/vnd.oci.image.index.v1+json", "application/vnd.oci.image.manifest.v1+json"},
      {"application/vnd.docker.distribution.manifest.list.v2+json",
       "application/vnd.docker.distribution.manifest.v2+json"},
  };
  char cmd[4200], arm[128], body[2048], idx[GN_DIGEST_STRLEN], err[256] = "";
  snprintf(cmd, sizeof(cmd), "'%s/scripts/registry' build-busybox '%s/img' bb:arm %d arm64", th_source_dir(), reg.dir,
           reg.port);
  assert_int_equal(th_run(cmd, arm, sizeof(arm)), 0);
  long arm_size, amd_size;
  manifest_size(arm, &arm_size);
  manifest_size(reg.digest, &amd_size);
  for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
    /* The index names its manifests with the OCI type: skopeo pushed them as
     * OCI manifests, and a Docker list pointing at them is what mirrors do. */
    snprintf(body, sizeof(body),
             "{\"schemaVersion\":2,\"mediaType\":\"%s\",\"manifests\":["
             "{\"mediaType\":\"%s\",\"digest\":\"%s\",\"size\":%ld,"
             "\"platform\":{\"architecture\":\"arm64\",\"os\":\"linux\"}},"
             "{\"mediaType\":\"%s\",\"digest\":\"%s\",\"size\":%ld,"
             "\"platform\":{\"architecture\":\"amd64\",\"os\":\"linux\"}}]}",
             cases[i].index_type, "application/vnd.oci.image.manifest.v1+json", arm, arm_size,
             "application/vnd.oci.image.manifest.v1+json", reg.digest, amd_size);
    assert_int_equal(put_manifest("bb", "multi", cases[i].index_type, body, idx), 0);

    gn_imageref r;
    char resolved[GN_DIGEST_STRLEN];
    ref_for(&r, "bb:multi", NULL);
    assert_int_equal(gn_registry_resolve(&r, resolved, err, sizeof(err)), 0);
    assert_string_equal(resolved, idx); /* the index's digest, not a platform's */

    char *dir = new_store_dir();
    gn_store *s = NULL;
    gn_image img;
    ref_for(&r, "bb", idx);
    assert_int_equal(th_store_open_loopback(dir, &s), 0);
    int rc = gn_store_pull(s, &r, NULL, NULL, &img, err, sizeof(err));
    if (rc)
      fail_msg("pull of index %s: %d %s", cases[i].index_type, rc, err);
    assert_string_equal(img.manifest_digest, reg.digest);
    gn_image_done(&img);
    gn_store_free(s);
    th_rm_rf(dir);
    free(dir);
  }
}

static void test_pull_index_without_amd64_is_not_found(void **state) {
  (void)state;
  char cmd[4200], arm[128], body[2048], idx[GN_DIGEST_STRLEN], err[256] = "";
  snprintf(cmd, sizeof(cmd), "'%s/scripts/registry' build-busybox '%s/img' bb:arm %d arm64", th_source_dir(), reg.dir,
           reg.port);
  assert_int_equal(th_run(cmd, arm, sizeof(arm)), 0);
  long arm_size;
  manifest_size(arm, &arm_size);
  snprintf(body, sizeof(body),
           "{\"schemaVersion\":2,\"mediaType\":\"application/vnd.oci.image.index.v1+json\",\"manifests\":["
           "{\"mediaType\":\"application/vnd.oci.image.manifest.v1+json\",\"digest\":\"%s\",\"size\":%ld,"
           "\"platform\":{\"architecture\":\"arm64\",\"os\":\"linux\"}}]}",
           arm, arm_size);
  assert_int_equal(put_manifest("bb", "armonly", "application/vnd.oci.image.index.v1+json", body, idx), 0);
  char *dir = new_store_dir();
  gn_store *s = NULL;
  gn_image img;
  gn_imageref r;
  ref_for(&r, "bb", idx);
  assert_int_equal(th_store_open_loopback(dir, &s), 0);
  assert_int_equal(gn_store_pull(s, &r, NULL, NULL, &img, err, sizeof(err)), GN_ENOTFOUND);
  assert_non_null(strstr(err, "linux/amd64"));
  /* A manifest that is itself arm64 (pinned directly) is refused too. */
  ref_for(&r, "bb", arm);
  assert_int_equal(gn_store_pull(s, &r, NULL, NULL, &img, err, sizeof(err)), GN_EUNSUPPORTED);
  gn_store_free(s);
  th_rm_rf(dir);
  free(dir);
}

typedef struct progress_log {
  uint64_t calls, last_done, total;
} progress_log;

static void on_progress(void *ud, const char *what, uint64_t done, uint64_t total) {
  progress_log *p = ud;
  assert_non_null(what);
  assert_true(done <= total);
  p->calls++;
  p->last_done = done;
  p->total = total;
}

static void test_pull_resumes_partial_layer_with_range(void **state) {
  (void)state;
  char *dir = new_store_dir();
  gn_store *s = NULL;
  gn_imageref r;
  gn_image img;
  char err[256] = "", src[4096], dst[4096];
  size_t layer_len = 0;
  assert_true(layer_digest[0]); /* set by test_pull_refuses_corrupted_layer */
  th_registry_blob_path(&reg, layer_digest, src, sizeof(src));
  char *layer = th_read_file(src, &layer_len);
  assert_non_null(layer);
  assert_int_equal(th_store_open_loopback(dir, &s), 0);
  /* Half the layer already arrived in an earlier, interrupted pull. */
  size_t half = layer_len / 2;
  snprintf(dst, sizeof(dst), "%s/tmp/%s.partial", dir, layer_digest + 7);
  assert_int_equal(th_write_file(dst, layer, half), 0);
  progress_log pl = {0};
  ref_for(&r, "bb", reg.digest);
  int rc = gn_store_pull(s, &r, on_progress, &pl, &img, err, sizeof(err));
  if (rc)
    fail_msg("resumed pull: %d %s", rc, err);
  size_t manifest_len = 0, config_len = 0;
  char mpath[4096];
  snprintf(mpath, sizeof(mpath), "%s/blobs/sha256/%s", dir, reg.digest + 7);
  free(th_read_file(mpath, &manifest_len));
  /* Everything but the layer's first half came over the wire. */
  th_registry_blob_path(&reg, reg.digest, mpath, sizeof(mpath));
  (void)config_len;
  assert_true(img.bytes_fetched < layer_len);
  assert_true(img.bytes_fetched >= layer_len - half);
  assert_true(img.bytes_fetched < layer_len - half + 4096); /* + manifest + config */
  assert_true(pl.calls > 0);
  assert_int_equal(pl.last_done, layer_len);
  assert_int_equal(pl.total, layer_len);
  snprintf(dst, sizeof(dst), "%s/blobs/sha256/%s", dir, layer_digest + 7);
  size_t got_len = 0;
  char *got = th_read_file(dst, &got_len);
  assert_int_equal(got_len, layer_len);
  assert_memory_equal(got, layer, layer_len);
  free(got);
  free(layer);
  gn_image_done(&img);
  gn_store_free(s);
  th_rm_rf(dir);
  free(dir);
}

static void test_pull_restarts_partial_that_is_not_a_prefix(void **state) {
  (void)state;
  char *dir = new_store_dir();
  gn_store *s = NULL;
  gn_imageref r;
  gn_image img;
  char err[256] = "", dst[4096];
  assert_int_equal(th_store_open_loopback(dir, &s), 0);
  /* Garbage in the partial file: the hash fails, the pull must not keep it,
   * and a second pull then starts clean and succeeds. */
  snprintf(dst, sizeof(dst), "%s/tmp/%s.partial", dir, layer_digest + 7);
  assert_int_equal(th_write_file(dst, "garbage", 7), 0);
  ref_for(&r, "bb", reg.digest);
  assert_int_equal(gn_store_pull(s, &r, NULL, NULL, &img, err, sizeof(err)), GN_EDIGEST);
  assert_false(th_exists(dst));
  int rc = gn_store_pull(s, &r, NULL, NULL, &img, err, sizeof(err));
  if (rc)
    fail_msg("second pull: %d %s", rc, err);
  gn_image_done(&img);
  gn_store_free(s);
  th_rm_rf(dir);
  free(dir);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_resolve_returns_pushed_digest),
      cmocka_unit_test(test_resolve_unknown_tag_is_not_found),
      cmocka_unit_test(test_pull_stores_image_and_second_pull_fetches_nothing),
      cmocka_unit_test(test_pull_refuses_unpinned_ref),
      cmocka_unit_test(test_pull_refuses_ref_pinned_to_another_digest),
      cmocka_unit_test(test_pull_refuses_corrupted_layer),
      cmocka_unit_test(test_pull_refuses_corrupted_manifest),
      cmocka_unit_test(test_pull_index_picks_linux_amd64),
      cmocka_unit_test(test_pull_index_without_amd64_is_not_found),
      cmocka_unit_test(test_pull_resumes_partial_layer_with_range),
      cmocka_unit_test(test_pull_restarts_partial_that_is_not_a_prefix),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
