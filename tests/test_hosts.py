"""Clusters across hosts: a real driver in the root namespace with two forked
workers, and two workers started by hand on namespace hosts
(clamor/testing/nethosts.py), each in a PID namespace of its own, so that the driver
knows them only by their connection and heartbeats.  Links are limited to
1 gbit/s.  Each scenario runs in a driver subprocess of its own, and every
figure it computes on the cluster is compared with what plain Python
computes in the same script.
"""
import textwrap

from helpers import scenario
from clamor.testing.nethosts import require_hosts

# What every driver script shares (after helpers.PRELUDE): hosts, workers on
# them, and where a task ran.
HOSTS = """
import secrets, subprocess, sys, threading
sys.path.insert(0, "tests")
import psutil
from clamor.testing.nethosts import Hosts

UNSHARE = ["unshare", "--pid", "--fork", "--mount-proc"]

def remote(hosts, i, endpoint, secret, *extra):
    # a worker on host i, in a PID namespace of its own
    env = {**os.environ, "CLAMOR_SECRET": secret}
    return hosts[i].popen(UNSHARE + [sys.executable, "-m", "clamor.worker", endpoint, *extra], env=env,
                          stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)

def worker_pid(p, timeout=15):
    # the worker process under `unshare --fork`, by its pid in the root namespace
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        kids = psutil.Process(p.pid).children()
        if kids:
            return kids[0].pid
        time.sleep(0.02)
    raise RuntimeError("the remote worker process did not start")

def cluster(hosts, workers=2, remote_hosts=(0, 1), **kw):
    kw.setdefault("start_timeout", 60)
    cl = clamor.Cluster(workers=workers, remote=len(remote_hosts), listen=f"{hosts.root_addr}:*",
                        progress=False, **kw)
    cl.join_command()                              # the control socket: cl.endpoint
    procs = [remote(hosts, i, cl.endpoint, cl.secret) for i in remote_hosts]
    cl.start()
    return cl, procs

def here():
    # the host a task runs on: its network namespace
    return os.stat("/proc/self/ns/net").st_ino

def names(hosts):
    # network namespace -> "root", "h0", "h1", ...
    out = {os.stat("/proc/self/ns/net").st_ino: "root"}
    for h in hosts:
        out[os.stat(f"/run/netns/{h.name}").st_ino] = f"h{h.index}"
    return out

def wait_workers(cl, n, timeout=30):
    # the driver reads its socket (joins, losses) during actions: run small
    # ones, not pinned to a worker (each must still be exact), until n are
    # live: worker_pids counts one still starting too, cl.run only live ones
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if len(cl.worker_pids) == n and len(cl.run(os.getpid)) == n:
            break
        got = cl.range(8, partitions=8).map(lambda x: time.sleep(0.02) or x * x).sum()
        if got != 140:
            raise AssertionError(f"sum of squares below 8: {got}")
    return len(cl.run(os.getpid))

def finish(cl, procs):
    cl.close()
    return [p.wait(15) for p in procs]
"""


def run(*parts, timeout=150, env=None):
    """The driver script made of ``parts`` (after HOSTS), run in its own
    interpreter: the JSON of its last line."""
    require_hosts()
    return scenario("".join(textwrap.dedent(p) for p in (HOSTS,) + parts), timeout=timeout, env=env)


# A keyed job over region arrays whose every value records the hosts its
# elements were read on (map side) and the host that reduced it.
SHUFFLE = """
def keyed_job(cl, keys, vals, n, parts=12, reducers=10, slow=0.0, on_reduce=None):
    def tag(it):
        h = here()
        time.sleep(slow)
        return [(int(keys[i]), (int(vals[i]), frozenset([h]))) for i in it]
    def reduced(it):
        if on_reduce is not None:
            on_reduce()
        h = here()
        return [(k, v, sorted(s), h) for k, (v, s) in it]
    return (cl.range(n, partitions=parts).map_partitions(tag)
            .reduce_by_key(lambda a, b: (a[0] + b[0], a[1] | b[1]), partitions=reducers)
            .map_partitions(reduced).collect())

def plain_sums(keys, vals):
    want = {}
    for k, v in zip(keys.tolist(), vals.tolist()):
        want[k] = want.get(k, 0) + v
    return want

def summary(rows, where):
    # {key: sum}, the hosts the map side read on, the hosts that reduced
    got = {}
    dup = 0
    for k, v, _, _ in rows:
        dup += k in got
        got[k] = v
    return {"sums": {str(k): v for k, v in got.items()}, "dup": dup,
            "map_hosts": sorted({where[h] for _, _, s, _ in rows for h in s}),
            "reduce_hosts": sorted({where[h] for _, _, _, h in rows})}
"""


