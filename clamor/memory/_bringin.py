"""What share()'s walk writes: objects outside the region that only a
region object holds, copied in (``_candidate``, ``_bring_in``), and a
region instance's dict given keys of its own, in the region
(``_own_keys``).
"""
import sys

from . import _pyshare, classkeys, promote, region
from .. import errors
from .._native import lib
from ..errors import NotShareable
from ._kinds import _HEAPTYPE, _MANAGED_DICT
from .cwalk import brought, conversions

# Instance dicts _own_keys rewrote: the dicts and key tables that died then
# may sit on CPython's free lists, which the runtime empties before it
# pickles what travels (hooks.release_dropped).


_NONSTR_KEY = -12345   # any non-str key converts a split dict to a combined one


def _has_dict(o):
    if isinstance(o, type):
        return False    # (a class made in a block: its dict is the type's own, not an instance's)
    t = type(o)
    return bool(t.__flags__ & _HEAPTYPE) and bool(t.__flags__ & _MANAGED_DICT or t.__dictoffset__)


def _own_keys(o, path, frozen=False):
    """Give a region instance a dict with its own keys table, in the region.

    CPython shares one keys table among the instances of a class (split
    dicts): the class's, made with the class, outside the region.  An
    attribute name first set after the workers were forked is added to
    that table in the driver only, and a worker, whose copy of the class
    is from the fork, would not find it.  A dict made and converted inside
    a heap block (one non-string key does it) keeps its own keys, in the
    region, where workers read them.  A dict that has its own keys
    already is left as it is: a walk may run after a stage began, and a
    write then would change pages for nothing (and, for workers not forked,
    be a page version no relocation list describes).

    ``frozen`` (a walk for forked workers): an instance whose class's keys
    table was frozen at the fork (``classkeys``) gets a region dict over
    that table instead, which those workers read: made from its values
    table, or a copy of the one made outside the region (vars(), a pickle
    outside a block)."""
    from .._native import lib
    from . import hooks

    if not hooks._installed:
        hooks.install()   # (the block below needs Python's allocators wrapped; once: it rescans every library)
    keep = False

    def convert(fresh):
        nonlocal keep
        lib.clamor_heap_enter()
        try:
            d = o.__dict__
            if not fresh:   # (made now, if it was not: over the class's table, if it has one)
                keep = frozen and classkeys.frozen_split(o)
            if fresh:
                keep = keep and len(d) > 0   # (a copy of an empty dict is a new empty one, not split)
                d = d.copy() if keep else dict(d)     # (a copy of a split dict is split, over the same keys)
                if not region.contains(id(d), sys.getsizeof(d)):
                    spare.append(d)     # off the free list: kept, so the next one is not
                    return False
                o.__dict__ = d
            else:
                depth = lib.clamor_heap_suspend()   # (the check's own objects are no region objects)
                try:
                    owns = _owns_keys(d)
                finally:
                    lib.clamor_heap_resume(depth)
                if owns:
                    return True     # done before: nothing is written
            conversions[0] += 1
            if keep:    # (a dict made here from the values is kept; one made outside, copied below)
                return classkeys.frozen(o)
            d[_NONSTR_KEY] = None
            del d[_NONSTR_KEY]
        finally:
            lib.clamor_heap_exit()
        return region.contains(id(d), sys.getsizeof(d))

    # The dict object may come from CPython's free list, outside the region
    # (its keys, general ones, never do): then make new ones until one is
    # the allocator's, holding those the free list gave (it keeps 80 at
    # most), which go back to it afterwards.  (A collection to empty the
    # lists cost a walk of the whole heap for each such instance.)
    spare = []
    if not convert(False):
        conversions[0] += 1
        for _ in range(_FREE_LIST_MAX + 1):
            if convert(True):
                break
        else:
            raise NotShareable(f"{path}.__dict__ could not be placed in the region")
        spare.clear()


_FREE_LIST_MAX = 80     # CPython's dict free list (PyDict_MAXFREELIST)


def _owns_keys(d):
    """A dict in the region, combined (no values table of a class's
    instances), whose keys table is in the region too."""
    if not region.contains(id(d), sys.getsizeof(d)):
        return False
    f = dict(_pyshare.fields(d))
    keys = f.get(lib.CLAMOR_FIELD_KEYS)
    return lib.CLAMOR_FIELD_VALUES not in f and keys is not None and region.contains(keys, 1)


def _bring_in(moves):
    """Copy each object of ``moves`` [(store, object)] into the region and
    store the copy where the object was."""
    from .heap import heap
    for store, o in moves:
        if store is not None and not isinstance(store, (promote.Rekey, promote.Drop, promote.Warm)):
            promote.dict_outside(o)
    with heap():
        for store, o in moves:
            if store is None and lib.clamor_py_table_in(id(o)) < 0:
                raise errors.ClamorError(f"could not make the table of a {type(o).__name__} again in the region")
        copies = [(store, promote.copy_in(o)) for store, o in moves
                  if store is not None and not isinstance(store, (promote.Rekey, promote.Drop, promote.Warm))]
        promote.rekey([(store.d, o) for store, o in moves if isinstance(store, promote.Rekey)])
        for store, o in moves:
            if isinstance(store, promote.Warm):
                store()
    for store, o in moves:
        if isinstance(store, promote.Drop):
            store()
    n = len(moves)
    moves.clear()
    for store, c in copies:
        store(c)
    conversions[0] += n
    brought[0] += n


def _candidate(parent, o, cache):
    """A store for ``o`` if it can be brought into the region (the caller
    holds it in one local), else None.  A constant key of a dict (a str or
    int made after the block) is a ``promote.Rekey``.  What is reached
    through an entry of a library's cache (``cache``: the dict and the
    key) and cannot be brought in drops that entry (``promote.Drop``)."""
    if parent is None:
        return None
    if promote.copyable(o):
        if promote.rekeyable(parent, o):
            return promote.Rekey(parent)
        # (the references here: the walk's local, this parameter and sole()'s)
        if promote.sole(o, 3):
            store = promote.slot(parent, o)
            if store is not None:
                return store
    return promote.Drop(*cache) if cache is not None else None
