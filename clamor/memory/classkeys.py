"""Classes' shared keys tables, frozen before each fork of workers
(csrc/pyclasskeys.c).

CPython keeps a plain instance's attribute names in one keys table for its
whole class, outside the region, and appends a name first set on any
instance to it in place.  A forked worker has the table as it was at the
fork.  ``freeze()`` (before each fork: ``hooks.prepare_fork``) stops
CPython appending to every class's table that names something; a name set
later gives that instance a table of its own, as a full table does.  The
walks for forked workers then take a region instance whose attributes lie
in a region values table, with no dict made yet (before CPython 3.13), or
whose dict is a region dict over its class's table, as it is
(``frozen``), when that table was
frozen before the Cluster's workers were forked (``accept``, at the
Cluster's fork) and reads as it did then.  The check before a stage reads
that values table (``_reads.pointer_extents``).  An instance whose dict was
made outside the region (``vars()`` or a pickle outside a block) gets a
region copy of it (``walk._own_keys``), one object where a dict with keys
of its own is three.

Workers not forked import the class and build its table themselves.  The
portable walks (before CPython 3.13) take a region instance whose
attributes lie in a region values table only as it lies too, its class's
table frozen then if it was not, and number a "classkeys" target for the
class, which carries the table's names in order (``Targets.class_keys``).
Before a task reads such an instance, each worker makes its own class's
table name those attributes at the same places and freezes it
(``adopt``); a worker whose table already names others there is refused.
Other instances, and every instance on 3.13 (its values lie inline), are
given keys of their own.
"""
import gc

from .. import errors
from .._native import lib

_seq = [0]      # the freezes made (one before each fork of workers)


def freeze(classes):
    """Freeze the keys table of each of ``classes`` that has one naming
    something (the others are left as they are)."""
    _seq[0] += 1
    for t in classes:
        if lib.clamor_py_freeze_keys(id(t), _seq[0]) < 0:
            raise MemoryError("no memory to record the classes' keys tables")


def accept():
    """The Cluster's workers were forked after the last ``freeze``."""
    lib.clamor_py_frozen_accept(_seq[0])


def frozen(o):
    """Is instance ``o``'s class's keys table frozen before the Cluster's
    fork and reading so still, and ``o``'s values table in the region, with
    no dict made or a region dict over that table?"""
    return bool(lib.clamor_py_frozen_instance(id(o)))


def keyed(o):
    """Is region instance ``o`` laid out over its class's table frozen for
    workers not forked, with no dict made (as the portable walk took it)?"""
    return bool(lib.clamor_py_keyed_instance(id(o)))


def frozen_keys(addr):
    """Is ``addr`` the keys table of a class ``frozen`` accepts?"""
    return bool(lib.clamor_py_frozen_keys(addr))


def frozen_split(o):
    """Is instance ``o``'s class as ``frozen`` wants it, and ``o``'s dict
    not made yet or one over its class's keys table, wherever it lies?
    (A region dict over that table is then what ``o`` needs.)"""
    return bool(lib.clamor_py_frozen_split(id(o)))


_makers = []     # (worker) instances made to lay a table out: kept, never finalized


def adopt(cls, names):
    """(A worker not forked.)  Make class ``cls``'s keys table name the
    strs ``names`` at their places, in order, as the driver's frozen table
    does, and freeze it: a region instance laid out over the driver's is
    then read right here.  Its address.

    A table that names a prefix of them (a fresh worker's names none) has
    the rest appended, as CPython appends a name first set on an instance.
    One that names others at those places (this worker set attributes in
    another order first) is replaced by one laid out as the driver's, each
    instance of ``cls`` here given its dict first (made from its values,
    over the old table): nothing here reads through the old table again."""
    names = tuple(names)
    try:
        return _adopt(cls, names)
    except errors.NotShareable:
        raise
    except Exception as err:      # (a class that will not make an instance of its own here, say)
        raise errors.NotShareable(f"this worker cannot lay out {cls.__module__}.{cls.__qualname__}'s keys table "
                                  f"as the driver's {list(names)}: {type(err).__name__}: {err}") from err


def _adopt(cls, names):
    have = lib.clamor_py_keys_prefix(id(cls), id(names))
    if 0 <= have < len(names) and not any(_descriptor(cls, name) for name in names[have:]):
        maker = object.__new__(cls)       # (no __init__ and no __setattr__ of the class runs)
        _makers.append(maker)
        for name in names[have:]:
            object.__setattr__(maker, name, None)
        have = lib.clamor_py_keys_prefix(id(cls), id(names))
    if have != len(names):
        _lay_out_anew(cls, names)
    addr = lib.clamor_py_keys_freeze_at(id(cls), id(names))
    if not addr and have == len(names):     # (another thread appended a name in between)
        _lay_out_anew(cls, names)
        addr = lib.clamor_py_keys_freeze_at(id(cls), id(names))
    if not addr:
        raise errors.NotShareable(
            f"region instances of {cls.__module__}.{cls.__qualname__} lay their attributes out as the driver's "
            f"class names them, {list(names)}, and this worker's class cannot be made to name them so")
    return addr


def _descriptor(cls, name):
    return any(hasattr(vars(b).get(name), "__set__") for b in type.mro(cls))


def _lay_out_anew(cls, names):
    twin = type("_" + cls.__name__ + "_as_the_driver_lays_it_out", (), {})
    maker = object.__new__(twin)
    _makers.append(maker)
    for name in names:
        object.__setattr__(maker, name, None)
    if lib.clamor_py_keys_prefix(id(twin), id(names)) != len(names):
        raise errors.NotShareable(f"this worker cannot lay out a keys table as the driver's "
                                  f"{cls.__module__}.{cls.__qualname__}: {list(names)}")
    # (each instance of cls here given its dict, made from its values over
    # the old table, and the table swapped, in C: no thread runs between)
    if lib.clamor_py_keys_relayout(id(cls), id(twin), id(gc.get_objects)) < 0:
        raise errors.NotShareable(f"{cls.__module__}.{cls.__qualname__}'s keys table could not be laid out anew "
                                  f"on this worker")
