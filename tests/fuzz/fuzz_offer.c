/* libFuzzer target: the offer body decoder and the offer table, both with
 * the input as a whole envelope and as a body signed by a fixed key. */
#include <gpunet/offer.h>

#define NOW 1700000000

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static gn_identity *id;
  if (!id && gn_identity_generate(&id) < 0)
    return 0;
  gn_offer o;
  (void)gn_offer_decode(data, size, &o);

  gn_offer_table *t = gn_offer_table_new(4);
  if (!t)
    return 0;
  (void)gn_offer_table_put(t, data, size, NOW);
  (void)gn_offer_table_withdraw(t, data, size);

  /* As a body: this reaches the table logic past the signature check. */
  if (size < 4096) {
    gn_buf env = {0};
    if (gn_envelope_seal(id, GN_MSG_OFFER, data, size, &env) == 0) {
      (void)gn_offer_table_put(t, env.data, env.len, NOW);
      (void)gn_offer_table_put(t, env.data, env.len, NOW);
      for (size_t i = 0; i < gn_offer_table_count(t); i++)
        (void)gn_offer_table_find(t, gn_offer_table_at(t, i)->id);
      (void)gn_offer_table_expire(t, NOW + 3600);
    }
    env.len = 0;
    if (gn_envelope_seal(id, GN_MSG_OFFER_WITHDRAW, data, size, &env) == 0)
      (void)gn_offer_table_withdraw(t, env.data, env.len);
    gn_buf_done(&env);
  }
  gn_offer_table_free(t);
  return 0;
}
