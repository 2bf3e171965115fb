/* Attestation in the daemon (attest_net.c): the glue around the attestation
 * agent (node/attest/, gpunet/attest.h): its io, the local GPUs, the offers'
 * copy of their verdicts and reports, POST /v1/attest. */
#ifndef GPUNET_NODE_ATTEST_NET_H
#define GPUNET_NODE_ATTEST_NET_H

#include "records.h"

#include <gpunet/attest.h>
#include <gpunet/offer.h>

/* Attestation of one local GPU model (provider), as the offers and the API
 * show it: attest_net.c keeps it a copy of the attestation agent's slot. */
#define GN_ATTEST_MODELS GN_ATTEST_LOCAL_MAX
typedef struct gn_attest_local {
  char model[96];
  char verdict[GN_ATTEST_VERDICT_STRLEN];
  gn_buf report_env; /* sealed GN_MSG_ATTEST_REPORT, attached to offers */
} gn_attest_local;

typedef void (*gn_attest_done_fn)(gn_node *n, void *ud, int rc, const gn_attest_result *res, const char *err);

void gn__attest_start_local(gn_node *n);
void gn__attest_on_message(gn_node *n, const uint8_t peer[GN_PK_LEN], const gn_envelope *env, const uint8_t *raw,
                           size_t raw_len);
void gn__attest_peer_up(gn_node *n, const uint8_t peer[GN_PK_LEN]);
/* A dial to addr expecting provider `expected` reached node `got`: the
 * verifications of `expected` still waiting for their session fail now. */
void gn__attest_dial_refused(gn_node *n, const char *addr, const uint8_t expected[GN_PK_LEN],
                             const uint8_t got[GN_PK_LEN]);
void gn__attest_tick(gn_node *n, uint64_t now_ms);
/* Challenges the provider of offer e; done is called exactly once (from a
 * later loop callback) unless this returns an error: GN_EPERM when the
 * offer's address is up under another node's key. A session to that address
 * that proves another key fails it too (done with GN_EPERM). */
int gn__attest_begin(gn_node *n, const gn_offer_entry *e, gn_attest_done_fn done, void *ud);
/* Its control route: POST /v1/attest. */
void gn__attest_register(gn_node *n);
const gn_attest_local *gn__attest_local_find(const gn_node *n, const char *model);
/* The verdict an offer's attached report states, e.g. "verified RTX 4090
 * (checked by gn…)" or "simulated (self-reported)"; "" when none. A peer's
 * verdict counts only with the lease agreement by which that peer then
 * leased the GPU; without one it reads "... (not counted: verifier gn…
 * shows no lease of it)". */
void gn__offer_attest_verdict(const gn_offer *o, char *buf, size_t cap);
json_t *gn__attest_result_json(const gn_attest_result *res);
void gn__attest_shutdown(gn_node *n);

#endif
