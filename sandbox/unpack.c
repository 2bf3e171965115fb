/* Unpacks an image's layers into a fresh rootfs with libarchive's reader and
 * our own dirfd-relative writer: compression detected (gzip, zstd, bzip2, xz,
 * plain tar), OCI whiteouts and opaque directories applied, every entry
 * checked so nothing lands outside the root, and the store's limits on
 * uncompressed bytes, entries and free space enforced while writing.
 *
 * Each layer is read, decompressed and hashed once. Whiteouts are applied as
 * they are met, to what the layers below left only: the entries this layer
 * created are remembered (keyed hashes of their paths) and spared, so a
 * whiteout or an opaque marker may come before or after this layer's own
 * entries. The layer's sha256 is checked when its last byte has been read.
 * The store verified every blob when it arrived, so this check only catches
 * later damage or tampering; it stays because it costs one OpenSSL pass over
 * the compressed bytes (well under the cost of inflating them), roots are
 * unpacked once per image and then shared, and a mismatch removes the whole
 * rootfs, so a damaged layer never runs. A layer that fails the check has
 * been written only inside the root, under every check below.
 *
 * What is kept from the archive: names, types, permission bits, symlinks as
 * symlinks, hardlinks inside the root, modification times, and owners. With
 * a user namespace (opts->id_count > 0) an owner u in the layer becomes
 * uid_base + u on the host (u >= id_count is refused), and setuid/setgid
 * bits are kept, since they then only ever name the job's own ids. Without
 * one, owners are kept as they are when unpacking as root (the job's root
 * is the host's root then) and setuid/setgid bits are dropped: a setuid-root
 * file on the host's disk is a gift to any local user. Not kept: extended
 * attributes and ACLs (security.capability would hand out file
 * capabilities), device nodes (refused), FIFOs and sockets (skipped: a job
 * can make its own in /tmp). */
#include "sandbox_int.h"

#include <archive.h>
#include <archive_entry.h>
#include <dirent.h>
#include <fcntl.h>
#include <limits.h>
#include <sodium.h>
#include <sys/stat.h>
#include <linux/openat2.h>
#include <sys/statvfs.h>
#include <sys/syscall.h>
#include <unistd.h>

#define WHITEOUTS_MAX 100000u       /* per layer */
#define PATH_DEPTH_MAX 256          /* components in an entry name */
#define RM_DEPTH_MAX 1024           /* deeper than any name we create */
#define FIXUP_BYTES_MAX (64u << 20) /* memory for one layer's directory fixups */
#define SPACE_CHECK_BYTES (64ull << 20)
#define READ_BUF_BYTES (256u * 1024u)
#define WH_PREFIX ".wh."
#define WH_OPAQUE ".wh..wh..opq"

/* A set of 64-bit keyed path hashes: the paths one layer created. A
 * collision can only spare a lower entry from a whiteout, which the image's
 * author could do anyway by leaving the whiteout out; the key is random so
 * nobody can aim for one. */
typedef struct hset {
  uint64_t *slots; /* 0 is empty */
  size_t n, cap;   /* cap a power of two */
} hset;

static void hset_done(hset *s) {
  free(s->slots);
  memset(s, 0, sizeof(*s));
}

static void hset_clear(hset *s) {
  if (s->slots)
    memset(s->slots, 0, s->cap * sizeof(uint64_t));
  s->n = 0;
}

static bool hset_has(const hset *s, uint64_t h) {
  if (!s->n)
    return false;
  h = h ? h : 1;
  for (size_t i = h & (s->cap - 1);; i = (i + 1) & (s->cap - 1)) {
    if (s->slots[i] == h)
      return true;
    if (!s->slots[i])
      return false;
  }
}

static int hset_add(hset *s, uint64_t h) {
  h = h ? h : 1;
  if ((s->n + 1) * 2 > s->cap) {
    size_t cap = s->cap ? s->cap * 2 : 1024;
    uint64_t *slots = calloc(cap, sizeof(uint64_t));
    if (!slots)
      return GN_ENOMEM;
    for (size_t i = 0; i < s->cap; i++) {
      uint64_t v = s->slots[i];
      if (!v)
        continue;
      size_t j = v & (cap - 1);
      while (slots[j])
        j = (j + 1) & (cap - 1);
      slots[j] = v;
    }
    free(s->slots);
    s->slots = slots;
    s->cap = cap;
  }
  size_t i = h & (s->cap - 1);
  while (s->slots[i] && s->slots[i] != h)
    i = (i + 1) & (s->cap - 1);
  if (!s->slots[i]) {
    s->slots[i] = h;
    s->n++;
  }
  return 0;
}

/* A directory's mode and times, applied when its layer is done: creating
 * entries inside it would change its mtime, and a read-only mode would stop
 * an unprivileged unpack from filling it. */
typedef struct fixup {
  char *path;
  size_t seq;
  mode_t mode;
  struct timespec times[2];
} fixup;

typedef struct unpack_ctx {
  int rootfd;
  char root[PATH_MAX];
  const char *layer; /* short digest, for messages */
  char *err;
  size_t err_cap;
  const volatile int *cancel;
  /* ownership */
  bool shift;    /* ids shifted into the job's user namespace */
  bool keep_ids; /* no shift, unpacking as root: the layer's ids as they are */
  uint32_t uid_base, gid_base, id_count;
  /* limits, defaults resolved */
  uint64_t layer_max_bytes, image_max_bytes, layer_max_entries, image_max_entries, reserve_bytes;
  uint64_t layer_bytes, image_bytes, layer_entries, image_entries, unchecked_bytes;
  /* the parent directory of the last entry, open */
  char pcache[PATH_MAX];
  int pcache_fd;
  uint64_t pcache_hash;
  /* this layer's paths and directory fixups */
  hset created;
  uint8_t hkey[crypto_shorthash_KEYBYTES];
  fixup *fix;
  size_t nfix, capfix, fix_bytes;
  size_t whiteouts;
} unpack_ctx;

static bool canceled(const unpack_ctx *c) {
  return c->cancel && *c->cancel;
}

static int err_canceled(unpack_ctx *c) {
  return gn__err(c->err, c->err_cap, GN_ECANCELED, "unpacking layer %s was canceled", c->layer);
}

