"""The driver of the differential test of clamor.share() (test_differential.py).

The test runs this file, followed by a call to ``main``, as the script of a
fresh interpreter, so the classes below are module-level classes of the
driver's ``__main__``: they exist when workers are forked.

One round: outside any block, allocate and drop what fills numpy's caches
and CPython's free lists (``churn``); build every kind of object under
``clamor.heap()`` (``KINDS``); ``clamor.share`` each; fingerprint the approved
ones on the driver (``fingerprint``: one line per path and field, down to
shapes, strides, dtypes, bytes, lengths and hash lookups); then a stage per
kind has the workers fingerprint the same objects, read in place through a
region list and captured directly by the task, and every line must agree.

Every object a generator returns is built inside the block, strings, floats,
dtypes and dict keys included (a constant from a code object lies outside
the region), except in ``inherited``, which refers on purpose to objects
made at import, before any fork, and ``inst_init``, whose attribute names
are constants of the class's code.
"""
import array
import hashlib
import json
import os
import random
import time

import numpy as np
import scipy.spatial

import clamor


class Plain:
    pass


class Child(Plain):
    pass


class Point:                      # attribute names are constants of this code: inherited
    def __init__(self, px, py, pz):
        self.px, self.py, self.pz = px, py, pz


class Slotted:
    __slots__ = ("sa", "sb", "sc", "sd")


class SlotChild(Slotted):
    __slots__ = ("se",)


class Mixed:
    __slots__ = ("ma", "__dict__")


# Made at import, before any fork: workers inherit them.
INHERITED = [(1.25, "made at import"), np.arange(5.0), np.True_, np.float64(2.5), Plain]

# ---- generators: each runs inside clamor.heap() --------------------------------

SCRIPTS = {"ascii": [(0x20, 0x7e)], "latin1": [(0x20, 0x7e), (0xa0, 0xff)],
           "bmp": [(0x20, 0x7e), (0xa0, 0xff), (0x100, 0xd7ff), (0xe000, 0xfffd)],
           "astral": [(0x20, 0x7e), (0x100, 0xd7ff), (0x10000, 0x10ffff)]}
NUMERIC = ["?", "i1", "i2", "<i4", "<i8", "u1", "<u2", "<u4", "<u8", ">i4", ">u8", "<f2", "<f4", "<f8", ">f8",
           "<c8", "<c16", ">c16"]


def size(r, cap):
    """Mostly small, now and then empty, one, or up to ``cap``."""
    x = r.random()
    return 0 if x < 0.04 else 1 if x < 0.08 else r.randint(2, 12) if x < 0.6 else r.randint(2, cap)


def text(r, n, script):
    ranges = SCRIPTS[script]
    out = [chr(r.randint(*ranges[-1]))] if n else []     # at least one of the widest kind
    out += [chr(r.randint(*r.choice(ranges))) for _ in range(n - 1)]
    r.shuffle(out)
    return "".join(out)


def name(r, i):
    return "zq" + str(i) + chr(r.randint(0x61, 0x7a))


def real(r):
    x = r.random()
    if x < 0.05:
        return r.choice([float("nan"), float("inf"), -float("inf"), -(r.random() * 0.0)])
    return (r.random() - 0.5) * 10.0 ** r.randint(-300, 300)


def big_int(r):
    bits = r.choice([31, 63, 64, 65, 130, 1000, 5000, 40000])
    return r.getrandbits(bits) * r.choice([1, -1]) + r.getrandbits(8) * 1000


def shape(r, nd, cap):
    dims = [r.randint(1, 4) for _ in range(nd)]
    while dims and np.prod(dims) > cap:
        dims[r.randrange(nd)] = 1
    if dims and r.random() < 0.06:
        dims[r.randrange(nd)] = 0
    return tuple(dims)


def numeric(r, nr, dt, shp):
    dt = np.dtype(dt)
    if dt.kind == "b":
        return np.asarray(nr.random(shp) < 0.5)            # not a numpy bool for shape ()
    if dt.kind in "iu":
        info = np.iinfo(dt)
        return nr.integers(info.min, info.max, size=shp, dtype=dt.newbyteorder("="), endpoint=True).astype(dt)
    vals = nr.standard_normal(shp) * 10.0 ** r.randint(-3, 4)
    if dt.kind == "c":
        vals = vals + 1j * nr.standard_normal(shp)
    return vals.astype(dt)


