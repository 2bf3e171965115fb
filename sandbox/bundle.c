/* OCI bundle generation: writes bundle_dir/config.json (runtime spec 1.0.2)
 * for a job with strict isolation, and tells whether the host's cgroup
 * layout can apply memory, pids and CPU limits.
 *
 * The process runs as uid 0:0 inside the container, with every capability
 * set empty, no-new-privileges and the seccomp allow list of seccomp.c.
 * Why root: images expect to own and read their files, and the root
 * filesystem is read-only anyway. With spec->id_count > 0 the job gets a
 * user namespace: its uid 0 is the unprivileged host uid spec->uid_base, so
 * on an escape it owns only the job's own files (the unpacker shifts the
 * rootfs ownership into the same range). Without one (a provider who opted
 * out) root without capabilities still cannot override file permissions,
 * mount, trace, load modules or use raw sockets, and seccomp refuses the
 * calls that need no capability (keyrings, io_uring, perf, userfaultfd).
 *
 * What the job can still learn about the host: the rootfs's host path is
 * the "root" field of "/" in /proc/self/mountinfo (runc resolves root.path
 * to an absolute path before it bind-mounts it, so a relative root.path or
 * a symlink does not hide it; only a rootfs that is itself a mount, not a
 * bind of a directory, would), and the host paths of ro_binds sources
 * appear there the same way. */
#include "sandbox_int.h"

#include <fcntl.h>
#include <jansson.h>
#include <linux/magic.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#define DEFAULT_PATH "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
#define DEFAULT_NOFILE 1024u
#define STRV_MAX 4096u
#define DEVICES_MAX 64u
#define BINDS_MAX 256u
#define PATH_MAX_LEN 1024u
#define CPU_PERIOD_DEFAULT_US 100000u
#define CPU_US_MIN 1000u /* the kernel's minimum quota and period: 1 ms */
#define CPU_PERIOD_MAX_US 1000000u
#define CPU_QUOTA_MAX_US (1000000ull * 4096u) /* a second of 4096 CPUs per period second */

/* The masked and read-only /proc and /sys paths are runc's defaults, plus
 * the host's GPU driver details (the job sees its own GPUs through the
 * device nodes and nvidia-smi), the power meters (RAPL energy counters are
 * a side channel on other tenants' work, "Platypus"), and interrupt
 * counts. Paths missing on a host are skipped by the runtime. */
static const char *const masked_paths[] = {
    "/proc/acpi",          "/proc/asound",
    "/proc/kcore",         "/proc/keys",
    "/proc/latency_stats", "/proc/timer_list",
    "/proc/timer_stats",   "/proc/sched_debug",
    "/sys/firmware",       "/proc/scsi",
    "/proc/driver/nvidia", "/sys/devices/virtual/powercap",
    "/proc/interrupts",    NULL,
};
static const char *const readonly_paths[] = {
    "/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger", NULL,
};

static json_t *strv_json(const char *const *v) {
  json_t *a = json_array();
  for (size_t i = 0; a && v && v[i]; i++)
    json_array_append_new(a, json_string(v[i]));
  return a;
}

static json_t *mount_json(const char *dest, const char *type, const char *source, const char *const *options) {
  json_t *m = json_pack("{s:s, s:s, s:s}", "destination", dest, "type", type, "source", source);
  if (m && options)
    json_object_set_new(m, "options", strv_json(options));
  return m;
}

