/* stats.c -- counters and the fetch-latency histogram.
 *
 * Counters are relaxed atomics bumped by the pager, the server and the fault
 * handler (an atomic add is async-signal-safe).  Latencies go to a log-linear
 * histogram: 16 sub-buckets per power of two of nanoseconds, so a percentile
 * is exact to within about 6%, with no allocation and no lock.
 */
#include <math.h>
#include <string.h>
#include <time.h>

#include "internal.h"

struct cl_counters cl_stats;

#define SUB_BITS 4
#define SUB (1u << SUB_BITS)
#define NBUCKETS (64 * SUB)

static _Atomic uint64_t hist[NBUCKETS];
static _Atomic uint64_t hist_max_ns;

uint64_t cl_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

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
#define LD(f) o->f = atomic_load_explicit(&cl_stats.f, memory_order_relaxed)
    LD(faults); LD(pages_fetched); LD(bytes_fetched); LD(readahead_pages);
    LD(fetch_requests); LD(fetch_errors); LD(pages_served); LD(bytes_served);
    LD(requests_served); LD(bad_requests); LD(evictions); LD(pages_dropped);
    LD(pages_invalidated); LD(pages_logged); LD(pages_unchanged);
    LD(pages_from_peers); LD(bytes_from_peers); LD(redirects); LD(peer_fallbacks);
    LD(peer_direct); LD(hint_bytes); LD(peer_timeouts);
#undef LD
    cl_version_stats(&o->versions, &o->version_bytes);
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
#define Z(f) atomic_store(&cl_stats.f, 0)
    Z(faults); Z(pages_fetched); Z(bytes_fetched); Z(readahead_pages);
    Z(fetch_requests); Z(fetch_errors); Z(pages_served); Z(bytes_served);
    Z(requests_served); Z(bad_requests); Z(evictions); Z(pages_dropped);
    Z(pages_invalidated); Z(pages_logged); Z(pages_unchanged);
    Z(pages_from_peers); Z(bytes_from_peers); Z(redirects); Z(peer_fallbacks);
    Z(peer_direct); Z(hint_bytes); Z(peer_timeouts);
#undef Z
    for (unsigned b = 0; b < NBUCKETS; b++) atomic_store(&hist[b], 0);
    atomic_store(&hist_max_ns, 0);
}
