"""The one module that imports the compiled core.

It loads libzmq through pyzmq (so that one libzmq serves the process), hands
its path to the C core, and turns C error codes into typed exceptions with
``check``.  Everything else in clamor goes through ``ffi``, ``lib`` and
``check`` from here.
"""
import glob
import os

from . import errors

try:
    import zmq  # noqa: F401  (loads the libzmq that pyzmq ships)
except ImportError as err:  # pragma: no cover - depends on the install
    raise errors.BuildError("clamor needs pyzmq: pip install pyzmq") from err

try:
    from ._clamor import ffi, lib
except ImportError as err:  # pragma: no cover - depends on the install
    raise errors.BuildError(
        "clamor's compiled core is missing: install clamor with 'pip install .' "
        "(needs a C compiler; on Debian: apt-get install gcc python3-dev)"
    ) from err


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
