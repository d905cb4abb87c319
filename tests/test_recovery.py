"""Lineage-based recovery and speculative copies, with real processes killed
for real (SIGKILL) or stopped (SIGSTOP).  Each scenario runs in a
subprocess: its own driver, its own cluster.

The seeded runs kill workers at random moments of a job that caches, updates
a global, shuffles and joins; every run must give exactly the result of a
run without failure (the expected values are computed in the driver with
plain Python, at the version each stage must read).
"""
import pytest

from helpers import PRELUDE, gone, run_script

# Each test whose workers read region pages or join a running cluster runs
# with workers that map the driver's pages and with workers that fetch them
# (conftest.same_host); those about serving peers, fetch only.  The tests
# whose workers never touch a region page run once.
both_modes = pytest.mark.usefixtures("same_host")

SEEDED = PRELUDE + """
import random

SEEDS = [int(s) for s in sys.argv[1].split(",")]
N = 1 << 19                                   # 4 MiB global: 64 pages of 64 KiB
g = clamor.empty(N, "i8")
g[:] = np.arange(N) * 3
NUMS = 3000
before = [int(x) for x in g[(np.arange(NUMS) * 997) % N]]

def expected():
    cached = [(i % 23, before[i]) for i in range(NUMS)]
    sums = {}
    for k, v in cached:
        sums[k] = sums.get(k, 0) + v
    after = g.copy()                          # the update below, applied to a plain copy
    after[:] = after * 2 + 1
    joined = sorted((k, sums[k] + k * 10 + int(after[k * 1000])) for k in sums)
    return len(cached), sorted(sums.items()), joined, int(after[::4096].sum())

EXPECT = expected()

def pause(x):
    time.sleep(0.02)                          # tasks take a while, so kills land inside stages
    return x

def job(cl):
    words = cl.range(NUMS, partitions=9).map(lambda i: (i % 23, int(g[(i * 997) % N]))).map_partitions(pause)
    words = words.cache()
    n = words.count()                               # stage: computes and caches, at the first version
    g[:] = g * 2 + 1                                # the driver updates the global between stages
    sums = words.reduce_by_key(lambda a, b: a + b)  # shuffle over the cached partitions (old version)
    s = sorted(sums.collect())
    right = cl.parallelize([(k, k * 10) for k in range(23)], 3).map_partitions(pause)
    joined = sorted(sums.join(right).map(lambda kv: (kv[0], kv[1][0] + kv[1][1] + int(g[kv[0] * 1000])))
                    .map_partitions(pause).collect())
    # many tasks reading the same pages: peers serve them to each other
    hot = cl.range(0, N, 4096, partitions=12).map(lambda i: int(g[i])).map_partitions(pause).sum()
    return (n, s, joined, hot)

def cluster():
    return clamor.Cluster(workers=3, progress=False, replication="random", speculation=False)

g[:] = np.arange(N) * 3
with cluster() as cl:                         # a run without failure: its length spreads the kills
    t0 = time.monotonic()
    assert job(cl) == EXPECT
    span = time.monotonic() - t0

out = []
for seed in SEEDS:
    rnd = random.Random(seed)
    g[:] = np.arange(N) * 3                  # the same globals at the start of every run
    with cluster() as cl:
        kills, victims = [], set()
        plan = [rnd.uniform(0.0, 1.1 * span) for _ in range(rnd.choice([1, 1, 2]))]
        stop = threading.Event()

        def killer():
            t0 = time.monotonic()
            for at in sorted(plan):
                if stop.wait(max(0.0, at - (time.monotonic() - t0))):
                    return
                pids = [p for p in cl.worker_pids if p not in victims]   # (a dead one may be listed a while)
                if pids:
                    victim = rnd.choice(pids)
                    try:
                        os.kill(victim, signal.SIGKILL)
                        kills.append(round(time.monotonic() - t0, 3))
                        victims.add(victim)
                    except ProcessLookupError:
                        pass
        th = threading.Thread(target=killer)
        th.start()
        got = job(cl)
        stop.set()
        th.join()
        deadline = time.monotonic() + 30         # a kill just before the end is noticed too
        while victims & set(cl.worker_pids) and time.monotonic() < deadline:
            cl._check_liveness()
            time.sleep(0.02)
        cl._check_liveness()
        rec = cl.stats()["recovery"]
        pids = cl.worker_pids + [p for p in cl._pids]
    out.append({"seed": seed, "ok": got == EXPECT, "kills": kills, "lost": rec["workers_lost"],
                "rerun": rec["tasks_rerun"], "jobs": rec["recovery_jobs"], "pids": pids, "span": span,
                "diff": None if got == EXPECT else [repr(got)[:300], repr(EXPECT)[:300]]})
print(json.dumps(out))
"""


