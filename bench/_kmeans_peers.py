"""kmeans.py's peers: the same Lloyd iterations as a Spark RDD program and
as a Dask program, each run in a subprocess of its own (``kmeans.py --run
SYSTEM``) before the clamor driver exists.

The driver side (``run_peers``) writes the points as P ``.npy`` blocks,
the same contiguous chunks clamor and the multiprocessing baseline get
(``_common.bounds``), and the initial centroids into a temporary directory,
runs each peer's subprocess over it and reads back its figures and final
centroids.  The subprocess side (``child``) starts the peer with W
single-core worker processes (``_peers.spark``, ``_peers.dask``), has the
workers load the blocks, and runs ``lloyd``: per iteration one task per
block computing ``_common.partial_sums`` with the centroids, the partials
gathered in partition order and folded with ``_common.add`` in the driver,
which moves the centroids with ``_common.update``; the same arithmetic in
the same order as clamor's, so the centroids come out equal.

Every task also says how long its kernel took and, on Spark, how long it
waited for its block (``timed_partials``), so a slow iteration can be told
apart into reading, computing and the system's own overhead.

Numpy is imported here at module level: import this module only after
``_common.one_blas_thread()`` (kmeans.py does so first).
"""
import json
import os
import shutil
import sys
import tempfile
import time

import numpy as np

from _common import add, bounds, die_with_parent, partial_sums, update

PEERS = ("spark", "dask")
HERE = os.path.dirname(os.path.abspath(__file__))
KMEANS = os.path.join(HERE, "kmeans.py")


# ---- the data directory -------------------------------------------------------------------

def save_blocks(d, x, init, meta):
    """The points as ``meta["partitions"]`` contiguous blocks, the initial
    centroids and the run's parameters, in directory ``d``."""
    b = bounds(len(x), meta["partitions"])
    for i in range(meta["partitions"]):
        np.save(os.path.join(d, f"block{i}.npy"), x[b[i]:b[i + 1]])
    np.save(os.path.join(d, "init.npy"), init)
    with open(os.path.join(d, "meta.json"), "w") as f:
        json.dump(meta, f)


def load_block(d, i):
    """Block i of the points (what the peers' workers run to load them)."""
    return np.load(os.path.join(d, f"block{i}.npy"))


def _meta(d):
    with open(os.path.join(d, "meta.json")) as f:
        return json.load(f)


# ---- the iterations ------------------------------------------------------------------------

def timed_partials(block, c, read_s=0.0):
    """A task's answer: (partial sums and counts of ``block`` at centroids
    ``c``, (seconds the task waited for its block, kernel seconds, the
    kernel's CPU seconds, pid)).  Kernel seconds well above its CPU seconds
    are time the task's thread waited for a core or the GIL."""
    t, cpu = time.perf_counter(), time.thread_time()
    out = partial_sums(block, c)
    return out, (read_s, time.perf_counter() - t, time.thread_time() - cpu, os.getpid())


def lloyd(step, init, iters, name):
    """``iters`` iterations from ``init``; ``step(c)`` returns the
    partitions' timed_partials in partition order.  Returns (centroids,
    seconds per iteration, per iteration the longest read, kernel and
    kernel CPU seconds of its tasks)."""
    c, times, slow = init, [], []
    for it in range(iters):
        t = time.perf_counter()
        res = step(c)
        acc = res[0][0]
        for r in res[1:]:
            acc = add(acc, r[0])
        c = update(c, *acc)
        times.append(time.perf_counter() - t)
        read, kernel, cpu = (max(r[1][j] for r in res) for j in range(3))
        slow.append((read, kernel, cpu))
        print(f"  {name:>5} iteration {it}: {times[-1]:7.3f} s (longest read {read:.3f} s, kernel {kernel:.3f} s, "
              f"kernel CPU {cpu:.3f} s; {len({r[1][3] for r in res})} worker processes)", flush=True)
    return c, times, slow


def _rounds(step, init, meta, name, between=None):
    """``meta["reps"]`` rounds of lloyd, each from the initial centroids;
    ``between()`` (if given) is called after each round and its value kept."""
    rounds = []
    for _ in range(meta["reps"]):
        c, times, slow = lloyd(step, init, meta["iters"], name)
        rounds.append({"times": times, "slow": slow, "after": between() if between else None})
    return c, rounds


# ---- Spark ------------------------------------------------------------------------------------

def _block_facts(block):
    """The untimed warm-up's answer: the worker's pid, BLAS threads,
    interpreter and numpy, and the block's rows."""
    return os.getpid(), os.environ.get("OPENBLAS_NUM_THREADS"), sys.executable, np.__version__, len(block)


def _say_facts(facts):
    return (f"Python worker processes {sorted({f[0] for f in facts})}, BLAS threads {sorted({str(f[1]) for f in facts})}, "
            f"{sorted({f[2] for f in facts})} with numpy {sorted({f[3] for f in facts})}")


