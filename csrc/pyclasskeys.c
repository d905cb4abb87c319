/* pyclasskeys.c -- classes' shared keys tables, frozen at a fork.
 *
 * Built only into the Python extension (CLAMOR_WITH_PYTHON).  CPython 3.11-
 * 3.13 keeps an instance's attribute names in one keys table for all
 * instances of its class (the class's ht_cached_keys, outside the region),
 * and appends a name first set on any instance to it in place while it has
 * room (dk_usable > 0).  A worker forked from the driver has the table as
 * it was at the fork: a name appended later in the driver is one the
 * worker would not find.  So share() gave every region instance a dict
 * with keys of its own (pyownkeys.c): a dict, a keys table of its own and
 * a resize, about 3 us and 200 bytes an instance.
 *
 * Before each fork of workers (hooks.prepare_fork) every class's table
 * that names something is frozen instead: dk_usable set to 0, so that
 * CPython never appends to it again (a new name gives that instance a
 * table of its own, as a full table does), and recorded here with its
 * length, a digest of its names and the fork's number.  A worker forked
 * after that has the table as the driver will always have it.  The walks
 * for forked workers (pywalk.c, walk._visit_inside) then take a region
 * instance whose attributes are still in its region values table only (no
 * dict made: the check reads the table, pyextents.c; before 3.13, whose
 * values lie inline), or whose dict is a region dict over that table (a
 * split dict: its values table in the region, its keys the class's), as
 * it is, when the table was frozen at or
 * before the fork of the Cluster's workers (clamor_py_frozen_accept) and
 * still reads as it did then.  One whose dict was made outside the region
 * (vars() or a pickle outside a block) gets a region copy of it
 * (pyownkeys.c).  Workers not forked build their
 * classes' tables themselves, in their own order: their walks still give
 * instances keys of their own.
 *
 * The GIL is held by every caller.
 */
#ifdef CLAMOR_WITH_PYTHON
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

struct frozen {
    uintptr_t type, keys;
    Py_ssize_t n;
    uint64_t digest, seq;
};

static struct frozen *tab; /* sorted by type */
static size_t ntab, captab;
static uint64_t accepted; /* frozen at or before this fork: every worker of the Cluster has it so */
/* The entries by keys table, for the dicts over one (walked as dicts);
 * sorted again when nbykeys != ntab */
static struct frozen **bykeys;
static size_t nbykeys;

static struct cl_dict_keys *class_keys(PyTypeObject *t) {
    if (!(t->tp_flags & Py_TPFLAGS_HEAPTYPE) || !(t->tp_flags & Py_TPFLAGS_MANAGED_DICT)) return NULL;
    return (struct cl_dict_keys *)((PyHeapTypeObject *)t)->ht_cached_keys;
}

/* The names' addresses, in order (a shared table holds strs only: the
 * entries are a key and a value slot each). */
static uint64_t digest_of(const struct cl_dict_keys *k) {
    const PyObject *const *e = (const PyObject *const *)(k->dk_indices + ((size_t)1 << k->dk_log2_index_bytes));
    uint64_t h = 1469598103934665603ull ^ (uint64_t)k->dk_nentries;
    for (Py_ssize_t i = 0; i < k->dk_nentries; i++) {
        h ^= (uint64_t)(uintptr_t)e[2 * i];
        h *= 1099511628211ull;
    }
    return h;
}

static struct frozen *find(uintptr_t type) {
    size_t lo = 0, hi = ntab;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (tab[mid].type < type)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < ntab && tab[lo].type == type ? &tab[lo] : NULL;
}

/* A frozen table is never freed, in the driver or in a worker.  A region
 * dict over it holds a reference the driver counted; a forked worker, whose
 * copy of the table counts only the dicts of before the fork, may run such
 * a dict's deallocation (its count read from a page of a later version)
 * and would free its table under every instance of the class.  (CPython
 * 3.12+ counts no further at its immortal count, far below this.) */
#define PIN ((ssize_t)1 << 40)

