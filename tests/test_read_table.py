"""The table a walk's verdict rests on (``readtable.ReadTable``): the ranges it
read, split at page boundaries and kept per page, and each page's digest.
``changed(pages)`` must say yes exactly when a byte inside a range on one of
those pages changed: checked against the bytes themselves, on random
ranges over a region buffer and random writes."""
from helpers import PRELUDE, run_json

CODE = PRELUDE + """
import random
from clamor.memory import readtable

NPAGES = 12
buf = clamor.zeros(1 << 20, dtype=np.uint8)      # (the region exists from here)
ps = region.page_size()
buf = clamor.zeros(NPAGES * ps, dtype=np.uint8)
base = buf.ctypes.data
first = (base - region.base()) // ps               # buf starts a page or lies inside one
raw = buf
raw[:] = np.frombuffer(np.random.default_rng(1).bytes(raw.size), np.uint8)
r = random.Random(7)
failures, checks = [], 0
for trial in range(60):
    readtable.BLOCK_RANGES = (1, 4, 1 << 16)[trial % 3]     # (a table of one block, or of many)
    ext = []
    for _ in range(r.randrange(1, 40)):
        lo = r.randrange(0, raw.size - 1)
        n = r.choice([0, 8, 16, r.randrange(1, 3 * ps)])
        ext.append((base + lo, min(n, raw.size - lo), True, None, "body"))
    plain = np.array([(base + p * ps + r.randrange(0, ps - 8), 8) for p in r.sample(range(NPAGES), 3)],
                     dtype=np.uint64)
    plain = plain[[(lo - region.base()) // ps == (lo + 7 - region.base()) // ps for lo in plain[:, 0].tolist()]]
    table = readtable.read_digests(ext, plain)
    # the ranges, split at page boundaries, cover exactly the bytes given
    want = np.zeros(raw.size, bool)
    for lo, n, *_ in ext:
        want[lo - base:lo - base + n] = True
    for lo, n in plain.tolist():
        want[lo - base:lo - base + n] = True
    got = np.zeros(raw.size, bool)
    for lo, n in table.ranges.tolist():
        if (lo - region.base()) // ps != (lo + n - 1 - region.base()) // ps:
            failures.append(["crosses a page", trial])
        got[lo - base:lo - base + n] = True
    if not (got == want).all():
        failures.append(["cover", trial])
    before = raw.copy()
    for _ in range(r.randrange(0, 6)):
        raw[r.randrange(0, raw.size)] ^= np.uint8(1 + r.randrange(255))
    diff = before != raw
    for _ in range(10):
        pages = readtable.pages_array(first + p for p in r.sample(range(NPAGES + 1), r.randrange(1, 6)))
        expect = False
        for pg in pages.tolist():
            a = max(0, (pg * ps) - (base - region.base()))
            b = min(raw.size, (pg + 1) * ps - (base - region.base()))
            expect |= bool(a < b and (diff[a:b] & want[a:b]).any())
        checks += 1
        if table.changed(pages) != expect:
            failures.append(["changed", trial, pages.tolist(), expect])
    raw[:] = before
    if table.changed(readtable.pages_array(range(first - 1, first + NPAGES + 2))):
        failures.append(["restored", trial])
print(json.dumps({"failures": failures[:5], "checks": checks}))
"""


def test_the_read_table_says_a_page_changed_exactly_when_a_byte_it_read_there_did():
    out = run_json(CODE, timeout=120)
    assert out["checks"] == 600, out
    assert out["failures"] == [], out