static json_t *mounts_json(const gn_bundle_spec *s) {
  static const char *const dev[] = {"nosuid", "strictatime", "mode=755", "size=65536k", NULL};
  static const char *const pts[] = {"nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620", "gid=5", NULL};
  /* gid 5 (tty) must exist in a user namespace for devpts to take it. */
  static const char *const pts_nogid[] = {"nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620", NULL};
  static const char *const ro_bind[] = {"bind", "rbind", "ro", "nosuid", "nodev", NULL};
  static const char *const dev_bind[] = {"bind", "nosuid", "noexec", NULL};
  static const char *const shm[] = {"nosuid", "noexec", "nodev", "mode=1777", "size=65536k", NULL};
  static const char *const mq[] = {"nosuid", "noexec", "nodev", NULL};
  static const char *const sys[] = {"nosuid", "noexec", "nodev", "ro", NULL};
  static const char *const tmp[] = {"nosuid", "nodev", "mode=1777", "size=64m", NULL};
  json_t *a = json_array();
  if (!a)
    return NULL;
  json_array_append_new(a, mount_json("/proc", "proc", "proc", NULL));
  json_array_append_new(a, mount_json("/dev", "tmpfs", "tmpfs", dev));
  json_array_append_new(a,
                        mount_json("/dev/pts", "devpts", "devpts", s->id_count && s->id_count <= 5 ? pts_nogid : pts));
  json_array_append_new(a, mount_json("/dev/shm", "tmpfs", "shm", shm));
  json_array_append_new(a, mount_json("/dev/mqueue", "mqueue", "mqueue", mq));
  /* sysfs can be mounted only by an owner of the network namespace: a job
   * that joins the provider's (netns_path, not its user namespace's) gets
   * an empty read-only /sys instead (a bind of the host's would show the
   * host's interfaces). */
  static const char *const sys_empty[] = {"nosuid", "noexec", "nodev", "ro", "size=4k", NULL};
  if (s->netns_path)
    json_array_append_new(a, mount_json("/sys", "tmpfs", "tmpfs", sys_empty));
  else
    json_array_append_new(a, mount_json("/sys", "sysfs", "sysfs", sys));
  json_array_append_new(a, mount_json("/tmp", "tmpfs", "tmpfs", tmp));
  /* In a user namespace nobody can make device nodes: runtimes then
   * bind-mount the host's node found at the container path, which is not
   * the source when they differ (a fake tree, a renamed node). So the node
   * is bind-mounted from its source here, and the cgroup rule below still
   * lets the job open only that device. */
  for (size_t i = 0; s->id_count && i < s->n_dev_nodes; i++)
    json_array_append_new(a, mount_json(s->dev_nodes[i].dest, "bind", s->dev_nodes[i].source, dev_bind));
  for (size_t i = 0; i < s->n_ro_binds; i++)
    json_array_append_new(a, mount_json(s->ro_binds[i].dest, "bind", s->ro_binds[i].source, ro_bind));
  static const char *const rw_bind[] = {"bind", "rw", "nosuid", "nodev", NULL};
  for (size_t i = 0; i < s->n_rw_binds; i++)
    json_array_append_new(a, mount_json(s->rw_binds[i].dest, "bind", s->rw_binds[i].source, rw_bind));
  return a;
}

static bool env_has(const char *const *env, const char *prefix) {
  size_t n = strlen(prefix);
  for (size_t i = 0; env && env[i]; i++)
    if (strncmp(env[i], prefix, n) == 0)
      return true;
  return false;
}

static bool hostname_valid(const char *h) {
  size_t n = strlen(h);
  if (n == 0 || n > 63)
    return false;
  for (size_t i = 0; i < n; i++) {
    char c = h[i];
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '.'))
      return false;
  }
  return h[0] != '-';
}

static bool visible_devices_valid(const char *v) {
  size_t n = strlen(v);
  if (n == 0 || n > 512)
    return false;
  for (size_t i = 0; i < n; i++) {
    char c = v[i];
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == ',' || c == '-'))
      return false;
  }
  return true;
}

/* An absolute path with no "." or ".." component, no empty component and
 * no control bytes: what a mount destination or a bind source may be. */
static bool abs_path_valid(const char *p) {
  size_t n = strlen(p);
  if (n < 2 || n > PATH_MAX_LEN || p[0] != '/' || p[n - 1] == '/')
    return false;
  for (size_t i = 0; i < n; i++)
    if ((unsigned char)p[i] < 0x20 || p[i] == 0x7f || p[i] == ',')
      return false; /* a comma would split runtime mount options on some runtimes */
  for (const char *c = p + 1;;) {
    const char *e = strchr(c, '/');
    size_t len = e ? (size_t)(e - c) : strlen(c);
    if (len == 0 || (len == 1 && c[0] == '.') || (len == 2 && c[0] == '.' && c[1] == '.'))
      return false;
    if (!e)
      return true;
    c = e + 1;
  }
}

/* True when path is dir or beneath it ("/proc", "/proc/x"; not "/procfoo"). */
static bool path_under(const char *path, const char *dir) {
  size_t n = strlen(dir);
  return strncmp(path, dir, n) == 0 && (path[n] == '\0' || path[n] == '/');
}

