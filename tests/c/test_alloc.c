/* test_alloc.c -- unit tests of the region allocator (csrc/alloc.c).
 *
 * A standalone program: maps a 1 GiB region as the driver and exercises
 * clamor_malloc() and friends without pager, server or network.  Exits
 * non-zero if any check fails.  CLAMOR_TEST_QUICK=1 shrinks the randomised
 * parts (for valgrind).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <setjmp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "internal.h"

#include "check.h"

#define REGION_SIZE ((size_t)1 << 30)
#define KiB ((size_t)1 << 10)
#define MiB ((size_t)1 << 20)

static long scale = 1; // divided by 10 in quick mode

/* ---- helpers -------------------------------------------------------------- */

static uint64_t rng_next(uint64_t *s) { // xorshift64*
    *s ^= *s >> 12;
    *s ^= *s << 25;
    *s ^= *s >> 27;
    return *s * 2685821657736338717ull;
}

static uint64_t pat(uint64_t seed, size_t i) { return (seed + i) * 0x9e3779b97f4a7c15ull; }

static void fill(void *p, size_t n, uint64_t seed) {
    uint64_t *w = p;
    size_t i;
    for (i = 0; i < n / 8; i++) w[i] = pat(seed, i);
    uint64_t last = pat(seed, i);
    memcpy((char *)p + i * 8, &last, n % 8);
}

static int verify(const void *p, size_t n, uint64_t seed) {
    const uint64_t *w = p;
    size_t i;
    for (i = 0; i < n / 8; i++)
        if (w[i] != pat(seed, i)) return 0;
    uint64_t last = pat(seed, i);
    return memcmp((const char *)p + i * 8, &last, n % 8) == 0;
}

static int all_bytes(const void *p, size_t n, int c) {
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++)
        if (b[i] != (unsigned char)c) return 0;
    return 1;
}

static int detail_has(const char *s) { return strstr(clamor_last_error(), s) != NULL; }

static uint64_t off_of(const void *p) { return (uint64_t)((uintptr_t)p - clamor_region_base()); }

static int in_region(const void *p) { return off_of(p) < clamor_region_size(); }

struct blk {
    char *p;
    size_t size;
    uint64_t seed;
};

static int blk_cmp(const void *a, const void *b) {
    const struct blk *x = a, *y = b;
    return x->p < y->p ? -1 : x->p > y->p;
}

// Sort live blocks by address: 1 if no two usable ranges overlap.
static int no_overlap(struct blk *b, size_t n) {
    struct blk *s = malloc(n * sizeof *s);
    size_t m = 0;
    int ok = 1;
    for (size_t i = 0; i < n; i++)
        if (b[i].p) s[m++] = b[i];
    qsort(s, m, sizeof *s, blk_cmp);
    for (size_t i = 0; i + 1 < m; i++)
        if (s[i].p + clamor_usable_size(s[i].p) > s[i + 1].p) ok = 0;
    free(s);
    return ok;
}

/* ---- SIGSEGV trap: turns a stray access into a failed check ------------- */

static sigjmp_buf trap_jmp;
static volatile sig_atomic_t trap_armed;

static void trap_handler(int sig) {
    if (trap_armed) siglongjmp(trap_jmp, 1);
    signal(sig, SIG_DFL);
    raise(sig);
}

/* ---- tests -------------------------------------------------------------- */

static void test_no_region(void) {
    errno = 0;
    CHECK(clamor_malloc(16) == NULL && errno == ENXIO);
    CHECK(detail_has("clamor_region_init"));
    errno = 0;
    CHECK(clamor_calloc(1, 16) == NULL && errno == ENXIO);
    CHECK(clamor_aligned_alloc(64, 16) == NULL && errno == ENXIO);
    CHECK(cl_alloc_range_used(0, 1 << 20) == 0);
    CHECK(clamor_heap_allocated() == 0 && clamor_heap_footprint() == 0);
}

static void test_roles(void) {
    int role = cl_region.role;
    cl_region.role = CLAMOR_ROLE_WORKER;
    errno = 0;
    CHECK(clamor_malloc(16) == NULL && errno == EPERM);
    CHECK(detail_has("only the driver"));
    CHECK(clamor_realloc(NULL, 16) == NULL && errno == EPERM);
    cl_region.role = role;
    void *p = clamor_malloc(16);
    CHECK(p != NULL);
    cl_region.role = CLAMOR_ROLE_WORKER; /* workers never free region memory */
    CHECK(clamor_free_checked(p) == EPERM);
    CHECK(detail_has("only the driver frees"));
    cl_region.role = role;
    CHECK(clamor_usable_size(p) >= 16); /* still live */
    clamor_free(p);
}

