/* test_pagetable.c -- the worker page table and mapping accounting of
 * csrc/pagetable.c, in one process and without network.
 *
 * The test plays the pager: it marks page words WANTED, writes bytes into the
 * fill view and calls cl_pt_install(), or drops pages with cl_pt_drop().
 * After every step it compares the pager's count of the mappings the public
 * view is split into with the kernel's, read from /proc/self/maps, and with a
 * shadow model.  It checks that a mapping budget (clamor_set_max_mappings)
 * holds under random single-page installs by evicting, that a drop gives the
 * memory back, and that a forked child, of a worker or of a driver, starts
 * with every page absent and never sees the driver's bytes.  Exits non-zero
 * if any check fails.
 */
#define _GNU_SOURCE
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

#define BASE ((uintptr_t)0x300000000000ULL)
#define SIZE ((size_t)64 << 20)
#define PS ((size_t)4096)
#define NPAGES (SIZE / PS)
#define DRIVER_BASE ((uintptr_t)0x310000000000ULL)

static long scale = 1; /* divided by 10 in quick mode */
static uint8_t model[NPAGES]; /* 1: this test installed the page and did not drop it */
static uint32_t gen[NPAGES];   /* bumped on every install: the bytes written */

static uint64_t rng = 0x2545f4914f6cdd1dull;
static uint64_t rnd(void) {
    rng ^= rng >> 12;
    rng ^= rng << 25;
    rng ^= rng >> 27;
    return rng * 2685821657736338717ull;
}

/* ---- helpers -------------------------------------------------------------- */

/* Permission string ("rw-s", "---s") of the mapping holding addr, or "". */
static const char *perms_at(uintptr_t addr) {
    static char perms[8];
    FILE *f = fopen("/proc/self/maps", "r");
    perms[0] = '\0';
    if (!f) return perms;
    char line[512];
    while (fgets(line, sizeof line, f)) {
        unsigned long s, e;
        char p[8];
        if (sscanf(line, "%lx-%lx %7s", &s, &e, p) == 3 && addr >= s && addr < e) {
            snprintf(perms, sizeof perms, "%s", p);
            break;
        }
    }
    fclose(f);
    return perms;
}

static uint32_t state(uint64_t i) { return CL_PG_STATE(atomic_load(&cl_region.pages[i])); }

static uint64_t word(uint64_t i, size_t k) { return (i << 32 | gen[i]) * 0x9e3779b97f4a7c15ull + k; }

/* Mappings implied by the model: 1 + boundaries where openness changes. */
static uint32_t model_mappings(void) {
    uint32_t m = 1;
    for (size_t i = 1; i < NPAGES; i++) m += model[i] != model[i - 1];
    return m;
}

/* What the pager does: claim, fill, install. */
static int install(uint64_t first, uint64_t count) {
    for (uint64_t i = first; i < first + count; i++) {
        atomic_store(&cl_region.pages[i], CL_PG_WANTED);
        gen[i]++;
        uint64_t *w = (uint64_t *)(cl_region.fill + i * PS);
        for (size_t k = 0; k < PS / 8; k += 64) w[k] = word(i, k);
    }
    int rc = cl_pt_install(first, count);
    if (rc == 0)
        for (uint64_t i = first; i < first + count; i++) model[i] = 1;
    return rc;
}

static int drop(uint64_t first, uint64_t count) {
    int rc = cl_pt_drop(first, count);
    if (rc == 0) memset(model + first, 0, count);
    return rc;
}

/* The public view shows what was written through the fill view. */
static bool shows(uint64_t i) {
    const uint64_t *w = (const uint64_t *)cl_page_addr(i);
    for (size_t k = 0; k < PS / 8; k += 64)
        if (w[k] != word(i, k)) return false;
    return true;
}

static bool fill_shows(uint64_t i) {
    const uint64_t *w = (const uint64_t *)(cl_region.fill + i * PS);
    for (size_t k = 0; k < PS / 8; k += 64)
        if (w[k] != word(i, k)) return false;
    return true;
}

static bool fill_zero(uint64_t i) {
    const uint64_t *w = (const uint64_t *)(cl_region.fill + i * PS);
    for (size_t k = 0; k < PS / 8; k++)
        if (w[k]) return false;
    return true;
}

