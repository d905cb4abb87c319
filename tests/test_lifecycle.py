"""Worker life cycle: a Cluster's workers, forked, spawned (start_method=
"spawn") or started by hand (remote=), live exactly as long as the driver
process (whichever thread started them) and no longer than their Cluster;
liveness across PID namespaces; reaping; a prompt close(); STOP ahead of
queued tasks; typed errors at the edges, a worker the Cluster does not
expect among them.  Real processes, killed for real; each scenario in a
subprocess.
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
from helpers import PRELUDE, ROOT, gone, run_script, wait_gone
from clamor.runtime import liveness

SECRET = "a secret of the right length"   # for a worker that must get past the secret to the error at hand


def env(**extra):
    return {**os.environ, "PYTHONFAULTHANDLER": "", **extra}


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
    out, _ = run_script("""
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


CLUSTER_DRIVER = PRELUDE + """
box = {}
def start():
    box["cl"] = clamor.Cluster(workers=2, start_method=sys.argv[2], progress=False).start()
if sys.argv[1] == "thread":                 # no PR_SET_PDEATHSIG then: the lifeline alone
    th = threading.Thread(target=start)
    th.start()
    th.join()
else:
    start()
cl = box["cl"]
time.sleep(0.5)
assert cl.range(10).sum() == 45
ports = [int(ep.rsplit(":", 1)[1]) for ep in (cl.endpoint, cl.page_endpoint)]
print(json.dumps({"pids": cl.worker_pids, "lost": cl.stats()["recovery"]["workers_lost"], "ports": ports}),
      flush=True)
cl.range(2, partitions=2).map(lambda x: time.sleep(60)).collect()
"""


@pytest.mark.parametrize("start_method", ["fork", "spawn"])
@pytest.mark.parametrize("started_in", ["main", "thread"])
def test_killing_the_driver_kills_workers_within_two_seconds_even_mid_task_and_frees_its_ports(started_in,
                                                                                                start_method):
    p, out = start(CLUSTER_DRIVER, started_in, start_method)
    try:
        pids, ports = out["pids"], out["ports"]
        assert out["lost"] == 0 and len(pids) == 2 and not any(gone(w) for w in pids)
        time.sleep(0.7)                                     # the tasks are running
        assert not any(gone(w) for w in pids)
        for w in pids:                                      # the driver's listening sockets are not in them
            assert not listening_ports(w) & set(ports), (w, listening_ports(w), ports)
        assert not any(refused(port) for port in ports)
        p.send_signal(signal.SIGKILL)
        p.wait(10)
        assert wait_gone(pids, 2.0), [(w, psutil.Process(w).status()) for w in pids if not gone(w)]
        assert all(refused(port) for port in ports)
    finally:
        finish(p)


def test_a_worker_started_by_hand_exits_once_its_driver_is_killed():
    # Not tied to the driver by a lifeline: it checks the driver's PID (the
    # same PID namespace) once the driver has been silent for a second.
    p, out = start("""
        import json, os, subprocess, sys, time, clamor
        cl = clamor.Cluster(workers=0, remote=1, progress=False)
        cl.join_command()
        w = subprocess.Popen([sys.executable, "-m", "clamor.worker", "--driver", cl.endpoint],
                             env={**os.environ, "CLAMOR_SECRET": cl.secret})
        cl.start()
        assert cl.run(lambda: 6 * 7) == [42] and cl.worker_pids == [w.pid]
        ports = [int(ep.rsplit(":", 1)[1]) for ep in (cl.endpoint, cl.page_endpoint)]
        print(json.dumps({"pid": w.pid, "ports": ports}), flush=True)
        time.sleep(60)
        """)
    try:
        pid, ports = out["pid"], out["ports"]
        time.sleep(1.5)                                     # idle, and silent for more than a second
        assert not gone(pid)
        assert not listening_ports(pid) & set(ports)
        p.send_signal(signal.SIGKILL)
        p.wait(10)
        assert wait_gone([pid], 4.0), "a worker started by hand outlived its driver"
        assert all(refused(port) for port in ports)
    finally:
        finish(p)


