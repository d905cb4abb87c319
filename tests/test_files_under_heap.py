"""Files load under clamor.heap() on a driver whose region is write-protected.

Once a stage has begun (a Cluster protects the region as it starts; so
does attaching to Dask), the driver keeps region pages write-protected to
log their versions.  A system call that writes into such a page used to
fail with EFAULT: np.load, pickle.load, open().read(), pd.read_csv and even
the first import of a module under heap() (which now runs outside the
region: hooks._imports_outside).  Each mechanism is run:
userfaultfd, where a system call's write waits for the page's version like
any other write, and mprotect, the fallback, where the blocks heap() hands
out are opened as they are handed out.

Every scenario runs in its own interpreter.  What a loader gives is checked
against the file, is checked to lie in the region, and is read by the
workers in a stage, whose answers are compared with the same computation in
one process.
"""
import pytest
from helpers import PRELUDE, run_json

# Each test runs under both mechanisms (conftest.write_protect).
pytestmark = pytest.mark.usefixtures("write_protect")


# The files, and what a single process computes from them (no region).
FILES = PRELUDE + """
import pickle
import pandas as pd
D = {d!r}
RAW = 1 << 18                  # 256 KiB: four pages
rng = np.random.default_rng(3)
ref = {{
    "npy": rng.random(50_000),
    "bin": rng.integers(-1 << 40, 1 << 40, 40_000),
    "pkl": {{"ids": list(range(0, 60_000, 3)), "names": [f"n{{i}}" for i in range(1000)], "w": rng.random(20_000)}},
    "raw": rng.integers(0, 256, RAW, dtype=np.uint8).tobytes(),
    "csv": pd.DataFrame({{"a": np.arange(10_000), "b": rng.random(10_000), "c": rng.integers(0, 9, 10_000)}}),
}}
np.save(D + "/a.npy", ref["npy"])
ref["bin"].tofile(D + "/b.bin")
with open(D + "/p.pkl", "wb") as f:
    pickle.dump(ref["pkl"], f)
with open(D + "/raw", "wb") as f:
    f.write(ref["raw"])
ref["csv"].to_csv(D + "/c.csv", index=False)
ref["csv"] = pd.read_csv(D + "/c.csv")     # as read back (the floats' text round trip)

def sender(data):
    # a socket whose other end sends `data` from a thread outside any heap() block
    a, b = socket.socketpair()
    t = threading.Thread(target=lambda: (b.sendall(data), b.close()))
    t.start()
    return a, t

def recv_all(sock, buf):
    mv, got = memoryview(buf).cast("B"), 0
    while got < len(mv):
        n = sock.recv_into(mv[got:])
        if not n:
            break
        got += n
    return got

def answers(npy, bin_, pkl, raw, readinto, csv_b, csv_c, recv, i):
    # what a task computes from what was loaded; partition i of 4
    return [float(npy[i::4].sum()), int(bin_[i::4].sum()), sum(pkl["ids"][i::4]), pkl["names"][i * 7],
            float(pkl["w"][i::4].sum()), int(np.frombuffer(raw, np.uint8)[i::4].sum()), int(readinto[i::4].sum()),
            float(csv_b[i::4].sum()), int(csv_c[i::4].sum()), int(recv[i::4].sum())]

raw_ref = np.frombuffer(ref["raw"], np.uint8)
want = [answers(ref["npy"], ref["bin"], ref["pkl"], ref["raw"], raw_ref, ref["csv"]["b"].to_numpy(),
                ref["csv"]["c"].to_numpy(), raw_ref, i) for i in range(4)]
"""

