/* pyheap.c -- Python's allocators and numpy's data allocator into the region.
 *
 * Built only into the Python extension (CLAMOR_WITH_PYTHON), never into the
 * plain C library.  clamor_py_heap_install() wraps the three PyMem domains
 * (raw, mem, object) once: while the calling thread is inside
 * `with clamor.heap():` (cl_heap_depth > 0) a request goes to clamor_malloc;
 * otherwise to the allocator that was there before (pymalloc and friends),
 * unchanged.  Frees and reallocs are routed by address, so a region object
 * freed later, inside the block or not, goes back to the region allocator.
 * Wrapping after start-up is allowed because every pointer the old
 * allocator handed out still goes back to it (tracemalloc does the same).
 *
 * numpy keeps a small-buffer cache in its default data allocator, so a small
 * array made inside the block could reuse memory freed earlier outside the
 * region (measured: a KDTree's `maxes` array landed outside that way).
 * clamor's NEP 49 handler, set for the block's duration in the current
 * context, allocates straight from the region; arrays remember their handler,
 * so their data is freed through it wherever they die.  Array data is
 * allocated atomic (alloc.c): the conservative scan never reads it, and the
 * items of an object array are walked through the array by share().
 */
#ifdef CLAMOR_WITH_PYTHON
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#define NPY_NO_DEPRECATED_API NPY_1_22_API_VERSION
#define PY_ARRAY_UNIQUE_SYMBOL clamor_ARRAY_API
#include <numpy/arrayobject.h>
#include <errno.h>
#include <malloc.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>

#include "internal.h"

static PyMemAllocatorEx orig[3];
static int py_heap_install(void);
static int installed;

static inline int in_region(const void *p) { return cl_in_region((uintptr_t)p); }

static void *h_malloc(void *ctx, size_t n) {
    PyMemAllocatorEx *o = ctx;
    return CL_IN_HEAP() ? clamor_malloc(n ? n : 1) : o->malloc(o->ctx, n);
}

static void *h_calloc(void *ctx, size_t n, size_t sz) {
    PyMemAllocatorEx *o = ctx;
    return CL_IN_HEAP() ? clamor_calloc(n ? n : 1, sz ? sz : 1) : o->calloc(o->ctx, n, sz);
}

/* Region memory freed outside a block: region objects are dying in ordinary
 * code, and CPython's free lists and numpy's caches may be keeping some of
 * them (a dict's table is freed here, the dict goes on a free list).  The
 * driver empties those before it serializes a stage or forks. */
static _Atomic unsigned long dropped;

unsigned long clamor_py_region_dropped(void) { return atomic_load_explicit(&dropped, memory_order_relaxed); }

static void h_free(void *ctx, void *p) {
    PyMemAllocatorEx *o = ctx;
    if (p && in_region(p)) {
        if (cl_region.role == CLAMOR_ROLE_DRIVER) {
            if (!CL_IN_HEAP()) atomic_fetch_add_explicit(&dropped, 1, memory_order_relaxed);
            clamor_free(p);
        } else {
            CL_COUNT(region_frees, 1); /* workers never free region memory */
        }
        return;
    }
    o->free(o->ctx, p);
}

static void *h_realloc(void *ctx, void *p, size_t n) {
    PyMemAllocatorEx *o = ctx;
    if (p && in_region(p)) {
        if (cl_region.role == CLAMOR_ROLE_DRIVER) return clamor_realloc(p, n ? n : 1);
        /* a worker: a private copy; the region block stays.  Its old size
         * is the driver's to know: copy what can be read of n bytes. */
        void *q = o->malloc(o->ctx, n);
        if (q) memcpy(q, p, cl_prefetch_readable(p, n));
        return q;
    }
    if (CL_IN_HEAP() && p) {
        /* The old block's size is unknown to us for pymalloc blocks, so
         * grow through the old allocator first, then move. */
        void *tmp = o->realloc(o->ctx, p, n);
        if (!tmp) return NULL;
        void *q = clamor_malloc(n ? n : 1);
        if (!q) return tmp;
        memcpy(q, tmp, n);
        o->free(o->ctx, tmp);
        return q;
    }
    return CL_IN_HEAP() ? clamor_malloc(n ? n : 1) : o->realloc(o->ctx, p, n);
}

