"""``with clamor.heap():`` -- every allocation of this thread lands in the region.

Inside the block, on the driver, the current thread's allocations go to the
region allocator:

- Python objects: all three PyMem domains are wrapped (once, on first use);
- numpy array data: clamor's NEP 49 handler is set for the block, bypassing
  numpy's small-buffer cache (which would hand back memory freed earlier,
  outside the region);
- C and C++ heap calls of extension modules (malloc, calloc, realloc, free,
  posix_memalign, aligned_alloc, ...; C++ ``new`` is malloc): the GOT of
  every loaded library is patched at run time, and libraries loaded later
  are patched as they load.  No LD_PRELOAD and no relaunch: a plain
  ``python script.py`` works.

Outside the block the original allocators serve as before; a region block
freed later, inside the block or not, goes back to the region allocator.
Other threads are not affected.  Memory that a library cached or allocated
before the block can still be reachable from objects built in it: check
with ``clamor.share(obj)`` before shipping.
"""
import contextlib
import errno
import gc
import threading

from . import errors, region
from ._native import check, lib

_installed = False
_lock = threading.Lock()


def install():
    """Wrap the allocators (idempotent).  Called by ``heap()``."""
    global _installed
    with _lock:
        if not _installed:
            lib.clamor_py_heap_install()
            _installed = True
        lib.clamor_interpose_refresh()


@contextlib.contextmanager
def heap():
    """Allocate everything this thread allocates inside the block in the region."""
    region.ensure()
    install()
    # A full collection empties CPython's free lists (floats, tuples, lists,
    # dicts, ...), which would otherwise hand the block objects allocated
    # earlier outside the region, and, after it, hand region objects to code
    # outside it.
    gc.collect()
    check(lib.clamor_heap_enter(), "clamor.heap()", {errno.EPERM: errors.NotDriver})
    try:
        if lib.clamor_py_numpy_enter() != 0:
            raise errors.ClamorError("could not set clamor's numpy allocator")
    except BaseException:
        lib.clamor_heap_exit()
        raise
    try:
        yield
    finally:
        lib.clamor_heap_exit()
        lib.clamor_py_numpy_exit()
        gc.collect()


def active():
    """True inside a ``heap()`` block on this thread."""
    return bool(lib.clamor_heap_active())
