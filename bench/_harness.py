#!/usr/bin/env python3
"""The benchmarks' harness: the systems, the child protocol and the report.

SYSTEMS.  ``start(system, workers, hosts=None, **options)`` starts clamor,
Spark, Dask or Ray and yields its handle (a Cluster, a SparkContext, a Dask
Client, the ray module); leaving it stops every process it started.  Without
``hosts``, W single-core workers on this host; with ``hosts``
(``hosts_for(n, rate)``), one worker per namespace host, the driver in the
root namespace (bench/README.md, "The peers").  A system that cannot run
here raises ``PeerMissing`` saying why.

CHILD PROTOCOL.  Each system runs in a subprocess of its own (``--run
SYSTEM --out FILE``): ``run_systems`` in the parent, ``child_result`` in the
child, which writes a JSON dict of figures or why there are none.  The
parent is the children's subreaper: what a child leaves running is killed
and named in ``left_behind``.  A process forked from a region's driver
attaches to the region: run a peer in a process that is not a driver.

REPORT.  ``parser``, ``med``, ``ratio``, ``pick_systems``, ``missing`` and
``json_line`` (every script's last line; also bench/results/NAME.json).

    python bench/_harness.py --selftest [--hosts 2] [--rate 1gbit] [--mib 64] [--systems clamor,spark,dask,ray]

checks each system on fresh namespace hosts (needs root).  Longer than the
house's 600 lines: the one home of the four systems and of their stop.
"""
import argparse
import contextlib
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
import uuid
from unittest import mock

from _common import HOST_ENV, _script, die_with_parent, ratio  # noqa: F401  (ratio: the benchmarks')

HERE = os.path.dirname(os.path.abspath(__file__))
RESULTS = os.path.join(HERE, "results")
SYSTEMS = ("clamor", "spark", "dask", "ray")
JAVA_HINT = "install Java 17 (Debian: apt-get install openjdk-17-jre-headless) or set JAVA_HOME"
TAG_ENV = "CLAMOR_PEERHOSTS_TAG"      # marks every process a hosts context started, and their descendants
RAY_OBJECT_STORE_MB = 2048            # per node on namespace hosts: 5 x 30% of RAM would not fit /dev/shm
START_TIMEOUT, STOP_GRACE = 120.0, 10.0
# The Active Memory Manager drops the replicas scatter(broadcast=True) makes,
# and tasks fetch them again over the slow links: a user who broadcasts turns it off.
DASK_AMM_OFF = {"distributed.scheduler.active-memory-manager.start": False}


class PeerMissing(RuntimeError):
    """The system cannot run here; str() says why and what to install."""


# ---- the report ----------------------------------------------------------------------

def med(xs, key=None):
    """The median of ``xs`` (of ``x[key]`` for each x with ``key``); None when empty."""
    xs = [x[key] for x in xs] if key is not None else list(xs)
    return statistics.median(xs) if xs else None


def parser(description, quick, smoke, build=False):
    """A script's ArgumentParser with its two sizes, ``--quick`` and
    ``--smoke`` (one or neither), ``quick`` and ``smoke`` their help; with
    ``build``, ``--no-build`` (for ``_common.ensure_built``)."""
    ap = argparse.ArgumentParser(description=description)
    size = ap.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true", help=quick)
    size.add_argument("--smoke", action="store_true", help=smoke)
    if build:
        ap.add_argument("--no-build", action="store_true", help="do not rebuild the C core even if it is stale")
    return ap


# The peers a --smoke run leaves out unless --systems names them: the test
# machine installs clamor's "test" extra (Dask, not Ray nor pyspark) and has
# no Java, and either's start-up alone takes longer than a whole smoke run.
SMOKE_LEAVES_OUT = {
    "spark": "left out under --smoke (a JVM per executor, Java 17 needed; name it in --systems to run it)",
    "ray": "left out under --smoke (not in the test extra, slow to start; name it in --systems to run it)",
}


def smoke_systems(systems, named):
    """(the systems a --smoke run keeps, {system: why left out}); every
    system stays when ``named`` (--systems was given)."""
    if named:
        return list(systems), {}
    out = {s: why for s, why in SMOKE_LEAVES_OUT.items() if s in systems}
    for s, why in out.items():
        print(f"smoke: {s} {why}", flush=True)
    return [s for s in systems if s not in out], out


def pick_systems(ap, args, known, default):
    """The systems ``--systems`` asks for (``default`` without it), each
    one of ``known``, less what --smoke leaves out: (systems, {system: why
    left out})."""
    named = args.systems is not None
    asked = [s for s in (args.systems if named else ",".join(default)).split(",") if s]
    if set(asked) - set(known):
        ap.error(f"--systems: unknown {sorted(set(asked) - set(known))}; choose among {','.join(known)}")
    return smoke_systems(asked, named) if args.smoke else (asked, {})


def missing(system, res, left_out=None):
    """Why ``system`` has no figures: ``res`` (its child's result) is None
    when it was not run, left out by --smoke (``left_out``) or not asked for."""
    if res is None:
        return (left_out or {}).get(system, "not requested (--systems)")
    return why_not(res) or "not run"


