/* Private to p2p: the rate classes every session message is charged to
 * (ratelimit.c holds the one table; docs/overlay/limits.md explains it). */
#ifndef GPUNET_P2P_RATECLASS_H
#define GPUNET_P2P_RATECLASS_H

#include <gpunet/ratelimit.h>

enum {
  GN__RC_PEERS,     /* PEERS: each makes us dial */
  GN__RC_GOSSIP,    /* offers, withdrawals, digests and wants */
  GN__RC_VIEW,      /* partial-view maintenance (76-82) */
  GN__RC_CONTROL,   /* lease, job control, billing, ERROR */
  GN__RC_BULK,      /* job logs, /output and seed chunks */
  GN__RC_ATTEST,    /* attestation exchanges (50-59) */
  GN__RC_RTT,       /* round-trip measurements (60-63) */
  GN__RC_OTHER,     /* types this version does not know */
  GN__RC_KEEPALIVE, /* the session's empty keepalive frames */
  GN__RC_NAT,       /* hole punching and relays (84-89) */
  GN__RC_COUNT
};

typedef struct gn__rate_class {
  const char *name;
  gn_rate rate;
} gn__rate_class;

/* The class of a message type (SWIM's 70-73 travel over UDP, not sessions,
 * and fall in GN__RC_OTHER here). */
int gn__rate_class_of(uint32_t type);
const gn__rate_class *gn__rate_class_get(int cls);
/* What a message of len bytes costs in cls: one token; in the bulk class
 * one per started 64 KiB, at most the class's burst. */
uint32_t gn__rate_cost(int cls, size_t len);

#endif
