/* The self-contained JSON export of an invoice and its audit: the signed
 * envelopes (hex) are authoritative, and every readable field beside them
 * must say exactly what the signed data says. */
#include "billing_int.h"

#include <inttypes.h>
#include <jansson.h>
#include <sodium.h>
#include <stdio.h>

#define EXPORT_FORMAT "gpunet-invoice/1"

static json_t *hex_json(const uint8_t *p, size_t n) {
  char *hex = malloc(n * 2 + 1);
  if (!hex)
    return NULL;
  sodium_bin2hex(hex, n * 2 + 1, p, n);
  json_t *j = json_stringn(hex, n * 2);
  free(hex);
  return j;
}

/* json_object_set_new that remembers the first failure (out of memory). */
static void set(json_t *o, const char *key, json_t *v, bool *ok) {
  if (!v || json_object_set_new(o, key, v) < 0)
    *ok = false;
}

static void price_text(uint64_t micro, const char *currency, const char *suffix, char *buf, size_t cap) {
  char p[32];
  gn_price_format(micro, p, sizeof(p));
  snprintf(buf, cap, "%s %s%s", p, currency, suffix);
}

int gn_invoice_export(const uint8_t *invoice_env, size_t invoice_len, const uint8_t *accept_env, size_t accept_len,
                      struct json_t **ret_json) {
  gn__invoice_view v;
  gn_invoice_response resp;
  char id[GN_NODE_ID_STRLEN], text[96];
  json_t *o = NULL, *ticks = NULL, *envs = NULL;
  bool ok = true;
  int r;
  if (!invoice_env || !ret_json || (accept_len && !accept_env))
    return GN_EINVAL;
  if ((r = gn__invoice_verify(invoice_env, invoice_len, NULL, 0, &v, NULL, 0)) < 0)
    return r;
  if (accept_len) {
    if ((r = gn_invoice_response_open(accept_env, accept_len, invoice_env, invoice_len, &resp)) < 0)
      goto out;
    r = GN_EINVAL;
    if (!resp.accepted) /* a rejection is not an acceptance to export */
      goto out;
  }
  r = GN_ETOOBIG;
  /* JSON integers are signed 64-bit in jansson. */
  if (v.body.price_uper_hour > INT64_MAX || v.body.total_micro > INT64_MAX)
    goto out;
  r = GN_ENOMEM;
  if (!(o = json_object()) || !(ticks = json_array()) || !(envs = json_object()))
    goto out;
  gn_invoice_summary s;
  gn__invoice_summary_fill(&v, &s);
  set(o, "format", json_string(EXPORT_FORMAT), &ok);
  set(o, "invoice_id", json_string(s.invoice_id), &ok);
  set(o, "lease_id", json_string(s.lease_id), &ok);
  gn_node_id_format(s.provider, id);
  set(o, "provider", json_string(id), &ok);
  gn_node_id_format(s.requester, id);
  set(o, "requester", json_string(id), &ok);
  set(o, "gpu_model", json_string(s.gpu_model), &ok);
  set(o, "gpus", json_integer(s.gpus), &ok);
  set(o, "price_uper_hour", json_integer((json_int_t)s.price_uper_hour), &ok);
  price_text(s.price_uper_hour, s.currency, "/GPU-hour", text, sizeof(text));
  set(o, "price", json_string(text), &ok);
  set(o, "currency", json_string(s.currency), &ok);
  set(o, "start_s", json_integer(s.start_s), &ok);
  set(o, "end_s", json_integer(s.end_s), &ok);
  set(o, "end_reason", json_string(v.body.end_reason), &ok);
  set(o, "seconds", json_integer((json_int_t)s.seconds), &ok);
  set(o, "total_micro", json_integer((json_int_t)s.total_micro), &ok);
  price_text(s.total_micro, s.currency, "", text, sizeof(text));
  set(o, "total", json_string(text), &ok);
  set(o, "chain_head", hex_json(s.chain_head, sizeof(s.chain_head)), &ok);

  uint8_t h[GN__HASH_LEN];
  gn__genesis(v.body.agreement, v.body.agreement_len, h);
  for (uint64_t i = 0; ok && i < v.body.seconds; i++) {
    gn__tickrec rec;
    gn__tickrec_get(v.body.ticks + i * GN__TICKREC_LEN, &rec);
    int64_t ts = v.body.start_s + (int64_t)rec.t_off;
    gn__tick_hash(h, v.body.lease_id, rec.idx, ts, rec.gpus, rec.util, h);
    json_t *t = json_object();
    if (!t) {
      ok = false;
      break;
    }
    set(t, "second", json_integer(rec.idx), &ok);
    set(t, "t", json_integer(ts), &ok);
    set(t, "gpus", json_integer(rec.gpus), &ok);
    set(t, "util", rec.util == GN_UTIL_UNKNOWN ? json_null() : json_integer(rec.util), &ok);
    set(t, "hash", hex_json(h, sizeof(h)), &ok);
    if (json_array_append_new(ticks, t) < 0)
      ok = false;
  }
  set(o, "ticks", ticks, &ok);
  ticks = NULL;
  set(envs, "agreement", hex_json(v.body.agreement, v.body.agreement_len), &ok);
  set(envs, "invoice", hex_json(invoice_env, invoice_len), &ok);
  set(envs, "acceptance", accept_len ? hex_json(accept_env, accept_len) : json_null(), &ok);
  set(o, "envelopes", envs, &ok);
  envs = NULL;
  if (!ok)
    goto out;
  *ret_json = o;
  o = NULL;
  r = 0;
out:
  json_decref(o);
  json_decref(ticks);
  json_decref(envs);
  gn__invoice_view_done(&v);
  return r;
}

