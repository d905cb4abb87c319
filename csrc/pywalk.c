/* pywalk.c -- share()'s walk of plain data and plain instances, in C.
 *
 * Built only into the Python extension (CLAMOR_WITH_PYTHON).  share() walks
 * the object graph in Python (clamor/memory/walk.py): about 0.1 million
 * objects a second.  Most large globals are plain, though: dicts, lists,
 * tuples and sets of ints, floats, strs and bytes, and lists of instances
 * of plain classes and dataclasses.  For those, clamor_py_walk_plain() does
 * the same checks as the Python walk, in C:
 *
 *   - every object lies in the region, header to the end of its body, or
 *     is a singleton every process has (None, True, False, Ellipsis,
 *     NotImplemented, an int from -5 to 256, the empty str and the
 *     one-character Latin-1 strs), as walk._ok_outside says, or an object
 *     with no referent in a loaded image (the empty tuple), as the walk's
 *     in_image says; or an atom or a class outside the region, which the
 *     caller judges by walk._ok_outside (inherited at the fork, or not);
 *   - every raw pointer field the Python walk checks (pyshare.c, fields())
 *     leads into the region: a list's item array, a dict's keys table (or
 *     the interpreter's static empty one, in a loaded image), a set's
 *     table, a str's data and cached copies;
 *   - no dict is split (a values table: an instance's), and no object has
 *     words a version would hide (a set's weak-reference list, pyhide.c);
 *   - an instance is of a class laid out as object with a dict
 *     (cl_py_plain_class: no __slots__, no C base), has no weak reference,
 *     and has a dict of its own (walk._owns_keys); its collector referents
 *     (its class, its dict) are walked as gc.get_referents gives them to
 *     the Python walk.
 *
 * It answers 1 only when all of that holds for every object reachable, and
 * then the Python walk would approve without a word to say or a thing to
 * write.  Anything else (another type, an object outside the region, a
 * table that grew outside a block, more than `limit` objects) answers 0,
 * and the caller walks in Python, which refuses with a path, brings the
 * object in, or accepts it for reasons this file does not know (an object
 * the workers inherited).  So C only ever says yes where Python says yes;
 * tests/test_walk_plain.py checks that on random graphs.  An instance
 * whose dict is not its own yet answers 2: clamor_py_own_keys()
 * (pyownkeys.c) gives every such instance reachable one, as walk._own_keys
 * would, in one heap block, and the caller walks again.  The ranges each
 * object's reader follows pointers from are pyextents.c's; what a recheck
 * of the walk reads (where a root's entries lie, the digests of its pages)
 * is pyrecheck.c's; the set of objects seen and the stack, pyseen.h's.
 *
 * The GIL is held throughout (the objects are borrowed): about 0.2 s per
 * million objects on this machine.
 */
#ifdef CLAMOR_WITH_PYTHON
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "pyseen.h"

/* [a, a+n) inside the region: region.contains(addr, n); short for the
 * many checks below */
static inline int inside(uintptr_t a, size_t n) { return cl_in_region_span(a, n); }

int cl_py_stack_push(struct cl_py_stack *st, PyObject *o) { return push(st, o); }

/* ---- one object ---------------------------------------------------------------- */

enum { FALLBACK = 0, OK = 1, NEEDS_KEYS = 2, NOMEM = -1 };

/* A singleton every process has, outside the region (walk._ok_outside). */
static int everyones(PyObject *o) {
    if (o == Py_None || o == Py_True || o == Py_False || o == Py_Ellipsis || o == Py_NotImplemented) return 1;
    if (PyLong_CheckExact(o)) {
        int overflow = 0;
        long v = PyLong_AsLongAndOverflow(o, &overflow);
        return !overflow && v >= -5 && v <= 256;
    }
    if (PyUnicode_CheckExact(o)) {
#if PY_VERSION_HEX < 0x030C0000
        if (!PyUnicode_IS_READY(o)) return 0; /* (a legacy str: its length is not known yet) */
#endif
        Py_ssize_t n = PyUnicode_GET_LENGTH(o);
        return n == 0 || (n == 1 && PyUnicode_READ_CHAR(o, 0) < 256);
    }
    return 0;
}

