/* Unpacks an image's layers into a fresh rootfs with libarchive: compression
 * detected (gzip, zstd, plain tar), OCI whiteouts and opaque directories
 * applied, and every entry checked so nothing lands outside the root.
 *
 * Each layer is read twice. The first pass checks every entry name and type,
 * collects the whiteouts and verifies the layer against its digest (the
 * store verified it when it arrived; this catches later damage) before the
 * layer changes anything. The second pass extracts.
 *
 * What is kept from the archive: names, types, permission bits (minus
 * setuid/setgid: jobs run with no-new-privileges, and a setuid binary has
 * no business in a GPU job), symlinks as symlinks, hardlinks inside the
 * root, modification times. What is not: owners (everything is owned by the
 * unpacking user: as root that is root:root, which matches the uid 0 the
 * bundle runs as), extended attributes and ACLs (security.capability would
 * hand out file capabilities), device nodes (refused), FIFOs and sockets
 * (skipped: a job can make its own in /tmp). */
#include "sandbox_int.h"

#include <archive.h>
#include <archive_entry.h>
#include <dirent.h>
#include <fcntl.h>
#include <limits.h>
#include <sodium.h>
#include <sys/stat.h>
#include <unistd.h>

#define ENTRIES_MAX 1000000u /* per layer */
#define WHITEOUTS_MAX 100000u
#define RM_DEPTH_MAX 1024
#define WH_PREFIX ".wh."
#define WH_OPAQUE ".wh..wh..opq"

typedef struct unpack_ctx {
  int rootfd;
  char root[PATH_MAX];
  const char *layer; /* short digest, for messages */
  char *err;
  size_t err_cap;
} unpack_ctx;

/* Removes name under dirfd, recursively, never following a symlink. */
static int rm_rf_at(int dirfd, const char *name, int depth) {
  struct stat st;
  if (depth > RM_DEPTH_MAX)
    return GN_ETOOBIG;
  if (fstatat(dirfd, name, &st, AT_SYMLINK_NOFOLLOW) < 0)
    return errno == ENOENT ? 0 : -errno;
  if (!S_ISDIR(st.st_mode))
    return unlinkat(dirfd, name, 0) < 0 && errno != ENOENT ? -errno : 0;
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
    r = rm_rf_at(fd, e->d_name, depth + 1);
  }
  closedir(d);
  if (r == 0 && unlinkat(dirfd, name, AT_REMOVEDIR) < 0 && errno != ENOENT)
    r = -errno;
  return r;
}

/* Empties a directory (for an opaque marker), keeping the directory. */
static int empty_dir_fd(int fd) {
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
    r = rm_rf_at(fd, e->d_name, 1);
  }
  closedir(d);
  return r;
}

