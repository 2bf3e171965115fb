/* gpunetd: the gpunet daemon; everything it does starts in daemon.c. */
int gn__node_main(int argc, char **argv);

int main(int argc, char **argv) {
  return gn__node_main(argc, argv);
}
