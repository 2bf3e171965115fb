/* Where a node keeps its state, shared by gpunetd and the gpunet CLI (which
 * must find the identity and the control socket with no daemon to ask). */
#ifndef GPUNET_PATHS_H
#define GPUNET_PATHS_H

#include <stddef.h>

/* The default data directory: $XDG_DATA_HOME/gpunet when XDG_DATA_HOME is an
 * absolute path, else $HOME/.local/share/gpunet. GN_ETOOBIG (buf emptied) if
 * it does not fit in cap, GN_ENOTFOUND when neither variable is usable. */
int gn_data_dir_default(char *buf, size_t cap);

#endif
