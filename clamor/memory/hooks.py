"""The state of clamor's allocator hooks: installed once, suspended and
resumed per thread, and the caches that must be emptied at a block's
edges.

``heap.py`` builds ``with clamor.heap():`` on top of this; ``region.py``
uses ``outside`` to keep its own work out of a block.  Nothing here maps
the region.

The gate itself, which keeps the driver's other Python threads out of a
block, is gate.py; ``suspended`` opens it and closes it again.
"""
import abc
import contextlib
import functools
import gc
import logging
import sys
import threading

from .. import errors
from .._native import ffi, lib
from . import classkeys
from .gate import close_gate, open_gate

log = logging.getLogger("clamor.heap")

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
            _imports_outside()
            _installed = True
        lib.clamor_interpose_refresh()


def _rehome():
    """Move the tables that ordinary dicts and lists grew inside the block
    (a module's globals, a library's cache) back outside the region: they
    are the interpreter's, and a worker must not read the driver's later
    changes to them.  Every tracked object is looked at through the
    collector's own lists (``_gc_heads``), without the reference that
    ``gc.get_objects()`` takes to each: that reference writes every
    object, and once workers exist each page holding a region object would
    be logged as a write at every block's end."""
    heads = _gc_heads()
    if heads is not None:
        moved = lib.clamor_py_rehome_tracked(ffi.cast("const uint64_t *", heads.ctypes.data), len(heads))
    else:
        objs = gc.get_objects()
        try:
            moved = lib.clamor_py_rehome(id(objs))
        finally:
            del objs
    if moved < 0:
        raise errors.ClamorError("could not move dict and list tables out of the region")


_heads = []     # [the collector's list heads (numpy uint64), or None where they do not check out]


def _gc_heads():
    """The collector's generations' list heads (csrc/pyrehome.c,
    clamor_py_gc_heads), or None: found once, and used only if their lists
    hold every object ``gc.get_objects()`` gives."""
    if not _heads:
        import numpy as np

        heads = np.zeros(3, dtype=np.uint64)
        ok = False
        collecting = gc.isenabled()
        gc.disable()
        try:
            if lib.clamor_py_gc_heads(ffi.cast("uint64_t *", heads.ctypes.data)) == 0:
                objs = gc.get_objects()
                addrs = np.sort(np.fromiter(map(id, objs), dtype=np.uint64, count=len(objs)))
                del objs
                found = lib.clamor_py_gc_count(ffi.cast("const uint64_t *", heads.ctypes.data), len(heads),
                                               ffi.cast("const uint64_t *", addrs.ctypes.data), len(addrs))
                ok = found == len(addrs)
        finally:
            if collecting:
                gc.enable()
        if not ok:
            log.debug("the collector's lists are not laid out as expected: the rehome pass uses gc.get_objects()")
        _heads.append(heads if ok else None)
    return _heads[0]


def _ufunc_caches_out():
    """Move numpy's per-ufunc dispatch caches that grew inside a block out
    of the region (csrc/pyufunc.c says why): every ufunc a loaded module
    names.  Their layout is numpy's own, by version; numpy 3 is left as
    it is."""
    np = sys.modules.get("numpy")
    if np is None:
        return
    try:
        major, minor = (int(x) for x in np.__version__.split(".")[:2])
    except ValueError:
        return
    if major != 2:
        return
    seen = {}
    for m in list(sys.modules.values()):
        d = getattr(m, "__dict__", None)
        if type(d) is not dict:
            continue
        for v in list(d.values()):
            if type(v) is np.ufunc:
                seen[id(v)] = v
    ufuncs = list(seen.values())
    unread = ffi.new("long *")
    moved = lib.clamor_py_ufunc_caches_out(id(ufuncs), 1 if minor <= 4 else 2, unread)
    if moved < 0:
        raise errors.ClamorError("could not move numpy's ufunc dispatch caches out of the region")
    if unread[0]:
        log.debug("%d of numpy's ufunc dispatch caches could not be read as numpy %s lays them out",
                  unread[0], np.__version__)


