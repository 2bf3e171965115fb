/* The content-addressed image store: dir/blobs/sha256/<hex>, each blob
 * verified against its digest before it is renamed into place, and the pull
 * flow that fills it from a registry (index -> linux/amd64 manifest ->
 * config and layers). */
#include "sandbox_int.h"

#include <fcntl.h>
#include <sodium.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

struct gn_store {
  char *dir;
};

static int mkdir_p1(const char *path, mode_t mode) {
  if (mkdir(path, mode) == 0 || errno == EEXIST)
    return 0;
  return -errno;
}

int gn_store_open(const char *dir, gn_store **ret) {
  char p[4096];
  int r;
  if (!dir || !dir[0] || !ret || strlen(dir) > 3000)
    return GN_EINVAL;
  if (sodium_init() < 0)
    return GN_EIO;
  if ((r = mkdir_p1(dir, 0755)) < 0)
    return r;
  snprintf(p, sizeof(p), "%s/blobs", dir);
  if ((r = mkdir_p1(p, 0755)) < 0)
    return r;
  snprintf(p, sizeof(p), "%s/blobs/sha256", dir);
  if ((r = mkdir_p1(p, 0755)) < 0)
    return r;
  snprintf(p, sizeof(p), "%s/tmp", dir);
  if ((r = mkdir_p1(p, 0700)) < 0)
    return r;
  gn_store *s = calloc(1, sizeof(*s));
  if (!s || !(s->dir = strdup(dir))) {
    free(s);
    return GN_ENOMEM;
  }
  *ret = s;
  return 0;
}

gn_store *gn_store_free(gn_store *s) {
  if (s) {
    free(s->dir);
    free(s);
  }
  return NULL;
}

const char *gn__store_dir(const gn_store *s) {
  return s->dir;
}

void gn__store_blob_path(const gn_store *s, const char *digest, char out[4096]) {
  snprintf(out, 4096, "%s/blobs/sha256/%s", s->dir, digest + 7);
}

static void partial_path(const gn_store *s, const char *digest, char out[4096]) {
  snprintf(out, 4096, "%s/tmp/%s.partial", s->dir, digest + 7);
}

static int read_fd_all(int fd, size_t max, gn_buf *out) {
  uint8_t chunk[65536];
  for (;;) {
    ssize_t n = read(fd, chunk, sizeof(chunk));
    if (n < 0) {
      if (errno == EINTR)
        continue;
      return -errno;
    }
    if (n == 0)
      return 0;
    if ((size_t)n > max - out->len)
      return GN_ETOOBIG;
    int r = gn_buf_append(out, chunk, (size_t)n);
    if (r < 0)
      return r;
  }
}

/* Reads a small blob from the store and checks it still matches its digest.
 * A blob that no longer matches (disk damage, tampering) is removed, so the
 * pull fetches it again: GN_ENOTFOUND. */
static int read_small_blob(gn_store *s, const char *digest, size_t max, gn_buf *ret) {
  char path[4096], got[GN_DIGEST_STRLEN];
  gn_buf b = {0};
  gn__store_blob_path(s, digest, path);
  int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0)
    return errno == ENOENT ? GN_ENOTFOUND : -errno;
  int r = read_fd_all(fd, max, &b);
  close(fd);
  if (r < 0) {
    gn_buf_done(&b);
    return r;
  }
  gn__digest_of(b.data, b.len, got);
  if (strcmp(got, digest) != 0) {
    gn_buf_done(&b);
    unlink(path);
    return GN_ENOTFOUND;
  }
  *ret = b;
  return 0;
}

static int write_all(int fd, const uint8_t *p, size_t n) {
  while (n) {
    ssize_t w = write(fd, p, n);
    if (w < 0) {
      if (errno == EINTR)
        continue;
      return -errno;
    }
    p += w;
    n -= (size_t)w;
  }
  return 0;
}

/* Writes already-verified bytes as blob `digest`: temp file, fsync, rename,
 * so a reader never sees a half-written blob. */
