/* The provider's file operations on a lease's workspace (node/ws_prov.c):
 * round trips, and the attacks a job or a renter can try: symbolic links
 * planted in the workspace (as the last component or on the way), fifos,
 * hard links, holes past the end of a file (a sparse disk bomb), writes
 * past the workspace's budget. Each runs in a fresh temporary directory
 * with a canary outside the workspace that must stay untouched. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "ws.h"

#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

typedef struct fixture {
  char top[64];     /* the test's directory */
  char ws[96];      /* top/ws: the workspace */
  char outside[96]; /* top/outside: a directory beside it */
  char canary[128]; /* top/outside/canary: a file that must not change */
  int root;         /* the workspace's descriptor */
  gn_ws_limits lim;
  uint64_t used;
} fixture;

static const char canary_text[] = "the provider's secret\n";

static int setup(void **state) {
  fixture *f = calloc(1, sizeof *f);
  snprintf(f->top, sizeof f->top, "/tmp/gn-ws-test-XXXXXX");
  if (!mkdtemp(f->top))
    return -1;
  snprintf(f->ws, sizeof f->ws, "%s/ws", f->top);
  snprintf(f->outside, sizeof f->outside, "%s/outside", f->top);
  snprintf(f->canary, sizeof f->canary, "%s/canary", f->outside);
  if (mkdir(f->ws, 0700) < 0 || mkdir(f->outside, 0700) < 0)
    return -1;
  FILE *c = fopen(f->canary, "w");
  if (!c)
    return -1;
  fputs(canary_text, c);
  fclose(c);
  f->root = open(f->ws, O_RDONLY | O_DIRECTORY);
  f->lim.cap_bytes = 1ull << 30;
  f->lim.reserve_bytes = 0;
  *state = f;
  return f->root >= 0 ? 0 : -1;
}

static int teardown(void **state) {
  fixture *f = *state;
  char cmd[128];
  close(f->root);
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", f->top);
  int r = system(cmd);
  free(f);
  return r == 0 ? 0 : -1;
}

static void assert_canary_untouched(const fixture *f) {
  char buf[128] = "";
  FILE *c = fopen(f->canary, "r");
  assert_non_null(c);
  size_t k = fread(buf, 1, sizeof buf - 1, c);
  fclose(c);
  buf[k] = 0;
  assert_string_equal(buf, canary_text);
}

static int put(fixture *f, const char *path, uint64_t offset, const char *data, uint64_t *size, char *why) {
  return gn__ws_write(f->root, path, offset, (const uint8_t *)data, strlen(data), &f->lim, &f->used, size, why, 256);
}

static void test_workspace_write_then_read_round_trip(void **state) {
  fixture *f = *state;
  char why[256] = "";
  uint64_t size = 0;
  uint8_t buf[64];
  size_t len = 0;
  assert_int_equal(put(f, "a/b/file.txt", 0, "hello ", &size, why), 0);
  assert_int_equal(put(f, "a/b/file.txt", 6, "world", &size, why), 0);
  assert_int_equal(size, 11);
  assert_int_equal(gn__ws_read(f->root, "a/b/file.txt", 0, buf, sizeof buf, &len, &size, why, sizeof why), 0);
  assert_int_equal(len, 11);
  assert_memory_equal(buf, "hello world", 11);
  assert_int_equal(gn__ws_read(f->root, "a/b/file.txt", 6, buf, 3, &len, &size, why, sizeof why), 0);
  assert_int_equal(len, 3);
  assert_memory_equal(buf, "wor", 3);
  assert_int_equal(f->used, 11);
}

static void test_workspace_write_makes_the_file_end_after_it(void **state) {
  fixture *f = *state;
  char why[256] = "";
  uint64_t size = 0;
  assert_int_equal(put(f, "f", 0, "0123456789", &size, why), 0);
  assert_int_equal(put(f, "f", 0, "ab", &size, why), 0); /* a restart from 0 */
  assert_int_equal(size, 2);
  struct stat st;
  assert_int_equal(fstatat(f->root, "f", &st, 0), 0);
  assert_int_equal(st.st_size, 2);
}

