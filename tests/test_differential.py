"""Differential test of clamor.share(): what it approves, a forked worker
reads exactly as the driver does.

A driver (tests/objgen.py, run as the script of a fresh interpreter) builds
many kinds of objects under ``clamor.heap()``, each round right after
allocating and dropping, outside the block, what fills numpy's caches and
CPython's free lists.  It calls ``clamor.share`` on each; a refusal must name
a path from ``obj`` and a reason.  For every approved object the driver
computes a fingerprint (one line per path and field: type, length, shape,
strides, dtype, flags, bytes, hash lookups, attributes, a KD-tree's answers)
and the workers compute the same, reading the object in place through a
region list and (every array, and one object of each kind) as captured by
the task.  Every line must agree.  The driver empties no free list itself:
region objects it dropped must not become the runtime's.

Two variants: objects built after the workers were forked (the harder case:
nothing outside the region reaches them), and before the Cluster starts.
"""
import os
import textwrap

import pytest

from helpers import run_driver

# Every test with workers that map the driver's pages and with workers that
# fetch them (conftest.same_host).
pytestmark = pytest.mark.usefixtures("same_host")

HERE = os.path.dirname(os.path.abspath(__file__))


def differential(variant, seeds):
    with open(os.path.join(HERE, "objgen.py")) as f:
        return run_driver(f.read() + f"\nmain({variant!r}, {seeds!r})\n")


def summary(out):
    """The counts, the failures by kind and field, and the first cases."""
    lines = [f"{out['variant']}: {len(out['kinds'])} kinds, {out['cases']} cases, {out['approved']} approved, "
             f"{out['refused']} refused, {len(out['mismatches'])} mismatches, {len(out['failed_stages'])} failed "
             f"stages, {len(out['errors'])} errors, {out['seconds']} s, driver exit status {out['exit']}"]
    by = {}
    for m in out["mismatches"]:
        key = (m["kind"], m["via"], ",".join(m["fields"]))
        by[key] = by.get(key, 0) + 1
    lines += [f"  mismatch x{n}: {kind} ({via}): {fields}" for (kind, via, fields), n in sorted(by.items())]
    for m in out["mismatches"][:12]:
        lines.append(f"  {m['id']} ({m['via']}, worker {m['pid']}):")
        lines += [f"      driver: {a!r}\n      worker: {b!r}" for a, b in m["first"]]
    lines += [f"  the stage of {kind} {ids} failed: {err}: {msg.splitlines()[0]}"
              for kind, ids, err, msg in out["failed_stages"][:12]]
    if len(out["failed_stages"]) > 12:
        lines.append(f"  ... and {len(out['failed_stages']) - 12} more failed stages")
    lines += [f"  worker: {ln}" for ln in out["fatal"]]
    lines += [f"  error {cid}: {what}: {msg}" for cid, what, msg in out["errors"][:12]]
    for kind, reasons in sorted(out["refusals"].items()):
        lines += [f"  refused x{n} {kind}: {msg}" for n, _, msg in reasons.values()]
    return "\n".join(lines)


# Four seeds per variant, two in each mode (each mode ran all four before:
# two minutes of the suite): the objects differ by seed, the fault path by mode.
SEEDS = {"map": 0, "fetch": 2}


def seeds(same_host, first):
    return [first + SEEDS[same_host], first + SEEDS[same_host] + 1]


def check(out, floor):
    """Every kind ran; no error, crash or mismatch; share() approved at
    least ``floor`` of each kind built entirely inside the block."""
    text = summary(out)
    print(text)
    kinds = out["kinds"]
    assert set(kinds) == set(out["defined"]) and len(kinds) >= 30, text
    assert out["cases"] >= 200, text    # (two seeds)
    short = {k: v for k, v in kinds.items() if v["inside"] and v["approved"] < floor * v["cases"]}
    assert not out["errors"], text
    assert out["approved"] + out["refused"] == out["cases"], text
    assert out["approved"] >= 0.8 * out["cases"], text
    assert not short, f"share() refused too many of {sorted(short)}\n{text}"
    assert not out["failed_stages"] and out["recovery"]["workers_lost"] == 0, text
    assert out["compared"] == 2 * out["approved"], text        # both workers' answers, every case
    assert not out["mismatches"], text
    assert out["exit"] == 0, text