static int store_bytes(gn_store *s, const char *digest, const uint8_t *p, size_t n) {
  char tmp[4096], path[4096];
  /* Unique per writer: two threads may store the same manifest at once. */
  snprintf(tmp, sizeof(tmp), "%s/tmp/%s.%ld.%08x.tmp", s->dir, digest + 7, (long)getpid(), randombytes_random());
  gn__store_blob_path(s, digest, path);
  int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0644);
  if (fd < 0)
    return -errno;
  int r = write_all(fd, p, n);
  if (r == 0 && fsync(fd) < 0)
    r = -errno;
  close(fd);
  if (r == 0 && rename(tmp, path) < 0)
    r = -errno;
  if (r < 0)
    unlink(tmp);
  return r;
}

static bool blob_present(gn_store *s, const char *digest, uint64_t size) {
  char path[4096];
  struct stat st;
  gn__store_blob_path(s, digest, path);
  return lstat(path, &st) == 0 && S_ISREG(st.st_mode) && (uint64_t)st.st_size == size;
}

/* Hashes the bytes already in a partial download so the resumed transfer
 * continues the same hash. */
static int hash_prefix(int fd, gn__sha256 *st, uint64_t *ret_len) {
  uint8_t chunk[65536];
  uint64_t total = 0;
  if (lseek(fd, 0, SEEK_SET) < 0)
    return -errno;
  for (;;) {
    ssize_t n = read(fd, chunk, sizeof(chunk));
    if (n < 0) {
      if (errno == EINTR)
        continue;
      return -errno;
    }
    if (n == 0)
      break;
    gn__sha256_update(st, chunk, (size_t)n);
    total += (uint64_t)n;
  }
  *ret_len = total;
  return 0;
}

typedef struct pull_ctx {
  gn_store *s;
  gn__registry *reg;
  gn_pull_progress_fn progress;
  void *ud;
  uint64_t fetched;
  char *err;
  size_t err_cap;
} pull_ctx;

/* Ensures blob d is in the store, downloading (or resuming) it if needed.
 * The partial file is locked so two pulls of one blob do not interleave. */
static int ensure_blob(pull_ctx *c, const gn__descriptor *d) {
  char ppath[4096], path[4096], shortd[32];
  gn__sha256 st = {0};
  char got[GN_DIGEST_STRLEN];
  int fd = -1, r;
  bool keep_partial = false;

  if (blob_present(c->s, d->digest, d->size))
    return 0;
  partial_path(c->s, d->digest, ppath);
  gn__store_blob_path(c->s, d->digest, path);
  fd = open(ppath, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0)
    return gn__err(c->err, c->err_cap, -errno, "cannot create %s: %s", ppath, strerror(errno));
  if (flock(fd, LOCK_EX) < 0) {
    r = -errno;
    goto out;
  }
  if (blob_present(c->s, d->digest, d->size)) {
    /* Another pull finished it while we waited for the lock. */
    r = 0;
    goto out;
  }
  if ((r = gn__sha256_init(&st)) < 0)
    goto out;
  uint64_t have = 0;
  if ((r = hash_prefix(fd, &st, &have)) < 0)
    goto out;
  if (have > d->size) {
    if (ftruncate(fd, 0) < 0) {
      r = -errno;
      goto out;
    }
    if ((r = gn__sha256_init(&st)) < 0)
      goto out;
    have = 0;
  }
  gn__blob_sink sink = {.fd = fd,
                        .offset = have,
                        .expected_size = d->size,
                        .hash_state = &st,
                        .progress = c->progress,
                        .progress_ud = c->ud,
                        .what = gn__digest_short(d->digest, shortd)};
  if (have < d->size || d->size == 0) {
    for (int attempt = 0; attempt < 2; attempt++) {
      r = gn__registry_get_blob(c->reg, d->digest, &sink, c->err, c->err_cap);
      c->fetched += sink.fetched;
      if (r < 0) {
        /* A broken connection keeps what arrived, for the next try to resume. */
        keep_partial = r == GN_EIO || r == GN_ETIMEDOUT;
        goto out;
      }
      if (!sink.restarted)
        break;
      if (ftruncate(fd, 0) < 0 || lseek(fd, 0, SEEK_SET) < 0) {
        r = -errno;
        goto out;
      }
      if ((r = gn__sha256_init(&st)) < 0)
        goto out;
      sink.offset = 0;
    }
  }
  if (sink.offset + sink.fetched != d->size) {
    r = gn__err(c->err, c->err_cap, GN_EPROTO, "blob %s: got %llu bytes, its descriptor says %llu", shortd,
                (unsigned long long)(sink.offset + sink.fetched), (unsigned long long)d->size);
    goto out;
  }
  if ((r = gn__sha256_final_digest(&st, got)) < 0)
    goto out;
  if (strcmp(got, d->digest) != 0) {
    r = gn__err(c->err, c->err_cap, GN_EDIGEST, "blob %s does not match its digest", shortd);
    goto out;
  }
  if (fsync(fd) < 0 || fchmod(fd, 0644) < 0 || rename(ppath, path) < 0) {
    r = gn__err(c->err, c->err_cap, -errno, "cannot store blob %s: %s", shortd, strerror(errno));
    goto out;
  }
  r = 0;
out:
  if (r < 0 && !keep_partial)
    unlink(ppath);
  else if (r == 0)
    unlink(ppath); /* no-op after the rename; removes an empty file when another pull won */
  if (fd >= 0)
    close(fd);
  gn__sha256_done(&st);
  return r;
}

