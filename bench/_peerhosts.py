#!/usr/bin/env python3
"""clamor, Spark, Dask and Ray on network-namespace hosts with rate-limited links.

The namespace-host counterpart of ``_peers.py``: each system is a context
manager that starts it on the hosts of a ``tests/nethosts.py`` ``Hosts``
(one single-core worker process per host, so W = len(hosts)), yields its
handle, and stops every process it started when the block ends, also on an
error.  The driver (and Spark's master, Dask's scheduler, Ray's head) runs
in the root namespace, on the bridge's address ``hosts.root_addr``: between
the driver and host i only host i's link counts, and traffic between two
hosts crosses both of theirs.

  clamor_cluster(hosts, **cluster_kwargs)
            ``clamor.Cluster(workers=0, remote=W, listen=f"{root}:*")``
            (clamor's defaults otherwise: CURVE encryption on, the secret a
            fresh random one); on every host ``unshare --pid --fork
            --kill-child --mount-proc python -m clamor.worker <cl.endpoint>``
            (a PID namespace of its own, as bench/hosts.py runs them) with
            the secret in CLAMOR_SECRET (never on a command line), as
            docs/hosts.md says; ``cl.start()`` waits for the W workers.  On
            leaving: ``cl.close()`` (the workers exit 0).
  spark(hosts, executor_mb, driver_memory, conf)
            a SparkContext on a Spark standalone cluster: a master
            (``org.apache.spark.deploy.master.Master --host <root>`` on free
            ports) in the root namespace and one ``...deploy.worker.Worker
            spark://<root>:<port> --host <host addr> --cores 1 --memory
            <executor_mb>m`` per host, each run in the foreground by
            pyspark's bundled ``bin/spark-class`` (not the daemonising sbin
            scripts), SPARK_LOCAL_IP the host's address.  Each worker
            launches one executor JVM with one core and ``executor_mb`` MiB
            of heap (``spark.executor.memory``).  The driver JVM runs in the
            root namespace (``spark.driver.host`` and ``bindAddress`` = the
            root's address; ``spark.driver.memory`` = ``driver_memory``, as
            in ``_peers.spark``, whose start and stop it reuses).  Python
            workers run /work/venv's python (PYSPARK_PYTHON: this
            interpreter, unless the caller set it) with bench/ on
            PYTHONPATH.  Spark's defaults
            otherwise (TorrentBroadcast, lz4-compressed broadcast blocks,
            python worker reuse).  Yielded once the W executors registered.
  dask(hosts, config=None, **worker_options)
            a ``distributed.Client`` on a scheduler started in the root
            namespace (``python -m distributed.cli.dask_scheduler --host
            <root> --port 0 --dashboard-address :0``) and one ``dask worker
            <scheduler> --nthreads 1 --host <host addr>`` per host: nanny on,
            memory limit "auto" (RAM x threads / cores: 11.8 GiB a worker
            here), the Active Memory Manager on: Dask's defaults, as users
            run it.  ``config`` (a dict of dask config,
            e.g. ``DASK_AMM_OFF``) is set in the scheduler's and workers'
            environment (DASK_* variables) and in this process while the
            block runs; ``worker_options`` are more ``dask worker`` options
            (``memory_limit="4GiB"`` -> ``--memory-limit 4GiB``, ``nanny=False``
            -> ``--no-nanny``).  On leaving: ``client.shutdown()`` (scheduler
            and workers close), ``client.close()``.
  ray_session(hosts, object_store_mb=None)
            the ``ray`` module connected (``ray.init(address=<root>:<port>)``)
            to a cluster: a head ``ray start --head --block --num-cpus 0``
            in the root namespace (no task runs there) and one ``ray start
            --block --address <root>:<port> --node-ip-address <host addr>
            --num-cpus 1`` per host.  The head's ports that default to fixed
            numbers (GCS 6379, client server 10001, dashboard agent 52365)
            are chosen free; Ray picks the rest.  No dashboard
            (``--include-dashboard false``, as ``_peers.ray_session``), usage
            stats off (``--disable-usage-stats``: no report leaves the
            machine), token authentication off (RAY_AUTH_MODE=disabled,
            ``ray start``'s default on a machine without ~/.ray/auth_token;
            with that file, which a local ``ray.init()`` leaves, the nodes
            would turn it on and a driver connecting by address would not),
            each node's temp dir private.  Object stores: Ray's default is
            30% of RAM per node, and 5 such stores (a head and 4 hosts)
            would not fit this 24 GiB machine's /dev/shm; each gets
            ``object_store_mb`` (default 2048 MiB): 5 x 2 GiB = 10 GiB of
            the 24 GiB /dev/shm, room on every node for a 1 GiB object and
            its next version while the old one is released (memory is taken
            only as objects are written).  ``ray_host_nodes(ray)`` gives
            the hosts' node ids by address (for NodeAffinitySchedulingStrategy).
            On leaving: ray.shutdown().
            Never ``ray stop``, which would stop every Ray on the machine.

Every process is started with ``hosts[i].popen`` (``hosts.root.popen`` in
the root namespace), in a session of its own, with bench/ on PYTHONPATH,
CLAMOR_BENCH_HOST set to its host index (tasks report where they ran:
every pid may be 1, every hostname the same), a tag in
CLAMOR_PEERHOSTS_TAG that its descendants inherit, and the parent-death
signal (``setpriv --pdeathsig TERM``), so a killed benchmark leaves nothing.
On leaving, after the system's own shutdown: SIGTERM to each process
started, 10 s of grace, then SIGKILL to their sessions, to every process on
the machine carrying the tag (found by pid: Spark's executors, Ray's
raylets and workers, Dask's nanny children), and to anything new left in
the hosts' namespaces.  A host runs one system at a time.  Logs go to a
temporary directory, removed on leaving; a process that exits while its
system starts raises RuntimeError with the tail of its log.

As with ``_peers``, run each system in a process of its own: the one
that uses ``clamor_cluster`` is a clamor driver, and a process forked from
it (as the peers fork) attaches to its region.

``PeerMissing`` (``_peers``'s) is raised when a system cannot run at all:
no Java (``_peers.java()``), not installed, no ``unshare``.

``LinkCounter(hosts)`` reads the bytes on the hosts' links, the root-side
veths' counters: ``read()`` is (bytes into the hosts, bytes out of them),
``total()`` their sum, what ``link_bytes(hosts)`` returns.  It counts
everything that crossed: payload, the systems' own messages, TCP/IP
headers; a byte sent from host to host is counted on both links.

    python bench/_peerhosts.py --selftest [--hosts 2] [--rate 1gbit] [--mib 64] [--systems clamor,spark,dask,ray]

runs each system in a subprocess of its own on fresh hosts: one task per
worker (each on a host of its own), then a ``--mib`` MiB float64 array sent
the system's way (clamor: a region array read by every worker; Spark:
``sc.broadcast``; Dask: ``scatter(broadcast=True)``; Ray: ``ray.put``) and
read by one task per worker, with the seconds, the link bytes and the rate;
then it shows that nothing is left running and the namespaces are gone.
Needs root.
"""
import argparse
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid

HERE = os.path.dirname(os.path.abspath(__file__))

import _peers  # noqa: E402
from clamor.testing import leftovers  # noqa: E402
from _peers import PeerMissing  # noqa: E402

HOST_ENV = "CLAMOR_BENCH_HOST"        # a worker process's host index
TAG_ENV = "CLAMOR_PEERHOSTS_TAG"      # marks every process a context started, and their descendants
RAY_OBJECT_STORE_MB = 2048
START_TIMEOUT = 120.0
STOP_GRACE = 10.0
# See dask_globals.py: the Active Memory Manager drops the replicas that
# scatter(broadcast=True) makes; a user who broadcasts turns it off.
DASK_AMM_OFF = {"distributed.scheduler.active-memory-manager.start": False}

__all__ = ["HOST_ENV", "DASK_AMM_OFF", "RAY_OBJECT_STORE_MB", "PeerMissing", "LinkCounter", "LinkWindow", "link_bytes", "hosts_or_none",
           "clamor_cluster", "spark", "dask", "ray_session", "ray_host_nodes", "where"]


# ---- links ------------------------------------------------------------------------------

class LinkCounter:
    """Bytes on the hosts' links: the root-side veths' counters."""

    def __init__(self, hosts):
        self.veths = [h.veth for h in hosts]

    def read(self):
        """(bytes into the hosts, bytes out of them) since the links were made."""
        into = out = 0
        for v in self.veths:
            with open(f"/sys/class/net/{v}/statistics/tx_bytes") as f:
                into += int(f.read())
            with open(f"/sys/class/net/{v}/statistics/rx_bytes") as f:
                out += int(f.read())
        return into, out

    def total(self):
        return sum(self.read())


