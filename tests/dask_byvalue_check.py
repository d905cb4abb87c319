"""A region object passed to Dask as it is (not through clamor.dask.ref)
travels by value with a ByValueWarning naming clamor.dask.ref, once per
object.  Run by hand:

    python tests/dask_byvalue_check.py

Not in the suite: its driver hung past the time-out in 2 of about 6 runs
on 2026-11-28 (issue 33 open); the cause is not found yet.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_dask_objects import run  # noqa: E402  (its driver's setup and teardown)


def test_a_region_object_passed_as_it_is_travels_by_value_said_once():
    # A region object given to Dask itself, not through clamor.dask.ref:
    # Dask's copy, read at submission, with a ByValueWarning that names
    # clamor.dask.ref, once per object.  (A KDTree failed on the scheduler,
    # which unpickles graphs: its __setstate__ got references, not arrays;
    # with tokenize.ensure-deterministic, its token raised TokenizationError.)
    out = run("""
import collections, warnings
from dask.tokenize import tokenize
from clamor.memory import byvalue
with clamor.heap():
    tally = collections.Counter(f"k{i % 7}" for i in range(700))
dask.config.set({"tokenize.ensure-deterministic": True})
qs = rng.random((5, 2))
want = tree.query(qs, k=3)[1].tolist()
before = byvalue.counts()
got = {}
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    got["tree_arg"] = client.submit(lambda t, q: t.query(q, k=3)[1].tolist(), tree, qs).result() == want
    got["tree_closure"] = client.submit(lambda: tree.query(qs, k=3)[1].tolist()).result() == want
    got["tree_again"] = int(client.submit(lambda t: t.query(qs[0], k=1)[1], tree, pure=False).result()) == want[0][0]
    got["dict_delayed"] = dask.delayed(lambda d: d["k7"][1])(names).compute() == "v7"
    got["dict_map"] = client.gather(client.map(lambda k, d: d[k][0], ["k1", "k2"], [names, names])) == [1, 2]
    got["counter"] = client.submit(lambda c: c["k3"], tally).result() == 100
res["got"] = got
res["tokens"] = [tokenize(tree) == tokenize(tree), tokenize(tally) == tokenize(tally)]
res["warnings"] = [(w.category.__name__, str(w.message), w.filename) for w in caught]
res["counts"] = [before, byvalue.counts()]
res["by_ref_still"] = int(client.submit(lambda t: t.get().query(qs[0], k=1)[1], clamor.dask.ref(tree)).result()) == want[0][0]
""")
    assert all(out["got"].values()), out["got"]
    assert out["tokens"] == [True, True]
    told = [w for w in out["warnings"] if w[0] == "ByValueWarning"]
    assert sorted(m.split(" (")[0] for _, m, _ in told) == ["a region Counter", "a region KDTree", "a region dict"], told
    for _, msg, where in told:
        assert "travels by value" in msg and "clamor.dask.ref" in msg and where == "<string>", (msg, where)
    before, after = out["counts"]
    assert after["objects"] - before["objects"] == 3 and after["bytes"] - before["bytes"] > 100_000, out["counts"]
    assert out["by_ref_still"]


if __name__ == "__main__":
    test_a_region_object_passed_as_it_is_travels_by_value_said_once()
    print("ok")