/* An object with no referent, of a plain type: a static one in a loaded
 * image (the empty tuple, bytes and frozenset, a cached one-byte bytes)
 * is accepted as the Python walk accepts it (walk.amap.in_image). */
static int static_atom(PyObject *o) {
    PyTypeObject *t = Py_TYPE(o);
    if (t == &PyLong_Type || t == &PyFloat_Type || t == &PyComplex_Type || t == &PyUnicode_Type ||
        t == &PyBytes_Type)
        return 1;
    if (t == &PyTuple_Type) return PyTuple_GET_SIZE(o) == 0;
    if (t == &PyFrozenSet_Type) return PySet_GET_SIZE(o) == 0;
    return 0;
}

static int plain_type(PyTypeObject *t) {
    return t == &PyLong_Type || t == &PyFloat_Type || t == &PyComplex_Type || t == &PyBool_Type ||
           t == &PyUnicode_Type || t == &PyBytes_Type || t == &PyTuple_Type || t == &PyList_Type ||
           t == &PyDict_Type || t == &PySet_Type || t == &PyFrozenSet_Type;
}

/* The raw pointer fields of an object of a plain type, in the region (or,
 * a dict's keys, the static empty table of an image); no split dict. */
static int fields_inside(PyObject *o, const uintptr_t *images, size_t nimages, int frozen) {
    if (PyList_CheckExact(o)) {
        PyObject **items = ((PyListObject *)o)->ob_item;
        return !items || inside((uintptr_t)items, 1);
    }
    if (PyDict_CheckExact(o)) {
        PyDictObject *d = (PyDictObject *)o;
        if (d->ma_values) /* (an instance's, over its class's keys: frozen at the fork, for forked workers) */
            return frozen && inside((uintptr_t)d->ma_values, sizeof(void *)) &&
                   cl_py_frozen_keys((uintptr_t)d->ma_keys);
        uintptr_t k = (uintptr_t)d->ma_keys;
        return !k || inside(k, 1) || cl_in_ranges(k, images, nimages);
    }
    if (PyAnySet_CheckExact(o)) {
        PySetObject *s = (PySetObject *)o;
        return s->table == s->smalltable || inside((uintptr_t)s->table, 1);
    }
    if (PyUnicode_CheckExact(o)) {
        PyASCIIObject *u = (PyASCIIObject *)o;
        if (!u->state.compact && !inside((uintptr_t)((PyUnicodeObject *)o)->data.any, 1)) return 0;
        if (!u->state.ascii) {
            const char *utf8 = ((PyCompactUnicodeObject *)o)->utf8;
            if (utf8 && !inside((uintptr_t)utf8, 1)) return 0;
        }
#if PY_VERSION_HEX < 0x030C0000
        if (u->wstr && !inside((uintptr_t)u->wstr, 1)) return 0;
#endif
    }
    return 1;
}

static int children(PyObject *o, struct cl_py_stack *st) {
    if (PyTuple_CheckExact(o)) {
        for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(o); i++)
            if (push(st, PyTuple_GET_ITEM(o, i)) < 0) return -1;
    } else if (PyList_CheckExact(o)) {
        for (Py_ssize_t i = 0; i < PyList_GET_SIZE(o); i++)
            if (push(st, PyList_GET_ITEM(o, i)) < 0) return -1;
    } else if (PyDict_CheckExact(o)) {
        Py_ssize_t pos = 0;
        PyObject *k, *v;
        while (PyDict_Next(o, &pos, &k, &v))
            if (push(st, k) < 0 || push(st, v) < 0) return -1;
    } else if (PyAnySet_CheckExact(o)) {
        PySetObject *s = (PySetObject *)o;
        for (Py_ssize_t i = 0; i <= s->mask; i++) {
            setentry *e = &s->table[i];
            if (e->key && e->hash != -1 && push(st, e->key) < 0) return -1;   /* (a dummy's hash is -1) */
        }
    }
    return 0;
}