static int freeze_keys(uintptr_t type, uint64_t seq) {
    PyTypeObject *t = (PyTypeObject *)type;
    struct cl_dict_keys *k = class_keys(t);
    if (!k || k->dk_kind != 2 /* DICT_KEYS_SPLIT */ || k->dk_nentries <= 0) return 0;
    k->dk_usable = 0; /* (CPython appends no name to it again) */
    struct frozen f = {type, (uintptr_t)k, k->dk_nentries, digest_of(k), seq}, *at = find(type);
    if (at) {
        if (at->keys != f.keys || at->n != f.n || at->digest != f.digest) { /* (another class at its address) */
            if (at->keys != f.keys) k->dk_refcnt += PIN;
            *at = f;
            nbykeys = 0;
        } else if (seq < at->seq) {
            at->seq = seq; /* (frozen for a portable walk, and now before a fork too) */
        }
        return 1;
    }
    k->dk_refcnt += PIN;
    if (ntab == captab) {
        size_t cap = captab ? 2 * captab : 256;
        struct frozen *nt = realloc(tab, cap * sizeof *nt);
        if (!nt) return -1;
        tab = nt;
        captab = cap;
    }
    size_t i = 0;
    while (i < ntab && tab[i].type < type) i++;
    memmove(&tab[i + 1], &tab[i], (ntab - i) * sizeof *tab);
    tab[i] = f;
    ntab++;
    nbykeys = 0; /* (its pointers into tab: sorted again at the next lookup) */
    return 1;
}

/* (cffi calls these without the GIL: each takes it) */
int clamor_py_freeze_keys(uintptr_t type, uint64_t seq) {
    PyGILState_STATE g = PyGILState_Ensure();
    int rc = freeze_keys(type, seq);
    PyGILState_Release(g);
    return rc;
}

void clamor_py_frozen_accept(uint64_t seq) {
    PyGILState_STATE g = PyGILState_Ensure();
    accepted = seq;
    PyGILState_Release(g);
}

static int frozen_entry(const struct frozen *f) {
    struct cl_dict_keys *k = class_keys((PyTypeObject *)f->type);
    return k && f->seq <= accepted && (uintptr_t)k == f->keys && k->dk_usable == 0 && k->dk_nentries == f->n &&
           digest_of(k) == f->digest;
}

int cl_py_frozen_class(PyTypeObject *t) {
    struct frozen *f = accepted ? find((uintptr_t)t) : NULL;
    return f && frozen_entry(f);
}


static int by_keys(const void *a, const void *b) {
    uintptr_t x = (*(struct frozen *const *)a)->keys, y = (*(struct frozen *const *)b)->keys;
    return x < y ? -1 : x > y;
}

int cl_py_frozen_keys(uintptr_t keys) {
    if (!accepted) return 0;
    if (nbykeys != ntab) { /* (entries were added since: sorted again) */
        struct frozen **nb = realloc(bykeys, (ntab ? ntab : 1) * sizeof *nb);
        if (!nb) return 0;
        bykeys = nb;
        for (size_t i = 0; i < ntab; i++) bykeys[i] = &tab[i];
        qsort(bykeys, ntab, sizeof *bykeys, by_keys);
        nbykeys = ntab;
    }
    size_t lo = 0, hi = nbykeys;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (bykeys[mid]->keys < keys)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < nbykeys && bykeys[lo]->keys == keys && frozen_entry(bykeys[lo]);
}

int clamor_py_frozen_keys(uintptr_t keys) {
    PyGILState_STATE g = PyGILState_Ensure();
    int rc = cl_py_frozen_keys(keys);
    PyGILState_Release(g);
    return rc;
}

int cl_py_frozen_instance(PyObject *o) { return cl_py_frozen_class(Py_TYPE(o)) && cl_py_frozen_layout(o); }

int cl_py_frozen_layout(PyObject *o) {
    PyObject *d = cl_py_instance_dict(o);
    if (!d) { /* (its attributes in its values table only: read through the class's table) */
#if PY_VERSION_HEX >= 0x030D0000
        return 0; /* (3.13's values lie inline: test_differential_updates read wrong with them taken) */
#else
        PyObject **v = cl_py_instance_values(o);
        return v && cl_in_region_span((uintptr_t)v, sizeof *v);
#endif
    }
    return cl_py_split_over_class(o, d) && cl_in_region_span((uintptr_t)d, 1) &&
           cl_in_region_span((uintptr_t)((PyDictObject *)d)->ma_values, sizeof(void *));
}

int cl_py_split_over_class(PyObject *o, PyObject *d) {
    PyDictObject *m = (PyDictObject *)d;
    return d && PyDict_CheckExact(d) && m->ma_values &&
           (uintptr_t)m->ma_keys == (uintptr_t)((PyHeapTypeObject *)Py_TYPE(o))->ht_cached_keys;
}

int clamor_py_frozen_split(uintptr_t obj) {
    PyGILState_STATE g = PyGILState_Ensure();
    PyObject *o = (PyObject *)obj, *d = cl_py_instance_dict(o);
    int rc = cl_py_frozen_class(Py_TYPE(o)) && (!d || cl_py_split_over_class(o, d));
    PyGILState_Release(g);
    return rc;
}