static bool accounting_ok(void) {
    int k = kernel_mappings(BASE, SIZE);
    uint32_t c = clamor_mappings(), m = model_mappings();
    if (k == (int)c && c == m) return true;
    fprintf(stderr, "  mappings: kernel %d, pager %u, model %u\n", k, c, m);
    return false;
}

/* Drop everything this test installed. */
static void reset_all(void) {
    CHECK(drop(0, NPAGES) == 0);
    CHECK(clamor_mappings() == 1);
    CHECK(kernel_mappings(BASE, SIZE) == 1);
}

/* ---- tests ------------------------------------------------------------------ */

static void test_attach(void) {
    CHECK(clamor_region_role() == CLAMOR_ROLE_WORKER);
    CHECK(clamor_region_base() == BASE && clamor_region_size() == SIZE && clamor_page_size() == PS);
    CHECK(cl_region.npages == NPAGES && cl_region.page_shift == 12);
    CHECK(cl_region.fill != NULL && cl_region.pages != NULL);
    bool absent = true;
    for (size_t i = 0; i < NPAGES; i++) absent &= state(i) == CL_PG_ABSENT;
    CHECK(absent);
    CHECK(clamor_mappings() == 1);
    CHECK(kernel_mappings(BASE, SIZE) == 1);
    CHECK(strncmp(perms_at(BASE), "---", 3) == 0);
    CHECK(fill_zero(0) && fill_zero(NPAGES - 1));
    CHECK(clamor_region_attach(BASE, SIZE, PS) == EBUSY);
}

static void test_install_basic(void) {
    CHECK(install(10, 4) == 0);
    CHECK(accounting_ok() && clamor_mappings() == 3);
    bool ok = true;
    for (uint64_t i = 10; i < 14; i++) ok &= state(i) == CL_PG_PRESENT && shows(i);
    CHECK(ok);
    CHECK(state(9) == CL_PG_ABSENT && state(14) == CL_PG_ABSENT);
    CHECK(strncmp(perms_at(BASE + 10 * PS), "rw", 2) == 0);
    CHECK(strncmp(perms_at(BASE + 14 * PS), "---", 3) == 0);

    CHECK(install(0, 1) == 0); /* left edge: one more boundary */
    CHECK(accounting_ok() && clamor_mappings() == 4);
    CHECK(install(NPAGES - 1, 1) == 0); /* right edge */
    CHECK(accounting_ok() && clamor_mappings() == 5);
    CHECK(install(14, 1) == 0); /* extends a run: no new mapping */
    CHECK(accounting_ok() && clamor_mappings() == 5);
    CHECK(install(16, 1) == 0);
    CHECK(accounting_ok() && clamor_mappings() == 7);
    CHECK(install(15, 1) == 0); /* joins two runs */
    CHECK(accounting_ok() && clamor_mappings() == 5);
    CHECK(install(1, 9) == 0); /* joins the edge run: 0..16 open */
    CHECK(accounting_ok() && clamor_mappings() == 3);
    CHECK(shows(0) && shows(5) && shows(16));

    /* a waiter's bit is cleared, and the waiter woken, on install */
    atomic_store(&cl_region.pages[100], CL_PG_WANTED | CL_PG_WAITERS);
    gen[100]++;
    uint64_t *w = (uint64_t *)(cl_region.fill + 100 * PS);
    for (size_t k = 0; k < PS / 8; k += 64) w[k] = word(100, k);
    CHECK(cl_pt_install(100, 1) == 0);
    model[100] = 1;
    CHECK(atomic_load(&cl_region.pages[100]) == CL_PG_PRESENT);
    CHECK(shows(100) && accounting_ok());

    CHECK(drop(5, 3) == 0); /* splits a run */
    CHECK(accounting_ok());
    CHECK(state(5) == CL_PG_ABSENT && state(7) == CL_PG_ABSENT && state(8) == CL_PG_PRESENT);
    CHECK(strncmp(perms_at(BASE + 6 * PS), "---", 3) == 0);
    CHECK(shows(4) && shows(8));
    reset_all();
}

