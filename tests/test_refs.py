"""clamor.ref / Ref / ArrayRef: references that travel instead of the bytes.

The driver is this process (default region), with a Cluster of two workers
that are fresh interpreters (``python -m clamor.worker``): one it spawns, at
the driver's base, and one started by hand at another base.
"""
import ctypes
import json
import os
import pickle
import subprocess
import sys
import textwrap

import cloudpickle
import numpy as np
import pytest

import clamor
from clamor import region

OTHER_BASE = 0x300000000000
POINT = np.dtype([("x", "<i4"), ("y", "<f8"), ("tag", "S3")])

# The workers cannot import this file: ship its functions by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])


@pytest.fixture(scope="module")
def cl():
    c = clamor.Cluster(workers=1, start_method="spawn", remote=1, progress=False)
    c.join_command()   # opens the control socket: c.endpoint
    proc = subprocess.Popen([sys.executable, "-m", "clamor.worker", "--driver", c.endpoint,
                             "--base", hex(OTHER_BASE)], env={**os.environ, "CLAMOR_SECRET": c.secret})
    try:
        with c:                            # worker 0: spawned, the driver's base
            assert c.worker_pids[1] == proc.pid   # worker 1: by hand, somewhere else
            yield c
    finally:
        c.close()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:   # (it never joined)
            proc.kill()
            proc.wait()


def views():
    """Region arrays and views of them, by name, and the values they hold."""
    a = clamor.array(np.arange(100_000, dtype="f8") * 0.5)
    m = clamor.array(np.arange(300 * 400, dtype="i4").reshape(300, 400))
    c = clamor.array(np.arange(5000) + 1j * np.arange(5000)[::-1])
    f = clamor.array(np.asfortranarray(np.arange(60, dtype="i2").reshape(3, 4, 5)))
    s = clamor.array(np.array([(i, i / 4, b"k%d" % (i % 10)) for i in range(1000)], dtype=POINT))
    out = {
        "whole": a,
        "slice": a[12_345:67_890],
        "strided": a[3::7],
        "reversed": a[::-1],
        "scalar": clamor.full((), 42.0),
        "empty": a[10:10],
        "2d": m,
        "2d transposed": m.T,
        "2d column": m[:, 17],
        "2d block": m[10:250:3, 399:5:-11],
        "complex": c[::3],
        "fortran 3d": f,
        "fortran 3d sliced": f[:, 1:, ::2],
        "structured": s,
        "structured field": s["y"][::2],
        "u1 tail": clamor.array(np.arange(70_000) % 251, dtype="u1")[65_530:],
    }
    return out


def check_same(got, want, what):
    assert isinstance(got, np.ndarray), what
    assert got.dtype == want.dtype, what
    assert got.shape == want.shape, what
    assert got.tolist() == want.tolist(), what


# ---- in this process ------------------------------------------------------------

def test_raw_ref_pickle_roundtrip():
    p = clamor.alloc(100)
    try:
        r = clamor.ref(p)
        assert isinstance(r, clamor.Ref) and r.addr == p
        r = clamor.Ref(p, 100)
        back = pickle.loads(pickle.dumps(r))
        assert isinstance(back, clamor.Ref)
        assert back.addr == p and back.nbytes == 100 and back.offset == p - region.base()
        assert f"{p - region.base():#x}" in repr(back)
        back2 = cloudpickle.loads(cloudpickle.dumps(r))
        assert back2.addr == p
    finally:
        clamor.free(p)


def test_array_ref_pickle_roundtrip():
    for what, v in views().items():
        r = clamor.ref(v)
        assert isinstance(r, clamor.ArrayRef), what
        back = pickle.loads(pickle.dumps(r))
        got = back.get()
        check_same(got, v, what)
        assert got.strides == v.strides, what
        assert got.__array_interface__["data"][0] == v.__array_interface__["data"][0], what
        if v.size:
            assert np.shares_memory(got, v), what  # the same memory, not a copy


def test_ref_of_address_outside_the_region():
    region.ensure()   # (the addresses are named from the region's bounds: it must exist, whichever test ran first)
    bad = {
        "python object": id(object()),
        "below the region": region.base() - 4096,
        "one past the region": region.base() + region.size(),
        "runs off the end": region.base() + region.size() - 8,
    }
    for what, addr in bad.items():
        with pytest.raises(clamor.InvalidPointer) as ei:
            clamor.Ref(addr, 16)
        assert isinstance(ei.value, clamor.ClamorError), what
        assert f"{addr:#x}" in str(ei.value), what
    with pytest.raises(clamor.InvalidPointer):
        clamor.ref(id(object()))


