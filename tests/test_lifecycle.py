"""Worker life cycle: workers live exactly as long as the driver process
(whichever thread forked them) and no longer than their Cluster; liveness
across PID namespaces; reaping; a prompt close(); typed errors at the
edges.  Real processes, killed for real; each scenario in a subprocess.
"""
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time

import psutil
import pytest

import clamor
from helpers import gone, wait_gone
from clamor.runtime import _liveness

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def env(**extra):
    return {**os.environ, "PYTHONFAULTHANDLER": "", **extra}


def run_json(code, timeout=120, args=()):
    """Run ``code`` in a fresh interpreter; its last stdout line is JSON."""
    p = subprocess.run([sys.executable, "-c", textwrap.dedent(code), *args], env=env(), capture_output=True,
                       text=True, timeout=timeout, cwd=ROOT)
    assert p.returncode == 0, f"exit {p.returncode}\nstdout:\n{p.stdout[-3000:]}\nstderr:\n{p.stderr[-6000:]}"
    return json.loads(p.stdout.strip().splitlines()[-1]), p.stderr


def start(code, *args, **kw):
    """Start ``code`` as a driver process; its first stdout line is JSON."""
    p = subprocess.Popen([sys.executable, "-c", textwrap.dedent(code), *args], env=env(), stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, cwd=ROOT, **kw)
    line = p.stdout.readline()
    if not line:
        p.kill()
        raise AssertionError(f"the driver printed nothing:\n{p.communicate()[1][-6000:]}")
    return p, json.loads(line)


def finish(p):
    if p.poll() is None:
        p.kill()
    return p.communicate(timeout=30)


def listening_ports(pid):
    return {c.laddr.port for c in psutil.Process(pid).net_connections(kind="inet") if c.status == psutil.CONN_LISTEN}


def refused(port):
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) != 0


# ---- workers live as long as the driver process ---------------------------------------

def test_workers_outlive_the_threads_that_forked_them():
    out, _ = run_json("""
        import concurrent.futures, json, os, signal, threading, time, clamor
        box = {}
        th = threading.Thread(target=lambda: box.setdefault("cl", clamor.Cluster(workers=2, progress=False).start()))
        th.start()
        th.join()                                  # the thread that forked the workers is gone
        cl = box["cl"]
        time.sleep(1.0)
        res = [cl.range(10).sum()]                 # from the main thread
        with concurrent.futures.ThreadPoolExecutor(1) as ex:
            res.append(ex.submit(lambda: cl.range(10).sum()).result())
        time.sleep(1.0)
        res.append(cl.range(10).sum())
        lost_before = cl.stats()["recovery"]["workers_lost"]

        # a replacement forked during an action that runs in a short-lived thread
        victim = cl.worker_pids[0]
        os.kill(victim, signal.SIGKILL)
        def act():
            while len(cl._workers) < 2 or victim in cl.worker_pids:
                res.append(cl.range(10).sum())
        th = threading.Thread(target=act)
        th.start()
        th.join()
        time.sleep(1.5)
        res.append(cl.range(10).sum())
        rec = cl.stats()["recovery"]
        pids = cl.worker_pids
        cl.close()
        print(json.dumps({"res": res, "lost_before": lost_before, "rec": rec, "pids": pids, "victim": victim}))
        """)
    assert set(out["res"]) == {45}, out
    assert out["lost_before"] == 0, out
    assert out["rec"]["workers_lost"] == 1 and out["rec"]["workers_replaced"] == 1, out     # the victim only
    assert out["victim"] not in out["pids"] and len(out["pids"]) == 2


CLUSTER_DRIVER = """
import json, sys, threading, time, clamor
box = {}
def start():
    box["cl"] = clamor.Cluster(workers=2, progress=False).start()
if sys.argv[1] == "thread":                 # no PR_SET_PDEATHSIG then: the lifeline alone
    th = threading.Thread(target=start)
    th.start()
    th.join()
else:
    start()
cl = box["cl"]
time.sleep(0.5)
assert cl.range(10).sum() == 45
print(json.dumps({"pids": cl.worker_pids, "lost": cl.stats()["recovery"]["workers_lost"]}), flush=True)
cl.range(2, partitions=2).map(lambda x: time.sleep(60)).collect()
"""