@pytest.mark.parametrize("start_method", ["fork", "spawn"])
def test_workers_leave_ctrl_c_to_the_driver(start_method):
    p, pids = start("""
        import json, sys, time, clamor
        with clamor.Cluster(workers=2, start_method=sys.argv[1], progress=False) as cl:
            print(json.dumps(cl.worker_pids), flush=True)
            try:
                cl.run(time.sleep, 1.5)
            except KeyboardInterrupt:
                print("INTERRUPTED", flush=True)
        """, start_method, start_new_session=True)
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
    me = liveness.pid_namespace()
    host, boot, ino = me.rsplit("/", 2)
    assert host == socket.gethostname() and len(boot) == 36 and int(ino) > 0
    assert liveness.shares_pids(me)
    assert not liveness.shares_pids(f"{host}/{boot}/{int(ino) + 1}")      # a container on this host
    assert not liveness.shares_pids(f"{host}-2/{boot}/{ino}")             # another host
    assert not liveness.shares_pids(f"{host}/{'0' * 36}/{ino}")           # this host, another boot
    assert not liveness.shares_pids(None) and not liveness.shares_pids("")


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

NS_WORKER = PRELUDE + """
UNSHARE = json.loads(sys.argv[1])
def ns_worker(cl):
    # a worker in its own PID namespace, as in a container: not tied to this
    # process; it joins when cl.start() (or an action) reads its JOIN
    cl.join_command()                                     # opens the control socket: cl.endpoint
    clean = {k: v for k, v in os.environ.items() if not k.startswith("CLAMOR_")}
    clean["CLAMOR_SECRET"] = cl.secret
    return subprocess.Popen(UNSHARE + [sys.executable, "-m", "clamor.worker", "--driver", cl.endpoint], env=clean)
"""


@pytest.fixture(scope="module")
def pidns_scenario():
    """Three workers in PID namespaces of their own serve a Cluster; then
    one is killed during a call pinned to it (its connection closes) and
    another stopped during one (silent, its connection open), the third
    still live.  Each loss is timed, and its reason read from the driver's
    log."""
    out, _ = run_script(NS_WORKER + """
import logging, signal, threading, time, psutil, clamor
reasons = []
class Losses(logging.Handler):
    def emit(self, record):
        msg = record.getMessage()
        if " lost: " in msg:
            reasons.append(msg)
logging.getLogger("clamor").addHandler(Losses())
res = {}
def ns_ino(pid="self"):
    return os.stat(f"/proc/{pid}/ns/pid").st_ino
def index_of(host):
    # a worker's index in cl.run, told by its PID namespace: its PID is 1 in each
    return cl.run(ns_ino).index(ns_ino(host))
def attempt(what, host, fn, *args, before=None):
    i = index_of(host)
    if before is not None:
        before()
    t0 = time.monotonic()
    try:
        res[what] = cl.run(fn, *args, workers=[i])[0]
    except clamor.ClamorError as e:
        res[what] = f"{type(e).__name__}: {e}"
    res[what + "_s"] = time.monotonic() - t0
    res[what + "_why"] = reasons[-1] if reasons else None
cl = clamor.Cluster(workers=0, remote=3, progress=False, speculation=False, heartbeat_timeout=3)
procs = [ns_worker(cl) for _ in range(3)]
with cl:                                                  # start(): they join
    hosts = [psutil.Process(p.pid).children()[0].pid for p in procs]   # their PIDs out here
    res["pids"] = cl.worker_pids                          # as they see themselves
    time.sleep(1.5)                                       # the driver's PID means nothing in there
    res["served"] = [cl.run(lambda: 6 * 7, workers=[i])[0] for i in range(3)]
    threading.Timer(1.0, os.kill, (hosts[0], signal.SIGKILL)).start()
    attempt("killed", hosts[0], time.sleep, 60)           # its connection closes
    res["left_after_kill"] = len(cl.worker_pids)
    attempt("stopped", hosts[1], time.sleep, 60,          # silent, connection open
            before=lambda: os.kill(hosts[1], signal.SIGSTOP))
    os.kill(hosts[1], signal.SIGKILL)
    res["left"] = cl.run(lambda: 6 * 7)                   # the third serves on
    for p in procs[:2]:
        p.wait(10)
print(json.dumps(res))
""", args=(json.dumps(UNSHARE),), timeout=240)
    return out


