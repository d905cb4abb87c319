"""Workers on the driver's host map its pages (same_host="map").

Each test runs a driver in a subprocess (helpers.run_py).  The pages a
worker maps are the driver's memory: these tests check that no driver
write made while a stage runs reaches that stage, that a worker's writes
stay its own, that old locations are freed and mappings stay bounded over
many stages, and that a worker that cannot map falls back to fetching and
says why.
"""
import json

import pytest

from helpers import PRELUDE, flag_waiter


def test_a_driver_write_while_a_stage_runs_is_not_seen_by_it(py, tmp_path):
    # The worker maps page 0, the driver writes it and a page the worker has
    # not touched yet while the task waits, and the task reads both again:
    # the old bytes, from the location it mapped and from the version the
    # driver kept.  The next stage sees the writes.  Spawned and forked.
    p = py(PRELUDE + flag_waiter(tmp_path) + f"""
out = {{}}
for method in ("fork", "spawn"):
    for f in os.listdir(flags):
        os.unlink(os.path.join(flags, f))
    a = clamor.array(np.ones(1 << 21))           # 16 MiB: 256 pages
    far = 1 << 20                                # 8 MiB on: another window
    def task(r):
        x = r.get()
        v0 = float(x[0])
        open(os.path.join(flags, "read"), "w").close()
        wait_for("written")
        return v0, float(x[0]), float(x[far]), float(x[1]), clamor.stats()["pages_mapped"]
    with clamor.Cluster(workers=1, start_method=method, progress=False, speculation=False) as cl:
        def writer():
            wait_for("read")
            a[0] = 2.0
            a[far] = 3.0
            open(os.path.join(flags, "written"), "w").close()
        t = threading.Thread(target=writer)
        t.start()
        during = cl.run(task, clamor.ref(a))[0]
        t.join()
        after = cl.run(lambda r: (float(r.get()[0]), float(r.get()[far])), clamor.ref(a))[0]
        modes = cl.stats()["same_host"]["workers"]
    out[method] = [during, after, sorted(m["mode"] for m in modes.values())]
    del a
print(json.dumps(out))
""", check=True, timeout=240)
    out = json.loads(p.stdout.strip().splitlines()[-1])
    for method, (during, after, modes) in out.items():
        assert modes == ["map"], (method, modes)
        v0, again, far, other, mapped = during
        assert (v0, again, far, other) == (1.0, 1.0, 1.0, 1.0), (method, during)
        assert mapped > 0, (method, during)
        assert after == [2.0, 3.0], (method, after)


def test_a_workers_private_write_never_reaches_the_driver_or_another_worker(py):
    p = py(PRELUDE + """
a = clamor.array(np.arange(1 << 20, dtype=np.float64))   # 8 MiB
with clamor.Cluster(workers=2, progress=False, speculation=False) as cl:
    w0, w1 = cl.worker_pids
    def scribble(r):
        x = r.get()
        if os.getpid() != w0:
            return None
        x[:1000] = -7.0                          # pages it maps: now its own copies
        return float(x[:1000].sum()), float(x[1000:].sum())
    def look(r):
        x = r.get()
        return os.getpid(), float(x[:1000].sum()), clamor.stats()["pages_mapped"]
    mine = [v for v in cl.run(scribble, clamor.ref(a)) if v is not None]
    seen = cl.run(look, clamor.ref(a))
    driver = float(a[:1000].sum())
print(json.dumps({"mine": mine, "seen": seen, "driver": driver, "w0": w0}))
""", check=True)
    out = json.loads(p.stdout.strip().splitlines()[-1])
    want = float(sum(range(1000)))
    assert out["mine"][0][0] == -7000.0
    assert out["driver"] == want, "a worker's write reached the driver"
    for pid, head, mapped in out["seen"]:
        assert mapped > 0
        # the writer keeps its copy for this version; the other never sees it
        assert head == (-7000.0 if pid == out["w0"] else want), out


