"""Dynamic replication: workers serve the pages they hold to each other."""
import errno
import json

import pytest

from helpers import PRELUDE

# Workers that map the driver's pages (same host) hold none of their own to
# serve: these run with workers that fetch (conftest.same_host, fetch_path).
pytestmark = [pytest.mark.usefixtures("same_host"), pytest.mark.fetch_path]

PRE = PRELUDE


def test_policies_move_load_off_the_driver_with_equal_results(py):
    p = py(PRE + """
a = clamor.array(np.arange(1 << 22, dtype=np.float64))       # 32 MiB
want = float(a.sum())
out = {}
for pol in ("off", "random", "two-choices"):
    with clamor.Cluster(workers=4, progress=False, replication=pol) as cl:
        got = cl.range(8, partitions=8).map(lambda i: float(a.sum())).collect()
        assert got == [want] * 8, (pol, got)
        st = cl.stats()
        out[pol] = {"driver": st["replication"]["bytes_served_by_driver"], "peers": st["bytes_from_peers"],
                    "redirects": st["replication"]["redirects"], "hit": st["replication"]["redirect_hit_rate"]}
    # (no reset between clusters: each reports what was served since it started)
print(json.dumps(out))
""", check=True, timeout=300)
    out = json.loads(p.stdout.strip().splitlines()[-1])
    assert out["off"]["peers"] == 0 and out["off"]["redirects"] == 0
    for pol in ("random", "two-choices"):
        assert out[pol]["peers"] > 0 and out[pol]["redirects"] > 0, out
        assert out[pol]["driver"] < out["off"]["driver"], out
        assert out[pol]["hit"] > 0.5, out


def test_peers_never_serve_a_changed_page(py):
    py(PRE + """
a = clamor.array(np.zeros(1 << 20))                          # 8 MiB
with clamor.Cluster(workers=4, progress=False, replication="random") as cl:
    s = cl.range(8, partitions=8).map(lambda i: float(a.sum())).collect()
    assert s == [0.0] * 8
    for round_ in range(1, 4):
        a[::4096] = round_                                      # one write per page
        got = cl.range(8, partitions=8).map(lambda i: float(a.sum())).collect()
        assert got == [256.0 * round_] * 8, (round_, got)
    assert cl.stats()["bytes_from_peers"] > 0
""", check=True, timeout=300)


def test_a_dead_holder_falls_back_to_the_driver(py):
    p = py(PRE + """
a = clamor.array(np.arange(1 << 20, dtype=np.float64))       # 8 MiB
want = float(a.sum())
with clamor.Cluster(workers=3, progress=False, replication="random") as cl:
    holder = cl.worker_pids[0]
    # only worker w0 reads the array: it becomes the holder of every page
    def read(i):
        return float(a.sum()) if i == 0 else 0.0
    cl.range(1, partitions=1).map(read).collect()
    os.kill(holder, signal.SIGKILL)
    time.sleep(1.5)                                            # the cluster notices and drops it
    t = time.time()
    got = cl.range(4, partitions=4).map(lambda i: (float(a.sum()), clamor.stats()["peer_fallbacks"])).collect()
    took = time.time() - t
print(json.dumps({"sums": [g[0] for g in got], "fallbacks": sum(g[1] for g in got), "took": took}))
""", check=True, timeout=300)
    out = json.loads(p.stdout.strip().splitlines()[-1])
    assert out["sums"] == [float(sum(range(1 << 20)))] * 4, out
    # the cluster noticed the death before the stage and the directory forgot
    # the peer: nobody was sent to it (a request sent to a dead peer waits a
    # second before it goes back to the driver)
    assert out["took"] < 1.0, out


def test_a_holder_that_lost_its_copy_sends_requesters_back_to_the_driver(py):
    p = py(PRE + """
a = clamor.array(np.arange(1 << 20, dtype=np.float64))       # 8 MiB
with clamor.Cluster(workers=3, progress=False, replication="random") as cl:
    def read_and_forget(i):
        s = float(a.sum())
        region.drop_pages(0, region.size() // region.page_size())   # the driver is not told
        return s
    holder = cl.range(1, partitions=1).map(lambda i: (read_and_forget(i), os.getpid())).collect()[0][1]
    def read_late_on_holder(i):
        if os.getpid() == holder:
            time.sleep(1.0)          # the others ask first, and are sent to the holder
        return float(a.sum()), clamor.stats()["peer_fallbacks"]
    got = cl.range(6, partitions=6).map(read_late_on_holder).collect()
    st = cl.stats()
print(json.dumps({"sums": [g[0] for g in got], "fallbacks": max(g[1] for g in got),
                  "redirects": st["replication"]["redirects"]}))
""", check=True, timeout=300)
    out = json.loads(p.stdout.strip().splitlines()[-1])
    assert out["sums"] == [float(sum(range(1 << 20)))] * 6, out
    assert out["redirects"] > 0 and out["fallbacks"] > 0, out