/* An entry name as messages show it: control bytes become '?' (a name must
 * not forge lines in the provider's log), and at most about 160 bytes. */
static const char *shown(const char *in, char out[200]) {
  size_t n = 0;
  for (; in && *in && n < 160; in++)
    out[n++] = (unsigned char)*in < 0x20 || *in == 0x7f ? '?' : *in;
  if (in && *in)
    memcpy(out + n, "...", 4);
  else
    out[n] = '\0';
  return out;
}

static const char *fmt_size(uint64_t n, char buf[32]) {
  if (n && n % (1ull << 30) == 0)
    snprintf(buf, 32, "%llu GiB", (unsigned long long)(n >> 30));
  else if (n && n % (1ull << 20) == 0)
    snprintf(buf, 32, "%llu MiB", (unsigned long long)(n >> 20));
  else
    snprintf(buf, 32, "%llu bytes", (unsigned long long)n);
  return buf;
}

/* Refuses before the next bytes could cut into the store's reserve of free
 * space (the ledger's room). */
static int space_check(unpack_ctx *c, uint64_t upcoming) {
  struct statvfs sv;
  char a[32];
  if (fstatvfs(c->rootfd, &sv) < 0)
    return gn__err(c->err, c->err_cap, -errno, "cannot check free space for %s: %s", c->root, strerror(errno));
  uint64_t avail = (uint64_t)sv.f_bavail * (uint64_t)sv.f_frsize;
  c->unchecked_bytes = 0;
  if (avail < c->reserve_bytes || avail - c->reserve_bytes < upcoming)
    return gn__err(c->err, c->err_cap, GN_ENOSPACE,
                   "layer %s: not enough free space to unpack it without cutting into the %s the store keeps free; "
                   "refusing",
                   c->layer, fmt_size(c->reserve_bytes, a));
  return 0;
}

/* Counts n more uncompressed bytes against the layer and the image, and
 * checks free space every SPACE_CHECK_BYTES, before they are written. */
static int charge_bytes(unpack_ctx *c, uint64_t n) {
  char a[32];
  if (n > c->layer_max_bytes - c->layer_bytes)
    return gn__err(c->err, c->err_cap, GN_ETOOBIG, "layer %s unpacks to more than %s; refusing", c->layer,
                   fmt_size(c->layer_max_bytes, a));
  if (n > c->image_max_bytes - c->image_bytes)
    return gn__err(c->err, c->err_cap, GN_ETOOBIG, "the image unpacks to more than %s (at layer %s); refusing",
                   fmt_size(c->image_max_bytes, a), c->layer);
  c->layer_bytes += n;
  c->image_bytes += n;
  c->unchecked_bytes += n;
  if (c->unchecked_bytes >= SPACE_CHECK_BYTES)
    return space_check(c, c->unchecked_bytes);
  return 0;
}

static int charge_entry(unpack_ctx *c) {
  if (++c->layer_entries > c->layer_max_entries)
    return gn__err(c->err, c->err_cap, GN_ETOOBIG, "layer %s has more than %llu entries; refusing", c->layer,
                   (unsigned long long)c->layer_max_entries);
  if (++c->image_entries > c->image_max_entries)
    return gn__err(c->err, c->err_cap, GN_ETOOBIG, "the image has more than %llu entries (at layer %s); refusing",
                   (unsigned long long)c->image_max_entries, c->layer);
  return 0;
}

/* The keyed hash of parent path h joined with one more component. The
 * root's hash is 0. */
static uint64_t path_mix(const unpack_ctx *c, uint64_t h, const char *comp, size_t len) {
  uint8_t buf[8 + PATH_MAX], out[crypto_shorthash_BYTES];
  uint64_t r;
  if (len > PATH_MAX)
    len = PATH_MAX;
  memcpy(buf, &h, 8);
  memcpy(buf + 8, comp, len);
  crypto_shorthash(out, buf, 8 + len, c->hkey);
  memcpy(&r, out, 8);
  return r;
}

static uint64_t path_hash(const unpack_ctx *c, const char *path) {
  uint64_t h = 0;
  while (*path) {
    const char *slash = strchr(path, '/');
    size_t len = slash ? (size_t)(slash - path) : strlen(path);
    h = path_mix(c, h, path, len);
    if (!slash)
      break;
    path = slash + 1;
  }
  return h;
}

/* Removes name under dirfd, recursively, never following a symlink.
 * GN_ECANCELED once *cancel is set (cancel may be NULL). */
static int rm_rf_at(int dirfd, const char *name, int depth, const volatile int *cancel) {
  struct stat st;
  if (cancel && *cancel)
    return GN_ECANCELED;
  if (depth > RM_DEPTH_MAX)
    return GN_ETOOBIG;
  if (fstatat(dirfd, name, &st, AT_SYMLINK_NOFOLLOW) < 0)
    return errno == ENOENT ? 0 : -errno;
  if (!S_ISDIR(st.st_mode))
    return unlinkat(dirfd, name, 0) < 0 && errno != ENOENT ? -errno : 0;
  /* A layer's read-only directory (0555, 0000) cannot be read or emptied by
   * an unprivileged unpack until it is the owner's again; we own it. */
  if ((st.st_mode & 0700) != 0700)
    fchmodat(dirfd, name, (st.st_mode & 07777) | 0700, AT_SYMLINK_NOFOLLOW);
  int fd = openat(dirfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0)
    return -errno;
  DIR *d = fdopendir(fd);
  if (!d) {
    close(fd);
    return -errno;
  }
  int r = 0;
  struct dirent *e;
  while (r == 0 && (e = readdir(d))) {
    if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
      continue;
    r = rm_rf_at(fd, e->d_name, depth + 1, cancel);
  }
  closedir(d);
  if (r == 0 && unlinkat(dirfd, name, AT_REMOVEDIR) < 0 && errno != ENOENT)
    r = -errno;
  return r;
}

static int remove_lower(unpack_ctx *c, int dirfd, const char *name, uint64_t hparent, int depth);

/* Removes what the layers below left in the directory fd (hash h), sparing
 * what this layer created. */
