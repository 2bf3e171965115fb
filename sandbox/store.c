/* The content-addressed image store: dir/blobs/sha256/<hex>, each blob
 * verified against its digest before it is renamed into place; the pull
 * flow that fills it from a registry (index -> linux/amd64 manifest ->
 * config and layers) under the provider's limits (registry policy,
 * deadlines, cancellation, free-space reserve, size budget); the shared
 * unpacked roots under dir/roots/; and the garbage collector that keeps the
 * store within its budget. Pulls run concurrently on the daemon's thread
 * pool against one gn_store: shared state is under s->mu, a blob download
 * holds a lock on its partial file, and blobs a pull or unpack is using are
 * pinned so the collector leaves them alone. */
#include "sandbox_int.h"

#include <dirent.h>
#include <fcntl.h>
#include <ftw.h>
#include <limits.h>
#include <pthread.h>
#include <sodium.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

#define ALLOW_MAX 256u       /* entries in the registry allow list */
#define ALLOW_ENTRY_MAX 255u /* bytes in one entry */
#define GC_ENTRIES_MAX 100000u

/* An unpacked root known to this process. */
typedef struct root_ent {
  char name[96]; /* "<hex>-<uid_base>" */
  unsigned refs;
  bool busy; /* being unpacked; waiters sleep on s->cond */
  struct root_ent *next;
} root_ent;

/* A blob some pull or unpack is using: gc leaves it alone. */
typedef struct pin_ent {
  char digest[GN_DIGEST_STRLEN];
  unsigned n;
  struct pin_ent *next;
} pin_ent;

struct gn_store {
  char *dir; /* absolute */
  pthread_mutex_t mu;
  pthread_cond_t cond;
  gn_store_limits lim; /* as set; zero fields mean the defaults */
  char **allow;        /* lim.registry_allow points here */
  root_ent *roots;
  pin_ent *pins;
};

static void clean_tmp(gn_store *s);

static int mkdir_p1(const char *path, mode_t mode) {
  if (mkdir(path, mode) == 0 || errno == EEXIST)
    return 0;
  return -errno;
}

int gn_store_open(const char *dir, gn_store **ret) {
  char p[PATH_MAX + 32], abs[PATH_MAX];
  int r;
  if (!dir || !dir[0] || !ret || strlen(dir) > 3000)
    return GN_EINVAL;
  if (sodium_init() < 0)
    return GN_EIO;
  if ((r = mkdir_p1(dir, 0755)) < 0)
    return r;
  /* Roots are handed out by absolute path (bundles point at them). */
  if (!realpath(dir, abs))
    return -errno;
  if (strlen(abs) > 3000)
    return GN_EINVAL;
  static const char *const subs[] = {"blobs", "blobs/sha256", "roots"};
  for (size_t i = 0; i < sizeof(subs) / sizeof(subs[0]); i++) {
    snprintf(p, sizeof(p), "%s/%s", abs, subs[i]);
    if ((r = mkdir_p1(p, 0755)) < 0)
      return r;
  }
  snprintf(p, sizeof(p), "%s/tmp", abs);
  if ((r = mkdir_p1(p, 0700)) < 0)
    return r;
  gn_store *s = calloc(1, sizeof(*s));
  if (!s || !(s->dir = strdup(abs))) {
    free(s);
    return GN_ENOMEM;
  }
  pthread_mutex_init(&s->mu, NULL);
  pthread_cond_init(&s->cond, NULL);
  clean_tmp(s);
  *ret = s;
  return 0;
}

static void strv_free(char **v) {
  for (size_t i = 0; v && v[i]; i++)
    free(v[i]);
  free(v);
}

gn_store *gn_store_free(gn_store *s) {
  if (!s)
    return NULL;
  while (s->roots) {
    root_ent *n = s->roots->next;
    free(s->roots);
    s->roots = n;
  }
  while (s->pins) {
    pin_ent *n = s->pins->next;
    free(s->pins);
    s->pins = n;
  }
  strv_free(s->allow);
  pthread_cond_destroy(&s->cond);
  pthread_mutex_destroy(&s->mu);
  free(s->dir);
  free(s);
  return NULL;
}

/* A deep copy of a NULL-terminated list, bounded. */
static int strv_copy(const char *const *v, char ***ret) {
  size_t n = 0;
  while (v && v[n]) {
    if (++n > ALLOW_MAX || strlen(v[n - 1]) > ALLOW_ENTRY_MAX || !v[n - 1][0])
      return GN_EINVAL;
  }
  char **c = calloc(n + 1, sizeof(char *));
  if (!c)
    return GN_ENOMEM;
  for (size_t i = 0; i < n; i++) {
    if (!(c[i] = strdup(v[i]))) {
      strv_free(c);
      return GN_ENOMEM;
    }
  }
  *ret = c;
  return 0;
}

