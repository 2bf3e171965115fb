/* Billing v2 messages as pure functions on byte arrays: the provider's debit
 * notes and final invoice (each continuing the last ACCEPTED note), the
 * requester's check of them against its own head and observation, its
 * countersignatures (the cumulative vouchers) and rejections, and the
 * provider's open of those answers. No SQLite, no clock: notes/billing2.md. */
#include "billing_int.h"

#include <inttypes.h>
#include <sodium.h>
#include <stdio.h>

#define AGREEMENT_MAX 16384 /* request (<= 4 KiB) + 16 GPU ids + signatures */
#define NOTE_KEYS 11
#define INVOICE_KEYS 15
/* An invoice with an energy claim has both of its two keys, or neither. */
#define ENERGY_KEYS 2
/* Room for the envelope around a body (version, type, signer, signature). */
#define ENVELOPE_OVERHEAD 256

/* Parses an envelope like gn_envelope_open but WITHOUT verifying its
 * signature: only for bytes whose signature was verified already (the
 * audit's parallel pre-pass), or for ordering before a full audit. */
static int envelope_parse(const uint8_t *buf, size_t len, gn_envelope *ret) {
  gn_wire_doc doc;
  gn_envelope env;
  int r;
  if (!buf || !ret)
    return GN_EINVAL;
  if ((r = gn_wire_decode(buf, len, &doc)) < 0)
    return r;
  const msgpack_object *root = doc.root;
  const msgpack_object *f = root->type == MSGPACK_OBJECT_ARRAY ? root->via.array.ptr : NULL;
  r = GN_EINVAL;
  if (!f || root->via.array.size != 5 || f[0].type != MSGPACK_OBJECT_POSITIVE_INTEGER ||
      f[0].via.u64 != GN_PROTO_VERSION || f[1].type != MSGPACK_OBJECT_POSITIVE_INTEGER || f[1].via.u64 > UINT32_MAX ||
      f[2].type != MSGPACK_OBJECT_BIN || f[2].via.bin.size != GN_PK_LEN || f[3].type != MSGPACK_OBJECT_BIN ||
      f[4].type != MSGPACK_OBJECT_BIN || f[4].via.bin.size != GN_SIG_LEN)
    goto out;
  env.version = (uint32_t)f[0].via.u64;
  env.type = (uint32_t)f[1].via.u64;
  memcpy(env.signer, f[2].via.bin.ptr, GN_PK_LEN);
  env.body = (const uint8_t *)f[3].via.bin.ptr;
  env.body_len = f[3].via.bin.size;
  memcpy(env.sig, f[4].via.bin.ptr, GN_SIG_LEN);
  if (env.body_len && (env.body < buf || env.body + env.body_len > buf + len))
    goto out;
  if (env.body_len == 0)
    env.body = buf;
  *ret = env;
  r = 0;
out:
  gn_wire_doc_done(&doc);
  return r;
}

/* gn_envelope_open, or the result of a verification done before (sig_rc:
 * GN__SIG_UNCHECKED to verify now, 0 verified, < 0 failed with that code). */
static int env_open(const uint8_t *buf, size_t len, int sig_rc, gn_envelope *ret) {
  if (sig_rc == GN__SIG_UNCHECKED)
    return gn_envelope_open(buf, len, ret);
  if (sig_rc < 0)
    return sig_rc;
  return envelope_parse(buf, len, ret);
}

/* --- body codec ------------------------------------------------------------*/

int gn__bill_body_encode(const gn__bill_body *b, gn_buf *ret) {
  gn_wire_writer w;
  int r;
  gn_wire_writer_init(&w);
  const bool energy = b->final && b->energy.present;
  gn_wire_put_map(&w, b->final ? INVOICE_KEYS + (energy ? ENERGY_KEYS : 0) : NOTE_KEYS);
  gn_wire_put_str(&w, "lease_id");
  gn_wire_put_str(&w, b->lease_id);
  if (b->final) {
    gn_wire_put_str(&w, "agreement");
    gn_wire_put_bin(&w, b->agreement, b->agreement_len);
  } else {
    gn_wire_put_str(&w, "agreement_hash");
    gn_wire_put_bin(&w, b->agreement_hash, GN__HASH_LEN);
  }
  gn_wire_put_str(&w, "seq");
  gn_wire_put_u64(&w, b->seq);
  gn_wire_put_str(&w, "prev");
  gn_wire_put_bin(&w, b->prev, GN__HASH_LEN);
  gn_wire_put_str(&w, "from");
  gn_wire_put_u64(&w, b->from);
  gn_wire_put_str(&w, "ticks");
  gn_wire_put_bin(&w, b->ticks, b->ticks_len);
  gn_wire_put_str(&w, "seconds");
  gn_wire_put_u64(&w, b->seconds);
  gn_wire_put_str(&w, "gpu_seconds");
  gn_wire_put_u64(&w, b->gpu_seconds);
  gn_wire_put_str(&w, "chain_head");
  gn_wire_put_bin(&w, b->chain_head, GN__HASH_LEN);
  gn_wire_put_str(&w, "total_micro");
  gn_wire_put_u64(&w, b->total_micro);
  if (b->final) {
    gn_wire_put_str(&w, "price_uper_hour");
    gn_wire_put_u64(&w, b->price_uper_hour);
    gn_wire_put_str(&w, "currency");
    gn_wire_put_str(&w, b->currency);
    gn_wire_put_str(&w, "start_s");
    gn_wire_put_i64(&w, b->start_s);
    gn_wire_put_str(&w, "end_s");
    gn_wire_put_i64(&w, b->end_s);
    gn_wire_put_str(&w, "end_reason");
    gn_wire_put_str(&w, b->end_reason);
    if (energy) {
      gn_wire_put_str(&w, "energy_mj");
      gn_wire_put_u64(&w, b->energy.mj);
      gn_wire_put_str(&w, "energy_measured_s");
      gn_wire_put_u64(&w, b->energy.measured_s);
    }
  } else {
    gn_wire_put_str(&w, "issued_s");
    gn_wire_put_i64(&w, b->issued_s);
  }
  r = gn_wire_writer_take(&w, ret);
  gn_wire_writer_done(&w);
  return r;
}

