/* error.c -- per-thread detail of the last failure.
 *
 * C functions return 0 or a positive errno value; the one-line detail of what
 * went wrong goes to a thread-local buffer that Python reads back through
 * clamor_last_error() when it turns the errno into a typed exception.
 * Never used from the fault handler (vsnprintf is not async-signal-safe).
 */
#include <stdarg.h>
#include <stdio.h>

#include "internal.h"

static __thread char cl_errbuf[512];

int cl_err(int err, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cl_errbuf, sizeof cl_errbuf, fmt, ap);
    va_end(ap);
    return err;
}

const char *clamor_last_error(void) { return cl_errbuf; }