static int remove_lower_children(unpack_ctx *c, int fd, uint64_t h, int depth) {
  int dup_fd = dup(fd);
  if (dup_fd < 0)
    return -errno;
  DIR *d = fdopendir(dup_fd);
  if (!d) {
    close(dup_fd);
    return -errno;
  }
  int r = 0;
  struct dirent *e;
  while (r == 0 && (e = readdir(d))) {
    if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
      continue;
    r = remove_lower(c, fd, e->d_name, h, depth + 1);
  }
  closedir(d);
  return r;
}

/* A whiteout: removes name under dirfd and everything beneath it that the
 * layers below left, never following a symlink. A directory holding some of
 * this layer's entries stays, with just those. */
static int remove_lower(unpack_ctx *c, int dirfd, const char *name, uint64_t hparent, int depth) {
  struct stat st;
  if (canceled(c))
    return GN_ECANCELED;
  if (depth > RM_DEPTH_MAX)
    return GN_ETOOBIG;
  uint64_t h = path_mix(c, hparent, name, strlen(name));
  bool mine = hset_has(&c->created, h);
  if (fstatat(dirfd, name, &st, AT_SYMLINK_NOFOLLOW) < 0)
    return errno == ENOENT ? 0 : -errno;
  if (!S_ISDIR(st.st_mode)) {
    if (mine)
      return 0;
    return unlinkat(dirfd, name, 0) < 0 && errno != ENOENT ? -errno : 0;
  }
  if (!mine && c->created.n == 0)
    return rm_rf_at(dirfd, name, depth, c->cancel); /* nothing of ours anywhere yet */
  int fd = openat(dirfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0)
    return -errno;
  int r = remove_lower_children(c, fd, h, depth);
  close(fd);
  if (r == 0 && !mine && unlinkat(dirfd, name, AT_REMOVEDIR) < 0 && errno != ENOENT && errno != ENOTEMPTY &&
      errno != EEXIST)
    r = -errno;
  return r;
}

/* Cleans an entry name into "a/b/c": drops "./" and empty components,
 * refuses absolute names (but "/" itself) and "..". Returns 0, GN_EPERM, or
 * GN_ETOOBIG for a name too long or too deep. An empty result is the root
 * itself. */
static int clean_path(const char *in, char *out, size_t cap) {
  if (!in)
    return GN_EPERM;
  if (in[0] == '/') {
    /* "/" alone is the root directory itself (umoci writes such an entry);
     * any other absolute name is refused. */
    if (in[strspn(in, "/")] != '\0')
      return GN_EPERM;
    out[0] = '\0';
    return 0;
  }
  size_t n = 0, depth = 0;
  const char *p = in;
  while (*p) {
    const char *slash = strchr(p, '/');
    size_t len = slash ? (size_t)(slash - p) : strlen(p);
    if (len == 2 && p[0] == '.' && p[1] == '.')
      return GN_EPERM;
    if (len > 0 && !(len == 1 && p[0] == '.')) {
      if (n + len + 2 > cap || ++depth > PATH_DEPTH_MAX)
        return GN_ETOOBIG;
      if (n)
        out[n++] = '/';
      memcpy(out + n, p, len);
      n += len;
    }
    if (!slash)
      break;
    p = slash + 1;
  }
  out[n] = '\0';
  return 0;
}

/* Opens the directory holding the last component of path (relative to the
 * root) without following any symlink on the way. Returns the fd, -ENOENT
 * when some parent does not exist yet, or GN_EPERM when one is a symlink
 * (ret_bad then names it). */
