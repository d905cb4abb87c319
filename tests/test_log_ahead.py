"""Pages the driver rewrites at every version are logged as the version
begins (version.c, "logging ahead"): their copy and mapping happen in runs,
and the driver's writes to them take no fault.  A worker that maps the
driver's pages keeps the page tables of those it drops, and maps them
again with those tables when they come back to a location (park.c).

These tests are differential: a driver applies random update patterns to a
region array and to a plain numpy copy, and every stage's workers must read
exactly what the copy holds, with logging ahead on and off, under both
kinds of write protection, for workers that map the driver's pages (with
their page tables kept and not) and for workers that fetch them.  Pages logged ahead and then not written, written
back with their old bytes, or written while a stage runs, are all part of
the patterns.
"""
import textwrap

import pytest

from helpers import flag_waiter, scenario

DIFFERENTIAL = """
import hashlib
rng = np.random.default_rng(SEED)
n = 1 << 20                                # 8 MiB: 128 pages of 64 KiB
per_page = 8192
a = clamor.array(np.zeros(n))
want = np.zeros(n)
hot = rng.choice(128, 24, replace=False)   # pages rewritten at (almost) every stage
def digest(x):
    return hashlib.sha256(np.ascontiguousarray(x).tobytes()).hexdigest()
unparked = [0, 0]
def read(i):
    # a partition's digest, and one entry of every hot page
    part = a[i::2]
    return digest(part), [float(a[p * per_page + 5]) for p in hot], clamor.stats()["pages_unparked"]
mismatches = []
with clamor.Cluster(workers=2, progress=False, speculation=False, same_host=SAME_HOST) as cl:
    ds = cl.range(2, partitions=2)
    for stage in range(36):
        kind = stage % 6
        if kind != 3:                      # stage 3 of 6: hot pages left alone (logged ahead, unwritten)
            for p in hot:
                idx = p * per_page + rng.integers(0, per_page, 40)
                delta = rng.standard_normal(40)
                a[idx] += delta
                want[idx] += delta
        if kind == 4:                      # hot pages written back with their own bytes
            for p in hot[:6]:
                s = slice(p * per_page, (p + 1) * per_page)
                a[s] = want[s]
        idx = rng.integers(0, n, 30)       # scattered pages, most of them cold
        a[idx] = stage
        want[idx] = stage
        got = ds.map(read).collect()
        exp = [(digest(want[i::2]), [float(want[p * per_page + 5]) for p in hot]) for i in range(2)]
        if [list(g[:2]) for g in got] != [list(e) for e in exp]:
            mismatches.append(stage)
        unparked = [g[2] for g in got]
    modes = sorted(m["mode"] for m in cl.stats()["same_host"]["workers"].values())
st = region.stats()
print(json.dumps({"mismatches": mismatches, "modes": modes, "ahead": st["pages_logged_ahead"], "unparked": unparked,
                  "logged": st["pages_logged"], "mode": region.write_protection()["mechanism"]}))
"""


@pytest.mark.parametrize("ahead", ["1", "0"])   # (logging ahead and parking, both on or both off)
@pytest.mark.parametrize("protect", ["userfaultfd", "mprotect"])
@pytest.mark.parametrize("same_host", ["map", "fetch"])
def test_workers_read_what_one_process_computes_under_random_rewrites(ahead, protect, same_host):
    out = scenario(DIFFERENTIAL.replace("SEED", str(len(ahead + protect + same_host)))
                   .replace("SAME_HOST", repr(same_host)),
                   env={"CLAMOR_LOG_AHEAD": ahead, "CLAMOR_PARK": ahead, "CLAMOR_WRITE_PROTECT": protect},
                   timeout=300)
    assert out["mismatches"] == [], out
    assert out["mode"] == protect, out
    assert out["modes"] == [same_host, same_host], out
    if ahead == "1":
        # from the third stage on, the 24 hot pages are logged ahead at
        # nearly every version: most first writes took no fault
        assert out["ahead"] >= 24 * 20, out
        assert out["ahead"] * 2 > out["logged"], out
    else:
        assert out["ahead"] == 0, out
    # (a worker that maps, parking on, maps hot pages back with their page
    # tables: each worker reads every page, so each one does)
    if same_host == "map" and ahead == "1":
        assert min(out["unparked"]) > 0, out
    else:
        assert out["unparked"] == [0, 0], out


