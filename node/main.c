/* gpunetd: the gpunet daemon. */
#include <stdio.h>
int main(void) {
  fputs("gpunetd: not built yet\n", stderr);
  return 1;
}
