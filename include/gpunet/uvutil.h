/* libuv helpers shared by the whole project: a handle is freed only in its
 * close callback, and this is the one place that does it. */
#ifndef GPUNET_UVUTIL_H
#define GPUNET_UVUTIL_H

#include <stddef.h>
#include <uv.h>

/* Allocates a zeroed handle of size bytes (sizeof(uv_tcp_t), sizeof(uv_timer_t)...)
 * that gn_uv_close_free can later free. NULL when out of memory. */
void *gn_uv_handle_alloc(size_t size);

/* Frees a handle from gn_uv_handle_alloc whose init failed (so libuv never
 * knew it). NULL is fine. */
void gn_uv_handle_free_unused(void *h);

/* Closes h (from gn_uv_handle_alloc); its close callback frees it and then
 * calls done(arg) when done is not NULL. h->data is not used after this call.
 * A handle that is already closing is left alone (done is not called). */
void gn_uv_close_free(uv_handle_t *h, void (*done)(void *arg), void *arg);

#endif