LOAD = """
def load_all():
    # every loader under heap(); the socket's sender runs outside the block
    sock, t = sender(ref["raw"])
    with clamor.heap():
        got = {}
        got["npy"] = np.load(D + "/a.npy")
        got["bin"] = np.fromfile(D + "/b.bin", dtype=np.int64)
        with open(D + "/p.pkl", "rb") as f:
            got["pkl"] = pickle.load(f)
        with open(D + "/raw", "rb") as f:
            got["raw"] = f.read()
        got["readinto"] = np.empty(RAW, np.uint8)
        with open(D + "/raw", "rb", buffering=0) as f:
            n_readinto = f.readinto(got["readinto"])
        got["csv"] = pd.read_csv(D + "/c.csv")
        got["recv"] = np.empty(RAW, np.uint8)
        n_recv = recv_all(sock, got["recv"])
    t.join()
    sock.close()
    same = {
        "npy": np.array_equal(got["npy"], ref["npy"]), "bin": np.array_equal(got["bin"], ref["bin"]),
        "pkl": got["pkl"]["ids"] == ref["pkl"]["ids"] and got["pkl"]["names"] == ref["pkl"]["names"]
               and np.array_equal(got["pkl"]["w"], ref["pkl"]["w"]),
        "raw": got["raw"] == ref["raw"], "readinto": n_readinto == RAW and got["readinto"].tobytes() == ref["raw"],
        "csv": got["csv"].equals(ref["csv"]), "recv": n_recv == RAW and got["recv"].tobytes() == ref["raw"],
    }
    inside = {
        "npy": region.contains(got["npy"].ctypes.data, got["npy"].nbytes),
        "bin": region.contains(got["bin"].ctypes.data, got["bin"].nbytes),
        "pkl": region.contains(got["pkl"]["w"].ctypes.data, got["pkl"]["w"].nbytes),
        "raw": region.contains(id(got["raw"]), len(got["raw"])),
        "readinto": region.contains(got["readinto"].ctypes.data, RAW),
        "csv": region.contains(got["csv"]["b"].to_numpy().ctypes.data),
        "recv": region.contains(got["recv"].ctypes.data, RAW),
    }
    return got, same, inside
"""


def test_every_loader_works_under_heap_in_a_forked_cluster_before_and_after_a_stage(tmp_path, write_protect):
    out = run_json(FILES.format(d=str(tmp_path)) + LOAD + """
import errno

res = {}
with clamor.Cluster(workers=2, progress=False) as cl:
    # outside any block, never written by the driver: system calls write them below, after stages
    old = [clamor.zeros(RAW // 8).view(np.uint8) for _ in range(3)]
    for phase in ("before", "after"):
        if phase == "after":
            assert cl.range(4, partitions=4).count() == 4          # a stage has run
        got, same, inside = load_all()
        # the tasks read what was loaded: arrays (the DataFrame's columns too), a dict, a bytes
        npy, bin_, pkl, raw, rd, recv = (got[k] for k in ("npy", "bin", "pkl", "raw", "readinto", "recv"))
        csv_b, csv_c = got["csv"]["b"].to_numpy(), got["csv"]["c"].to_numpy()
        tasks = cl.range(4, partitions=4).map(
            lambda i: answers(npy, bin_, pkl, raw, rd, csv_b, csv_c, recv, i)).collect()
        # the workers read the objects in place, not copies sent with the tasks
        where = cl.range(2, partitions=2).map(lambda i: [region.contains(id(pkl)), region.contains(id(raw))]).collect()
        res[phase] = {"same": same, "inside": inside, "tasks": tasks == want, "in_place": where}
        del got, npy, bin_, pkl, raw, rd, recv, csv_b, csv_c

    # system calls into region buffers that exist since before the stages
    sock, t = sender(ref["raw"])
    with open(D + "/raw", "rb", buffering=0) as f:
        syscalls = {}
        for name, call in (("readinto", lambda: f.readinto(old[0])),
                           ("readv", lambda: os.readv(f.fileno(), [old[1][: RAW // 2], old[1][RAW // 2:]])),
                           ("recv_into", lambda: recv_all(sock, old[2]))):
            f.seek(0)
            try:
                syscalls[name] = call() == RAW
            except OSError as e:
                syscalls[name] = errno.errorcode[e.errno]
    sock.close()
    t.join()
    o = old
    syscalls["tasks"] = cl.range(3, partitions=3).map(lambda i: o[i].tobytes() == ref["raw"]).collect()
    res["syscalls"] = syscalls
    res["mechanism"] = cl.stats()["write_protection"]["mechanism"]
print(json.dumps(res))
""", timeout=240)
    assert out["mechanism"] == write_protect
    for phase in ("before", "after"):
        r = out[phase]
        assert all(r["same"].values()), (phase, r["same"])        # each loader read its file
        assert all(r["inside"].values()), (phase, r["inside"])    # into region memory
        assert r["tasks"], phase                                   # and the workers read it right
        assert r["in_place"] == [[True, True]] * 2, phase
    if write_protect == "userfaultfd":
        # any system call may write into the region, into any page
        assert out["syscalls"] == {"readinto": True, "readv": True, "recv_into": True, "tasks": [True] * 3}
    else:
        # without it, a buffer not handed out in this stage's heap() needs clamor.readinto & co.
        assert out["syscalls"] == {"readinto": "EFAULT", "readv": "EFAULT", "recv_into": "EFAULT",
                                   "tasks": [False] * 3}


