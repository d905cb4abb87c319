"""Workers not forked from the driver: spawned by the Cluster
(start_method="spawn") or started by hand (``remote``), joining with
JOIN/WELCOME and then speaking the runtime's protocol; and Cluster.run,
a call on each worker."""
import pytest

from helpers import scenario, shadow_numpy

# (indented as the scenarios are: they are dedented together)
HAND = """
        import subprocess, sys
        def by_hand(cl, *extra):
            return subprocess.Popen([sys.executable, "-m", "clamor.worker", "--driver", cl.endpoint, *extra],
                                    stderr=subprocess.PIPE, text=True, env={**os.environ, "CLAMOR_SECRET": cl.secret})
"""


def test_spawned_workers_compute_what_forked_workers_and_one_process_compute():
    out = scenario("""
        rng = np.random.default_rng(7)
        a = clamor.array(rng.integers(-10**9, 10**9, 1 << 20))
        idx = rng.integers(0, a.size, (16, 500))
        def job(cl):
            first = cl.parallelize(list(range(16)), 8).map(lambda i: int(a[idx[i]].sum())).collect()
            a[idx[3]] += 1        # an update between stages reaches every worker
            second = cl.parallelize(list(range(16)), 8).map(lambda i: int(a[idx[i]].sum())).collect()
            a[idx[3]] -= 1
            return first + second
        local = [int(a[idx[i]].sum()) for i in range(16)]
        a[idx[3]] += 1
        local += [int(a[idx[i]].sum()) for i in range(16)]
        a[idx[3]] -= 1
        res = {"one process": local}
        for method in ("fork", "spawn"):
            with clamor.Cluster(workers=2, start_method=method, progress=False) as cl:
                res[method] = job(cl)
                res[method + " pids"] = cl.worker_pids
        res["me"] = os.getpid()
        print(json.dumps(res))
        """)
    assert out["fork"] == out["one process"]
    assert out["spawn"] == out["one process"]
    assert len(set(out["spawn pids"])) == 2 and out["me"] not in out["spawn pids"]


def test_region_python_objects_go_in_place_to_workers_that_can_relocate_them_only():
    """A spawned worker maps the region at the driver's address and uses a
    region dict in place (the same id); a hand-started one at another base
    cannot, and the driver refuses to ship it there, naming the worker."""
    out = scenario(HAND + """
        with clamor.heap():
            d = {"k": list(range(100))}
        res = {"addr": hex(id(d))}
        with clamor.Cluster(workers=1, start_method="spawn", progress=False) as cl:
            res["spawned"] = cl.run(lambda: (hex(id(d)), sum(d["k"])))
        cl = clamor.Cluster(workers=0, remote=1, progress=False, start_timeout=60)
        cl.join_command()                     # (binds the endpoint)
        p = by_hand(cl, "--base", hex(0x300000000000))
        cl.start()
        res["elsewhere"] = attempt(cl.run, lambda: sum(d["k"]))
        res["map"] = attempt(lambda: cl.range(4).map(lambda i: d["k"][i]).collect())
        a = clamor.zeros(10); a[:] = 4
        res["array afterwards"] = cl.run(lambda: float(a.sum()))
        cl.close()
        p.wait(30)
        print(json.dumps(res))
        """, env={"PYTHONHASHSEED": "0"})
    assert out["spawned"] == [[out["addr"], 4950]]
    for k in ("elsewhere", "map"):
        kind, msg, typed = out[k]
        assert kind == "NotShareable" and typed, out[k]
        assert f"region dict at {out['addr']}" in msg and "w0" in msg and "another address" in msg, msg
    assert out["array afterwards"] == [40.0]


def test_a_worker_not_forked_refuses_a_region_object_that_reaches_it_anyway():
    """The worker's own guard, behind the driver's: an offset to a region
    object is refused with NotShareable, never dereferenced."""
    out = scenario("""
        from clamor.runtime import serialize
        with clamor.heap():
            d = {"k": 1}
        blob = serialize.dumps(d)
        res = {"forked view": serialize.loads(blob) is d}
        serialize.objects_in_place(False)
        res["not forked"] = attempt(serialize.loads, blob)
        print(json.dumps(res))
        """)
    assert out["forked view"] is True
    assert out["not forked"][0] == "NotShareable" and out["not forked"][2]


