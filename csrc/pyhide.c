/* pyhide.c -- the words of region objects a version shows workers as zero.
 *
 * Built only into the Python extension (CLAMOR_WITH_PYTHON).  Some words
 * of a region object point at what only the driver's process made for it
 * after a fork, outside the region:
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
 * region object, and makes its own references and descriptions.
 *
 * share()'s walk in C asks cl_py_to_hide() of each region object it checks
 * (pywalk.c), the Python walk asks clamor_py_hides() (clamor/memory/hidden.py),
 * and the driver begins each version through clamor_py_version_begin_hiding().
 */
#ifdef CLAMOR_WITH_PYTHON
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#define NPY_NO_DEPRECATED_API NPY_1_22_API_VERSION
#define PY_ARRAY_UNIQUE_SYMBOL clamor_ARRAY_API
#define NO_IMPORT_ARRAY
#include <numpy/arrayobject.h>
#include <errno.h>
#include <stddef.h>

#include "internal.h"

static inline int in_region(const void *p) { return cl_in_region((uintptr_t)p); }

/* numpy's C API, loaded once (pyheap.c); the test stays here, inline: every
 * object a walk approves asks it. */
static inline int numpy_ready(void) { return PyArray_API ? 0 : cl_py_numpy_ready(); }

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

#endif /* CLAMOR_WITH_PYTHON */
