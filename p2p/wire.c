/* The bounded msgpack codec: a writer over msgpack-c's packer, and a reader
 * that pre-scans hostile bytes before msgpack-c is allowed to allocate. */
#include <gpunet/wire.h>

/* Besides the per-container limit, the whole document is bounded in objects:
 * msgpack-c allocates one msgpack_object (24 bytes) per element, so without
 * this an 8 MiB message of tiny nested arrays would cost ~200 MiB. */
#define WIRE_MAX_OBJECTS (4u * GN_WIRE_MAX_ITEMS)

const char *gn_msg_type_name(uint32_t type) {
  switch (type) {
  case GN_MSG_PEERS:
    return "peers";
  case GN_MSG_OFFER:
    return "offer";
  case GN_MSG_OFFER_WITHDRAW:
    return "offer_withdraw";
  case GN_MSG_LEASE_REQUEST:
    return "lease_request";
  case GN_MSG_LEASE_ACCEPT:
    return "lease_accept";
  case GN_MSG_LEASE_REJECT:
    return "lease_reject";
  case GN_MSG_LEASE_RELEASE:
    return "lease_release";
  case GN_MSG_LEASE_END:
    return "lease_end";
  case GN_MSG_JOB_MANIFEST:
    return "job_manifest";
  case GN_MSG_JOB_STATUS:
    return "job_status";
  case GN_MSG_JOB_LOG:
    return "job_log";
  case GN_MSG_JOB_STOP:
    return "job_stop";
  case GN_MSG_JOB_OUTPUT_GET:
    return "job_output_get";
  case GN_MSG_JOB_OUTPUT:
    return "job_output";
  case GN_MSG_JOB_SEED_GET:
    return "job_seed_get";
  case GN_MSG_JOB_SEED:
    return "job_seed";
  case GN_MSG_INVOICE:
    return "invoice";
  case GN_MSG_INVOICE_ACCEPT:
    return "invoice_accept";
  case GN_MSG_INVOICE_REJECT:
    return "invoice_reject";
  case GN_MSG_DEBIT_NOTE:
    return "debit_note";
  case GN_MSG_DEBIT_ACCEPT:
    return "debit_accept";
  case GN_MSG_DEBIT_REJECT:
    return "debit_reject";
  case GN_MSG_ERROR:
    return "error";
  case GN_MSG_ATTEST_CHALLENGE:
    return "attest_challenge";
  case GN_MSG_ATTEST_RESPONSE:
    return "attest_response";
  case GN_MSG_ATTEST_OPEN:
    return "attest_open";
  case GN_MSG_RTT_ASK:
    return "rtt_ask";
  case GN_MSG_RTT_REPORT:
    return "rtt_report";
  case GN_MSG_RTT_PING:
    return "rtt_ping";
  case GN_MSG_RTT_PONG:
    return "rtt_pong";
  case GN_MSG_ATTEST_PROOF:
    return "attest_proof";
  case GN_MSG_OFFER_DIGEST:
    return "offer_digest";
  case GN_MSG_OFFER_WANT:
    return "offer_want";
  case GN_MSG_SWIM_PING:
    return "swim_ping";
  case GN_MSG_SWIM_ACK:
    return "swim_ack";
  case GN_MSG_SWIM_PING_REQ:
    return "swim_ping_req";
  case GN_MSG_SWIM_NACK:
    return "swim_nack";
  case GN_MSG_VIEW_JOIN:
    return "view_join";
  case GN_MSG_VIEW_FORWARD_JOIN:
    return "view_forward_join";
  case GN_MSG_VIEW_NEIGHBOR:
    return "view_neighbor";
  case GN_MSG_VIEW_NEIGHBOR_REPLY:
    return "view_neighbor_reply";
  case GN_MSG_VIEW_DISCONNECT:
    return "view_disconnect";
  case GN_MSG_VIEW_SHUFFLE:
    return "view_shuffle";
  case GN_MSG_VIEW_SHUFFLE_REPLY:
    return "view_shuffle_reply";
  case GN_MSG_NAT_OBSERVED:
    return "nat_observed";
  case GN_MSG_NAT_PUNCH_REQ:
    return "nat_punch_req";
  case GN_MSG_NAT_PUNCH:
    return "nat_punch";
  case GN_MSG_RELAY_RESERVE:
    return "relay_reserve";
  case GN_MSG_RELAY_STATUS:
    return "relay_status";
  case GN_MSG_RELAY_CALL:
    return "relay_call";
  case GN_MSG_FWD_OPEN:
    return "fwd_open";
  case GN_MSG_FWD_DATA:
    return "fwd_data";
  case GN_MSG_FWD_CREDIT:
    return "fwd_credit";
  case GN_MSG_FWD_CLOSE:
    return "fwd_close";
  case GN_MSG_WS_PUT:
    return "ws_put";
  case GN_MSG_WS_PUT_ACK:
    return "ws_put_ack";
  case GN_MSG_WS_GET:
    return "ws_get";
  case GN_MSG_WS_DATA:
    return "ws_data";
  case GN_MSG_WS_STAT:
    return "ws_stat";
  case GN_MSG_WS_STAT_REPLY:
    return "ws_stat_reply";
  case GN_MSG_EXEC_OPEN:
    return "exec_open";
  case GN_MSG_EXEC_DATA:
    return "exec_data";
  case GN_MSG_EXEC_WINDOW:
    return "exec_window";
  case GN_MSG_EXEC_SIGNAL:
    return "exec_signal";
  case GN_MSG_EXEC_EXIT:
    return "exec_exit";
  case GN_MSG_EXEC_CLOSE:
    return "exec_close";
  default:
    return NULL;
  }
}