def link_bytes(hosts):
    """Bytes both ways on all the hosts' links (tx + rx of the root-side veths)."""
    return LinkCounter(hosts).total()


class LinkWindow:
    """Bytes both ways on the hosts' links from its making on: ``bytes()``;
    None when ``hosts`` is None (a run on one host has no links)."""

    def __init__(self, hosts):
        self.counter = LinkCounter(hosts) if hosts is not None else None
        self.start = self.counter.total() if self.counter else 0

    def bytes(self):
        return self.counter.total() - self.start if self.counter else None


def hosts_or_none(n, rate):
    """A context manager: ``n`` namespace hosts whose links run at ``rate``
    (``nethosts.Hosts``), or None (``rate`` None: one host)."""
    if rate is None:
        return contextlib.nullcontext(None)
    from clamor.testing import nethosts
    return nethosts.Hosts(n, rate=rate)


# ---- where a task runs --------------------------------------------------------------------

def where():
    """In a task: {"host": CLAMOR_BENCH_HOST, "ip": eth0's address, "pid"}."""
    import fcntl
    import os
    import socket
    import struct

    ip = None
    with contextlib.suppress(OSError), socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        ip = socket.inet_ntoa(fcntl.ioctl(s.fileno(), 0x8915, struct.pack("256s", b"eth0"))[20:24])  # SIOCGIFADDR
    return {"host": os.environ.get(HOST_ENV), "ip": ip, "pid": os.getpid()}


# ---- processes ----------------------------------------------------------------------------

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


def _tagged(key, value, exclude=()):
    """psutil processes whose environment holds key=value (but the pids in ``exclude``)."""
    import psutil

    if not value:
        raise ValueError("no tag to look for")
    out = []
    for p in psutil.process_iter():
        if p.pid in exclude:
            continue
        try:
            if p.environ().get(key) == value and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except (psutil.Error, OSError):
            pass
    return out


