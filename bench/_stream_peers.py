"""Spark, Dask and Ray on streaming.py's rounds: each peer re-sends the
whole updated table every round, the way a user of that system publishes
a changed global, and runs the same lookups on as many single-core worker
processes as clamor has workers.

  spark  ``local-cluster[W,1,executor_mb]`` (``_peers.spark``): each round
         ``bc = sc.broadcast(table)`` (TorrentBroadcast of the pickled
         table), ``sc.parallelize(shares, W).map(task reading
         bc.value).collect()``, then ``bc.destroy()``.
  dask   ``LocalCluster(n_workers=W, threads_per_worker=1,
         processes=True)`` (``_peers.dask``): each round
         ``f = client.scatter(table, broadcast=True)``, one
         ``client.submit(task, f, share)`` per share, ``client.gather``,
         then ``f.release()``.
  ray    ``ray.init(num_cpus=W, include_dashboard=False)``
         (``_peers.ray_session``): each round ``ref = ray.put(table)`` (one
         object in the object store), one remote task per share reading it
         zero-copy, ``ray.get``; the reference dropped at the round's end.

A round is timed from the publish to the release of the table, after the
driver's in-place update of one value (not timed, as clamor's is not).
Before round 0, untimed: every worker has started and run one small task
through a small broadcast / scatter / put of its own, so start-up is in no
round.  Every round's answers are checked against the driver's own values
here (``WrongAnswer``), and by streaming.py against clamor's.

``start(system, workers, **conf)`` is the one place every system, clamor
included, is started.  ``child`` runs one peer in its own process
(streaming.py ``--run SYSTEM``), ``run_system`` starts that process and
reads what it wrote.  This module is imported only by streaming.py and by
processes it starts; the kernel (``task``) and the workload come from
streaming.py, so that the peers' cloudpickle sends them by value (a
function of ``__main__``) and no worker needs to import this module.
"""
import os
import time

import _peerhosts

SYSTEMS = ("spark", "dask", "ray")


class WrongAnswer(RuntimeError):
    """A peer's answers differ from the driver's: the comparison is void."""


def start(system, workers, hosts=None, **conf):
    """The context manager that starts ``system`` with ``workers`` worker
    processes on this host and stops all of it on leaving: "clamor" a
    ``clamor.Cluster`` (``conf``: its keyword arguments), "spark" (``conf``:
    executor_mb, driver_memory), "dask", "ray".  With ``hosts`` (namespace
    hosts, ``_peerhosts``): one worker per host instead."""
    if hosts is not None:
        if system == "clamor":
            return _peerhosts.clamor_cluster(hosts, progress=False, **conf)
        if system == "spark":
            return _peerhosts.spark(hosts, conf["executor_mb"], conf["driver_memory"], app="streaming",
                                    conf={"spark.ui.showConsoleProgress": "false"})
        if system == "dask":   # the Active Memory Manager would drop the broadcast's replicas
            return _peerhosts.dask(hosts, config=_peerhosts.DASK_AMM_OFF)
        return _peerhosts.ray_session(hosts)
    if system == "clamor":
        import clamor

        return clamor.Cluster(workers=workers, progress=False, **conf)
    import _peers

    if system == "spark":
        # no console progress bar (display only): it would garble the rounds' lines
        return _peers.spark(workers, executor_mb=conf["executor_mb"], driver_memory=conf["driver_memory"],
                            app="streaming", conf={"spark.ui.showConsoleProgress": "false"})
    if system == "dask":
        return _peers.dask(workers)
    if system == "ray":
        return _peers.ray_session(workers)
    raise ValueError(f"unknown system {system!r}")


# ---- the rounds ----------------------------------------------------------------------------

