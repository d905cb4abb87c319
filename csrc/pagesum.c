/* pagesum.c -- the sum of a page's bytes: what a worker installed, what
 * the server sends, what a page rebuilt from a diff must match (wire.h).
 * Pure functions of the bytes; no state.
 */
#include "internal.h"

/* A sum of a page's bytes as a worker installed them (never 0). */
uint64_t cl_page_sum(const void *p, size_t len) {
    const uint64_t *w = p;
    uint64_t h = 0x9e3779b97f4a7c15ULL ^ len, a = 0, b = 0;
    for (size_t i = 0; i + 1 < len / 8; i += 2) {   /* two lanes: the multiplies overlap */
        a = (a ^ w[i]) * 0xff51afd7ed558ccdULL;
        b = (b ^ w[i + 1]) * 0xc4ceb9fe1a85ec53ULL;
        a ^= a >> 29;
        b ^= b >> 31;
    }
    h ^= a + 3 * b;
    h *= 0xbf58476d1ce4e5b9ULL;
    h ^= h >> 31;
    return h | 1;
}

uint64_t cl_page_xor_sum(const void *a_, const void *b_, void *out_, size_t len) {
    const uint64_t *w = a_, *v = b_;
    uint64_t *o = out_;
    uint64_t h = 0x9e3779b97f4a7c15ULL ^ len, a = 0, b = 0;
    size_t n = len / 8, i = 0;
    for (; i + 1 < n; i += 2) { /* cl_page_sum's lanes, and the XOR beside them */
        o[i] = w[i] ^ v[i];
        o[i + 1] = w[i + 1] ^ v[i + 1];
        a = (a ^ w[i]) * 0xff51afd7ed558ccdULL;
        b = (b ^ w[i + 1]) * 0xc4ceb9fe1a85ec53ULL;
        a ^= a >> 29;
        b ^= b >> 31;
    }
    for (; i < n; i++) o[i] = w[i] ^ v[i];
    h ^= a + 3 * b;
    h *= 0xbf58476d1ce4e5b9ULL;
    h ^= h >> 31;
    return h | 1;
}
