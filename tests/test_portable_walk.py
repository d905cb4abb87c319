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
import sys
import textwrap

from helpers import PRELUDE, UNION, run_driver

MODULE = textwrap.dedent("""
    import dataclasses

    class Inst:
        pass

    @dataclasses.dataclass
    class Rec:
        a: object
        b: object = None
""")

DIFFERENTIAL = PRELUDE + UNION + """
import random, weakref
sys.path.insert(0, {moddir!r})
sys.path.insert(0, "tests")
import graphgen
import pwclasses
from clamor.memory import _relocentries, portable, walk
from clamor.memory.walk import _walk

class Local:
    pass

t = portable.driver().targets
t.refresh_images()

def stable(entries):
    # {{page: entries}} with the null entries' words zeroed: those are the
    # collector's links, which it rewrites whenever it runs
    out = {{}}
    for page, e in entries.items():
        a = np.frombuffer(e, _relocentries._ENTRY).copy()
        a["v"][a["t"] == 0] = 0
        out[page] = a.tobytes()
    return out

def listing_agrees(ext, strict, nulls, tags=None, null_tags=None):
    # the relocation words listed in one call of C (csrc/pyrelist.c) against
    # their numpy reference: the words, targets, tags, refusals and entries
    got, bad, words = _relocentries._match(ext, strict, nulls, t, None, tags, null_tags)
    pages = _relocentries._page_entries(words)
    ref, ref_bad = _relocentries._match_reference(ext, strict, nulls, t, None, tags, null_tags)
    counts["listed"] += 1
    counts["listed_bad"] += len(ref_bad) > 0
    return (all(np.array_equal(a, b) for a, b in zip(got[:2], ref[:2])) and np.array_equal(bad, ref_bad)
            and (tags is None or np.array_equal(got[2], ref[2])) and stable(pages) == stable(_relocentries._by_page(*ref[:2])))

def c_side(g, limit):
    mode = portable._Mode(t)
    if not mode.c_walk(g, limit):
        return None
    if not listing_agrees(mode.c_extents, mode.c_strict, mode.null_words, mode.tags, mode.null_tags):
        counts["bad"].append(["the C listing differs from its reference, on the C walk's extents"])
    return mode

def python_side(g, limit):
    mode = portable._Mode(t)
    walk.plain_in_c[0] = False
    try:
        _walk(g, limit, mode, bring_in=False)
        ext = np.array([(lo, n) for lo, n, *_ in mode.extents], dtype=np.uint64).reshape(-1, 2)
        strict = np.array([s for _, _, s, *_ in mode.extents], dtype=np.uint8)
        if not listing_agrees(ext, strict, mode.null_words):
            counts["bad"].append(["the C listing differs from its reference, on the Python walk's extents"])
        portable._entries(mode, t)
        return mode
    except clamor.NotShareable as e:
        return str(e)
    finally:
        walk.plain_in_c[0] = True

def made_in_block(r):
    # a perturbation drawn in the cases' block: its kind, and its objects made in the region
    k = r.randrange(12)
    if k == 1:
        o = Local()
        o.a = 1.5
        return k, [o]
    if k == 2:
        return k, [{{1.5, 2.5}}]
    if k == 3:
        return k, [np.arange(3.0)]
    if k == 4:
        return k, [{{"k" + str(j): j * 0.5 for j in range(3)}}]
    if k == 5:
        return k, [{{}}, (), frozenset()]                        # the static empty keys
    return k, []

def perturb(r, g, k, made, keep):
    # after the block: what is made outside it, and the graph changed
    if k == 0:
        g.append([1.5, 2.5])                                    # a mutable list outside the region
        return "outside list"
    if k == 1:
        g.extend(made)                                          # its class is not importable
        return "local class"
    if k == 2:
        keep.append(weakref.ref(made[0]))
        g.extend(made)
        return "weakly referenced set"
    if k == 3:
        g.extend(made)
        return "array"
    if k == 4:
        d = made[0]
        for j in range(30):
            d["g" + str(j)] = None                               # the keys table grows outside the block
        g.append(d)
        return "dict grown outside"
    if k == 5:
        g.extend(made)
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
graphs = graphgen.Graphs(OUTSIDE, singles=graphgen.SINGLES + ((), b""), outside=0.15, width=7, tuple_keys=True,
                         instance=lambda r: pwclasses.Inst() if r.random() < 0.5 else pwclasses.Rec(None))
keep = []
counts = {{"c_yes": 0, "c_no": 0, "bad": [], "kinds_yes": {{}}, "kinds_no": {{}}, "entries": 0, "nulls": 0,
          "seeded": 0, "small_limit": 0, "refused": 0, "listed": 0, "listed_bad": 0, "keyed": 0}}
# every case's graph and the region parts of its perturbation in one block
# (a block's edges cost two full collections and a pass over every object)
with clamor.heap():
    made = [([graphs.build(r, 0, odd=case % 3 == 0) for _ in range(r.randrange(1, 5))], made_in_block(r))
            for case in range(int({cases!r}))]
for case, (g, (k, parts)) in enumerate(made):
    kind = perturb(r, g, k, parts, keep)
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
    ec = stable(portable._page_entries(portable._entries(c, t)))
    ep = stable(portable._page_entries(portable._entries(p, t)))
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
    # the classes whose instances were taken over their frozen tables, and
    # the targets the workers bind (those classes' "classkeys" among them)
    if sorted(c.keyed) != sorted(p.keyed):
        counts["bad"].append([case, kind, "keyed classes differ", sorted(c.keyed), sorted(p.keyed)])
    if portable._entries(c, t).targets.tolist() != portable._entries(p, t).targets.tolist():
        counts["bad"].append([case, kind, "targets differ"])
    counts["keyed"] += bool(c.keyed)
print(json.dumps(counts))
"""


