"""A differential soak of the paths where memory changes hands on a worker.

The driver keeps a pool of globals built under ``clamor.heap()`` (dicts,
lists of tuples, structured arrays whose dtype is a region object, nested
containers of strs, sets, KDTrees, bytearrays).  Round after round it
makes new ones, releases old ones (their region blocks go back to clamor's
allocator and the next ones are made over them), changes some in place,
and sends them to tasks.  Each task reads its globals and returns what it
read, together with results that keep region objects alive in the ways
pickling does not show (a view of a copy with the region's dtype, the
objects themselves, views of region arrays).  Between rounds the workers'
pages change: a new version, or (Dask) every page dropped by hand.

Every answer is compared with the same function run on the driver.  A
worker that released a region object (``region_frees``), a lost or
restarted worker, or a mismatch fails the run.  Memory changes hands on a
worker through clamor's allocator wrappers (Python's three domains), its
NEP 49 handler (arrays), the GOT interposition (scipy's C++ nodes) and
glibc (the worker's own objects): every kind of global exercises one.

    python tests/memsoak.py MODE SEED [SEED...] [--rounds N]   (MODE: fork, spawn, dask)

prints one JSON object per seed.  tests/test_memory_soak.py runs the
suite's seeds; the closing figures of the soak ran it at ten times those.
"""
import hashlib
import json
import os
import random
import sys

import numpy as np
import scipy.spatial  # before any heap() block: a first import inside one reads its files into the region

KINDS = ("dict", "tuples", "records", "nested", "strset", "kdtree", "bytes")


def make(kind, rng):
    """A new global of ``kind`` (call inside clamor.heap())."""
    n = rng.randint(20, 400)
    if kind == "dict":
        return {rng.randrange(10**6): float(rng.random()) for _ in range(n)}
    if kind == "tuples":
        return [(i, "t%d" % rng.randrange(10**5), [float(i), rng.random()]) for i in range(n)]
    if kind == "records":
        a = np.zeros(n, np.dtype([("id", "<i8"), ("w", "<f8"), ("tag", "S6")]))   # the dtype is made here
        a["id"] = np.arange(n) * 3
        a["w"] = np.linspace(0, 1, n)
        a["tag"] = [b"r%d" % (i % 97) for i in range(n)]
        return a
    if kind == "nested":
        return {"k%d" % i: ["v%d" % j for j in range(i % 7)] for i in range(n)}
    if kind == "strset":
        return {"s%d-%d" % (i, rng.randrange(1000)) for i in range(n)}
    if kind == "kdtree":
        t = scipy.spatial.KDTree(np.random.default_rng(rng.randrange(2**32)).random((n * 4, 2)))
        t.__dict__  # noqa: B018  (made here: CPython 3.11+ makes it on first request)
        return t
    return bytearray(rng.randbytes(n * 8))


def change(g, rng):
    """Change global ``g`` in place (inside clamor.heap()); False if its kind
    is not changed in place."""
    if isinstance(g, dict) and g:
        k = next(iter(g))
        g[k] = float(rng.random()) if isinstance(g[k], float) else ["w%d" % rng.randrange(99)]
    elif isinstance(g, list) and g:
        g[rng.randrange(len(g))] = (-1, "changed", [rng.random()])
    elif isinstance(g, np.ndarray):
        g["w"][rng.randrange(len(g))] = rng.random()
    elif isinstance(g, bytearray):
        g[rng.randrange(len(g))] = rng.randrange(256)
    else:
        return False
    return True


def _h(*parts):
    h = hashlib.sha256()
    for p in parts:
        h.update(p if isinstance(p, bytes) else repr(p).encode())
    return h.hexdigest()[:16]


def read(g, i):
    """What a task computes from global ``g`` (its ``i``-th reading): a
    digest, and results that hold region objects in ways pickling hides."""
    if isinstance(g, np.ndarray):
        rec = g[np.arange(i % len(g), len(g), 5)]         # a copy: its dtype is the region's
        return _h(g.tobytes(), g.dtype.descr), rec["id"], rec["tag"][:3], g[1:4]["w"]
    if isinstance(g, dict):
        items = sorted(g.items(), key=repr)
        return _h(items), items[:3], list(g.values())[: i % 4]
    if isinstance(g, list):
        return _h(g), g[i % len(g)], g[:2]
    if isinstance(g, (set, frozenset)):
        return _h(sorted(g)), sorted(g)[:2]
    if isinstance(g, bytearray):
        return _h(bytes(g)), g[:8]
    # a KDTree: queries through its C++ nodes
    q = np.random.default_rng(i).random((16, 2))
    d, j = g.query(q, k=3)
    return _h(d.tobytes(), j.tobytes()), g.data[j[:, 0]], g.data[:2]