def test_hints_send_later_fetches_straight_to_a_peer(py):
    p = py(PRE + """
a = clamor.array(np.arange(1 << 22, dtype=np.float64))       # 32 MiB, 512 pages
per = region.page_size() // 8
npg = a.size // per
want = float(a[::per].sum())
def touch(i):
    order = np.random.default_rng(i).permutation(npg)          # random order: no read-ahead
    return float(sum(a[int(k) * per] for k in order))
out = {}
for pol in ("random", "two-choices"):
    with clamor.Cluster(workers=4, progress=False, replication=pol) as cl:
        got = cl.range(8, partitions=8).map(touch).collect()
        st = cl.stats()
    out[pol] = {"ok": got == [want] * 8, "direct": st["replication"]["direct_requests"],
                "redirects": st["replication"]["redirects"], "peer_pages": st["bytes_from_peers"] // region.page_size(),
                "hit": st["replication"]["redirect_hit_rate"]}
print(json.dumps(out))
""", check=True, timeout=300)
    out = json.loads(p.stdout.strip().splitlines()[-1])
    for pol, o in out.items():
        assert o["ok"], out
        # the driver's hints carried most peer fetches: they skipped the driver
        assert o["direct"] > 0 and o["direct"] > o["redirects"], out
        assert o["peer_pages"] >= o["direct"] // 2 and o["hit"] > 0.5, out


def test_a_peer_serves_a_direct_request_only_in_its_own_stage(py):
    p = py(PRE + """
import ctypes, struct, zmq
HDR = struct.Struct("<IBBHIIQII")
GET, DIRECT = 1, 8
a = clamor.array(np.arange(1 << 17, dtype=np.float64))       # 1 MiB, 16 pages
ps = region.page_size()
page = (a.ctypes.data - region.base()) // ps
with clamor.Cluster(workers=1, progress=False, replication="random") as cl:
    def hold(i):
        region.set_version(777)                                  # as if it ran stage 777
        return float(a[0]), region.server_endpoint()
    (v, ep), = cl.range(1, partitions=1).map(hold).collect()
    from clamor.runtime.security import Security
    s = zmq.Context.instance().socket(zmq.DEALER)
    Security(cl.secret).client(s)                              # a member of the cluster, as a peer is
    s.connect(ep)
    out = {}
    for name, stage, idx in [("older", 776, page), ("newer", 778, page), ("same", 777, page),
                             ("not held", 777, page + 8)]:
        s.send(HDR.pack(0x524D4C43, 1, GET, DIRECT, 0, stage, idx, 1, 9))
        assert s.poll(5000), name
        fr = s.recv_multipart()
        _, _, t, _, st, *_ = HDR.unpack(fr[0])
        out[name] = [t, st, fr[1] == ctypes.string_at(region.base() + idx * ps, ps)]
    s.close(0)
print(json.dumps(out))
""", check=True, timeout=300)
    out = json.loads(p.stdout.strip().splitlines()[-1])
    PAGES, ERROR = 2, 3
    assert out["older"][:2] == [ERROR, errno.ESTALE], out
    assert out["newer"][:2] == [ERROR, errno.ESTALE], out
    assert out["same"] == [PAGES, 0, True], out
    assert out["not held"][:2] == [ERROR, errno.EAGAIN], out


def test_stats_keep_what_a_lost_peer_served(py):
    p = py(PRE + """
a = clamor.array(np.arange(1 << 22, dtype=np.float64))       # 32 MiB
with clamor.Cluster(workers=3, progress=False, replication="random") as cl:
    for _ in range(2):
        cl.range(6, partitions=6).map(lambda i: float(a.sum())).collect()
    cl.range(3, partitions=3).map(lambda i: i).collect()      # every worker reports its counters
    before = cl.stats()["replication"]["bytes_served_by_peer"]
    top = max(before, key=before.get)
    os.kill(cl._pid_of[top.encode()], signal.SIGKILL)
    time.sleep(1.0)
    cl.range(3, partitions=3).map(lambda i: i).collect()      # the loss is noticed
    after = cl.stats()
print(json.dumps({"before": before, "top": top, "after": after["replication"]["bytes_served_by_peer"],
                  "lost": after["recovery"]["workers_lost"]}))
""", check=True, timeout=300)
    out = json.loads(p.stdout.strip().splitlines()[-1])
    assert out["lost"] == 1 and out["before"][out["top"]] > 0, out
    assert out["after"][out["top"]] == out["before"][out["top"]], out


def test_a_replacement_taking_a_lost_peers_number_costs_no_peer_timeouts(py):
    """Workers die between stages and replacements take their peer numbers.
    Hints naming such a number went over a socket still connected to the
    dead peer, and each such request waited a second for it."""
    p = py(PRE + """
a = clamor.zeros(1 << 21, dtype=np.float64)                # 16 MiB
per = region.page_size() // 8
npg = a.size // per
a[::per] = np.arange(npg)
def touch(i, st):
    clamor.configure(readahead=0)
    order = np.random.default_rng(i * 7919 + st).permutation(npg)
    return float(sum(a[int(k) * per] for k in order))
want = float(np.arange(npg).sum())
wrong = 0
with clamor.Cluster(workers=4, progress=False, replication="random", speculation=False) as cl:
    for st in range(8):
        if st and st % 2 == 0:
            os.kill(cl.worker_pids[st % 4], signal.SIGKILL)
            time.sleep(0.3)
        got = cl.range(8, partitions=8).map(lambda i, st=st: touch(i, st)).collect()
        wrong += sum(g != want for g in got)
        cl.range(4, partitions=4).map(lambda i: clamor.region.drop_pages(0, npg)).collect()
    s = cl.stats()
print(json.dumps({"wrong": wrong, "lost": s["recovery"]["workers_lost"], "timeouts": s["replication"]["peer_timeouts"],
                  "peers": s["bytes_from_peers"]}))
""", check=True, timeout=300)
    out = json.loads(p.stdout.strip().splitlines()[-1])
    assert out["lost"] == 3 and out["peers"] > 0, out      # the scenario happened
    assert out["wrong"] == 0 and out["timeouts"] == 0, out