def test_a_shuffle_across_hosts_equals_plain_python():
    out = run(SHUFFLE, """
        rng = np.random.default_rng(11)
        n = 120_000
        keys = clamor.array(rng.integers(0, 4000, n))
        vals = clamor.array(rng.integers(-10**12, 10**12, n))
        want = plain_sums(keys, vals)
        want_groups = {}
        for k, v in zip(keys.tolist(), vals.tolist()):
            want_groups.setdefault(k, []).append(v)
        with Hosts(2, rate="1gbit") as hosts:
            where = names(hosts)
            cl, procs = cluster(hosts)
            res = summary(keyed_job(cl, keys, vals, n, slow=0.05), where)
            groups = (cl.range(n, partitions=16).map(lambda i: (int(keys[i]), int(vals[i])))
                      .group_by_key(partitions=9).map_values(sorted).collect())
            res["groups_equal"] = dict(groups) == {k: sorted(v) for k, v in want_groups.items()}
            res["groups_len"] = [len(groups), len(want_groups)]
            res["count"] = cl.range(n, partitions=8).filter(lambda i: keys[i] % 7 == 3).count()
            res["want_count"] = int((keys % 7 == 3).sum())
            res["lost"] = cl.stats()["recovery"]["workers_lost"]
            res["codes"] = finish(cl, procs)
        res["want"] = {str(k): v for k, v in want.items()}
        print(json.dumps(res))
    """)
    assert out["sums"] == out["want"] and out["dup"] == 0
    assert out["groups_equal"], out["groups_len"]
    assert out["count"] == out["want_count"]
    # the shuffle crossed hosts: both sides ran on the root and on both namespace hosts
    assert out["map_hosts"] == ["h0", "h1", "root"], out["map_hosts"]
    assert out["reduce_hosts"] == ["h0", "h1", "root"], out["reduce_hosts"]
    assert out["lost"] == 0 and out["codes"] == [0, 0]


def test_a_driver_update_between_stages_reaches_every_host():
    out = run("""
        import hashlib
        rng = np.random.default_rng(5)
        n = 1 << 20                                         # 8 MiB: 128 pages of 64 KiB
        a = clamor.array(rng.integers(-10**15, 10**15, n))
        digest = lambda: hashlib.sha256(memoryview(a).cast("B")).hexdigest()
        parts = lambda: cl.range(32, partitions=16).map(lambda p: int(a[p * (n // 32):(p + 1) * (n // 32)].sum())).collect()
        plain_parts = lambda: [int(a[p * (n // 32):(p + 1) * (n // 32)].sum()) for p in range(32)]
        where_of = lambda: cl.run(here)
        res = {}
        with Hosts(2, rate="1gbit") as hosts:
            where = names(hosts)
            cl, procs = cluster(hosts)
            res["where"] = [where[h] for h in where_of()]
            # stage 1: every worker reads every page
            res["s1"] = [cl.run(digest), digest(), parts(), plain_parts()]
            # the driver changes elements on several pages (each worker holds them all),
            # one element per changed page plus a whole page's worth
            idx = np.concatenate([np.arange(3, n, n // 16), np.arange(40_000, 48_192)])
            a[idx] = rng.integers(-10**15, 10**15, idx.size)
            a[-1] += 1
            res["s2"] = [cl.run(digest), digest(), parts(), plain_parts()]
            res["elements"] = [cl.run(lambda: a[idx].tolist()), a[idx].tolist()]
            # stage 3: no update, the same again
            res["s3"] = [cl.run(digest), digest(), parts(), plain_parts()]
            # a second update, on one page only, after a stage with none
            a[n // 2] = 12345
            res["s4"] = [cl.run(digest), digest(), parts(), plain_parts()]
            res["lost"] = cl.stats()["recovery"]["workers_lost"]
            res["same_host"] = sorted((m["mode"], m["reason"]) for m in cl.stats()["same_host"]["workers"].values())
            res["codes"] = finish(cl, procs)
        print(json.dumps(res))
    """)
    assert sorted(out["where"]) == ["h0", "h1", "root", "root"]
    for s in ("s1", "s2", "s3", "s4"):
        got, want, got_parts, want_parts = out[s]
        assert got == [want] * 4, (s, out["where"], got, want)
        assert got_parts == want_parts, s
    assert out["s2"][1] != out["s1"][1] and out["s3"][1] == out["s2"][1] and out["s4"][1] != out["s3"][1]
    got, want = out["elements"]
    assert got == [want] * 4
    assert out["lost"] == 0 and out["codes"] == [0, 0]
    # the driver's host maps, the namespace hosts fetch and say why: one
    # cluster of both kinds, each reading what the driver wrote
    modes = out["same_host"]
    assert [m for m, _ in modes] == ["fetch", "fetch", "map", "map"], modes
    assert all(why for m, why in modes if m == "fetch"), modes      # another namespace, or unseen driver