int gn__bill_body_decode(bool final, const uint8_t *body, size_t len, gn_wire_doc *doc, gn__bill_body *ret,
                         char *reason, size_t cap) {
  gn__bill_body b;
  const char *field = NULL, *what = final ? "invoice" : "debit note";
  int r;
  memset(&b, 0, sizeof(b));
  b.final = final;
  if ((r = gn_wire_decode(body, len, doc)) < 0)
    return gn__fail(reason, cap, "%s body is not valid msgpack (%s)", what, gn_strerror(r));
  const msgpack_object *m = doc->root;
  /* Exactly the expected number of keys, each found: no unknown key and no
   * key twice (a second copy could say something else to another reader). */
  const bool energy = final && m->type == MSGPACK_OBJECT_MAP && m->via.map.size == INVOICE_KEYS + ENERGY_KEYS;
  if (m->type != MSGPACK_OBJECT_MAP || (m->via.map.size != (final ? INVOICE_KEYS : NOTE_KEYS) && !energy))
    field = "(body is not a map of the expected keys)";
  else if (gn_wire_get_str(m, "lease_id", b.lease_id, sizeof(b.lease_id)) < 0 || !gn__lease_id_ok(b.lease_id))
    field = "lease_id";
  else if (final && gn_wire_get_bin_ref(m, "agreement", AGREEMENT_MAX, &b.agreement, &b.agreement_len) < 0)
    field = "agreement";
  else if (!final && gn_wire_get_bin_exact(m, "agreement_hash", b.agreement_hash, GN__HASH_LEN) < 0)
    field = "agreement_hash";
  else if (gn_wire_get_u64(m, "seq", &b.seq) < 0)
    field = "seq";
  else if (gn_wire_get_bin_exact(m, "prev", b.prev, GN__HASH_LEN) < 0)
    field = "prev";
  else if (gn_wire_get_u64(m, "from", &b.from) < 0)
    field = "from";
  else if (gn_wire_get_bin_ref(m, "ticks", (size_t)GN_BILL_MAX_TICKS * GN_BILL_TICK_LEN, &b.ticks, &b.ticks_len) < 0)
    field = "ticks";
  else if (gn_wire_get_u64(m, "seconds", &b.seconds) < 0)
    field = "seconds";
  else if (gn_wire_get_u64(m, "gpu_seconds", &b.gpu_seconds) < 0)
    field = "gpu_seconds";
  else if (gn_wire_get_bin_exact(m, "chain_head", b.chain_head, GN__HASH_LEN) < 0)
    field = "chain_head";
  else if (gn_wire_get_u64(m, "total_micro", &b.total_micro) < 0)
    field = "total_micro";
  else if (!final && gn_wire_get_i64(m, "issued_s", &b.issued_s) < 0)
    field = "issued_s";
  else if (final && gn_wire_get_u64(m, "price_uper_hour", &b.price_uper_hour) < 0)
    field = "price_uper_hour";
  else if (final && gn_wire_get_str(m, "currency", b.currency, sizeof(b.currency)) < 0)
    field = "currency";
  else if (final && gn_wire_get_i64(m, "start_s", &b.start_s) < 0)
    field = "start_s";
  else if (final && gn_wire_get_i64(m, "end_s", &b.end_s) < 0)
    field = "end_s";
  else if (final &&
           (gn_wire_get_str(m, "end_reason", b.end_reason, sizeof(b.end_reason)) < 0 || !gn__printable(b.end_reason)))
    field = "end_reason";
  /* Bounded to what SQLite and JSON integers hold; whether the figures are
   * physically plausible is the reader's judgement (gn_energy_plausible). */
  else if (energy && (gn_wire_get_u64(m, "energy_mj", &b.energy.mj) < 0 || b.energy.mj > INT64_MAX))
    field = "energy_mj";
  else if (energy && (gn_wire_get_u64(m, "energy_measured_s", &b.energy.measured_s) < 0 || b.energy.measured_s == 0 ||
                      b.energy.measured_s > INT64_MAX))
    field = "energy_measured_s";
  b.energy.present = energy;
  if (field) {
    gn_wire_doc_done(doc);
    return gn__fail(reason, cap, "%s body is malformed: field %s is missing, of the wrong type or too long", what,
                    field);
  }
  *ret = b;
  return 0;
}

/* --- verification ------------------------------------------------------------*/

void gn__bill_view_done(gn__bill_view *v) {
  if (v)
    gn_wire_doc_done(&v->doc);
}

static void hex8(const uint8_t *h, char out[17]) {
  sodium_bin2hex(out, 17, h, 8);
}

/* Walks the n ticks from head's chain: valid values, the chain, the GPU
 * seconds. Shared by sealing (bad input is the caller's: GN_EINVAL) and
 * checking (a peer's: GN_EAUDIT); code says which. */
static int walk_ticks(const gn__bill_ctx *ctx, const uint8_t *ticks, uint64_t n, uint64_t from,
                      uint8_t chain[GN__HASH_LEN], uint64_t *ret_gpu_sum, int code, char *reason, size_t cap) {
  gn__tick_hasher th;
  const uint32_t count = ctx->ag.terms.count;
  uint64_t sum = 0;
  gn__tick_hasher_init(&th, ctx->ag.terms.lease_id);
  for (uint64_t k = 0; k < n; k++) {
    const uint8_t gpus = ticks[2 * k], util = ticks[2 * k + 1];
    const uint64_t idx = from + k;
    if (gpus > count) {
      gn__fail(reason, cap, "second %" PRIu64 ": gpus is %u but the lease has %" PRIu32 " GPU%s", idx, gpus, count,
               count == 1 ? "" : "s");
      return code;
    }
    if (util > 100 && util != GN_UTIL_UNKNOWN) {
      gn__fail(reason, cap, "second %" PRIu64 ": util %u is not a percentage", idx, util);
      return code;
    }
    gn__tick_hasher_step(&th, chain, idx, gpus, util);
    sum += gpus; /* at most 255 * GN_BILL_MAX_TICKS: cannot overflow */
  }
  *ret_gpu_sum = sum;
  return 0;
}

