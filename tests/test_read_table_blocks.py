"""A read table kept in blocks of pages (``readtable.ReadTable``): a change
remakes only the blocks it lands on.  Differential: random tagged tables
over a region buffer, cut into blocks of a few ranges, and random series
of updates (entries' ranges dropped, new ones put in, on old pages and new,
bytes written on some pages); after each, the blocked table read whole
must be ``updated_reference``'s, range for range, tag for tag, digest for
digest, and a block the update did not land on must be the same object as
before."""
from helpers import PRELUDE, run_json

CODE = PRELUDE + """
import random
from clamor.memory import readtable

NPAGES = 40
clamor.zeros(1 << 20, dtype=np.uint8)          # (the region exists from here)
ps = region.page_size()
buf = clamor.zeros(NPAGES * ps, dtype=np.uint8)
base = buf.ctypes.data
buf[:] = np.frombuffer(np.random.default_rng(3).bytes(buf.size), np.uint8)
r = random.Random(5)
counts = {"differ": [], "updates": 0, "blocks_max": 0, "shared": 0, "remade": 0, "emptied": 0, "grew": 0}

def random_ranges(n, tags_from):
    lo = [base + 8 * r.randrange(buf.size // 8 - 2) for _ in range(n)]
    ranges = np.array([(a, 8) for a in lo], dtype=np.uint64).reshape(-1, 2)
    return ranges, np.array([r.choice(tags_from) for _ in range(n)], dtype=np.int32)

def same(a, b):
    return (np.array_equal(a.ranges, b.ranges) and np.array_equal(a.tags, b.tags) and
            np.array_equal(a.pages, b.pages) and np.array_equal(a.starts, b.starts) and
            np.array_equal(a.digests, b.digests))

for case in range(40):
    readtable.BLOCK_RANGES = r.choice([1, 3, 16, 200, 1 << 16])
    ranges, tags = random_ranges(r.choice([0, 1, 30, 600]), list(range(-1, 60)))
    table = readtable.ReadTable(ranges, tags)
    ref = readtable.ReadTable.from_arrays(table.ranges, table.tags, table.pages, table.starts, table.digests)
    for step in range(8):
        drop = np.unique(np.array([r.randrange(-1, 60) for _ in range(r.choice([0, 1, 3, 20]))], dtype=np.int32))
        new, new_tags = random_ranges(r.choice([0, 1, 5, 80]), drop.tolist() or [7])
        if r.random() < 0.2:            # (on pages no range lay on before)
            new = new[(new[:, 0] - np.uint64(base)) // np.uint64(ps) >= np.uint64(NPAGES - 3)]
            new_tags = new_tags[:len(new)]
        touched = np.unique(np.array([(base - region.base()) // ps + r.randrange(NPAGES)
                                      for _ in range(r.randrange(0, 4))], dtype=np.uint64))
        for p in touched.tolist():      # bytes written there
            at = p * ps - (base - region.base()) + r.randrange(ps)
            if 0 <= at < buf.size:
                buf[at] ^= np.uint8(1 + r.randrange(255))
        before = list(table.blocks)
        got = table.updated(drop, new, new_tags, touched)
        want = readtable.updated_reference(ref, drop, new, new_tags, touched)
        counts["updates"] += 1
        if not same(got, want):
            counts["differ"].append([case, step, readtable.BLOCK_RANGES, len(table.ranges)])
            break
        # and read by page as the reference reads
        pages = np.unique(np.concatenate([touched, want.pages[::3]])) if len(want.pages) else touched
        if not np.array_equal(got.changed_pages(pages), want.changed_pages(pages)) or \\
                not np.array_equal(got.tags_on(pages), want.tags_on(pages)) or \\
                not np.array_equal(got.own_ranges(), want.ranges[want.tags < 0]):
            counts["differ"].append([case, step, "read by page"])
        kept = {id(b) for b in got.blocks}
        counts["shared"] += sum(id(b) in kept for b in before)
        counts["remade"] += sum(id(b) not in kept for b in before)
        counts["emptied"] += len(table.ranges) > 0 and len(got.ranges) == 0
        counts["grew"] += len(got.blocks) > len(before)
        counts["blocks_max"] = max(counts["blocks_max"], len(got.blocks))
        table, ref = got, want
    # blocks are never written: tables share them
    if table.blocks and table.blocks[0].ranges.flags.writeable:
        counts["differ"].append([case, "a block is writable"])
print(json.dumps(counts))
"""


def test_a_table_in_blocks_updates_as_its_whole_array_reference_does():
    out = run_json(CODE, timeout=180)
    assert out["differ"] == [], out["differ"][:5]
    assert out["updates"] == 320, out
    # what was exercised: tables of many blocks, blocks kept and remade, grown and emptied
    assert out["blocks_max"] >= 30 and out["shared"] >= 500 and out["remade"] >= 100, out
    assert out["grew"] >= 20 and out["emptied"] >= 1, out


def test_a_tag_set_finds_the_tags_numpy_isin_finds():
    import random

    import numpy as np

    from clamor.memory.readtable import TagSet
    r = random.Random(9)
    for _ in range(300):
        drop = np.unique(np.array([r.randrange(-3, 50) for _ in range(r.choice([0, 1, 4, 30]))], dtype=np.int32))
        tags = np.array([r.randrange(-5, 60) for _ in range(r.choice([0, 1, 100]))], dtype=np.int32)
        s = TagSet(drop)
        assert np.array_equal(s.hits(tags), np.isin(tags, drop)), (drop, tags)
        if len(tags):
            lo, hi = int(tags.min()), int(tags.max())
            assert s.meets(lo, hi) or not np.isin(tags, drop).any()
        lo = r.randrange(-6, 60)
        hi = lo + r.randrange(0, 8)
        assert s.meets(lo, hi) == bool(((drop >= lo) & (drop <= hi)).any()), (drop, lo, hi)