@pytest.mark.parametrize("started_in", ["main", "thread"])
def test_killing_the_driver_kills_workers_within_two_seconds_even_mid_task(started_in):
    p, out = start(CLUSTER_DRIVER, started_in)
    try:
        pids = out["pids"]
        assert out["lost"] == 0 and len(pids) == 2 and not any(gone(w) for w in pids)
        time.sleep(0.7)                                     # the tasks are running
        assert not any(gone(w) for w in pids)
        p.send_signal(signal.SIGKILL)
        p.wait(10)
        assert wait_gone(pids, 2.0), [(w, psutil.Process(w).status()) for w in pids if not gone(w)]
    finally:
        finish(p)


TASKSERVER_DRIVER = """
import json, sys, threading, time, clamor
from clamor.runtime.tasks import TaskServer
ts = TaskServer()
if sys.argv[1] == "thread":
    th = threading.Thread(target=ts.fork, args=(1,))
    th.start()
    th.join()
else:
    ts.fork(1)
assert ts.run(lambda: 6 * 7) == 42
ports = [int(ep.rsplit(":", 1)[1]) for ep in (ts.endpoint, ts.page_endpoint)]
print(json.dumps({"pid": ts.workers[0]["pid"], "ports": ports}), flush=True)
ts.run(time.sleep, 60)
"""


@pytest.mark.parametrize("forked_in", ["main", "thread"])
def test_taskserver_forked_worker_dies_with_its_driver_mid_task_and_frees_its_ports(forked_in):
    p, out = start(TASKSERVER_DRIVER, forked_in)
    try:
        pid, ports = out["pid"], out["ports"]
        time.sleep(0.7)                                     # the task is running
        assert not gone(pid)
        assert not listening_ports(pid) & set(ports)        # the driver's listening sockets were closed in it
        assert not any(refused(port) for port in ports)
        p.send_signal(signal.SIGKILL)
        p.wait(10)
        assert wait_gone([pid], 2.0), "a forked TaskServer worker outlived its driver"
        assert all(refused(port) for port in ports)
    finally:
        finish(p)


def test_taskserver_workers_leave_ctrl_c_to_the_driver():
    p, pids = start("""
        import json, time, clamor
        from clamor.runtime.tasks import TaskServer
        with TaskServer() as ts:
            ts.fork(2)
            print(json.dumps([w["pid"] for w in ts.workers]), flush=True)
            try:
                ts.gather([(0, time.sleep, (1.5,), {}), (1, time.sleep, (1.5,), {})])
            except KeyboardInterrupt:
                print("INTERRUPTED", flush=True)
        """, start_new_session=True)
    try:
        time.sleep(0.7)
        os.killpg(p.pid, signal.SIGINT)                     # Ctrl-C: the whole process group
        out, err = p.communicate(timeout=30)
    finally:
        finish(p)
    assert "INTERRUPTED" in out, err
    assert "KeyboardInterrupt" not in err and "Traceback" not in err, err
    assert p.returncode == 0
    assert wait_gone(pids, 2.0)


# ---- liveness across PID namespaces ------------------------------------------------------

def test_pid_checks_only_between_processes_that_share_a_pid_namespace():
    me = _liveness.pid_namespace()
    host, boot, ino = me.rsplit("/", 2)
    assert host == socket.gethostname() and len(boot) == 36 and int(ino) > 0
    assert _liveness.shares_pids(me)
    assert not _liveness.shares_pids(f"{host}/{boot}/{int(ino) + 1}")      # a container on this host
    assert not _liveness.shares_pids(f"{host}-2/{boot}/{ino}")             # another host
    assert not _liveness.shares_pids(f"{host}/{'0' * 36}/{ino}")           # this host, another boot
    assert not _liveness.shares_pids(None) and not _liveness.shares_pids("")