static void test_workspace_refuses_offset_past_the_end(void **state) {
  fixture *f = *state;
  char why[256] = "";
  uint64_t size = 0;
  assert_int_equal(put(f, "f", 0, "abc", &size, why), 0);
  /* a hole of a terabyte would be a disk bomb the budget never sees */
  assert_true(put(f, "f", 1ull << 40, "x", &size, why) < 0);
  assert_non_null(strstr(why, "past the end"));
  assert_true(put(f, "new", 1, "x", &size, why) < 0);
  struct stat st;
  assert_int_equal(fstatat(f->root, "f", &st, 0), 0);
  assert_int_equal(st.st_size, 3);
  assert_true(st.st_blocks * 512 < (1 << 20));
}

static void test_workspace_refuses_writes_past_its_budget(void **state) {
  fixture *f = *state;
  char why[256] = "";
  uint64_t size = 0;
  static char big[GN_WS_CHUNK + 1];
  memset(big, 'x', GN_WS_CHUNK);
  f->lim.cap_bytes = 2 * GN_WS_CHUNK;
  assert_int_equal(put(f, "f", 0, big, &size, why), 0);
  assert_int_equal(put(f, "f", GN_WS_CHUNK, big, &size, why), 0);
  assert_true(put(f, "f", 2 * GN_WS_CHUNK, "y", &size, why) < 0);
  assert_non_null(strstr(why, "workspace is full"));
  assert_true(put(f, "other", 0, "y", &size, why) < 0); /* the budget is the whole workspace's */
  struct stat st;
  assert_int_equal(fstatat(f->root, "f", &st, 0), 0);
  assert_int_equal(st.st_size, 2 * GN_WS_CHUNK);
  /* an overwrite that does not grow anything still goes */
  assert_int_equal(put(f, "f", 0, "z", &size, why), 0);
}

static void test_workspace_usage_counts_what_jobs_wrote(void **state) {
  fixture *f = *state;
  char path[160];
  snprintf(path, sizeof path, "%s/by-the-job", f->ws);
  FILE *w = fopen(path, "w");
  assert_non_null(w);
  static char block[1 << 16];
  memset(block, 1, sizeof block);
  for (int i = 0; i < 4; i++)
    fwrite(block, 1, sizeof block, w);
  fclose(w);
  assert_true(gn__ws_usage(f->root) >= 4u << 16);
}

static void test_workspace_refuses_a_planted_symlink(void **state) {
  fixture *f = *state;
  char link[160], why[256] = "";
  uint64_t size = 0;
  uint8_t buf[64];
  size_t len = 0;
  snprintf(link, sizeof link, "%s/evil", f->ws);
  assert_int_equal(symlink(f->canary, link), 0);
  assert_true(gn__ws_read(f->root, "evil", 0, buf, sizeof buf, &len, &size, why, sizeof why) < 0);
  assert_non_null(strstr(why, "symbolic link"));
  assert_true(put(f, "evil", 0, "overwritten", &size, why) < 0);
  bool exists = true;
  uint8_t sha[32];
  assert_true(gn__ws_stat(f->root, "evil", true, 1 << 20, &exists, &size, sha, why, sizeof why) < 0);
  assert_canary_untouched(f);
}

static void test_workspace_refuses_a_symlinked_directory_on_the_way(void **state) {
  fixture *f = *state;
  char link[160], why[256] = "", made[192];
  uint64_t size = 0;
  uint8_t buf[64];
  size_t len = 0;
  snprintf(link, sizeof link, "%s/dir", f->ws);
  assert_int_equal(symlink(f->outside, link), 0);
  assert_true(gn__ws_read(f->root, "dir/canary", 0, buf, sizeof buf, &len, &size, why, sizeof why) < 0);
  assert_true(put(f, "dir/canary", 0, "overwritten", &size, why) < 0);
  assert_true(put(f, "dir/new", 0, "planted", &size, why) < 0);
  snprintf(made, sizeof made, "%s/new", f->outside);
  assert_int_equal(access(made, F_OK), -1);
  bool exists = true;
  /* refused, not "absent": a renter learns nothing of what lies beyond */
  assert_true(gn__ws_stat(f->root, "dir/canary", false, 0, &exists, &size, NULL, why, sizeof why) < 0);
  assert_canary_untouched(f);
}