def _extension_free_lists_out():
    """Dead region objects on extension modules' free lists (Cython's) are
    replaced by objects outside the region (csrc/pyextfree.c says why)."""
    import numpy as np

    # (sorted and unique; np.unique would import numpy.ma, 55 ms, at a first fork)
    types = np.array(sorted({id(t) for t in all_classes()} | {id(type)}), dtype=np.uint64)
    failed = ffi.new("long *")
    n = lib.clamor_py_ext_freelists_flush(ffi.cast("const uint64_t *", types.ctypes.data), types.size, failed)
    if n < 0:
        raise errors.ClamorError("could not empty extension modules' free lists of region objects")
    if failed[0]:
        log.debug("%d dead region objects on extension modules' free lists could not be replaced", failed[0])


def _free_lists_out():
    """CPython's free lists hold no region object (csrc/pyfreelist.c)."""
    if lib.clamor_py_freelists_flush() < 0:
        raise errors.ClamorError("could not empty CPython's free lists of region objects")


def drain_free_lists():
    """Outside every block: CPython's free lists emptied, their objects
    (and new ones outside the region, past them) held in the list returned
    (csrc/pyfreelist.c, clamor_py_freelists_drain), for a block to make
    new region objects; ``release_free_lists`` lets them go."""
    held = []
    if lib.clamor_py_freelists_drain(id(held)) < 0:
        raise errors.ClamorError("could not empty CPython's free lists")
    return held


def release_free_lists(held):
    """Let go of what ``drain_free_lists`` held: those outside the region
    fill the lists again."""
    if lib.clamor_py_freelists_release(id(held)) < 0:
        raise errors.ClamorError("could not give CPython's free lists their objects back")


def _flush_dims(inside):
    if lib.clamor_py_numpy_dims_flush(1 if inside else 0) != 0:
        raise errors.ClamorError("could not flush numpy's cache of shape buffers")


_collecting = threading.RLock()


def collect():
    """A full collection, which leaves CPython's free lists empty, as an
    inner ``heap()`` block's edges and ``suspended()``'s need.  Inside a block the collector's
    callbacks are off (``callbacks_off``)."""
    gc.collect()


_collected_at = [0]     # the region's bytes allocated after the last full collection at a block's edge


def collect_at_edge():
    """At an outer block's edges: a full collection once the region's
    allocated bytes have grown by a quarter since the last one made at an
    edge (CPython collects its old generation by a like rule: the cost of a
    full collection spread over what was allocated since), so that a block
    that built something leaves none of its garbage cycles behind (freed
    later, their region objects would go on the free lists in ordinary
    code), and structures built and dropped again and again (a tree made
    anew at every round) give their memory back; else the young
    generations only (``collect_young``): a block that changes a big
    global does not write it whole."""
    if lib.clamor_heap_allocated() >= _collected_at[0] + _collected_at[0] // 4:
        collect()
        _collected_at[0] = lib.clamor_heap_allocated()
    else:
        collect_young()


def collect_young():
    """A collection of the young generations, as ``heap()`` makes at its
    edges: what died since the last one, and no more.  A full collection
    writes the collector's words of every tracked object, and region
    objects are most of them once a big global is built: once workers
    exist, each page holding one would be logged and compared as a write
    (about 1 s for a million instances).  The free lists are then emptied
    by hand (``drain_free_lists``, ``_free_lists_out``)."""
    gc.collect(1)


@contextlib.contextmanager
def callbacks_off():
    """The collector calls ``gc.callbacks`` after it empties the free lists:
    what a callback frees goes back on them, outside the region, and a
    block's first dicts and lists were made from it (Dask's GC diagnosis
    is one, in every process that runs a Dask scheduler, such as a
    LocalCluster's driver).  A block runs with them off, from before its
    first collection to after its last: putting them back allocates, and
    did between the collection and the block (a tuple of the block read as
    outside the region)."""
    with _collecting:
        saved = gc.callbacks[:]
        del gc.callbacks[:]
    try:
        yield
    finally:
        with _collecting:
            gc.callbacks[:0] = saved


