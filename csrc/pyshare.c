/* pyshare.c -- what clamor.share() cannot see from Python.
 *
 * Built only into the Python extension (CLAMOR_WITH_PYTHON).  share() walks
 * the Python object graph; the memory an object points to without a Python
 * reference is invisible there: an ndarray's shape and strides buffer, a
 * list's item array, a dict's keys and values tables, a set's table, a
 * bytearray's buffer, a str's cached UTF-8.  A forked worker reads such a
 * pointer in its own copy of the driver's memory as it was at fork, so one
 * that leaves the region is read stale, silently.
 *
 * clamor_py_fields() reports those fields for the types share() knows.  For
 * the objects of extension types it does not know (a cKDTree, a deque, a
 * Decimal), clamor_py_scan() looks at every aligned word, the way a
 * conservative collector does: a word that points into the region leads to
 * another block to scan; one that points into the process's private
 * writable memory outside it is something share() cannot vouch for.
 */
#ifdef CLAMOR_WITH_PYTHON
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#define NPY_NO_DEPRECATED_API NPY_1_22_API_VERSION
#define PY_ARRAY_UNIQUE_SYMBOL clamor_ARRAY_API
#define NO_IMPORT_ARRAY
#include <numpy/arrayobject.h>

#include "internal.h"

static int put(uintptr_t *out, int n, int max, int code, const void *p) {
    if (p && n < max) {
        out[2 * n] = (uintptr_t)code;
        out[2 * n + 1] = (uintptr_t)p;
        return n + 1;
    }
    return n;
}

static int fields(PyObject *o, uintptr_t *out, int max) {
    int n = 0;
    if (PyArray_Check(o)) {
        PyArrayObject *a = (PyArrayObject *)o;
        n = put(out, n, max, CLAMOR_FIELD_DATA, PyArray_DATA(a));
        if (PyArray_NDIM(a) > 0) {
            n = put(out, n, max, CLAMOR_FIELD_DIMS, PyArray_DIMS(a));
            n = put(out, n, max, CLAMOR_FIELD_STRIDES, PyArray_STRIDES(a));
        }
    } else if (PyArray_DescrCheck(o)) {
        PyArray_Descr *d = (PyArray_Descr *)o;
        if (PyDataType_ISLEGACY(d)) {
            n = put(out, n, max, CLAMOR_FIELD_SUBARRAY, PyDataType_SUBARRAY(d));
            n = put(out, n, max, CLAMOR_FIELD_CMETA, PyDataType_C_METADATA(d));
        }
    } else if (PyList_Check(o)) {
        n = put(out, n, max, CLAMOR_FIELD_ITEMS, ((PyListObject *)o)->ob_item);
    } else if (PyDict_Check(o)) {
        n = put(out, n, max, CLAMOR_FIELD_KEYS, ((PyDictObject *)o)->ma_keys);
        n = put(out, n, max, CLAMOR_FIELD_VALUES, ((PyDictObject *)o)->ma_values);
    } else if (PyAnySet_Check(o)) {
        PySetObject *s = (PySetObject *)o;
        if (s->table != s->smalltable) n = put(out, n, max, CLAMOR_FIELD_TABLE, s->table);
    } else if (PyByteArray_Check(o)) {
        n = put(out, n, max, CLAMOR_FIELD_BUFFER, ((PyByteArrayObject *)o)->ob_bytes);
    } else if (PyUnicode_Check(o)) {
        PyASCIIObject *u = (PyASCIIObject *)o;
        if (!u->state.compact) n = put(out, n, max, CLAMOR_FIELD_DATA, ((PyUnicodeObject *)o)->data.any);
        if (!u->state.ascii) n = put(out, n, max, CLAMOR_FIELD_UTF8, ((PyCompactUnicodeObject *)o)->utf8);
#if PY_VERSION_HEX < 0x030C0000
        n = put(out, n, max, CLAMOR_FIELD_WSTR, u->wstr);
#endif
    }
    return n;
}

int clamor_py_fields(uintptr_t obj, uintptr_t *out, int max) {
    PyGILState_STATE g = PyGILState_Ensure();
    int n = cl_py_numpy_ready() < 0 ? -1 : fields((PyObject *)obj, out, max);
    if (n < 0) PyErr_Print();
    PyGILState_Release(g);
    return n;
}

/* A type made by a class statement (type.__new__) frees its instances
 * through CPython's subtype_dealloc, which it does not export; a type an
 * extension made has a dealloc of its own, whether static or made at run
 * time (PyType_FromSpec: collections.deque since 3.12, decimal.Decimal since
 * 3.13), and so do pybind11's.  A class made once shows which it is. */
static destructor class_dealloc;
/* The layout of the probe, a class of object with nothing declared: its
 * instances hold a dict and weak references, where this CPython puts them. */
static Py_ssize_t plain_basicsize, plain_dictoffset, plain_weaklistoffset;
static unsigned long plain_flags;
#define PLAIN_FLAGS (Py_TPFLAGS_MANAGED_DICT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HEAPTYPE)