static void test_size_classes(void) {
    static char *ps[8193];
    size_t alloc0 = clamor_heap_allocated();
    size_t sum = 0;
    int ok_align = 1, ok_usable = 1, ok_waste = 1;
    for (size_t s = 0; s <= CLAMOR_SMALL_MAX; s++) {
        ps[s] = clamor_malloc(s);
        if (!ps[s]) {
            CHECK(ps[s] != NULL);
            return;
        }
        size_t u = clamor_usable_size(ps[s]);
        sum += u;
        if ((uintptr_t)ps[s] % 16 || u % 16) ok_align = 0;
        if (u < s || u < 16) ok_usable = 0;
        if (s > 128 ? u - s > s / 4 : u - s >= 16 + (s == 0)) ok_waste = 0;
        memset(ps[s], (int)(s & 0xff), s);
    }
    CHECK(ok_align);
    CHECK(ok_usable);
    CHECK(ok_waste);
    CHECK(clamor_heap_allocated() - alloc0 == sum);
    // 32 classes, each size maps to the smallest class >= it
    size_t nclass = 0, prev = 0;
    for (size_t s = 1; s <= CLAMOR_SMALL_MAX; s++) {
        size_t u = clamor_usable_size(ps[s]);
        if (u != prev) nclass++, prev = u;
    }
    CHECK(nclass == 32);
    CHECK(clamor_usable_size(ps[129]) == 160 && clamor_usable_size(ps[8192]) == 8192);
    int ok = 1;
    for (size_t s = 0; s <= CLAMOR_SMALL_MAX; s++)
        if (!all_bytes(ps[s], s, (int)(s & 0xff))) ok = 0;
    CHECK(ok);
    ok = 1;
    for (size_t s = 0; s <= CLAMOR_SMALL_MAX; s++)
        if (clamor_free_checked(ps[s]) != 0) ok = 0;
    CHECK(ok);
    CHECK(clamor_heap_allocated() == alloc0);
}

static void test_slab_layout(void) {
    cl_alloc_reset();
    char *a = clamor_malloc(48), *b = clamor_malloc(48), *c = clamor_malloc(40);
    CHECK(b - a == 48 && c - b == 48);                 // one slab, consecutive slots
    CHECK(off_of(a) % (64 * KiB) == 0);                // slabs are 64 KiB
    CHECK(clamor_heap_footprint() == 64 * KiB);
    char *d = clamor_malloc(8192);
    CHECK(clamor_heap_footprint() == 128 * KiB);       // another class, another slab
    CHECK(labs((long)(d - a)) >= (long)(64 * KiB));
    clamor_free(a), clamor_free(b), clamor_free(c), clamor_free(d);
    CHECK(clamor_heap_allocated() == 0);
}

static void test_spans(void) {
    size_t sizes[] = {8193, 12288, 12289, 64 * KiB, 100000, 1 * MiB + 1, 17 * MiB};
    size_t f0 = clamor_heap_footprint(), a0 = clamor_heap_allocated();
    char *ps[7];
    size_t total = 0;
    for (int i = 0; i < 7; i++) {
        ps[i] = clamor_malloc(sizes[i]);
        CHECK(ps[i] && (uintptr_t)ps[i] % CL_OS_PAGE == 0);
        size_t want = (sizes[i] + CL_OS_PAGE - 1) / CL_OS_PAGE * CL_OS_PAGE;
        CHECK(clamor_usable_size(ps[i]) == want);
        total += want;
        fill(ps[i], sizes[i], i);
    }
    CHECK(clamor_heap_footprint() - f0 == total);
    CHECK(clamor_heap_allocated() - a0 == total);
    for (int i = 0; i < 7; i++) CHECK(verify(ps[i], sizes[i], i));
    for (int i = 0; i < 7; i++) clamor_free(ps[i]);
    CHECK(clamor_heap_footprint() == f0 && clamor_heap_allocated() == a0);
}