static int validate_binds(const gn_bundle_spec *s) {
  if ((s->n_dev_nodes && !s->dev_nodes) || (s->n_ro_binds && !s->ro_binds) || (s->n_rw_binds && !s->rw_binds))
    return GN_EINVAL;
  if (s->n_dev_nodes > DEVICES_MAX || s->n_ro_binds > BINDS_MAX || s->n_rw_binds > BINDS_MAX)
    return GN_ETOOBIG;
  if (s->netns_path && !abs_path_valid(s->netns_path))
    return GN_EINVAL;
  for (size_t i = 0; i < s->n_rw_binds; i++) {
    const gn_bundle_bind *b = &s->rw_binds[i];
    struct stat st;
    if (!b->source || !b->dest || !abs_path_valid(b->source) || !abs_path_valid(b->dest) ||
        path_under(b->dest, "/proc") || path_under(b->dest, "/sys") || path_under(b->dest, "/dev"))
      return GN_EINVAL;
    if (stat(b->source, &st) < 0)
      return -errno;
    if (!S_ISDIR(st.st_mode))
      return GN_EINVAL;
  }
  for (size_t i = 0; i < s->n_dev_nodes; i++) {
    const gn_bundle_bind *b = &s->dev_nodes[i];
    if (!b->source || !b->dest || !abs_path_valid(b->source) || !abs_path_valid(b->dest) ||
        !path_under(b->dest, "/dev"))
      return GN_EINVAL;
  }
  for (size_t i = 0; i < s->n_ro_binds; i++) {
    const gn_bundle_bind *b = &s->ro_binds[i];
    struct stat st;
    if (!b->source || !b->dest || !abs_path_valid(b->source) || !abs_path_valid(b->dest))
      return GN_EINVAL;
    /* A bind over the kernel's own views would undo the masks. */
    if (path_under(b->dest, "/proc") || path_under(b->dest, "/sys") || path_under(b->dest, "/dev"))
      return GN_EINVAL;
    if (stat(b->source, &st) < 0)
      return -errno;
  }
  return 0;
}

/* linux.cgroupsPath: absolute, 1..4 components each in the id grammar, so
 * it can name no parent ("..") nor a path the runtime would resolve
 * relative to its own cgroup. */
static bool cgroups_path_valid(const char *p) {
  char comp[GN_ID_MAX + 1];
  size_t n = 0;
  if (p[0] != '/')
    return false;
  while (*p == '/') {
    const char *end = strchr(p + 1, '/');
    size_t len = end ? (size_t)(end - p - 1) : strlen(p + 1);
    if (len == 0 || len > GN_ID_MAX || ++n > 4)
      return false;
    memcpy(comp, p + 1, len);
    comp[len] = 0;
    if (!gn_id_valid(comp))
      return false;
    p += 1 + len;
  }
  return *p == 0;
}

static int validate(const gn_bundle_spec *s) {
  if (!s->argv || !s->argv[0] || !s->argv[0][0])
    return GN_EINVAL;
  size_t n = 0;
  for (const char *const *p = s->argv; *p; p++)
    if (++n > STRV_MAX)
      return GN_ETOOBIG;
  n = 0;
  for (const char *const *p = s->env; p && *p; p++) {
    const char *eq = strchr(*p, '=');
    if (!eq || eq == *p)
      return GN_EINVAL;
    if (++n > STRV_MAX)
      return GN_ETOOBIG;
  }
  if (s->cwd && s->cwd[0] != '/')
    return GN_EINVAL;
  if (s->hostname && !hostname_valid(s->hostname))
    return GN_EINVAL;
  if (s->rootfs && (!s->rootfs[0] || strstr(s->rootfs, "..")))
    return GN_EINVAL;
  if (s->visible_devices && !visible_devices_valid(s->visible_devices))
    return GN_EINVAL;
  if (s->id_count) {
    /* Container root mapped onto host root would be no namespace at all,
     * and a range must not wrap past the last uid. */
    if (s->uid_base == 0 || s->gid_base == 0 || (uint64_t)s->uid_base + s->id_count > UINT32_MAX ||
        (uint64_t)s->gid_base + s->id_count > UINT32_MAX)
      return GN_EINVAL;
  }
  if (s->cpu_quota_us) {
    uint64_t period = s->cpu_period_us ? s->cpu_period_us : CPU_PERIOD_DEFAULT_US;
    if (s->cpu_quota_us < CPU_US_MIN || s->cpu_quota_us > CPU_QUOTA_MAX_US || period < CPU_US_MIN ||
        period > CPU_PERIOD_MAX_US)
      return GN_EINVAL;
  } else if (s->cpu_period_us) {
    return GN_EINVAL; /* a period without a quota limits nothing: a caller's mistake */
  }
  if (s->cgroups_path && !cgroups_path_valid(s->cgroups_path))
    return GN_EINVAL;
  return validate_binds(s);
}