def prepare_fork():
    """Call right before ``os.fork()`` of a worker, before making anything
    the child reads.  Returns the region objects the child inherits
    references to from outside the region (``_held_from_outside``): keep
    them alive while the child may live.

    CPython keeps freed objects of the common types (lists, tuples, dicts,
    floats, ...) on free lists and hands them out again, and numpy keeps
    freed shape buffers.  Once a heap() block has run, a region object freed
    after it can sit there; a forked worker starts with every region page
    absent and no pager yet, so the interpreter's own first allocations
    after fork would touch the region and kill the child.  A full
    collection empties the free lists (the slice cache is emptied by
    hand); numpy's cache is flushed; tables that ordinary dicts and lists
    took from the region, and numpy's ufunc dispatch caches, go back
    outside.
    """
    if not _installed:
        return []
    classkeys.freeze(all_classes())     # (the child has its classes' keys tables as they will stay)
    _forget_interpreter_caches()
    gc.collect()
    _flush_dims(active())
    held = []
    if not active():
        _rehome()
        _ufunc_caches_out()
        _extension_free_lists_out()
        # (and the one slice CPython caches, which a collection leaves:
        # a region slice there was a worker's next slice)
        _free_lists_out()
        held = _held_from_outside()
    global _dropped_seen
    _dropped_seen = lib.clamor_py_region_dropped()
    return held


def prepare_next_fork():
    """Before each fork after the first of several in a row that one
    ``prepare_fork`` prepared, the collector off in between (a collection
    could free region objects onto the free lists): the free lists and
    numpy's cache are emptied again of what the last fork's own work freed."""
    if not _installed:
        return
    _free_lists_out()
    _flush_dims(active())


def _held_from_outside():
    """The region objects this process's own memory refers to: a module's
    global or a library's cache that a block set (csrc/pyheld.c,
    ``clamor_py_held_from_outside``).  A forked worker inherits those
    references as they are; if the driver dropped such an object later and
    reused its memory, the worker would read the new object in its place.
    So the caller keeps them alive while the workers it forks live."""
    objs, held = gc.get_objects(), []
    try:
        if lib.clamor_py_held_from_outside(id(objs), id(held)) < 0:
            raise errors.ClamorError("could not list the region objects held from outside the region")
    finally:
        del objs
    return held


_dropped_seen = 0
# CPython's cached slice, taken where a block resumes (suspended): held
# until the outer block ends, so that the block makes its own slices
_held_slices = []


def _forget_interpreter_caches():
    """Before a fork: the interpreter's own caches must hold no region
    object, since a worker inherits them as they are while the driver may
    later drop and free what they held, and the worker's interpreter would
    then follow its copy into memory the driver reuses.  The caches of
    abstract base classes (weak references a check made inside a block,
    such as ``isinstance(x, collections.abc.Sequence)``) are reset, the
    type attribute cache (which holds attribute names: region strs) is
    cleared, and re's patterns and the warnings filters move out
    (``_warnings_outside``)."""
    lo = int(lib.clamor_region_base())
    hi = lo + int(lib.clamor_region_size())
    # (3.13 names it _clear_internal_caches and deprecates the old name)
    (getattr(sys, "_clear_internal_caches", None) or sys._clear_type_cache)()
    with suspended():    # (the copies are made outside the region)
        _warnings_outside(lambda o: lo <= id(o) < hi)
    if not hasattr(abc, "_get_dump"):   # (the pure-Python _py_abc keeps its caches in WeakSets of its own)
        return
    for cls in all_classes():
        if isinstance(cls, abc.ABCMeta):
            caches = abc._get_dump(cls)[1:3]
            if any(lo <= id(w) < hi for s in caches for w in s):
                abc._reset_caches(cls)


def _warnings_outside(inside):
    """The re module's cache of compiled patterns and the warnings module's
    filters hold no region object (``inside(o)``).  A pattern compiled in
    a block (a vectorizer's token pattern) is cached; a thread a block
    covered that ran ``warnings.catch_warnings``, which is not thread-safe
    (a forest fitted with n_jobs=2), can leave its copy of the filters,
    made in the block, as the module's list; a filter added in a block is a
    region tuple.  A worker inherits them as they are; the driver later
    evicts or replaces them and frees their memory, and the worker's next
    warning or regex reads what the driver put there."""
    import re
    import warnings
    caches = [getattr(re, n) for n in ("_cache", "_cache2") if isinstance(getattr(re, n, None), dict)]
    if any(inside(k) or inside(v) for c in caches for k, v in c.items()):
        re.purge()
    fs = warnings.filters
    if inside(fs) or any(inside(f) or any(inside(x) for x in f) for f in fs):
        def out(x):
            if isinstance(x, str) and inside(x):
                return x.encode("utf-8", "surrogatepass").decode("utf-8", "surrogatepass")
            if isinstance(x, re.Pattern) and inside(x):
                return re.compile(out(x.pattern), x.flags)
            return x
        warnings.filters = [tuple([out(x) for x in f]) for f in fs]
        warnings._filters_mutated()


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


