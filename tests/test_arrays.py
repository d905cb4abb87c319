"""numpy arrays in the region: clamor.empty/zeros/full/array/asarray/view/
in_region, their lifetime and the typed errors for what cannot live there.

These use this process's default region.
"""
import gc

import numpy as np
import pytest

import clamor
from clamor import region

SHAPES = [(), (0,), (5,), (3, 4), (2, 3, 4), (2, 0, 3), (1, 1, 1, 7)]
POINT = np.dtype([("x", "<i4"), ("y", "<f8")])              # packed: itemsize 12
POINT_ALIGNED = np.dtype([("a", "u1"), ("b", "<f8"), ("c", "<i2")], align=True)
DTYPES = [np.dtype("f8"), np.dtype("i4"), np.dtype("u1"), np.dtype("c16"), np.dtype("c8"), np.dtype(">i8"),
          np.dtype("bool"), POINT, POINT_ALIGNED, np.dtype(("f4", (2, 3)))]


def allocated():
    gc.collect()
    return clamor.heap_stats()["allocated"]


def sample(shape, dtype, seed=0):
    """Deterministic, non-trivial values of any of DTYPES."""
    rng = np.random.default_rng(seed)
    out = np.zeros(shape, dtype)
    flat = out.reshape(-1)
    n, dt = flat.size, out.dtype
    if dt.fields:
        for name in dt.names:
            flat[name] = rng.integers(-1000, 1000, n)
    elif dt.kind == "c":
        flat[...] = rng.normal(size=n) + 1j * rng.normal(size=n)
    elif dt.kind == "b":
        flat[...] = rng.integers(0, 2, n)
    elif dt.kind == "u":
        flat[...] = rng.integers(0, 256, n)
    else:
        flat[...] = rng.integers(-1000, 1000, n)
    return out


def expect(shape, dtype):
    """Shape and dtype numpy gives np.empty(shape, dtype) (subarray dtypes
    add their dimensions)."""
    return shape + dtype.shape, dtype.base if dtype.subdtype else dtype


def shares(a, b):
    return np.shares_memory(a, b) if a.size and b.size else False


# ---- construction ----------------------------------------------------------------

@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_empty_zeros_full_array(shape, dtype):
    eshape, edtype = expect(shape, dtype)
    assert np.empty(shape, dtype).shape == eshape
    e = clamor.empty(shape, dtype)
    assert isinstance(e, np.ndarray)
    assert e.shape == eshape and e.dtype == edtype
    assert clamor.in_region(e)
    assert e.flags.writeable
    z = clamor.zeros(shape, dtype)
    assert z.shape == eshape and z.dtype == edtype and clamor.in_region(z)
    assert z.tobytes() == bytes(z.nbytes)
    src = sample(shape, dtype, seed=len(shape))
    first = src.reshape(-1)[0] if src.size else np.zeros((), edtype)
    f = clamor.full(shape, first, dtype)
    assert f.shape == eshape and f.dtype == edtype and clamor.in_region(f)
    if src.size:
        assert (f == first).all()
    a = clamor.array(src)
    assert a.shape == eshape and a.dtype == edtype and clamor.in_region(a)
    assert a.tolist() == src.tolist()  # field by field: padding bytes are not copied
    assert not shares(a, src)
    e[...] = src  # writes land and read back
    assert e.tolist() == src.tolist()
    assert not shares(e, z) and not shares(e, a) and not shares(a, f)


@pytest.mark.parametrize("dtype", [POINT_ALIGNED, np.dtype("f8"), np.dtype(("i2", (3,)))], ids=str)
def test_zeros_clears_every_byte_of_reused_memory(dtype):
    n = 5  # a small block: the allocator hands the freed slot straight back
    dirty = clamor.full(n * dtype.itemsize, 0xFF, dtype="u1")
    addr = dirty.ctypes.data
    del dirty
    gc.collect()
    z = clamor.zeros(n, dtype)
    assert z.ctypes.data == addr  # the dirty block came back ...
    assert z.tobytes() == bytes(z.nbytes)  # ... and is zero, padding included


def test_int_shape_and_values():
    a = clamor.full(7, 3)
    assert a.shape == (7,) and a.dtype == np.asarray(3).dtype
    assert a.tolist() == [3] * 7
    b = clamor.full((2, 2), 1.5, dtype="f4")
    assert b.dtype == np.float32 and b.tolist() == [[1.5, 1.5], [1.5, 1.5]]
    c = clamor.full((), 2 + 3j)
    assert c.shape == () and c.dtype == np.complex128 and c[()] == 2 + 3j
    d = clamor.zeros(4, dtype="i4")
    assert d.dtype == np.int32 and d.tolist() == [0, 0, 0, 0]
    assert clamor.empty(5).dtype == np.float64


