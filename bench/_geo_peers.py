"""geo.py's peers: the geo demo's k-nearest queries on Spark, Dask and Ray.

Each peer broadcasts the same (KDTree, records) that geo.py's broadcast
baseline pickles, the way that system's users share a global, and answers
the same queries in the same partitions with the same ``geo.answer``:

  spark  ``bc = sc.broadcast((tree, records))`` (TorrentBroadcast, Spark's
         defaults), ``sc.parallelize(parts, P).mapPartitions(...)`` reading
         ``bc.value`` (loaded once per Python worker, which Spark reuses),
         ``collect()``; ``bc.destroy()`` after the clock stops.
  dask   ``client.scatter([tree, records], broadcast=True)`` (default
         hashing), one ``client.submit(geo.answer, tree, records, part)``
         per partition, ``client.gather`` in order; the futures released
         after the clock stops.
  ray    ``ref = ray.put((tree, records))`` once, one remote task per
         partition taking ``ref`` (Ray hands each task the tuple, its numpy
         arrays zero-copy from the object store), ``ray.get`` in order.

Timed: from the broadcast call (which pickles or serialises the value) to
the last answer on the driver; ``broadcast_s`` is the broadcast call alone.
Not timed: loading the data, starting the system, and the warm-up: the same
job once with a small tree (256 records) and 8 queries a partition, which
starts every worker process (Spark's executors and their Python workers,
Dask's workers, Ray's worker processes) and imports scipy and the demo's
module in each, as geo.py's broadcast workers are started and have
imported them before the data exists.

Every system is started through ``start(system, cfg)``, clamor included
(geo.py calls it for its Cluster); ``cfg`` is the JSON-able dict of
``config(args, pickled_bytes)``.  On one host it uses ``_peers.py``.

geo.py runs each peer in a subprocess of its own (``geo.py --run SYSTEM``,
``child`` here; ``run_system`` starts it), after clamor and its own
baselines are done and their processes gone.  The data travel by file:
``data.pkl`` (the pickle of (tree, records), the broadcast baseline's
bytes), ``queries.npy`` and ``config.json``; a subprocess writes
``result-SYSTEM.json`` and its answers ``answers-SYSTEM.npz``.  The task
functions are nested functions, which cloudpickle sends by value: the
workers import only ``clamor.demo.geo`` (installed), never this file.
"""
import contextlib
import json
import os
import pickle
import sys
import time

import numpy as np

import _peerhosts
import _peers
from _common import bounds, die_with_parent
from clamor.demo import geo

PEERS = ("spark", "dask", "ray")
MIB = 1 << 20
WARM_RECORDS = 256   # records of the warm-up's small tree
WARM_QUERIES = 8     # queries of each warm-up partition