int clamor_py_classes_init(void) {
    PyGILState_STATE g = PyGILState_Ensure();
    if (!class_dealloc) {
        PyObject *t = PyObject_CallFunction((PyObject *)&PyType_Type, "s()N", "clamor_probe", PyDict_New());
        if (t) {
            PyTypeObject *p = (PyTypeObject *)t;
            plain_basicsize = p->tp_basicsize;
            plain_dictoffset = p->tp_dictoffset;
            plain_weaklistoffset = p->tp_weaklistoffset;
            plain_flags = p->tp_flags & PLAIN_FLAGS;
            class_dealloc = p->tp_dealloc;
        } else {
            PyErr_Print();
        }
        Py_XDECREF(t);
    }
    PyGILState_Release(g);
    return class_dealloc ? 0 : -1;
}

bool cl_py_is_class(PyTypeObject *t) {
    if (!class_dealloc) return t->tp_flags & Py_TPFLAGS_HEAPTYPE; // (not yet known: the cautious answer)
    return t->tp_dealloc == class_dealloc;
}

int clamor_py_is_class(uintptr_t type) { return cl_py_is_class((PyTypeObject *)type); }

bool cl_py_plain_class(PyTypeObject *t) {
    if (!class_dealloc || t->tp_dealloc != class_dealloc || t->tp_itemsize || t->tp_basicsize != plain_basicsize ||
        t->tp_dictoffset != plain_dictoffset || t->tp_weaklistoffset != plain_weaklistoffset ||
        (t->tp_flags & PLAIN_FLAGS) != plain_flags || !(plain_flags & Py_TPFLAGS_MANAGED_DICT))
        return false;
    // no C type but object in the MRO (a mixin's C layout may match the size)
    PyObject *mro = t->tp_mro;
    if (!mro || !PyTuple_CheckExact(mro)) return false;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(mro); i++) {
        PyTypeObject *b = (PyTypeObject *)PyTuple_GET_ITEM(mro, i);
        if (b != &PyBaseObject_Type && b->tp_dealloc != class_dealloc) return false;
    }
    return true;
}

/* The words before a managed-dict instance's collector links (CPython
 * 3.11: values table at -4, dict at -3; 3.12: weak references at -4, dict
 * or values (tagged 1) at -3; 3.13: weak references at -4, dict at -3, the
 * values inline after the body). */
PyObject *cl_py_instance_dict(PyObject *o) {
    PyObject **pre = (PyObject **)o;
#if PY_VERSION_HEX < 0x030C0000
    return pre[-4] ? NULL : pre[-3];
#elif PY_VERSION_HEX < 0x030D0000
    return ((uintptr_t)pre[-3] & 1) ? NULL : pre[-3];
#else
    return pre[-3];
#endif
}

/* Give instance o the dict d, as `o.__dict__ = d` does (its type's
 * __dict__ setter).  Not PyObject_GenericSetDict: on CPython 3.13.0 that
 * leaves the values inline after the body in use, and the dict it
 * replaces over them, so an attribute set later is seen by the old dict
 * and not by the new one, and a walk reads the new one (a worker not
 * forked read no attributes at all; tests/test_instance_dicts.py). */
int cl_py_set_instance_dict(PyObject *o, PyObject *d) {
    static PyObject *name;
    if (!name && !(name = PyUnicode_InternFromString("__dict__"))) return -1;
    return PyObject_GenericSetAttr(o, name, d);
}

/* The value slots of such an instance whose attributes lie in a values
 * table only, no dict made (CPython 3.11: the table at -4; 3.12: at -3,
 * stored one byte below it, so odd; 3.13: inline after the body, while
 * valid), or NULL. */
PyObject **cl_py_instance_values(PyObject *o) {
    PyObject **pre = (PyObject **)o;
#if PY_VERSION_HEX < 0x030C0000
    return pre[-3] ? NULL : (PyObject **)pre[-4];
#elif PY_VERSION_HEX < 0x030D0000
    return ((uintptr_t)pre[-3] & 1) ? (PyObject **)((uintptr_t)pre[-3] + 1) : NULL;
#else
    if (pre[-3] || !(Py_TYPE(o)->tp_flags & Py_TPFLAGS_INLINE_VALUES)) return NULL;
    const uint8_t *v = (const uint8_t *)o + Py_TYPE(o)->tp_basicsize; /* capacity, size, embedded, valid */
    return v[3] ? (PyObject **)(v + 8) : NULL;
#endif
}