def test_remote_workers_serve_pages_to_peers_across_hosts():
    out = run("""
        import hashlib
        rng = np.random.default_rng(3)
        n = 4 << 20                                         # 32 MiB: 512 pages
        a = clamor.array(rng.integers(0, 2**62, n))
        digest = lambda: hashlib.sha256(memoryview(a).cast("B")).hexdigest()
        res = {"rounds": []}
        with Hosts(2, rate="1gbit") as hosts:
            where = names(hosts)
            cl, procs = cluster(hosts)                      # replication: "two-choices" by default
            res["policy"] = cl.stats()["replication"]["policy"]
            at = [where[h] for h in cl.run(here)]
            res["where"] = at
            remote_ix = [i for i, w in enumerate(at) if w != "root"]
            for r in range(4):
                # a remote worker reads it first, then every worker reads it, then again
                first = cl.run(digest, workers=[remote_ix[r % 2]])
                every = cl.run(digest)
                again = cl.run(lambda: int(a[::97].sum()))
                res["rounds"].append([first, every, again, digest(), int(a[::97].sum())])
                a[r * 100_000:r * 100_000 + 20_000] += 1     # pages every worker holds change
            st = cl.stats()
            # bytes_served_by_peer is keyed by worker id; cl.run's order is the workers' id order
            served = st["replication"]["bytes_served_by_peer"]
            wids = sorted(served, key=lambda w: int(w[1:]))
            res["served"] = {w: served[w] for w in wids}
            res["served_at"] = {w: at[i] for i, w in enumerate(wids)}
            res["from_peers"] = st["bytes_from_peers"]
            res["from_driver"] = st["bytes_from_driver"]
            res["timeouts"] = st["replication"]["peer_timeouts"]
            res["lost"] = st["recovery"]["workers_lost"]
            res["codes"] = finish(cl, procs)
        print(json.dumps(res))
    """)
    assert out["policy"] == "two-choices"
    assert sorted(out["where"]) == ["h0", "h1", "root", "root"]
    for first, every, again, want, want_again in out["rounds"]:
        assert first == [want] and every == [want] * 4 and again == [want_again] * 4
    assert len(out["served"]) == 4, out["served"]
    assert out["from_peers"] > 0, out
    remote_served = {w: b for w, b in out["served"].items() if out["served_at"][w] != "root"}
    assert len(remote_served) == 2 and max(remote_served.values()) > 0, out
    assert sum(out["served"].values()) == out["from_peers"], out
    assert out["lost"] == 0 and out["codes"] == [0, 0]


