"""Globals across stages: caching, driver updates, invalidation, versions."""
import json

import numpy as np
import pytest

from helpers import PRELUDE, flag_waiter

# Every test with workers that map the driver's pages and with workers that
# fetch them (conftest.same_host).
pytestmark = pytest.mark.usefixtures("same_host")


def test_listing3_kdtree_update_between_stages(py):
    """The paper's Listing 3: query a k-d tree, update it in place, query
    again, zip both results and take the argmin; equal to one process."""
    p = py(PRELUDE + """
sys.path.insert(0, "tests")
from kdtree_region import KDTree
rng = np.random.default_rng(7)
pts = rng.random((4000, 2)) * 100
queries = [tuple(q) for q in rng.random((60, 2)) * 100]
gone, new = pts[123], np.array([50.0, 50.0])
# queries next to the inserted point get a nearer neighbour after the update,
# those next to the erased one a farther one
queries += [(50.01, 50.02), (49.98, 50.01), tuple(gone + 0.001), tuple(gone - 0.002)]

# single process
ref = KDTree(pts)
ref1 = [ref.query(q, 3)[0][0] for q in queries]
ref.erase(gone); ref.insert(new)
ref2 = [ref.query(q, 3)[0][0] for q in queries]
expect = [int(np.argmin([a, b])) for a, b in zip(ref1, ref2)]

with clamor.Cluster(workers=2, progress=False) as cl:
    tree = KDTree(pts, alloc=clamor.array)
    qs = cl.parallelize(queries, partitions=6)
    res1 = qs.map(lambda q: tree.query(q, 3)[0][0]).cache()
    assert res1.count() == len(queries)             # computed at this version
    assert tree.erase(gone) and tree.insert(new)     # driver updates in place
    res2 = qs.map(lambda q: tree.query(q, 3)[0][0])
    got = res1.zip(res2).map(lambda ab: int(np.argmin(ab))).collect()
    st = cl.stats()
assert got == expect, (got, expect)
assert sum(expect) >= 2, "the update should bring some queries a nearer point"
assert ref2[-1] > ref1[-1], "the erased point should be gone for its neighbours"
print(json.dumps({"nearer_after_update": sum(expect), "queries": len(expect),
                  "pages_logged": st["driver"]["pages_logged"]}))
""", check=True, timeout=300)
    print(p.stdout)


def test_one_page_update_refetches_only_that_page(py):
    p = py(PRELUDE + """
a = clamor.array(np.arange(1 << 21, dtype=np.float64))     # 16 MiB, 256 pages of 64 KiB
ps = region.page_size()
with clamor.Cluster(workers=1, progress=False) as cl:
    def total(_):
        return float(a.sum()), clamor.stats()
    s1, st1 = cl.range(1, partitions=1).map(total).collect()[0]
    s1b, st1b = cl.range(1, partitions=1).map(total).collect()[0]
    a[12345] = -1.0                                             # one page changes
    s2, st2 = cl.range(1, partitions=1).map(total).collect()[0]
moved = lambda st: st["pages_fetched"] + st["pages_mapped"]   # over a socket, or mapped (same host)
refetched = moved(st2) - moved(st1b)
print(json.dumps({"first": moved(st1), "again": moved(st1b) - moved(st1),
                  "after_update": refetched, "invalidated": st2["pages_invalidated"]}))
assert s1 == s1b == float(np.arange(1 << 21, dtype=np.float64).sum())
assert s2 == s1 - 12345.0 - 1.0
assert moved(st1b) == moved(st1), "pages were fetched again without a change"
assert refetched == 1, refetched
assert st2["pages_invalidated"] == 1
""", check=True)
    print(p.stdout)