def test_many_threads_faulting_one_page_map_it_once(py):
    py(PRELUDE + """
a = clamor.array(np.arange(1 << 22, dtype=np.int64))   # 32 MiB, 512 pages
with clamor.Cluster(workers=1, progress=False, speculation=False) as cl:
    def f(r):
        x = r.get()
        n = 32
        barrier = threading.Barrier(n)
        out = [None] * n
        def reader(i):
            barrier.wait()
            out[i] = int(x[(i * 37 % 512) * 8192 + i])     # many pages, several threads each window
        threads = [threading.Thread(target=reader, args=(i,)) for i in range(n)]
        [t.start() for t in threads]; [t.join() for t in threads]
        st = clamor.stats()
        return out, st["pages_mapped"], st["pages_fetched"], st["fetch_errors"]
    out, mapped, fetched, errs = cl.run(f, clamor.ref(a))[0]
assert out == [(i * 37 % 512) * 8192 + i for i in range(32)], out
assert fetched == 0 and errs == 0, (fetched, errs)
# no page is mapped twice: at most the array's pages (and one more at each end)
assert 0 < mapped <= 514, mapped
""", check=True)


def test_many_stages_of_sparse_updates_free_old_versions_and_bound_mappings(py):
    # 200 stages, each writing a few scattered pages of a 32 MiB table that
    # two workers read whole: every stage is exact, the driver holds a
    # bounded number of versions, and the mappings of the driver and of the
    # workers stay bounded (pages move between their home and their twin,
    # and a group moves together).  The 1200 pages written are more
    # than the bound on mappings (about two per page of the table), and
    # cover most pages.
    p = py(PRELUDE + """
def maps(pid="self"):
    with open(f"/proc/{pid}/maps") as f:
        return sum(1 for _ in f)
rng = np.random.default_rng(7)
n = 1 << 22                                       # 32 MiB: 512 pages
a = clamor.array(rng.integers(0, 1000, n))
want = a.copy()
worst = {"versions": 0, "version_bytes": 0, "driver_maps": 0, "worker_maps": 0, "worker_mappings": 0}
with clamor.Cluster(workers=2, progress=False, speculation=False) as cl:
    pids = cl.worker_pids
    base_maps = maps()
    for stage in range(200):
        idx = rng.integers(0, n, 6)
        a[idx] += 1
        want[idx] += 1
        got = cl.range(2, partitions=2).map(lambda i: (int(a[i::2].sum()), clamor.stats()["mappings"])).collect()
        assert [g for g, _ in got] == [int(want[0::2].sum()), int(want[1::2].sum())], stage
        st = region.stats()
        worst["versions"] = max(worst["versions"], st["versions"])
        worst["version_bytes"] = max(worst["version_bytes"], st["version_bytes"])
        worst["driver_maps"] = max(worst["driver_maps"], maps() - base_maps)
        worst["worker_maps"] = max(worst["worker_maps"], *(maps(p) for p in pids))
        worst["worker_mappings"] = max(worst["worker_mappings"], *(m for _, m in got))
    modes = sorted(m["mode"] for m in cl.stats()["same_host"]["workers"].values())
    mapped = cl.stats()["bytes_mapped"]
print(json.dumps({"worst": worst, "modes": modes, "mapped": mapped}))
""", check=True, timeout=600)
    out = json.loads(p.stdout.strip().splitlines()[-1])
    w = out["worst"]
    assert out["modes"] == ["map", "map"]
    assert out["mapped"] > 0
    # a stage changes at most 6 pages; versions live for about two stages
    assert w["versions"] <= 24, w
    # after 200 stages the pages written sit at home or twin, scattered:
    # each costs the driver about two mappings, and at most 512 pages exist
    assert w["driver_maps"] <= 2 * 512 + 64, w
    assert w["worker_maps"] <= 2 * 512 + 400, w
    assert w["worker_mappings"] <= 2 * 512 + 2, w