/* cffi releases the GIL around calls into this module: take it back. */
int clamor_py_heap_install(void) {
    PyGILState_STATE g = PyGILState_Ensure();
    int rc = py_heap_install();
    PyGILState_Release(g);
    return rc;
}

static int py_heap_install(void) {
    if (installed) return 0;
    PyMemAllocatorDomain doms[3] = {PYMEM_DOMAIN_RAW, PYMEM_DOMAIN_MEM, PYMEM_DOMAIN_OBJ};
    for (int i = 0; i < 3; i++) {
        PyMem_GetAllocator(doms[i], &orig[i]);
        PyMemAllocatorEx a = {&orig[i], h_malloc, h_calloc, h_realloc, h_free};
        PyMem_SetAllocator(doms[i], &a);
    }
    installed = 1;
    return 0;
}

/* ---- numpy (NEP 49) ------------------------------------------------------------ */

/* A process forked inside a block is a worker, with the handler still set
 * in its context: there it allocates as numpy's default would. */
static inline bool worker(void) { return cl_region.role != CLAMOR_ROLE_DRIVER; }
/* A thread a block started keeps the handler once the block closes: its
 * arrays are then ordinary memory. */
static inline bool outside_now(void) {
    return worker() || (!cl_heap_depth && cl_heap_adopted && !cl_adopted_open());
}

static void *n_malloc(void *ctx, size_t n) {
    (void)ctx;
    return outside_now() ? malloc(n ? n : 1) : clamor_malloc_atomic(n ? n : 1);
}
static void *n_calloc(void *ctx, size_t n, size_t sz) {
    (void)ctx;
    return outside_now() ? calloc(n ? n : 1, sz ? sz : 1) : clamor_calloc_atomic(n ? n : 1, sz ? sz : 1);
}
static void *n_realloc(void *ctx, void *p, size_t n) {
    (void)ctx;
    if (worker()) {
        if (!p || !in_region(p)) return realloc(p, n ? n : 1);
        void *q = malloc(n ? n : 1); /* a private copy; the region block stays */
        if (q) memcpy(q, p, cl_prefetch_readable(p, n));
        return q;
    }
    if (outside_now()) {   /* a thread a closed block started: out of the region */
        if (!p || !in_region(p)) return realloc(p, n ? n : 1);
        void *q = malloc(n ? n : 1);
        if (q) {
            size_t old = clamor_usable_size(p);
            memcpy(q, p, old < n ? old : n);
            clamor_free(p);
        }
        return q;
    }
    if (p && !in_region(p)) { /* an array from before, grown in the block */
        void *q = clamor_malloc_atomic(n ? n : 1);
        if (q) {
            size_t old = malloc_usable_size(p);
            memcpy(q, p, old < n ? old : n);
            free(p);
        }
        return q;
    }
    return clamor_realloc(p, n ? n : 1);
}
static void n_free(void *ctx, void *p, size_t sz) {
    (void)ctx;
    (void)sz;
    if (!p) return;
    if (in_region(p)) {
        if (cl_region.role == CLAMOR_ROLE_DRIVER) {
            if (!CL_IN_HEAP()) atomic_fetch_add_explicit(&dropped, 1, memory_order_relaxed);
            clamor_free(p);
        } else {
            CL_COUNT(region_frees, 1);
        }
        return;
    }
    free(p);
}


static PyDataMem_Handler handler = {
    "clamor_region", 1, {NULL, n_malloc, n_calloc, n_realloc, n_free}};
static PyObject *capsule;

static int numpy_ready(void) {
    if (PyArray_API) return 0;
    if (_import_array() < 0) return -1;
    return 0;
}

int cl_py_numpy_ready(void) { return numpy_ready(); }

/* Every array made in a block points at this capsule (its mem_handler), so
 * it must exist before workers are forked: made when clamor is imported. */
uintptr_t clamor_py_numpy_handler(void) {
    PyGILState_STATE g = PyGILState_Ensure();
    if (!capsule && !(capsule = PyCapsule_New(&handler, "mem_handler", NULL))) PyErr_Print();
    PyGILState_Release(g);
    return (uintptr_t)capsule;
}

