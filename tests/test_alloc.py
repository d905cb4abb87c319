"""The Python allocator surface: clamor.alloc/free/realloc/calloc/usable_size/
heap_stats and their typed errors.

Tests that need their own region (a small one to exhaust, a worker) run in a
subprocess; the rest use this process's default region.
"""
import ctypes
import gc
import random
import threading

import pytest

import clamor
from clamor import region
from helpers import run_json


def fill(addr, n, byte):
    ctypes.memset(addr, byte, n)


def read(addr, n):
    return ctypes.string_at(addr, n)


@pytest.fixture
def sentinel():
    """A live block with known bytes: every bad call must leave it intact."""
    p = clamor.alloc(256)
    data = bytes(range(256))
    ctypes.memmove(p, data, 256)
    yield p, data
    assert read(p, 256) == data
    clamor.free(p)


def baseline():
    gc.collect()
    return clamor.heap_stats()["allocated"]


# ---- the happy path ----------------------------------------------------------

@pytest.mark.parametrize("n", [0, 1, 16, 17, 100, 4096, 8192, 8193, 1 << 20, (3 << 20) + 5])
def test_alloc_write_free(n):
    before = baseline()
    p = clamor.alloc(n)
    assert region.contains(p, max(n, 1))
    assert p % 16 == 0
    assert clamor.usable_size(p) >= n
    assert clamor.heap_stats()["allocated"] >= before + max(n, 1)
    if n:
        fill(p, n, 0x5A)
        assert read(p, n) == b"\x5a" * n
    clamor.free(p)
    assert clamor.usable_size(p) == 0
    assert baseline() == before


@pytest.mark.parametrize("n,align", [(1, 32), (100, 64), (100, 4096), (5000, 1024), (1 << 20, 1 << 16),
                                     (10, 1 << 21)])
def test_alignment(n, align):
    p = clamor.alloc(n, align=align)
    try:
        assert p % align == 0
        assert clamor.usable_size(p) >= n
    finally:
        clamor.free(p)


def test_free_null_is_noop(sentinel):
    before = clamor.heap_stats()
    clamor.free(0)
    assert clamor.heap_stats() == before


def test_heap_stats_keys_and_types():
    st = clamor.heap_stats()
    assert set(st) == {"allocated", "footprint"}
    # size_t counts: one taken below zero would wrap to near 2**64
    assert all(isinstance(v, int) and v < 1 << 63 for v in st.values()), st
    assert st["footprint"] >= st["allocated"], st
    p = clamor.alloc(1 << 20)
    try:
        st2 = clamor.heap_stats()
        assert st2["allocated"] >= st["allocated"] + (1 << 20)
        assert st2["footprint"] >= st2["allocated"]
    finally:
        clamor.free(p)


def test_usable_size_of_foreign_address_is_zero():
    assert clamor.usable_size(0) == 0
    assert clamor.usable_size(id(object())) == 0
    p = clamor.alloc(64)
    try:
        assert clamor.usable_size(p + 16) == 0
    finally:
        clamor.free(p)


# ---- typed errors for bad sizes ------------------------------------------------

@pytest.mark.parametrize("bad", [-1, -(1 << 70)])
def test_negative_size(bad, sentinel):
    for call in (lambda: clamor.alloc(bad), lambda: clamor.calloc(bad, 8), lambda: clamor.calloc(8, bad)):
        with pytest.raises(clamor.InvalidSize) as ei:
            call()
        assert isinstance(ei.value, ValueError) and isinstance(ei.value, clamor.ClamorError)
        assert str(bad) in str(ei.value)


@pytest.mark.parametrize("bad", [1.5, 4.0, "3", None, b"12", [8]])
def test_non_int_size(bad, sentinel):
    with pytest.raises(clamor.InvalidSize, match=type(bad).__name__):
        clamor.alloc(bad)
    p = clamor.alloc(8)
    with pytest.raises(clamor.InvalidSize):
        clamor.realloc(p, bad)
    assert clamor.usable_size(p) >= 8  # the block is left as it was
    clamor.free(p)


