"""Keys copied into the region by the C walk (cwalk.rekey,
csrc/pyownkeys.c: clamor_py_rekey) against the Python walk's
``promote.Rekey``, its reference.

Before any Cluster nothing is inherited: a str outside the region that a
region dict holds as a key (an attribute name compiled into a class, a key
made outside a block) must be copied in.  The Python walk does it dict by
dict at tens of microseconds an object; the C walk now does it for exact
dicts and goes on in C.  Twin random graphs, built alike from one seed
before any fork, are shared one with the C walk on and one with the Python
walk only: the same verdict, the same items in the same order, every key of
an approved graph in the region (or a singleton, or the image's), nothing left to write for
either walk afterwards, and forked workers read what the driver reads.

Where a stray str is also a value (held by a dict that is not the sole
holder until its key occurrences are replaced), the Python walk's verdict
depends on whether it meets the str first as a key or as a value: the
verdicts are not compared there, but whatever either path approves must
hold every object it reaches in the region, or be a singleton or part of
a loaded image.
"""
from helpers import PRELUDE, run_driver

SCRIPT = PRELUDE + """
import collections, random
from clamor.memory import cwalk, walk

class Inst:
    def __init__(self, i):
        self.ident, self.label = i, "n" + str(i)

def names(seed):
    # made outside any block: strs that region dicts hold as keys (and,
    # now and then, as a value or in a defaultdict, which the C walk leaves
    # to the Python walk)
    r = random.Random(seed)
    return r, ["name" + str(seed) + "_" + str(i) for i in range(r.randrange(1, 6))]

def graph(r, names):
    # called in a block: the graph, in the region but for its names
    kinds = set()
    g = []
    for _ in range(r.randrange(1, 30)):
        k = r.randrange(6)
        if k == 0:
            o = Inst(r.randrange(10**6))
            for nm in r.sample(names, r.randrange(len(names) + 1)):
                setattr(o, nm, r.random())
            g.append(o)
            kinds.add("instance")
        elif k == 1:
            g.append({nm: [r.random(), "v" + str(r.randrange(99))] for nm in r.sample(names, len(names))})
            kinds.add("dict")
        elif k == 2:
            g.append({"in" + str(i): {names[0]: i} for i in range(r.randrange(1, 4))})
            kinds.add("nested")
        elif k == 3:
            g.append((r.random(), [Inst(i) for i in range(r.randrange(1, 4))]))
            kinds.add("tuple of instances")
        elif k == 4 and r.random() < 0.25:
            g.append({"as value": names[-1]})
            kinds.add("value")
        elif k == 5 and r.random() < 0.25:
            d = collections.defaultdict(list)
            d[names[0]].append(r.random())
            g.append(d)
            kinds.add("defaultdict")
    return g, kinds

def describe(o, depth=0):
    if type(o).__name__ == "Inst":     # (by name: the function ships by value, its class with it)
        return ["Inst", [[k, describe(v, depth + 1)] for k, v in vars(o).items()]]
    if isinstance(o, dict):
        return [type(o).__name__, [[k, describe(v, depth + 1)] for k, v in o.items()]]
    if isinstance(o, (list, tuple)):
        return [type(o).__name__, [describe(x, depth + 1) for x in o]]
    return o

def atoms(o, out):
    # the keys and the str and float values reachable from o
    if type(o).__name__ == "Inst":
        o = vars(o)
    if isinstance(o, dict):
        out.extend(o)
        for v in o.values():
            atoms(v, out)
    elif isinstance(o, (list, tuple)):
        for x in o:
            atoms(x, out)
    elif isinstance(o, (str, float)):
        out.append(o)
    return out

def share(g, in_c):
    walk.plain_in_c[0] = in_c
    calls = []
    orig = walk._walk_once
    walk._walk_once = lambda *a, **k: calls.append(1) or orig(*a, **k)
    moved = cwalk.brought[0]
    try:
        clamor.share(g)
        verdict = "approved"
    except clamor.NotShareable as e:
        verdict = "refused"
    finally:
        walk._walk_once = orig
        walk.plain_in_c[0] = True
    return verdict, len(calls), cwalk.brought[0] - moved

amap = walk._Walk().amap     # (a str of the interpreter's own image, as 3.12's identifiers, every process has)
out = {"bad": [], "c_rekeyed": 0, "python_decided": 0, "cases": 0, "kinds": {}}
keep = []
# the twins of every seed in one block (a block's edges cost two full
# collections and a pass over every object); their names made before it
named = [(names(seed), names(seed)) for seed in range(int({cases!r}))]
with clamor.heap():
    twins = [(graph(*na), graph(*nb)) for na, nb in named]
del named
for seed, ((a, kinds), (b, _)) in enumerate(twins):
    va, calls_a, moved_a = share(a, True)
    vb, _, moved_b = share(b, False)
    out["cases"] += 1
    for k in kinds:
        out["kinds"][k] = out["kinds"].get(k, 0) + 1
    if calls_a == 0 and moved_a:
        out["c_rekeyed"] += 1
    if calls_a:
        out["python_decided"] += 1
    if "value" not in kinds and (va != vb or (va == "approved" and moved_a != moved_b)):
        out["bad"].append([seed, "verdict", va, vb, moved_a, moved_b])
    if describe(a) != describe(b):
        out["bad"].append([seed, "items differ"])
    for g, v in ((a, va), (b, vb)):
        stray = [x for x in atoms(g, []) if not (region.contains(id(x), 1) or walk._ok_outside(x) or
                                                  amap.in_image(id(x)))]
        if v == "approved" and stray:
            out["bad"].append([seed, "approved with objects outside", stray[:3]])
    if va == "approved":
        again = share(a, True)
        if again[0] != "approved" or again[2]:
            out["bad"].append([seed, "the C path wrote again", again])
        if again[1] and not {"defaultdict", "value"} & kinds:
            out["bad"].append([seed, "the C walk deferred after its own rekey", again])
        if share(a, False)[2] or (vb == "approved" and share(b, True)[2]):
            out["bad"].append([seed, "one walk left the other something to write"])
        keep.append(a)
with clamor.Cluster(workers=2, progress=False) as cl:
    got = cl.parallelize(range(2), 2).map(lambda _: json.dumps(describe(keep), sort_keys=True)).collect()
out["workers_read"] = got == [json.dumps(describe(keep), sort_keys=True)] * 2
print(json.dumps(out, default=repr))
"""


