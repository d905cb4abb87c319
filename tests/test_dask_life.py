"""clamor.dask's life on a real Dask LocalCluster: detach, a client that
closes, attach again, and what attach refuses."""
import os
import threading
import time

import numpy as np
import pytest

pytest.importorskip("distributed")
from distributed import Client, LocalCluster  # noqa: E402

import clamor  # noqa: E402
import clamor.dask  # noqa: E402
from helpers import scenario  # noqa: E402


def _cluster(**kw):
    args = dict(n_workers=2, threads_per_worker=2, processes=True, dashboard_address=":0", host="127.0.0.1",
                worker_dashboard_address=":0")
    args.update(kw)
    return LocalCluster(**args)


def _region_state(base):
    """In a worker: whether the region is mapped there, and clamor's threads."""
    def probe():
        mapped = False
        with open("/proc/self/maps") as f:
            for line in f:
                lo = int(line.split("-", 1)[0], 16)
                if lo == base:
                    mapped = True
        names = []
        for t in os.listdir("/proc/self/task"):
            try:
                with open(f"/proc/self/task/{t}/comm") as f:
                    names.append(f.read().strip())
            except OSError:
                pass
        py = [t.name for t in threading.enumerate()]
        return {"mapped": mapped, "threads": sorted(n for n in names + py if "clamor" in n)}
    return probe


def test_attach_refuses_bad_input():
    with pytest.raises(clamor.ConfigError, match="Client"):
        clamor.dask.attach("tcp://127.0.0.1:8786")
    with pytest.raises(clamor.ConfigError, match="not attached"):
        clamor.dask.detach()
    with _cluster(n_workers=1) as cluster, Client(cluster) as c:
        with pytest.raises(clamor.ConfigError, match="connect_timeout"):
            clamor.dask.attach(c, connect_timeout=-1)
        clamor.dask.attach(c)
        try:
            with pytest.raises(clamor.ConfigError, match="already"):
                clamor.dask.attach(c)
            with pytest.raises(clamor.RegionInUse, match="Dask"):
                clamor.Cluster(workers=1).start()
        finally:
            clamor.dask.detach(c)


def test_detach_and_client_close_leave_nothing_on_the_workers():
    base = clamor.region.base() if clamor.region.size() else None
    with _cluster(n_workers=1) as cluster:
        with Client(cluster) as c:
            clamor.dask.attach(c)
            g = clamor.array(np.arange(10.0))
            assert c.submit(lambda: float(g.sum())).result() == 45.0
            base = clamor.region.base()
            state = c.run(_region_state(base))
            assert all(s["mapped"] and "clamor-pager" in s["threads"] for s in state.values())
            clamor.dask.detach(c)
            assert clamor.dask.attached() is None
            state = c.run(_region_state(base))
            assert all(not s["mapped"] and not s["threads"] for s in state.values()), state
            assert c.submit(lambda: 6 * 7).result() == 42     # Dask itself goes on
            clamor.dask.attach(c)                                # and attaches again
            assert c.submit(lambda: float(g[3])).result() == 3.0
        # the client closed without detach: the driver notices, the workers follow
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and clamor.dask.attached() is not None:
            time.sleep(0.1)
        assert clamor.dask.attached() is None
        with Client(cluster) as c2:
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:
                state = c2.run(_region_state(base))
                if all(not s["mapped"] and not s["threads"] for s in state.values()):
                    break
                time.sleep(0.2)
            assert all(not s["mapped"] and not s["threads"] for s in state.values()), state


def test_workers_inside_the_driver_process_are_refused():
    with LocalCluster(n_workers=1, processes=False, dashboard_address=":0") as cluster, Client(cluster) as c:
        with pytest.raises(clamor.ConfigError, match="processes"):
            clamor.dask.attach(c)
        assert clamor.dask.attached() is None


def test_a_worker_that_joins_later_attaches_too():
    with _cluster(n_workers=1) as cluster, Client(cluster) as c:
        clamor.dask.attach(c)
        try:
            g = clamor.array(np.arange(1 << 16, dtype=np.float64))
            assert c.submit(lambda: float(g[100])).result() == 100.0
            first = set(c.scheduler_info()["workers"])
            cluster.scale(2)
            c.wait_for_workers(2, timeout=60)
            new = (set(c.scheduler_info()["workers"]) - first).pop()
            g[100] = -5.0
            assert c.submit(lambda: float(g[100]) + float(g[7]), workers=[new], pure=False).result() == 2.0
            assert c.run(lambda: clamor.region.role(), workers=[new])[new] == "worker"
        finally:
            clamor.dask.detach(c)


