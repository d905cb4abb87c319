/* diffs.c -- the driver's page diffs (wire.h, "Diffs"): made for a
 * request, and kept for the next worker that asks for the same one.
 *
 * A diff is made page by page: both versions read (version.c), XORed and
 * summed (pagesum.c), the XOR in the sparse form; each page's runs count
 * words from its own start, and are moved to the page's place in the
 * reply as they are copied there.
 *
 * DESIGN.  Workers that hold the same old copy of a page ask for the same
 * diff: after a driver update every worker that read the page at version b
 * asks for it at version v with base b.  Making a diff reads both
 * versions of the page and XORs them; made once and kept, the
 * other workers' requests cost a look-up and a copy of the diff's few
 * bytes.  A diff is named by (page, base, version) and is exact for as
 * long as both versions cannot change, which holds for every version up to
 * the driver's epoch once it has begun (version.c logs a page's bytes
 * before the first write of an epoch): the server keeps only diffs of such
 * versions, read before either version is.
 *
 * One slot per page, direct-mapped by page number; a slot holds the last
 * diff made for a page.  At most KEPT_BYTES of diffs are kept:
 * past that, everything goes and filling starts again.  A new region or
 * a driver's versions begun again (cl_version_generation) empties it.
 * The page server's thread alone uses all of it: no lock.
 */
#define _GNU_SOURCE
#include <stdlib.h>
#include <string.h>

#include "diffs.h"

#define SLOTS_SHIFT 16
#define SLOTS ((size_t)1 << SLOTS_SHIFT)
#define KEPT_BYTES ((size_t)64 << 20)

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
    void *xbuf, *vbuf, *out; /* a page's XOR, a base version's page, a reply being made */
    size_t xbuf_len, vbuf_len, out_len;
} D;

static void clear(void) {
    if (!D.slot) return;
    for (size_t i = 0; i < SLOTS; i++) free(D.slot[i].runs);
    free(D.slot);
    D.slot = NULL;
    D.bytes = 0;
}

void cl_diffs_free(void) {
    clear();
    free(D.xbuf);
    free(D.vbuf);
    free(D.out);
    D.xbuf = D.vbuf = D.out = NULL;
    D.xbuf_len = D.vbuf_len = D.out_len = 0;
}

/* The slots, empty if the versions they name began again. */
static bool ready(bool make) {
    uint64_t gen = cl_version_generation();
    if (D.slot && D.gen != gen) clear();
    if (!D.slot && make) {
        D.slot = calloc(SLOTS, sizeof *D.slot);
        D.gen = gen;
    }
    return D.slot != NULL;
}

static bool get(uint64_t p, uint32_t base, uint32_t version, uint64_t *sum, const uint8_t **runs, uint32_t *n) {
    if (!ready(false)) return false;
    struct slot *s = &D.slot[p & (SLOTS - 1)];
    if (s->page1 != p + 1 || s->base != base || s->version != version) return false;
    *sum = s->sum;
    *runs = s->runs;
    *n = s->n;
    return true;
}

static void put(uint64_t p, uint32_t base, uint32_t version, uint64_t sum, const uint8_t *runs, uint32_t n) {
    if (!ready(true)) return;
    struct slot *s = &D.slot[p & (SLOTS - 1)];
    if (s->page1) {
        D.bytes -= s->n;
        free(s->runs);
        memset(s, 0, sizeof *s);
    }
    if (D.bytes + n > KEPT_BYTES) { /* full: begin again */
        clear();
        if (!ready(true)) return;
        s = &D.slot[p & (SLOTS - 1)];
    }
    uint8_t *copy = malloc(n ? n : 1);
    if (!copy) return;
    if (n) memcpy(copy, runs, n);
    *s = (struct slot){.page1 = p + 1, .base = base, .version = version, .sum = sum, .n = n, .runs = copy};
    D.bytes += n;
}

/* True if the diff of the request's k-th page may be kept: both versions
 * have begun, so neither can change. */
