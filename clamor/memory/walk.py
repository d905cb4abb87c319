"""The walk behind ``clamor.share()``: what is reachable from an object,
and whether workers can follow it.

A forked worker sees two kinds of memory at the driver's addresses: the
region (pages fetched on demand) and what it inherited at fork.  Anything
else reachable from ``obj``, such as an object a library took from a free
list or a cache while ``obj`` was built, is garbage on the worker.
The walk visits what is reachable from ``obj`` and raises ``NotShareable``
naming the path to the first thing that is neither in the region nor
inherited.  It follows three kinds of pointer:

- Python references: gc referents, with attribute, key and index names for
  the message; numpy arrays through their base, dtype and, for object
  arrays, their items;
- the pointer fields that hold no Python reference, of the types it knows
  (``_pyshare``): an array's data and its shape-and-strides buffer, a
  dtype's subarray and C metadata, a list's item array, a dict's keys and
  values tables, a set's table, a bytearray's and an ``array.array``'s
  buffer, a str's cached UTF-8 (and, before 3.12, wide-char) copy;
- every aligned word of objects of extension types it does not know (a
  cKDTree, a deque, a Decimal), and of the region blocks those lead to, the
  way a conservative collector scans: a word pointing into the process's
  private writable memory outside the region, unless it is an object the
  workers inherited, is something ``share`` cannot vouch for, and it says
  so.

A region instance of a class gets a dict with keys of its own, in the
region (see ``_own_keys``).

"Inherited" is what existed when the last Cluster of this process forked
its workers, and still reads as it did then (snapshot in ``note_fork``,
with a fingerprint of each object: a float made after the fork at the
address of one freed since is not the float the workers have); before any
fork, only objects that
every process of the same image has (types, modules, functions and code
objects, builtins, small ints, interned singletons, and whatever lies in a
loaded image's own memory) count.
"""
import warnings

import numpy as np

from . import _inherit, classkeys, cwalk, hidden, promote, region
from .cwalk import LIMIT, brought, conversions, in_c, plain_in_c  # noqa: F401  (share()'s, the tests')
from ._pyshare import fields  # noqa: F401  (the raw pointer fields of an object: clamor.dask's)
from .. import errors
from .._native import lib
from ..errors import NotShareable, ShareWarning  # noqa: F401  (share()'s own)
# The walk's parts, each in a module of its own: the names share(), the
# runtime and the tests use of them are here too.
from ._bringin import _bring_in, _candidate, _has_dict, _own_keys, _owns_keys  # noqa: F401
from ._graph import _Path, _children, _dtype_parts
from ._inherit import _ok_outside, _replaced, _vouched_by_words, note_fork  # noqa: F401
from ._kinds import _opaque
from ._reads import Reads, pointer_extents  # noqa: F401
from ._walkstate import _Walk


def __getattr__(name):
    # (``_inherited`` is rebound by note_fork: read where it lives)
    if name == "_inherited":
        return _inherit._inherited
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _walk(obj, limit, mode, reads=None, bring_in=True):
    """share()'s walk; ``mode`` as for ``_Walk``; ``reads`` (a ``Reads``,
    forked walks only) records what the verdict rests on.  ``bring_in``:
    objects outside the region that only a region object holds are copied
    into it (``promote``), a pandas Index's hash table is made in it
    (``promote.Warm``), and the walk made again; otherwise refused, and
    nothing is written."""
    if not region.size():
        raise errors.NoRegion("no region in this process")
    if mode is None and _walk_plain(obj, limit, reads):
        return
    if mode is not None and mode.c_walk(obj, limit):
        return
    last = None
    for _ in range(16):
        moves = _walk_once(obj, limit, mode, reads, bring_in)
        if not moves:
            return
        ids = [id(o) for _, o in moves]
        if ids == last:      # the same objects again: bringing them in did not take
            break
        last = ids
        _bring_in(moves)
        if mode is not None:
            mode.restart()
        if reads is not None:
            reads.restart()
    _walk_once(obj, limit, mode, reads, False)


def _walk_plain(obj, limit, reads=None, convert=True):
    """share()'s walk in C (cwalk.walk_plain), the objects it met outside
    the region judged by the Python walk's rules (``_c_outside_ok``).
    ``convert``: where it meets strs outside the region that the workers
    would not have (the attribute names of a class made before any Cluster,
    a key in every instance's dict), the dicts holding them as keys get
    region copies (cwalk.rekey, the Python walk's ``promote.Rekey`` in C),
    and it walks again."""
    met = []

    def judge(objs, limit, reads):
        met[:] = objs
        return _c_outside_ok(objs, limit, reads)

    if cwalk.walk_plain(obj, limit, reads, convert, judge):
        return True
    if not convert:
        return False
    amap = _Walk().amap
    strays = [o for o in met if type(o) is str and len(o) > 1 and not (_ok_outside(o) or amap.in_image(id(o)))]
    if not strays or not cwalk.rekey(obj, limit, strays):
        return False
    return cwalk.walk_plain(obj, limit, reads, convert, _c_outside_ok)