/* Outside the region, what the Python walk may accept by rules of its own
 * (walk._ok_outside, an object the workers inherited by its fingerprint):
 * an atom, a class, and an object of a type this walk takes.  Collected
 * for the caller, which judges each (a container by a walk of its own). */
static int outside_candidate(PyObject *o) {
    PyTypeObject *t = Py_TYPE(o);
    return t == &PyLong_Type || t == &PyFloat_Type || t == &PyComplex_Type || t == &PyUnicode_Type ||
           t == &PyBytes_Type || PyType_Check(o) || plain_type(t) || cl_py_plain_class(t);
}

/* ---- what a portable walk adds (portable._Mode.inside) ----------------------- */

struct words {
    uint64_t *v;
    int32_t *tag; /* the tag of the object each belongs to */
    size_t n, cap;
};

static int word(struct words *ws, uintptr_t a, int32_t tag) {
    if (ws->n == ws->cap) {
        size_t cap = ws->cap ? 2 * ws->cap : 4096;
        uint64_t *t = realloc(ws->v, cap * sizeof *t);
        if (!t) return -1;
        ws->v = t;
        int32_t *g = realloc(ws->tag, cap * sizeof *g);
        if (!g) return -1;
        ws->tag = g;
        ws->cap = cap;
    }
    ws->tag[ws->n] = tag;
    ws->v[ws->n++] = a;
    return 0;
}

/* ---- one walk ------------------------------------------------------------------ */

struct walk {
    struct seen seen;
    struct cl_py_stack st;
    struct cl_py_extents ext, *e;        /* e: &ext when the caller wants the extents */
    PyObject *outside;             /* a list for the outside candidates, or NULL */
    const uintptr_t *images;
    size_t nimages;
    long limit, n;
    PyTypeObject *classes[8];      /* plain classes met (cl_py_plain_class is a scan of the MRO) */
    char frozen_of[8];             /* each one's keys frozen at the fork (cl_py_frozen_class): 0 not known yet, 1, 2 not */
    char keyed_of[8];              /* each one's keys frozen for workers not forked (cl_py_portable_class): as frozen_of */
    int nclasses;
    int frozen;                    /* a walk for forked workers: instances of such classes keep dicts over them */
    int keyed;                     /* a walk for workers not forked: instances over frozen tables kept (keyed_ok) */
    struct words classes_keyed;    /* there: the classes of those instances */
    int converting;                /* the pass of clamor_py_own_keys (cl_py_walk_needing_keys): collect, never refuse */
    struct cl_py_stack todo;       /* there: the instances whose dicts need keys of their own (held) */
    const uint64_t *keys;          /* or of clamor_py_rekey (cl_py_walk_holding_keys): these keys, sorted; */
    size_t nkeys;                  /* todo then has the exact dicts holding any of them (held) */
    /* clamor_py_walk_tagged: the root's entries tag what is reached through them */
    int tagging, shared;           /* shared: an object with extents reached through two entries */
    int recheck;                   /* walk only the entries listed in dirty (sorted) */
    const int32_t *dirty;
    size_t ndirty;
    /* clamor_py_walk_portable: the words a worker not forked reads as null,
     * and whether a dict or set is keyed by what hashes by the seed */
    int portable, seeded;
    struct words nulls;
};

/* An extent's strictness byte: bit 0 strict; TYPE_WORD: an atom's type
 * word, read for its relocation only (it cannot change while the atom
 * lives, and what holds the atom is read: portable._Mode.read_table). */
#define TYPE_WORD 2