def test_the_c_portable_walk_lists_the_relocations_the_python_walk_lists(tmp_path):
    (tmp_path / "pwclasses.py").write_text(MODULE)
    out = run_driver(DIFFERENTIAL.format(moddir=str(tmp_path), cases=300), timeout=300)
    assert out["exit"] == 0, out
    assert not out["bad"], out["bad"][:5]
    assert out["c_yes"] >= 80 and out["c_no"] >= 40, out     # both answers are exercised
    if sys.version_info < (3, 13):      # (3.13: values inline, keys of their own)
        assert out["keyed"] >= 20, out                    # instances taken over their class's frozen table
    assert out["entries"] > 1000 and out["nulls"] > 300 and out["seeded"] > 20, out
    # what the Python walk must judge made the C walk defer; what it takes, it took
    for kind in ("outside list", "local class", "weakly referenced set", "array", "dict grown outside"):
        assert out["kinds_no"].get(kind, 0) >= 3 and not out["kinds_yes"].get(kind), (kind, out)
    for kind in ("empty containers", "outside constants", "shared and cycle", "none"):
        assert out["kinds_yes"].get(kind, 0) >= 3, (kind, out)
    assert out["small_limit"] >= 10 and out["refused"] >= 40, out
    assert out["listed"] >= 300, out        # the listing's differential ran on both walks' extents


