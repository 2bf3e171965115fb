/* A lease's workspace (issue 10 item 3; docs/protocol.md §3.2,
 * docs/sandbox.md "The workspace"): a writable directory on the provider,
 * DATA_DIR/workspace/LEASE/upper, seen through an overlay view that every
 * job of the lease binds at /workspace (so no job's mountinfo shows the
 * data dir's path), and removed when the lease has ended; `gpunet cp` copies files in
 * and out of it over the lease's session. ws_prov.c is the provider's side
 * (the file operations, run on the thread pool one at a time per lease,
 * and the glue), ws_req.c the requester's (the control routes). */
#ifndef GPUNET_NODE_WS_H
#define GPUNET_NODE_WS_H

#include "records.h"
#include "wsmsg.h"

#include <gpunet/sandbox.h>

#define GN_WS_QUEUE_MAX 128    /* requests of one lease queued on the provider; more are refused "busy" */
#define GN_WS_QUEUE_TOTAL 1024 /* ... of all leases together */
#define GN_WS_WALK_ENTRIES 100000
#define GN_WS_WALK_DEPTH 64

/* --- the file operations (blocking; tests call them directly) -------------
 *
 * root is a directory descriptor of the workspace; path has passed
 * gn__ws_path_norm. Every component is opened relative to the one before
 * it with O_NOFOLLOW, so no symbolic link anywhere on the way is followed
 * (the job owns the tree and may plant links, fifos or hard links): such a
 * path is refused, and nothing outside the workspace is read or written.
 * Only regular files with one link are read or written. On refusal the
 * functions return a negative GN_* code and write a reason a renter can
 * read into reason (cap bytes). */

typedef struct gn_ws_limits {
  uint64_t cap_bytes;     /* the workspace's budget (config workspace_max) */
  uint64_t reserve_bytes; /* free space the write must leave on the file system (disk_reserve) */
  /* The file system that reserve is kept on when it is not the one the
   * workspace is on (a lease's own file system): the data dir. NULL: the
   * workspace's. */
  const char *reserve_path;
} gn_ws_limits;

/* Bytes the tree under root holds on disk (st_blocks), the walk bounded by
 * GN_WS_WALK_ENTRIES entries and GN_WS_WALK_DEPTH levels; links are not
 * followed. */
uint64_t gn__ws_usage(int root);
/* Writes len bytes at offset into path (created, with missing parent
 * directories, owned like root, when absent) and makes the file end at
 * offset + len. Refused: offset past the file's current size (no holes),
 * *used + the growth over lim->cap_bytes, the growth into the free-space
 * reserve. *used is the workspace's usage, updated by the growth.
 * ret_size: the file's size after. */
int gn__ws_write(int root, const char *path, uint64_t offset, const uint8_t *data, size_t len, const gn_ws_limits *lim,
                 uint64_t *used, uint64_t *ret_size, char *reason, size_t cap);
/* Reads at most buf_cap bytes at offset; offset past the end is refused. */
int gn__ws_read(int root, const char *path, uint64_t offset, uint8_t *buf, size_t buf_cap, size_t *ret_len,
                uint64_t *ret_size, char *reason, size_t cap);
/* ret_exists false (and 0) when there is no such file; with hash, the
 * SHA-256 of the whole file, refused when it is larger than hash_max. */
int gn__ws_stat(int root, const char *path, bool hash, uint64_t hash_max, bool *ret_exists, uint64_t *ret_size,
                uint8_t ret_sha256[32], char *reason, size_t cap);

/* --- provider glue (ws_prov.c) -------------------------------------------- */

/* At a lease's start (on the loop): makes its workspace, owned by the
 * lease's host uid (uid_base) when it has a user namespace (userns), and
 * mounts its view where gpunetd has its own mount namespace. */
void gn__ws_lease_start(gn_node *n, const char *lease_id, uint32_t uid_base, bool userns);
/* WS_PUT, WS_GET, WS_STAT from peer: answered only to the lease's
 * requester while the lease is active (anyone else, or an ended lease,
 * gets nothing); the work is queued per lease on the thread pool. */
void gn__ws_prov_on_message(gn_node *n, const uint8_t peer[GN_PK_LEN], const gn_envelope *env);
/* The worker's part of a job's preparation: makes the workspace (and its
 * view) if it is missing and adds the view's bind at /workspace to spec
 * (the directory's own without a view), after the binds spec
 * already has (copied into binds, bind_cap entries; path_buf holds the
 * source). GN_* with err on failure. */
int gn__ws_prepare(gn_job *j, gn_bundle_spec *spec, gn_bundle_bind *binds, size_t bind_cap, char *path_buf,
                   size_t path_cap, char *err, size_t err_cap);
/* Every tick: workspaces of leases that are not active and whose jobs are
 * gone are removed (on the thread pool; the view detached first), those an
 * earlier run left too. */
void gn__ws_prov_tick(gn_node *n, int64_t now_s);

/* --- requester glue (ws_req.c) ---------------------------------------------*/

/* GET /v1/leases/:id/files/stat, GET and POST /v1/leases/:id/files. */
void gn__ws_register(gn_node *n);
/* WS_PUT_ACK, WS_DATA, WS_STAT_REPLY from peer. */
void gn__ws_req_on_message(gn_node *n, const uint8_t peer[GN_PK_LEN], const gn_envelope *env);
/* Control requests waiting past their deadline are answered 504. */
void gn__ws_req_tick(gn_node *n, uint64_t now_ms);
/* At shutdown: every waiting control request is answered 503. */
void gn__ws_req_shutdown(gn_node *n);

#endif