def test_the_first_import_of_a_module_under_heap_in_a_cluster_reads_its_files(tmp_path, write_protect):
    out = run_json(PRELUDE + """
assert "scipy.spatial" not in sys.modules
pts = np.random.default_rng(8).random((5_000, 2))
np.save(%r, pts)
res = {}
with clamor.Cluster(workers=2, progress=False) as cl:
    with clamor.heap():
        import scipy.spatial                     # (the import itself runs outside the region)
        loaded = np.load(%r)
        tree = scipy.spatial.cKDTree(loaded)
    res["in_region"] = region.contains(id(tree)) and region.contains(loaded.ctypes.data, loaded.nbytes)
    qs = [(i / 7.0, 1 - i / 9.0) for i in range(8)]
    res["driver"] = [tree.query(q, k=5)[1].tolist() for q in qs]
    res["mechanism"] = cl.stats()["write_protection"]["mechanism"]
# workers forked before the import do not have its extension loaded: a
# Cluster started after it queries the tree in place
with clamor.Cluster(workers=2, progress=False) as cl:
    res["tasks"] = cl.parallelize(qs, partitions=4).map(lambda q: tree.query(q, k=5)[1].tolist()).collect()
from scipy.spatial import cKDTree
plain = cKDTree(pts)
res["want"] = [plain.query(q, k=5)[1].tolist() for q in qs]
print(json.dumps(res))
""" % (str(tmp_path / "pts.npy"), str(tmp_path / "pts.npy")), timeout=240)
    assert out["mechanism"] == write_protect
    assert out["in_region"]
    assert out["driver"] == out["want"]
    assert out["tasks"] == out["want"]