int gn__bill_verify_sig(const uint8_t *env, size_t len, int sig_rc, bool final, const gn__bill_ctx *ctx,
                        const gn_bill_head *head, const gn__bill_limits *lim, gn__bill_view *ret, char *reason,
                        size_t cap) {
  gn__bill_view v;
  const gn_lease_terms *t = &ctx->ag.terms;
  const char *what = final ? "invoice" : "debit note";
  char a[GN_NODE_ID_STRLEN], b[GN_NODE_ID_STRLEN], ha[17], hb[17];
  int r;
  if (!env)
    return gn__fail(reason, cap, "no %s given", what);
  memset(&v, 0, sizeof(v));
  r = env_open(env, len, sig_rc, &v.env);
  if (r == GN_ESIG) {
    gn_node_id_format(t->provider, a);
    return gn__fail(reason, cap, "%s signature does not verify against provider %s", what, a);
  }
  if (r < 0)
    return gn__fail(reason, cap, "%s envelope is malformed (%s)", what, gn_strerror(r));
  if (v.env.type != (final ? GN_MSG_INVOICE : GN_MSG_DEBIT_NOTE)) {
    const char *name = gn_msg_type_name(v.env.type);
    return gn__fail(reason, cap, "envelope is a %s message (type %" PRIu32 "), not a%s %s", name ? name : "unknown",
                    v.env.type, final ? "n" : "", what);
  }
  if (memcmp(v.env.signer, t->provider, GN_PK_LEN) != 0) {
    gn_node_id_format(v.env.signer, a);
    gn_node_id_format(t->provider, b);
    return gn__fail(reason, cap, "%s is signed by %s, not by the lease's provider %s", what, a, b);
  }
  if ((r = gn__bill_body_decode(final, v.env.body, v.env.body_len, &v.doc, &v.body, reason, cap)) < 0)
    return r;
  const gn__bill_body *bd = &v.body;
  if (final ? (bd->agreement_len != ctx->len || memcmp(bd->agreement, ctx->env, ctx->len) != 0)
            : memcmp(bd->agreement_hash, ctx->hash, GN__HASH_LEN) != 0) {
    r = gn__fail(reason, cap, "%s (lease %s) is for another agreement than the one held", what, bd->lease_id);
    goto out;
  }
  if (strcmp(bd->lease_id, t->lease_id) != 0) {
    r = gn__fail(reason, cap, "%s is for lease %s but the agreement is for lease %s", what, bd->lease_id, t->lease_id);
    goto out;
  }
  /* Continuity with OUR head: a note always continues the last accepted one. */
  if (!final && lim && lim->stale_ok && bd->seq >= 1 && bd->seq <= head->seq) {
    r = GN_ESTATE;
    gn__fail(reason, cap,
             "debit note %" PRIu64 " continues a note before our head (note %" PRIu64
             " is accepted already): re-send that acceptance",
             bd->seq, head->seq);
    goto out;
  }
  if (!final && head->seq == UINT64_MAX) {
    r = gn__fail(reason, cap, "the head's seq cannot grow (it is the largest)");
    goto out;
  }
  const uint64_t want_seq = final ? head->seq : head->seq + 1;
  if (bd->seq != want_seq) {
    r = gn__fail(reason, cap, "%s has seq %" PRIu64 " but the last accepted note is %" PRIu64 " (expected %" PRIu64 ")",
                 what, bd->seq, head->seq, want_seq);
    goto out;
  }
  if (memcmp(bd->prev, head->note_hash, GN__HASH_LEN) != 0) {
    hex8(bd->prev, ha);
    hex8(head->note_hash, hb);
    r = gn__fail(reason, cap,
                 "%s does not continue the last accepted note: prev is %s... but the accepted note %" PRIu64
                 " is %s...",
                 what, ha, head->seq, hb);
    goto out;
  }
  if (head->seconds == UINT64_MAX || bd->from != head->seconds + 1) {
    r = gn__fail(reason, cap, "%s starts at second %" PRIu64 " but the last accepted note ends at second %" PRIu64,
                 what, bd->from, head->seconds);
    goto out;
  }
  if (bd->ticks_len % GN_BILL_TICK_LEN) {
    r = gn__fail(reason, cap, "%s ticks are %zu bytes, not %d per second", what, bd->ticks_len, GN_BILL_TICK_LEN);
    goto out;
  }
  const uint64_t n = bd->ticks_len / GN_BILL_TICK_LEN;
  if (!final && n == 0) {
    r = gn__fail(reason, cap, "debit note %" PRIu64 " carries no seconds", bd->seq);
    goto out;
  }
  uint64_t seconds;
  if (!gn__add_u64(head->seconds, n, &seconds) || bd->seconds != seconds) {
    r = gn__fail(reason, cap, "%s says %" PRIu64 " seconds but carries %" PRIu64 " after the %" PRIu64 " accepted",
                 what, bd->seconds, n, head->seconds);
    goto out;
  }
  if (bd->seconds > t->max_s) {
    r = gn__fail(reason, cap, "%s bills %" PRIu64 " seconds but the lease allows at most max_s %" PRIu64, what,
                 bd->seconds, t->max_s);
    goto out;
  }
  if (final) {
    char pa[32], pb[32];
    if (bd->start_s != ctx->ag.start_s) {
      r = gn__fail(reason, cap, "invoice start_s is %" PRId64 " but the agreement started at %" PRId64, bd->start_s,
                   ctx->ag.start_s);
      goto out;
    }
    if (bd->end_s < bd->start_s) {
      r = gn__fail(reason, cap, "invoice end_s %" PRId64 " is before start_s %" PRId64, bd->end_s, bd->start_s);
      goto out;
    }
    /* start_s is in [0, 2^40] (gn_agreement_open), end_s >= start_s: no overflow. */
    const uint64_t window = (uint64_t)(bd->end_s - bd->start_s);
    if (bd->seconds > window) {
      r = gn__fail(reason, cap,
                   "invoice bills %" PRIu64 " seconds but its window end_s - start_s holds only %" PRIu64 " (%" PRId64
                   " .. %" PRId64 ")",
                   bd->seconds, window, bd->start_s, bd->end_s);
      goto out;
    }
    if (bd->price_uper_hour != t->price_uper_hour) {
      gn_price_format(bd->price_uper_hour, pa, sizeof(pa));
      gn_price_format(t->price_uper_hour, pb, sizeof(pb));
      r = gn__fail(reason, cap, "invoice price is %s but the agreement says %s %s/GPU-hour", pa, pb, t->currency);
      goto out;
    }
    if (strcmp(bd->currency, t->currency) != 0) {
      r = gn__fail(reason, cap, "invoice currency is %s but the agreement says %s", bd->currency, t->currency);
      goto out;
    }
  }
  uint8_t chain[GN__HASH_LEN];
  uint64_t sum = 0, gpu_seconds, total;
  memcpy(chain, head->chain_head, GN__HASH_LEN);
  if ((r = walk_ticks(ctx, bd->ticks, n, bd->from, chain, &sum, GN_EAUDIT, reason, cap)) < 0)
    goto out;
  if (memcmp(chain, bd->chain_head, GN__HASH_LEN) != 0) {
    r = gn__fail(reason, cap,
                 "%s chain_head does not match the chain recomputed from our head through its %" PRIu64
                 " seconds (a tick was changed, added or removed)",
                 what, n);
    goto out;
  }
  if (!gn__add_u64(head->gpu_seconds, sum, &gpu_seconds)) {
    r = gn__fail(reason, cap, "%s gpu_seconds overflow", what);
    goto out;
  }
  if (bd->gpu_seconds != gpu_seconds) {
    r = gn__fail(reason, cap, "%s says gpu_seconds %" PRIu64 " but its ticks add up to %" PRIu64, what, bd->gpu_seconds,
                 gpu_seconds);
    goto out;
  }
  if (gn_price_cost_checked(t->price_uper_hour, 1, gpu_seconds, &total) < 0) {
    r = gn__fail(reason, cap, "%s total overflows: %" PRIu64 " GPU-seconds at %" PRIu64 " micro/GPU-hour", what,
                 gpu_seconds, t->price_uper_hour);
    goto out;
  }
  if (bd->total_micro != total) {
    char pa[32];
    gn_price_format(t->price_uper_hour, pa, sizeof(pa));
    r = gn__fail(reason, cap,
                 "%s total_micro is %" PRIu64 " but %" PRIu64 " GPU-seconds at %s %s/GPU-hour cost %" PRIu64, what,
                 bd->total_micro, gpu_seconds, pa, t->currency, total);
    goto out;
  }
  if (lim && lim->check_observed) {
    uint64_t allowed;
    if (!gn__add_u64(lim->observed_s, lim->tolerance_s, &allowed))
      allowed = UINT64_MAX; /* a bound, not a bill: the widest bound is safe */
    if (bd->seconds > allowed) {
      r = gn__fail(reason, cap,
                   "%s bills %" PRIu64 " seconds but only %" PRIu64 " were observed (tolerance %" PRIu64 " s)", what,
                   bd->seconds, lim->observed_s, lim->tolerance_s);
      goto out;
    }
  }
  if (lim && lim->max_spend_micro && bd->total_micro > lim->max_spend_micro) {
    char pa[32], pb[32];
    gn_price_format(bd->total_micro, pa, sizeof(pa));
    gn_price_format(lim->max_spend_micro, pb, sizeof(pb));
    r = gn__fail(reason, cap, "spending cap: %s bills %s %s, over the cap of %s %s", what, pa, t->currency, pb,
                 t->currency);
    goto out;
  }
  /* All verified: fill the summary and the head accepting it would give. */
  gn_bill_note *no = &v.note;
  no->final = final;
  memcpy(no->lease_id, bd->lease_id, sizeof(no->lease_id));
  gn_bill_hash(env, len, no->hash);
  no->seq = bd->seq;
  memcpy(no->prev, bd->prev, GN__HASH_LEN);
  no->from = bd->from;
  no->n = n;
  no->seconds = bd->seconds;
  no->gpu_seconds = bd->gpu_seconds;
  no->total_micro = bd->total_micro;
  memcpy(no->chain_head, bd->chain_head, GN__HASH_LEN);
  no->issued_s = bd->issued_s;
  no->start_s = final ? bd->start_s : ctx->ag.start_s;
  no->end_s = bd->end_s;
  memcpy(no->end_reason, bd->end_reason, sizeof(no->end_reason));
  no->energy = bd->energy;
  v.next.seq = bd->seq;
  memcpy(v.next.note_hash, no->hash, GN__HASH_LEN);
  v.next.seconds = bd->seconds;
  v.next.gpu_seconds = bd->gpu_seconds;
  v.next.total_micro = bd->total_micro;
  memcpy(v.next.chain_head, bd->chain_head, GN__HASH_LEN);
  *ret = v;
  return 0;
out:
  gn_wire_doc_done(&v.doc);
  return r;
}

