/* The sandbox: image references, the OCI registry client, the
 * content-addressed image store, layer unpacking, OCI bundle generation and
 * the OCI runtime (runc or crun). Depends on no other gpunet module. */
#ifndef GPUNET_SANDBOX_H
#define GPUNET_SANDBOX_H

#include <gpunet/base.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/* --- image references -----------------------------------------------------*/

#define GN_DIGEST_STRLEN 72 /* "sha256:" + 64 hex + NUL */

typedef struct gn_imageref {
  char registry[256];            /* "127.0.0.1:5000" or "registry-1.docker.io" */
  char repository[256];          /* "library/busybox" */
  char tag[128];                 /* "latest" when neither tag nor digest given */
  char digest[GN_DIGEST_STRLEN]; /* "" unless pinned */
  bool plain_http;               /* loopback registries speak plain HTTP */
} gn_imageref;

/* Parses "host[:port]/repo[:tag][@sha256:hex]". GN_EINVAL with no change to
 * ret on anything malformed. */
int gn_imageref_parse(const char *s, gn_imageref *ret);
/* Formats as registry/repository[:tag][@digest]. */
int gn_imageref_format(const gn_imageref *r, char *buf, size_t cap);

/* --- registry and store ---------------------------------------------------*/

/* Resolves the reference's tag to the digest of its manifest (or image
 * index), so a job can be pinned to it. */
int gn_registry_resolve(const gn_imageref *ref, char ret_digest[GN_DIGEST_STRLEN], char *err, size_t err_cap);

typedef struct gn_store gn_store;

/* The image store under dir: blobs/sha256/<hex>, each verified by its
 * digest before it is kept. */
int gn_store_open(const char *dir, gn_store **ret);
gn_store *gn_store_free(gn_store *s);

typedef struct gn_image {
  char manifest_digest[GN_DIGEST_STRLEN]; /* the platform manifest */
  size_t layer_count;
  char (*layers)[GN_DIGEST_STRLEN]; /* layer blob digests, bottom first */
  char **entrypoint;                /* NULL-terminated, from the image config */
  char **cmd;
  char **env;
  char workdir[256];
  uint64_t bytes_fetched; /* 0 when everything was already in the store */
} gn_image;

void gn_image_done(gn_image *img);

/* The job's argv (NULL-terminated, free with gn_argv_free): the image's
 * entrypoint followed by cmd when cmd is non-empty, else by the image's own
 * cmd, as Docker does. GN_EINVAL when that leaves nothing to run. */
int gn_image_argv(const gn_image *img, const char *const *cmd, char ***ret_argv);
/* The job's environment (free with gn_argv_free): the image's entries, each
 * replaced by the job's entry of the same name, then the job's new names.
 * GN_EINVAL for a job entry without "NAME=". */
int gn_image_env(const gn_image *img, const char *const *env, char ***ret_env);

/* A pull's progress: once with what = GN_PULL_PROGRESS_TOTAL, done 0 and
 * total the bytes of the blobs not yet in the store (0: nothing to fetch),
 * then for each blob fetched its short digest, the bytes it holds so far
 * and its size. Called on the pulling thread. */
typedef void (*gn_pull_progress_fn)(void *ud, const char *what, uint64_t done, uint64_t total);
#define GN_PULL_PROGRESS_TOTAL "image"

/* Pulls a digest-pinned reference (ref->digest must be set) into the store:
 * Bearer token auth when the registry asks, image index -> linux/amd64
 * manifest, OCI and Docker schema-2 media types, every blob verified by
 * sha256 while streaming (GN_EDIGEST on mismatch, nothing kept). Blobs
 * already in the store are not fetched again. Blocking: run it off the
 * event loop. */
int gn_store_pull(gn_store *s, const gn_imageref *ref, gn_pull_progress_fn progress, void *ud, gn_image *ret, char *err,
                  size_t err_cap);

/* --- the provider's limits on pulls, unpacks and the store -----------------*/
/* (owner: sandbox/store.c, registry.c, unpack.c) */

/* Store-wide policy, set once by the daemon from its config (copied,
 * including the allow list). Zero fields take the GN_STORE_DEFAULT_*s. */
