"""System calls on region memory.

The kernel raises no SIGSEGV when a system call touches a page that is not
present: read(), recv_into() and write() fail with EFAULT instead (see the
libsigsegv README).  These wrappers make the pages present first (a no-op on
the driver, where every page is).  For anything else, call
``clamor.prefetch(buf)`` before the call.
"""
import numpy as np

from .region import prefetch


def readinto(f, buf):
    """``f.readinto(buf)`` for a region buffer."""
    prefetch(buf)
    return f.readinto(buf)


def recv_into(sock, buf, nbytes=0, flags=0):
    """``sock.recv_into(buf, nbytes, flags)`` for a region buffer."""
    prefetch(buf)
    return sock.recv_into(buf, nbytes, flags)


def write(fd, buf):
    """``os.write(fd, buf)`` of a region buffer."""
    import os

    prefetch(buf)
    return os.write(fd, buf)


def fromfile(file, out, count=-1, sep=""):
    """Read ``file`` into the region array ``out`` (``np.fromfile`` semantics
    for dtype and count); returns the number of items read."""
    prefetch(out)
    flat = out.reshape(-1)
    n = flat.size if count < 0 else min(count, flat.size)
    if sep:
        data = np.fromfile(file, dtype=out.dtype, count=n, sep=sep)
        flat[: data.size] = data
        return data.size
    opened = isinstance(file, (str, bytes)) or hasattr(file, "__fspath__")
    f = open(file, "rb") if opened else file
    try:
        got = f.readinto(memoryview(flat[:n]).cast("B"))
    finally:
        if opened:
            f.close()
    return (got or 0) // out.dtype.itemsize