/* --- writing --------------------------------------------------------------*/

/* msgpack-c's packer drops write errors; this callback records them so that
 * a truncated document is never handed out. */
static int writer_write(void *data, const char *buf, size_t len) {
  gn_wire_writer *w = data;
  if (w->failed)
    return -1;
  if (msgpack_sbuffer_write(&w->sbuf, buf, len) != 0) {
    w->failed = true;
    return -1;
  }
  return 0;
}

void gn_wire_writer_init(gn_wire_writer *w) {
  msgpack_sbuffer_init(&w->sbuf);
  msgpack_packer_init(&w->pk, w, writer_write);
  w->failed = false;
}

void gn_wire_writer_done(gn_wire_writer *w) {
  msgpack_sbuffer_destroy(&w->sbuf);
  msgpack_sbuffer_init(&w->sbuf);
  w->failed = false;
}

int gn_wire_writer_take(gn_wire_writer *w, gn_buf *ret) {
  int r = w->failed ? GN_ENOMEM : gn_buf_append(ret, w->sbuf.data, w->sbuf.size);
  msgpack_sbuffer_clear(&w->sbuf);
  w->failed = false;
  return r;
}

void gn_wire_put_map(gn_wire_writer *w, uint32_t n) {
  msgpack_pack_map(&w->pk, n);
}
void gn_wire_put_array(gn_wire_writer *w, uint32_t n) {
  msgpack_pack_array(&w->pk, n);
}

void gn_wire_put_str(gn_wire_writer *w, const char *s) {
  size_t n = strlen(s);
  if (n > UINT32_MAX) {
    w->failed = true;
    return;
  }
  msgpack_pack_str_with_body(&w->pk, s, n);
}

void gn_wire_put_bin(gn_wire_writer *w, const void *p, size_t n) {
  if (n > UINT32_MAX) {
    w->failed = true;
    return;
  }
  msgpack_pack_bin_with_body(&w->pk, p, n);
}

void gn_wire_put_u64(gn_wire_writer *w, uint64_t v) {
  msgpack_pack_uint64(&w->pk, v);
}
void gn_wire_put_i64(gn_wire_writer *w, int64_t v) {
  msgpack_pack_int64(&w->pk, v);
}
void gn_wire_put_bool(gn_wire_writer *w, bool v) {
  if (v)
    msgpack_pack_true(&w->pk);
  else
    msgpack_pack_false(&w->pk);
}
void gn_wire_put_nil(gn_wire_writer *w) {
  msgpack_pack_nil(&w->pk);
}

/* --- reading --------------------------------------------------------------*/

static uint64_t be_read(const uint8_t *p, size_t n) {
  uint64_t v = 0;
  for (size_t i = 0; i < n; i++)
    v = (v << 8) | p[i];
  return v;
}

/* Walks the encoding without allocating, with an explicit stack of
 * "elements still expected" per open container, so no input can recurse or
 * make the later unpack allocate more than the bytes justify. */
