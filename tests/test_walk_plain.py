"""share()'s walk of plain data and of instances of plain classes in C
(csrc/pywalk.c) against the walk in Python, its reference
(clamor/memory/walk.py): the verdict, and for the Cluster's check the bytes
the verdict rests on.

The C walk may only say yes where the Python walk says yes with nothing to
add: approved, no object brought into the region, no dict given keys of its
own, no warning.  Where it cannot tell, it says no and the Python walk
decides.  Random graphs of dicts, lists, tuples, sets, strs, bytes, ints and
floats, each built in a block or with parts made outside it: ints and strs
made outside (before the snapshot of a fork: inherited; after: not),
tables grown outside a block, the static empty dict keys, singletons, a set
with a weak reference, an instance's split dict, instances of a plain class
and of a dataclass (with dicts of their own, given by the C conversion or
by walk._own_keys; without; nested), of a class with __slots__, of a class
made in a block, one with a weak reference, an array, shared and repeated
objects, and more objects than the limit.  Both walks run on each; the
Python walk runs second, since it may write (bringing objects in).

The conversion (clamor_py_own_keys) against walk._own_keys: twin graphs of
instances, one shared with the C walk on, one with the Python walk only:
the same verdict, every instance's dict its own afterwards, and neither
walk finds anything left to write in the other's graph.
"""
import sys

import pytest

from helpers import PRELUDE, UNION, run_driver

# the classes of both scripts' instances: a plain class and a dataclass
CLASSES = """
import dataclasses

class Inst:
    pass

@dataclasses.dataclass
class Rec:
    a: object
    b: object = None
"""

