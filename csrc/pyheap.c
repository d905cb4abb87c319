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
 *
 * What else the heap asks of CPython's objects has files of its own: tables
 * that grew across the region's edge (pyrehome.c), the words of region
 * objects a version hides (pyhide.c), and the region objects this process's
 * own objects hold (pyheld.c).
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

#endif /* CLAMOR_WITH_PYTHON */