/* ---- numpy's cache of shape buffers --------------------------------------------
 *
 * numpy keeps a few freed shape-and-strides buffers of each rank up to 7
 * (npy_alloc_cache_dim: 7 or 15 per size depending on the version) in a
 * static table of its own, and hands them to the next arrays of that rank.
 * A buffer freed before a heap() block would hold the shape of an array
 * made inside it, outside the region: a forked worker then reads its own
 * stale copy of that address (np.arange(7) made under heap() read as shape
 * (2,)).  The table is out of reach, so the flush goes through numpy
 * itself: arrays of each rank are made until that bucket is surely empty;
 * those whose buffers lie on the side being entered are freed first and
 * refill it; the rest find it full and go back to their own allocator. */
#define DIM_RANKS 7     // numpy caches sizes below 16 words: 2 * ndim, ndim <= 7
#define DIM_DRAIN 40    // more than any numpy's bucket holds

static int dims_flush(int inside) {
    npy_intp shape[DIM_RANKS] = {0};
    PyObject *held[DIM_DRAIN];
    for (int nd = 1; nd <= DIM_RANKS; nd++) {
        int n = 0;
        while (n < DIM_DRAIN && (held[n] = PyArray_SimpleNew(nd, shape, NPY_UINT8))) n++;
        for (int pass = 0; pass < 2; pass++) {
            for (int i = 0; i < n; i++) {
                if (!held[i]) continue;
                int here = in_region(PyArray_DIMS((PyArrayObject *)held[i])) == inside;
                if (here == (pass == 0)) Py_CLEAR(held[i]);
            }
        }
        if (n < DIM_DRAIN) return -1; // the Python error is set
    }
    return 0;
}

/* 0, or -1 (the Python error is printed). */
int clamor_py_numpy_dims_flush(int inside) {
    PyGILState_STATE g = PyGILState_Ensure();
    int rc = numpy_ready() < 0 ? -1 : dims_flush(inside);
    if (rc) PyErr_Print();
    PyGILState_Release(g);
    return rc;
}

/* Per-thread stack of the handlers current before each heap() entry. */
#define MAXNEST 64
static __thread PyObject *saved[MAXNEST];
static __thread int nsaved;

static int numpy_enter(void);
static int numpy_exit(void);

/* 0, or -1 (the Python error is printed: cffi callers get a plain code). */
int clamor_py_numpy_enter(void) {
    PyGILState_STATE g = PyGILState_Ensure();
    int rc = numpy_enter();
    if (rc) PyErr_Print();
    PyGILState_Release(g);
    return rc;
}

int clamor_py_numpy_exit(void) {
    PyGILState_STATE g = PyGILState_Ensure();
    int rc = numpy_exit();
    if (rc) PyErr_Print();
    PyGILState_Release(g);
    return rc;
}

int clamor_py_numpy_suspend(void) {
    PyGILState_STATE g = PyGILState_Ensure();
    int rc = -1;
    if (numpy_ready() < 0) {
        /* the Python error is set */
    } else if (nsaved == MAXNEST) {
        PyErr_SetString(PyExc_RecursionError, "clamor.heap() nested too deeply");
    } else {
        PyObject *prev = PyDataMem_SetHandler(NULL); /* numpy's default */
        if (prev) {
            saved[nsaved++] = prev;
            rc = 0;
        }
    }
    if (rc) PyErr_Print();
    PyGILState_Release(g);
    return rc;
}

static int numpy_enter(void) {
    if (numpy_ready() < 0) return -1;
    if (!capsule && !(capsule = PyCapsule_New(&handler, "mem_handler", NULL))) return -1;
    if (nsaved == MAXNEST) {
        PyErr_SetString(PyExc_RecursionError, "clamor.heap() nested too deeply");
        return -1;
    }
    PyObject *prev = PyDataMem_SetHandler(capsule);
    if (!prev) return -1;
    saved[nsaved++] = prev;
    return 0;
}