def config(args, pickled_bytes):
    """What ``start`` and the subprocesses need, from geo.py's arguments:
    Spark's memory defaults to what a broadcast of ``pickled_bytes`` needs
    (executor heap 2 x it + 1 GiB; driver 4 x it, at least 2g: Spark's 1g
    default cannot hold a 1 GiB broadcast)."""
    return {"workers": args.workers, "partitions": 4 * args.workers, "page_size": args.page_size,
            "netns": args.netns, "rate": args.rate if args.netns else None,
            "spark_executor_mb": args.spark_executor_mb or (2 * pickled_bytes // MIB + 1024),
            "spark_driver_memory": args.spark_driver_memory or f"{max(2, -(-4 * pickled_bytes // (1 << 30)))}g"}


def hosts_of(cfg):
    """The namespace hosts for ``cfg`` (``--netns``: one a worker, links at
    ``--rate``), or None on one host: a context manager."""
    return _peerhosts.hosts_or_none(cfg["workers"], cfg["rate"] if cfg.get("netns") else None)


def start(system, cfg, hosts=None):
    """A context manager that starts ``system`` with ``cfg["workers"]``
    single-core worker processes and yields its handle (a clamor Cluster, a
    SparkContext, a Dask Client, the ray module); everything it started is
    stopped when the block ends.  PeerMissing when a peer cannot run here.
    With ``hosts`` (namespace hosts), one worker per host (``_peerhosts``)."""
    w = cfg["workers"]
    if hosts is not None:
        return {"clamor": lambda: _peerhosts.clamor_cluster(hosts, page_size=cfg.get("page_size"), progress=None),
                "spark": lambda: _peerhosts.spark(hosts, cfg["spark_executor_mb"], cfg["spark_driver_memory"],
                                                  conf={"spark.ui.showConsoleProgress": "false"}, app="geo"),
                # the Active Memory Manager would drop the broadcast's replicas, to be fetched again
                "dask": lambda: _peerhosts.dask(hosts, config=_peerhosts.DASK_AMM_OFF),
                "ray": lambda: _peerhosts.ray_session(hosts)}[system]()
    if system == "clamor":
        import clamor

        return clamor.Cluster(workers=w, page_size=cfg.get("page_size"), progress=None)
    if system == "spark":
        # Spark's Python workers run PYSPARK_PYTHON (default: python3 on the
        # PATH, which need not be this interpreter nor see its packages)
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        return _peers.spark(w, cfg["spark_executor_mb"], cfg["spark_driver_memory"], app="geo",
                            conf={"spark.ui.showConsoleProgress": "false"})   # no progress bars in the output
    if system == "dask":
        return _peers.dask(w)
    if system == "ray":
        return _peers.ray_session(w)
    raise ValueError(f"no such system: {system}")


def split(queries, p):
    """The query partitions, cut as ``Cluster.parallelize`` cuts them."""
    b = bounds(len(queries), p)
    return [queries[b[i]:b[i + 1]] for i in range(p)]


# ---- the jobs: (answers per partition, broadcast s, total s) --------------------------------

def spark_job(sc, tree, records, parts):
    t0 = time.perf_counter()
    bc = sc.broadcast((tree, records))
    t1 = time.perf_counter()

    def answer(it):
        tr, rec = bc.value
        return [geo.answer(tr, rec, q) for q in it]

    out = sc.parallelize(parts, len(parts)).mapPartitions(answer).collect()
    t2 = time.perf_counter()
    bc.destroy()
    return out, t1 - t0, t2 - t0


def dask_job(client, tree, records, parts):
    t0 = time.perf_counter()
    tf, rf = client.scatter([tree, records], broadcast=True)
    t1 = time.perf_counter()
    futs = [client.submit(geo.answer, tf, rf, q, pure=False) for q in parts]
    out = client.gather(futs)
    t2 = time.perf_counter()
    client.cancel(futs + [tf, rf])
    return out, t1 - t0, t2 - t0


def ray_job(ray, tree, records, parts):
    def answer(data, q):
        return geo.answer(data[0], data[1], q)

    task = ray.remote(answer)
    t0 = time.perf_counter()
    ref = ray.put((tree, records))
    t1 = time.perf_counter()
    out = ray.get([task.remote(ref, q) for q in parts])
    t2 = time.perf_counter()
    del ref
    return out, t1 - t0, t2 - t0


JOBS = {"spark": spark_job, "dask": dask_job, "ray": ray_job}


def describe(system, h, ray_pids):
    """What the peer runs on, after the warm-up: (one line, figures)."""
    if system == "spark":
        n = len(_peers.executor_pids(h))
        return f"Spark {h.version}, {h.master}, {n} executor JVMs", {"version": h.version, "processes": n}
    if system == "dask":
        import distributed

        n = len(h.scheduler_info()["workers"])
        return f"Dask {distributed.__version__}, {n} workers", {"version": distributed.__version__, "processes": n}
    n = len(ray_pids)
    return f"Ray {h.__version__}, {n} worker processes", {"version": h.__version__, "processes": n}


def run_peer(system, h, cfg, tree, records, queries, hosts=None):
    """Warm-up, then the timed job: (answers, figures)."""
    parts = split(queries, cfg["partitions"])
    # Ray starts its workers lazily: have W of them before the warm-up
    pids = _peers.ray_wait_workers(h, cfg["workers"]) if system == "ray" else None
    small = np.ascontiguousarray(records[:WARM_RECORDS])
    t0 = time.perf_counter()
    JOBS[system](h, geo.build_tree(small), small, [q[:WARM_QUERIES] for q in parts])
    warm_s = time.perf_counter() - t0
    line, figures = describe(system, h, pids)
    print(f"  {system}: {line}; warm-up {warm_s:.2f} s", flush=True)
    links = _peerhosts.LinkWindow(hosts)
    out, bcast_s, total_s = JOBS[system](h, tree, records, parts)
    figures.update(s=total_s, broadcast_s=bcast_s, warm_s=warm_s, link_bytes=links.bytes())
    return geo.concat(out), figures


# ---- one system per subprocess -----------------------------------------------------------------

def write_data(d, blob, queries, cfg):
    """The subprocesses' inputs in directory ``d``."""
    with open(os.path.join(d, "data.pkl"), "wb") as f:
        f.write(blob)
    np.save(os.path.join(d, "queries.npy"), queries)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg, f)


def child(system, d, out):
    """``geo.py --run SYSTEM``: run one peer over the data in ``d``; write
    its figures (or why it could not run) to ``out``, its answers beside."""
    die_with_parent()

    def run():
        with open(os.path.join(d, "config.json")) as f:
            cfg = json.load(f)
        with hosts_of(cfg) as hosts, start(system, cfg, hosts) as h:   # workers before the data, as in geo.py
            with open(os.path.join(d, "data.pkl"), "rb") as f:
                tree, records = pickle.load(f)
            queries = np.load(os.path.join(d, "queries.npy"))
            (ranked, top_km), figures = run_peer(system, h, cfg, tree, records, queries, hosts)
        np.savez(os.path.join(d, f"answers-{system}.npz"), ranked=ranked, top_km=top_km)
        return figures

    return _peers.child_result(system, out, run)


def run_system(system, d, script, timeout):
    """Runs ``script --run system`` in a subprocess and returns its result
    dict (``answers`` set when it ran; ``error`` when it failed without
    saying why).  Processes it leaves behind are killed and named in
    ``left_behind``; those below this process before it started are not
    touched.  This process is a clamor driver: no Python runs between fork
    and exec (the child sets its own death signal)."""
    out = os.path.join(d, f"result-{system}.json")
    before = {p.pid for p in _peers.descendants()}
    res = _peers.run_child(system, [sys.executable, script, "--run", system, "--data", d, "--out", out], out,
                           timeout, preexec=False, exclude=before)
    npz = os.path.join(d, f"answers-{system}.npz")
    if "s" in res and os.path.exists(npz):
        with np.load(npz) as z:
            res["answers"] = (z["ranked"], z["top_km"])
    return res


@contextlib.contextmanager
def reaping():
    """This process as the children's subreaper for the block; on leaving,
    anything below it that was not there on entering is killed and named."""
    _peers.subreaper()
    before = {p.pid for p in _peers.descendants()}
    try:
        yield
    finally:
        left = _peers.reap_descendants(exclude=before)
        if left:
            print(f"killed processes left behind: {left}", flush=True)