/* The words of region object o that a worker not forked reads as null (the
 * collector's links, the weak-reference list) and, for an atom, its type
 * word (its other words are data); the seed's mark. */
static int portable_words(struct walk *w, PyObject *o) {
    PyTypeObject *t = Py_TYPE(o);
    uintptr_t a = (uintptr_t)o;
    int32_t tag = w->ext.cur;
    if (PyType_HasFeature(t, Py_TPFLAGS_HAVE_GC) &&
        (word(&w->nulls, a - 16, tag) < 0 || word(&w->nulls, a - 8, tag) < 0))
        return NOMEM;
    if (t->tp_weaklistoffset && word(&w->nulls, a + t->tp_weaklistoffset, tag) < 0) return NOMEM;
    if (!w->seeded && (t == &PyDict_Type || t == &PySet_Type || t == &PyFrozenSet_Type)) w->seeded = cl_py_seeded_keys(o);
    if (t == &PyLong_Type || t == &PyFloat_Type || t == &PyComplex_Type || t == &PyUnicode_Type ||
        t == &PyBytes_Type) {
        w->ext.strict_now = 1 | TYPE_WORD;
        return cl_py_extent(&w->ext, a + 8, 8) < 0 ? NOMEM : OK;
    }
    return OK;
}

static int plain_instance(struct walk *w, PyObject *o) {
    PyTypeObject *t = Py_TYPE(o);
    for (int i = 0; i < w->nclasses; i++)
        if (w->classes[i] == t) return 1;
    if (!cl_py_plain_class(t)) return 0;
    if (w->nclasses < (int)(sizeof w->classes / sizeof w->classes[0])) w->classes[w->nclasses++] = t;
    return 1;
}

/* May instance o keep its dict as it is: a walk for forked workers
 * (frozen), o's dict a region dict over its class's keys table, frozen at
 * the fork (pyclasskeys.c)?  (The dict is walked on its own.) */
static int frozen_ok(struct walk *w, PyObject *o) {
    if (!w->frozen) return 0;
    PyTypeObject *t = Py_TYPE(o);
    int i = 0;
    while (i < w->nclasses && w->classes[i] != t) i++;
    if (i == w->nclasses) return cl_py_frozen_instance(o);
    if (!w->frozen_of[i]) w->frozen_of[i] = cl_py_frozen_class(t) ? 1 : 2;
    return w->frozen_of[i] == 1 && cl_py_frozen_layout(o);
}

/* May instance o keep its values table as it is: a walk for workers not
 * forked, o's attributes in a region values table only, its class's table
 * frozen (pyclasskeys.c: each worker lays its own out alike)?  Its class
 * is noted for the caller. */
static int keyed_ok(struct walk *w, PyObject *o) {
    if (!w->keyed || !cl_py_portable_layout(o)) return 0;
    PyTypeObject *t = Py_TYPE(o);
    int i = 0;
    while (i < w->nclasses && w->classes[i] != t) i++;
    if (i < w->nclasses && w->keyed_of[i]) return w->keyed_of[i] == 1;
    int ok = cl_py_portable_class(t);
    if (i < w->nclasses) w->keyed_of[i] = ok ? 1 : 2;
    if (!ok) return 0;
    for (size_t j = 0; j < w->classes_keyed.n; j++)
        if (w->classes_keyed.v[j] == (uint64_t)(uintptr_t)t) return 1;
    return word(&w->classes_keyed, (uintptr_t)t, 0) < 0 ? NOMEM : 1;
}

/* walk._owns_keys: a dict in the region, combined, its keys table there
 * too.  (The Python test is [d, d + sys.getsizeof(d)) in the region; the
 * body, the collector's links and the keys' whole block bound that.) */