static void test_alignment(void) {
    size_t sizes[] = {1, 100, 5000, 8192, 20000, 3 * MiB};
    struct blk b[21 * 6];
    int n = 0, ok = 1;
    for (size_t align = 16; align <= MiB; align *= 2)
        for (int i = 0; i < 6; i++) {
            char *p = clamor_aligned_alloc(align, sizes[i]);
            if (!p || (uintptr_t)p % align || clamor_usable_size(p) < sizes[i]) ok = 0;
            if (!p) continue;
            fill(p, sizes[i], (uint64_t)n);
            b[n++] = (struct blk){p, sizes[i], (uint64_t)n};
        }
    CHECK(ok && n == 17 * 6);
    CHECK(no_overlap(b, (size_t)n));
    for (int i = 0; i < n; i++) CHECK(verify(b[i].p, b[i].size, (uint64_t)i));
    for (int i = 0; i < n; i++) CHECK(clamor_free_checked(b[i].p) == 0);
    char *p = clamor_aligned_alloc(1, 10), *q = clamor_aligned_alloc(8, 10);
    CHECK(p && q && (uintptr_t)p % 16 == 0 && (uintptr_t)q % 16 == 0);
    clamor_free(p), clamor_free(q);
    errno = 0;
    CHECK(clamor_aligned_alloc(0, 10) == NULL && errno == EINVAL);
    errno = 0;
    CHECK(clamor_aligned_alloc(48, 10) == NULL && errno == EINVAL);
    CHECK(detail_has("power of two"));
}

static void test_realloc(void) {
    cl_alloc_reset(); // a known layout: blocks are carved in address order
    size_t a0 = clamor_heap_allocated();
    // small grow and shrink, moving between classes
    char *p = clamor_malloc(40);
    fill(p, 40, 1);
    char *q = clamor_realloc(p, 48); // same class: in place
    CHECK(q == p && verify(q, 40, 1));
    q = clamor_realloc(q, 1000);
    CHECK(q && verify(q, 40, 1));
    fill(q, 1000, 2);
    char *r = clamor_realloc(q, 100);
    CHECK(r && verify(r, 100, 2));
    // small -> large -> small
    fill(r, 100, 3);
    char *l = clamor_realloc(r, 50000);
    CHECK(l && (uintptr_t)l % CL_OS_PAGE == 0 && verify(l, 100, 3));
    fill(l, 50000, 4);
    // large grows in place when the pages after it are free
    char *l2 = clamor_realloc(l, 200000);
    CHECK(l2 == l && verify(l2, 50000, 4) && clamor_usable_size(l2) == 200704);
    fill(l2, 200000, 5);
    // large shrinks in place and gives the tail back
    size_t f0 = clamor_heap_footprint();
    char *l3 = clamor_realloc(l2, 30000);
    CHECK(l3 == l2 && verify(l3, 30000, 5) && clamor_usable_size(l3) == 32768);
    CHECK(f0 - clamor_heap_footprint() == 200704 - 32768);
    // blocked by a neighbour: moves, contents preserved
    char *block = clamor_malloc(20000);
    CHECK(block == l3 + 32768);
    char *l4 = clamor_realloc(l3, 300000);
    CHECK(l4 && l4 != l3 && verify(l4, 30000, 5));
    CHECK(clamor_free_checked(l3) == EINVAL); // the old block was freed
    clamor_free(block);
    fill(l4, 300000, 6);
    char *s = clamor_realloc(l4, 200);
    CHECK(s && verify(s, 200, 6) && clamor_usable_size(s) < 8192);
    // realloc(NULL, n) mallocs, realloc(p, 0) frees and returns NULL
    char *m = clamor_realloc(NULL, 77);
    CHECK(m && clamor_usable_size(m) >= 77);
    CHECK(clamor_realloc(m, 0) == NULL);
    CHECK(clamor_usable_size(m) == 0 && clamor_free_checked(m) == EINVAL);
    // a foreign pointer: NULL, EINVAL, nothing touched
    int local[4] = {1, 2, 3, 4};
    errno = 0;
    CHECK(clamor_realloc(local, 100) == NULL && errno == EINVAL && local[3] == 4);
    errno = 0;
    CHECK(clamor_realloc(s + 16, 100) == NULL && errno == EINVAL);
    // too big: NULL, ENOMEM, the block stays
    errno = 0;
    CHECK(clamor_realloc(s, 2 * REGION_SIZE) == NULL && errno == ENOMEM);
    CHECK(clamor_usable_size(s) > 0 && verify(s, 200, 6));
    clamor_free(s);
    CHECK(clamor_heap_allocated() == a0);
}