typedef struct gn_store_limits {
  uint64_t layer_max_bytes;          /* uncompressed bytes per layer */
  uint64_t image_max_bytes;          /* uncompressed bytes per image */
  uint64_t layer_max_entries;        /* tar entries per layer */
  uint64_t image_max_entries;        /* tar entries per image */
  uint64_t reserve_bytes;            /* free space kept on the store's filesystem (the ledger's room) */
  uint64_t store_max_bytes;          /* blobs + unpacked roots; older unused ones are collected past it */
  uint32_t blob_timeout_s;           /* deadline for one blob */
  uint32_t pull_timeout_s;           /* deadline for a whole pull */
  const char *const *registry_allow; /* NULL-terminated: "127.0.0.1", "127.0.0.1:5000", "10.0.0.0/8"... */
} gn_store_limits;

#define GN_STORE_DEFAULT_LAYER_MAX_BYTES (8ull << 30)
#define GN_STORE_DEFAULT_IMAGE_MAX_BYTES (16ull << 30)
#define GN_STORE_DEFAULT_LAYER_MAX_ENTRIES 500000ull
#define GN_STORE_DEFAULT_IMAGE_MAX_ENTRIES 1000000ull
#define GN_STORE_DEFAULT_RESERVE_BYTES (1ull << 30)
#define GN_STORE_DEFAULT_MAX_BYTES (64ull << 30)
#define GN_STORE_DEFAULT_BLOB_TIMEOUT_S 600u
#define GN_STORE_DEFAULT_PULL_TIMEOUT_S 1800u

int gn_store_set_limits(gn_store *s, const gn_store_limits *l);

/* Per-call options of a pull or an unpack. cancel, when not NULL, is read
 * from the worker thread: once it is non-zero the call stops within a
 * second with GN_ECANCELED and leaves nothing half-written behind. */
typedef struct gn_pull_opts {
  gn_pull_progress_fn progress;
  void *progress_ud;
  const volatile int *cancel;
} gn_pull_opts;

/* Pulls like gn_store_pull, under the store's limits and with opts (may be
 * NULL). A registry on a loopback, link-local, private or this host's own
 * address is refused (GN_EPERM) unless the allow list names it. Registry
 * error bodies go to err_log (the provider's log), never to err (which the
 * renter may see). err_log may be NULL. */
int gn_store_pull_ex(gn_store *s, const gn_imageref *ref, const gn_pull_opts *opts, gn_image *ret, char *err,
                     size_t err_cap, char *err_log, size_t err_log_cap);

typedef struct gn_unpack_opts {
  const volatile int *cancel;
  /* Ownership follows the job's user namespace: an entry owned by uid u in
   * the layer is owned by uid_base + u on the host; u >= id_count is
   * refused. id_count 0: no shift (files keep the layer's ids). */
  uint32_t uid_base;
  uint32_t gid_base;
  uint32_t id_count;
} gn_unpack_opts;

/* The image's read-only root, unpacked once per (image, uid_base) under the
 * store and shared by every job that runs it: ret_path gets its absolute
 * path. Counted as in use until gn_store_rootfs_release; roots not in use
 * are collected when the store is over its budget. Blocking. */
int gn_store_rootfs(gn_store *s, const gn_image *img, const gn_unpack_opts *opts, char ret_path[4096], char *err,
                    size_t err_cap);
void gn_store_rootfs_release(gn_store *s, const char *path);

/* Removes unused unpacked roots and blobs, oldest first, until the store is
 * within store_max_bytes (and the reserve is free). Blocking. */
int gn_store_gc(gn_store *s, uint64_t *ret_freed_bytes);

/* Unpacks the image's layers in order into rootfs (created), honouring
 * whiteouts and opaque directories and refusing absolute paths, "..",
 * device nodes and links that escape the root (GN_EPERM, naming the entry in
 * err). Blocking. */
int gn_store_unpack(gn_store *s, const gn_image *img, const char *rootfs, char *err, size_t err_cap);
/* Removes path and everything under it, never following a symlink, making
 * read-only directories the owner's first (image trees have them). 0 when
 * it is gone or was never there. Blocking. */
