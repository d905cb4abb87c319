"""Instances whose dicts were made outside the region read the same
through their attributes and through their dicts, in the driver and in
every worker, after the check gives them region dicts and after the
driver changes them: differential against a model kept in plain Python.

A dict made outside the region (a pickle, ``vars()``, ``copy``) over an
instance's values is replaced by a region copy before a stage.  On CPython
3.13 the values lie inline after the instance's body; replaced through
``PyObject_GenericSetDict`` they stayed in use, and the old dict over
them: the driver's later ``p.x = ...`` went to the inline values, its new
dict (what workers read) kept the old value, and a worker not forked found
no attribute at all (and crashed in ``dir()``)."""
import json

import pytest

from helpers import PRELUDE, run_driver

SCENARIO = PRELUDE + """
import copy, pickle
sys.path.insert(0, "tests")
from keyed_records import Point
starts = sys.argv[1]
n = 300
with clamor.heap():
    pts = [Point(i, i * 0.5, "p" + str(i)) for i in range(n)]
model = [{"x": i, "y": i * 0.5, "label": "p" + str(i)} for i in range(n)]
pickle.dumps(pts[:80])                      # dicts made outside the region
for k in range(100, 120):
    vars(pts[k])
copy.copy(pts[150])

def read():
    out = []
    for p in pts:
        d = vars(p)
        out.append([[p.x, p.y, p.label], [d.get("x"), d.get("y"), d.get("label")], sorted(d)])
    return out

def want():
    return [[[m["x"], m["y"], m["label"]]] * 2 + [sorted(m)] for m in model]

res = {"stages": []}
rnd = 0
for start in starts:
    with clamor.Cluster(workers=2, start_method=start, progress=None) as cl:
        for _ in range(3):
            if rnd:                             # the driver's changes, both ways
                for k in range(rnd, n, 7):
                    pts[k].x = -k * rnd
                    model[k]["x"] = -k * rnd
                for k in range(rnd + 3, n, 11):
                    vars(pts[k])["y"] = k * 1.5 + rnd
                    model[k]["y"] = k * 1.5 + rnd
                for k in range(rnd, n, 37):
                    pts[k].extra = rnd
                    model[k]["extra"] = rnd
            rnd += 1
            w = want()
            got = cl.parallelize(range(2), 2).map(lambda _: read()).collect()
            res["stages"].append({"start": start, "driver": read() == w, "workers": [g == w for g in got],
                                  "first_bad": next(([i, g[i], w[i]] for g in got for i in range(n) if g[i] != w[i]),
                                                    None)})
print(json.dumps(res))
"""


@pytest.mark.parametrize("starts", [["fork"], ["spawn"], ["fork", "spawn"]])
def test_instances_with_dicts_made_outside_read_alike_both_ways_everywhere(starts):
    # (after a fork's check, a spawned worker's check: the 3.13 crash)
    out = run_driver(SCENARIO.replace("sys.argv[1]", repr(starts)), timeout=240, env={"PYTHONHASHSEED": "0"})
    assert out["exit"] == 0 and not out["fatal"], out
    assert len(out["stages"]) == 3 * len(starts), out
    for s in out["stages"]:
        assert s["driver"] and s["workers"] == [True, True], out
