"""The portable walk (workers not forked from the driver) in C
(csrc/pywalk.c, clamor_py_walk_portable; portable._Mode.c_walk) against the
walk in Python, its reference (clamor/memory/walk.py with portable._Mode).

Where the C walk decides, it must decide as the Python walk does: the same
relocation entries on every page (each word, the target it names, the word
as it is), the same words read as null, the same bytes read (the read table
that says when to walk again), the same seed verdict and the same object
count.  Where it cannot tell (an object it does not take, one outside the
region that is no target, a pointer into private memory) it defers, and the
Python walk decides.  Random graphs of dicts, lists, tuples, sets, strs,
bytes, ints, floats and complexes, with atoms made outside any block (ints,
strs, constant tuples: targets the worker makes), singletons, the static
empty tuple and dict keys, instances of importable plain classes and
dataclasses, and parts the Python walk must judge: a class defined in the
script (not importable), a mutable list outside the region, a set with a
weak reference, a split dict, a table grown outside a block, an array, a
limit too small.
"""
import textwrap

from helpers import UNION, run_driver

MODULE = textwrap.dedent("""
    import dataclasses

    class Inst:
        pass

    @dataclasses.dataclass
    class Rec:
        a: object
        b: object = None
""")

DIFFERENTIAL = UNION + """
import json, random, sys, weakref
import numpy as np
sys.path.insert(0, {moddir!r})
import clamor
import pwclasses
from clamor.memory import portable, walk
from clamor.memory.walk import _walk

class Local:
    pass

t = portable.driver().targets
t.refresh_images()

def c_side(g, limit):
    mode = portable._Mode(t)
    if not mode.c_walk(g, limit):
        return None
    return mode

def python_side(g, limit):
    mode = portable._Mode(t)
    walk.plain_in_c[0] = False
    try:
        _walk(g, limit, mode, bring_in=False)
        portable._entries(mode, t)
        return mode
    except clamor.NotShareable as e:
        return str(e)
    finally:
        walk.plain_in_c[0] = True

def leaf(r, outside):
    if outside:
        return r.choice(OUTSIDE)
    k = r.randrange(9)
    if k == 0:
        return r.choice([None, True, False, Ellipsis, 0, 7, -3, 256, "", "a", "\\xe9", (), b""])
    return [lambda: r.randrange(10**3, 10**12), lambda: r.random() * 1e6, lambda: "s" + str(r.random()),
            lambda: ("é" + str(r.randrange(10**6))), lambda: str(r.randrange(10**6)).encode() * 3,
            lambda: complex(r.random(), 1.5), lambda: r.randrange(300, 10**6), lambda: "k" * r.randrange(2, 40)][k - 1]()

def build(r, depth, odd):
    k = r.randrange(7) if depth < 3 else 7
    if k == 7:
        return leaf(r, odd and r.random() < 0.15)
    n = r.randrange(0, 7)
    items = [build(r, depth + 1, odd) for _ in range(n)]
    if k == 0:
        return items
    if k == 1:
        return tuple(items)
    if k in (2, 3):
        return {{(i if r.random() < 0.5 else ("key" + str(i) if r.random() < 0.7 else (i, "t"))): x
                for i, x in enumerate(items)}}
    if k == 4:
        o = (pwclasses.Inst() if r.random() < 0.5 else pwclasses.Rec(None))
        o.a, o.b = (items + [None, None])[:2]
        return o
    def hashable(x):
        try:
            hash(x)
            return True
        except TypeError:
            return False
    hashable = [x for x in items if hashable(x)]
    return set(hashable) if k == 5 else frozenset(hashable)

def perturb(r, g, keep):
    k = r.randrange(12)
    if k == 0:
        with clamor.heap.suspended():
            g.append([1.5, 2.5])                                 # a mutable list outside the region
        return "outside list"
    if k == 1:
        with clamor.heap():
            o = Local()
            o.a = 1.5
        g.append(o)                                             # its class is not importable
        return "local class"
    if k == 2:
        with clamor.heap():
            s = {{1.5, 2.5}}
        keep.append(weakref.ref(s))
        g.append(s)
        return "weakly referenced set"
    if k == 3:
        with clamor.heap():
            g.append(np.arange(3.0))
        return "array"
    if k == 4:
        with clamor.heap():
            d = {{"k" + str(j): j * 0.5 for j in range(3)}}
        with clamor.heap.suspended():
            for j in range(30):
                d["g" + str(j)] = None                           # the keys table grows outside the block
        g.append(d)
        return "dict grown outside"
    if k == 5:
        with clamor.heap():
            g.append({{}})                                        # the static empty keys
            g.append(())
            g.append(frozenset())
        return "empty containers"
    if k == 6:
        g.append(r.choice(CONSTS))                              # constant tuples made outside
        return "outside constants"
    if k == 7:
        g.append(g[0] if g else None)
        g.append(g)                                             # shared, and a cycle
        return "shared and cycle"
    return "none"

r = random.Random(int(sys.argv[1]) if len(sys.argv) > 1 else 11)
OUTSIDE = [r.randrange(10**3, 10**12) for _ in range(40)] + [sys.intern("o" + str(r.random())) for _ in range(40)] + \\
          [r.random() * 1e6 for _ in range(40)] + ["p" + str(r.random()) for _ in range(20)]
CONSTS = [(OUTSIDE[i], OUTSIDE[i + 40]) for i in range(10)]
keep = []
counts = {{"c_yes": 0, "c_no": 0, "bad": [], "kinds_yes": {{}}, "kinds_no": {{}}, "entries": 0, "nulls": 0,
          "seeded": 0, "small_limit": 0, "refused": 0}}
for case in range(int({cases!r})):
    with clamor.heap():
        g = [build(r, 0, odd=case % 3 == 0) for _ in range(r.randrange(1, 5))]
    kind = perturb(r, g, keep)
    limit = 10**6 if case % 13 else r.randrange(1, 30)
    counts["small_limit"] += limit < 10**6
    c = c_side(g, limit)
    p = python_side(g, limit)
    counts["refused"] += isinstance(p, str)
    if c is None:
        counts["c_no"] += 1
        counts["kinds_no"][kind] = counts["kinds_no"].get(kind, 0) + 1
        continue
    counts["c_yes"] += 1
    counts["kinds_yes"][kind] = counts["kinds_yes"].get(kind, 0) + 1
    if isinstance(p, str):
        counts["bad"].append([case, kind, "C approved what Python refused", p[:200]])
        continue
    ec, ep = portable._entries(c, t), portable._entries(p, t)
    if ec != ep:
        counts["bad"].append([case, kind, "entries differ", sorted(set(ec) ^ set(ep))[:5],
                              [pg for pg in ec if pg in ep and ec[pg] != ep[pg]][:5]])
    counts["entries"] += sum(len(v) for v in ec.values()) // 16
    counts["nulls"] += int((c.found[1] == 0).sum())
    rc, rp = c.read_table(), p.read_table()
    if union(rc.ranges.tolist()) != union(rp.ranges.tolist()):
        counts["bad"].append([case, kind, "reads differ"])
    if bool(c.seeded) != bool(p.seeded):
        counts["bad"].append([case, kind, "seed verdict differs", c.seeded, p.seeded])
    counts["seeded"] += bool(c.seeded)
    if c.objects != p.objects:
        counts["bad"].append([case, kind, "objects differ", c.objects, p.objects])
print(json.dumps(counts))
"""


def test_the_c_portable_walk_lists_the_relocations_the_python_walk_lists(tmp_path):
    (tmp_path / "pwclasses.py").write_text(MODULE)
    out = run_driver(DIFFERENTIAL.format(moddir=str(tmp_path), cases=300), timeout=300)
    assert out["exit"] == 0, out
    assert not out["bad"], out["bad"][:5]
    assert out["c_yes"] >= 80 and out["c_no"] >= 40, out     # both answers are exercised
    assert out["entries"] > 1000 and out["nulls"] > 300 and out["seeded"] > 20, out
    # what the Python walk must judge made the C walk defer; what it takes, it took
    for kind in ("outside list", "local class", "weakly referenced set", "array", "dict grown outside"):
        assert out["kinds_no"].get(kind, 0) >= 3 and not out["kinds_yes"].get(kind), (kind, out)
    for kind in ("empty containers", "outside constants", "shared and cycle", "none"):
        assert out["kinds_yes"].get(kind, 0) >= 3, (kind, out)
    assert out["small_limit"] >= 10 and out["refused"] >= 40, out