int gn_rm_tree(const char *path);
int gn_store_unpack_ex(gn_store *s, const gn_image *img, const char *rootfs, const gn_unpack_opts *opts, char *err,
                       size_t err_cap);

/* --- bundles --------------------------------------------------------------*/

/* (owner: sandbox/bundle.c, sandbox/seccomp.c) */

/* A host path that appears in the container at dest: a character device
 * (source is stat'ed for its major/minor; a fake tree in tests) or a file
 * or directory bind-mounted read-only (driver libraries). */
typedef struct gn_bundle_bind {
  const char *source;
  const char *dest;
} gn_bundle_bind;

typedef struct gn_bundle_spec {
  const char *rootfs; /* path relative to the bundle dir, usually "rootfs" */
  const char *const *argv;
  const char *const *env;
  const char *cwd;
  const char *hostname;
  bool network;                /* false: a new, empty network namespace */
  uint64_t memory_bytes;       /* 0: no limit */
  uint32_t pids_max;           /* 0: no limit */
  uint64_t nofile;             /* RLIMIT_NOFILE */
  const char *const *devices;  /* GPU device nodes to pass in, NULL-terminated */
  const char *visible_devices; /* NVIDIA_VISIBLE_DEVICES, NULL for none */
  bool cgroup_limits;          /* false where the cgroup layout cannot apply them */
  /* User namespace: container ids 0..id_count-1 map to host
   * uid_base../gid_base..; id_count 0 means no user namespace (only where
   * the provider opted in to run without one). */
  uint32_t uid_base;
  uint32_t gid_base;
  uint32_t id_count;
  uint64_t cpu_quota_us;           /* CPU time per cpu_period_us; 0: no CPU limit */
  uint64_t cpu_period_us;          /* 0: 100000 */
  const gn_bundle_bind *dev_nodes; /* extra character devices (GPU control, UVM) */
  size_t n_dev_nodes;
  const gn_bundle_bind *ro_binds; /* read-only bind mounts (driver libraries, nvidia-smi) */
  size_t n_ro_binds;
  bool no_seccomp; /* tests only: the default seccomp profile is always on otherwise */
  /* linux.cgroupsPath, NULL for the runtime's default: absolute, each
   * component in the id grammar (gn_id_valid), at most 4 of them, e.g.
   * "/gpunet/<lease>/<job>" from gn_cgroup_lease_path. */
  const char *cgroups_path;
  /* An existing network namespace the job joins instead of a new, empty
   * one (a training job's: lo and its WireGuard interface, made by the
   * provider; an `ip netns`-style bind mount or /proc/PID/ns/net). An
   * absolute path; NULL: a new one. The job's user namespace does not own
   * it, so the job cannot change its interfaces or routes. */
  const char *netns_path;
  /* Read-write bind mounts (a training job's /output): each source an
   * existing directory, each dest absolute and outside /proc, /sys and
   * /dev; mounted nosuid, nodev. */
  const gn_bundle_bind *rw_binds;
  size_t n_rw_binds;
} gn_bundle_spec;

/* Writes bundle_dir/config.json: new namespaces, read-only root with a
 * writable tmpfs /tmp, no new privileges, no capabilities, masked and
 * read-only /proc paths, rlimits and the limits in spec. */
int gn_bundle_write(const char *bundle_dir, const gn_bundle_spec *spec);

/* True when this host's cgroup layout can apply memory and pids limits:
 * cgroup v2 with both controllers enabled at the root, or cgroup v1 (or
 * hybrid) with memory and pids hierarchies mounted. Set
 * gn_bundle_spec.cgroup_limits from it. */
bool gn_cgroup_limits_supported(void);

/* --- the lease's cgroup (owner: sandbox/cgroup.c) --------------------------*/

/* All jobs of a lease nest under one cgroup, gpunet/<lease> at the root of
 * each hierarchy, that holds the lease's CPU quota and its memory and pids
 * ceilings: v1 (and hybrid) cpu/, memory/ and pids/ hierarchies, or the v2
 * unified one with the controllers enabled down to it. Blocking (cgroupfs
 * writes): off the event loop. */
