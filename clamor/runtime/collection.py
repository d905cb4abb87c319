"""DataCollection: a lazy, partitioned collection, like Spark's RDD.

A collection is a node of a lineage graph.  Transformations make new nodes
and run nothing; an action (``collect``, ``reduce``, ``count``, ...) makes the
cluster run the stages that compute it.  Narrow transformations (``map``,
``filter``, ``flat_map``, ``map_partitions``, ``zip``) are fused into the
task that computes a partition; keyed ones (``reduce_by_key``,
``group_by_key``, ``join``) need a shuffle, which ends a stage: map tasks
leave their buckets on the workers, and reduce tasks fetch them from the
workers directly, not through the driver.

A partition is a sequence: a list, or an ndarray for collections made from
arrays (``parallelize`` of an ndarray, ``read_npy``), so ``map_partitions``
can work on whole arrays.

Collections are shipped to workers as part of a stage (cloudpickle, with
region arrays by reference); the driver-side cluster handle is not shipped.
"""
import functools
import glob as _glob
import weakref
import itertools
import numbers
import os
import sys
import types
import zlib

import numpy as np

from .. import errors
from ..memory.heap import active as heap_active, outside, suspended

_ids = itertools.count(1)
_MASK = 0x7FFFFFFFFFFFFFFF


def stable_hash(key):
    """A hash that is the same in every process and agrees with ``==``.

    str and bytes hashing is randomized per interpreter (spawned workers would
    disagree), so they go through crc32.  Numbers use Python's own numeric
    hash, which is not randomized and is equal for equal values across int,
    float, Fraction, Decimal, complex and numpy scalars (0.5 ==
    np.float32(0.5), 3 == 3.0): keys that compare equal meet in one
    partition.  NaN, equal to nothing, hashes to one constant.
    """
    if key is None:
        return 0
    if isinstance(key, (numbers.Number, np.number, np.bool_)):
        if key != key:  # NaN (hash(nan) is per object since Python 3.10)
            return 0x7FF8
        return hash(key) & _MASK
    if isinstance(key, str):
        return zlib.crc32(key.encode("utf-8", "surrogatepass"))
    if isinstance(key, bytes):
        return zlib.crc32(key)
    if isinstance(key, tuple):
        h = 0x345678
        for k in key:
            h = (h * 1000003) ^ stable_hash(k)
        return h & _MASK
    if isinstance(key, frozenset):
        return functools.reduce(lambda a, b: a ^ b, (stable_hash(k) for k in key), 0x5A5A)
    return hash(key) & _MASK  # user types: their own __hash__


def _callable(fn, what):
    if not callable(fn):
        raise TypeError(f"{what} takes a function, not {type(fn).__name__}")


def _as_list(x):
    return x if isinstance(x, (list, np.ndarray)) else list(x)


def _outside_heap(cls):
    """Run the constructor and the public methods of ``cls`` outside any
    ``clamor.heap()`` block: collections are the runtime's objects, not data
    the workers read in place."""
    for name, fn in list(vars(cls).items()):
        if isinstance(fn, types.FunctionType) and (name == "__init__" or not name.startswith("_")):
            setattr(cls, name, outside(fn))
    return cls