/* Gets the manifest (or index) named by digest: from the store, else from
 * the registry, verified against the digest before it is kept. */
static int ensure_manifest(pull_ctx *c, const char *digest, gn_buf *ret, char ret_content_type[128]) {
  char header_digest[GN_DIGEST_STRLEN], got[GN_DIGEST_STRLEN], a[32], b[32];
  gn_buf body = {0};
  int r = read_small_blob(c->s, digest, GN__MANIFEST_MAX, &body);
  if (r == 0) {
    ret_content_type[0] = '\0';
    *ret = body;
    return 0;
  }
  if (r != GN_ENOTFOUND)
    return gn__err(c->err, c->err_cap, r, "cannot read manifest %s from the store: %s", gn__digest_short(digest, a),
                   gn_strerror(r));
  if ((r = gn__registry_get_manifest(c->reg, digest, &body, ret_content_type, header_digest, c->err, c->err_cap)) < 0)
    return r;
  c->fetched += body.len;
  gn__digest_of(body.data, body.len, got);
  if (strcmp(got, digest) != 0 || (header_digest[0] && strcmp(header_digest, digest) != 0)) {
    gn_buf_done(&body);
    return gn__err(c->err, c->err_cap, GN_EDIGEST, "manifest %s does not match its digest (got %s)",
                   gn__digest_short(digest, a), gn__digest_short(got, b));
  }
  if ((r = store_bytes(c->s, digest, body.data, body.len)) < 0) {
    gn_buf_done(&body);
    return gn__err(c->err, c->err_cap, r, "cannot store manifest %s: %s", gn__digest_short(digest, a), gn_strerror(r));
  }
  *ret = body;
  return 0;
}

void gn_image_done(gn_image *img) {
  if (!img)
    return;
  free(img->layers);
  img->layers = NULL;
  img->layer_count = 0;
  img->entrypoint = gn__strv_free(img->entrypoint);
  img->cmd = gn__strv_free(img->cmd);
  img->env = gn__strv_free(img->env);
}

