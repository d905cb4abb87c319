"""The worker's side: a Dask worker process attached to the driver's region.

The plugin joins the driver's control endpoint, maps the region (every
page absent) and starts clamor's pager and page server, as a worker of a
Cluster does.  Region arrays in a task's graph load as views of that
region; a task's first touch of a page fetches it, from the driver or a
peer that holds it.

A worker holds one version of each page, so it runs the tasks of one
version at a time.  The scheduler names each task's version in its
executor, ``clamor-<version>`` (clamor/dask/_scheduler.py); those
executors share the worker's own thread pool and pass a gate that, when
the version changes and no task of another version runs, drops the pages
that changed between the two (asked of the driver) and moves the pager to
the new version.  Versions take turns in the order their tasks arrived.

A task's result leaves as a value: region arrays in it are copied at the
task's version.
"""
import json
import logging
import os
import pickle
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import zmq
from distributed.diagnostics.plugin import WorkerPlugin

from .. import errors
from ..memory import images, portable, region
from ..runtime import security, serialize
from ..runtime.liveness import BYE, Beat, beat_interval, pid_namespace
from ..runtime.versions import VersionGate
from ..runtime.worker import advertised_address, attach, driver_check, join_body, leave_body
from . import _pickling
from ._scheduler import RESOURCE

log = logging.getLogger("clamor.dask")

NAME = "clamor"
SLOTS = 1 << 20        # the worker's amount of the clamor resource: never what limits it
DRIVER_GRACE = 10.0    # seconds without an answer before a worker detaches itself (across PID namespaces)


class Link:
    """Requests to the driver's control endpoint, one at a time."""

    def __init__(self, endpoint, sec, timeout):
        self.endpoint, self.sec, self.timeout = endpoint, sec, timeout
        self.ctx = zmq.Context()
        self.lock = threading.Lock()
        self.sock = None
        self._open()

    def _open(self):
        if self.sock is not None:
            self.sock.close()
        self.sock = self.ctx.socket(zmq.DEALER)
        self.sock.linger = 0
        self.sec.client(self.sock)
        self.sock.connect(self.endpoint)

    def ask(self, kind, body=b"", timeout=None):
        """The driver's answer (kind, body); TransportError if none comes in
        ``timeout`` seconds."""
        timeout = self.timeout if timeout is None else timeout
        with self.lock:
            if self.sock is None:
                raise errors.TransportError("the link to the driver is closed")
            # (a DEALER whose connection failed its handshake for good would
            # block a plain send forever: the send waits at most the time-out)
            self.sock.sndtimeo = max(1, int(timeout * 1000))
            try:
                self.sock.send_multipart([kind, body])
                sent = True
            except zmq.Again:
                sent = False
            if not sent or not self.sock.poll(int(timeout * 1000)):
                self._open()   # a late answer must not be read as the next one's
                raise errors.TransportError(
                    f"no answer from the clamor driver at {self.endpoint} within {timeout:g} s (it is gone, "
                    f"or this worker's secret is not the driver's)")
            frames = self.sock.recv_multipart()
        if len(frames) != 2:
            raise errors.ProtocolError(f"the driver answered {kind.decode()} with {len(frames)} frames")
        if frames[0] == b"ERROR":
            raise errors.ProtocolError(f"the driver refused {kind.decode()}: {frames[1].decode(errors='replace')}")
        return frames[0], frames[1]

    def close(self):
        with self.lock:
            if self.sock is not None:
                self.sock.close()
                self.sock = None
        self.ctx.term()


_task = threading.local()   # .version: that of the task this thread runs (None between tasks)


class VersionThreadPoolExecutor(ThreadPoolExecutor):
    """Runs tasks of one version on the worker's own pool, through the gate.
    (A ThreadPoolExecutor by name and type: Dask then passes context
    variables to its threads as for its own.)"""

    def __init__(self, pool, gate, version):
        super().__init__(max_workers=1)   # (no thread is made: submit goes to ``pool``)
        self._pool, self._gate, self._version = pool, gate, version

    def submit(self, fn, /, *args, **kwargs):
        return self._pool.submit(self._run, fn, args, kwargs)

    def _run(self, fn, args, kwargs):
        self._gate.enter(self._version)
        _task.version = self._version
        try:
            out = fn(*args, **kwargs)
            if isinstance(out, dict) and out.get("op") == "task-finished":
                out["result"] = _pickling.detach_result(out["result"])
            return out
        finally:
            _task.version = None
            self._gate.exit()

    def shutdown(self, wait=True, **kwargs):
        super().shutdown(wait=False)


