/* One cgroup per lease that all the lease's jobs nest under, holding the
 * lease's CPU quota and its memory and pids ceilings, so a lease running
 * eight jobs gets its share of the host once, not eight times. Works on
 * cgroup v1 (and hybrid) hierarchies and on the unified v2 hierarchy. */
#include <gpunet/base.h>
#include <gpunet/sandbox.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/magic.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <unistd.h>

#define CG_DEFAULT_ROOT "/sys/fs/cgroup"
#define CG_DIR "gpunet"
#define CG_PERIOD_DEFAULT_US 100000u

/* The override is set by tests before any thread uses it; the lock only
 * keeps a reader from seeing half a path. */
static pthread_mutex_t root_lock = PTHREAD_MUTEX_INITIALIZER;
static char root_override[1024];
static gn_cgroup_layout layout_override;

void gn_cgroup_set_root(const char *root, gn_cgroup_layout layout) {
  pthread_mutex_lock(&root_lock);
  if (root && strlen(root) < sizeof root_override) {
    snprintf(root_override, sizeof root_override, "%s", root);
    layout_override = layout;
  } else {
    root_override[0] = 0;
    layout_override = GN_CGROUP_NONE;
  }
  pthread_mutex_unlock(&root_lock);
}

static bool fs_is(const char *path, long magic) {
  struct statfs sf;
  return statfs(path, &sf) == 0 && (long)sf.f_type == magic;
}

/* The root and the layout in use: the override, or what the host mounts. */
static gn_cgroup_layout root_get(char root[1024]) {
  gn_cgroup_layout lay;
  pthread_mutex_lock(&root_lock);
  if (root_override[0]) {
    memcpy(root, root_override, 1024);
    lay = layout_override;
    pthread_mutex_unlock(&root_lock);
    return lay;
  }
  pthread_mutex_unlock(&root_lock);
  snprintf(root, 1024, "%s", CG_DEFAULT_ROOT);
  if (fs_is(root, CGROUP2_SUPER_MAGIC))
    return GN_CGROUP_V2;
  /* v1 or hybrid (a tmpfs with one hierarchy per controller, and maybe a
   * cgroup2 "unified" without controllers): the runtime limits jobs
   * through the v1 hierarchies. */
  if (fs_is(CG_DEFAULT_ROOT "/cpu", CGROUP_SUPER_MAGIC))
    return GN_CGROUP_V1;
  return GN_CGROUP_NONE;
}

gn_cgroup_layout gn_cgroup_layout_get(void) {
  char root[1024];
  return root_get(root);
}

static void errf(char *err, size_t cap, const char *fmt, ...) {
  if (!err || !cap)
    return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(err, cap, fmt, ap);
  va_end(ap);
}

/* snprintf that reports truncation. */
static int pathf(char *buf, size_t cap, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int k = vsnprintf(buf, cap, fmt, ap);
  va_end(ap);
  return k < 0 || (size_t)k >= cap ? GN_ETOOBIG : 0;
}

/* Writes text to an existing control file (never created: a missing file
 * means the controller is not there, in a fake tree as on the host). */
static int write_file(const char *path, const char *text) {
  int fd = open(path, O_WRONLY | O_TRUNC | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0)
    return -errno;
  size_t len = strlen(text);
  ssize_t w;
  do
    w = write(fd, text, len);
  while (w < 0 && errno == EINTR);
  int r = w < 0 ? -errno : (size_t)w != len ? GN_EIO : 0;
  if (close(fd) < 0 && r == 0)
    r = -errno;
  return r;
}

static int mkdir_ok(const char *path) {
  return mkdir(path, 0755) < 0 && errno != EEXIST ? -errno : 0;
}

int gn_cgroup_lease_path(const char *lease_id, const char *job_id, char *buf, size_t cap) {
  if (!buf || !cap || !gn_id_valid(lease_id) || (job_id && !gn_id_valid(job_id)))
    return GN_EINVAL;
  int r = job_id ? pathf(buf, cap, "/%s/%s/%s", CG_DIR, lease_id, job_id) : pathf(buf, cap, "/%s/%s", CG_DIR, lease_id);
  if (r < 0)
    buf[0] = 0;
  return r;
}

