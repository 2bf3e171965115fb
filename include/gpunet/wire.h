/* The peer-to-peer wire format: bounded msgpack reading and writing, and the
 * signed envelope every peer-to-peer message travels in. */
#ifndef GPUNET_WIRE_H
#define GPUNET_WIRE_H

#include <gpunet/base.h>
#include <gpunet/identity.h>
#include <msgpack.h>
#include <stdbool.h>

#define GN_PROTO_VERSION 1
#define GN_MSG_MAX (8u * 1024u * 1024u) /* one envelope, encoded */
#define GN_WIRE_MAX_DEPTH 16
#define GN_WIRE_MAX_ITEMS 200000 /* elements of one array or map */

/* Message types. Every message between peers is one envelope of these. */
enum gn_msg_type {
  GN_MSG_PEERS = 1,          /* known peers: [{id, addr}] */
  GN_MSG_OFFER = 2,          /* a provider's signed offer */
  GN_MSG_OFFER_WITHDRAW = 3, /* the provider leaves or withdraws */
  GN_MSG_OFFER_DIGEST = 4,   /* anti-entropy: what offers the sender holds (docs/overlay.md §3) */
  GN_MSG_OFFER_WANT = 5,     /* anti-entropy: the offers the sender lacks */
  GN_MSG_LEASE_REQUEST = 10, /* requester -> provider, signed by requester */
  GN_MSG_LEASE_ACCEPT = 11,  /* provider -> requester: the agreement */
  GN_MSG_LEASE_REJECT = 12,
  GN_MSG_LEASE_RELEASE = 13,  /* requester ends the lease early */
  GN_MSG_LEASE_END = 14,      /* provider says the lease ended */
  GN_MSG_JOB_MANIFEST = 20,   /* requester -> provider */
  GN_MSG_JOB_STATUS = 21,     /* provider -> requester: accepted/rejected/running/exited */
  GN_MSG_JOB_LOG = 22,        /* provider -> requester: a chunk of output */
  GN_MSG_JOB_STOP = 23,       /* requester -> provider */
  GN_MSG_JOB_OUTPUT_GET = 24, /* requester -> provider: a chunk of a job's /output (tar) */
  GN_MSG_JOB_OUTPUT = 25,     /* provider -> requester: that chunk */
  GN_MSG_JOB_SEED_GET = 26,   /* provider -> requester: a chunk of the seed (tar) a manifest names */
  GN_MSG_JOB_SEED = 27,       /* requester -> provider: that chunk */
  GN_MSG_INVOICE = 30,        /* provider -> requester */
  GN_MSG_INVOICE_ACCEPT = 31, /* requester's countersignature */
  GN_MSG_INVOICE_REJECT = 32,
  GN_MSG_DEBIT_NOTE = 33,   /* provider -> requester: cumulative interval bill */
  GN_MSG_DEBIT_ACCEPT = 34, /* requester's countersignature and cumulative voucher */
  GN_MSG_DEBIT_REJECT = 35,
  GN_MSG_ERROR = 40,
  GN_MSG_ATTEST_CHALLENGE = 50, /* reserved for GPU attestation */
  GN_MSG_ATTEST_RESPONSE = 51,
  GN_MSG_ATTEST_OPEN = 52,
  GN_MSG_ATTEST_PROOF = 53,
  GN_MSG_RTT_ASK = 60,    /* requester -> provider: measure your round trip to these peers */
  GN_MSG_RTT_REPORT = 61, /* provider -> requester: the signed measurements */
  GN_MSG_RTT_PING = 62,   /* provider -> provider */
  GN_MSG_RTT_PONG = 63,
  GN_MSG_SWIM_PING = 70, /* membership datagrams over UDP (docs/overlay.md §1) */
  GN_MSG_SWIM_ACK = 71,
  GN_MSG_SWIM_PING_REQ = 72,
  GN_MSG_SWIM_NACK = 73,
  GN_MSG_VIEW_JOIN = 76, /* partial views over sessions (docs/overlay.md §2) */
  GN_MSG_VIEW_FORWARD_JOIN = 77,
  GN_MSG_VIEW_NEIGHBOR = 78,
  GN_MSG_VIEW_NEIGHBOR_REPLY = 79,
  GN_MSG_VIEW_DISCONNECT = 80,
  GN_MSG_VIEW_SHUFFLE = 81,
  GN_MSG_VIEW_SHUFFLE_REPLY = 82,
  GN_MSG_NAT_OBSERVED = 84, /* home networks (docs/nat.md): the address a peer sees us at */
  GN_MSG_NAT_PUNCH_REQ = 85,
  GN_MSG_NAT_PUNCH = 86,
  GN_MSG_RELAY_RESERVE = 87,
  GN_MSG_RELAY_STATUS = 88,
  GN_MSG_RELAY_CALL = 89,
  GN_MSG_EXEC_OPEN = 90,   /* requester -> provider: a process in a lease's sandbox (docs/protocol.md §3.3) */
  GN_MSG_EXEC_DATA = 91,   /* either way: stdin, or the process's output */
  GN_MSG_EXEC_WINDOW = 92, /* either way: credit returned; requester: terminal size */
  GN_MSG_EXEC_SIGNAL = 93, /* requester -> provider: INT, TERM or KILL */
  GN_MSG_EXEC_EXIT = 94,   /* provider -> requester: the process ended, or never started */
  GN_MSG_EXEC_CLOSE = 95,  /* requester -> provider: the renter went away, kill it */
  /* forwarded ports: gpunet forward (docs/protocol.md §3.4) */
  GN_MSG_FWD_OPEN = 96,   /* lease holder -> provider: a stream to a port in the sandbox */
  GN_MSG_FWD_DATA = 97,   /* either way: bytes of one stream */
  GN_MSG_FWD_CREDIT = 98, /* either way: flow-control credit */
  GN_MSG_FWD_CLOSE = 99,  /* either way: half-close or reset */
  /* a lease's workspace: gpunet cp (docs/protocol.md §3.2) */
  GN_MSG_WS_PUT = 100,        /* lease holder -> provider: bytes into the lease's workspace (docs/protocol.md §3.2) */
  GN_MSG_WS_PUT_ACK = 101,    /* provider -> lease holder: written, or refused */
  GN_MSG_WS_GET = 102,        /* lease holder -> provider: bytes of a workspace file */
  GN_MSG_WS_DATA = 103,       /* provider -> lease holder: those bytes, or the refusal */
  GN_MSG_WS_STAT = 104,       /* lease holder -> provider: a workspace file's size (and SHA-256) */
  GN_MSG_WS_STAT_REPLY = 105, /* provider -> lease holder: the answer */
};

