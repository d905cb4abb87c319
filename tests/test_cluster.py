"""The Cluster runtime: task errors, shipping closures and region arrays by
reference, statistics, life cycle (clean close, a worker or the driver
killed), argument checking, logging and the progress bar.

In-process tests share one module-scoped cluster (this pytest process is its
driver).  Life-cycle and terminal scenarios run in subprocesses.
"""
import fcntl
import json
import os
import select
import signal
import struct
import subprocess
import sys
import termios
import textwrap
import threading
import time

import numpy as np
import pytest

import clamor
from helpers import PRELUDE, ROOT, gone, run_script, scenario, wait_gone
from clamor import region

KIB = 1024


@pytest.fixture(scope="module")
def arrays():
    """Every region array the in-process tests read, written before the
    cluster runs its first stage.  Workers keep the pages they fetch (and
    read ahead), and nothing invalidates them yet (see
    test_driver_write_between_stages_is_seen), so an array allocated later
    could share a page a worker already holds and read stale there.  A gap
    nobody reads follows each array, so that read-ahead from one (up to twice
    the read-ahead size past the pages read) never fetches the next, and the
    arrays read sequentially come last (see test_read_ahead_stops)."""
    gap = 4 * clamor.configure()["readahead"] + (16 << 20)   # address space only: never touched
    pads = []

    def fenced(a):
        pads.append(clamor.alloc(gap))
        return a

    out = {"small": fenced(clamor.zeros(16, "i8")),
           "big": fenced(clamor.empty((1 << 27,), "f8")),     # 1 GiB; only the pages written below exist
           "big_idx": [0, 12_345_678, (1 << 27) - 1],
           "ints": fenced(clamor.array(np.arange(300_000, dtype="i8"))),
           "mib8": fenced(clamor.array(np.arange(1 << 20, dtype="f8")))}
    for j, i in enumerate(out["big_idx"]):
        out["big"][i] = 1.5 + j
    yield out
    for p in pads:
        clamor.free(p)


@pytest.fixture(scope="module")
def cl(arrays):
    with clamor.Cluster(workers=2, progress=False) as c:
        yield c


def last_stage(cl):
    return cl.stage_stats()[-1]


def env():
    return {**os.environ, "PYTHONFAULTHANDLER": ""}


# ---- task errors -----------------------------------------------------------------

def explode_on_seven(x):
    if x == 7:
        raise KeyError(f"boom at {x}")
    return x


def test_task_error_carries_the_remote_traceback(cl):
    with pytest.raises(clamor.TaskError) as info:
        cl.range(20, partitions=4).map(explode_on_seven).collect()
    err = info.value
    assert isinstance(err, clamor.ClamorError)
    assert str(err).splitlines()[0] == "KeyError: 'boom at 7'"
    assert "Traceback (most recent call last)" in err.remote_traceback
    assert "explode_on_seven" in err.remote_traceback          # the user's function, in the worker's frames
    assert 'raise KeyError(f"boom at {x}")' in err.remote_traceback
    assert "explode_on_seven" in str(err)
    # the cluster is usable afterwards, with all its workers
    assert cl.range(20, partitions=4).map(lambda x: x + 1).sum() == 210
    assert cl.stats()["workers"] == 2


@pytest.mark.parametrize("where", ["shuffle map side", "reduce function", "action", "unpicklable result",
                                   "sys.exit"])