def test_a_worker_started_by_hand_joins_and_the_next_one_is_refused():
    out = scenario(HAND + """
        cl = clamor.Cluster(workers=1, remote=1, progress=False, start_timeout=30)
        res = {"command": cl.join_command()}
        p = by_hand(cl)
        cl.start()
        a = clamor.zeros(1 << 16); a[:] = 3
        res["run"] = cl.run(lambda: (os.getpid(), float(a.sum())))
        res["hand pid"], res["pids"] = p.pid, cl.worker_pids
        extra = by_hand(cl)
        deadline = time.monotonic() + 30
        while extra.poll() is None and time.monotonic() < deadline:
            res["while it waits"] = cl.range(100).sum()   # the driver answers JOIN while it reads its socket
        res["extra rc"] = extra.wait(5)
        res["extra says"] = extra.stderr.read().strip().splitlines()
        cl.close()
        res["hand rc"] = p.wait(30)
        print(json.dumps(res))
        """)
    assert out["command"].startswith("clamor worker tcp://127.0.0.1:")
    pids = [r[0] for r in out["run"]]
    assert out["hand pid"] in pids and sorted(pids) == sorted(out["pids"])
    assert [r[1] for r in out["run"]] == [3.0 * (1 << 16)] * 2
    assert out["while it waits"] == 4950
    assert out["extra rc"] == 2
    assert len(out["extra says"]) == 1 and "refused" in out["extra says"][0] and "no more workers" in out["extra says"][0]
    assert out["hand rc"] == 0      # stopped by close()


def test_start_says_who_joined_and_how_the_others_join():
    out = scenario("""
        cl = clamor.Cluster(workers=1, remote=2, progress=False, start_timeout=2)
        cmd = cl.join_command()
        res = {"start": attempt(cl.start), "command": cmd}
        print(json.dumps(res))
        """)
    kind, msg, typed = out["start"]
    assert kind == "WorkerLost" and typed
    assert "1 of 1 local workers started" in msg and "0 of 2 remote workers joined" in msg
    assert out["command"] in msg


def test_a_lost_remote_worker_leaves_its_place_to_the_next_one():
    out = scenario(HAND + """
        cl = clamor.Cluster(workers=1, remote=1, progress=False, start_timeout=30)
        cl.join_command()
        first = by_hand(cl)
        cl.start()
        res = {"before": sorted(cl.run(os.getpid))}
        first.kill(); first.wait()
        time.sleep(1.0)
        res["sum while one is lost"] = cl.range(10).sum()
        second = by_hand(cl)
        deadline = time.monotonic() + 30
        while len(cl.run(os.getpid)) < 2 and time.monotonic() < deadline:
            time.sleep(0.2)                 # (the driver reads JOIN and HELLO while it runs)
        res["after"] = sorted(cl.run(os.getpid))
        res["first"], res["second"] = first.pid, second.pid
        res["lost"] = cl.stats()["recovery"]["workers_lost"]
        cl.close()
        second.wait(30)
        print(json.dumps(res))
        """)
    assert out["first"] in out["before"] and out["first"] not in out["after"]
    assert out["second"] in out["after"] and len(out["after"]) == 2
    assert out["sum while one is lost"] == 45
    assert out["lost"] == 1


def test_spawned_workers_are_replaced_and_die_with_their_driver():
    out = scenario("""
        res = {}
        with clamor.Cluster(workers=2, start_method="spawn", progress=False) as cl:
            victim = cl.worker_pids[0]
            os.kill(victim, signal.SIGKILL)
            res["sum"] = cl.range(1000, partitions=8).sum()
            # The sum may end before the driver notices the kill (the other
            # worker ran the lost tasks): a run() on the dead worker then
            # fails with WorkerLost, as documented, until it is replaced.
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                try:
                    if len(cl.run(os.getpid)) == 2:
                        break
                except clamor.WorkerLost:
                    pass
                time.sleep(0.2)
            res["pids"] = cl.run(os.getpid)
            res["victim"] = victim
            res["replaced"] = cl.stats()["recovery"]["workers_replaced"]
        print(json.dumps(res))
        """)
    assert out["sum"] == 499500
    assert out["victim"] not in out["pids"] and len(out["pids"]) == 2
    assert out["replaced"] >= 1