def test_workers_killed_at_random_moments_give_the_exact_result(same_host):
    # ten seeds, five in each mode (each mode with all ten took 45 s of the suite)
    seeds = {"map": "1,2,3,4,5", "fetch": "6,7,8,9,10"}[same_host]
    runs, _ = run_script(SEEDED, timeout=400, args=[seeds])
    assert len(runs) == len(seeds.split(","))
    for r in runs:
        assert r["ok"], r
        assert r["lost"] == len(r["kills"]), r        # each kill noticed once, nothing else lost
        assert all(gone(pid) for pid in r["pids"])      # no process left behind
    # the moments spread over the job, so some runs had work to redo
    assert sum(r["rerun"] + r["jobs"] for r in runs) > 0, runs


@both_modes
def test_lost_cached_partitions_are_recomputed_at_their_own_version():
    """The paper's point: lineage includes the page versions read.  The
    cached partitions were made before the update, so their re-run must read
    the old bytes, while a new stage reads the new ones."""
    out, err = run_script("""
        import json, logging, os, signal, time
        import numpy as np
        import clamor

        class Reruns(logging.Handler):                    # the driver's INFO line of each recomputation
            def __init__(self):
                super().__init__(logging.INFO)
                self.seen = []
            def emit(self, record):
                if record.msg.startswith("recomputing "):
                    self.seen.append([record.args[0], record.args[-1]])   # partitions, stage
        reruns = Reruns()
        logging.getLogger("clamor").addHandler(reruns)
        logging.getLogger("clamor").setLevel(logging.INFO)

        g = clamor.zeros(1 << 18, "i8")
        g[:] = 7
        with clamor.Cluster(workers=3, progress=False, speculation=False) as cl:
            c = cl.range(600, partitions=6).map(lambda i: int(g[i * 400])).cache()
            first = c.sum()
            made_at = cl.stage_stats()[-1]["stage"]
            g[:] = 1000                                   # every page changes
            held = [w for (cid, p), w in cl._lineage.cache.items() if cid == c.id]
            victim = sorted(held)[0]
            os.kill(cl._pid_of[victim], signal.SIGKILL)
            time.sleep(0.2)
            again = c.sum()                               # lost partitions recomputed at the old version
            again_at = cl.stage_stats()[-1]["stage"]
            fresh = cl.range(600, partitions=6).map(lambda i: int(g[i * 400])).sum()
            rec = cl.stats()["recovery"]
        print(json.dumps({"first": first, "again": again, "fresh": fresh, "rec": rec, "made_at": made_at,
                          "again_at": again_at, "lost": held.count(victim), "reruns": reruns.seen}))
        """, timeout=240)
    assert out["first"] == 600 * 7
    assert out["again"] == 600 * 7, out
    assert out["fresh"] == 600 * 1000
    assert out["rec"]["workers_lost"] == 1 and out["rec"]["recovery_jobs"] >= 1
    # the driver said so: the victim's partitions, and only they, were
    # recomputed at the stage that cached them, not at the stage that read them
    assert out["reruns"] and all(stage == out["made_at"] for _, stage in out["reruns"]), (out, err[-3000:])
    assert sum(n for n, _ in out["reruns"]) == out["lost"] > 0, out
    assert out["again_at"] > out["made_at"], out


