/* The provider agent (provider.c): offers, lease requests, jobs in the
 * sandbox, metering and invoices of the leases this node provides. */
#ifndef GPUNET_NODE_PROVIDER_H
#define GPUNET_NODE_PROVIDER_H

#include "records.h"

void gn__provider_publish_offers(gn_node *n, int64_t now_s);
void gn__provider_withdraw_offers(gn_node *n);
void gn__provider_on_message(gn_node *n, const uint8_t peer[GN_PK_LEN], const gn_envelope *env, const uint8_t *raw,
                             size_t raw_len);
void gn__provider_tick(gn_node *n, uint64_t now_ms, int64_t now_s);
void gn__provider_end_lease(gn_node *n, gn_lease *l, const char *reason);
void gn__provider_peer_up(gn_node *n, const uint8_t peer[GN_PK_LEN]);
void gn__provider_peer_down(gn_node *n, const uint8_t peer[GN_PK_LEN]);
/* load_state: rebuilds a provider lease's machine from its newest persisted
 * state and the ledger (an active lease resumes metering). */
int gn__provider_restore(gn_node *n, gn_lease *l, const uint8_t *state, size_t len);
void gn__provider_stop_job(gn_node *n, gn_job *j);
/* Kills again the stopped jobs whose container outlived the last kill (run
 * by the tick, and by the shutdown's wait, which stops the tick). */
void gn__provider_kill_again(gn_node *n, uint64_t now_ms);
/* At start, before any lease: budgets from config and the host, whether
 * limits and user namespaces can be enforced. GN_EUNSUPPORTED (with why in
 * err) when this host must not provide under its config. */
int gn__provider_init(gn_node *n, char *err, size_t cap);
/* Thread-pool work of the provider still queued or running, or job
 * processes still open: shutdown waits for these. */
bool gn__provider_busy(const gn_node *n);
/* What `gpunet status` says about how jobs are isolated here. */
json_t *gn__provider_status_json(const gn_node *n);
/* Whether this host can run jobs in their own user namespace with a mapped
 * id range (a probe: a child unshares and its map is written); why not in
 * why. Blocking, once at start. */
bool gn__userns_probe(char *why, size_t cap);

#endif