def recheck(obj, reads, limit=LIMIT):
    """cwalk.recheck, the objects met outside the region judged by the
    Python walk's rules."""
    return cwalk.recheck(obj, reads, limit, _outside_inherited)


def _outside_inherited(objs, limit):
    """The inherited objects among ``objs`` (outside the region) that the
    Python walk accepts as they are, or None if it would not accept them
    all so (a refusal, a write, region bytes it would read)."""
    extra = Reads()
    if not _c_outside_ok(objs, limit, extra) or extra.extents:
        return None
    return extra.inherited


_C_ATOMS = (int, float, complex, str, bytes)


def _c_outside_ok(objs, limit, reads):
    """Does the Python walk accept each of ``objs``, outside the region, as
    it is: the atoms, classes and containers the C walk met there?  An
    atom or a class by ``_ok_outside``; a container (one the workers
    inherited, such as a constant tuple of code compiled before the fork)
    by a walk of its own that brings nothing in, its extents and inherited
    objects going to ``reads``.  (A class whose instances the walk warms, a
    pandas Index's, is left to the Python walk; so is a container it would
    refuse, or copy into the region, where its holder is known.)"""
    walk = _Walk()
    for o in objs:
        if isinstance(o, type) and promote.warms(o):
            return False
        if type(o) in _C_ATOMS or isinstance(o, type):
            if not (_ok_outside(o) or walk.amap.in_image(id(o))):
                return False
            continue
        try:
            if _walk_once(o, limit, None, reads, False):
                return False
        except NotShareable:
            return False
    return True


def _walk_once(obj, limit, mode, reads, bring_in):
    """One pass of share()'s walk over what is reachable from ``obj``, as
    ``_walk`` describes it: the moves [(store, object)] that would bring
    objects into the region (``bring_in``), or None when there are none;
    a refusal raises ``NotShareable``."""
    walk = _Walk(mode)
    root = _Path()
    stack = [(root, obj, None, None)]
    seen = set()
    rekeyed = set()     # constants outside the region to copy in as keys: of every dict that has them
    moves = []
    n = 0
    while stack:
        path, o, parent, cache = stack.pop()
        if id(o) in seen:
            # (an attribute name that instances of a class share is one str:
            # each dict gets a copy, in this round)
            if id(o) in rekeyed and promote.rekeyable(parent, o):
                moves.append((promote.Rekey(parent), o))
            continue
        seen.add(id(o))
        n += 1
        if n > limit:
            raise NotShareable(f"more than {limit} objects reachable from the shared object")
        # (not sys.getsizeof: it runs the class's __sizeof__, and pandas'
        # computes and caches arrays there, outside the region)
        inside = region.contains(id(o), lib.clamor_py_body_size(id(o)) if not isinstance(o, type) else 1)
        # (_candidate is called from here: it counts this frame's reference
        # to ``o`` as the walk's one)
        if not inside and mode is not None and not (isinstance(o, np.ndarray) and path is root):
            why = mode.why_not(o)      # a relocation target, or not portable
            if why is not None:
                store = _candidate(parent, o, cache) if bring_in else None
                if store is None:
                    raise mode.refusal(path, o, why)
                moves.append((store, o))
                if isinstance(store, promote.Rekey):
                    rekeyed.add(id(o))
            continue
        if not inside:
            if _accepted_outside(walk, stack, path, o, reads):
                continue  # inherited, or part of a loaded image
            if _data_in_region(o):
                if path is root:
                    continue  # shipped by itself, a region array travels as a reference
                store = _candidate(parent, o, cache) if bring_in else None
                if store is not None:
                    moves.append((store, o))
                    continue
                raise NotShareable(f"{path} (ndarray at {id(o):#x}) has its data in the region but is itself an "
                                   f"object outside it, which workers cannot follow a pointer to: make the array "
                                   f"inside clamor.heap(), or pass it to tasks directly (it travels by reference)")
            store = _candidate(parent, o, cache) if bring_in else None
            if store is not None:
                moves.append((store, o))
                if isinstance(store, promote.Rekey):
                    rekeyed.add(id(o))
                continue
            raise _refusal_outside(path, o)
        _visit_inside(walk, stack, path, o, cache, moves, mode, reads, bring_in)
    if reads is not None:
        reads.objects += n
    if mode is not None:
        mode.objects += n
    moves += [(None, t) for t in walk.tables]
    if moves:
        return moves
    if reads is not None and walk._scanner is not None:
        reads.extents += [(lo, n, False, None, "C memory") for lo, n in walk.scanner.blocks]
    if walk.unsure:
        warnings.warn(ShareWarning(f"share() scanned {walk.scanner.budget >> 20} MiB of the C memory behind "
                                   f"{walk.unsure[0]} and stopped: what lies past that is not checked"),
                      stacklevel=3)
    if walk._scanner is not None and walk.scanner.doubts:
        off, addr, where = walk.scanner.doubts[0]
        warnings.warn(ShareWarning(f"share() cannot tell whether byte {off} of {where}, reached through the C "
                                   f"memory of {walk.doubt_path}, is a pointer: it holds {addr:#x}, an address in "
                                   f"this process's private memory outside the region (it may be bytes left from "
                                   f"an earlier use of that memory)"), stacklevel=3)


