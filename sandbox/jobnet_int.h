/* Private declarations shared by the job network's files (jobnet.c: keys,
 * names, validation, configuration text; jobnet_link.c: the interface). */
#ifndef GPUNET_JOBNET_INT_H
#define GPUNET_JOBNET_INT_H

#include "sandbox_int.h"

#include <gpunet/jobnet.h>

/* The canonical text of a parsed endpoint, as wireguard-go and wg read it. */
void gn__jobnet_endpoint_text(const struct sockaddr_storage *ss, char out[GN_JOBNET_ENDPOINT_MAX]);
/* wg(8)'s configuration file for the kernel backend, built from the same
 * parsed values as gn_jobnet_uapi_set_text. Holds the private key: the
 * caller wipes out. */
int gn__jobnet_wg_conf_text(const gn_jobnet_config *cfg, char *out, size_t cap, size_t *ret_len);

#endif
