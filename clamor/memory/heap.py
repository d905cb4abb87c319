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

from .. import errors
from .._native import check, lib
from . import region
from .gate import close_gate, open_gate
from .hooks import (HANDLER, _flush_dims, _free_lists_out, _held_slices, _rehome, active,  # noqa: F401
                    callbacks_off, collect, collect_at_edge, collect_young, drain_free_lists, install, outside,
                    prepare_fork, release_dropped, release_free_lists, settle, suspended)


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
    # The driver's other Python threads (clamor's: the control endpoint's
    # handshakes; a Dask client's event loop) stop running Python code
    # before the collection below and until the block ends: what they free
    # would go to the same free lists (gate.close_gate, csrc/pygate.c).
    outer = not active()
    if outer:
        close_gate()
    try:
        with callbacks_off() if outer else contextlib.nullcontext():
            # An outer block: what died since the last collection is
            # collected first, or it would be freed inside the block, and
            # again as it ends (all that died, once the region has grown by
            # a quarter since: hooks.collect_at_edge).  CPython's free lists
            # (floats, tuples, lists, dicts, key tables, ...) would hand the
            # block objects allocated earlier outside the region: they are
            # emptied, their objects held until the block ends
            # (hooks.drain_free_lists); after it, they would hand region
            # objects to code outside: they are emptied of those.  An inner
            # block collects whole at its edges, which empties the lists.
            # CPython caches one freed slice: the block's first slice would
            # be that one, outside the region (a pandas block's placement).
            # Held until the block ends, the block makes its own.  (Taken
            # before the collection: the call leaves a tuple on the free
            # list.)
            cached_slice = slice(None)
            if outer:
                collect_at_edge()
                held = drain_free_lists()
            else:
                collect()
            rc = lib.clamor_heap_enter()   # nothing kept is allocated between this and the yield
            if rc:
                lib.clamor_py_numpy_exit()
                if outer:
                    release_free_lists(held)
                check(rc, "clamor.heap()", {errno.EPERM: errors.NotDriver})
            try:
                # numpy's cache of shape buffers, like the free lists, would hand
                # the block buffers freed outside it (and, after it, hand region
                # buffers out)
                _flush_dims(True)
                yield
            finally:
                lib.clamor_heap_exit()
                lib.clamor_py_numpy_exit()
                if outer:
                    collect_at_edge()
                    release_free_lists(held)
                    _free_lists_out()
                else:
                    collect()
                _flush_dims(active())   # an inner block's end is still inside the outer one
                if not active():
                    _rehome()
                    settle()
                    _held_slices.clear()
                del cached_slice
    finally:
        if outer:
            open_gate()


# ``clamor.heap`` is this module's function, which hides the module in the
# package namespace: its helpers are reached through it.
heap.suspended = suspended
heap.outside = outside
heap.active = active
