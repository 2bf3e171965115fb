/* What main.c needs of the daemon (daemon.c). */
#ifndef GPUNET_NODE_DAEMON_H
#define GPUNET_NODE_DAEMON_H

/* gpunetd: runs until a signal; the process's exit code. */
int gn__node_main(int argc, char **argv);

#endif
