/* pyrehome.c -- tables that grew across the region's edge, moved back; a
 * weak reference copied into the region.
 *
 * Built only into the Python extension (CLAMOR_WITH_PYTHON).  Python's
 * allocators send a heap() block's requests to the region (pyheap.c); an
 * object's table follows whoever grows it.  clamor_py_rehome() gives the
 * interpreter's objects that grew a table in the region one outside again
 * at the end of a block.  clamor_py_table_in() and clamor_py_weakref_copy()
 * go the other way, inside a block: a region object's table made again in
 * the region, a weak reference copied into it.
 */
#ifdef CLAMOR_WITH_PYTHON
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>

#include "internal.h"

static inline int in_region(const void *p) { return cl_in_region((uintptr_t)p); }

/* ---- tables that grew into the region -----------------------------------------
 *
 * A dict or list made outside a block that grows inside it gets its new
 * table from the region: a module's globals assigned in the block, a
 * library's cache dict, a list appended to.  The object stays the
 * interpreter's, but its table is now region memory: a worker forked later
 * reads that table from the driver, and when the driver changes the object
 * after the block, the page is invalidated and the worker reads entries
 * that point at the driver's objects, which it does not have.  At the end
 * of a block each such object gets its table back outside the region.
 * A dict is swapped with a copy of itself made outside (PyDict_Copy makes
 * a fresh keys table), so that no other thread sees it empty; a list's
 * item array and a set's table are copied.  Only exact dicts that are not
 * split (an instance dict shares its class's keys), exact lists and exact
 * sets and frozensets are moved. */
static int rehome_dict(PyDictObject *d) {
    PyDictObject *c = (PyDictObject *)PyDict_Copy((PyObject *)d);
    if (!c) return -1;
    // not a plain table this time, or not where this thread allocates: leave it
    if (c->ma_values || in_region(c->ma_keys) != (cl_heap_depth > 0)) {
        Py_DECREF(c);
        return 0;
    }
    PyDictKeysObject *k = d->ma_keys;
    d->ma_keys = c->ma_keys;
    c->ma_keys = k;
    // (deprecated for extensions since 3.12, but CPython's own to keep right)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
#if PY_VERSION_HEX >= 0x030C0000
    /* the low bits of the tag are the dict's own: keep d's, take a new
     * version.  3.12: its watchers (8 bits); 3.13: and how many times it
     * changed while watched (4 more, pycore_dict.h) */
    const uint64_t own = PY_VERSION_HEX >= 0x030D0000 ? (1u << 12) - 1 : (1u << 8) - 1;
    d->ma_version_tag = (c->ma_version_tag & ~own) | (d->ma_version_tag & own);
#else
    d->ma_version_tag = c->ma_version_tag;
#endif
#pragma GCC diagnostic pop
    Py_DECREF(c); // frees the region table and drops the references it held
    return 1;
}

static int rehome_list(PyListObject *l) {
    size_t n = (size_t)l->allocated * sizeof(PyObject *);
    PyObject **items = PyMem_Malloc(n ? n : 1);
    if (!items) return -1;
    memcpy(items, l->ob_item, (size_t)Py_SIZE(l) * sizeof(PyObject *));
    PyObject **old = l->ob_item;
    l->ob_item = items;
    PyMem_Free(old);
    return 1;
}

/* a set's (or frozenset's) table: an ABC's caches of subclasses grow as
 * isinstance() is asked inside a block; its small table is inline */
static int rehome_set(PySetObject *s) {
    size_t n = ((size_t)s->mask + 1) * sizeof(setentry);
    setentry *table = PyMem_Malloc(n);
    if (!table) return -1;
    memcpy(table, s->table, n);
    setentry *old = s->table;
    s->table = table;
    PyMem_Free(old);
    return 1;
}