@pytest.mark.parametrize("huge", [1 << 62, (1 << 63) - 1])
def test_huge_size_is_region_exhausted(huge, sentinel):
    before = baseline()
    with pytest.raises(clamor.RegionExhausted) as ei:
        clamor.alloc(huge)
    assert isinstance(ei.value, MemoryError) and isinstance(ei.value, clamor.ClamorError)
    assert str(huge) in str(ei.value)
    with pytest.raises(clamor.RegionExhausted, match=str(huge)):
        clamor.calloc(huge, 1)
    assert baseline() == before


def test_size_just_above_region_is_region_exhausted(sentinel):
    n = region.size() + region.page_size()
    with pytest.raises(clamor.RegionExhausted, match=str(n)):
        clamor.alloc(n)
    p = clamor.alloc(8)
    with pytest.raises(clamor.RegionExhausted, match=str(n)):
        clamor.realloc(p, n)
    assert clamor.usable_size(p) >= 8
    clamor.free(p)


def test_size_beyond_64_bits_is_invalid(sentinel):
    n = 1 << 64
    with pytest.raises(clamor.InvalidSize, match=str(n)):
        clamor.alloc(n)


def test_calloc_overflow_is_typed(sentinel):
    with pytest.raises(clamor.AllocError) as ei:
        clamor.calloc(1 << 40, 1 << 40)
    assert isinstance(ei.value, (clamor.RegionExhausted, clamor.InvalidSize))
    assert str(1 << 40) in str(ei.value)


@pytest.mark.parametrize("align", [0, 3, 24, 100, -8, 1 << 64])
def test_align_not_power_of_two(align, sentinel):
    with pytest.raises(clamor.InvalidSize):
        clamor.alloc(64, align=align)


def test_align_must_be_int(sentinel):
    with pytest.raises(clamor.InvalidSize, match="float"):
        clamor.alloc(64, align=16.0)


# ---- typed errors for bad pointers ---------------------------------------------

def _foreign_addresses():
    p = clamor.alloc(64)        # a slab block
    q = clamor.alloc(1 << 20)   # a span
    never = region.base() + region.size() - region.page_size()
    assert clamor.usable_size(never) == 0
    return [p, q], {
        "python object": id(object()),
        "low address": 0x10,
        "ctypes buffer": ctypes.addressof(ctypes.c_int(0)),
        "in region, never allocated": never,
        "one past the region": region.base() + region.size(),
        "interior of a small block": p + 16,
        "unaligned interior of a small block": p + 1,
        "interior of a span": q + 4096,
        "last page of a span": q + (1 << 20) - 4096,
    }


def test_free_foreign_address(sentinel):
    blocks, bad = _foreign_addresses()
    for b in blocks:
        fill(b, 64, 0xC3)
    before = clamor.heap_stats()
    for what, addr in bad.items():
        with pytest.raises(clamor.InvalidPointer) as ei:
            clamor.free(addr)
        assert isinstance(ei.value, clamor.ClamorError), what
        assert f"{addr:#x}" in str(ei.value), what
        assert clamor.heap_stats() == before, what
    for b in blocks:  # the heap is as it was
        assert read(b, 64) == b"\xc3" * 64
        clamor.free(b)


def test_realloc_foreign_address(sentinel):
    blocks, bad = _foreign_addresses()
    before = clamor.heap_stats()
    for what, addr in bad.items():
        with pytest.raises(clamor.InvalidPointer):
            clamor.realloc(addr, 128)
        assert clamor.heap_stats() == before, what
    for b in blocks:
        clamor.free(b)


@pytest.mark.parametrize("bad", [-1, 1 << 64, "0x10", 1.0])
def test_free_non_address(bad, sentinel):
    with pytest.raises(clamor.InvalidPointer):
        clamor.free(bad)