def _unshare():
    for cmd in (["unshare", "--pid", "--fork", "--mount-proc"],
                ["unshare", "--user", "--map-root-user", "--pid", "--fork", "--mount-proc"]):
        try:
            if subprocess.run(cmd + ["true"], capture_output=True, timeout=10).returncode == 0:
                return cmd
        except (OSError, subprocess.TimeoutExpired):
            pass
    return None


UNSHARE = _unshare()
needs_pidns = pytest.mark.skipif(UNSHARE is None, reason="PID namespaces are not available here")

NS_WORKER = """
import json, os, subprocess, sys
UNSHARE = json.loads(sys.argv[1])
def ns_worker(ts):
    # a worker in its own PID namespace, as in a container: not tied to this process
    clean = {k: v for k, v in os.environ.items() if not k.startswith("CLAMOR_")}
    p = subprocess.Popen(UNSHARE + [sys.executable, "-m", "clamor.worker", "--driver", ts.endpoint], env=clean)
    ts._await(len(ts.workers) + 1, 30)
    return p
"""


@needs_pidns
def test_workers_in_another_pid_namespace_serve_and_their_loss_is_noticed():
    out, _ = run_json(NS_WORKER + """
import signal, threading, time, psutil, clamor
from clamor.runtime.tasks import TaskServer
res = {}
def attempt(what, worker, fn, *args):
    t0 = time.monotonic()
    try:
        res[what] = ts.run(fn, *args, worker=worker, timeout=30)
    except clamor.ClamorError as e:
        res[what] = f"{type(e).__name__}: {e}"
    res[what + "_s"] = time.monotonic() - t0
with TaskServer() as ts:
    procs = [ns_worker(ts), ns_worker(ts)]
    hosts = [psutil.Process(p.pid).children()[0].pid for p in procs]   # their PIDs out here
    res["pids"] = [w["pid"] for w in ts.workers]          # as they see themselves
    time.sleep(3)                                         # the driver's PID means nothing in there
    attempt("first", 0, lambda: 6 * 7)
    attempt("second", 1, lambda: 6 * 7)
    threading.Timer(1.0, os.kill, (hosts[0], signal.SIGKILL)).start()
    attempt("killed", 0, time.sleep, 60)                  # its connection closes
    os.kill(hosts[1], signal.SIGSTOP)                     # silent, connection open
    attempt("stopped", 1, time.sleep, 60)
    os.kill(hosts[1], signal.SIGKILL)
    for p in procs:
        p.wait(10)
print(json.dumps(res))
""", args=(json.dumps(UNSHARE),))
    assert out["pids"] == [1, 1], out
    assert out["first"] == out["second"] == 42, out
    assert out["killed"].startswith("WorkerLost") and "connection" in out["killed"], out
    assert out["killed_s"] < 6, out
    assert out["stopped"].startswith("WorkerLost") and "heartbeat" in out["stopped"], out
    assert 9 < out["stopped_s"] < 16, out


@needs_pidns
def test_a_worker_in_another_pid_namespace_exits_when_its_driver_is_killed():
    p, out = start(NS_WORKER + """
import time, psutil
from clamor.runtime.tasks import TaskServer
ts = TaskServer()
w = ns_worker(ts)
print(json.dumps({"unshare": w.pid, "worker": psutil.Process(w.pid).children()[0].pid}), flush=True)
time.sleep(60)
""", json.dumps(UNSHARE))
    try:
        assert not gone(out["worker"])
        p.send_signal(signal.SIGKILL)
        p.wait(10)
        assert wait_gone([out["worker"], out["unshare"]], 5.0)      # the connection closed: it noticed
    finally:
        finish(p)


# ---- reaping, finalizing, closing -----------------------------------------------------