def test_the_mapping_budget_holds_with_pages_at_scattered_locations(py):
    # Every other page of the table is moved to its twin by a write, so a
    # worker reading it all maps one run per page; with a budget of 64
    # mappings the worker copies old runs into its own memory and closes
    # them (eviction), and still reads exactly.
    p = py(PRELUDE + """
a = clamor.array(np.arange(1 << 21, dtype=np.int64))   # 16 MiB, 256 pages
with clamor.Cluster(workers=1, progress=False, speculation=False) as cl:
    cl.range(1, partitions=1).map(lambda _: 0).collect()  # stages begin: writes from now on move pages
    a[::16384] += 1                                       # every other page (8192 int64 per page)
    def f(_):
        clamor.configure(max_mappings=64)
        s = int(a.sum())
        st = clamor.stats()
        return s, st["mappings"], st["evictions"], st["pages_mapped"]
    got = cl.range(1, partitions=1).map(f).collect()[0]
print(json.dumps({"got": got, "want": int(a.sum())}))
""", check=True)
    out = json.loads(p.stdout.strip().splitlines()[-1])
    s, mappings, evictions, mapped = out["got"]
    assert s == out["want"]
    assert mapped >= 256 and evictions > 0, out
    assert mappings <= 64, out


def test_forced_fetch_and_a_bad_mode(py):
    p = py(PRELUDE + """
a = clamor.array(np.arange(1 << 20, dtype=np.float64))
try:
    clamor.Cluster(workers=1, same_host="shared")
except clamor.ConfigError as err:
    bad = str(err)
with clamor.Cluster(workers=1, progress=False, same_host="fetch") as cl:
    s, st = cl.run(lambda r: (float(r.get().sum()), clamor.stats()), clamor.ref(a))[0]
    info = cl.stats()
print(json.dumps({"bad": bad, "s": s, "mapped": st["pages_mapped"], "fetched": st["pages_fetched"],
                  "same_host": info["same_host"], "bytes_mapped": info["bytes_mapped"]}))
""", check=True)
    out = json.loads(p.stdout.strip().splitlines()[-1])
    assert "same_host must be one of" in out["bad"]
    assert out["s"] == float(sum(range(1 << 20)))
    assert out["mapped"] == 0 and out["fetched"] >= 128 and out["bytes_mapped"] == 0
    assert out["same_host"]["mode"] == "fetch"
    (w,) = out["same_host"]["workers"].values()
    assert w == {"mode": "fetch", "reason": "the cluster was made with same_host='fetch'"}


@pytest.mark.parametrize("offer, why", [
    ({"pid": 999999999, "fd": 3, "cookie": "00" * 16}, "not a process this worker can see"),
    ("self-wrong-cookie", "not this cluster's region"),
    ("self-bad-fd", "cannot open"),
    ({"pid": "x"}, "malformed"),
])
def test_a_worker_that_cannot_map_says_why_and_fetches(py, offer, why):
    # The offer names a process and a descriptor: a wrong one is refused with
    # its reason, and the worker reads through its page server as before.
    p = py(PRELUDE + f"""
from clamor.memory import samehost
offer = {offer!r}
a = clamor.array(np.arange(1 << 20, dtype=np.float64))
region.serve()
good = samehost.info()
if offer == "self-wrong-cookie":
    offer = dict(good, cookie="11" * 16)
elif offer == "self-bad-fd":
    offer = dict(good, fd=987)
r, w = os.pipe()
pid = os.fork()
if pid == 0:
    os.close(r)
    ok = samehost.attach(offer)
    region.set_version(1)
    res = {{"ok": ok, "status": samehost.status(), "sum": float(a.sum()), "st": clamor.stats()}}
    os.write(w, json.dumps(res).encode())
    os._exit(0)
os.close(w)
data = b""
while chunk := os.read(r, 1 << 16):
    data += chunk
os.waitpid(pid, 0)
print(data.decode())
""", check=True)
    out = json.loads(p.stdout.strip().splitlines()[-1])
    assert out["ok"] is False
    assert out["status"]["mode"] == "fetch" and why in out["status"]["reason"], out["status"]
    assert out["sum"] == float(sum(range(1 << 20)))
    assert out["st"]["pages_mapped"] == 0 and out["st"]["pages_fetched"] > 0


