/* Internal helpers shared by the node's infrastructure files (config, filter,
 * gpu); not part of any public header. */
#ifndef GN_NODE_INFRA_H
#define GN_NODE_INFRA_H

#include <stddef.h>
#include <stdint.h>

/* "0.40", ".5", "1", "12.345678" (currency units) -> micro-units. At most 6
 * decimals and no more than 10^12 units; GN_EINVAL on anything else. */
int gn__price_parse(const char *s, uint64_t *ret_micro);
/* Lowercases s into buf dropping spaces, dashes and underscores, and strips
 * a leading "nvidia" then "geforce": "NVIDIA GeForce RTX-4090" -> "rtx4090". */
void gn__gpu_model_norm(const char *s, char *buf, size_t cap);

#endif