# A job whose reduce side (after the shuffle) marks its start in a file
# named after its host and then sleeps, so that a thread of the driver can
# strike a remote host while that host runs a task of the stage.  The marks
# go to MARKS, the test's tmp_path (see strike()).
STRIKE = SHUFFLE + """
marks = os.environ["MARKS"]
def mark():
    open(os.path.join(marks, f"{here()}.{os.getpid()}.{time.monotonic_ns()}"), "w").close()
    time.sleep(0.4)

def strike_when_busy(victim_ns, strike, timeout=60):
    # a thread: strike once a task of the stage has started on the victim's host
    done = {}
    def watch():
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if any(f.startswith(f"{victim_ns}.") for f in os.listdir(marks)):
                strike()
                done["at"] = time.monotonic()
                return
            time.sleep(0.005)
    t = threading.Thread(target=watch, daemon=True)
    t.start()
    return t, done
"""


def strike(body, tmp_path):
    """The driver script STRIKE + ``body``, its marks in ``tmp_path``."""
    return run(STRIKE, body, env={"MARKS": str(tmp_path)})


def test_a_remote_worker_killed_mid_stage_is_recovered_from_lineage(tmp_path):
    out = strike("""
        rng = np.random.default_rng(23)
        n = 80_000
        keys = clamor.array(rng.integers(0, 3000, n))
        vals = clamor.array(rng.integers(-10**9, 10**9, n))
        want = plain_sums(keys, vals)
        with Hosts(2, rate="1gbit") as hosts:
            where = names(hosts)
            victim_ns = {v: k for k, v in where.items()}["h1"]
            cl, procs = cluster(hosts, heartbeat_timeout=5)
            victim = worker_pid(procs[1])
            t, done = strike_when_busy(victim_ns, lambda: os.kill(victim, signal.SIGKILL))
            t0 = time.monotonic()
            res = summary(keyed_job(cl, keys, vals, n, parts=12, reducers=16, on_reduce=mark), where)
            res["returned_after_kill"] = "at" in done and time.monotonic() > done["at"]
            res["took"] = time.monotonic() - t0
            res["victim_gone"] = not psutil.pid_exists(victim) or psutil.Process(victim).status() == psutil.STATUS_ZOMBIE
            res["rec"] = cl.stats()["recovery"]
            res["workers_after"] = len(cl.worker_pids)
            res["where_after"] = sorted(where[h] for h in cl.run(here))
            # the next action, on the three left
            res["next"] = summary(keyed_job(cl, keys, vals, n, parts=9, reducers=7), where)
            res["codes"] = finish(cl, procs)
        res["want"] = {str(k): v for k, v in want.items()}
        print(json.dumps(res))
    """, tmp_path)
    assert out["returned_after_kill"] and out["victim_gone"], out["took"]
    assert out["sums"] == out["want"] and out["dup"] == 0
    rec = out["rec"]
    assert rec["workers_lost"] >= 1, rec
    assert rec["tasks_rerun"] + rec["recovery_jobs"] >= 1, rec
    assert rec["workers_replaced"] == 0, rec           # a remote worker is not replaced
    assert out["workers_after"] == 3 and out["where_after"] == ["h0", "root", "root"]
    assert out["next"]["sums"] == out["want"] and out["next"]["dup"] == 0
    assert "h1" not in out["next"]["map_hosts"] + out["next"]["reduce_hosts"]
    assert out["codes"][0] == 0