int gn__bill_verify(const uint8_t *env, size_t len, bool final, const gn__bill_ctx *ctx, const gn_bill_head *head,
                    const gn__bill_limits *lim, gn__bill_view *ret, char *reason, size_t cap) {
  return gn__bill_verify_sig(env, len, GN__SIG_UNCHECKED, final, ctx, head, lim, ret, reason, cap);
}

static int check_common(const uint8_t *env, size_t len, bool final, const uint8_t *agreement_env, size_t agreement_len,
                        const gn_bill_head *head, const gn__bill_limits *lim, gn_bill_head *ret_next,
                        gn_bill_note *ret_note, char *reason, size_t cap) {
  gn__bill_ctx ctx;
  gn__bill_view v;
  int r;
  if (reason && cap)
    reason[0] = 0;
  if (!head)
    return gn__fail(reason, cap, "no head to check against");
  if ((r = gn__bill_ctx_open(agreement_env, agreement_len, &ctx, reason, cap)) < 0)
    return r;
  if ((r = gn__bill_verify(env, len, final, &ctx, head, lim, &v, reason, cap)) < 0)
    return r;
  if (ret_next)
    *ret_next = v.next;
  if (ret_note)
    *ret_note = v.note;
  gn__bill_view_done(&v);
  return 0;
}

int gn_bill_note_check(const uint8_t *note_env, size_t len, const uint8_t *agreement_env, size_t agreement_len,
                       const gn_bill_head *head, uint64_t observed_s, uint64_t tolerance_s, uint64_t max_spend_micro,
                       gn_bill_head *ret_next, gn_bill_note *ret_note, char *reason, size_t cap) {
  gn__bill_limits lim = {true, observed_s, tolerance_s, max_spend_micro, true};
  return check_common(note_env, len, false, agreement_env, agreement_len, head, &lim, ret_next, ret_note, reason, cap);
}

