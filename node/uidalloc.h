/* Host-wide user namespace slots (issue 6: two leases never share a host
 * uid). Every gpunetd on a host numbers its leases' uid ranges from the same
 * slots (node/provider.c: GN_USERNS_BASE + 65536 * slot), so a slot is
 * claimed host-wide: slot s is held by whoever holds an flock(2) on the file
 * DIR/slot-<s> (DIR: gn_uidalloc_dir()). The lock lives as long as the
 * descriptor: a crashed holder's slots are free again at once (the kernel
 * drops its locks with the process), and nothing has to be cleaned up.
 * Locks are per open file, so two claims in one process never get the same
 * slot either. The files are never removed (removing one while another
 * process opens it would let two hold "the same" slot). */
#ifndef GPUNET_NODE_UIDALLOC_H
#define GPUNET_NODE_UIDALLOC_H

#include <stdint.h>

/* The default directory, and the environment variable that overrides it
 * (tests, hosts whose /run is elsewhere). Not under /run/gpunet: each
 * provider mounts a private tmpfs there in its own mount namespace
 * (provider.c, GN_DATA_ALIAS_DIR), so a directory below it would be each
 * daemon's own and no lock would be seen by another daemon. */
#define GN_UIDALLOC_DIR "/run/gpunet-uid-slots"
#define GN_UIDALLOC_DIR_ENV "GN_UID_SLOT_DIR"

/* GN_UID_SLOT_DIR when set and not empty, else GN_UIDALLOC_DIR. */
const char *gn_uidalloc_dir(void);

/* Claims the lowest slot below nslots that no process on the host holds and
 * keeps it until gn_uidalloc_release (or the process ends). dir is created
 * (mode 0700, its parents 0755) when missing; it must be a directory owned by
 * this user and writable by nobody else (GN_EPERM otherwise: anyone who can
 * write there could take every slot). GN_EBUSY: every slot is held;
 * GN_EINVAL: bad arguments; -errno when the directory or a lock file cannot
 * be made or opened. */
int gn_uidalloc_claim(const char *dir, uint32_t nslots, uint32_t *ret_slot);

/* Releases a slot this process claimed in dir. GN_ENOTFOUND if it holds
 * none such. */
int gn_uidalloc_release(const char *dir, uint32_t slot);

/* How many slots this process holds (all directories). */
uint32_t gn_uidalloc_held(void);

#endif
