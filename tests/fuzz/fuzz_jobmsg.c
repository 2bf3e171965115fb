/* libFuzzer target: the daemon's job manifest (with its training section and seed)
 * and lease/job notice decoders on arbitrary bytes. The first byte picks the
 * message type. */
#include "node_internal.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1)
    return 0;
  static const uint32_t types[] = {GN_MSG_JOB_MANIFEST, GN_MSG_JOB_STATUS,     GN_MSG_JOB_LOG,    GN_MSG_JOB_STOP,
                                   GN_MSG_LEASE_REJECT, GN_MSG_LEASE_RELEASE,  GN_MSG_LEASE_END,  GN_MSG_ERROR,
                                   GN_MSG_OFFER,        GN_MSG_JOB_OUTPUT_GET, GN_MSG_JOB_OUTPUT, GN_MSG_JOB_SEED_GET,
                                   GN_MSG_JOB_SEED};
  uint32_t type = types[data[0] % GN_ARRAY_SIZE(types)];
  data++;
  size--;
  if (type == GN_MSG_JOB_MANIFEST) {
    gn_jobman m;
    if (gn__jobman_decode(data, size, &m) == 0) {
      if (m.argc < 1 || m.argc > GN_JOB_MAX_ARGS || m.argv[m.argc] != NULL)
        __builtin_trap();
      /* The training section is bounded and consistent whenever present. */
      const gn_jobman_net *t = &m.net;
      if (m.has_net && (t->npeers > GN_JOBMAN_MAX_PEERS || t->world == 0 || t->world > GN_JOBMAN_MAX_PEERS + 1 ||
                        t->rank >= t->world || t->local_rank >= t->local_world || t->local_world > t->world ||
                        t->listen_port == 0 || t->master_port == 0 || t->subnet_host > 255 || !gn_id_valid(t->group) ||
                        memchr(t->group, 0, sizeof t->group) == NULL))
        __builtin_trap();
      for (uint32_t i = 0; m.has_net && i < t->npeers; i++)
        if (t->peers[i].rank >= t->world || t->peers[i].rank == t->rank ||
            memchr(t->peers[i].endpoint, 0, sizeof t->peers[i].endpoint) == NULL)
          __builtin_trap();
      /* A seed only with output, bounded. */
      if (m.has_seed && (!m.output || m.seed_size == 0 || m.seed_size > GN_JOB_SEED_MAX))
        __builtin_trap();
      /* What decodes encodes and decodes to the same. */
      gn_wire_writer w;
      gn_buf b = {0};
      gn_jobman m2;
      gn_wire_writer_init(&w);
      if (gn__jobman_encode(&m, &w) != 0 || gn_wire_writer_take(&w, &b) != 0 ||
          gn__jobman_decode(b.data, b.len, &m2) != 0)
        __builtin_trap();
      if (m2.has_net != m.has_net || m2.output != m.output || m2.argc != m.argc || m2.has_seed != m.has_seed ||
          m2.seed_size != m.seed_size || memcmp(m2.seed_sha256, m.seed_sha256, sizeof m.seed_sha256) != 0 ||
          (m.has_net && (m2.net.npeers != t->npeers || m2.net.rank != t->rank ||
                         memcmp(m2.net.private_key, t->private_key, sizeof t->private_key) != 0)))
        __builtin_trap();
      gn__jobman_done(&m2);
      gn_wire_writer_done(&w);
      gn_buf_done(&b);
      gn__jobman_done(&m);
    }
    return 0;
  }
  gn_jobmsg m;
  if (gn__jobmsg_decode(type, data, size, &m) == 0) {
    if (m.data_len > GN_JOB_LOG_CHUNK || (m.data_len && (m.data < data || m.data + m.data_len > data + size)))
      __builtin_trap();
    gn__jobmsg_done(&m);
  }
  return 0;
}