def run_rounds(wl, name, publish, lookups, retire):
    """Every round of ``wl``: its update, then publish(table) -> h,
    lookups(h, shares) -> [(answer, pid)] in share order, retire(h).
    Returns {"times", "phases" (publish, lookups, release), "answers",
    "workers_used"} per round and "worker_processes_seen" over them all."""
    out = {"times": [], "phases": [], "answers": [], "workers_used": []}
    seen = set()
    for r in range(wl.rounds):
        shares, expect = wl.begin(r)
        t0 = time.perf_counter()
        h = publish(wl.table)
        t1 = time.perf_counter()
        res = lookups(h, shares)
        t2 = time.perf_counter()
        retire(h)
        h = None   # Ray frees an object when its last reference goes
        t3 = time.perf_counter()
        got = [tuple(a) for a, _ in res]
        if got != expect:
            raise WrongAnswer(f"{name}, round {r}: answers {got}, the driver's {expect}")
        used = len({pid for _, pid in res})
        seen |= {pid for _, pid in res}
        out["times"].append(t3 - t0)
        out["phases"].append((t1 - t0, t2 - t1, t3 - t2))
        out["answers"].append(got)
        out["workers_used"].append(used)
        print(f"  {name:>5} round {r}: {t3 - t0:8.4f} s (publish {t1 - t0:.4f}, lookups {t2 - t1:.4f}, "
              f"release {t3 - t2:.4f}); {used} worker processes", flush=True)
    out["worker_processes_seen"] = len(seen)   # more than W: a system started new ones between rounds
    return out


def warm_check(name, got, want):
    if [tuple(a) for a, _ in got] != want:
        raise WrongAnswer(f"{name}: the warm-up answers are wrong")
    return len({pid for _, pid in got})


def run_spark(wl, task, warm, conf, hosts=None):

    W = wl.workers
    tiny, tkeys, tbits, tans = warm
    with start("spark", W, hosts, **conf) as sc:
        end = time.monotonic() + 120
        while len(sc._jsc.sc().statusTracker().getExecutorInfos()) - 1 < W and time.monotonic() < end:
            time.sleep(0.2)   # executors register after the context is up
        bc = sc.broadcast(tiny)
        warm_check("spark", sc.parallelize([tkeys] * W, W).map(lambda q: task(bc.value, q, tbits, 0.3)).collect(),
                   [tans] * W)
        bc.destroy()
        execs = len(sc._jsc.sc().statusTracker().getExecutorInfos()) - 1   # less the driver's
        print(f"  spark: {sc.version}, master {sc.master}, {execs} executors", flush=True)
        bits = wl.bits
        links = _peerhosts.LinkWindow(hosts)

        def lookups(bc, shares):
            return sc.parallelize(shares, len(shares)).map(lambda q: task(bc.value, q, bits)).collect()

        out = run_rounds(wl, "spark", sc.broadcast, lookups, lambda bc: bc.destroy())
        out.update(version=sc.version, master=sc.master, executor_processes=execs, link_bytes=links.bytes())
    # one host: the pickled table to each executor, a lower bound; namespace hosts: what crossed the links
    out["bytes"] = out["link_bytes"] if hosts is not None else wl.table.nbytes * W * wl.rounds
    return out


def run_dask(wl, task, warm, conf, hosts=None):
    W = wl.workers
    tiny, tkeys, tbits, tans = warm
    with start("dask", W, hosts) as client:
        import distributed

        f = client.scatter(tiny, broadcast=True)
        used = warm_check("dask", client.gather([client.submit(task, f, tkeys, tbits, 0.3, pure=False)
                                                 for _ in range(W)]), [tans] * W)
        f.release()
        print(f"  dask: {distributed.__version__}, {len(client.scheduler_info()['workers'])} workers, "
              f"{used} ran the warm-up", flush=True)
        bits = wl.bits
        links = _peerhosts.LinkWindow(hosts)

        def lookups(f, shares):
            return client.gather([client.submit(task, f, q, bits, pure=False) for q in shares])

        out = run_rounds(wl, "dask", lambda t: client.scatter(t, broadcast=True), lookups, lambda f: f.release())
        out.update(version=distributed.__version__, link_bytes=links.bytes())
    out["bytes"] = out["link_bytes"] if hosts is not None else wl.table.nbytes * W * wl.rounds
    return out


