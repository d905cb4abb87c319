"""``with clamor.heap():`` -- every allocation of this thread lands in the region.

Inside the block, on the driver, the current thread's allocations go to the
region allocator:

- Python objects: all three PyMem domains are wrapped (once, on first use);
- numpy array data: clamor's NEP 49 handler is set for the block, bypassing
  numpy's small-buffer cache (which would hand back memory freed earlier,
  outside the region);
- numpy's shape-and-strides buffers: numpy's own cache of them is flushed
  at each edge of the block, so that an array made inside gets a buffer in
  the region and one made outside never gets a region buffer;
- dicts and lists made outside the block that grew inside it (a module's
  globals assigned in the block, a library's cache) get their tables back
  outside the region when the block ends: they are the interpreter's;
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
import functools
import gc
import threading

from . import errors
from ._native import check, lib

_installed = False
_lock = threading.Lock()
# Made now, before any worker is forked: every array made in a block
# points at it (share() accepts that pointer).
HANDLER = lib.clamor_py_numpy_handler()


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
    """Allocate everything this thread allocates inside the block in the
    region: Python objects, numpy data, and the C heap of extension modules.

    Driver only (maps the default region if there is none).  Blocks nest.
    ``clamor.heap.suspended()`` leaves the block for a while, and
    ``clamor.heap.active()`` says whether this thread is in one.  Raises
    NotDriver in a worker, RegionInUse if the default region cannot be
    mapped, ClamorError if numpy's allocator cannot be set.
    """
    from . import region  # here: region imports this module

    region.ensure()
    install()
    if lib.clamor_region_role() != lib.CLAMOR_ROLE_DRIVER:
        raise errors.NotDriver("clamor.heap() needs the driver's region")
    # numpy's handler first, outside the block: setting it makes a new
    # context (contextvars), and interpreter state such as that must not
    # live in the region, where a forked worker would read the driver's
    # later version of it.
    if lib.clamor_py_numpy_enter() != 0:
        raise errors.ClamorError("could not set clamor's numpy allocator")
    # A full collection empties CPython's free lists (floats, tuples, lists,
    # dicts, ...), which would otherwise hand the block objects allocated
    # earlier outside the region, and, after it, hand region objects to code
    # outside it.
    gc.collect()
    rc = lib.clamor_heap_enter()   # nothing kept is allocated between this and the yield
    if rc:
        lib.clamor_py_numpy_exit()
        check(rc, "clamor.heap()", {errno.EPERM: errors.NotDriver})
    # numpy's cache of shape buffers, like the free lists, would hand the
    # block buffers freed outside it (and, after it, hand region buffers out)
    _flush_dims(True)
    try:
        yield
    finally:
        lib.clamor_heap_exit()
        lib.clamor_py_numpy_exit()
        gc.collect()
        _flush_dims(active())   # an inner block's end is still inside the outer one
        if not active():
            _rehome()


def _rehome():
    """Move the tables that ordinary dicts and lists grew inside the block
    (a module's globals, a library's cache) back outside the region: they
    are the interpreter's, and a worker must not read the driver's later
    changes to them."""
    objs = gc.get_objects()
    try:
        if lib.clamor_py_rehome(id(objs)) < 0:
            raise errors.ClamorError("could not move dict and list tables out of the region")
    finally:
        del objs


def _flush_dims(inside):
    if lib.clamor_py_numpy_dims_flush(1 if inside else 0) != 0:
        raise errors.ClamorError("could not flush numpy's cache of shape buffers")


def prepare_fork():
    """Call right before ``os.fork()`` of a worker.

    CPython keeps freed objects of the common types (lists, tuples, dicts,
    floats, ...) on free lists and hands them out again, and numpy keeps
    freed shape buffers.  Once a heap() block has run, a region object freed
    after it can sit there; a forked worker starts with every region page
    absent and no pager yet, so the interpreter's own first allocations
    after fork would touch the region and kill the child.  A full
    collection empties the free lists; numpy's cache is flushed.
    """
    if _installed:
        gc.collect()
        _flush_dims(active())
        global _dropped_seen
        _dropped_seen = lib.clamor_py_region_dropped()


_dropped_seen = 0


def release_dropped():
    """Before the runtime makes objects that travel (a stage's payload):
    if region objects died in ordinary code since the last look, empty the
    caches that may hold them, so that the runtime's own objects are not
    taken from the region and shipped as if the user had shared them.
    Outside heap blocks only; cheap when nothing was dropped."""
    global _dropped_seen
    if not _installed or active():
        return
    n = lib.clamor_py_region_dropped()
    if n != _dropped_seen:
        gc.collect()
        _flush_dims(False)
        _dropped_seen = lib.clamor_py_region_dropped()


def active():
    """True inside a ``heap()`` block on this thread."""
    return bool(lib.clamor_heap_active())


def threads_inside():
    """Number of threads inside a ``heap()`` block right now."""
    return int(lib.clamor_heap_threads())


@contextlib.contextmanager
def suspended():
    """Leave this thread's ``heap()`` block for the duration (nothing to do
    outside one).

    clamor's own runtime (page server and pager threads, sockets, worker
    processes, stage bookkeeping) must not live in the region: a user
    calling ``Cluster.start()`` or an action inside a block would otherwise
    put libzmq's objects and the scheduler's state in memory the workers
    read, and free them through the wrong allocator.
    """
    depth = lib.clamor_heap_suspend()
    if not depth:
        yield
        return
    if lib.clamor_py_numpy_suspend() != 0:
        lib.clamor_heap_resume(depth)
        raise errors.ClamorError("could not restore numpy's allocator for clamor's runtime")
    # Free lists hand out objects freed earlier: empty them both ways, as
    # heap() does (a region tuple reused by the runtime would be shipped by
    # reference; a runtime one reused in the block would not be shareable).
    gc.collect()
    _flush_dims(False)
    try:
        yield
    finally:
        lib.clamor_py_numpy_exit()
        gc.collect()
        lib.clamor_heap_resume(depth)
        _flush_dims(True)


def outside(fn):
    """Decorator: run ``fn`` with this thread's heap block suspended."""
    @functools.wraps(fn)
    def run(*args, **kwargs):
        if not lib.clamor_heap_active():
            return fn(*args, **kwargs)
        with suspended():
            return fn(*args, **kwargs)
    return run


# ``clamor.heap`` is this module's function, which hides the module in the
# package namespace: its helpers are reached through it.
heap.suspended = suspended
heap.outside = outside
heap.active = active
