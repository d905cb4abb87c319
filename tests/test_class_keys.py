"""Classes' shared keys tables frozen at the fork (csrc/pyclasskeys.c,
clamor/memory/classkeys.py): instances are used in place by forked workers
with a region dict over their class's table, not a table of their own;
names set after the fork, dicts made outside a block, classes made after
the fork and workers not forked still read as the driver reads."""
import json
import sys

from helpers import PRELUDE, run_driver

CLASSES = PRELUDE + """
import pickle
from clamor.memory import classkeys, walk
region.ensure()

class Rec:
    def __init__(self, i):
        self.i, self.name, self.score = i, "n" + str(i), i / 2

def read(objs, keys):
    return [(o.i, o.name, o.score, sorted(vars(o))) for o in (objs[k] for k in keys)]
"""


def test_instances_of_a_class_frozen_at_the_fork_are_used_as_they_lie_and_read_right():
    out = run_driver(CLASSES + """
with clamor.heap():
    objs = [Rec(i) for i in range(20_000)]
res = {}
with clamor.Cluster(workers=2, progress=None) as cl:
    c0 = walk.conversions[0]
    clamor.share(objs)
    res["conversions"] = walk.conversions[0] - c0
    res["kept"] = [classkeys.frozen(objs[k]) for k in (0, 19_999)]
    res["own_tables"] = sum(walk._owns_keys(vars(o)) for o in objs[:1000])
    keys = list(range(0, 20_000, 1999))
    res["first"] = cl.parallelize(range(2), 2).map(lambda _: read(objs, keys)).collect() == [read(objs, keys)] * 2
    with clamor.heap():
        objs[5].score = -1.0
        objs[7].extra = "a name first set after the fork"     # (not in the class's frozen table)
        objs[8].i = "str" + str(8)
    keys += [5, 7, 8]
    got = cl.parallelize(range(2), 2).map(lambda _: read(objs, keys)).collect()
    res["changed"] = got == [read(objs, keys)] * 2
    res["extra"] = got[0][-2]
    res["others_kept"] = classkeys.frozen(objs[9])
print(json.dumps(res))
""", timeout=240)
    assert out["exit"] == 0, out
    # taken as they lie (3.13, whose values lie inline: a dict made over them, one object each; a table of
    # their own is three)
    assert out["conversions"] == (0 if sys.version_info < (3, 13) else 20_000), out
    assert out["kept"] == [True, True] and out["own_tables"] == 0, out
    assert out["first"] and out["changed"], out
    assert out["extra"] == [7, "n7", 3.5, ["extra", "i", "name", "score"]], out
    assert out["others_kept"], out                # the new name did not touch the class's table


def test_dicts_made_outside_a_block_get_region_copies_over_the_frozen_table():
    # A pickle (or vars()) outside a block makes each instance's dict from
    # its values, outside the region: share() copies each into the region,
    # still over the class's table.
    out = run_driver(CLASSES + """
with clamor.heap():
    objs = [Rec(i) for i in range(5_000)]
pickle.dumps(objs)
res = {"outside_before": not region.contains(id(vars(objs[0])), 1)}
with clamor.Cluster(workers=2, progress=None) as cl:
    c0 = walk.conversions[0]
    clamor.share(objs)
    res["conversions"] = walk.conversions[0] - c0
    res["kept"] = classkeys.frozen(objs[0])
    res["inside_after"] = all(region.contains(id(vars(o)), 1) for o in objs)
    keys = list(range(0, 5_000, 499))
    res["same"] = cl.parallelize(range(2), 2).map(lambda _: read(objs, keys)).collect() == [read(objs, keys)] * 2
print(json.dumps(res))
""", timeout=240)
    assert out["exit"] == 0, out
    assert out["outside_before"], out                     # (the setup)
    assert out["conversions"] >= 5_000, out
    assert out["kept"] and out["inside_after"] and out["same"], out


