/* Signed envelopes: every peer-to-peer message is a body signed by its
 * author, verified over the exact bytes carried (never re-encoded); the
 * bulk bytes of a stream (session-bound types) may instead go unsigned over
 * their author's own session, and are accepted only from it. */
#include <gpunet/wire.h>

#include <sodium.h>

#define ENV_FIELDS 5
#define ENV_PREFIX_LEN (sizeof(GN_ENVELOPE_PREFIX)) /* with its NUL */
/* An envelope's fixed overhead is below this; the body may use the rest. */
#define ENV_OVERHEAD 128

/* Builds prefix || type (big-endian) || body: the bytes that are signed. */
static int signed_bytes(uint32_t type, const uint8_t *body, size_t body_len, uint8_t **ret_p, size_t *ret_len) {
  size_t n = ENV_PREFIX_LEN + 4 + body_len;
  uint8_t *p = malloc(n);
  if (!p)
    return GN_ENOMEM;
  memcpy(p, GN_ENVELOPE_PREFIX, ENV_PREFIX_LEN);
  p[ENV_PREFIX_LEN + 0] = (uint8_t)(type >> 24);
  p[ENV_PREFIX_LEN + 1] = (uint8_t)(type >> 16);
  p[ENV_PREFIX_LEN + 2] = (uint8_t)(type >> 8);
  p[ENV_PREFIX_LEN + 3] = (uint8_t)type;
  if (body_len)
    memcpy(p + ENV_PREFIX_LEN + 4, body, body_len);
  *ret_p = p;
  *ret_len = n;
  return 0;
}

/* sign false: 64 zero bytes instead of a signature (session-bound types). */
static int seal(const gn_identity *id, uint32_t type, const uint8_t *body, size_t body_len, bool sign, gn_buf *ret) {
  uint8_t sig[GN_SIG_LEN];
  uint8_t *msg = NULL;
  size_t msg_len;
  gn_wire_writer w;
  int r;

  if (!id || !ret || (!body && body_len))
    return GN_EINVAL;
  if (body_len > GN_MSG_MAX - ENV_OVERHEAD)
    return GN_ETOOBIG;
  if (!sign) {
    memset(sig, 0, sizeof sig);
  } else {
    if ((r = signed_bytes(type, body, body_len, &msg, &msg_len)) < 0)
      return r;
    gn_identity_sign(id, msg, msg_len, sig);
    free(msg);
  }

  gn_wire_writer_init(&w);
  gn_wire_put_array(&w, ENV_FIELDS);
  gn_wire_put_u64(&w, GN_PROTO_VERSION);
  gn_wire_put_u64(&w, type);
  gn_wire_put_bin(&w, id->pk, GN_PK_LEN);
  gn_wire_put_bin(&w, body, body_len);
  gn_wire_put_bin(&w, sig, GN_SIG_LEN);
  r = gn_wire_writer_take(&w, ret);
  gn_wire_writer_done(&w);
  return r;
}

int gn_envelope_seal(const gn_identity *id, uint32_t type, const uint8_t *body, size_t body_len, gn_buf *ret) {
  return seal(id, type, body, body_len, true, ret);
}

bool gn_msg_type_session_bound(uint32_t type) {
  return type == GN_MSG_EXEC_DATA || type == GN_MSG_FWD_DATA || type == GN_MSG_WS_PUT || type == GN_MSG_WS_DATA;
}

int gn_envelope_seal_bound(const gn_identity *id, uint32_t type, const uint8_t *body, size_t body_len, gn_buf *ret) {
  if (!gn_msg_type_session_bound(type))
    return GN_EINVAL;
  return seal(id, type, body, body_len, false, ret);
}

int gn_envelope_seal_for_session(const gn_identity *id, uint32_t type, const uint8_t *body, size_t body_len,
                                 gn_buf *ret) {
  return seal(id, type, body, body_len, !gn_msg_type_session_bound(type), ret);
}

/* peer: the other end of the session the bytes came over, or NULL. */
static int open_env(const uint8_t *buf, size_t len, const uint8_t *peer, gn_envelope *ret) {
  gn_wire_doc doc;
  gn_envelope env;
  uint8_t *msg = NULL;
  size_t msg_len;
  int r;

  if (!buf || !ret)
    return GN_EINVAL;
  if ((r = gn_wire_decode(buf, len, &doc)) < 0)
    return r;
  const msgpack_object *root = doc.root;
  /* The version comes first and is checked before anything else, so a later
   * version may change the rest of the layout. */
  if (root->type != MSGPACK_OBJECT_ARRAY || root->via.array.size < 1 ||
      root->via.array.ptr[0].type != MSGPACK_OBJECT_POSITIVE_INTEGER) {
    r = GN_EINVAL;
    goto out;
  }
  const msgpack_object *f = root->via.array.ptr;
  if (f[0].via.u64 != GN_PROTO_VERSION) {
    r = GN_EVERSION;
    goto out;
  }
  if (root->via.array.size != ENV_FIELDS || f[1].type != MSGPACK_OBJECT_POSITIVE_INTEGER || f[1].via.u64 > UINT32_MAX ||
      f[2].type != MSGPACK_OBJECT_BIN || f[2].via.bin.size != GN_PK_LEN || f[3].type != MSGPACK_OBJECT_BIN ||
      f[4].type != MSGPACK_OBJECT_BIN || f[4].via.bin.size != GN_SIG_LEN) {
    r = GN_EINVAL;
    goto out;
  }
  env.version = (uint32_t)f[0].via.u64;
  env.type = (uint32_t)f[1].via.u64;
  memcpy(env.signer, f[2].via.bin.ptr, GN_PK_LEN);
  env.body = (const uint8_t *)f[3].via.bin.ptr;
  env.body_len = f[3].via.bin.size;
  memcpy(env.sig, f[4].via.bin.ptr, GN_SIG_LEN);
  /* msgpack-c references binaries in the input; the contract (body points
   * into buf) depends on it, so check rather than trust. */
  if (env.body_len && (env.body < buf || env.body + env.body_len > buf + len)) {
    r = GN_EINVAL;
    goto out;
  }
  /* An unsigned envelope (64 zero bytes: no Ed25519 signature is) stands
   * only for a session-bound type sent straight over the session by its
   * signer, whom the session authenticated. Anywhere else it fails below
   * as the bad signature it is. */
  static const uint8_t zero[GN_SIG_LEN];
  bool bound = peer && gn_msg_type_session_bound(env.type) && sodium_memcmp(env.sig, zero, GN_SIG_LEN) == 0 &&
               sodium_memcmp(env.signer, peer, GN_PK_LEN) == 0;
  if (!bound) {
    if ((r = signed_bytes(env.type, env.body, env.body_len, &msg, &msg_len)) < 0)
      goto out;
    if ((r = gn_sig_verify(env.signer, msg, msg_len, env.sig)) < 0)
      goto out;
  }
  if (env.body_len == 0)
    env.body = buf; /* never NULL, even for an empty body */
  *ret = env;
  r = 0;
out:
  free(msg);
  gn_wire_doc_done(&doc);
  return r;
}

int gn_envelope_open(const uint8_t *buf, size_t len, gn_envelope *ret) {
  return open_env(buf, len, NULL, ret);
}

int gn_envelope_open_from(const uint8_t *buf, size_t len, const uint8_t peer[GN_PK_LEN], gn_envelope *ret) {
  if (!peer)
    return GN_EINVAL;
  return open_env(buf, len, peer, ret);
}
