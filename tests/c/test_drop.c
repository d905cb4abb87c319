/* test_drop.c -- dropping pages on a worker (csrc/pagetable.c), in one process
 * and without network; the test plays the pager, as test_pagetable.c does.
 *
 * A: a page dropped while a fault fetches it again at once.  The drop must
 *    punch the memory out before the page reads ABSENT: a punch after the
 *    pager's pwrite would open the new copy as zeros.
 * B: invalidating a page at a full mapping budget, where the eviction that
 *    makes room takes the page's own run: the mapping count must stay equal
 *    to the kernel's.
 * Exits non-zero if a check fails.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "internal.h"

#include "check.h"

#define BASE ((uintptr_t)0x300000000000ULL)
#define SIZE ((size_t)256 << 20)
#define PS ((size_t)4096)

static void fill_install(uint64_t first, uint64_t count, uint8_t v) {
    for (uint64_t i = first; i < first + count; i++) {
        atomic_store(&cl_region.pages[i], CL_PG_WANTED);
        memset(cl_region.fill + i * PS, v, PS);
    }
    cl_pt_install(first, count);
}

static uint64_t victim;
static volatile int refetched;

static void *pager(void *arg) {
    (void)arg;
    _Atomic uint32_t *w = &cl_region.pages[victim];
    for (;;) { /* a fault on the page as soon as it is ABSENT: the pager re-fetches it */
        uint32_t exp = CL_PG_ABSENT;
        if (atomic_compare_exchange_strong(w, &exp, CL_PG_WANTED)) break;
    }
    char buf[PS];
    memset(buf, 0x5a, PS);
    if (pwrite(cl_region.memfd, buf, PS, (off_t)(victim * PS)) != (ssize_t)PS) perror("pwrite");
    cl_pt_install(victim, 1); /* waits for pt_lock: after the drop's punch */
    refetched = 1;
    return NULL;
}

int main(int argc, char **argv) {
    int rounds = argc > 1 ? atoi(argv[1]) : 20;
    CHECK(clamor_region_attach(BASE, SIZE, PS) == 0);
    if (failed) return CHECK_SUMMARY("test_drop");
    /* ---- A ---- */
    uint64_t n = (128 << 20) / PS;
    int zeros = 0;
    for (int r = 0; r < rounds; r++) {
        fill_install(0, n, 0x11);
        victim = (uint64_t)(r % 7);
        refetched = 0;
        pthread_t th;
        pthread_create(&th, NULL, pager, NULL);
        cl_pt_drop(0, n);
        pthread_join(th, NULL);
        const uint8_t *p = (const uint8_t *)cl_page_addr(victim);
        if (p[0] != 0x5a || p[PS - 1] != 0x5a) zeros++;
        cl_pt_drop(0, n);
    }
    CHECK(zeros == 0);
    /* ---- B ---- */
    cl_pt_drop(0, SIZE / PS);
    clamor_set_max_mappings(0);
    fill_install(0 + 100, 3, 1);
    fill_install(110, 3, 1);
    fill_install(120, 3, 1);
    uint32_t m0 = clamor_mappings();
    int k0 = kernel_mappings(BASE, SIZE);
    clamor_set_max_mappings(m0);
    uint64_t pg = 101;
    int rc = clamor_invalidate(&pg, 1);
    CHECK(rc == 0);
    CHECK((int)clamor_mappings() == kernel_mappings(BASE, SIZE));
    CHECK(kernel_mappings(BASE, SIZE) < k0);
    clamor_region_close();
    return CHECK_SUMMARY("test_drop");
}