def test_workers_read_objects_built_after_the_fork_as_the_driver_does(same_host):
    """Workers forked first; each round's objects are built after."""
    check(differential("after_fork", seeds(same_host, 101)), floor=0.8)


def test_spawned_workers_read_region_objects_in_place_as_the_driver_does(same_host):
    """Workers not forked from the driver use every kind of region object
    in place, their pages relocated as they arrive: every object that
    share(portable=True) approves reads the same on them as on the driver.
    (The driver imports objgen by name, so the workers import its classes.)"""
    code = f"import objgen\nobjgen.main('spawn', {seeds(same_host, 201)!r})\n"
    out = run_driver(code, timeout=300, env={"PYTHONPATH": HERE, "PYTHONHASHSEED": "0"})
    check(out, floor=0.8)


def test_workers_read_objects_built_before_the_cluster_as_the_driver_does(same_host):
    """Objects built before the Cluster forks its workers.  share() knows
    less then (no snapshot yet of what workers will inherit) and refuses
    more of the kinds that point outside the region (``inherited``,
    ``inst_init``), but not of the others."""
    check(differential("before_fork", seeds(same_host, 201)), floor=0.8)


def test_small_array_reusing_numpy_shape_cache_reads_right_on_a_worker():
    """numpy keeps freed shape-and-strides buffers for reuse; one freed
    before the block, outside the region, went to an array made inside it,
    and a worker read a stale shape ((2,) and a wrong sum).  The snippet of
    the bug report, as it was written."""
    out = run_driver(textwrap.dedent("""
        import json
        import numpy as np, clamor
        with clamor.Cluster(workers=1) as cl:
            with clamor.heap():
                d = {"a": np.array([10**12 + k for k in range(448)], dtype=np.int64)}
            try:
                clamor.share(d)
                refused = None
            except clamor.NotShareable as e:
                refused = str(e)
            got = None if refused else cl.parallelize(range(1), 1).map(
                lambda _: (d["a"].shape, int(d["a"].sum()))).collect()
            print(json.dumps({"refused": refused, "got": got, "driver": [d["a"].shape, int(d["a"].sum())]}))
        """))
    want = [[448], 448 * 10**12 + 447 * 448 // 2]
    assert out["driver"] == want and out["exit"] == 0, out
    if out["refused"] is not None:   # at the very least, share() names the shape buffer
        assert out["refused"].startswith("obj['a']"), out
        assert "shape" in out["refused"] or "dimensions" in out["refused"], out
    else:
        assert out["got"] == [want], out


def test_an_action_after_region_objects_were_dropped():
    """Region objects dropped after a block sit on CPython's free lists;
    the runtime's own objects (a stage's, a forked worker's) must not be
    taken from there, or they travel as region objects: the action was
    refused with NotShareable naming a dict of the runtime, and a worker
    forked next failed at start.  Region tuples of small ints free no
    region memory when dropped, and a closure's tuple of cells taken from
    there made every later action fail."""
    out = run_driver(textwrap.dedent("""
        import json
        import clamor

        def attempt(f):
            try:
                return f()
            except Exception as e:
                return [type(e).__name__, str(e)[:300]]

        def fresh_cluster():
            with clamor.Cluster(workers=1, progress=False) as cl:
                return cl.range(2).map(lambda i: i + 1).collect()

        def closure_action(cl, a, b):
            return cl.range(2).map(lambda i: i + a + b).collect()   # a closure of two cells

        res = {}
        with clamor.Cluster(workers=1, progress=False) as cl:
            cl.range(1).collect()
            with clamor.heap():
                tmp = [{"x" + str(i): [i, i]} for i in range(100)]
            del tmp
            res["action"] = attempt(lambda: cl.range(2).map(lambda i: i + 1).collect())
            pairs = [None] * 500                     # made outside the block
            with clamor.heap():
                for i in range(500):
                    pairs[i] = (i % 200, 7)
            del pairs
            res["closure"] = attempt(lambda: closure_action(cl, 10, 20))
        with clamor.heap():
            tmp = [[(i, str(i) * 2)] for i in range(300)]
        del tmp
        res["new cluster"] = attempt(fresh_cluster)
        print(json.dumps(res))
        """))
    assert out["action"] == [1, 2], out
    assert out["closure"] == [30, 31], out
    assert out["new cluster"] == [1, 2], out
    assert out["exit"] == 0, out
