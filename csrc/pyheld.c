/* pyheld.c -- region objects that this process's own objects hold: before
 * pages change (a worker) and before a fork (the driver).
 *
 * Built only into the Python extension (CLAMOR_WITH_PYTHON).  A region
 * object's pages are the driver's; a reference to one from this process's
 * private memory, or a link of this process's collector through one, is
 * counted or followed in a copy that the driver may change under it.
 * clamor_py_untrack_region() takes such objects out of a worker's collector
 * before its pages change; clamor_py_held_from_outside() lists, before a
 * fork, the region objects the driver holds from outside the region, for
 * the caller to keep alive.
 */
#ifdef CLAMOR_WITH_PYTHON
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "internal.h"

static inline int in_region(const void *p) { return cl_in_region((uintptr_t)p); }

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

#endif /* CLAMOR_WITH_PYTHON */
