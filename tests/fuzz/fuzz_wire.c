/* libFuzzer target: the bounded msgpack reader and its typed accessors. */
#include <gpunet/wire.h>

static void poke(const msgpack_object *m) {
  static const char *keys[] = {"v", "id", "sig", "addr", "peers", "seq", "provider", ""};
  for (size_t i = 0; i < GN_ARRAY_SIZE(keys); i++) {
    uint64_t u;
    int64_t s;
    bool b;
    char str[64];
    uint8_t bin[32];
    const uint8_t *ref;
    size_t len;
    const msgpack_object_array *arr;
    (void)gn_wire_get(m, keys[i]);
    (void)gn_wire_get_u64(m, keys[i], &u);
    (void)gn_wire_get_i64(m, keys[i], &s);
    (void)gn_wire_get_bool(m, keys[i], &b);
    (void)gn_wire_get_str(m, keys[i], str, sizeof(str));
    (void)gn_wire_get_bin_exact(m, keys[i], bin, sizeof(bin));
    (void)gn_wire_get_bin_ref(m, keys[i], 64, &ref, &len);
    if (gn_wire_get_array(m, keys[i], 64, &arr) == 0)
      for (uint32_t k = 0; k < arr->size; k++)
        (void)gn_wire_get_u64(&arr->ptr[k], "id", &u);
  }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  gn_wire_doc doc;
  if (gn_wire_decode(data, size, &doc) == 0) {
    poke(doc.root);
    if (doc.root->type == MSGPACK_OBJECT_ARRAY)
      for (uint32_t i = 0; i < doc.root->via.array.size && i < 16; i++)
        poke(&doc.root->via.array.ptr[i]);
    gn_wire_doc_done(&doc);
  }
  return 0;
}
