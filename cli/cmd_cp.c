/* gpunet cp: copies one file into or out of a lease's workspace (the
 * provider's /workspace of the lease's jobs) through gpunetd, in chunks of
 * 512 KiB with progress, resuming where an interrupted copy stopped, and
 * checking the SHA-256 of both sides at the end (docs/protocol.md §3.2). */
#include "cli.h"
#include "cp.h"
#include "progress.h"

#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <limits.h>
#include <gpunet/base.h>
#include <openssl/evp.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define CP_CHUNK (512u * 1024u) /* bytes per call to gpunetd (its GN_WS_API_CHUNK) */
#define CP_PATH_MAX 1024

static const struct option cp_longs[] = {{"help", no_argument, NULL, 'h'}, {0}};
const cli_opts cli_cp_opts = {":h", cp_longs};

typedef struct cp_job {
  cli *c;
  char lease[72];
  char rpath[CP_PATH_MAX]; /* in the workspace */
  char local[PATH_MAX];    /* the local file (DST for a download) */
  char part[PATH_MAX + 8]; /* a download's partial file */
  uint64_t size;           /* bytes to copy */
  uint64_t resumed_from;   /* where the first attempt started */
  uint64_t stop_after;     /* GN_CP_STOP_AFTER: stop once this many bytes went (tests); 0: never */
  char sha256[65];         /* hex, of both sides once verified */
} cp_job;

/* "LEASE:PATH" -> lease, path (may be empty); false when s names a local
 * file (no ':' before the first '/', or not a lease id before it). */
static bool split_remote(const char *s, char *lease, size_t lcap, char *path, size_t pcap) {
  const char *colon = strchr(s, ':'), *slash = strchr(s, '/');
  if (!colon || (slash && slash < colon) || (size_t)(colon - s) >= lcap)
    return false;
  memcpy(lease, s, (size_t)(colon - s));
  lease[colon - s] = 0;
  if (!gn_id_valid(lease))
    return false;
  snprintf(path, pcap, "%s", colon + 1);
  return true;
}

static const char *base_name(const char *p) {
  const char *s = strrchr(p, '/');
  return s ? s + 1 : p;
}

static int sha256_fd(int fd, uint64_t len, char hex[65]) {
  EVP_MD_CTX *ctx = EVP_MD_CTX_new();
  uint8_t *buf = malloc(1 << 20), md[32];
  unsigned mdlen = 0;
  int r = -1;
  if (!ctx || !buf || EVP_DigestInit_ex(ctx, EVP_sha256(), NULL) != 1)
    goto out;
  for (uint64_t off = 0; off < len;) {
    size_t want = len - off < (1u << 20) ? (size_t)(len - off) : (1u << 20);
    ssize_t k = pread(fd, buf, want, (off_t)off);
    if (k < 0 && errno == EINTR)
      continue;
    if (k <= 0)
      goto out;
    EVP_DigestUpdate(ctx, buf, (size_t)k);
    off += (uint64_t)k;
  }
  if (EVP_DigestFinal_ex(ctx, md, &mdlen) == 1 && mdlen == 32) {
    sodium_bin2hex(hex, 65, md, 32);
    r = 0;
  }
out:
  EVP_MD_CTX_free(ctx);
  free(buf);
  return r;
}

static char *files_path(const cp_job *j, const char *suffix, const char *query) {
  char *lease = cli_urlencode(j->lease), *p = cli_urlencode(j->rpath);
  size_t cap = strlen(lease ? lease : "") + strlen(p ? p : "") + strlen(query) + 64;
  char *out = lease && p ? malloc(cap) : NULL;
  if (out)
    snprintf(out, cap, "/v1/leases/%s/files%s?path=%s%s", lease, suffix, p, query);
  free(lease);
  free(p);
  return out;
}

/* The remote file: exists, size, and with hash its SHA-256 (hex). */
static int remote_stat(cp_job *j, bool hash, bool *exists, uint64_t *size, char hex[65]) {
  char *path = files_path(j, "/stat", hash ? "&hash=1" : "");
  json_t *a = NULL;
  if (!path)
    return cli_fail("out of memory");
  int r = cli_call(j->c, "GET", path, NULL, &a);
  free(path);
  if (r != CLI_OK)
    return r;
  *exists = cli_bool(a, "exists");
  *size = (uint64_t)cli_int(a, "size", 0);
  const char *s = cli_str(a, "sha256");
  if (hex)
    snprintf(hex, 65, "%s", s && strlen(s) == 64 ? s : "");
  json_decref(a);
  return CLI_OK;
}