typedef enum gn_cgroup_layout { GN_CGROUP_NONE = 0, GN_CGROUP_V1 = 1, GN_CGROUP_V2 = 2 } gn_cgroup_layout;

typedef struct gn_cgroup_limits {
  uint64_t cpu_quota_us;  /* CPU time per cpu_period_us; 0: no CPU limit */
  uint64_t cpu_period_us; /* 0: 100000 */
  uint64_t memory_bytes;  /* 0: no limit */
  uint32_t pids_max;      /* 0: no limit */
} gn_cgroup_limits;

/* The layout under the cgroup root in use (the host's, or the override). */
gn_cgroup_layout gn_cgroup_layout_get(void);
/* Tests: root instead of /sys/fs/cgroup, with the layout to assume there (a
 * fake tree, a plain directory with the control files made beforehand, has
 * no cgroup file system to tell it). NULL: the host's again. */
void gn_cgroup_set_root(const char *root, gn_cgroup_layout layout);
/* The runtime's cgroupsPath of a job of the lease, "/gpunet/<lease>/<job>"
 * (job_id NULL: the lease's own, "/gpunet/<lease>"). GN_EINVAL unless both
 * ids pass gn_id_valid. */
int gn_cgroup_lease_path(const char *lease_id, const char *job_id, char *buf, size_t cap);
/* Creates the lease's cgroup (existing is fine: a second call rewrites the
 * same limits) and writes the non-zero limits. GN_EUNSUPPORTED without a
 * usable layout; -errno naming the file in err when a write is refused. */
int gn_cgroup_lease_create(const char *lease_id, const gn_cgroup_limits *limits, char *err, size_t err_cap);
/* Removes the lease's cgroup and the (empty) job cgroups left below it, in
 * every hierarchy. 0 when none is there; -EBUSY while a process is in it. */
int gn_cgroup_lease_remove(const char *lease_id);
/* Removes the lease cgroups under gpunet/ that mine (NULL: all) claims,
 * with what is below them (daemon start: what a crash left). Cgroups still
 * holding a process stay and make it fail; ret_removed counts directories
 * removed (one per hierarchy on v1). */
int gn_cgroup_remove_stale(bool (*mine)(const char *lease_id, void *ud), void *ud, unsigned *ret_removed);
/* Moves this process into the cgroup it is already in (a move that changes
 * nothing), to switch the kernel's cgroup migration lock to its slow path
 * ahead of the runtime: the first cgroup.procs write after a quiet spell
 * waits for an RCU grace period (4-20 ms on a busy 2-CPU host), which
 * `runc run` otherwise pays when it puts a container's init into its
 * cgroups; a write made while a job is prepared leaves the lock warm for
 * the runtime's. Blocking for that grace period: on a thread of its own.
 * GN_EBUSY while another call is under way; GN_EUNSUPPORTED without a
 * cgroup file system (or with the root overridden by a test). */
int gn_cgroup_attach_warm(void);

/* --- GPU passthrough (owner: sandbox/nvidia.c) ---------------------------*/

#define GN_NVIDIA_MAX_NODES 24
#define GN_NVIDIA_MAX_BINDS 96

/* What a job on the leased GPUs needs from the host, found the way the
 * NVIDIA container toolkit finds it: the GPUs' /dev/nvidiaN, the control
 * and UVM nodes, and the driver's user-space libraries and tools, each
 * ready to hand to gn_bundle_spec (nodes -> dev_nodes, binds -> ro_binds). */
typedef struct gn_nvidia_pass {
  size_t n_nodes;
  gn_bundle_bind nodes[GN_NVIDIA_MAX_NODES];
  size_t n_binds;
  gn_bundle_bind binds[GN_NVIDIA_MAX_BINDS];
  char strings[GN_NVIDIA_MAX_NODES + GN_NVIDIA_MAX_BINDS][2][512]; /* storage the pointers point into */
} gn_nvidia_pass;

/* root: "/" on a real host, a fake tree in tests. minors: the leased GPUs'
 * /dev/nvidiaN numbers. GN_ENOTFOUND when a leased GPU's node is missing. */
int gn_nvidia_passthrough(const char *root, const unsigned *minors, size_t n, gn_nvidia_pass *ret, char *err,
                          size_t err_cap);

