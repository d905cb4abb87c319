/* futex.c -- wait on a 32-bit word, wake its waiters: futex(2), bare.
 *
 * The page-state words (pagetable.c) and the driver's version gate
 * (version.c) are waited on this way.  Both calls are plain system calls,
 * so the fault handler may use them (async-signal-safe), and they need no
 * lock: the word is the whole state.
 */
#define _GNU_SOURCE
#include <linux/futex.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "internal.h"

int cl_futex_wait(_Atomic uint32_t *w, uint32_t val, int timeout_ms) {
    struct timespec ts, *tp = NULL;
    if (timeout_ms >= 0) {
        ts.tv_sec = timeout_ms / 1000;
        ts.tv_nsec = (long)(timeout_ms % 1000) * 1000000L;
        tp = &ts;
    }
    long r = syscall(SYS_futex, (uint32_t *)w, FUTEX_WAIT_PRIVATE, val, tp, NULL, 0);
    return r == 0 ? 0 : errno;
}

void cl_futex_wake(_Atomic uint32_t *w) {
    syscall(SYS_futex, (uint32_t *)w, FUTEX_WAKE_PRIVATE, INT32_MAX, NULL, NULL, 0);
}