static int numpy_exit(void) {
    if (nsaved == 0) return 0;
    PyObject *prev = saved[--nsaved];
    PyObject *mine = PyDataMem_SetHandler(prev);
    Py_DECREF(prev);
    if (!mine) return -1;
    Py_DECREF(mine);
    return 0;
}
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

static Py_ssize_t rehome(PyObject *objs) {
    PyObject *found = PyList_New(0);
    if (!found) return -1;
    PyObject *lrus = PyList_New(0);
    if (!lrus) {
        Py_DECREF(found);
        return -1;
    }
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(objs); i++) {
        PyObject *o = PyList_GET_ITEM(objs, i);
        if (is_lru(o) && !in_region(o) && lru_in_region(o) && PyList_Append(lrus, o) < 0) {
            Py_DECREF(found);
            Py_DECREF(lrus);
            return -1;
        }
        if ((grown(o) && PyList_Append(found, o) < 0) ||
            (Py_TYPE(o)->tp_traverse && Py_TYPE(o)->tp_traverse(o, visit, found) < 0)) {
            Py_DECREF(found);
            return -1;
        }
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
        int rc = !grown(o) ? 0 : is_abc_data(o) ? rehome_abc((abc_data *)o)
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

/* -- words a version shows workers as zero --------------------------------
 * Some words of a region object point at what only the driver's process
 * made for it after a fork, outside the region:
 *  - its list of weak references (HIDE_WEAKLIST), which starts in its body:
 *    with a weak reference the driver made outside heap(), weakref.ref()
 *    on a forked worker takes the driver's for its own basic reference, or
 *    links a new one to it, and writes through it;
 *  - an array's cached buffer description (HIDE_BUFFER_INFO), numpy's,
 *    made when the driver first exported the buffer (a Cython memoryview):
 *    the worker's export reads the driver's pointer (pandas' take died).
 * A version's pages show workers those words zero: the driver clears
 * them, begins the version, and puts them back, holding the GIL throughout
 * (the write after the version began leaves the cleared bytes as the version
 * its tasks read).  Zero is always right for a worker: it never frees a
 * region object, and makes its own references and descriptions. */
#define HIDE_WEAKLIST 1
#define HIDE_BUFFER_INFO 2

static PyWeakReference **weaklist_of(PyObject *o) {
    PyTypeObject *t = Py_TYPE(o);
    if (!t->tp_weaklistoffset || PyType_Check(o)) return NULL;
    return (PyWeakReference **)((char *)o + t->tp_weaklistoffset);
}

void *cl_py_weaklist_head(PyObject *o) {
    PyWeakReference **head = weaklist_of(o);
    return head ? (void *)*head : NULL;
}

static int leads_out(PyWeakReference **head) {
    for (PyWeakReference *r = *head; r; r = r->wr_next)
        if (!in_region(r)) return 1;
    return 0;
}

static void **buffer_info_of(PyObject *o) {
    if (numpy_ready() < 0) {
        PyErr_Clear();
        return NULL;
    }
    return PyArray_Check(o) ? (void **)((char *)o + offsetof(PyArrayObject_fields, _buffer_info)) : NULL;
}

/* Which words of `o` (a live region object) to hide now: HIDE_* bits;
 * *weak and *info get their addresses. */
int cl_py_to_hide(PyObject *o, void ***weak, void ***info) {
    int kinds = 0;
    PyWeakReference **head = weaklist_of(o);
    if (head && in_region(head) && *head && PyWeakref_Check((PyObject *)*head) && (*head)->wr_object == o &&
        leads_out(head)) {
        *weak = (void **)head;
        kinds |= HIDE_WEAKLIST;
    }
    void **bi = buffer_info_of(o);
    if (bi && *bi && !in_region((void *)((uintptr_t)*bi & ~(uintptr_t)7))) {
        *info = bi;
        kinds |= HIDE_BUFFER_INFO;
    }
    return kinds;
}

/* The HIDE_* bits of the words of region object `obj` that a version would
 * hide now (0: none). */
int clamor_py_hides(uintptr_t obj) {
    PyGILState_STATE g = PyGILState_Ensure();
    PyObject *o = (PyObject *)obj;
    void **weak, **info;
    int rc = in_region(o) ? cl_py_to_hide(o, &weak, &info) : 0;
    PyGILState_Release(g);
    return rc;
}

/* Driver: clamor_version_begin(version) with the words to hide of the region
 * objects at objs[i] (of type types[i], as a walk saw them) shown zero to
 * the version.  An entry no longer such an object, or with nothing to hide,
 * gets state[i] = 0 (the caller forgets it), the others 1.  Returns
 * clamor_version_begin's result. */
int clamor_py_version_begin_hiding(uint32_t version, const uint64_t *objs, const uint64_t *types, int8_t *state,
                                 size_t n) {
    PyGILState_STATE g = PyGILState_Ensure();
    void ***words = n ? PyMem_RawCalloc(2 * n, sizeof *words) : NULL;
    void **saved = n ? PyMem_RawCalloc(2 * n, sizeof *saved) : NULL;
    if (n && (!words || !saved)) {
        PyMem_RawFree(words);
        PyMem_RawFree(saved);
        PyGILState_Release(g);
        return cl_err(ENOMEM, "no memory for the words to hide");
    }
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        PyObject *o = (PyObject *)(uintptr_t)objs[i];
        void **weak = NULL, **info = NULL;
        state[i] = in_region(o) && in_region((char *)o + sizeof(PyObject) - 1) &&
                   (uint64_t)(uintptr_t)Py_TYPE(o) == types[i] && Py_REFCNT(o) > 0 && cl_py_to_hide(o, &weak, &info);
        if (weak) words[k++] = weak;
        if (info) words[k++] = info;
    }
    for (size_t i = 0; i < k; i++) {
        saved[i] = *words[i];
        *words[i] = NULL;
    }
    int rc = clamor_version_begin(version);
    for (size_t i = 0; i < k; i++) *words[i] = saved[i];
    PyMem_RawFree(words);
    PyMem_RawFree(saved);
    PyGILState_Release(g);
    return rc;
}