/* Returns a short lowercase name ("offer", "lease_request"...), or NULL for a
 * type this version does not know. */
const char *gn_msg_type_name(uint32_t type);

/* --- writing --------------------------------------------------------------*/

typedef struct gn_wire_writer {
  msgpack_sbuffer sbuf;
  msgpack_packer pk;
  bool failed; /* an allocation failed: take reports GN_ENOMEM */
} gn_wire_writer;

void gn_wire_writer_init(gn_wire_writer *w);
void gn_wire_writer_done(gn_wire_writer *w);
/* Hands the encoded bytes to ret (appended) and resets the writer. */
int gn_wire_writer_take(gn_wire_writer *w, gn_buf *ret);
void gn_wire_put_map(gn_wire_writer *w, uint32_t n);
void gn_wire_put_array(gn_wire_writer *w, uint32_t n);
void gn_wire_put_str(gn_wire_writer *w, const char *s);
void gn_wire_put_bin(gn_wire_writer *w, const void *p, size_t n);
void gn_wire_put_u64(gn_wire_writer *w, uint64_t v);
void gn_wire_put_i64(gn_wire_writer *w, int64_t v);
void gn_wire_put_bool(gn_wire_writer *w, bool v);
void gn_wire_put_nil(gn_wire_writer *w);

/* --- reading --------------------------------------------------------------*/

/* A decoded document. The input bytes are scanned first so that no container
 * claims more elements than bytes remain, and no nesting exceeds
 * GN_WIRE_MAX_DEPTH; only then is msgpack-c asked to unpack. Trailing bytes are
 * an error. */
typedef struct gn_wire_doc {
  msgpack_unpacked u;
  const msgpack_object *root;
} gn_wire_doc;