def test_write_back_of_identical_bytes_invalidates_nothing(py):
    py(PRELUDE + """
a = clamor.array(np.arange(1 << 20, dtype=np.float64))
with clamor.Cluster(workers=1, progress=False) as cl:
    f = lambda _: (float(a.sum()), clamor.stats()["pages_fetched"])
    s1, n1 = cl.range(1, partitions=1).map(f).collect()[0]
    a[100:200] = a[100:200].copy()                 # written, same bytes
    a[5000] += 1.0; a[5000] -= 1.0                 # went up and back down
    s2, n2 = cl.range(1, partitions=1).map(f).collect()[0]
    st = region.stats()
assert s1 == s2 and n1 == n2, (n1, n2)
assert st["pages_unchanged"] >= 1 and st["pages_logged"] >= 1
""", check=True)


def test_driver_write_during_a_running_stage_does_not_leak(py, tmp_path):
    """The driver writes the array while the stage's first tasks wait to
    read it (and before its later tasks start): every task of that stage
    reads the old bytes, the next stage the new ones."""
    py(PRELUDE + flag_waiter(tmp_path) + """
a = clamor.array(np.zeros(1 << 20))               # 8 MiB
with clamor.Cluster(workers=2, progress=False) as cl:
    def late_read(i):
        say(f"started-{i}")
        wait_for("written")                        # the driver writes meanwhile
        return float(a[i * 100000:(i + 1) * 100000].sum())
    def writer():
        deadline = time.monotonic() + 60
        while not any(f.startswith("started-") for f in os.listdir(flags)):
            assert time.monotonic() < deadline, "no task started"
            time.sleep(0.005)
        a[:] = 7.0
        say("written")
    t = threading.Thread(target=writer); t.start()
    got = cl.range(8, partitions=8).map(late_read).collect()
    t.join()
    assert got == [0.0] * 8, got                   # that stage saw the old version
    after = cl.range(8, partitions=8).map(lambda i: float(a[i * 100000:(i + 1) * 100000].sum())).collect()
    assert after == [700000.0] * 8, after           # the next stage sees the write
""", check=True, timeout=120)


def test_versions_are_dropped_and_shown_in_stats(py, same_host):
    p = py(PRELUDE + """
a = clamor.array(np.zeros(1 << 20))               # 128 pages
with clamor.Cluster(workers=1, progress=False) as cl:
    cl.range(2).count()
    a[:] = 1.0                                     # every page logged
    held = region.stats()["version_bytes"]
    cl.range(2).count()                            # a stage its one worker ran at: once it ends,
    after = region.stats()                         # nobody needs stage <= 1 any more
    cached = cl.range(4, partitions=2).map(lambda i: float(a[i])).cache()
    cached.count()                                 # a live partition computed at this stage
    a[:] = 2.0
    cl.range(2).count()
    kept = region.stats()["versions"]
    del cached
    import gc; gc.collect()
    cl.range(2).count(); cl.range(2).count()
    final = region.stats()["versions"]
print(json.dumps({"held": held, "after": after["versions"], "kept": kept, "final": final}))
assert held >= 128 * 65536
# A worker may read the stage it last ran at until its next task drops what
# changed (mapping: the old locations; fetching: between tasks, its
# collector visits region objects): those versions go once it has run a
# task of a later stage, as that stage ends.
assert after["versions"] == 0, after
assert kept >= 128, "versions a live cached partition may need were dropped"
assert final == 0, final
""", check=True)
    print(p.stdout)


@pytest.mark.fetch_path
@pytest.mark.parametrize("keep", [0, 16 << 20])
def test_invalidated_pages_give_memory_back_on_the_worker(py, keep):
    # A fetching worker keeps the copies of changed pages it held, for diffs,
    # up to diff_keep bytes (CLAMOR_DIFF_KEEP): the rest goes back.  (A worker
    # that maps holds no copies: test_log_ahead.py checks what it keeps.)
    py(f"KEEP = {keep}\n" + PRELUDE + """
a = clamor.array(np.ones(1 << 23))                 # 64 MiB
def shmem(pid):
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("RssShmem:"):
            return int(line.split()[1]) * 1024
with clamor.Cluster(workers=1, progress=False) as cl:
    pid = cl.worker_pids[0]
    cl.range(1, partitions=1).map(lambda _: float(a.sum())).collect()
    full = shmem(pid)
    a[:] = 2.0                                     # every page changes
    cl.range(1, partitions=1).map(lambda _: 0).collect()   # invalidates, reads nothing
    empty = shmem(pid)
assert full >= 60 << 20, full
assert empty < full - (56 << 20) + KEEP, (full, empty)
""", env={"CLAMOR_DIFF_KEEP": str(keep)}, check=True)