static void test_workspace_refuses_a_fifo_without_waiting(void **state) {
  fixture *f = *state;
  char fifo[160], why[256] = "";
  uint64_t size = 0;
  uint8_t buf[64];
  size_t len = 0;
  snprintf(fifo, sizeof fifo, "%s/pipe", f->ws);
  assert_int_equal(mkfifo(fifo, 0600), 0);
  alarm(10); /* a blocking open would hang the test: SIGALRM fails it instead */
  assert_true(gn__ws_read(f->root, "pipe", 0, buf, sizeof buf, &len, &size, why, sizeof why) < 0);
  assert_true(put(f, "pipe", 0, "x", &size, why) < 0);
  alarm(0);
  assert_non_null(strstr(why, "not a regular file"));
}

static void test_workspace_refuses_a_file_with_other_hard_links(void **state) {
  fixture *f = *state;
  char a[160], b[160], why[256] = "";
  uint64_t size = 0;
  assert_int_equal(put(f, "a", 0, "x", &size, why), 0);
  snprintf(a, sizeof a, "%s/a", f->ws);
  snprintf(b, sizeof b, "%s/b", f->ws);
  assert_int_equal(link(a, b), 0);
  assert_true(put(f, "a", 0, "y", &size, why) < 0);
  assert_non_null(strstr(why, "hard links"));
}

static void test_workspace_stat_of_absent_and_hash(void **state) {
  fixture *f = *state;
  char why[256] = "";
  uint64_t size = 7;
  bool exists = true;
  uint8_t sha[32];
  assert_int_equal(gn__ws_stat(f->root, "nothing/here", true, 1 << 20, &exists, &size, sha, why, sizeof why), 0);
  assert_false(exists);
  assert_int_equal(size, 0);
  assert_int_equal(put(f, "abc", 0, "abc", &size, why), 0);
  assert_int_equal(gn__ws_stat(f->root, "abc", true, 1 << 20, &exists, &size, sha, why, sizeof why), 0);
  assert_true(exists);
  assert_int_equal(size, 3);
  static const uint8_t want[32] = {0xba, 0x78, 0x16, 0xbf, 0x8f, 0x01, 0xcf, 0xea, 0x41, 0x41, 0x40,
                                   0xde, 0x5d, 0xae, 0x22, 0x23, 0xb0, 0x03, 0x61, 0xa3, 0x96, 0x17,
                                   0x7a, 0x9c, 0xb4, 0x10, 0xff, 0x61, 0xf2, 0x00, 0x15, 0xad};
  assert_memory_equal(sha, want, 32);
  assert_true(gn__ws_stat(f->root, "abc", true, 2, &exists, &size, sha, why, sizeof why) < 0); /* over hash_max */
}

static void test_workspace_refuses_directories(void **state) {
  fixture *f = *state;
  char why[256] = "";
  uint64_t size = 0;
  uint8_t buf[8];
  size_t len = 0;
  assert_int_equal(put(f, "d/x", 0, "x", &size, why), 0);
  assert_true(gn__ws_read(f->root, "d", 0, buf, sizeof buf, &len, &size, why, sizeof why) < 0);
  assert_non_null(strstr(why, "directory"));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_workspace_write_then_read_round_trip, setup, teardown),
      cmocka_unit_test_setup_teardown(test_workspace_write_makes_the_file_end_after_it, setup, teardown),
      cmocka_unit_test_setup_teardown(test_workspace_refuses_offset_past_the_end, setup, teardown),
      cmocka_unit_test_setup_teardown(test_workspace_refuses_writes_past_its_budget, setup, teardown),
      cmocka_unit_test_setup_teardown(test_workspace_usage_counts_what_jobs_wrote, setup, teardown),
      cmocka_unit_test_setup_teardown(test_workspace_refuses_a_planted_symlink, setup, teardown),
      cmocka_unit_test_setup_teardown(test_workspace_refuses_a_symlinked_directory_on_the_way, setup, teardown),
      cmocka_unit_test_setup_teardown(test_workspace_refuses_a_fifo_without_waiting, setup, teardown),
      cmocka_unit_test_setup_teardown(test_workspace_refuses_a_file_with_other_hard_links, setup, teardown),
      cmocka_unit_test_setup_teardown(test_workspace_stat_of_absent_and_hash, setup, teardown),
      cmocka_unit_test_setup_teardown(test_workspace_refuses_directories, setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
