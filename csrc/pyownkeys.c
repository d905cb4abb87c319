/* pyownkeys.c -- instances given dicts with keys of their own
 * (walk._own_keys), in C.
 *
 * Built only into the Python extension (CLAMOR_WITH_PYTHON).  A walk in C
 * (pywalk.c) answers 2 at an instance of a plain class whose dict is not
 * its own yet (walk._owns_keys: a region dict, combined, its keys table in
 * the region too).  clamor_py_own_keys() then has the same walk
 * collect every such instance reachable (cl_py_walk_needing_keys) and gives
 * each, in one heap block, a region dict with a keys table of its own, as
 * walk._own_keys would; the caller walks again.
 *
 * A dict whose keys are strs outside the region that no worker inherits (an
 * attribute name compiled into a class made before any Cluster, held by
 * every instance's dict) gets region copies of them from clamor_py_rekey(),
 * as promote.rekey gives them, one copy of each key for all dicts.  The GIL
 * is held throughout.
 */
#ifdef CLAMOR_WITH_PYTHON
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

#define DICT_FREE_LIST_MAX 80 /* CPython's PyDict_MAXFREELIST */

static int str_keys(PyObject *d) {
    Py_ssize_t pos = 0;
    PyObject *k, *v;
    while (PyDict_Next(d, &pos, &k, &v))
        if (!PyUnicode_CheckExact(k)) return 0;
    return 1;
}

/* One non-str key set and deleted makes a split dict combined, with a keys
 * table of its own (a general one, which never comes from a free list). */
static int combine(PyObject *d, PyObject *key) {
    if (PyDict_SetItem(d, key, Py_None) < 0 || PyDict_DelItem(d, key) < 0) {
        PyErr_Clear();
        return -1;
    }
    return 0;
}

/* Instance o (held) gets a region dict with keys of its own, inside a heap
 * block; returns the conversions made, as walk._own_keys counts them.  Its
 * dict may come off CPython's free list, outside the region: then copies
 * are made until one is the allocator's, and those the free list gave are
 * kept in `spare` until the end.  A dict with a key other than an exact
 * str is left to the Python walk: no key's __eq__ runs here. */
static long own_keys(PyObject *o, PyObject *key, struct cl_py_stack *spare, int frozen) {
    PyObject *d = PyObject_GenericGetDict(o, NULL);
    long count = 0;
    if (!d) {
        PyErr_Clear();
        return 0;
    }
    if (!PyDict_CheckExact(d) || !str_keys(d) || cl_py_owns_keys(d)) goto out;
    count = 1;
    /* a class's keys frozen at the fork (pyclasskeys.c): the dict over
     * them, made here from the values (in the region), kept as it is; one
     * made outside the region (vars() or a pickle outside a block): a
     * region copy of it */
    int keep = frozen == 1 && cl_py_frozen_class(Py_TYPE(o)) && cl_py_split_over_class(o, d);
    if (keep && cl_py_frozen_layout(o)) goto out;
    keep = keep && PyDict_GET_SIZE(d) > 0; /* (a copy of an empty dict is a new empty one, not split) */
    if (!keep && (combine(d, key) < 0 || cl_py_owns_keys(d))) goto out;
    count = 2;
    for (int i = 0; i <= DICT_FREE_LIST_MAX; i++) {
        PyObject *c = PyDict_Copy(d);
        if (!c) {
            PyErr_Clear();
            break;
        }
        if (!cl_in_region_span((uintptr_t)c, (size_t)Py_TYPE(c)->tp_basicsize)) {
            if (cl_py_stack_push(spare, c) < 0) Py_DECREF(c);
            continue;
        }
        if (cl_py_set_instance_dict(o, c) < 0) {
            PyErr_Clear();
        } else {
            if (!keep) combine(c, key);
            if (cl_py_stack_push(spare, d) == 0) Py_INCREF(d); /* (kept off the free list: the next instance's is not it) */
        }
        Py_DECREF(c);
        count++;
        break;
    }
out:
    Py_DECREF(d);
    return count;
}

/* walk._own_keys for every region instance of a plain class reachable from
 * root through region objects of plain types and such instances (up to
 * `limit` objects), in one heap block, the collector off (nothing here runs
 * Python code or frees what the walk found).  Driver, before a stage's
 * version begins; Python's allocators wrapped (hooks.install).  frozen: a
 * walk for forked workers (1), which leaves the instances of classes whose
 * keys were frozen at the fork as they are (pyclasskeys.c), or for workers
 * not forked (2), which leaves those over a table frozen for them
 * (cl_py_portable_keys); 0 neither.  Returns the
 * conversions made (walk.conversions counts them), or a negative errno. */
long clamor_py_own_keys(uintptr_t root, long limit, int frozen) {
    PyGILState_STATE g = PyGILState_Ensure();
    struct cl_py_stack todo = {0}, spare = {0};
    long rc = cl_py_walk_needing_keys((PyObject *)root, limit, frozen, &todo);
    PyObject *key = rc || !todo.n ? NULL : PyLong_FromLong(-12345); /* (walk._NONSTR_KEY) */
    if (!rc && todo.n && !key) {
        PyErr_Clear();
        rc = -ENOMEM;
    }
    if (key) {
        int collecting = PyGC_Disable();
        int err = clamor_heap_enter();
        if (err) {
            rc = -err;
        } else {
            /* (the free lists hold region objects: a copy's key table is not one from outside) */
            if (cl_py_freelists_fill() < 0) {
                PyErr_Clear();
                rc = -ENOMEM;
            } else {
                for (size_t i = 0; i < todo.n; i++) rc += own_keys(todo.item[i], key, &spare, frozen);
            }
            clamor_heap_exit();
        }
        for (size_t i = 0; i < spare.n; i++) Py_DECREF(spare.item[i]); /* (back to the free list) */
        Py_DECREF(key);
        if (!err && cl_py_freelists_out() < 0) { /* (the fill's region objects and the dicts replaced: off them) */
            PyErr_Clear();
            rc = -ENOMEM;
        }
        if (collecting) PyGC_Enable();
    }
    free(spare.item);
    free(spare.tag);
    for (size_t i = 0; i < todo.n; i++) Py_DECREF(todo.item[i]);
    free(todo.item);
    free(todo.tag);
    PyGILState_Release(g);
    return rc;
}