def test_classes_made_after_the_fork_keep_their_keys_and_spawned_workers_take_the_frozen_table():
    out = run_driver(CLASSES + """
res = {}
with clamor.Cluster(workers=1, progress=None) as cl:
    class Late:                                   # made after the fork: its table is the driver's only
        def __init__(self, i):
            self.i, self.s = i, "s" + str(i)
    with clamor.heap():
        late = [Late(i) for i in range(2_000)]
    vars(late[0])                                 # (a dict over its class's table, outside)
    res["late_kept"] = classkeys.frozen(late[0]) or classkeys.frozen_split(late[0])
sys.path.insert(0, "tests")
from records import Record      # (a class spawned workers import by name)
with clamor.heap():
    recs = [Record("r" + str(i), [i], {"k": i}) for i in range(3_000)]
with clamor.Cluster(workers=2, start_method="spawn", progress=None) as cl:
    c0 = walk.conversions[0]
    clamor.share(recs, portable=True)
    res["spawned_conversions"] = walk.conversions[0] - c0
    keys = list(range(0, 3_000, 299))
    rd = lambda: [(o.name, o.values, o.index, sorted(vars(o))) for o in (recs[k] for k in keys)]
    res["spawned_same"] = cl.parallelize(range(2), 2).map(lambda _: rd()).collect() == [rd()] * 2
print(json.dumps(res))
""", timeout=300, env={"PYTHONHASHSEED": "0"})     # (the dataclass's dicts are keyed by str)
    assert out["exit"] == 0, out
    assert out["late_kept"] is False, out         # its table was never frozen: not taken as it lies
    if sys.version_info >= (3, 13):
        assert out["spawned_conversions"] >= 3_000, out     # (values inline: keys of their own)
    else:
        # workers not forked lay their class's table out as the driver's
        # frozen one (tests/test_portable_class_keys.py): taken as they lie
        assert out["spawned_conversions"] == 0, out
    assert out["spawned_same"], out


def test_the_freeze_stops_cpython_appending_to_a_classs_table():
    # A name first set after the fork, on an instance made outside a block
    # and on a region one in a block, is not appended to the class's table:
    # the table still reads as it did at the fork, and the workers find
    # every name.
    out = run_driver(CLASSES + """
with clamor.heap():
    objs = [Rec(i) for i in range(10)]
with clamor.Cluster(workers=1, progress=None) as cl:
    clamor.share(objs)
    a = Rec(1)
    a.late_name = 1
    with clamor.heap():
        objs[2].late_name = "set in a block"
    res = {"a": a.late_name, "still": classkeys.frozen(objs[0]),
           "same": cl.parallelize(range(1), 1).map(lambda _: read(objs, range(10))).collect() == [read(objs, range(10))],
           "late": cl.parallelize(range(1), 1).map(lambda _: objs[2].late_name).collect()}
print(json.dumps(res))
""")
    assert out["exit"] == 0, out
    assert out["a"] == 1 and out["late"] == ["set in a block"], out
    assert out["still"] and out["same"], out


def test_a_worker_that_sets_new_names_on_region_instances_keeps_its_class_working():
    # A forked worker's copy of a class's table counts only the dicts made
    # before the fork; one whose tasks gave region dicts over it tables of
    # their own (a library caching an attribute on a shared object: scipy's
    # sparse matrices do) let go of the class's table once for each, freed
    # it under every instance of the class, and died.
    out = run_driver(CLASSES + """
with clamor.heap():
    objs = [Rec(i) for i in range(300)]
with clamor.Cluster(workers=1, progress=None) as cl:
    clamor.share(objs)                  # region dicts over Rec's table, made after the fork

    def task(_):
        got = []
        for o in objs:
            o.cached = True             # a name not in the table: the region dict gets a table of its own
            junk = [bytes(range(i % 7, 90 + i % 7)) for i in range(200)]    # (what a freed table's memory goes to)
            fresh = [Rec(j) for j in range(50)]     # new instances over the table
            got.append(sum(r.i for r in fresh) + len(fresh[-1].name))
        return got

    res = {"got": cl.parallelize(range(1), 1).map(task).collect(), "lost": cl.stats()["recovery"]["workers_lost"]}
print(json.dumps(res))
""", timeout=240)
    assert out["exit"] == 0, out
    assert out["lost"] == 0, out
    assert out["got"] == [[1225 + 3] * 300], out


