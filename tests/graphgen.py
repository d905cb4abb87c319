"""Random object graphs for the walk's differential tests, in one place:
the driver scripts of test_walk_plain.py, test_recheck.py and
test_portable_walk.py import it (``sys.path.insert(0, "tests")``; they run
from the repository's root).

- ``Graphs``: nested dicts, lists, tuples, sets and frozensets (and, if
  the script asks, instances) of strs, bytes, ints, floats, complexes and
  singletons, with leaves made outside any block taken from a pool.
- ``record``, ``parts`` and ``change``: dicts and lists of records, and
  random changes of every kind to them (an entry replaced, added or
  deleted; a record changed in place, deep down; an object made outside
  the region put in; one record shared by two entries; a table grown
  outside a block; an instance whose dict needs keys of its own).

Called under ``clamor.heap()`` where the script wants the objects in the
region: every str, float, int and container is made at the call, none is
a constant of this module's code (the singletons in SINGLES are the
interpreter's own, wherever they are named).
"""
import contextlib

import clamor

SINGLES = (None, True, False, Ellipsis, 0, 7, -3, 256, "", "a", "\xe9")

ATOMS = (lambda r: r.randrange(10**3, 10**12), lambda r: r.random() * 1e6, lambda r: "s" + str(r.random()),
         lambda r: "é" + str(r.randrange(10**6)), lambda r: str(r.randrange(10**6)).encode() * 3,
         lambda r: complex(r.random(), 1.5), lambda r: r.randrange(300, 10**6), lambda r: "k" * r.randrange(2, 40))


def _hashable(x):
    try:
        hash(x)
        return True
    except TypeError:
        return False


class Graphs:
    """Random graphs: containers ``width - 1`` wide at most, three deep.
    ``pool``: objects made outside any block, a leaf of an ``odd`` graph
    with chance ``outside``; ``singles``: the singletons a leaf may be;
    ``instance(r)``: makes an instance whose ``a`` and ``b`` take a
    container's first two items (None: no instances); ``tuple_keys``: dict
    keys may be (int, str) tuples too."""

    def __init__(self, pool, singles=SINGLES, outside=0.1, width=8, instance=None, tuple_keys=False):
        self.pool, self.singles, self.outside, self.width = pool, list(singles), outside, width
        self.instance, self.tuple_keys = instance, tuple_keys

    def leaf(self, r, outside):
        """An atom, made now; a singleton; or, if ``outside``, one of the pool."""
        k = r.randrange(9)
        if k == 0:
            return r.choice(self.singles)
        return r.choice(self.pool) if outside else ATOMS[k - 1](r)

    def build(self, r, depth, odd):
        """A graph below ``depth`` (0: a whole one)."""
        top = 6 if self.instance is None else 7
        k = r.randrange(top) if depth < 3 else top
        if k == top:
            return self.leaf(r, odd and r.random() < self.outside)
        items = [self.build(r, depth + 1, odd) for _ in range(r.randrange(0, self.width))]
        if k == 0:
            return items
        if k == 1:
            return tuple(items)
        if k in (2, 3):
            return {self._key(r, i): x for i, x in enumerate(items)}
        if k == 4 and self.instance is not None:
            o = self.instance(r)
            o.a, o.b = (items + [None, None])[:2]
            return o
        hashable = [x for x in items if _hashable(x)]
        return set(hashable) if k == top - 2 else frozenset(hashable)

    def _key(self, r, i):
        if r.random() < 0.5:
            return i
        if not self.tuple_keys or r.random() < 0.7:
            return "key" + str(i)
        return (i, "t")