static int stop_now(const cp_job *j, uint64_t sent) {
  if (!j->stop_after || sent < j->stop_after)
    return -1;
  return cli_fail("stopped after %llu bytes (GN_CP_STOP_AFTER); run the same command again to resume",
                  (unsigned long long)sent);
}

/* Sends the local file from start; the remote file then ends where the
 * local one does. */
static int upload_from(cp_job *j, int fd, uint64_t start, cli_progress *pg) {
  uint8_t *buf = malloc(CP_CHUNK);
  int r = CLI_OK;
  uint64_t sent = 0, off = start;
  if (!buf)
    return cli_fail("out of memory");
  do { /* at least once: an empty file is one empty write */
    size_t want = j->size - off < CP_CHUNK ? (size_t)(j->size - off) : CP_CHUNK;
    ssize_t k = want ? pread(fd, buf, want, (off_t)off) : 0;
    if (k < 0 && errno == EINTR)
      continue;
    if (k < 0 || (size_t)k != want) {
      r = cli_fail("cannot read %s: %s", j->local, k < 0 ? strerror(errno) : "it got shorter");
      break;
    }
    char q[64], *path, *ans = NULL;
    size_t alen = 0;
    snprintf(q, sizeof q, "&offset=%llu", (unsigned long long)off);
    if (!(path = files_path(j, "", q))) {
      r = cli_fail("out of memory");
      break;
    }
    r = cli_call_bytes(j->c, "POST", path, buf, (size_t)k, &ans, &alen);
    free(path);
    free(ans);
    if (r != CLI_OK)
      break;
    off += (uint64_t)k;
    sent += (uint64_t)k;
    cli_progress_update(pg, off, j->size, NULL);
    if ((r = stop_now(j, sent)) >= 0)
      break;
    r = CLI_OK;
  } while (off < j->size);
  free(buf);
  return r;
}

static int do_upload(cp_job *j) {
  int fd = open(j->local, O_RDONLY | O_CLOEXEC);
  struct stat st;
  if (fd < 0)
    return cli_fail("cannot open %s: %s", j->local, strerror(errno));
  if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode)) {
    close(fd);
    return S_ISDIR(st.st_mode) ? cli_fail("%s is a directory: directories are not copied yet; make a tar of it "
                                          "(tar cf dir.tar DIR) and copy that",
                                          j->local)
                               : cli_fail("%s is not a regular file", j->local);
  }
  j->size = (uint64_t)st.st_size;
  char local_hex[65], remote_hex[65];
  int r = CLI_OK;
  for (int attempt = 0; attempt < 2; attempt++) {
    bool exists = false;
    uint64_t rsize = 0;
    if ((r = remote_stat(j, false, &exists, &rsize, NULL)) != CLI_OK)
      break;
    uint64_t start = attempt == 0 && exists && rsize <= j->size ? rsize : 0;
    if (attempt == 0)
      j->resumed_from = start;
    char label[CP_PATH_MAX + PATH_MAX + 96];
    snprintf(label, sizeof label, "%s -> %s:%s", base_name(j->local), j->lease, j->rpath);
    cli_progress *pg =
        cli_progress_start(cli_progress_mode_for(j->c->json), "cp", label, CLI_PROGRESS_BYTES, j->size, NULL, NULL);
    cli_progress_update(pg, start, j->size, start ? "resuming" : NULL);
    if (!(start == j->size && j->size > 0) || !exists)
      r = upload_from(j, fd, start, pg);
    if (r == CLI_OK && sha256_fd(fd, j->size, local_hex) < 0)
      r = cli_fail("cannot read %s to hash it", j->local);
    if (r == CLI_OK)
      r = remote_stat(j, true, &exists, &rsize, remote_hex);
    cli_progress_end(pg, r == CLI_OK, r == CLI_OK ? "verifying" : NULL);
    if (r != CLI_OK)
      break;
    if (exists && rsize == j->size && strcmp(local_hex, remote_hex) == 0) {
      memcpy(j->sha256, local_hex, sizeof j->sha256);
      break;
    }
    if (start == 0) {
      r = cli_fail("%s:%s does not match %s after the copy (SHA-256 %.12s… against %.12s…): was either side "
                   "changed meanwhile?",
                   j->lease, j->rpath, j->local, remote_hex[0] ? remote_hex : "-", local_hex);
      break;
    }
    fprintf(stderr, "gpunet: the resumed copy does not match; copying %s again from the start\n", j->local);
  }
  close(fd);
  return r;
}

