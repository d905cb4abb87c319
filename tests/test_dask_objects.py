"""Region Python objects on Dask: clamor.dask.ref(obj), used in place by
Dask's spawned workers (their pages relocated as they arrive).

Each scenario is a driver in its own interpreter started with
PYTHONHASHSEED=6640, the seed Dask's nanny gives the workers it starts:
str-keyed dicts in the region hash the same on both sides.  Every answer
is compared with the driver's own.
"""
import pytest
from helpers import scenario

pytest.importorskip("distributed")

SETUP = """
import dask, dask.bag as db
from distributed import Client, Event, LocalCluster
from scipy.spatial import KDTree
import clamor.dask

rng = np.random.default_rng(5)
region.ensure()
with clamor.heap():          # before the client: its threads refill CPython's free lists
    tree = KDTree(rng.random((100_000, 2)))
    names = {f"k{i}": [i, "v%d" % i] for i in range(4000)}

import types
outside = [1, 2, 3]
with clamor.heap():
    leaky = types.SimpleNamespace(data=None)
leaky.data = outside          # an attribute that points out of the region

cluster = LocalCluster(n_workers=2, threads_per_worker=2, processes=True, dashboard_address=":0",
                       worker_dashboard_address=":0")
client = Client(cluster)
clamor.dask.attach(client)
res = {}
"""

TEARDOWN = """
clamor.dask.detach(client)
client.close()
cluster.close()
print(json.dumps(res))
"""


def run(body, seed="6640"):
    return scenario(SETUP + body + TEARDOWN, timeout=240, env={"PYTHONHASHSEED": seed})


def test_a_kdtree_and_a_dict_are_used_in_place_in_every_way_dask_passes_data():
    out = run("""
from distributed.protocol.pickle import dumps
t, n = clamor.dask.ref(tree), clamor.dask.ref(names)
qs = [rng.random(2) for _ in range(24)]
near = lambda q: t.get().query(q, k=4)[1].tolist()
res["closure_bytes"] = len(dumps(near))
want = [near(q) for q in qs]
res["map"] = client.gather(client.map(near, qs)) == want
res["submit"] = client.submit(lambda tt, q: tt.get().query(q, k=4)[1].tolist(), t, qs[0]).result() == want[0]
res["delayed"] = dask.delayed(lambda tt: tt.get().query(qs[1], k=4)[1].tolist())(t).compute() == want[1]
keys = [f"k{i}" for i in range(0, 4000, 97)]
res["bag"] = db.from_sequence(keys, npartitions=3).map(lambda k: n.get()[k][1]).compute() == \\
    [names[k][1] for k in keys]
arr = clamor.array(np.arange(1000.0))
mixed = lambda tt, a, q: (tt.get().query(q, k=4)[1].tolist(), float(a[7]))   # a ref and an array, in that order
res["mixed"] = client.submit(mixed, t, arr, qs[2], pure=False).result() == (want[2], 7.0)
back = client.submit(lambda: n.get(), pure=False).result()
res["copy"] = [back == names, region.contains(id(back))]
st = client.run(clamor.stats)
res["relocated"] = sum(s["reloc_pages"] for s in st.values())
""")
    assert out["closure_bytes"] < 2000
    assert out["map"] and out["submit"] and out["delayed"] and out["bag"] and out["mixed"]
    assert out["copy"] == [True, False]        # a result is a value, not the worker's view of the region
    assert out["relocated"] > 0


def test_an_object_changed_by_the_driver_reads_per_submission():
    out = run("""
n = clamor.dask.ref(names)
name = "go-objects"
def held(i):
    Event(f"{name}-started-{i}").set()
    assert Event(name).wait(60)
    return n.get()["k7"][1] + n.get()["k3999"][1]
old = [client.submit(held, i, pure=False) for i in range(4)]
for i in range(4):
    assert Event(f"{name}-started-{i}", client=client).wait(60)
with clamor.heap():
    names["k7"][1] = "seven-" + str(len(names))       # the driver writes while the four run
    names["k3999"][1] = "last-" + str(len(names))
new = client.submit(lambda: n.get()["k7"][1] + n.get()["k3999"][1], pure=False)
Event(name, client=client).set()
res["old"] = client.gather(old)
res["new"] = new.result()
""")
    assert out["old"] == ["v7v3999"] * 4
    assert out["new"] == "seven-4000last-4000"


def test_what_cannot_be_used_in_place_is_refused_before_it_is_sent():
    out = run("""
res["leaky"] = attempt(clamor.dask.ref, leaky)
res["outside"] = attempt(clamor.dask.ref, outside)
res["array"] = attempt(clamor.dask.ref, clamor.zeros(4))
t = clamor.dask.ref(tree)
res["outside_a_task"] = client.run(lambda: attempt(t.get))
res["still"] = client.submit(lambda: len(t.get().data)).result()
""")
    kind, msg, typed = out["leaky"]
    assert kind == "NotShareable" and typed and "data" in msg and "outside the region" in msg, msg
    kind, msg, typed = out["outside"]
    assert kind == "NotShareable" and "not in the region" in msg, msg
    assert out["array"][0] == "TypeError"
    for kind, msg, typed in out["outside_a_task"].values():
        assert kind == "NotShareable" and "task" in msg, msg
    assert out["still"] == 100_000


def test_a_driver_whose_hash_seed_differs_from_the_workers_is_told_why():
    out = run("""
res["dict"] = attempt(clamor.dask.ref, names)
""", seed="1234")
    kind, msg, typed = out["dict"]
    assert kind == "NotShareable" and typed and "PYTHONHASHSEED" in msg and "6640" in msg, msg
