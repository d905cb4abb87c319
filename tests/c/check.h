/* check.h -- the tiny harness the C unit tests share.
 *
 * CHECK(cond) counts a pass or reports a failure with the process id (some
 * checks run in forked children), errno and clamor's detail for the calling
 * thread; CHECK_SUMMARY(name) prints "N passed, M failed" and gives main's
 * exit status.
 */
#ifndef CLAMOR_TEST_CHECK_H
#define CLAMOR_TEST_CHECK_H

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <unistd.h>

#include "clamor.h"

static int passed, failed;

#define CHECK(cond)                                                                              \
    do {                                                                                         \
        if (cond) {                                                                              \
            passed++;                                                                            \
        } else {                                                                                 \
            failed++;                                                                            \
            fprintf(stderr, "[%d] %s:%d: CHECK(%s) failed (errno %d, detail '%s')\n", (int)getpid(), \
                    __FILE__, __LINE__, #cond, errno, clamor_last_error());                      \
        }                                                                                        \
    } while (0)

/* Lines of /proc/self/maps that overlap [base, base+size). */
static inline int kernel_mappings(uintptr_t base, size_t size) {
    FILE *f = fopen("/proc/self/maps", "r");
    if (!f) return -1;
    char line[512];
    int n = 0;
    while (fgets(line, sizeof line, f)) {
        unsigned long s, e;
        if (sscanf(line, "%lx-%lx", &s, &e) == 2 && s < base + size && e > base) n++;
    }
    fclose(f);
    return n;
}

#define CHECK_SUMMARY(name) (printf("%s: %d passed, %d failed\n", (name), passed, failed), failed != 0)

#endif /* CLAMOR_TEST_CHECK_H */