static void test_calloc(void) {
    // reused small memory is zeroed
    char *p = clamor_malloc(100);
    memset(p, 0xff, 100);
    clamor_free(p);
    char *q = clamor_calloc(1, 100);
    CHECK(q == p && all_bytes(q, 100, 0));
    clamor_free(q);
    // reused large memory, punched (>= 64 KiB) and not (< 64 KiB)
    size_t sizes[] = {20000, 200000, 3 * MiB};
    for (int i = 0; i < 3; i++) {
        p = clamor_malloc(sizes[i]);
        memset(p, 0xee, sizes[i]);
        clamor_free(p);
        q = clamor_calloc(sizes[i], 1);
        CHECK(q == p && all_bytes(q, sizes[i], 0));
        memset(q, 0xdd, sizes[i]);
        clamor_free(q);
    }
    // many elements
    uint32_t *v = clamor_calloc(50000, sizeof *v);
    CHECK(v && all_bytes(v, 50000 * sizeof *v, 0));
    clamor_free(v);
    // n * size overflows
    errno = 0;
    CHECK(clamor_calloc(SIZE_MAX / 2, 3) == NULL && errno == ENOMEM);
    CHECK(detail_has("overflow"));
    errno = 0;
    CHECK(clamor_calloc((size_t)1 << 32, (size_t)1 << 32) == NULL && errno == ENOMEM);
    p = clamor_calloc(0, 5);
    CHECK(p != NULL && clamor_free_checked(p) == 0);
}

static void test_zero_size(void) {
    char *a = clamor_malloc(0), *b = clamor_malloc(0);
    CHECK(a && b && a != b);
    CHECK(clamor_usable_size(a) >= 1);
    CHECK(clamor_free_checked(a) == 0 && clamor_free_checked(b) == 0);
    CHECK(clamor_free_checked(a) == EINVAL);
}

static void test_huge(void) {
    size_t a0 = clamor_heap_allocated();
    size_t bad[] = {SIZE_MAX, SIZE_MAX - 100, SIZE_MAX - CL_OS_PAGE + 2, REGION_SIZE + 1, 2 * REGION_SIZE};
    for (int i = 0; i < 5; i++) {
        errno = 0;
        CHECK(clamor_malloc(bad[i]) == NULL && errno == ENOMEM);
        char num[32];
        snprintf(num, sizeof num, "%zu", bad[i]);
        CHECK(detail_has(num));
    }
    errno = 0;
    CHECK(clamor_aligned_alloc((size_t)1 << 40, 16) == NULL && errno == ENOMEM);
    errno = 0;
    CHECK(clamor_aligned_alloc(16, SIZE_MAX) == NULL && errno == ENOMEM);
    CHECK(clamor_heap_allocated() == a0);
}

static void test_exhaustion(void) {
    static char *ps[300000];
    size_t n = 0, f0 = clamor_heap_footprint(), a0 = clamor_heap_allocated();
    // 64 MiB blocks, then 1 MiB, then single pages, then whatever small
    // blocks still fit in slabs that have room
    size_t steps[] = {64 * MiB, MiB, 9000, 16};
    for (int s = 0; s < 4; s++) {
        for (;;) {
            char *p = clamor_malloc(steps[s]);
            if (!p) break;
            ps[n++] = p;
            if (n == 300000) break;
        }
        CHECK(errno == ENOMEM && detail_has("region exhausted"));
    }
    CHECK(n > 15 && n < 300000);
    CHECK(clamor_heap_footprint() >= REGION_SIZE - 64 * KiB);
    errno = 0;
    CHECK(clamor_malloc(100000) == NULL && errno == ENOMEM);
    CHECK(detail_has("100000 bytes requested"));
    errno = 0;
    CHECK(clamor_calloc(1, 50000) == NULL && errno == ENOMEM);
    // recovery: free one big block, and its size fits again
    clamor_free(ps[0]);
    ps[0] = clamor_malloc(64 * MiB);
    CHECK(ps[0] != NULL);
    for (size_t i = 0; i < n; i++) clamor_free(ps[i]);
    CHECK(clamor_heap_footprint() == f0 && clamor_heap_allocated() == a0);
    // free runs coalesced again: half the region in one piece
    char *big = clamor_malloc(REGION_SIZE / 2);
    CHECK(big != NULL);
    clamor_free(big);
}