/* The pages being dropped, sorted: does `o` (its header) lie on one? */
struct dropping {
    const uint64_t *pages;
    size_t n;
    uint64_t first, count;  /* and the pages [first, first+count) */
    int hit;
};

static int on_dropped_page(const void *o, const struct dropping *d) {
    if (!in_region(o)) return 0;
    uint64_t p = cl_page_of((uintptr_t)o);
    return p - d->first < d->count || cl_sorted_has(d->pages, d->n, p);
}

static int visit_dropped(PyObject *o, void *arg) {
    struct dropping *d = arg;
    if (on_dropped_page(o, d) || on_dropped_page((const char *)o + sizeof(PyObject) - 1, d)) {
        d->hit = 1;
        return 1;   /* (stops the traversal) */
    }
    return 0;
}

/* Worker, before pages change.
 *
 * Region objects the collector of this process tracks (a region dict that
 * got a container value in a task, a region object the driver tracked at a
 * fork) live in its lists by links in region pages.  When those pages are
 * dropped and fetched again the links are the driver's, and the next
 * collection walks into them.  So each such object leaves the lists (a
 * worker's region objects are never freed here, so the collector has
 * nothing to do with them).
 *
 * An object of this process that holds a region object on a page being
 * dropped (pages[0..npages), sorted, and [first, first+count)) is kept for good
 * and leaves the lists too.  Its reference was counted in this worker's
 * copy of the page only: released later, it would count down the driver's
 * object, or whatever the driver put there since.  And a task may have
 * stored it in a region object (pandas caches an Index's engine in the
 * Index's _cache): that reference goes with the page, the object outlives
 * it, and the collector would follow its pointer into memory the driver
 * reused (a spawned worker crashed there).
 *
 * objs: gc.get_objects().  Returns how many objects left the lists, or -1.
 * *kept: how many of them are this process's objects, kept. */