/* One control file of the lease's cgroup, naming it in err on failure. */
static int set_value(const char *dir, const char *file, const char *value, char *err, size_t cap) {
  char path[1400];
  int r = pathf(path, sizeof path, "%s/%s", dir, file);
  if (r == 0)
    r = write_file(path, value);
  if (r < 0)
    errf(err, cap, "cannot write %s to %s/%s: %s", value, dir, file, gn_strerror(r));
  return r;
}

/* Enables cpu, memory and pids for dir's children unless they already are:
 * a cgroup that holds processes itself (the root of a container's cgroup
 * namespace, say) refuses the write even when it would change nothing. */
static int enable_controllers(const char *dir, char *err, size_t cap) {
  char path[1400], buf[512];
  int r = pathf(path, sizeof path, "%s/cgroup.subtree_control", dir);
  if (r < 0)
    return r;
  int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd >= 0) {
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    bool cpu = false, mem = false, pids = false;
    buf[n > 0 ? n : 0] = 0;
    for (char *save = NULL, *t = strtok_r(buf, " \n", &save); t; t = strtok_r(NULL, " \n", &save)) {
      cpu = cpu || strcmp(t, "cpu") == 0;
      mem = mem || strcmp(t, "memory") == 0;
      pids = pids || strcmp(t, "pids") == 0;
    }
    if (cpu && mem && pids)
      return 0;
  }
  return set_value(dir, "cgroup.subtree_control", "+cpu +memory +pids", err, cap);
}

static int create_v2(const char *root, const char *lease_id, const gn_cgroup_limits *lim, char *err, size_t cap) {
  char top[1100], dir[1200], v[64];
  int r;
  /* The controllers must be enabled in every parent's subtree_control for
   * the lease's cgroup (and its jobs, below it) to have their files. The
   * runtime would enable them for the job's own cgroup; these two levels
   * are ours. */
  if ((r = pathf(top, sizeof top, "%s/%s", root, CG_DIR)) < 0 ||
      (r = pathf(dir, sizeof dir, "%s/%s", top, lease_id)) < 0) {
    errf(err, cap, "cgroup path under %s too long", root);
    return r;
  }
  if ((r = enable_controllers(root, err, cap)) < 0)
    return r;
  if ((r = mkdir_ok(top)) < 0) {
    errf(err, cap, "cannot create the cgroup %s: %s", top, gn_strerror(r));
    return r;
  }
  if ((r = enable_controllers(top, err, cap)) < 0)
    return r;
  if ((r = mkdir_ok(dir)) < 0) {
    errf(err, cap, "cannot create the cgroup %s: %s", dir, gn_strerror(r));
    return r;
  }
  if (lim->cpu_quota_us) {
    snprintf(v, sizeof v, "%llu %llu", (unsigned long long)lim->cpu_quota_us,
             (unsigned long long)(lim->cpu_period_us ? lim->cpu_period_us : CG_PERIOD_DEFAULT_US));
    if ((r = set_value(dir, "cpu.max", v, err, cap)) < 0)
      return r;
  }
  if (lim->memory_bytes) {
    snprintf(v, sizeof v, "%llu", (unsigned long long)lim->memory_bytes);
    if ((r = set_value(dir, "memory.max", v, err, cap)) < 0)
      return r;
  }
  if (lim->pids_max) {
    snprintf(v, sizeof v, "%u", lim->pids_max);
    if ((r = set_value(dir, "pids.max", v, err, cap)) < 0)
      return r;
  }
  return enable_controllers(dir, err, cap);
}

/* mkdir root/ctrl/gpunet/lease_id; dir gets the lease's path there. */
static int mkdir_v1(const char *root, const char *ctrl, const char *lease_id, char *dir, size_t dcap, char *err,
                    size_t cap) {
  char top[1200];
  int r;
  if ((r = pathf(top, sizeof top, "%s/%s/%s", root, ctrl, CG_DIR)) < 0 ||
      (r = pathf(dir, dcap, "%s/%s", top, lease_id)) < 0) {
    errf(err, cap, "cgroup path under %s too long", root);
    return r;
  }
  if ((r = mkdir_ok(top)) < 0 || (r = mkdir_ok(dir)) < 0)
    errf(err, cap, "cannot create the cgroup %s: %s", dir, gn_strerror(r));
  return r;
}

