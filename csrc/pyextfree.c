/* pyextfree.c -- extension modules' free lists back to ordinary memory.
 *
 * Built only into the Python extension (CLAMOR_WITH_PYTHON).  Cython keeps,
 * for a class declared with @cython.freelist(N), up to N dead objects of
 * that class in a static array of its module and hands them to the next
 * objects made (pandas' BlockPlacement keeps 32).  A region object that
 * dies outside a heap() block goes there.  The driver's next object of the
 * class, made outside any block, is then region memory written where the
 * workers read; a forked worker inherits the array, and its own next
 * object lands on memory the driver has given to another (the worker died:
 * "object already tracked", or computed wrong).
 *
 * So before a fork each writable segment of every loaded module (its data
 * and .bss) is scanned for words that point at a dead region object: one
 * whose reference count is 0, in a live region block, whose type's
 * deallocator lies in that same module (a free list's entry is a dead
 * object of one of the module's own classes).  Each such word gets a dead
 * object of the same class outside the region, made by the type's own
 * allocator and untracked, as a free list's entries are; the region one
 * goes back to the region allocator.  A word that is no free list's but
 * meets all of that already pointed at a dead object, which no code may
 * follow.
 */
#ifdef CLAMOR_WITH_PYTHON
#define _GNU_SOURCE
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <link.h>
#include <stdint.h>
#include <string.h>

#include "internal.h"

struct ext_ctx {
    uintptr_t self_lo, self_hi;  /* clamor's own image: not scanned */
    const uint64_t *types;       /* every type object's address, sorted */
    size_t ntypes;
    long replaced, failed;
};

static int known_type(const struct ext_ctx *c, uintptr_t t) { return cl_sorted_has(c->types, c->ntypes, t); }

/* The dead region object `o` points at, or NULL. */
static PyObject *dead_region_object(uintptr_t w) {
    if ((w & 7) || !cl_in_region(w) || !cl_in_region(w + sizeof(PyObject) - 1)) return NULL;
    uintptr_t start;
    size_t len;
    if (clamor_block_of((const void *)w, &start, &len) != 0 || w + sizeof(PyObject) > start + len) return NULL;
    PyObject *o = (PyObject *)w;
    if (Py_REFCNT(o) != 0) return NULL;
    return o;
}

static int in_hull(uintptr_t a, const struct dl_phdr_info *info) {
    for (int i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        uintptr_t lo = info->dlpi_addr + ph->p_vaddr;
        if (ph->p_type == PT_LOAD && (ph->p_flags & PF_X) && a - lo < ph->p_memsz) return 1;
    }
    return 0;
}

static void replace(PyObject **slot, PyObject *o, struct ext_ctx *c) {
    PyTypeObject *t = Py_TYPE(o);
    PyObject *n = t->tp_alloc ? t->tp_alloc(t, 0) : NULL;
    if (!n) {
        PyErr_Clear();
        c->failed++;
        return;
    }
    if (PyObject_IS_GC(n)) PyObject_GC_UnTrack(n);
    Py_SET_REFCNT(n, 0);
    *slot = n;
    t->tp_free(o);
    c->replaced++;
}

static int one_module(struct dl_phdr_info *info, size_t size, void *arg) {
    struct ext_ctx *c = arg;
    /* the program itself and libpython: CPython's own lists (pyfreelist.c) */
    if (!info->dlpi_name || !info->dlpi_name[0] || strstr(info->dlpi_name, "libpython")) return 0;
    for (int i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        if (ph->p_type != PT_LOAD || !(ph->p_flags & PF_W)) continue;
        uintptr_t lo = (info->dlpi_addr + ph->p_vaddr + 7) & ~(uintptr_t)7;
        uintptr_t hi = (info->dlpi_addr + ph->p_vaddr + ph->p_memsz) & ~(uintptr_t)7;
        if (lo - c->self_lo < c->self_hi - c->self_lo) return 0;   /* clamor's own */
        for (uintptr_t a = lo; a < hi; a += 8) {
            PyObject *o = dead_region_object(*(uintptr_t *)a);
            if (!o || !known_type(c, (uintptr_t)Py_TYPE(o))) continue;
            PyTypeObject *t = Py_TYPE(o);
            /* a type object of this module whose deallocator is its code */
            if (!in_hull((uintptr_t)t->tp_dealloc, info) || !t->tp_free || t->tp_basicsize < (Py_ssize_t)sizeof(PyObject))
                continue;
            replace((PyObject **)a, o, c);
        }
    }
    return 0;
}

static int find_self(struct dl_phdr_info *info, size_t size, void *arg) {
    struct ext_ctx *c = arg;
    uintptr_t me = (uintptr_t)&find_self, lo, hi;
    cl_py_image_hull(info, &lo, &hi);
    if (lo < hi && me - lo < hi - lo) {
        c->self_lo = lo;
        c->self_hi = hi;
        return 1;
    }
    return 0;
}

/* Driver, before a fork, outside every block: the dead region objects on
 * extension modules' free lists are replaced by dead objects outside the
 * region (above).  types[0..ntypes): the address of every type object,
 * sorted (a word is read as an object only if its type is one of them).
 * Returns how many, or -1 (the error is printed); *failed: how many could
 * not be (their type's allocator failed). */
long clamor_py_ext_freelists_flush(const uint64_t *types, size_t ntypes, long *failed) {
    PyGILState_STATE g = PyGILState_Ensure();
    struct ext_ctx c = {0, 0, types, ntypes, 0, 0};
    long n;
    if (CL_IN_HEAP()) {
        PyErr_SetString(PyExc_RuntimeError, "clamor_py_ext_freelists_flush inside a heap block");
        PyErr_Print();
        n = -1;
    } else {
        dl_iterate_phdr(find_self, &c);
        dl_iterate_phdr(one_module, &c);
        n = c.replaced;
    }
    *failed = c.failed;
    PyGILState_Release(g);
    return n;
}

#endif /* CLAMOR_WITH_PYTHON */