def test_driver_syscalls_into_write_protected_region(py, tmp_path, write_protect):
    # Under userfaultfd a read(2) into a protected page waits while the page's
    # version is logged; under mprotect it gets EFAULT, and clamor.readinto
    # opens the pages first.  Either way the next stage reads the new bytes.
    py(PRELUDE + f"""
import errno
with open("{tmp_path}/d.bin", "wb") as f:
    f.write(np.arange(8192, dtype=np.float64).tobytes())
a = clamor.array(np.zeros(1 << 16))
with clamor.Cluster(workers=1, progress=False) as cl:
    cl.range(1).count()                            # the region is write-protected now
    with open("{tmp_path}/d.bin", "rb", buffering=0) as f:
        try:
            f.readinto(a[:8192]); plain = "ok"
        except OSError as e:
            plain = e.errno
    assert plain == ("ok" if {write_protect!r} == "userfaultfd" else errno.EFAULT), plain
    assert a[8191] == (8191.0 if plain == "ok" else 0.0)
    with open("{tmp_path}/d.bin", "rb", buffering=0) as f:
        f.seek(8)
        n = clamor.readinto(f, a[8192:16383])
    assert n == 65528 and a[8192 + 8190] == 8191.0
    got = cl.range(1, partitions=1).map(lambda _: (float(a[:8192].sum()), float(a[8192:16383].sum()))).collect()[0]
    want = np.arange(8192).sum()
    assert got == ((float(want) if plain == "ok" else 0.0), float(want)), got
    assert cl.stats()["write_protection"]["mechanism"] == {write_protect!r}
""", check=True)


def test_a_skipped_task_still_drops_the_pages_it_carried(py, tmp_path):
    """The first task a worker gets at a new version carries the pages the
    driver changed.  A losing speculative copy keeps worker Y busy into the
    next stage; Y's task there is copied to another worker, which wins, and
    Y skips it unrun.  Y must still drop the changed pages, or it reads the
    old values in every later stage.  (The original returns once its copy
    has started; the copy, once the next stage is over.)"""
    p = py(PRELUDE + flag_waiter(tmp_path) + f"""
N = 1 << 20
a = clamor.array(np.zeros(N))
mark = {str(tmp_path / "mark")!r}
with clamor.Cluster(workers=3, progress=False) as cl:
    cl.range(12, partitions=12).map(lambda p: float(a.sum())).collect()
    def f(p):
        if p == 0:
            try:
                os.close(os.open(mark, os.O_CREAT | os.O_EXCL))
                wait_for("copied")                                      # the original
            except FileExistsError:
                say("copied")
                wait_for("summed")                                      # the losing copy
                say("done")
        return p
    cl.range(12, partitions=12).map(f).collect()
    a[:] = 1.0
    sums = cl.range(12, partitions=12).map(lambda p: float(a.sum())).collect()
    say("summed")
    wait_for("done")                               # Y is free again
    time.sleep(0.3)
    for _ in range(3):
        sums += cl.range(12, partitions=12).map(lambda p: float(a.sum())).collect()
    st = cl.stats()["recovery"]
print(json.dumps({{"wrong": sum(s != N for s in sums), "n": len(sums), "cancelled": st["copies_cancelled"]}}))
""", timeout=120)
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout.strip().splitlines()[-1])
    assert out["cancelled"] >= 1, out     # the scenario happened
    assert out["wrong"] == 0 and out["n"] == 48, out


