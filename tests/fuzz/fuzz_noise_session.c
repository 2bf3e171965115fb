/* libFuzzer target: random bytes fed to a responder session (framing,
 * handshake, payload checks), in two pieces to exercise reassembly. */
#include <gpunet/identity.h>

#include "../../p2p/session.h"

static void fixed_rng(void *ud, uint8_t *out, size_t len) {
  uint64_t *s = ud;
  for (size_t i = 0; i < len; i++) {
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    out[i] = (uint8_t)(*s >> 56);
  }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static gn_identity *id;
  if (!id && gn_identity_generate(&id) < 0)
    return 0;
  uint64_t seed = 1;
  gn_session_cfg cfg = {.initiator = false, .id = id, .listen_addr = "", .rng = fixed_rng, .rng_ud = &seed};
  gn_session *s;
  if (gn__session_new(&cfg, &s) < 0)
    return 0;
  size_t split = size ? data[0] % (size + 1) : 0;
  const struct {
    const uint8_t *p;
    size_t n;
  } parts[2] = {{data, split}, {data + split, size - split}};
  for (int k = 0; k < 2; k++) {
    size_t pos = 0;
    while (pos < parts[k].n) {
      size_t used = 0;
      gn_session_event ev;
      int r = gn__session_feed(s, parts[k].p + pos, parts[k].n - pos, &used, &ev);
      if (r < 0)
        goto out;
      pos += used;
      if (r == 0)
        break;
    }
    gn_buf out = {0};
    (void)gn__session_take_output(s, &out);
    gn_buf_done(&out);
  }
out:
  gn__session_free(s);
  return 0;
}
