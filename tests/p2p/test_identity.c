/* Tests for node identities: key files, signatures and printable node ids. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <gpunet/identity.h>

#include <fcntl.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

static char tmpdir[64];

static int setup(void **state) {
  (void)state;
  strcpy(tmpdir, "/tmp/gn-test-id-XXXXXX");
  return mkdtemp(tmpdir) ? 0 : -1;
}

static int teardown(void **state) {
  (void)state;
  char cmd[128];
  snprintf(cmd, sizeof(cmd), "rm -rf '%s'", tmpdir);
  return system(cmd) == 0 ? 0 : -1;
}

static void path_in_tmp(char *buf, size_t cap, const char *name) {
  snprintf(buf, cap, "%s/%s", tmpdir, name);
}

static void test_identity_save_load_roundtrip(void **state) {
  (void)state;
  gn_identity *a = NULL, *b = NULL;
  char path[128];
  path_in_tmp(path, sizeof(path), "rt.key");
  assert_int_equal(gn_identity_generate(&a), 0);
  assert_int_equal(gn_identity_save(a, path), 0);
  struct stat st;
  assert_int_equal(stat(path, &st), 0);
  assert_int_equal(st.st_mode & 0777, 0600);
  assert_int_equal(gn_identity_load(path, &b), 0);
  assert_memory_equal(a->pk, b->pk, GN_PK_LEN);
  /* A signature by the loaded key verifies under the original public key. */
  uint8_t sig[GN_SIG_LEN];
  gn_identity_sign(b, (const uint8_t *)"hello", 5, sig);
  assert_int_equal(gn_sig_verify(a->pk, (const uint8_t *)"hello", 5, sig), 0);
  gn_identity_free(a);
  gn_identity_free(b);
}

static void test_identity_save_refuses_existing_file(void **state) {
  (void)state;
  gn_identity *a = NULL;
  char path[128];
  path_in_tmp(path, sizeof(path), "twice.key");
  assert_int_equal(gn_identity_generate(&a), 0);
  assert_int_equal(gn_identity_save(a, path), 0);
  assert_int_equal(gn_identity_save(a, path), GN_EEXIST);
  gn_identity_free(a);
}

static void test_identity_load_refuses_group_readable_file(void **state) {
  (void)state;
  gn_identity *a = NULL, *b = NULL;
  char path[128];
  path_in_tmp(path, sizeof(path), "open.key");
  assert_int_equal(gn_identity_generate(&a), 0);
  assert_int_equal(gn_identity_save(a, path), 0);
  assert_int_equal(chmod(path, 0644), 0);
  assert_int_equal(gn_identity_load(path, &b), GN_EPERM);
  assert_null(b);
  assert_int_equal(chmod(path, 0600), 0);
  assert_int_equal(gn_identity_load(path, &b), 0);
  gn_identity_free(a);
  gn_identity_free(b);
}

static void test_identity_load_refuses_symlink(void **state) {
  (void)state;
  gn_identity *a = NULL, *b = NULL;
  char path[128], link[128];
  path_in_tmp(path, sizeof(path), "target.key");
  path_in_tmp(link, sizeof(link), "link.key");
  assert_int_equal(gn_identity_generate(&a), 0);
  assert_int_equal(gn_identity_save(a, path), 0);
  assert_int_equal(symlink(path, link), 0);
  assert_true(gn_identity_load(link, &b) < 0);
  assert_null(b);
  gn_identity_free(a);
}

static void write_file(const char *path, const void *p, size_t n) {
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
  assert_true(fd >= 0);
  assert_int_equal(write(fd, p, n), (ssize_t)n);
  close(fd);
}

static void test_identity_load_rejects_malformed_files(void **state) {
  (void)state;
  gn_identity *a = NULL, *b = NULL;
  char path[128], bad[128];
  uint8_t raw[200];
  path_in_tmp(path, sizeof(path), "good.key");
  path_in_tmp(bad, sizeof(bad), "bad.key");
  assert_int_equal(gn_identity_generate(&a), 0);
  assert_int_equal(gn_identity_save(a, path), 0);
  FILE *f = fopen(path, "rb");
  size_t n = fread(raw, 1, sizeof(raw), f);
  fclose(f);
  assert_int_equal(n, 72);

  /* truncated, extended, wrong magic, public half not matching the seed */
  write_file(bad, raw, 71);
  assert_int_equal(gn_identity_load(bad, &b), GN_EINVAL);
  write_file(bad, raw, 73);
  assert_int_equal(gn_identity_load(bad, &b), GN_EINVAL);
  raw[0] ^= 1;
  write_file(bad, raw, 72);
  assert_int_equal(gn_identity_load(bad, &b), GN_EINVAL);
  raw[0] ^= 1;
  raw[71] ^= 1;
  write_file(bad, raw, 72);
  assert_int_equal(gn_identity_load(bad, &b), GN_EINVAL);
  assert_null(b);
  gn_identity_free(a);
}