def test_the_control_endpoint_admits_members_only_and_survives_bad_requests():
    import json

    import zmq

    from clamor.runtime import security
    with _cluster(n_workers=1) as cluster, Client(cluster) as c:
        clamor.dask.attach(c)
        try:
            st = clamor.dask.stats()
            ctx = zmq.Context()
            try:
                stranger = ctx.socket(zmq.DEALER)          # no keys: the handshake never completes
                stranger.linger = 0
                stranger.connect(st["control"])
                stranger.send_multipart([b"JOIN", b"{}"])
                assert not stranger.poll(1500)
                intruder = ctx.socket(zmq.DEALER)          # keys of another secret
                intruder.linger = 0
                security.Security(security.new_secret()).client(intruder)
                intruder.connect(st["control"])
                intruder.send_multipart([b"PING", b""])
                assert not intruder.poll(1500)
                member = ctx.socket(zmq.DEALER)
                member.linger = 0
                security.Security(clamor.dask.secret(c)).client(member)
                member.connect(st["control"])
                for bad in ([b"CHANGES", b"not json"], [b"CHANGES", json.dumps([1]).encode()], [b"WHAT", b""],
                            [b"CHANGES"], [b"\xff" * 5000]):
                    member.send_multipart(bad)
                    assert member.poll(5000)
                    kind, why = member.recv_multipart()
                    assert kind == b"ERROR" and why, bad
                member.send_multipart([b"PING", b""])
                assert member.poll(5000) and member.recv_multipart()[0] == b"PONG"
            finally:
                ctx.destroy(linger=0)
            g = clamor.array(np.arange(100.0))
            assert c.submit(lambda: float(g.sum())).result() == 4950.0
        finally:
            clamor.dask.detach(c)


def test_objects_sent_after_attaching_again_are_relocated_on_the_same_worker():
    # A detached worker forgets the relocation targets it bound: the next
    # attachment's driver numbers its own from 1 again, and a number the
    # worker still took for bound was skipped, left unbound in C (the
    # region's close reset it), and the first page that pointed at it
    # killed the worker (KilledWorker on the matrix's first read).
    out = scenario("""
        import collections
        import dask
        import scipy.sparse as sp
        from distributed import Client, LocalCluster
        import clamor.dask
        dask.config.set({"distributed.scheduler.allowed-failures": 0})
        region.ensure()
        with clamor.heap():
            d = collections.defaultdict(list)
            for i in range(3000):
                d[f"k{i % 97}"].append(i)
            a = sp.random(400, 300, density=0.02, format="csr", random_state=4)
        v = np.arange(300.0)
        reads = [(d, lambda x: [x["k5"], len(x)]), (a, lambda x: (x @ v).round(9).tolist())]
        got = []
        with LocalCluster(n_workers=1, threads_per_worker=1, processes=True, dashboard_address=":0") as cl, \\
                Client(cl) as c:
            for obj, read in reads:          # one worker, attached twice
                clamor.dask.attach(c)
                for _ in range(2):
                    try:
                        r = clamor.dask.ref(obj)
                        got.append(c.submit(lambda r: read(r.get()), r, pure=False).result(timeout=30) == read(obj))
                    except Exception as e:
                        got.append(type(e).__name__)
                clamor.dask.detach(c)
        print(json.dumps({"got": got}))
        """, timeout=180, env={"PYTHONHASHSEED": "6640"})
    assert out["got"] == [True] * 4, out["got"]


def test_a_heap_block_opened_under_the_drivers_lock_while_its_threads_wait_for_it_goes_on():
    """clamor.dask.ref may bring objects into the region, opening a heap()
    block, under the Dask driver's lock; a block waits for clamor's gated
    threads to be idle.  The keeper woke meanwhile and waited for that lock
    while busy: both waited for ever (a run of test_dask_objects hung).  A
    gated thread steps out of the gate while it waits for the lock."""
    out = scenario("""
import threading
from distributed import Client, LocalCluster
import clamor.dask
from clamor.dask import _current, _driver
cluster = LocalCluster(n_workers=1, threads_per_worker=1, processes=True, dashboard_address=":0",
                       worker_dashboard_address=":0")
client = Client(cluster)
clamor.dask.attach(client)
drv = _current["driver"]
res = {}
for attempt_ in range(3):
    done = threading.Event()
    def block():
        with drv._lock:
            time.sleep(4 * _driver.KEEP_PERIOD)       # the keeper wakes and waits for the lock
            with clamor.heap():
                box = [float(attempt_)]
        done.set()
    t = threading.Thread(target=block, daemon=True)
    t.start()
    res[attempt_] = done.wait(20)
g = clamor.array(np.arange(1000.0))
res["read"] = client.submit(lambda: float(g[10]), pure=False).result()
clamor.dask.detach(client)
client.close()
cluster.close()
print(json.dumps(res))
""", timeout=120)
    assert out == {"0": True, "1": True, "2": True, "read": 10.0}, out


