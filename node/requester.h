/* The requester agent (requester.c): renting from an offer, job manifests,
 * job status and logs, releases, and checking and countersigning the
 * provider's notes and invoice. */
#ifndef GPUNET_NODE_REQUESTER_H
#define GPUNET_NODE_REQUESTER_H

#include "records.h"

void gn__requester_on_message(gn_node *n, const uint8_t peer[GN_PK_LEN], const gn_envelope *env, const uint8_t *raw,
                              size_t raw_len);
void gn__requester_peer_up(gn_node *n, const uint8_t peer[GN_PK_LEN]);
void gn__requester_peer_down(gn_node *n, const uint8_t peer[GN_PK_LEN]);
/* A dial to addr expecting provider `expected` reached node `got`: the lease
 * requests still waiting to be sent to `expected` fail now. */
void gn__requester_dial_refused(gn_node *n, const char *addr, const uint8_t expected[GN_PK_LEN],
                                const uint8_t got[GN_PK_LEN]);
/* load_state: rebuilds a requester lease's machine (its observation from
 * our own persisted UTC of receipt). */
int gn__requester_restore(gn_node *n, gn_lease *l, const uint8_t *state, size_t len);
void gn__requester_tick(gn_node *n, uint64_t now_ms, int64_t now_s);
/* Its control routes: POST /v1/leases (rent), DELETE /v1/leases/:id
 * (release), POST /v1/jobs (run) and POST /v1/jobs/:id/stop (a job this
 * node provides is stopped through the node's stop_provided_job hook). */
void gn__requester_register(gn_node *n);

#endif