static void test_bad_free(void) {
    char *p = clamor_malloc(100), *keep = clamor_malloc(100), *l = clamor_malloc(50000);
    fill(keep, 100, 77);
    fill(l, 50000, 78);
    size_t a0 = clamor_heap_allocated(), f0 = clamor_heap_footprint();
    // free(NULL) does nothing, not even errno
    errno = 0;
    clamor_free(NULL);
    CHECK(errno == 0 && clamor_free_checked(NULL) == 0);
    // double free
    clamor_free(p);
    size_t a1 = clamor_heap_allocated();
    errno = 0;
    clamor_free(p);
    CHECK(errno == EINVAL && detail_has("not a live block"));
    CHECK(clamor_heap_allocated() == a1);
    // stack, heap and a never-allocated region address
    int local;
    char *heap = malloc(32);
    char *never = (char *)clamor_region_base() + REGION_SIZE - 3 * MiB;
    void *bad[] = {&local, heap, never, never + 8, (char *)clamor_region_base() + REGION_SIZE,
                   (char *)clamor_region_base() - 4096};
    for (int i = 0; i < 6; i++) {
        errno = 0;
        clamor_free(bad[i]);
        CHECK(errno == EINVAL);
        CHECK(clamor_free_checked(bad[i]) == EINVAL);
        CHECK(clamor_usable_size(bad[i]) == 0);
    }
    free(heap);
    CHECK(detail_has("0x"));
    // interior pointers of live blocks
    void *inner[] = {keep + 1, keep + 16, keep + 8, l + 1, l + 4096, l + 40960};
    for (int i = 0; i < 6; i++) CHECK(clamor_free_checked(inner[i]) == EINVAL);
    // the unused tail of a slab: 6144-byte slots, 10 per 64 KiB slab; the
    // class has only its cached empty slab, so t is its first slot
    char *t = clamor_malloc(6144);
    CHECK(clamor_free_checked(t + 10 * 6144) == EINVAL);
    CHECK(clamor_free_checked(t) == 0);
    CHECK(clamor_heap_allocated() == a1 && clamor_heap_footprint() <= f0 + 64 * KiB);
    CHECK(clamor_heap_allocated() == a0 - 112);
    // the heap still works and never hands out keep or l again
    struct blk b[2000];
    int ok = 1;
    for (int i = 0; i < 2000; i++) {
        size_t sz = (size_t)(i * 37 % 20000) + 1;
        b[i] = (struct blk){clamor_malloc(sz), sz, (uint64_t)i};
        if (!b[i].p) ok = 0;
        else fill(b[i].p, sz, (uint64_t)i);
    }
    CHECK(ok);
    CHECK(verify(keep, 100, 77) && verify(l, 50000, 78));
    struct blk all[2002];
    memcpy(all, b, sizeof b);
    all[2000] = (struct blk){keep, 100, 0};
    all[2001] = (struct blk){l, 50000, 0};
    CHECK(no_overlap(all, 2002));
    for (int i = 0; i < 2000; i++) {
        if (!verify(b[i].p, b[i].size, b[i].seed)) ok = 0;
        clamor_free(b[i].p);
    }
    CHECK(ok);
    clamor_free(keep), clamor_free(l);
}

static void test_reuse(void) {
    cl_alloc_reset();
    size_t sizes[] = {1, 16, 100, 1000, 8192, 8193, 50000, 100000, 5 * MiB};
    for (int i = 0; i < 9; i++) {
        char *p = clamor_malloc(sizes[i]);
        clamor_free(p);
        char *q = clamor_malloc(sizes[i]);
        CHECK(q == p);
        char *r = clamor_malloc(sizes[i]);
        clamor_free(q);
        CHECK(clamor_malloc(sizes[i]) == q);
        clamor_free(q), clamor_free(r);
    }
    // a large run freed between two live blocks is used again
    char *a = clamor_malloc(MiB), *b = clamor_malloc(MiB), *c = clamor_malloc(MiB);
    clamor_free(b);
    CHECK(clamor_malloc(MiB / 2) == b);
    CHECK(clamor_malloc(MiB / 2) == b + MiB / 2);
    clamor_free(b), clamor_free(b + MiB / 2);
    // neighbours merge: three freed runs make one
    clamor_free(a), clamor_free(c);
    CHECK(clamor_malloc(3 * MiB) == a);
    clamor_free(a);
    CHECK(clamor_heap_allocated() == 0);
}

