/* The sandbox: image references, the OCI registry client, the
 * content-addressed image store, layer unpacking, OCI bundle generation and
 * the OCI runtime (runc or crun). Depends on no other gpunet module. */
#ifndef GPUNET_SANDBOX_H
#define GPUNET_SANDBOX_H

#include <gpunet/base.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

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

typedef void (*gn_pull_progress_fn)(void *ud, const char *what, uint64_t done, uint64_t total);

/* Pulls a digest-pinned reference (ref->digest must be set) into the store:
 * Bearer token auth when the registry asks, image index -> linux/amd64
 * manifest, OCI and Docker schema-2 media types, every blob verified by
 * sha256 while streaming (GN_EDIGEST on mismatch, nothing kept). Blobs
 * already in the store are not fetched again. Blocking: run it off the
 * event loop. */
int gn_store_pull(gn_store *s, const gn_imageref *ref, gn_pull_progress_fn progress, void *ud, gn_image *ret, char *err,
                  size_t err_cap);

/* Unpacks the image's layers in order into rootfs (created), honouring
 * whiteouts and opaque directories and refusing absolute paths, "..",
 * device nodes and links that escape the root (GN_EPERM, naming the entry in
 * err). Blocking. */
int gn_store_unpack(gn_store *s, const gn_image *img, const char *rootfs, char *err, size_t err_cap);

/* --- bundles --------------------------------------------------------------*/

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
char **gn_argv_free(char **argv);

/* Runs argv (argv[0] a path) to completion: fork, exec, wait. ret_status
 * gets the exit code, or 128 + signal number. stdin/stdout/stderr are
 * inherited. Blocking: for tests and the daemon's cleanup (kill, delete),
 * never for a job, which the daemon watches with uv_spawn. */
int gn_runtime_exec(char **argv, int *ret_status);
/* The same with the child's stdio redirected to the given fds (-1: inherit).
 * Descriptors above 2 are closed in the child. */
int gn_runtime_exec_io(char *const *argv, int stdin_fd, int stdout_fd, int stderr_fd, int *ret_status);

#endif
