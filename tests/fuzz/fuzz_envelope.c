/* libFuzzer target: envelope parsing and verification. */
#include <gpunet/wire.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  gn_envelope env;
  if (gn_envelope_open(data, size, &env) == 0) {
    /* body must lie inside the input */
    if (env.body_len && (env.body < data || env.body + env.body_len > data + size))
      __builtin_trap();
    (void)gn_msg_type_name(env.type);
  }
  return 0;
}
