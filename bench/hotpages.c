/* hotpages.c -- the open-addressing hash table of bench/hotpages.py.
 *
 * The driver builds the table in the global region through clamor_malloc,
 * whose address the script passes in as a function pointer (the compiled
 * clamor module hides its symbols, and this library links against nothing
 * but libc).  Workers call hp_lookup() on the same address: the region lies
 * at the same base in every process, so the table's header and slots are
 * read in place, and every page a lookup touches is fetched on first touch.
 *
 * Layout: one allocation, a 64-byte header then 2^bits slots of 16 bytes
 * (key, value).  Key 0 marks an empty slot.  The key of rank r (0 = hottest)
 * is hp_mix(r + 1) and its value hp_mix(key ^ VALUE_SALT): the finaliser
 * is a bijection of the 64-bit integers with hp_mix(0) == 0, so keys are
 * distinct and never 0, and anyone can compute both without the table.  A
 * key's home slot is its Fibonacci hash; collisions probe linearly.
 *
 * hp_lookup_mt() splits the keys over threads.  A lookup that touches a page
 * not present blocks its thread for a whole fetch; with several threads a
 * worker keeps several fetches in flight (the pager pipelines them), as a
 * task on a multi-core worker would.
 */
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define HP_MAGIC 0x686f747061676573ull /* "hotpages" */
#define FIB 0x9E3779B97F4A7C15ull      /* 2^64 / golden ratio */
#define VALUE_SALT 0x5851F42D4C957F2Dull

struct hp_table {
    uint64_t magic, bits, nkeys, bytes;
    uint64_t pad[4];
    uint64_t slot[][2]; /* key, value */
};

/* splitmix64's finaliser: a bijection, 0 -> 0 */
uint64_t hp_mix(uint64_t x) {
    x ^= x >> 30;
    x *= 0xBF58476D1CE4E5B9ull;
    x ^= x >> 27;
    x *= 0x94D049BB133111EBull;
    x ^= x >> 31;
    return x;
}

uint64_t hp_key(uint64_t rank) { return hp_mix(rank + 1); }
uint64_t hp_value(uint64_t key) { return hp_mix(key ^ VALUE_SALT); }

static inline uint64_t home(uint64_t key, unsigned bits) { return (key * FIB) >> (64 - bits); }

/* Build a table of 2^bits slots holding the keys of ranks [0, nkeys), with
 * memory from `alloc`.  Returns its address, or 0 if alloc failed or the
 * arguments are out of range (nkeys must leave a slot empty). */
uintptr_t hp_build(void *(*alloc)(size_t), unsigned bits, uint64_t nkeys) {
    if (bits < 4 || bits > 40 || nkeys >= (1ull << bits)) return 0;
    uint64_t nslots = 1ull << bits, mask = nslots - 1;
    size_t bytes = sizeof(struct hp_table) + nslots * 16;
    struct hp_table *t = alloc(bytes);
    if (!t) return 0;
    /* fresh region pages read as zero, but a span may be reused memory */
    memset(t, 0, bytes);
    for (uint64_t r = 0; r < nkeys; r++) {
        uint64_t k = hp_key(r), p = home(k, bits);
        while (t->slot[p][0]) p = (p + 1) & mask;
        t->slot[p][0] = k;
        t->slot[p][1] = hp_value(k);
    }
    t->magic = HP_MAGIC;
    t->bits = bits;
    t->nkeys = nkeys;
    t->bytes = bytes;
    return (uintptr_t)t;
}

/* Look up n keys in the table at `addr`: returns the wrapping sum of the
 * values found, and the number found in *found.  UINT64_MAX in *found if
 * `addr` is not a table. */
uint64_t hp_lookup(uintptr_t addr, const uint64_t *keys, size_t n, uint64_t *found) {
    const struct hp_table *t = (const struct hp_table *)addr;
    if (t->magic != HP_MAGIC) {
        *found = UINT64_MAX;
        return 0;
    }
    unsigned bits = (unsigned)t->bits;
    uint64_t mask = (1ull << bits) - 1, sum = 0, hits = 0;
    for (size_t i = 0; i < n; i++) {
        uint64_t k = keys[i], p = home(k, bits), s;
        while ((s = t->slot[p][0]) != 0 && s != k) p = (p + 1) & mask;
        if (s) {
            sum += t->slot[p][1];
            hits++;
        }
    }
    *found = hits;
    return sum;
}

struct part {
    uintptr_t addr;
    const uint64_t *keys;
    size_t n;
    uint64_t sum, found;
};

static void *lookup_part(void *arg) {
    struct part *p = arg;
    p->sum = hp_lookup(p->addr, p->keys, p->n, &p->found);
    return NULL;
}

/* hp_lookup() over `nthreads` threads (1..256), each a contiguous share of
 * the keys.  The same answer as hp_lookup(); *found is UINT64_MAX if the
 * table is bad or a thread could not be created. */
uint64_t hp_lookup_mt(uintptr_t addr, const uint64_t *keys, size_t n, unsigned nthreads, uint64_t *found) {
    if (nthreads <= 1 || nthreads > 256 || n < nthreads) return hp_lookup(addr, keys, n, found);
    struct part part[256];
    pthread_t th[256];
    unsigned started = 0;
    uint64_t sum = 0, hits = 0;
    for (unsigned i = 0; i < nthreads; i++) {
        size_t lo = n * i / nthreads, hi = n * (i + 1) / nthreads;
        part[i] = (struct part){addr, keys + lo, hi - lo, 0, 0};
        if (pthread_create(&th[i], NULL, lookup_part, &part[i]) != 0) break;
        started++;
    }
    for (unsigned i = 0; i < started; i++) {
        pthread_join(th[i], NULL);
        sum += part[i].sum;
        hits = hits == UINT64_MAX || part[i].found == UINT64_MAX ? UINT64_MAX : hits + part[i].found;
    }
    *found = started == nthreads ? hits : UINT64_MAX;
    return sum;
}

/* Expected answer without the table: the wrapping sum of hp_value(keys). */
uint64_t hp_expect(const uint64_t *keys, size_t n) {
    uint64_t sum = 0;
    for (size_t i = 0; i < n; i++) sum += hp_value(keys[i]);
    return sum;
}

/* Keys of the given ranks (out may alias ranks). */
void hp_keys(const uint64_t *ranks, size_t n, uint64_t *out) {
    for (size_t i = 0; i < n; i++) out[i] = hp_key(ranks[i]);
}