def test_ref_of_array_outside_the_region():
    for x in (np.arange(10.0), np.zeros((3, 3))[:, 1], [1, 2, 3]):
        with pytest.raises(clamor.InvalidPointer, match="not inside the region"):
            clamor.ref(x)
    with pytest.raises(clamor.InvalidPointer):
        clamor.ArrayRef(np.ones(4))


def test_refs_in_a_process_without_region():
    a = clamor.array(np.arange(10.0))
    blob = pickle.dumps([clamor.ref(a), clamor.Ref(a.ctypes.data, 80)]).hex()
    code = textwrap.dedent(f"""
        import json, pickle, clamor
        ar, r = pickle.loads(bytes.fromhex({blob!r}))
        out = []
        for f in (ar.get, lambda: r.addr):
            try:
                f()
                out.append("returned")
            except clamor.NoRegion as e:
                out.append("NoRegion")
        print(json.dumps(out))
        """)
    env = {k: v for k, v in os.environ.items() if not k.startswith("CLAMOR_")}
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env)
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout.splitlines()[-1]) == ["NoRegion", "NoRegion"]


# ---- in workers ------------------------------------------------------------------
# A worker keeps the pages it fetched across stages.  Tests here reuse memory
# that earlier tests freed and the driver wrote again: each cl.run is a stage,
# and the driver's writes since the last one must be invalidated on the
# workers before it runs, so no worker reads the bytes of a freed block.

def _materialise(refs):
    from clamor import region as wregion

    return {"role": wregion.role(), "base": wregion.base(), "pid": os.getpid(),
            "arrays": {k: np.array(r.get(), copy=True) for k, r in refs.items()}}


@pytest.mark.parametrize("worker", [0, 1], ids=["same base", "other base"])
def test_arrays_by_reference_in_a_worker(cl, worker):
    vs = views()
    [out] = cl.run(_materialise, {k: clamor.ref(v) for k, v in vs.items()}, workers=[worker])
    assert out["role"] == "worker"
    assert out["base"] == (region.base() if worker == 0 else OTHER_BASE)
    assert out["pid"] == cl.worker_pids[worker]
    for what, v in vs.items():
        check_same(out["arrays"][what], v, what)


def _read_raw(r):
    import ctypes as c

    from clamor import region as wregion

    return r.addr - wregion.base(), c.string_at(r.addr, r.nbytes)


@pytest.mark.parametrize("worker", [0, 1], ids=["same base", "other base"])
def test_raw_bytes_by_reference_in_a_worker(cl, worker):
    n = 200_000  # spans several pages
    p = clamor.alloc(n)
    data = os.urandom(n)
    ctypes.memmove(p, data, n)
    try:
        [(off, got)] = cl.run(_read_raw, clamor.Ref(p, n), workers=[worker])
        assert off == p - region.base()
        assert got == data
        # the worker holds these pages now; the driver writes them again
        data = os.urandom(n)
        ctypes.memmove(p, data, n)
        [(off, got)] = cl.run(_read_raw, clamor.Ref(p, n), workers=[worker])
        assert off == p - region.base()
        assert got == data
    finally:
        clamor.free(p)
    # memory freed and allocated again, with new bytes
    q = clamor.alloc(n)
    data = os.urandom(n)
    ctypes.memmove(q, data, n)
    try:
        [(off, got)] = cl.run(_read_raw, clamor.Ref(q, n), workers=[worker])
        assert off == q - region.base()
        assert got == data
    finally:
        clamor.free(q)


def test_closure_over_a_huge_array_pickles_small(cl):
    big = clamor.empty((1 << 27,), "f8")  # 1 GiB of region; only written pages cost memory
    big[0], big[-1], big[1 << 26] = 1.5, 2.5, 3.5
    r = clamor.ref(big)

    def probe():
        import clamor as c

        c.reset_stats()
        x = r.get()
        vals = (float(x[0]), float(x[-1]), float(x[1 << 26]), x.shape, str(x.dtype))
        st = c.stats()   # fetched, or mapped on the driver's host
        return vals, st["bytes_fetched"] + st["pages_mapped"] * c.region.page_size()

    payload = cloudpickle.dumps(probe)
    assert len(payload) < 10 * 1024, len(payload)
    assert len(cloudpickle.dumps((probe, (), {}))) < 10 * 1024
    for worker in (0, 1):
        [(vals, fetched)] = cl.run(probe, workers=[worker])
        assert cl.stage_stats()[-1]["payload_bytes"] < 10 * 1024   # what the stage shipped
        assert vals == (1.5, 2.5, 3.5, (1 << 27,), "float64")
        assert 0 < fetched < 64 << 20  # three pages (and read-ahead, or their windows), not the GiB
    del big
