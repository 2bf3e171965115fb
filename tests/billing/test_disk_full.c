/* A full disk under the ledger: a tick that cannot be committed is refused
 * with an error, nothing half-written remains, and once space is back the
 * chain continues from the last durable second. Runs on a real, tiny tmpfs
 * mounted by the test (needs root; skipped otherwise). */
#include "fixture.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/mount.h>

static int setup_tmpfs(void **state) {
  if (geteuid() != 0)
    return 0;
  fixture *f = calloc(1, sizeof(*f));
  assert_non_null(f);
  snprintf(f->dir, sizeof(f->dir), "/tmp/gn-full-XXXXXX");
  assert_non_null(mkdtemp(f->dir));
  if (mount("tmpfs", f->dir, "tmpfs", 0, "size=1m") != 0) {
    rmdir(f->dir);
    free(f);
    return 0;
  }
  snprintf(f->path, sizeof(f->path), "%s/gpunet.db", f->dir);
  f->db = fx_db_open(f->path);
  assert_int_equal(gn_ledger_open(f->db, &f->ledger), 0);
  assert_int_equal(gn_identity_generate(&f->provider), 0);
  assert_int_equal(gn_identity_generate(&f->requester), 0);
  assert_int_equal(gn_identity_generate(&f->other), 0);
  fx_terms(f, &f->terms, 1, 400000, 3600);
  fx_agree(f, &f->terms, &f->request, &f->agreement);
  *state = f;
  return 0;
}

static int teardown_tmpfs(void **state) {
  fixture *f = *state;
  if (!f)
    return 0;
  gn_ledger_free(f->ledger);
  sqlite3_close(f->db);
  gn_identity_free(f->provider);
  gn_identity_free(f->requester);
  gn_identity_free(f->other);
  gn_buf_done(&f->request);
  gn_buf_done(&f->agreement);
  umount2(f->dir, MNT_DETACH);
  rmdir(f->dir);
  free(f);
  return 0;
}

/* Fills the file system until write() says ENOSPC. */
static void fill(const char *path) {
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
  assert_true(fd >= 0);
  static char block[4096];
  memset(block, 0xab, sizeof(block));
  ssize_t w;
  while ((w = write(fd, block, sizeof(block))) > 0)
    ;
  assert_int_equal(errno, ENOSPC);
  for (size_t small = 512; small >= 1; small /= 2)
    while (write(fd, block, small) > 0)
      ;
  close(fd);
}

static void test_ledger_refuses_ticks_on_full_disk_and_resumes(void **state) {
  fixture *f = *state;
  if (!f)
    skip();
  gn_tick t;
  uint64_t count = 0;
  char reason[256] = "", filler[128];
  assert_int_equal(gn_ledger_begin_lease(f->ledger, f->terms.lease_id, f->agreement.data, f->agreement.len), 0);
  for (int i = 0; i < 10; i++)
    assert_int_equal(fx_append_tick(f->ledger, f->terms.lease_id, FX_START_S + i, 1, 50, &t), 0);
  snprintf(filler, sizeof(filler), "%s/filler", f->dir);
  fill(filler);

  /* Every attempt fails cleanly while the disk is full; nothing counts. */
  int failures = 0;
  for (int i = 0; i < 50; i++) {
    int r = fx_append_tick(f->ledger, f->terms.lease_id, FX_START_S + 10 + i, 1, 50, &t);
    if (r < 0)
      failures++;
    else
      break; /* SQLite found room in pages it already had: fill again */
  }
  assert_true(failures > 0);
  assert_int_equal(gn_ledger_tick_count(f->ledger, f->terms.lease_id, &count), 0);
  uint64_t durable = count;
  assert_true(durable >= 10 && durable < 60);
  assert_int_equal(gn_ledger_verify_chain(f->ledger, f->terms.lease_id, reason, sizeof(reason)), 0);

  /* Space comes back: the next tick is the next second of the chain. */
  assert_int_equal(unlink(filler), 0);
  assert_int_equal(fx_append_tick(f->ledger, f->terms.lease_id, FX_START_S + 100, 1, 50, &t), 0);
  assert_int_equal(t.idx, durable + 1);
  assert_int_equal(gn_ledger_verify_chain(f->ledger, f->terms.lease_id, reason, sizeof(reason)), 0);
  gn_buf inv = {0};
  assert_int_equal(fx_invoice_seal(f->ledger, f->provider, f->terms.lease_id, FX_START_S + 101, "released", &inv), 0);
  gn_invoice_summary sum;
  assert_int_equal(
      gn_invoice_check(inv.data, inv.len, f->agreement.data, f->agreement.len, 3600, 2, &sum, reason, sizeof(reason)),
      0);
  assert_int_equal(sum.seconds, durable + 1);
  gn_buf_done(&inv);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_ledger_refuses_ticks_on_full_disk_and_resumes, setup_tmpfs, teardown_tmpfs),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