def test_a_worker_lost_to_the_heartbeat_timeout_is_reaped_at_once():
    out, _ = run_json("""
        import json, os, signal, time, psutil, clamor
        with clamor.Cluster(workers=2, progress=False, heartbeat_timeout=3, speculation=False) as cl:
            assert cl.range(4).sum() == 6
            victim = cl.worker_pids[0]
            os.kill(victim, signal.SIGSTOP)          # silent, not dead: lost by heartbeat time-out
            t0 = time.monotonic()
            while cl.stats()["recovery"]["workers_lost"] == 0 and time.monotonic() - t0 < 30:
                assert cl.range(4, partitions=4).map(lambda x: time.sleep(0.5) or x).sum() == 6
            after = cl.range(10).sum()               # the next action
            kids = {c.pid: c.status() for c in psutil.Process().children()}
            rec = cl.stats()["recovery"]
        print(json.dumps({"victim": victim, "kids": kids, "rec": rec, "after": after}))
        """)
    assert out["rec"]["workers_lost"] == 1 and out["after"] == 45, out
    assert str(out["victim"]) not in out["kids"], out                  # reaped, not a zombie
    assert psutil.STATUS_ZOMBIE not in out["kids"].values(), out


def test_a_cluster_dropped_without_close_stops_its_workers():
    out, _ = run_json("""
        import gc, json, time, weakref, psutil, clamor
        def make():
            cl = clamor.Cluster(workers=2, progress=False).start()
            assert cl.range(10).sum() == 45
            return weakref.ref(cl), cl.worker_pids, int(cl.endpoint.rsplit(":", 1)[1])
        ref, pids, port = make()                     # no close(), no with: only dropped
        gc.collect()
        collected = ref() is None
        me = psutil.Process()
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and set(pids) & {c.pid for c in me.children()}:
            time.sleep(0.05)
        kids = [c.pid for c in me.children()]
        with clamor.Cluster(workers=1, progress=False) as cl:    # and the next one works
            again = cl.range(10).sum()
        print(json.dumps({"collected": collected, "pids": pids, "kids": kids, "port": port, "again": again}))
        """)
    assert out["collected"], "the finalizer keeps the Cluster alive"
    assert not set(out["pids"]) & set(out["kids"]), out                # stopped and reaped
    assert all(gone(p) for p in out["pids"])
    assert refused(out["port"])
    assert out["again"] == 45


def test_stop_goes_ahead_of_tasks_queued_on_a_worker():
    # The protocol itself: three TASKs and a STOP wait together in the
    # worker's queue (it is stopped while they arrive).  It must exit without
    # running any (each would be answered FAIL: their stage is unknown).
    out, _ = run_json("""
        import json, os, pickle, signal, time, clamor
        with clamor.Cluster(workers=1, progress=False) as cl:
            assert cl.range(4).sum() == 6
            pid = cl.worker_pids[0]
            os.kill(pid, signal.SIGSTOP)
            for k in range(3):
                cl._sock.send_multipart([b"w0", b"TASK", pickle.dumps((999, k)), b"999", b"0", b"", b"", b""])
            cl._sock.send_multipart([b"w0", b"STOP"])
            time.sleep(0.5)
            os.kill(pid, signal.SIGCONT)
            replies, exited, t0 = [], None, time.monotonic()
            while time.monotonic() - t0 < 4:
                while cl._sock.poll(50):
                    replies.append(cl._sock.recv_multipart()[1].decode())
                if exited is None and os.waitpid(pid, os.WNOHANG)[0]:
                    exited = time.monotonic() - t0
                    t0 = time.monotonic() - 3.5       # a last look for replies
        print(json.dumps({"replies": [r for r in replies if r != "HB"], "exited": exited}))
        """)
    assert out["exited"] is not None and out["exited"] < 2, out
    assert out["replies"] == [], out


def test_close_after_ctrl_c_does_not_wait_for_queued_tasks(tmp_path):
    out, _ = run_json("""
        import json, os, signal, sys, threading, time, clamor
        TMP = sys.argv[1]
        def task(x):
            open(os.path.join(TMP, str(x)), "w").close()
            time.sleep(1.5)
            return x
        with clamor.Cluster(workers=2, slots=4, progress=False, speculation=False) as cl:
            assert cl.range(2).sum() == 1
            threading.Timer(1.0, os.kill, (os.getpid(), signal.SIGINT)).start()
            try:
                cl.range(40, partitions=40).map(task).collect()
                res = "finished"
            except KeyboardInterrupt:
                res = "interrupted"
            t0 = time.monotonic()
            cl.close()
            took = time.monotonic() - t0
        print(json.dumps({"res": res, "took": took, "started": len(os.listdir(TMP))}))
        """, args=(str(tmp_path),))
    assert out["res"] == "interrupted"
    assert out["took"] < 2.0, out                # the running tasks end; the 3 queued on each are not run
    assert out["started"] <= 4, out


