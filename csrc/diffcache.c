/* diffcache.c -- the diffs the driver's page server made, kept for the
 * next worker that asks for the same one.
 *
 * DESIGN.  Workers that hold the same old copy of a page ask for the same
 * diff: after a driver update every worker that read the page at version b
 * asks for it at version v with base b.  Making a diff reads both
 * versions of the page and XORs them (server.c); made once and kept, the
 * other workers' requests cost a look-up and a copy of the diff's few
 * bytes.  A diff is named by (page, base, version) and is exact for as
 * long as both versions cannot change, which holds for every version up to
 * the driver's epoch once it has begun (version.c logs a page's bytes
 * before the first write of an epoch): the server keeps only diffs of such
 * versions, read before either version is.
 *
 * One slot per page, direct-mapped by page number; a slot holds the last
 * diff made for a page.  At most CL_DIFFCACHE_BYTES of diffs are kept:
 * past that, everything goes and filling starts again.  A new region or
 * a driver's versions begun again (cl_version_generation) empties it.
 * The page server's thread alone uses it: no lock.
 */
#define _GNU_SOURCE
#include <stdlib.h>
#include <string.h>

#include "internal.h"

#define SLOTS_SHIFT 16
#define SLOTS ((size_t)1 << SLOTS_SHIFT)
#define CL_DIFFCACHE_BYTES ((size_t)64 << 20)

struct slot {
    uint64_t page1; /* page + 1; 0: empty */
    uint32_t base, version;
    uint64_t sum;
    uint32_t n;
    uint8_t *runs;
};

static struct {
    struct slot *slot;
    size_t bytes;
    uint64_t gen;
} D;

void cl_diffcache_clear(void) {
    if (!D.slot) return;
    for (size_t i = 0; i < SLOTS; i++) free(D.slot[i].runs);
    free(D.slot);
    D.slot = NULL;
    D.bytes = 0;
}

/* The slots, empty if the versions they name began again. */
static bool ready(bool make) {
    uint64_t gen = cl_version_generation();
    if (D.slot && D.gen != gen) cl_diffcache_clear();
    if (!D.slot && make) {
        D.slot = calloc(SLOTS, sizeof *D.slot);
        D.gen = gen;
    }
    return D.slot != NULL;
}

bool cl_diffcache_get(uint64_t p, uint32_t base, uint32_t version, uint64_t *sum, const uint8_t **runs, uint32_t *n) {
    if (!ready(false)) return false;
    struct slot *s = &D.slot[p & (SLOTS - 1)];
    if (s->page1 != p + 1 || s->base != base || s->version != version) return false;
    *sum = s->sum;
    *runs = s->runs;
    *n = s->n;
    return true;
}

void cl_diffcache_put(uint64_t p, uint32_t base, uint32_t version, uint64_t sum, const uint8_t *runs, uint32_t n) {
    if (!ready(true)) return;
    struct slot *s = &D.slot[p & (SLOTS - 1)];
    if (s->page1) {
        D.bytes -= s->n;
        free(s->runs);
        memset(s, 0, sizeof *s);
    }
    if (D.bytes + n > CL_DIFFCACHE_BYTES) { /* full: begin again */
        cl_diffcache_clear();
        if (!ready(true)) return;
        s = &D.slot[p & (SLOTS - 1)];
    }
    uint8_t *copy = malloc(n ? n : 1);
    if (!copy) return;
    if (n) memcpy(copy, runs, n);
    *s = (struct slot){.page1 = p + 1, .base = base, .version = version, .sum = sum, .n = n, .runs = copy};
    D.bytes += n;
}
