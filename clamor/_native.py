"""The one module that imports the compiled core.

It refuses a core built for another Python (``interpreter_problem``): the C
code reads CPython's objects through layouts of the version it was built
for.  It loads libzmq through pyzmq (so that one libzmq serves the process),
hands its path to the C core, and turns C error codes into typed exceptions
with ``check``; arrays C allocated and hands over become numpy arrays that
free them (``owned_array``).  Everything else in clamor goes through
``ffi``, ``lib`` and ``check`` from here.
"""
import glob
import os
import sys

import numpy as np

from . import errors

try:
    import zmq  # noqa: F401  (loads the libzmq that pyzmq ships)
except ImportError as err:  # pragma: no cover - depends on the install
    raise errors.BuildError("clamor needs pyzmq: pip install pyzmq") from err

try:
    from ._clamor import ffi, lib
except ImportError as err:  # pragma: no cover - depends on the install
    raise errors.BuildError(
        f"clamor's compiled core could not be loaded ({err}): install clamor with this interpreter, "
        "'pip install .' (needs a C compiler; on Debian: apt-get install gcc python3-dev)"
    ) from err


def minors(mask):
    """The minor versions of CPython 3 set in ``mask`` (bit m: 3.m)."""
    return [m for m in range(64) if mask >> m & 1]


def interpreter_problem(running, built_for, known):
    """Why a core built for ``built_for`` (a PY_VERSION_HEX) that knows the
    layouts of the minor versions in ``known`` (a mask, bit m for 3.m) cannot
    serve the interpreter ``running`` ((major, minor)), or None if it can.
    The C code reads CPython's objects through layouts that change with
    every minor version: read with another's, they read wrong, silently."""
    built = (built_for >> 24, built_for >> 16 & 0xFF)
    names = ", ".join(f"3.{m}" for m in minors(known))
    if tuple(running) != built:
        return (f"clamor's compiled core was built for Python {built[0]}.{built[1]}, and this is Python "
                f"{running[0]}.{running[1]}: reinstall clamor with this interpreter "
                f"(pip install . from its source tree, pip install -e . for a working copy); clamor supports "
                f"Python {names}")
    if running[0] != 3 or running[1] not in minors(known):
        return (f"clamor does not know the object layouts of Python {running[0]}.{running[1]} (it supports "
                f"Python {names}): use one of those")
    return None


try:
    _problem = interpreter_problem(sys.version_info[:2], lib.clamor_py_built_for(), lib.clamor_py_known_minors())
except AttributeError:  # a module from before the check: it cannot say what it was built for
    _problem = ("clamor's compiled core is older than its Python code: reinstall clamor with this interpreter "
                "(pip install . from its source tree, pip install -e . for a working copy)")
if _problem:
    raise errors.UnsupportedPython(f"{_problem} (the core is {sys.modules[__package__ + '._clamor'].__file__})")
del _problem
if lib.clamor_py_classes_init() != 0:  # pragma: no cover - making one class failed
    raise errors.BuildError("clamor's compiled core could not start: see the error printed above")


# cffi makes the function object for ``lib.name`` on first use and keeps it.
# Make them all now: one first used inside ``clamor.heap()`` would live in the
# region (and be gone with it, or read in a stale version by a worker).
for _name in dir(lib):
    getattr(lib, _name)
del _name


def last_error():
    """The C core's detail for this thread's last failure."""
    return ffi.string(lib.clamor_last_error()).decode("utf-8", "replace")


def error(rc, what="", classes=None):
    """The exception for C error code ``rc``."""
    cls = (classes or {}).get(rc) or errors.ERRNO_CLASSES.get(rc, errors.ClamorError)
    detail = last_error() or os.strerror(rc)
    msg = f"{what}: {detail}" if what else detail
    return cls(msg, rc)


def check(rc, what="", classes=None):
    """Raise the typed exception for a non-zero C return code."""
    if rc > 0:
        raise error(rc, what, classes)
    return rc


def _libzmq_path():
    """Path of the libzmq that pyzmq loaded into this process."""
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                path = line.rstrip("\n").split(" ", 5)[-1].strip()
                if "libzmq" in os.path.basename(path):
                    return path
    except OSError:  # pragma: no cover - /proc is always there on Linux
        pass
    import zmq as _z

    root = os.path.dirname(os.path.dirname(_z.__file__))
    found = sorted(glob.glob(os.path.join(root, "pyzmq.libs", "libzmq*.so*")))
    return found[0] if found else os.environ.get("CLAMOR_LIBZMQ", "")


LIBZMQ_PATH = _libzmq_path()
check(lib.clamor_zmq_load(LIBZMQ_PATH.encode()), "loading libzmq", {})


def owned_array(ptr, n, dtype):
    """A numpy view of ``n`` items of ``dtype`` at ``ptr``, memory C
    malloc'd and handed over: freed (clamor_py_buffer_free) with the
    view's last reference.  An empty array for none."""
    if not n or ptr == ffi.NULL:
        return np.zeros(0, dtype)
    size = n * np.dtype(dtype).itemsize
    return np.frombuffer(ffi.buffer(ffi.gc(ptr, lib.clamor_py_buffer_free, size=size), size), dtype=dtype)