int gn_bill_invoice_check(const uint8_t *invoice_env, size_t len, const uint8_t *agreement_env, size_t agreement_len,
                          const gn_bill_head *head, uint64_t observed_s, uint64_t tolerance_s, uint64_t max_spend_micro,
                          gn_bill_head *ret_next, gn_bill_note *ret_note, char *reason, size_t cap) {
  gn__bill_limits lim = {true, observed_s, tolerance_s, max_spend_micro, false};
  return check_common(invoice_env, len, true, agreement_env, agreement_len, head, &lim, ret_next, ret_note, reason,
                      cap);
}

int gn_bill_note_open(const uint8_t *env, size_t len, const uint8_t *agreement_env, size_t agreement_len,
                      const gn_bill_head *head, gn_bill_head *ret_next, gn_bill_note *ret_note, char *reason,
                      size_t cap) {
  uint32_t type = 0;
  uint8_t signer[GN_PK_LEN];
  uint8_t *body = NULL;
  size_t blen = 0;
  if (env && gn__envelope_peek(env, len, &type, signer, &body, &blen) == 0)
    free(body);
  return check_common(env, len, type == GN_MSG_INVOICE, agreement_env, agreement_len, head, NULL, ret_next, ret_note,
                      reason, cap);
}

/* --- sealing (provider) ------------------------------------------------------*/

static int seal_common(bool final, const gn_identity *provider, const uint8_t *agreement_env, size_t agreement_len,
                       const gn_bill_head *head, const uint8_t *ticks, uint64_t n, int64_t issued_s, int64_t end_s,
                       const char *end_reason, const gn_bill_energy *energy, gn_buf *ret_env, gn_bill_head *ret_next) {
  gn__bill_ctx ctx;
  gn__bill_body b;
  gn_buf body = {0}, env = {0};
  uint64_t sum = 0;
  int r;
  if (!provider || !head || (n && !ticks) || !ret_env || n > GN_BILL_MAX_TICKS || (!final && n == 0))
    return GN_EINVAL;
  if (final && (!end_reason || strlen(end_reason) >= sizeof(b.end_reason) || !gn__printable(end_reason)))
    return GN_EINVAL;
  if (energy && energy->present &&
      (!final || energy->measured_s == 0 || energy->measured_s > INT64_MAX || energy->mj > INT64_MAX))
    return GN_EINVAL;
  if ((r = gn__bill_ctx_open(agreement_env, agreement_len, &ctx, NULL, 0)) < 0)
    return GN_EINVAL;
  if (memcmp(provider->pk, ctx.ag.terms.provider, GN_PK_LEN) != 0)
    return GN_EPERM;
  memset(&b, 0, sizeof(b));
  b.final = final;
  snprintf(b.lease_id, sizeof(b.lease_id), "%s", ctx.ag.terms.lease_id);
  b.agreement = agreement_env;
  b.agreement_len = agreement_len;
  memcpy(b.agreement_hash, ctx.hash, GN__HASH_LEN);
  b.seq = final ? head->seq : head->seq + 1;
  if (!final && b.seq == 0)
    return GN_EINVAL; /* seq overflow */
  memcpy(b.prev, head->note_hash, GN__HASH_LEN);
  if (!gn__add_u64(head->seconds, 1, &b.from) || !gn__add_u64(head->seconds, n, &b.seconds))
    return GN_EINVAL;
  if (b.seconds > ctx.ag.terms.max_s)
    return GN_EINVAL;
  b.ticks = ticks;
  b.ticks_len = (size_t)n * GN_BILL_TICK_LEN;
  memcpy(b.chain_head, head->chain_head, GN__HASH_LEN);
  if ((r = walk_ticks(&ctx, ticks, n, b.from, b.chain_head, &sum, GN_EINVAL, NULL, 0)) < 0)
    return r;
  if (!gn__add_u64(head->gpu_seconds, sum, &b.gpu_seconds))
    return GN_EINVAL;
  if (gn_price_cost_checked(ctx.ag.terms.price_uper_hour, 1, b.gpu_seconds, &b.total_micro) < 0)
    return GN_EINVAL;
  b.issued_s = issued_s;
  if (final) {
    b.price_uper_hour = ctx.ag.terms.price_uper_hour;
    memcpy(b.currency, ctx.ag.terms.currency, sizeof(b.currency));
    b.start_s = ctx.ag.start_s;
    /* Every billed second lies in the window: an end_s before start_s +
     * seconds (the wall clock is behind the monotonic meter) is raised to it. */
    b.end_s = end_s < b.start_s + (int64_t)b.seconds ? b.start_s + (int64_t)b.seconds : end_s;
    snprintf(b.end_reason, sizeof(b.end_reason), "%s", end_reason);
    if (energy && energy->present)
      b.energy = *energy;
  }
  if ((r = gn__bill_body_encode(&b, &body)) < 0)
    goto out;
  r = GN_ETOOBIG;
  if (body.len > GN_MSG_MAX - ENVELOPE_OVERHEAD)
    goto out;
  if ((r = gn_envelope_seal(provider, final ? GN_MSG_INVOICE : GN_MSG_DEBIT_NOTE, body.data, body.len, &env)) < 0)
    goto out;
  if (ret_next) {
    gn_bill_head h;
    h.seq = b.seq;
    gn_bill_hash(env.data, env.len, h.note_hash);
    h.seconds = b.seconds;
    h.gpu_seconds = b.gpu_seconds;
    h.total_micro = b.total_micro;
    memcpy(h.chain_head, b.chain_head, GN__HASH_LEN);
    *ret_next = h;
  }
  r = gn_buf_append(ret_env, env.data, env.len);
out:
  gn_buf_done(&env);
  gn_buf_done(&body);
  return r;
}

int gn_bill_note_seal(const gn_identity *provider, const uint8_t *agreement_env, size_t agreement_len,
                      const gn_bill_head *head, const uint8_t *ticks, uint64_t n, int64_t issued_s, gn_buf *ret_env,
                      gn_bill_head *ret_next) {
  return seal_common(false, provider, agreement_env, agreement_len, head, ticks, n, issued_s, 0, NULL, NULL, ret_env,
                     ret_next);
}

