/* The requester's glue of `gpunet train` (train_req.c, issue 8): the control
 * routes /v1/train, the plan (offers, RTTs, billing/plan.c), the gang lease
 * (billing/gang.c, docs/protocol.md §2.13) driven by the requester's lease
 * events, and the ranks' manifests with their job network
 * (notes: train-iface.md). requester.c calls the hooks below and gives this
 * module the two lease services it needs (gn_train_ops), so this module never
 * includes requester.h. */
#ifndef GPUNET_NODE_TRAIN_REQ_H
#define GPUNET_NODE_TRAIN_REQ_H

#include "records.h"

/* What the requester agent does for a gang's leases. */
struct gn_train_ops {
  /* Adopts an agreement that passed our checks as a requester lease (its
   * billing machine, ledger, record): 0 and *ret, else an error (the lease
   * is then released by the requester). */
  int (*adopt)(gn_node *n, const uint8_t peer[GN_PK_LEN], const uint8_t *raw, size_t raw_len, const gn_agreement *ag,
               uint64_t max_spend_micro, uint64_t max_price_uper_hour, gn_lease **ret);
  /* Releases a requester lease this node holds (as DELETE /v1/leases/ID,
   * without an API request waiting); nothing if it is settled already. */
  void (*release)(gn_node *n, const char *lease_id, const char *reason);
};
typedef struct gn_train_ops gn_train_ops;

/* Registers POST/GET/DELETE /v1/train routes (from gn__requester_register). */
void gn__trainreq_register(gn_node *n, const gn_train_ops *ops);
/* A LEASE_ACCEPT nobody's rent waits for: true when it is a gang member's
 * (then it is handled: adopted, or released). */
bool gn__trainreq_on_accept(gn_node *n, const uint8_t peer[GN_PK_LEN], const uint8_t *raw, size_t raw_len,
                            const gn_agreement *ag);
/* A LEASE_REJECT nobody's rent waits for. */
void gn__trainreq_on_reject(gn_node *n, const uint8_t peer[GN_PK_LEN], const char *lease_id, const char *reason);
/* A JOB_OUTPUT: the answer to a GET /v1/train/ID/output waiting for it. */
void gn__trainreq_on_output(gn_node *n, const uint8_t peer[GN_PK_LEN], const gn_envelope *env);
/* A JOB_SEED_GET: a restarted rank's provider asks a chunk of the seed its
 * manifest names; answered with a JOB_SEED only to the provider of that
 * rank's lease. */
void gn__trainreq_on_seed_get(gn_node *n, const uint8_t peer[GN_PK_LEN], const gn_envelope *env);
void gn__trainreq_peer_up(gn_node *n, const uint8_t peer[GN_PK_LEN]);
void gn__trainreq_peer_down(gn_node *n, const uint8_t peer[GN_PK_LEN]);
/* Timers: answer deadlines, the members' leases and ranks' jobs. */
void gn__trainreq_tick(gn_node *n, uint64_t now_ms);

#endif