def test_heap_blocks_one_after_another_while_attached_never_deadlock():
    """A block's end lets the parked residents go, but the next block's
    close came first: they stayed parked, while the close waited for a busy
    clamor thread (the keeper) that needed one of them, the event loop (60
    empty blocks in a row hung on 3.12, where Dask's profiler is a resident
    too).  A park now lasts until the gate opens once, and a resident still
    waking from one is not counted as parked for the next block.  80 blocks
    in a row run here (more than the 60 that hung)."""
    out = scenario("""
import threading
from distributed import Client, LocalCluster
import clamor.dask
cluster = LocalCluster(n_workers=1, threads_per_worker=1, processes=True, dashboard_address=":0",
                       worker_dashboard_address=":0")
client = Client(cluster)
clamor.dask.attach(client)
made, done = [], threading.Event()
def blocks():
    for i in range(80):
        with clamor.heap():
            made.append([float(i)])
    done.set()
threading.Thread(target=blocks, daemon=True).start()
res = {"done": done.wait(120)}
res["outside"] = sum(not region.contains(id(m)) for m in made)
res["read"] = client.submit(lambda: 41 + 1, pure=False).result(timeout=30) if res["done"] else None
clamor.dask.detach(client)
client.close()
cluster.close()
print(json.dumps(res))
""", timeout=180)
    assert out == {"done": True, "outside": 0, "read": 42}, out


def test_a_worker_detached_after_a_task_tracked_region_objects_collects_and_attaches_again():
    # A task that stores a container of its own in a region dict makes the
    # worker's collector track that dict (its links in region pages), and
    # one that keeps a region object in its own memory holds a reference
    # counted in its copy of the page.  At detach the region is unmapped:
    # the worker's next collection walked into it and killed the worker
    # (the nanny started another), every time.  Now each attachment reads
    # right on the same worker, and collections after each detach live.
    out = scenario("""
        import gc, types
        import dask
        from distributed import Client, LocalCluster
        import clamor.dask
        dask.config.set({"distributed.scheduler.allowed-failures": 0})
        region.ensure()
        with clamor.heap():
            objs = [types.SimpleNamespace(cache={"n": k}, data=np.arange(1000.0) + k) for k in range(3)]

        def fill(r):
            h = r.get()
            h.cache["engine"] = [list(range(5)) for _ in range(50)]
            import distributed
            distributed.__dict__.setdefault("_clamor_test_kept", []).append(h)
            return float(h.data.sum())

        def collect():
            gc.collect()
            return os.getpid()

        got, pids = [], []
        with LocalCluster(n_workers=1, threads_per_worker=1, processes=True, dashboard_address=":0") as cl, \\
                Client(cl) as c:
            for k, obj in enumerate(objs):
                clamor.dask.attach(c)
                try:
                    got.append(c.submit(fill, clamor.dask.ref(obj), pure=False).result(timeout=30)
                               == float(obj.data.sum()))
                except Exception as e:
                    got.append(f"{type(e).__name__}: {str(e)[:200]}")
                clamor.dask.detach(c)
                try:
                    pids.extend(c.run(collect).values())
                except Exception as e:
                    pids.append(f"{type(e).__name__}: {str(e)[:200]}")
                with clamor.heap():                 # the driver moves on between attachments
                    obj.data = np.zeros(1000) + 7
                    junk = [{"x" + str(i): float(i)} for i in range(3000)]
        print(json.dumps({"got": got, "pids": pids}))
        """, timeout=180, env={"PYTHONHASHSEED": "6640"})
    assert out["got"] == [True] * 3, out
    assert len(out["pids"]) == 3 and all(isinstance(p, int) for p in out["pids"]), out
    assert len(set(out["pids"])) == 1, out       # the same worker throughout