@both_modes
@pytest.mark.fetch_path
def test_a_worker_killed_while_serving_pages_to_peers():
    """Every worker reads the same hot pages, so with replication the driver
    redirects requests to holders; one holder dies mid-stage.  Requests to it
    fall back to the driver and its tasks run again elsewhere."""
    out, _ = run_script("""
        import json, os, signal, threading, time
        import numpy as np
        import clamor
        hot = clamor.empty(1 << 20, "f8")                 # 8 MiB, 128 pages
        hot[:] = np.arange(hot.size) % 1000
        with clamor.Cluster(workers=4, progress=False, replication="random", speculation=False) as cl:
            warm = cl.range(8, partitions=8).map(lambda i: float(hot[i::997].sum())).collect()
            hot[:] = hot + 1                              # new versions: holders re-learned this stage
            victim = cl.worker_pids[1]
            def kill():
                time.sleep(0.4)
                os.kill(victim, signal.SIGKILL)
            th = threading.Thread(target=kill)
            th.start()
            def slow_read(i):
                tot = 0.0
                for j in range(0, hot.size, 8192):        # every page, slowly
                    tot += float(hot[(j + i) % hot.size])
                    time.sleep(0.002)
                return tot
            got = cl.range(16, partitions=16).map(slow_read).collect()
            th.join()
            st = cl.stats()
        exp = [float(sum((hot[(j + i) % hot.size]) for j in range(0, hot.size, 8192))) for i in range(16)]
        print(json.dumps({"ok": got == exp, "redirects": st["replication"]["redirects"],
                          "lost": st["recovery"]["workers_lost"], "rerun": st["recovery"]["tasks_rerun"]}))
        """, timeout=240)
    assert out["ok"], out
    assert out["lost"] == 1
    assert out["redirects"] > 0                          # peers were serving pages
    assert out["rerun"] >= 1                             # the victim died holding tasks


@both_modes
def test_replacement_workers_join_and_take_tasks():
    out, _ = run_script("""
        import json, os, signal, time, clamor
        with clamor.Cluster(workers=2, progress=False) as cl:
            before = cl.worker_pids
            os.kill(before[0], signal.SIGKILL)
            total = cl.range(200, partitions=20).map(lambda x: (x, os.getpid())).collect()
            # (speculative copies may finish that job before the loss is noticed)
            deadline = time.monotonic() + 30
            while before[0] in cl.worker_pids and time.monotonic() < deadline:
                cl._check_liveness()
                time.sleep(0.05)
            after = cl.worker_pids

            def slow_sum(it):
                time.sleep(0.05)                      # long enough for the replacement to join
                return [(sum(it), os.getpid())]
            again = cl.range(200, partitions=20).map_partitions(slow_sum).collect()
            ran_on = sorted({pid for _, pid in total})
            ran_again = sorted({pid for _, pid in again})
            rec = cl.stats()["recovery"]
        print(json.dumps({"before": before, "after": after, "ran_on": ran_on, "ran_again": ran_again,
                          "sum": sum(x for x, _ in total), "sum2": sum(x for x, _ in again), "rec": rec}))
        """, timeout=240)
    assert out["sum"] == out["sum2"] == sum(range(200))
    assert out["before"][0] not in out["after"] and len(out["after"]) == 2
    assert out["rec"]["workers_lost"] == 1 and out["rec"]["workers_replaced"] == 1
    assert out["before"][0] not in out["ran_on"] + out["ran_again"]
    replacement = [p for p in out["after"] if p not in out["before"]]
    assert replacement and replacement[0] in out["ran_again"]      # the replacement takes tasks
    assert all(gone(p) for p in out["before"] + out["after"])


