/* Tests of node/uidalloc.c: user namespace slots are host-wide. Two
 * processes (fork) claiming at once never get the same slot; a holder that
 * dies (SIGKILL, no release) frees its slots; release makes a slot free
 * again; a directory others can write to is refused. */
#include "uidalloc.h"

#include <gpunet/base.h>

#include <setjmp.h>
#include <stdbool.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#define PER_CHILD 40
#define CHILDREN 4

typedef struct fixture {
  char dir[64];
  char slots[128];
} fixture;

static int setup(void **state) {
  fixture *f = calloc(1, sizeof(*f));
  snprintf(f->dir, sizeof(f->dir), "/tmp/gn-uid-XXXXXX");
  assert_non_null(mkdtemp(f->dir));
  snprintf(f->slots, sizeof(f->slots), "%s/run/gpunet/uid-slots", f->dir);
  *state = f;
  return 0;
}

static int teardown(void **state) {
  fixture *f = *state;
  char cmd[128];
  snprintf(cmd, sizeof(cmd), "rm -rf '%s'", f->dir);
  assert_int_equal(system(cmd), 0);
  free(f);
  return 0;
}

static void test_uidalloc_dir_env(void **state) {
  (void)state;
  unsetenv(GN_UIDALLOC_DIR_ENV);
  assert_string_equal(gn_uidalloc_dir(), "/run/gpunet-uid-slots");
  setenv(GN_UIDALLOC_DIR_ENV, "", 1);
  assert_string_equal(gn_uidalloc_dir(), "/run/gpunet-uid-slots");
  setenv(GN_UIDALLOC_DIR_ENV, "/tmp/x", 1);
  assert_string_equal(gn_uidalloc_dir(), "/tmp/x");
  unsetenv(GN_UIDALLOC_DIR_ENV);
}

static void test_uidalloc_lowest_free_and_release(void **state) {
  fixture *f = *state;
  uint32_t a, b, c, d;
  assert_int_equal(gn_uidalloc_claim(f->slots, 100, &a), 0); /* makes the directory and its parents */
  assert_int_equal(gn_uidalloc_claim(f->slots, 100, &b), 0);
  assert_int_equal(a, 0);
  assert_int_equal(b, 1);
  struct stat st;
  assert_int_equal(stat(f->slots, &st), 0);
  assert_int_equal(st.st_mode & 0777, 0700);
  assert_int_equal(gn_uidalloc_held(), 2);
  assert_int_equal(gn_uidalloc_release(f->slots, a), 0);
  assert_int_equal(gn_uidalloc_release(f->slots, a), GN_ENOTFOUND); /* not held any more */
  assert_int_equal(gn_uidalloc_release(f->slots, 77), GN_ENOTFOUND);
  assert_int_equal(gn_uidalloc_claim(f->slots, 100, &c), 0);
  assert_int_equal(c, 0); /* the lowest free one again */
  /* Every slot held: GN_EBUSY, nothing claimed. */
  assert_int_equal(gn_uidalloc_claim(f->slots, 2, &d), GN_EBUSY);
  assert_int_equal(gn_uidalloc_held(), 2);
  assert_int_equal(gn_uidalloc_release(f->slots, b), 0);
  assert_int_equal(gn_uidalloc_release(f->slots, c), 0);
  assert_int_equal(gn_uidalloc_held(), 0);
}

static void test_uidalloc_bad_input_changes_nothing(void **state) {
  fixture *f = *state;
  uint32_t s;
  char path[160];
  assert_int_equal(gn_uidalloc_claim(NULL, 10, &s), GN_EINVAL);
  assert_int_equal(gn_uidalloc_claim(f->slots, 0, &s), GN_EINVAL);
  assert_int_equal(gn_uidalloc_claim("relative/dir", 10, &s), GN_EINVAL);
  assert_int_equal(gn_uidalloc_claim(f->slots, 10, NULL), GN_EINVAL);
  /* A directory anyone can write to: anyone could hold every slot. */
  snprintf(path, sizeof(path), "%s/open", f->dir);
  assert_int_equal(mkdir(path, 0777), 0);
  assert_int_equal(chmod(path, 0777), 0);
  assert_int_equal(gn_uidalloc_claim(path, 10, &s), GN_EPERM);
  /* A file where the directory should be. */
  snprintf(path, sizeof(path), "%s/file", f->dir);
  FILE *fp = fopen(path, "w");
  assert_non_null(fp);
  fclose(fp);
  assert_int_equal(gn_uidalloc_claim(path, 10, &s), GN_EPERM);
  /* A symlink as the directory is refused too (lstat). */
  snprintf(path, sizeof(path), "%s/link", f->dir);
  assert_int_equal(symlink(f->dir, path), 0);
  assert_int_equal(gn_uidalloc_claim(path, 10, &s), GN_EPERM);
  assert_int_equal(gn_uidalloc_held(), 0);
}