/* Cleans an entry name into "a/b/c": drops "./" and empty components,
 * refuses absolute names (but "/" itself) and "..". Returns 0, or GN_EPERM.
 * An empty result is the root itself. */
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
  size_t n = 0;
  const char *p = in;
  while (*p) {
    const char *slash = strchr(p, '/');
    size_t len = slash ? (size_t)(slash - p) : strlen(p);
    if (len == 2 && p[0] == '.' && p[1] == '.')
      return GN_EPERM;
    if (len > 0 && !(len == 1 && p[0] == '.')) {
      if (n + len + 2 > cap)
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

/* Reads a layer blob through sha256 so the digest covers every byte. */
typedef struct layer_reader {
  int fd;
  crypto_hash_sha256_state st;
  uint64_t total;
  uint8_t buf[65536];
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
    crypto_hash_sha256_update(&lr->st, lr->buf, (size_t)n);
    lr->total += (uint64_t)n;
    *buff = lr->buf;
    return n;
  }
}

static int layer_open(const char *path, layer_reader *lr, struct archive **ret) {
  lr->fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (lr->fd < 0)
    return errno == ENOENT ? GN_ENOTFOUND : -errno;
  crypto_hash_sha256_init(&lr->st);
  lr->total = 0;
  struct archive *a = archive_read_new();
  if (!a) {
    close(lr->fd);
    return GN_ENOMEM;
  }
  /* Tar only (OCI layers are tar), with any compression libarchive knows;
   * "raw" is not enabled, so a non-tar blob is an error. */
  archive_read_support_filter_all(a);
  archive_read_support_format_tar(a);
  archive_read_support_format_gnutar(a);
  if (archive_read_open(a, lr, NULL, lr_read, NULL) != ARCHIVE_OK) {
    archive_read_free(a);
    close(lr->fd);
    return GN_EINVAL;
  }
  *ret = a;
  return 0;
}

static void layer_close(layer_reader *lr, struct archive *a) {
  if (a)
    archive_read_free(a);
  if (lr->fd >= 0)
    close(lr->fd);
  lr->fd = -1;
}

/* Reads what libarchive left after the end-of-archive marker, so the hash
 * covers the whole blob. */
static int lr_drain(layer_reader *lr) {
  for (;;) {
    ssize_t n = read(lr->fd, lr->buf, sizeof(lr->buf));
    if (n < 0 && errno == EINTR)
      continue;
    if (n < 0)
      return -errno;
    if (n == 0)
      return 0;
    crypto_hash_sha256_update(&lr->st, lr->buf, (size_t)n);
    lr->total += (uint64_t)n;
  }
}

typedef struct whiteouts {
  char **paths; /* cleaned paths; "dir/.wh..wh..opq" kept as such */
  size_t n, cap;
} whiteouts;

static void whiteouts_done(whiteouts *w) {
  for (size_t i = 0; i < w->n; i++)
    free(w->paths[i]);
  free(w->paths);
  memset(w, 0, sizeof(*w));
}

static const char *base_name(const char *p) {
  const char *s = strrchr(p, '/');
  return s ? s + 1 : p;
}

/* Pass 1: names, types, whiteouts and the digest. Changes nothing. */
static int layer_check(unpack_ctx *c, const char *path, const char *digest, whiteouts *wh) {
  layer_reader *lr = malloc(sizeof(*lr));
  struct archive *a = NULL;
  struct archive_entry *e;
  char clean[PATH_MAX], got[GN_DIGEST_STRLEN];
  uint8_t hash[32];
  int r;
  if (!lr)
    return GN_ENOMEM;
  lr->fd = -1;
  if ((r = layer_open(path, lr, &a)) < 0) {
    gn__err(c->err, c->err_cap, r, "layer %s: cannot open: %s", c->layer, gn_strerror(r));
    goto out;
  }
  size_t count = 0;
  for (;;) {
    int ar = archive_read_next_header(a, &e);
    if (ar == ARCHIVE_EOF)
      break;
    if (ar != ARCHIVE_OK && ar != ARCHIVE_WARN) {
      r = gn__err(c->err, c->err_cap, GN_EINVAL, "layer %s: not a valid tar archive: %s", c->layer,
                  archive_error_string(a));
      goto out;
    }
    if (++count > ENTRIES_MAX) {
      r = gn__err(c->err, c->err_cap, GN_ETOOBIG, "layer %s: more than %u entries", c->layer, ENTRIES_MAX);
      goto out;
    }
    const char *name = archive_entry_pathname(e);
    if (!name) {
      r = gn__err(c->err, c->err_cap, GN_EINVAL, "layer %s: entry without a name", c->layer);
      goto out;
    }
    if ((r = clean_path(name, clean, sizeof(clean))) < 0) {
      gn__err(c->err, c->err_cap, r, "layer %s: entry \"%s\" %s; refusing the image", c->layer, name,
              r == GN_ETOOBIG ? "has a name that is too long" : "points outside the root");
      goto out;
    }
    mode_t type = archive_entry_filetype(e);
    if (type == AE_IFCHR || type == AE_IFBLK) {
      r = gn__err(c->err, c->err_cap, GN_EPERM, "layer %s: entry \"%s\" is a device node; refusing the image", c->layer,
                  name);
      goto out;
    }
    const char *link = archive_entry_hardlink(e);
    if (link) {
      char target[PATH_MAX];
      if (clean_path(link, target, sizeof(target)) < 0 || !target[0]) {
        r = gn__err(c->err, c->err_cap, GN_EPERM,
                    "layer %s: hardlink \"%s\" points outside the root (\"%s\"); refusing the image", c->layer, name,
                    link);
        goto out;
      }
    }
    if (strncmp(base_name(clean), WH_PREFIX, strlen(WH_PREFIX)) == 0) {
      const char *target = base_name(clean) + strlen(WH_PREFIX);
      if (strcmp(base_name(clean), WH_OPAQUE) != 0 &&
          (!target[0] || strcmp(target, ".") == 0 || strcmp(target, "..") == 0)) {
        r = gn__err(c->err, c->err_cap, GN_EPERM, "layer %s: malformed whiteout \"%s\"", c->layer, name);
        goto out;
      }
      if (wh->n >= WHITEOUTS_MAX) {
        r = gn__err(c->err, c->err_cap, GN_ETOOBIG, "layer %s: too many whiteouts", c->layer);
        goto out;
      }
      if (wh->n == wh->cap) {
        size_t cap = wh->cap ? wh->cap * 2 : 16;
        char **p = realloc(wh->paths, cap * sizeof(char *));
        if (!p) {
          r = GN_ENOMEM;
          goto out;
        }
        wh->paths = p;
        wh->cap = cap;
      }
      if (!(wh->paths[wh->n] = strdup(clean))) {
        r = GN_ENOMEM;
        goto out;
      }
      wh->n++;
    }
    /* Reading through the data (no skip callback) keeps the hash whole. */
    if (archive_read_data_skip(a) != ARCHIVE_OK) {
      r = gn__err(c->err, c->err_cap, GN_EINVAL, "layer %s: truncated at \"%s\": %s", c->layer, name,
                  archive_error_string(a));
      goto out;
    }
  }
  if ((r = lr_drain(lr)) < 0)
    goto out;
  crypto_hash_sha256_final(&lr->st, hash);
  gn__digest_from_hash(hash, got);
  if (strcmp(got, digest) != 0) {
    r = gn__err(c->err, c->err_cap, GN_EDIGEST, "layer %s does not match its digest", c->layer);
    goto out;
  }
  r = 0;
out:
  layer_close(lr, a);
  free(lr);
  return r;
}

/* Applies one layer's whiteouts to what the layers below left. A whiteout
 * under a symlinked directory deletes nothing: overlay filesystems record
 * whiteouts at real paths, so such an entry cannot name a lower file. */
static int apply_whiteouts(unpack_ctx *c, const whiteouts *wh) {
  for (size_t i = 0; i < wh->n; i++) {
    const char *p = wh->paths[i];
    const char *last = NULL;
    char bad[PATH_MAX];
    int dfd = open_parent(c->rootfd, p, &last, bad, sizeof(bad));
    if (dfd == -ENOENT || dfd == GN_EPERM || dfd == -ENOTDIR)
      continue;
    if (dfd < 0)
      return gn__err(c->err, c->err_cap, dfd, "layer %s: whiteout \"%s\": %s", c->layer, p, gn_strerror(dfd));
    int r;
    if (strcmp(last, WH_OPAQUE) == 0)
      r = empty_dir_fd(dfd);
    else
      r = rm_rf_at(dfd, last + strlen(WH_PREFIX), 0);
    close(dfd);
    if (r < 0)
      return gn__err(c->err, c->err_cap, r, "layer %s: whiteout \"%s\": %s", c->layer, p, gn_strerror(r));
  }
  return 0;
}

/* A hardlink may only name a regular file already inside the root, reached
 * without symlinks: linking a host file in through a symlinked parent is
 * the classic escape. */
static int hardlink_target_ok(unpack_ctx *c, const char *target) {
  const char *last = NULL;
  char bad[PATH_MAX];
  int dfd = open_parent(c->rootfd, target, &last, bad, sizeof(bad));
  if (dfd < 0)
    return GN_EPERM;
  struct stat st;
  int r = fstatat(dfd, last, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISREG(st.st_mode) ? 0 : GN_EPERM;
  close(dfd);
  return r;
}

static int copy_data(struct archive *in, struct archive *out) {
  const void *buf;
  size_t size;
  la_int64_t off;
  for (;;) {
    int r = archive_read_data_block(in, &buf, &size, &off);
    if (r == ARCHIVE_EOF)
      return ARCHIVE_OK;
    if (r != ARCHIVE_OK)
      return r;
    if (archive_write_data_block(out, buf, size, off) != ARCHIVE_OK)
      return ARCHIVE_FATAL;
  }
}

/* Pass 2: extraction. */
static int layer_extract(unpack_ctx *c, const char *path) {
  layer_reader *lr = malloc(sizeof(*lr));
  struct archive *a = NULL, *w = NULL;
  struct archive_entry *e;
  char clean[PATH_MAX], full[PATH_MAX * 2], bad[PATH_MAX];
  int r;
  if (!lr)
    return GN_ENOMEM;
  lr->fd = -1;
  if ((r = layer_open(path, lr, &a)) < 0)
    goto out;
  w = archive_write_disk_new();
  if (!w) {
    r = GN_ENOMEM;
    goto out;
  }
  /* Names are handed to libarchive as absolute paths under the root, because
   * its alternative is chdir(), which is process-wide and this runs on a
   * thread pool. So ARCHIVE_EXTRACT_SECURE_NOABSOLUTEPATHS cannot be set:
   * absolute entry names are refused by clean_path() before the prefix is
   * added, and ".." by both clean_path() and SECURE_NODOTDOT. */
  archive_write_disk_set_options(w, ARCHIVE_EXTRACT_TIME | ARCHIVE_EXTRACT_PERM | ARCHIVE_EXTRACT_SECURE_SYMLINKS |
                                        ARCHIVE_EXTRACT_SECURE_NODOTDOT | ARCHIVE_EXTRACT_UNLINK);
  archive_write_disk_set_standard_lookup(w);
  for (;;) {
    int ar = archive_read_next_header(a, &e);
    if (ar == ARCHIVE_EOF)
      break;
    if (ar != ARCHIVE_OK && ar != ARCHIVE_WARN) {
      r = gn__err(c->err, c->err_cap, GN_EINVAL, "layer %s: %s", c->layer, archive_error_string(a));
      goto out;
    }
    const char *name = archive_entry_pathname(e);
    if (!name || clean_path(name, clean, sizeof(clean)) < 0) {
      r = gn__err(c->err, c->err_cap, GN_EPERM, "layer %s changed between passes", c->layer);
      goto out;
    }
    mode_t type = archive_entry_filetype(e);
    if (!clean[0] || strncmp(base_name(clean), WH_PREFIX, strlen(WH_PREFIX)) == 0 || type == AE_IFIFO ||
        type == AE_IFSOCK)
      continue; /* the root itself, whiteouts (done), FIFOs and sockets */
    if (type == AE_IFCHR || type == AE_IFBLK) {
      r = gn__err(c->err, c->err_cap, GN_EPERM, "layer %s: entry \"%s\" is a device node", c->layer, name);
      goto out;
    }
    const char *last;
    int dfd = open_parent(c->rootfd, clean, &last, bad, sizeof(bad));
    if (dfd == GN_EPERM) {
      r = gn__err(c->err, c->err_cap, GN_EPERM,
                  "layer %s: entry \"%s\" would be written through the symlink \"%s\"; refusing the image", c->layer,
                  name, bad);
      goto out;
    }
    if (dfd >= 0)
      close(dfd);
    const char *link = archive_entry_hardlink(e);
    if (link) {
      char target[PATH_MAX];
      if (clean_path(link, target, sizeof(target)) < 0 || hardlink_target_ok(c, target) < 0) {
        r = gn__err(c->err, c->err_cap, GN_EPERM,
                    "layer %s: hardlink \"%s\" -> \"%s\" does not name a file inside the root; refusing the image",
                    c->layer, name, link);
        goto out;
      }
      snprintf(full, sizeof(full), "%s/%s", c->root, target);
      archive_entry_set_hardlink(e, full);
    }
    snprintf(full, sizeof(full), "%s/%s", c->root, clean);
    archive_entry_set_pathname(e, full);
    archive_entry_set_perm(e, archive_entry_perm(e) & 01777);
    /* Leave no trace of the archive's owner names: ownership is ours. */
    archive_entry_set_uid(e, getuid());
    archive_entry_set_gid(e, getgid());
    if (archive_write_header(w, e) != ARCHIVE_OK) {
      r = gn__err(c->err, c->err_cap, GN_EPERM, "layer %s: cannot extract \"%s\": %s", c->layer, name,
                  archive_error_string(w));
      goto out;
    }
    if (archive_entry_size(e) > 0 && copy_data(a, w) != ARCHIVE_OK) {
      r = gn__err(c->err, c->err_cap, GN_EIO, "layer %s: cannot write \"%s\": %s", c->layer, name,
                  archive_error_string(w) ? archive_error_string(w) : archive_error_string(a));
      goto out;
    }
    if (archive_write_finish_entry(w) != ARCHIVE_OK) {
      r = gn__err(c->err, c->err_cap, GN_EIO, "layer %s: cannot finish \"%s\": %s", c->layer, name,
                  archive_error_string(w));
      goto out;
    }
  }
  if (archive_write_close(w) != ARCHIVE_OK) {
    r = gn__err(c->err, c->err_cap, GN_EIO, "layer %s: %s", c->layer, archive_error_string(w));
    goto out;
  }
  r = 0;
out:
  if (w)
    archive_write_free(w);
  layer_close(lr, a);
  free(lr);
  return r;
}

int gn__unpack_layer_files(const char *const *paths, const char *const *digests, size_t n, const char *rootfs,
                           char *err, size_t err_cap) {
  unpack_ctx c = {.rootfd = -1, .err = err, .err_cap = err_cap};
  whiteouts wh = {0};
  char shortd[32];
  int r;
  if (!rootfs || !rootfs[0])
    return GN_EINVAL;
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
  for (size_t i = 0; i < n; i++) {
    c.layer = gn__digest_short(digests[i], shortd);
    if ((r = layer_check(&c, paths[i], digests[i], &wh)) < 0)
      goto out;
    if ((r = apply_whiteouts(&c, &wh)) < 0)
      goto out;
    whiteouts_done(&wh);
    if ((r = layer_extract(&c, paths[i])) < 0)
      goto out;
  }
  r = 0;
out:
  whiteouts_done(&wh);
  if (c.rootfd >= 0)
    close(c.rootfd);
  if (r < 0) {
    /* Half an image is no image: remove it, never following links. */
    if (c.root[0]) {
      char parent[PATH_MAX];
      snprintf(parent, sizeof(parent), "%s", c.root);
      char *slash = strrchr(parent, '/');
      if (slash && slash != parent) {
        *slash = '\0';
        int pfd = open(parent, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (pfd >= 0) {
          rm_rf_at(pfd, slash + 1, 0);
          close(pfd);
        }
      }
    } else {
      rmdir(rootfs);
    }
  }
  return r;
}

int gn_store_unpack(gn_store *s, const gn_image *img, const char *rootfs, char *err, size_t err_cap) {
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
  r = gn__unpack_layer_files(paths, digests, img->layer_count, rootfs, err, err_cap);
out:
  free(bufs);
  return r;
}
