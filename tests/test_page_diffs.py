"""Page diffs on the wire: a fetching worker keeps its copy of a page the
driver changed and asks for the page with the version its copy is; the
driver answers with the words that changed when that is shorter
(csrc/server.c, csrc/pager.c; docs/wire.md, "Diffs").

A differential hunt over random update patterns: a few words of a dense
page, many words, the whole page, the same bytes written back, stages
skipped between a worker's reads (its copy's version collected meanwhile),
and a copy the worker wrote into.  Every task must read each page as the
driver has it, byte for byte, and the counters must show diffs used where
they should be: a round after a few words changed on dense pages moves a
small fraction of the pages' bytes.  With the code of before diffs (or
CLAMOR_DIFF_KEEP=0) that round moves the pages whole, and the test fails.
Malformed diffs from a fake page server are in test_page_diffs_faults.py."""
import json

import pytest

from helpers import PRELUDE

SCENARIO = PRELUDE + """
import hashlib

rng = np.random.default_rng({seed})
cl = clamor.Cluster(workers=2, start_method={method!r}, same_host="fetch", progress=False, speculation=False).start()
ps = region.page_size()
words = ps // 8
n_pages = 24
a = clamor.zeros(n_pages * words + words, dtype=np.uint64)
off = (-(a.ctypes.data - region.base()) % ps) // 8
view = a[off:off + n_pages * words].reshape(n_pages, words)
view[:] = rng.integers(1, 1 << 63, view.shape, dtype=np.uint64)     # dense: no sparse form

def digests(_i, scribble=()):
    x = view
    got = {{int(p): hashlib.sha256(x[p].tobytes()).hexdigest() for p in range(n_pages)}}
    for p in scribble:             # the worker writes into its own copy
        x[p, 5] ^= np.uint64(1)
    return got

def want():
    return {{int(p): hashlib.sha256(view[p].tobytes()).hexdigest() for p in range(n_pages)}}

def update(kind):
    pages = rng.choice(n_pages, int(rng.integers(4, n_pages)), replace=False)
    for p in pages:
        if kind == "few":
            view[p, rng.integers(0, words, int(rng.integers(1, 8)))] += np.uint64(1)
        elif kind == "many":
            view[p, rng.integers(0, words, words // 3)] ^= np.uint64(0xff)
        elif kind == "whole":
            view[p] = rng.integers(1, 1 << 63, words, dtype=np.uint64)
        elif kind == "same":
            view[p] = view[p].copy()
    return [int(p) for p in pages]

mismatch, rounds = [], []
plan = ["few", "many", "few", "whole", "same", "few", "skip", "skip", "few", "scribble", "few", "few",
        "skip", "many", "few"]
for rnd, kind in enumerate(plan):
    if kind == "skip":                 # a stage that reads nothing: the copies' versions may go
        cl.range(2, partitions=2).map(lambda i: i).collect()
        update("few")
        continue
    scribble = list(rng.choice(n_pages, 5, replace=False)) if kind == "scribble" else []
    got = cl.range(2, partitions=2).map(lambda i: digests(i, scribble)).collect()
    w = want()
    for g in got:
        mismatch += [(rnd, kind, p) for p in g if g[p] != w[p]]
    st = cl.stage_stats()[-1]
    rounds.append({{"kind": plan[rnd - 1] if rnd else "first", "wire": st["wire_bytes"],
                   "diff": st.get("wire_bytes_diff", 0), "diff_pages": st.get("diff_pages", 0),
                   "fetched": st["bytes_from_driver"] + st["bytes_from_peers"]}})
    touched = update("few" if kind == "scribble" else kind)
    if kind == "scribble":             # the driver changes the pages the workers wrote into
        for p in scribble:
            view[p, 7] += np.uint64(1)
ws = cl.run(lambda: {{k: v for k, v in clamor.stats().items() if "diff" in k or "kept" in k}})
ds = {{k: v for k, v in clamor.stats().items() if "diff" in k}}
cl.close()
print(json.dumps({{"mismatch": mismatch, "rounds": rounds, "ps": ps, "n_pages": n_pages, "workers": ws,
                  "driver": ds}}))
"""


@pytest.mark.fetch_path
@pytest.mark.parametrize("method,seed", [("fork", 1), ("fork", 2), ("spawn", 3)])
def test_diffs_read_as_on_the_driver_and_are_used(py, method, seed):
    """Forked workers, and spawned ones, which relocate: their copies get
    the driver's words back before the diff, and the new list after."""
    p = py(SCENARIO.format(seed=seed, method=method), timeout=300)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-4000:]
    out = json.loads(p.stdout.strip().splitlines()[-1])
    assert out["mismatch"] == [], out["mismatch"]
    rounds = out["rounds"]
    # after a few words changed on dense pages, what crosses the wire is a
    # small part of the pages fetched again: diffs
    few = [r for r in rounds if r["kind"] == "few"]
    assert few and all(r["fetched"] > 0 for r in few), rounds
    assert all(r["wire"] < r["fetched"] / 8 for r in few), rounds
    assert all(r["diff_pages"] > 0 and r["diff"] > 0 for r in few), rounds
    # a whole page rewritten has no shorter diff: it travels whole
    whole = [r for r in rounds if r["kind"] == "whole"]
    assert all(r["wire"] > r["fetched"] / 2 for r in whole), rounds
    # the same bytes written back invalidate nothing: nothing is fetched
    assert all(r["fetched"] == 0 for r in rounds if r["kind"] == "same"), rounds
    # a copy a worker wrote into did not sum right and was fetched whole
    retries = sum(w["diff_retries"] for w in out["workers"])
    assert retries > 0, out["workers"]
    # and only those: at most the 5 pages each of the 2 workers wrote into
    # (a diff kept by the driver and sent to the other worker sums right)
    assert retries <= 10, out["workers"]
    d = out["driver"]
    assert 0 < d["diff_pages_reused"] < d["diff_pages_served"], d
    assert all(w["kept_bytes"] >= 0 and w["pages_kept"] > 0 for w in out["workers"]), out["workers"]


def test_no_diffs_when_no_copy_is_kept(py):
    """CLAMOR_DIFF_KEEP=0: no copy is kept and no diff asked for; the reads
    are the same."""
    p = py(SCENARIO.format(seed=3, method="fork"), env={"CLAMOR_DIFF_KEEP": "0"}, timeout=300)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-4000:]
    out = json.loads(p.stdout.strip().splitlines()[-1])
    assert out["mismatch"] == [], out["mismatch"]
    assert all(r["diff_pages"] == 0 for r in out["rounds"]), out["rounds"]
    assert all(w["pages_kept"] == 0 and w["diff_pages"] == 0 for w in out["workers"]), out["workers"]
