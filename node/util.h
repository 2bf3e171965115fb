/* Small string helpers of the daemon's files: hex, and snprintf for paths
 * (fails rather than cut) and for messages (cuts). Depends on nothing of the
 * node. */
#ifndef GPUNET_NODE_UTIL_H
#define GPUNET_NODE_UTIL_H

#include <stddef.h>
#include <stdint.h>

/* out gets 2n lowercase hex digits and a NUL. */
void gn__hex(const uint8_t *p, size_t n, char *out);
/* snprintf for file paths: GN_ETOOBIG (and an empty buf) if it would not fit. */
int gn__pathf(char *buf, size_t cap, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* snprintf for messages and names, where cutting a long value short is the
 * intended behaviour. */
void gn__strf(char *buf, size_t cap, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

#endif