@both_modes
def test_a_replacement_killed_before_it_joins_is_noticed_and_replaced():
    out, _ = run_script("""
        import json, os, signal, time, clamor
        with clamor.Cluster(workers=2, progress=False) as cl:
            first = cl.worker_pids
            os.kill(first[0], signal.SIGKILL)
            while len(cl._workers) == 2:              # the driver notices and forks a replacement
                cl._check_liveness()
                time.sleep(0.01)
            starting = [p for p in cl.worker_pids if p not in first]
            os.kill(starting[0], signal.SIGKILL)      # before its HELLO is read: never joined
            total = cl.range(200, partitions=20).map(lambda x: (x, os.getpid())).collect()
            time.sleep(0.6)
            cl._check_liveness()
            after = cl.worker_pids
            ran_on = sorted({pid for _, pid in total})
            rec = cl.stats()["recovery"]
        print(json.dumps({"first": first, "starting": starting, "after": after, "ran_on": ran_on,
                          "sum": sum(x for x, _ in total), "rec": rec}))
        """, timeout=240)
    assert out["sum"] == sum(range(200))
    assert len(out["starting"]) == 1
    assert out["rec"]["workers_lost"] == 2 and out["rec"]["workers_replaced"] == 2, out
    assert len(out["after"]) == 2 and not set(out["after"]) & {out["first"][0], out["starting"][0]}
    assert out["starting"][0] not in out["ran_on"] and out["first"][0] not in out["ran_on"]
    assert all(gone(p) for p in out["first"] + out["starting"] + out["after"])


@both_modes
def test_a_replacement_gets_its_share_of_an_iterative_job():
    # Partitions keep to the worker that ran them last (its pages are warm),
    # but no worker is preferred for more than its share: after a loss the
    # survivor ran every partition, and the replacement must not stay idle.
    out, _ = run_script("""
        import json, os, signal, time, clamor
        def where(it):
            time.sleep(0.2)
            return [(sum(it), os.getpid())]
        with clamor.Cluster(workers=2, progress=False, speculation=False) as cl:
            data = cl.range(1000, partitions=2)
            first = data.map_partitions(where).collect()
            victim = cl.worker_pids[0]
            os.kill(victim, signal.SIGKILL)
            lost = data.map_partitions(where).collect()
            deadline = time.monotonic() + 30
            while len(cl._expected) + len(cl._workers) < 2 or victim in cl.worker_pids:
                assert time.monotonic() < deadline
                cl._check_liveness()
                time.sleep(0.05)
            rounds = [data.map_partitions(where).collect() for _ in range(3)]
            pids = cl.worker_pids
        print(json.dumps({"first": first, "lost": lost, "rounds": rounds, "victim": victim, "pids": pids}))
        """, timeout=240)
    total = sum(range(1000))
    assert sum(s for s, _ in out["lost"]) == total
    assert {p for _, p in out["lost"]} == {p for p in {p for _, p in out["first"]} if p != out["victim"]}
    # the replacement joins during the first round; from the next one on, each worker runs one partition
    for r in out["rounds"][1:]:
        assert sum(s for s, _ in r) == total
        assert sorted(p for _, p in r) == sorted(out["pids"]), out


def test_a_task_that_kills_its_worker_every_time_fails_after_max_attempts():
    out, _ = run_script("""
        import json, os, time, clamor
        # One task a worker: a task that shared the dying worker would be
        # lost with it too, and could reach max_attempts first.
        with clamor.Cluster(workers=2, slots=1, progress=False, max_attempts=3, speculation=False) as cl:
            t0 = time.monotonic()
            try:
                cl.range(6, partitions=6).map(lambda x: os._exit(3) if x == 4 else x).collect()
                res = "no error"
            except clamor.WorkerLost as e:
                res = str(e)
            took = time.monotonic() - t0
            ok_after = cl.range(10).sum()                 # the cluster is usable afterwards
            rec = cl.stats()["recovery"]
            pids = cl.worker_pids
        print(json.dumps({"res": res, "took": took, "after": ok_after, "rec": rec, "pids": pids}))
        """, timeout=240)
    assert "partition 4" in out["res"] and "3 times" in out["res"], out
    assert out["rec"]["workers_lost"] == 3
    assert out["after"] == 45
    assert all(gone(p) for p in out["pids"])