@pytest.mark.parametrize("cached", [False, True])
def test_the_driver_moves_pages_back_home_to_bound_its_own_mappings(py, cached):
    # Scattered single-element writes leave pages at their twins, each one
    # splitting the driver's view.  With a budget of 256 mappings the driver
    # moves pages back home at stage begins (workers that map drop them),
    # and every stage still reads exactly.  A collection cached at the first
    # stage keeps that stage's versions, at the pages' homes: those move to
    # the pool once no worker maps them, and the pages still go home.
    p = py(PRELUDE + f"""
cached = {cached!r}
def maps():
    with open("/proc/self/maps") as f:
        return sum(1 for _ in f)
rng = np.random.default_rng(11)
n = 1 << 22                                       # 32 MiB: 512 pages
a = clamor.array(np.zeros(n, dtype=np.int64))
want = np.zeros(n, dtype=np.int64)
clamor.configure(max_mappings=256)
worst = 0
with clamor.Cluster(workers=2, progress=False, speculation=False) as cl:
    if cached:
        kept = cl.range(4, partitions=2).map(lambda i: i * 2).cache()
        kept.collect()
    base = maps()
    for stage in range(50):
        idx = rng.integers(0, n, 12)
        a[idx] += stage + 1
        want[idx] += stage + 1
        got = cl.range(2, partitions=2).map(lambda i: int(a[i::2].sum())).collect()
        assert got == [int(want[0::2].sum()), int(want[1::2].sum())], stage
        worst = max(worst, maps() - base)
    modes = sorted(m["mode"] for m in cl.stats()["same_host"]["workers"].values())
st = region.stats()
print(json.dumps({{"worst": worst, "compacted": st["pages_compacted"], "modes": modes}}))
""", check=True, timeout=300)
    out = json.loads(p.stdout.strip().splitlines()[-1])
    assert out["modes"] == ["map", "map"]
    assert out["compacted"] > 0, out
    # about 360 pages written once or more (compaction every few stages); at
    # most 64 left away from home (2 mappings each), and the few a stage writes
    assert out["worst"] <= 2 * 64 + 2 * 12 + 16, out


def test_a_task_of_an_older_stage_keeps_reading_its_stage_after_pages_move_home(py):
    # A page moved back home at stage 3 (compaction) is mapped by a task still
    # running at stage 2 (a straggler, a lineage re-run).  The driver then
    # writes the page twice, with stage 2 kept: the task must read its
    # stage's bytes all along, through its mapping and after a fetch.
    p = py(PRELUDE + """
from clamor.memory import samehost
import struct
region.ensure(); region.serve()
samehost.share(True)                # children forked from now on map the driver's pages
clamor.configure(max_mappings=8)    # compaction with two pages away from home
ps = region.page_size()
per = ps // 8
a = clamor.array(np.full(4 * per, 1.0))
first = (a.ctypes.data - region.base()) // ps
region.version_begin(1)
a[0] = 2.0; a[per] = 2.0            # the pages move to their twins
region.version_begin(2); region.versions_keep([2])
region.version_begin(3)               # and back home
region.versions_keep([2, 3])
compacted = region.stats()["pages_compacted"]
r1, w1 = os.pipe(); r2, w2 = os.pipe()
pid = os.fork()
if pid == 0:                        # a worker still running a task of stage 2
    clamor.configure(max_mappings=0)
    region.set_version(2)
    before = float(a[0])
    os.write(w1, b"x")
    os.read(r2, 1)
    after = float(a[0])
    region.drop_pages(first, 1)
    fetched = float(a[0])
    os.write(w1, json.dumps([before, after, fetched]).encode())
    os._exit(0)
os.read(r1, 1)
a[0] = 5.0
region.version_begin(4)
region.versions_keep([2, 4])        # stage 2 is kept: the task still runs
a[0] = 7.0                          # a location freed now would be reused here
os.write(w2, b"x")
got = json.loads(os.read(r1, 4096))
os.waitpid(pid, 0)
print(json.dumps({"compacted": compacted, "got": got}))
""", check=True)
    out = json.loads(p.stdout.strip().splitlines()[-1])
    assert out["compacted"] >= 1, out
    assert out["got"] == [2.0, 2.0, 2.0], out