/* --- audit ----------------------------------------------------------------*/

/* Decodes envelopes.<key>; GN_ENOTFOUND if absent or null, GN_EINVAL if not
 * a string, GN_EAUDIT (with reason) if not hex. */
static int unhex_field(const json_t *envs, const char *key, uint8_t **ret, size_t *ret_len, char *reason, size_t cap) {
  const json_t *j = json_object_get(envs, key);
  if (!j || json_is_null(j))
    return GN_ENOTFOUND;
  if (!json_is_string(j))
    return GN_EINVAL;
  const char *hex = json_string_value(j);
  size_t n = json_string_length(j);
  if (n % 2 || n / 2 > GN_MSG_MAX)
    return gn__fail(reason, cap, "envelopes.%s is not an envelope in hex (length %zu)", key, n);
  uint8_t *bin = malloc(n / 2 + 1);
  size_t bin_len = 0;
  const char *end = NULL;
  if (!bin)
    return GN_ENOMEM;
  if (sodium_hex2bin(bin, n / 2 + 1, hex, n, NULL, &bin_len, &end) != 0 || end != hex + n || bin_len != n / 2) {
    free(bin);
    return gn__fail(reason, cap, "envelopes.%s is not valid hex", key);
  }
  *ret = bin;
  *ret_len = bin_len;
  return 0;
}

/* Prints a value the file holds, for a message. */
static void file_value(const json_t *j, char *buf, size_t cap) {
  if (!j)
    snprintf(buf, cap, "nothing (the field is missing)");
  else if (json_is_string(j))
    snprintf(buf, cap, "\"%.80s%s\"", json_string_value(j), json_string_length(j) > 80 ? "..." : "");
  else if (json_is_integer(j))
    snprintf(buf, cap, "%" JSON_INTEGER_FORMAT, json_integer_value(j));
  else if (json_is_null(j))
    snprintf(buf, cap, "null");
  else
    snprintf(buf, cap, "a %s", json_is_object(j) ? "object" : json_is_array(j) ? "array" : "non-integer value");
}

static int str_field(const json_t *o, const char *path, const char *key, const char *want, char *reason, size_t cap) {
  const json_t *j = json_object_get(o, key);
  if (j && json_is_string(j) && json_string_length(j) == strlen(want) && strcmp(json_string_value(j), want) == 0)
    return 0;
  char got[128];
  file_value(j, got, sizeof(got));
  return gn__fail(reason, cap, "%s%s in the file says %s but the signed invoice says \"%s\"", path, key, got, want);
}

static int int_field(const json_t *o, const char *path, const char *key, int64_t want, char *reason, size_t cap) {
  const json_t *j = json_object_get(o, key);
  if (j && json_is_integer(j) && json_integer_value(j) == want)
    return 0;
  char got[128];
  file_value(j, got, sizeof(got));
  return gn__fail(reason, cap, "%s%s in the file says %s but the signed invoice says %" PRId64, path, key, got, want);
}

