/* Internal helpers shared by the node's infrastructure files (filter, gpu);
 * not part of any public header. */
#ifndef GN_NODE_INFRA_H
#define GN_NODE_INFRA_H

#include <stddef.h>
#include <stdint.h>

/* Lowercases s into buf dropping spaces, dashes and underscores, and strips
 * a leading "nvidia" then "geforce": "NVIDIA GeForce RTX-4090" -> "rtx4090". */
void gn__gpu_model_norm(const char *s, char *buf, size_t cap);

#endif