@needs_pidns
def test_workers_in_another_pid_namespace_serve_and_a_silent_one_is_lost_by_heartbeat(pidns_scenario):
    out = pidns_scenario
    assert out["pids"] == [1, 1, 1], out
    assert out["served"] == [42, 42, 42], out
    assert out["killed"].startswith("WorkerLost") and out["left_after_kill"] == 2, out
    assert out["stopped"].startswith("WorkerLost"), out
    assert "(pid 1) lost: no heartbeat" in out["stopped_why"], out
    assert 2.5 < out["stopped_s"] < 9, out                # heartbeat_timeout=3
    assert out["left"] == [42], out


@needs_pidns
def test_a_worker_in_another_pid_namespace_is_lost_as_soon_as_its_connection_closes(pidns_scenario):
    out = pidns_scenario
    assert out["killed"].startswith("WorkerLost"), out
    assert "connection" in out["killed_why"] and out["killed_s"] < 6, out


@needs_pidns
def test_a_worker_in_another_pid_namespace_exits_when_its_driver_is_killed():
    p, out = start(NS_WORKER + """
import time, psutil, clamor
cl = clamor.Cluster(workers=0, remote=1, progress=False)
w = ns_worker(cl)
cl.start()
assert cl.run(lambda: 6 * 7) == [42]
print(json.dumps({"unshare": w.pid, "worker": psutil.Process(w.pid).children()[0].pid}), flush=True)
time.sleep(60)
""", json.dumps(UNSHARE))
    try:
        time.sleep(1.5)                                     # the driver's PID means nothing in there
        assert not gone(out["worker"])
        p.send_signal(signal.SIGKILL)
        p.wait(10)
        assert wait_gone([out["worker"], out["unshare"]], 5.0)      # the connection closed: it noticed
    finally:
        finish(p)


@needs_pidns
def test_a_worker_in_another_pid_namespace_stopped_by_close_exits_quietly():
    out, err = run_script(NS_WORKER + """
import time, clamor
cl = clamor.Cluster(workers=0, remote=1, progress=False)
w = ns_worker(cl)
with cl:
    served = cl.run(lambda: 6 * 7)
t0 = time.monotonic()
code = w.wait(30)
print(json.dumps({"served": served, "code": code, "took": time.monotonic() - t0}))
""", args=(json.dumps(UNSHARE),))
    assert out["served"] == [42] and out["took"] < 5, out
    assert out["code"] == 0 and "Traceback" not in err, (out, err[-2000:])


# ---- reaping, finalizing, closing -----------------------------------------------------