long clamor_py_untrack_region(uintptr_t objs, const uint64_t *pages, size_t npages, uint64_t first, uint64_t count,
                              long *kept) {
    PyGILState_STATE g = PyGILState_Ensure();
    long n = 0;
    *kept = 0;
    PyObject *l = (PyObject *)objs;
    if (!PyList_Check(l)) {
        PyErr_SetString(PyExc_TypeError, "clamor_py_untrack_region needs a list");
        n = -1;
    }
    struct dropping d = {pages, npages, first, count, 0};
    for (Py_ssize_t i = 0; n >= 0 && i < PyList_GET_SIZE(l); i++) {
        PyObject *o = PyList_GET_ITEM(l, i);
        if (!PyObject_IS_GC(o) || !PyObject_GC_IsTracked(o)) continue;
        if (in_region(o)) {
            PyObject_GC_UnTrack(o);
            n++;
            continue;
        }
        traverseproc trav = Py_TYPE(o)->tp_traverse;
        if ((!npages && !count) || !trav) continue;
        d.hit = 0;
        trav(o, visit_dropped, &d);
        if (d.hit) {
            Py_INCREF(o);
            PyObject_GC_UnTrack(o);
            n++;
            (*kept)++;
        }
    }
    if (n < 0) PyErr_Print();
    PyGILState_Release(g);
    return n;
}

/* Driver, before a fork: the region objects this process holds from
 * outside the region.
 *
 * A forked worker inherits the driver's private memory as it is at the
 * fork: a module's globals, a library's cache, a thread's attributes.
 * Where those hold a region object (a counter a block set, a str a block
 * stored in a module's dict), the worker keeps the reference, while the
 * driver may drop it later, free the object and give its memory to
 * another: the worker would then read the other object in its place (an
 * int became another int, a str became an array).  The caller keeps each
 * object listed alive while workers forked now may live.
 *
 * Each object of objs (gc.get_objects()) outside the region is traversed;
 * a region object it refers to goes to out, and a container outside the
 * region that the collector does not track (a tuple or dict of atoms) is
 * traversed in turn.  Returns how many were listed (repeats included), or
 * -1 (error printed). */
struct held {
    PyObject *out;
    int depth;
    int failed;
};

static int visit_held(PyObject *o, void *arg) {
    struct held *h = arg;
    if (!o || h->failed) return 0;
    if (in_region(o)) {
        if (PyList_Append(h->out, o) < 0) h->failed = 1;
    } else if (PyObject_IS_GC(o) && !PyObject_GC_IsTracked(o) && Py_TYPE(o)->tp_traverse && h->depth < 32) {
        h->depth++;   /* (untracked containers hold atoms and untracked containers only: no cycle) */
        Py_TYPE(o)->tp_traverse(o, visit_held, h);
        h->depth--;
    }
    return 0;
}

long clamor_py_held_from_outside(uintptr_t objs, uintptr_t out) {
    PyGILState_STATE g = PyGILState_Ensure();
    long n = -1;
    PyObject *l = (PyObject *)objs, *o = (PyObject *)out;
    if (!PyList_Check(l) || !PyList_Check(o)) {
        PyErr_SetString(PyExc_TypeError, "clamor_py_held_from_outside needs two lists");
    } else {
        struct held h = {o, 0, 0};
        Py_ssize_t before = PyList_GET_SIZE(o);
        for (Py_ssize_t i = 0; !h.failed && i < PyList_GET_SIZE(l); i++) {
            PyObject *x = PyList_GET_ITEM(l, i);
            if (x == o || in_region(x) || !Py_TYPE(x)->tp_traverse) continue;
            Py_TYPE(x)->tp_traverse(x, visit_held, &h);
        }
        if (!h.failed) n = (long)(PyList_GET_SIZE(o) - before);
    }
    if (n < 0) PyErr_Print();
    PyGILState_Release(g);
    return n;
}

/* objs: a list of objects (gc.get_objects()); the calling thread outside
 * every block.  Returns how many tables moved, or -1 (error printed). */
long clamor_py_rehome(uintptr_t objs) {
    PyGILState_STATE g = PyGILState_Ensure();
    long n = -1;
    if (cl_heap_depth) PyErr_SetString(PyExc_RuntimeError, "clamor_py_rehome inside a heap block");
    else if (!PyList_Check((PyObject *)objs)) PyErr_SetString(PyExc_TypeError, "clamor_py_rehome needs a list");
    else n = (long)rehome((PyObject *)objs);
    if (n < 0) PyErr_Print();
    PyGILState_Release(g);
    return n;
}

#endif /* CLAMOR_WITH_PYTHON */
