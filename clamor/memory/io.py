"""System calls on region memory.

The kernel raises no SIGSEGV when a system call touches a page that is not
present: read(), recv_into() and write() fail with EFAULT instead (see the
libsigsegv README).  On a worker, these wrappers fetch the pages first; on
the driver, where the region is write-protected between stages (page
versions), they open the pages a read writes into.  Any other buffer is
passed straight through.  For other calls, use ``clamor.prefetch(buf)``
first.
"""
import io
import os
import stat

import numpy as np

from . import region as _region
from .region import prefetch


def _ready(buf):
    addr, n = _region._span(buf)
    if n and _region.size() and _region.contains(addr, n):
        prefetch(addr, n)


def readinto(f, buf):
    """``f.readinto(buf)``, for a region buffer too."""
    _ready(buf)
    return f.readinto(buf)


def recv_into(sock, buf, nbytes=0, flags=0):
    """``sock.recv_into(buf, nbytes, flags)``, for a region buffer too."""
    _ready(buf)
    return sock.recv_into(buf, nbytes, flags)


def write(fd, buf):
    """``os.write(fd, buf)``, of a region buffer too."""
    _ready(buf)
    return os.write(fd, buf)


def fromfile(file, out, count=-1, sep=""):
    """Read ``file`` into the region array ``out`` (``np.fromfile`` semantics
    for dtype and count); returns the number of items read."""
    _ready(out)
    flat = out.reshape(-1)
    n = flat.size if count < 0 else min(count, flat.size)
    if sep:
        data = np.fromfile(file, dtype=out.dtype, count=n, sep=sep)
        flat[: data.size] = data
        return data.size
    opened = isinstance(file, (str, bytes)) or hasattr(file, "__fspath__")
    f = open(file, "rb") if opened else file
    size = out.dtype.itemsize
    try:
        left = _bytes_left(f)
        if left is None:  # a stream: whole items only, as np.fromfile
            data = f.read(n * size) or b""
            k = len(data) // size
            flat.view(np.uint8)[: k * size] = np.frombuffer(data, np.uint8, k * size)
            return k
        n = min(n, left // size)  # a trailing part of an item is not read
        got = f.readinto(memoryview(flat[:n]).cast("B"))
    finally:
        if opened:
            f.close()
    return (got or 0) // size


def _bytes_left(f):
    """Bytes between the position of regular file ``f`` and its end; None
    for anything else (pipes, sockets, objects without a descriptor)."""
    try:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode):
            return None
        return max(0, st.st_size - f.tell())
    except (AttributeError, OSError, ValueError, io.UnsupportedOperation):
        return None