def _accepted_outside(walk, stack, path, o, reads):
    """Does the walk accept ``o``, outside the region, as it is: inherited
    by the workers, or part of a loaded image?  One vouched for by its
    fingerprint has its children stacked, to be checked in turn."""
    by_words = _vouched_by_words(o)    # (the fingerprint once: _ok_outside's last test)
    if by_words or _ok_outside(o) or walk.amap.in_image(id(o)):
        if reads is not None:
            reads.outside(o)
        if by_words:
            # its fingerprint covers its own words, and its referents
            # only by address: a dict freed since the fork and made
            # again at the same address, its keys table, key and
            # value too, read as the inherited one (a worker read
            # {'d234': 1234} for the driver's {'d433': 1433}).  Each
            # referent is checked in turn (and not brought in: the
            # inherited object is not written).
            for step, child in _children(o):
                stack.append((_Path(path, *step) if isinstance(step, tuple) else path + step, child, None,
                              None))
            step = child = None
        return True
    return False


def _data_in_region(o):
    """Is ``o`` an array of no objects whose data lies in the region?"""
    return isinstance(o, np.ndarray) and not o.dtype.hasobject and o.nbytes and \
        region.contains(np.asarray(o).__array_interface__["data"][0], o.nbytes)


def _refusal_outside(path, o):
    """The error for ``o``, outside the region, that the walk neither
    accepts nor can bring in."""
    if _inherit._inherited is None:
        return NotShareable(f"{path} ({type(o).__name__} at {id(o):#x}) is outside the region, and no "
                            f"Cluster has forked workers yet: start the Cluster first (what exists when it "
                            f"forks is inherited), or build it inside clamor.heap()")
    if _replaced(o):
        return NotShareable(f"{path} ({type(o).__name__} at {id(o):#x}) is outside the region, at the "
                            f"address of an object the workers inherited, but not that object as they have "
                            f"it: it was made or changed after the fork (a freed object's address is "
                            f"used again); build it inside clamor.heap()")
    return NotShareable(f"{path} ({type(o).__name__} at {id(o):#x}) is outside the region and "
                        f"was not inherited by the workers: build it inside clamor.heap()")


def _visit_inside(walk, stack, path, o, cache, moves, mode, reads, bring_in):
    """Check ``o``, in the region, and stack what it leads to: its raw
    fields, the words to relocate and the bytes read (``mode``,
    ``reads``), an ndarray's base, dtype and items, a dtype's parts, the
    C memory of an extension type, an instance's own keys, its children."""
    walk.fields(path, o, bring_in)
    if bring_in and promote.warmable(o):
        moves.append((promote.Warm(o), o))
    hidden.note(o)
    if mode is not None:
        mode.inside(path, o)       # the words of it to relocate
    if reads is not None:
        reads.inside(path, o)
    if isinstance(o, np.ndarray):
        # ndarrays are not gc containers: their base, dtype and items are
        # walked here
        if o.base is not None:
            stack.append((path + ".base", o.base, None, cache))
        elif o.nbytes:
            addr = o.__array_interface__["data"][0]
            if not region.contains(addr, o.nbytes):
                raise NotShareable(f"{path}: the data of this {o.dtype} array of {o.nbytes} bytes lies at "
                                   f"{addr:#x}, outside the region")
        stack.append((path + ".dtype", o.dtype, None, cache))
        if o.dtype.hasobject:
            for i, item in enumerate(o.ravel(order="K")):
                stack.append((_Path(path, ".flat[{}]", i), item, None, cache))
            item = None
        return
    if isinstance(o, np.dtype):
        for name, child in _dtype_parts(o):
            stack.append((path + name, child, None, cache))
        child = None
        return
    if _opaque(o):
        walk.opaque(path, o)
    if _has_dict(o):
        # (a dict over its class's keys, frozen at the fork; for workers not
        # forked, a values table over them, frozen for those workers)
        if not (classkeys.frozen(o) if mode is None else mode.keeps_keys(o)):
            _own_keys(o, path, frozen=mode is None)
    in_cache = type(o) is dict and path.key in promote.CACHE_NAMES
    for step, child in _children(o):
        entry = (o, step[1]) if in_cache and isinstance(step, tuple) and step[0] == "[{}]" else cache
        stack.append((_Path(path, *step) if isinstance(step, tuple) else path + step, child, o, entry))
    entry = None
    step = child = None     # (a reference left here would count as another holder)