/* --- runtime --------------------------------------------------------------*/

typedef enum gn_runtime_kind { GN_RUNTIME_RUNC = 1, GN_RUNTIME_CRUN = 2 } gn_runtime_kind;

typedef struct gn_runtime {
  gn_runtime_kind kind;
  char path[256];
  char version[64];
} gn_runtime;

/* Finds a working OCI runtime. `name` ("runc", "crun", a path, or NULL for
 * auto) overrides detection. Auto prefers crun on a unified cgroup v2
 * hierarchy and runc otherwise, and checks the binary runs. */
int gn_runtime_detect(const char *name, gn_runtime *ret, char *err, size_t err_cap);
/* argv (NULL-terminated, caller frees with gn_argv_free) for
 * `RUNTIME --root STATE run --bundle BUNDLE ID`, `kill ID SIG`, `delete -f ID`. */
int gn_runtime_argv_run(const gn_runtime *rt, const char *state_root, const char *bundle, const char *id,
                        char ***ret_argv);
int gn_runtime_argv_kill(const gn_runtime *rt, const char *state_root, const char *id, const char *signal,
                         char ***ret_argv);
int gn_runtime_argv_delete(const gn_runtime *rt, const char *state_root, const char *id, char ***ret_argv);
/* `RUNTIME --root STATE exec --no-new-privs [--tty] [--pid-file F] [--env
 * K=V]... ID CMD...`: one more process in a running container, with the
 * container's user, capabilities, seccomp and cgroup. env: NULL or a
 * NULL-terminated list of KEY=VALUE. */
int gn_runtime_argv_exec(const gn_runtime *rt, const char *state_root, const char *id, bool tty, const char *pid_file,
                         char *const *env, char *const *cmd, char ***ret_argv);
/* Whether the runtime keeps state for container id under state_root (runc
 * and crun: a directory state_root/id). `run` removes it when the container
 * has ended and been destroyed, so a delete after it would only start the
 * runtime again for nothing; true unless known to be absent. */
bool gn_runtime_has_state(const char *state_root, const char *id);
char **gn_argv_free(char **argv);

/* Runs argv (argv[0] a path) to completion: spawn, wait. ret_status gets
 * the exit code, or 128 + signal number (127: argv[0] cannot be run).
 * stdin/stdout/stderr are inherited. Blocking: for tests and the daemon's
 * cleanup (kill, delete), never for a job (gn_runtime_spawn). */
int gn_runtime_exec(char **argv, int *ret_status);
/* The same with the child's stdio redirected to the given fds (-1: inherit).
 * Descriptors above 2 are closed in the child. */
int gn_runtime_exec_io(char *const *argv, int stdin_fd, int stdout_fd, int stderr_fd, int *ret_status);
/* Starts argv without waiting for it, the way the daemon starts a job's
 * `runc run`: stdin from /dev/null, stdout and stderr onto the given fds,
 * the other descriptors closed, default signal dispositions, empty signal
 * mask; with posix_spawn (vfork-like: no copy of the daemon's page tables).
 * ret_pidfd gets a pidfd (close-on-exec, the caller's to close) that turns
 * readable when the process ends; reap it then with gn_runtime_reap.
 * GN_EUNSUPPORTED without pidfds (Linux before 5.3): nothing started. */
int gn_runtime_spawn(char *const *argv, int stdout_fd, int stderr_fd, pid_t *ret_pid, int *ret_pidfd);
/* The same with stdin from stdin_fd (-1: /dev/null) and, with new_session,
 * in a session of its own (setsid), out of the daemon's process group. */
int gn_runtime_spawn_io(char *const *argv, int stdin_fd, int stdout_fd, int stderr_fd, bool new_session, pid_t *ret_pid,
                        int *ret_pidfd);
/* Whether gn_runtime_spawn can work here (the kernel has pidfd_open). */
bool gn_runtime_spawn_supported(void);
/* Reaps pid, started by gn_runtime_spawn, without blocking: ret_status as
 * gn_runtime_exec's; -EAGAIN while it runs. */
int gn_runtime_reap(pid_t pid, int *ret_status);

#endif