def _imports_outside():
    """A module imported inside a block runs its code outside the region.

    A module's state is the interpreter's, not data the user shares: its
    globals and classes, and what its code sets on objects that already
    exist (``multiprocessing.dummy`` gives the main thread a
    ``WeakKeyDictionary`` of the pool threads it starts; a library imports
    a submodule lazily inside ``fit()``).  Made in the region, it is
    reached from the interpreter's own state, which a forked worker
    inherits.  The driver's later changes to it outside any block give
    those region objects tables and values in the driver's private memory,
    and the worker follows the driver's pointers into memory of its own: a
    forest fitted with n_jobs=2 inside a block made its workers loop for
    ever in such a dict, die, or predict zeros.

    The interpreter calls ``importlib._bootstrap._find_and_load`` only for
    a module it has not loaded yet, so the wrapper costs nothing on other
    imports.  A thread a block adopted (``_adopt_threads``) leaves it for
    the import as well."""
    boot = sys.modules.get("_frozen_importlib")
    find = getattr(boot, "_find_and_load", None)
    if find is None or getattr(find, "_clamor", False):
        return

    @functools.wraps(find)
    def find_and_load(name, import_):
        if lib.clamor_heap_active():
            with suspended():
                return find(name, import_)
        block = getattr(_adopted, "block", 0)
        if not block:
            return find(name, import_)
        lib.clamor_heap_adopt(0)
        try:
            return find(name, import_)
        finally:
            lib.clamor_heap_adopt(block)
    find_and_load._clamor = True
    boot._find_and_load = find_and_load


_adopted = threading.local()     # .block: the block this thread adopted (_adopt_threads)


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
                _adopted.block = block      # (before: its dict is made outside the region)
                lib.clamor_heap_adopt(block)
                lib.clamor_py_numpy_enter()     # (numpy's handler is per context: the thread's own)
                try:
                    run()
                finally:
                    lib.clamor_py_numpy_exit()
                    lib.clamor_heap_adopt(0)
                    _adopted.block = 0
            self.run = run_in_block
        return start(self)
    start_in_block._clamor = True
    threading.Thread.start = start_in_block


def release_dropped():
    """Before the runtime makes objects that travel (a stage's payload):
    CPython's free lists and numpy's cache of shape buffers may hold region
    objects that died in ordinary code since a block.  They are emptied, so
    that the runtime's own tuples and dicts are not region memory shipped as
    if the user had shared it.  A collection as well when region memory was
    freed outside a block since the last look (a dying container may keep
    others alive in a cycle), by the rule of a block's edges
    (``collect_at_edge``): the young generations, and whole once the
    region has grown by a quarter.  A full one each time wrote the
    collector's words of every region object: the stage after a one-entry
    change copied every page of the global.  (A cycle left for CPython's
    own collection of its old generation is harmless here: a region object
    the runtime then takes off a free list travels by value, as a copy,
    ``serialize``.)  Outside heap blocks only."""
    global _dropped_seen
    if not _installed or active():
        return
    n = lib.clamor_py_region_dropped()
    if n != _dropped_seen:
        collect_at_edge()
        _dropped_seen = lib.clamor_py_region_dropped()
    _free_lists_out()
    _flush_dims(False)


def settle():
    """At the end of an outer ``heap()`` block, after its full collection
    (which frees the region's garbage cycles) and the tables moved out:
    count the region memory freed so far as looked at, so that the next
    action does not collect the whole heap again for it.  (It still
    empties the free lists: ``release_dropped``.  Emptied here, they would
    be full of ordinary objects at the next block, whose objects would then
    take them: a cached slice outside the region in a pandas block made
    inside it.)"""
    global _dropped_seen
    _dropped_seen = lib.clamor_py_region_dropped()


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
    collect()
    _flush_dims(False)
    open_gate()     # the other threads may run meanwhile (a worker's handshake, Dask's loop)
    try:
        yield
    finally:
        close_gate()
        lib.clamor_py_numpy_exit()
        _held_slices.append(slice(None))    # (CPython's one cached slice: not the block's next, as heap() does)
        collect()
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
