/* libFuzzer target: the forwarded-port decoders (FWD_OPEN, FWD_DATA,
 * FWD_CREDIT, FWD_CLOSE) on arbitrary bytes, and a window fed the decoded
 * amounts. The first byte picks the message type. What decodes is within
 * its bounds, and an FWD_OPEN re-encodes to the same. */
#include "fwdmsg.h"
#include "node_internal.h"

#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1)
    return 0;
  static const uint32_t types[] = {GN_MSG_FWD_OPEN, GN_MSG_FWD_DATA, GN_MSG_FWD_CREDIT, GN_MSG_FWD_CLOSE};
  uint32_t type = types[data[0] % GN_ARRAY_SIZE(types)];
  data++;
  size--;
  if (type == GN_MSG_FWD_OPEN) {
    gn_fwdopen m, m2;
    if (gn__fwdopen_decode(data, size, &m) != 0)
      return 0;
    if (m.stream == 0 || m.port == 0 || m.port > 65535 || !gn_id_valid(m.lease_id) ||
        (m.job_id[0] && !gn_id_valid(m.job_id)))
      __builtin_trap();
    gn_wire_writer w;
    gn_buf b = {0};
    gn_wire_writer_init(&w);
    if (gn__fwdopen_encode(&m, &w) != 0 || gn_wire_writer_take(&w, &b) != 0 ||
        gn__fwdopen_decode(b.data, b.len, &m2) != 0 || memcmp(&m, &m2, sizeof m) != 0)
      __builtin_trap();
    gn_wire_writer_done(&w);
    gn_buf_done(&b);
    return 0;
  }
  gn_fwdmsg m;
  if (gn__fwdmsg_decode(type, data, size, &m) != 0)
    return 0;
  gn_fwd_win win;
  gn__fwd_win_init(&win);
  if (m.stream == 0)
    __builtin_trap();
  if (type == GN_MSG_FWD_DATA) {
    if (m.data_len == 0 || m.data_len > GN_FWD_CHUNK || gn__fwd_win_recv(&win, m.data_len) != 0)
      __builtin_trap();
    (void)gn__fwd_win_delivered(&win, m.data_len);
    if (win.recv_left > GN_FWD_WINDOW)
      __builtin_trap();
  } else if (type == GN_MSG_FWD_CREDIT) {
    if (m.credit == 0 || m.credit > GN_FWD_WINDOW)
      __builtin_trap();
    /* A fresh window takes no credit; one with that much sent takes it. */
    if (gn__fwd_win_credit(&win, m.credit) == 0 || gn__fwd_win_sent(&win, m.credit) != 0 ||
        gn__fwd_win_credit(&win, m.credit) != 0 || win.send_left != GN_FWD_WINDOW)
      __builtin_trap();
  } else if (memchr(m.reason, 0, sizeof m.reason) == NULL) {
    __builtin_trap();
  }
  gn__fwdmsg_done(&m);
  return 0;
}