@pytest.mark.usefixtures("same_host")
def test_a_stage_running_while_the_driver_loads_a_file_into_its_buffer_reads_the_old_bytes(tmp_path, write_protect):
    out = run_json(PRELUDE + f"""
D = {str(tmp_path)!r}
N = 1 << 18                                       # 2 MiB: 32 pages
new = np.random.default_rng(2).random(N)
new.tofile(D + "/new.bin")
buf = clamor.array(np.full(N, 1.0))               # the bytes the stage must read

def wait_for(path):
    deadline = time.monotonic() + 60
    while not os.path.exists(path):
        assert time.monotonic() < deadline, path
        time.sleep(0.01)

def task(i):
    open(D + f"/started-{{i}}", "w").close()
    wait_for(D + "/loaded")                       # reads only after the driver's load
    part = buf[i * (N // 4):(i + 1) * (N // 4)]
    return float(part.sum()), float(part[::997].sum())

def load():
    while len([f for f in os.listdir(D) if f.startswith("started-")]) < 2:
        time.sleep(0.01)                          # the stage is running, a task on each worker
    with clamor.heap(), open(D + "/new.bin", "rb", buffering=0) as f:
        if {write_protect!r} == "userfaultfd":
            n = f.readinto(buf)                   # the kernel writes the region
        else:
            n = clamor.readinto(f, buf)           # opens the pages first
    assert n == N * 8 and np.array_equal(buf, new)
    open(D + "/loaded", "w").close()

with clamor.Cluster(workers=2, progress=False, speculation=False) as cl:
    cl.range(2).count()
    t = threading.Thread(target=load)
    t.start()
    during = cl.range(4, partitions=4).map(task).collect()
    t.join()
    after = cl.range(4, partitions=4).map(lambda i: float(buf[i * (N // 4):(i + 1) * (N // 4)].sum())).collect()
    mech = cl.stats()["write_protection"]["mechanism"]
old = [(float(N // 4), float(len(range(0, N // 4, 997))))] * 4
print(json.dumps({{"mechanism": mech, "during_old": during == old,
                   "after": after == [float(new[i * (N // 4):(i + 1) * (N // 4)].sum()) for i in range(4)]}}))
""", timeout=240)
    assert out["mechanism"] == write_protect
    assert out["during_old"]        # the running stage never saw the bytes the file brought
    assert out["after"]             # the next stage sees all of them


DASK = """
import dask
from distributed import Client, LocalCluster
import clamor.dask

region.ensure()
cluster = LocalCluster(n_workers=2, threads_per_worker=2, processes=True, dashboard_address=":0",
                       worker_dashboard_address=":0", host="127.0.0.1")
client = Client(cluster)
clamor.dask.attach(client)                       # a stage begins: the region is write-protected from here
res = {}
for phase in ("before", "after"):
    got, same, inside = load_all()
    # region arrays travel by reference (the bytes object's, the DataFrame's columns and the
    # pickled dict's array too): the workers read them in place.  (The dict itself may come
    # from one of CPython's free lists, refilled by the client's threads: docs/limits.md.)
    npy, bin_, rd, recv, pkl = (got[k] for k in ("npy", "bin", "readinto", "recv", "pkl"))
    raw = np.frombuffer(got["raw"], np.uint8)
    csv_b, csv_c = got["csv"]["b"].to_numpy(), got["csv"]["c"].to_numpy()
    futs = client.map(lambda i: answers(npy, bin_, pkl, raw, rd, csv_b, csv_c, recv, i), range(4), pure=False)
    before = sum(s["pages_fetched"] + s["pages_mapped"] for s in client.run(clamor.stats).values())
    res[phase] = {"same": same, "inside": inside, "tasks": client.gather(futs) == want}
    res[phase]["read"] = sum(s["pages_fetched"] + s["pages_mapped"] for s in client.run(clamor.stats).values()) - before
    # the next loads write while these versions are kept: a new stage begins with the next graph
    assert client.submit(lambda a: float(a[-1]), npy, pure=False).result() == float(ref["npy"][-1])
    del got, npy, bin_, rd, recv, raw, csv_b, csv_c, pkl, futs
res["mechanism"] = region.write_protection()["mechanism"]
clamor.dask.detach(client)
client.close()
cluster.close()
print(json.dumps(res))
"""


def test_every_loader_works_under_heap_on_a_driver_attached_to_dask(tmp_path, write_protect):
    pytest.importorskip("distributed")
    out = run_json(FILES.format(d=str(tmp_path)) + LOAD + DASK, timeout=300)
    assert out["mechanism"] == write_protect
    for phase in ("before", "after"):
        r = out[phase]
        assert all(r["same"].values()), (phase, r["same"])
        assert all(r["inside"].values()), (phase, r["inside"])
        assert r["tasks"], phase
        assert r["read"] > 0, phase         # the workers read the region's pages, not copies