int clamor_py_instance_items(uintptr_t obj, uintptr_t out) {
    PyGILState_STATE g = PyGILState_Ensure();
    PyObject *o = (PyObject *)obj, *list = (PyObject *)out, **v = NULL;
    PyTypeObject *t = Py_TYPE(o);
    int n = -1;
    if ((t->tp_flags & Py_TPFLAGS_HEAPTYPE) && (t->tp_flags & Py_TPFLAGS_MANAGED_DICT) && PyList_CheckExact(list)) {
#if PY_VERSION_HEX >= 0x030D0000
        /* (3.13 visits inline values while they are valid, a dict made over them or not) */
        const uint8_t *iv = (t->tp_flags & Py_TPFLAGS_INLINE_VALUES) ? (const uint8_t *)o + t->tp_basicsize : NULL;
        v = iv && iv[3] ? (PyObject **)(iv + 8) : NULL;
#else
        v = cl_py_instance_values(o);
#endif
    }
    const struct cl_dict_keys *k = v ? (const struct cl_dict_keys *)((PyHeapTypeObject *)t)->ht_cached_keys : NULL;
    if (k && k->dk_kind == 2 /* DICT_KEYS_SPLIT */) {
        /* (a split table's entries: a name and an unused value slot each) */
        PyObject *const *e = (PyObject *const *)(k->dk_indices + ((size_t)1 << k->dk_log2_index_bytes));
        Py_ssize_t m = k->dk_nentries;
#if PY_VERSION_HEX >= 0x030D0000
        Py_ssize_t cap = ((const uint8_t *)v)[-8]; /* (the values' header: capacity first) */
        if (cap < m) m = cap;
#endif
        n = 0;
        for (Py_ssize_t i = 0; i < m && n >= 0; i++) {
            if (!v[i] || !e[2 * i]) continue;
            PyObject *pair = PyTuple_Pack(2, e[2 * i], v[i]);
            if (!pair || PyList_Append(list, pair) < 0) n = -2;
            else n++;
            Py_XDECREF(pair);
        }
        if (n == -2) PyErr_Clear();
    }
    PyGILState_Release(g);
    return n;
}

// Bytes of the object's own body: its type's basic size and its items.
size_t clamor_py_body_size(uintptr_t obj) {
    PyObject *o = (PyObject *)obj;
    size_t n = (size_t)Py_TYPE(o)->tp_basicsize;
#if PY_VERSION_HEX >= 0x030C0000
    // an int's size word is a tag since 3.12: the digit count, above the sign bits
    if (PyLong_Check(o))
        return n + sizeof(digit) * (size_t)(((PyLongObject *)o)->long_value.lv_tag >> _PyLong_NON_SIZE_BITS);
#endif
    if (Py_TYPE(o)->tp_itemsize) n += (size_t)Py_TYPE(o)->tp_itemsize * (size_t)Py_ABS(Py_SIZE(o));
    return n;
}

size_t clamor_py_scan(uintptr_t lo, size_t len, const uintptr_t *priv, size_t npriv, uintptr_t *inner,
                      size_t *ninner, size_t maxinner, uintptr_t *outer, size_t *nouter, size_t maxouter) {
    uintptr_t start = (lo + 7) & ~(uintptr_t)7, end = lo + len, prev = 0;
    size_t ni = 0, no = 0;
    uintptr_t p = start;
    for (; p + 8 <= end; p += 8) {
        uintptr_t w = *(const uintptr_t *)p;
        if (w < 4096) continue;
        if (cl_in_region(w)) {
            if ((w >= lo && w < end) || w == prev) continue; // into this block, or a repeat
            if (ni == maxinner) break;
            inner[ni++] = prev = w;
        } else if (cl_in_ranges(w, priv, npriv)) {
            if (no + 2 > maxouter) break;
            outer[no++] = p - lo;
            outer[no++] = w;
        }
    }
    *ninner = ni;
    *nouter = no / 2;
    return p + 8 > end ? len : p - lo;
}
/* portable._seeded: a str or bytes, or a tuple or frozenset holding one */
static int seeded_key(PyObject *k, int depth) {
    if (PyUnicode_Check(k) || PyBytes_Check(k)) return 1;
    if (depth >= 8) return 0;
    if (PyTuple_Check(k)) {
        for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(k); i++)
            if (seeded_key(PyTuple_GET_ITEM(k, i), depth + 1)) return 1;
    } else if (PyFrozenSet_Check(k)) {
        PySetObject *s = (PySetObject *)k;
        for (Py_ssize_t i = 0; i <= s->mask; i++)
            if (s->table[i].key && s->table[i].hash != -1 && seeded_key(s->table[i].key, depth + 1)) return 1;
    }
    return 0;
}

int cl_py_seeded_keys(PyObject *o) {
    if (PyDict_CheckExact(o)) {
        Py_ssize_t pos = 0;
        PyObject *k, *v;
        while (PyDict_Next(o, &pos, &k, &v))
            if (seeded_key(k, 0)) return 1;
    } else if (PyAnySet_CheckExact(o)) {
        PySetObject *s = (PySetObject *)o;
        for (Py_ssize_t i = 0; i <= s->mask; i++)
            if (s->table[i].key && s->table[i].hash != -1 && seeded_key(s->table[i].key, 0)) return 1;
    }
    return 0;
}

#endif /* CLAMOR_WITH_PYTHON */