/* A new str equal to the str k, or NULL (no memory). */
static PyObject *copy_str(PyObject *k) {
    Py_ssize_t n = PyUnicode_GET_LENGTH(k);
    PyObject *c = PyUnicode_New(n, PyUnicode_MAX_CHAR_VALUE(k));
    if (!c) {
        PyErr_Clear();
        return NULL;
    }
    memcpy(PyUnicode_DATA(c), PyUnicode_DATA(k), (size_t)n * PyUnicode_KIND(k));
    return c;
}

/* Refill the dict d in place, in order, each key found in keys[0..n)
 * (sorted) replaced by its copy; items: room for 2 * len(d) objects.  The
 * keys replaced, or -1: no memory for an item, and d holds those before it. */
static long refill(PyObject *d, const uint64_t *keys, PyObject *const *copies, size_t n, PyObject **items) {
    Py_ssize_t pos = 0, m = 0;
    PyObject *k, *v;
    long replaced = 0;
    while (PyDict_Next(d, &pos, &k, &v)) {
        ssize_t at = cl_sorted_find(keys, n, (uint64_t)(uintptr_t)k);
        if (at >= 0) {
            k = copies[at];
            replaced++;
        }
        Py_INCREF(k);
        Py_INCREF(v);
        items[2 * m] = k;
        items[2 * m + 1] = v;
        m++;
    }
    PyDict_Clear(d);
    int failed = 0;
    for (Py_ssize_t i = 0; i < m; i++) {
        if (!failed && PyDict_SetItem(d, items[2 * i], items[2 * i + 1]) < 0) failed = 1;
        Py_DECREF(items[2 * i]);
        Py_DECREF(items[2 * i + 1]);
    }
    if (failed) PyErr_Clear();
    return failed ? -1 : replaced;
}

/* keys: the addresses of exact strs of more than one character, ascending,
 * each held by the caller.  Driver, before a stage's version begins (the
 * dicts are written); Python's allocators wrapped (hooks.install).  A copy
 * made outside the region (it cannot be, but for a failed block) stops it
 * with -EFAULT before any dict is touched. */
long clamor_py_rekey(uintptr_t root, long limit, const uint64_t *keys, size_t nkeys) {
    PyGILState_STATE g = PyGILState_Ensure();
    struct cl_py_stack todo = {0};
    long total = 0;
    PyObject **copies = calloc(nkeys ? nkeys : 1, sizeof *copies), **items = NULL;
    long rc = copies ? cl_py_walk_holding_keys((PyObject *)root, limit, keys, nkeys, &todo)
                     : -ENOMEM;
    Py_ssize_t most = 0;
    for (size_t i = 0; i < todo.n; i++)
        if (PyDict_GET_SIZE(todo.item[i]) > most) most = PyDict_GET_SIZE(todo.item[i]);
    if (!rc && todo.n && !(items = malloc(2 * (size_t)most * sizeof *items + 1))) rc = -ENOMEM;
    if (!rc && todo.n) {
        int collecting = PyGC_Disable();
        int err = clamor_heap_enter();
        if (err) rc = -err;
        /* (the free lists hold region objects: a refilled dict's key table,
         * of the kind that list holds, is not one from outside) */
        if (!rc && cl_py_freelists_fill() < 0) {
            PyErr_Clear();
            rc = -ENOMEM;
        }
        for (size_t i = 0; !rc && i < nkeys; i++) {
            PyObject *k = (PyObject *)(uintptr_t)keys[i];
            if (!PyUnicode_CheckExact(k) || PyUnicode_GET_LENGTH(k) < 2) rc = -EINVAL;
            else if (!(copies[i] = copy_str(k))) rc = -ENOMEM;
            else if (!cl_in_region_span((uintptr_t)copies[i], (size_t)Py_TYPE(copies[i])->tp_basicsize)) rc = -EFAULT;
        }
        for (size_t i = 0; !rc && i < todo.n; i++) {
            long r = refill(todo.item[i], keys, copies, nkeys, items);
            rc = r < 0 ? -ENOMEM : 0;
            total += r;
        }
        if (!err) clamor_heap_exit();
        if (collecting) PyGC_Enable();
    }
    for (size_t i = 0; i < nkeys && copies; i++) Py_XDECREF(copies[i]);
    for (size_t i = 0; i < todo.n; i++) Py_DECREF(todo.item[i]);
    if (todo.n && cl_py_freelists_out() < 0) { /* (the fill's region objects and the tables replaced: off them) */
        PyErr_Clear();
        if (!rc) rc = -ENOMEM;
    }
    free(todo.item);
    free(todo.tag);
    free(items);
    free(copies);
    PyGILState_Release(g);
    return rc ? rc : total;
}

#endif /* CLAMOR_WITH_PYTHON */