/* An ABC's caches (Modules/_abc.c, the same layout 3.11 to 3.13): the sets
 * of subclasses isinstance() has seen, made on first need, so inside a
 * block when the first check of that ABC runs there.  The ABC is the
 * interpreter's, outside the region; a worker forked later inherits its
 * pointers to region sets, and reads the driver's later changes to them
 * (weak references made outside the region after the fork, which it
 * does not have).  The two caches are replaced by empty sets made
 * outside (they refill on the next check); the registry of register()ed
 * classes is copied out. */
typedef struct {
    PyObject_HEAD
    PyObject *registry, *cache, *negative_cache;
    unsigned long long negative_cache_version;
} abc_data;

static int is_abc_data(PyObject *o) { return !strcmp(Py_TYPE(o)->tp_name, "_abc._abc_data"); }

static int abc_grown(PyObject *o) {
    abc_data *a = (abc_data *)o;
    return (a->registry && in_region(a->registry)) || (a->cache && in_region(a->cache)) ||
           (a->negative_cache && in_region(a->negative_cache));
}

static int rehome_abc(abc_data *a) {
    PyObject **slots[3] = {&a->registry, &a->cache, &a->negative_cache};
    for (int i = 0; i < 3; i++) {
        PyObject *old = *slots[i];
        if (!old || !in_region(old)) continue;
        PyObject *fresh = PySet_New(i == 0 ? old : NULL);
        if (!fresh) return -1;
        *slots[i] = fresh;
        Py_DECREF(old);
    }
    return 1;
}

static int grown(PyObject *o) {
    if (in_region(o)) return 0;
    if (is_abc_data(o)) return abc_grown(o);
    if (PySet_CheckExact(o) || PyFrozenSet_CheckExact(o))
        return ((PySetObject *)o)->table != ((PySetObject *)o)->smalltable && in_region(((PySetObject *)o)->table);
    if (PyDict_CheckExact(o)) return !((PyDictObject *)o)->ma_values && in_region(((PyDictObject *)o)->ma_keys);
    if (PyList_CheckExact(o)) return ((PyListObject *)o)->ob_item && in_region(((PyListObject *)o)->ob_item);
    return 0;
}

/* An instance outside the region whose dict was made in a block (vars(),
 * copy or pickle of it there): a worker forked later has the instance,
 * and reads the dict as the driver changes it.  Its dict is swapped for a
 * copy made outside.  (Found by the words before the instance's header:
 * CPython 3.13 does not show the dict to the collector while the values
 * after the instance's body are in use, so the instance kept no one from
 * freeing it.) */
static PyObject *region_instance_dict(PyObject *o) {
    if (in_region(o) || PyType_Check(o) || !(Py_TYPE(o)->tp_flags & Py_TPFLAGS_MANAGED_DICT)) return NULL;
    PyObject *d = cl_py_instance_dict(o);
    return d && PyDict_CheckExact(d) && in_region(d) ? d : NULL;
}

static int rehome_instance_dict(PyObject *o) {
    PyObject *d = region_instance_dict(o);
    if (!d) return 0;
    Py_INCREF(d);
    PyObject *c = PyDict_Copy(d);
    int rc = c ? cl_py_set_instance_dict(o, c) : -1;
    Py_XDECREF(c);
    Py_DECREF(d);
    return rc < 0 ? -1 : 1;
}

// gc does not track a dict that holds only atomic values: it is found as a
// referent of the tracked objects instead.
static int visit(PyObject *o, void *found) {
    return o && grown(o) ? PyList_Append((PyObject *)found, o) : 0;
}

/* A functools.lru_cache filled inside a block (pandas memoizes its take
 * functions so): its links and entries are region objects in the
 * interpreter's cache, and the cache reorders its links as it is used
 * after the block, pointing them at entries made outside.  A worker forked
 * later reads those region links as the driver has them: such caches are
 * cleared (memoized values are made again on the next call). */
static int is_lru(PyObject *o) { return !strcmp(Py_TYPE(o)->tp_name, "functools._lru_cache_wrapper"); }

