"""The state of clamor's allocator hooks: installed once, suspended and
resumed per thread, and the caches that must be emptied at a block's edges.

``heap.py`` builds ``with clamor.heap():`` on top of this; ``region.py``
uses ``outside`` to keep its own work out of a block.  Nothing here maps
the region.
"""
import abc
import contextlib
import functools
import gc
import sys
import threading

from .. import errors
from .._native import lib

_installed = False
_lock = threading.Lock()
# Made now, before any worker is forked: every array made in a block
# points at it (share() accepts that pointer).
HANDLER = lib.clamor_py_numpy_handler()


def install():
    """Wrap the allocators (idempotent).  Called by ``heap()``, and by a
    worker as it maps the region."""
    global _installed
    with _lock:
        if not _installed:
            lib.clamor_py_heap_install()
            _adopt_threads()
            _installed = True
        lib.clamor_interpose_refresh()


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
    """Call right before ``os.fork()`` of a worker, before making anything
    the child reads.

    CPython keeps freed objects of the common types (lists, tuples, dicts,
    floats, ...) on free lists and hands them out again, and numpy keeps
    freed shape buffers.  Once a heap() block has run, a region object freed
    after it can sit there; a forked worker starts with every region page
    absent and no pager yet, so the interpreter's own first allocations
    after fork would touch the region and kill the child.  A full
    collection empties the free lists; numpy's cache is flushed; tables
    that ordinary dicts and lists took from the region go back outside.
    """
    if _installed:
        _forget_interpreter_caches()
        gc.collect()
        _flush_dims(active())
        if not active():
            _rehome()
        global _dropped_seen
        _dropped_seen = lib.clamor_py_region_dropped()


_dropped_seen = 0


def _forget_interpreter_caches():
    """Before a fork: the interpreter's own caches must hold no region
    object, since a worker inherits them as they are while the driver may
    later drop and free what they held, and the worker's interpreter would
    then follow its copy into memory the driver reuses.  The caches of
    abstract base classes (weak references a check made inside a block,
    such as ``isinstance(x, collections.abc.Sequence)``) are reset, and the
    type attribute cache (which holds attribute names: region strs) is
    cleared."""
    lo = int(lib.clamor_region_base())
    hi = lo + int(lib.clamor_region_size())
    # (3.13 names it _clear_internal_caches and deprecates the old name)
    (getattr(sys, "_clear_internal_caches", None) or sys._clear_type_cache)()
    if not hasattr(abc, "_get_dump"):   # (the pure-Python _py_abc keeps its caches in WeakSets of its own)
        return
    for cls in all_classes():
        if isinstance(cls, abc.ABCMeta):
            caches = abc._get_dump(cls)[1:3]
            if any(lo <= id(w) < hi for s in caches for w in s):
                abc._reset_caches(cls)


def all_classes():
    """Every class alive, static types included (``object`` and what
    derives from it), each once."""
    seen, stack = {id(object)}, [object]
    while stack:
        cls = stack.pop()
        yield cls
        try:
            subs = type.__subclasses__(cls)
        except TypeError:
            continue
        for c in subs:
            if id(c) not in seen:
                seen.add(id(c))
                stack.append(c)


def _adopt_threads():
    """A thread started inside a block allocates in the region while that
    block is open (csrc/interpose.c): a library that fits a model in a
    pool of threads of its own (scikit-learn's ``n_jobs``) builds it all
    there.  Outside the block, or once it closes, the thread is as any."""
    start = threading.Thread.start
    if getattr(start, "_clamor", False):
        return

    @functools.wraps(start)
    def start_in_block(self):
        block = lib.clamor_heap_block()
        if block:
            run = self.run

            def run_in_block():
                lib.clamor_heap_adopt(block)
                lib.clamor_py_numpy_enter()     # (numpy's handler is per context: the thread's own)
                try:
                    run()
                finally:
                    lib.clamor_py_numpy_exit()
                    lib.clamor_heap_adopt(0)
            self.run = run_in_block
        return start(self)
    start_in_block._clamor = True
    threading.Thread.start = start_in_block


def release_dropped():
    """Before the runtime makes objects that travel (a stage's payload):
    CPython's free lists and numpy's cache of shape buffers may hold region
    objects that died in ordinary code since a block.  They are emptied, so
    that the runtime's own tuples and dicts are not region memory shipped as
    if the user had shared it.  A full collection as well when region
    memory was freed outside a block since the last look (a dying container
    may keep others alive in a cycle).  Outside heap blocks only."""
    global _dropped_seen
    if not _installed or active():
        return
    n = lib.clamor_py_region_dropped()
    if n != _dropped_seen:
        gc.collect()
        _dropped_seen = lib.clamor_py_region_dropped()
    if lib.clamor_py_freelists_flush() < 0:
        raise errors.ClamorError("could not empty CPython's free lists of region objects")
    _flush_dims(False)


def active():
    """True inside a ``heap()`` block on this thread."""
    return bool(lib.clamor_heap_active())


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
    lib.clamor_py_gate_open()     # clamor's threads may run meanwhile (a worker's handshake)
    try:
        yield
    finally:
        lib.clamor_py_gate_close()
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