class _Procs:
    """The processes one context started, their logs, and their stop."""

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

    def check(self):
        """RuntimeError if a process has exited (with the tail of its log)."""
        for label, p, path in self.procs:
            if p.poll() is not None:
                raise RuntimeError(f"{self.name}: {label} exited with status {p.returncode}:\n{self.tail(path)}")

    def wait_for(self, ready, what, timeout=START_TIMEOUT, step=0.1):
        """Poll ``ready()`` until true, checking that no process died."""
        deadline = time.monotonic() + timeout
        while not ready():
            self.check()
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
        takes over 10), wait ``grace``, then kill its session and whatever
        is left.  Returns the names of those that needed the kill."""
        try:
            killed = self._stop(grace)
        finally:
            shutil.rmtree(self.tmp, ignore_errors=True)
        if killed:
            print(f"{self.name}: killed after {grace:.0f} s of SIGTERM: {', '.join(killed)}", file=sys.stderr, flush=True)
        return killed

    def _stop(self, grace):
        import psutil

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


# ---- clamor -------------------------------------------------------------------------------

@contextlib.contextmanager
def clamor_cluster(hosts, **cluster_kwargs):
    """A clamor.Cluster of len(hosts) remote workers, one per host (see the module)."""
    import clamor

    unshare = shutil.which("unshare")
    if unshare is None:
        raise PeerMissing("clamor's remote workers run under unshare (util-linux), which is missing")
    for k in ("workers", "remote"):
        if k in cluster_kwargs:
            raise TypeError(f"clamor_cluster: {k} is fixed (one remote worker per host)")
    kw = {"listen": f"{hosts.root_addr}:*"}
    kw.update(cluster_kwargs)
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


# ---- Spark --------------------------------------------------------------------------------

@contextlib.contextmanager
def _setenv(**env):
    """This process's environment with ``env`` set, put back on leaving."""
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@contextlib.contextmanager
def spark(hosts, executor_mb=2048, driver_memory="4g", conf=None, app="clamor-bench"):
    """A SparkContext on a standalone cluster, one 1-core worker per host (see the module)."""
    _peers.java()
    try:
        import pyspark
    except ImportError:
        raise PeerMissing("pyspark is not installed (pip install pyspark)") from None
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

        def listening():
            with socket.socket() as s:
                s.settimeout(1)
                return s.connect_ex((root, port)) == 0

        procs.wait_for(listening, "the master does not listen")
        master = f"spark://{root}:{port}"
        for h in hosts:
            work = os.path.join(procs.tmp, f"work{h.index}")
            procs.start(h, f"worker{h.index}",
                        [spark_class, "org.apache.spark.deploy.worker.Worker", master, "--host", h.addr,
                         "--cores", "1", "--memory", f"{executor_mb}m", "--work-dir", work],
                        procs.env(h, SPARK_LOCAL_IP=h.addr))
        c = {
            # _peers.spark sets local-cluster[...] first; spark.master here replaces it
            "spark.master": master,
            "spark.driver.host": root,
            "spark.driver.bindAddress": root,
            "spark.executor.memory": f"{executor_mb}m",
            "spark.executorEnv.PYTHONPATH": procs.env()["PYTHONPATH"],
        }
        c.update(conf or {})
        # the executors' python is the driver's PYSPARK_PYTHON, read when the
        # context is made (spark.pyspark.python is spark-submit's, and
        # without either they run "python3" from PATH, not this venv's)
        python = os.environ.get("PYSPARK_PYTHON") or sys.executable
        with _setenv(PYSPARK_PYTHON=python, SPARK_LOCAL_IP=root), \
                _peers.spark(len(hosts), executor_mb, driver_memory, app=app, conf=c) as sc:
            tracker = sc._jsc.sc().statusTracker()
            procs.wait_for(lambda: len(tracker.getExecutorInfos()) - 1 >= len(hosts),
                           f"{len(hosts)} executors did not register", step=0.25)
            yield sc
    finally:
        procs.stop()


# ---- Dask ---------------------------------------------------------------------------------

def _dask_env(config):
    """A dask config dict as DASK_* environment variables."""
    return {"DASK_" + k.upper().replace(".", "__").replace("-", "_"): repr(v) for k, v in (config or {}).items()}


def _cli_options(options):
    argv = []
    for k, v in options.items():
        flag = "--" + k.replace("_", "-")
        if v is True:
            argv.append(flag)
        elif v is False:
            argv.append("--no-" + k.replace("_", "-"))
        elif v is not None:
            argv += [flag, str(v)]
    return argv


@contextlib.contextmanager
def dask(hosts, config=None, **worker_options):
    """A distributed.Client: scheduler in the root namespace, one ``dask
    worker --nthreads 1`` (with its nanny) per host (see the module)."""
    try:
        import dask as dask_mod
        from distributed import Client
    except ImportError:
        raise PeerMissing("dask.distributed is not installed (pip install 'dask[distributed]')") from None
    root = hosts.root_addr
    procs = _Procs("dask", hosts)
    client = None
    try:
        with contextlib.ExitStack() as stack:
            stack.enter_context(dask_mod.config.set(config or {}))
            # Dask's scratch space in procs.tmp (the scheduler would make
            # /tmp/dask-scratch-space and keep it)
            denv = {**_dask_env(config), "DASK_TEMPORARY_DIRECTORY": procs.tmp}
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
            client = Client(addr, timeout=60)
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


# ---- Ray ----------------------------------------------------------------------------------