static void test_range_used(void) {
    cl_alloc_reset();
    CHECK(cl_alloc_range_used(0, REGION_SIZE) == 0); // no heap yet
    char *s = clamor_malloc(100), *l = clamor_malloc(200000);
    uint64_t so = off_of(s), lo = off_of(l);
    CHECK(cl_alloc_range_used(so, 1) == 1);
    CHECK(cl_alloc_range_used(so & ~(uint64_t)4095, 4096) == 1);
    CHECK(cl_alloc_range_used(lo, 200000) == 1);
    CHECK(cl_alloc_range_used(lo + 196608, 1) == 1);  // last page
    CHECK(cl_alloc_range_used(lo + 200704, 4096) == 0); // just past it
    CHECK(cl_alloc_range_used(lo + 200703, 2) == 1);    // straddles its end
    CHECK(cl_alloc_range_used(512 * MiB, 256 * MiB) == 0);
    CHECK(cl_alloc_range_used(REGION_SIZE - 1, 1) == 0);
    CHECK(cl_alloc_range_used(lo, 0) == 0);
    CHECK(cl_alloc_range_used(REGION_SIZE, 4096) == 0);
    CHECK(cl_alloc_range_used(UINT64_MAX, UINT64_MAX) == 0);
    CHECK(cl_alloc_range_used(lo, UINT64_MAX) == 1);
    CHECK(cl_alloc_range_used(0, REGION_SIZE) == 1);
    clamor_free(l);
    CHECK(cl_alloc_range_used(lo, 200000) == 0);
    clamor_free(s); // the slab stays cached for its class: still in use
    CHECK(cl_alloc_range_used(so, 1) == 1);
    cl_alloc_reset();
    CHECK(cl_alloc_range_used(0, REGION_SIZE) == 0);
}

static void test_untouched(void) {
    // No region byte is read or written: with the whole region inaccessible
    // the allocator still works.  Runs on a new region, whose pages all read
    // zero, so calloc of a block never handed out skips the memset.
    struct sigaction sa = {.sa_handler = trap_handler}, old;
    sigaction(SIGSEGV, &sa, &old);
    char *live[600];
    int n = 0;
    if (sigsetjmp(trap_jmp, 1) == 0) {
        trap_armed = 1;
        CHECK(mprotect((void *)clamor_region_base(), REGION_SIZE, PROT_NONE) == 0);
        char *z = clamor_calloc(1, 600 * MiB);
        CHECK(z != NULL);
        clamor_free(z);
        for (int i = 0; i < 30000; i++) {
            size_t sz = (size_t)(i * 7919 % 300000) + 1;
            char *p = i % 50 ? clamor_malloc(sz) : clamor_aligned_alloc(8192, sz);
            if (i % 2 && n < 600) live[n++] = p;
            else clamor_free(p);
            if (i % 97 == 0 && n) {
                CHECK(clamor_usable_size(live[n - 1]) >= 1);
                CHECK(cl_alloc_range_used(off_of(live[n - 1]), 1) == 1);
                clamor_free(live[--n]);
            }
        }
        for (int i = 0; i < n; i++) clamor_free(live[i]);
        CHECK(clamor_free_checked(live[0]) == EINVAL); // double free reads nothing either
        trap_armed = 0;
    } else {
        trap_armed = 0;
        CHECK(!"allocator touched region memory");
    }
    mprotect((void *)clamor_region_base(), REGION_SIZE, PROT_READ | PROT_WRITE);
    sigaction(SIGSEGV, &old, NULL);

    // block A survives lots of traffic around it
    char *a = clamor_malloc(3000);
    fill(a, 3000, 99);
    for (int i = 0; i < 20000; i++) {
        size_t sz = (size_t)(i * 131 % 70000) + 1;
        char *p = clamor_malloc(sz);
        if (i % 3) clamor_free(p);
        else clamor_free(clamor_realloc(p, sz / 2 + 1));
    }
    CHECK(verify(a, 3000, 99));
    // a freed block keeps its bytes: no free list inside it
    char *keep = clamor_malloc(1000), *f = clamor_malloc(1000), *g = clamor_malloc(30000);
    memset(f, 0x5a, 1000);
    memset(g, 0x6b, 30000);
    clamor_free(f);
    clamor_free(g);
    for (int i = 0; i < 5000; i++) clamor_free(clamor_malloc((size_t)(i % 900) + 1));
    CHECK(all_bytes(f, 1000, 0x5a) && all_bytes(g, 30000, 0x6b));
    clamor_free(keep);
    clamor_free(a);
}

static long memfd_kib(void) {
    struct stat st;
    return fstat(cl_region.memfd, &st) == 0 ? (long)st.st_blocks / 2 : -1;
}