def test_taskserver_close_does_not_wait_for_queued_tasks():
    out, _ = run_json("""
        import json, os, signal, threading, time, clamor
        from clamor.runtime.tasks import TaskServer
        with TaskServer() as ts:
            ts.fork(1)
            threading.Timer(1.0, os.kill, (os.getpid(), signal.SIGINT)).start()
            try:
                ts.gather([(0, time.sleep, (1.5,), {}) for _ in range(5)])
            except KeyboardInterrupt:
                pass
            pid = ts.workers[0]["pid"]
            t0 = time.monotonic()
            ts.close()
            took = time.monotonic() - t0
        print(json.dumps({"took": took}))
        """)
    assert out["took"] < 2.0, out


# ---- typed errors at the edges -----------------------------------------------------------

@pytest.mark.parametrize("argv, extra_env, says", [
    (["--driver", "garbage"], {}, "cannot connect to the driver at 'garbage'"),
    (["--driver", "tcp://127.0.0.1:1"], {"CLAMOR_CONNECT_TIMEOUT": "abc"}, "CLAMOR_CONNECT_TIMEOUT must be a number"),
    (["--driver", "tcp://127.0.0.1:1", "--connect-timeout", "-1"], {}, "must be a positive number"),
])
def test_worker_command_line_errors_are_one_line_messages(argv, extra_env, says):
    p = subprocess.run([sys.executable, "-m", "clamor.worker", *argv], env=env(**extra_env), capture_output=True,
                       text=True, timeout=30, cwd=ROOT)
    assert p.returncode not in (0, None)
    assert p.stderr.strip().splitlines() == [p.stderr.strip()] and says in p.stderr, p.stderr
    assert "Traceback" not in p.stderr


def test_clamor_worker_cli_takes_a_connect_timeout():
    t0 = time.monotonic()
    p = subprocess.run([sys.executable, "-m", "clamor", "worker", "--driver", "tcp://127.0.0.1:1",
                        "--connect-timeout", "0.5"], env=env(), capture_output=True, text=True, timeout=30, cwd=ROOT)
    assert p.returncode != 0
    assert "no answer from the driver at tcp://127.0.0.1:1 within 0.5 s" in p.stderr, p.stderr
    assert time.monotonic() - t0 < 15


def test_worker_pids_before_start_is_empty():
    assert clamor.Cluster(workers=2).worker_pids == []


@pytest.mark.parametrize("kw", [{"slots": True}, {"heartbeat_timeout": None}, {"heartbeat_timeout": "x"},
                                {"heartbeat_timeout": -1}, {"heartbeat_timeout": 0},
                                {"heartbeat_timeout": float("nan")}, {"heartbeat_timeout": True},
                                {"start_timeout": None}, {"start_timeout": float("inf")}, {"start_timeout": -5}])
def test_bad_lifecycle_settings_are_config_errors(kw):
    with pytest.raises(clamor.ConfigError):
        clamor.Cluster(workers=1, **kw)


# ---- the runtime stays out of heap() blocks ------------------------------------------------

def test_a_cluster_started_and_closed_inside_a_heap_block():
    out, _ = run_json("""
        import json, numpy as np, clamor
        with clamor.heap():
            cl = clamor.Cluster(workers=1, progress=False).start()
            a = np.arange(100_000, dtype="i8")
            inside = clamor.in_region(a)
            got = cl.range(4, partitions=4).map(lambda i: int(a[i * 25_000:(i + 1) * 25_000].sum())).sum()
            lost = cl.stats()["recovery"]["workers_lost"]
            cl.close()
        print(json.dumps({"inside": inside, "got": got, "want": int(a.sum()), "lost": lost}))
        """, timeout=60)
    assert out["inside"] and out["got"] == out["want"] and out["lost"] == 0, out