DIFFERENTIAL = PRELUDE + CLASSES + UNION + """
import random, warnings, weakref
sys.path.insert(0, "tests")
import graphgen
from clamor.memory import classkeys, hooks, walk, _pyshare
from clamor._native import ffi, lib

class Slotted:
    __slots__ = ("a", "b")

def c_walk(o, limit):
    # the C walk's verdict as share() takes it (the objects it met outside
    # the region judged by walk._ok_outside), converting nothing
    return walk._walk_plain(o, limit, convert=False)

def python_walk(o, limit):
    walk.plain_in_c[0] = False
    before = (walk.brought[0], walk.conversions[0])
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            clamor.share(o, limit=limit)
        verdict = "approved"
    except clamor.NotShareable as e:
        verdict = "refused"
    finally:
        walk.plain_in_c[0] = True
    return verdict, (walk.brought[0], walk.conversions[0]) != before, len(caught)

def same_reads(o, limit):
    # the bytes the Cluster's check rests on: the C walk's extents against
    # the Python walk's (walk.pointer_extents of every object)
    mine = walk.Reads()
    if not walk._walk_plain(o, limit, mine, convert=False):
        return "C deferred"
    walk.plain_in_c[0] = False
    try:
        theirs = walk.Reads()
        walk._walk(o, limit, None, theirs)
    finally:
        walk.plain_in_c[0] = True
    ours = [tuple(x) for x in mine.plain] + [(lo, n) for lo, n, *_ in mine.extents]
    return union(ours) == union((lo, n) for lo, n, *_ in theirs.extents) and \
        sorted(map(id, mine.inherited)) == sorted(map(id, theirs.inherited))

def made_in_block(r):
    # a perturbation drawn in the cases' block: its kind, and its objects made in the region
    k = r.randrange(20)
    made = []
    if k == 2:
        made = [{}, ()]                                         # the interpreter's static empty keys and tuple
    elif k == 3:
        made = [{1.5, 2.5}]
    elif k == 4:
        i = Inst()
        i.a, i.b = 1.25, "x" + str(r.random())
        made = [i.__dict__]                                     # a split dict
    elif k == 5:
        made = [Inst()]
    elif k == 6:
        made = [np.arange(3.0)]
    elif k == 8:
        made = [{"k" + str(j): j * 0.5 for j in range(3)}]
    elif k in (10, 11):
        made = [Inst() if r.random() < 0.5 else Rec(None) for _ in range(r.randrange(1, 5))]
        for o in made:
            o.a, o.b = graphs.build(r, 2, False), graphs.build(r, 2, False)
    elif k == 12:
        made = [Rec(graphs.build(r, 2, False), "x" + str(r.random()))]   # attributes in a values table
    elif k == 19:
        o = Rec(graphs.build(r, 2, False), "z" + str(r.random()))
        vars(o)                                                 # a region dict over the class's table
        made = [o]
    elif k == 13:
        o = Slotted()
        o.a, o.b = 1.5, "y" + str(r.random())
        made = [o]
    elif k == 14:
        class Made:
            pass
        o = Made()
        o.a = 2.5
        walk._own_keys(o, "obj")
        made = [o]
    elif k == 15:
        o = Inst()
        o.a = 3.5
        walk._own_keys(o, "obj")
        made = [o]
    elif k == 16:
        o = Inst()
        o.kids = [Rec(j, {"w": [j * 0.5]}) for j in range(r.randrange(1, 4))]
        o.kids.append(o)                                         # a cycle through an instance
        o.other = Rec(o.kids[0])
        made = [{"top": o}]
    return k, made

def perturb(r, g, k, made, shared):
    # after the block: what is made outside it, and a change of the kinds
    # that make the Python walk refuse, bring in or warn
    box = g if isinstance(g, list) else None
    if box is None:
        return g, "none"
    if k == 0:
        box.extend([str(r.random()) for _ in range(40)])       # the item array grows outside the block
        return g, "list grown outside"
    if k == 1:
        box.append(10**9 + r.randrange(1000))                   # an int made outside the block
        return g, "int outside"
    if k == 2:
        box.extend(made)
        return g, "empty dict"
    if k == 3:
        shared.append(weakref.ref(made[0]))                      # a weak reference made outside the block
        box.extend(made)
        return g, "weakly referenced set"
    if k == 4:
        box.extend(made)
        return g, "split dict"
    if k == 5:
        box.extend(made)
        return g, "instance"
    if k == 6:
        box.extend(made)
        return g, "array"
    if k == 7 and box:
        box.append(box[0])                                      # the same object twice
        box.append(box)                                         # and a cycle
        return g, "shared and cycle"
    if k == 8:
        d = made[0]
        for j in range(30):
            d["g" + str(j)] = None                               # the keys table grows outside the block
        box.append(d)
        return g, "dict grown outside"
    if k in (10, 11):
        if k == 10:
            lib.clamor_py_own_keys(id(made), 10**6, 0)           # the conversion in C
        else:
            for o in made:
                walk._own_keys(o, "obj")                         # the Python reference
        box.extend(made)
        return g, "instances converted in C" if k == 10 else "instances converted in Python"
    if k == 12:
        box.extend(made)
        return g, "unconverted instance"
    if k == 13:
        box.extend(made)
        return g, "slotted instance"
    if k == 14:
        box.extend(made)
        return g, "class made in a block"
    if k == 15:
        shared.append(weakref.ref(made[0]))                      # a weak reference made outside the block
        box.extend(made)
        return g, "instance with a weak reference"
    if k == 16:
        lib.clamor_py_own_keys(id(made[0]), 10**6, 0)
        box.extend(made)
        return g, "nested instances"
    if k == 19:
        box.extend(made)
        return g, "instance over its class's table"
    if k == 17:
        box.append(r.choice(INHERITED))                         # containers made before the fork
        box.append(r.choice(INHERITED))
        return g, "inherited containers"
    if k == 18:
        box.append((r.randrange(10**3, 10**12), "late" + str(r.random())))   # made after it, outside
        return g, "late tuple"
    return g, "none"

r = random.Random(int(sys.argv[1]) if len(sys.argv) > 1 else 5)
OUTSIDE = [r.randrange(10**3, 10**12) for _ in range(50)] + ["o" + str(r.random()) for _ in range(50)] + \
          [r.random() * 1e6 for _ in range(50)]      # made outside any block
INHERITED = [tuple(OUTSIDE[i:i + 3]) for i in range(0, 30, 3)] + [frozenset(OUTSIDE[i:i + 2]) for i in range(60, 70, 2)] + \
            [[OUTSIDE[i], (OUTSIDE[i + 1],)] for i in range(100, 110, 2)] + [{"i" + str(i): OUTSIDE[i]} for i in range(5)]
graphs = graphgen.Graphs(OUTSIDE)
walk.note_fork()     # as a Cluster's fork would: OUTSIDE, INHERITED, the classes and their attribute names are inherited
if {freeze!r}:
    # and the classes' keys tables frozen, as before a fork: dicts made from
    # instances' values over their class's table, and instances with one,
    # are then taken as they lie (classkeys)
    _warm = (Inst(), Rec(None))          # (instances before the freeze: the tables name something)
    _warm[0].a = _warm[0].b = _warm[0].kids = _warm[0].other = None
    classkeys.freeze(hooks.all_classes())
    classkeys.accept()
shared = []
counts = {"c_yes": 0, "c_no": 0, "bad": [], "kinds_c_no": {}, "kinds_c_yes": {}, "limit_checked": 0, "reads_compared": 0}
# every case's graph and the region parts of its perturbation in one block
# (a block's edges cost two full collections and a pass over every object)
with clamor.heap():
    made = [([graphs.build(r, 0, odd=case % 3 == 0) for _ in range(r.randrange(1, 5))], made_in_block(r))
            for case in range(int({cases!r}))]
for case, (g, (k, parts)) in enumerate(made):
    g, kind = perturb(r, g, k, parts, shared)
    limit = 10**6 if case % 17 else max(1, r.randrange(1, 30))
    counts["limit_checked"] += limit < 10**6
    c = c_walk(g, limit)
    verdict, wrote, warned = python_walk(g, limit)
    if c:
        counts["c_yes"] += 1
        counts["kinds_c_yes"][kind] = counts["kinds_c_yes"].get(kind, 0) + 1
        if verdict != "approved" or wrote or warned:
            counts["bad"].append([case, kind, verdict, wrote, warned])
    else:
        counts["c_no"] += 1
        counts["kinds_c_no"][kind] = counts["kinds_c_no"].get(kind, 0) + 1
    if c:
        counts["reads_compared"] += 1
        same = same_reads(g, limit)
        if same is not True:
            counts["bad"].append([case, kind, "reads differ", same])
    if c and case % 11 == 0:       # and the C walk's answer stands once Python walked too
        if not c_walk(g, limit):
            counts["bad"].append([case, kind, "C changed its mind"])
print(json.dumps(counts))
"""


