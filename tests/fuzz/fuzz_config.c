/* libFuzzer target for the config file parser: any file content must load or
 * be rejected with a message, never crash or leak, and a rejected file must
 * leave the configuration as it was. */
#include <gpunet/node.h>

#include <stdio.h>
#include <sys/mman.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  /* The parser reads a path; an anonymous memory file gives it one. */
  int fd = memfd_create("gpunet.conf", MFD_CLOEXEC);
  if (fd < 0)
    return 0;
  if (size && write(fd, data, size) != (ssize_t)size) {
    close(fd);
    return 0;
  }
  char path[64];
  snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
  gn_config cfg;
  gn_config_defaults(&cfg);
  gn_config before = cfg;
  char err[512];
  err[0] = '\0';
  int r = gn_config_load_file(&cfg, path, false, err, sizeof(err));
  if (r < 0) {
    if (!err[0] || memcmp(&before, &cfg, sizeof(cfg)) != 0)
      __builtin_trap(); /* an error must say why and change nothing */
  } else {
    if (cfg.bootstrap_count > GN_CONFIG_MAX_BOOTSTRAP || cfg.simulate_count > GN_CONFIG_MAX_SIMULATE)
      __builtin_trap();
    for (size_t i = 0; i < cfg.bootstrap_count; i++)
      if (!cfg.bootstrap[i] || !cfg.bootstrap[i][0])
        __builtin_trap();
  }
  gn_config_done(&cfg);
  close(fd);
  return 0;
}