static int create_v1(const char *root, const char *lease_id, const gn_cgroup_limits *lim, char *err, size_t cap) {
  char dir[1300], v[64];
  int r;
  if (lim->cpu_quota_us) {
    if ((r = mkdir_v1(root, "cpu", lease_id, dir, sizeof dir, err, cap)) < 0)
      return r;
    /* The period first: the kernel checks quota against it, and a child's
     * quota against its parent's. */
    snprintf(v, sizeof v, "%llu", (unsigned long long)(lim->cpu_period_us ? lim->cpu_period_us : CG_PERIOD_DEFAULT_US));
    if ((r = set_value(dir, "cpu.cfs_period_us", v, err, cap)) < 0)
      return r;
    snprintf(v, sizeof v, "%llu", (unsigned long long)lim->cpu_quota_us);
    if ((r = set_value(dir, "cpu.cfs_quota_us", v, err, cap)) < 0)
      return r;
  }
  if (lim->memory_bytes) {
    if ((r = mkdir_v1(root, "memory", lease_id, dir, sizeof dir, err, cap)) < 0)
      return r;
    /* Old kernels count a child's memory against its parent only with
     * use_hierarchy; new ones always do and may refuse the write. */
    char uh[1400];
    if (pathf(uh, sizeof uh, "%s/memory.use_hierarchy", dir) == 0)
      (void)write_file(uh, "1");
    snprintf(v, sizeof v, "%llu", (unsigned long long)lim->memory_bytes);
    if ((r = set_value(dir, "memory.limit_in_bytes", v, err, cap)) < 0)
      return r;
  }
  if (lim->pids_max) {
    if ((r = mkdir_v1(root, "pids", lease_id, dir, sizeof dir, err, cap)) < 0)
      return r;
    snprintf(v, sizeof v, "%u", lim->pids_max);
    if ((r = set_value(dir, "pids.max", v, err, cap)) < 0)
      return r;
  }
  return 0;
}

int gn_cgroup_lease_create(const char *lease_id, const gn_cgroup_limits *limits, char *err, size_t err_cap) {
  char root[1024];
  if (!gn_id_valid(lease_id) || !limits) {
    errf(err, err_cap, "not a lease id");
    return GN_EINVAL;
  }
  switch (root_get(root)) {
  case GN_CGROUP_V2:
    return create_v2(root, lease_id, limits, err, err_cap);
  case GN_CGROUP_V1:
    return create_v1(root, lease_id, limits, err, err_cap);
  default:
    errf(err, err_cap, "no cgroup v1 cpu hierarchy or cgroup v2 under %s", root);
    return GN_EUNSUPPORTED;
  }
}

/* rmdir dir and the directories below it, deepest first. Only
 * directories: a cgroup's files go with it, and one that still holds a
 * process stays (EBUSY), which is reported. Depth is bounded: jobs nest
 * one level below a lease, the runtime's own sub-cgroups a few more. */