int clamor_py_frozen_instance(uintptr_t obj) {
    PyGILState_STATE g = PyGILState_Ensure();
    int rc = cl_py_frozen_instance((PyObject *)obj);
    PyGILState_Release(g);
    return rc;
}

static int keyed_instance(PyObject *o);

int clamor_py_instance_replace(uintptr_t obj, uintptr_t old, uintptr_t new_value) {
    PyGILState_STATE g = PyGILState_Ensure();
    PyObject *o = (PyObject *)obj;
    PyObject **v = cl_py_frozen_instance(o) || keyed_instance(o) ? cl_py_instance_values(o) : NULL;
    Py_ssize_t n = v ? ((struct cl_dict_keys *)((PyHeapTypeObject *)Py_TYPE(o))->ht_cached_keys)->dk_nentries : 0;
    int rc = 0;
    for (Py_ssize_t i = 0; i < n && !rc; i++) {
        if (v[i] != (PyObject *)old) continue;
        Py_INCREF((PyObject *)new_value);
        v[i] = (PyObject *)new_value;
        Py_DECREF((PyObject *)old);
        rc = 1;
    }
    PyGILState_Release(g);
    return rc;
}

/* ---- classes' tables for workers not forked ------------------------------------
 *
 * A worker not forked imports the class and builds its table itself.  A
 * portable walk (pywalk.c) takes a region instance whose attributes lie in
 * its region values table only (no dict made; before 3.13, whose values
 * lie inline) as it lies, when its class's table is frozen here (frozen now
 * if it is not yet: NOT_FORKED until a fork's freeze names it): the driver
 * then never lays an attribute out otherwise.  Each worker makes its own
 * class's table name the same attributes at the same places before a task
 * reads such an instance (classkeys.adopt, at the "classkeys" target the
 * walk numbered), and freezes it; one that cannot is refused there. */

#define NOT_FORKED UINT64_MAX

static int current(const struct frozen *f) {
    struct cl_dict_keys *k = class_keys((PyTypeObject *)f->type);
    return k && (uintptr_t)k == f->keys && k->dk_usable == 0 && k->dk_nentries == f->n && digest_of(k) == f->digest;
}

int cl_py_portable_layout(PyObject *o) {
#if PY_VERSION_HEX >= 0x030D0000
    (void)o;
    return 0;
#else
    if (cl_py_instance_dict(o)) return 0;
    PyObject **v = cl_py_instance_values(o);
    return v && cl_in_region_span((uintptr_t)v, sizeof *v);
#endif
}

int cl_py_portable_class(PyTypeObject *t) {
#if PY_VERSION_HEX >= 0x030D0000
    (void)t;
    return 0;
#else
    struct frozen *f = find((uintptr_t)t);
    if (f && current(f)) return 1;
    if (freeze_keys((uintptr_t)t, NOT_FORKED) != 1) return 0;
    f = find((uintptr_t)t);
    return f && current(f);
#endif
}

/* cl_py_portable_keys without the freeze: o as a portable walk took it. */
static int keyed_instance(PyObject *o) {
    struct frozen *f = cl_py_portable_layout(o) ? find((uintptr_t)Py_TYPE(o)) : NULL;
    return f && current(f);
}

int clamor_py_keyed_instance(uintptr_t obj) {
    PyGILState_STATE g = PyGILState_Ensure();
    int rc = keyed_instance((PyObject *)obj);
    PyGILState_Release(g);
    return rc;
}

int cl_py_portable_keys(PyObject *o) { return cl_py_portable_layout(o) && cl_py_portable_class(Py_TYPE(o)); }

int clamor_py_portable_keys(uintptr_t obj) {
    PyGILState_STATE g = PyGILState_Ensure();
    int rc = cl_py_portable_keys((PyObject *)obj);
    PyGILState_Release(g);
    return rc;
}

static PyObject *const *entries_of(const struct cl_dict_keys *k) {
    return (PyObject *const *)(k->dk_indices + ((size_t)1 << k->dk_log2_index_bytes));
}

/* Driver: the names of class `type`'s frozen table, in order, appended to
 * the list at `out`; its address, or 0 (not frozen as the walk took it). */
uintptr_t clamor_py_frozen_names(uintptr_t type, uintptr_t out) {
    PyGILState_STATE g = PyGILState_Ensure();
    struct frozen *f = find(type);
    uintptr_t rc = 0;
    if (f && current(f)) {
        const struct cl_dict_keys *k = (const struct cl_dict_keys *)f->keys;
        PyObject *const *e = entries_of(k);
        rc = f->keys;
        for (Py_ssize_t i = 0; i < k->dk_nentries && rc; i++)
            if (PyList_Append((PyObject *)out, e[2 * i]) < 0) {
                PyErr_Clear();
                rc = 0;
            }
    }
    PyGILState_Release(g);
    return rc;
}