def test_the_c_rekey_gives_the_dicts_the_keys_the_python_walk_gives():
    out = run_driver(SCRIPT.replace("{cases!r}", "100"), timeout=300)
    assert out["exit"] == 0, out
    assert not out["bad"], out
    assert out["workers_read"], out
    assert out["c_rekeyed"] >= 25 and out["python_decided"] >= 10, out     # both paths are exercised
    for kind in ("instance", "dict", "nested", "tuple of instances", "value", "defaultdict"):
        assert out["kinds"].get(kind, 0) >= 20, (kind, out)


def test_a_list_of_instances_built_before_any_cluster_is_shared_in_c():
    """The case that cost a Python walk: 20,000 instances of a class made
    before any Cluster, each dict holding the class's attribute names (strs
    outside the region) as keys.  share() approves it without the Python
    walk, one region copy of each name for all dicts."""
    out = run_driver(PRELUDE + """
from clamor.memory import cwalk, walk

class Rec:
    def __init__(self, i):
        self.ident, self.label, self.score = i, "n" + str(i), i / 2

with clamor.heap():
    recs = [Rec(i) for i in range(20_000)]
calls = []
orig = walk._walk_once
walk._walk_once = lambda *a, **k: calls.append(1) or orig(*a, **k)
moved = cwalk.brought[0]
clamor.share(recs)
amap = walk._Walk().amap
keys = {id(k) for r in recs for k in vars(r) if not amap.in_image(id(k))}    # (3.12: "ident" is the image's)
print(json.dumps({"python_walks": len(calls), "moved": cwalk.brought[0] - moved, "distinct_keys": len(keys),
                  "keys_in_region": all(region.contains(k, 1) for k in keys),
                  "scores": sum(r.score for r in recs)}))
""", timeout=180)
    assert out["exit"] == 0, out
    assert out["python_walks"] == 0, out
    assert out["keys_in_region"], out
    assert out["distinct_keys"] <= 3, out          # one copy of each name, not one per dict
    assert out["moved"] >= 20_000, out             # (each dict that held an outside name counts)
    assert out["scores"] == sum(i / 2 for i in range(20_000)), out
