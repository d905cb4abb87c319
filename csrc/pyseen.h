/* pyseen.h -- the walks' working sets (pywalk.c): the set of objects seen
 * and the stack of objects to visit (pywalk.c; the set also pyfinger.c's
 * fork snapshot, which tags each object with a depth).  Static
 * inline: both run once or more per object a walk visits, the innermost
 * loop of share() and of the Cluster's check.  The GIL is held; neither
 * touches a Python object's reference count.
 */
#ifndef CLAMOR_PYSEEN_H
#define CLAMOR_PYSEEN_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>

#include "internal.h"

/* ---- the set of objects seen: open addressing on addresses ------------------ */

/* The slot of address a: the objects of one 4 KiB page go to one aligned
 * run of 256 slots (one per 16 bytes of the page), the runs of pages spread
 * by a multiplicative hash.  A walk meets objects about in the order they
 * were made, neighbours in memory, so consecutive lookups share the table's
 * cache lines and pages; a hash of the whole address made nearly every
 * lookup of a big graph a cache miss (most of a walk's time). */
static inline size_t seen_slot(uintptr_t a, size_t mask) {
    return (((a >> 12) * 0x9E3779B97F4A7C15ull) ^ ((a >> 4) & 0xff)) & mask;
}

struct seen {
    uintptr_t *slot;
    int32_t *tag; /* the tag each object was first seen with */
    size_t mask, n;
};

static inline int seen_grow(struct seen *s) {
    size_t cap = s->slot ? 2 * (s->mask + 1) : 1024;
    uintptr_t *t = calloc(cap, sizeof *t);
    int32_t *g = calloc(cap, sizeof *g);
    if (!t || !g) {
        free(t);
        free(g);
        return -1;
    }
    for (size_t i = 0; s->slot && i <= s->mask; i++) {
        uintptr_t a = s->slot[i];
        if (!a) continue;
        size_t j = seen_slot(a, cap - 1);
        while (t[j]) j = (j + 1) & (cap - 1);
        t[j] = a;
        g[j] = s->tag[i];
    }
    free(s->slot);
    free(s->tag);
    s->slot = t;
    s->tag = g;
    s->mask = cap - 1;
    return 0;
}

/* 1 if added (with `tag`), 0 if seen before (*first: its tag then), -1
 * out of memory */
static inline int seen_add(struct seen *s, uintptr_t a, int32_t tag, int32_t *first) {
    if (!s->slot || 2 * (s->n + 1) > s->mask + 1) {
        if (seen_grow(s) < 0) return -1;
    }
    size_t j = seen_slot(a, s->mask);
    while (s->slot[j]) {
        if (s->slot[j] == a) {
            *first = s->tag[j];
            return 0;
        }
        j = (j + 1) & s->mask;
    }
    s->slot[j] = a;
    s->tag[j] = tag;
    s->n++;
    return 1;
}

/* As seen_add, tags kept least: 1 if added or its tag was greater (now
 * `tag`), 0 if seen with a tag no greater, -1 out of memory */
static inline int seen_least(struct seen *s, uintptr_t a, int32_t tag) {
    int32_t first;
    int r = seen_add(s, a, tag, &first);
    if (r != 0) return r;
    if (first <= tag) return 0;
    size_t j = seen_slot(a, s->mask);
    while (s->slot[j] != a) j = (j + 1) & s->mask;
    s->tag[j] = tag;
    return 1;
}

/* ---- the stack of objects to visit ------------------------------------------- */

/* struct cl_py_stack (internal.h): each object pushed carries the tag
 * `cur` of the moment, the entry of the root it was reached through
 * (clamor_py_walk_tagged), or ROOT. */
static inline int push(struct cl_py_stack *st, PyObject *o) {
    if (st->n == st->cap) {
        size_t cap = st->cap ? 2 * st->cap : 4096;
        PyObject **t = realloc(st->item, cap * sizeof *t);
        if (!t) return -1;
        st->item = t;
        int32_t *g = realloc(st->tag, cap * sizeof *g);
        if (!g) return -1;
        st->tag = g;
        st->cap = cap;
    }
    st->tag[st->n] = st->cur;
    st->item[st->n++] = o;
    return 0;
}

#endif /* CLAMOR_PYSEEN_H */
