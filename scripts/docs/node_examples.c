/* Prints real hex examples of the daemon's job and lease-control messages for
 * docs/protocol.md. Deterministic: keys come from fixed seeds.
 * Build: see scripts/docs/examples. */
#include "../../node/node_internal.h"

#include <sodium.h>
#include <stdio.h>

static gn_identity *fixed_identity(uint8_t fill) {
  uint8_t seed[crypto_sign_SEEDBYTES];
  memset(seed, fill, sizeof(seed));
  gn_identity *id = calloc(1, sizeof(*id));
  id->sk = sodium_malloc(crypto_sign_SECRETKEYBYTES);
  crypto_sign_seed_keypair(id->pk, id->sk, seed);
  return id;
}

static void show(const gn_identity *id, uint32_t type, gn_wire_writer *w) {
  gn_buf body = {0}, env = {0};
  gn_wire_writer_take(w, &body);
  gn_envelope_seal(id, type, body.data, body.len, &env);
  printf("%s envelope (%zu bytes):\n", gn_msg_type_name(type), env.len);
  for (size_t i = 0; i < env.len; i++)
    printf("%02x%s", env.data[i], (i + 1) % 32 == 0 || i + 1 == env.len ? "\n" : "");
  printf("\n");
  gn_buf_done(&body);
  gn_buf_done(&env);
}

static void put_kv_str(gn_wire_writer *w, const char *k, const char *v) {
  gn_wire_put_str(w, k);
  gn_wire_put_str(w, v);
}

int main(void) {
  if (sodium_init() < 0)
    return 1;
  gn_identity *req = fixed_identity(2), *prov = fixed_identity(1);
  gn_wire_writer w;
  gn_wire_writer_init(&w);

  gn_jobman m;
  memset(&m, 0, sizeof m);
  gn__strf(m.job_id, sizeof m.job_id, "j-0a1b2c3d4e5f");
  gn__strf(m.lease_id, sizeof m.lease_id, "l-00112233aabbccdd");
  gn__strf(
      m.image, sizeof m.image,
      "127.0.0.1:5000/demo/busybox:latest@sha256:3937af578adffd6ad35ca267a7bf7df3cecc3a0d5eb87bcf86b546d1d1105d4a");
  char *argv[] = {"sh", "-c", "echo hello", NULL}, *env[] = {"GREETING=hello", NULL};
  m.argc = 3;
  memcpy(m.argv, argv, sizeof argv);
  m.envc = 1;
  memcpy(m.env, env, sizeof env);
  m.memory_mib = 4096;
  m.pids = 512;
  memset(m.nonce, 0x5a, sizeof m.nonce);
  m.issued_s = 1796211582;
  m.expires_s = m.issued_s + 300;
  gn__jobman_encode(&m, &w);
  show(req, GN_MSG_JOB_MANIFEST, &w);

  gn_wire_put_map(&w, 6);
  put_kv_str(&w, "job_id", "j-0a1b2c3d4e5f");
  put_kv_str(&w, "lease_id", "l-00112233aabbccdd");
  put_kv_str(&w, "state", "exited");
  gn_wire_put_str(&w, "exit_code");
  gn_wire_put_i64(&w, 0);
  put_kv_str(&w, "reason", "");
  put_kv_str(&w, "digest", "sha256:3937af578adffd6ad35ca267a7bf7df3cecc3a0d5eb87bcf86b546d1d1105d4a");
  show(prov, GN_MSG_JOB_STATUS, &w);

  gn_wire_put_map(&w, 4);
  put_kv_str(&w, "job_id", "j-0a1b2c3d4e5f");
  put_kv_str(&w, "lease_id", "l-00112233aabbccdd");
  gn_wire_put_str(&w, "offset");
  gn_wire_put_u64(&w, 0);
  gn_wire_put_str(&w, "data");
  gn_wire_put_bin(&w, "hello\n", 6);
  show(prov, GN_MSG_JOB_LOG, &w);

  gn_wire_put_map(&w, 2);
  put_kv_str(&w, "job_id", "j-0a1b2c3d4e5f");
  put_kv_str(&w, "lease_id", "l-00112233aabbccdd");
  show(req, GN_MSG_JOB_STOP, &w);

  gn_wire_put_map(&w, 2);
  put_kv_str(&w, "lease_id", "l-00112233aabbccdd");
  put_kv_str(&w, "reason", "asked for 2 x NVIDIA GeForce RTX 4090 but 1 of 1 are free");
  show(prov, GN_MSG_LEASE_REJECT, &w);

  gn_wire_put_map(&w, 2);
  put_kv_str(&w, "lease_id", "l-00112233aabbccdd");
  put_kv_str(&w, "reason", "released by the requester");
  show(req, GN_MSG_LEASE_RELEASE, &w);

  gn_wire_put_map(&w, 3);
  put_kv_str(&w, "lease_id", "l-00112233aabbccdd");
  put_kv_str(&w, "reason", "released by the requester");
  gn_wire_put_str(&w, "end_s");
  gn_wire_put_i64(&w, 1796211600);
  show(prov, GN_MSG_LEASE_END, &w);

  gn_wire_put_map(&w, 2);
  put_kv_str(&w, "sid", "a-00112233aabbccdd");
  put_kv_str(&w, "reason", "busy with another attestation; try again shortly");
  show(prov, GN_MSG_ERROR, &w);

  gn_wire_writer_done(&w);
  gn_identity_free(req);
  gn_identity_free(prov);
  return 0;
}