def test_an_attribute_set_after_a_stage_is_seen_by_the_next_check_and_read_right():
    # CPython 3.13 keeps an instance's values after its body and changes
    # no dict when one is set: the check must read those bytes too (an
    # attribute set to a float made after the fork was read by the workers
    # as whatever lay at that address in their memory).  The new object is
    # held by the instance alone, so it is brought into the region.
    out = run_driver(CLASSES + """
class C:
    pass
with clamor.heap():
    other = C(); other.a = 1; other.cache = None      # the class's table names a and cache at the fork
    objs = [C() for _ in range(50)]
    for i, o in enumerate(objs):
        o.a = i + 0.5
def rd(_):
    return [(o.a, repr(getattr(o, "cache", "missing"))) for o in objs[:5]]
with clamor.Cluster(workers=1, progress=None, max_attempts=1) as cl:
    clamor.share(objs)
    first = cl.parallelize(range(1), 1).map(rd).collect()
    made = [float(i) * 1.5 for i in range(500)]        # after the fork: not inherited
    objs[1].a = made[99] + 0.0                       # (held by the instance alone)
    objs[2].cache = {"k": [1, 2]}
    objs[3].cache = "s" + str(len(made))
    by_value = clamor.memory.byvalue.counts()["objects"]
    second = cl.parallelize(range(1), 1).map(rd).collect()
    res = {"first": first, "second": second, "driver": rd(0), "lost": cl.stats()["recovery"]["workers_lost"],
           "by_value": clamor.memory.byvalue.counts()["objects"] - by_value,
           "brought_in": [region.contains(id(x), 1) for x in (objs[1].a, objs[2].cache, objs[3].cache)]}
print(json.dumps(res))
""", timeout=240)
    assert out["exit"] == 0, out
    assert out["first"] == [[[i + 0.5, "'missing'"] for i in range(5)]], out
    assert out["driver"][1:4] == [[148.5, "'missing'"], [2.5, "{'k': [1, 2]}"], [3.5, "'s500'"]], out
    assert out["second"] == [out["driver"]] and out["lost"] == 0, out
    assert out["brought_in"] == [True, True, True] and out["by_value"] == 0, out


def test_an_instance_with_an_empty_dict_made_outside_a_block_is_shared():
    # A copy of an empty dict is a new empty one, never over the class's
    # table: such an instance gets a region dict with keys of its own (the
    # Python walk, which takes instances of classes with a C base, such as
    # pandas' blocks, refused a frame: "could not be placed in the region").
    out = run_driver(CLASSES + """
from clamor.memory import _bringin
with clamor.heap():
    objs = [Rec(1), Rec.__new__(Rec), Rec.__new__(Rec)]
vars(objs[1]); vars(objs[2])                    # empty dicts over Rec's table, made outside
with clamor.Cluster(workers=1, progress=None) as cl:
    direct = attempt(lambda: _bringin._own_keys(objs[1], "objs[1]", True))
    verdict = attempt(lambda: type(clamor.share(objs)).__name__)
    got = cl.parallelize(range(1), 1).map(lambda _: [sorted(vars(o)) for o in objs]).collect()
print(json.dumps({"direct": direct, "verdict": verdict, "got": got,
                  "inside": [region.contains(id(vars(o)), 1) and walk._owns_keys(vars(o)) for o in objs[1:]]}))
""", timeout=120)
    assert out["exit"] == 0, out
    assert out["direct"][0] == "ok" and out["verdict"][0] == "ok", out
    assert out["got"] == [[["i", "name", "score"], [], []]] and out["inside"] == [True, True], out


