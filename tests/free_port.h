/* A free TCP port on 127.0.0.1 for a process the test starts (a daemon, a
 * registry), chosen as scripts/lib/nodes.sh's gn_free_port does: at random
 * below the kernel's ephemeral range, and checked by a bind. A port the
 * kernel handed out for port 0 and the test let go is ephemeral: any
 * process's outgoing connection may take it as its source port before the
 * daemon binds it (the CI saw "cannot listen on 127.0.0.1:40943: Address
 * already in use" with unit tests running side by side). */
#ifndef GPUNET_TESTS_FREE_PORT_H
#define GPUNET_TESTS_FREE_PORT_H

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <unistd.h>

/* Returns the port, or -1 when none was found in 200 tries. */
static inline int gn_test_free_port(void) {
  int lo = 32768, base = 10000, span;
  FILE *f = fopen("/proc/sys/net/ipv4/ip_local_port_range", "r");
  if (f) {
    if (fscanf(f, "%d", &lo) != 1)
      lo = 32768;
    fclose(f);
  }
  span = lo - base;
  if (span < 2000) { /* an unusual range: the shell helper's old choice */
    base = 20000;
    span = 30000;
  }
  for (int i = 0; i < 200; i++) {
    unsigned r = 0;
    if (getrandom(&r, sizeof r, 0) != (ssize_t)sizeof r)
      r = (unsigned)getpid() * 2654435761u + (unsigned)i * 40503u;
    int port = base + (int)(r % (unsigned)span);
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
      return -1;
    struct sockaddr_in a = {
        .sin_family = AF_INET, .sin_port = htons((uint16_t)port), .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    int ok = bind(fd, (struct sockaddr *)&a, sizeof a) == 0;
    close(fd);
    if (ok)
      return port;
  }
  return -1;
}

#endif