int gn_store_set_limits(gn_store *s, const gn_store_limits *l) {
  char **allow = NULL;
  if (!s || !l)
    return GN_EINVAL;
  int r = strv_copy(l->registry_allow, &allow);
  if (r < 0)
    return r;
  pthread_mutex_lock(&s->mu);
  char **old = s->allow;
  s->lim = *l;
  s->allow = allow;
  s->lim.registry_allow = (const char *const *)allow;
  pthread_mutex_unlock(&s->mu);
  /* A pull in flight works on its own copy of the list. */
  strv_free(old);
  return 0;
}

const gn_store_limits *gn__store_limits(const gn_store *s) {
  return &s->lim;
}

#define LIM(s, f, d) ((s)->lim.f ? (s)->lim.f : (d))

/* The limits a pull runs under, with defaults filled in and its own copy of
 * the allow list. */
static int limits_snapshot(gn_store *s, gn_store_limits *ret, char ***ret_allow) {
  pthread_mutex_lock(&s->mu);
  gn_store_limits l = {
      .layer_max_bytes = LIM(s, layer_max_bytes, GN_STORE_DEFAULT_LAYER_MAX_BYTES),
      .image_max_bytes = LIM(s, image_max_bytes, GN_STORE_DEFAULT_IMAGE_MAX_BYTES),
      .layer_max_entries = LIM(s, layer_max_entries, GN_STORE_DEFAULT_LAYER_MAX_ENTRIES),
      .image_max_entries = LIM(s, image_max_entries, GN_STORE_DEFAULT_IMAGE_MAX_ENTRIES),
      .reserve_bytes = LIM(s, reserve_bytes, GN_STORE_DEFAULT_RESERVE_BYTES),
      .store_max_bytes = LIM(s, store_max_bytes, GN_STORE_DEFAULT_MAX_BYTES),
      .blob_timeout_s = LIM(s, blob_timeout_s, GN_STORE_DEFAULT_BLOB_TIMEOUT_S),
      .pull_timeout_s = LIM(s, pull_timeout_s, GN_STORE_DEFAULT_PULL_TIMEOUT_S),
  };
  int r = strv_copy((const char *const *)s->allow, ret_allow);
  pthread_mutex_unlock(&s->mu);
  if (r == 0) {
    l.registry_allow = (const char *const *)*ret_allow;
    *ret = l;
  }
  return r;
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

static uint64_t free_bytes(const char *path) {
  struct statvfs sv;
  if (statvfs(path, &sv) < 0)
    return UINT64_MAX; /* cannot tell: the write itself will say */
  return (uint64_t)sv.f_bavail * sv.f_frsize;
}

static int space_check(gn_store *s, uint64_t reserve, uint64_t need, char *err, size_t err_cap) {
  uint64_t avail = free_bytes(s->dir);
  if (avail == UINT64_MAX || (avail >= reserve && avail - reserve >= need))
    return 0;
  return gn__err(err, err_cap, GN_ENOSPACE,
                 "the image store has %llu MiB free and keeps %llu MiB in reserve; %llu MiB more do not fit",
                 (unsigned long long)(avail >> 20), (unsigned long long)(reserve >> 20),
                 (unsigned long long)((need + (1u << 20) - 1) >> 20));
}

int gn__store_space_check(gn_store *s, uint64_t need_bytes, char *err, size_t err_cap) {
  pthread_mutex_lock(&s->mu);
  uint64_t reserve = LIM(s, reserve_bytes, GN_STORE_DEFAULT_RESERVE_BYTES);
  pthread_mutex_unlock(&s->mu);
  return space_check(s, reserve, need_bytes, err, err_cap);
}

/* --- pins ---------------------------------------------------------------*/

static int pin(gn_store *s, const char *digest) {
  int r = 0;
  pthread_mutex_lock(&s->mu);
  pin_ent *p = s->pins;
  while (p && strcmp(p->digest, digest) != 0)
    p = p->next;
  if (!p) {
    if (!(p = calloc(1, sizeof(*p)))) {
      r = GN_ENOMEM;
      goto out;
    }
    snprintf(p->digest, sizeof(p->digest), "%s", digest);
    p->next = s->pins;
    s->pins = p;
  }
  p->n++;
out:
  pthread_mutex_unlock(&s->mu);
  return r;
}

static void unpin(gn_store *s, const char *digest) {
  pthread_mutex_lock(&s->mu);
  for (pin_ent **pp = &s->pins; *pp; pp = &(*pp)->next) {
    if (strcmp((*pp)->digest, digest) == 0) {
      if (--(*pp)->n == 0) {
        pin_ent *dead = *pp;
        *pp = dead->next;
        free(dead);
      }
      break;
    }
  }
  pthread_mutex_unlock(&s->mu);
}

/* Caller holds s->mu. */
static bool pinned_locked(const gn_store *s, const char *hex) {
  for (const pin_ent *p = s->pins; p; p = p->next)
    if (strcmp(p->digest + 7, hex) == 0)
      return true;
  return false;
}

/* The pins of one pull or unpack, released together. */
typedef struct pinset {
  char (*d)[GN_DIGEST_STRLEN];
  size_t n, cap;
} pinset;

static int pinset_add(gn_store *s, pinset *ps, const char *digest) {
  for (size_t i = 0; i < ps->n; i++)
    if (strcmp(ps->d[i], digest) == 0)
      return 0;
  if (ps->n == ps->cap) {
    size_t cap = ps->cap ? ps->cap * 2 : 16;
    void *p = realloc(ps->d, cap * sizeof(*ps->d));
    if (!p)
      return GN_ENOMEM;
    ps->d = p;
    ps->cap = cap;
  }
  int r = pin(s, digest);
  if (r == 0)
    snprintf(ps->d[ps->n++], GN_DIGEST_STRLEN, "%s", digest);
  return r;
}

static void pinset_done(gn_store *s, pinset *ps) {
  for (size_t i = 0; i < ps->n; i++)
    unpin(s, ps->d[i]);
  free(ps->d);
  *ps = (pinset){0};
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

static void touch(const char *path) {
  utimensat(AT_FDCWD, path, NULL, 0); /* last use, for gc; best effort */
}

static void touch_blob(gn_store *s, const char *digest) {
  char path[4096];
  gn__store_blob_path(s, digest, path);
  touch(path);
}

typedef struct pull_ctx {
  gn_store *s;
  gn__registry *reg;
  gn_store_limits lim;
  const gn_pull_opts *opts;
  pinset pins;
  uint64_t fetched;
  char *err;
  size_t err_cap;
} pull_ctx;

static bool canceled(const pull_ctx *c) {
  return c->opts && c->opts->cancel && *c->opts->cancel;
}

/* Takes the download lock of blob d: the partial file, locked, and still
 * the one at its path (a pull that gave up may have removed it while we
 * waited). Waiting stays cancellable. */
static int lock_partial(pull_ctx *c, const char *ppath, uint64_t deadline_ms, int *ret_fd) {
  for (;;) {
    int fd = open(ppath, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd < 0)
      return gn__err(c->err, c->err_cap, -errno, "cannot create %s: %s", ppath, strerror(errno));
    while (flock(fd, LOCK_EX | LOCK_NB) < 0) {
      int e = errno;
      if (e != EWOULDBLOCK && e != EINTR) {
        close(fd);
        return -e;
      }
      if (canceled(c)) {
        close(fd);
        return gn__err(c->err, c->err_cap, GN_ECANCELED, "pull canceled");
      }
      if (gn__now_ms() >= deadline_ms) {
        close(fd);
        return gn__err(c->err, c->err_cap, GN_ETIMEDOUT, "timed out waiting for another pull of the same blob");
      }
      struct timespec ts = {0, 50 * 1000 * 1000};
      nanosleep(&ts, NULL);
    }
    struct stat a, b;
    if (fstat(fd, &a) == 0 && stat(ppath, &b) == 0 && a.st_dev == b.st_dev && a.st_ino == b.st_ino) {
      *ret_fd = fd;
      return 0;
    }
    close(fd); /* removed or replaced while we waited: take the current one */
  }
}

/* Ensures blob d is in the store, downloading (or resuming) it if needed.
 * The partial file is locked so two pulls of one blob do not interleave;
 * it is hashed once, as it streams. */
static int ensure_blob(pull_ctx *c, const gn__descriptor *d) {
  char ppath[4096], path[4096], shortd[32];
  gn__sha256 st = {0};
  char got[GN_DIGEST_STRLEN];
  int fd = -1, r;
  bool keep_partial = false, renamed = false;

  gn__digest_short(d->digest, shortd);
  if (canceled(c))
    return gn__err(c->err, c->err_cap, GN_ECANCELED, "pull canceled before blob %s", shortd);
  if (blob_present(c->s, d->digest, d->size)) {
    touch_blob(c->s, d->digest);
    return 0;
  }
  if ((r = space_check(c->s, c->lim.reserve_bytes, d->size, c->err, c->err_cap)) < 0)
    return r;
  uint64_t blob_deadline = gn__now_ms() + (uint64_t)c->lim.blob_timeout_s * 1000u;
  partial_path(c->s, d->digest, ppath);
  gn__store_blob_path(c->s, d->digest, path);
  if ((r = lock_partial(c, ppath, blob_deadline, &fd)) < 0)
    return r;
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
                        .progress = c->opts ? c->opts->progress : NULL,
                        .progress_ud = c->opts ? c->opts->progress_ud : NULL,
                        .what = shortd,
                        .deadline_ms = blob_deadline,
                        .space_path = c->s->dir,
                        .reserve_bytes = c->lim.reserve_bytes};
  if (have < d->size || d->size == 0) {
    for (int attempt = 0; attempt < 2; attempt++) {
      r = gn__registry_get_blob(c->reg, d->digest, &sink, c->err, c->err_cap);
      c->fetched += sink.fetched;
      if (r < 0) {
        /* A broken connection keeps what arrived, for the next try to
         * resume; a cancel, a deadline or a full disk leaves nothing. */
        keep_partial = r == GN_EIO;
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
  renamed = true;
  r = 0;
out:
  /* Still holding the lock: nobody else can be using this partial file. */
  if (!renamed && !keep_partial)
    unlink(ppath);
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
    touch_blob(c->s, digest);
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

/* --- trees: sizes and removal ------------------------------------------*/

/* nftw has no user pointer; the walk runs on one thread at a time per
 * thread, so a thread-local accumulator is enough. */
static _Thread_local uint64_t tree_bytes;

static int size_entry(const char *p, const struct stat *st, int flag, struct FTW *f) {
  (void)p, (void)flag, (void)f;
  tree_bytes += (uint64_t)st->st_blocks * 512u;
  return 0;
}

static uint64_t tree_size(const char *path) {
  tree_bytes = 0;
  nftw(path, size_entry, 16, FTW_PHYS);
  return tree_bytes;
}

/* Removes a tree that nobody can reach any more (renamed under tmp/ first),
 * never following links. */
static void rm_tree(const char *path) {
  gn_rm_tree(path);
}

/* Moves dir/<rel> out of sight (under tmp/) and removes it there. Caller
 * holds s->mu for the rename when others could look the name up. */
static int retire(gn_store *s, const char *rel, char out[4096]) {
  char from[4096];
  snprintf(from, sizeof(from), "%s/%s", s->dir, rel);
  snprintf(out, 4096, "%s/tmp/gc-%08x%08x", s->dir, randombytes_random(), randombytes_random());
  return rename(from, out) < 0 ? -errno : 0;
}

#define TMP_STALE_S (24 * 3600) /* a temp entry this old belongs to no live pull or unpack */

/* Removes what crashed or abandoned work left under tmp/: trees retired
 * for removal (gc-*), and day-old unpacks, stamps and partial downloads no
 * pull holds the lock of. */
static void clean_tmp(gn_store *s) {
  char p[4096];
  snprintf(p, sizeof(p), "%s/tmp", s->dir);
  DIR *d = opendir(p);
  if (!d)
    return;
  time_t now = time(NULL);
  struct dirent *e;
  while ((e = readdir(d)) != NULL) {
    const char *n = e->d_name;
    struct stat st;
    if (n[0] == '.' || strlen(n) > 200)
      continue;
    snprintf(p, sizeof(p), "%s/tmp/%s", s->dir, n);
    if (lstat(p, &st) < 0)
      continue;
    bool old = now - st.st_mtime > TMP_STALE_S;
    if (strncmp(n, "gc-", 3) == 0 || (old && strncmp(n, "root-", 5) == 0)) {
      if (S_ISDIR(st.st_mode))
        rm_tree(p);
      else
        unlink(p);
    } else if (old && S_ISREG(st.st_mode)) {
      int fd = open(p, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
      if (fd >= 0 && flock(fd, LOCK_EX | LOCK_NB) == 0)
        unlink(p); /* nobody downloads into it */
      if (fd >= 0)
        close(fd);
    }
  }
  closedir(d);
}

/* --- roots --------------------------------------------------------------*/

static root_ent *root_find(gn_store *s, const char *name) {
  for (root_ent *e = s->roots; e; e = e->next)
    if (strcmp(e->name, name) == 0)
      return e;
  return NULL;
}

static void root_remove(gn_store *s, root_ent *e) {
  for (root_ent **pp = &s->roots; *pp; pp = &(*pp)->next) {
    if (*pp == e) {
      *pp = e->next;
      free(e);
      return;
    }
  }
}

/* The byte size recorded in a root's stamp file; false without a stamp. */
static bool stamp_read(const char *stamp, uint64_t *ret_bytes) {
  char buf[32] = "";
  int fd = open(stamp, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0)
    return false;
  ssize_t n = read(fd, buf, sizeof(buf) - 1);
  close(fd);
  if (n <= 0)
    return false;
  buf[n] = '\0';
  *ret_bytes = strtoull(buf, NULL, 10);
  return true;
}

static int stamp_write(gn_store *s, const char *stamp, uint64_t bytes) {
  char tmp[4096], buf[32];
  snprintf(tmp, sizeof(tmp), "%s/tmp/stamp-%08x%08x", s->dir, randombytes_random(), randombytes_random());
  int n = snprintf(buf, sizeof(buf), "%llu\n", (unsigned long long)bytes);
  int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0644);
  if (fd < 0)
    return -errno;
  int r = write_all(fd, (const uint8_t *)buf, (size_t)n);
  close(fd);
  if (r == 0 && rename(tmp, stamp) < 0)
    r = -errno;
  if (r < 0)
    unlink(tmp);
  return r;
}

/* --- garbage collection -------------------------------------------------*/

typedef struct gc_item {
  char rel[128]; /* "blobs/sha256/<hex>" or "roots/<name>" */
  bool root;
  uint64_t bytes;
  struct timespec used;
} gc_item;

static int gc_cmp(const void *a, const void *b) {
  const gc_item *x = a, *y = b;
  if (x->used.tv_sec != y->used.tv_sec)
    return x->used.tv_sec < y->used.tv_sec ? -1 : 1;
  if (x->used.tv_nsec != y->used.tv_nsec)
    return x->used.tv_nsec < y->used.tv_nsec ? -1 : 1;
  return strcmp(x->rel, y->rel);
}

static bool hex64(const char *s) {
  size_t i = 0;
  for (; s[i]; i++)
    if (i >= 64 || !((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f')))
      return false;
  return i == 64;
}

/* Root directory names: 64 hex, '-', a decimal uid. */
static bool root_name_valid(const char *n) {
  if (strlen(n) < 66 || n[64] != '-')
    return false;
  char hex[65];
  memcpy(hex, n, 64);
  hex[64] = '\0';
  if (!hex64(hex))
    return false;
  const char *u = n + 65;
  size_t i = 0;
  for (; u[i]; i++)
    if (i >= 10 || u[i] < '0' || u[i] > '9')
      return false;
  return i > 0;
}

/* Everything the store holds: its bytes in total (ret_usage) and the items
 * gc may remove (blobs not pinned, roots not in use), in ret_items. */
static int gc_scan(gn_store *s, gc_item **ret_items, size_t *ret_n, uint64_t *ret_usage) {
  char p[4096];
  gc_item *items = NULL;
  size_t n = 0, cap = 0;
  uint64_t usage = 0;
  int r = 0;
  static const char *const dirs[] = {"blobs/sha256", "roots"};
  for (size_t d = 0; d < 2; d++) {
    snprintf(p, sizeof(p), "%s/%s", s->dir, dirs[d]);
    DIR *dir = opendir(p);
    if (!dir)
      continue;
    struct dirent *e;
    while ((e = readdir(dir)) != NULL) {
      const char *name = e->d_name;
      gc_item it = {.root = d == 1};
      struct stat st;
      if (it.root) {
        size_t nl = strlen(name);
        if (nl < 7 || strcmp(name + nl - 6, ".stamp") != 0 || nl - 6 >= sizeof(it.rel) - 8)
          continue;
        char rn[128];
        memcpy(rn, name, nl - 6);
        rn[nl - 6] = '\0';
        if (!root_name_valid(rn))
          continue;
        snprintf(p, sizeof(p), "%s/roots/%s", s->dir, name);
        if (lstat(p, &st) < 0 || !stamp_read(p, &it.bytes))
          continue;
        snprintf(it.rel, sizeof(it.rel), "roots/%.100s", rn);
        usage += it.bytes;
        pthread_mutex_lock(&s->mu);
        root_ent *re = root_find(s, rn);
        bool busy = re && (re->refs || re->busy);
        pthread_mutex_unlock(&s->mu);
        if (busy)
          continue;
      } else {
        if (!hex64(name))
          continue;
        snprintf(p, sizeof(p), "%s/blobs/sha256/%s", s->dir, name);
        if (lstat(p, &st) < 0 || !S_ISREG(st.st_mode))
          continue;
        it.bytes = (uint64_t)st.st_size;
        usage += it.bytes;
        snprintf(it.rel, sizeof(it.rel), "blobs/sha256/%.64s", name);
        pthread_mutex_lock(&s->mu);
        bool pinned = pinned_locked(s, name);
        pthread_mutex_unlock(&s->mu);
        if (pinned)
          continue;
      }
      it.used = st.st_mtim;
      if (n == cap) {
        if (cap >= GC_ENTRIES_MAX)
          continue; /* a store this large is collected over several passes */
        size_t nc = cap ? cap * 2 : 64;
        gc_item *ni = realloc(items, nc * sizeof(*items));
        if (!ni) {
          r = GN_ENOMEM;
          closedir(dir);
          goto out;
        }
        items = ni;
        cap = nc;
      }
      items[n++] = it;
    }
    closedir(dir);
  }
  if (n)
    qsort(items, n, sizeof(*items), gc_cmp);
out:
  if (r < 0) {
    free(items);
    return r;
  }
  *ret_items = items;
  *ret_n = n;
  *ret_usage = usage;
  return 0;
}

/* Removes unused items, least recently used first, until the store holds at
 * most target bytes and reserve bytes are free. */
static int gc_to(gn_store *s, uint64_t target, uint64_t reserve, uint64_t *ret_usage, uint64_t *ret_freed) {
  static pthread_mutex_t gc_mu = PTHREAD_MUTEX_INITIALIZER; /* one collector at a time */
  gc_item *items = NULL;
  size_t n = 0;
  uint64_t usage = 0, freed = 0;
  pthread_mutex_lock(&gc_mu);
  int r = gc_scan(s, &items, &n, &usage);
  for (size_t i = 0; r == 0 && i < n; i++) {
    uint64_t avail = free_bytes(s->dir);
    if (usage <= target && (avail == UINT64_MAX || avail >= reserve))
      break;
    char gone[4096];
    bool removed = false;
    pthread_mutex_lock(&s->mu);
    if (items[i].root) {
      const char *rn = items[i].rel + 6;
      root_ent *re = root_find(s, rn);
      if (!(re && (re->refs || re->busy)) && retire(s, items[i].rel, gone) == 0) {
        char stamp[4096];
        snprintf(stamp, sizeof(stamp), "%s/%s.stamp", s->dir, items[i].rel);
        unlink(stamp);
        if (re)
          root_remove(s, re);
        removed = true;
      }
    } else if (!pinned_locked(s, items[i].rel + 13)) {
      char path[4096];
      snprintf(path, sizeof(path), "%s/%s", s->dir, items[i].rel);
      removed = unlink(path) == 0;
      gone[0] = '\0';
    }
    pthread_mutex_unlock(&s->mu);
    if (!removed)
      continue;
    if (items[i].root)
      rm_tree(gone);
    usage -= items[i].bytes;
    freed += items[i].bytes;
  }
  pthread_mutex_unlock(&gc_mu);
  free(items);
  if (ret_usage)
    *ret_usage = usage;
  if (ret_freed)
    *ret_freed = freed;
  return r;
}

int gn_store_gc(gn_store *s, uint64_t *ret_freed_bytes) {
  if (!s)
    return GN_EINVAL;
  pthread_mutex_lock(&s->mu);
  uint64_t max = LIM(s, store_max_bytes, GN_STORE_DEFAULT_MAX_BYTES);
  uint64_t reserve = LIM(s, reserve_bytes, GN_STORE_DEFAULT_RESERVE_BYTES);
  pthread_mutex_unlock(&s->mu);
  uint64_t freed = 0;
  clean_tmp(s);
  int r = gc_to(s, max, reserve, NULL, &freed);
  if (r == 0 && ret_freed_bytes)
    *ret_freed_bytes = freed;
  return r;
}

/* Makes room for need more bytes: collects down to store_max_bytes - need
 * and refuses (GN_ENOSPACE) when even that is not enough, or when the
 * filesystem would cut into the reserve. */
static int make_room(gn_store *s, const gn_store_limits *lim, uint64_t need, const char *what, char *err,
                     size_t err_cap) {
  if (need > lim->store_max_bytes)
    return gn__err(err, err_cap, GN_ENOSPACE, "%s needs %llu MiB, over the image store's budget of %llu MiB", what,
                   (unsigned long long)(need >> 20), (unsigned long long)(lim->store_max_bytes >> 20));
  uint64_t usage = 0;
  int r = gc_to(s, lim->store_max_bytes - need, lim->reserve_bytes + need, &usage, NULL);
  if (r < 0)
    return gn__err(err, err_cap, r, "cannot collect the image store: %s", gn_strerror(r));
  if (usage + need > lim->store_max_bytes)
    return gn__err(err, err_cap, GN_ENOSPACE,
                   "%s needs %llu MiB; the image store's budget is %llu MiB and images in use hold %llu MiB", what,
                   (unsigned long long)(need >> 20), (unsigned long long)(lim->store_max_bytes >> 20),
                   (unsigned long long)(usage >> 20));
  return space_check(s, lim->reserve_bytes, need, err, err_cap);
}

/* --- pulls --------------------------------------------------------------*/

int gn_store_pull_ex(gn_store *s, const gn_imageref *ref, const gn_pull_opts *opts, gn_image *ret, char *err,
                     size_t err_cap, char *err_log, size_t err_log_cap) {
  pull_ctx c = {.s = s, .opts = opts, .err = err, .err_cap = err_cap};
  gn_buf top = {0}, mbuf = {0}, cbuf = {0};
  gn__manifest m = {0};
  gn__config cfg = {0};
  gn_image img;
  char ctype[128], mdigest[GN_DIGEST_STRLEN], a[32];
  char **allow = NULL;
  gn__manifest_kind kind;
  int r;

  memset(&img, 0, sizeof(img));
  if (err_log && err_log_cap)
    err_log[0] = '\0';
  if (!s || !ref || !ret)
    return GN_EINVAL;
  if (!gn__digest_valid(ref->digest))
    return gn__err(err, err_cap, GN_EINVAL, "image %s/%s is not pinned to a sha256 digest", ref->registry,
                   ref->repository);
  if ((r = limits_snapshot(s, &c.lim, &allow)) < 0)
    return r;
  gn__registry_opts ro = {.enforce = true,
                          .allow = c.lim.registry_allow,
                          .cancel = opts ? opts->cancel : NULL,
                          .deadline_ms = gn__now_ms() + (uint64_t)c.lim.pull_timeout_s * 1000u,
                          .err_log = err_log,
                          .err_log_cap = err_log_cap};
  if ((r = gn__registry_open(ref, &ro, &c.reg, err, err_cap)) < 0)
    goto out;
  if ((r = pinset_add(s, &c.pins, ref->digest)) < 0)
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
    if ((r = pinset_add(s, &c.pins, mdigest)) < 0)
      goto out;
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
  /* Pin what this image needs before looking at what is missing, so a
   * concurrent collection cannot take it in between. */
  uint64_t missing = 0;
  if ((r = pinset_add(s, &c.pins, m.config.digest)) < 0)
    goto out;
  if (!blob_present(s, m.config.digest, m.config.size))
    missing += m.config.size;
  for (size_t i = 0; i < m.layer_count; i++) {
    if ((r = pinset_add(s, &c.pins, m.layers[i].digest)) < 0)
      goto out;
    if (!blob_present(s, m.layers[i].digest, m.layers[i].size)) {
      if (m.layers[i].size > UINT64_MAX - missing) {
        r = gn__err(err, err_cap, GN_ETOOBIG, "image %s: layer sizes overflow", gn__digest_short(mdigest, a));
        goto out;
      }
      missing += m.layers[i].size;
    }
  }
  /* The bytes this pull will fetch in all, before the blobs' own progress. */
  if (c.opts && c.opts->progress)
    c.opts->progress(c.opts->progress_ud, GN_PULL_PROGRESS_TOTAL, 0, missing);
  if (missing) {
    char what[64];
    snprintf(what, sizeof(what), "image %s", gn__digest_short(mdigest, a));
    if ((r = make_room(s, &c.lim, missing, what, err, err_cap)) < 0)
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
  pinset_done(s, &c.pins);
  strv_free(allow);
  return r;
}

int gn_store_pull(gn_store *s, const gn_imageref *ref, gn_pull_progress_fn progress, void *ud, gn_image *ret, char *err,
                  size_t err_cap) {
  gn_pull_opts o = {.progress = progress, .progress_ud = ud};
  return gn_store_pull_ex(s, ref, &o, ret, err, err_cap, NULL, 0);
}

/* --- shared roots -------------------------------------------------------*/

static void root_paths(gn_store *s, const char *name, char path[4096], char stamp[4096]) {
  snprintf(path, 4096, "%s/roots/%s", s->dir, name);
  snprintf(stamp, 4096, "%s/roots/%s.stamp", s->dir, name);
}

int gn_store_rootfs(gn_store *s, const gn_image *img, const gn_unpack_opts *opts, char ret_path[4096], char *err,
                    size_t err_cap) {
  char name[96], path[4096], stamp[4096], tmp[4096], a[32];
  pinset pins = {0};
  root_ent *e;
  int r = 0;
  if (!s || !img || !ret_path || !gn__digest_valid(img->manifest_digest))
    return GN_EINVAL;
  const volatile int *cancel = opts ? opts->cancel : NULL;
  snprintf(name, sizeof(name), "%s-%u", img->manifest_digest + 7, opts ? opts->uid_base : 0u);
  root_paths(s, name, path, stamp);

  pthread_mutex_lock(&s->mu);
  while ((e = root_find(s, name)) != NULL && e->busy) {
    /* Another job is unpacking this root: wait for it, cancellably. */
    if (cancel && *cancel) {
      pthread_mutex_unlock(&s->mu);
      return gn__err(err, err_cap, GN_ECANCELED, "canceled while image %s was being unpacked",
                     gn__digest_short(img->manifest_digest, a));
    }
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_nsec += 100 * 1000 * 1000;
    if (ts.tv_nsec >= 1000000000L) {
      ts.tv_sec++;
      ts.tv_nsec -= 1000000000L;
    }
    pthread_cond_timedwait(&s->cond, &s->mu, &ts);
  }
  struct stat st;
  if (!e && lstat(stamp, &st) == 0 && lstat(path, &st) == 0 && S_ISDIR(st.st_mode)) {
    /* Unpacked by an earlier run of the daemon. */
    if ((e = calloc(1, sizeof(*e))) == NULL) {
      pthread_mutex_unlock(&s->mu);
      return GN_ENOMEM;
    }
    snprintf(e->name, sizeof(e->name), "%s", name);
    e->next = s->roots;
    s->roots = e;
  }
  if (e) {
    e->refs++;
    pthread_mutex_unlock(&s->mu);
    touch(stamp);
    snprintf(ret_path, 4096, "%s", path);
    return 0;
  }
  if ((e = calloc(1, sizeof(*e))) == NULL) {
    pthread_mutex_unlock(&s->mu);
    return GN_ENOMEM;
  }
  snprintf(e->name, sizeof(e->name), "%s", name);
  e->busy = true;
  e->next = s->roots;
  s->roots = e;
  /* A root without its stamp is a leftover of a crash between the rename
   * and the stamp: not trusted, removed. */
  char gone[4096];
  char rel[128];
  snprintf(rel, sizeof(rel), "roots/%s", name);
  bool stale = lstat(path, &st) == 0 && retire(s, rel, gone) == 0;
  pthread_mutex_unlock(&s->mu);
  if (stale)
    rm_tree(gone);

  for (size_t i = 0; i < img->layer_count && r == 0; i++)
    if (gn__digest_valid(img->layers[i]))
      r = pinset_add(s, &pins, img->layers[i]);
  snprintf(tmp, sizeof(tmp), "%s/tmp/root-%.16s-%08x%08x", s->dir, name, randombytes_random(), randombytes_random());
  if (r == 0)
    r = gn_store_unpack_ex(s, img, tmp, opts, err, err_cap);
  if (r == 0) {
    uint64_t bytes = tree_size(tmp);
    if (rename(tmp, path) < 0) {
      r = gn__err(err, err_cap, -errno, "cannot keep the root of image %s: %s",
                  gn__digest_short(img->manifest_digest, a), strerror(errno));
      rm_tree(tmp);
    } else if ((r = stamp_write(s, stamp, bytes)) < 0) {
      gn__err(err, err_cap, r, "cannot keep the root of image %s: %s", gn__digest_short(img->manifest_digest, a),
              gn_strerror(r));
      pthread_mutex_lock(&s->mu);
      stale = retire(s, rel, gone) == 0;
      pthread_mutex_unlock(&s->mu);
      if (stale)
        rm_tree(gone);
    }
  }
  pthread_mutex_lock(&s->mu);
  e->busy = false;
  if (r < 0)
    root_remove(s, e); /* waiters find no entry and try themselves */
  else
    e->refs = 1;
  pthread_cond_broadcast(&s->cond);
  pthread_mutex_unlock(&s->mu);
  pinset_done(s, &pins);
  if (r < 0)
    return r;
  /* The new root counts against the budget: collect older unused ones. */
  gn_store_gc(s, NULL);
  snprintf(ret_path, 4096, "%s", path);
  return 0;
}

void gn_store_rootfs_release(gn_store *s, const char *path) {
  char stamp[4096];
  if (!s || !path)
    return;
  const char *base = strrchr(path, '/');
  base = base ? base + 1 : path;
  pthread_mutex_lock(&s->mu);
  root_ent *e = root_find(s, base);
  if (e && e->refs > 0)
    e->refs--;
  pthread_mutex_unlock(&s->mu);
  if (e) {
    snprintf(stamp, sizeof(stamp), "%s/roots/%s.stamp", s->dir, base);
    touch(stamp); /* last use: gc collects the least recently used first */
  }
}