def leaf(r, nr, depth=0):
    c = r.randrange(16)
    if c == 0:
        return r.randint(-5, 256)                          # a small int: a static object
    if c == 1:
        return big_int(r)
    if c == 2:
        return real(r)
    if c == 3:
        return complex(real(r), real(r))
    if c in (4, 5):
        return text(r, r.randint(0, 24), r.choice(list(SCRIPTS)))
    if c == 6:
        return r.randbytes(r.randint(2, 40))
    if c == 7:
        return r.choice([None, True, False])
    if c == 8:
        return np.float64(real(r)) if r.random() < 0.5 else np.int32(r.randint(-2**31, 2**31 - 1))
    if c == 9:
        return numeric(r, nr, r.choice(NUMERIC), shape(r, r.randint(0, 6), 64))
    if c == 10:
        return r.randint(257, 10**6) * r.choice([1, -1])
    if depth < 3 and c in (11, 12, 13):
        return container(r, nr, depth + 1)
    return text(r, r.randint(2, 8), "ascii")


def hashable(r, nr):
    c = r.randrange(7)
    if c == 0:
        return r.randint(-10**9, 10**9)
    if c == 1:
        return big_int(r)
    if c == 2:
        return real(r)
    if c == 3:
        return (text(r, r.randint(2, 6), "latin1"), r.randint(300, 999))
    if c == 4:
        return r.randbytes(r.randint(2, 9))
    if c == 5:
        return frozenset(r.randint(300, 10**4) for _ in range(r.randint(1, 4)))
    return text(r, r.randint(2, 12), r.choice(list(SCRIPTS)))


def container(r, nr, depth):
    n, c = size(r, 12), r.randrange(5)
    if c == 0:
        return [leaf(r, nr, depth) for _ in range(n)]
    if c == 1:
        return tuple(leaf(r, nr, depth) for _ in range(max(n, 1)))
    if c == 2:
        return {text(r, r.randint(2, 8), "ascii") + str(i): leaf(r, nr, depth) for i in range(n)}
    if c == 3:
        return {hashable(r, nr) for _ in range(n)}
    return frozenset(hashable(r, nr) for _ in range(n))


def gen_nd_numeric(r, nr):
    shp = shape(r, r.randint(0, 6), r.choice([64, 500, 4000])) if r.random() < 0.8 else (r.randint(65, 20000),)
    arr = numeric(r, nr, r.choice(NUMERIC), shp)
    return {text(r, 3, "ascii"): arr} if r.random() < 0.5 else arr


def gen_nd_small(r, nr):
    # size 0..64: numpy takes the shape buffers of these from its cache
    return [numeric(r, nr, r.choice(NUMERIC), shape(r, r.randint(0, 6), 64)) for _ in range(r.randint(1, 4))]


