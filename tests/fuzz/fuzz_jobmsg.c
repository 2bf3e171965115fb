/* libFuzzer target: the daemon's job manifest and lease/job notice decoders
 * on arbitrary bytes. The first byte picks the message type. */
#include "node_internal.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1)
    return 0;
  static const uint32_t types[] = {GN_MSG_JOB_MANIFEST, GN_MSG_JOB_STATUS,   GN_MSG_JOB_LOG,
                                   GN_MSG_JOB_STOP,     GN_MSG_LEASE_REJECT, GN_MSG_LEASE_RELEASE,
                                   GN_MSG_LEASE_END,    GN_MSG_ERROR,        GN_MSG_OFFER};
  uint32_t type = types[data[0] % GN_ARRAY_SIZE(types)];
  data++;
  size--;
  if (type == GN_MSG_JOB_MANIFEST) {
    gn_jobman m;
    if (gn__jobman_decode(data, size, &m) == 0) {
      if (m.argc < 1 || m.argc > GN_JOB_MAX_ARGS || m.argv[m.argc] != NULL)
        __builtin_trap();
      gn__jobman_done(&m);
    }
    return 0;
  }
  gn_jobmsg m;
  if (gn__jobmsg_decode(type, data, size, &m) == 0) {
    if (m.data_len > GN_JOB_LOG_CHUNK || (m.data_len && (m.data < data || m.data + m.data_len > data + size)))
      __builtin_trap();
    gn__jobmsg_done(&m);
  }
  return 0;
}