def record(r, cls, depth=0):
    """An int, a str, a tuple, or a list, dict or ``cls`` instance of records."""
    k = r.randrange(6 if depth < 2 else 3)
    if k == 0:
        return r.randrange(10**6, 10**9)
    if k == 1:
        return "s" + str(r.random())
    if k == 2:
        return (r.random(), "t" + str(r.randrange(10**6)))
    if k == 3:
        return [record(r, cls, depth + 1) for _ in range(r.randrange(0, 4))]
    if k == 4:
        return {"f" + str(i): record(r, cls, depth + 1) for i in range(r.randrange(0, 4))}
    o = cls()
    o.a, o.b = record(r, cls, depth + 1), record(r, cls, depth + 1)
    return o


def parts(x, cls, out, depth=0):
    """``out`` with the mutable parts of record ``x`` (lists, dicts, ``cls``
    instances), to change in place."""
    if isinstance(x, (list, dict, cls)):
        out.append(x)
    if depth < 3:
        for y in (x if isinstance(x, list) else x.values() if isinstance(x, dict) else
                  (getattr(x, "a", None), getattr(x, "b", None)) if isinstance(x, cls) else ()):
            parts(y, cls, out, depth + 1)
    return out


def put(c, key, attr, v):
    """Add v to the record c: appended to a list, at ``key`` of a dict,
    as attribute ``attr`` of an instance."""
    if isinstance(c, list):
        c.append(v)
    elif isinstance(c, dict):
        c[key] = v
    else:
        setattr(c, attr, v)


def _block():
    """A ``clamor.heap()`` block, unless the caller is in one already (a
    script that changes several roots in one block: each block's edges cost
    two full collections)."""
    return contextlib.nullcontext() if clamor.heap.active() else clamor.heap()


def change(r, root, cls, kinds=11):
    """Change dict or list ``root`` of records at random; returns what
    changed.  ``kinds``: 11, every kind; 9, none of "table grown outside"
    and "instance needing keys".  Called in a block or outside one."""
    keys = list(root.keys()) if isinstance(root, dict) else list(range(len(root)))
    k = r.randrange(kinds)
    if not keys:
        k = 1
    if k == 0:
        with _block():
            root[r.choice(keys)] = record(r, cls)
        return "entry replaced"
    if k == 1:
        with _block():
            if isinstance(root, dict):
                root["new" + str(r.random())] = record(r, cls)
            else:
                root.append(record(r, cls))
        return "entry added"
    if k == 2:
        with _block():
            if isinstance(root, dict):
                del root[r.choice(keys)]
            else:
                root.pop(r.randrange(len(root)))
        return "entry deleted"
    cs = [c for key in r.sample(keys, min(len(keys), 8)) for c in parts(root[key], cls, [])]
    if not cs:
        return "none"
    c = r.choice(cs)
    if k in (3, 4, 5):
        with _block():
            v = record(r, cls)
            if isinstance(c, list):
                c.append(v) if not c or r.random() < 0.5 else c.__setitem__(r.randrange(len(c)), v)
            elif isinstance(c, dict):
                c["g" + str(r.randrange(5))] = v
            else:
                setattr(c, r.choice("ab"), v)
        return "record changed in place"
    if k == 6:
        with clamor.heap.suspended():
            v = ["outside" + str(r.random())]            # made outside any block: no target either
            put(c, "out", "a", v)
        return "object outside put in"
    if k == 7 and len(keys) > 1:
        a, b = r.sample(keys, 2)
        with _block():
            root[a] = root[b] if isinstance(root[b], (list, dict, cls)) else [root[b]]
            if root[a] is not root[b]:
                root[b] = root[a]
        return "record shared by two entries"
    if k == 8 and isinstance(c, dict):
        with clamor.heap.suspended():
            for j in range(20):
                c["grown" + str(j)] = None               # its table grows outside the block
        return "table grown outside"
    if k == 9:
        with _block():
            o = cls()
            o.z = 1.5
        with clamor.heap.suspended():
            put(c, "inst", "b", o)
        return "instance needing keys"
    with _block():
        if isinstance(c, (list, dict)):
            c.clear()
        else:
            c.a = None
    return "record emptied"