@pytest.mark.parametrize("freeze", [False, True], ids=["tables-live", "tables-frozen"])
def test_the_c_walk_approves_only_what_the_python_walk_approves_untouched(freeze):
    out = run_driver(DIFFERENTIAL.replace("{cases!r}", "400").replace("{freeze!r}", repr(freeze)), timeout=300)
    assert out["exit"] == 0, out
    assert not out["bad"], out
    assert out["c_yes"] >= 80 and out["c_no"] >= 80, out      # both answers are exercised
    assert out["reads_compared"] == out["c_yes"], out
    # a dict made from an instance's values, over its class's table, an
    # instance with one, and (before CPython 3.13, whose values lie inline)
    # one whose attributes lie in its values table, no dict made: given
    # keys of their own (the Python walk's work) unless the table was
    # frozen at the fork, when both walks take them as they lie
    as_they_lie = ("split dict", "instance over its class's table") + \
        (("unconverted instance",) if sys.version_info < (3, 13) else ())
    # each kind of change that needs the Python walk made the C walk defer
    for kind in ("list grown outside", "int outside", "weakly referenced set", "array",
                 "dict grown outside", "slotted instance", "class made in a block",
                 "instance with a weak reference", "late tuple") + (() if freeze else as_they_lie):
        assert out["kinds_c_no"].get(kind, 0) >= 3, (kind, out)
        assert out["kinds_c_yes"].get(kind, 0) == 0, (kind, out)
    assert out["limit_checked"] >= 10, out
    # accepted: the static empty keys and tuple; instances with dicts of their own
    for kind in ("empty dict", "instances converted in C", "instances converted in Python", "nested instances",
                 "inherited containers") + (as_they_lie if freeze else ()):
        assert out["kinds_c_yes"].get(kind, 0) >= 3, (kind, out)


def test_share_of_plain_data_goes_through_the_c_walk_and_is_read_right():
    """A big dict of plain data: share() takes the C walk (it approves
    without the Python walk's per-object cost), and forked workers read it
    as the driver does."""
    out = run_driver(PRELUDE + """
from clamor.memory import walk
n = 200_000
with clamor.heap():
    d = {i: (i, "s" + str(i)) for i in range(n)}
    s = {"k" + str(i): ["v" + str(i), i * 0.5] for i in range(n)}
calls = []
orig = walk._walk_once
walk._walk_once = lambda *a, **k: calls.append(1) or orig(*a, **k)
with clamor.Cluster(workers=2, progress=False) as cl:
    clamor.share(d)
    clamor.share(s)
    python_walks = len(calls)
    got = cl.parallelize(range(2), 2).map(lambda i: [d[7 + i], d[n - 1], s["k123"], len(s)]).collect()
print(json.dumps({"python_walks": python_walks, "got": got}))
""", timeout=180)
    assert out["exit"] == 0, out
    assert out["python_walks"] == 0, out
    assert out["got"] == [[[7, "s7"], [199_999, "s199999"], ["v123", 61.5], 200_000],
                          [[8, "s8"], [199_999, "s199999"], ["v123", 61.5], 200_000]], out


