/* libFuzzer target: the exec message decoders (EXEC_OPEN and the small
 * EXEC_DATA/WINDOW/SIGNAL/EXIT/CLOSE maps) on arbitrary bytes. The first
 * byte picks the message type. What decodes is within its bounds, and an
 * EXEC_OPEN that decodes encodes and decodes to the same. */
#include "execmsg.h"

#include <signal.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1)
    return 0;
  static const uint32_t types[] = {GN_MSG_EXEC_OPEN,   GN_MSG_EXEC_DATA, GN_MSG_EXEC_WINDOW,
                                   GN_MSG_EXEC_SIGNAL, GN_MSG_EXEC_EXIT, GN_MSG_EXEC_CLOSE};
  uint32_t type = types[data[0] % (sizeof types / sizeof types[0])];
  data++;
  size--;
  if (type == GN_MSG_EXEC_OPEN) {
    gn_execopen o;
    if (gn__execopen_decode(data, size, &o) == 0) {
      if (o.argc < 1 || o.argc > GN_EXEC_MAX_ARGS || o.argv[o.argc] != NULL || o.envc > GN_EXEC_MAX_ARGS ||
          o.env[o.envc] != NULL || !gn_id_valid(o.lease_id) || !gn_id_valid(o.job_id) ||
          (o.tty && (o.rows < 1 || o.cols < 1 || o.rows > GN_EXEC_MAX_DIM || o.cols > GN_EXEC_MAX_DIM)))
        __builtin_trap();
      for (uint32_t i = 0; i < o.argc; i++)
        if (strlen(o.argv[i]) > GN_EXEC_MAX_ARG_LEN)
          __builtin_trap();
      for (uint32_t i = 0; i < o.envc; i++)
        if (!gn_env_entry_valid(o.env[i]))
          __builtin_trap();
      gn_wire_writer w;
      gn_buf b = {0};
      gn_execopen o2;
      gn_wire_writer_init(&w);
      if (gn__execopen_encode(&o, &w) != 0 || gn_wire_writer_take(&w, &b) != 0 ||
          gn__execopen_decode(b.data, b.len, &o2) != 0)
        __builtin_trap();
      if (o2.sid != o.sid || o2.argc != o.argc || o2.envc != o.envc || o2.tty != o.tty || o2.rows != o.rows ||
          o2.cols != o.cols || o2.expires_s != o.expires_s || memcmp(o2.nonce, o.nonce, sizeof o.nonce) != 0 ||
          strcmp(o2.argv[o.argc - 1], o.argv[o.argc - 1]) != 0)
        __builtin_trap();
      gn__execopen_done(&o2);
      gn_wire_writer_done(&w);
      gn_buf_done(&b);
      gn__execopen_done(&o);
    }
    return 0;
  }
  gn_execmsg m;
  if (gn__execmsg_decode(type, data, size, &m) == 0) {
    if (m.data_len > GN_EXEC_CHUNK || (m.data_len && (m.data < data || m.data + m.data_len > data + size)) ||
        m.ack > GN_EXEC_WINDOW || m.rows > GN_EXEC_MAX_DIM || m.cols > GN_EXEC_MAX_DIM || m.code < -1 || m.code > 255 ||
        (type == GN_MSG_EXEC_SIGNAL && m.sig != SIGINT && m.sig != SIGTERM && m.sig != SIGKILL) ||
        memchr(m.reason, 0, sizeof m.reason) == NULL)
      __builtin_trap();
    gn__execmsg_done(&m);
  }
  return 0;
}