int gn_store_pull(gn_store *s, const gn_imageref *ref, gn_pull_progress_fn progress, void *ud, gn_image *ret, char *err,
                  size_t err_cap) {
  pull_ctx c = {.s = s, .progress = progress, .ud = ud, .err = err, .err_cap = err_cap};
  gn_buf top = {0}, mbuf = {0}, cbuf = {0};
  gn__manifest m = {0};
  gn__config cfg = {0};
  gn_image img;
  char ctype[128], mdigest[GN_DIGEST_STRLEN], a[32];
  gn__manifest_kind kind;
  int r;

  memset(&img, 0, sizeof(img));
  if (!s || !ref || !ret)
    return GN_EINVAL;
  if (!gn__digest_valid(ref->digest))
    return gn__err(err, err_cap, GN_EINVAL, "image %s/%s is not pinned to a sha256 digest", ref->registry,
                   ref->repository);
  if ((r = gn__registry_new(ref, &c.reg)) < 0)
    goto out;
  if ((r = ensure_manifest(&c, ref->digest, &top, ctype)) < 0)
    goto out;
  if ((r = gn__manifest_kind_of(top.data, top.len, ctype, &kind)) < 0) {
    gn__err(err, err_cap, r, "manifest %s is neither an image manifest nor an index", gn__digest_short(ref->digest, a));
    goto out;
  }
  memcpy(mdigest, ref->digest, sizeof(mdigest));
  if (kind == GN__KIND_INDEX) {
    gn__descriptor d;
    if ((r = gn__index_pick(top.data, top.len, "linux", "amd64", &d)) < 0) {
      gn__err(err, err_cap, r, "image index %s: %s", gn__digest_short(ref->digest, a),
              r == GN_ENOTFOUND ? "no linux/amd64 image in it" : "malformed");
      goto out;
    }
    memcpy(mdigest, d.digest, sizeof(mdigest));
    if ((r = ensure_manifest(&c, mdigest, &mbuf, ctype)) < 0)
      goto out;
    if ((r = gn__manifest_kind_of(mbuf.data, mbuf.len, ctype, &kind)) < 0 || kind != GN__KIND_MANIFEST) {
      r = gn__err(err, err_cap, GN_EUNSUPPORTED, "manifest %s: an index inside an index is not supported",
                  gn__digest_short(mdigest, a));
      goto out;
    }
  } else {
    mbuf = top;
    top = (gn_buf){0};
  }
  if ((r = gn__manifest_parse(mbuf.data, mbuf.len, &m)) < 0) {
    gn__err(err, err_cap, r, "manifest %s: %s", gn__digest_short(mdigest, a),
            r == GN_ETOOBIG ? "over the layer or config size limit" : "malformed or unsupported");
    goto out;
  }
  if ((r = ensure_blob(&c, &m.config)) < 0)
    goto out;
  if ((r = read_small_blob(s, m.config.digest, GN__CONFIG_MAX, &cbuf)) < 0) {
    gn__err(err, err_cap, r, "cannot read config %s", gn__digest_short(m.config.digest, a));
    goto out;
  }
  if ((r = gn__config_parse(cbuf.data, cbuf.len, &cfg)) < 0) {
    gn__err(err, err_cap, r, "image config %s is malformed", gn__digest_short(m.config.digest, a));
    goto out;
  }
  if ((cfg.os[0] && strcmp(cfg.os, "linux") != 0) || (cfg.arch[0] && strcmp(cfg.arch, "amd64") != 0)) {
    r = gn__err(err, err_cap, GN_EUNSUPPORTED, "image %s is for %s/%s, not linux/amd64", gn__digest_short(mdigest, a),
                cfg.os, cfg.arch);
    goto out;
  }
  for (size_t i = 0; i < m.layer_count; i++)
    if ((r = ensure_blob(&c, &m.layers[i])) < 0)
      goto out;

  if (m.layer_count) {
    img.layers = calloc(m.layer_count, sizeof(*img.layers));
    if (!img.layers) {
      r = GN_ENOMEM;
      goto out;
    }
  }
  for (size_t i = 0; i < m.layer_count; i++)
    memcpy(img.layers[i], m.layers[i].digest, GN_DIGEST_STRLEN);
  img.layer_count = m.layer_count;
  memcpy(img.manifest_digest, mdigest, sizeof(mdigest));
  img.entrypoint = cfg.entrypoint;
  img.cmd = cfg.cmd;
  img.env = cfg.env;
  cfg.entrypoint = cfg.cmd = cfg.env = NULL;
  snprintf(img.workdir, sizeof(img.workdir), "%s", cfg.workdir);
  img.bytes_fetched = c.fetched;
  *ret = img;
  memset(&img, 0, sizeof(img));
  r = 0;
out:
  gn_image_done(&img);
  gn__config_done(&cfg);
  gn__manifest_done(&m);
  gn_buf_done(&top);
  gn_buf_done(&mbuf);
  gn_buf_done(&cbuf);
  gn__registry_free(c.reg);
  return r;
}
