"""How the benchmarks start and stop the peer systems: Spark, Dask and Ray.

Each peer is a context manager that starts the system with ``workers``
single-core worker processes on this host, yields its handle, and stops
every process it started when the block ends, also on an error:

  spark(workers, executor_mb, driver_memory)
            a SparkContext on ``local-cluster[W,1,executor_mb]``: a master
            and W workers inside the driver JVM, each worker launching one
            executor JVM with one core and ``executor_mb`` MiB of heap
            (W executor processes, as many as the other systems' workers,
            not ``local[W]`` threads).  ``driver_memory`` is the driver
            JVM's heap (``spark.driver.memory``; its default, 1g, is too
            small to hold a 1 GiB broadcast).  Spark's defaults otherwise
            (TorrentBroadcast, lz4-compressed broadcast blocks, python
            worker reuse, the UI on its default port or the next free one).
            On leaving: ``sc.stop()`` (the executors go), then the gateway
            JVM is shut down and waited for.  Without Java, raises
            PeerMissing saying to install Java 17.
  dask(workers)
            a ``distributed.Client`` on ``LocalCluster(n_workers=W,
            threads_per_worker=1, processes=True)`` (Dask's defaults: nannies,
            the Active Memory Manager, memory limits of RAM / W; the
            dashboard on any free port).  On leaving: client.close(),
            cluster.close().
  ray_session(workers)
            ``ray.init(num_cpus=W, include_dashboard=False)``, Ray's defaults
            otherwise; yields the ``ray`` module.  On leaving: ray.shutdown().

After each, ``reap_descendants()`` kills (by pid) any process still
running below this one: what a peer left behind is reported, never kept.
Run a peer in a process of its own (a benchmark's subprocess) that is not a
clamor driver: a process forked from a region's driver attaches to the
region as a worker, and the peers fork or spawn processes of their own.
A benchmark that starts such a subprocess can call ``subreaper()`` first,
so that anything the subprocess leaves running is re-parented to the
benchmark, which then finds it with ``reap_descendants()``.

``PeerMissing`` (with the reason) is raised when a system cannot be
started at all: not installed, no Java.  Benchmarks report such a peer as
null with that reason.
"""
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import traceback

JAVA_HINT = "install Java 17 (Debian: apt-get install openjdk-17-jre-headless) or set JAVA_HOME"


class PeerMissing(RuntimeError):
    """The peer system cannot run here; str() says why and what to install."""


# ---- processes -------------------------------------------------------------------------

def subreaper():
    """Make this process the child subreaper (prctl PR_SET_CHILD_SUBREAPER):
    orphans of its descendants are re-parented to it, not to init, so
    reap_descendants() still finds them.  False where that is not possible."""
    try:
        import ctypes

        return ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):  # pragma: no cover - Linux only
        return False


def descendants(exclude=()):
    """The live processes below this one (psutil.Process list), minus the
    pids in ``exclude``."""
    import psutil

    out = []
    for p in psutil.Process().children(recursive=True):
        try:
            if p.pid not in exclude and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except psutil.NoSuchProcess:
            pass
    return out


def _leftovers():
    """clamor.testing.leftovers: the names in /dev/shm that killed processes leave."""
    from clamor.testing import leftovers

    return leftovers


def reap_descendants(exclude=(), grace=5.0):
    """Terminate, then kill, every process still running below this one
    (but the pids in ``exclude``); returns "name(pid): command line" of each
    it found (multiprocessing's resource tracker, which Dask's LocalCluster
    starts and which would end with this process, is one).  The names in
    /dev/shm that only they held go too: a killed resource tracker cannot
    remove those of the processes it tracked."""
    import psutil

    procs = descendants(exclude)
    leftovers = _leftovers()
    held = leftovers.held_shm([p.pid for p in procs])
    names = []
    for p in procs:
        try:
            names.append(f"{p.name()}({p.pid}): {' '.join(p.cmdline())[:120]}")
            p.terminate()
        except psutil.NoSuchProcess:
            pass
    _, alive = psutil.wait_procs(procs, timeout=grace)
    for p in alive:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(alive, timeout=grace)
    leftovers.unlink_unheld(held)
    return names


# ---- a system in a subprocess of its own --------------------------------------------------