static void test_drop_returns_memory(void) {
    struct stat st0, st1, st2;
    CHECK(fstat(cl_region.memfd, &st0) == 0);
    CHECK(install(2000, 256) == 0); /* 1 MiB */
    CHECK(fstat(cl_region.memfd, &st1) == 0);
    CHECK(st1.st_blocks >= st0.st_blocks + (blkcnt_t)(256 * PS / 512)); /* every page was written */
    CHECK(!fill_zero(2000) && !fill_zero(2255));
    struct clamor_stats s0, s1;
    clamor_stats_get(&s0);
    CHECK(clamor_pages_drop(2000, 256) == 0);
    memset(model + 2000, 0, 256);
    clamor_stats_get(&s1);
    CHECK(s1.pages_dropped == s0.pages_dropped + 256);
    CHECK(fstat(cl_region.memfd, &st2) == 0);
    CHECK(st2.st_blocks <= st0.st_blocks);
    bool zero = true, absent = true;
    for (uint64_t i = 2000; i < 2256; i++) {
        zero &= fill_zero(i);
        absent &= state(i) == CL_PG_ABSENT;
    }
    CHECK(zero && absent);
    CHECK(strncmp(perms_at(BASE + 2000 * PS), "---", 3) == 0);
    CHECK(accounting_ok());

    /* HELD (read ahead, view closed): a drop forgets its data too */
    atomic_store(&cl_region.pages[3000], CL_PG_HELD);
    memset(cl_region.fill + 3000 * PS, 0x5a, PS);
    CHECK(drop(3000, 1) == 0);
    CHECK(state(3000) == CL_PG_ABSENT && fill_zero(3000));
    /* WANTED (in flight) is left alone: the pager will install it */
    atomic_store(&cl_region.pages[3001], CL_PG_WANTED);
    CHECK(drop(3000, 4) == 0);
    CHECK(state(3001) == CL_PG_WANTED);
    atomic_store(&cl_region.pages[3001], CL_PG_ABSENT);
    CHECK(accounting_ok());

    /* bounds and role */
    CHECK(clamor_pages_drop(NPAGES, 1) == EINVAL);
    CHECK(clamor_pages_drop(NPAGES - 1, 2) == EINVAL);
    CHECK(clamor_pages_drop(1, UINT64_MAX) == EINVAL);
    CHECK(clamor_pages_drop(NPAGES, 0) == 0);
}

static void test_random_accounting(void) {
    long ops = 4000 / scale, mismatches = 0, bad_data = 0, fails = 0;
    for (long op = 0; op < ops; op++) {
        /* half the traffic in a small window, so runs merge and split often */
        uint64_t span = rnd() % 2 ? 256 : NPAGES;
        uint64_t first = rnd() % span, count = 1 + rnd() % 8;
        if (first + count > NPAGES) count = NPAGES - first;
        if (rnd() % 3) { /* install the absent prefix of the run */
            uint64_t n = 0;
            while (n < count && !model[first + n]) n++;
            if (n && install(first, n) != 0) fails++;
        } else if (drop(first, count) != 0) {
            fails++;
        }
        if (op % 16 == 0 || op == ops - 1) {
            if (!accounting_ok()) mismatches++;
            uint64_t i = rnd() % span;
            while (i < NPAGES && !model[i]) i++;
            if (i < NPAGES && (state(i) != CL_PG_PRESENT || !shows(i))) bad_data++;
        }
    }
    CHECK(fails == 0);
    CHECK(mismatches == 0);
    CHECK(bad_data == 0);
    bool states = true;
    for (size_t i = 0; i < NPAGES; i++)
        states &= (state(i) == CL_PG_PRESENT) == (model[i] != 0);
    CHECK(states);
    reset_all();
}

static void test_budget(uint32_t budget) {
    clamor_set_max_mappings(budget);
    CHECK(clamor_max_mappings() == budget);
    clamor_stats_reset();
    long iters = 3000 / scale, over = 0, mismatches = 0, fails = 0;
    int worst = 0;
    for (long it = 0; it < iters; it++) {
        uint64_t i = rnd() % NPAGES;
        if (state(i) != CL_PG_ABSENT) continue;
        if (install(i, 1) != 0) fails++;
        /* evictions close pages behind the model's back: resync it */
        for (size_t p = 0; p < NPAGES; p += 1)
            if (model[p] && state(p) != CL_PG_PRESENT) model[p] = 0;
        int k = kernel_mappings(BASE, SIZE);
        if (k > worst) worst = k;
        if (k > (int)budget) over++;
        if (k != (int)clamor_mappings() || clamor_mappings() != model_mappings()) mismatches++;
    }
    struct clamor_stats st;
    clamor_stats_get(&st);
    CHECK(fails == 0);
    CHECK(over == 0);
    CHECK(mismatches == 0);
    CHECK(st.evictions > 0);
    printf("  budget %u: at most %d mappings seen, %ld over, %lu evictions\n", budget, worst, over,
           (unsigned long)st.evictions);
    CHECK(worst == (int)budget || worst == (int)budget - 1); /* the budget was reached */
    /* evicted pages are closed with their bytes kept (a worker's own writes
     * to them survive), open pages show theirs */
    long lost = 0, unkept = 0, present = 0, held = 0;
    for (uint64_t i = 0; i < NPAGES; i++) {
        if (state(i) == CL_PG_PRESENT) {
            present++;
            if (!shows(i)) lost++;
        } else if (state(i) == CL_PG_HELD) {
            held++;
            if (!fill_shows(i)) unkept++;
        } else if (gen[i] && !fill_zero(i)) { /* dropped earlier: memory given back */
            unkept++;
        }
    }
    CHECK(present > 0);
    CHECK(held > 0);
    CHECK(lost == 0 && unkept == 0);
    clamor_set_max_mappings(0);
    CHECK(clamor_max_mappings() > budget);
    reset_all();
}