def test_a_worker_lost_to_the_heartbeat_timeout_is_reaped_at_once():
    out, _ = run_script("""
        import json, os, signal, time, psutil, clamor
        with clamor.Cluster(workers=2, progress=False, heartbeat_timeout=1.5, speculation=False) as cl:
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
    out, _ = run_script("""
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


HOW = ["fork", "spawn", "remote"]

# A cluster of ``n`` workers forked, spawned, or started by hand (``remote``:
# started by this script, then awaited by start()); the hand-started ones'
# Popen objects too.
CLUSTER_OF = PRELUDE + """
def cluster_of(how, n, **kw):
    if how != "remote":
        return clamor.Cluster(workers=n, start_method=how, progress=False, **kw), []
    cl = clamor.Cluster(workers=0, remote=n, progress=False, **kw)
    cl.join_command()
    env = {**os.environ, "CLAMOR_SECRET": cl.secret}
    return cl, [subprocess.Popen([sys.executable, "-m", "clamor.worker", "--driver", cl.endpoint], env=env)
                for _ in range(n)]
"""


@pytest.mark.parametrize("how", HOW)
def test_stop_goes_ahead_of_tasks_queued_on_a_worker(how):
    # The protocol itself: three TASKs and a STOP wait together in the
    # worker's queue (it is stopped while they arrive).  It must exit without
    # running any (each would be answered FAIL: their stage is unknown).
    out, _ = run_script(CLUSTER_OF + textwrap.dedent("""
        import json, os, pickle, signal, time
        cl, procs = cluster_of(sys.argv[1], 1)
        with cl:
            assert cl.range(4).sum() == 6
            pid = cl.worker_pids[0]
            wid = next(iter(cl._workers))
            os.kill(pid, signal.SIGSTOP)
            for k in range(3):
                cl._sock.send_multipart([wid, b"TASK", pickle.dumps((999, k)), b"999", b"0", b"", b"", b""])
            cl._sock.send_multipart([wid, b"STOP"])
            time.sleep(0.5)
            os.kill(pid, signal.SIGCONT)
            replies, exited, code, t0 = [], None, None, time.monotonic()
            while time.monotonic() - t0 < 4:
                while cl._sock.poll(50):
                    replies.append(cl._sock.recv_multipart()[1].decode())
                if exited is None:
                    done, status = os.waitpid(pid, os.WNOHANG)
                    if done:
                        exited, code = time.monotonic() - t0, os.waitstatus_to_exitcode(status)
                        t0 = time.monotonic() - 3.5       # a last look for replies
        print(json.dumps({"replies": [r for r in replies if r != "HB"], "exited": exited, "code": code}))
        """), args=(how,))
    assert out["exited"] is not None and out["exited"] < 2, out
    assert out["code"] == 0, out                  # it stopped, it was not killed
    assert out["replies"] == [], out


@pytest.mark.parametrize("how", HOW)
def test_close_after_ctrl_c_does_not_wait_for_queued_tasks(tmp_path, how):
    out, _ = run_script(CLUSTER_OF + textwrap.dedent("""
        import json, os, signal, threading, time
        TMP = sys.argv[2]
        def task(x):
            open(os.path.join(TMP, str(x)), "w").close()
            time.sleep(1.5)
            return x
        cl, procs = cluster_of(sys.argv[1], 2, slots=4, speculation=False)
        with cl:
            assert cl.range(2).sum() == 1
            threading.Timer(1.0, os.kill, (os.getpid(), signal.SIGINT)).start()
            try:
                cl.range(40, partitions=40).map(task).collect()
                res = "finished"
            except KeyboardInterrupt:
                res = "interrupted"
            t0 = time.monotonic()
            cl.close()
            for p in procs:                       # close() does not wait for those started by hand
                p.wait(30)
            took = time.monotonic() - t0
        codes = [p.returncode for p in procs]
        print(json.dumps({"res": res, "took": took, "started": len(os.listdir(TMP)), "codes": codes}))
        """), args=(how, str(tmp_path)))
    assert out["res"] == "interrupted"
    assert out["took"] < 2.0, out                # the running tasks end; the 3 queued on each are not run
    assert out["started"] <= 4, out
    assert all(c == 0 for c in out["codes"]), out


# ---- typed errors at the edges -----------------------------------------------------------

@pytest.mark.parametrize("argv, extra_env, says", [
    (["--driver", "tcp://garbage"], {}, "cannot connect to the driver at 'tcp://garbage'"),
    (["--driver", "tcp://127.0.0.1:1"], {"CLAMOR_CONNECT_TIMEOUT": "abc"}, "CLAMOR_CONNECT_TIMEOUT must be a number"),
    (["--driver", "tcp://127.0.0.1:1", "--connect-timeout", "-1"], {}, "must be a positive number"),
])
def test_worker_command_line_errors_are_one_line_messages(argv, extra_env, says):
    extra_env = {"CLAMOR_SECRET": SECRET, **extra_env}
    p = subprocess.run([sys.executable, "-m", "clamor.worker", *argv], env=env(**extra_env), capture_output=True,
                       text=True, timeout=30, cwd=ROOT)
    assert p.returncode not in (0, None)
    assert p.stderr.strip().splitlines() == [p.stderr.strip()] and says in p.stderr, p.stderr
    assert "Traceback" not in p.stderr


@pytest.mark.parametrize("remote", [0, 1])
def test_a_worker_the_cluster_does_not_expect_is_refused_with_a_one_line_message(remote):
    # Every place is taken (the cluster's forked worker, or its one remote
    # worker, has joined): a worker started by hand is refused when an action
    # reads its JOIN, exits non-zero, and the cluster runs on as it was.
    out, _ = run_script("""
        import json, os, subprocess, sys, time, clamor
        remote = int(sys.argv[1])
        cl = clamor.Cluster(workers=1 - remote, remote=remote, progress=False)
        env = {**os.environ, "CLAMOR_SECRET": cl.secret}     # (a member: it holds the secret)
        first = []
        if remote:
            cl.join_command()
            first = [subprocess.Popen([sys.executable, "-m", "clamor.worker", "--driver", cl.endpoint], env=env)]
        with cl:
            pids = cl.worker_pids
            extra = subprocess.Popen([sys.executable, "-m", "clamor.worker", "--driver", cl.endpoint], env=env,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            t0 = time.monotonic()
            while extra.poll() is None and time.monotonic() - t0 < 30:
                cl.run(time.sleep, 0.2)              # the driver reads its socket during an action
            out, err = extra.communicate(timeout=30)
            after = {"pids": cl.worker_pids, "sum": cl.range(10).sum(), "workers": cl.stats()["workers"]}
        for p in first:
            p.wait(30)
        print(json.dumps({"pids": pids, "code": extra.returncode, "out": out, "err": err, "after": after,
                          "first": [p.returncode for p in first]}))
        """, args=(str(remote),))
    err = out["err"].strip()
    assert out["code"] not in (0, None), out
    assert err.splitlines() == [err], out
    assert err.startswith("clamor worker: ") and "refused this worker" in err, out
    assert "expects no more workers" in err, out
    assert "Traceback" not in out["err"] and out["out"] == "", out
    assert out["after"] == {"pids": out["pids"], "sum": 45, "workers": 1}, out
    assert out["first"] == [0] * remote, out


def test_clamor_worker_cli_takes_a_connect_timeout():
    t0 = time.monotonic()
    p = subprocess.run([sys.executable, "-m", "clamor", "worker", "--driver", "tcp://127.0.0.1:1",
                        "--connect-timeout", "0.5"], env=env(CLAMOR_SECRET=SECRET), capture_output=True, text=True,
                       timeout=30, cwd=ROOT)
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
    out, _ = run_script("""
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


def test_a_heartbeat_timeout_under_a_second_loses_no_busy_worker():
    """Workers beat at a quarter of the Cluster's heartbeat_timeout (at most
    once a second): with a time-out of 0.4 s, tasks of 1.5 s run on forked
    and spawned workers and none is lost.  (They beat once a second, and
    every worker was lost while its task ran.)"""
    out, _ = run_script(PRELUDE + """
out = {}
for how in ("fork", "spawn"):
    with clamor.Cluster(workers=2, start_method=how, progress=None, heartbeat_timeout=0.4) as cl:
        cl.run(lambda: None)
        got = cl.parallelize(range(4), 2).map(lambda x: (time.sleep(1.5), x * 2)[1]).collect()
        out[how] = {"lost": cl.stats()["recovery"]["workers_lost"], "right": got == [0, 2, 4, 6]}
print(json.dumps(out))
""", timeout=120)
    for how in ("fork", "spawn"):
        assert out[how] == {"lost": 0, "right": True}, out