def test_instances_whose_attributes_lie_in_their_values_tables_are_shared_with_no_dict_made():
    # Instances never asked for their dict keep their attributes in a values
    # table, named by their class's frozen table: share() takes them as they
    # lie (no dict is made, nothing converted), and the Cluster's check
    # reads their values tables.  Each kind of change has a stage of its
    # own: a value set outside a block to an object made after the fork
    # (brought into the region, in its slot: the workers read whatever lay
    # at its address when the check missed it), values changed in a block,
    # a name first set after the fork (a dict made outside the region).
    out = run_driver(CLASSES + """
import ctypes
def dictless(o):        # (the managed dict's word: null, or in 3.12 a values table's, which is odd)
    w = ctypes.c_size_t.from_address(id(o) - 24).value
    return w == 0 or w & 1 == 1
def rd(keys):
    return [(o.i, o.name, o.score, getattr(o, "extra", None)) for o in (objs[k] for k in keys)]
with clamor.heap():
    objs = [Rec(i) for i in range(30_000)]
res = {}
with clamor.Cluster(workers=2, progress=None) as cl:
    c0 = walk.conversions[0]
    clamor.share(objs)
    res["conversions"] = walk.conversions[0] - c0
    res["dictless"] = sum(map(dictless, objs))
    res["frozen"] = sum(map(classkeys.frozen, objs))
    keys = list(range(0, 30_000, 997)) + [5, 6, 9, 10, 11, 29_999]
    stages = [cl.parallelize(range(2), 2).map(lambda _: rd(keys)).collect() == [rd(keys)] * 2]
    brought_in = []
    for step in range(3):
        late = [float(j) + step for j in range(100)]                # made after the fork, outside a block
        objs[9].score = late[42] * 2                                # held by the instance alone: brought in
        objs[29_999].name = "last" + str(len(late) + step)
        stages.append(cl.parallelize(range(2), 2).map(lambda _: rd(keys)).collect() == [rd(keys)] * 2)
        brought_in.append(region.contains(id(objs[9].score), 1) and region.contains(id(objs[29_999].name), 1)
                          and dictless(objs[9]) and dictless(objs[29_999]))     # (in its slot: no dict made)
        with clamor.heap():
            objs[5].score = -1.5 * (step + 1)                        # new values, in a block
            objs[6].name = "renamed" + str(step)
        stages.append(cl.parallelize(range(2), 2).map(lambda _: rd(keys)).collect() == [rd(keys)] * 2)
    objs[10].extra = "extra" + str(len(late))                       # a name not in the frozen table, outside
    with clamor.heap():
        objs[11].extra = "extra" + str(len(late) + 1)               # and in a block
    stages.append(cl.parallelize(range(2), 2).map(lambda _: rd(keys)).collect() == [rd(keys)] * 2)
    res["stages"], res["brought_in"] = stages, brought_in
    res["brought_in_anyhow"] = region.contains(id(objs[9].score), 1) and region.contains(id(objs[29_999].name), 1)
    res["driver"] = rd([5, 6, 9, 10, 11, 29_999])
    res["still_dictless"] = sum(map(dictless, objs[12:29_999]))
    res["lost"] = cl.stats()["recovery"]["workers_lost"]
print(json.dumps(res))
""", timeout=240)
    assert out["exit"] == 0, out
    if sys.version_info < (3, 13):
        assert out["conversions"] == 0, out
        assert out["dictless"] == 30_000 and out["frozen"] == 30_000, out
        assert out["brought_in"] == [True] * 3, out
    else:       # (3.13's inline values: each instance gets a region dict over them, as before)
        assert out["conversions"] == 30_000 and out["dictless"] == 0 and out["frozen"] == 30_000, out
    assert out["stages"] == [True] * 8 and out["brought_in_anyhow"], out
    assert out["driver"] == [[5, "n5", -4.5, None], [6, "renamed2", 3.0, None], [9, "n9", 88.0, None],
                             [10, "n10", 5.0, "extra100"], [11, "n11", 5.5, "extra101"],
                             [29_999, "last102", 14_999.5, None]], out
    assert out["lost"] == 0, out
    if sys.version_info < (3, 13):
        assert out["still_dictless"] == 29_999 - 12, out      # (the checks made no dict for what did not change)


