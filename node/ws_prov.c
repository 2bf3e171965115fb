/* The provider's side of a lease's workspace: its files kept in a file
 * system of workspace_max bytes made for the lease (DATA_DIR/workspace/
 * LEASE/fs.img, see "A file system per lease") or, where the host cannot
 * make one, in DATA_DIR/workspace/LEASE/upper seen through an overlay
 * "view" at GN_DATA_ALIAS_DIR/ws/LEASE; the lease's jobs bind it at
 * /workspace; written and read by the lease holder (WS_PUT/WS_GET/WS_STAT)
 * one request at a time per lease on the thread pool, never through a
 * link, within the workspace budget; removed once the lease has ended and
 * its jobs are gone. */
#include "du.h"
#include "node_internal.h"
#include "ws.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <openssl/evp.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

/* --- the file operations -----------------------------------------------------*/

static void shown_path(const char *path, char *out, size_t cap) {
  gn_printable_copy(path, out, cap);
}

/* The directory holding path's last component, every component before it
 * opened relative to the one before with O_NOFOLLOW (a link is refused,
 * never followed); with create, missing ones are made (0755, owned like
 * root). *ret_name points into path. */
static int walk_parent(int root, const char *path, bool create, const struct stat *owner, int *ret_fd,
                       const char **ret_name, char *reason, size_t cap) {
  char buf[GN_WS_PATH_MAX], shown[128];
  size_t k = strlen(path);
  if (k >= sizeof buf)
    return GN_EINVAL;
  memcpy(buf, path, k + 1);
  int dfd = fcntl(root, F_DUPFD_CLOEXEC, 0);
  if (dfd < 0)
    return -errno;
  char *p = buf;
  for (char *slash; (slash = strchr(p, '/'));) {
    *slash = 0;
    int fd = openat(dfd, p, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0 && errno == ENOENT && create) {
      if (mkdirat(dfd, p, 0755) < 0 && errno != EEXIST) {
        int e = -errno;
        close(dfd);
        shown_path(buf, shown, sizeof shown);
        gn__strf(reason, cap, "cannot make the directory %s: %s", shown, strerror(-e));
        return e;
      }
      if (owner && fchownat(dfd, p, owner->st_uid, owner->st_gid, AT_SYMLINK_NOFOLLOW) < 0) {
        int e = -errno;
        close(dfd);
        gn__strf(reason, cap, "cannot give the new directory to the lease's user: %s", strerror(-e));
        return e;
      }
      fd = openat(dfd, p, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    }
    if (fd < 0) {
      int e = -errno;
      close(dfd);
      shown_path(buf, shown, sizeof shown);
      if (e == -ENOENT)
        gn__strf(reason, cap, "no such directory in the workspace: %s", shown);
      else if (e == -ELOOP || e == -ENOTDIR)
        gn__strf(reason, cap, "%s in the workspace is a symbolic link or not a directory: refused", shown);
      else
        gn__strf(reason, cap, "cannot open %s in the workspace: %s", shown, strerror(-e));
      return e;
    }
    close(dfd);
    dfd = fd;
    *slash = '/';
    p = slash + 1;
  }
  *ret_fd = dfd;
  *ret_name = path + (p - buf);
  return 0;
}

/* Opens path for reading or writing: a regular file with one link, never
 * a link, a fifo (O_NONBLOCK: opening one does not wait) or a device. */
static int open_file(int root, const char *path, bool write, bool create, int *ret_fd, bool *ret_absent, char *reason,
                     size_t cap) {
  char shown[128];
  struct stat rst;
  const char *name = NULL;
  int dfd = -1, fd = -1, r;
  shown_path(path, shown, sizeof shown);
  if (ret_absent)
    *ret_absent = false;
  if (fstat(root, &rst) < 0)
    return -errno;
  if ((r = walk_parent(root, path, create, &rst, &dfd, &name, reason, cap)) < 0) {
    if (r == -ENOENT && ret_absent)
      *ret_absent = true;
    return r;
  }
  int flags = (write ? O_RDWR : O_RDONLY) | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC;
  if (create) {
    fd = openat(dfd, name, flags | O_CREAT | O_EXCL, 0644);
    if (fd >= 0 && fchown(fd, rst.st_uid, rst.st_gid) < 0) {
      r = -errno;
      gn__strf(reason, cap, "cannot give %s to the lease's user: %s", shown, strerror(errno));
      unlinkat(dfd, name, 0);
      goto out;
    }
    if (fd < 0 && errno == EEXIST)
      fd = openat(dfd, name, flags);
  } else {
    fd = openat(dfd, name, flags);
  }
  if (fd < 0) {
    r = -errno;
    if (r == -ENOENT && ret_absent)
      *ret_absent = true;
    if (r == -ENOENT)
      gn__strf(reason, cap, "no such file in the workspace: %s", shown);
    else if (r == -ELOOP)
      gn__strf(reason, cap, "%s in the workspace is a symbolic link: refused", shown);
    else
      gn__strf(reason, cap, "cannot open %s in the workspace: %s", shown, strerror(-r));
    goto out;
  }
  struct stat st;
  if (fstat(fd, &st) < 0) {
    r = -errno;
    goto out;
  }
  if (!S_ISREG(st.st_mode)) {
    r = S_ISDIR(st.st_mode) ? -EISDIR : GN_EINVAL;
    gn__strf(reason, cap, "%s in the workspace is %s", shown,
             S_ISDIR(st.st_mode) ? "a directory: directories are not copied yet (use tar)" : "not a regular file");
    goto out;
  }
  if (st.st_nlink > 1) {
    r = GN_EPERM;
    gn__strf(reason, cap, "%s in the workspace has other hard links: refused", shown);
    goto out;
  }
  *ret_fd = fd;
  fd = -1;
  r = 0;
out:
  if (fd >= 0)
    close(fd);
  close(dfd);
  return r;
}

uint64_t gn__ws_usage(int root) {
  int fd = openat(root, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  return fd >= 0 ? gn__du_tree(fd, GN_WS_WALK_DEPTH, GN_WS_WALK_ENTRIES) : 0;
}

int gn__ws_write(int root, const char *path, uint64_t offset, const uint8_t *data, size_t len, const gn_ws_limits *lim,
                 uint64_t *used, uint64_t *ret_size, char *reason, size_t cap) {
  char shown[128];
  int fd = -1, r;
  if (len > GN_WS_CHUNK || offset > GN_WS_OFFSET_MAX)
    return GN_EINVAL;
  if ((r = open_file(root, path, true, true, &fd, NULL, reason, cap)) < 0)
    return r;
  shown_path(path, shown, sizeof shown);
  struct stat st;
  if (fstat(fd, &st) < 0) {
    r = -errno;
    goto out;
  }
  uint64_t size = (uint64_t)st.st_size, end = offset + len;
  if (offset > size) { /* a hole would be a file the budget never saw */
    r = -ERANGE;
    gn__strf(reason, cap, "offset %llu is past the end of %s (%llu bytes): continue from its size",
             (unsigned long long)offset, shown, (unsigned long long)size);
    goto out;
  }
  uint64_t growth = end > size ? end - size : 0;
  if (growth && (*used > lim->cap_bytes || lim->cap_bytes - *used < growth)) {
    r = -ENOSPC;
    gn__strf(reason, cap, "the lease's workspace is full (%llu MiB)", (unsigned long long)(lim->cap_bytes >> 20));
    goto out;
  }
  struct statvfs vfs;
  if (growth && (lim->reserve_path ? statvfs(lim->reserve_path, &vfs) : fstatvfs(fd, &vfs)) == 0 &&
      (uint64_t)vfs.f_bavail * vfs.f_frsize < lim->reserve_bytes + growth) {
    r = -ENOSPC;
    gn__strf(reason, cap, "the provider's disk is down to its free-space reserve: nothing more can be written");
    goto out;
  }
  for (size_t done = 0; done < len;) {
    ssize_t k = pwrite(fd, data + done, len - done, (off_t)(offset + done));
    if (k < 0 && errno == EINTR)
      continue;
    if (k <= 0) {
      r = k < 0 ? -errno : GN_EIO;
      if (r == -ENOSPC || r == -EDQUOT) /* the lease's own file system is full */
        gn__strf(reason, cap, "the lease's workspace is full (%llu MiB)", (unsigned long long)(lim->cap_bytes >> 20));
      else
        gn__strf(reason, cap, "cannot write %s: %s", shown, gn_strerror(r));
      goto out;
    }
    done += (size_t)k;
  }
  if (size > end && ftruncate(fd, (off_t)end) < 0) {
    r = -errno;
    gn__strf(reason, cap, "cannot cut %s to %llu bytes: %s", shown, (unsigned long long)end, strerror(errno));
    goto out;
  }
  uint64_t shrink = size > end ? size - end : 0;
  *used = *used + growth - (shrink < *used + growth ? shrink : *used + growth);
  *ret_size = end;
  r = 0;
out:
  close(fd);
  return r;
}

int gn__ws_read(int root, const char *path, uint64_t offset, uint8_t *buf, size_t buf_cap, size_t *ret_len,
                uint64_t *ret_size, char *reason, size_t cap) {
  char shown[128];
  int fd = -1, r;
  if ((r = open_file(root, path, false, false, &fd, NULL, reason, cap)) < 0)
    return r;
  struct stat st;
  if (fstat(fd, &st) < 0) {
    r = -errno;
    goto out;
  }
  if (offset > (uint64_t)st.st_size) {
    shown_path(path, shown, sizeof shown);
    r = -ERANGE;
    gn__strf(reason, cap, "offset %llu is past the end of %s (%llu bytes)", (unsigned long long)offset, shown,
             (unsigned long long)st.st_size);
    goto out;
  }
  size_t want = (uint64_t)st.st_size - offset < buf_cap ? (size_t)((uint64_t)st.st_size - offset) : buf_cap;
  size_t got = 0;
  while (got < want) {
    ssize_t k = pread(fd, buf + got, want - got, (off_t)(offset + got));
    if (k < 0 && errno == EINTR)
      continue;
    if (k < 0) {
      r = -errno;
      gn__strf(reason, cap, "cannot read: %s", strerror(errno));
      goto out;
    }
    if (k == 0)
      break;
    got += (size_t)k;
  }
  *ret_len = got;
  *ret_size = (uint64_t)st.st_size;
  r = 0;
out:
  close(fd);
  return r;
}

int gn__ws_stat(int root, const char *path, bool hash, uint64_t hash_max, bool *ret_exists, uint64_t *ret_size,
                uint8_t ret_sha256[32], char *reason, size_t cap) {
  int fd = -1;
  bool absent = false;
  int r = open_file(root, path, false, false, &fd, &absent, reason, cap);
  if (r < 0 && absent) {
    reason[0] = 0;
    *ret_exists = false;
    *ret_size = 0;
    return 0;
  }
  if (r < 0)
    return r;
  struct stat st;
  EVP_MD_CTX *ctx = NULL;
  uint8_t *buf = NULL;
  if (fstat(fd, &st) < 0) {
    r = -errno;
    goto out;
  }
  if (hash) {
    if ((uint64_t)st.st_size > hash_max) {
      r = GN_ETOOBIG;
      gn__strf(reason, cap, "the file is larger than the workspace's budget (%llu MiB): not hashed",
               (unsigned long long)(hash_max >> 20));
      goto out;
    }
    unsigned mdlen = 0;
    if (!(ctx = EVP_MD_CTX_new()) || !(buf = malloc(1 << 20)) || EVP_DigestInit_ex(ctx, EVP_sha256(), NULL) != 1) {
      r = GN_ENOMEM;
      goto out;
    }
    for (;;) {
      ssize_t k = read(fd, buf, 1 << 20);
      if (k < 0 && errno == EINTR)
        continue;
      if (k < 0) {
        r = -errno;
        gn__strf(reason, cap, "cannot read the file: %s", strerror(errno));
        goto out;
      }
      if (k == 0)
        break;
      EVP_DigestUpdate(ctx, buf, (size_t)k);
    }
    if (EVP_DigestFinal_ex(ctx, ret_sha256, &mdlen) != 1 || mdlen != 32) {
      r = GN_EIO;
      goto out;
    }
  }
  *ret_exists = true;
  *ret_size = (uint64_t)st.st_size;
  r = 0;
out:
  EVP_MD_CTX_free(ctx);
  free(buf);
  close(fd);
  return r;
}

/* --- the glue: a queue per lease, one request on the pool at a time -----------*/

#define WS_WALK_EVERY_MS 5000 /* the workspace's usage is measured again this often while written */
#define WS_TICK_S 2           /* ended leases' workspaces are looked for this often */
#define WS_REMOVALS_MAX 4     /* removals on the pool at once */

typedef struct ws_lease ws_lease;

typedef struct ws_op {
  struct ws_op *next;
  uv_work_t w;
  ws_lease *wl;
  uint32_t type;
  uint8_t peer[GN_PK_LEN];
  uint64_t seq, offset;
  char path[GN_WS_PATH_MAX];
  bool hash;
  uint8_t *data; /* WS_PUT: the bytes; WS_GET: what was read */
  size_t len;
  gn_ws_limits lim;
  /* results */
  int rc;
  uint64_t size;
  bool exists, eof;
  uint8_t sha256[32];
  char reason[GN_WS_REASON_MAX];
} ws_op;

struct ws_lease {
  ws_lease *next;
  gn_node *n;
  char id[GN_LEASE_ID_STRLEN];
  ws_op *head, *tail;
  unsigned queued;
  bool running;
  /* the worker's: the usage measured and what was written since */
  uint64_t used, walked_ms;
  bool walked;
};

static ws_lease *wls;
static unsigned ws_queued_total;
static unsigned ws_removals;
static int64_t ws_tick_s;
static char ws_removing[WS_REMOVALS_MAX][GN_LEASE_ID_STRLEN];

/* DATA_DIR/workspace/LEASE: the lease's storage, upper (the files) and
 * work (the overlay's work dir) beside each other on one file system. */
static int ws_base(const gn_node *n, const char *lease_id, char *buf, size_t cap) {
  char parent[PATH_MAX];
  if (gn__pathf(parent, sizeof parent, "%s/workspace", n->cfg.data_dir) < 0)
    return GN_ETOOBIG;
  return gn_path_join(buf, cap, parent, NULL, lease_id, NULL);
}

/* The view: an overlay whose only writable layer is the storage's upper
 * dir, over the empty lower dir, mounted in gpunetd's own mount namespace
 * (provider.c, data_alias_setup) beside the data dir's alias. A job's bind
 * of the storage itself would show the data dir's host path in the job's
 * /proc/self/mountinfo (a bind mount's root field is the directory's path
 * from its file system's root, whatever path the bind used); an overlay's
 * root is "/" and its options name only the alias. Every bind of the view
 * shares the one overlay, so the jobs of a lease see each other's files,
 * and the daemon reads and writes the files through it too: changing an
 * overlay's upper dir underneath it is undefined. The views die with the
 * namespace; after a restart a resumed lease's view is mounted again on
 * first need. lock makes one view per lease; view_off is set when the
 * kernel refuses an overlay: plain binds of the upper dir from then on. */
static pthread_mutex_t ws_view_lock = PTHREAD_MUTEX_INITIALIZER;
static bool ws_view_off;

static int ws_view_path(const gn_node *n, const char *lease_id, char *buf, size_t cap) {
  const char *slash = strrchr(n->data_alias, '/'); /* the alias is GN_DATA_ALIAS_DIR/data */
  if (!n->data_alias[0] || !slash)
    return GN_EINVAL;
  return gn__pathf(buf, cap, "%.*s/ws/%s", (int)(slash - n->data_alias), n->data_alias, lease_id);
}

static bool ws_view_mounted(const char *view) {
  char parent[PATH_MAX];
  struct stat a, b;
  gn__strf(parent, sizeof parent, "%s", view);
  char *slash = strrchr(parent, '/');
  if (!slash)
    return false;
  *slash = 0;
  return stat(view, &a) == 0 && stat(parent, &b) == 0 && a.st_dev != b.st_dev;
}

/* Mounts the view of the storage at base; false (errno set) when it cannot. */
static bool ws_view_mount(const gn_node *n, const char *base, const char *view) {
  char parent[PATH_MAX], opts[3 * PATH_MAX];
  const char *rel = base + strlen(n->cfg.data_dir), *slash = strrchr(n->data_alias, '/');
  gn__strf(parent, sizeof parent, "%s", view);
  *strrchr(parent, '/') = 0;
  if (gn__pathf(opts, sizeof opts, "lowerdir=%.*s/empty,upperdir=%s%s/upper,workdir=%s%s/work",
                (int)(slash - n->data_alias), n->data_alias, n->data_alias, rel, n->data_alias, rel) < 0 ||
      strpbrk(rel, ",:\\")) {
    errno = ENAMETOOLONG;
    return false;
  }
  if ((mkdir(parent, 0711) < 0 && errno != EEXIST) || (mkdir(view, 0711) < 0 && errno != EEXIST))
    return false;
  if (mount("overlay", view, "overlay", MS_NOSUID | MS_NODEV, opts) < 0) {
    int e = errno;
    rmdir(view);
    errno = e;
    return false;
  }
  return true;
}

/* --- a file system per lease ---------------------------------------------------
 *
 * With workspace_fs = auto (the default) a lease's storage is
 * DATA_DIR/workspace/LEASE/fs.img: a sparse file of workspace_max bytes
 * holding an ext4 file system (mkfs.ext4: no journal, no blocks reserved,
 * an inode per 64 KiB), mounted by mount(8) through a loop device at
 * .../LEASE/fs in gpunetd's own mount namespace. Both are named by the data
 * dir's alias, so the loop device's backing file (readable in a job's
 * /sys) names no host path, and a job's bind of fs/upper shows only
 * "/upper" of the loop device in its mountinfo: no overlay view is needed.
 * A job's writes then stop at the budget as they are made (ENOSPC): no
 * survey is needed to catch them and no number of entries hides any. The
 * mount dies with the namespace (the loop device is let go with it); after
 * a restart it is mounted again on first need. Where the host cannot make
 * one (no alias, no mkfs.ext4, no loop device, a budget under 16 MiB),
 * the first lease says so once and the directory layout is used, with the
 * survey. A lease keeps the layout it started with. */
#define WS_IMAGE_MIN (16ull << 20)
static bool ws_image_off; /* under ws_view_lock */

/* The alias path (PATH_MAX) of host, a path under the data dir. */
static int alias_of(const gn_node *n, const char *host, char *buf) {
  size_t k = strlen(n->cfg.data_dir);
  if (!n->data_alias[0] || strncmp(host, n->cfg.data_dir, k) != 0)
    return GN_EINVAL;
  return gn__pathf(buf, PATH_MAX, "%s%s", n->data_alias, host + k);
}

/* The first of /usr/sbin, /sbin, /usr/bin, /bin that has name. */
static bool find_tool(const char *name, char *buf, size_t cap) {
  static const char *const dirs[] = {"/usr/sbin", "/sbin", "/usr/bin", "/bin"};
  for (size_t i = 0; i < sizeof dirs / sizeof dirs[0]; i++)
    if (gn__pathf(buf, cap, "%s/%s", dirs[i], name) == 0 && access(buf, X_OK) == 0)
      return true;
  return false;
}

/* Runs argv (argv[0] a tool's name), its stderr kept; 0 when it exits 0,
 * else GN_EIO with the tool and the start of what it said in err. */
static int run_tool(char **argv, char *err, size_t cap) {
  char path[64];
  const char *name = argv[0];
  if (!find_tool(name, path, sizeof path)) {
    gn__strf(err, cap, "no %s on this host", name);
    return GN_ENOTFOUND;
  }
  argv[0] = path;
  int efd = memfd_create("gn-ws-tool", MFD_CLOEXEC), code = -1;
  int r = gn_runtime_exec_io(argv, -1, -1, efd, &code);
  argv[0] = (char *)name;
  if (r == 0 && code == 0) {
    if (efd >= 0)
      close(efd);
    return 0;
  }
  char said[160] = "";
  ssize_t k = efd >= 0 ? pread(efd, said, sizeof said - 1, 0) : -1;
  said[k > 0 ? k : 0] = 0;
  said[strcspn(said, "\n")] = 0;
  if (efd >= 0)
    close(efd);
  gn__strf(err, cap, "%s %s (%s)", name, r < 0 ? "could not run" : "failed", said[0] ? said : gn_strerror(r));
  return GN_EIO;
}

/* Makes the image at img (an alias path) of bytes bytes. */
static int ws_image_make(const char *img, uint64_t bytes, char *err, size_t cap) {
  int fd = open(img, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0 || ftruncate(fd, (off_t)bytes) < 0) {
    gn__strf(err, cap, "cannot make %s: %s", "the image file", strerror(errno));
    if (fd >= 0) {
      close(fd);
      unlink(img);
    }
    return -errno;
  }
  close(fd);
  uint64_t inodes = bytes / 65536;
  inodes = inodes < 4096 ? 4096 : inodes > (1u << 20) ? (1u << 20) : inodes;
  char n_inodes[24], path[PATH_MAX];
  gn__strf(n_inodes, sizeof n_inodes, "%llu", (unsigned long long)inodes);
  gn__strf(path, sizeof path, "%s", img);
  char *argv[] = {"mkfs.ext4",
                  "-q",
                  "-F",
                  "-m",
                  "0",
                  "-O",
                  "^has_journal",
                  "-N",
                  n_inodes,
                  "-E",
                  "lazy_itable_init=1,nodiscard",
                  "-L",
                  "gpunet-ws",
                  path,
                  NULL};
  int r = run_tool(argv, err, cap);
  if (r < 0)
    unlink(img);
  return r;
}

/* Mounts the image img at dir (alias paths) unless it is mounted there. The
 * inode tables are left as mkfs.ext4 wrote them (noinit_itable): the sparse
 * file reads as zeros where nothing was written. */
static int ws_image_mount(const char *img, const char *dir, char *err, size_t cap) {
  if (mkdir(dir, 0700) < 0 && errno != EEXIST) {
    gn__strf(err, cap, "cannot make its mount point: %s", strerror(errno));
    return -errno;
  }
  if (ws_view_mounted(dir))
    return 0;
  char a[PATH_MAX], b[PATH_MAX];
  gn__strf(a, sizeof a, "%s", img);
  gn__strf(b, sizeof b, "%s", dir);
  char *argv[] = {"mount", "-t", "ext4", "-o", "loop,nosuid,nodev,noatime,noinit_itable", a, b, NULL};
  return run_tool(argv, err, cap);
}

/* The image layout of the storage at base (a host path), when the lease
 * has it or, with create, gets it now: ret_upper (PATH_MAX) is the upper
 * dir inside the mounted image. 0: the image is in use; 1: the lease keeps
 * the directory layout; < 0: the image cannot be used now. */
static int ws_image_open(const gn_node *n, const char *base, bool create, uid_t owner, char *ret_upper) {
  char host[PATH_MAX], img[PATH_MAX], fs[PATH_MAX], err[256] = "";
  struct stat st;
  if (gn__pathf(host, sizeof host, "%s/upper", base) < 0 || lstat(host, &st) == 0)
    return 1; /* made as a directory: it stays one */
  if (gn__pathf(host, sizeof host, "%s/fs.img", base) < 0 || alias_of(n, host, img) < 0)
    return 1;
  if (gn__pathf(host, sizeof host, "%s/fs", base) < 0 || alias_of(n, host, fs) < 0)
    return 1;
  int r = 0;
  bool have = lstat(img, &st) == 0;
  if (have && !S_ISREG(st.st_mode))
    return GN_EINVAL;
  if (!have) {
    if (!create)
      return -ENOENT;
    if (ws_image_off || n->cfg.workspace_fs_dir || n->cfg.workspace_max_bytes < WS_IMAGE_MIN)
      return 1;
    if ((r = ws_image_make(img, n->cfg.workspace_max_bytes, err, sizeof err)) == 0 &&
        (r = ws_image_mount(img, fs, err, sizeof err)) < 0) {
      unlink(img); /* made but not mountable here: no lease can have one */
      rmdir(fs);
    }
    if (r < 0) {
      ws_image_off = true;
      gn_log(GN_LOG_WARN,
             "no file system per lease for the workspaces (%s): directories are used, and what jobs write "
             "there is measured every 10 s",
             err);
      return 1;
    }
  } else if ((r = ws_image_mount(img, fs, err, sizeof err)) < 0) {
    gn_log_ratelimited("ws-mount", GN_LOG_WARN, "cannot mount a lease's workspace: %s", err);
    return r;
  }
  if (gn__pathf(ret_upper, PATH_MAX, "%s/upper", fs) < 0)
    return GN_ETOOBIG;
  if (mkdir(ret_upper, 0700) == 0) {
    if (owner != (uid_t)-1 && chown(ret_upper, owner, owner) < 0)
      return -errno;
  } else if (errno != EEXIST) {
    return -errno;
  }
  return 0;
}

/* The lease's files as the daemon reaches them, into ret_dir (PATH_MAX):
 * the view, mounted here if it is not yet, or the upper dir without one.
 * With create the storage is made first, its upper dir owned by owner
 * (unless (uid_t)-1); without, a missing storage is -ENOENT. ret_bind
 * (PATH_MAX, or NULL) gets the path a job's runtime binds at /workspace.
 * Blocking: on the pool, or at a lease's start. */
static int ws_open(const gn_node *n, const char *lease_id, bool create, uid_t owner, char *ret_dir, char *ret_bind) {
  char base[PATH_MAX], upper[PATH_MAX], work[PATH_MAX], view[PATH_MAX];
  int r = ws_base(n, lease_id, base, sizeof base);
  if (r < 0 || (r = gn__pathf(upper, sizeof upper, "%s/upper", base)) < 0 ||
      (r = gn__pathf(work, sizeof work, "%s/work", base)) < 0)
    return r < 0 ? r : GN_ETOOBIG;
  pthread_mutex_lock(&ws_view_lock);
  if (create) {
    char parent[PATH_MAX];
    gn__strf(parent, sizeof parent, "%s/workspace", n->cfg.data_dir);
    if ((mkdir(parent, 0711) < 0 && errno != EEXIST) || (mkdir(base, 0700) < 0 && errno != EEXIST)) {
      r = -errno;
      goto out;
    }
  }
  int img = ws_image_open(n, base, create, owner, ret_dir);
  if (img <= 0) {
    r = img;
    if (r == 0 && ret_bind)
      gn__strf(ret_bind, PATH_MAX, "%s", ret_dir);
    goto out;
  }
  if (create) {
    if (mkdir(upper, 0700) == 0) {
      if (owner != (uid_t)-1 && chown(upper, owner, owner) < 0) {
        r = -errno;
        goto out;
      }
    } else if (errno != EEXIST) {
      r = -errno;
      goto out;
    }
  }
  struct stat st;
  if (lstat(upper, &st) < 0) {
    r = -errno;
    goto out;
  }
  if (!S_ISDIR(st.st_mode)) {
    r = GN_EINVAL;
    goto out;
  }
  gn__strf(ret_dir, PATH_MAX, "%s", upper);
  if (ws_view_path(n, lease_id, view, sizeof view) == 0) {
    bool mounted = ws_view_mounted(view);
    if (!mounted && !ws_view_off) {
      mounted = (mkdir(work, 0700) == 0 || errno == EEXIST) && ws_view_mount(n, base, view);
      if (!mounted) {
        ws_view_off = true;
        gn_log(GN_LOG_WARN,
               "no overlay for the leases' workspaces (%s): jobs bind the directory itself, and can read the "
               "data dir's path in their mountinfo",
               strerror(errno));
      }
    }
    if (mounted)
      gn__strf(ret_dir, PATH_MAX, "%s", view);
  }
  if (ret_bind) {
    size_t k = strlen(n->cfg.data_dir);
    if (strcmp(ret_dir, upper) != 0)
      gn__strf(ret_bind, PATH_MAX, "%s", ret_dir);
    else if (gn__pathf(ret_bind, PATH_MAX, "%s%s", n->data_alias[0] ? n->data_alias : n->cfg.data_dir, upper + k) < 0)
      r = GN_ETOOBIG;
  }
out:
  pthread_mutex_unlock(&ws_view_lock);
  return r;
}

void gn__ws_lease_start(gn_node *n, const char *lease_id, uint32_t uid_base, bool userns) {
  char dir[PATH_MAX];
  int r = ws_open(n, lease_id, true, userns ? (uid_t)uid_base : (uid_t)-1, dir, NULL);
  if (r < 0)
    gn_log(GN_LOG_WARN, "lease %s: cannot make its workspace: %s", lease_id, gn_strerror(r));
}

static ws_lease *wl_find(gn_node *n, const char *id) {
  for (ws_lease *w = wls; w; w = w->next)
    if (w->n == n && strcmp(w->id, id) == 0)
      return w;
  return NULL;
}

static void ws_reply(gn_node *n, const ws_op *op) {
  gn_wsmsg m;
  memset(&m, 0, sizeof m);
  gn__strf(m.lease_id, sizeof m.lease_id, "%s", op->wl->id);
  m.seq = op->seq;
  m.offset = op->offset;
  gn__strf(m.reason, sizeof m.reason, "%s", op->rc < 0 ? (op->reason[0] ? op->reason : gn_strerror(op->rc)) : "");
  uint32_t type = op->type == GN_MSG_WS_PUT   ? GN_MSG_WS_PUT_ACK
                  : op->type == GN_MSG_WS_GET ? GN_MSG_WS_DATA
                                              : GN_MSG_WS_STAT_REPLY;
  if (op->rc == 0) {
    m.size = op->size;
    if (type == GN_MSG_WS_DATA) {
      m.data = op->data;
      m.data_len = op->len;
      m.eof = op->offset + op->len >= op->size;
    }
    m.exists = op->exists;
    m.has_sha256 = op->type == GN_MSG_WS_STAT && op->hash && op->exists;
    memcpy(m.sha256, op->sha256, sizeof m.sha256);
  } else if (type == GN_MSG_WS_DATA) {
    m.eof = true;
  }
  gn_wire_writer w;
  gn_wire_writer_init(&w);
  if (gn__wsmsg_encode(type, &m, &w) == 0)
    gn__node_send(n, op->peer, type, &w);
  gn_wire_writer_done(&w);
}

static void op_work(uv_work_t *w) {
  ws_op *op = w->data;
  ws_lease *wl = op->wl;
  char dir[PATH_MAX];
  /* A PUT to a lease resumed after a restart makes the storage, owned by
   * the daemon's user until the lease's next job gives it to the lease's
   * (gn__ws_prepare). */
  int r = ws_open(wl->n, wl->id, op->type == GN_MSG_WS_PUT, (uid_t)-1, dir, NULL);
  int root = r < 0 ? -1 : open(dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (r == 0 && root < 0)
    r = -errno;
  if (root < 0) {
    op->rc = r;
    if (op->type == GN_MSG_WS_STAT && r == -ENOENT) {
      op->rc = 0;
      op->exists = false;
    } else {
      gn__strf(op->reason, sizeof op->reason, "the lease's workspace cannot be opened: %s", gn_strerror(r));
    }
    return;
  }
  switch (op->type) {
  case GN_MSG_WS_PUT: {
    uint64_t now = gn_mono_ms();
    if (!wl->walked || gn_ms_since(now, wl->walked_ms) >= WS_WALK_EVERY_MS) {
      wl->used = gn__ws_usage(root);
      wl->walked = true;
      wl->walked_ms = now;
    }
    op->rc = gn__ws_write(root, op->path, op->offset, op->data, op->len, &op->lim, &wl->used, &op->size, op->reason,
                          sizeof op->reason);
    break;
  }
  case GN_MSG_WS_GET:
    op->rc = gn__ws_read(root, op->path, op->offset, op->data, GN_WS_CHUNK, &op->len, &op->size, op->reason,
                         sizeof op->reason);
    break;
  default:
    op->rc = gn__ws_stat(root, op->path, op->hash, op->lim.cap_bytes, &op->exists, &op->size, op->sha256, op->reason,
                         sizeof op->reason);
    break;
  }
  close(root);
}

static void wl_next(ws_lease *wl);

static void op_after(uv_work_t *w, int status) {
  ws_op *op = w->data;
  ws_lease *wl = op->wl;
  gn_node *n = wl->n;
  if (status < 0 && op->rc == 0)
    op->rc = GN_ECANCELED;
  if (n->tp)
    ws_reply(n, op);
  wl->head = op->next;
  if (!wl->head)
    wl->tail = NULL;
  wl->queued--;
  ws_queued_total--;
  free(op->data);
  free(op);
  wl->running = false;
  wl_next(wl);
}

static void wl_next(ws_lease *wl) {
  while (wl->head && !wl->running) {
    ws_op *op = wl->head;
    op->w.data = op;
    if (uv_queue_work(wl->n->loop, &op->w, op_work, op_after) == 0) {
      wl->running = true;
      return;
    }
    op->rc = GN_ENOMEM;
    gn__strf(op->reason, sizeof op->reason, "the provider cannot queue the request");
    ws_reply(wl->n, op);
    wl->head = op->next;
    if (!wl->head)
      wl->tail = NULL;
    wl->queued--;
    ws_queued_total--;
    free(op->data);
    free(op);
  }
}

static void refuse(gn_node *n, const uint8_t peer[GN_PK_LEN], uint32_t type, const gn_wsmsg *req, const char *why) {
  ws_op op;
  ws_lease wl;
  memset(&op, 0, sizeof op);
  memset(&wl, 0, sizeof wl);
  gn__strf(wl.id, sizeof wl.id, "%s", req->lease_id);
  op.wl = &wl;
  op.type = type;
  memcpy(op.peer, peer, GN_PK_LEN);
  op.seq = req->seq;
  op.offset = req->offset;
  op.rc = GN_EPERM;
  gn__strf(op.reason, sizeof op.reason, "%s", why);
  ws_reply(n, &op);
}

void gn__ws_prov_on_message(gn_node *n, const uint8_t peer[GN_PK_LEN], const gn_envelope *env) {
  gn_wsmsg m;
  if (env->type != GN_MSG_WS_PUT && env->type != GN_MSG_WS_GET && env->type != GN_MSG_WS_STAT)
    return;
  if (gn__wsmsg_decode(env->type, env->body, env->body_len, &m) < 0) {
    gn_log_ratelimited("ws-malformed", GN_LOG_WARN, "dropped a malformed %s", gn_msg_type_name(env->type));
    return;
  }
  gn_lease *l = gn__lease_find(n, m.lease_id);
  /* Only the lease holder hears anything, even that the lease exists. */
  if (!n->cfg.provide || !l || l->role != GN_ROLE_PROVIDER || memcmp(l->ag.terms.requester, peer, GN_PK_LEN) != 0) {
    gn__wsmsg_done(&m);
    return;
  }
  ws_lease *wl = wl_find(n, m.lease_id);
  if (l->state != GN_LEASE_ACTIVE) {
    refuse(n, peer, env->type, &m, "the lease has ended: its workspace is gone");
    goto out;
  }
  if ((wl && wl->queued >= GN_WS_QUEUE_MAX) || ws_queued_total >= GN_WS_QUEUE_TOTAL) {
    refuse(n, peer, env->type, &m, "the provider is busy with this workspace; ask again shortly");
    goto out;
  }
  if (env->type == GN_MSG_WS_PUT && n->disk_low) {
    refuse(n, peer, env->type, &m,
           "the provider's disk is down to its free-space reserve: nothing more can be written");
    goto out;
  }
  ws_op *op = calloc(1, sizeof *op);
  size_t dlen = env->type == GN_MSG_WS_PUT ? m.data_len : env->type == GN_MSG_WS_GET ? GN_WS_CHUNK : 0;
  if (!op || (dlen && !(op->data = malloc(dlen))) || (!wl && !(wl = calloc(1, sizeof *wl)))) {
    if (op)
      free(op->data);
    free(op);
    refuse(n, peer, env->type, &m, "the provider is out of memory");
    goto out;
  }
  if (!wl->n) {
    wl->n = n;
    gn__strf(wl->id, sizeof wl->id, "%s", m.lease_id);
    wl->next = wls;
    wls = wl;
  }
  op->wl = wl;
  op->type = env->type;
  memcpy(op->peer, peer, GN_PK_LEN);
  op->seq = m.seq;
  op->offset = m.offset;
  op->hash = m.hash;
  gn__strf(op->path, sizeof op->path, "%s", m.path);
  if (env->type == GN_MSG_WS_PUT && m.data_len)
    memcpy(op->data, m.data, m.data_len);
  op->len = env->type == GN_MSG_WS_PUT ? m.data_len : 0;
  op->lim.cap_bytes = n->cfg.workspace_max_bytes;
  op->lim.reserve_bytes = n->cfg.disk_reserve_bytes;
  op->lim.reserve_path = n->cfg.data_dir; /* the workspace may be a file system of its own */
  char base[PATH_MAX];
  if (ws_base(n, m.lease_id, base, sizeof base) < 0) {
    free(op->data);
    free(op);
    refuse(n, peer, env->type, &m, "the lease's workspace has no path on this provider");
    goto out;
  }
  if (wl->tail)
    wl->tail->next = op;
  else
    wl->head = op;
  wl->tail = op;
  wl->queued++;
  ws_queued_total++;
  wl_next(wl);
out:
  gn__wsmsg_done(&m);
}

int gn__ws_prepare(gn_job *j, gn_bundle_spec *spec, gn_bundle_bind *binds, size_t bind_cap, char *path_buf,
                   size_t path_cap, char *err, size_t err_cap) {
  gn_node *n = j->node;
  char dir[PATH_MAX];
  if (spec->n_rw_binds + 1 > bind_cap || path_cap < PATH_MAX) {
    gn__strf(err, err_cap, "the job's /workspace has no path");
    return GN_ETOOBIG;
  }
  int r = ws_open(n, j->lease_id, true, j->id_count > 0 ? (uid_t)j->uid_base : (uid_t)-1, dir, path_buf);
  if (r < 0) {
    gn__strf(err, err_cap, "cannot make the lease's workspace: %s", gn_strerror(r));
    return r;
  }
  /* Made by a write before this job (after a restart): the lease's user
   * gets it now (through the view: its root is the upper dir's). */
  int fd = open(dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  struct stat st;
  if (fd < 0 || fstat(fd, &st) < 0 ||
      (j->id_count && st.st_uid != j->uid_base && fchown(fd, j->uid_base, j->uid_base) < 0)) {
    r = -errno;
    if (fd >= 0)
      close(fd);
    gn__strf(err, err_cap, "cannot give the lease's workspace to its user: %s", gn_strerror(r));
    return r;
  }
  close(fd);
  for (size_t i = 0; i < spec->n_rw_binds; i++)
    binds[i] = spec->rw_binds[i];
  binds[spec->n_rw_binds] = (gn_bundle_bind){path_buf, "/workspace"};
  spec->rw_binds = binds;
  spec->n_rw_binds++;
  return 0;
}

/* --- removal of ended leases' workspaces ---------------------------------------*/

typedef struct ws_rm {
  uv_work_t w;
  gn_node *n;
  char id[GN_LEASE_ID_STRLEN];
  char dir[PATH_MAX];
  char view[PATH_MAX]; /* empty without a mount namespace of our own */
  char fs[PATH_MAX];   /* where its image is mounted (alias path); empty likewise */
  int rc;
} ws_rm;

/* The view goes first: the storage is never removed from under a mounted
 * overlay. Storages an earlier run left have no view (it died with that
 * run's namespace): umount2 then fails, which is fine. */
static void rm_work(uv_work_t *w) {
  ws_rm *q = w->data;
  if (q->view[0]) {
    pthread_mutex_lock(&ws_view_lock);
    bool stuck = umount2(q->view, MNT_DETACH) < 0 && errno != EINVAL && errno != ENOENT;
    q->rc = stuck ? -errno : 0;
    if (!stuck)
      rmdir(q->view);
    pthread_mutex_unlock(&ws_view_lock);
    if (stuck)
      return;
  }
  /* The lease's file system (detached: the loop device is let go once the
   * last user is gone; nothing else may still hold it, its jobs are over). */
  if (q->fs[0] && umount2(q->fs, MNT_DETACH) < 0 && errno != EINVAL && errno != ENOENT) {
    q->rc = -errno;
    return;
  }
  q->rc = gn_rm_tree(q->dir);
}

static void rm_after(uv_work_t *w, int status) {
  ws_rm *q = w->data;
  (void)status;
  ws_removals--;
  for (size_t i = 0; i < WS_REMOVALS_MAX; i++)
    if (strcmp(ws_removing[i], q->id) == 0)
      ws_removing[i][0] = 0;
  if (q->rc == 0)
    gn_log(GN_LOG_INFO, "lease %s: its workspace was removed", q->id);
  else
    gn_log_ratelimited("ws-rm", GN_LOG_WARN, "lease %s: cannot remove its workspace yet: %s", q->id,
                       gn_strerror(q->rc));
  free(q);
}

static bool lease_jobs_live(gn_node *n, const char *lease_id) {
  for (gn_job *j = n->jobs; j; j = j->next)
    if (j->role == GN_ROLE_PROVIDER && strcmp(j->lease_id, lease_id) == 0 &&
        (j->state == GN_JOB_PENDING || j->state == GN_JOB_PULLING || j->state == GN_JOB_RUNNING || j->tasks ||
         j->handles_open))
      return true;
  return false;
}

/* --- what jobs write: the survey ------------------------------------------------
 *
 * A copy's writes are counted before they are made; what a job writes into
 * /workspace itself is only seen afterwards. Every WS_SURVEY_S the
 * workspaces of leases with running jobs are measured on the thread pool,
 * and the jobs of a lease whose workspace is past the budget are stopped. */

#define WS_SURVEY_S 10
#define WS_SURVEY_MAX 64 /* leases measured by one survey */

typedef struct ws_survey {
  uv_work_t w;
  gn_node *n;
  size_t count;
  struct {
    char id[GN_LEASE_ID_STRLEN];
    uint64_t bytes;
  } e[WS_SURVEY_MAX];
} ws_survey;

static bool ws_surveying;
static int64_t ws_survey_s;

static void survey_work(uv_work_t *w) {
  ws_survey *s = w->data;
  char dir[PATH_MAX];
  for (size_t i = 0; i < s->count; i++) {
    int fd = ws_open(s->n, s->e[i].id, false, (uid_t)-1, dir, NULL) < 0
                 ? -1
                 : open(dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    s->e[i].bytes = fd >= 0 ? gn__ws_usage(fd) : 0;
    if (fd >= 0)
      close(fd);
  }
}

static void survey_after(uv_work_t *w, int status) {
  ws_survey *s = w->data;
  gn_node *n = s->n;
  ws_surveying = false;
  uint64_t cap = n->cfg.workspace_max_bytes;
  for (size_t i = 0; status == 0 && i < s->count; i++) {
    if (s->e[i].bytes <= cap)
      continue;
    for (gn_job *j = n->jobs; j; j = j->next) {
      if (j->role != GN_ROLE_PROVIDER || strcmp(j->lease_id, s->e[i].id) != 0 ||
          (j->state != GN_JOB_PULLING && j->state != GN_JOB_RUNNING) || j->stop_requested || !n->stop_provided_job)
        continue;
      gn__strf(j->error, sizeof j->error, "the lease's workspace passed its budget (%llu MiB): the job was stopped",
               (unsigned long long)(cap >> 20));
      gn_log(GN_LOG_WARN, "job %s: %s (%llu MiB in /workspace)", j->id, j->error,
             (unsigned long long)(s->e[i].bytes >> 20));
      n->stop_provided_job(n, j);
    }
  }
  free(s);
}

static void survey_start(gn_node *n, int64_t now_s) {
  if (ws_surveying || now_s - ws_survey_s < WS_SURVEY_S)
    return;
  ws_survey_s = now_s;
  ws_survey *s = NULL;
  for (gn_lease *l = n->leases; l; l = l->next) {
    if (l->role != GN_ROLE_PROVIDER || l->state != GN_LEASE_ACTIVE)
      continue;
    bool running = false;
    for (gn_job *j = n->jobs; j && !running; j = j->next)
      running = j->role == GN_ROLE_PROVIDER && j->state == GN_JOB_RUNNING && strcmp(j->lease_id, l->id) == 0;
    if (!running)
      continue;
    if (!s && !(s = calloc(1, sizeof *s)))
      return;
    if (s->count == WS_SURVEY_MAX)
      break;
    char base[PATH_MAX];
    if (ws_base(n, l->id, base, sizeof base) < 0)
      continue;
    gn__strf(s->e[s->count].id, sizeof s->e[s->count].id, "%s", l->id);
    s->count++;
  }
  if (!s)
    return;
  s->n = n;
  s->w.data = s;
  if (uv_queue_work(n->loop, &s->w, survey_work, survey_after) < 0) {
    free(s);
    return;
  }
  ws_surveying = true;
}

void gn__ws_prov_tick(gn_node *n, int64_t now_s) {
  if (!n->cfg.provide || n->stopping)
    return;
  survey_start(n, now_s);
  if (now_s - ws_tick_s < WS_TICK_S)
    return;
  ws_tick_s = now_s;
  /* idle queues of leases that are over are forgotten */
  for (ws_lease **pp = &wls; *pp;) {
    ws_lease *wl = *pp;
    gn_lease *l = wl->n == n ? gn__lease_find(n, wl->id) : NULL;
    if (wl->n == n && !wl->head && !wl->running && (!l || l->state != GN_LEASE_ACTIVE)) {
      *pp = wl->next;
      free(wl);
      continue;
    }
    pp = &wl->next;
  }
  char parent[PATH_MAX];
  gn__strf(parent, sizeof parent, "%s/workspace", n->cfg.data_dir);
  DIR *d = opendir(parent);
  if (!d)
    return;
  struct dirent *e;
  while ((e = readdir(d)) && ws_removals < WS_REMOVALS_MAX) {
    if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0 || !gn_id_valid(e->d_name) ||
        strlen(e->d_name) >= GN_LEASE_ID_STRLEN)
      continue;
    gn_lease *l = gn__lease_find(n, e->d_name);
    if ((l && l->role == GN_ROLE_PROVIDER && l->state == GN_LEASE_ACTIVE) || wl_find(n, e->d_name) ||
        lease_jobs_live(n, e->d_name))
      continue;
    bool busy = false;
    size_t slot = WS_REMOVALS_MAX;
    for (size_t i = 0; i < WS_REMOVALS_MAX; i++) {
      busy |= strcmp(ws_removing[i], e->d_name) == 0;
      if (!ws_removing[i][0] && slot == WS_REMOVALS_MAX)
        slot = i;
    }
    if (busy || slot == WS_REMOVALS_MAX)
      continue;
    ws_rm *q = calloc(1, sizeof *q);
    if (!q)
      break;
    q->n = n;
    gn__strf(q->id, sizeof q->id, "%s", e->d_name);
    char fs_host[PATH_MAX];
    if (gn_path_join(q->dir, sizeof q->dir, parent, NULL, e->d_name, NULL) < 0 ||
        (n->data_alias[0] && ws_view_path(n, e->d_name, q->view, sizeof q->view) < 0) ||
        gn__pathf(fs_host, sizeof fs_host, "%s/fs", q->dir) < 0 ||
        (n->data_alias[0] && alias_of(n, fs_host, q->fs) < 0)) {
      free(q);
      continue;
    }
    q->w.data = q;
    if (uv_queue_work(n->loop, &q->w, rm_work, rm_after) < 0) {
      free(q);
      break;
    }
    gn__strf(ws_removing[slot], sizeof ws_removing[slot], "%s", q->id);
    ws_removals++;
  }
  closedir(d);
}