static int open_parent(int rootfd, const char *path, const char **ret_last, char *ret_bad, size_t bad_cap) {
  char buf[PATH_MAX];
  snprintf(buf, sizeof(buf), "%s", path);
  int fd = dup(rootfd);
  if (fd < 0)
    return -errno;
  char *p = buf;
  for (;;) {
    char *slash = strchr(p, '/');
    if (!slash)
      break;
    *slash = '\0';
    struct stat st;
    if (fstatat(fd, p, &st, AT_SYMLINK_NOFOLLOW) < 0) {
      int e = -errno;
      close(fd);
      return e;
    }
    if (S_ISLNK(st.st_mode)) {
      close(fd);
      snprintf(ret_bad, bad_cap, "%.*s", (int)(slash - buf), buf);
      return GN_EPERM;
    }
    int next = openat(fd, p, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    int e = -errno;
    close(fd);
    if (next < 0)
      return e;
    fd = next;
    *slash = '/';
    p = slash + 1;
  }
  *ret_last = path + (p - buf);
  return fd;
}

/* Gives a created entry its owner: shifted into the job's ids, the layer's
 * own as root without a shift, else left to the unpacking user. fd >= 0:
 * the entry itself; else name under dfd (a symlink is not followed). */
static int set_owner(unpack_ctx *c, int fd, int dfd, const char *name, uint32_t uid, uint32_t gid) {
  if (c->shift) {
    uid += c->uid_base;
    gid += c->gid_base;
  } else if (!c->keep_ids) {
    return 0;
  }
  int r = fd >= 0 ? fchown(fd, uid, gid) : fchownat(dfd, name, uid, gid, AT_SYMLINK_NOFOLLOW);
  return r < 0 ? -errno : 0;
}

static void pcache_drop(unpack_ctx *c) {
  if (c->pcache_fd >= 0)
    close(c->pcache_fd);
  c->pcache_fd = -1;
  c->pcache[0] = '\0';
}

/* Opens directory dir (relative to the root, "" for the root) for creating
 * an entry in it, creating missing directories (owned by the job's root,
 * mode 0755, counted as entries) and refusing to pass through a symlink or
 * a non-directory. The fd is borrowed: it stays cached for the next entry. */
static int parent_for(unpack_ctx *c, const char *dir, const char *entry_name, int *ret_fd, uint64_t *ret_h) {
  char buf[PATH_MAX], show[200];
  int r;
  if (c->pcache_fd >= 0 && strcmp(c->pcache, dir) == 0) {
    *ret_fd = c->pcache_fd;
    *ret_h = c->pcache_hash;
    return 0;
  }
  pcache_drop(c);
  /* Fast path: one openat2 resolving the whole directory beneath the root
   * with no symlinks (Linux 5.6+). Anything it refuses (a missing
   * directory, a symlink on the way, an older kernel) takes the walk below,
   * which creates, or names what is wrong. */
  if (dir[0]) {
    struct open_how how = {.flags = O_RDONLY | O_DIRECTORY | O_CLOEXEC,
                           .resolve = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS};
    long fast = syscall(SYS_openat2, c->rootfd, dir, &how, sizeof(how));
    if (fast >= 0) {
      snprintf(c->pcache, sizeof(c->pcache), "%s", dir);
      c->pcache_fd = (int)fast;
      c->pcache_hash = path_hash(c, dir);
      *ret_fd = c->pcache_fd;
      *ret_h = c->pcache_hash;
      return 0;
    }
  }
  snprintf(buf, sizeof(buf), "%s", dir);
  int fd = dup(c->rootfd);
  if (fd < 0)
    return -errno;
  uint64_t h = 0;
  char *p = buf;
  while (*p) {
    char *slash = strchr(p, '/');
    if (slash)
      *slash = '\0';
    h = path_mix(c, h, p, strlen(p));
    struct stat st;
    if (fstatat(fd, p, &st, AT_SYMLINK_NOFOLLOW) < 0) {
      if (errno != ENOENT) {
        r = -errno;
        goto fail;
      }
      if ((r = charge_entry(c)) < 0)
        goto fail;
      if (mkdirat(fd, p, 0755) < 0) {
        r = gn__err(c->err, c->err_cap, -errno, "layer %s: cannot create the directory \"%s\" for \"%s\": %s", c->layer,
                    buf, entry_name, strerror(errno));
        goto fail;
      }
      if ((r = set_owner(c, -1, fd, p, 0, 0)) < 0 || (r = hset_add(&c->created, h)) < 0)
        goto fail;
    } else if (S_ISLNK(st.st_mode)) {
      r = gn__err(c->err, c->err_cap, GN_EPERM,
                  "layer %s: entry \"%s\" would be written through the symlink \"%s\"; refusing the image", c->layer,
                  entry_name, shown(buf, show));
      goto fail;
    } else if (!S_ISDIR(st.st_mode)) {
      r = gn__err(c->err, c->err_cap, GN_EPERM,
                  "layer %s: entry \"%s\" would be written under \"%s\", which is not a directory; refusing the image",
                  c->layer, entry_name, shown(buf, show));
      goto fail;
    }
    int next = openat(fd, p, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    r = -errno;
    close(fd);
    fd = -1;
    if (next < 0)
      goto fail;
    fd = next;
    if (!slash)
      break;
    *slash = '/';
    p = slash + 1;
  }
  snprintf(c->pcache, sizeof(c->pcache), "%s", dir);
  c->pcache_fd = fd;
  c->pcache_hash = h;
  *ret_fd = fd;
  *ret_h = h;
  return 0;
fail:
  if (fd >= 0)
    close(fd);
  return r;
}

/* Reads a layer blob through sha256 so the digest covers every byte. */
typedef struct layer_reader {
  int fd;
  gn__sha256 sha;
  uint64_t total;
  uint8_t buf[READ_BUF_BYTES];
} layer_reader;

static la_ssize_t lr_read(struct archive *a, void *ud, const void **buff) {
  layer_reader *lr = ud;
  for (;;) {
    ssize_t n = read(lr->fd, lr->buf, sizeof(lr->buf));
    if (n < 0 && errno == EINTR)
      continue;
    if (n < 0) {
      archive_set_error(a, errno, "read failed");
      return -1;
    }
    gn__sha256_update(&lr->sha, lr->buf, (size_t)n);
    lr->total += (uint64_t)n;
    *buff = lr->buf;
    return n;
  }
}

static int layer_open(const char *path, layer_reader *lr, struct archive **ret) {
  int r;
  lr->fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (lr->fd < 0)
    return errno == ENOENT ? GN_ENOTFOUND : -errno;
  if ((r = gn__sha256_init(&lr->sha)) < 0)
    return r;
  lr->total = 0;
  struct archive *a = archive_read_new();
  if (!a)
    return GN_ENOMEM;
  /* Tar only (OCI layers are tar), with the compressions image tools write.
   * Not filter_all: it includes filters that run external programs (lrzip,
   * lzop, grzip) on the layer's bytes. "raw" is not enabled, so a non-tar
   * blob is an error. */
  archive_read_support_filter_gzip(a);
  archive_read_support_filter_zstd(a);
  archive_read_support_filter_bzip2(a);
  archive_read_support_filter_xz(a);
  archive_read_support_format_tar(a);
  archive_read_support_format_gnutar(a);
  if (archive_read_open(a, lr, NULL, lr_read, NULL) != ARCHIVE_OK) {
    archive_read_free(a);
    return GN_EINVAL;
  }
  *ret = a;
  return 0;
}

/* Reads what libarchive left after the end-of-archive marker, so the hash
 * covers the whole blob. */
static int lr_drain(unpack_ctx *c, layer_reader *lr) {
  for (;;) {
    if (canceled(c))
      return GN_ECANCELED;
    ssize_t n = read(lr->fd, lr->buf, sizeof(lr->buf));
    if (n < 0 && errno == EINTR)
      continue;
    if (n < 0)
      return -errno;
    if (n == 0)
      return 0;
    gn__sha256_update(&lr->sha, lr->buf, (size_t)n);
    lr->total += (uint64_t)n;
  }
}

static const char *base_name(const char *p) {
  const char *s = strrchr(p, '/');
  return s ? s + 1 : p;
}

static int write_all_at(int fd, const uint8_t *p, size_t n, uint64_t off) {
  while (n) {
    ssize_t w = pwrite(fd, p, n, (off_t)off);
    if (w < 0) {
      if (errno == EINTR)
        continue;
      return errno == ENOSPC || errno == EDQUOT ? GN_ENOSPACE : -errno;
    }
    p += w;
    n -= (size_t)w;
    off += (uint64_t)w;
  }
  return 0;
}

/* Reads the entry's data, into fd when fd >= 0 (holes stay holes), and
 * counts it: the declared size was charged at the header, anything past it
 * is charged as it comes. ret_end: the end of the last block. */
static int entry_data(unpack_ctx *c, struct archive *a, int fd, const char *name, uint64_t charged, uint64_t *ret_end) {
  const void *buf;
  size_t size;
  la_int64_t off;
  uint64_t end = 0;
  int r;
  for (;;) {
    if (canceled(c))
      return err_canceled(c);
    int ar = archive_read_data_block(a, &buf, &size, &off);
    if (ar == ARCHIVE_EOF)
      break;
    if (ar != ARCHIVE_OK && ar != ARCHIVE_WARN)
      return gn__err(c->err, c->err_cap, GN_EINVAL, "layer %s: truncated or corrupt at \"%s\": %s", c->layer, name,
                     archive_error_string(a));
    if (off < 0 || (uint64_t)off > UINT64_MAX - size)
      return gn__err(c->err, c->err_cap, GN_EINVAL, "layer %s: bad data offset in \"%s\"", c->layer, name);
    uint64_t blk_end = (uint64_t)off + size;
    if (blk_end > charged) {
      if ((r = charge_bytes(c, blk_end - charged)) < 0)
        return r;
      charged = blk_end;
    }
    if (fd >= 0 && size && (r = write_all_at(fd, buf, size, (uint64_t)off)) < 0)
      return gn__err(c->err, c->err_cap, r, "layer %s: cannot write \"%s\": %s", c->layer, name,
                     r == GN_ENOSPACE ? "the disk is full" : gn_strerror(r));
    if (blk_end > end)
      end = blk_end;
  }
  *ret_end = end;
  return 0;
}

static int fixup_add(unpack_ctx *c, const char *path, mode_t mode, const struct timespec times[2]) {
  size_t len = strlen(path) + 1;
  if (c->fix_bytes + len + sizeof(fixup) > FIXUP_BYTES_MAX)
    return gn__err(c->err, c->err_cap, GN_ETOOBIG, "layer %s: too many directories; refusing", c->layer);
  if (c->nfix == c->capfix) {
    size_t cap = c->capfix ? c->capfix * 2 : 64;
    fixup *f = realloc(c->fix, cap * sizeof(*f));
    if (!f)
      return GN_ENOMEM;
    c->fix = f;
    c->capfix = cap;
  }
  fixup *f = &c->fix[c->nfix];
  if (!(f->path = strdup(path)))
    return GN_ENOMEM;
  f->seq = c->nfix;
  f->mode = mode;
  f->times[0] = times[0];
  f->times[1] = times[1];
  c->nfix++;
  c->fix_bytes += len + sizeof(fixup);
  return 0;
}

static void fixups_done(unpack_ctx *c) {
  for (size_t i = 0; i < c->nfix; i++)
    free(c->fix[i].path);
  c->nfix = 0;
  c->fix_bytes = 0;
}

/* Deepest (and, for one path, latest) first: a parent's prefix sorts before
 * its children, so descending order visits children first. */
static int fixup_cmp(const void *a, const void *b) {
  const fixup *x = a, *y = b;
  int r = strcmp(y->path, x->path);
  if (r)
    return r;
  return x->seq < y->seq ? 1 : x->seq > y->seq ? -1 : 0;
}

static int fixups_apply(unpack_ctx *c) {
  char bad[PATH_MAX];
  if (c->nfix)
    qsort(c->fix, c->nfix, sizeof(*c->fix), fixup_cmp);
  for (size_t i = 0; i < c->nfix; i++) {
    const fixup *f = &c->fix[i];
    if (i && strcmp(f->path, c->fix[i - 1].path) == 0)
      continue; /* an earlier entry for the same directory */
    if (canceled(c))
      return err_canceled(c);
    const char *last = NULL;
    int dfd = open_parent(c->rootfd, f->path, &last, bad, sizeof(bad));
    if (dfd < 0)
      continue; /* gone, or no longer reached without a symlink */
    int fd = openat(dfd, last, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    close(dfd);
    if (fd < 0)
      continue; /* replaced by something that is not a directory */
    int r = fchmod(fd, f->mode) < 0 || futimens(fd, f->times) < 0 ? -errno : 0;
    close(fd);
    if (r < 0)
      return gn__err(c->err, c->err_cap, r, "layer %s: cannot set the mode of \"%s\": %s", c->layer, f->path,
                     gn_strerror(r));
  }
  fixups_done(c);
  return 0;
}

/* A whiteout entry: removes what the layers below left at its target (or,
 * for an opaque marker, in its directory). A whiteout under a missing or
 * symlinked directory deletes nothing: overlay filesystems record whiteouts
 * at real paths, so such an entry cannot name a lower file. */
static int do_whiteout(unpack_ctx *c, const char *clean, const char *name) {
  const char *base = base_name(clean);
  const char *target = base + strlen(WH_PREFIX);
  const char *last = NULL;
  char bad[PATH_MAX];
  int r;
  if (strcmp(base, WH_OPAQUE) != 0 && (!target[0] || strcmp(target, ".") == 0 || strcmp(target, "..") == 0))
    return gn__err(c->err, c->err_cap, GN_EPERM, "layer %s: malformed whiteout \"%s\"", c->layer, name);
  if (++c->whiteouts > WHITEOUTS_MAX)
    return gn__err(c->err, c->err_cap, GN_ETOOBIG, "layer %s: more than %u whiteouts; refusing", c->layer,
                   WHITEOUTS_MAX);
  /* The directory's hash, for sparing this layer's own entries. */
  uint64_t hdir = 0;
  if (base != clean) {
    char dir[PATH_MAX];
    snprintf(dir, sizeof(dir), "%.*s", (int)(base - clean - 1), clean);
    hdir = path_hash(c, dir);
  }
  int dfd = open_parent(c->rootfd, clean, &last, bad, sizeof(bad));
  if (dfd == -ENOENT || dfd == GN_EPERM || dfd == -ENOTDIR)
    return 0;
  if (dfd < 0)
    return gn__err(c->err, c->err_cap, dfd, "layer %s: whiteout \"%s\": %s", c->layer, name, gn_strerror(dfd));
  pcache_drop(c); /* the cached directory may be among what goes */
  if (strcmp(base, WH_OPAQUE) == 0)
    r = remove_lower_children(c, dfd, hdir, 0);
  else
    r = remove_lower(c, dfd, target, hdir, 0);
  close(dfd);
  if (r == GN_ECANCELED)
    return err_canceled(c);
  if (r < 0)
    return gn__err(c->err, c->err_cap, r, "layer %s: whiteout \"%s\": %s", c->layer, name, gn_strerror(r));
  return 0;
}

/* Creates one entry (not the root, not a whiteout) and reads its data. */
static int extract_entry(unpack_ctx *c, struct archive *a, struct archive_entry *e, const char *name,
                         const char *clean) {
  mode_t type = archive_entry_filetype(e);
  const char *link = archive_entry_hardlink(e);
  const char *last = base_name(clean);
  char dir[PATH_MAX], target[PATH_MAX], bad[PATH_MAX], show[200];
  int dfd = -1, fd = -1, r;
  uint64_t hdir = 0, end = 0;
  la_int64_t size = archive_entry_size(e);
  la_int64_t uid = archive_entry_uid(e), gid = archive_entry_gid(e);
  uint64_t charged = size > 0 ? (uint64_t)size : 0;

  if (type == AE_IFCHR || type == AE_IFBLK)
    return gn__err(c->err, c->err_cap, GN_EPERM, "layer %s: entry \"%s\" is a device node; refusing the image",
                   c->layer, name);
  if (!link && type != AE_IFREG && type != AE_IFDIR && type != AE_IFLNK)
    return entry_data(c, a, -1, name, charged, &end); /* FIFOs and sockets: skipped */
  if (c->shift && (uid < 0 || gid < 0 || uid >= c->id_count || gid >= c->id_count))
    return gn__err(c->err, c->err_cap, GN_EPERM,
                   "layer %s: entry \"%s\" is owned by %lld:%lld, outside the %u ids of the job's user namespace; "
                   "refusing the image",
                   c->layer, name, (long long)uid, (long long)gid, c->id_count);
  if (!c->shift && (uid < 0 || gid < 0 || uid >= UINT32_MAX || gid >= UINT32_MAX))
    return gn__err(c->err, c->err_cap, GN_EPERM, "layer %s: entry \"%s\" has a bad owner %lld:%lld", c->layer, name,
                   (long long)uid, (long long)gid);
  mode_t perm = (mode_t)archive_entry_perm(e) & (c->shift ? 07777 : 01777);
  struct timespec times[2] = {{archive_entry_mtime(e), archive_entry_mtime_nsec(e)},
                              {archive_entry_mtime(e), archive_entry_mtime_nsec(e)}};
  if (archive_entry_atime_is_set(e))
    times[0] = (struct timespec){archive_entry_atime(e), archive_entry_atime_nsec(e)};
  if (times[1].tv_nsec < 0 || times[1].tv_nsec > 999999999 || times[0].tv_nsec < 0 || times[0].tv_nsec > 999999999)
    times[0].tv_nsec = times[1].tv_nsec = 0;

  snprintf(dir, sizeof(dir), "%.*s", last == clean ? 0 : (int)(last - clean - 1), clean);
  if ((r = parent_for(c, dir, name, &dfd, &hdir)) < 0)
    return r;
  uint64_t h = path_mix(c, hdir, last, strlen(last));

  /* Whatever is there goes, unless a directory meets a directory. */
  struct stat st;
  bool exists = fstatat(dfd, last, &st, AT_SYMLINK_NOFOLLOW) == 0;
  if (exists && !(S_ISDIR(st.st_mode) && type == AE_IFDIR && !link)) {
    if ((r = rm_rf_at(dfd, last, 0, c->cancel)) == GN_ECANCELED)
      return err_canceled(c);
    if (r < 0)
      return gn__err(c->err, c->err_cap, r, "layer %s: cannot replace \"%s\": %s", c->layer, name, gn_strerror(r));
    exists = false;
  }

  if (link) {
    /* A hardlink may only name a regular file already inside the root,
     * reached without symlinks: linking a host file in through a symlinked
     * parent is the classic escape. */
    const char *tlast = NULL;
    int tfd = -1;
    struct stat tst;
    if (clean_path(link, target, sizeof(target)) < 0 || !target[0] ||
        (tfd = open_parent(c->rootfd, target, &tlast, bad, sizeof(bad))) < 0 ||
        fstatat(tfd, tlast, &tst, AT_SYMLINK_NOFOLLOW) < 0 || !S_ISREG(tst.st_mode)) {
      if (tfd >= 0)
        close(tfd);
      return gn__err(c->err, c->err_cap, GN_EPERM,
                     "layer %s: hardlink \"%s\" -> \"%s\" does not name a file inside the root; refusing the image",
                     c->layer, name, shown(link, show));
    }
    r = linkat(tfd, tlast, dfd, last, 0) < 0 ? -errno : 0;
    close(tfd);
    if (r < 0)
      return gn__err(c->err, c->err_cap, r, "layer %s: cannot link \"%s\": %s", c->layer, name, gn_strerror(r));
    if ((r = hset_add(&c->created, h)) < 0)
      return r;
    return entry_data(c, a, -1, name, charged, &end);
  }

  if (type == AE_IFLNK) {
    const char *to = archive_entry_symlink(e);
    if (!to || !to[0])
      return gn__err(c->err, c->err_cap, GN_EINVAL, "layer %s: symlink \"%s\" has no target", c->layer, name);
    /* The target is stored, never followed here. */
    if (symlinkat(to, dfd, last) < 0)
      return gn__err(c->err, c->err_cap, -errno, "layer %s: cannot create symlink \"%s\": %s", c->layer, name,
                     strerror(errno));
    if ((r = set_owner(c, -1, dfd, last, (uint32_t)uid, (uint32_t)gid)) < 0)
      return gn__err(c->err, c->err_cap, r, "layer %s: cannot set the owner of \"%s\": %s", c->layer, name,
                     gn_strerror(r));
    utimensat(dfd, last, times, AT_SYMLINK_NOFOLLOW);
    if ((r = hset_add(&c->created, h)) < 0)
      return r;
    return entry_data(c, a, -1, name, charged, &end);
  }

  if (type == AE_IFDIR) {
    /* Owner-writable until the layer is done (fixups_apply). */
    if (!exists && mkdirat(dfd, last, 0700) < 0)
      return gn__err(c->err, c->err_cap, -errno, "layer %s: cannot create directory \"%s\": %s", c->layer, name,
                     strerror(errno));
    fd = openat(dfd, last, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0)
      return gn__err(c->err, c->err_cap, -errno, "layer %s: cannot open directory \"%s\": %s", c->layer, name,
                     strerror(errno));
    r = set_owner(c, fd, -1, NULL, (uint32_t)uid, (uint32_t)gid);
    if (r == 0 && (perm & 0700) != 0700)
      r = fchmod(fd, 0700) < 0 ? -errno : 0;
    close(fd);
    if (r < 0)
      return gn__err(c->err, c->err_cap, r, "layer %s: cannot set the owner of \"%s\": %s", c->layer, name,
                     gn_strerror(r));
    if ((r = fixup_add(c, clean, perm, times)) < 0 || (r = hset_add(&c->created, h)) < 0)
      return r;
    return entry_data(c, a, -1, name, charged, &end);
  }

  /* A regular file. O_EXCL with O_NOFOLLOW: never through a link. */
  fd = openat(dfd, last, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0)
    return gn__err(c->err, c->err_cap, -errno, "layer %s: cannot create \"%s\": %s", c->layer, name, strerror(errno));
  if ((r = hset_add(&c->created, h)) < 0)
    goto out;
  if ((r = entry_data(c, a, fd, name, charged, &end)) < 0)
    goto out;
  if (size > 0 && (uint64_t)size > end && ftruncate(fd, (off_t)size) < 0) {
    r = gn__err(c->err, c->err_cap, errno == ENOSPC ? GN_ENOSPACE : -errno, "layer %s: cannot write \"%s\": %s",
                c->layer, name, strerror(errno));
    goto out;
  }
  /* Owner first: chown clears setuid and setgid bits. */
  r = set_owner(c, fd, -1, NULL, (uint32_t)uid, (uint32_t)gid);
  if (r == 0 && fchmod(fd, perm) < 0)
    r = -errno;
  if (r == 0 && futimens(fd, times) < 0)
    r = -errno;
  if (r < 0) {
    gn__err(c->err, c->err_cap, r, "layer %s: cannot set the owner or mode of \"%s\": %s", c->layer, name,
            gn_strerror(r));
    goto out;
  }
  r = 0;
out:
  close(fd);
  return r;
}

/* One layer, one pass: checks, whiteouts, extraction and the digest. */
static int layer_unpack(unpack_ctx *c, const char *path, const char *digest) {
  layer_reader *lr = malloc(sizeof(*lr));
  struct archive *a = NULL;
  struct archive_entry *e;
  char clean[PATH_MAX], got[GN_DIGEST_STRLEN], name[200];
  int r;
  if (!lr)
    return GN_ENOMEM;
  lr->fd = -1;
  lr->sha = (gn__sha256){0};
  c->layer_bytes = c->layer_entries = 0;
  c->whiteouts = 0;
  hset_clear(&c->created);
  pcache_drop(c);
  if ((r = space_check(c, 0)) < 0)
    goto out;
  if ((r = layer_open(path, lr, &a)) < 0) {
    gn__err(c->err, c->err_cap, r, "layer %s: cannot open: %s", c->layer, gn_strerror(r));
    goto out;
  }
  for (;;) {
    if (canceled(c)) {
      r = err_canceled(c);
      goto out;
    }
    int ar = archive_read_next_header(a, &e);
    if (ar == ARCHIVE_EOF)
      break;
    if (ar != ARCHIVE_OK && ar != ARCHIVE_WARN) {
      r = gn__err(c->err, c->err_cap, GN_EINVAL, "layer %s: not a valid tar archive: %s", c->layer,
                  archive_error_string(a));
      goto out;
    }
    if ((r = charge_entry(c)) < 0)
      goto out;
    const char *raw = archive_entry_pathname(e);
    if (!raw) {
      r = gn__err(c->err, c->err_cap, GN_EINVAL, "layer %s: entry without a name", c->layer);
      goto out;
    }
    shown(raw, name); /* for messages only */
    if ((r = clean_path(raw, clean, sizeof(clean))) < 0) {
      gn__err(c->err, c->err_cap, r, "layer %s: entry \"%s\" %s; refusing the image", c->layer, name,
              r == GN_ETOOBIG ? "has a name that is too long or too deep" : "points outside the root");
      goto out;
    }
    /* The declared size is counted before a byte is read: a sparse entry
     * claiming a terabyte is refused here, whatever it would cost on disk. */
    la_int64_t size = archive_entry_size(e);
    if (size > 0 && (r = charge_bytes(c, (uint64_t)size)) < 0)
      goto out;
    uint64_t end;
    if (!clean[0]) {
      r = entry_data(c, a, -1, name, size > 0 ? (uint64_t)size : 0, &end); /* the root itself */
    } else if (strncmp(base_name(clean), WH_PREFIX, strlen(WH_PREFIX)) == 0) {
      if ((r = do_whiteout(c, clean, name)) == 0)
        r = entry_data(c, a, -1, name, size > 0 ? (uint64_t)size : 0, &end);
    } else {
      r = extract_entry(c, a, e, name, clean);
    }
    if (r < 0)
      goto out;
  }
  if ((r = fixups_apply(c)) < 0)
    goto out;
  if ((r = lr_drain(c, lr)) < 0) {
    if (r == GN_ECANCELED)
      err_canceled(c);
    goto out;
  }
  if ((r = gn__sha256_final_digest(&lr->sha, got)) < 0)
    goto out;
  if (strcmp(got, digest) != 0) {
    r = gn__err(c->err, c->err_cap, GN_EDIGEST, "layer %s does not match its digest", c->layer);
    goto out;
  }
  r = 0;
out:
  pcache_drop(c);
  fixups_done(c);
  if (a)
    archive_read_free(a);
  if (lr->fd >= 0)
    close(lr->fd);
  gn__sha256_done(&lr->sha);
  free(lr);
  return r;
}

/* Removes a half-made rootfs, never following links. */
static void remove_rootfs(const char *root, const char *rootfs) {
  if (!root[0]) {
    rmdir(rootfs);
    return;
  }
  gn_rm_tree(root);
}

int gn_rm_tree(const char *path) {
  char parent[PATH_MAX];
  if (!path || !path[0] || strlen(path) >= sizeof(parent))
    return GN_EINVAL;
  snprintf(parent, sizeof(parent), "%s", path);
  char *slash = strrchr(parent, '/');
  const char *name = parent;
  int pfd = AT_FDCWD;
  if (slash) {
    if (!slash[1])
      return GN_EINVAL;
    name = slash + 1;
    *slash = '\0';
    pfd = open(slash == parent ? "/" : parent, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (pfd < 0)
      return errno == ENOENT ? 0 : -errno;
  }
  if (strcmp(name, ".") == 0 || strcmp(name, "..") == 0) {
    if (pfd != AT_FDCWD)
      close(pfd);
    return GN_EINVAL;
  }
  int r = rm_rf_at(pfd, name, 0, NULL);
  if (pfd != AT_FDCWD)
    close(pfd);
  return r;
}

static uint64_t or_default(uint64_t v, uint64_t def) {
  return v ? v : def;
}

int gn__unpack_layer_files(const char *const *paths, const char *const *digests, size_t n, const char *rootfs,
                           const gn_store_limits *lim, const gn_unpack_opts *opts, char *err, size_t err_cap) {
  static const gn_store_limits no_limits;
  unpack_ctx c = {.rootfd = -1, .pcache_fd = -1, .err = err, .err_cap = err_cap};
  char shortd[32];
  int r;
  if (!rootfs || !rootfs[0] || (n && (!paths || !digests)))
    return GN_EINVAL;
  lim = lim ? lim : &no_limits;
  c.layer_max_bytes = or_default(lim->layer_max_bytes, GN_STORE_DEFAULT_LAYER_MAX_BYTES);
  c.image_max_bytes = or_default(lim->image_max_bytes, GN_STORE_DEFAULT_IMAGE_MAX_BYTES);
  c.layer_max_entries = or_default(lim->layer_max_entries, GN_STORE_DEFAULT_LAYER_MAX_ENTRIES);
  c.image_max_entries = or_default(lim->image_max_entries, GN_STORE_DEFAULT_IMAGE_MAX_ENTRIES);
  c.reserve_bytes = or_default(lim->reserve_bytes, GN_STORE_DEFAULT_RESERVE_BYTES);
  if (opts) {
    c.cancel = opts->cancel;
    if (opts->id_count) {
      /* The highest host id must stay below (uid_t)-1, which means "none". */
      if ((uint64_t)opts->uid_base + opts->id_count > UINT32_MAX ||
          (uint64_t)opts->gid_base + opts->id_count > UINT32_MAX)
        return gn__err(err, err_cap, GN_EINVAL, "id range %u+%u does not fit in 32 bits", opts->uid_base,
                       opts->id_count);
      c.shift = true;
      c.uid_base = opts->uid_base;
      c.gid_base = opts->gid_base;
      c.id_count = opts->id_count;
    }
  }
  c.keep_ids = !c.shift && geteuid() == 0;
  c.layer = "(none)";
  randombytes_buf(c.hkey, sizeof(c.hkey));
  if (canceled(&c))
    return gn__err(err, err_cap, GN_ECANCELED, "unpacking into %s was canceled", rootfs);
  if (mkdir(rootfs, 0755) < 0)
    return gn__err(err, err_cap, errno == EEXIST ? GN_EEXIST : -errno, "cannot create rootfs %s: %s", rootfs,
                   errno == EEXIST ? "it exists (each unpack needs a fresh directory)" : strerror(errno));
  if (!realpath(rootfs, c.root)) {
    r = -errno;
    goto out;
  }
  c.rootfd = open(c.root, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (c.rootfd < 0) {
    r = -errno;
    goto out;
  }
  /* The job's root directory belongs to the job's root. */
  if (c.shift && fchown(c.rootfd, c.uid_base, c.gid_base) < 0) {
    r = gn__err(err, err_cap, -errno, "cannot give rootfs %s to uid %u: %s", c.root, c.uid_base, strerror(errno));
    goto out;
  }
  for (size_t i = 0; i < n; i++) {
    c.layer = gn__digest_short(digests[i], shortd);
    if ((r = layer_unpack(&c, paths[i], digests[i])) < 0)
      goto out;
  }
  r = 0;
out:
  pcache_drop(&c);
  hset_done(&c.created);
  fixups_done(&c);
  free(c.fix);
  if (c.rootfd >= 0)
    close(c.rootfd);
  if (r < 0)
    remove_rootfs(c.root, rootfs); /* half an image is no image */
  return r;
}

int gn_store_unpack_ex(gn_store *s, const gn_image *img, const char *rootfs, const gn_unpack_opts *opts, char *err,
                       size_t err_cap) {
  if (!s || !img || !rootfs)
    return GN_EINVAL;
  if (img->layer_count > GN__LAYERS_MAX)
    return GN_ETOOBIG;
  const char *paths[GN__LAYERS_MAX], *digests[GN__LAYERS_MAX];
  char(*bufs)[4096] = calloc(img->layer_count ? img->layer_count : 1, 4096);
  if (!bufs)
    return GN_ENOMEM;
  int r = 0;
  for (size_t i = 0; i < img->layer_count; i++) {
    if (!gn__digest_valid(img->layers[i])) {
      r = GN_EINVAL;
      goto out;
    }
    gn__store_blob_path(s, img->layers[i], bufs[i]);
    paths[i] = bufs[i];
    digests[i] = img->layers[i];
  }
  /* A copy: the daemon sets the limits once, before any unpack. */
  gn_store_limits lim = *gn__store_limits(s);
  lim.registry_allow = NULL;
  r = gn__unpack_layer_files(paths, digests, img->layer_count, rootfs, &lim, opts, err, err_cap);
out:
  free(bufs);
  return r;
}

int gn_store_unpack(gn_store *s, const gn_image *img, const char *rootfs, char *err, size_t err_cap) {
  return gn_store_unpack_ex(s, img, rootfs, NULL, err, err_cap);
}
