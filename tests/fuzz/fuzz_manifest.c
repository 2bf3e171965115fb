/* libFuzzer target: the sandbox's parsers for registry JSON (manifest kind,
 * image manifest, image index, image config) on arbitrary bytes. */
#include "../../sandbox/sandbox_int.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  gn__manifest_kind kind;
  gn__manifest m;
  gn__descriptor d;
  gn__config c;
  if (gn__manifest_kind_of(data, size, size & 1 ? GN__MT_OCI_INDEX : NULL, &kind) == 0 && kind != GN__KIND_INDEX &&
      kind != GN__KIND_MANIFEST)
    abort();
  if (gn__manifest_parse(data, size, &m) == 0) {
    if (m.layer_count > GN__LAYERS_MAX || !gn__digest_valid(m.config.digest))
      abort();
    for (size_t i = 0; i < m.layer_count; i++)
      if (!gn__digest_valid(m.layers[i].digest))
        abort();
    gn__manifest_done(&m);
  }
  if (gn__index_pick(data, size, "linux", "amd64", &d) == 0 && !gn__digest_valid(d.digest))
    abort();
  if (gn__config_parse(data, size, &c) == 0)
    gn__config_done(&c);
  return 0;
}