def test_a_library_cache_on_an_instance_with_no_dict_made_is_known_by_its_name():
    # The walk names the attributes of an instance whose values lie in its
    # values table as its dict's would be, so a library's cache (an
    # attribute named _cache, as pandas keeps one) is known: an entry the
    # driver put there after the fork, held elsewhere too, is dropped (the
    # library makes it again), not shipped by value with the whole object
    # (pandas' RangeIndex went by value so).
    out = run_driver(CLASSES + """
import ctypes, warnings
class Idx:
    def __init__(self, i):
        self._cache, self.v = {}, i
with clamor.heap():
    objs = [Idx(i) for i in range(10)]
class Engine:
    pass
with clamor.Cluster(workers=1, progress=None) as cl:
    clamor.share(objs)
    engine = Engine()                   # made after the fork, and held here too
    objs[3]._cache["engine"] = engine
    bv = clamor.memory.byvalue.counts()["objects"]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = cl.parallelize(range(1), 1).map(lambda _: [(o.v, sorted(o._cache)) for o in objs]).collect()
    res = {"by_value": clamor.memory.byvalue.counts()["objects"] - bv, "got": got[0][3],
           "driver": sorted(objs[3]._cache), "warned": [str(w.message)[:200] for w in caught],
           "dictless": ctypes.c_size_t.from_address(id(objs[3]) - 24).value in (0,) or
                       ctypes.c_size_t.from_address(id(objs[3]) - 24).value & 1 == 1}
print(json.dumps(res))
""", timeout=120)
    assert out["exit"] == 0, out
    # (the setup: no dict made; 3.13 makes one over the inline values, which the collector visits still)
    assert out["dictless"] == (sys.version_info < (3, 13)), out
    assert out["by_value"] == 0 and not out["warned"], out
    assert out["got"] == [3, []] and out["driver"] == [], out     # the entry dropped, in the driver too


def test_a_stage_whose_check_gives_instances_keys_ships_them_in_place():
    # The check before a stage begins may give instances dicts of their own
    # (workers not forked, on 3.13; a dict made outside the region): the
    # version that begins after shows the rewrite, so the list still goes
    # by offset, checked as one object.  (The check before the stage sent
    # it by value, each instance then checked on its own: 24 s for 20,000
    # instances on 3.13.)
    out = run_driver(CLASSES + """
sys.path.insert(0, "tests")
from keyed_records import Point
res = {}
with clamor.heap():
    pts = [Point(i, i * 0.5, "p" + str(i)) for i in range(20_000)]
pickle.dumps(pts[:100])      # (their dicts made outside the region: a rewrite for every kind of worker)
keys = list(range(0, 20_000, 997))
rd = lambda: [(pts[k].x, pts[k].y, pts[k].label, sorted(vars(pts[k]))) for k in keys]
for start in ("fork", "spawn"):
    with clamor.Cluster(workers=1, start_method=start, progress=None) as cl:
        c0 = walk.conversions[0]
        res[start] = cl.run(rd) == [rd()]
        res[start + "_conversions"] = walk.conversions[0] - c0
        res[start + "_payload"] = cl.stats()["stages_detail"][-1]["payload_bytes"]
        res[start + "_verdicts"] = cl.stats()["checks"]["verdicts"]
print(json.dumps(res))
""", timeout=240, env={"PYTHONHASHSEED": "0"})
    assert out["exit"] == 0, out
    assert out["fork"] and out["spawn"], out
    assert out["fork_conversions"] > 0 and out["spawn_conversions"] > 0, out    # (the setup: rewrites)
    # in place: a payload of the task alone, not 20,000 pickled instances (about 1 MB)
    assert out["fork_payload"] < 50_000 and out["spawn_payload"] < 50_000, out
    # and checked as one object, not each instance on its own
    assert out["fork_verdicts"] <= 3 and out["spawn_verdicts"] <= 3, out
