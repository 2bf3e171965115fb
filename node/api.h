/* The control API's routes of the node as a whole (api.c): status, GPUs,
 * peers, offers, leases, jobs and their logs, invoices, metrics. */
#ifndef GPUNET_NODE_API_H
#define GPUNET_NODE_API_H

#include "records.h"

void gn__api_register(gn_node *n);
/* Serves GET /metrics, and nothing else, over TCP on n->cfg.metrics_listen
 * (n->metrics_ctl); warns in the log when that address is not loopback. */
int gn__api_metrics_listen(gn_node *n);
/* Splits an IP:PORT listen address ("127.0.0.1:9100", "[::1]:9100") for
 * gn_ctl_new_tcp: the address is copied into host (cap bytes, cut to fit),
 * *ret_ip points into it without an IPv6 address's brackets, *ret_port is
 * atoi's reading of what follows the last ':'. GN_EINVAL when there is no
 * ':'. Used by the metrics and the dashboard listeners. */
int gn__api_listen_split(const char *listen, char *host, size_t cap, const char **ret_ip, int *ret_port);
/* What this node has billed as provider in its own currency (cfg.currency),
 * as gpunet_earnings_total counts it; for the dashboard's history. */
uint64_t gn__api_earned_micro(gn_node *n);
/* Long-polled logs (GET /v1/jobs/:id/logs?wait_ms=): a waiting request is a
 * GN_PENDING_LOGS entry keyed by job id. _wake answers the job's waiters that
 * have something new (output past their offset, a state change); the node's
 * job_changed hook (set by gn__api_register) calls it whenever the job's log
 * grows or its state is persisted. _answer replies to one waiter with what
 * there is (its deadline passed); the caller frees p. */
void gn__api_logs_wake(gn_node *n, const gn_job *j);
void gn__api_logs_answer(gn_node *n, gn_pending *p);

#endif
