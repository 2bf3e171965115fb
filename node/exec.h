/* `gpunet exec` and `gpunet shell`: a process in a lease's sandbox, its
 * stdio (or a terminal) carried over the lease's session. exec_prov.c is the
 * provider's side (runc exec on a PTY or pipes), exec_req.c the requester's
 * (a Unix socket for the CLI, gpunetd-exec.sock, relayed to the provider).
 * Wire format in docs/protocol.md §3.3. */
#ifndef GPUNET_NODE_EXEC_H
#define GPUNET_NODE_EXEC_H

#include "execmsg.h"
#include "node_internal.h"

/* Provider: EXEC_OPEN, EXEC_DATA, EXEC_WINDOW, EXEC_SIGNAL, EXEC_CLOSE from
 * peer (the envelope's signer, checked by the caller). */
void gn__exec_prov_on_message(gn_node *n, const uint8_t peer[GN_PK_LEN], const gn_envelope *env);
/* Requester: EXEC_DATA, EXEC_WINDOW, EXEC_EXIT from peer. */
void gn__exec_req_on_message(gn_node *n, const uint8_t peer[GN_PK_LEN], const gn_envelope *env);
/* Both: the session to peer is gone; its streams end. */
void gn__exec_peer_down(gn_node *n, const uint8_t peer[GN_PK_LEN]);
/* Both: timeouts, and streams whose lease ended or whose job stopped. */
void gn__exec_tick(gn_node *n, uint64_t now_ms);
/* Requester: listens on DATA_DIR/gpunetd-exec.sock (0600). 0 or -errno. */
int gn__exec_start(gn_node *n);
/* Both: ends every stream and closes the socket (shutdown). */
void gn__exec_close(gn_node *n);

/* Internal to exec_prov.c and exec_req.c. n->exec, made by gn__exec_start. */
struct gn__exec_pstream;
struct gn__exec_client;
struct gn__exec {
  struct gn__exec_pstream *pstreams; /* provider: streams we run */
  uint32_t pstream_count;
  struct gn__exec_waiting *waiting; /* provider: opens waiting for their job's container */
  uint32_t waiting_count;
  uint32_t pid_seq;    /* provider: names the pid files */
  uv_pipe_t *listener; /* requester: gpunetd-exec.sock */
  char sock_path[4200];
  struct gn__exec_client *clients;
  uint32_t client_count;
  uint32_t next_sid;
};

/* Seals body as type and sends it
 * to peer; GN_ECLOSED when its session is down. */
int gn__exec_send(gn_node *n, const uint8_t peer[GN_PK_LEN], uint32_t type, gn_wire_writer *w);
void gn__exec_prov_peer_down(gn_node *n, const uint8_t peer[GN_PK_LEN]);
void gn__exec_req_peer_down(gn_node *n, const uint8_t peer[GN_PK_LEN]);
void gn__exec_prov_tick(gn_node *n, uint64_t now_ms);
void gn__exec_req_tick(gn_node *n, uint64_t now_ms);
void gn__exec_prov_close(gn_node *n);
void gn__exec_req_close(gn_node *n);

#endif