static int visit_in_region(PyObject *o, void *hit) {
    if (o && in_region(o)) *(int *)hit = 1;
    return 0;
}

static int lru_in_region(PyObject *o) {
    int hit = 0;
    if (Py_TYPE(o)->tp_traverse) Py_TYPE(o)->tp_traverse(o, visit_in_region, &hit);
    return hit;
}

/* What to move, found by a look at one object (tracked; what it refers
 * to, for an untracked dict it holds). */
static int scan(PyObject *o, PyObject *found, PyObject *lrus) {
    if (is_lru(o) && !in_region(o) && lru_in_region(o) && PyList_Append(lrus, o) < 0) return -1;
    if (((grown(o) || region_instance_dict(o)) && PyList_Append(found, o) < 0) ||
        (Py_TYPE(o)->tp_traverse && Py_TYPE(o)->tp_traverse(o, visit, found) < 0))
        return -1;
    return 0;
}

/* CPython's PyGC_Head (3.11-3.13, pycore_gc.h): the two words before a
 * tracked object, its links in its generation's circular list; the low
 * two bits of prev are flags. */
struct gc_link {
    uintptr_t next, prev;
};
#define GC_LINK(w) ((struct gc_link *)((w) & ~(uintptr_t)3))

/* fn(o, arg) for every object in the lists heads[0..n) (GC_LINK
 * addresses), read by their links: no reference taken, so no object's
 * words are written (a region object's page is not logged as a write).
 * fn must not track, untrack or free an object.  -1 on a list whose links
 * do not agree (a node whose next does not point back to it), with an
 * error; or fn's -1. */
static int each_tracked(const uint64_t *heads, size_t n, int (*fn)(PyObject *, void *), void *arg) {
    for (size_t i = 0; i < n; i++) {
        struct gc_link *h = (struct gc_link *)(uintptr_t)heads[i], *g = GC_LINK(h->next);
        while (g != h) {
            struct gc_link *nx = GC_LINK(g->next);
            if (!nx || GC_LINK(nx->prev) != g) {
                PyErr_SetString(PyExc_RuntimeError, "the collector's lists do not read as expected");
                return -1;
            }
            if (fn((PyObject *)(g + 1), arg) < 0) return -1;
            g = nx;
        }
    }
    return 0;
}

struct scanning {
    PyObject *found, *lrus;
};

static int scan_one(PyObject *o, void *arg) {
    struct scanning *s = arg;
    return scan(o, s->found, s->lrus);
}

/* objs (a list), or else the lists heads[0..nheads). */
static Py_ssize_t rehome(PyObject *objs, const uint64_t *heads, size_t nheads) {
    PyObject *found = PyList_New(0);
    if (!found) return -1;
    PyObject *lrus = PyList_New(0);
    if (!lrus) {
        Py_DECREF(found);
        return -1;
    }
    int rc = 0;
    if (objs) {
        for (Py_ssize_t i = 0; i < PyList_GET_SIZE(objs) && !rc; i++) rc = scan(PyList_GET_ITEM(objs, i), found, lrus);
    } else {
        struct scanning s = {found, lrus};
        rc = each_tracked(heads, nheads, scan_one, &s);
    }
    if (rc < 0) {
        Py_DECREF(found);
        Py_DECREF(lrus);
        return -1;
    }
    Py_ssize_t moved = 0;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(lrus); i++) {
        PyObject *r = PyObject_CallMethod(PyList_GET_ITEM(lrus, i), "cache_clear", NULL);
        if (!r) {
            Py_DECREF(found);
            Py_DECREF(lrus);
            return -1;
        }
        Py_DECREF(r);
        moved++;
    }
    Py_DECREF(lrus);
    // moved only now: a dict being traversed must keep its table meanwhile
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(found); i++) {
        PyObject *o = PyList_GET_ITEM(found, i);
        int rc = region_instance_dict(o) ? rehome_instance_dict(o) : !grown(o) ? 0
                 : is_abc_data(o) ? rehome_abc((abc_data *)o)
                 : PyDict_CheckExact(o) ? rehome_dict((PyDictObject *)o)
                 : PyList_CheckExact(o) ? rehome_list((PyListObject *)o) : rehome_set((PySetObject *)o);
        if (rc < 0) {
            Py_DECREF(found);
            return -1;
        }
        moved += rc;
    }
    Py_DECREF(found);
    return moved;
}

