/* Internal interface of the settlement files (settle.c, settle_ledger.c,
 * settle_webhook.c): what the drivers need of the outbox's connection. */
#ifndef GPUNET_SETTLE_INT_H
#define GPUNET_SETTLE_INT_H

#include <gpunet/settle.h>

/* The connection gn_settle_open was given. */
sqlite3 *gn__settle_db(gn_settle *s);
/* Current UTC in milliseconds (for records only; the outbox takes its times
 * from the caller). */
int64_t gn__settle_now_ms(void);
/* Copies src into dst (cap bytes with the NUL), replacing bytes that are not
 * printable ASCII with '?', so a reason from a server is safe to show. */
void gn__settle_printable(char *dst, size_t cap, const char *src, size_t len);

#endif