def test_a_worker_lost_right_after_it_reports_is_not_sent_more_work(tmp_path):
    # The driver is stopped while a worker reports a task and dies, so that when
    # it resumes, the report (which frees a slot on that worker) and the loss
    # are handled in one batch of events: the Run decided for the freed slot
    # must not go to the lost worker.
    out, _ = run_script("""
        import json, os, signal, subprocess, sys, threading, time, clamor
        DRIVER = os.getpid()
        FLAG = os.path.join(sys.argv[1], "once")

        def task(x):
            if x == 0 and not os.path.exists(FLAG):
                open(FLAG, "w").close()
                subprocess.Popen(["sh", "-c", f"sleep 1.2; kill -CONT {DRIVER}"], start_new_session=True)
                os.kill(DRIVER, signal.SIGSTOP)
                threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGKILL)).start()
                return x
            time.sleep(0.4)
            return x

        with clamor.Cluster(workers=2, progress=False, speculation=False) as cl:
            got = cl.range(8, partitions=8).map(task).collect()
            rec = cl.stats()["recovery"]
            again = cl.range(10).sum()
        flag = os.path.exists(FLAG)
        print(json.dumps({"got": got, "rec": rec, "again": again, "flag": flag}))
        """, args=[str(tmp_path)], timeout=240)
    assert out["flag"]
    assert out["got"] == list(range(8)), out
    assert out["rec"]["workers_lost"] == 1, out
    assert out["again"] == 45


def test_without_replacements_losing_the_last_worker_raises():
    out, _ = run_script("""
        import json, os, signal, threading, time, clamor
        with clamor.Cluster(workers=1, progress=False, replace_workers=False) as cl:
            victim = cl.worker_pids[0]
            threading.Timer(0.5, os.kill, (victim, signal.SIGKILL)).start()
            t0 = time.monotonic()
            try:
                cl.range(4, partitions=4).map(lambda x: time.sleep(30)).collect()
                res = "no error"
            except clamor.WorkerLost as e:
                res = str(e)
            took = time.monotonic() - t0
        print(json.dumps({"res": res, "took": took}))
        """, timeout=240)
    assert "no live workers" in out["res"]
    assert out["took"] < 5


STRAGGLER = PRELUDE + """

def task(i):
    for _ in range(10):          # 0.2 s in small sleeps: a stopped process cannot go on between them
        time.sleep(0.02)
    return i * i

def run(spec, slow):
    with clamor.Cluster(workers=3, progress=False, speculation=spec) as cl:
        cl.range(3, partitions=3).map(lambda x: x).collect()       # warm up every worker
        victim = cl.worker_pids[0]
        stop = threading.Event()

        def throttle():          # the victim runs 5% of the time
            while not stop.is_set():
                os.kill(victim, signal.SIGSTOP)
                stop.wait(0.38)
                os.kill(victim, signal.SIGCONT)
                stop.wait(0.02)
        th = threading.Thread(target=throttle)
        if slow:
            th.start()
        t0 = time.monotonic()
        res = cl.range(12, partitions=12).map(task).collect()
        took = time.monotonic() - t0
        stop.set()
        if slow:
            th.join()
        os.kill(victim, signal.SIGCONT)
        rec = cl.stats()["recovery"]
    assert res == [i * i for i in range(12)], res
    return took, rec

base, _ = run(clamor.Speculation(), slow=False)
spec, rec_on = run(clamor.Speculation(), slow=True)
nospec, rec_off = run(None, slow=True)
print(json.dumps({"base": base, "spec": spec, "nospec": nospec, "copies": rec_on["speculative_copies"],
                  "copies_off": rec_off["speculative_copies"]}))
"""


def test_speculation_rescues_a_stage_from_a_straggler():
    out, _ = run_script(STRAGGLER, timeout=240)
    assert out["copies"] >= 1 and out["copies_off"] == 0, out
    assert out["spec"] <= 2.0 * out["base"], out         # the bound
    assert out["nospec"] >= 1.5 * out["spec"], out        # and measurably slower without it


@pytest.mark.parametrize("kw", [{"speculation": "yes"}, {"speculation": 1.5}, {"max_attempts": 0},
                                {"max_attempts": True}, {"max_attempts": 2.0}])
def test_bad_recovery_settings_are_config_errors(kw):
    import clamor
    with pytest.raises(clamor.ConfigError):
        clamor.Cluster(workers=1, **kw)


@pytest.mark.parametrize("kw", [{"multiplier": 0.5}, {"quantile": 0.0}, {"quantile": 1.5}, {"min_runtime": -1}])
def test_bad_speculation_thresholds_are_config_errors(kw):
    import clamor
    with pytest.raises(clamor.ConfigError):
        clamor.Speculation(**kw)