int cl_py_owns_keys(PyObject *d) {
    if (!d || !PyDict_CheckExact(d)) return 0;
    PyDictObject *m = (PyDictObject *)d;
    uintptr_t k = (uintptr_t)m->ma_keys, start;
    size_t size;
    if (m->ma_values || !inside(k, 1) || clamor_block_of((void *)k, &start, &size) != 0) return 0;
    return inside((uintptr_t)d, (size_t)Py_TYPE(d)->tp_basicsize + 2 * sizeof(void *) + size);
}

static int visit_push(PyObject *r, void *arg) { return r && push(arg, r) < 0 ? -1 : 0; }

/* One region instance of a plain class. */
static int instance(struct walk *w, PyObject *o) {
    uintptr_t a = (uintptr_t)o;
    if (!inside(a, clamor_py_body_size(a))) return w->converting ? OK : FALLBACK;
    int keyed = 0;
    if (!cl_py_owns_keys(cl_py_instance_dict(o)) && !frozen_ok(w, o) && !(keyed = keyed_ok(w, o))) {
        if (!w->converting) return NEEDS_KEYS;
        if (w->nkeys) goto referents;
        Py_INCREF(o);
        if (push(&w->todo, o) < 0) {
            Py_DECREF(o);
            return NOMEM;
        }
    } else if (keyed == NOMEM) {
        return NOMEM;
    } else if (!w->converting && cl_py_weaklist_head(o)) {
        return FALLBACK; /* (hidden.note's, when it leads out of the region) */
    }
referents:
    /* the collector's referents, as gc.get_referents gives the Python walk:
     * the class, and the dict or the values table */
    if (Py_TYPE(o)->tp_traverse(o, visit_push, &w->st) != 0) return NOMEM;
    if (w->converting) return OK;
    if (w->portable && portable_words(w, o) != OK) return NOMEM;
    return w->e && cl_py_instance_extents(o, w->e) < 0 ? NOMEM : OK;   /* (no call when none are wanted) */
}

/* Does the exact dict o hold one of w->keys (by identity) as a key? */
static int holds_key(const struct walk *w, PyObject *o) {
    Py_ssize_t pos = 0;
    PyObject *k, *v;
    while (PyDict_Next(o, &pos, &k, &v))
        if (cl_sorted_has(w->keys, w->nkeys, (uint64_t)(uintptr_t)k)) return 1;
    return 0;
}

/* Push o onto st, held: OK, or NOMEM. */
static int hold(struct cl_py_stack *st, PyObject *o) {
    Py_INCREF(o);
    if (push(st, o) == 0) return OK;
    Py_DECREF(o);
    return NOMEM;
}

static int visit(struct walk *w, PyObject *o) {
    uintptr_t a = (uintptr_t)o;
    if (!inside(a, 1)) {
        /* (not walked: the Python walk accepts it as it is, or decides; a
         * portable walk's images are the relocation targets', and what lies
         * outside them must be a target the caller numbers) */
        int img = cl_in_ranges(a, w->images, w->nimages);
        if (w->converting || (w->portable ? img && (everyones(o) || static_atom(o))
                                          : everyones(o) || (static_atom(o) && img)))
            return OK;
        if (!w->outside || !outside_candidate(o)) return FALLBACK;
        return PyList_Append(w->outside, o) < 0 ? NOMEM : OK;
    }
    if (plain_type(Py_TYPE(o))) {
        void **weak = NULL, **info = NULL;
        if (!w->converting && (!inside(a, clamor_py_body_size(a)) || !fields_inside(o, w->images, w->nimages, w->frozen) ||
                               cl_py_to_hide(o, &weak, &info)))
            return FALLBACK;
        if (children(o, &w->st) < 0) return NOMEM;
        if (w->converting) return w->nkeys && PyDict_CheckExact(o) && holds_key(w, o) ? hold(&w->todo, o) : OK;
        if (w->portable && portable_words(w, o) != OK) return NOMEM;
        return w->e && cl_py_extents_of(o, w->e) < 0 ? NOMEM : OK;
    }
    if (plain_instance(w, o)) return instance(w, o);
    return w->converting ? OK : FALLBACK;
}

