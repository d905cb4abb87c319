/* pyufunc.c -- numpy's per-ufunc dispatch caches back to ordinary memory.
 *
 * Built only into the Python extension (CLAMOR_WITH_PYTHON).  A ufunc
 * caches, per combination of operand DTypes, the loop it dispatched to:
 * a hash table in C memory that numpy grows with PyMem_Calloc and frees
 * with PyMem_Free.  Called inside a heap() block with a new combination,
 * the table grows in the region.  A worker forked then inherits the
 * ufunc, which lives outside the region, pointing at region memory; once
 * the driver grows the table again outside a block, the region table is
 * freed and its memory given to other objects, and the worker's next
 * lookup probed their bytes for ever.  So before a fork each ufunc's table
 * moves outside (clamor_py_ufunc_caches_out).
 *
 * The table is numpy's private struct (numpy/_core/src/common/
 * npy_hashtable.h), in two layouts:
 *   1 (numpy 2.0 to 2.4): {int key_len; PyObject **buckets; npy_intp size;
 *      npy_intp nelem}, the buckets size * (key_len + 1) pointers;
 *   2 (numpy 2.5 on): {int key_len; struct buckets *buckets}, with
 *      struct buckets {struct buckets *prev; npy_intp size, nelem;
 *      PyObject *array[size * (key_len + 1)]}.
 * The caller names the layout from numpy's version; a table whose fields
 * do not read as that layout (sizes a power of two, counts in range, the
 * region block at least as long as the table) is left alone and counted.
 * The table holds no references (numpy's cache counts none), so moving it
 * is a copy.
 */
#ifdef CLAMOR_WITH_PYTHON
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define NPY_NO_DEPRECATED_API NPY_1_22_API_VERSION
#define PY_ARRAY_UNIQUE_SYMBOL clamor_ARRAY_API
#define NO_IMPORT_ARRAY
#define PY_UFUNC_UNIQUE_SYMBOL clamor_UFUNC_API
#define NO_IMPORT_UFUNC
#include <numpy/arrayobject.h>
#include <numpy/ufuncobject.h>

#include "internal.h"

struct buckets2 {
    struct buckets2 *prev;
    Py_ssize_t size, nelem;
    PyObject *array[];
};

static int power_of_two(Py_ssize_t n) { return n >= 1 && n <= (1 << 24) && (n & (n - 1)) == 0; }

/* The region block at p is at least `need` bytes long from p. */
static int block_holds(const void *p, size_t need) {
    uintptr_t start;
    size_t len;
    if (clamor_block_of(p, &start, &len) != 0) return 0;
    return (uintptr_t)p >= start && (uintptr_t)p - start + need <= len;
}

/* Move one table's buckets outside the region: 1 moved, 0 nothing to do,
 * -1 unreadable (left alone), -2 out of memory. */
static int move_out(void *table, int layout) {
    if (!table || cl_in_region((uintptr_t)table)) return 0;   /* (a region ufunc's table is versioned with it) */
    int key_len = *(int *)table;
    if (key_len < 1 || key_len > 64) return -1;
    void **slot = (void **)((char *)table + sizeof(void *));
    void *b = *slot;
    if (!b || !cl_in_region((uintptr_t)b)) return 0;
    if (layout == 1) {
        Py_ssize_t size = ((Py_ssize_t *)table)[2], nelem = ((Py_ssize_t *)table)[3];
        size_t bytes = (size_t)size * (size_t)(key_len + 1) * sizeof(PyObject *);
        if (!power_of_two(size) || nelem < 0 || nelem > size || !block_holds(b, bytes)) return -1;
        void *nb = PyMem_Calloc((size_t)size * (size_t)(key_len + 1), sizeof(PyObject *));
        if (!nb) return -2;
        memcpy(nb, b, bytes);
        *slot = nb;
        PyMem_Free(b);
        return 1;
    }
    struct buckets2 *old = b;
    size_t bytes = sizeof *old + (size_t)old->size * (size_t)(key_len + 1) * sizeof(PyObject *);
    if (!power_of_two(old->size) || old->nelem < 0 || old->nelem > old->size || old->prev ||
        !block_holds(b, bytes))
        return -1;
    void *nb = PyMem_Malloc(bytes);
    if (!nb) return -2;
    memcpy(nb, b, bytes);
    *slot = nb;
    PyMem_Free(b);
    return 1;
}

/* ufuncs: a list of numpy ufuncs; layout: 1 or 2 (above).  The calling
 * thread outside every block.  Returns how many tables moved, or -1 (the
 * error is printed); *unread: how many were left unread (a ufunc too
 * small to hold the fields of numpy 2's PyUFuncObject counts too). */
long clamor_py_ufunc_caches_out(uintptr_t ufuncs, int layout, long *unread) {
    const size_t offset = offsetof(PyUFuncObject, _dispatch_cache);
    PyGILState_STATE g = PyGILState_Ensure();
    long n = 0;
    *unread = 0;
    PyObject *l = (PyObject *)ufuncs;
    if (CL_IN_HEAP()) {
        PyErr_SetString(PyExc_RuntimeError, "clamor_py_ufunc_caches_out inside a heap block");
        n = -1;
    } else if (!PyList_Check(l) || (layout != 1 && layout != 2)) {
        PyErr_SetString(PyExc_TypeError, "clamor_py_ufunc_caches_out needs a list and layout 1 or 2");
        n = -1;
    }
    for (Py_ssize_t i = 0; n >= 0 && i < PyList_GET_SIZE(l); i++) {
        PyObject *u = PyList_GET_ITEM(l, i);
        if ((size_t)Py_TYPE(u)->tp_basicsize < offset + 2 * sizeof(void *)) {  /* (_dispatch_cache, _loops) */
            (*unread)++;
            continue;
        }
        int rc = move_out(*(void **)((char *)u + offset), layout);
        if (rc == 1) n++;
        else if (rc == -1) (*unread)++;
        else if (rc == -2) {
            PyErr_NoMemory();
            n = -1;
        }
    }
    if (n < 0) PyErr_Print();
    PyGILState_Release(g);
    return n;
}

#endif /* CLAMOR_WITH_PYTHON */