static int download_from(cp_job *j, int fd, uint64_t start, cli_progress *pg) {
  uint8_t *buf = malloc(CP_CHUNK);
  int r = CLI_OK;
  uint64_t got = 0;
  if (!buf)
    return cli_fail("out of memory");
  for (uint64_t off = start; off < j->size;) {
    char q[64];
    uint64_t want = j->size - off < CP_CHUNK ? j->size - off : CP_CHUNK;
    snprintf(q, sizeof q, "&offset=%llu&length=%llu", (unsigned long long)off, (unsigned long long)want);
    char *path = files_path(j, "", q), *ans = NULL;
    size_t len = 0;
    if (!path) {
      r = cli_fail("out of memory");
      break;
    }
    r = cli_call_raw(j->c, "GET", path, NULL, &ans, &len);
    free(path);
    if (r != CLI_OK)
      break;
    if (len > want) {
      free(ans);
      r = cli_fail("gpunetd sent more of %s:%s than asked at offset %llu", j->lease, j->rpath, (unsigned long long)off);
      break;
    }
    memcpy(buf, ans, len);
    free(ans);
    if (len == 0) {
      r = cli_fail("%s:%s got shorter while it was copied (%llu bytes)", j->lease, j->rpath, (unsigned long long)off);
      break;
    }
    for (size_t w = 0; w < len;) {
      ssize_t k = pwrite(fd, buf + w, len - w, (off_t)(off + w));
      if (k < 0 && errno == EINTR)
        continue;
      if (k <= 0) {
        r = cli_fail("cannot write %s: %s", j->part, k < 0 ? strerror(errno) : "short write");
        goto out;
      }
      w += (size_t)k;
    }
    off += len;
    got += len;
    cli_progress_update(pg, off, j->size, NULL);
    if ((r = stop_now(j, got)) >= 0)
      break;
    r = CLI_OK;
  }
out:
  free(buf);
  return r;
}

static int do_download(cp_job *j) {
  int r = CLI_OK;
  char remote_hex[65] = "", local_hex[65] = "";
  struct stat st;
  if (stat(j->local, &st) == 0 && S_ISDIR(st.st_mode)) {
    char dst[PATH_MAX];
    if (snprintf(dst, sizeof dst, "%s/%s", j->local, base_name(j->rpath)) >= (int)sizeof dst)
      return cli_fail("%s/%s: path too long", j->local, base_name(j->rpath));
    memcpy(j->local, dst, sizeof dst);
  }
  snprintf(j->part, sizeof j->part, "%s.part", j->local);
  for (int attempt = 0; attempt < 2; attempt++) {
    bool exists = false;
    if ((r = remote_stat(j, false, &exists, &j->size, NULL)) != CLI_OK)
      return r;
    if (!exists)
      return cli_fail("no file %s in the workspace of lease %s", j->rpath, j->lease);
    int fd = open(j->part, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644);
    if (fd < 0)
      return cli_fail("cannot open %s: %s", j->part, strerror(errno));
    uint64_t start = 0;
    if (attempt == 0 && fstat(fd, &st) == 0 && (uint64_t)st.st_size <= j->size)
      start = (uint64_t)st.st_size;
    if (attempt == 0)
      j->resumed_from = start;
    if (ftruncate(fd, (off_t)start) < 0) {
      close(fd);
      return cli_fail("cannot cut %s: %s", j->part, strerror(errno));
    }
    char label[CP_PATH_MAX + PATH_MAX + 96];
    snprintf(label, sizeof label, "%s:%s -> %s", j->lease, j->rpath, base_name(j->local));
    cli_progress *pg =
        cli_progress_start(cli_progress_mode_for(j->c->json), "cp", label, CLI_PROGRESS_BYTES, j->size, NULL, NULL);
    cli_progress_update(pg, start, j->size, start ? "resuming" : NULL);
    r = download_from(j, fd, start, pg);
    uint64_t rsize = 0;
    if (r == CLI_OK)
      r = remote_stat(j, true, &exists, &rsize, remote_hex);
    if (r == CLI_OK && sha256_fd(fd, j->size, local_hex) < 0)
      r = cli_fail("cannot read %s to hash it", j->part);
    cli_progress_end(pg, r == CLI_OK, r == CLI_OK ? "verifying" : NULL);
    close(fd);
    if (r != CLI_OK)
      return r; /* the partial file stays: running the command again resumes */
    if (exists && rsize == j->size && strcmp(local_hex, remote_hex) == 0) {
      if (rename(j->part, j->local) < 0)
        return cli_fail("cannot rename %s to %s: %s", j->part, j->local, strerror(errno));
      memcpy(j->sha256, local_hex, sizeof j->sha256);
      return CLI_OK;
    }
    unlink(j->part);
    if (start == 0)
      return cli_fail("%s does not match %s:%s after the copy (SHA-256 %.12s… against %.12s…): was the remote "
                      "file changed meanwhile? The partial copy was removed",
                      j->local, j->lease, j->rpath, local_hex, remote_hex[0] ? remote_hex : "-");
    fprintf(stderr, "gpunet: the resumed copy does not match; copying %s:%s again from the start\n", j->lease,
            j->rpath);
  }
  return r;
}

