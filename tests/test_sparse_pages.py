"""Sparse pages on the wire: a worker asks for sparse data with every fetch,
and a page server sends mostly-zero pages as their nonzero words when that
halves them (csrc/wire.c; docs/wire.md, "Sparse pages").

A differential hunt: region arrays whose pages hold every kind of sparsity
(all zeros, one word, scattered words, runs, negative zeros, NaNs, half
words, dense) are read by workers that fetch them, from the driver and
from each other, forked and spawned, before and after the driver rewrites
them sparsely; every page must read as on the driver, byte for byte.  The
wire counters must show the sparse pages travelling small and the dense
ones whole.  The C encoding itself is unit-tested in tests/c/test_wire.c;
malformed sparse replies in tests/test_faults.py."""
import json

import pytest

from helpers import PRELUDE

SCENARIO = PRELUDE + """
import hashlib

SEED = {seed}
rng = np.random.default_rng(SEED)
cl = clamor.Cluster(workers=2, start_method={method!r}, same_host="fetch", progress=False).start()
ps = region.page_size()
words = ps // 8
KINDS = ("zeros", "one", "scattered", "runs", "negzero", "nan", "halfword", "gaps", "dense", "edges")

def fill(page, kind):
    page[:] = 0
    if kind == "one":
        page[rng.integers(words)] = rng.integers(1, 1 << 63)
    elif kind == "scattered":
        k = int(rng.integers(1, words // 40))
        page[rng.integers(0, words, k)] = rng.integers(1, 1 << 63, k)
    elif kind == "runs":
        for _ in range(int(rng.integers(1, 20))):
            s = int(rng.integers(words)); n = int(rng.integers(1, 60))
            page[s:s + n] = rng.integers(1, 1 << 63, len(page[s:s + n]))
    elif kind == "negzero":          # -0.0 is a nonzero word
        page.view(np.float64)[rng.integers(0, words, 30)] = -0.0
    elif kind == "nan":
        page.view(np.float64)[rng.integers(0, words, 30)] = np.nan
    elif kind == "halfword":         # only one byte of a word set
        page.view(np.uint8)[rng.integers(0, ps, 50)] = rng.integers(1, 256, 50)
    elif kind == "gaps":             # one-word zero gaps inside a run
        s = int(rng.integers(0, words - 200))
        page[s:s + 200:2] = rng.integers(1, 1 << 63, 100)
    elif kind == "dense":
        page[:] = rng.integers(1, 1 << 63, words)
    elif kind == "edges":
        page[0] = 1; page[-1] = 2

n_pages = 48
a = clamor.zeros(n_pages * words + words, dtype=np.uint64)   # one page more: the array need not start on a page
off = (-(a.ctypes.data - region.base()) % ps) // 8
view = a[off:off + n_pages * words].reshape(n_pages, words)
kinds = [KINDS[i % len(KINDS)] for i in rng.permutation(n_pages)]
for p, k in enumerate(kinds):
    fill(view[p], k)

def digests(arr, which):
    # worker p % 2 reads pages p, p + 2, ...; then the other half, which the other worker may serve
    x = arr.get() if hasattr(arr, "get") else arr
    x = x[off:off + n_pages * words].reshape(n_pages, words)
    return {{int(p): hashlib.sha256(x[p].tobytes()).hexdigest() for p in which}}

def want(which):
    return {{int(p): hashlib.sha256(view[p].tobytes()).hexdigest() for p in which}}

ref = clamor.ref(a) if {method!r} == "spawn" else a
def read(i, r=ref):
    got = digests(r, range(i, n_pages, 2))
    got.update(digests(r, range(1 - i, n_pages, 2)))
    return got

mismatch = []
rounds = []
for rnd in range(3):
    got = cl.range(2, partitions=2).map(read).collect()
    for g in got:
        w = want(g)
        bad = [p for p in g if g[p] != w[p]]
        mismatch += [(rnd, p, kinds[p]) for p in bad]
    st = cl.stage_stats()[-1]
    rounds.append({{k: st[k] for k in ("bytes_from_driver", "bytes_from_peers", "wire_bytes")}})
    # the driver rewrites some pages sparsely, some densely, some to zeros
    for p in rng.choice(n_pages, 12, replace=False):
        kinds[p] = KINDS[int(rng.integers(len(KINDS)))]
        fill(view[p], kinds[p])

cl.close()
print(json.dumps({{"mismatch": mismatch, "rounds": rounds, "ps": ps, "n_pages": n_pages}}))
"""


@pytest.mark.fetch_path
@pytest.mark.parametrize("method,seed", [("fork", 1), ("fork", 2), ("spawn", 3)])
def test_every_kind_of_sparse_page_reads_as_on_the_driver(py, method, seed):
    p = py(SCENARIO.format(seed=seed, method=method), timeout=240)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-4000:]
    out = json.loads(p.stdout.strip().splitlines()[-1])
    assert out["mismatch"] == [], out["mismatch"]
    first, later = out["rounds"][0], out["rounds"][1:]
    # at first each worker fetches every page (from the driver or its peer)
    assert first["bytes_from_driver"] + first["bytes_from_peers"] >= 2 * out["n_pages"] * out["ps"], first
    for r in out["rounds"]:
        fetched = r["bytes_from_driver"] + r["bytes_from_peers"]
        # a tenth of the pages are dense and travel whole, the rest in far fewer bytes
        assert 0 < r["wire_bytes"] < fetched / 2, r
    # later rounds fetch again only the pages the driver rewrote
    assert all(0 < r["bytes_from_driver"] + r["bytes_from_peers"] < 2 * out["n_pages"] * out["ps"] for r in later), later
