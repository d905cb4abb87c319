"""Instances shipped to workers not forked, over their class's frozen keys
table (csrc/pyclasskeys.c, classkeys.adopt): the driver freezes the table
and leaves each instance's values as they lie (no table of its own), and
each worker lays its own class's table out as the driver's before a task
reads one.  A worker whose class already names its attributes another way
has its table laid out anew, its own instances still read as before.
Every stage reads what the driver reads."""
import sys

import pytest

from helpers import PRELUDE, run_driver

pytestmark = pytest.mark.skipif(sys.version_info >= (3, 13),
                                reason="3.13 lays values inline: instances get keys of their own (test_portable)")

DRIVER = PRELUDE + """
sys.path.insert(0, "tests")
from keyed_records import Point, Rec, Branchy, make_own, read_own, read
from clamor.memory import classkeys, walk
from clamor._native import lib
region.ensure()
res = {}
"""


def test_spawned_workers_read_instances_as_they_lie_over_the_frozen_table():
    out = run_driver(DRIVER + """
with clamor.heap():
    pts = [Point(i, -i, "p" + str(i)) for i in range(5_000)]
    recs = [Rec(i, "n" + str(i), i / 4) for i in range(5_000)]
with clamor.Cluster(workers=2, start_method="spawn", progress=None) as cl:
    c0 = walk.conversions[0]
    clamor.share(pts, portable=True)
    clamor.share(recs, portable=True)
    res["conversions"] = walk.conversions[0] - c0
    res["no_dicts"] = sum(lib.clamor_py_portable_keys(id(o)) for o in pts[::50] + recs[::50])
    keys = list(range(0, 5_000, 497))
    want = lambda: [read(pts, keys), read(recs, keys)]
    res["first"] = cl.parallelize(range(2), 2).map(lambda _: want()).collect() == [want()] * 2
    with clamor.heap():
        pts[3].y = "changed"
        pts[4].extra = ("a name", "the frozen table does not have")
        recs[5].score = -1.0
    keys += [3, 4, 5]
    got = cl.parallelize(range(2), 2).map(lambda _: want()).collect()
    res["changed"] = got == [want()] * 2
    res["extra"] = got[0][0][-2]
    outside = Point(1, 2, "outside")
    outside.z = 3                              # (a new name outside a block: a dict of its own)
    res["outside"] = [outside.x, outside.z]
    res["lost"] = cl.stats()["recovery"]["workers_lost"]
# a forked Cluster later: the table frozen for spawned workers was frozen before its fork
with clamor.Cluster(workers=2, progress=None) as cl:
    c0 = walk.conversions[0]
    clamor.share(pts)
    res["forked_conversions"] = walk.conversions[0] - c0
    res["forked"] = cl.parallelize(range(2), 2).map(lambda _: read(pts, keys)).collect() == [read(pts, keys)] * 2
print(json.dumps(res))
""", timeout=240, env={"PYTHONHASHSEED": "0"})    # (pts[4]'s dict, made by its new name, is keyed by str)
    assert out["exit"] == 0, out
    assert out["conversions"] == 0 and out["no_dicts"] == 200, out
    assert out["first"] and out["changed"], out
    assert out["extra"] == [["extra", ["a name", "the frozen table does not have"]], ["label", "p4"], ["x", 4],
                            ["y", -4]], out
    assert out["outside"] == [1, 3] and out["lost"] == 0, out
    assert out["forked_conversions"] == 0 and out["forked"], out


@pytest.mark.parametrize("how", ["reversed", "prefix", "leaf first"])
def test_a_worker_whose_class_names_attributes_otherwise_reads_both_its_own_and_the_drivers(how):
    out = run_driver(DRIVER + f"""
how = {how!r}
with clamor.heap():
    if how == "leaf first":
        objs = [Branchy(i % 3 != 0, i) for i in range(3_000)]     # (a node first: kind, left, right, value)
    else:
        objs = [Point(i, i * 2, "p" + str(i)) for i in range(3_000)]
with clamor.Cluster(workers=2, start_method="spawn", progress=None) as cl:
    res["made"] = cl.parallelize(range(2), 2).map(lambda _: make_own(how)).collect()
    own = cl.parallelize(range(2), 2).map(lambda _: read_own()).collect()
    c0 = walk.conversions[0]
    clamor.share(objs, portable=True)
    res["conversions"] = walk.conversions[0] - c0
    keys = list(range(0, 3_000, 211))
    got = cl.parallelize(range(2), 2).map(lambda _: [read(objs, keys), read_own()]).collect()
    res["same"] = got == [[read(objs, keys), own[0]]] * 2
    res["own_before"] = own[0]
    # a new instance on the worker, after its table was laid out anew
    res["new"] = cl.parallelize(range(2), 2).map(lambda _: read([Point(1, 2, "n")] if how != "leaf first"
                                                                 else [Branchy(False, 3)], [0])).collect()
    res["lost"] = cl.stats()["recovery"]["workers_lost"]
print(json.dumps(res))
""", timeout=240)
    assert out["exit"] == 0, out
    assert out["made"] == [1, 1] and out["conversions"] == 0, out
    assert out["same"], out
    assert out["own_before"] == [{"reversed": [["label", "own"], ["x", 2], ["y", 1]], "prefix": [["x", 7]],
                                  "leaf first": [["kind", "leaf"], ["value", 5]]}[how]], out
    assert out["new"] == [[[["label", "n"], ["x", 1], ["y", 2]]]] * 2 if how != "leaf first" else \
        out["new"] == [[[["kind", "node"], ["left", 3], ["right", -3]]]] * 2, out
    assert out["lost"] == 0, out


@pytest.mark.parametrize("root", ["instances", "floats"])
def test_a_str_keyed_dict_an_entry_gains_is_refused_to_workers_hashing_otherwise(root):
    # Instances over the frozen table hash nothing: spawned workers whose
    # seed differs read them.  A dict keyed by str that an entry gains later
    # (a new attribute name gives the instance one) is refused for them,
    # with the reason, and the data and the Cluster survive; before, the
    # recheck of share()'s check took it and the stage read it wrong.
    out = run_driver(DRIVER + f"""
with clamor.heap():
    objs = [Point(i, -i, "p" + str(i)) for i in range(2_000)] if {root!r} == "instances" else \\
        [i * 0.5 for i in range(2_000)]
with clamor.Cluster(workers=2, start_method="spawn", progress=None) as cl:
    keys = [0, 4, 1_999]
    rd = lambda: read(objs, keys) if {root!r} == "instances" else [objs[k] for k in keys]
    res["first"] = cl.parallelize(range(2), 2).map(lambda _: rd()).collect() == [rd()] * 2
    with clamor.heap():
        if {root!r} == "instances":
            objs[4].extra = 1
        else:
            objs[4] = {{"k" + str(i): i for i in range(5)}}
    try:
        cl.parallelize(range(2), 2).map(lambda _: rd()).collect()
        res["second"] = "ran"
    except clamor.NotShareable as err:
        res["second"] = "PYTHONHASHSEED" in str(err)
    with clamor.heap():
        objs[4] = 4 * 0.5 if {root!r} == "floats" else Point(4, -4, "p4")
    res["after"] = cl.parallelize(range(2), 2).map(lambda _: rd()).collect() == [rd()] * 2
    res["lost"] = cl.stats()["recovery"]["workers_lost"]
print(json.dumps(res))
""", timeout=240, env={"PYTHONHASHSEED": "random"})
    assert out["exit"] == 0, out
    assert out["first"] is True and out["second"] is True, out
    assert out["after"] is True and out["lost"] == 0, out