def test_zero_d_arrays():
    a = clamor.array(np.float64(2.5))
    assert a.shape == () and a[()] == 2.5 and clamor.in_region(a)
    a[()] = 7
    assert float(a) == 7.0
    p = clamor.full((), (4, 5.5), dtype=POINT)
    assert p["x"] == 4 and p["y"] == 5.5


def test_alignment_of_arrays():
    for dt in DTYPES:
        for shape in [(1,), (3,), (1000,)]:
            a = clamor.empty(shape, dt)
            assert a.ctypes.data % 64 == 0
    b = clamor.empty(100, "u1", align=4096)
    assert b.ctypes.data % 4096 == 0


def test_array_from_lists_and_dtype_conversion():
    a = clamor.array([[1, 2, 3], [4, 5, 6]])
    assert clamor.in_region(a) and a.shape == (2, 3) and a.sum() == 21
    b = clamor.array([1, 2, 3], dtype="f4")
    assert b.dtype == np.float32 and b.tolist() == [1.0, 2.0, 3.0]
    c = clamor.array(np.arange(10)[::3])  # a non-contiguous source
    assert c.tolist() == [0, 3, 6, 9] and c.flags.c_contiguous and clamor.in_region(c)
    s = clamor.array([(1, 2.0), (3, 4.0)], dtype=POINT)
    assert s["x"].tolist() == [1, 3] and s["y"].tolist() == [2.0, 4.0]


def test_structured_fields_are_views():
    a = clamor.zeros(10, POINT_ALIGNED)
    a["b"] = np.arange(10) * 0.5
    a["c"][3] = -7
    assert a.itemsize == POINT_ALIGNED.itemsize == 24
    col = a["b"]
    assert clamor.in_region(col) and shares(col, a)
    assert col.tolist() == [i * 0.5 for i in range(10)]
    assert a[3]["c"] == -7 and a[2]["c"] == 0


@pytest.mark.parametrize("bad", [(-1,), (3, -2), (1.5,), ("a",)])
def test_bad_shapes(bad):
    before = allocated()
    with pytest.raises(clamor.InvalidSize):
        clamor.empty(bad)
    assert allocated() == before