class Executors(dict):
    """A worker's executors, with ``clamor-<version>`` made on first use."""

    def __init__(self, base, gate):
        super().__init__(base)
        self.gate = gate

    def __missing__(self, name):
        if isinstance(name, str) and name.startswith("clamor-") and name[7:].isdigit():
            e = self[name] = VersionThreadPoolExecutor(self["default"], self.gate, int(name[7:]))
            return e
        raise KeyError(name)


class RegionPlugin(WorkerPlugin):
    """Attaches each Dask worker, present and future, to the driver's
    region (installed by clamor.dask.attach)."""

    _stop = None    # set once this worker is attached: a teardown after a failed setup has nothing to stop

    name = NAME

    def __init__(self, control, secret, encrypt, driver_pid, driver_pidns, timeout=30.0):
        self.control, self.secret, self.encrypt = control, secret, encrypt
        self.driver_pid, self.driver_pidns, self.timeout = driver_pid, driver_pidns, timeout

    async def setup(self, worker):
        try:
            self._attach(worker)
        except BaseException:
            if worker.state.total_resources.get(RESOURCE):   # (attached before, detached since)
                await worker.set_resources(**{RESOURCE: 0})
            raise
        await worker.set_resources(**{RESOURCE: SLOTS})
        await worker.scheduler.clamor_attached(worker=worker.address)

    def _attach(self, worker):
        if os.getpid() == self.driver_pid and pid_namespace() == self.driver_pidns:
            raise errors.ConfigError("this Dask worker runs inside the driver's process (a LocalCluster with "
                                     "processes=False?): clamor needs workers in processes of their own")
        if region.role() is not None:
            raise errors.RegionError("this Dask worker's process has a clamor region already (attached to another "
                                     "driver?); one process maps one region")
        secret = security.from_environment(self.secret)
        if secret is None:
            raise errors.ConfigError("no clamor secret on this worker: Dask's connection is not encrypted, so the "
                                     "driver does not send it; set CLAMOR_SECRET in the worker's environment to "
                                     "the driver's (clamor.dask.secret(client))")
        sec = security.Security(secret, self.encrypt)
        self._lock = threading.Lock()
        self._done = False
        self.link = Link(self.control, sec, self.timeout)
        try:
            kind, body = self.link.ask(b"JOIN", join_body())
            if kind != b"WELCOME":
                raise errors.WorkerRefused(f"the clamor driver at {self.control} answered JOIN with {kind!r}")
            welcome = json.loads(body)
            host = advertised_address(self.control)
            # (every page comes with its relocations: region objects are used in place)
            self.serving = attach(welcome, sec, f"tcp://{host}:*",
                                  fetch_reason="a Dask worker fetches the driver's pages").encode()
        except BaseException:
            self.link.close()
            raise
        region.set_version(welcome["version"])
        # Region objects are used in place only at the driver's address, with
        # its hash seed and its builds of the images they point into.
        self.refuse = None
        bad = images.mismatches(welcome.get("images") or {})
        if region.base() != welcome["base"]:
            self.refuse = "this worker maps the region at another address than the driver"
        elif welcome.get("hash") != portable.hash_digest():
            self.refuse = ("this worker's str hash seed differs from the driver's: start the driver with "
                           "PYTHONHASHSEED set to a number other than 0 (Dask's workers take it from their "
                           "environment, or use 6640 when it is unset or 0)")
        elif bad:
            self.refuse = f"{len(bad)} of this worker's images differ from the driver's: " + "; ".join(bad[:3])
        serialize.objects_in_place(self.refuse is None)
        _pickling.set_object_resolver(self._object)
        self.bind_error = None
        self.gate = VersionGate(self._changes, welcome["version"], on_switch=self._bind_targets)
        self._bind_targets()
        execs = worker.executors
        if isinstance(execs, Executors):   # attached before, then detached
            execs.gate = self.gate
            for name in [n for n in execs if isinstance(n, str) and n.startswith("clamor-")]:
                del execs[name]
        else:
            worker.executors = Executors(execs, self.gate)
        _pickling.install(self.gate.stamp)
        _pickling.resolve(True)
        self._stop = threading.Event()
        # A driver this worker can see alive is only busy (a long check before a
        # submission, a heap() block that pauses its threads, Ctrl-Z): its
        # workers wait, as a Cluster's do.  Across PID namespaces, silence tells.
        alive = driver_check(welcome)
        beat = Beat(self._ping, beat_interval(welcome), alive=alive, grace=DRIVER_GRACE if alive is None else None)
        self._watcher = threading.Thread(target=beat.run, args=(self._stop, self._driver_gone),
                                         name="clamor-dask-watch", daemon=True)
        self._watcher.start()
        log.info("attached to the clamor driver at %s (pages %s, version %d)", self.control, welcome["pages"],
                 welcome["version"])

    def _changes(self, lo, hi):
        """The pages changed between versions ``lo`` and ``hi``, asked of the driver."""
        kind, body = self.link.ask(b"CHANGES", json.dumps([lo, hi]).encode())
        if kind != b"CHANGES" or len(body) % 8:
            raise errors.ProtocolError(f"the driver answered CHANGES with {kind!r}")
        return np.frombuffer(body, dtype=np.uint64)

    def _bind_targets(self):
        """Bind the relocation targets the driver's lists name (asked at
        attach and at each change of version, before tasks run)."""
        try:
            kind, body = self.link.ask(b"TARGETS")
            if kind != b"TARGETS":
                raise errors.ProtocolError(f"the driver answered TARGETS with {kind!r}")
            portable.bind(pickle.loads(body))
        except errors.TransportError:
            raise
        except Exception as err:  # a target this worker cannot have: objects fail, saying why
            self.bind_error = err

    def _object(self, ref):
        """A region object for a task (GlobalObject.get)."""
        if self.refuse:
            raise errors.NotShareable(f"a region object cannot be used in place here: {self.refuse}")
        if self.bind_error is not None:
            raise errors.NotShareable(f"a region object cannot be used in place here: {self.bind_error}")
        # The task reads at its submission's version, the newest stamp in its
        # graph: the handle's (when the object was last sent, at or before
        # it) or a region array's sent with it.
        version = getattr(_task, "version", None)
        if version is None or ref.version > version:
            raise errors.NotShareable("clamor.dask.ref(...).get() reads the object in a task it was sent to "
                                      "(at that task's version), not outside one")
        self.gate.resolved = True
        return serialize.object_at(ref.offset)

    def _ping(self):
        """One heartbeat (liveness.Beat): PING, naming this worker's page
        server, which the driver keeps while the pings come."""
        kind, _ = self.link.ask(b"PING", self.serving, timeout=2.0)
        return BYE if kind == b"BYE" else True

    def _driver_gone(self, why):
        """Detach this worker: the driver said BYE, its process is gone, or,
        across PID namespaces, it has not answered for DRIVER_GRACE s."""
        log.warning("clamor detaches this worker: %s", why)
        self._shutdown(why)

    def teardown(self, worker):
        # (the worker keeps the clamor resource: a task that reads globals and
        # was already on its way fails at the closed gate, saying why, rather
        # than wait for a resource that never comes)
        self._shutdown("clamor.dask.detach()")

    def _shutdown(self, why):
        if self._stop is None:
            return
        with self._lock:
            if self._done:
                return
            self._done = True
        self._stop.set()
        if threading.current_thread() is not self._watcher:
            self._watcher.join()
        drained = self.gate.close(why)
        _pickling.resolve(False)
        _pickling.uninstall()
        try:
            self.link.ask(b"LEAVE", leave_body(why, pages=self.serving.decode()), timeout=1.0)
        except errors.ClamorError:
            pass   # (a driver that is gone forgets it anyway)
        self.link.close()
        if not drained:
            # a task still reads the region: leave it mapped rather than pull it from under the task
            log.warning("a task still runs after 60 s; the region stays mapped on this worker")
            return
        region.close(force=True)
        # Closing the region unbound every relocation target in C; the next
        # attachment's driver numbers its targets from 1 again, and a number
        # still marked bound here was skipped: its pointers stayed the old
        # driver's, and the task that read them killed the worker.
        portable.unbind_all()