class DataCollection:
    """A partitioned collection, made by a Cluster's sources (``parallelize``,
    ``range``, ``read_text``, ``read_npy``) and transformed lazily; actions
    (``collect``, ``count``, ``reduce``, ``sum``, ``take``, ``foreach``) run
    it on the workers.  (Implementation: ``ctx`` in ``_compute`` is the
    worker's task context, clamor.executor.TaskContext.)"""

    def __new__(cls, *args, **kwargs):
        if not heap_active():
            return super().__new__(cls)
        with suspended():
            return super().__new__(cls)

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        _outside_heap(cls)

    def __init__(self, cluster, num_partitions, deps=()):
        self.id = next(_ids)
        self._cluster = cluster
        self.num_partitions = int(num_partitions)
        self.deps = tuple(deps)
        self.cached = False

    # -- pickling: the cluster stays on the driver ------------------------------
    def __getstate__(self):
        st = dict(self.__dict__)
        st["_cluster"] = None
        return st

    def __repr__(self):
        return f"<{type(self).__name__} #{self.id}: {self.num_partitions} partitions>"

    # -- computing a partition (on a worker) -----------------------------------
    def partition(self, p, ctx):
        # (a collection in ``restore`` was unpersisted: this task re-runs a
        # stage that read its cached snapshot, and reads it again)
        if self.cached or self.id in ctx.locs.get("restore", ()):
            hit = ctx.cached_partition(self.id, p)
            if hit is not None:
                return hit
            part = _as_list(self._compute(p, ctx))
            ctx.cache_partition(self.id, p, part)
            return part
        return self._compute(p, ctx)

    def _compute(self, p, ctx):  # pragma: no cover - abstract
        raise NotImplementedError

    # -- transformations --------------------------------------------------------
    def map_partitions(self, fn):
        """``fn(partition) -> iterable`` for each partition."""
        _callable(fn, "map_partitions")
        return Narrow(self, lambda part, p: fn(part))

    def map_partitions_with_index(self, fn):
        """``fn(index, partition) -> iterable`` for each partition."""
        _callable(fn, "map_partitions_with_index")
        return Narrow(self, lambda part, p: fn(p, part))

    def map(self, fn):
        """``fn(x)`` for each element (lazy, as every transformation)."""
        _callable(fn, "map")
        return Narrow(self, lambda part, p: [fn(x) for x in part])

    def filter(self, fn):
        """The elements for which ``fn(x)`` is true."""
        _callable(fn, "filter")
        return Narrow(self, lambda part, p: [x for x in part if fn(x)])

    def flat_map(self, fn):
        """The elements of ``fn(x)`` (an iterable) for each element."""
        _callable(fn, "flat_map")
        return Narrow(self, lambda part, p: [y for x in part for y in fn(x)])

    def zip(self, other):
        """Pairs (a, b) of elements at the same position.  Both collections
        must have the same number of partitions, and the same number of
        elements in each (as Spark's zip requires)."""
        if not isinstance(other, DataCollection):
            raise TypeError("zip takes another DataCollection")
        if other.num_partitions != self.num_partitions:
            raise errors.ConfigError(f"zip needs equal partition counts: {self.num_partitions} "
                                     f"and {other.num_partitions}")
        return Zipped(self, other)

    def key_by(self, fn):
        """``(fn(x), x)`` pairs."""
        _callable(fn, "key_by")
        return self.map(lambda x: (fn(x), x))

    def map_values(self, fn):
        """``(k, fn(v))`` for each ``(k, v)`` pair."""
        _callable(fn, "map_values")
        return self.map(lambda kv: (kv[0], fn(kv[1])))

    def reduce_by_key(self, fn, partitions=None):
        """(k, v) pairs -> (k, fn-reduced v), combining on the map side first."""
        _callable(fn, "reduce_by_key")
        return Shuffled([self], self.num_partitions if partitions is None else partitions, combine=fn)

    def group_by_key(self, partitions=None):
        """(k, v) pairs -> (k, [v, ...])."""
        return Shuffled([self], self.num_partitions if partitions is None else partitions)

    def cogroup(self, other, partitions=None):
        """(k, ([v...], [w...])) for every key of either collection."""
        if not isinstance(other, DataCollection):
            raise TypeError(f"cogroup and join take another DataCollection, not {type(other).__name__}")
        if partitions is None:
            partitions = max(self.num_partitions, other.num_partitions)
        return Shuffled([self, other], partitions)

    def join(self, other, partitions=None):
        """Inner join of (k, v) and (k, w) pairs: (k, (v, w))."""
        return self.cogroup(other, partitions).flat_map(
            lambda kv: [(kv[0], (v, w)) for v in kv[1][0] for w in kv[1][1]])

    def cache(self):
        """Keep computed partitions on the workers across actions (until
        ``unpersist()`` or until this collection is garbage-collected)."""
        if not self.cached and self._cluster is not None:
            weakref.finalize(self, self._cluster._forget, ("cache", self.id))
        self.cached = True
        return self

    def unpersist(self):
        """Stop caching; the workers drop the partitions they keep."""
        self.cached = False
        if self._cluster is not None:
            self._cluster._drop_cache(self.id)
        return self

    # -- actions ----------------------------------------------------------------
    def _run(self, kind, arg=None, partitions=None):
        if self._cluster is None:
            raise errors.ClamorError("this collection is not attached to a cluster (actions run on the driver)")
        return self._cluster._run_action(self, kind, arg, partitions)

    def collect(self):
        """Every element, in partition order, as a list (an action: it runs
        the stages, and raises TaskError if a task raises, WorkerLost if the
        work cannot be recovered, NotSerializable if a function cannot be
        shipped; the other actions alike)."""
        parts = self._run("collect")
        return [x for part in parts for x in part]

    def count(self):
        """The number of elements."""
        return sum(self._run("count"))

    def reduce(self, fn):
        """The elements combined with ``fn(a, b)`` (associative), in
        partition order; ValueError for an empty collection."""
        _callable(fn, "reduce")
        partials = [v for ok, v in self._run("reduce", fn) if ok]
        if not partials:
            raise ValueError("reduce() of an empty collection")
        return functools.reduce(fn, partials)

    def sum(self):
        """The sum of the elements (0 for none; arrays add elementwise)."""
        partials = [v for ok, v in self._run("sum") if ok]
        return functools.reduce(lambda a, b: a + b, partials) if partials else 0

    def take(self, n):
        """The first ``n`` elements, computing as few partitions as it can."""
        if isinstance(n, bool) or not isinstance(n, numbers.Integral):
            raise TypeError(f"take needs an int, not {type(n).__name__}")
        n = min(int(n), sys.maxsize)
        if n <= 0:
            return []
        out, p, step = [], 0, 1
        while p < self.num_partitions and len(out) < n:
            hi = min(self.num_partitions, p + step)
            for part in self._run("take", n - len(out), list(range(p, hi))):
                out.extend(part)
            p, step = hi, step * 4
        return out[:n]

    def foreach(self, fn):
        """``fn(x)`` on the workers for its side effects (which may run more
        than once for a partition, after a failure or for a straggler)."""
        _callable(fn, "foreach")
        self._run("foreach", fn)