#define ROOT_TAG (-1)

/* Entry i of the root, (k, v) (k NULL for a list's item), pushed tagged i. */
static int root_entry(struct walk *w, size_t i, PyObject *k, PyObject *v) {
    w->st.cur = (int32_t)i;
    if ((k && push(&w->st, k) < 0) || push(&w->st, v) < 0) return NOMEM;
    return OK;
}

/* The root of a tagged walk, an exact dict or list: checked as visit()
 * checks it, its own extents tagged ROOT_TAG, its entries pushed each with
 * its index (a recheck: only those listed in `dirty`). */
static int visit_root(struct walk *w, PyObject *o) {
    uintptr_t a = (uintptr_t)o;
    void **weak = NULL, **info = NULL;
    if (!inside(a, 1) || !inside(a, clamor_py_body_size(a)) || !fields_inside(o, w->images, w->nimages, w->frozen) ||
        cl_py_to_hide(o, &weak, &info))
        return FALLBACK;
    if (w->portable && portable_words(w, o) != OK) return NOMEM;
    if (w->e && cl_py_extents_of(o, w->e) < 0) return NOMEM;
    int rc = OK;
    if (w->recheck) {
        for (size_t j = 0; rc == OK && j < w->ndirty; j++) {
            Py_ssize_t i = w->dirty[j], pos = i;
            PyObject *k = NULL, *v = NULL;
            if (PyDict_CheckExact(o)) {
                if (PyDict_Next(o, &pos, &k, &v) && pos - 1 == i) rc = root_entry(w, (size_t)i, k, v);
            } else if (i < PyList_GET_SIZE(o)) {
                rc = root_entry(w, (size_t)i, NULL, PyList_GET_ITEM(o, i));
            }
        }
    } else if (PyDict_CheckExact(o)) {
        Py_ssize_t pos = 0;
        PyObject *k, *v;
        while (rc == OK && PyDict_Next(o, &pos, &k, &v)) rc = root_entry(w, (size_t)pos - 1, k, v);
    } else {
        for (Py_ssize_t i = 0; rc == OK && i < PyList_GET_SIZE(o); i++)
            rc = root_entry(w, (size_t)i, NULL, PyList_GET_ITEM(o, i));
    }
    w->st.cur = ROOT_TAG;
    return rc;
}

static int walk_from(struct walk *w, PyObject *root) {
    w->st.cur = ROOT_TAG;
    int rc = push(&w->st, root) < 0 ? NOMEM : OK;
    while (rc == OK && w->st.n) {
        w->st.n--;
        PyObject *o = w->st.item[w->st.n];
        int32_t tag = w->st.tag[w->st.n], first;
        int fresh = seen_add(&w->seen, (uintptr_t)o, tag, &first);
        if (fresh < 0) return NOMEM;
        if (!fresh) {
            if (w->tagging && first != tag && cl_py_has_extents(o)) w->shared = 1;
            continue;
        }
        if (++w->n > w->limit) return w->converting ? OK : FALLBACK;
        w->st.cur = w->ext.cur = tag;
        rc = w->tagging && o == root ? visit_root(w, o) : visit(w, o);
    }
    return rc;
}

static void walk_free(struct walk *w) {
    for (size_t i = 0; i < w->todo.n; i++) Py_DECREF(w->todo.item[i]);
    free(w->todo.item);
    free(w->todo.tag);
    free(w->ext.v);
    free(w->ext.tag);
    free(w->ext.strict);
    free(w->nulls.v);
    free(w->nulls.tag);
    free(w->classes_keyed.v);
    free(w->classes_keyed.tag);
    free(w->seen.slot);
    free(w->seen.tag);
    free(w->st.item);
    free(w->st.tag);
}