int gn_bill_invoice_seal(const gn_identity *provider, const uint8_t *agreement_env, size_t agreement_len,
                         const gn_bill_head *head, const uint8_t *ticks, uint64_t n, int64_t end_s,
                         const char *end_reason, gn_buf *ret_env, gn_bill_head *ret_next) {
  return seal_common(true, provider, agreement_env, agreement_len, head, ticks, n, 0, end_s, end_reason, NULL, ret_env,
                     ret_next);
}

int gn_bill_invoice_seal_energy(const gn_identity *provider, const uint8_t *agreement_env, size_t agreement_len,
                                const gn_bill_head *head, const uint8_t *ticks, uint64_t n, int64_t end_s,
                                const char *end_reason, const gn_bill_energy *energy, gn_buf *ret_env,
                                gn_bill_head *ret_next) {
  return seal_common(true, provider, agreement_env, agreement_len, head, ticks, n, 0, end_s, end_reason, energy,
                     ret_env, ret_next);
}

/* --- the requester's answers ---------------------------------------------------*/

/* Copies a reason as 1..255 printable bytes: others are shown as '?'. */
static void reason_copy(char out[256], const char *in) {
  size_t n = 0;
  for (; in && in[n] && n < 255; n++)
    out[n] = ((unsigned char)in[n] < 0x20 || (unsigned char)in[n] > 0x7e) ? '?' : in[n];
  out[n] = 0;
  if (n == 0)
    snprintf(out, 256, "rejected");
}

static int answer_seal(const gn_identity *requester, uint32_t type, const gn__bill_ctx *ctx,
                       const uint8_t hash[GN__HASH_LEN], uint64_t seq, uint64_t seconds, uint64_t total_micro,
                       int64_t accepted_s, const char *reason, gn_buf *ret_env) {
  gn_wire_writer w;
  gn_buf body = {0};
  const bool note = type == GN_MSG_DEBIT_ACCEPT || type == GN_MSG_DEBIT_REJECT;
  const bool accept = type == GN_MSG_DEBIT_ACCEPT || type == GN_MSG_INVOICE_ACCEPT;
  int r;
  gn_wire_writer_init(&w);
  gn_wire_put_map(&w, type == GN_MSG_DEBIT_ACCEPT ? 7 : type == GN_MSG_INVOICE_ACCEPT ? 6 : note ? 4 : 3);
  gn_wire_put_str(&w, "lease_id");
  gn_wire_put_str(&w, ctx->ag.terms.lease_id);
  gn_wire_put_str(&w, note ? "note_hash" : "invoice_hash");
  gn_wire_put_bin(&w, hash, GN__HASH_LEN);
  if (note) {
    gn_wire_put_str(&w, "seq");
    gn_wire_put_u64(&w, seq);
  }
  if (type == GN_MSG_INVOICE_ACCEPT) {
    gn_wire_put_str(&w, "accepted_s");
    gn_wire_put_i64(&w, accepted_s);
  }
  if (accept) {
    gn_wire_put_str(&w, "seconds");
    gn_wire_put_u64(&w, seconds);
    gn_wire_put_str(&w, "total_micro");
    gn_wire_put_u64(&w, total_micro);
    gn_wire_put_str(&w, "currency");
    gn_wire_put_str(&w, ctx->ag.terms.currency);
  } else {
    gn_wire_put_str(&w, "reason");
    gn_wire_put_str(&w, reason);
  }
  if (type == GN_MSG_DEBIT_ACCEPT) {
    gn_wire_put_str(&w, "provider");
    gn_wire_put_bin(&w, ctx->ag.terms.provider, GN_PK_LEN);
  }
  r = gn_wire_writer_take(&w, &body);
  gn_wire_writer_done(&w);
  if (r == 0)
    r = gn_envelope_seal(requester, type, body.data, body.len, ret_env);
  gn_buf_done(&body);
  return r;
}

static int requester_ctx(const gn_identity *requester, const uint8_t *agreement_env, size_t agreement_len,
                         gn__bill_ctx *ctx) {
  if (!requester || gn__bill_ctx_open(agreement_env, agreement_len, ctx, NULL, 0) < 0)
    return GN_EINVAL;
  return memcmp(requester->pk, ctx->ag.terms.requester, GN_PK_LEN) == 0 ? 0 : GN_EPERM;
}

int gn_bill_note_accept_seal(const gn_identity *requester, const uint8_t *agreement_env, size_t agreement_len,
                             const gn_bill_head *accepted, gn_buf *ret_env) {
  gn__bill_ctx ctx;
  int r;
  if (!accepted || !ret_env || accepted->seq == 0)
    return GN_EINVAL;
  if ((r = requester_ctx(requester, agreement_env, agreement_len, &ctx)) < 0)
    return r;
  return answer_seal(requester, GN_MSG_DEBIT_ACCEPT, &ctx, accepted->note_hash, accepted->seq, accepted->seconds,
                     accepted->total_micro, 0, NULL, ret_env);
}

int gn_bill_invoice_accept_seal(const gn_identity *requester, const uint8_t *agreement_env, size_t agreement_len,
                                const gn_bill_head *final, int64_t accepted_s, gn_buf *ret_env) {
  gn__bill_ctx ctx;
  int r;
  if (!final || !ret_env)
    return GN_EINVAL;
  if ((r = requester_ctx(requester, agreement_env, agreement_len, &ctx)) < 0)
    return r;
  return answer_seal(requester, GN_MSG_INVOICE_ACCEPT, &ctx, final->note_hash, 0, final->seconds, final->total_micro,
                     accepted_s, NULL, ret_env);
}

/* Reads a note's seq without trusting it (for naming it in a rejection). */
static uint64_t peek_seq(const uint8_t *env, size_t len) {
  uint32_t type;
  uint8_t signer[GN_PK_LEN];
  uint8_t *body = NULL;
  size_t blen = 0;
  uint64_t seq = 0;
  gn_wire_doc doc;
  if (gn__envelope_peek(env, len, &type, signer, &body, &blen) < 0)
    return 0;
  if (gn_wire_decode(body, blen, &doc) == 0) {
    if (doc.root->type != MSGPACK_OBJECT_MAP || gn_wire_get_u64(doc.root, "seq", &seq) < 0)
      seq = 0;
    gn_wire_doc_done(&doc);
  }
  free(body);
  return seq;
}

