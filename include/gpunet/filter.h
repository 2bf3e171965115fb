/* The offer filter language of `gpunet offers`, `gpunet rent --gpu` and the
 * daemon's offer listing (billing/filter.c): parsed by the CLI before it asks
 * and by gpunetd when it matches, so it lives below both.
 *
 * "gpu=rtx4090 vram>=24 price<=0.50 count>=2 simulated=false": terms separated
 * by spaces or commas, all must hold. Keys: gpu (= or !=, case-insensitive
 * substring ignoring spaces, dashes and an "NVIDIA"/"GeForce" prefix), vram
 * (GiB, rounded), price (currency units per GPU-hour), count (GPUs free),
 * simulated, confined and training (true/false). Operators: = != < <= > >=
 * (== is =). A bare word after a gpu term continues the model, so
 * "gpu=RTX 4090 vram>=24" works. */
#ifndef GPUNET_FILTER_H
#define GPUNET_FILTER_H

#include <gpunet/offer.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define GN_FILTER_MAX_TERMS 16
#define GN_FILTER_MAX_LEN 1024

enum gn_filter_key {
  GN_FILTER_GPU,
  GN_FILTER_VRAM,
  GN_FILTER_PRICE,
  GN_FILTER_COUNT,
  GN_FILTER_SIMULATED,
  GN_FILTER_CONFINED, /* the offer says neither no_userns nor unenforced_limits */
  GN_FILTER_TRAINING  /* the offer says it takes ranks of training jobs */
};
enum gn_filter_op { GN_FILTER_EQ, GN_FILTER_NE, GN_FILTER_LT, GN_FILTER_LE, GN_FILTER_GT, GN_FILTER_GE };

typedef struct gn_filter_term {
  enum gn_filter_key key;
  enum gn_filter_op op;
  char text[64]; /* gpu: the normalized model fragment */
  uint64_t num;  /* vram GiB, price micro-units, count, simulated/confined/training 0/1 */
} gn_filter_term;

typedef struct gn_filter {
  gn_filter_term terms[GN_FILTER_MAX_TERMS];
  size_t count; /* 0 matches everything */
} gn_filter;

/* GN_EINVAL or GN_ETOOBIG with a one-line message in err on bad input. */
int gn_filter_parse(const char *s, gn_filter *ret, char *err, size_t cap);
bool gn_filter_match(const gn_filter *f, const gn_offer *o);

/* Lowercases s into buf dropping spaces, dashes, underscores and tabs, and
 * strips a leading "nvidia" then "geforce": "NVIDIA GeForce RTX-4090" ->
 * "rtx4090". The gpu key's matching and the GPU inventory's model names. */
void gn_gpu_model_norm(const char *s, char *buf, size_t cap);

#endif
