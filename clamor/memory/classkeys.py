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
of its own is three.  Walks for workers not forked still give each instance
keys of its own.
"""
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


def frozen_keys(addr):
    """Is ``addr`` the keys table of a class ``frozen`` accepts?"""
    return bool(lib.clamor_py_frozen_keys(addr))


def frozen_split(o):
    """Is instance ``o``'s class as ``frozen`` wants it, and ``o``'s dict
    not made yet or one over its class's keys table, wherever it lies?
    (A region dict over that table is then what ``o`` needs.)"""
    return bool(lib.clamor_py_frozen_split(id(o)))