def run_spark(d, meta, init):
    import _peers

    P, W = meta["partitions"], meta["workers"]
    # The Python workers run this interpreter (and its packages), as the
    # other systems' workers do, not the python3 first on PATH: PySpark's
    # documented PYSPARK_PYTHON, read when the SparkContext starts.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    with _peers.spark(W, meta["spark_executor_mb"], app="kmeans") as sc:
        for f in ("_common.py", "_kmeans_peers.py"):   # what the tasks import, shipped the documented way
            sc.addPyFile(os.path.join(HERE, f))
        rdd = sc.parallelize(range(P), P).map(lambda i: load_block(d, i)).cache()
        facts = rdd.map(_block_facts).collect()   # untimed: loads and caches the blocks, starts the Python workers
        info = [r for r in sc._jsc.sc().getRDDStorageInfo() if r.id() == rdd.id()]
        cached = info[0].numCachedPartitions() if info else 0
        if cached != P:
            raise RuntimeError(f"Spark cached {cached} of {P} blocks (it would reload the rest every iteration): "
                               f"raise --spark-executor-mb")
        mem = int(info[0].memSize())
        execs = _peers.executor_pids(sc)
        print(f"  spark: {sc.version}, master {sc.master}, {len(execs)} executor JVMs; {_say_facts(facts)}; "
              f"{P} blocks cached ({mem / (1 << 20):.0f} MiB in the executors' memory)", flush=True)

        def step(c):
            def task(it):
                t = time.perf_counter()
                blocks = list(it)   # the cached block: the executor JVM writes it to this Python worker, unpickled here
                read = time.perf_counter() - t
                return [timed_partials(b, c, read) for b in blocks]
            return rdd.mapPartitions(task).collect()

        c, rounds = _rounds(step, init, meta, "spark")
        extra = {"version": sc.version, "master": sc.master, "executor_processes": len(execs),
                 "python_workers": len({f[0] for f in facts}), "cached_bytes": mem,
                 # every iteration reads every cached block through the JVM -> Python socket
                 "bytes": mem * meta["iters"]}
    return c, rounds, extra


# ---- Dask --------------------------------------------------------------------------------------

def _incoming(client):
    """Bytes the workers have received from one another so far (their transfer logs)."""
    got = client.run(lambda dask_worker: sum(e["total"] for e in dask_worker.transfer_incoming_log))
    return int(sum(got.values()))


def run_dask(d, meta, init):
    import _peers

    P, W = meta["partitions"], meta["workers"]
    with _peers.dask(W) as client:
        import distributed

        parts = client.map(load_block, [d] * P, range(P), pure=False)
        facts = client.gather([client.submit(_block_facts, f, pure=False) for f in parts])   # untimed
        holders = {w for v in client.who_has(parts).values() for w in v}
        print(f"  dask: {distributed.__version__}, {len(client.scheduler_info()['workers'])} workers, "
              f"blocks on {len(holders)} of them; {_say_facts(facts)}", flush=True)

        def step(c):
            return client.gather([client.submit(timed_partials, f, c, pure=False) for f in parts])

        before = [_incoming(client)]

        def moved():
            now = _incoming(client)
            out, before[0] = now - before[0], now
            return out

        c, rounds = _rounds(step, init, meta, "dask", moved)
        copies = sum(len(v) for v in client.who_has(parts).values())
        if copies > P or any(r["after"] for r in rounds):
            # Once more than 2 x threads tasks of one group are alive (this
            # loop's, released but not yet forgotten), the scheduler takes
            # them for root-ish and places them without regard to their block.
            print(f"  dask: the workers copied blocks between them ({[r['after'] for r in rounds]} bytes a round; "
                  f"{copies} copies of {P} blocks at the end): tasks placed as root-ish, away from their block",
                  flush=True)
        extra = {"version": distributed.__version__, "block_holders": len(holders), "block_copies": copies,
                 "python_workers": len({f[0] for f in facts}), "bytes": rounds[-1]["after"]}
    return c, rounds, extra


RUNNERS = {"spark": run_spark, "dask": run_dask}


# ---- the subprocess and the driver's side of it -------------------------------------------------

def child(system, d, out):
    """``kmeans.py --run SYSTEM``: run one peer over the blocks in ``d``;
    write its figures to ``out`` (JSON) and its centroids beside it, or the
    reason it could not run."""
    die_with_parent()
    import _peers

    def run():
        c, rounds, extra = RUNNERS[system](d, _meta(d), np.load(os.path.join(d, "init.npy")))
        np.save(out + ".c.npy", c)
        return {"rounds": rounds, "extra": extra}

    return _peers.child_result(system, out, run)


def _run_one(system, d, timeout):
    """``kmeans.py --run system`` in a subprocess; its result dict (with
    ``error`` when it failed without saying why)."""
    import _peers

    out = os.path.join(d, f"result-{system}.json")
    res = _peers.run_child(system, [sys.executable, KMEANS, "--run", system, "--data", d, "--out", out], out, timeout)
    if "rounds" in res:
        res["centroids"] = np.load(out + ".c.npy")
    return res


def run_peers(systems, x, init, meta, timeout):
    """Each of ``systems`` over the points ``x`` from ``init``, one after
    another; {system: result dict}.  A result has ``rounds`` (each with
    ``times`` and ``slow``), ``extra`` and ``centroids`` when the peer ran,
    else ``missing`` or ``error`` saying why.  Call it from a process that
    is not a clamor driver, after ``_peers.subreaper()``."""
    d = tempfile.mkdtemp(prefix="kmeans-")
    results = {}
    try:
        save_blocks(d, x, init, meta)
        for s in systems:
            print(f"-- {s}", flush=True)
            r = results[s] = _run_one(s, d, timeout)
            if "rounds" not in r:
                print(f"  {s}: not run: {r.get('missing') or r.get('error')}", flush=True)
            if r["left_behind"]:
                print(f"  {s}: left behind and killed: {r['left_behind']}", flush=True)
    finally:
        shutil.rmtree(d, ignore_errors=True)
    return results