/* One character device at path with st's numbers (linux_devices NULL: the
 * node is bind-mounted instead), and its allow rule. */
static int add_device(const char *path, const struct stat *st, json_t *linux_devices, json_t *rules) {
  json_int_t major = (json_int_t)major(st->st_rdev), minor = (json_int_t)minor(st->st_rdev);
  if ((linux_devices &&
       json_array_append_new(linux_devices,
                             json_pack("{s:s, s:s, s:I, s:I, s:i, s:i, s:i}", "path", path, "type", "c", "major", major,
                                       "minor", minor, "fileMode", 0666, "uid", 0, "gid", 0)) < 0) ||
      json_array_append_new(rules, json_pack("{s:b, s:s, s:I, s:I, s:s}", "allow", 1, "type", "c", "major", major,
                                             "minor", minor, "access", "rwm")) < 0)
    return GN_ENOMEM;
  return 0;
}

/* Adds linux.devices and the matching allow rules for each GPU node. */
static int devices_json(const char *const *devices, json_t *linux_devices, json_t *rules) {
  size_t n = 0;
  for (const char *const *p = devices; p && *p; p++) {
    struct stat st;
    if (++n > DEVICES_MAX)
      return GN_ETOOBIG;
    if (strncmp(*p, "/dev/", 5) != 0 || strstr(*p, ".."))
      return GN_EINVAL;
    if (stat(*p, &st) < 0)
      return -errno;
    if (!S_ISCHR(st.st_mode))
      return GN_EINVAL; /* GPUs are character devices; anything else is a mistake */
    if (add_device(*p, &st, linux_devices, rules) < 0)
      return GN_ENOMEM;
  }
  return 0;
}

/* Adds spec->dev_nodes: each source is stat'ed on the host for its numbers
 * and appears at dest, made by the runtime (without a user namespace) or
 * bind-mounted (with one, see mounts_json); the cgroup lets the job use
 * only these. */
static int dev_nodes_json(const gn_bundle_spec *s, json_t *linux_devices, json_t *rules) {
  for (size_t i = 0; i < s->n_dev_nodes; i++) {
    struct stat st;
    if (stat(s->dev_nodes[i].source, &st) < 0)
      return -errno;
    if (!S_ISCHR(st.st_mode))
      return GN_EINVAL;
    if (add_device(s->dev_nodes[i].dest, &st, s->id_count ? NULL : linux_devices, rules) < 0)
      return GN_ENOMEM;
  }
  return 0;
}