def run_ray(wl, task, warm, conf, hosts=None):
    import _peers

    W = wl.workers
    tiny, tkeys, tbits, tans = warm
    with start("ray", W, hosts) as ray:
        look = ray.remote(task)
        pids = _peers.ray_wait_workers(ray, W)
        ref = ray.put(tiny)   # 1 MiB: in the object store, not inlined
        warm_check("ray", ray.get([look.remote(ref, tkeys, tbits, 0.3) for _ in range(W)]), [tans] * W)
        del ref
        print(f"  ray: {ray.__version__}, {len(pids)} worker processes", flush=True)
        bits = wl.bits
        links = _peerhosts.LinkWindow(hosts)

        def lookups(ref, shares):
            return ray.get([look.remote(ref, q, bits) for q in shares])

        out = run_rounds(wl, "ray", ray.put, lookups, lambda ref: None)
        out.update(version=ray.__version__, worker_processes=len(pids), link_bytes=links.bytes())
    # one host: one copy into its object store, read in place by the workers
    out["bytes"] = out["link_bytes"] if hosts is not None else wl.table.nbytes * wl.rounds
    return out


RUNNERS = {"spark": run_spark, "dask": run_dask, "ray": run_ray}


# ---- one process per peer ------------------------------------------------------------------

def child(system, wl, task, warm, conf, out, rate=None):
    """``--run SYSTEM``: run ``system`` over the workload ``wl`` (its table
    built, in plain memory); write its figures to ``out`` (JSON), or why it
    could not run ("missing"), failed ("error") or answered wrong
    ("wrong").  ``task(table, q, bits, pause=0)`` -> (answer, pid) is what
    every worker runs; ``warm`` = (a small table, its keys, its bits, the
    answer) for the warm-up task."""
    import _peers

    def run():
        with _peerhosts.hosts_or_none(wl.workers, rate) as hosts:
            return RUNNERS[system](wl, task, warm, conf, hosts)

    return _peers.child_result(system, out, run, {WrongAnswer: "wrong"})


def run_system(system, cmd, out, timeout):
    """Runs ``cmd`` (streaming.py ``--run system --out out ...``) in a
    subprocess; its result dict, "error" set when it ended without one.
    Call ``_peers.subreaper()`` first so that what it leaves is found."""
    import _peers

    res = _peers.run_child(system, cmd, out, timeout)
    if "answers" in res:
        res["answers"] = [[tuple(a) for a in rnd] for rnd in res["answers"]]
    return res


def why_not(res):
    """Why a peer has no times (None when it has them)."""
    if "times" in res:
        return None
    return res.get("missing") or res.get("wrong") or res.get("error") or "not run"


def run_peers(systems, cmd, timeout):
    """Runs each of ``systems`` through ``cmd + ["--run", system, "--out",
    file]``, one after another; {system: its result}.  This process is made
    the children's subreaper first (see ``_peers``): call it while it has
    no other children."""
    import shutil
    import tempfile

    import _peers

    if not systems:
        return {}
    _peers.subreaper()
    d = tempfile.mkdtemp(prefix="streaming-")
    out = {}
    try:
        for s in systems:
            print(f"-- {s}: the table re-sent every round", flush=True)
            path = os.path.join(d, f"{s}.json")
            r = out[s] = run_system(s, cmd + ["--run", s, "--out", path], path, timeout)
            if r.get("wrong"):
                raise SystemExit(f"streaming: {r['wrong']}: the comparison is void")
            why = why_not(r)
            if why:
                print(f"  {s}: not run: {why}", flush=True)
                continue
            rest = r["times"][1:]
            print(f"  {s}: {sum(rest) / len(rest):.4f} s a round after the first (first {r['times'][0]:.4f} s); "
                  f"{r['wall_s']:.0f} s with start-up" + (f"; left behind and killed: {r['left_behind']}"
                                                          if r.get("left_behind") else ""), flush=True)
    finally:
        shutil.rmtree(d, ignore_errors=True)
    return out