static int wire_prescan(const uint8_t *buf, size_t len) {
  uint64_t need[GN_WIRE_MAX_DEPTH + 1];
  size_t depth = 1, pos = 0, objects = 0;

  if (len > GN_MSG_MAX)
    return GN_ETOOBIG;
  need[0] = 1;
  while (depth > 0) {
    if (need[depth - 1] == 0) {
      depth--;
      continue;
    }
    need[depth - 1]--;
    if (pos >= len)
      return GN_EINVAL;
    if (++objects > WIRE_MAX_OBJECTS)
      return GN_ETOOBIG;
    uint8_t b = buf[pos++];
    size_t hdr = 0;     /* length-field bytes after the type byte */
    size_t fixed = 0;   /* payload bytes of a scalar */
    uint64_t items = 0; /* elements of a container */
    bool container = false, is_map = false;

    if (b <= 0x7f || b >= 0xe0 || b == 0xc0 || b == 0xc2 || b == 0xc3) {
      /* fixint, nil, bool: the type byte is the whole value */
    } else if (b >= 0x80 && b <= 0x8f) {
      container = is_map = true;
      items = b & 0x0f;
    } else if (b >= 0x90 && b <= 0x9f) {
      container = true;
      items = b & 0x0f;
    } else if (b >= 0xa0 && b <= 0xbf) {
      fixed = b & 0x1f;
    } else {
      switch (b) {
      case 0xc4:
      case 0xd9:
        hdr = 1;
        break; /* bin8, str8 */
      case 0xc5:
      case 0xda:
        hdr = 2;
        break; /* bin16, str16 */
      case 0xc6:
      case 0xdb:
        hdr = 4;
        break; /* bin32, str32 */
      case 0xca:
        fixed = 4;
        break; /* float32 */
      case 0xcb:
        fixed = 8;
        break; /* float64 */
      case 0xcc:
      case 0xd0:
        fixed = 1;
        break;
      case 0xcd:
      case 0xd1:
        fixed = 2;
        break;
      case 0xce:
      case 0xd2:
        fixed = 4;
        break;
      case 0xcf:
      case 0xd3:
        fixed = 8;
        break;
      case 0xdc:
        hdr = 2;
        container = true;
        break; /* array16 */
      case 0xdd:
        hdr = 4;
        container = true;
        break; /* array32 */
      case 0xde:
        hdr = 2;
        container = is_map = true;
        break; /* map16 */
      case 0xdf:
        hdr = 4;
        container = is_map = true;
        break; /* map32 */
      default:
        /* 0xc1 (never used) and every ext type: nothing here speaks them. */
        return GN_EINVAL;
      }
    }
    if (hdr) {
      if (len - pos < hdr)
        return GN_EINVAL;
      uint64_t v = be_read(buf + pos, hdr);
      pos += hdr;
      if (container)
        items = v;
      else
        fixed = (size_t)v;
    }
    if (container) {
      if (items > GN_WIRE_MAX_ITEMS)
        return GN_ETOOBIG;
      if (is_map)
        items *= 2;
      /* Every element takes at least one byte. */
      if (items > len - pos)
        return GN_EINVAL;
      if (depth > GN_WIRE_MAX_DEPTH)
        return GN_ETOOBIG;
      need[depth++] = items;
    } else {
      if (fixed > len - pos)
        return GN_EINVAL;
      pos += fixed;
    }
  }
  return pos == len ? 0 : GN_EINVAL;
}

int gn_wire_decode(const uint8_t *buf, size_t len, gn_wire_doc *ret_doc) {
  if (!buf && len)
    return GN_EINVAL;
  int r = wire_prescan(buf, len);
  if (r < 0)
    return r;
  gn_wire_doc doc;
  size_t off = 0;
  msgpack_unpacked_init(&doc.u);
  msgpack_unpack_return ur = msgpack_unpack_next(&doc.u, (const char *)buf, len, &off);
  if (ur != MSGPACK_UNPACK_SUCCESS || off != len) {
    msgpack_unpacked_destroy(&doc.u);
    return ur == MSGPACK_UNPACK_NOMEM_ERROR ? GN_ENOMEM : GN_EINVAL;
  }
  /* The root lives in the zone rather than in the struct, so a caller may
   * copy the gn_wire_doc by value. */
  /* A bare scalar is unpacked without a zone; give it one to hold the root
   * (msgpack_unpacked_destroy frees it like any other). */
  if (!doc.u.zone && !(doc.u.zone = msgpack_zone_new(sizeof(msgpack_object) * 2))) {
    msgpack_unpacked_destroy(&doc.u);
    return GN_ENOMEM;
  }
  msgpack_object *root = msgpack_zone_malloc(doc.u.zone, sizeof(*root));
  if (!root) {
    msgpack_unpacked_destroy(&doc.u);
    return GN_ENOMEM;
  }
  *root = doc.u.data;
  doc.root = root;
  *ret_doc = doc;
  return 0;
}

void gn_wire_doc_done(gn_wire_doc *doc) {
  if (!doc)
    return;
  msgpack_unpacked_destroy(&doc->u);
  doc->root = NULL;
}