def _commit():
    try:
        out = subprocess.run(["git", "-C", HERE, "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                             timeout=10)
        return out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def json_line(figures, name=None):
    """Print ``figures`` as one JSON object on one line: the script's last
    line.  The same figures go to bench/results/NAME.json (NAME: the
    script's, with "-quick" for a --quick run) with the date, the commit and
    the command line, for bench/figures.py; not under ``--smoke``."""
    print(json.dumps(figures), flush=True)
    if "--smoke" in sys.argv:
        return
    name = name or _script() + ("-quick" if "--quick" in sys.argv else "")
    record = {"bench": name, "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "commit": _commit(),
              "argv": sys.argv[1:], "machine": {"cpus": os.cpu_count(), "mem_bytes": os.sysconf("SC_PAGE_SIZE")
                                                * os.sysconf("SC_PHYS_PAGES")},
              "figures": figures}
    try:
        os.makedirs(RESULTS, exist_ok=True)
        with open(os.path.join(RESULTS, f"{name}.json"), "w") as f:
            json.dump(record, f, indent=1, default=str)
            f.write("\n")
    except OSError as err:   # (a read-only checkout: the line above is the result)
        print(f"could not write bench/results/{name}.json: {err}", file=sys.stderr)


def last_json_line(text):
    """The JSON object on the last line of ``text``; IndexError when there
    is no line, ValueError when it is not JSON."""
    return json.loads(text.strip().splitlines()[-1])


# ---- processes -------------------------------------------------------------------------

def subreaper():
    """Make this process the child subreaper (PR_SET_CHILD_SUBREAPER): its
    descendants' orphans come back to it, and ``reap_descendants`` finds them."""
    try:
        import ctypes

        return ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):  # pragma: no cover - Linux only
        return False


def descendants(exclude=()):
    """The live processes below this one (psutil), minus the pids in ``exclude``."""
    import psutil

    out = []
    for p in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.NoSuchProcess):
            if p.pid not in exclude and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
    return out


def reap_descendants(exclude=(), grace=5.0):
    """Terminate, then kill, every process still below this one (but
    ``exclude``); returns "name(pid): command line" of each.  The /dev/shm
    names only they held go too: a killed resource tracker cannot remove them."""
    import psutil

    from clamor.testing import leftovers

    procs = descendants(exclude)
    held = leftovers.held_shm([p.pid for p in procs])
    names = []
    for p in procs:
        with contextlib.suppress(psutil.NoSuchProcess):
            names.append(f"{p.name()}({p.pid}): {' '.join(p.cmdline())[:120]}")
            p.terminate()
    _, alive = psutil.wait_procs(procs, timeout=grace)
    for p in alive:
        with contextlib.suppress(psutil.NoSuchProcess):
            p.kill()
    psutil.wait_procs(alive, timeout=grace)
    leftovers.unlink_unheld(held)
    return names


# ---- the child protocol ------------------------------------------------------------------

def why_not(res):
    """Why a system's child has no figures (None when it has them)."""
    if res is None:
        return "not run"
    return res.get("missing") or res.get("wrong") or res.get("error")


def child_args(ap, systems, sized_for=None, timeout=3600, default=None, note=""):
    """A script's flags for its systems: ``--systems`` (``default``, a
    list; ``note`` ends its help), ``--timeout`` (seconds a child may
    take); with ``sized_for`` (what Spark's memory must hold, in words)
    ``--spark-executor-mb`` and ``--spark-driver-memory`` (``spark_memory``
    gives their defaults); and the child protocol's own, hidden: ``--run
    SYSTEM`` (one of ``systems``), ``--data DIR``, ``--out FILE``."""
    if default is not None:
        ap.add_argument("--systems", default=None,
                        help=f"which to run, comma-separated (default {','.join(default)}{note})")
    if sized_for:
        ap.add_argument("--spark-executor-mb", type=int, default=None,
                        help=f"heap of each executor JVM, MiB (default: 2 x {sized_for} + 1024)")
        ap.add_argument("--spark-driver-memory", default=None,
                        help=f"driver JVM heap (default: 4 x {sized_for}, >= 2g)")
    ap.add_argument("--timeout", type=float, default=timeout, help="seconds a system's subprocess may take")
    ap.add_argument("--run", choices=systems, help=argparse.SUPPRESS)
    ap.add_argument("--data", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)


def spark_memory(args, nbytes):
    """(executor MiB, driver heap) for a broadcast of ``nbytes``, unless the
    command line says: an executor 2 x it + 1 GiB, the driver 4 x it and at
    least 2g (Spark's 1g default cannot hold a 1 GiB broadcast)."""
    return (args.spark_executor_mb or 2 * nbytes // (1 << 20) + 1024,
            args.spark_driver_memory or f"{max(2, -(-4 * nbytes // (1 << 30)))}g")


def child_result(system, out, run, reasons=()):
    """In a ``--run SYSTEM`` child: ``run()`` -> a dict of figures, written
    to ``out`` as JSON with ``system``; or why not: ``missing``
    (PeerMissing), the key of ``reasons`` ({exception class: key}) that
    matches, else ``error`` with the traceback.  What is still running
    below the child is killed and named in ``left_behind``; the child dies
    with its parent.  Returns 0."""
    die_with_parent()
    res = {"system": system}
    try:
        res.update(run())
    except PeerMissing as err:
        res["missing"] = str(err)
    except BaseException as err:  # noqa: BLE001 - reported to the parent, which decides
        key = next((k for cls, k in dict(reasons).items() if isinstance(err, cls)), None)
        if key:
            res[key] = str(err)
        else:
            res["error"] = f"{type(err).__name__}: {err}"
            res["traceback"] = traceback.format_exc()
            print(res["traceback"], file=sys.stderr, flush=True)
    finally:
        res["left_behind"] = reap_descendants()
        with open(out, "w") as f:
            json.dump(res, f)
    return 0


