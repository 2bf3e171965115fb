/* The hostile-job suite's keyring helper (tests/e2e/test_hostile.sh): puts,
 * gets and drops "user" keys in the kernel keyrings, so the suite can plant
 * a secret in the host root's keyrings and try to read it, write to them,
 * and pass a value between two leases' jobs. Built static by the suite at
 * test time and run both on the host and inside jobs; it only reports what
 * the kernel answered.
 *
 *   gn_hostile key-put RING DESC VALUE   OK <serial>        | BLOCKED <errno>
 *   gn_hostile key-get RING DESC         FOUND <value>      | NOTFOUND | BLOCKED <errno>
 *   gn_hostile key-del RING DESC         OK                 | NOTFOUND | BLOCKED <errno>
 *   gn_hostile tar-entries N             a tar stream of N empty files on stdout
 *                                        (an entry-count bomb, gzipped by the suite)
 *
 * RING: "u" the user keyring, "p" the persistent keyring, "s" the session
 * keyring, "n:NAME" a named session keyring joined (or created) by NAME.
 * Exit status: 0 for OK/FOUND, 1 for BLOCKED, 2 for NOTFOUND, 3 for usage. */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#define KEY_SPEC_SESSION_KEYRING -3
#define KEY_SPEC_USER_KEYRING -4
#define KEYCTL_GET_KEYRING_ID 0
#define KEYCTL_JOIN_SESSION_KEYRING 1
#define KEYCTL_UNLINK 9
#define KEYCTL_SEARCH 10
#define KEYCTL_READ 11
#define KEYCTL_INVALIDATE 21
#define KEYCTL_GET_PERSISTENT 22

static long keyctl5(long op, long a, long b, long c, long d) {
  return syscall(SYS_keyctl, op, a, b, c, d);
}

static int blocked(const char *what) {
  int e = errno;
  printf("BLOCKED %s (%s: %s)\n", strerrorname_np(e) ? strerrorname_np(e) : "?", what, strerror(e));
  return 1;
}

/* The keyring's serial number, creating it where the kernel would. */
static long ring_id(const char *ring) {
  if (strcmp(ring, "u") == 0)
    return keyctl5(KEYCTL_GET_KEYRING_ID, KEY_SPEC_USER_KEYRING, 1, 0, 0);
  if (strcmp(ring, "s") == 0)
    return keyctl5(KEYCTL_GET_KEYRING_ID, KEY_SPEC_SESSION_KEYRING, 1, 0, 0);
  if (strcmp(ring, "p") == 0)
    return keyctl5(KEYCTL_GET_PERSISTENT, -1, KEY_SPEC_SESSION_KEYRING, 0, 0);
  if (strncmp(ring, "n:", 2) == 0 && ring[2])
    return keyctl5(KEYCTL_JOIN_SESSION_KEYRING, (long)(ring + 2), 0, 0, 0);
  errno = EINVAL;
  return -1;
}

/* A ustar stream of the directory e/ and n empty regular files e/0000000,
 * e/0000001, ... */
static int tar_entries(unsigned long n) {
  static char blk[512];
  for (unsigned long i = 0; i <= n; i++) {
    memset(blk, 0, sizeof blk);
    if (i == 0)
      snprintf(blk, 100, "e/");
    else
      snprintf(blk, 100, "e/%07lu", i - 1);
    memcpy(blk + 100, i == 0 ? "0000755" : "0000644", 8);
    memcpy(blk + 108, "0000000", 8);
    memcpy(blk + 116, "0000000", 8);
    memcpy(blk + 124, "00000000000", 12);
    memcpy(blk + 136, "00000000000", 12);
    memset(blk + 148, ' ', 8);
    blk[156] = i == 0 ? '5' : '0';
    memcpy(blk + 257, "ustar", 6);
    memcpy(blk + 263, "00", 2);
    unsigned sum = 0;
    for (size_t k = 0; k < sizeof blk; k++)
      sum += (unsigned char)blk[k];
    snprintf(blk + 148, 8, "%06o", sum);
    if (fwrite(blk, sizeof blk, 1, stdout) != 1)
      return 1;
  }
  memset(blk, 0, sizeof blk);
  for (int k = 0; k < 2; k++)
    if (fwrite(blk, sizeof blk, 1, stdout) != 1)
      return 1;
  return fflush(stdout) == 0 ? 0 : 1;
}

int main(int argc, char **argv) {
  if (argc == 3 && strcmp(argv[1], "tar-entries") == 0)
    return tar_entries(strtoul(argv[2], NULL, 10));
  if (argc < 4 || (strcmp(argv[1], "key-put") == 0) != (argc == 5)) {
    fprintf(stderr, "usage: gn_hostile key-put|key-get|key-del RING DESC [VALUE] | tar-entries N\n");
    return 3;
  }
  const char *op = argv[1], *desc = argv[3];
  long ring = ring_id(argv[2]);
  if (ring < 0)
    return blocked("keyring");
  if (strcmp(op, "key-put") == 0) {
    long k = syscall(SYS_add_key, "user", desc, argv[4], strlen(argv[4]), ring);
    if (k < 0)
      return blocked("add_key");
    printf("OK %ld\n", k);
    return 0;
  }
  long k = keyctl5(KEYCTL_SEARCH, ring, (long)"user", (long)desc, 0);
  if (k < 0) {
    if (errno == ENOKEY) {
      printf("NOTFOUND\n");
      return 2;
    }
    return blocked("keyctl search");
  }
  if (strcmp(op, "key-del") == 0) {
    if (keyctl5(KEYCTL_INVALIDATE, k, 0, 0, 0) < 0 && keyctl5(KEYCTL_UNLINK, k, ring, 0, 0) < 0)
      return blocked("keyctl invalidate");
    printf("OK\n");
    return 0;
  }
  if (strcmp(op, "key-get") != 0) {
    fprintf(stderr, "gn_hostile: unknown operation %s\n", op);
    return 3;
  }
  char buf[512];
  long n = keyctl5(KEYCTL_READ, k, (long)buf, sizeof buf - 1, 0);
  if (n < 0)
    return blocked("keyctl read");
  buf[n < (long)sizeof buf - 1 ? n : (long)sizeof buf - 1] = '\0';
  printf("FOUND %s\n", buf);
  return 0;
}
