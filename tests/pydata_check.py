"""Run each library object of ``pydata_objects`` through a Cluster and say
what happened, one JSON line per kind, then a summary line:

    python tests/pydata_check.py MODE [KIND ...]

MODE: ``fork`` (built before the workers are forked), ``fork-after``
(built inside the open Cluster), ``spawn`` (portable: workers not forked).
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


def _moved(st):
    return st["bytes_from_driver"] + st["bytes_from_peers"] + st["bytes_mapped"]


def run(mode, kinds, workers=2):
    pydata_objects.import_libraries()
    if os.environ.get("PYDATA_READAHEAD"):    # (bytes; forked workers inherit it)
        clamor.configure(readahead=int(os.environ["PYDATA_READAHEAD"]))
    objs = {}
    if mode == "fork":
        for k in kinds:
            with clamor.heap():
                objs[k] = pydata_objects.build(k)
    out = []
    with clamor.Cluster(workers=workers, start_method="spawn" if mode == "spawn" else "fork") as cl:
        if mode != "fork":
            for k in kinds:
                with clamor.heap():
                    objs[k] = pydata_objects.build(k)
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
