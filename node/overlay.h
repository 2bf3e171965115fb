/* The daemon's overlay glue (overlay.c): SWIM membership (gpunet/swim.h) on
 * a UDP socket bound to the transport's listen address, every datagram a
 * signed envelope, bounded, rate-limited per source before its signature is
 * checked; HyParView partial views (gpunet/views.h) over the sessions, whose
 * active view is who discovery pushes offers to. docs/overlay/daemon.md. */
#ifndef GPUNET_NODE_OVERLAY_H
#define GPUNET_NODE_OVERLAY_H

#include "node_internal.h"

#include <jansson.h>

/* The most bytes of one datagram read; a longer one is dropped. */
#define GN_OVERLAY_DGRAM_MAX 1400
/* Per source host (any port): a bucket of this many datagrams refilled at
 * this rate, in a table of this many sources (gn_ratelimit: a source whose
 * bucket is full again, else the least recently seen of its set, makes
 * room). Then one bucket for all sources together. */
#define GN_OVERLAY_SRC_RATE_PER_S 100
#define GN_OVERLAY_SRC_BURST 200
#define GN_OVERLAY_SRC_MAX 1024
#define GN_OVERLAY_ALL_RATE_PER_S 2000
#define GN_OVERLAY_ALL_BURST 4000

/* Starts membership when the config says overlay = on: binds UDP on the
 * transport's listen address (the transport listens already) and starts
 * the SWIM timer. A socket that cannot be bound is logged and leaves the
 * node without membership (status says why); only running out of memory
 * fails (GN_ENOMEM, err set). */
int gn__overlay_start(gn_node *n, char *err, size_t cap);
/* A session came up with a peer advertising addr: it becomes a member to
 * probe at the same host:port over UDP (its key is proven by the session),
 * and the partial views hear of the session (a bootstrap node's is the
 * contact they JOIN through). */
void gn__overlay_peer_up(gn_node *n, const uint8_t peer[GN_PK_LEN], const char *addr);
/* A session went down: the partial views drop the peer from their active
 * view. Membership is not told: SWIM finds out on its own. */
void gn__overlay_peer_down(gn_node *n, const uint8_t peer[GN_PK_LEN]);
/* A peer named by another (a PEERS entry): a candidate for the passive
 * view, as hearsay. */
void gn__overlay_heard(gn_node *n, const uint8_t id[GN_PK_LEN], const char *addr);
/* A view message (GN_MSG_VIEW_*) over the session to peer, whose signer the
 * caller checked is peer: gn_views_on_message's code, GN_ESTATE without
 * views. */
int gn__overlay_on_message(gn_node *n, const uint8_t peer[GN_PK_LEN], const gn_envelope *env);
/* Graceful shutdown begins: announces the leave and sends what that
 * sends at once; the socket stays open (answers carry the leave) until
 * gn__overlay_close. Harmless when not started. */
void gn__overlay_stop(gn_node *n);
/* When the sessions close: closes the socket and the timer once the leave
 * was told (an answer went out since, or 3 s passed since the leave, or
 * nobody is left to tell; the loop runs until then). */
void gn__overlay_close(gn_node *n);
/* After the loop ended: frees what is left. Harmless when not started. */
void gn__overlay_free(gn_node *n);
/* Adds "overlay", "members", "health" and "datagrams" to a status object. */
void gn__overlay_status_json(gn_node *n, json_t *o);
/* GET /v1/members: the members this node knows, each with its state. */
void gn__overlay_register(gn_node *n);
/* Where a peer stands in the partial views: "active", "passive", "none",
 * or NULL without views. */
const char *gn__overlay_view_of(gn_node *n, const uint8_t id[GN_PK_LEN]);
/* A member's state ("alive", "suspect", "dead", "left"), or NULL when id
 * is not a member or there is no membership. */
const char *gn__overlay_member_state(gn_node *n, const uint8_t id[GN_PK_LEN]);
/* A live member's advertised address (alive or suspect) into out, or
 * GN_ENOTFOUND (not a member, dead, left, or no membership). */
int gn__overlay_member_addr(gn_node *n, const uint8_t id[GN_PK_LEN], char *out, size_t cap);
/* This node is reached at addr (node/nat.c's advertised address): the
 * membership advertises it from now on. Harmless without membership. */
void gn__overlay_set_addr(gn_node *n, const char *addr);

#endif