def same(a, b):
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return (isinstance(a, np.ndarray) and isinstance(b, np.ndarray) and a.dtype == b.dtype
                and a.shape == b.shape and a.tobytes() == b.tobytes())
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return a == b


def main(mode, seed, rounds=8, workers=2):
    import clamor
    from clamor import region

    rng = random.Random(seed)
    region.ensure()
    pool = {}
    with clamor.heap():
        for s in range(6):
            pool[s] = make(rng.choice(KINDS), rng)
    out = {"mode": mode, "seed": seed, "rounds": rounds, "tasks": 0, "readings": 0, "mismatches": [],
           "refused": 0, "made": 6, "released": 0, "changed": 0}

    if mode == "dask":
        from distributed import Client, LocalCluster
        import clamor.dask
        cluster = LocalCluster(n_workers=workers, threads_per_worker=2, processes=True, dashboard_address=":0",
                               worker_dashboard_address=":0")
        client = Client(cluster)
        clamor.dask.attach(client)
        pids = client.run(os.getpid)

        def stage(fn, items):
            return client.gather(client.map(fn, items, pure=False))

        def worker_stats():
            return list(client.run(clamor.stats).values())

        def drop():
            client.run(lambda: region.drop_pages(0, region.size() // region.page_size()))

        def alive():
            return client.run(os.getpid) == pids
    else:
        cl = clamor.Cluster(workers=workers, start_method=mode, progress=False, start_timeout=60)
        cl.start()

        def stage(fn, items):
            return cl.parallelize(items, len(items)).map(fn).collect()

        def worker_stats():
            return cl.run(clamor.stats)

        def drop():
            pass   # (the Cluster's workers drop what the driver changed, at the next stage's version)

        def alive():
            return cl.stats()["recovery"]["workers_lost"] == 0

    try:
        for r in range(rounds):
            with clamor.heap():
                for s in list(pool):
                    p = rng.random()
                    if p < 0.25:
                        del pool[s]                          # released: the next make reuses its blocks
                        out["released"] += 1
                        pool[s] = make(rng.choice(KINDS), rng)
                        out["made"] += 1
                    elif p < 0.45:
                        out["changed"] += change(pool[s], rng)
            slots = sorted(pool)
            if mode == "dask":
                handles = {}
                for s in slots:
                    for _ in range(10):
                        if isinstance(pool[s], np.ndarray):
                            handles[s] = pool[s]      # (a region array travels as itself)
                            break
                        try:
                            handles[s] = clamor.dask.ref(pool[s])
                            break
                        except clamor.NotShareable as err:
                            # Dask's threads free objects onto CPython's free lists while a block
                            # runs, and the block may take one (docs/limits.md): made again
                            out["refused"] += 1
                            out.setdefault("refusals", []).append(str(err)[:200])
                            with clamor.heap():
                                pool[s] = make(rng.choice(KINDS), rng)
                    else:
                        del pool[s]
                slots = sorted(handles)

                def task(job, handles=handles):
                    s, i = job
                    h = handles[s]
                    return read(h if isinstance(h, np.ndarray) else h.get(), i)
            else:
                live = dict(pool)

                def task(job, live=live):
                    s, i = job
                    return read(live[s], i)
            jobs = [(s, rng.randrange(1000)) for s in slots for _ in range(2)]
            try:
                got = stage(task, jobs)
            except clamor.NotShareable as err:
                out["refused"] += 1
                out.setdefault("refusals", []).append(str(err)[:300])
                continue
            out["tasks"] += len(jobs)
            for (s, i), g in zip(jobs, got):
                want = read(pool[s], i)
                out["readings"] += len(want)
                if not same(list(g), list(want)):
                    which = [k for k, (x, y) in enumerate(zip(g, want)) if not same(x, y)]
                    out["mismatches"].append([r, s, type(pool[s]).__name__, i, which])
            if rng.random() < 0.5:
                drop()
        st = worker_stats()
        out["region_frees"] = sum(x["region_frees"] for x in st)
        out["workers_alive"] = alive()
    finally:
        if mode == "dask":
            clamor.dask.detach(client)
            client.close()
            cluster.close()
        else:
            cl.close()
    return out


if __name__ == "__main__":
    args = sys.argv[1:]
    rounds = 8
    if "--rounds" in args:
        k = args.index("--rounds")
        rounds = int(args[k + 1])
        del args[k:k + 2]
    mode, seeds = args[0], [int(x) for x in args[1:]]
    for seed in seeds:
        print(json.dumps(main(mode, seed, rounds)), flush=True)