/* The walk of clamor_py_own_keys (pyownkeys.c): it collects, never refuses.
 * The instances found go to *todo, held; the caller drops them. */
int cl_py_walk_needing_keys(PyObject *root, long limit, int frozen, struct cl_py_stack *todo) {
    struct walk w = {.limit = limit, .converting = 1, .frozen = frozen == 1, .keyed = frozen == 2};
    int rc = walk_from(&w, root) == NOMEM ? -ENOMEM : 0;
    *todo = w.todo;
    w.todo = (struct cl_py_stack){0};
    walk_free(&w);
    return rc;
}

/* The walk of clamor_py_rekey (pyownkeys.c): it collects, never refuses.
 * The exact region dicts found holding any of keys[0..nkeys) (sorted) go
 * to *todo, held; the caller drops them. */
int cl_py_walk_holding_keys(PyObject *root, long limit, const uint64_t *keys, size_t nkeys,
                            struct cl_py_stack *todo) {
    struct walk w = {.limit = limit, .converting = 1, .keys = keys, .nkeys = nkeys};
    int rc = walk_from(&w, root) == NOMEM ? -ENOMEM : 0;
    *todo = w.todo;
    w.todo = (struct cl_py_stack){0};
    walk_free(&w);
    return rc;
}

/* Copy n bytes at src into the bytearray ba (resized): 0, or -1. */
int cl_py_to_bytearray(uintptr_t ba, const void *src, size_t n) {
    PyObject *b = (PyObject *)ba;
    if (!PyByteArray_Check(b) || PyByteArray_Resize(b, (Py_ssize_t)n) < 0) {
        PyErr_Clear();
        return -1;
    }
    if (n) memcpy(PyByteArray_AS_STRING(b), src, n);
    return 0;
}

/* root: an object; limit: share()'s; images: the loaded images' ranges,
 * sorted pairs.  Returns 1 (approved, the Python walk has nothing to add
 * once the caller accepts each object of `outside_out`), 0 (walk it in
 * Python), 2 (an instance's dict needs keys of its own: clamor_py_own_keys
 * first) or -1 (no memory).  *visited: objects looked at. */
int clamor_py_walk_plain(uintptr_t root, long limit, const uintptr_t *images, size_t nimages, long *visited,
                         uintptr_t extents_out, uintptr_t outside_out) {
    PyGILState_STATE g = PyGILState_Ensure();
    struct walk w = {.images = images, .nimages = nimages, .limit = limit, .frozen = 1};
    w.e = extents_out ? &w.ext : NULL;
    w.outside = outside_out && PyList_Check((PyObject *)outside_out) ? (PyObject *)outside_out : NULL;
    int rc = walk_from(&w, (PyObject *)root);
    /* (start, length) pairs as native words, into the caller's bytearray */
    if (rc == OK && w.e && cl_py_to_bytearray(extents_out, w.ext.v, 2 * w.ext.n * sizeof(uint64_t)) < 0) rc = NOMEM;
    if (rc == NOMEM) PyErr_Clear(); /* (a failed append) */
    walk_free(&w);
    *visited = w.n;
    PyGILState_Release(g);
    return rc;
}

/* clamor_py_walk_plain of an exact dict or list `root`, each extent tagged
 * (an int32 into tags_out, beside extents_out) with the index of the
 * root's entry it was reached through, or -1 (the root's own).  *shared:
 * an object with extents was reached through two entries (a walk of one
 * entry does not vouch for it).  recheck: the root is checked again, and
 * of its entries only those in dirty (ndirty, ascending) are walked; the
 * caller keeps the other entries' extents (their bytes did not change:
 * clamor_py_root_slots says where each entry lies). */
