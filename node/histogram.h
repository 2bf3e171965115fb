/* A Prometheus histogram with fixed buckets, for latencies the daemon
 * measures (debit-note round trips): constant memory whatever is observed. */
#ifndef GPUNET_NODE_HISTOGRAM_H
#define GPUNET_NODE_HISTOGRAM_H

#include <stdint.h>
#include <stdio.h>

/* Upper bounds of the buckets, in milliseconds: 0.01 s to 10 s; +Inf is
 * implicit. */
#define GN_HISTO_BUCKETS 10
extern const uint32_t gn_histo_bounds_ms[GN_HISTO_BUCKETS];

typedef struct gn_histo {
  uint64_t in[GN_HISTO_BUCKETS + 1]; /* per bucket, not cumulative; the last is +Inf */
  uint64_t count;
  uint64_t sum_ms; /* saturates instead of wrapping */
} gn_histo;

/* Counts one observation of ms milliseconds. */
void gn_histo_observe_ms(gn_histo *h, uint64_t ms);
/* Writes the HELP and TYPE lines and the _bucket (cumulative, le in
 * seconds), _sum (seconds) and _count series of metric name. */
void gn_histo_write(const gn_histo *h, FILE *f, const char *name, const char *help);

#endif