# ---- sources -----------------------------------------------------------------

_outside_heap(DataCollection)


class Parallel(DataCollection):
    """``cl.parallelize(seq, partitions)``: contiguous slices; each task gets
    its own slice with it (region arrays travel by reference)."""

    def __init__(self, cluster, data, partitions):
        n = len(data)
        super().__init__(cluster, partitions)
        bounds = [(n * i) // partitions for i in range(partitions + 1)]
        self._slices = [data[bounds[i]:bounds[i + 1]] for i in range(partitions)]

    def __getstate__(self):
        st = super().__getstate__()
        st["_slices"] = None  # each task carries its own slice
        return st

    def task_data(self, p):
        return self._slices[p]

    def _compute(self, p, ctx):
        return ctx.source_data(self.id, p)


class Range(DataCollection):
    def __init__(self, cluster, start, stop, step, partitions):
        super().__init__(cluster, partitions)
        self._r = range(start, stop, step)

    def _compute(self, p, ctx):
        n = len(self._r)
        lo, hi = (n * p) // self.num_partitions, (n * (p + 1)) // self.num_partitions
        return list(self._r[lo:hi])


def _expand(paths):
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    out = []
    for p in paths:
        p = os.fspath(p)
        hits = sorted(_glob.glob(p)) if any(c in p for c in "*?[") else [p]
        out.extend(hits)
    if not out:
        raise FileNotFoundError(f"no files match {paths!r}")
    for p in out:
        if not os.path.isfile(p):
            raise FileNotFoundError(p)
    return out


class TextFiles(DataCollection):
    """Lines of text files.  Each file is split into byte ranges; a range
    owns the lines that start inside it, so workers read in parallel."""

    def __init__(self, cluster, paths, partitions=None, encoding="utf-8"):
        files = _expand(paths)
        sizes = [os.path.getsize(f) for f in files]
        want = max(int(partitions or len(files)), 1)
        splits = []
        total = sum(sizes) or 1
        for f, size in zip(files, sizes):
            k = max(1, round(want * size / total)) if partitions else 1
            for i in range(k):
                splits.append((f, size * i // k, size * (i + 1) // k))
        super().__init__(cluster, len(splits))
        self._splits, self._encoding = splits, encoding

    def _compute(self, p, ctx):
        path, lo, hi = self._splits[p]
        out = []
        with open(path, "rb") as f:
            if lo > 0:  # skip the line that started in the previous range
                f.seek(lo - 1)
                f.readline()
            while f.tell() < hi:
                line = f.readline()
                if not line:
                    break
                # strip one "\n" or "\r\n", not every trailing "\r" ("a\r\r\n" is "a\r")
                if line.endswith(b"\n"):
                    line = line[:-2] if line.endswith(b"\r\n") else line[:-1]
                out.append(line.decode(self._encoding))
        return out


class NpyFiles(DataCollection):
    """One partition per .npy file: the array itself (rows are elements)."""

    def __init__(self, cluster, paths):
        files = _expand(paths)
        super().__init__(cluster, len(files))
        self._files = files

    def _compute(self, p, ctx):
        return np.load(self._files[p], allow_pickle=False)


# ---- transformations ---------------------------------------------------------

class Narrow(DataCollection):
    """``fn(partition, index)`` over one parent; chains of these run fused."""

    def __init__(self, parent, fn):
        super().__init__(parent._cluster, parent.num_partitions, [parent])
        self._fn = fn

    def _compute(self, p, ctx):
        return self._fn(self.deps[0].partition(p, ctx), p)


class Zipped(DataCollection):
    def __init__(self, a, b):
        super().__init__(a._cluster, a.num_partitions, [a, b])

    def _compute(self, p, ctx):
        a, b = (_as_list(d.partition(p, ctx)) for d in self.deps)
        if len(a) != len(b):
            raise ValueError(f"zip: partition {p} has {len(a)} and {len(b)} elements")
        return list(zip(a, b))


class Shuffled(DataCollection):
    """The reduce side of a shuffle over one parent (group/reduce by key) or
    two (cogroup).  Each parent's map side is its own shuffle, with id
    ``shuffle_ids[i]``; bucket r of map partition m is block
    ("shuffle", shuffle_id, m, r) on the worker that ran that map task."""

    def __init__(self, parents, partitions, combine=None):
        if isinstance(partitions, bool) or not isinstance(partitions, numbers.Integral) or partitions < 1:
            raise errors.ConfigError(f"a shuffle needs a positive int of partitions, not {partitions!r}")
        partitions = int(partitions)
        super().__init__(parents[0]._cluster, partitions, parents)
        self.combine = combine
        self.shuffle_ids = [next(_ids) for _ in parents]
        if self._cluster is not None:  # buckets live until the collection goes
            for sid in self.shuffle_ids:
                weakref.finalize(self, self._cluster._forget, ("shuffle", sid))

    def bucketize(self, i, part):
        """Map side for parent ``i``: one dict key -> value(s) per bucket."""
        r = self.num_partitions
        buckets = [{} for _ in range(r)]
        comb = self.combine
        for kv in part:
            try:
                k, v = kv
            except (TypeError, ValueError):
                raise TypeError(f"keyed operations need (key, value) pairs, got {kv!r}") from None
            b = buckets[stable_hash(k) % r]
            if comb is None:
                b.setdefault(k, []).append(v)
            elif k in b:
                b[k] = comb(b[k], v)
            else:
                b[k] = v
        return buckets

    def _compute(self, p, ctx):
        merged = [{} for _ in self.deps]
        comb = self.combine
        for i, sid in enumerate(self.shuffle_ids):
            acc = merged[i]
            for block in ctx.shuffle_blocks(sid, self.deps[i].num_partitions, p):
                for k, v in block.items():
                    if k not in acc:
                        acc[k] = v if comb is not None else list(v)
                    elif comb is None:
                        acc[k].extend(v)
                    else:
                        acc[k] = comb(acc[k], v)
        if len(self.deps) == 1:
            return list(merged[0].items())
        keys = dict.fromkeys(itertools.chain(*merged))
        return [(k, tuple(m.get(k, []) for m in merged)) for k in keys]


# ---- per-partition action functions (run on the workers) ----------------------

def _packed(part):
    """A partition as the driver will iterate it, in a form that pickles
    fast: an ndarray as itself (one buffer, where a list of its elements
    pickles each numpy scalar apart, about 40x slower), and a list of numpy
    numbers of one type as an array of that type (iterating it gives the
    same scalars back).  Anything else as a list."""
    if isinstance(part, np.ndarray):
        return part
    part = _as_list(part)
    if len(part) >= 16 and isinstance(part[0], (np.number, np.bool_)) \
            and not isinstance(part[0], np.timedelta64):  # units could differ
        t = type(part[0])
        if all(type(x) is t for x in part):
            return np.array(part, dtype=t)
    return part


def partition_result(kind, part, arg):
    """What a result task sends back for one partition."""
    if kind == "collect":
        return _packed(part)
    if kind == "count":
        return len(part) if hasattr(part, "__len__") else sum(1 for _ in part)
    if kind == "take":
        if isinstance(part, np.ndarray):
            return part[:arg]
        return _packed(list(itertools.islice(iter(part), arg)))
    if kind == "cache":       # a lineage re-run of cached partitions: computing them caches them
        return None
    if kind == "foreach":
        for x in part:
            arg(x)
        return None
    if kind == "reduce":
        it = iter(part)
        try:
            first = next(it)
        except StopIteration:
            return (False, None)
        return (True, functools.reduce(arg, it, first))
    if kind == "sum":
        if isinstance(part, np.ndarray):
            return (part.shape[0] > 0, part.sum(axis=0) if part.shape[0] else None)
        it = iter(part)
        try:
            first = next(it)
        except StopIteration:
            return (False, None)
        return (True, functools.reduce(lambda a, b: a + b, it, first))
    raise ValueError(f"unknown action {kind!r}")
