/* The bytes a directory tree holds on disk, measured by a bounded walk that
 * follows no link: the workspace's budget (ws_prov.c) and the survey of
 * training jobs' /output (train_prov.c). Depends on nothing of the node. */
#ifndef GPUNET_NODE_DU_H
#define GPUNET_NODE_DU_H

#include <stdint.h>

/* The sum of st_blocks * 512 of every entry under dirfd, which it takes
 * (closed before it returns, also on failure). Subdirectories are opened
 * relative to their parent with O_NOFOLLOW, at most max_depth levels below
 * dirfd; the walk stops after max_entries entries in all. What cannot be
 * opened or stat'ed counts 0: a tree the job may change under us is measured
 * as well as it can be, never refused. */
uint64_t gn__du_tree(int dirfd, int max_depth, uint64_t max_entries);

#endif