def test_a_host_deleted_mid_stage_leaves_the_others_to_finish(tmp_path):
    out = strike("""
        rng = np.random.default_rng(29)
        n = 80_000
        keys = clamor.array(rng.integers(0, 3000, n))
        vals = clamor.array(rng.integers(-10**9, 10**9, n))
        want = plain_sums(keys, vals)
        with Hosts(2, rate="1gbit") as hosts:
            where = names(hosts)
            victim_ns = {v: k for k, v in where.items()}["h0"]
            cl, procs = cluster(hosts, heartbeat_timeout=3)
            t, done = strike_when_busy(victim_ns, hosts[0].delete)
            t0 = time.monotonic()
            res = summary(keyed_job(cl, keys, vals, n, parts=12, reducers=16, on_reduce=mark), where)
            res["returned_after_delete"] = "at" in done and time.monotonic() > done["at"]
            res["took"] = time.monotonic() - t0
            res["deleted"] = hosts[0].deleted and hosts[0].name not in subprocess.run(
                ["ip", "netns", "list"], capture_output=True, text=True).stdout
            res["rec"] = cl.stats()["recovery"]
            res["workers_after"] = len(cl.worker_pids)
            res["where_after"] = sorted(where[h] for h in cl.run(here))
            res["next"] = summary(keyed_job(cl, keys, vals, n, parts=9, reducers=7), where)
            b = clamor.array(np.arange(1 << 20))
            res["run_after"] = [cl.run(lambda: int(b.sum())), int(b.sum())]
            res["code"] = finish(cl, procs[1:])
        res["want"] = {str(k): v for k, v in want.items()}
        print(json.dumps(res))
    """, tmp_path)
    assert out["returned_after_delete"] and out["deleted"], out["took"]
    assert out["sums"] == out["want"] and out["dup"] == 0
    assert out["rec"]["workers_lost"] >= 1 and out["rec"]["workers_replaced"] == 0, out["rec"]
    assert out["workers_after"] == 3 and out["where_after"] == ["h1", "root", "root"]
    assert out["next"]["sums"] == out["want"] and out["next"]["dup"] == 0
    assert out["next"]["map_hosts"] == ["h1", "root"], out["next"]
    got, want = out["run_after"]
    assert got == [want] * 3
    assert out["code"] == [0]


def test_a_remote_worker_started_before_the_driver_and_one_that_takes_a_lost_ones_place():
    out = run(SHUFFLE, """
        rng = np.random.default_rng(31)
        n = 60_000
        keys = clamor.array(rng.integers(0, 2500, n))
        vals = clamor.array(rng.integers(-10**9, 10**9, n))
        want = plain_sums(keys, vals)
        pidns = lambda: os.stat("/proc/self/ns/pid").st_ino
        res = {}
        with Hosts(2, rate="1gbit") as hosts:
            where = names(hosts)
            with socket.socket() as s:                      # a port of the root address, free now
                s.bind((hosts.root_addr, 0))
                port = s.getsockname()[1]
            secret = secrets.token_urlsafe(32)
            endpoint = f"tcp://{hosts.root_addr}:{port}"
            early = remote(hosts, 0, endpoint, secret, "--connect-timeout", "60")
            time.sleep(2.0)                                 # it retries: nobody listens yet
            res["early_waiting"] = early.poll() is None
            cl = clamor.Cluster(workers=2, remote=2, listen=f"{hosts.root_addr}:{port}", secret=secret,
                                progress=False, start_timeout=60)
            res["endpoint"] = [cl.join_command(), f"clamor worker {endpoint}"]
            second = remote(hosts, 1, cl.endpoint, cl.secret)
            cl.start()
            res["first"] = summary(keyed_job(cl, keys, vals, n, slow=0.05), where)
            # the second one is lost; a third, started by hand while the cluster runs, takes its place
            os.kill(worker_pid(second), signal.SIGKILL)
            res["after_loss"] = wait_workers(cl, 3)
            third = remote(hosts, 1, cl.endpoint, cl.secret)
            third_ns = os.stat(f"/proc/{worker_pid(third)}/ns/pid").st_ino
            res["after_join"] = wait_workers(cl, 4)
            res["pidns"] = [third_ns, cl.run(pidns)]
            res["third_in_run"] = third_ns in res["pidns"][1]
            # a later stage: the third worker gets tasks of it
            def tag_pidns(it):
                time.sleep(0.05)
                return [(pidns(), int(keys[i]), int(vals[i])) for i in it]
            rows = cl.range(n, partitions=16).map_partitions(tag_pidns).collect()
            res["third_ran"] = sum(1 for r in rows if r[0] == third_ns)
            res["rows_exact"] = [(k, v) for _, k, v in rows] == list(zip(keys.tolist(), vals.tolist()))
            res["later"] = summary(keyed_job(cl, keys, vals, n, slow=0.05), where)
            res["rec"] = cl.stats()["recovery"]
            res["codes"] = finish(cl, [early, third])
            second.wait(15)
        res["want"] = {str(k): v for k, v in want.items()}
        print(json.dumps(res))
    """)
    assert out["early_waiting"]
    assert out["endpoint"][0] == out["endpoint"][1]
    assert out["first"]["sums"] == out["want"] and out["first"]["dup"] == 0
    assert out["first"]["map_hosts"] == ["h0", "h1", "root"]          # the early one worked
    assert out["after_loss"] == 3 and out["after_join"] == 4
    assert out["third_in_run"] and out["third_ran"] > 0, (out["pidns"], out["third_ran"])
    assert out["rows_exact"]
    assert out["later"]["sums"] == out["want"] and out["later"]["dup"] == 0
    assert out["rec"]["workers_lost"] == 1 and out["rec"]["workers_replaced"] == 0, out["rec"]
    assert out["codes"] == [0, 0]