@contextlib.contextmanager
def ray_session(hosts, object_store_mb=None):
    """The ray module, connected to a head (0 CPUs) in the root namespace and
    one 1-CPU node per host (see the module)."""
    try:
        import ray
    except ImportError:
        raise PeerMissing("ray is not installed (pip install ray)") from None
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
        # RAY_AUTH_MODE: ray start turns token authentication on when it finds
        # a ~/.ray/auth_token (which a local ray.init() leaves behind), and a
        # driver connecting by address does not: say it, as on a fresh machine
        renv = {"RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": os.environ.get("RAY_AUTH_MODE", "disabled")}
        # the client server runs (on 10001 by default) only with ray[client] installed
        from ray._private.utils import get_ray_client_dependency_error
        client = [] if get_ray_client_dependency_error() else ["--ray-client-server-port", str(client_port)]
        procs.start(hosts.root, "head",
                    [cli, "start", "--head", "--node-ip-address", root, "--port", str(gcs), "--num-cpus", "0",
                     "--include-dashboard", "false", *client, "--dashboard-agent-listen-port", str(agent_port),
                     "--temp-dir", os.path.join(procs.tmp, "head"), *common], procs.env(**renv))

        def listening():
            with socket.socket() as s:
                s.settimeout(1)
                return s.connect_ex((root, gcs)) == 0

        procs.wait_for(listening, "the head does not listen")
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


# ---- self-test ----------------------------------------------------------------------------

def digest(a):
    """In a task: where it ran, and the CRC32 and size of ``a``'s bytes (reads every page)."""
    import zlib

    import numpy as np

    a = np.ascontiguousarray(a)
    return where(), zlib.crc32(memoryview(a).cast("B")), a.nbytes


SYSTEMS = {"clamor": clamor_cluster, "spark": spark, "dask": dask, "ray": ray_session}


def _per_worker(system, h, fn, *args):
    """``fn(*args)`` once on every worker; the results."""
    n = h["n"]
    if system == "clamor":
        return h["cl"].run(fn, *args)
    if system == "spark":
        return h["sc"].parallelize(range(n), n).barrier().mapPartitions(lambda it: [fn(*args)]).collect()
    if system == "dask":
        client = h["client"]
        ws = list(client.scheduler_info(n_workers=-1)["workers"])
        return client.gather([client.submit(fn, *args, workers=[w], allow_other_workers=False, pure=False)
                              for w in ws])
    ray = h["ray"]
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
    rfn = ray.remote(num_cpus=1)(fn)
    return ray.get([rfn.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False)).remote(*args)
                    for node in ray_host_nodes(ray).values()])


def _send(system, h, arr):
    """Send ``arr`` the system's way and read it with one task per worker."""
    if system == "clamor":
        import clamor
        a = clamor.array(arr)
        return _per_worker(system, h, digest, a)
    if system == "spark":
        bc = h["sc"].broadcast(arr)
        try:
            n = h["n"]
            return h["sc"].parallelize(range(n), n).barrier().mapPartitions(lambda it: [digest(bc.value)]).collect()
        finally:
            bc.destroy()
    if system == "dask":
        fut = h["client"].scatter(arr, broadcast=True)
        try:
            return _per_worker(system, h, digest, fut)
        finally:
            h["client"].cancel(fut)
    ref = h["ray"].put(arr)
    return _per_worker(system, h, digest, ref)


