/* What the NAT and relay bodies' codecs (p2p/nat.c, p2p/relay.c) share:
 * internal to the library. */
#ifndef GPUNET_P2P_NAT_BODY_H
#define GPUNET_P2P_NAT_BODY_H

#include <gpunet/wire.h>

#define GN__NAT_BODY_MAX 512 /* no NAT or relay body is longer */

/* Takes w's bytes into ret and releases w. */
int gn__nat_take(gn_wire_writer *w, gn_buf *ret);
/* A decoded body's root: a map of at most max entries (GN_EINVAL, or
 * GN_ETOOBIG over GN__NAT_BODY_MAX; doc is released on failure). */
int gn__nat_open_map(const uint8_t *body, size_t len, size_t max, gn_wire_doc *doc);
/* An address field: numeric host:port (gn_nat_addr_valid), or "" where
 * empty_ok. */
int gn__nat_get_addr(const msgpack_object *map, const char *key, bool empty_ok, char *out, size_t cap);

#endif