CONVERSION = PRELUDE + CLASSES + """
import random
from clamor.memory import walk

def graph(seed):
    # instances whose attributes lie in values tables (no dict of their
    # own yet), some nested, in lists, dicts and tuples; and the instances
    # (called in a block)
    r = random.Random(seed)
    made = []
    def instance(depth):
        o = Inst() if r.random() < 0.5 else Rec(None)
        made.append(o)
        o.a = r.random() if depth > 1 or r.random() < 0.5 else [instance(depth + 1) for _ in range(r.randrange(3))]
        o.b = "s" + str(r.randrange(10**6))
        if r.random() < 0.2:
            o.c = (instance(depth + 1), r.randrange(10**6))
        return o
    g = [instance(0) if r.random() < 0.7 else {"k" + str(i): instance(1) for i in range(3)}
         for _ in range(r.randrange(1, 20))]
    return g, made

def python_walks():
    calls = []
    orig = walk._walk_once
    walk._walk_once = lambda *a, **k: calls.append(1) or orig(*a, **k)
    return calls, orig

def verdict(g):
    try:
        clamor.share(g)
        return "approved"
    except clamor.NotShareable:
        return "refused"

walk.note_fork()     # as a Cluster's fork would: the classes and attribute names are inherited
out = {"cases": 0, "bad": [], "converted_c": 0, "converted_py": 0}
# the twins of every case in one block (a block's edges cost two full
# collections and a pass over every object)
with clamor.heap():
    twins = [(graph(case), graph(case)) for case in range(60)]     # twins: the same shapes and values
for case, ((ga, made_a), (gb, made_b)) in enumerate(twins):
    before = walk.conversions[0]
    calls, orig = python_walks()
    try:
        va = verdict(ga)             # the C walk, which converts first
    finally:
        walk._walk_once = orig
    out["converted_c"] += walk.conversions[0] - before
    walk.plain_in_c[0] = False
    before = walk.conversions[0]
    try:
        vb = verdict(gb)             # the Python walk alone: walk._own_keys
    finally:
        walk.plain_in_c[0] = True
    out["converted_py"] += walk.conversions[0] - before
    owned = [walk._owns_keys(o.__dict__) for o in made_a + made_b]
    walk.plain_in_c[0] = False
    before = walk.conversions[0]
    try:
        va2 = verdict(ga)            # the Python walk finds nothing left to write in the C walk's graph
    finally:
        walk.plain_in_c[0] = True
    left = walk.conversions[0] != before
    c_on_b = walk._walk_plain(gb, 10**6, convert=False)    # and C approves the Python walk's, untouched
    out["cases"] += 1
    if not (va == vb == va2 == "approved" and all(owned) and not left and c_on_b and not calls):
        out["bad"].append([case, va, vb, va2, owned.count(False), left, c_on_b, len(calls)])
print(json.dumps(out))
"""


def test_the_c_conversion_gives_instances_the_dicts_the_python_walk_gives():
    out = run_driver(CONVERSION, timeout=300)
    assert out["exit"] == 0, out
    assert out["cases"] == 60 and not out["bad"], out
    assert out["converted_c"] > 0 and out["converted_py"] > 0, out


def test_the_cluster_reports_what_its_checks_keep_per_object():
    """cl.stats()["checks"]: the verdicts remembered, the objects their
    walks visited and the bytes kept to know when to walk again; at most
    16 bytes an object for a big dict of records (issue's bound)."""
    out = run_driver(PRELUDE + """
n = 100_000
with clamor.heap():
    d = {i: (i, "s" + str(i)) for i in range(n)}
with clamor.Cluster(workers=1, progress=False) as cl:
    before = cl.stats()["checks"]
    got = cl.parallelize(range(1), 1).map(lambda i: d[n - 1]).collect()
    after = cl.stats()["checks"]
print(json.dumps({"before": before, "after": after, "got": got}))
""", timeout=180)
    assert out["exit"] == 0, out
    assert out["got"] == [[99_999, "s99999"]], out
    assert out["before"]["objects"] == 0, out
    after = out["after"]
    assert after["verdicts"] >= 1 and after["objects"] >= 3 * 100_000 - 300, out   # the dict, tuples, ints, strs
    assert 0 < after["bytes"] and after["bytes_per_object"] <= 16, out