/* Partial drops split runs; what remains must stay evictable, so that the
 * budget holds again after the next install. */
static void test_budget_with_drops(void) {
    clamor_set_max_mappings(5);
    CHECK(install(10, 2) == 0 && drop(10, 1) == 0); /* page 11 remains */
    CHECK(install(20, 2) == 0 && drop(20, 1) == 0); /* page 21 remains */
    CHECK(clamor_mappings() == 5);
    CHECK(install(30, 1) == 0);
    CHECK(kernel_mappings(BASE, SIZE) <= 5);
    for (size_t p = 0; p < NPAGES; p++)
        if (model[p] && state(p) != CL_PG_PRESENT) model[p] = 0;
    CHECK(accounting_ok());
    reset_all();

    uint32_t budget = 41;
    clamor_set_max_mappings(budget);
    long iters = 3000 / scale, over = 0, mismatches = 0, fails = 0;
    for (long it = 0; it < iters; it++) {
        uint64_t first = rnd() % (NPAGES - 8), count = 1 + rnd() % 6;
        bool installed = false;
        if (rnd() % 3) {
            uint64_t n = 0;
            while (n < count && state(first + n) == CL_PG_ABSENT) n++;
            if (n && install(first, n) != 0) fails++;
            installed = n > 0;
        } else {
            /* drop part of a present run, often its first page */
            uint64_t i = first;
            while (i < NPAGES && state(i) != CL_PG_PRESENT) i++;
            if (i < NPAGES && drop(i, 1 + rnd() % 2) != 0) fails++;
        }
        for (size_t p = 0; p < NPAGES; p++)
            if (model[p] && state(p) != CL_PG_PRESENT) model[p] = 0;
        /* A drop that splits a run adds two mappings and may overshoot;
         * the next install evicts back under the budget. */
        int k = kernel_mappings(BASE, SIZE);
        if (installed && k > (int)budget) over++;
        if (k != (int)clamor_mappings() || clamor_mappings() != model_mappings()) mismatches++;
    }
    CHECK(fails == 0);
    CHECK(over == 0);
    CHECK(mismatches == 0);
    if (over) fprintf(stderr, "  budget %u with partial drops: over it %ld times\n", budget, over);
    clamor_set_max_mappings(0);
    reset_all();
}

/* ---- fork ------------------------------------------------------------------- */

static int wait_child(pid_t pid) {
    int st;
    if (waitpid(pid, &st, 0) != pid) return -1;
    if (WIFSIGNALED(st)) {
        fprintf(stderr, "  child %d killed by signal %d\n", (int)pid, WTERMSIG(st));
        return -1;
    }
    return WEXITSTATUS(st);
}

static bool all_absent(void) {
    for (size_t i = 0; i < cl_region.npages; i++)
        if (atomic_load(&cl_region.pages[i]) != CL_PG_ABSENT) return false;
    return true;
}