def test_a_stage_maps_pages_logged_ahead_and_never_sees_the_drivers_writes(tmp_path):
    # A page rewritten at every stage is logged ahead: written between
    # stages, as the stage before ends (its workers have moved on from the
    # version before, so the copy goes where that version was: two
    # locations, not three); written while a stage runs, as each stage
    # begins, once the page has had a third copy (the first such write
    # faults).  Its table entry names the copy the driver writes from the
    # next version on.  A task of this version still maps (not fetches) the
    # location of its own version, and a driver write made while it runs,
    # which takes no fault, is not seen by it; the next stage sees it.
    out = scenario(flag_waiter(tmp_path) + textwrap.dedent("""
    def memfd_bytes():                               # the driver's memory for the region
        for fd in os.listdir("/proc/self/fd"):
            try:
                if os.readlink(f"/proc/self/fd/{fd}").startswith("/memfd:clamor-region"):
                    return os.fstat(int(fd)).st_blocks * 512
            except OSError:
                pass
    a = clamor.array(np.zeros(1 << 20))              # 128 pages
    with clamor.Cluster(workers=1, progress=False, speculation=False) as cl:
        between = []
        for stage in range(1, 6):                    # every page changes between stages
            st0 = region.stats()
            a[::512] = stage
            st1 = region.stats()
            between.append(st1["pages_logged"] - st0["pages_logged"])
            assert cl.run(lambda _: float(a.sum()), 0)[0] == stage * 2048
        held = memfd_bytes()
        rounds = []
        for stage, value in ((6, 6.0), (7, 99.0)):   # and while a stage runs
            def task(_, value=value):
                st0 = clamor.stats()
                v0 = float(a[0])
                say(f"read{value}")
                wait_for(f"written{value}")
                st1 = clamor.stats()
                return [v0, float(a[0]), float(a.sum()), st1["pages_fetched"] - st0["pages_fetched"],
                        st1["pages_mapped"]]
            def writer(value=value):
                wait_for(f"read{value}")
                a[::512] = value
                say(f"written{value}")
            st0 = region.stats()
            t = threading.Thread(target=writer)
            t.start()
            during = cl.run(task, 0)[0]
            t.join()
            st = region.stats()
            rounds.append({"during": during, "ahead": st["pages_logged_ahead"] - st0["pages_logged_ahead"],
                           "faulted": (st["pages_logged"] - st["pages_logged_ahead"])
                                      - (st0["pages_logged"] - st0["pages_logged_ahead"])})
        after = cl.run(lambda _: [float(a[0]), float(a.sum())], 0)[0]
    print(json.dumps({"between": between, "rounds": rounds, "after": after, "held": held, "nbytes": a.nbytes}))
    """), timeout=180)
    # between stages: from the third on, the pages were logged ahead as the
    # stage before ended, and the writes took no fault
    assert out["between"][2:] == [0, 0, 0], out
    # and the array lies in two locations, not three (the rest of the
    # region's memory is a few pages)
    assert out["nbytes"] * 2 <= out["held"] < out["nbytes"] * 2.5, out
    first, second = out["rounds"]
    for r, before in ((first, 5.0), (second, 6.0)):
        v0, again, total, fetched, mapped = r["during"]
        assert v0 == again == before, out
        assert total == before * 2048, out
        assert fetched == 0 and mapped > 0, out
    # the second time, the stage's pages were logged ahead as it began (into
    # the third copies the first time made), and the write took no fault
    assert second["ahead"] >= 128, out
    assert second["faulted"] == 0, out
    assert out["after"] == [99.0, 99.0 * 2048], out


def test_a_mapping_worker_keeps_page_tables_not_memory_and_lets_go_when_the_driver_frees():
    # A worker that maps the driver's pages keeps, at each version, the page
    # tables of the pages it drops (csrc/park.c), and maps the next
    # version's pages with them when they come back to a location it parked.
    # Those tables point at the driver's memory, never at a copy of the
    # worker's own: once the driver frees the global (and the versions it
    # kept of it), the worker's shared memory falls back to nothing.
    out = scenario("""
    import gc
    def shmem(pid):
        for line in open(f"/proc/{pid}/status"):
            if line.startswith("RssShmem:"):
                return int(line.split()[1]) << 10
    a = clamor.array(np.ones(1 << 23))                 # 64 MiB, 1024 pages
    seen = []
    with clamor.Cluster(workers=1, progress=False, speculation=False, same_host="map") as cl:
        pid = cl.worker_pids[0]
        for stage in range(6):                         # every page rewritten at every stage
            a[:] = stage
            seen.append(cl.run(lambda _: [float(a.sum()), clamor.stats()["pages_parked"],
                                          clamor.stats()["pages_unparked"]], 0)[0])
        held = shmem(pid)
        del a
        gc.collect()
        for _ in range(3):                             # the versions kept of it go too
            cl.run(lambda _: 0, 0)
        after = shmem(pid)
    print(json.dumps({"seen": seen, "held": held, "after": after}))
    """, timeout=180)
    sums = [s for s, _, _ in out["seen"]]
    assert sums == [float(stage * (1 << 23)) for stage in range(6)], out
    parked, unparked = out["seen"][-1][1:]
    # each stage parks the 1024 pages it drops; from the fourth stage on the
    # pages come back to locations parked three stages before
    assert parked >= 1024 * 5 and unparked >= 1024 * 2, out
    assert out["held"] >= 60 << 20, out
    assert out["after"] < 4 << 20, out