RECHECK = PRELUDE + UNION + """
import random
sys.path.insert(0, {moddir!r})
sys.path.insert(0, "tests")
import graphgen
import pwclasses
from clamor.memory import _relocentries, portable, readtable

# (words and read tables of many chunks and blocks: a recheck remakes only some)
_relocentries.CHUNK_WORDS = readtable.BLOCK_RANGES = 8
rel = portable.Relocations()
t = rel.targets
t.refresh_images()

def whole(root):
    mode = portable._Mode(t)
    if not mode.c_walk(root, 10**6):
        return None
    return portable._entries(mode, t), mode.read_table(), portable._tag_state(mode, root)

def norm(words):
    # each page's entries, made of the words as clamor_reloc_set_words makes
    # them (a null word's recorded value is a collector link, which the
    # driver's collector rewrites at any time: workers write null there, and
    # the server's check of a list against the bytes it serves skips them)
    out = {{}}
    for page, e in portable._page_entries(words).items():
        a = np.frombuffer(e, portable._ENTRY).copy()
        a["v"][a["t"] == 0] = 0
        out[page] = a.tobytes()
    return out

r = random.Random(int(sys.argv[1]) if len(sys.argv) > 1 else 7)
counts = {{"stood": 0, "deferred": 0, "bad": [], "kinds": {{}}, "words": 0}}
# every trial's root in one block, and each step's changes of every root in
# one block (a block's edges cost two full collections and a pass over every
# object); each root is rechecked after its own changes
with clamor.heap():
    roots = [{{"k" + str(i): graphgen.record(r, pwclasses.Inst) for i in range(n)}} if trial % 2 else
             [graphgen.record(r, pwclasses.Inst) for _ in range(n)]
             for trial, n in ((trial, r.randrange(1, 40)) for trial in range(int({trials!r})))]
live = []
for trial, root in enumerate(roots):
    got = whole(root)
    if got is None or got[2] is None:
        continue
    k = id(root)
    rel._keep(k, root, *got, False)
    live.append((trial, root, k))
for step in range(10):
    with clamor.heap():
        changed = [[graphgen.change(r, root, pwclasses.Inst, kinds=9)
                    for _ in range(1 if r.random() < 0.7 else r.randrange(2, 4))] for _, root, _ in live]
    going = []
    for (trial, root, k), kinds in zip(live, changed):
        again = rel._recheck(k, root, rel.per_root[k][1].pages, 10**6)
        full = whole(root)
        for kind in kinds:
            key = kind + (" stood" if again is not None else " deferred")
            counts["kinds"][key] = counts["kinds"].get(key, 0) + 1
        if again is None:
            counts["deferred"] += 1
            if full is None or full[2] is None:
                continue
            rel._keep(k, root, *full, False)
            going.append((trial, root, k))
            continue
        counts["stood"] += 1
        entries, read, touched, state = again
        if full is None:
            counts["bad"].append([trial, step, kinds, "recheck approved what the whole walk does not"])
            continue
        if norm(entries) != norm(full[0]):
            ne, nf = norm(entries), norm(full[0])
            counts["bad"].append([trial, step, kinds, "other relocation entries",
                                  sorted(p for p in set(ne) | set(nf) if ne.get(p) != nf.get(p))])
            continue
        if union(read.ranges.tolist()) != union(full[1].ranges.tolist()):
            counts["bad"].append([trial, step, kinds, "rests on other bytes"])
            continue
        if full[2] is not None and not all(np.array_equal(getattr(state[0], f), getattr(full[2][0], f))
                                           for f in ("addrs", "tids", "tags", "pages", "ends")):
            counts["bad"].append([trial, step, kinds, "other words or tags kept"])
            continue
        counts["words"] += len(state[0])
        rel._keep(k, root, entries, read, state, state[2])
        going.append((trial, root, k))
    live = going
print(json.dumps(counts))
"""


def test_a_portable_recheck_lists_what_a_whole_walk_lists(tmp_path):
    """A change costs what changed for workers not forked too: after the
    driver changes a dict or list whose relocations are listed, only the
    entries whose bytes changed are walked again (Relocations._recheck),
    and their words and ranges replace the old ones.  Differential against
    a whole walk over random changes of every kind: the same entries on
    every page, the same bytes read, the same words and tags kept; where it
    cannot tell (an object outside that is no target, one two entries
    share) it defers to the whole walk."""
    (tmp_path / "pwclasses.py").write_text(MODULE)
    out = run_driver(RECHECK.format(moddir=str(tmp_path), trials=120), timeout=300)
    assert out["exit"] == 0, out
    assert not out["bad"], out["bad"][:3]
    assert out["stood"] >= 100 and out["deferred"] >= 30 and out["words"] > 5000, out
    kinds = out["kinds"]
    for kind in ("entry replaced", "entry added", "entry deleted", "record changed in place", "record emptied"):
        assert kinds.get(kind + " stood", 0) >= 10, (kind, out)
    for kind in ("object outside put in",):
        assert kinds.get(kind + " deferred", 0) >= 3, (kind, out)


def test_a_walk_longer_than_the_heartbeat_timeout_loses_no_worker():
    """The check before a stage and the listing of relocations hold the
    driver's GIL while they walk; the heartbeats that workers send
    meanwhile wait on the socket and count once it is read.  A stage whose
    walks take more than twice ``heartbeat_timeout`` (the walk in Python,
    the slow one) loses no spawned worker, and reads right."""
    out = run_driver(PRELUDE + """
from clamor.memory import walk
N = 100_000
with clamor.heap():
    d = {i: (i, "s" + str(i)) for i in range(N)}
walk.plain_in_c[0] = False
with clamor.Cluster(workers=2, start_method="spawn", progress=None, heartbeat_timeout=0.75) as cl:
    cl.run(lambda: None)
    t0 = time.perf_counter()
    got = cl.parallelize(range(2), 2).map(lambda _: d[N // 3]).collect()
    out = {"stage_s": time.perf_counter() - t0, "lost": cl.stats()["recovery"]["workers_lost"],
           "right": got == [d[N // 3]] * 2}
print(json.dumps(out))
""", env={"PYTHONHASHSEED": "0"})
    assert out["exit"] == 0, out
    assert out["stage_s"] > 1.5, out       # the walks outlasted two time-outs
    assert out["lost"] == 0 and out["right"], out