/* Strings and binaries in the document point into buf, which must outlive
 * the document. GN_ETOOBIG over a limit, GN_EINVAL when malformed. */
int gn_wire_decode(const uint8_t *buf, size_t len, gn_wire_doc *ret_doc);
void gn_wire_doc_done(gn_wire_doc *doc);

/* Accessors on a map object. All return GN_EINVAL if the key is missing or
 * has the wrong type, GN_ETOOBIG if over max. */
const msgpack_object *gn_wire_get(const msgpack_object *map, const char *key);
int gn_wire_get_u64(const msgpack_object *map, const char *key, uint64_t *ret);
int gn_wire_get_i64(const msgpack_object *map, const char *key, int64_t *ret);
/* An unsigned integer that fits in 32 bits (GN_ETOOBIG otherwise). */
int gn_wire_get_u32(const msgpack_object *map, const char *key, uint32_t *ret);
int gn_wire_get_bool(const msgpack_object *map, const char *key, bool *ret);
/* Copies a string into buf (NUL-terminated); it must fit in cap-1 bytes and
 * contain no NUL. */
int gn_wire_get_str(const msgpack_object *map, const char *key, char *buf, size_t cap);
/* Binary of exactly len bytes, copied. */
int gn_wire_get_bin_exact(const msgpack_object *map, const char *key, uint8_t *out, size_t len);
/* Binary of at most max bytes, by reference into the document. */
int gn_wire_get_bin_ref(const msgpack_object *map, const char *key, size_t max, const uint8_t **ret_p, size_t *ret_len);
/* Array of at most max elements. */
int gn_wire_get_array(const msgpack_object *map, const char *key, size_t max, const msgpack_object_array **ret);

/* --- envelopes ------------------------------------------------------------*/

/* Encoded as the msgpack array [version, type, signer(bin 32), body(bin),
 * sig(bin 64)]. The signature covers GN_ENVELOPE_PREFIX (with its NUL), the
 * type as 4 bytes big-endian, then the body bytes exactly as carried. */
#define GN_ENVELOPE_PREFIX "gpunet-envelope-v1"

typedef struct gn_envelope {
  uint32_t version;
  uint32_t type;
  uint8_t signer[GN_PK_LEN];
  const uint8_t *body; /* points into the buffer given to gn_envelope_open */
  size_t body_len;
  uint8_t sig[GN_SIG_LEN];
} gn_envelope;

/* Signs body as type and appends the encoded envelope to ret. */
int gn_envelope_seal(const gn_identity *id, uint32_t type, const uint8_t *body, size_t body_len, gn_buf *ret);
/* Parses and verifies an envelope. GN_EVERSION for another version,
 * GN_ESIG for a bad signature, GN_EINVAL/GN_ETOOBIG for malformed input.
 * ret->body points into buf. Never re-encodes. */
int gn_envelope_open(const uint8_t *buf, size_t len, gn_envelope *ret);

/* Session-bound types: the bulk bytes of a stream between two nodes
 * (EXEC_DATA, FWD_DATA, WS_PUT, WS_DATA; docs/protocol.md §1.5). Sent
 * straight over the Noise session, which is keyed to their author, they may
 * go unsigned: gn_envelope_seal_bound writes 64 zero bytes where the
 * signature goes (GN_EINVAL for any other type). Such an envelope is
 * accepted only by gn_envelope_open_from, from the session whose peer is
 * its signer; gn_envelope_open, and every envelope kept, embedded or
 * relayed, refuses it as a bad signature. */
bool gn_msg_type_session_bound(uint32_t type);
int gn_envelope_seal_bound(const gn_identity *id, uint32_t type, const uint8_t *body, size_t body_len, gn_buf *ret);
/* What a node sends straight over a session: sealed unsigned when type is
 * session-bound, signed otherwise. */
int gn_envelope_seal_for_session(const gn_identity *id, uint32_t type, const uint8_t *body, size_t body_len,
                                 gn_buf *ret);
/* gn_envelope_open for an envelope that came straight over a session with
 * peer: an unsigned one of a session-bound type signed in peer's name is
 * accepted unverified; anything else is verified as gn_envelope_open does. */
int gn_envelope_open_from(const uint8_t *buf, size_t len, const uint8_t peer[GN_PK_LEN], gn_envelope *ret);

#endif
