"""clamor's globals on a real Dask LocalCluster (spawned worker processes).

Every result is checked against the same code run in this process; the
versions tests hold tasks with Dask's own Events so that the driver's
write lands while they run.
"""
import os
import pickle
import time
import warnings

import numpy as np
import pytest

dask = pytest.importorskip("dask")
distributed = pytest.importorskip("distributed")
import dask.bag as db  # noqa: E402
from distributed import Client, Event, LocalCluster  # noqa: E402

import clamor  # noqa: E402
import clamor.dask  # noqa: E402
from clamor.dask import _pickling  # noqa: E402

GiB = 1 << 30
PAGE = 64 << 10


def _cluster(**kw):
    args = dict(n_workers=2, threads_per_worker=2, processes=True, dashboard_address=":0", host="127.0.0.1",
                worker_dashboard_address=":0")
    args.update(kw)
    return LocalCluster(**args)


@pytest.fixture(scope="module")
def client():
    with _cluster() as cluster, Client(cluster) as c:
        c.wait_for_workers(2, timeout=120)    # (both started: a test below runs a task on every thread)
        clamor.dask.attach(c)
        try:
            yield c
        finally:
            if clamor.dask.attached() is c:
                clamor.dask.detach(c)


@pytest.fixture(scope="module")
def big(client):
    """A 1 GiB global, one float64 written every 4096 (a page in 8 holds
    data; the rest were never written and cost nothing)."""
    a = clamor.zeros(GiB // 8)
    a[::4096] = np.arange(a.size // 4096, dtype=np.float64) * 3.0 + 1.0
    return a


def _moved(client):
    """Bytes each worker fetched so far (from the driver and from peers: bytes_fetched counts both)."""
    return {w: s["bytes_fetched"] for w, s in client.run(clamor.stats).items()}


# -- by reference ------------------------------------------------------------


def test_closure_over_a_1gib_global_pickles_to_a_few_hundred_bytes(client, big):
    from distributed.protocol.pickle import dumps    # what Dask pickles a task's function with

    def f(i):
        return float(big[i * 4096])

    assert len(dumps(f)) < 1200
    assert len(dumps(big)) < 400
    before = _moved(client)
    got = client.gather(client.map(f, range(256)))
    assert got == [f(i) for i in range(256)]
    moved = sum(_moved(client).values()) - sum(before.values())
    # 256 pages are read: at most a few read-ahead pages around each, never the GiB
    assert 0 < moved <= 256 * 16 * PAGE


def test_the_graph_dask_sends_stays_small(client, big):
    """Dask warns of a graph above its threshold: set it at 4 kB, and a
    closure over the 1 GiB global does not reach it, while one over an
    ordinary 1 MiB array does (the check can fail)."""
    plain = np.ones(1 << 17)
    with dask.config.set({"distributed.admin.large-graph-warning-threshold": "4kB"}):
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert client.submit(lambda: float(big[4096 * 5] + big[-4096]), pure=False).result() == \
                float(big[4096 * 5] + big[-4096])
        with pytest.warns(UserWarning, match="large graph"):
            assert client.submit(lambda: float(plain.sum()), pure=False).result() == float(plain.sum())


def test_every_way_dask_passes_data(client, big):
    small = clamor.array(np.arange(50_000, dtype=np.int32).reshape(250, 200))
    rec = clamor.zeros(1000, dtype=np.dtype([("x", "<f8"), ("id", "<i4"), ("tag", "S3")], align=True))
    rec["x"] = np.linspace(0, 1, 1000)
    rec["id"] = np.arange(1000)[::-1]
    rec["tag"] = b"abc"

    def total(a):
        return float(np.asarray(a, dtype=np.float64).sum())

    cases = {
        "submit arg": (client.submit(total, small), total(small)),
        "submit kwarg": (client.submit(lambda *, a: total(a), a=small[::3, ::-2]), total(small[::3, ::-2])),
        "map over views": (client.map(total, [small[i] for i in range(0, 250, 50)]),
                           [total(small[i]) for i in range(0, 250, 50)]),
        "nested containers": (client.submit(lambda d: total(d["a"][1]) + total(d["b"]), {"a": [small, small.T],
                                            "b": small[:, 7]}), total(small.T) + total(small[:, 7])),
        "structured": (client.submit(lambda r: (float(r["x"].sum()), int(r["id"][3]), bytes(r["tag"][9])), rec),
                       (float(rec["x"].sum()), int(rec["id"][3]), bytes(rec["tag"][9]))),
        "delayed": (dask.delayed(total)(small[10:20]), total(small[10:20])),
        "delayed closure": (dask.delayed(lambda: float(big[4096 * 77]))(), float(big[4096 * 77])),
        "bag": (db.from_sequence(range(40), npartitions=4).map(lambda i: float(big[i * 4096])).sum(),
                sum(float(big[i * 4096]) for i in range(40))),
    }
    for name, (job, want) in cases.items():
        if isinstance(job, list):
            got = client.gather(job)
        elif hasattr(job, "compute"):
            got = job.compute()
        else:
            got = job.result()
        assert got == want, name


def test_a_result_that_is_a_view_of_a_global_comes_back_as_a_copy(client, big):
    fut = client.submit(lambda: big[4096 * 3:4096 * 3 + 10])
    got = fut.result()
    assert not clamor.in_region(got.__array_interface__["data"][0])
    assert np.array_equal(got, big[4096 * 3:4096 * 3 + 10])


def test_ordinary_arrays_pickle_as_numpy_pickles_them():
    """While attached, every array outside the region pickles as numpy's
    own reduce would, at every protocol, with and without out-of-band
    buffers; the payload does not name clamor (it loads without it)."""
    rng = np.random.default_rng(7)
    base = rng.standard_normal((40, 30))
    arrays = [base, np.asfortranarray(base), base[::2, ::-3], base.T, base[3], np.float32(2.5) * base[:, :1],
              np.arange(0), np.array(3.5), np.array(["a", "bb"]), np.array([1, "x", None], dtype=object),
              rng.integers(0, 9, (5, 6, 7)).astype(np.uint8),
              np.zeros(8, dtype=[("a", "<i4"), ("b", "<f8", (2,))]), np.ones(10, dtype=">i8")]
    ro = base.copy()
    ro.flags.writeable = False
    arrays.append(ro)
    with clamor_attached_pickling():
        for a in arrays:
            for proto in range(2, pickle.HIGHEST_PROTOCOL + 1):
                for oob in ([None, []] if proto >= 5 else [None]):
                    kw = {"buffer_callback": oob.append} if oob is not None else {}
                    mine = pickle.dumps(a, protocol=proto, **kw)
                    assert b"clamor" not in mine
                    b = pickle.loads(mine, buffers=oob or ())
                    ref_bufs = []
                    ref = pickle.loads(_numpy_dumps(a, proto, ref_bufs if oob is not None else None),
                                       buffers=ref_bufs)
                    # (numpy itself loads a non-native byte order as native below protocol 5;
                    # clamor's keeps the array's own: both hold the same values)
                    assert b.dtype in (ref.dtype, a.dtype) and b.shape == ref.shape, (a.dtype, proto)
                    assert b.flags.writeable == ref.flags.writeable, (a.dtype, proto, oob is not None)
                    assert b.flags.c_contiguous == ref.flags.c_contiguous
                    if a.dtype.hasobject:
                        assert list(b.ravel()) == list(a.ravel())
                    else:
                        assert np.array_equal(b, a) and b.tobytes() == a.tobytes()


def _numpy_dumps(a, proto, bufs):
    """numpy's own pickle of ``a`` (without clamor's dispatch entry)."""
    import copyreg
    saved = copyreg.dispatch_table.pop(np.ndarray, None)
    try:
        kw = {"buffer_callback": bufs.append} if bufs is not None else {}
        return pickle.dumps(a, protocol=proto, **kw)
    finally:
        if saved is not None:
            copyreg.dispatch_table[np.ndarray] = saved


class clamor_attached_pickling:
    """The driver's pickling hooks, installed for the block if no client
    is attached (the differential test needs only them)."""

    def __enter__(self):
        self.own = _pickling._stamp[0] is None
        if self.own:
            _pickling.install(lambda: 1)

    def __exit__(self, *exc):
        if self.own:
            _pickling.uninstall()


# -- versions ------------------------------------------------------------------


def test_an_update_between_two_computes(client):
    g = clamor.array(np.arange(100_000, dtype=np.float64))
    keys = list(range(0, 100_000, 997))
    first = db.from_sequence(keys, npartitions=4).map(lambda k: float(g[k]))
    before = first.compute()
    g[::997] = -g[::997]
    after = db.from_sequence(keys, npartitions=4).map(lambda k: float(g[k])).compute()
    assert before == [float(k) for k in keys]
    assert after == [-float(k) for k in keys]
    # the first bag, computed again, is a new submission: it reads the update
    assert first.compute() == after


def _hold(name):
    """A task body that says it started, waits for ``name``, then reads."""
    def run(g, i):
        Event(name + "-started-" + str(i)).set()
        assert Event(name).wait(60)
        return float(g[i * 8192])
    return run


def _one_per_thread(client, f, *args):
    """Submit ``f(*args, i)`` once per worker thread, two to each worker
    (Dask may queue a third on one worker behind two that wait: named as
    where each should go, and left free to go elsewhere if its worker dies)."""
    client.wait_for_workers(2, timeout=120)     # (one a test killed is back)
    workers = sorted(client.scheduler_info()["workers"])
    assert len(workers) == 2, workers
    return [client.submit(f, *args, i, pure=False, workers=[workers[i % 2]], allow_other_workers=True)
            for i in range(4)]


def test_tasks_running_while_the_driver_writes_read_their_own_version(client):
    g = clamor.array(np.arange(1 << 20, dtype=np.float64))
    name = f"go-{time.monotonic_ns()}"
    n = 4   # one per worker thread: all running at once
    futs = _one_per_thread(client, _hold(name), g)
    for i in range(n):
        assert Event(f"{name}-started-{i}", client=client).wait(60)
    g[::8192] = 1e9                        # while the four run
    later = client.map(lambda i: float(g[i * 8192]), range(n), pure=False)
    Event(name, client=client).set()
    assert client.gather(futs) == [float(i * 8192) for i in range(n)]
    assert client.gather(later) == [1e9] * n


def test_a_worker_killed_mid_computation_recomputes_at_the_submitted_version(client):
    g = clamor.array(np.arange(1 << 20, dtype=np.float64) * 2)
    name = f"kill-{time.monotonic_ns()}"
    futs = _one_per_thread(client, _hold(name), g)
    for i in range(4):
        assert Event(f"{name}-started-{i}", client=client).wait(60)
    g[:] = -1.0                                 # every page changes
    victim = next(w for w, keys in client.processing().items() if futs[0].key in keys)
    pid = client.run(os.getpid, workers=[victim])[victim]
    os.kill(pid, 9)
    Event(name, client=client).set()
    assert client.gather(futs) == [float(i * 8192 * 2) for i in range(4)]
    assert client.submit(lambda: float(g[8192]), pure=False).result() == -1.0


def test_versions_are_freed_once_their_futures_are(client, monkeypatch):
    from clamor.dask import _driver, _scheduler
    monkeypatch.setattr(_driver, "STAMP_HOLD", 1.0)    # (30 s by default: a graph may be on its way)
    monkeypatch.setattr(_scheduler, "HOLD", 1.0)
    g = clamor.array(np.zeros(1 << 16))
    kept = []
    futs = []
    for step in range(5):
        g[step * 4096] = step + 1
        futs.append(client.submit(lambda s=step: float(g[s * 4096]), pure=False))
    assert client.gather(futs) == [float(s + 1) for s in range(5)]
    kept.append(clamor.dask.stats()["versions_kept"])
    del futs
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and clamor.dask.stats()["versions_kept"] > 1:
        time.sleep(0.2)
    assert kept[0] >= 2          # several versions were held while their futures were
    assert clamor.dask.stats()["versions_kept"] == 1




# -- differential: random writes and submissions, interleaved ------------------


@pytest.mark.parametrize("seed", [11, 12, 13, 14, 15])
def test_random_updates_and_submissions_read_what_one_process_reads(client, seed):
    """Rounds of sparse driver writes, each followed by submissions that do
    not wait for the earlier ones (map, submit, delayed, bag; tasks sleep a
    little so that versions overlap on the workers).  Every result must
    equal what the same function returned in this process at submission."""
    rng = np.random.default_rng(seed)
    g = clamor.array(rng.standard_normal(1 << 18))      # 2 MiB: 32 pages
    jobs, want = [], []
    for _ in range(16):
        pages = rng.choice(32, size=rng.integers(1, 6), replace=False)
        for p in pages:
            lo = int(p) * 8192 + int(rng.integers(0, 8000))
            g[lo:lo + int(rng.integers(1, 100))] = rng.standard_normal()
        idx = rng.integers(0, g.size, size=int(rng.integers(1, 40)))
        nap = float(rng.uniform(0, 0.02))

        def read(i, idx=idx, nap=nap):
            time.sleep(nap)
            return float(g[idx[i % idx.size]]) + float(g[idx].sum())

        n = int(rng.integers(1, 6))
        expect = [read(i, nap=0) for i in range(n)]
        how = rng.integers(0, 4)
        if how == 0:
            jobs.append(client.map(read, range(n), pure=False))
        elif how == 1:
            jobs.append([client.submit(read, i, pure=False) for i in range(n)])
        elif how == 2:   # (client.compute submits now; .compute() would read at its own, later time)
            jobs.append(client.compute(dask.delayed(lambda *xs: list(xs))(*[dask.delayed(read)(i) for i in range(n)])))
        else:
            jobs.append(client.compute(db.from_sequence(range(n), npartitions=min(n, 3)).map(read)))
        want.append(expect)
    got = [client.gather(job) for job in jobs]
    assert got == want


def test_a_worker_whose_attach_failed_tears_down_without_an_error():
    """Dask calls a plugin's teardown also when its setup raised: a worker
    that never attached (here: no secret in its environment) has nothing to
    stop, and its teardown says nothing of attributes never set.  (In a
    fresh interpreter: one with a region already is refused earlier.)"""
    from helpers import run_json
    out = run_json("""
import json, os
from clamor.dask._worker import RegionPlugin
from clamor.errors import ConfigError

class FakeWorker:       # (what _attach reads of a worker before the refusal)
    pass

os.environ.pop("CLAMOR_SECRET", None)
plugin = RegionPlugin("tcp://127.0.0.1:9", None, True, driver_pid=-1, driver_pidns="elsewhere")
try:
    plugin._attach(FakeWorker())
    refused = None
except ConfigError as e:
    refused = str(e)
try:
    plugin.teardown(FakeWorker())
    teardown = "ok"
except Exception as e:
    teardown = f"{type(e).__name__}: {e}"
print(json.dumps({"refused": refused, "teardown": teardown}))
""")
    assert out["refused"] and "no clamor secret" in out["refused"], out
    assert out["teardown"] == "ok", out
