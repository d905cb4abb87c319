/* pyknock.c -- park a thread that runs plain Python, at its next call.
 *
 * Built only into the Python extension (CLAMOR_WITH_PYTHON).  A resident of
 * the gate (pygate.c) is a thread of the driver that runs Python whenever it
 * likes; as a heap() block begins it must park, or what it frees feeds the
 * block's objects from CPython's free lists.  An event loop can be asked to
 * park with a callback.  A thread that runs a plain loop (Dask's profiler,
 * which samples the event loop's stack every 10 ms on Python 3.12 and
 * later) offers no such door, so clamor_py_knock() sets a one-shot profile
 * function on that thread: at its next call or return (a sleep() ending is
 * one), the thread puts back the profile function it had, parks until no
 * block is open, and hands the event to that function.
 *
 * Nothing is freed between the thread's wake-up and its park: the knock's
 * record is held until the park ends.  A thread that already has a knock
 * waiting is not knocked twice: the waiting one is for this block now.
 */
#ifdef CLAMOR_WITH_PYTHON
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <errno.h>
#include <stdlib.h>

#include "internal.h"

#if PY_VERSION_HEX >= 0x030D0000
/* exported by 3.11-3.13, declared in the public headers up to 3.12 */
PyAPI_FUNC(int) _PyEval_SetProfile(PyThreadState *tstate, Py_tracefunc func, PyObject *arg);
#endif

#define KNOCK "clamor.knock"

struct knock {
    const int *abort_;    /* the resident's: set once it is let in */
    unsigned long knocked; /* the gate's generation at the knock */
    Py_tracefunc saved;   /* the thread's profile function before the knock */
    PyObject *saved_obj;
};

static void knock_free(PyObject *cap) {
    struct knock *k = PyCapsule_GetPointer(cap, KNOCK);
    if (!k) {
        PyErr_Clear();
        return;
    }
    Py_XDECREF(k->saved_obj);
    free(k);
}

static int knock_hook(PyObject *obj, PyFrameObject *frame, int what, PyObject *arg) {
    struct knock *k = PyCapsule_GetPointer(obj, KNOCK);
    if (!k) return -1;
    Py_INCREF(obj);                               /* freed after the park, not before */
    Py_tracefunc saved = k->saved;
    PyObject *saved_obj = Py_XNewRef(k->saved_obj);
    PyEval_SetProfile(saved, saved_obj);
    Py_BEGIN_ALLOW_THREADS
    clamor_py_gate_park(k->abort_, k->knocked);
    Py_END_ALLOW_THREADS
    int rc = saved ? saved(saved_obj, frame, what, arg) : 0;
    Py_XDECREF(saved_obj);
    Py_DECREF(obj);
    return rc;
}

int clamor_py_knock(unsigned long thread_id, const int *abort_, unsigned long knocked) {
    PyGILState_STATE g = PyGILState_Ensure();
    PyThreadState *me = PyThreadState_Get();
    PyThreadState *ts = PyInterpreterState_ThreadHead(PyThreadState_GetInterpreter(me));
    while (ts && ts->thread_id != thread_id) ts = PyThreadState_Next(ts);
    int rc = 0;
    if (!ts || ts == me) {
        rc = -ESRCH;                              /* gone (or the caller itself) */
    } else if (ts->c_profilefunc == knock_hook) {   /* a knock not yet taken: for this block now */
        struct knock *k = PyCapsule_GetPointer(ts->c_profileobj, KNOCK);
        if (k) {
            k->abort_ = abort_;
            k->knocked = knocked;
        } else {
            PyErr_Clear();
        }
    } else {
        struct knock *k = malloc(sizeof *k);
        PyObject *cap = k ? PyCapsule_New(k, KNOCK, knock_free) : NULL;
        if (!cap) {
            free(k);
            PyErr_Clear();
            rc = -ENOMEM;
        } else {
            k->abort_ = abort_;
            k->knocked = knocked;
            k->saved = ts->c_profilefunc;
            k->saved_obj = Py_XNewRef(ts->c_profileobj);
            if (_PyEval_SetProfile(ts, knock_hook, cap) < 0) {
                PyErr_Clear();                    /* an audit hook said no */
                rc = -EPERM;
            }
            Py_DECREF(cap);                       /* the thread holds it now */
        }
    }
    PyGILState_Release(g);
    return rc;
}
#endif