@pytest.mark.parametrize("n", [48, 1 << 20])
def test_double_free(n, sentinel):
    before = baseline()
    a, b = clamor.alloc(n), clamor.alloc(n)
    fill(b, n, 0x77)
    clamor.free(a)
    after_one = clamor.heap_stats()
    with pytest.raises(clamor.InvalidPointer, match="not a live block"):
        clamor.free(a)
    assert clamor.heap_stats() == after_one
    with pytest.raises(clamor.InvalidPointer):
        clamor.realloc(a, 2 * n)
    c = clamor.alloc(n)  # may take a's place, never b's
    assert c != b
    fill(c, n, 0x11)
    assert read(b, n) == b"\x77" * n
    clamor.free(b)
    clamor.free(c)
    assert baseline() == before


# ---- realloc / calloc ------------------------------------------------------------

@pytest.mark.parametrize("old,new", [(16, 17), (100, 5000), (5000, 8192), (8000, 9000), (100, 1 << 20),
                                     (1 << 20, (1 << 21) + 3), (1 << 20, 100), (1 << 21, 1 << 20),
                                     (300, 20)])
def test_realloc_preserves_contents(old, new):
    p = clamor.alloc(old)
    data = random.Random(old * 7 + new).randbytes(old)
    ctypes.memmove(p, data, old)
    q = clamor.realloc(p, new)
    assert clamor.usable_size(q) >= new
    keep = min(old, new)
    assert read(q, keep) == data[:keep]
    if q != p:
        assert clamor.usable_size(p) == 0  # the old block went back
    fill(q, new, 0xEE)  # the whole new size is writable
    clamor.free(q)


def test_realloc_null_allocates_and_zero_frees():
    before = baseline()
    p = clamor.realloc(0, 100)
    assert clamor.usable_size(p) >= 100
    assert clamor.realloc(p, 0) == 0
    assert clamor.usable_size(p) == 0
    assert baseline() == before


def test_realloc_failure_leaves_block(sentinel):
    p = clamor.alloc(1 << 20)
    fill(p, 1 << 20, 0x42)
    with pytest.raises(clamor.RegionExhausted):
        clamor.realloc(p, region.size() * 2)
    assert clamor.usable_size(p) >= 1 << 20
    assert read(p, 1 << 20) == b"\x42" * (1 << 20)
    clamor.free(p)


@pytest.mark.parametrize("n,size", [(4, 16), (1, 8192), (3, 1000), (16, 1 << 16), (1, (1 << 22) + 7), (0, 8)])
def test_calloc_zeroes_reused_memory(n, size):
    total = n * size
    # dirty blocks of the same size so that calloc likely reuses one
    dirty = [clamor.alloc(max(total, 1)) for _ in range(4)]
    for d in dirty:
        fill(d, max(total, 1), 0xFF)
    for d in dirty:
        clamor.free(d)
    p = clamor.calloc(n, size)
    try:
        assert clamor.usable_size(p) >= total
        assert read(p, total) == bytes(total)
    finally:
        clamor.free(p)


# ---- a region of our own --------------------------------------------------------

def test_region_exhaustion_then_recovery():
    out = run_json("""
        import json, ctypes, clamor
        from clamor import region
        MB = 1 << 20
        blocks, err = [], None
        try:
            for i in range(1000):
                p = clamor.alloc(MB)
                ctypes.memset(p, i % 251, MB)
                blocks.append(p)
        except clamor.RegionExhausted as e:
            err = e
        res = {"size": region.size(), "n": len(blocks), "err": str(err),
               "memory_error": isinstance(err, MemoryError), "stats": clamor.heap_stats()}
        # small requests fail the same typed way once nothing is left
        try:
            clamor.alloc(8)
            res["small"] = "ok"
        except clamor.RegionExhausted as e:
            res["small"] = "RegionExhausted"
        res["intact"] = all(ctypes.string_at(p, MB) == bytes([i % 251]) * MB for i, p in enumerate(blocks))
        for p in blocks[::2]:
            clamor.free(p)
        q = clamor.alloc(MB)            # fits in a hole
        ctypes.memset(q, 1, MB)
        res["again"] = clamor.usable_size(q) >= MB
        for p in blocks[1::2]:
            clamor.free(p)
        clamor.free(q)
        big = clamor.alloc(48 * MB)     # the holes merged back into one run
        res["big"] = clamor.usable_size(big) >= 48 * MB
        clamor.free(big)
        res["end"] = clamor.heap_stats()["allocated"]
        print(json.dumps(res))
        """, env={"CLAMOR_REGION_SIZE": "64M"})
    assert out["size"] == 64 << 20
    assert out["n"] == 64, out  # bookkeeping lives outside the region: every byte is usable
    assert out["small"] == "RegionExhausted"
    assert out["memory_error"]
    assert str(1 << 20) in out["err"]
    assert out["stats"]["footprint"] <= 64 << 20
    assert out["intact"]
    assert out["again"] and out["big"]
    assert out["end"] == 0


