/* gpunet: the user's command. */
#include <stdio.h>
int main(void) {
  fputs("gpunet: not built yet\n", stderr);
  return 1;
}