int cmd_cp(cli *c, int argc, char **argv) {
  int o;
  optind = 0;
  opterr = 0;
  while ((o = getopt_long(argc, argv, cli_cp_opts.shorts, cli_cp_opts.longs, NULL)) != -1) {
    if (o == 'h')
      return cli_print_usage(cli_find_cmd("cp"));
    return cli_bad_option("cp", o, argv);
  }
  int r = cli_want_args(argc, argv, 2, "SRC and DST");
  if (r >= 0)
    return r;
  const char *src = argv[optind], *dst = argv[optind + 1];
  cp_job j = {.c = c};
  char lease2[72], path2[CP_PATH_MAX];
  bool up = split_remote(dst, j.lease, sizeof j.lease, j.rpath, sizeof j.rpath);
  bool down = split_remote(src, lease2, sizeof lease2, path2, sizeof path2);
  if (up == down)
    return cli_usage_error("cp", "exactly one of SRC and DST must be LEASE:PATH (a lease's workspace)");
  const char *stop = getenv("GN_CP_STOP_AFTER");
  if (stop && stop[0])
    j.stop_after = strtoull(stop, NULL, 10);
  if (down) {
    memcpy(j.lease, lease2, sizeof j.lease);
    memcpy(j.rpath, path2, sizeof j.rpath);
    if (!j.rpath[0])
      return cli_usage_error("cp", "name the file in the workspace: %s:PATH", j.lease);
    snprintf(j.local, sizeof j.local, "%s", dst);
  } else {
    snprintf(j.local, sizeof j.local, "%s", src);
    size_t k = strlen(j.rpath);
    if (k == 0 || j.rpath[k - 1] == '/') /* L: or L:dir/ -> the local file's name there */
      snprintf(j.rpath + k, sizeof j.rpath - k, "%s", base_name(j.local));
  }
  uint64_t t0 = cli_mono_ms();
  r = down ? do_download(&j) : do_upload(&j);
  if (r != CLI_OK)
    return r;
  double secs = (double)(cli_mono_ms() - t0) / 1000.0;
  if (c->json)
    return cli_print_json_new(json_pack("{s:s, s:s, s:s, s:I, s:s, s:f, s:I}", "direction", down ? "down" : "up",
                                        "lease", j.lease, "path", j.rpath, "bytes", (json_int_t)j.size, "sha256",
                                        j.sha256, "seconds", secs, "resumed_from", (json_int_t)j.resumed_from));
  char amount[32], rate[32];
  cli_progress_fmt_bytes(j.size, amount, sizeof amount);
  cli_progress_fmt_bytes(secs > 0 ? (uint64_t)((double)(j.size - j.resumed_from) / secs) : 0, rate, sizeof rate);
  printf("copied %s %s %s:%s in %.1f s (%s/s%s), SHA-256 %s verified on both sides\n", amount, down ? "from" : "to",
         j.lease, j.rpath, secs, rate, j.resumed_from ? ", resumed" : "", j.sha256);
  return CLI_OK;
}