static json_t *build(const gn_bundle_spec *s, int *ret_code) {
  json_t *root = NULL, *env = NULL, *linux_devices = NULL, *rules = NULL, *resources = NULL;
  json_t *caps = NULL, *process = NULL, *lx = NULL;
  int r = GN_ENOMEM;

  env = strv_json(s->env);
  if (!env)
    goto fail;
  if (!env_has(s->env, "PATH="))
    json_array_insert_new(env, 0, json_string(DEFAULT_PATH));
  if (s->visible_devices) {
    char v[600];
    snprintf(v, sizeof(v), "NVIDIA_VISIBLE_DEVICES=%s", s->visible_devices);
    json_array_append_new(env, json_string(v));
  }

  /* Empty sets: the job holds no capability at all, not even the handful
   * runc grants by default. */
  caps = json_pack("{s:[], s:[], s:[], s:[], s:[]}", "bounding", "effective", "inheritable", "permitted", "ambient");
  uint64_t nofile = s->nofile ? s->nofile : DEFAULT_NOFILE;
  process =
      json_pack("{s:b, s:{s:i, s:i}, s:o, s:o, s:s, s:o, s:b, s:[{s:s, s:I, s:I}, {s:s, s:i, s:i}]}", "terminal", 0,
                "user", "uid", 0, "gid", 0, "args", strv_json(s->argv), "env", env, "cwd", s->cwd ? s->cwd : "/",
                "capabilities", caps, "noNewPrivileges", 1, "rlimits", "type", "RLIMIT_NOFILE", "hard",
                (json_int_t)nofile, "soft", (json_int_t)nofile, "type", "RLIMIT_CORE", "hard", 0, "soft", 0);
  env = caps = NULL; /* owned by process (or freed by json_pack on failure) */
  if (!process)
    goto fail;

  linux_devices = json_array();
  rules = json_pack("[{s:b, s:s}]", "allow", 0, "access", "rwm"); /* default deny */
  if (!linux_devices || !rules)
    goto fail;
  if ((r = devices_json(s->devices, linux_devices, rules)) < 0 || (r = dev_nodes_json(s, linux_devices, rules)) < 0)
    goto fail;
  r = GN_ENOMEM;
  resources = json_pack("{s:o}", "devices", rules);
  rules = NULL;
  if (!resources)
    goto fail;
  if (s->cgroup_limits) {
    /* Only where the cgroup layout applies them (gn_cgroup_limits_supported,
     * which since the CPU limit also wants the cpu controller):
     * a runtime asked for limits it cannot set refuses to start at all. */
    if (s->memory_bytes)
      json_object_set_new(resources, "memory", json_pack("{s:I}", "limit", (json_int_t)s->memory_bytes));
    if (s->pids_max)
      json_object_set_new(resources, "pids", json_pack("{s:I}", "limit", (json_int_t)s->pids_max));
    if (s->cpu_quota_us)
      json_object_set_new(resources, "cpu",
                          json_pack("{s:I, s:I}", "quota", (json_int_t)s->cpu_quota_us, "period",
                                    (json_int_t)(s->cpu_period_us ? s->cpu_period_us : CPU_PERIOD_DEFAULT_US)));
  }

  /* Every job gets a new network namespace. With spec->network false it stays
   * empty (only a down loopback, which runc brings up). spec->network true
   * means the node may attach the job network to this namespace after the
   * container starts; in this version nothing here does that, so a job with
   * network=true is, for now, just as isolated: no interface but lo. */
  /* A cgroup namespace always: the job sees its own cgroup as "/", not the
   * provider's hierarchy and the other jobs' names in it. */
  lx = json_pack("{s:[{s:s}, {s:s}, {s:s}, {s:s}, {s:s}, {s:s}], s:o, s:o, s:o, s:o}", "namespaces", "type", "pid",
                 "type", "ipc", "type", "uts", "type", "mount", "type", "network", "type", "cgroup", "devices",
                 linux_devices, "resources", resources, "maskedPaths", strv_json(masked_paths), "readonlyPaths",
                 strv_json(readonly_paths));
  linux_devices = resources = NULL;
  if (!lx)
    goto fail;
  if (s->cgroups_path && json_object_set_new(lx, "cgroupsPath", json_string(s->cgroups_path)) < 0)
    goto fail;
  if (s->netns_path) { /* join the provider's namespace instead of a new one */
    json_t *ns = json_object_get(lx, "namespaces");
    for (size_t i = 0; i < json_array_size(ns); i++) {
      json_t *e = json_array_get(ns, i);
      if (strcmp(json_string_value(json_object_get(e, "type")), "network") == 0 &&
          json_object_set_new(e, "path", json_string(s->netns_path)) < 0)
        goto fail;
    }
  }
  if (s->id_count) {
    json_t *ns = json_object_get(lx, "namespaces");
    if (json_array_append_new(ns, json_pack("{s:s}", "type", "user")) < 0 ||
        json_object_set_new(lx, "uidMappings",
                            json_pack("[{s:i, s:I, s:I}]", "containerID", 0, "hostID", (json_int_t)s->uid_base, "size",
                                      (json_int_t)s->id_count)) < 0 ||
        json_object_set_new(lx, "gidMappings",
                            json_pack("[{s:i, s:I, s:I}]", "containerID", 0, "hostID", (json_int_t)s->gid_base, "size",
                                      (json_int_t)s->id_count)) < 0)
      goto fail;
  }
  if (!s->no_seccomp && json_object_set_new(lx, "seccomp", gn__seccomp_profile()) < 0)
    goto fail;

  root = json_pack("{s:s, s:o, s:{s:s, s:b}, s:s, s:o, s:o}", "ociVersion", "1.0.2", "process", process, "root", "path",
                   s->rootfs ? s->rootfs : "rootfs", "readonly", 1, "hostname", s->hostname ? s->hostname : "gpunet",
                   "mounts", mounts_json(s), "linux", lx);
  process = lx = NULL;
  if (!root)
    goto fail;
  return root;
fail:
  json_decref(env);
  json_decref(caps);
  json_decref(process);
  json_decref(linux_devices);
  json_decref(rules);
  json_decref(resources);
  json_decref(lx);
  *ret_code = r;
  return NULL;
}