def gen_nd_datetime(r, nr):
    unit = r.choice(["Y", "M", "D", "h", "s", "ms", "us", "ns"])
    raw = nr.integers(-10**9, 10**9, size=shape(r, r.randint(0, 4), 200), dtype="<i8")
    raw.flat[: raw.size // 7] = np.iinfo(np.int64).min                    # NaT
    arr = raw.view(np.dtype(r.choice(["<M8[", "<m8["]) + unit + "]"))
    return arr.astype(arr.dtype.newbyteorder(">")) if r.random() < 0.3 else arr


def gen_nd_text(r, nr):
    shp = shape(r, r.randint(0, 3), 60)
    n = int(np.prod(shp))
    if r.random() < 0.5:
        items = [r.randbytes(r.randint(0, 9)) for _ in range(n)]
        dt = "S" + str(r.randint(1, 12))
    else:
        items = [text(r, r.randint(0, 9), r.choice(list(SCRIPTS))) for _ in range(n)]
        dt = r.choice(["<U", ">U"]) + str(r.randint(1, 12))
    return np.array(items, dtype=dt).reshape(shp)


def struct_dtype(r):
    names = [name(r, i) for i in range(r.randint(1, 5))]
    fmts = ["u1", "<i2", ">i4", "<f8", "<c8", "S3", "<U2", "?", "<M8[s]", ("<f4", (2,)), ("u1", (2, 3))]
    fields = [(nm, *((f,) if isinstance(f, str) else f)) for nm, f in zip(names, (r.choice(fmts) for _ in names))]
    if r.random() < 0.5:                                       # nested
        inner = [(name(r, 10 + i), r.choice(["u1", "<f4", ">i8"])) for i in range(r.randint(1, 3))]
        fields.append((name(r, 20), inner, (r.randint(1, 2),)) if r.random() < 0.5 else (name(r, 20), inner))
    c = r.randrange(3)
    if c == 0:
        return np.dtype(fields, align=True)
    if c == 1:                                                  # explicit offsets, a gap and itemsize
        base = np.dtype(fields)
        offs = [base.fields[f[0]][1] * 2 for f in fields]
        return np.dtype({"names": [f[0] for f in fields], "formats": [base.fields[f[0]][0] for f in fields],
                         "offsets": offs, "itemsize": base.itemsize * 2 + r.randint(0, 5)})
    return np.dtype(fields)


def gen_nd_struct(r, nr):
    dt = struct_dtype(r)
    shp = shape(r, r.randint(0, 3), 40)
    raw = nr.integers(0, 256, size=int(np.prod(shp)) * dt.itemsize, dtype=np.uint8)
    arr = raw.view(dt).reshape(shp)
    if r.random() < 0.3 and dt.names:
        return arr[r.choice(dt.names)]                          # a field: a view at an offset
    return arr


def gen_nd_object(r, nr):
    shp = shape(r, r.randint(0, 3), 30)
    flat = np.empty(int(np.prod(shp)), dtype=object)
    for i in range(flat.size):
        flat[i] = leaf(r, nr, 1)                   # one element: a list or an array is stored as is
    return flat.reshape(shp)


VIEWS = ["rev", "step", "inner", "T", "perm", "reshape", "newaxis", "broadcast", "view", "index", "swap", "diag",
         "realimag"]


def gen_nd_view(r, nr):
    arr = numeric(r, nr, r.choice(NUMERIC), shape(r, r.randint(1, 4), r.choice([60, 600])))
    for _ in range(r.randint(1, 3)):
        op, ax = r.choice(VIEWS), r.randrange(max(arr.ndim, 1))
        sl = [slice(None)] * arr.ndim
        if op == "rev" and arr.ndim:
            sl[ax] = slice(None, None, -r.randint(1, 3))
        elif op == "step" and arr.ndim:
            sl[ax] = slice(r.randint(0, 1), None, r.randint(2, 3))
        elif op == "inner" and arr.ndim:
            sl[ax] = slice(1, -1)
        if op in ("rev", "step", "inner"):
            arr = arr[tuple(sl)]
        elif op == "T":
            arr = arr.T
        elif op == "perm":
            arr = arr.transpose(r.sample(range(arr.ndim), arr.ndim))
        elif op == "reshape" and arr.flags.c_contiguous:
            arr = arr.reshape(arr.shape[::-1])
        elif op == "newaxis":
            arr = arr[None, ..., None] if arr.ndim < 5 else arr
        elif op == "broadcast" and arr.ndim < 5:
            arr = np.broadcast_to(arr, (r.randint(1, 3),) + arr.shape)
        elif op == "view" and arr.ndim and arr.strides[-1] == arr.itemsize and arr.itemsize in (2, 4, 8):
            arr = arr.view({2: "<i2", 4: "<u4", 8: "<f8"}[arr.itemsize])
        elif op == "index" and arr.ndim > 1 and arr.shape[0]:
            arr = arr[r.randrange(arr.shape[0])]
        elif op == "swap" and arr.ndim > 1:
            arr = arr.swapaxes(0, arr.ndim - 1)
        elif op == "diag" and arr.ndim >= 2:
            arr = arr.diagonal()
        elif op == "realimag" and arr.dtype.kind == "c":
            arr = arr.imag if r.random() < 0.5 else arr.real
    return arr


def gen_dict_str(r, nr):
    d = {}
    for i in range(size(r, 1500)):
        d[text(r, r.randint(1, 10), r.choice(list(SCRIPTS))) + str(i)] = leaf(r, nr, 2)
    for k in r.sample(list(d), len(d) // 4):                  # dummies in the table
        del d[k]
    return d


def gen_dict_int(r, nr):
    d = {}
    for i in range(size(r, 1500)):
        d[r.choice([i, r.randint(-10**12, 10**12), big_int(r)])] = leaf(r, nr, 2)
    for k in r.sample(list(d), len(d) // 5):
        del d[k]
    return d


def gen_dict_mixed(r, nr):
    return {hashable(r, nr): leaf(r, nr, 1) for _ in range(size(r, 600))}


def gen_list_append(r, nr):
    lst = []
    for _ in range(size(r, 3000)):
        lst.append(leaf(r, nr, 2) if r.random() < 0.3 else r.randint(-10**6, 10**6))
    if lst and r.random() < 0.5:
        del lst[: len(lst) // 2]                             # shrinks the item array again
        lst.insert(0, real(r))
    return lst


def gen_tuple(r, nr):
    return tuple(leaf(r, nr, 1) for _ in range(size(r, 300)))


def gen_set(r, nr):
    s = {hashable(r, nr) for _ in range(size(r, 800))}
    for x in r.sample(sorted(s, key=lambda x: hex(x) if type(x) is int else repr(x)), len(s) // 4):
        s.discard(x)
    return s


def gen_frozenset(r, nr):
    return frozenset(hashable(r, nr) for _ in range(size(r, 400)))


def gen_bytes(r, nr):
    return r.randbytes(size(r, 20000))


def gen_bytearray(r, nr):
    b = bytearray(r.randbytes(size(r, 5000)))
    for _ in range(r.randint(0, 300)):
        b.append(r.getrandbits(8))                             # reallocs the buffer
    return b


def gen_array_array(r, nr):
    a = array.array(r.choice("bBhHiIlLqQfd"))
    span = 2 ** (8 * a.itemsize - 1) - 1
    for _ in range(size(r, 3000)):
        a.append((real(r) if a.typecode == "d" else r.random()) if a.typecode in "fd" else r.randint(0, span))
    return a


def gen_scalars(r, nr):
    c = r.randrange(4)
    if c == 0:
        return big_int(r)
    if c == 1:
        return real(r)
    if c == 2:
        return complex(real(r), real(r))
    return r.choice([None, True, False, (None, True, False, Ellipsis, r.randint(300, 400))])


def gen_nested(r, nr):
    return container(r, nr, 0)


def fill(r, nr, o, names):
    r.shuffle(names)
    for nm in names:
        setattr(o, nm, leaf(r, nr, 2))
    for nm in r.sample(names, len(names) // 6):
        delattr(o, nm)
    return o


def gen_inst_dict(r, nr):
    return fill(r, nr, r.choice([Plain, Child])(), [name(r, i) for i in range(size(r, 40))])


def gen_inst_init(r, nr):
    return Point(real(r), leaf(r, nr, 2), [Point(real(r), None, big_int(r))])


def gen_inst_slots(r, nr):
    o = r.choice([Slotted, SlotChild])()
    slots = ["sa", "sb", "sc", "sd"] + (["se"] if isinstance(o, SlotChild) else [])
    for s in r.sample(slots, r.randint(0, len(slots))):
        setattr(o, s, leaf(r, nr, 2))
    return o


def gen_inst_mixed(r, nr):
    o = Mixed()
    if r.random() < 0.7:
        o.ma = leaf(r, nr, 2)
    return fill(r, nr, o, [name(r, i) for i in range(size(r, 12))])


def points(r, nr):
    pts = nr.random((r.randint(1, 600), r.randint(1, 4))) * 10.0 ** r.randint(-2, 3)
    return np.round(pts, 1) if r.random() < 0.3 else pts          # duplicates


def gen_kdtree(r, nr):
    return scipy.spatial.KDTree(points(r, nr), leafsize=r.randint(1, 16), balanced_tree=r.random() < 0.5)


def gen_ckdtree(r, nr):
    return scipy.spatial.cKDTree(points(r, nr), leafsize=r.randint(1, 16), compact_nodes=r.random() < 0.5,
                                 copy_data=r.random() < 0.5)


def gen_cyclic(r, nr):
    lst = [leaf(r, nr, 2)]
    lst.append(lst)
    d = {text(r, 4, "bmp"): lst}
    d[text(r, 5, "ascii")] = d
    return [lst, d, (lst, d)]


def gen_inherited(r, nr):
    return [r.choice(INHERITED) for _ in range(r.randint(1, 4))] + [text(r, 5, "latin1")]


# kind: (generator, cases per round, built entirely inside the block)
KINDS = {
    "nd_numeric": (gen_nd_numeric, 10, True), "nd_small": (gen_nd_small, 10, True),
    "nd_datetime": (gen_nd_datetime, 4, True), "nd_text": (gen_nd_text, 5, True),
    "nd_struct": (gen_nd_struct, 6, True), "nd_object": (gen_nd_object, 5, True),
    "nd_view": (gen_nd_view, 10, True),
    "dict_str": (gen_dict_str, 4, True), "dict_int": (gen_dict_int, 4, True),
    "dict_mixed": (gen_dict_mixed, 4, True), "list_append": (gen_list_append, 4, True),
    "tuple": (gen_tuple, 4, True), "set": (gen_set, 3, True), "frozenset": (gen_frozenset, 3, True),
    "bytes": (gen_bytes, 3, True), "bytearray": (gen_bytearray, 3, True),
    "array_array": (gen_array_array, 3, True),
    "str_ascii": (lambda r, nr: text(r, size(r, 3000), "ascii"), 3, True),
    "str_latin1": (lambda r, nr: text(r, size(r, 3000), "latin1"), 3, True),
    "str_bmp": (lambda r, nr: text(r, size(r, 3000), "bmp"), 3, True),
    "str_astral": (lambda r, nr: text(r, size(r, 3000), "astral"), 3, True),
    "scalars": (gen_scalars, 6, True), "nested": (gen_nested, 6, True),
    "inst_dict": (gen_inst_dict, 4, True), "inst_slots": (gen_inst_slots, 4, True),
    "inst_mixed": (gen_inst_mixed, 3, True), "inst_init": (gen_inst_init, 2, False),
    "kdtree": (gen_kdtree, 2, True), "ckdtree": (gen_ckdtree, 2, True),
    "cyclic": (gen_cyclic, 1, True), "inherited": (gen_inherited, 2, False),
}


def churn(r):
    """Outside any block: allocate and drop what fills numpy's caches of
    shape buffers and small data buffers, CPython's free lists, and a big
    block, so that the next block runs right after a large free."""
    junk = []
    for _ in range(r.randint(50, 300)):
        junk.append(np.empty((1,) * r.randint(0, 7)))
        junk.append(np.arange(r.randint(0, 60)).reshape(-1)[::2])
    junk += [[i] * 3 for i in range(200)] + [{i: i} for i in range(200)] + [(i, i) for i in range(300)]
    junk += [float(i) + 0.5 for i in range(500)] + [str(i) * 3 for i in range(300)]
    junk.append(np.ones(r.choice([1 << 16, 1 << 20, 1 << 23]), np.uint8))
    junk.append(bytearray(r.choice([1 << 12, 1 << 22])))
    r.shuffle(junk)
    del junk


# ---- the fingerprint: runs on the driver and on the workers ----------------------

_handler_name = (np._core if hasattr(np, "_core") else np.core).multiarray.get_handler_name


def _bounds(o):
    """The bytes an array's elements span, from its data pointer, shape and
    strides (numpy's byte_bounds, which moved between versions)."""
    lo = hi = o.__array_interface__["data"][0]
    if o.size == 0:
        return lo, lo
    for n, s in zip(o.shape, o.strides):
        lo, hi = lo + min(0, (n - 1) * s), hi + max(0, (n - 1) * s)
    return lo, hi + o.itemsize


def _digest(b):
    return f"len={len(b)} sha={hashlib.sha1(b).hexdigest()[:16]} head={b[:24].hex()}"


def _walk(o, path, out, stack):
    t = type(o)
    emit = lambda field, value: out.append(f"{path}\t{field}={value}")   # noqa: E731
    emit("type", t.__module__ + "." + t.__qualname__)
    if o is None or o is True or o is False or o is Ellipsis:
        return
    if id(o) in stack:
        emit("cycle", path.count("[") - stack[id(o)])
        return
    stack[id(o)] = path.count("[")
    try:
        _fields(o, t, path, emit, out, stack)
    except Exception as e:  # a worker that reads garbage can raise anywhere
        emit("error", f"{type(e).__name__}: {str(e)[:120]}")
    finally:
        del stack[id(o)]


def _fields(o, t, path, emit, out, stack):
    if isinstance(o, np.ndarray):
        emit("shape", o.shape)
        emit("size", o.size)
        emit("strides", o.strides)
        emit("dtype", f"{o.dtype.str} {o.dtype!r} descr={o.dtype.descr} isalignedstruct={o.dtype.isalignedstruct}")
        emit("flags", [o.flags[f] for f in ("C_CONTIGUOUS", "F_CONTIGUOUS", "ALIGNED")])
        emit("writeable", o.flags["WRITEABLE"])
        emit("owndata", o.flags["OWNDATA"])
        base = o.base
        emit("base", None if base is None else f"{type(base).__name__} {getattr(base, 'shape', '')}")
        try:
            emit("handler", _handler_name(o))
        except Exception as e:
            emit("handler", f"{type(e).__name__}: {e}")
        lo, hi = _bounds(o)
        if o.size > 1 << 20 or (clamor.region.contains(id(o)) and hi > lo and not clamor.region.contains(lo, hi - lo)):
            # a shape or strides read wrong: reading the elements could crash
            emit("data", f"not read: {o.size} elements at {lo:#x}..{hi:#x}")
        elif o.dtype.hasobject:
            for i, x in enumerate(o.reshape(-1)):
                _walk(x, f"{path}.flat[{i}]", out, stack)
        else:
            raw = o
            if o.dtype.names and o.size:   # the gaps between fields of a copy hold what its memory held
                raw = np.zeros(o.shape, o.dtype)
                raw[...] = o
            emit("data", _digest(raw.tobytes()))
            if o.dtype.kind in "biufc" and o.size:
                emit("sum", repr(o.sum(dtype=np.complex128 if o.dtype.kind == "c" else np.float64)))
        return
    if isinstance(o, np.generic):
        emit("value", f"{o.dtype.str} {o.tobytes().hex()}")
        return
    if t is int:
        emit("value", hex(o))
    elif t is float:
        emit("value", o.hex())
    elif t is complex:
        emit("value", f"{o.real.hex()} {o.imag.hex()}")
    elif t is str:
        emit("value", f"len={len(o)} hash={hash(o)} ascii={o.isascii()} text={o[:40]!r} "
                      f"utf8={_digest(o.encode('utf-8'))}")
    elif t in (bytes, bytearray):
        emit("value", f"hash={hash(o) if t is bytes else ''} {_digest(bytes(o))}")
    elif t is array.array:
        emit("value", f"{o.typecode} {o.itemsize} {len(o)} {_digest(o.tobytes())}")
    elif t in (list, tuple):
        emit("len", len(o))
        for i, x in enumerate(o):
            _walk(x, f"{path}[{i}]", out, stack)
    elif t is dict:
        emit("len", len(o))
        missing = object()
        emit("lookup", all(o.get(k, missing) is v for k, v in o.items()))
        for i, (k, v) in enumerate(o.items()):
            _walk(k, f"{path}.key#{i}", out, stack)
            _walk(v, f"{path}[{i}]", out, stack)
    elif t in (set, frozenset):
        emit("len", len(o))
        emit("lookup", all(x in o for x in o))
        items = []
        for x in o:
            sub = []
            _walk(x, "", sub, stack)
            items.append("|".join(sub))
        for i, s in enumerate(sorted(items)):
            emit(f"item#{i}", s)
    elif hasattr(o, "query") and hasattr(o, "leafsize"):
        _tree(o, path, emit, out, stack)
    else:
        d = getattr(o, "__dict__", None)
        if d is not None:
            emit("attrs", list(d))
            for k, v in d.items():
                _walk(v, f"{path}.{k}", out, stack)
        for cls in t.__mro__:
            for s in cls.__dict__.get("__slots__", ()):
                if s != "__dict__":
                    if hasattr(o, s):
                        _walk(getattr(o, s), f"{path}.{s}", out, stack)
                    else:
                        emit(s, "<unset>")


def _tree(o, path, emit, out, stack):
    emit("tree", f"n={o.n} m={o.m} leafsize={o.leafsize} size={o.size}")
    for attr in ("data", "maxes", "mins", "indices"):
        _walk(getattr(o, attr), f"{path}.{attr}", out, stack)
    q = np.random.default_rng(7).random((6, o.m)) * (o.maxes - o.mins + 1) + o.mins - 0.5
    dist, idx = o.query(q, k=min(3, o.n))
    emit("query", f"{_digest(dist.tobytes())} {idx.tolist()}")
    emit("ball", sorted(o.query_ball_point(q[0], float(np.max(o.maxes - o.mins)) * 0.3 + 1e-9)))


def fingerprint(o):
    """One line per path and field: what a reader of ``o`` sees."""
    out = []
    _walk(o, "obj", out, {})
    return out


def on_worker(payload, direct):
    """The task: fingerprint every object read in place through the region
    list ``payload``, and those captured directly (``direct``)."""
    return os.getpid(), [fingerprint(o) for o in payload], [fingerprint(o) for o in direct]


# ---- the driver ------------------------------------------------------------------------

def build_round(seed, rep, kinds, portable=False):
    """Churn, build every kind under heap() (in one to three blocks), share
    (``portable``: for workers not forked from the driver)."""
    r, nr = random.Random(seed), np.random.default_rng(seed)
    plan = [(kind, j) for kind in kinds for j in range(KINDS[kind][1])]
    r.shuffle(plan)
    cuts = sorted(r.sample(range(1, len(plan)), r.randint(0, 2)))
    built = []
    for lo, hi in zip([0] + cuts, cuts + [len(plan)]):
        if r.random() < 0.85:
            churn(r)
        with clamor.heap():
            part = [KINDS[kind][0](r, nr) for kind, _ in plan[lo:hi]]
        built += part
    cases = {}
    for (kind, j), obj in zip(plan, built):
        cid = f"{seed}.{kind}.{j}"
        k = rep["kinds"].setdefault(kind, {"cases": 0, "approved": 0, "refused": 0, "inside": KINDS[kind][2]})
        k["cases"] += 1
        try:
            clamor.share(obj, portable=portable)
        except clamor.NotShareable as e:
            msg = str(e)
            k["refused"] += 1
            head = msg.split(" ", 1)
            if not (head[0].startswith("obj") and len(head) == 2 and len(head[1]) > 10):
                rep["errors"].append([cid, "refusal without a path and a reason", msg[:300]])
            reason = msg.split(" (", 1)[-1].split(" at 0x")[0] + ": " + msg.split(": ")[-1][:60]
            rep["refusals"].setdefault(kind, {}).setdefault(reason, [0, cid, msg[:200]])[0] += 1
            continue
        except Exception as e:
            rep["errors"].append([cid, "share raised " + type(e).__name__, str(e)[:300]])
            continue
        k["approved"] += 1
        cases.setdefault(kind, []).append((cid, obj, fingerprint(obj)))
    # The lists the workers read the objects through (the stage checks them
    # with share() as it ships them: a refusal fails the stage).
    with clamor.heap():
        lists = [[obj for _, obj, _ in items] for items in cases.values()]
    return cases, dict(zip(cases, lists))


# A region array that a task captures outside a region object travels as a
# reference (offset, dtype, shape, strides) and is rebuilt on the worker, a
# writeable view that does not own its data; an empty one, and an array of
# objects with the arrays it holds, travel by value (numpy's pickle gives an
# empty one C strides, and a datetime its native byte order).
_REBUILT = {"base", "owndata", "handler", "writeable"}
_EMPTY = _REBUILT | {"strides", "flags", "dtype"}


def _as_captured(lines):
    empty = {x.split("\t", 1)[0] for x in lines if x.endswith("\tsize=0")}
    out = []
    for x in lines:
        path, field = x.split("\t", 1)
        if field.split("=", 1)[0] not in (_EMPTY if path in empty else _REBUILT):
            out.append(x)
    return out


def compare(cid, kind, via, pid, drv, wrk, rep):
    if via == "captured" and drv != wrk:
        drv, wrk = _as_captured(drv), _as_captured(wrk)
    if drv == wrk:
        return
    diffs = [(a, b) for a, b in zip(drv, wrk) if a != b]
    if len(drv) != len(wrk):
        diffs.append((f"({len(drv)} lines)", f"({len(wrk)} lines)"))
    fields = sorted({a.split("\t", 1)[-1].split("=", 1)[0] for a, _ in diffs})
    rep["mismatches"].append({"id": cid, "kind": kind, "via": via, "pid": pid, "fields": fields,
                              "first": [[a[:160], b[:160]] for a, b in diffs[:2]],
                              "driver": "\n".join(drv)[:300], "worker": "\n".join(wrk)[:300]})


def run_round(cl, cases, payloads, rep):
    """One stage per kind, so that a failed stage (a worker crash) names
    the kind."""
    # No gc.collect() here: region objects dropped since the last block (an
    # earlier round's, temporaries) sit on CPython's free lists, and the
    # runtime must not take its own objects from there (see
    # test_an_action_after_region_objects_were_dropped).
    for kind, items in cases.items():
        # Captured directly, an array travels by reference or by value, and
        # anything else as a region object, as through the list (once is
        # enough: each costs the implicit share() of pickling).
        captured = [i for i, (_, obj, _) in enumerate(items) if i == 0 or isinstance(obj, np.ndarray)]
        payload, direct = payloads[kind], tuple(items[i][1] for i in captured)
        lost = cl.stats()["recovery"]["workers_lost"]
        try:
            res = cl.parallelize(range(2), 2).map(lambda _: on_worker(payload, direct)).collect()
        except Exception as e:
            rep["failed_stages"].append([kind, [c for c, _, _ in items][:8], type(e).__name__, str(e)[:300]])
            continue
        if cl.stats()["recovery"]["workers_lost"] != lost:
            rep["failed_stages"].append([kind, [c for c, _, _ in items][:8], "worker lost", "recovered"])
        for pid, inplace, direct_fps in res:
            for (cid, _, drv), a in zip(items, inplace):
                compare(cid, kind, "in place", pid, drv, a, rep)
            for i, b in zip(captured, direct_fps):
                compare(items[i][0], kind, "captured", pid, items[i][2], b, rep)
            rep["compared"] += len(items)


def main(variant, seeds, kinds=tuple(KINDS)):
    """Run the rounds of ``seeds``, objects built "after_fork" (the workers
    exist) or "before_fork", or for "spawn"ed workers (this module then
    imported by its name, so that they import its classes and functions);
    print the report as one JSON line."""
    t0 = time.monotonic()
    rep = {"variant": variant, "defined": list(kinds), "kinds": {}, "refusals": {}, "errors": [], "failed_stages": [],
           "mismatches": [], "compared": 0}
    # A task lost with its worker is not run again: a replacement, forked
    # later, inherits what the lost worker could not read, and would hide it.
    opts = dict(workers=2, progress=False, max_attempts=1, speculation=False)
    if variant == "spawn":
        with clamor.Cluster(start_method="spawn", **opts) as cl:
            for seed in seeds:
                run_round(cl, *build_round(seed, rep, kinds, portable=True), rep)
            rep["recovery"] = cl.stats()["recovery"]
    elif variant == "before_fork":
        rounds = [build_round(seed, rep, kinds) for seed in seeds]
        with clamor.Cluster(**opts) as cl:
            for cases, payloads in rounds:
                run_round(cl, cases, payloads, rep)
            rep["recovery"] = cl.stats()["recovery"]
    else:
        with clamor.Cluster(**opts) as cl:
            cl.parallelize(range(2), 2).map(lambda _: os.getpid()).collect()     # the workers exist
            for seed in seeds:
                run_round(cl, *build_round(seed, rep, kinds), rep)
            rep["recovery"] = cl.stats()["recovery"]
    ks = rep["kinds"].values()
    rep.update(cases=sum(k["cases"] for k in ks), approved=sum(k["approved"] for k in ks),
               refused=sum(k["refused"] for k in ks), seconds=round(time.monotonic() - t0, 1))
    print(json.dumps(rep))