def test_driver_writes_racing_with_stage_starts_all_reach_the_workers(py):
    """A driver thread writes region pages while the main thread begins
    stage after stage.  Once the writer has stopped, one more stage must see
    the driver's final bytes on every worker: a write fault that overlapped
    a stage start once logged its page where no stage looked (or reopened it
    just after the start closed it), and workers kept the old page for good.
    The race is timing-dependent: several rounds make it likely to show
    (five in each mode, workers that map and workers that fetch)."""
    p = py(PRELUDE + """
N = 1 << 20
a = clamor.array(np.zeros(N))
bad = []
with clamor.Cluster(workers=4, progress=False) as cl:
    for rnd in range(5):
        stop = threading.Event()
        def writer():
            k = rnd * 100000
            while not stop.is_set():
                k += 1
                i = (k * 7919) % (N - 50000)
                a[i:i + 50000] = k       # numpy releases the GIL for the copy
                time.sleep(0.001)
        t = threading.Thread(target=writer); t.start()
        for s in range(30):
            cl.range(8, partitions=8).map(lambda p: (float(a.sum()), time.sleep(0.01))).collect()
        stop.set(); t.join()
        exp = a.copy()
        got = cl.range(4, partitions=4).map(lambda p: a.copy()).collect()
        bad += [int((g != exp).sum()) for g in got]
print(json.dumps({"bad": bad}))
""", timeout=180)
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout.strip().splitlines()[-1])
    assert len(out["bad"]) == 20 and not any(out["bad"]), out


def test_a_losing_copy_reads_its_own_stage_after_the_next_one_began(py, tmp_path):
    """A straggler's losing copy goes on running after its action returned.
    When it reads a page the driver has changed since, and the driver has
    begun later stages, it must get its own stage's version: that version
    is kept while the copy runs (it was collected at the next stage start,
    and the worker died on the fault).  An array nobody changed reads fine
    at any old stage.  The original reads once two later stages have
    begun, and more begin while it runs."""
    p = py(PRELUDE + flag_waiter(tmp_path) + f"""
a = clamor.array(np.arange(1 << 20, dtype=np.float64))
b = clamor.array(np.arange(1 << 20, dtype=np.float64))
c = clamor.array(np.arange(1 << 20, dtype=np.float64))
mark = {str(tmp_path / "mark")!r}
seen = {str(tmp_path / "seen")!r}
def task(i):
    if i == 0:
        try:
            os.close(os.open(mark, os.O_CREAT | os.O_EXCL))
        except FileExistsError:
            return 0.0
        wait_for("go")                           # the copy elsewhere wins
        s = float(b.sum()) + float(c.sum())      # after later stages began
        with open(seen, "w") as f:
            f.write(repr(s))
        say("read")
    return float(a[i * 1000])
with clamor.Cluster(workers=4, progress=False) as cl:
    cl.range(4, partitions=4).map(lambda i: i).collect()
    r1 = cl.range(8, partitions=8).map(task).collect()
    a[:] += 1.0
    b[:] += 1.0
    rest = []
    for k in range(6):
        rest.append(cl.range(4, partitions=4).map(lambda i: float(a[i * 1000])).collect())
        if k == 1:
            say("go")
    wait_for("read")
    st = cl.stats()["recovery"]
print(json.dumps({{"r1": r1, "rest": rest, "lost": st["workers_lost"], "copies": st["speculative_copies"],
                  "seen": float(open(seen).read())}}))
""", timeout=120)
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout.strip().splitlines()[-1])
    assert out["copies"] >= 1, out                      # the scenario happened
    assert out["lost"] == 0, out
    assert out["r1"] == [float(i * 1000) for i in range(8)], out
    assert out["rest"] == [[float(i * 1000 + 1) for i in range(4)]] * 6, out
    s = float(np.arange(1 << 20, dtype=np.float64).sum())
    assert out["seen"] == 2 * s, out                    # b as the copy's stage saw it