def run_child(system, cmd, out, timeout, preexec=True, exclude=()):
    """Runs ``cmd`` and returns the dict its ``child_result`` wrote
    (``error`` when there is none, a time-out included), with ``wall_s``;
    what it left running is killed and added to ``left_behind``, but the
    pids in ``exclude``.  ``preexec=False`` from a clamor driver: a fork
    running Python code would run the region's fork hooks (the child sets
    its own death signal)."""
    t = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix=f"bench-{system}-", ignore_cleanup_errors=True) as tmp:
        env = {**os.environ, "TMPDIR": tmp, "SPARK_LOCAL_DIRS": tmp}
        proc = subprocess.Popen(cmd, env=env, preexec_fn=die_with_parent if preexec else None)
        try:
            rc = proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            rc = f"{proc.wait()} (killed after {timeout:.0f} s)"
        except BaseException:
            proc.kill()
            proc.wait()
            raise
        finally:
            left = reap_descendants(exclude)
    try:
        with open(out) as f:
            res = json.load(f)
    except (OSError, ValueError):
        res = {"system": system, "error": f"the subprocess exited with status {rc} and no result"}
    res["left_behind"] = res.get("left_behind", []) + left
    res["wall_s"] = time.perf_counter() - t
    return res


def run_systems(systems, argv, d, timeout, load=None, check=None, preexec=True, heading=""):
    """Each of ``systems``, one after another, in a subprocess ``argv +
    ["--run", system, "--out", d/result-SYSTEM.json]``; {system: its result
    dict}.  ``load(system, res, out)`` reads what the child left beside
    ``out`` (when it ran); ``check(system, res)`` may stop the script.  This
    process is the children's subreaper; what was below it before is not
    touched.  ``d`` None: a temporary directory, removed after."""
    results = {}
    if not systems:
        return results
    if d is None:
        with tempfile.TemporaryDirectory(prefix="bench-", ignore_cleanup_errors=True) as tmp:
            return run_systems(systems, argv, tmp, timeout, load, check, preexec, heading)
    subreaper()
    before = {p.pid for p in descendants()}
    for s in systems:
        print(f"-- {s}{heading}", flush=True)
        out = os.path.join(d, f"result-{s}.json")
        r = results[s] = run_child(s, argv + ["--run", s, "--out", out], out, timeout, preexec, before)
        why = why_not(r)
        if why is None and load:
            load(s, r, out)
        if check:
            check(s, r)
        if why is not None:
            print(f"  {s}: not run: {why}", flush=True)
        if r.get("left_behind"):
            print(f"  {s}: left behind and killed: {r['left_behind']}", flush=True)
    return results


# ---- systems on this host ------------------------------------------------------------------

