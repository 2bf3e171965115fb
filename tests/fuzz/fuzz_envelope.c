/* libFuzzer target: envelope parsing and verification, and the unsigned
 * session-bound form (accepted only for its types, from its signer's
 * session: here a fixed peer key the fuzzer can learn to write). */
#include <gpunet/wire.h>

#include <string.h>

static bool zero_sig(const gn_envelope *env) {
  for (size_t i = 0; i < GN_SIG_LEN; i++)
    if (env->sig[i])
      return false;
  return true;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  gn_envelope env;
  if (gn_envelope_open(data, size, &env) == 0) {
    /* body must lie inside the input */
    if (env.body_len && (env.body < data || env.body + env.body_len > data + size))
      __builtin_trap();
    if (zero_sig(&env)) /* no Ed25519 signature is 64 zero bytes */
      __builtin_trap();
    (void)gn_msg_type_name(env.type);
  }
  uint8_t peer[GN_PK_LEN];
  memset(peer, 0x01, sizeof peer);
  if (gn_envelope_open_from(data, size, peer, &env) == 0) {
    if (env.body_len && (env.body < data || env.body + env.body_len > data + size))
      __builtin_trap();
    if (zero_sig(&env) && (!gn_msg_type_session_bound(env.type) || memcmp(env.signer, peer, GN_PK_LEN) != 0))
      __builtin_trap();
  }
  return 0;
}