static bool key_is(const msgpack_object *k, const char *key, size_t klen) {
  /* An empty string has a NULL ptr in msgpack-c: never hand that to memcmp. */
  return k->type == MSGPACK_OBJECT_STR && k->via.str.size == klen &&
         (klen == 0 || memcmp(k->via.str.ptr, key, klen) == 0);
}

const msgpack_object *gn_wire_get(const msgpack_object *map, const char *key) {
  if (!map || map->type != MSGPACK_OBJECT_MAP)
    return NULL;
  size_t klen = strlen(key);
  const msgpack_object *found = NULL;
  for (uint32_t i = 0; i < map->via.map.size; i++) {
    const msgpack_object_kv *kv = &map->via.map.ptr[i];
    if (!key_is(&kv->key, key, klen))
      continue;
    /* A duplicated key is ambiguous (two readers could disagree on what a
     * signer meant), so it reads as missing. */
    if (found)
      return NULL;
    found = &kv->val;
  }
  return found;
}

int gn_wire_get_u64(const msgpack_object *map, const char *key, uint64_t *ret) {
  const msgpack_object *o = gn_wire_get(map, key);
  if (!o || o->type != MSGPACK_OBJECT_POSITIVE_INTEGER)
    return GN_EINVAL;
  *ret = o->via.u64;
  return 0;
}

int gn_wire_get_u32(const msgpack_object *map, const char *key, uint32_t *ret) {
  uint64_t v;
  int r = gn_wire_get_u64(map, key, &v);
  if (r < 0)
    return r;
  if (v > UINT32_MAX)
    return GN_ETOOBIG;
  *ret = (uint32_t)v;
  return 0;
}

int gn_wire_get_i64(const msgpack_object *map, const char *key, int64_t *ret) {
  const msgpack_object *o = gn_wire_get(map, key);
  if (!o)
    return GN_EINVAL;
  if (o->type == MSGPACK_OBJECT_POSITIVE_INTEGER) {
    if (o->via.u64 > INT64_MAX)
      return GN_ETOOBIG;
    *ret = (int64_t)o->via.u64;
    return 0;
  }
  if (o->type == MSGPACK_OBJECT_NEGATIVE_INTEGER) {
    *ret = o->via.i64;
    return 0;
  }
  return GN_EINVAL;
}

int gn_wire_get_bool(const msgpack_object *map, const char *key, bool *ret) {
  const msgpack_object *o = gn_wire_get(map, key);
  if (!o || o->type != MSGPACK_OBJECT_BOOLEAN)
    return GN_EINVAL;
  *ret = o->via.boolean;
  return 0;
}

int gn_wire_get_str(const msgpack_object *map, const char *key, char *buf, size_t cap) {
  const msgpack_object *o = gn_wire_get(map, key);
  if (!o || o->type != MSGPACK_OBJECT_STR || cap == 0)
    return GN_EINVAL;
  size_t n = o->via.str.size;
  if (n > cap - 1)
    return GN_ETOOBIG;
  if (n && memchr(o->via.str.ptr, '\0', n))
    return GN_EINVAL;
  if (n)
    memcpy(buf, o->via.str.ptr, n);
  buf[n] = '\0';
  return 0;
}

int gn_wire_get_bin_exact(const msgpack_object *map, const char *key, uint8_t *out, size_t len) {
  const msgpack_object *o = gn_wire_get(map, key);
  if (!o || o->type != MSGPACK_OBJECT_BIN || o->via.bin.size != len)
    return GN_EINVAL;
  if (len)
    memcpy(out, o->via.bin.ptr, len);
  return 0;
}

int gn_wire_get_bin_ref(const msgpack_object *map, const char *key, size_t max, const uint8_t **ret_p,
                        size_t *ret_len) {
  const msgpack_object *o = gn_wire_get(map, key);
  if (!o || o->type != MSGPACK_OBJECT_BIN)
    return GN_EINVAL;
  if (o->via.bin.size > max)
    return GN_ETOOBIG;
  *ret_p = (const uint8_t *)o->via.bin.ptr;
  *ret_len = o->via.bin.size;
  return 0;
}

int gn_wire_get_array(const msgpack_object *map, const char *key, size_t max, const msgpack_object_array **ret) {
  const msgpack_object *o = gn_wire_get(map, key);
  if (!o || o->type != MSGPACK_OBJECT_ARRAY)
    return GN_EINVAL;
  if (o->via.array.size > max)
    return GN_ETOOBIG;
  *ret = &o->via.array;
  return 0;
}
