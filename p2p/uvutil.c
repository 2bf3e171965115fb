/* The project-wide way to free libuv handles: only in their close callback,
 * with an optional notification once the memory is gone. */
#include <gpunet/uvutil.h>

#include <stdalign.h>
#include <stdlib.h>

/* Kept in front of every handle so that closing needs no allocation (and so
 * cannot fail). */
typedef struct closer {
  void (*done)(void *arg);
  void *arg;
} closer;

#define HDR_SIZE ((sizeof(closer) + alignof(max_align_t) - 1) / alignof(max_align_t) * alignof(max_align_t))

static closer *closer_of(uv_handle_t *h) {
  return (closer *)(void *)((char *)h - HDR_SIZE);
}

void *gn_uv_handle_alloc(size_t size) {
  char *p = calloc(1, HDR_SIZE + size);
  return p ? p + HDR_SIZE : NULL;
}

void gn_uv_handle_free_unused(void *h) {
  if (h)
    free(closer_of(h));
}

static void on_close(uv_handle_t *h) {
  closer c = *closer_of(h);
  free(closer_of(h));
  if (c.done)
    c.done(c.arg);
}

void gn_uv_close_free(uv_handle_t *h, void (*done)(void *arg), void *arg) {
  if (!h || uv_is_closing(h))
    return;
  closer *c = closer_of(h);
  c->done = done;
  c->arg = arg;
  uv_close(h, on_close);
}