int gn_bundle_write(const char *bundle_dir, const gn_bundle_spec *spec) {
  char path[4096], tmp[4096];
  int r;
  if (!bundle_dir || !spec || strlen(bundle_dir) > 4000)
    return GN_EINVAL;
  if ((r = validate(spec)) < 0)
    return r;
  if (mkdir(bundle_dir, 0700) < 0 && errno != EEXIST)
    return -errno;
  /* In a user namespace the runtime mounts the rootfs as the job's host
   * uid, which must be able to pass through the bundle directory (search,
   * not list). The directories above it need the same. */
  if (spec->id_count && chmod(bundle_dir, 0711) < 0)
    return -errno;
  json_t *cfg = build(spec, &r);
  if (!cfg)
    return r;
  snprintf(path, sizeof(path), "%s/config.json", bundle_dir);
  snprintf(tmp, sizeof(tmp), "%s/.config.json.tmp", bundle_dir);
  char *text = json_dumps(cfg, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
  json_decref(cfg);
  if (!text)
    return GN_ENOMEM;
  int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0644);
  if (fd < 0) {
    r = -errno;
    goto out;
  }
  size_t len = strlen(text), off = 0;
  r = 0;
  while (off < len) {
    ssize_t w = write(fd, text + off, len - off);
    if (w < 0 && errno == EINTR)
      continue;
    if (w < 0) {
      r = -errno;
      break;
    }
    off += (size_t)w;
  }
  if (close(fd) < 0 && r == 0)
    r = -errno;
  if (r == 0 && rename(tmp, path) < 0)
    r = -errno;
  if (r < 0)
    unlink(tmp);
out:
  free(text);
  return r;
}

static bool fs_is(const char *path, long magic) {
  struct statfs sf;
  return statfs(path, &sf) == 0 && (long)sf.f_type == magic;
}

bool gn_cgroup_limits_supported(void) {
  if (fs_is("/sys/fs/cgroup", CGROUP2_SUPER_MAGIC)) {
    /* Unified hierarchy: the controllers must be enabled at the root. */
    char buf[512] = "";
    int fd = open("/sys/fs/cgroup/cgroup.controllers", O_RDONLY | O_CLOEXEC);
    if (fd < 0)
      return false;
    ssize_t n = read(fd, buf, sizeof(buf) - 1);
    close(fd);
    if (n <= 0)
      return false;
    buf[n] = '\0';
    bool mem = false, pids = false, cpu = false;
    for (char *save = NULL, *t = strtok_r(buf, " \n", &save); t; t = strtok_r(NULL, " \n", &save)) {
      mem = mem || strcmp(t, "memory") == 0;
      pids = pids || strcmp(t, "pids") == 0;
      cpu = cpu || strcmp(t, "cpu") == 0;
    }
    return mem && pids && cpu;
  }
  /* cgroup v1 (or hybrid): the controllers mounted as their own hierarchies
   * ("cpu" is usually a link to "cpu,cpuacct"; statfs follows it). */
  return fs_is("/sys/fs/cgroup/memory", CGROUP_SUPER_MAGIC) && fs_is("/sys/fs/cgroup/pids", CGROUP_SUPER_MAGIC) &&
         fs_is("/sys/fs/cgroup/cpu", CGROUP_SUPER_MAGIC);
}
