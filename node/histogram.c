/* Fixed-bucket histograms in the Prometheus text format (node/histogram.h). */
#include "histogram.h"

#include <inttypes.h>

const uint32_t gn_histo_bounds_ms[GN_HISTO_BUCKETS] = {10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000};

void gn_histo_observe_ms(gn_histo *h, uint64_t ms) {
  size_t i = 0;
  while (i < GN_HISTO_BUCKETS && ms > gn_histo_bounds_ms[i])
    i++;
  h->in[i]++;
  h->count++;
  h->sum_ms = ms > UINT64_MAX - h->sum_ms ? UINT64_MAX : h->sum_ms + ms;
}

void gn_histo_write(const gn_histo *h, FILE *f, const char *name, const char *help) {
  fprintf(f, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name);
  uint64_t cum = 0;
  for (size_t i = 0; i < GN_HISTO_BUCKETS; i++) {
    cum += h->in[i];
    fprintf(f, "%s_bucket{le=\"%g\"} %" PRIu64 "\n", name, gn_histo_bounds_ms[i] / 1000.0, cum);
  }
  fprintf(f, "%s_bucket{le=\"+Inf\"} %" PRIu64 "\n", name, h->count);
  fprintf(f, "%s_sum %.3f\n%s_count %" PRIu64 "\n", name, (double)h->sum_ms / 1000.0, name, h->count);
}
