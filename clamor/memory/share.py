"""``clamor.share(obj)``: can workers use ``obj`` in place?

The walk is ``clamor.memory.walk``'s; for workers not forked from the
driver, ``clamor.memory.portable`` decides what they can have and lists
the words to relocate.
"""
from . import portable as _portable
from .walk import LIMIT, Reads, _walk, note_fork  # noqa: F401  (note_fork: the Cluster's)
from ..errors import NotShareable, ShareWarning  # noqa: F401  (share()'s own)


def share(obj, limit=LIMIT, portable=False):
    """Check that workers can use ``obj`` in place; returns ``obj``.

    Raises NotShareable naming the path to the first object, raw pointer
    field (an array's shape buffer, a list's item array, ...) or word of an
    extension object's C memory that lies neither in the region nor in
    memory the workers inherited.  Warns (``ShareWarning``) where it cannot
    tell: a word in C memory behind an extension object that may or may not
    be a pointer out of the region, or C memory too large to scan to the
    end.  ``limit``: the most objects to visit (more are refused).

    ``portable=True`` asks instead whether workers that were not forked
    from the driver (spawned, on other hosts) can use it: everything
    outside the region that ``obj`` points at must be in a loaded image,
    importable (a module, a class, a function), or an immutable constant a
    worker can make equal (see ``clamor.memory.portable``)."""
    if portable:
        _portable.check(obj, limit)
        return obj
    _walk(obj, limit, None)
    return obj


def vouch(obj, limit=LIMIT):
    """share(obj) for the runtime: returns the ``Reads`` the verdict rests
    on, so that the check is made again once they change."""
    reads = Reads()
    _walk(obj, limit, None, reads)
    return reads.seal()
