/* stats.c -- counters and the fetch-latency histogram.
 *
 * Counters are relaxed atomics bumped by the pager, the server and the fault
 * handler (an atomic add is async-signal-safe).  Latencies go to a log-linear
 * histogram: 16 sub-buckets per power of two of nanoseconds, so a percentile
 * is exact to within about 6%, with no allocation and no lock.
 */
#include <math.h>
#include <string.h>

#include "internal.h"

struct cl_counters cl_stats;

#define SUB_BITS 4
#define SUB (1u << SUB_BITS)
#define NBUCKETS (64 * SUB)

static _Atomic uint64_t hist[NBUCKETS];
static _Atomic uint64_t hist_max_ns;

static unsigned bucket_of(uint64_t ns) {
    if (ns < SUB) return (unsigned)ns;
    unsigned msb = 63u - (unsigned)__builtin_clzll(ns);
    unsigned sub = (unsigned)(ns >> (msb - SUB_BITS)) & (SUB - 1);
    return (msb - SUB_BITS + 1) * SUB + sub;
}

/* Lower bound of a bucket, in ns. */
static double bucket_low(unsigned b) {
    if (b < SUB) return b;
    unsigned msb = b / SUB + SUB_BITS - 1, sub = b % SUB;
    return ldexp(1.0 + (double)sub / SUB, (int)msb);
}

void cl_stats_latency(uint64_t ns) {
    atomic_fetch_add_explicit(&hist[bucket_of(ns)], 1, memory_order_relaxed);
    uint64_t m = atomic_load_explicit(&hist_max_ns, memory_order_relaxed);
    while (ns > m && !atomic_compare_exchange_weak(&hist_max_ns, &m, ns)) {}
}

static double percentile(const uint64_t *h, uint64_t total, double q) {
    if (total == 0) return 0.0;
    uint64_t rank = (uint64_t)ceil(q * (double)total), seen = 0;
    if (rank == 0) rank = 1;
    for (unsigned b = 0; b < NBUCKETS; b++) {
        seen += h[b];
        if (seen >= rank) {
            /* middle of the bucket */
            return (bucket_low(b) + bucket_low(b + 1)) / 2.0;
        }
    }
    return 0.0;
}

void clamor_stats_get(struct clamor_stats *o) {
    memset(o, 0, sizeof *o);
#define LOAD(name) o->name = atomic_load_explicit(&cl_stats.name, memory_order_relaxed);
    CLAMOR_STATS(LOAD, CL_STATS_NONE)
#undef LOAD
    cl_version_stats(&o->versions, &o->version_bytes);
    o->kept_bytes = cl_region.role == CLAMOR_ROLE_WORKER ? cl_pt_kept_pages() << cl_region.page_shift : 0;
    uint64_t h[NBUCKETS]; /* 8 KiB snapshot on the stack */
    uint64_t total = 0;
    for (unsigned b = 0; b < NBUCKETS; b++) {
        h[b] = atomic_load_explicit(&hist[b], memory_order_relaxed);
        total += h[b];
    }
    o->latency_count = total;
    o->latency_p50_us = percentile(h, total, 0.50) / 1e3;
    o->latency_p99_us = percentile(h, total, 0.99) / 1e3;
    o->latency_max_us = (double)atomic_load(&hist_max_ns) / 1e3;
}

void clamor_stats_reset(void) {
#define ZERO(name) atomic_store(&cl_stats.name, 0);
    CLAMOR_STATS(ZERO, CL_STATS_NONE)
#undef ZERO
    for (unsigned b = 0; b < NBUCKETS; b++) atomic_store(&hist[b], 0);
    atomic_store(&hist_max_ns, 0);
}