static int check_readable(const json_t *doc, const gn__invoice_view *v, char *reason, size_t cap) {
  gn_invoice_summary s;
  char text[160], hex[GN__HASH_LEN * 2 + 1];
  int r;
  gn__invoice_summary_fill(v, &s);
  if ((r = str_field(doc, "", "invoice_id", s.invoice_id, reason, cap)) < 0 ||
      (r = str_field(doc, "", "lease_id", s.lease_id, reason, cap)) < 0)
    return r;
  gn_node_id_format(s.provider, text);
  if ((r = str_field(doc, "", "provider", text, reason, cap)) < 0)
    return r;
  gn_node_id_format(s.requester, text);
  if ((r = str_field(doc, "", "requester", text, reason, cap)) < 0 ||
      (r = str_field(doc, "", "gpu_model", s.gpu_model, reason, cap)) < 0 ||
      (r = int_field(doc, "", "gpus", s.gpus, reason, cap)) < 0 ||
      (r = int_field(doc, "", "price_uper_hour", (int64_t)s.price_uper_hour, reason, cap)) < 0)
    return r;
  price_text(s.price_uper_hour, s.currency, "/GPU-hour", text, sizeof(text));
  if ((r = str_field(doc, "", "price", text, reason, cap)) < 0 ||
      (r = str_field(doc, "", "currency", s.currency, reason, cap)) < 0 ||
      (r = int_field(doc, "", "start_s", s.start_s, reason, cap)) < 0 ||
      (r = int_field(doc, "", "end_s", s.end_s, reason, cap)) < 0 ||
      (r = str_field(doc, "", "end_reason", v->body.end_reason, reason, cap)) < 0 ||
      (r = int_field(doc, "", "seconds", (int64_t)s.seconds, reason, cap)) < 0 ||
      (r = int_field(doc, "", "total_micro", (int64_t)s.total_micro, reason, cap)) < 0)
    return r;
  price_text(s.total_micro, s.currency, "", text, sizeof(text));
  if ((r = str_field(doc, "", "total", text, reason, cap)) < 0)
    return r;
  sodium_bin2hex(hex, sizeof(hex), s.chain_head, GN__HASH_LEN);
  if ((r = str_field(doc, "", "chain_head", hex, reason, cap)) < 0)
    return r;

  const json_t *ticks = json_object_get(doc, "ticks");
  if (!json_is_array(ticks))
    return gn__fail(reason, cap, "ticks in the file is missing or not an array");
  if (json_array_size(ticks) != s.seconds)
    return gn__fail(reason, cap, "ticks in the file lists %zu seconds but the signed invoice has %" PRIu64,
                    json_array_size(ticks), s.seconds);
  uint8_t h[GN__HASH_LEN];
  gn__genesis(v->body.agreement, v->body.agreement_len, h);
  for (uint64_t i = 0; i < s.seconds; i++) {
    gn__tickrec rec;
    char path[48];
    const json_t *t = json_array_get(ticks, i);
    gn__tickrec_get(v->body.ticks + i * GN__TICKREC_LEN, &rec);
    int64_t ts = v->body.start_s + (int64_t)rec.t_off;
    gn__tick_hash(h, v->body.lease_id, rec.idx, ts, rec.gpus, rec.util, h);
    snprintf(path, sizeof(path), "ticks[%" PRIu64 "].", i);
    if (!json_is_object(t))
      return gn__fail(reason, cap, "ticks[%" PRIu64 "] in the file is not an object", i);
    if ((r = int_field(t, path, "second", rec.idx, reason, cap)) < 0 ||
        (r = int_field(t, path, "t", ts, reason, cap)) < 0 ||
        (r = int_field(t, path, "gpus", rec.gpus, reason, cap)) < 0)
      return r;
    const json_t *u = json_object_get(t, "util");
    if (rec.util == GN_UTIL_UNKNOWN) {
      if (!u || !json_is_null(u)) {
        char got[128];
        file_value(u, got, sizeof(got));
        return gn__fail(reason, cap, "%sutil in the file says %s but the signed invoice says null (unknown)", path,
                        got);
      }
    } else if ((r = int_field(t, path, "util", rec.util, reason, cap)) < 0) {
      return r;
    }
    sodium_bin2hex(hex, sizeof(hex), h, GN__HASH_LEN);
    const json_t *hj = json_object_get(t, "hash");
    if (!hj || !json_is_string(hj) || strcmp(json_string_value(hj), hex) != 0) {
      char got[128];
      file_value(hj, got, sizeof(got));
      return gn__fail(reason, cap, "%shash in the file says %s but the chain recomputed from the signed ticks gives %s",
                      path, got, hex);
    }
  }
  return 0;
}