static bool keepable(const struct cl_wire_hdr *rq, const uint32_t *bases, uint32_t k, uint32_t epoch) {
    return cl_version_active() && bases[k] >= 1 && bases[k] < rq->version && rq->version <= epoch;
}

/* Append a page's runs (words counted from its start) at out, their words
 * counted from the start of the request's data (page k). */
static void runs_at(uint8_t *out, const uint8_t *runs, size_t n, uint32_t k) {
    uint32_t shift = k << (cl_region.page_shift - 3);
    if (out != runs) memcpy(out, runs, n);
    for (size_t o = 0; o + 8 <= n;) {
        uint32_t first, count;
        memcpy(&first, out + o, 4);
        memcpy(&count, out + o + 4, 4);
        first += shift;
        memcpy(out + o, &first, 4);
        o += 8 + (size_t)count * 8;
    }
}

bool cl_diff_make(cl_zmq_msg *body, size_t len, const struct cl_wire_hdr *rq, const uint32_t *bases, size_t *sent) {
    size_t ps = (size_t)1 << cl_region.page_shift, head = (size_t)rq->count * 8;
    uint32_t epoch = clamor_version_current(); /* (read before either version is) */
    if (len <= head + 8 || !cl_grow(&D.xbuf, &D.xbuf_len, ps) || !cl_grow(&D.vbuf, &D.vbuf_len, ps) ||
        !cl_grow(&D.out, &D.out_len, len))
        return false;
    const char *pages = cl_zmq.msg_data(body);
    uint8_t *out = D.out;
    size_t n = 0, cap = len - head - 8;
    for (uint32_t k = 0; k < rq->count; k++) {
        if (cl_version_read(rq->index + k, bases[k], D.vbuf) != 0) return false; /* collected: the pages */
        uint64_t sum = cl_page_xor_sum(pages + k * ps, D.vbuf, D.xbuf, ps);
        for (int i = 0; i < 8; i++) out[k * 8 + i] = (uint8_t)(sum >> (8 * i));
        size_t m = 0;
        if (cl_wire_sparse_encode(D.xbuf, ps, out + head + n, cap - n, &m) != 0) return false;
        if (keepable(rq, bases, k, epoch)) put(rq->index + k, bases[k], rq->version, sum, out + head + n, (uint32_t)m);
        runs_at(out + head + n, out + head + n, m, k);
        n += m;
    }
    cl_zmq_msg sized;
    if (cl_zmq.msg_init_size(&sized, head + n) != 0) return false;
    memcpy(cl_zmq.msg_data(&sized), out, head + n);
    cl_zmq.msg_close(body);
    *body = sized;
    *sent = head + n;
    return true;
}

bool cl_diff_kept(const struct cl_wire_hdr *rq, const uint32_t *bases, size_t len, cl_zmq_msg *body, size_t *sent) {
    size_t head = (size_t)rq->count * 8, n = 0;
    uint32_t epoch = clamor_version_current();
    uint64_t sums[CL_WIRE_MAX_COUNT];
    const uint8_t *runs[CL_WIRE_MAX_COUNT];
    uint32_t lens[CL_WIRE_MAX_COUNT];
    for (uint32_t k = 0; k < rq->count; k++) {
        if (!keepable(rq, bases, k, epoch) || !get(rq->index + k, bases[k], rq->version, &sums[k], &runs[k], &lens[k]))
            return false;
        n += lens[k];
    }
    if (len <= head + 8 || n > len - head - 8 || cl_zmq.msg_init_size(body, head + n) != 0) return false;
    uint8_t *out = cl_zmq.msg_data(body);
    for (uint32_t k = 0; k < rq->count; k++)
        for (int i = 0; i < 8; i++) out[k * 8 + i] = (uint8_t)(sums[k] >> (8 * i));
    n = 0;
    for (uint32_t k = 0; k < rq->count; k++) {
        runs_at(out + head + n, runs[k], lens[k], k);
        n += lens[k];
    }
    *sent = head + n;
    return true;
}