def test_region_python_objects_are_refused_for_remote_workers_and_nothing_breaks():
    out = run("""
        with clamor.heap():
            d = {"k": list(range(1000)), "name": "region"}
        res = {"addr": hex(id(d))}
        a = clamor.array(np.arange(1 << 20, dtype=np.int64) * 3)
        with Hosts(2, rate="1gbit") as hosts:
            where = names(hosts)
            cl, procs = cluster(hosts)
            pids = cl.worker_pids
            res["run"] = attempt(cl.run, lambda: sum(d["k"]))
            res["map"] = attempt(lambda: cl.range(100, partitions=8).map(lambda i: d["k"][i]).collect())
            res["same_pids"] = [cl.worker_pids == pids, len(pids)]
            res["getpid"] = [cl.run(os.getpid), cl.worker_pids]
            res["where"] = sorted(where[h] for h in cl.run(here))
            res["arrays"] = [cl.run(lambda: int(a.sum())), int(a.sum())]
            res["job"] = [cl.range(0, 1 << 20, 7, partitions=12).map(lambda i: int(a[i])).sum(), int(a[::7].sum())]
            res["rec"] = cl.stats()["recovery"]
            res["codes"] = finish(cl, procs)
        print(json.dumps(res))
    """, env={"PYTHONHASHSEED": None})    # (a driver without a seed: its dicts do not hash the same elsewhere)
    for k in ("run", "map"):
        kind, msg, typed = out[k]
        assert kind == "NotShareable" and typed, out[k]
        assert f"region dict at {out['addr']}" in msg, msg
    assert out["same_pids"] == [True, 4]
    got, pids = out["getpid"]
    assert got == pids and len(got) == 4 and got.count(1) == 2          # the remote ones are pid 1 in theirs
    assert out["where"] == ["h0", "h1", "root", "root"]
    got, want = out["arrays"]
    assert got == [want] * 4
    assert out["job"][0] == out["job"][1]
    assert out["rec"]["workers_lost"] == 0
    assert out["codes"] == [0, 0]


def test_a_driver_idle_longer_than_the_heartbeat_timeout_keeps_its_remote_workers():
    """Workers heartbeat all along; a driver that computes on its own
    between two actions for longer than ``heartbeat_timeout`` has their
    heartbeats queued on its socket, and must not take them for lost (a
    remote worker lost is lost for good: nothing replaces it)."""
    out = run("""
        n = 1 << 20
        a = clamor.array(np.arange(n, dtype=np.int64) * 3)
        want = [int(a[p::64].sum()) for p in range(64)]
        res = {}
        with Hosts(2, rate="1gbit") as hosts:
            where = names(hosts)
            cl, procs = cluster(hosts, heartbeat_timeout=1)
            res["before"] = [sorted(where[h] for h in cl.run(here)), cl.run(lambda: int(a.sum())), int(a.sum())]
            time.sleep(1.8)                                 # the driver busy with something else
            res["after"] = cl.range(64, partitions=16).map(lambda p: int(a[p::64].sum())).collect() == want
            res["where_after"] = sorted(where[h] for h in cl.run(here))
            res["rec"] = cl.stats()["recovery"]
            res["alive"] = [p.poll() is None for p in procs]
            cl.close()
        print(json.dumps(res))
    """)
    where, got, want = out["before"]
    assert where == ["h0", "h1", "root", "root"] and got == [want] * 4
    assert out["after"]
    assert out["rec"]["workers_lost"] == 0, out["rec"]
    assert out["where_after"] == ["h0", "h1", "root", "root"], out