static void test_punch(void) {
    long k0 = memfd_kib();
    char *p = clamor_malloc(8 * MiB);
    memset(p, 1, 8 * MiB);
    CHECK(memfd_kib() - k0 >= 8 * 1024);
    clamor_free(p);
    CHECK(memfd_kib() - k0 < 64); // given back to the kernel
    // below 64 KiB a span is not punched: its bytes stay
    p = clamor_malloc(40000);
    memset(p, 2, 40000);
    clamor_free(p);
    CHECK(all_bytes(p, 40000, 2));
}

static void test_random(void) {
    enum { SLOTS = 2000 };
    static struct blk b[SLOTS];
    uint64_t rng = 12345;
    long ops = 300000 / scale;
    int ok_fill = 1, ok_null = 1, ok_acct = 1, ok_overlap = 1, ok_used = 1;
    size_t a0 = clamor_heap_allocated();
    for (long op = 0; op < ops; op++) {
        uint64_t r = rng_next(&rng);
        struct blk *x = &b[r % SLOTS];
        int kind = (int)(r >> 32) % 16;
        size_t sz = (r >> 40) % 100 < 95 ? (size_t)((r >> 16) % 2048) : (size_t)((r >> 16) % 300000);
        if (x->p && kind < 12) { // free or realloc
            if (!verify(x->p, x->size, x->seed)) ok_fill = 0;
            if (kind < 8) {
                clamor_free(x->p);
                x->p = NULL;
            } else {
                char *q = clamor_realloc(x->p, sz + 1);
                if (!q) {
                    ok_null = 0;
                    continue;
                }
                size_t keep = x->size < sz + 1 ? x->size : sz + 1;
                if (!verify(q, keep, x->seed)) ok_fill = 0;
                x->p = q;
                x->size = sz + 1;
                x->seed = r;
                fill(q, x->size, r);
            }
        } else if (!x->p) {
            char *p;
            if (kind < 10) p = clamor_malloc(sz);
            else if (kind < 13) p = clamor_calloc(1, sz);
            else p = clamor_aligned_alloc((size_t)16 << (r % 14), sz);
            if (!p) {
                ok_null = 0;
                continue;
            }
            if (kind >= 10 && kind < 13 && !all_bytes(p, sz, 0)) ok_fill = 0;
            *x = (struct blk){p, sz, r};
            fill(p, sz, r);
        }
        if (op % 20000 == 0 || op == ops - 1) {
            size_t sum = 0;
            for (int i = 0; i < SLOTS; i++)
                if (b[i].p) {
                    sum += clamor_usable_size(b[i].p);
                    if (!verify(b[i].p, b[i].size, b[i].seed)) ok_fill = 0;
                    if (!cl_alloc_range_used(off_of(b[i].p), b[i].size + 1)) ok_used = 0;
                }
            if (clamor_heap_allocated() - a0 != sum) ok_acct = 0;
            if (!no_overlap(b, SLOTS)) ok_overlap = 0;
        }
    }
    CHECK(ok_fill);
    CHECK(ok_null);
    CHECK(ok_acct);
    CHECK(ok_overlap);
    CHECK(ok_used);
    for (int i = 0; i < SLOTS; i++) {
        clamor_free(b[i].p);
        b[i].p = NULL;
    }
    CHECK(clamor_heap_allocated() == a0);
}

static _Atomic int stress_stop;
static _Atomic long stress_bad;

static void *stress_thread(void *arg) {
    enum { SLOTS = 500 };
    struct blk b[SLOTS] = {{0}};
    uint64_t rng = 0x1234567ull * ((uintptr_t)arg + 1);
    long bad = 0, ops = 100000 / scale;
    for (long op = 0; op < ops; op++) {
        uint64_t r = rng_next(&rng);
        struct blk *x = &b[r % SLOTS];
        size_t sz = (r >> 40) % 100 < 97 ? (size_t)((r >> 16) % 1500) : (size_t)((r >> 16) % 200000);
        uint64_t seed = r ^ ((uint64_t)(uintptr_t)arg << 56);
        if (x->p) {
            if (!verify(x->p, x->size, x->seed)) bad++;
            if ((r >> 32) % 4) {
                clamor_free(x->p);
                x->p = NULL;
                continue;
            }
            char *q = clamor_realloc(x->p, sz + 1);
            if (!q) {
                bad++;
                continue;
            }
            if (!verify(q, x->size < sz + 1 ? x->size : sz + 1, x->seed)) bad++;
            *x = (struct blk){q, sz + 1, seed};
        } else {
            char *p = (r >> 32) % 8 ? clamor_malloc(sz) : clamor_calloc(sz, 1);
            if (!p || !in_region(p)) {
                bad++;
                continue;
            }
            *x = (struct blk){p, sz, seed};
        }
        fill(x->p, x->size, x->seed);
    }
    for (int i = 0; i < SLOTS; i++)
        if (b[i].p) {
            if (!verify(b[i].p, b[i].size, b[i].seed)) bad++;
            if (clamor_free_checked(b[i].p)) bad++;
        }
    stress_bad += bad;
    return NULL;
}