static int rmdir_tree(const char *dir, int depth) {
  int r = 0;
  if (depth > 8)
    return GN_ETOOBIG;
  DIR *d = opendir(dir);
  if (!d)
    return errno == ENOENT ? 0 : -errno;
  struct dirent *e;
  while ((e = readdir(d))) {
    if (e->d_type != DT_DIR || strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
      continue;
    char sub[4096];
    int k = pathf(sub, sizeof sub, "%s/%s", dir, e->d_name);
    if (k == 0)
      k = rmdir_tree(sub, depth + 1);
    if (k < 0 && r == 0)
      r = k;
  }
  closedir(d);
  if (rmdir(dir) < 0 && errno != ENOENT && r == 0)
    r = -errno;
  return r;
}

/* Calls fn(dir) for root/gpunet (v2) or root/<each hierarchy>/gpunet (v1:
 * all of them, since the runtime creates the job's path in every
 * hierarchy it joins, not only in the three this file limits). */
static int each_top(int (*fn)(const char *top, void *ud), void *ud) {
  char root[1024], top[1400];
  int r = 0, k;
  gn_cgroup_layout lay = root_get(root);
  if (lay == GN_CGROUP_V2) {
    if ((r = pathf(top, sizeof top, "%s/%s", root, CG_DIR)) == 0)
      r = fn(top, ud);
    return r;
  }
  if (lay != GN_CGROUP_V1)
    return 0;
  DIR *d = opendir(root);
  if (!d)
    return -errno;
  struct dirent *e;
  while ((e = readdir(d))) {
    /* Links ("cpu" -> "cpu,cpuacct") name a hierarchy seen under its own
     * name too. */
    if (e->d_type != DT_DIR || e->d_name[0] == '.')
      continue;
    if ((k = pathf(top, sizeof top, "%s/%s/%s", root, e->d_name, CG_DIR)) == 0)
      k = fn(top, ud);
    if (k < 0 && r == 0)
      r = k;
  }
  closedir(d);
  return r;
}

static int remove_one(const char *top, void *ud) {
  char dir[4096];
  int r = pathf(dir, sizeof dir, "%s/%s", top, (const char *)ud);
  return r < 0 ? r : rmdir_tree(dir, 0);
}

int gn_cgroup_lease_remove(const char *lease_id) {
  if (!gn_id_valid(lease_id))
    return GN_EINVAL;
  return each_top(remove_one, (void *)lease_id);
}

typedef struct stale_ctx {
  bool (*mine)(const char *lease_id, void *ud);
  void *ud;
  unsigned count;
} stale_ctx;

static int remove_all(const char *top, void *ud) {
  stale_ctx *c = ud;
  int r = 0, k;
  DIR *d = opendir(top);
  if (!d)
    return errno == ENOENT ? 0 : -errno;
  struct dirent *e;
  while ((e = readdir(d))) {
    /* Only what a lease id could have made, and only the caller's leases:
     * another daemon on this host keeps its own. */
    if (e->d_type != DT_DIR || !gn_id_valid(e->d_name) || (c->mine && !c->mine(e->d_name, c->ud)))
      continue;
    char dir[4096];
    if ((k = pathf(dir, sizeof dir, "%s/%s", top, e->d_name)) == 0 && (k = rmdir_tree(dir, 0)) == 0)
      c->count++;
    if (k < 0 && r == 0)
      r = k;
  }
  closedir(d);
  return r;
}

int gn_cgroup_remove_stale(bool (*mine)(const char *lease_id, void *ud), void *ud, unsigned *ret_removed) {
  stale_ctx c = {mine, ud, 0};
  int r = each_top(remove_all, &c);
  if (r == 0 && ret_removed)
    *ret_removed = c.count;
  return r;
}

/* Whether the comma-separated list names ctrl. */
static bool list_has(const char *list, const char *ctrl) {
  size_t n = strlen(ctrl);
  for (const char *p = list;;) {
    size_t len = strcspn(p, ",");
    if (len == n && strncmp(p, ctrl, n) == 0)
      return true;
    if (!p[len])
      return false;
    p += len + 1;
  }
}

/* The cgroup.procs file of the cgroup this process is in, in the hierarchy
 * the layout limits jobs through (v1: the pids one; v2: the unified one). */
static int own_procs_file(const char *root, gn_cgroup_layout lay, char *buf, size_t cap) {
  FILE *f = fopen("/proc/self/cgroup", "re");
  if (!f)
    return -errno;
  char line[4096];
  int r = GN_ENOTFOUND;
  while (r == GN_ENOTFOUND && fgets(line, sizeof line, f)) {
    line[strcspn(line, "\n")] = 0;
    /* "hierarchy-id:controller,list:/path" */
    char *list = strchr(line, ':');
    char *path = list ? strchr(list + 1, ':') : NULL;
    if (!path || path[1] != '/')
      continue;
    *path++ = 0;
    list++;
    if (lay == GN_CGROUP_V2 && strcmp(line, "0") == 0 && !list[0])
      r = pathf(buf, cap, "%s%s/cgroup.procs", root, strcmp(path, "/") ? path : "");
    else if (lay == GN_CGROUP_V1 && list_has(list, "pids"))
      r = pathf(buf, cap, "%s/%s%s/cgroup.procs", root, list, strcmp(path, "/") ? path : "");
  }
  fclose(f);
  return r;
}

int gn_cgroup_attach_warm(void) {
  static atomic_bool busy;
  char root[1024], procs[4096], pid[24];
  pthread_mutex_lock(&root_lock);
  bool fake = root_override[0] != 0;
  pthread_mutex_unlock(&root_lock);
  if (fake)
    return GN_EUNSUPPORTED; /* a fake tree has no lock to take */
  gn_cgroup_layout lay = root_get(root);
  if (lay == GN_CGROUP_NONE)
    return GN_EUNSUPPORTED;
  if (atomic_exchange(&busy, true))
    return GN_EBUSY;
  int r = own_procs_file(root, lay, procs, sizeof procs);
  if (r == 0) {
    snprintf(pid, sizeof pid, "%ld", (long)getpid());
    r = write_file(procs, pid);
  }
  atomic_store(&busy, false);
  return r;
}