int gn_bill_note_reject_seal(const gn_identity *requester, const uint8_t *agreement_env, size_t agreement_len,
                             const uint8_t *note_env, size_t note_len, const char *reason, gn_buf *ret_env) {
  gn__bill_ctx ctx;
  uint8_t hash[GN__HASH_LEN];
  char why[256];
  int r;
  if (!note_env || !ret_env)
    return GN_EINVAL;
  if ((r = requester_ctx(requester, agreement_env, agreement_len, &ctx)) < 0)
    return r;
  gn_bill_hash(note_env, note_len, hash);
  reason_copy(why, reason);
  return answer_seal(requester, GN_MSG_DEBIT_REJECT, &ctx, hash, peek_seq(note_env, note_len), 0, 0, 0, why, ret_env);
}

int gn_bill_invoice_reject_seal(const gn_identity *requester, const uint8_t *agreement_env, size_t agreement_len,
                                const uint8_t *invoice_env, size_t invoice_len, const char *reason, gn_buf *ret_env) {
  gn__bill_ctx ctx;
  uint8_t hash[GN__HASH_LEN];
  char why[256];
  int r;
  if (!invoice_env || !ret_env)
    return GN_EINVAL;
  if ((r = requester_ctx(requester, agreement_env, agreement_len, &ctx)) < 0)
    return r;
  gn_bill_hash(invoice_env, invoice_len, hash);
  reason_copy(why, reason);
  return answer_seal(requester, GN_MSG_INVOICE_REJECT, &ctx, hash, 0, 0, 0, 0, why, ret_env);
}

/* --- the provider's open of an answer -----------------------------------------*/

int gn__bill_response_open_sig(const uint8_t *env, size_t len, int sig_rc, const gn__bill_ctx *ctx,
                               gn_bill_response *ret, char *reason, size_t cap) {
  gn_envelope e;
  gn_wire_doc doc;
  gn_bill_response resp;
  char a[GN_NODE_ID_STRLEN], b[GN_NODE_ID_STRLEN];
  int r;
  if (!env || !ret) {
    gn__fail(reason, cap, "no response given");
    return GN_EINVAL;
  }
  memset(&resp, 0, sizeof(resp));
  r = env_open(env, len, sig_rc, &e);
  if (r == GN_ESIG) {
    gn_node_id_format(ctx->ag.terms.requester, a);
    gn__fail(reason, cap, "response signature does not verify against requester %s", a);
    return GN_ESIG;
  }
  if (r < 0) {
    gn__fail(reason, cap, "response envelope is malformed (%s)", gn_strerror(r));
    return r;
  }
  if (e.type != GN_MSG_DEBIT_ACCEPT && e.type != GN_MSG_DEBIT_REJECT && e.type != GN_MSG_INVOICE_ACCEPT &&
      e.type != GN_MSG_INVOICE_REJECT) {
    gn__fail(reason, cap, "response has type %" PRIu32 ", not an acceptance or rejection", e.type);
    return GN_EPROTO;
  }
  if (memcmp(e.signer, ctx->ag.terms.requester, GN_PK_LEN) != 0) {
    gn_node_id_format(e.signer, a);
    gn_node_id_format(ctx->ag.terms.requester, b);
    gn__fail(reason, cap, "response is signed by %s, not by the lease's requester %s", a, b);
    return GN_EPERM;
  }
  resp.type = e.type;
  resp.accepted = e.type == GN_MSG_DEBIT_ACCEPT || e.type == GN_MSG_INVOICE_ACCEPT;
  resp.final = e.type == GN_MSG_INVOICE_ACCEPT || e.type == GN_MSG_INVOICE_REJECT;
  if ((r = gn_wire_decode(e.body, e.body_len, &doc)) < 0) {
    gn__fail(reason, cap, "response body is not valid msgpack");
    return GN_EINVAL;
  }
  const msgpack_object *m = doc.root;
  const uint32_t keys = e.type == GN_MSG_DEBIT_ACCEPT     ? 7
                        : e.type == GN_MSG_INVOICE_ACCEPT ? 6
                        : e.type == GN_MSG_DEBIT_REJECT   ? 4
                                                          : 3;
  char currency[8] = "";
  uint8_t prov[GN_PK_LEN];
  const char *field = NULL;
  if (m->type != MSGPACK_OBJECT_MAP || m->via.map.size != keys)
    field = "(body is not a map of the expected keys)";
  else if (gn_wire_get_str(m, "lease_id", resp.lease_id, sizeof(resp.lease_id)) < 0)
    field = "lease_id";
  else if (gn_wire_get_bin_exact(m, resp.final ? "invoice_hash" : "note_hash", resp.hash, GN__HASH_LEN) < 0)
    field = resp.final ? "invoice_hash" : "note_hash";
  else if (!resp.final && gn_wire_get_u64(m, "seq", &resp.seq) < 0)
    field = "seq";
  else if (e.type == GN_MSG_INVOICE_ACCEPT && gn_wire_get_i64(m, "accepted_s", &resp.accepted_s) < 0)
    field = "accepted_s";
  else if (resp.accepted && gn_wire_get_u64(m, "seconds", &resp.seconds) < 0)
    field = "seconds";
  else if (resp.accepted && gn_wire_get_u64(m, "total_micro", &resp.total_micro) < 0)
    field = "total_micro";
  else if (resp.accepted && gn_wire_get_str(m, "currency", currency, sizeof(currency)) < 0)
    field = "currency";
  else if (!resp.accepted &&
           (gn_wire_get_str(m, "reason", resp.reason, sizeof(resp.reason)) < 0 || !gn__printable(resp.reason)))
    field = "reason";
  else if (e.type == GN_MSG_DEBIT_ACCEPT && gn_wire_get_bin_exact(m, "provider", prov, GN_PK_LEN) < 0)
    field = "provider";
  gn_wire_doc_done(&doc);
  if (field) {
    gn__fail(reason, cap, "response body is malformed: field %s is missing, of the wrong type or too long", field);
    return GN_EINVAL;
  }
  if (strcmp(resp.lease_id, ctx->ag.terms.lease_id) != 0) {
    gn__fail(reason, cap, "response is for lease %.23s, not %s", resp.lease_id, ctx->ag.terms.lease_id);
    return GN_EINVAL;
  }
  if (resp.accepted && strcmp(currency, ctx->ag.terms.currency) != 0) {
    gn__fail(reason, cap, "voucher currency is %s but the agreement says %s", currency, ctx->ag.terms.currency);
    return GN_EINVAL;
  }
  if (e.type == GN_MSG_DEBIT_ACCEPT && memcmp(prov, ctx->ag.terms.provider, GN_PK_LEN) != 0) {
    gn__fail(reason, cap, "voucher names another provider than the agreement's");
    return GN_EINVAL;
  }
  if (e.type == GN_MSG_DEBIT_ACCEPT && resp.seq == 0) {
    gn__fail(reason, cap, "voucher accepts note seq 0");
    return GN_EINVAL;
  }
  *ret = resp;
  return 0;
}