/* objs: a list of objects (gc.get_objects()); the calling thread outside
 * every block.  Returns how many tables moved, or -1 (error printed). */
long clamor_py_rehome(uintptr_t objs) {
    PyGILState_STATE g = PyGILState_Ensure();
    long n = -1;
    if (cl_heap_depth) PyErr_SetString(PyExc_RuntimeError, "clamor_py_rehome inside a heap block");
    else if (!PyList_Check((PyObject *)objs)) PyErr_SetString(PyExc_TypeError, "clamor_py_rehome needs a list");
    else n = (long)rehome((PyObject *)objs, NULL, 0);
    if (n < 0) PyErr_Print();
    PyGILState_Release(g);
    return n;
}

/* clamor_py_rehome of every object the collector tracks in the lists
 * heads[0..n) (its generations', from clamor_py_gc_heads), read by their
 * links rather than gc.get_objects(), whose references would write every
 * object (see each_tracked).  The collector off meanwhile. */
long clamor_py_rehome_tracked(const uint64_t *heads, size_t n) {
    PyGILState_STATE g = PyGILState_Ensure();
    long moved = -1;
    if (cl_heap_depth) {
        PyErr_SetString(PyExc_RuntimeError, "clamor_py_rehome_tracked inside a heap block");
    } else {
        int collecting = PyGC_Disable();
        moved = (long)rehome(NULL, heads, n);
        if (collecting) PyGC_Enable();
    }
    if (moved < 0) PyErr_Print();
    PyGILState_Release(g);
    return moved;
}

/* The collector's three generations' list heads, as CPython 3.11-3.13 lays
 * them out (pycore_gc.h: struct gc_generation, a PyGC_Head, then two ints,
 * in an array): the youngest is the one a new list's links lead to.  The
 * caller checks them (every tracked object counted, once) before it relies
 * on them.  0, or -1 (error printed). */
int clamor_py_gc_heads(uint64_t *heads) {
#ifdef Py_GIL_DISABLED
    (void)heads;
    return -1; /* (no such lists in a build without the GIL) */
#else
    PyGILState_STATE g = PyGILState_Ensure();
    int rc = -1;
    PyObject *probe = PyList_New(0); /* tracked: the newest in the youngest generation */
    if (probe && PyObject_GC_IsTracked(probe)) {
        uintptr_t h0 = (uintptr_t)GC_LINK(((struct gc_link *)probe - 1)->next);
        for (int i = 0; i < 3; i++) heads[i] = h0 + (uint64_t)i * (sizeof(struct gc_link) + 2 * sizeof(int));
        rc = 0;
    } else if (!probe) {
        PyErr_Print();
    }
    Py_XDECREF(probe);
    PyGILState_Release(g);
    return rc;
#endif
}

struct counting {
    const uint64_t *sorted;
    size_t nsorted;
    long count;
};

static int count_one(PyObject *o, void *arg) {
    struct counting *c = arg;
    c->count += cl_sorted_has(c->sorted, c->nsorted, (uint64_t)(uintptr_t)o);
    return 0;
}

/* How many objects of sorted[0..nsorted) (addresses, ascending) the lists
 * heads[0..n) hold, read by their links (the check of clamor_py_gc_heads'
 * answer against gc.get_objects()); -1 if their links do not agree. */
