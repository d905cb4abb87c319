"""A change costs what changed: after the driver changes a dict or list
that a check vouched for, ``walk.recheck`` walks again only the entries
whose key or value is another object now, or which led to a byte that
changed (csrc/pywalk.c, clamor_py_walk_tagged), and keeps the rest of the
read table.

Differential: random dicts and lists of records, random changes of every
kind (an entry replaced, added or deleted; a record changed in place, deep
down; an object made outside the region put inside a record; one record
shared by two entries; a table grown outside a block; an instance whose
dict needs keys of its own), several changes between checks at times.
After each, the recheck must approve only what a whole walk approves, and
rest on the same bytes; where it cannot tell it says so and the whole walk
decides.
"""
from helpers import PRELUDE, UNION, run_driver

DIFFERENTIAL = PRELUDE + UNION + """
sys.path.insert(0, "tests")
import random
import graphgen
import numpy as np
from clamor.memory import readtable, walk
readtable.BLOCK_RANGES = 4      # (tables of many blocks: a change remakes only some)

class Rec:
    pass

def whole(root, convert=False):
    # the C walk's verdict as share() takes it; a judge writes nothing
    reads = walk.Reads()
    ok = walk._walk_plain(root, 10**6, reads, convert=convert)
    return ok, reads

r = random.Random(int(sys.argv[1]) if len(sys.argv) > 1 else 11)
walk.note_fork()
counts = {"rechecks": 0, "stood": 0, "deferred": 0, "bad": [], "kinds": {}, "compared": 0}
# every trial's root in one block, and each step's changes of every root in
# one block (a block's edges cost two full collections and a pass over every
# object); each root is rechecked after its own changes
with clamor.heap():
    roots = [{"k" + str(i): graphgen.record(r, Rec) for i in range(n)} if trial % 2 else
             [graphgen.record(r, Rec) for _ in range(n)]
             for trial, n in ((trial, r.randrange(1, 40)) for trial in range(int({trials!r})))]
live = []
for trial, root in enumerate(roots):
    ok, reads = whole(root, convert=True)      # (the instances get dicts of their own, as a check gives them)
    if not ok:
        continue
    reads.seal()
    if not reads.incremental:
        continue
    live.append([trial, root, reads])
for step in range(12):
    with clamor.heap():
        changed = [[graphgen.change(r, root, Rec) for _ in range(1 if r.random() < 0.7 else r.randrange(2, 4))]
                   for _, root, _ in live]
    going = []
    for (trial, root, reads), kinds in zip(live, changed):
        reads.note(reads.read.pages)            # every page the verdict read: note() finds those that changed
        counts["rechecks"] += 1
        stood = walk.recheck(root, reads)
        full_ok, full = whole(root)
        for kind in kinds:
            key = kind + (" stood" if stood else " deferred")
            counts["kinds"][key] = counts["kinds"].get(key, 0) + 1
        if stood:
            counts["stood"] += 1
            if not full_ok:
                counts["bad"].append([trial, step, kinds, "recheck approved what the whole walk does not"])
                continue
            full.seal()
            counts["compared"] += 1
            if union(reads.read.ranges) != union(full.read.ranges):
                counts["bad"].append([trial, step, kinds, "rests on other bytes"])
                continue
            # and its digests are those of the bytes now (a stale one misses the next change)
            fresh = readtable.ReadTable(reads.read.ranges, reads.read.tags)
            if not (np.array_equal(fresh.pages, reads.read.pages) and np.array_equal(fresh.digests, reads.read.digests)):
                counts["bad"].append([trial, step, kinds, "digests stale"])
                continue
        else:
            counts["deferred"] += 1
            if not full_ok:
                continue
            reads = full.seal()
            if not reads.incremental:
                continue
        going.append([trial, root, reads])
    live = going
print(json.dumps(counts))
"""


def test_a_recheck_approves_only_what_a_whole_walk_approves_and_rests_on_the_same_bytes():
    out = run_driver(DIFFERENTIAL.replace("{trials!r}", "200"), timeout=300)
    assert out["exit"] == 0, out
    assert not out["bad"], out
    assert out["stood"] >= 100 and out["deferred"] >= 50 and out["compared"] == out["stood"], out
    kinds = out["kinds"]
    # what a recheck can bring up to date, it does
    for kind in ("entry replaced", "entry added", "entry deleted", "record changed in place", "record emptied"):
        assert kinds.get(kind + " stood", 0) >= 10, (kind, out)
    # what needs the whole walk (a refusal, a write, an object two entries share), it leaves to it
    for kind in ("object outside put in", "table grown outside", "instance needing keys"):
        assert kinds.get(kind + " deferred", 0) >= 3, (kind, out)


def test_a_one_entry_change_of_a_big_dict_walks_one_entry_again():
    """The Cluster's check after d[k] = v on a 200,000-entry dict: the
    recheck, not a whole walk (which would visit 600,000 objects), and the
    workers read the new entry."""
    out = run_driver(PRELUDE + '''
from clamor.memory import walk
n = 200_000
with clamor.heap():
    d = {i: (i, "s" + str(i)) for i in range(n)}
visits = []
orig = walk._walk_plain
walk._walk_plain = lambda *a, **k: visits.append(1) or orig(*a, **k)
with clamor.Cluster(workers=1, progress=False) as cl:
    first = cl.parallelize(range(1), 1).map(lambda i: d[5]).collect()
    whole_walks = len(visits)
    with clamor.heap():
        d[5] = (-5, "changed" + str(n))
    second = cl.parallelize(range(1), 1).map(lambda i: d[5]).collect()
    after = len(visits) - whole_walks
print(json.dumps({"first": first, "second": second, "whole_walks": whole_walks, "after": after}))
''', timeout=180)
    assert out["exit"] == 0, out
    assert out["first"] == [[5, "s5"]] and out["second"] == [[-5, "changed200000"]], out
    assert out["whole_walks"] >= 1 and out["after"] == 0, out