def test_task_errors_everywhere_leave_the_cluster_usable(cl, where):
    d = cl.range(30, partitions=3)
    with pytest.raises(clamor.TaskError) as info:
        if where == "shuffle map side":
            d.map(lambda x: (x % 3, 1 // (x - 12))).reduce_by_key(lambda a, b: a + b).collect()
        elif where == "reduce function":
            d.map(lambda x: (x % 3, x)).reduce_by_key(lambda a, b: a + b + [][0]).collect()
        elif where == "action":
            d.foreach(lambda x: int("not a number"))
        elif where == "unpicklable result":
            d.map(lambda x: threading.Lock()).collect()
        else:
            d.map(lambda x: sys.exit(3)).collect()    # a SystemExit must not take the worker down
    assert info.value.remote_traceback
    assert cl.range(30, partitions=6).map(lambda x: (x % 5, x)).reduce_by_key(lambda a, b: a + b).count() == 5
    assert cl.stats()["workers"] == 2


# ---- what travels: references, not bytes ---------------------------------------------

def test_closure_capturing_a_1gib_region_array_ships_a_reference(cl, arrays):
    big, idx = arrays["big"], arrays["big_idx"]
    assert big.nbytes == 1 << 30 and clamor.in_region(big)
    got = cl.range(3, partitions=3).map(lambda j: float(big[idx[j]])).collect()
    assert got == [1.5, 2.5, 3.5]
    st = last_stage(cl)
    assert st["payload_bytes"] + st["task_data_bytes"] < 10 * KIB
    # a few pages (and read-ahead), or a few windows mapped on this host; not the GiB
    assert 0 < st["bytes_from_driver"] + st["bytes_mapped"] < (64 << 20)
    assert st["faults"] >= 3


def drop_on_workers(cl, a):
    """Drop ``a``'s pages on every worker.  Earlier tests' faults may have
    mapped them already (a worker on the driver's host maps a 4 MiB window
    at a time, and fills windows ahead of a scan): a stage that must fault
    starts from here."""
    ps = region.page_size()
    first = (a.ctypes.data - region.base()) // ps
    count = (a.ctypes.data + a.nbytes - 1 - region.base()) // ps - first + 1
    cl.run(lambda: region.drop_pages(first, count))


def test_region_ndarray_parallelize_travels_by_reference(cl, arrays):
    a = arrays["mib8"]                                   # 8 MiB in the region
    drop_on_workers(cl, a)
    plain = np.arange(1 << 20, dtype="f8")
    served = cl.stats()["driver"]["bytes_served"] + cl.stats()["bytes_mapped"]
    assert cl.parallelize(a, partitions=4).sum() == plain.sum()
    by_ref = last_stage(cl)
    assert by_ref["task_data_bytes"] < 10 * KIB
    # the workers paged it in (fetched, or mapped on this host) ...
    assert by_ref["faults"] > 0 and by_ref["bytes_from_driver"] + by_ref["bytes_mapped"] > 0
    moved = cl.stats()["driver"]["bytes_served"] + cl.stats()["bytes_mapped"] - served
    assert moved >= a.nbytes - region.page_size()   # ... all of it

    assert cl.parallelize(plain, partitions=4).sum() == plain.sum()
    by_value = last_stage(cl)
    assert by_value["task_data_bytes"] >= plain.nbytes
    assert by_value["faults"] == 0


def test_driver_write_between_stages_is_seen(cl, arrays):
    small = arrays["small"]
    read = cl.range(2, partitions=2).map(lambda i: int(small.sum()))
    assert read.collect() == [0, 0]
    small[:] = 7                          # the driver writes between stages
    assert read.collect() == [112, 112]


def test_read_ahead_stops():
    out, _ = run_script("""
        import json, time, numpy as np, clamor
        a = clamor.array(np.arange(1 << 20, dtype="f8"))   # 8 MiB, read sequentially
        pad = clamor.alloc(256 << 20)                      # allocated, never read
        with clamor.Cluster(workers=1, progress=False) as cl:
            assert cl.range(1, partitions=1).map(lambda i: float(a.sum())).collect() == [a.sum()]
            time.sleep(1.0)
            print(json.dumps({"served": cl.stats()["driver"]["bytes_served"],
                              "readahead": clamor.configure()["readahead"]}))
        """, timeout=60)
    assert out["served"] <= (8 << 20) + 2 * out["readahead"] + (1 << 20)


# ---- statistics ----------------------------------------------------------------------

STAGE_KEYS = {"stage", "kind", "tasks", "faults", "bytes_from_driver", "bytes_from_peers", "bytes_mapped", "payload_bytes",
              "task_data_bytes", "duration_s", "task_s"}


def test_stats_count_stages_tasks_faults_and_bytes(cl, arrays):
    arr = arrays["ints"]
    drop_on_workers(cl, arr)
    before = cl.stats()
    assert {"stages", "tasks", "faults", "bytes_from_driver", "bytes_from_peers", "task_seconds", "workers",
            "driver", "stages_detail"} <= set(before)
    assert before["workers"] == 2
    total = cl.range(4, partitions=4).map(lambda i: int(arr[i * 75_000:(i + 1) * 75_000].sum())).sum()
    assert total == 300_000 * 299_999 // 2
    st = last_stage(cl)
    assert STAGE_KEYS <= set(st)
    assert st["kind"] == "sum" and st["tasks"] == 4
    # Each report carries the worker's running counters: read-ahead that lands
    # after a worker's last task of a stage counts in its next report.
    assert st["faults"] > 0 and st["bytes_from_driver"] + st["bytes_mapped"] > 0
    after = cl.stats()
    assert after["stages"] == before["stages"] + 1
    assert after["tasks"] == before["tasks"] + 4
    assert after["faults"] - before["faults"] == st["faults"]
    assert after["bytes_from_driver"] - before["bytes_from_driver"] == st["bytes_from_driver"]
    assert after["bytes_from_peers"] - before["bytes_from_peers"] == st["bytes_from_peers"]
    assert after["bytes_mapped"] - before["bytes_mapped"] == st["bytes_mapped"]
    moved = (after["driver"]["bytes_served"] + after["bytes_mapped"]
             - before["driver"]["bytes_served"] - before["bytes_mapped"])
    assert moved >= arr.nbytes - region.page_size()
    assert after["stages_detail"][-1] == st
    assert cl.stage_stats() == after["stages_detail"]


def test_stats_task_durations(cl):
    before = cl.stats()["task_seconds"]
    cl.range(4, partitions=4).map(lambda x: time.sleep(0.1 * (x + 1))).count()
    st = last_stage(cl)
    assert set(st["task_s"]) == {"min", "median", "max"}
    assert 0.1 <= st["task_s"]["min"] <= st["task_s"]["median"] <= st["task_s"]["max"]
    assert st["task_s"]["max"] >= 0.4
    assert st["duration_s"] >= st["task_s"]["max"]
    assert cl.stats()["task_seconds"] - before >= 1.0
    assert st["faults"] == 0                                        # it touched no region page


def test_shuffle_map_stage_is_recorded(cl):
    n0 = len(cl.stage_stats())
    cl.range(100, partitions=5).map(lambda x: (x % 4, x)).group_by_key(partitions=3).count()
    kinds = [(s["kind"], s["tasks"]) for s in cl.stage_stats()[n0:]]
    assert kinds == [("map", 5), ("count", 3)]


# ---- arguments ------------------------------------------------------------------------

@pytest.mark.parametrize("workers", [0, -1, True, 1.5, "2"])
def test_bad_worker_count_is_a_config_error(workers):
    with pytest.raises(clamor.ConfigError):
        clamor.Cluster(workers=workers)


def test_bad_arguments_are_config_errors(cl, tmp_path):
    with pytest.raises(clamor.ConfigError):
        clamor.Cluster(workers=1, slots=0)
    for bad in (0, -2, 1.5, True):
        with pytest.raises(clamor.ConfigError):
            cl.parallelize([1, 2, 3], partitions=bad)
        with pytest.raises(clamor.ConfigError):
            cl.range(10, partitions=bad)
    with pytest.raises(clamor.ConfigError):
        cl.range(0, 10, 0)
    with pytest.raises(ValueError):             # a ConfigError is a ValueError, too
        cl.range(5, 1, 0)
    f = tmp_path / "t.txt"
    f.write_text("x\n")
    with pytest.raises(clamor.ConfigError):
        cl.read_text(str(f), partitions=0)
    other = 4096 if region.page_size() != 4096 else 16384
    with pytest.raises(clamor.ConfigError):      # the region's page size is fixed
        clamor.Cluster(workers=1, page_size=other).start()
    with pytest.raises(clamor.ConfigError, match="region_size"):   # and so are its size ...
        clamor.Cluster(workers=1, region_size=region.size() * 2).start()
    with pytest.raises(clamor.ConfigError, match="base"):          # ... and its base
        clamor.Cluster(workers=1, base=region.base() + (1 << 40)).start()
    assert cl.range(3).collect() == [0, 1, 2]


# ---- logging --------------------------------------------------------------------------

def test_cluster_start_logs_at_info():
    # in its own process: this module's cluster is open, and a process runs one at a time
    out, _ = run_script("""
        import json, logging, clamor
        seen = []
        class Keep(logging.Handler):
            def emit(self, record):
                seen.append((record.levelno, record.getMessage()))
        log = logging.getLogger("clamor")
        log.addHandler(Keep())
        log.setLevel(logging.INFO)
        with clamor.Cluster(workers=1, progress=False) as c:
            total = c.range(3).sum()
        print(json.dumps({"total": total, "info": [m for lvl, m in seen if lvl == logging.INFO]}))
        """, timeout=60)
    assert out["total"] == 3
    assert out["info"] and "1 workers" in out["info"][0]


def test_one_open_cluster_per_process(cl):
    with pytest.raises(clamor.RegionInUse, match="another Cluster of this process is open"):
        clamor.Cluster(workers=1, progress=False).start()
    assert cl.range(3).collect() == [0, 1, 2]     # the open one is untouched
    closed = clamor.Cluster(workers=1, progress=False)
    closed.close()
    with pytest.raises(clamor.ClamorError, match="closed"):
        closed.start()


# ---- life cycle (subprocesses) --------------------------------------------------------

def test_close_leaves_no_child_process():
    out, _ = run_script("""
        import json, psutil, clamor
        me = psutil.Process()
        with clamor.Cluster(workers=3, progress=False) as cl:
            pids = sorted(cl.worker_pids)
            during = sorted(p.pid for p in me.children(recursive=True))
            total = cl.range(10).sum()
        cl.close()                                    # a second close does nothing
        after = [p.pid for p in me.children(recursive=True)]
        print(json.dumps({"pids": pids, "during": during, "after": after, "total": total,
                          "alive": [p for p in pids if psutil.pid_exists(p)]}))
        """, timeout=60)
    assert len(out["pids"]) == 3 and out["during"] == out["pids"]
    assert out["total"] == 45
    assert out["after"] == [] and out["alive"] == []


def test_cluster_left_open_is_closed_at_exit():
    p = subprocess.run([sys.executable, "-c", PRELUDE + textwrap.dedent("""
        cl = clamor.Cluster(workers=2, progress=False).start()
        assert cl.range(4).count() == 4
        print(json.dumps(cl.worker_pids), flush=True)
        """)], env=env(), capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert p.returncode == 0, p.stderr
    pids = json.loads(p.stdout.strip().splitlines()[-1])
    assert len(pids) == 2 and wait_gone(pids, 5.0)


def test_without_recovery_a_worker_killed_during_a_task_raises_worker_lost():
    out, err = run_script("""
        import json, logging, os, signal, threading, time, clamor
        logging.basicConfig(level=logging.WARNING)
        with clamor.Cluster(workers=2, progress=False, recover=False, replace_workers=False) as cl:
            victim = cl.worker_pids[0]
            killed = []
            def kill():
                time.sleep(1.0)
                os.kill(victim, signal.SIGKILL)
                killed.append(time.monotonic())
            threading.Thread(target=kill, daemon=True).start()
            t0 = time.monotonic()
            try:
                cl.range(4, partitions=4).map(lambda x: time.sleep(60)).collect()
                res = ["no error", "", 0]
            except clamor.WorkerLost as e:
                res = ["WorkerLost", str(e), time.monotonic() - killed[0]]
            except Exception as e:
                res = [type(e).__name__, str(e), time.monotonic() - t0]
            pids = cl.worker_pids
            t0 = time.monotonic()
            cl.close(timeout=0.5)          # the survivor is still in its task: killed after 0.5 s
            closing = time.monotonic() - t0
        print(json.dumps({"res": res, "pids": pids, "closing": closing}))
        """, timeout=60)
    kind, msg, waited = out["res"]
    assert kind == "WorkerLost", msg
    assert waited < 3.0
    assert "w0" in msg or str(out["pids"][0]) in msg
    assert "lost" in err                                # logged at WARNING by the driver
    assert out["closing"] < 3.0
    assert all(gone(p) for p in out["pids"])


def test_without_recovery_after_losing_an_idle_worker_the_survivors_carry_on():
    out, _ = run_script("""
        import json, os, signal, time, clamor
        with clamor.Cluster(workers=2, progress=False, recover=False, replace_workers=False) as cl:
            assert cl.range(10).sum() == 45
            os.kill(cl.worker_pids[1], signal.SIGKILL)
            time.sleep(0.3)
            first = None
            try:
                first = cl.range(8, partitions=8).sum()
            except clamor.WorkerLost as e:
                first = "WorkerLost"
            again = cl.range(8, partitions=8).sum()
            workers = cl.stats()["workers"]
        print(json.dumps({"first": first, "again": again, "workers": workers}))
        """, timeout=60)
    assert out["first"] in (28, "WorkerLost")    # it may notice the loss before or during that stage
    assert out["again"] == 28
    assert out["workers"] == 1


DRIVER = PRELUDE + """
cl = clamor.Cluster(workers=2, progress=False).start()
print(json.dumps(cl.worker_pids), flush=True)
if sys.argv[1] == "busy":
    cl.range(2, partitions=2).map(lambda x: time.sleep(60)).collect()
else:
    time.sleep(60)
"""


@pytest.mark.parametrize("mode", ["idle", "busy"])
def test_workers_exit_when_the_driver_is_killed(mode):
    p = subprocess.Popen([sys.executable, "-c", DRIVER, mode], env=env(), stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        line = p.stdout.readline()
        pids = json.loads(line)
        assert len(pids) == 2 and not any(gone(w) for w in pids)
        time.sleep(0.5)                                   # busy: the tasks are running
        p.send_signal(signal.SIGKILL)
        p.wait(10)
        assert wait_gone(pids, 5.0), [(w, not gone(w)) for w in pids]
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
        p.stdout.close()
        p.stderr.close()


# ---- progress bar ---------------------------------------------------------------------

SLOW = PRELUDE + """
with clamor.Cluster(workers=2{arg}) as cl:
    assert cl.range(10).sum() == 45                   # a short stage: never a bar
    sys.stderr.write("LONG STAGE NEXT\\n")
    sys.stderr.flush()
    print(cl.range(4, partitions=4).map(lambda x: time.sleep(1.5) or x).sum(), flush=True)
"""


def start_slow(arg="", tty=False):
    """Start the SLOW script (a ~3 s stage) with stderr on a pseudo-terminal
    (``tty``) or a pipe.  Returns a function that waits for it and returns
    (stdout, stderr)."""
    cmd = [sys.executable, "-c", SLOW.replace("{arg}", arg)]
    if not tty:
        p = subprocess.Popen(cmd, env=env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)

        def finish():
            out, err = p.communicate(timeout=60)
            assert p.returncode == 0, err
            return out, err
        return finish
    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 120, 0, 0))
    p = subprocess.Popen(cmd, env={**env(), "TERM": "xterm"}, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                         stderr=slave, cwd=ROOT)
    os.close(slave)

    def finish():
        chunks, deadline = [], time.monotonic() + 60
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 0.2)
            if ready:
                try:
                    data = os.read(master, 65536)
                except OSError:            # EIO: every writer of the terminal is gone
                    break
                if not data:
                    break
                chunks.append(data)
            elif p.poll() is not None:
                break
        os.close(master)
        out = p.stdout.read().decode()
        p.stdout.close()
        assert p.wait(10) == 0
        return out, b"".join(chunks).decode("utf-8", "replace")
    return finish


def test_progress_bar_on_a_terminal_only_for_long_stages():
    shown, hidden = start_slow(tty=True), start_slow(", progress=False", tty=True)
    out, err = shown()
    assert out.strip() == "6"
    before, _, after = err.partition("LONG STAGE NEXT")
    assert before.strip() == ""                                          # the short stage drew nothing
    assert "%|" in after and "stage" in after and "/4" in after          # tqdm: "stage N: sum: 50%|... 2/4"
    out, err = hidden()
    assert out.strip() == "6"
    assert err.replace("\r", "").strip() == "LONG STAGE NEXT"


def test_no_progress_bar_when_stderr_is_not_a_terminal():
    silent, forced = start_slow(), start_slow(", progress=True")
    out, err = silent()
    assert out.strip() == "6"
    assert err.strip() == "LONG STAGE NEXT"
    out, err = forced()                                      # progress=True shows it anyway
    assert out.strip() == "6"
    assert "%|" in err.partition("LONG STAGE NEXT")[2]


def test_driver_memory_stays_flat_over_many_stages():
    """An iterative job runs stages without end: what the driver keeps per
    stage (the scheduler's stages and task keys, the payloads each worker
    was sent) must not grow with them.  The history the scheduler and
    stage_stats() keep (1024 and 1000 stages by default, 64 here: a driver
    script whose Scheduler and StageAccounts take 64 for their defaults) is
    filled first, over 300 stages.  The driver's traced memory also takes
    one-time steps of about 1 MiB (CPython's table of interned strings
    doubles: when depends on what was imported before), so it is measured
    over two windows of 200 stages: growth with the stages shows in both,
    a step in one."""
    out = scenario("""
        import tracemalloc
        from clamor.runtime import accounting, scheduler
        scheduler.Scheduler.__init__.__defaults__ = (False, None, 64)      # history=64
        accounting.StageAccounts.__init__.__defaults__ = (64,)             # keep=64
        with clamor.Cluster(workers=2, progress=False) as cl:
            g = clamor.zeros(1024)
            c = cl.range(8, partitions=2)

            def stages(n):
                for i in range(n):
                    g[i % g.size] = i                       # a global updated every stage
                    assert c.map(lambda x: x + g[0]).count() == 8

            tracemalloc.start()      # from the start: what is replaced later is freed, and counted so
            try:
                stages(300)
                kept = [cl._sched._history_len, len(cl.stage_stats())]
                grown = []
                for _ in range(2):
                    before = tracemalloc.get_traced_memory()[0]
                    stages(200)
                    grown.append(tracemalloc.get_traced_memory()[0] - before)
            finally:
                tracemalloc.stop()
        print(json.dumps({"kept": kept, "grown": grown}))
        """, timeout=300)
    assert out["kept"] == [64, 64], out            # the histories were full before the measure
    assert min(out["grown"]) < 100 * KIB, f"the driver grew {out['grown']} bytes over two windows of 200 stages"