int clamor_py_walk_tagged(uintptr_t root, long limit, const uintptr_t *images, size_t nimages, long *visited,
                          uintptr_t extents_out, uintptr_t tags_out, uintptr_t outside_out, const int32_t *dirty,
                          size_t ndirty, int recheck, int *shared) {
    PyGILState_STATE g = PyGILState_Ensure();
    struct walk w = {.images = images, .nimages = nimages, .limit = limit, .frozen = 1, .tagging = 1,
                     .recheck = recheck, .dirty = dirty, .ndirty = ndirty};
    w.e = &w.ext;
    w.outside = outside_out && PyList_Check((PyObject *)outside_out) ? (PyObject *)outside_out : NULL;
    PyObject *r = (PyObject *)root;
    int rc = PyDict_CheckExact(r) || PyList_CheckExact(r) ? walk_from(&w, r) : FALLBACK;
    if (rc == OK && (cl_py_to_bytearray(extents_out, w.ext.v, 2 * w.ext.n * sizeof(uint64_t)) < 0 ||
                     cl_py_to_bytearray(tags_out, w.ext.tag, w.ext.n * sizeof(int32_t)) < 0))
        rc = NOMEM;
    if (rc == NOMEM) PyErr_Clear();
    *shared = w.shared;
    walk_free(&w);
    *visited = w.n;
    PyGILState_Release(g);
    return rc;
}

/* clamor_py_walk_plain for workers not forked from the driver (the walk of
 * portable._Mode, whose reference is the Python walk): `images` are the
 * relocation targets' (an object outside the region and them goes to
 * `outside_out` for the caller to number as a target, or to refuse); the
 * extents to read relocations from, their strictness (pointer_extents':
 * every word a pointer or null) and the words a worker reads as null go to
 * *out, handed over as they were grown (no copy: a walk of 10^7 objects
 * makes hundreds of MiB of them).  *seeded: a dict or set reached is keyed
 * by what hashes by the seed.  tagging: as clamor_py_walk_tagged, of an
 * exact dict or list: each extent and null word tagged with the root's
 * entry it was reached through, *shared, and with recheck only the entries
 * in dirty walked.  Returns as clamor_py_walk_plain; *out is filled only
 * with 1. */
int clamor_py_walk_portable(uintptr_t root, long limit, const uintptr_t *images, size_t nimages, long *visited,
                            uintptr_t outside_out, int *seeded, int tagging, const int32_t *dirty, size_t ndirty,
                            int recheck, int *shared, struct clamor_walkout *out) {
    memset(out, 0, sizeof *out);
    PyGILState_STATE g = PyGILState_Ensure();
    struct walk w = {.images = images, .nimages = nimages, .limit = limit, .portable = 1, .keyed = 1,
                     .tagging = tagging, .recheck = recheck, .dirty = dirty, .ndirty = ndirty};
    w.e = &w.ext;
    w.outside = outside_out && PyList_Check((PyObject *)outside_out) ? (PyObject *)outside_out : NULL;
    PyObject *r = (PyObject *)root;
    int rc = w.outside && (!tagging || PyDict_CheckExact(r) || PyList_CheckExact(r)) ? walk_from(&w, r) : FALLBACK;
    if (rc == OK) {
        *out = (struct clamor_walkout){.ext = w.ext.v, .strict = w.ext.strict, .n = w.ext.n, .nulls = w.nulls.v,
                                       .nnulls = w.nulls.n, .keyed = w.classes_keyed.v, .nkeyed = w.classes_keyed.n};
        w.classes_keyed.v = NULL;
        w.ext.v = NULL;
        w.ext.strict = NULL;
        w.nulls.v = NULL;
        if (tagging) {
            out->tags = w.ext.tag;
            out->null_tags = w.nulls.tag;
            w.ext.tag = NULL;
            w.nulls.tag = NULL;
        }
    }
    if (rc == NOMEM) PyErr_Clear();
    *seeded = w.seeded;
    *shared = w.shared;
    walk_free(&w);
    *visited = w.n;
    PyGILState_Release(g);
    return rc;
}


#endif /* CLAMOR_WITH_PYTHON */
