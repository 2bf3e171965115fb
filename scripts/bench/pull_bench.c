/* Pull bench, gpunet's side: one pull of a digest-pinned image into an empty
 * store, then its root filesystem, each timed, one line of figures printed.
 * Built by CMake (target gn_pull_bench) and run by scripts/bench/pull, which
 * sets it side by side with skopeo copy and umoci from the same registry.
 *   gn_pull_bench STORE_DIR REF@sha256:... ROOTFS_DIR
 * prints: pull_ms=P unpack_ms=U again_ms=A fetched=BYTES pull=FN unpack=FN
 * (again: the root for a second job of the same image). */
#include <gpunet/sandbox.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* The store's newer interfaces (limits and the registry allow list, shared
 * read-only roots) are used where the library has them, so the same bench
 * gives the figures before and after they landed. */
#pragma weak gn_store_set_limits
#pragma weak gn_store_pull_ex
#pragma weak gn_store_rootfs
#pragma weak gn_store_rootfs_release

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* Whether a weak function was linked in, without the compiler folding the
 * test away. */
static int have(void (*fn)(void)) {
  void (*volatile f)(void) = fn;
  return f != NULL;
}

int main(int argc, char **argv) {
  if (argc != 4) {
    fprintf(stderr, "usage: gn_pull_bench STORE_DIR REF@sha256:... ROOTFS_DIR\n");
    return 2;
  }
  gn_store *s = NULL;
  gn_imageref ref;
  gn_image img;
  char err[512] = "", path[4096] = "";
  const char *how = "gn_store_unpack";
  int r, rc = 1;
  memset(&img, 0, sizeof img);
  if ((r = gn_imageref_parse(argv[2], &ref)) < 0) {
    fprintf(stderr, "gn_pull_bench: bad reference %s\n", argv[2]);
    return 2;
  }
  if ((r = gn_store_open(argv[1], &s)) < 0) {
    fprintf(stderr, "gn_pull_bench: cannot open store %s: %s\n", argv[1], gn_strerror(r));
    return 1;
  }
  if (have((void (*)(void))gn_store_set_limits)) {
    static const char *const allow[] = {"127.0.0.1", NULL};
    gn_store_limits lim = {.registry_allow = allow};
    if ((r = gn_store_set_limits(s, &lim)) < 0) {
      fprintf(stderr, "gn_pull_bench: cannot set store limits: %s\n", gn_strerror(r));
      goto out;
    }
  }
  const char *pull = have((void (*)(void))gn_store_pull_ex) ? "gn_store_pull_ex" : "gn_store_pull";
  double t0 = now_ms();
  if (have((void (*)(void))gn_store_pull_ex))
    r = gn_store_pull_ex(s, &ref, NULL, &img, err, sizeof err, NULL, 0);
  else
    r = gn_store_pull(s, &ref, NULL, NULL, &img, err, sizeof err);
  double t1 = now_ms();
  if (r < 0) {
    fprintf(stderr, "gn_pull_bench: pull of %s failed: %s (%s)\n", argv[2], err, gn_strerror(r));
    goto out;
  }
  /* The root a job gets, twice: the first job of an image, then the next
   * one (which the old store unpacked again, into a bundle of its own). */
  double t[3] = {now_ms(), 0, 0};
  for (int k = 0; k < 2; k++) {
    char dir[4096];
    snprintf(dir, sizeof dir, "%s%s", argv[3], k ? ".again" : "");
    if (have((void (*)(void))gn_store_rootfs)) {
      how = "gn_store_rootfs";
      r = gn_store_rootfs(s, &img, NULL, path, err, sizeof err);
      if (r == 0 && have((void (*)(void))gn_store_rootfs_release))
        gn_store_rootfs_release(s, path);
    } else {
      r = gn_store_unpack(s, &img, dir, err, sizeof err);
    }
    t[k + 1] = now_ms();
    if (r < 0) {
      fprintf(stderr, "gn_pull_bench: %s of %s failed: %s (%s)\n", how, argv[2], err, gn_strerror(r));
      goto out;
    }
  }
  printf("pull_ms=%.1f unpack_ms=%.1f again_ms=%.1f fetched=%llu pull=%s unpack=%s\n", t1 - t0, t[1] - t[0],
         t[2] - t[1], (unsigned long long)img.bytes_fetched, pull, how);
  rc = 0;
out:
  gn_image_done(&img);
  gn_store_free(s);
  return rc;
}