/* Worker: how many of the tuple of strs `names` class `type`'s table holds
 * at their places, in order (its length: all); -1 if its table names
 * something else at one of them, has more, or is not a shared one.  GIL
 * held. */
static long prefix_of(PyTypeObject *type, PyObject *t) {
    const struct cl_dict_keys *k = class_keys(type);
    if (!k || k->dk_kind != 2 /* DICT_KEYS_SPLIT */ || k->dk_nentries > PyTuple_GET_SIZE(t)) return -1;
    PyObject *const *e = entries_of(k);
    long rc = (long)k->dk_nentries;
    for (Py_ssize_t i = 0; i < k->dk_nentries && rc >= 0; i++) {
        PyObject *a = e[2 * i], *b = PyTuple_GET_ITEM(t, i);
        if (!a || !PyUnicode_CheckExact(a) || !PyUnicode_CheckExact(b) || PyUnicode_Compare(a, b) != 0) rc = -1;
    }
    if (PyErr_Occurred()) {
        PyErr_Clear();
        rc = -1;
    }
    return rc;
}

long clamor_py_keys_prefix(uintptr_t type, uintptr_t names) {
    PyGILState_STATE g = PyGILState_Ensure();
    long rc = prefix_of((PyTypeObject *)type, (PyObject *)names);
    PyGILState_Release(g);
    return rc;
}

/* Worker: class `type`'s table frozen (and kept for good) if it names the
 * strs of the tuple `names` at their places, all of them and no more (one
 * hold of the GIL: no other thread appends between): its address, or 0. */
uintptr_t clamor_py_keys_freeze_at(uintptr_t type, uintptr_t names) {
    PyGILState_STATE g = PyGILState_Ensure();
    struct cl_dict_keys *k = class_keys((PyTypeObject *)type);
    uintptr_t rc = 0;
    if (k && prefix_of((PyTypeObject *)type, (PyObject *)names) == PyTuple_GET_SIZE((PyObject *)names)) {
        if (k->dk_usable) {
            k->dk_usable = 0;
            k->dk_refcnt += PIN;
        }
        rc = (uintptr_t)k;
    }
    PyGILState_Release(g);
    return rc;
}

/* Worker: class `type` takes the keys table of class `twin` (laid out as
 * the driver's: classkeys.adopt made it so), kept for good, after every
 * instance of `type` here that the call `objects()` (gc.get_objects) lists
 * is given its dict, made from its values over the old table; the caches
 * of attribute places the interpreter keeps for `type` are dropped.  All
 * in one hold of the GIL, the collector off: no thread makes an instance
 * over the old table in between, and no finalizer runs.  0, or -1 (no
 * shared tables, no memory). */
int clamor_py_keys_relayout(uintptr_t type, uintptr_t twin, uintptr_t objects) {
    PyGILState_STATE g = PyGILState_Ensure();
    PyHeapTypeObject *t = (PyHeapTypeObject *)type;
    struct cl_dict_keys *k = class_keys((PyTypeObject *)twin);
    int rc = -1, collecting = PyGC_Disable();
    PyObject *objs = k && k->dk_kind == 2 && class_keys((PyTypeObject *)type) ? PyObject_CallNoArgs((PyObject *)objects)
                                                                              : NULL;
    if (objs && PyList_CheckExact(objs)) {
        rc = 0;
        for (Py_ssize_t i = 0; i < PyList_GET_SIZE(objs) && !rc; i++) {
            PyObject *o = PyList_GET_ITEM(objs, i);
            if (Py_TYPE(o) != (PyTypeObject *)type) continue;
            PyObject *d = PyObject_GenericGetDict(o, NULL);
            if (d)
                Py_DECREF(d);
            else
                rc = -1;
        }
        if (!rc) {
            k->dk_usable = 0; /* (frozen as it comes in: no thread appends to it first) */
            k->dk_refcnt += PIN;
            t->ht_cached_keys = (void *)k; /* (the old one stays: the dicts made over it hold it) */
            PyType_Modified((PyTypeObject *)type);
        }
    }
    Py_XDECREF(objs);
    if (PyErr_Occurred()) PyErr_Clear();
    if (collecting) PyGC_Enable();
    PyGILState_Release(g);
    return rc;
}
#endif /* CLAMOR_WITH_PYTHON */