def java():
    """(path of the java binary, its version line); PeerMissing without one."""
    home = os.environ.get("JAVA_HOME")
    path = os.path.join(home, "bin", "java") if home else shutil.which("java")
    if not path or not os.access(path, os.X_OK):
        raise PeerMissing(f"Spark needs Java and none was found: {JAVA_HINT}")
    try:
        out = subprocess.run([path, "-version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError) as err:
        raise PeerMissing(f"Spark needs Java; {path} -version failed ({err}): {JAVA_HINT}") from None
    line = (out.stderr or out.stdout).strip().splitlines()
    if out.returncode != 0 or not line:
        raise PeerMissing(f"Spark needs Java; {path} -version failed: {JAVA_HINT}")
    return path, line[0]


def _pyspark():
    java()
    try:
        import pyspark
    except ImportError:
        raise PeerMissing("pyspark is not installed (pip install pyspark)") from None
    return pyspark


@contextlib.contextmanager
def _spark_local(workers, executor_mb=2048, driver_memory="4g", app="clamor-bench", conf=None):
    """A SparkContext on local-cluster[W,1,executor_mb]: W executor JVMs of
    one core; the driver JVM's heap ``driver_memory`` (1g cannot hold a 1
    GiB broadcast).  On leaving sc.stop(), then the gateway JVM's."""
    pyspark = _pyspark()
    # the executors' Python workers run this interpreter (else "python3" on PATH)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    c = pyspark.SparkConf().setMaster(f"local-cluster[{workers},1,{executor_mb}]").setAppName(app)
    c.set("spark.driver.memory", driver_memory)
    for k, v in (conf or {}).items():
        c.set(k, v)
    sc = pyspark.SparkContext(conf=c)
    sc.setLogLevel("ERROR")
    try:
        end = time.monotonic() + START_TIMEOUT
        while "spark.master" not in (conf or {}) and time.monotonic() < end and \
                len(sc._jsc.sc().statusTracker().getExecutorInfos()) - 1 < workers:
            time.sleep(0.2)   # local-cluster's executors register after the context is up
        yield sc
    finally:
        gateway = getattr(sc, "_gateway", None)
        try:
            sc.stop()
        finally:
            proc = getattr(gateway, "proc", None)
            with contextlib.suppress(Exception):   # the JVM may be gone already
                if gateway is not None:
                    gateway.shutdown()
            if proc is not None:
                with contextlib.suppress(Exception):
                    proc.stdin.close()   # the gateway JVM exits when its stdin closes
                try:
                    proc.wait(20)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
            pyspark.SparkContext._gateway = None
            pyspark.SparkContext._jvm = None


def executor_pids(sc):
    """Process ids of the executor JVMs (CoarseGrainedExecutorBackend) below this process."""
    import psutil

    out = []
    for p in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.Error):
            if any("CoarseGrainedExecutorBackend" in a for a in p.cmdline()):
                out.append(p.pid)
    return out


def _distributed():
    try:
        import dask
        import distributed
    except ImportError:
        raise PeerMissing("dask.distributed is not installed (pip install 'dask[distributed]')") from None
    return dask, distributed


@contextlib.contextmanager
def _dask_local(workers, config=None, **cluster_kwargs):
    """A Client on LocalCluster(n_workers=W, threads_per_worker=1,
    processes=True), Dask's defaults otherwise (but ``config``); its scratch
    space in a directory removed on leaving (Dask keeps /tmp/dask-scratch-space)."""
    dask, distributed = _distributed()
    with tempfile.TemporaryDirectory(prefix="bench-dask-", ignore_cleanup_errors=True) as scratch, \
            dask.config.set({**(config or {}), "temporary-directory": scratch}):
        kw = {"n_workers": workers, "threads_per_worker": 1, "processes": True, "dashboard_address": ":0"}
        kw.update(cluster_kwargs)
        cluster = distributed.LocalCluster(**kw)
        client = None
        try:
            client = distributed.Client(cluster)
            client.wait_for_workers(workers, timeout=120)
            yield client
        finally:
            try:
                if client is not None:
                    client.close()
            finally:
                cluster.close()


def _ray():
    try:
        import ray
    except ImportError:
        raise PeerMissing("ray is not installed (pip install ray)") from None
    return ray


@contextlib.contextmanager
def _ray_local(workers, **init_kwargs):
    """ray.init(num_cpus=W, include_dashboard=False), usage stats off; yields ray."""
    ray = _ray()
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")   # no report to a server outside this machine
    ray.init(**{"num_cpus": workers, "include_dashboard": False, **init_kwargs})
    try:
        yield ray
    finally:
        ray.shutdown()


def ray_wait_workers(ray, workers, timeout=120):
    """Wait until ``workers`` distinct worker processes ran a task (Ray
    starts them lazily), keeping start-up out of the timed part; their pids."""

    @ray.remote(num_cpus=1)
    def _pid(pause):
        time.sleep(pause)
        return os.getpid()

    end = time.monotonic() + timeout
    pids = set()
    while len(pids) < workers and time.monotonic() < end:
        pids |= set(ray.get([_pid.remote(0.3) for _ in range(workers)]))
    return pids


def peer_facts(system, h, ray_pids=()):
    """What a started peer runs on, after its warm-up: (a line to print,
    {"version", "processes"}); ``ray_pids``: ``ray_wait_workers``'s."""
    if system == "spark":
        n = len(h._jsc.sc().statusTracker().getExecutorInfos()) - 1   # less the driver's
        return f"Spark {h.version}, {h.master}, {n} executors", {"version": h.version, "processes": n}
    if system == "dask":
        import distributed

        n = len(h.scheduler_info(n_workers=-1)["workers"])
        return f"Dask {distributed.__version__}, {n} workers", {"version": distributed.__version__, "processes": n}
    n = len(ray_pids)
    return f"Ray {h.__version__}, {n} worker processes", {"version": h.__version__, "processes": n}


def write_json(path, obj):
    with open(path, "w") as f:
        json.dump(obj, f)


def read_json(path):
    with open(path) as f:
        return json.load(f)


# ---- the registry ------------------------------------------------------------------------

def hosts_for(n, rate):
    """A context manager: ``n`` namespace hosts whose links run at ``rate``,
    or None (``rate`` None: one host)."""
    if rate is None:
        return contextlib.nullcontext(None)
    from clamor.testing import nethosts

    return nethosts.Hosts(n, rate=rate)


def start(system, workers, hosts=None, executor_mb=2048, driver_memory="4g", app="clamor-bench", spark_conf=None,
          dask_config=None, dask_options=None, **cluster_kwargs):
    """The context manager that starts ``system`` ("clamor", "spark",
    "dask", "ray") with ``workers`` worker processes on this host, or one
    per host of ``hosts``; ``cluster_kwargs`` are clamor.Cluster's,
    ``executor_mb``, ``driver_memory``, ``app`` and ``spark_conf`` Spark's;
    ``dask_config`` is set for Dask (on hosts DASK_AMM_OFF by default),
    ``dask_options`` are LocalCluster's keywords on one host, ``dask
    worker``'s options on hosts."""
    spark = dict(executor_mb=executor_mb, driver_memory=driver_memory, app=app, conf=spark_conf)
    if hosts is not None:
        return {"clamor": lambda: _clamor_hosts(hosts, **cluster_kwargs), "spark": lambda: _spark_hosts(hosts, **spark),
                "dask": lambda: _dask_hosts(hosts, dask_config or DASK_AMM_OFF, **(dask_options or {})),
                "ray": lambda: _ray_hosts(hosts)}[system]()
    if system == "clamor":
        import clamor

        return clamor.Cluster(workers=workers, **cluster_kwargs)
    return {"spark": lambda: _spark_local(workers, **spark),
            "dask": lambda: _dask_local(workers, dask_config, **(dask_options or {})),
            "ray": lambda: _ray_local(workers)}[system]()


def shared(system, h):
    """A global shared the way a peer's users share it (bench/README.md,
    "The peers"), on the handle ``start`` yielded: (publish, tasks, retire).
    publish(x) -> a handle: ``sc.broadcast(x)``, ``client.scatter(x,
    broadcast=True)``, ``ray.put(x)``; tasks(fn, handle, items, *args) ->
    [fn(x, item, *args)], one task an item, in order; retire(handle): the
    broadcast destroyed, the future released; Ray frees an object with its
    last reference."""
    if system == "spark":
        def tasks(fn, bc, items, *args):
            return h.parallelize(items, len(items)).map(lambda q: fn(bc.value, q, *args)).collect()
        return h.broadcast, tasks, lambda bc: bc.destroy()
    if system == "dask":
        def tasks(fn, f, items, *args):
            return h.gather([h.submit(fn, f, q, *args, pure=False) for q in items])
        return (lambda x: h.scatter(x, broadcast=True)), tasks, lambda f: f.release()
    remote = {}

    def tasks(fn, ref, items, *args):
        if fn not in remote:
            remote[fn] = h.remote(fn)
        return h.get([remote[fn].remote(ref, q, *args) for q in items])
    return h.put, tasks, lambda ref: None


# ---- namespace hosts: links, where a task ran ------------------------------------------------

class Links:
    """Bytes on the hosts' links, the root-side veths' counters: everything
    that crossed (payload, the systems' own messages, TCP/IP headers); a
    byte from host to host counts on both links.  ``hosts`` None: one host,
    no links."""

    def __init__(self, hosts):
        self.veths = None if hosts is None else [h.veth for h in hosts]
        self.start = sum(self.read())

    def read(self):
        """(bytes into the hosts, bytes out of them) since the links were made."""
        into = out = 0
        for v in self.veths or ():
            with open(f"/sys/class/net/{v}/statistics/tx_bytes") as f:
                into += int(f.read())
            with open(f"/sys/class/net/{v}/statistics/rx_bytes") as f:
                out += int(f.read())
        return into, out

    def bytes(self):
        """Bytes both ways since this object was made; None on one host."""
        return None if self.veths is None else sum(self.read()) - self.start


def where():
    """In a task: {"host": CLAMOR_BENCH_HOST, "ip": eth0's address, "pid"}
    (on namespace hosts every pid may be 1 and every hostname the same)."""
    import fcntl
    import os
    import socket
    import struct

    ip = None
    with contextlib.suppress(OSError), socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        ip = socket.inet_ntoa(fcntl.ioctl(s.fileno(), 0x8915, struct.pack("256s", b"eth0"))[20:24])  # SIOCGIFADDR
    return {"host": os.environ.get(HOST_ENV), "ip": ip, "pid": os.getpid()}


def _free_ports(addr, k):
    """``k`` distinct ports free on ``addr`` now."""
    socks = []
    try:
        for _ in range(k):
            s = socket.socket()
            s.bind((addr, 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _listening(addr, port):
    with socket.socket() as s:
        s.settimeout(1)
        return s.connect_ex((addr, port)) == 0


def _tagged(key, value, exclude=()):
    """psutil processes whose environment holds key=value (but ``exclude``)."""
    import psutil

    if not value:
        raise ValueError("no tag to look for")
    out = []
    for p in psutil.process_iter():
        if p.pid in exclude:
            continue
        with contextlib.suppress(psutil.Error, OSError):
            if p.environ().get(key) == value and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
    return out


class _Procs:
    """The processes one hosts context started, their logs, and their stop.
    Each runs by ``host.popen`` in a session of its own, with bench/ on
    PYTHONPATH, its host index in CLAMOR_BENCH_HOST, a tag its descendants
    inherit, and the parent-death signal (setpriv --pdeathsig TERM)."""

    def __init__(self, name, hosts):
        self.name = name
        self.hosts = hosts
        self.tag = f"{name}-{os.getpid()}-{uuid.uuid4().hex[:12]}"
        self.procs = []                   # (label, Popen, log path)
        self.before = {h.name: set(h.pids()) for h in hosts}
        self.setpriv = shutil.which("setpriv")
        self.tmp = tempfile.mkdtemp(prefix=f"ph-{name}-")     # last: stop() removes it

    def env(self, host=None, **extra):
        env = dict(os.environ)
        env[TAG_ENV] = self.tag
        env["PYTHONPATH"] = os.pathsep.join(p for p in (HERE, os.environ.get("PYTHONPATH")) if p)
        if host is not None:
            env[HOST_ENV] = str(host.index)
        env.update(extra)
        return env

    def start(self, host, label, argv, env):
        """Start ``argv`` on ``host`` (a Host, or hosts.root), its output in a log."""
        if self.setpriv:
            argv = [self.setpriv, "--pdeathsig", "TERM", "--", *argv]
        path = os.path.join(self.tmp, f"{label}.log")
        with open(path, "wb") as log:
            p = host.popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
        self.procs.append((label, p, path))
        return p

    def tail(self, path, n=15):
        try:
            with open(path, errors="replace") as f:
                return "".join(f.readlines()[-n:])
        except OSError:
            return ""

    def wait_for(self, ready, what, timeout=START_TIMEOUT, step=0.1):
        """Poll ``ready()`` until true; RuntimeError with the log's tail when
        a process exits first, or on the time-out."""
        deadline = time.monotonic() + timeout
        while not ready():
            for label, p, path in self.procs:
                if p.poll() is not None:
                    raise RuntimeError(f"{self.name}: {label} exited with status {p.returncode}:\n{self.tail(path)}")
            if time.monotonic() > deadline:
                logs = "".join(f"--- {label}\n{self.tail(path, 8)}" for label, _, path in self.procs)
                raise RuntimeError(f"{self.name}: {what} after {timeout:.0f} s\n{logs}")
            time.sleep(step)

    def _leftovers(self):
        import psutil

        procs = {p.pid: p for p in _tagged(TAG_ENV, self.tag, exclude={os.getpid()})}
        for h in self.hosts:
            for pid in set(h.pids()) - self.before.get(h.name, set()):
                with contextlib.suppress(psutil.Error):
                    procs.setdefault(pid, psutil.Process(pid))
        return list(procs.values())

    def wait_exit(self, timeout):
        """Give the processes ``timeout`` seconds to exit by themselves."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and any(p.poll() is None for _, p, _ in self.procs):
            time.sleep(0.1)

    def stop(self, grace=STOP_GRACE):
        """SIGTERM each process started (it stops its children: ``ray start
        --block`` does it in 2 s, where a SIGTERM to all of them at once
        takes over 10), wait ``grace``, then kill its session, every process
        carrying the tag and anything new in the hosts' namespaces.
        Returns the names of those that needed the kill."""
        try:
            killed = self._stop(grace)
        finally:
            shutil.rmtree(self.tmp, ignore_errors=True)
        if killed:
            print(f"{self.name}: killed after {grace:.0f} s of SIGTERM: {', '.join(killed)}", file=sys.stderr, flush=True)
        return killed

    def _stop(self, grace):
        import psutil

        from clamor.testing import leftovers

        for _, p, _ in self.procs:
            if p.poll() is None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(p.pid, signal.SIGTERM)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:        # the children may outlive their parent briefly
            if all(p.poll() is not None for _, p, _ in self.procs) and not self._leftovers():
                break
            time.sleep(0.1)
        killed = [label for label, p, _ in self.procs if p.poll() is None]
        # what the processes about to be killed hold in /dev/shm: their
        # resource trackers die with them and cannot remove it
        victims = {q for _, p, _ in self.procs if p.poll() is None for q in leftovers.group_pids(p.pid)}
        held = leftovers.held_shm(victims | {q.pid for q in self._leftovers()})
        for _, p, _ in self.procs:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(p.pid, signal.SIGKILL)
        deadline = time.monotonic() + 20
        while True:
            left = self._leftovers()
            if not left:
                break
            held |= leftovers.held_shm([q.pid for q in left])
            for q in left:
                with contextlib.suppress(psutil.Error):
                    killed.append(f"{q.name()}({q.pid}: {' '.join(q.cmdline())[:80]})")
                    q.kill()
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.name}: processes {[q.pid for q in left]} do not die")
            psutil.wait_procs(left, timeout=1)
        for _, p, _ in self.procs:
            p.wait()
        leftovers.unlink_unheld(held)
        return killed


# ---- systems on namespace hosts ---------------------------------------------------------------

@contextlib.contextmanager
def _clamor_hosts(hosts, **cluster_kwargs):
    """Cluster(workers=0, remote=W, listen=<root>:*), clamor's defaults
    otherwise (CURVE on, a fresh secret); on every host ``unshare --pid
    --fork --kill-child --mount-proc python -m clamor.worker <endpoint>``
    with the secret in CLAMOR_SECRET, as docs/hosts.md says."""
    import clamor

    unshare = shutil.which("unshare")
    if unshare is None:
        raise PeerMissing("clamor's remote workers run under unshare (util-linux), which is missing")
    for k in ("workers", "remote"):
        if k in cluster_kwargs:
            raise TypeError(f"clamor on hosts: {k} is fixed (one remote worker per host)")
    kw = {"listen": f"{hosts.root_addr}:*", **cluster_kwargs}
    procs = _Procs("clamor", hosts)
    cl = None
    try:
        cl = clamor.Cluster(workers=0, remote=len(hosts), **kw)
        cl.join_command()                 # opens the control endpoint: cl.endpoint is known
        plain = [] if kw.get("encrypt", True) else ["--no-encrypt"]
        for h in hosts:
            procs.start(h, f"worker{h.index}",
                        [unshare, "--pid", "--fork", "--kill-child", "--mount-proc", sys.executable, "-m",
                         "clamor.worker", cl.endpoint, *plain],
                        procs.env(h, CLAMOR_SECRET=cl.secret))
        cl.start()
        yield cl
    finally:
        try:
            if cl is not None:
                cl.close()
        finally:
            procs.stop()


@contextlib.contextmanager
def _spark_hosts(hosts, executor_mb=2048, driver_memory="4g", conf=None, app="clamor-bench"):
    """A standalone cluster: a master in the root namespace, one ``Worker
    --cores 1 --memory <executor_mb>m`` per host (run in the foreground by
    pyspark's bin/spark-class), and the driver JVM as ``_spark_local``'s on
    the root's address.  Yielded once the W executors registered."""
    pyspark = _pyspark()
    spark_class = os.path.join(os.path.dirname(pyspark.__file__), "bin", "spark-class")
    if not os.access(spark_class, os.X_OK):
        raise PeerMissing(f"pyspark has no bin/spark-class ({spark_class}) to run a standalone cluster")
    root = hosts.root_addr
    procs = _Procs("spark", hosts)
    try:
        port, ui = _free_ports(root, 2)
        procs.start(hosts.root, "master",
                    [spark_class, "org.apache.spark.deploy.master.Master", "--host", root, "--port", str(port),
                     "--webui-port", str(ui)], procs.env(SPARK_LOCAL_IP=root))
        procs.wait_for(lambda: _listening(root, port), "the master does not listen")
        master = f"spark://{root}:{port}"
        for h in hosts:
            procs.start(h, f"worker{h.index}",
                        [spark_class, "org.apache.spark.deploy.worker.Worker", master, "--host", h.addr,
                         "--cores", "1", "--memory", f"{executor_mb}m", "--work-dir",
                         os.path.join(procs.tmp, f"work{h.index}")], procs.env(h, SPARK_LOCAL_IP=h.addr))
        c = {"spark.master": master,    # replaces _spark_local's local-cluster[...]
             "spark.driver.host": root, "spark.driver.bindAddress": root,
             "spark.executor.memory": f"{executor_mb}m",
             "spark.executorEnv.PYTHONPATH": procs.env()["PYTHONPATH"], **(conf or {})}
        # the executors' python is the driver's PYSPARK_PYTHON, read when the context is made
        python = os.environ.get("PYSPARK_PYTHON") or sys.executable
        with mock.patch.dict(os.environ, PYSPARK_PYTHON=python, SPARK_LOCAL_IP=root), \
                _spark_local(len(hosts), executor_mb, driver_memory, app=app, conf=c) as sc:
            tracker = sc._jsc.sc().statusTracker()
            procs.wait_for(lambda: len(tracker.getExecutorInfos()) - 1 >= len(hosts),
                           f"{len(hosts)} executors did not register", step=0.25)
            yield sc
    finally:
        procs.stop()


def _cli_options(options):
    argv = []
    for k, v in options.items():
        flag = k.replace("_", "-")
        if v is True:
            argv.append("--" + flag)
        elif v is False:
            argv.append("--no-" + flag)
        elif v is not None:
            argv += ["--" + flag, str(v)]
    return argv


@contextlib.contextmanager
def _dask_hosts(hosts, config=None, **worker_options):
    """A Client on a scheduler in the root namespace and one ``dask worker
    --nthreads 1`` per host (nanny, memory limit and Active Memory Manager
    as Dask's defaults, but for ``config``, set in every process's
    environment as DASK_* and here; ``worker_options`` are more ``dask
    worker`` options: ``nanny=False`` -> ``--no-nanny``)."""
    dask, distributed = _distributed()
    root = hosts.root_addr
    procs = _Procs("dask", hosts)
    client = None
    try:
        with dask.config.set(config or {}):
            denv = {"DASK_" + k.upper().replace(".", "__").replace("-", "_"): repr(v) for k, v in (config or {}).items()}
            denv["DASK_TEMPORARY_DIRECTORY"] = procs.tmp   # (the scheduler would keep /tmp/dask-scratch-space)
            sfile = os.path.join(procs.tmp, "scheduler.json")
            procs.start(hosts.root, "scheduler",
                        [sys.executable, "-m", "distributed.cli.dask_scheduler", "--host", root, "--port", "0",
                         "--dashboard-address", ":0", "--scheduler-file", sfile], procs.env(**denv))

            def address():
                with contextlib.suppress(OSError, ValueError), open(sfile) as f:
                    return json.load(f)["address"]
                return None

            procs.wait_for(address, "the scheduler did not start")
            addr = address()
            for h in hosts:
                procs.start(h, f"worker{h.index}",
                            [sys.executable, "-m", "distributed.cli.dask_worker", addr, "--nthreads", "1",
                             "--host", h.addr, "--name", f"h{h.index}",
                             "--local-directory", os.path.join(procs.tmp, f"w{h.index}"),
                             *_cli_options(worker_options)], procs.env(h, **denv))
            client = distributed.Client(addr, timeout=60)
            procs.wait_for(lambda: len(client.scheduler_info(n_workers=-1)["workers"]) >= len(hosts),
                           f"{len(hosts)} workers did not join", step=0.25)
            yield client
    finally:
        try:
            if client is not None:
                with contextlib.suppress(Exception):
                    client.shutdown()
                client.close()
                # the scheduler tells the nannies to close; a SIGTERM that
                # cuts that short leaves a nanny waiting on it for ~8 s
                procs.wait_exit(5.0)
        finally:
            procs.stop()


@contextlib.contextmanager
def _ray_hosts(hosts, object_store_mb=None):
    """The ray module connected to a head with no CPUs in the root namespace
    and one ``ray start --num-cpus 1`` node per host; free ports for the
    head's fixed ones, no dashboard, usage stats and token authentication
    off, each node's temp dir and object store (RAY_OBJECT_STORE_MB) its
    own.  Never ``ray stop``, which would stop every Ray on the machine."""
    ray = _ray()
    cli = os.path.join(os.path.dirname(sys.executable), "ray")
    cli = cli if os.access(cli, os.X_OK) else shutil.which("ray")
    if cli is None:
        raise PeerMissing("ray's command line (ray start) is not installed")
    store = str(int(object_store_mb or RAY_OBJECT_STORE_MB) << 20)
    root = hosts.root_addr
    procs = _Procs("ray", hosts)
    connected = False
    try:
        gcs, client_port, agent_port = _free_ports(root, 3)
        common = ["--block", "--object-store-memory", store, "--disable-usage-stats"]
        # ray start turns token authentication on when it finds a
        # ~/.ray/auth_token (a local ray.init() leaves one), and a driver
        # connecting by address does not: say it, as on a fresh machine
        renv = {"RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": os.environ.get("RAY_AUTH_MODE", "disabled")}
        # the client server runs (on 10001 by default) only with ray[client] installed
        from ray._private.utils import get_ray_client_dependency_error
        client = [] if get_ray_client_dependency_error() else ["--ray-client-server-port", str(client_port)]
        procs.start(hosts.root, "head",
                    [cli, "start", "--head", "--node-ip-address", root, "--port", str(gcs), "--num-cpus", "0",
                     "--include-dashboard", "false", *client, "--dashboard-agent-listen-port", str(agent_port),
                     "--temp-dir", os.path.join(procs.tmp, "head"), *common], procs.env(**renv))
        procs.wait_for(lambda: _listening(root, gcs), "the head does not listen")
        for h in hosts:
            procs.start(h, f"node{h.index}",
                        [cli, "start", "--address", f"{root}:{gcs}", "--node-ip-address", h.addr, "--num-cpus", "1",
                         "--temp-dir", os.path.join(procs.tmp, f"n{h.index}"), *common], procs.env(h, **renv))
        ray.init(address=f"{root}:{gcs}", _node_ip_address=root, log_to_driver=True)
        connected = True
        procs.wait_for(lambda: sum(1 for n in ray.nodes() if n["Alive"]) >= len(hosts) + 1,
                       f"{len(hosts)} nodes did not join", step=0.25)
        yield ray
    finally:
        try:
            if connected:
                ray.shutdown()
        finally:
            procs.stop()


def ray_host_nodes(ray):
    """The node ids of the live nodes that run tasks (the hosts'), by address."""
    return {n["NodeManagerAddress"]: n["NodeID"] for n in ray.nodes()
            if n["Alive"] and n["Resources"].get("CPU", 0) > 0}


# ---- self-test --------------------------------------------------------------------------------

def digest(a):
    """In a task: where it ran, and the CRC32 and size of ``a``'s bytes (reads every page)."""
    import zlib

    import numpy as np

    a = np.ascontiguousarray(a)
    return where(), zlib.crc32(memoryview(a).cast("B")), a.nbytes


def _per_worker(system, h, n, fn, *args):
    """``fn(*args)`` once on every worker; the results."""
    if system == "clamor":
        return h.run(fn, *args)
    if system == "spark":
        return h.parallelize(range(n), n).barrier().mapPartitions(lambda it: [fn(*args)]).collect()
    if system == "dask":
        ws = list(h.scheduler_info(n_workers=-1)["workers"])
        return h.gather([h.submit(fn, *args, workers=[w], allow_other_workers=False, pure=False) for w in ws])
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
    rfn = h.remote(num_cpus=1)(fn)
    return h.get([rfn.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False)).remote(*args)
                  for node in ray_host_nodes(h).values()])


def _send(system, h, n, arr):
    """Send ``arr`` the system's way and read it with one task per worker."""
    if system == "clamor":
        import clamor
        return _per_worker(system, h, n, digest, clamor.array(arr))
    if system == "spark":
        bc = h.broadcast(arr)
        try:
            return h.parallelize(range(n), n).barrier().mapPartitions(lambda it: [digest(bc.value)]).collect()
        finally:
            bc.destroy()
    if system == "dask":
        fut = h.scatter(arr, broadcast=True)
        try:
            return _per_worker(system, h, n, digest, fut)
        finally:
            h.cancel(fut)
    return _per_worker(system, h, n, digest, h.put(arr))


def _selftest_run(system, n, rate, mib):
    """``--run SYSTEM``: one system on ``n`` fresh hosts; its figures."""
    import zlib

    import numpy as np

    from clamor.testing import nethosts

    out = {"hosts": n, "rate": rate, "mib": mib, "pid": os.getpid()}
    with nethosts.Hosts(n, rate=rate) as hosts:
        t0 = time.perf_counter()
        with start(system, n, hosts, **({"executor_mb": 1024} if system == "spark" else {})) as h:
            out["start_s"] = round(time.perf_counter() - t0, 2)
            ran = _per_worker(system, h, n, where)
            expect = {(str(x.index), x.addr) for x in hosts}
            got = {(r["host"], r["ip"]) for r in ran}
            out.update(tasks=sorted(got), hosts_ok=len(ran) == n and got == expect)
            print(f"{system}: started in {out['start_s']} s; one task per worker ran on {sorted(got)}: "
                  f"{'ok' if out['hosts_ok'] else 'WRONG, expected ' + str(sorted(expect))}", flush=True)
            arr = np.random.default_rng(0).random((mib << 20) // 8)
            crc = zlib.crc32(memoryview(arr).cast("B"))
            links = Links(hosts)
            b0 = links.read()
            t = time.perf_counter()
            res = _send(system, h, n, arr)
            secs = time.perf_counter() - t
            b1 = links.read()
            into, outof = b1[0] - b0[0], b1[1] - b0[1]
            out.update(send_s=round(secs, 3), into_hosts=into, out_of_hosts=outof,
                       into_rate_gbit=round(into * 8 / secs / 1e9, 3),
                       send_ok=len(res) == n and all(r[1] == crc and r[2] == arr.nbytes for r in res)
                       and {(r[0]["host"], r[0]["ip"]) for r in res} == expect)
            print(f"{system}: {mib} MiB to {n} workers in {secs:.2f} s; links: {into / 2**20:.1f} MiB into the hosts, "
                  f"{outof / 2**20:.1f} MiB out ({into / arr.nbytes:.2f} x the array), {out['into_rate_gbit']} Gbit/s "
                  f"into the hosts (all links); every worker read it whole: {'ok' if out['send_ok'] else 'WRONG'}", flush=True)
            t1 = time.perf_counter()
        out["stop_s"] = round(time.perf_counter() - t1, 2)
        out["left_after_stop"] = [f"pid {pid} in {x.name}" for x in hosts for pid in x.pids()]
    print(f"{system}: stopped in {out['stop_s']} s; left in the hosts: {out['left_after_stop'] or 'none'}", flush=True)
    return out


def _selftest(args):
    """Each system in a child of its own (the child protocol); a table, and
    whether every check held: placement, the array read whole, nothing
    left running, no namespace left."""
    from clamor.testing import nethosts

    ok, reason = nethosts.available()
    if not ok:
        print(f"_harness: network namespaces are not available here: {reason}", file=sys.stderr)
        return 2
    argv = [sys.executable, os.path.abspath(__file__), "--hosts", str(args.hosts), "--rate", args.rate,
            "--mib", str(args.mib)]
    rows, rc = run_systems(args.systems.split(","), argv, None, args.timeout), 0
    print(f"{'system':8} {'start s':>8} {'send s':>7} {'into MiB':>9} {'out MiB':>8} {'Gbit/s':>7} {'stop s':>7}  checks")
    for system, row in rows.items():
        stale = [x for x in nethosts._netns_names() if x.startswith(f"{nethosts.NS_PREFIX}{row.get('pid')}-")]
        good = row.get("hosts_ok") and row.get("send_ok") and not row.get("left_after_stop") \
            and not row["left_behind"] and not stale
        rc |= not good
        if why_not(row) or "stop_s" not in row:
            print(f"{system:8} not run: {why_not(row) or 'no figures'}")
            continue
        print(f"{system:8} {row['start_s']:8.1f} {row['send_s']:7.2f} {row['into_hosts'] / 2**20:9.1f} "
              f"{row['out_of_hosts'] / 2**20:8.1f} {row['into_rate_gbit']:7.3f} {row['stop_s']:7.1f}  "
              f"{'ok' if good else 'FAILED'}" + (f" (namespaces left: {stale})" if stale else ""))
    return int(rc)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--selftest", action="store_true", help="start each system on namespace hosts and check it")
    ap.add_argument("--systems", default=",".join(SYSTEMS))
    ap.add_argument("--hosts", type=int, default=2)
    ap.add_argument("--rate", default="1gbit", help="every host's link, both ways (tc notation)")
    ap.add_argument("--mib", type=int, default=64, help="the array sent to every worker, MiB")
    child_args(ap, SYSTEMS, timeout=1800)
    args = ap.parse_args(argv)
    if args.run:
        return child_result(args.run, args.out, lambda: _selftest_run(args.run, args.hosts, args.rate, args.mib))
    if args.selftest:
        return _selftest(args)
    ap.print_help()
    return 2


if __name__ == "__main__":
    sys.exit(main())