/* A worker's child starts over: nothing present, one mapping, no data. */
static void test_fork_worker(void) {
    CHECK(install(500, 8) == 0);
    CHECK(install(900, 1) == 0);
    pid_t pid = fork();
    if (pid == 0) {
        alarm(60);
        failed = passed = 0;
        CHECK(cl_region.role == CLAMOR_ROLE_WORKER);
        CHECK(all_absent());
        CHECK(clamor_mappings() == 1);
        CHECK(kernel_mappings(BASE, SIZE) == 1);
        CHECK(strncmp(perms_at(BASE + 500 * PS), "---", 3) == 0);
        CHECK(fill_zero(500) && fill_zero(900));
        CHECK(clamor_fork_parent_endpoint()[0] == '\0');
        memset(model, 0, sizeof model);
        CHECK(install(501, 1) == 0 && shows(501) && accounting_ok()); /* still works */
        _exit(failed ? 1 : 0);
    }
    CHECK(pid > 0);
    CHECK(wait_child(pid) == 0);
    /* the child's private memory did not touch ours */
    CHECK(state(500) == CL_PG_PRESENT && shows(500) && shows(507) && shows(900));
    CHECK(accounting_ok());
    reset_all();
}

/* driver (child) -> worker (grandchild): the grandchild sees none of the
 * driver's bytes, from before or after the fork. */
static int driver_tree(void) {
    failed = passed = 0;
    CHECK(clamor_region_close() == 0);
    int rc = clamor_region_init(DRIVER_BASE, (size_t)16 << 20, PS);
    CHECK(rc == 0);
    if (rc) return 1;
    CHECK(cl_region.role == CLAMOR_ROLE_DRIVER);
    char *d = (char *)DRIVER_BASE;
    memset(d, 0x11, 2 * PS);
    int ready[2], go[2];
    if (pipe(ready) || pipe(go)) return 1;
    pid_t g = fork();
    if (g == 0) {
        alarm(60);
        failed = passed = 0;
        char c;
        CHECK(cl_region.role == CLAMOR_ROLE_WORKER);
        CHECK(clamor_region_role() == CLAMOR_ROLE_WORKER);
        CHECK(all_absent());
        CHECK(clamor_fork_parent_endpoint() != NULL && clamor_fork_parent_endpoint()[0] == '\0');
        CHECK(clamor_mappings() == 1);
        CHECK(kernel_mappings(DRIVER_BASE, (size_t)16 << 20) == 1);
        CHECK(strncmp(perms_at(DRIVER_BASE), "---", 3) == 0);
        CHECK(cl_region.fill != NULL && cl_region.fill[0] == 0 && cl_region.fill[PS] == 0);
        CHECK(write(ready[1], "r", 1) == 1);
        CHECK(read(go[0], &c, 1) == 1); /* the driver has written 0x22 now */
        CHECK(cl_region.fill[0] == 0 && cl_region.fill[PS + 7] == 0);
        /* open the view directly: it must be our own, zero, memory */
        CHECK(mprotect(d, 2 * PS, PROT_READ) == 0);
        CHECK(d[0] == 0 && d[PS - 1] == 0 && d[PS] == 0 && d[2 * PS - 1] == 0);
        _exit(failed ? 1 : 0);
    }
    CHECK(g > 0);
    char c;
    CHECK(read(ready[0], &c, 1) == 1);
    memset(d, 0x22, 2 * PS);
    CHECK(write(go[1], "g", 1) == 1);
    CHECK(wait_child(g) == 0);
    CHECK(d[0] == 0x22 && d[2 * PS - 1] == 0x22); /* the driver kept its bytes */
    CHECK(clamor_region_close() == 0);
    return failed ? 1 : 0;
}

static void test_fork_driver(void) {
    pid_t pid = fork();
    if (pid == 0) {
        alarm(60);
        _exit(driver_tree());
    }
    CHECK(pid > 0);
    CHECK(wait_child(pid) == 0);
    CHECK(cl_region.role == CLAMOR_ROLE_WORKER && cl_region.base == BASE); /* ours is untouched */
}

int main(void) {
    const char *quick = getenv("CLAMOR_TEST_QUICK");
    if (quick && *quick && *quick != '0') scale = 10;
    setvbuf(stdout, NULL, _IONBF, 0);
    int rc = clamor_region_attach(BASE, SIZE, PS);
    CHECK(rc == 0);
    if (rc) {
        fprintf(stderr, "clamor_region_attach: %s\n", clamor_last_error());
        return 1;
    }
    test_attach();
    test_install_basic();
    test_drop_returns_memory();
    test_random_accounting();
    test_budget(3);
    test_budget(17);
    test_budget(101);
    test_budget_with_drops();
    test_fork_worker();
    test_fork_driver();
    CHECK(clamor_region_close() == 0);
    CHECK(kernel_mappings(BASE, SIZE) == 0);
    return CHECK_SUMMARY("test_pagetable");
}