WORKER_ALLOC = """
    import json, clamor

    def attempt():
        import clamor
        from clamor import region
        out = {"role": region.role()}
        calls = {"alloc": lambda: clamor.alloc(64), "calloc": lambda: clamor.calloc(4, 4),
                 "realloc": lambda: clamor.realloc(0, 64), "empty": lambda: clamor.empty(10),
                 "array": lambda: clamor.array([1, 2, 3])}
        for name, call in calls.items():
            try:
                call()
                out[name] = "returned"
            except clamor.NotDriver as e:
                out[name] = ["NotDriver", isinstance(e, clamor.AllocError), str(e)]
            except BaseException as e:
                out[name] = [type(e).__name__, str(e)]
        return out

    with clamor.Cluster(workers=1, start_method="{how}", progress=False) as cl:
        [res] = cl.run(attempt)
        res["driver_still_allocates"] = clamor.usable_size(clamor.alloc(64)) >= 64
    print(json.dumps(res))
"""


@pytest.mark.parametrize("how", ["fork", "spawn"])
def test_worker_cannot_allocate(how):
    out = run_json(WORKER_ALLOC.replace("{how}", how))
    assert out["role"] == "worker"
    for name in ("alloc", "calloc", "realloc", "empty", "array"):
        kind, is_alloc_error, msg = out[name]
        assert kind == "NotDriver" and is_alloc_error, (name, out[name])
        assert "driver" in msg
    assert out["driver_still_allocates"]


# ---- threads --------------------------------------------------------------------

def test_threads_allocate_concurrently():
    nthreads, per = 8, 1000
    before = baseline()
    results, errors = [None] * nthreads, []
    start = threading.Barrier(nthreads)

    def work(t):
        try:
            rng = random.Random(t)
            mine = []
            start.wait()
            for i in range(per):
                n = rng.choice((rng.randrange(1, 256), rng.randrange(256, 9000), rng.randrange(9000, 40000)))
                p = clamor.alloc(n)
                ctypes.memset(p, t + 1, n)
                mine.append((p, n))
                if i % 3 == 2:  # free some as we go, so threads reuse each other's memory
                    q, m = mine.pop(rng.randrange(len(mine)))
                    assert ctypes.string_at(q, m) == bytes([t + 1]) * m
                    clamor.free(q)
            results[t] = [(p, n, clamor.usable_size(p)) for p, n in mine]
        except BaseException as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(nthreads)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(60)
    assert not errors, errors
    blocks = sorted((p, u, t) for t, res in enumerate(results) for p, n, u in res)
    for (p, u, t), (q, _, _) in zip(blocks, blocks[1:]):
        assert p + u <= q, f"blocks at {p:#x}+{u} (thread {t}) and {q:#x} overlap"
    for t, res in enumerate(results):
        for p, n, u in res:
            assert u >= n and region.contains(p, n)
            assert ctypes.string_at(p, n) == bytes([t + 1]) * n
    assert clamor.heap_stats()["allocated"] >= before + sum(n for r in results for _, n, _ in r)

    def free_all(res):
        for p, _, _ in res:
            clamor.free(p)

    threads = [threading.Thread(target=free_all, args=(r,)) for r in results]
    for th in threads:
        th.start()
    for th in threads:
        th.join(60)
    assert baseline() == before