/* A child claims n slots, writes them to fd, waits for a byte on go (or
 * for its death) and exits without releasing. */
static pid_t spawn_claimer(const char *dir, int n, int *ret_rd, int *ret_go) {
  int p[2], g[2];
  assert_int_equal(pipe(p), 0);
  assert_int_equal(pipe(g), 0);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    close(p[0]);
    close(g[1]);
    for (int i = 0; i < n; i++) {
      uint32_t s;
      int32_t v = gn_uidalloc_claim(dir, 100000, &s) == 0 ? (int32_t)s : -1;
      if (write(p[1], &v, sizeof(v)) != sizeof(v))
        _exit(2);
    }
    char c;
    (void)!read(g[0], &c, 1);
    _exit(0);
  }
  close(p[1]);
  close(g[0]);
  *ret_rd = p[0];
  *ret_go = g[1];
  return pid;
}

static void read_all(int fd, int32_t *v, int n) {
  size_t want = (size_t)n * sizeof(*v), got = 0;
  while (got < want) {
    ssize_t r = read(fd, (char *)v + got, want - got);
    assert_true(r > 0);
    got += (size_t)r;
  }
}

static void test_uidalloc_processes_never_share_a_slot(void **state) {
  fixture *f = *state;
  pid_t pid[CHILDREN];
  int rd[CHILDREN], go[CHILDREN];
  int32_t got[CHILDREN][PER_CHILD];
  /* Claimed by this process too, at the same time. */
  uint32_t mine[PER_CHILD];
  for (int c = 0; c < CHILDREN; c++)
    pid[c] = spawn_claimer(f->slots, PER_CHILD, &rd[c], &go[c]);
  for (int i = 0; i < PER_CHILD; i++)
    assert_int_equal(gn_uidalloc_claim(f->slots, 100000, &mine[i]), 0);
  for (int c = 0; c < CHILDREN; c++)
    read_all(rd[c], got[c], PER_CHILD);
  /* Every slot claimed (all holders still alive) is distinct, and together
   * they are exactly slots 0..N-1 (each took the lowest free one). */
  enum { N = (CHILDREN + 1) * PER_CHILD };
  int seen[N];
  memset(seen, 0, sizeof(seen));
  for (int c = 0; c <= CHILDREN; c++)
    for (int i = 0; i < PER_CHILD; i++) {
      int32_t s = c < CHILDREN ? got[c][i] : (int32_t)mine[i];
      assert_true(s >= 0 && s < N);
      assert_int_equal(seen[s], 0);
      seen[s] = 1;
    }
  /* The first child dies without releasing anything (SIGKILL, as a crashed
   * gpunetd): its slots are free again, the others' are not. */
  assert_int_equal(kill(pid[0], SIGKILL), 0);
  int st;
  assert_int_equal(waitpid(pid[0], &st, 0), pid[0]);
  assert_true(WIFSIGNALED(st));
  int lowest = N;
  for (int i = 0; i < PER_CHILD; i++)
    if (got[0][i] < lowest)
      lowest = got[0][i];
  uint32_t again;
  assert_int_equal(gn_uidalloc_claim(f->slots, 100000, &again), 0);
  assert_int_equal(again, (uint32_t)lowest);
  /* A slot a live child holds is never handed out: the next claims fill the
   * dead child's slots only, then go past N. */
  uint32_t next[PER_CHILD];
  for (int i = 1; i < PER_CHILD; i++) {
    assert_int_equal(gn_uidalloc_claim(f->slots, 100000, &next[i]), 0);
    bool was_dead_childs = false;
    for (int k = 0; k < PER_CHILD; k++)
      was_dead_childs |= (uint32_t)got[0][k] == next[i];
    assert_true(was_dead_childs);
  }
  uint32_t past;
  assert_int_equal(gn_uidalloc_claim(f->slots, 100000, &past), 0);
  assert_int_equal(past, (uint32_t)N);
  for (int c = 1; c < CHILDREN; c++) {
    assert_int_equal(write(go[c], "x", 1), 1);
    assert_int_equal(waitpid(pid[c], &st, 0), pid[c]);
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
  }
  for (int c = 0; c < CHILDREN; c++) {
    close(rd[c]);
    close(go[c]);
  }
  /* The children are gone: the lowest free slot is a child's first. */
  uint32_t after;
  assert_int_equal(gn_uidalloc_claim(f->slots, 100000, &after), 0);
  assert_true(after < (uint32_t)N);
  for (int i = 0; i < PER_CHILD; i++)
    assert_true(after != mine[i]);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_uidalloc_dir_env),
      cmocka_unit_test_setup_teardown(test_uidalloc_lowest_free_and_release, setup, teardown),
      cmocka_unit_test_setup_teardown(test_uidalloc_bad_input_changes_nothing, setup, teardown),
      cmocka_unit_test_setup_teardown(test_uidalloc_processes_never_share_a_slot, setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