def test_read_ahead_left_in_flight_for_pages_changed_before_the_next_task(py):
    """A task scans half an array, so that its read-ahead window grows to
    full size and reaches the array's end, and returns; the driver changes
    pages at the far end of the window and begins the next stage at once.
    The old stage's requests for those pages can only be refused (their
    version is gone); the next task, waiting on them, must get the new
    bytes by asking again, not die (a 200 MB/s page server keeps the
    requests in flight long enough)."""
    p = py(PRELUDE + """
RA = 64
clamor.configure(readahead=RA << 20)
a = clamor.array(np.ones(1 << 23, dtype=np.float64))
per = region.page_size() // 8
npg = a.size // per
first_page = (a.ctypes.data - region.base()) // region.page_size()
last = npg - 1
def start_scan(i):
    region.drop_pages(first_page, npg)
    return float(a[: npg // 2 * per].sum())
def read_window(i):
    return float(a[(last - 3 * i) * per])
wrong = 0
with clamor.Cluster(workers=2, progress=False, replication="off", speculation=False) as cl:
    for r in range(8):
        cl.range(2, partitions=2).map(start_scan).collect()
        a[[(last - 3 * i) * per for i in range(2)]] = r + 2.0
        wrong += cl.range(2, partitions=2).map(read_window).collect() != [r + 2.0] * 2
    lost = cl.stats()["recovery"]["workers_lost"]
print(json.dumps({"wrong": wrong, "lost": lost}))
""", timeout=180, env={"CLAMOR_SERVE_RATE": "200e6"})
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout.strip().splitlines()[-1])
    assert out == {"wrong": 0, "lost": 0}, out


def test_a_freed_span_reused_for_zeros_is_not_read_stale(py):
    """Freeing a large block punches its pages out of the memfd: they read
    zero at once, with no write fault.  A zero-filled array allocated there
    next (zeros writes zeros; calloc of punched pages writes nothing) must
    not leave workers with the freed array's bytes."""
    p = py(PRELUDE + """
N = 1 << 18
out = {}
with clamor.Cluster(workers=1, progress=False) as cl:
    for mode in ("zeros", "calloc", "half"):
        a = clamor.full(N, 7.0)
        addr = a.ctypes.data
        first = cl.range(1, partitions=1).map(lambda i: float(a.sum())).collect()[0]
        del a
        if mode == "zeros":
            b = clamor.zeros(N)
        elif mode == "calloc":
            b = clamor.view(clamor.calloc(N, 8), np.float64, N)
        else:
            b = clamor.empty(N); b[: N // 2] = 0; b[N // 2:] = 1.0
        got = cl.range(1, partitions=1).map(lambda i: float(b.sum())).collect()[0]
        out[mode] = [b.ctypes.data == addr, first, got, float(b.sum())]
        if mode == "calloc":
            clamor.free(b.ctypes.data)
        del b
print(json.dumps(out))
""", timeout=120)
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout.strip().splitlines()[-1])
    for mode, (same, first, got, want) in out.items():
        assert same and first == 7.0 * (1 << 18), (mode, out)     # the scenario happened
        assert got == want, (mode, out)


def test_invalidating_every_other_page_keeps_within_the_mapping_budget(py):
    """4 KiB pages: a worker holds an array as one run; the driver changes
    every other page.  Dropping them one by one split the run into more
    mappings than vm.max_map_count allows (65530, for a 320 MiB array), and
    the worker died.  Here a budget of 16384 mappings and a 128 MiB array
    (32768 pages, 16384 of them dropped) show the bound."""
    p = py(PRELUDE + """
region.init(size=1 << 30, page_size=4096)
NP = 32768
a = clamor.array(np.arange(NP * 512, dtype=np.int64))
def info(i):
    clamor.configure(max_mappings=16384)
    return int(a.sum()), clamor.stats()["mappings"], clamor.configure()["max_mappings"]
with clamor.Cluster(workers=1, progress=False, recover=False) as cl:
    first = cl.range(1, partitions=1).map(info).collect()[0]
    a[::1024] += 1
    second = cl.range(1, partitions=1).map(info).collect()[0]
print(json.dumps({"first": first, "second": second, "want": int(a.sum())}))
""", timeout=180)
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout.strip().splitlines()[-1])
    assert out["second"][0] == out["want"], out
    assert out["second"][2] == 16384, out
    assert out["second"][1] <= out["second"][2], out