int gn__bill_response_open(const uint8_t *env, size_t len, const gn__bill_ctx *ctx, gn_bill_response *ret, char *reason,
                           size_t cap) {
  return gn__bill_response_open_sig(env, len, GN__SIG_UNCHECKED, ctx, ret, reason, cap);
}

int gn_bill_response_open(const uint8_t *env, size_t len, const uint8_t *agreement_env, size_t agreement_len,
                          gn_bill_response *ret) {
  gn__bill_ctx ctx;
  if (gn__bill_ctx_open(agreement_env, agreement_len, &ctx, NULL, 0) < 0)
    return GN_EINVAL;
  return gn__bill_response_open(env, len, &ctx, ret, NULL, 0);
}

int gn_bill_response_matches(const gn_bill_response *resp, const gn_bill_note *note) {
  if (!resp || !note)
    return GN_EINVAL;
  if (resp->final != note->final || sodium_memcmp(resp->hash, note->hash, GN__HASH_LEN) != 0)
    return GN_EDIGEST;
  if (!note->final && resp->seq && resp->seq != note->seq)
    return GN_EDIGEST;
  if (!note->final && resp->accepted && resp->seq != note->seq)
    return GN_EDIGEST;
  if (resp->accepted && (resp->seconds != note->seconds || resp->total_micro != note->total_micro))
    return GN_EDIGEST;
  return 0;
}

int gn__bill_peek(const uint8_t *env, size_t len, const gn__bill_ctx *ctx, gn_bill_note *ret, char *reason,
                  size_t cap) {
  return gn__bill_peek_sig(env, len, GN__SIG_UNCHECKED, ctx, ret, reason, cap);
}

int gn__bill_peek_sig(const uint8_t *env, size_t len, int sig_rc, const gn__bill_ctx *ctx, gn_bill_note *ret,
                      char *reason, size_t cap) {
  gn_envelope e;
  gn_wire_doc doc;
  gn__bill_body b;
  gn_bill_note no;
  int r;
  if (!env || !ret)
    return gn__fail(reason, cap, "no note given");
  if ((r = env_open(env, len, sig_rc, &e)) < 0)
    return gn__fail(reason, cap, "note envelope does not verify (%s)", gn_strerror(r));
  if (e.type != GN_MSG_DEBIT_NOTE && e.type != GN_MSG_INVOICE)
    return gn__fail(reason, cap, "envelope of type %" PRIu32 " is neither a debit note nor an invoice", e.type);
  const bool final = e.type == GN_MSG_INVOICE;
  if (memcmp(e.signer, ctx->ag.terms.provider, GN_PK_LEN) != 0)
    return gn__fail(reason, cap, "%s is not signed by the lease's provider", final ? "invoice" : "debit note");
  if ((r = gn__bill_body_decode(final, e.body, e.body_len, &doc, &b, reason, cap)) < 0)
    return r;
  r = GN_EAUDIT;
  if (strcmp(b.lease_id, ctx->ag.terms.lease_id) != 0 ||
      (final ? (b.agreement_len != ctx->len || memcmp(b.agreement, ctx->env, ctx->len) != 0)
             : memcmp(b.agreement_hash, ctx->hash, GN__HASH_LEN) != 0)) {
    gn__fail(reason, cap, "%s is for another lease or agreement", final ? "invoice" : "debit note");
    goto out;
  }
  memset(&no, 0, sizeof(no));
  no.final = final;
  memcpy(no.lease_id, b.lease_id, sizeof(no.lease_id));
  gn_bill_hash(env, len, no.hash);
  no.seq = b.seq;
  memcpy(no.prev, b.prev, GN__HASH_LEN);
  no.from = b.from;
  no.n = b.ticks_len / GN_BILL_TICK_LEN;
  no.seconds = b.seconds;
  no.gpu_seconds = b.gpu_seconds;
  no.total_micro = b.total_micro;
  memcpy(no.chain_head, b.chain_head, GN__HASH_LEN);
  no.issued_s = b.issued_s;
  no.start_s = final ? b.start_s : ctx->ag.start_s;
  no.end_s = b.end_s;
  memcpy(no.end_reason, b.end_reason, sizeof(no.end_reason));
  no.energy = b.energy;
  *ret = no;
  r = 0;
out:
  gn_wire_doc_done(&doc);
  return r;
}

int gn__invoice_agreement(const uint8_t *env, size_t len, gn_buf *ret_ag) {
  uint32_t type;
  uint8_t signer[GN_PK_LEN];
  uint8_t *body = NULL;
  size_t blen = 0;
  gn_wire_doc doc;
  gn__bill_body b;
  int r;
  if (!env || !ret_ag)
    return GN_EINVAL;
  if ((r = gn__envelope_peek(env, len, &type, signer, &body, &blen)) < 0)
    return r;
  r = GN_EPROTO;
  if (type != GN_MSG_INVOICE)
    goto out;
  r = GN_EINVAL;
  if (gn__bill_body_decode(true, body, blen, &doc, &b, NULL, 0) < 0)
    goto out;
  r = gn_buf_append(ret_ag, b.agreement, b.agreement_len);
  gn_wire_doc_done(&doc);
out:
  free(body);
  return r;
}