def child_result(system, out, run, reasons=()):
    """In a benchmark's ``--run SYSTEM`` subprocess: ``run()`` -> a dict of
    figures, written to ``out`` as JSON with ``system``; or why it did not
    run: ``missing`` (PeerMissing), a key of ``reasons`` ({exception class:
    key}, e.g. a wrong answer), else ``error`` with the traceback.  Anything
    still running below this process is killed and named in
    ``left_behind``.  Returns 0 (the process's exit status)."""
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
    """Runs ``cmd`` (a script's ``--run SYSTEM ... --out out``) and returns
    the dict ``child_result`` wrote (``error`` set when there is none, a
    time-out included), with ``wall_s``; what it left running is killed
    and added to ``left_behind``.  Call ``subreaper()`` first so that its
    orphans are found; processes in ``exclude`` are not touched.
    ``preexec=False`` from a clamor driver: a fork running Python code
    would run the region's fork hooks (the child sets its own death
    signal).  The child's temporary files (TMPDIR; Dask's scratch space,
    Spark's local directories) go to a directory that this process
    removes, a child killed on its time-out included."""
    from _common import die_with_parent

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


# ---- Spark ------------------------------------------------------------------------------

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


@contextlib.contextmanager
def spark(workers, executor_mb=2048, driver_memory="4g", app="clamor-bench", conf=None):
    """A SparkContext on local-cluster[workers,1,executor_mb] (see the module)."""
    java()
    try:
        import pyspark
    except ImportError:
        raise PeerMissing("pyspark is not installed (pip install pyspark)") from None
    # the executors' Python workers run this interpreter (else "python3" on
    # PATH, which may be another one, with other packages); PySpark reads
    # the variable when the context starts
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    c = pyspark.SparkConf().setMaster(f"local-cluster[{workers},1,{executor_mb}]").setAppName(app)
    c.set("spark.driver.memory", driver_memory)
    for k, v in (conf or {}).items():
        c.set(k, v)
    sc = pyspark.SparkContext(conf=c)
    sc.setLogLevel("ERROR")
    try:
        yield sc
    finally:
        gateway = getattr(sc, "_gateway", None)
        try:
            sc.stop()
        finally:
            proc = getattr(gateway, "proc", None)
            try:
                if gateway is not None:
                    gateway.shutdown()
            except Exception:   # the JVM may be gone already
                pass
            if proc is not None:
                try:
                    proc.stdin.close()   # the gateway JVM exits when its stdin closes
                except Exception:
                    pass
                try:
                    proc.wait(20)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
            pyspark.SparkContext._gateway = None
            pyspark.SparkContext._jvm = None


def executor_pids(sc):
    """Process ids of the executor JVMs (children of the driver JVM whose
    command line runs CoarseGrainedExecutorBackend)."""
    import psutil

    out = []
    for p in psutil.Process().children(recursive=True):
        try:
            if any("CoarseGrainedExecutorBackend" in a for a in p.cmdline()):
                out.append(p.pid)
        except psutil.Error:
            pass
    return out


# ---- Dask -------------------------------------------------------------------------------

@contextlib.contextmanager
def dask(workers, **cluster_kwargs):
    """A distributed.Client on LocalCluster(n_workers=workers,
    threads_per_worker=1, processes=True) (see the module).  Dask's
    scratch space (its "temporary-directory") is a directory removed on
    leaving: by default the scheduler and every worker make
    /tmp/dask-scratch-space, which Dask keeps."""
    try:
        import dask as dask_mod
        from distributed import Client, LocalCluster
    except ImportError:
        raise PeerMissing("dask.distributed is not installed (pip install 'dask[distributed]')") from None
    with tempfile.TemporaryDirectory(prefix="bench-dask-", ignore_cleanup_errors=True) as scratch, \
            dask_mod.config.set({"temporary-directory": scratch}):
        kw = {"n_workers": workers, "threads_per_worker": 1, "processes": True, "dashboard_address": ":0"}
        kw.update(cluster_kwargs)
        cluster = LocalCluster(**kw)
        client = None
        try:
            client = Client(cluster)
            client.wait_for_workers(workers, timeout=120)
            yield client
        finally:
            try:
                if client is not None:
                    client.close()
            finally:
                cluster.close()


# ---- Ray --------------------------------------------------------------------------------

@contextlib.contextmanager
def ray_session(workers, **init_kwargs):
    """ray.init(num_cpus=workers, include_dashboard=False); yields ray."""
    try:
        import ray
    except ImportError:
        raise PeerMissing("ray is not installed (pip install ray)") from None
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")   # no report to a server outside this machine
    kw = {"num_cpus": workers, "include_dashboard": False}
    kw.update(init_kwargs)
    ray.init(**kw)
    try:
        yield ray
    finally:
        ray.shutdown()


def ray_wait_workers(ray, workers, timeout=120):
    """Wait until ``workers`` distinct worker processes have run a task
    (Ray starts them lazily): start-up kept out of the timed part."""

    @ray.remote(num_cpus=1)
    def _pid(pause):
        time.sleep(pause)
        return os.getpid()

    end = time.monotonic() + timeout
    pids = set()
    while len(pids) < workers and time.monotonic() < end:
        pids |= set(ray.get([_pid.remote(0.3) for _ in range(workers)]))
    return pids
