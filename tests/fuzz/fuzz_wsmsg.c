/* libFuzzer target: the workspace messages' decoder (node/wsmsg.c) on
 * arbitrary bytes, the first byte picking the type, and the path grammar on
 * the rest. Whatever decodes is bounded, its path is canonical (no '..', not
 * absolute, no control byte), and it encodes and decodes to the same. */
#include "wsmsg.h"

#include <string.h>

static void check_path(const char *p) {
  size_t k = strlen(p);
  if (k == 0 || k >= GN_WS_PATH_MAX || p[0] == '/' || p[k - 1] == '/' || strstr(p, "//"))
    __builtin_trap();
  for (size_t i = 0; i < k; i++)
    if ((unsigned char)p[i] < 0x20 || p[i] == 0x7f)
      __builtin_trap();
  /* no "." or ".." component */
  for (const char *c = p; c; c = strchr(c, '/') ? strchr(c, '/') + 1 : NULL) {
    size_t n = strcspn(c, "/");
    if ((n == 1 && c[0] == '.') || (n == 2 && c[0] == '.' && c[1] == '.') || n > GN_WS_NAME_MAX)
      __builtin_trap();
  }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1)
    return 0;
  uint32_t type = GN_MSG_WS_PUT + data[0] % 7; /* 7: one type past the range */
  data++;
  size--;
  /* the path grammar alone */
  char in[2048], out[GN_WS_PATH_MAX];
  size_t k = size < sizeof in - 1 ? size : sizeof in - 1;
  memcpy(in, data, k);
  in[k] = 0;
  if (gn__ws_path_norm(in, out, sizeof out) == 0) {
    check_path(out);
    char again[GN_WS_PATH_MAX];
    if (gn__ws_path_norm(out, again, sizeof again) != 0 || strcmp(out, again) != 0)
      __builtin_trap(); /* canonical: normalizing twice changes nothing */
  }
  gn_wsmsg m;
  if (gn__wsmsg_decode(type, data, size, &m) != 0)
    return 0;
  if (type > GN_MSG_WS_STAT_REPLY || m.data_len > GN_WS_CHUNK || m.offset > GN_WS_OFFSET_MAX ||
      m.size > GN_WS_OFFSET_MAX || !gn_id_valid(m.lease_id))
    __builtin_trap();
  if (type == GN_MSG_WS_PUT || type == GN_MSG_WS_GET || type == GN_MSG_WS_STAT)
    check_path(m.path);
  gn_wire_writer w;
  gn_buf b = {0};
  gn_wsmsg m2;
  gn_wire_writer_init(&w);
  if (gn__wsmsg_encode(type, &m, &w) != 0 || gn_wire_writer_take(&w, &b) != 0 ||
      gn__wsmsg_decode(type, b.data, b.len, &m2) != 0)
    __builtin_trap();
  if (m2.seq != m.seq || m2.offset != m.offset || m2.data_len != m.data_len ||
      (m.data_len && memcmp(m2.data, m.data, m.data_len) != 0) || strcmp(m2.path, m.path) != 0 ||
      strcmp(m2.reason, m.reason) != 0 || m2.has_sha256 != m.has_sha256)
    __builtin_trap();
  gn__wsmsg_done(&m2);
  gn_wire_writer_done(&w);
  gn_buf_done(&b);
  gn__wsmsg_done(&m);
  return 0;
}