static int check_acceptance(const uint8_t *acc, size_t acc_len, const uint8_t *inv, size_t inv_len,
                            const gn__invoice_view *v, gn_invoice_summary *sum, char *reason, size_t cap) {
  gn_envelope e;
  gn_invoice_response resp;
  char a[GN_NODE_ID_STRLEN], b[GN_NODE_ID_STRLEN];
  int r = gn_envelope_open(acc, acc_len, &e);
  gn_node_id_format(v->agreement.terms.requester, b);
  if (r == GN_ESIG)
    return gn__fail(reason, cap, "acceptance signature does not verify against requester %s", b);
  if (r < 0)
    return gn__fail(reason, cap, "acceptance envelope is malformed (%s)", gn_strerror(r));
  r = gn_invoice_response_open(acc, acc_len, inv, inv_len, &resp);
  if (r == GN_EPERM) {
    gn_node_id_format(e.signer, a);
    return gn__fail(reason, cap, "acceptance is signed by %s, not by the requester %s", a, b);
  }
  if (r == GN_EDIGEST)
    return gn__fail(reason, cap, "acceptance is for another invoice (its invoice_hash does not match this invoice)");
  if (r < 0)
    return gn__fail(reason, cap, "acceptance is not a valid invoice acceptance (%s)", gn_strerror(r));
  if (!resp.accepted)
    return gn__fail(reason, cap, "the requester rejected this invoice: %s", resp.reason);
  sum->countersigned = true;
  sum->accepted_s = resp.at_s;
  return 0;
}

static int audit_v1(const struct json_t *doc, gn_invoice_summary *ret, char *reason, size_t cap) {
  uint8_t *inv = NULL, *ag = NULL, *acc = NULL;
  size_t inv_len = 0, ag_len = 0, acc_len = 0;
  gn__invoice_view v;
  bool have_view = false;
  gn_invoice_summary sum;
  int r;
  if (reason && cap)
    reason[0] = 0;
  const json_t *fmt = json_is_object(doc) ? json_object_get(doc, "format") : NULL;
  if (!fmt || !json_is_string(fmt) || strcmp(json_string_value(fmt), EXPORT_FORMAT) != 0) {
    gn__fail(reason, cap, "not a gpunet invoice export (no \"format\": \"" EXPORT_FORMAT "\")");
    return GN_EINVAL;
  }
  const json_t *envs = json_object_get(doc, "envelopes");
  if (!json_is_object(envs)) {
    gn__fail(reason, cap, "not a gpunet invoice export (no \"envelopes\" object)");
    return GN_EINVAL;
  }
  r = unhex_field(envs, "invoice", &inv, &inv_len, reason, cap);
  if (r == 0)
    r = unhex_field(envs, "agreement", &ag, &ag_len, reason, cap);
  if (r == GN_ENOTFOUND || r == GN_EINVAL) {
    gn__fail(reason, cap,
             "not a gpunet invoice export (envelopes.invoice and envelopes.agreement must be hex strings)");
    r = GN_EINVAL;
    goto out;
  }
  if (r < 0)
    goto out;
  r = unhex_field(envs, "acceptance", &acc, &acc_len, reason, cap);
  if (r == GN_EINVAL) {
    r = gn__fail(reason, cap, "envelopes.acceptance is neither null nor a hex string");
    goto out;
  }
  if (r < 0 && r != GN_ENOTFOUND)
    goto out;
  if ((r = gn__invoice_verify(inv, inv_len, NULL, 0, &v, reason, cap)) < 0)
    goto out;
  have_view = true;
  if (v.body.agreement_len != ag_len || memcmp(v.body.agreement, ag, ag_len) != 0) {
    r = gn__fail(reason, cap, "envelopes.agreement is not the agreement signed into the invoice");
    goto out;
  }
  gn__invoice_summary_fill(&v, &sum);
  if (acc && (r = check_acceptance(acc, acc_len, inv, inv_len, &v, &sum, reason, cap)) < 0)
    goto out;
  if ((r = check_readable(doc, &v, reason, cap)) < 0)
    goto out;
  if (reason && cap)
    reason[0] = 0;
  if (!sum.countersigned)
    gn__fail(reason, cap, "signed by the provider only: the export carries no acceptance by the requester");
  if (ret)
    *ret = sum;
  r = 0;
out:
  if (have_view)
    gn__invoice_view_done(&v);
  free(inv);
  free(ag);
  free(acc);
  return r;
}

/* Temporary bridge while the v2 audit lands. */
int gn_invoice_audit_json(const struct json_t *doc, gn_bill_audit *ret) {
  memset(ret, 0, sizeof(*ret));
  int r = audit_v1(doc, &ret->summary, ret->reason, sizeof(ret->reason));
  if (r == GN_EINVAL || r == GN_ENOMEM)
    return r;
  ret->has_invoice = true;
  ret->verdict = r < 0 ? GN_BILL_INVALID : ret->summary.countersigned ? GN_BILL_COUNTERSIGNED : GN_BILL_PROVIDER_ONLY;
  return ret->verdict == GN_BILL_COUNTERSIGNED ? 0 : GN_EAUDIT;
}