def test_run_calls_each_worker_once_in_order_and_reports_errors():
    out = scenario("""
        res = {}
        with clamor.Cluster(workers=3, progress=False) as cl:
            res["pids"] = cl.worker_pids
            res["all"] = cl.run(os.getpid)
            res["some"] = cl.run(os.getpid, workers=[2, 0])
            res["args"] = cl.run(lambda x, y=0: x + y, 40, y=2, workers=1)
            for bad in (3, -1, "0", True, [0, 7]):
                res[f"bad {bad!r}"] = attempt(cl.run, os.getpid, workers=bad)
            res["raises"] = attempt(cl.run, lambda: 1 / 0)
            try:
                cl.run(lambda: 1 / 0)
            except clamor.TaskError as e:
                res["remote type"] = e.remote_type
            res["after"] = cl.range(10).sum()
        print(json.dumps(res))
        """)
    assert out["all"] == out["pids"]
    assert out["some"] == [out["pids"][2], out["pids"][0]]
    assert out["args"] == [42]
    for k in ("bad 3", "bad -1", "bad '0'", "bad True", "bad [0, 7]"):
        assert out[k][0] == "ConfigError", (k, out[k])
    assert out["raises"][0] == "TaskError" and out["remote type"] == "ZeroDivisionError"
    assert out["after"] == 45


def test_run_on_a_worker_that_dies_during_the_call_is_worker_lost():
    out = scenario("""
        res = {}
        with clamor.Cluster(workers=2, progress=False, recover=True) as cl:
            victim = cl.worker_pids[1]
            def die_if_victim():
                if os.getpid() == victim:
                    os.kill(os.getpid(), signal.SIGKILL)
                return os.getpid()
            res["call"] = attempt(cl.run, die_if_victim)
            res["after"] = cl.range(10).sum()
        print(json.dumps(res))
        """)
    assert out["call"][0] == "WorkerLost" and out["call"][2]
    assert out["after"] == 45


@pytest.mark.parametrize("frames", [
    [b"JOIN", b"not json"],
    [b"JOIN", b"{}"],
    [b"JOIN"],
    [b"DONE", b"x"],
    [b"HELLO"],
])
def test_malformed_control_messages_are_dropped_and_the_cluster_goes_on(frames):
    """From a peer that holds the secret (an outsider's never get read)."""
    out = scenario(f"""
        import zmq
        from clamor.runtime.security import Security
        res = {{}}
        with clamor.Cluster(workers=1, progress=False) as cl:
            s = zmq.Context.instance().socket(zmq.DEALER)
            s.linger = 0
            Security(cl.secret).client(s)
            s.connect(cl.endpoint)
            s.send_multipart({frames!r})
            time.sleep(0.2)
            res["sum"] = cl.range(10).sum()
            res["again"] = cl.range(20).sum()
            s.close()
        print(json.dumps(res))
        """)
    assert out == {"sum": 45, "again": 190}


def _below_ephemeral(n):
    """The first of ``n`` ports just below the kernel's ephemeral range,
    which no connection takes for its local port (one of the range's
    ports, taken by another test's connection, moved a worker up one)."""
    with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
        low = int(f.read().split()[0])
    return low - 1000 - n


def test_local_workers_listen_on_the_ports_they_are_given():
    """A firewall can be opened for a fixed range: forked and spawned
    workers' page and block servers take the first free ports of
    worker_ports; bad ranges are ConfigError."""
    lo = _below_ephemeral(10)
    out = scenario("""
        import zmq
        taken = zmq.Context.instance().socket(zmq.ROUTER)
        taken.bind("tcp://127.0.0.1:PORT0")                    # the first port of the range is busy
        res = {}
        for method in ("fork", "spawn"):
            with clamor.Cluster(workers=2, start_method=method, worker_ports=(PORT0, PORT0 + 9), progress=False) as cl:
                pages = cl.run(lambda: region.server_endpoint())
                blocks = [w.blocks for w in cl._workers.values()]
                res[method] = sorted(int(ep.rsplit(":", 1)[1]) for ep in pages + blocks)
                res[method + " sum"] = cl.range(10).sum()
        for bad in ((0, 10), (10, 5), (1, 70000), [47000, 47010], (1.5, 2), "47000-47010"):
            res[f"bad {bad!r}"] = attempt(clamor.Cluster, workers=1, worker_ports=bad)
        print(json.dumps(res))
        """.replace("PORT0", str(lo)))
    for method in ("fork", "spawn"):
        assert out[method] == [lo + 1, lo + 2, lo + 3, lo + 4], out
        assert out[method + " sum"] == 45
    bad = [k for k in out if k.startswith("bad ")]
    assert len(bad) == 6 and all(out[k][0] == "ConfigError" for k in bad), out