def _selftest_run(system, n, rate, mib):
    """One system on ``n`` fresh hosts; prints lines and a JSON line."""
    import zlib

    import numpy as np

    from clamor.testing import nethosts

    out = {"system": system, "hosts": n, "rate": rate, "mib": mib}
    with nethosts.Hosts(n, rate=rate) as hosts:
        names = [h.name for h in hosts]
        t0 = time.perf_counter()
        kwargs = {"executor_mb": 1024} if system == "spark" else {}
        if system == "dask":
            kwargs["config"] = DASK_AMM_OFF
        with SYSTEMS[system](hosts, **kwargs) as handle:
            out["start_s"] = round(time.perf_counter() - t0, 2)
            h = {"n": n, {"clamor": "cl", "spark": "sc", "dask": "client", "ray": "ray"}[system]: handle}
            ran = _per_worker(system, h, where)
            expect = {(str(x.index), x.addr) for x in hosts}
            got = {(r["host"], r["ip"]) for r in ran}
            out["tasks"] = sorted(got)
            out["hosts_ok"] = len(ran) == n and got == expect
            print(f"{system}: started in {out['start_s']} s; one task per worker ran on {sorted(got)}: "
                  f"{'ok' if out['hosts_ok'] else 'WRONG, expected ' + str(sorted(expect))}", flush=True)
            arr = np.random.default_rng(0).random((mib << 20) // 8)
            crc = zlib.crc32(memoryview(arr).cast("B"))
            links = LinkCounter(hosts)
            b0 = links.read()
            t = time.perf_counter()
            res = _send(system, h, arr)
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
        run_tag = os.environ.get("CLAMOR_PEERHOSTS_RUN")      # set by --selftest for this run
        left = [f"{p.name()}({p.pid})" for p in _tagged("CLAMOR_PEERHOSTS_RUN", run_tag, exclude={os.getpid()})
                ] if run_tag else []
        left += [f"pid {pid} in {x.name}" for x in hosts for pid in x.pids()]
        out["left_after_stop"] = left
    gone = not any(name in nethosts._netns_names() for name in names)
    out["namespaces_gone"] = gone
    print(f"{system}: stopped in {out['stop_s']} s; processes left: {left or 'none'}; "
          f"namespaces gone: {gone}", flush=True)
    print(json.dumps(out), flush=True)
    return 0 if out["hosts_ok"] and out["send_ok"] and not left and gone else 1


def _selftest(args):
    from clamor.testing import nethosts

    ok, reason = nethosts.available()
    if not ok:
        print(f"_peerhosts: network namespaces are not available here: {reason}", file=sys.stderr)
        return 2
    _peers.subreaper()
    rows, rc = [], 0
    for system in args.systems.split(","):
        run = uuid.uuid4().hex
        env = {**os.environ, "CLAMOR_PEERHOSTS_RUN": run}
        p = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--selftest-run", system, "--hosts",
                              str(args.hosts), "--rate", args.rate, "--mib", str(args.mib)],
                             env=env, stdout=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL)
        text = p.communicate()[0]
        sys.stdout.write(text)
        row = None
        for line in reversed(text.splitlines()):
            if line.startswith("{"):
                row = json.loads(line)
                break
        left = [f"{q.name()}({q.pid})" for q in _tagged("CLAMOR_PEERHOSTS_RUN", run)]
        left += _peers.reap_descendants()
        stale = [x for x in nethosts._netns_names() if x.startswith(f"{nethosts.NS_PREFIX}{p.pid}-")]
        print(f"{system}: after its run: processes left on the machine: {left or 'none'}; "
              f"namespaces left: {stale or 'none'}; exit status {p.returncode}\n", flush=True)
        rows.append((system, row, p.returncode, left, stale))
        if p.returncode != 0 or left or stale:
            rc = 1
    print(f"{'system':8} {'start s':>8} {'send s':>7} {'into MiB':>9} {'out MiB':>8} {'Gbit/s':>7} {'stop s':>7}  checks")
    for system, row, code, left, stale in rows:
        if row and row.get("missing"):
            print(f"{system:8} missing: {row['missing']}")
            continue
        if not row or "start_s" not in row:
            print(f"{system:8} failed (exit status {code})")
            continue
        checks = "ok" if code == 0 and not left and not stale else "FAILED"
        print(f"{system:8} {row['start_s']:8.1f} {row['send_s']:7.2f} {row['into_hosts'] / 2**20:9.1f} "
              f"{row['out_of_hosts'] / 2**20:8.1f} {row['into_rate_gbit']:7.3f} {row['stop_s']:7.1f}  {checks}")
    return rc


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--selftest", action="store_true", help="start each system on namespace hosts and check it")
    ap.add_argument("--selftest-run", metavar="SYSTEM", help=argparse.SUPPRESS)
    ap.add_argument("--systems", default="clamor,spark,dask,ray")
    ap.add_argument("--hosts", type=int, default=2)
    ap.add_argument("--rate", default="1gbit", help="every host's link, both ways (tc notation)")
    ap.add_argument("--mib", type=int, default=64, help="the array sent to every worker, MiB")
    args = ap.parse_args(argv)
    if args.selftest_run:
        try:
            return _selftest_run(args.selftest_run, args.hosts, args.rate, args.mib)
        except PeerMissing as e:
            print(json.dumps({"system": args.selftest_run, "missing": str(e)}), flush=True)
            return 2
    if args.selftest:
        return _selftest(args)
    ap.print_help()
    return 2


if __name__ == "__main__":
    sys.exit(main())