def test_impossible_size():
    with pytest.raises(clamor.AllocError) as ei:
        clamor.empty((1 << 40, 1 << 40))
    assert isinstance(ei.value, (clamor.InvalidSize, clamor.RegionExhausted))
    with pytest.raises(clamor.RegionExhausted):
        clamor.empty(region.size() // 8 + 1)


# ---- array vs asarray --------------------------------------------------------------

def test_array_always_copies():
    a = clamor.array(np.arange(100.0))
    b = clamor.array(a)
    assert b is not a and not shares(a, b) and clamor.in_region(b)
    assert (a == b).all()
    a[0] = -1
    assert b[0] == 0.0
    src = np.arange(5)
    c = clamor.array(src)
    src[0] = 99
    assert c[0] == 0


def test_asarray_returns_region_arrays_themselves():
    a = clamor.array(np.arange(12.0).reshape(3, 4))
    assert clamor.asarray(a) is a
    assert clamor.asarray(a, dtype="f8") is a
    s = a[1:, ::2]
    assert clamor.asarray(s) is s  # a view in the region is in the region
    t = a.T
    assert clamor.asarray(t) is t


def test_asarray_copies_otherwise():
    src = np.arange(10, dtype="i8")
    b = clamor.asarray(src)
    assert b is not src and clamor.in_region(b) and not shares(b, src)
    assert b.tolist() == src.tolist()
    a = clamor.array(src)
    c = clamor.asarray(a, dtype="f4")  # another dtype: a converted copy
    assert c is not a and c.dtype == np.float32 and clamor.in_region(c) and not shares(a, c)
    assert c.tolist() == [float(x) for x in range(10)]
    d = clamor.asarray([1, 2, 3])
    assert clamor.in_region(d) and d.tolist() == [1, 2, 3]


def test_in_region():
    assert not clamor.in_region(np.arange(10))
    assert not clamor.in_region([1, 2, 3])
    a = clamor.zeros(1000)
    assert clamor.in_region(a) and clamor.in_region(a[10:20]) and clamor.in_region(a[::-1])
    raw = clamor.alloc(64)
    try:
        v = clamor.view(raw, "u1", 64)
        assert clamor.in_region(v)
    finally:
        del v
        clamor.free(raw)


# ---- object dtypes are refused ---------------------------------------------------------

OBJECT_DTYPES = [np.dtype(object), np.dtype([("a", "f8"), ("b", "O")]), np.dtype(("O", (2,)))]


@pytest.mark.parametrize("dtype", OBJECT_DTYPES, ids=str)
def test_object_dtype_rejected(dtype):
    before = allocated()
    for make in (lambda: clamor.empty(3, dtype), lambda: clamor.zeros(3, dtype),
                 lambda: clamor.full(3, None, dtype), lambda: clamor.array(np.zeros(3, dtype)),
                 lambda: clamor.asarray(np.zeros(3, dtype))):
        with pytest.raises(clamor.ClamorError, match="objects"):
            make()
    assert allocated() == before  # nothing leaked


def test_object_arrays_from_python_values_rejected():
    with pytest.raises(clamor.ClamorError):
        clamor.array([1, "a", None], dtype=object)
    with pytest.raises(clamor.ClamorError):
        clamor.full(4, "abc", dtype=object)
    raw = clamor.alloc(64)
    try:
        with pytest.raises(clamor.ClamorError):
            clamor.view(raw, object, 8)
    finally:
        clamor.free(raw)


# ---- view ----------------------------------------------------------------------------

def test_view_of_a_raw_block():
    raw = clamor.alloc(16 * 4)
    try:
        v = clamor.view(raw, "i4", (4, 4))
        v[...] = np.arange(16).reshape(4, 4)
        w = clamor.view(raw, "i4", 16)
        assert w.tolist() == list(range(16))
        t = clamor.view(raw, "i4", (4, 4), strides=(4, 16))  # the transpose, by strides
        assert (t == v.T).all()
        every_other = clamor.view(raw + 4, "i4", (8,), strides=(8,))
        assert every_other.tolist() == list(range(1, 16, 2))
        del v, w, t, every_other
        gc.collect()
        assert clamor.usable_size(raw) >= 64  # not owned: the views did not free it
    finally:
        clamor.free(raw)


def test_owned_view_frees_its_block():
    before = allocated()
    raw = clamor.alloc(1 << 20)
    v = clamor.view(raw, "f8", (1 << 17,), owned=True)
    v[:] = 1.0
    part = v[5:10]
    del v
    gc.collect()
    assert clamor.usable_size(raw) >= 1 << 20  # the slice keeps it
    assert part.tolist() == [1.0] * 5
    del part
    gc.collect()
    assert clamor.usable_size(raw) == 0
    assert allocated() == before


# ---- lifetime ----------------------------------------------------------------------------

@pytest.mark.parametrize("n", [1, 100, 1 << 20])
def test_arrays_freed_when_collected(n):
    before = allocated()
    a = clamor.zeros(n)
    assert clamor.heap_stats()["allocated"] >= before + 8 * n
    del a
    assert allocated() == before
    arrays = [clamor.full(10, i) for i in range(500)]
    assert clamor.heap_stats()["allocated"] > before
    del arrays
    assert allocated() == before


def test_arrays_in_a_cycle_freed_by_gc():
    before = allocated()

    class Holder:
        pass

    h = Holder()
    h.a = clamor.zeros(1 << 16)
    h.me = h
    del h
    assert allocated() == before


def test_views_keep_the_block_alive():
    before = allocated()
    a = clamor.array(np.arange(1_000_000, dtype="f8"))
    addr = a.ctypes.data
    s = a[1000:200000:3]
    t = a.reshape(1000, 1000).T[::7, 2:9]
    m = memoryview(a)[500:600]
    del a
    gc.collect()
    assert clamor.usable_size(addr) >= 8_000_000
    assert clamor.heap_stats()["allocated"] >= before + 8_000_000
    # new arrays must not land on the block still in use
    fillers = [clamor.full(1_000_000 // k, -1.0) for k in (1, 2, 3, 5)]
    assert s.tolist() == list(map(float, range(1000, 200000, 3)))
    assert (t == np.arange(1_000_000, dtype="f8").reshape(1000, 1000).T[::7, 2:9]).all()
    assert np.frombuffer(m, "f8").tolist() == list(map(float, range(500, 600)))
    assert all((f == -1.0).all() for f in fillers)
    del fillers, s, t
    gc.collect()
    assert clamor.usable_size(addr) >= 8_000_000  # the memoryview still holds it
    del m
    assert allocated() == before
    assert clamor.usable_size(addr) == 0


def test_big_array_costs_nothing_until_written():
    before = allocated()
    a = clamor.empty((1 << 27,), "f8")  # 1 GiB of address space
    assert a.nbytes == 1 << 30 and clamor.in_region(a)
    a[0], a[-1], a[1 << 26] = 1.0, 2.0, 3.0
    assert (a[0], a[-1], a[1 << 26]) == (1.0, 2.0, 3.0)
    del a
    assert allocated() == before