def test_a_cluster_idle_longer_than_the_heartbeat_timeout_keeps_its_workers():
    out = scenario("""
        res = {}
        with clamor.Cluster(workers=2, progress=False, heartbeat_timeout=1) as cl:
            res["pids"] = cl.run(os.getpid)
            time.sleep(1.8)                     # nobody reads the workers' heartbeats meanwhile
            res["after"] = cl.run(os.getpid)
            time.sleep(1.8)
            res["sum"] = cl.range(10).sum()
            res["lost"] = cl.stats()["recovery"]["workers_lost"]
        print(json.dumps(res))
        """)
    assert out["after"] == out["pids"] and out["sum"] == 45 and out["lost"] == 0, out


def test_a_check_before_a_stage_longer_than_the_heartbeat_timeout_keeps_its_workers():
    """The task is pickled before the stage begins (the check of what it
    ships); nobody reads the heartbeats meanwhile, and they must be read
    before the workers' silence is judged."""
    out = scenario("""
        res = {}

        class Slow:
            def __reduce__(self):
                time.sleep(1.8)                 # longer than the heartbeat time-out
                return (int, (7,))

        slow = Slow()
        with clamor.Cluster(workers=2, progress=False, heartbeat_timeout=1) as cl:
            res["pids"] = cl.run(os.getpid)
            res["got"] = cl.parallelize(range(4), 2).map(lambda x: x + slow).collect()
            res["after"] = cl.run(os.getpid)
            res["lost"] = cl.stats()["recovery"]["workers_lost"]
        print(json.dumps(res))
        """)
    assert out["got"] == [7, 8, 9, 10] and out["after"] == out["pids"] and out["lost"] == 0, out


def test_a_worker_whose_images_differ_is_refused_and_its_place_stays_open(tmp_path):
    """A hand-started worker that would import another build of numpy's
    core module (a file of its own first on its path) is refused at
    joining, naming the library; the driver logs it and the next worker
    takes the place."""
    out = scenario(HAND + shadow_numpy(tmp_path) + """
        cl = clamor.Cluster(workers=0, remote=1, progress=False, start_timeout=60)
        cl.join_command()
        env = {**os.environ, "CLAMOR_SECRET": cl.secret, "PYTHONPATH": shadow}
        bad = subprocess.Popen([sys.executable, "-m", "clamor.worker", cl.endpoint, "--connect-timeout", "30"],
                               env=env, stderr=subprocess.PIPE, text=True)
        starting = threading.Thread(target=cl.start)      # start() answers JOIN while it waits
        starting.start()
        res = {"bad rc": bad.wait(60), "bad says": bad.stderr.read().strip().splitlines()}
        good = by_hand(cl)                                  # the place the refused one left
        starting.join(60)
        res["run"] = cl.run(lambda: 6 * 7)
        res["log"] = [l for l in buf.getvalue().splitlines() if "refused to join" in l]
        res["core"] = core
        cl.close()
        good.wait(30)
        print(json.dumps(res))
        """)
    assert out["bad rc"] == 2 and len(out["bad says"]) == 1, out
    says = out["bad says"][0]
    assert "images differ" in says and out["core"] in says and "numpy" in says, says
    assert out["run"] == [42]
    assert len(out["log"]) == 1 and out["core"] in out["log"][0]


def test_a_join_left_waiting_by_a_worker_that_gave_up_takes_no_place():
    """A worker that asked to join while the driver was not reading, and
    gave up, leaves its JOIN queued: it must not take the place of the
    worker that comes next."""
    out = scenario(HAND + """
        cl = clamor.Cluster(workers=0, remote=1, progress=False, start_timeout=60)
        cl.join_command()
        early = subprocess.Popen([sys.executable, "-m", "clamor.worker", cl.endpoint, "--connect-timeout", "2"],
                                 env={**os.environ, "CLAMOR_SECRET": cl.secret}, stderr=subprocess.PIPE, text=True)
        res = {"early rc": early.wait(60), "early says": early.stderr.read().strip()}
        late = by_hand(cl)
        cl.start()
        res["run"] = cl.run(os.getpid)
        res["late"] = late.pid
        cl.close()
        late.wait(30)
        print(json.dumps(res))
        """)
    assert out["early rc"] == 2 and "no answer" in out["early says"], out
    assert out["run"] == [out["late"]]
