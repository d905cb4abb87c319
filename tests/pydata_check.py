"""Run each library object of ``pydata_objects`` through a Cluster and say
what happened, one JSON line per kind, then a summary line:

    python tests/pydata_check.py MODE [KIND ...]

MODE: ``fork`` (built before the workers are forked), ``fork-after``
(built inside the open Cluster), ``spawn`` (portable: workers not forked),
``dask`` (through ``clamor.dask.ref`` on a LocalCluster of Dask's spawned
workers, one cluster for each object; run with PYTHONHASHSEED=6640, the
seed Dask's nannies give their workers).
Each line: the verdict of ``share()`` (``portable=True`` for spawn), a
warning if it gave one, whether every worker's answer equals the
driver's, whether the object went by value, workers lost, the bytes the
stage moved to the workers and the object's pickled size.
"""
import json
import os
import pickle
import sys
import warnings

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import pydata_objects  # noqa: E402

import clamor  # noqa: E402


def _build(k):
    """Under heap(); with PYDATA_WARM=1 the lookup runs once in the block
    too, so that what a library makes lazily for it (a pandas index's hash
    table) is made in the region, not by each worker for itself."""
    with clamor.heap():
        obj, q = pydata_objects.build(k)
        if os.environ.get("PYDATA_WARM") == "1":
            pydata_objects.use(k, obj, q)
    return obj, q


def _moved(st):
    return st["bytes_from_driver"] + st["bytes_from_peers"] + st["bytes_mapped"]


def run_dask(kinds, workers=2):
    import dask
    from distributed import Client, LocalCluster

    import clamor.dask
    here = os.path.dirname(os.path.abspath(__file__))
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [here, os.environ.get("PYTHONPATH")]))  # (the workers')
    dask.config.set({"distributed.scheduler.allowed-failures": 0})   # a task that kills its worker fails at once
    pydata_objects.import_libraries()
    clamor.region.ensure()
    objs = {}
    for k in kinds:
        with clamor.heap():
            objs[k] = pydata_objects.build(k)
    out = []
    for k in kinds:
        obj, q = objs[k]
        rec = {"kind": k, "type": f"{type(obj).__module__}.{type(obj).__qualname__}", "by_value": False,
               "warning": None, "lost": 0, "moved": 0}
        # (a cluster of its own for each: the driver walks every object it
        # sent again as it sends the next, and a worker one object killed
        # must not fail the next)
        with LocalCluster(n_workers=workers, threads_per_worker=1, processes=True, dashboard_address=":0",
                          worker_dashboard_address=":0") as cluster, Client(cluster) as client:
            clamor.dask.attach(client)
            try:
                with warnings.catch_warnings(record=True) as caught:
                    warnings.simplefilter("always")
                    try:
                        r = clamor.dask.ref(obj)
                        rec["verdict"] = "ok"
                    except clamor.ClamorError as err:
                        rec["verdict"] = f"{type(err).__name__}: {err}"
                rec["warning"] = next((str(w.message) for w in caught
                                       if issubclass(w.category, clamor.ShareWarning)), None)
                want = pydata_objects.use(k, obj, q)
                if rec["verdict"] != "ok":
                    rec["same"] = False
                else:
                    try:
                        futs = [client.submit(lambda rr, i, k=k, q=q: pydata_objects.use(k, rr.get(), q), r, i,
                                              pure=False) for i in range(workers)]
                        got = client.gather(futs)
                        rec["same"] = all(g == want for g in got)
                        if not rec["same"]:
                            rec["got"], rec["want"] = repr(got)[:300], repr(want)[:300]
                    except Exception as err:  # the task's error, or its worker's death
                        rec["same"] = False
                        rec["error"] = f"{type(err).__name__}: {str(err)[:300]}"
            finally:
                clamor.dask.detach(client)
        rec["pickled"] = len(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL))
        out.append(rec)
        print(json.dumps(rec), flush=True)
    return out


def run(mode, kinds, workers=2):
    if mode == "dask":
        return run_dask(kinds, workers)
    pydata_objects.import_libraries()
    if os.environ.get("PYDATA_READAHEAD"):    # (bytes; forked workers inherit it)
        clamor.configure(readahead=int(os.environ["PYDATA_READAHEAD"]))
    objs = {}
    if mode == "fork":
        for k in kinds:
            objs[k] = _build(k)
    out = []
    with clamor.Cluster(workers=workers, start_method="spawn" if mode == "spawn" else "fork") as cl:
        if mode != "fork":
            for k in kinds:
                objs[k] = _build(k)
        for k in kinds:
            obj, q = objs[k]
            rec = {"kind": k, "type": f"{type(obj).__module__}.{type(obj).__qualname__}"}
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                try:
                    clamor.share(obj, portable=(mode == "spawn"))
                    rec["verdict"] = "ok"
                except clamor.NotShareable as err:
                    rec["verdict"] = f"NotShareable: {err}"
            rec["warning"] = next((str(w.message) for w in caught if issubclass(w.category, clamor.ShareWarning)),
                                  None)
            want = pydata_objects.use(k, obj, q)
            before, bv, lost = cl.stats(), clamor.memory.byvalue.counts()["objects"], \
                cl.stats()["recovery"]["workers_lost"]
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", clamor.ByValueWarning)
                try:
                    got = cl.parallelize(range(workers), workers).map(
                        lambda _, k=k, obj=obj, q=q: pydata_objects.use(k, obj, q)).collect()
                    rec["same"] = all(g == want for g in got)
                    if not rec["same"]:
                        rec["got"] = repr(got)[:300]
                        rec["want"] = repr(want)[:300]
                except clamor.ClamorError as err:
                    rec["same"] = False
                    rec["error"] = f"{type(err).__name__}: {str(err)[:300]}"
            after = cl.stats()
            rec["by_value"] = clamor.memory.byvalue.counts()["objects"] > bv
            rec["lost"] = after["recovery"]["workers_lost"] - lost
            rec["moved"] = _moved(after) - _moved(before)
            rec["pickled"] = len(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL))
            out.append(rec)
            print(json.dumps(rec), flush=True)
    return out


if __name__ == "__main__":
    mode = sys.argv[1]
    kinds = sys.argv[2:] or pydata_objects.KINDS
    recs = run(mode, kinds)
    print(json.dumps({"mode": mode, "kinds": len(recs), "approved": sum(r["verdict"] == "ok" for r in recs),
                      "same": sum(r["same"] for r in recs), "lost": sum(r["lost"] for r in recs)}))
