/* Settlement in the daemon (settle.c, around include/gpunet/settle.h):
 * vouchers, the outbox and its driver, GET /v1/balance. */
#ifndef GPUNET_NODE_SETTLE_GLUE_H
#define GPUNET_NODE_SETTLE_GLUE_H

#include "records.h"

/* _start after the database and the loop exist (opens the tables, the
 * configured driver, the retry timer), _stop at shutdown (the timer; a
 * request in flight still finishes and is recorded), _free after the loop
 * has run dry. */
int gn__settle_start(gn_node *n, char *err, size_t cap);
void gn__settle_stop(gn_node *n);
void gn__settle_free(gn_node *n);
/* Records a voucher of lease l (a DEBIT_ACCEPT or INVOICE_ACCEPT envelope):
 * the provider for each one it receives from the requester, the requester
 * for each one it signs. Refused vouchers (decreasing, another lease's, not
 * signed by the requester...) are logged and the code returned; the lease
 * goes on either way. */
int gn__settle_voucher(gn_node *n, const gn_lease *l, const uint8_t *env, size_t len);
/* Once a final invoice is countersigned (the requester signed, or the
 * provider received and verified, the INVOICE_ACCEPT): records that final
 * voucher and queues the lease's settlement (with the lease's export from the
 * ledger, so call it after the invoice and its acceptance are stored) for the
 * driver; durable before it returns. */
int gn__settle_final(gn_node *n, const gn_lease *l, const uint8_t *invoice_env, size_t invoice_len,
                     const uint8_t *accept_env, size_t accept_len);
/* "none", "pending", "settled" or "failed" for a lease's final settlement
 * (role "provider" or "requester"), for the invoice list. */
const char *gn__settle_state(gn_node *n, const char *lease_id, const char *role);
/* Its control routes: GET /v1/balance, and POST /v1/balance/retry (failed
 * settlements are queued again). */
void gn__settle_register(gn_node *n);

#endif