static void test_sig_verify_rejects_tampered_message(void **state) {
  (void)state;
  gn_identity *a = NULL;
  uint8_t sig[GN_SIG_LEN];
  assert_int_equal(gn_identity_generate(&a), 0);
  gn_identity_sign(a, (const uint8_t *)"hello", 5, sig);
  assert_int_equal(gn_sig_verify(a->pk, (const uint8_t *)"hellp", 5, sig), GN_ESIG);
  sig[3] ^= 0x10;
  assert_int_equal(gn_sig_verify(a->pk, (const uint8_t *)"hello", 5, sig), GN_ESIG);
  gn_identity_free(a);
}

static void test_node_id_roundtrip(void **state) {
  (void)state;
  for (int i = 0; i < 50; i++) {
    gn_identity *a = NULL;
    char s[GN_NODE_ID_STRLEN];
    uint8_t pk[GN_PK_LEN];
    assert_int_equal(gn_identity_generate(&a), 0);
    gn_node_id_format(a->pk, s);
    assert_int_equal(strlen(s), GN_NODE_ID_STRLEN - 1);
    assert_memory_equal(s, "gn", 2);
    for (size_t k = 2; s[k]; k++)
      assert_true((s[k] >= 'a' && s[k] <= 'z') || (s[k] >= '2' && s[k] <= '7'));
    assert_int_equal(gn_node_id_parse(s, pk), 0);
    assert_memory_equal(pk, a->pk, GN_PK_LEN);
    gn_identity_free(a);
  }
}

static void test_node_id_known_value(void **state) {
  (void)state;
  uint8_t pk[GN_PK_LEN] = {0};
  char s[GN_NODE_ID_STRLEN];
  gn_node_id_format(pk, s);
  /* 32 zero bytes encode to 51 'a's then the checksum and version bits. */
  assert_memory_equal(s, "gnaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa", 53);
}

static void test_node_id_parse_rejects_bad_checksum(void **state) {
  (void)state;
  gn_identity *a = NULL;
  char s[GN_NODE_ID_STRLEN];
  uint8_t pk[GN_PK_LEN];
  assert_int_equal(gn_identity_generate(&a), 0);
  gn_node_id_format(a->pk, s);
  /* Changing any one character must be caught (by the checksum for the key
   * part, by the checksum or version for the tail). */
  for (size_t k = 2; k < GN_NODE_ID_STRLEN - 1; k++) {
    char t[GN_NODE_ID_STRLEN];
    memcpy(t, s, sizeof(t));
    t[k] = t[k] == 'a' ? 'b' : 'a';
    assert_int_equal(gn_node_id_parse(t, pk), GN_EINVAL);
  }
  gn_identity_free(a);
}

static void test_node_id_parse_rejects_bad_shapes(void **state) {
  (void)state;
  gn_identity *a = NULL;
  char s[GN_NODE_ID_STRLEN + 4];
  uint8_t pk[GN_PK_LEN];
  assert_int_equal(gn_identity_generate(&a), 0);
  gn_node_id_format(a->pk, s);
  char t[sizeof(s)];
  const struct {
    const char *what;
    size_t pos;
    char c;
  } cases[] = {{"prefix", 0, 'x'}, {"upper", 10, 'A'}, {"digit1", 10, '1'}, {"digit8", 10, '8'}, {"pad", 10, '='}};
  for (size_t i = 0; i < GN_ARRAY_SIZE(cases); i++) {
    memcpy(t, s, sizeof(s));
    t[cases[i].pos] = cases[i].c;
    assert_int_equal(gn_node_id_parse(t, pk), GN_EINVAL);
  }
  memcpy(t, s, sizeof(s));
  t[GN_NODE_ID_STRLEN - 2] = '\0'; /* one short */
  assert_int_equal(gn_node_id_parse(t, pk), GN_EINVAL);
  memcpy(t, s, GN_NODE_ID_STRLEN - 1);
  t[GN_NODE_ID_STRLEN - 1] = 'a'; /* one long */
  t[GN_NODE_ID_STRLEN] = '\0';
  assert_int_equal(gn_node_id_parse(t, pk), GN_EINVAL);
  assert_int_equal(gn_node_id_parse("", pk), GN_EINVAL);
  gn_identity_free(a);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_identity_save_load_roundtrip, setup, teardown),
      cmocka_unit_test_setup_teardown(test_identity_save_refuses_existing_file, setup, teardown),
      cmocka_unit_test_setup_teardown(test_identity_load_refuses_group_readable_file, setup, teardown),
      cmocka_unit_test_setup_teardown(test_identity_load_refuses_symlink, setup, teardown),
      cmocka_unit_test_setup_teardown(test_identity_load_rejects_malformed_files, setup, teardown),
      cmocka_unit_test(test_sig_verify_rejects_tampered_message),
      cmocka_unit_test(test_node_id_roundtrip),
      cmocka_unit_test(test_node_id_known_value),
      cmocka_unit_test(test_node_id_parse_rejects_bad_checksum),
      cmocka_unit_test(test_node_id_parse_rejects_bad_shapes),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