long clamor_py_gc_count(const uint64_t *heads, size_t n, const uint64_t *sorted, size_t nsorted) {
    PyGILState_STATE g = PyGILState_Ensure();
    struct counting c = {sorted, nsorted, 0};
    long rc = each_tracked(heads, n, count_one, &c) < 0 ? -1 : c.count;
    if (rc < 0) PyErr_Clear();
    PyGILState_Release(g);
    return rc;
}

/* The other way, for one region object whose table grew outside the
 * region after its block (a cache filled on first use): the calling thread
 * inside a block, the table is made again there.  Returns 1 if it moved,
 * 0 if the object has no such table, -1 (error printed). */
long clamor_py_table_in(uintptr_t obj) {
    PyGILState_STATE g = PyGILState_Ensure();
    PyObject *o = (PyObject *)obj;
    long rc = 0;
    if (!cl_heap_depth) {
        PyErr_SetString(PyExc_RuntimeError, "clamor_py_table_in outside a heap block");
        rc = -1;
    } else if (PyDict_Check(o) && !((PyDictObject *)o)->ma_values && !in_region(((PyDictObject *)o)->ma_keys)) {
        rc = rehome_dict((PyDictObject *)o);
    } else if (PyList_Check(o) && ((PyListObject *)o)->ob_item && !in_region(((PyListObject *)o)->ob_item)) {
        rc = rehome_list((PyListObject *)o);
    } else if ((PySet_Check(o) || PyFrozenSet_Check(o)) && ((PySetObject *)o)->table != ((PySetObject *)o)->smalltable &&
               !in_region(((PySetObject *)o)->table)) {
        rc = rehome_set((PySetObject *)o);
    }
    if (rc < 0) PyErr_Print();
    PyGILState_Release(g);
    return rc;
}

/* A new weak reference to the referent of the live one at `ref`, made in
 * the region (the calling thread inside a block) and appended to the list
 * `out`.  CPython hands back the one basic reference a referent has, so
 * weakref.ref() cannot make it.  The copy joins the referent's list just
 * after `ref`, with its callback and hash; when `ref` dies (the caller
 * drops its only holder) the copy takes its place, at the head if `ref`
 * was there.  0, or -1 (error printed). */
long clamor_py_weakref_copy(uintptr_t ref, uintptr_t out) {
    PyGILState_STATE g = PyGILState_Ensure();
    PyWeakReference *old = (PyWeakReference *)ref;
    PyWeakReference *n = NULL;
    if (!cl_heap_depth)
        PyErr_SetString(PyExc_RuntimeError, "clamor_py_weakref_copy outside a heap block");
    else if (!PyList_Check((PyObject *)out))
        PyErr_SetString(PyExc_TypeError, "clamor_py_weakref_copy needs a list");
    else if (!PyWeakref_CheckRefExact((PyObject *)old))
        PyErr_SetString(PyExc_TypeError, "clamor_py_weakref_copy needs a weakref.ref");
    else if (old->wr_object == Py_None || old->wr_object == NULL)
        PyErr_SetString(PyExc_ValueError, "clamor_py_weakref_copy needs a live reference");
    else if ((n = PyObject_GC_New(PyWeakReference, &_PyWeakref_RefType)) != NULL) {
        memcpy((char *)n + sizeof(PyObject), (char *)old + sizeof(PyObject),
               sizeof(PyWeakReference) - sizeof(PyObject));
        Py_XINCREF(n->wr_callback);
        n->wr_prev = old;
        n->wr_next = old->wr_next;
        if (old->wr_next) old->wr_next->wr_prev = n;
        old->wr_next = n;
        PyObject_GC_Track((PyObject *)n);
    }
    long rc = n && PyList_Append((PyObject *)out, (PyObject *)n) == 0 ? 0 : -1;
    Py_XDECREF(n);
    if (rc < 0) PyErr_Print();
    PyGILState_Release(g);
    return rc;
}

#endif /* CLAMOR_WITH_PYTHON */