static void *range_reader(void *arg) {
    (void)arg;
    uint64_t rng = 99, hits = 0;
    while (!stress_stop) {
        uint64_t r = rng_next(&rng);
        hits += (uint64_t)cl_alloc_range_used(r % REGION_SIZE, (r >> 40) % (4 * MiB));
        if (r % 64 == 0) sched_yield(); // leave the CPUs to the allocating threads
    }
    return (void *)(uintptr_t)hits;
}

static void test_threads(void) {
    pthread_t t[4], rd;
    size_t a0 = clamor_heap_allocated();
    pthread_create(&rd, NULL, range_reader, NULL);
    for (uintptr_t i = 0; i < 4; i++) pthread_create(&t[i], NULL, stress_thread, (void *)i);
    for (int i = 0; i < 4; i++) pthread_join(t[i], NULL);
    stress_stop = 1;
    pthread_join(rd, NULL);
    CHECK(stress_bad == 0);
    CHECK(clamor_heap_allocated() == a0);
}

static void *fork_hammer(void *arg) {
    (void)arg;
    while (!stress_stop) clamor_free(clamor_malloc(100));
    return NULL;
}

// fork() while other threads allocate: the child inherits consistent
// metadata and a lock it can take (the atfork handlers hold it across fork).
static void test_fork(void) {
    pthread_t t[2];
    int ok = 1;
    stress_stop = 0;
    for (int i = 0; i < 2; i++) pthread_create(&t[i], NULL, fork_hammer, NULL);
    for (int i = 0; i < 20 && ok; i++) {
        pid_t pid = fork();
        if (pid == 0) {
            alarm(5); // a deadlock kills the child
            int worker = clamor_region_role() == CLAMOR_ROLE_WORKER;
            errno = 0;
            int eperm = clamor_malloc(16) == NULL && errno == EPERM;
            cl_region.role = CLAMOR_ROLE_DRIVER; // metadata only: the region is not touched
            void *p = clamor_malloc(100);
            int freed = p && clamor_free_checked(p) == 0;
            cl_alloc_reset();
            _exit(worker && eperm && freed ? 0 : 1);
        }
        int st = 0;
        if (pid < 0 || waitpid(pid, &st, 0) != pid || !WIFEXITED(st) || WEXITSTATUS(st) != 0) ok = 0;
    }
    stress_stop = 1;
    for (int i = 0; i < 2; i++) pthread_join(t[i], NULL);
    CHECK(ok);
}

static void test_close_reopen(void) {
    char *p = clamor_malloc(1000);
    CHECK(p != NULL);
    CHECK(clamor_region_close() == 0);
    errno = 0;
    CHECK(clamor_malloc(10) == NULL && errno == ENXIO);
    CHECK(clamor_free_checked(p) == EINVAL);
    CHECK(clamor_heap_allocated() == 0 && clamor_heap_footprint() == 0);
    CHECK(clamor_region_init(0, REGION_SIZE, 0) == 0);
    char *q = clamor_malloc(1000);
    CHECK(q != NULL && clamor_heap_allocated() == 1024);
    clamor_free(q);
}

int main(void) {
    const char *quick = getenv("CLAMOR_TEST_QUICK");
    if (quick && *quick && *quick != '0') scale = 10;
    test_no_region();
    int rc = clamor_region_init(0, REGION_SIZE, 0);
    CHECK(rc == 0);
    if (rc) {
        fprintf(stderr, "clamor_region_init: %s\n", clamor_last_error());
        return 1;
    }
    test_roles();
    test_size_classes();
    test_slab_layout();
    test_spans();
    test_alignment();
    test_realloc();
    test_calloc();
    test_zero_size();
    test_huge();
    test_bad_free();
    test_reuse();
    test_exhaustion();
    test_range_used();
    test_close_reopen();
    test_untouched();
    test_punch();
    test_random();
    test_threads();
    test_fork();
    return CHECK_SUMMARY("test_alloc");
}
