"""The relocation words of a portable walk listed in one call of C
(csrc/pyrelist.c, ``_relocentries._match``) against their numpy reference
(``_relocentries._match_reference``), on random words.

A region array's words are drawn as data, pointers at targets (static
types and singletons in libpython), pointers into private memory (objects
made outside the region), pointers into the region and null; extents over
them overlap at random, each strict or not and tagged; null words are drawn
among the same words, some of them the private pointers (which are then no
refusal).  Both sides must give the same words, targets and tags, the same
refusals in the same order, and the same entries on every page; the lists
C installs from the words (clamor_reloc_set_words) must be the reference's
entries, and change where a word's value changed, and nowhere else.  A
recheck's splice of words (clamor_py_reloc_splice) is checked against its
numpy reference on random words, tags and entries dropped, and a read
table's order by page (clamor_py_sort_by_page) against numpy's stable
argsort.
"""
from helpers import PRELUDE, run_driver

DIFFERENTIAL = PRELUDE + """
import random
from clamor._native import ffi, lib
from clamor.memory import _relocentries, portable

r = random.Random(int(sys.argv[1]) if len(sys.argv) > 1 else 5)
t = portable.driver().targets
t.refresh_images()
private = [[i] for i in range(64)]                  # (made outside the region: private memory)
TARGETS = [id(int), id(str), id(tuple), id(type(None)), id(None), id(True), id(dict)]
with clamor.heap():
    buf = np.zeros(400_000, dtype=np.uint64)         # 3 MiB of region words, over many pages
    inner = [float(i) for i in range(100)]
base = buf.ctypes.data

def draw():
    k = r.random()
    if k < 0.35:
        return r.randrange(0, 2**40)                 # data
    if k < 0.65:
        return r.choice(TARGETS) + 8 * r.randrange(0, 2)
    if k < 0.75:
        return id(r.choice(private))
    if k < 0.85:
        return id(r.choice(inner))                   # into the region: not listed
    return 0

counts = {"cases": 0, "words": 0, "bad": 0, "pages": 0, "differ": [], "installed": 0, "changed": 0, "null_bumps": 0}
WORDS = region.page_size() // 8
got_list = ffi.new("struct clamor_reloc[]", WORDS)
n_list = ffi.new("uint32_t *")

def install(stage, words):
    # clamor_reloc_set_words over the words' pages: (changed, counts)
    changed, n = np.zeros(len(words.pages), np.uint8), np.zeros(len(words.pages), np.uint32)
    pages = np.ascontiguousarray(words.pages, dtype=np.uint64)
    assert lib.clamor_reloc_set_words(stage, ffi.cast("const uint64_t *", pages.ctypes.data), len(pages),
                                      ffi.cast("const uint64_t *", words.addrs.ctypes.data),
                                      ffi.cast("const uint32_t *", words.tids.ctypes.data), len(words.addrs),
                                      ffi.cast("uint8_t *", changed.ctypes.data),
                                      ffi.cast("uint32_t *", n.ctypes.data)) == 0
    return changed, n

def listed(stage, page):
    assert lib.clamor_reloc_list(page, stage, got_list, WORDS, n_list) == 0
    return bytes(ffi.buffer(got_list, n_list[0] * 16))
for case in range(60):
    n = r.choice([1, 10, 200, 5000, 40_000])
    lo = r.randrange(0, len(buf) - n)
    buf[lo:lo + n] = [draw() for _ in range(n)]
    ext, strict, tags = [], [], []
    for _ in range(r.randrange(1, 60)):
        a = lo + r.randrange(0, n)
        length = min(r.randrange(1, 400), lo + n - a)
        ext.append((base + 8 * a + r.choice([0, 0, 0, 3]), 8 * length))     # (some start unaligned)
        strict.append(r.choice([0, 1, 3]))
        tags.append(r.randrange(-1, 50))
    nulls = sorted({base + 8 * (lo + r.randrange(0, n)) for _ in range(r.randrange(0, 40))})
    null_tags = [r.randrange(-1, 50) for _ in nulls]
    ext = np.array(ext, dtype=np.uint64).reshape(-1, 2)
    strict = np.array(strict, dtype=np.uint8)
    for tagged in (False, True):
        tg, ntg = (np.array(tags, np.int32), np.array(null_tags, np.int32)) if tagged else (None, None)
        got, bad, words = _relocentries._match(ext, strict, nulls, t, None, tg, ntg)
        pages = _relocentries._page_entries(words)
        ref, ref_bad = _relocentries._match_reference(ext, strict, nulls, t, None, tg, ntg)
        same = (np.array_equal(got[0], ref[0]) and np.array_equal(got[1], ref[1]) and np.array_equal(bad, ref_bad)
                and (not tagged or np.array_equal(got[2], ref[2])) and (tagged or got[2] is None)
                and pages == _relocentries._by_page(*ref[:2])
                and np.array_equal(words.pages, np.array(sorted(pages), dtype=np.uint64))
                and np.array_equal(words.targets, np.unique(ref[1])))
        if not same:
            counts["differ"].append([case, tagged, len(got[0]), len(ref[0]), len(bad), len(ref_bad)])
    # the lists C makes of the words as it installs them: the reference's
    # entries, word for word, the values read now; the same words again
    # change nothing; a word's value changed changes its page alone (but a
    # null word's)
    ref_pages = _relocentries._by_page(*ref[:2])
    stage = 2 * case + 1
    changed, n = install(stage, words)
    if any(listed(stage, p) != ref_pages[p] for p in words.pages.tolist()) or \
            not np.array_equal(n, [len(ref_pages[p]) // 16 for p in words.pages.tolist()]):
        counts["differ"].append([case, "installed lists"])
    counts["installed"] += int(changed.sum())
    if install(stage + 1, words)[0].any():
        counts["differ"].append([case, "the same words changed a list"])
    listed_words = np.flatnonzero(words.tids != 0)
    if len(listed_words):
        at = int(r.choice(listed_words.tolist()))
        a = int(words.addrs[at])
        buf[(a - base) // 8] += 8
        changed, _ = install(stage + 1, words)
        page = int(_relocentries._pages_of(np.array([a], np.uint64))[0])
        if changed.tolist() != [int(p == page) for p in words.pages.tolist()]:
            counts["differ"].append([case, "a changed word's page alone changes", changed.tolist()])
        counts["changed"] += int(changed.sum())
    null_words = np.flatnonzero(words.tids == 0)
    if len(null_words):     # (a null word's value is no part of a list: the collector's links change at any time)
        a = int(words.addrs[int(r.choice(null_words.tolist()))])
        buf[(a - base) // 8] += 8
        if install(stage + 1, words)[0].any():
            counts["differ"].append([case, "a null word's value changed a list"])
        counts["null_bumps"] += 1
    counts["cases"] += 1
    counts["words"] += len(ref[0])
    counts["bad"] += len(ref_bad) > 0
    counts["pages"] += len(pages)

# a recheck's splice (clamor_py_reloc_splice) against its numpy reference
counts["spliced"] = counts["clashes"] = counts["chunks_kept"] = counts["chunks_lost"] = 0
for case in range(200):
    n = r.choice([0, 1, 5, 100, 3000])
    old_a = np.array(sorted(r.sample(range(len(buf)), n)), dtype=np.uint64) * np.uint64(8) + np.uint64(base)
    old_t = np.array([r.randrange(0, 9) for _ in range(n)], dtype=np.uint32)
    old_g = np.array([r.randrange(-1, 30) for _ in range(n)], dtype=np.int32)
    drop = np.array(sorted(set(r.randrange(-1, 30) for _ in range(r.randrange(0, 6))) | {-1}), dtype=np.int32)
    pool = old_a[np.isin(old_g, drop)].tolist()
    if r.random() < 0.1 and n:
        pool.append(int(old_a[r.randrange(n)]))                          # (maybe a kept word: a clash)
    m = r.randrange(0, 50)
    new_a = sorted(set(r.sample(pool, min(len(pool), m // 2)) +
                       [base + 8 * r.randrange(len(buf)) for _ in range(m - m // 2)]))
    new_a = np.array(new_a, dtype=np.uint64)
    new_t = np.array([r.randrange(0, 9) for _ in new_a], dtype=np.uint32)
    new_g = np.array([r.randrange(0, 30) for _ in new_a], dtype=np.int32)
    # (in chunks of a few words to one of all: a splice makes anew only the chunks it lands on)
    _relocentries.CHUNK_WORDS = r.choice([1, 4, 64, 1 << 16])
    old = _relocentries.Words(old_a, old_t, tags=old_g)
    got = _relocentries._splice(old, drop, (new_a, new_t, new_g))
    ref = _relocentries._splice_reference((old_a, old_t, old_g), drop, (new_a, new_t, new_g))
    if (got is None) != (ref is None):
        counts["differ"].append(["splice", case, "clash seen by one side only"])
        continue
    if got is None:
        counts["clashes"] += 1
        continue
    words, touched = got
    whole = _relocentries.Words(ref[0][0], ref[0][1])
    if not (all(np.array_equal(x, y) for x, y in zip((words.addrs, words.tids, words.tags), ref[0]))
            and np.array_equal(touched, ref[1])
            and np.array_equal(words.pages, whole.pages) and np.array_equal(words.ends, whole.ends)):
        counts["differ"].append(["splice", case, _relocentries.CHUNK_WORDS])
    # the chunks no word went from or came to are the old ones (a chunk
    # takes the pages from its first up to the next chunk's first; the
    # first chunk, those below too)
    firsts = [int(c.pages[0]) for c in old.chunks]
    for i, c in enumerate(old.chunks):
        lo, hi = (firsts[i] if i else 0), (firsts[i + 1] if i + 1 < len(firsts) else 1 << 62)
        if not ((touched >= np.uint64(lo)) & (touched < np.uint64(hi))).any():
            counts["chunks_kept"] += any(c is k for k in words.chunks)
            counts["chunks_lost"] += not any(c is k for k in words.chunks)
    counts["spliced"] += 1
_relocentries.CHUNK_WORDS = 1 << 16

# the lists installed for several roots (Relocations._install): on each
# page, the union of the roots' words, an address named by two roots
# listed with the first root's target; the pages no root has, emptied
counts["roots_installed"] = counts["roots_shared_pages"] = 0
for case in range(40):
    _relocentries.CHUNK_WORDS = r.choice([3, 50, 1 << 16])     # (a root's words in chunks: C is given each)
    rel = portable.Relocations()
    roots, kept = [], []
    span = r.choice([20, 2000, len(buf) - 1])
    at = r.randrange(len(buf) - span)
    for k in range(r.randrange(1, 5)):
        a = np.array(sorted(r.sample(range(at, at + span), r.randrange(0, min(span, 3000)))), dtype=np.uint64)
        a = a * np.uint64(8) + np.uint64(base)
        w = _relocentries.Words(a, np.array([r.randrange(1, 9) for _ in a], dtype=np.uint32))
        root = [k]
        roots.append(root)
        rel._keep(id(root), root, w, None, None, False)
        kept.append(w)
    pages = set(np.concatenate([w.pages for w in kept]).tolist()) | {int(_relocentries._pages_of(
        np.array([base + 8 * r.randrange(len(buf))], np.uint64))[0])}      # (maybe a page no root has)
    stage = 1000 + case
    rel._install(pages, stage)
    for page in sorted(pages):
        owners = [w for w in kept if page in set(w.pages.tolist())]
        counts["roots_shared_pages"] += len(owners) > 1
        first = {}          # address -> target, the first root's (plain Python: the reference)
        for w in owners:
            on = _relocentries._pages_of(w.addrs) == np.uint64(page)
            for a, t_ in zip(w.addrs[on].tolist(), w.tids[on].tolist()):
                first.setdefault(a, t_)
        ua = np.array(sorted(first), dtype=np.uint64)
        want = _relocentries._by_page(ua, np.array([first[a] for a in sorted(first)], np.uint32)).get(page, b"")
        if listed(stage, page) != want:
            counts["differ"].append(["roots installed", case, page])
        counts["roots_installed"] += 1

# a read table's order (clamor_py_sort_by_page), some ranges left out,
# against numpy's stable argsort of those kept
from clamor.memory import readtable
counts["ordered"] = 0
for case in range(100):
    n = r.choice([0, 1, 7, 300, 5000])
    starts = [base + 8 * r.randrange(len(buf) - 1) for _ in range(n)]
    ranges = np.array([(a, 8) for a in starts], dtype=np.uint64).reshape(-1, 2)
    tags = np.array([r.randrange(-1, 40) for _ in range(n)], dtype=np.int32) if case % 2 else None
    skip = np.array([r.random() < 0.3 for _ in range(n)], dtype=np.uint8) if case % 3 else None
    table = readtable.ReadTable(ranges, tags, skip=skip)
    keep = slice(None) if skip is None else skip == 0
    ref_r, ref_t, ref_p, ref_s = readtable._order_reference(ranges[keep], None if tags is None else tags[keep])
    if not (np.array_equal(table.ranges, ref_r) and np.array_equal(table.pages, ref_p)
            and np.array_equal(table.starts, ref_s)
            and (tags is None or np.array_equal(table.tags, ref_t)) and (tags is not None or table.tags is None)):
        counts["differ"].append(["read table order", case, n])
    counts["ordered"] += len(table.pages)
print(json.dumps(counts))
"""


def test_the_c_listing_of_relocation_words_agrees_with_its_reference():
    out = run_driver(DIFFERENTIAL, timeout=300)
    assert out["exit"] == 0, out
    assert not out["differ"], out["differ"][:5]
    # what both sides listed: words at targets, refusals, several pages
    assert out["cases"] == 60 and out["words"] > 10_000 and out["bad"] >= 10 and out["pages"] > 60, out
    assert out["installed"] > 60 and out["changed"] >= 40 and out["null_bumps"] >= 20, out
    assert out["spliced"] >= 150 and out["clashes"] >= 3, out
    assert out["chunks_kept"] >= 200 and out["chunks_lost"] == 0, out
    assert out["ordered"] > 1000, out
    assert out["roots_installed"] > 100 and out["roots_shared_pages"] >= 20, out
