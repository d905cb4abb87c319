"""A minimal control plane: ship a function to a worker, get its result.

This is the small piece the page-fault layer needs for its tests and
benchmarks: the driver binds a ROUTER socket; each worker (``python -m
clamor.worker --driver ENDPOINT``, or a forked child) connects a DEALER,
learns the driver's page-server endpoint, attaches the region and then runs
functions sent to it with cloudpickle.  Messages (multipart):

    worker -> driver   READY                 driver -> worker  WELCOME page_ep driver_pid pid_namespace
    worker -> driver   ATTACHED info         driver -> worker  TASK id payload
    worker -> driver   RESULT id ok|err data driver -> worker  STOP
    worker -> driver   HB token              driver -> worker  PING (ignored)

Local workers die with the driver process and ignore Ctrl-C, as a
Cluster's do (clamor/runtime/_liveness.py).  Each side checks the other by PID only
when they share a PID namespace (``pid_namespace`` in WELCOME and in the
ATTACHED info).  Otherwise the worker sends ATTACHED, and all that
follows, on a new connection with ZMTP heartbeats, and HB (every second,
from another socket, ``token`` from the ATTACHED info).  The driver's PING
then fails once the worker's connection is closed, and a worker without
HB for 10 s is lost as well.
"""
import os
import pickle
import signal
import subprocess
import sys
import time

import cloudpickle
import zmq

from . import _liveness
from .. import errors
from ..memory import region
from ..memory.hooks import prepare_fork


class TaskServer:
    """Driver side.  ``page_endpoint`` is the driver's page server (started
    if needed).  Use as a context manager; ``close`` stops every worker."""

    def __init__(self, endpoint="tcp://127.0.0.1:*", page_endpoint=None):
        region.ensure()
        if region.role() != "driver":
            raise errors.RegionError("a TaskServer runs in the driver")
        self.page_endpoint = page_endpoint or region.server_endpoint() or region.serve()
        self._ctx = zmq.Context()
        self._sock = self._ctx.socket(zmq.ROUTER)
        self._sock.linger = 0
        self._sock.bind(endpoint)
        self.endpoint = self._sock.getsockopt_string(zmq.LAST_ENDPOINT)
        self.workers = []  # [{"id": identity, "pid": ..., "proc": Popen|None, ...}]
        self._procs = []
        self._checks_pid = {}  # identity -> whether its PID can be checked from here
        self._beats = {}       # HB token -> identity (workers in other PID namespaces)
        self._last_hb = {}     # identity -> when it was last heard of
        self._next = 0
        self._closed = False

    # -- starting workers ---------------------------------------------------
    def _open(self):
        if self._closed:
            raise errors.ClamorError("this TaskServer is closed")

    def spawn(self, n=1, base=None, env=None, timeout=30.0):
        """Start ``n`` worker processes with ``python -m clamor.worker``."""
        self._open()
        cmd = [sys.executable, "-m", "clamor.worker", "--driver", self.endpoint]
        if base is not None:
            cmd += ["--base", hex(base)]
        fd = _liveness.lifeline()
        env = {**os.environ, "CLAMOR_DIE_WITH_PARENT": "1", "CLAMOR_PARENT_PID": str(os.getpid()),
               "CLAMOR_LIFELINE_FD": str(fd), **(env or {})}
        for _ in range(n):
            self._procs.append(subprocess.Popen(cmd, env=env, pass_fds=(fd,)))
        return self._await(len(self.workers) + n, timeout)

    def fork(self, n=1, timeout=30.0):
        """Start ``n`` workers forked from this process (Python objects built
        in the region stay valid in a child of the same image)."""
        from .worker import serve   # (not at the top: python -m clamor.worker)

        self._open()

        for _ in range(n):
            # the child is a worker already (the region's fork hook)
            prepare_fork()   # before the arguments are made: none may come from a free list
            self._procs.append(_liveness.fork(serve, self.endpoint))
        return self._await(len(self.workers) + n, timeout)

    def accept(self, n=1, timeout=30.0):
        """Wait for ``n`` more workers started elsewhere (``python -m
        clamor.worker --driver`` this server's ``endpoint``, in a container,
        another PID namespace or host) to connect; returns the worker list.
        Raises WorkerLost if fewer connect within ``timeout`` seconds."""
        self._open()
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise errors.ConfigError(f"n must be a positive int, not {n!r}")
        return self._await(len(self.workers) + n, timeout)

    def _await(self, want, timeout):
        deadline = time.monotonic() + timeout
        while len(self.workers) < want:
            left = deadline - time.monotonic()
            if left <= 0 or not self._sock.poll(int(left * 1000)):
                raise errors.WorkerLost(f"only {len(self.workers)} of {want} workers connected within {timeout}s")
            frames = self._sock.recv_multipart()
            ident, kind = frames[0], frames[1]
            if kind == b"READY":
                self._sock.send_multipart([ident, b"WELCOME", self.page_endpoint.encode(),
                                           str(os.getpid()).encode(), (_liveness.pid_namespace() or "").encode()])
            elif kind == b"ATTACHED":
                info = pickle.loads(frames[2])
                info["id"] = ident
                self._checks_pid[ident] = _liveness.shares_pids(info.pop("pidns", None))
                token = info.pop("hb", None)
                if token is not None:
                    self._beats[token] = ident
                    self._last_hb[ident] = time.monotonic()
                self.workers.append(info)
        return self.workers

    # -- running functions --------------------------------------------------
    def run(self, fn, *args, worker=0, timeout=None, **kwargs):
        """Run ``fn(*args, **kwargs)`` on worker number ``worker``."""
        return self.gather([(worker, fn, args, kwargs)], timeout=timeout)[0]

    def map(self, fn, items, timeout=None):
        """``fn(item)`` for each item, spread round-robin over the workers."""
        n = len(self.workers)
        if not n:
            raise errors.WorkerLost("no workers: call spawn(), fork() or accept() first")
        return self.gather([(i % n, fn, (x,), {}) for i, x in enumerate(items)], timeout=timeout)

    def gather(self, calls, timeout=None):
        """Run [(worker, fn, args, kwargs)] concurrently; results in order.
        A worker that dies raises WorkerLost; a function that raises raises
        TaskError with the remote traceback."""
        self._open()
        if not self.workers:
            raise errors.WorkerLost("no workers: call spawn(), fork() or accept() first")
        calls = list(calls)
        for w, *_ in calls:
            if isinstance(w, bool) or not isinstance(w, int) or not 0 <= w < len(self.workers):
                raise errors.ConfigError(f"worker must be an int from 0 to {len(self.workers) - 1}, not {w!r}")
            if self.workers[w].get("lost"):
                raise errors.WorkerLost(f"worker {w} was stopped after a task of it ran past its time-out")
        pending = {}
        for w, fn, args, kwargs in calls:
            tid = self._next
            self._next += 1
            payload = cloudpickle.dumps((fn, args, kwargs))
            self._sock.send_multipart([self.workers[w]["id"], b"TASK", str(tid).encode(), payload])
            pending[tid] = w
        order = list(pending)
        results = {}
        deadline = None if timeout is None else time.monotonic() + timeout
        while pending:
            if not self._sock.poll(500):
                self._check_alive(pending.values())
                if deadline is not None and time.monotonic() > deadline:
                    self._stop_stuck(set(pending.values()))
                    raise errors.TaskTimeout(f"tasks {sorted(pending)} did not finish within {timeout}s; "
                                             f"worker(s) {sorted(set(pending.values()))} were stopped")
                continue
            frames = self._sock.recv_multipart()
            if frames[1] == b"HB" and frames[2] in self._beats:
                self._last_hb[self._beats[frames[2]]] = time.monotonic()
            if frames[1] != b"RESULT":
                continue
            tid = int(frames[2])
            if tid not in pending:
                continue
            del pending[tid]
            if frames[3] == b"ok":
                results[tid] = pickle.loads(frames[4])
            else:
                msg, tb = pickle.loads(frames[4])
                raise errors.TaskError(msg, tb)
        return [results[t] for t in order]

    def _stop_stuck(self, ws):
        """A task cannot be interrupted: stop the workers running those past
        their time-out, so that nothing later queues behind them.  Their
        slots stay (workers are named by index) and refuse new tasks."""
        for w in ws:
            info = self.workers[w]
            info["lost"] = True
            try:
                self._sock.send_multipart([info["id"], b"STOP"], flags=zmq.NOBLOCK)
            except zmq.ZMQError:
                pass
            if self._checks_pid.get(info["id"]):
                try:
                    os.kill(info["pid"], signal.SIGKILL)
                except ProcessLookupError:
                    pass

    def _check_alive(self, ws):
        for w in set(ws):
            info = self.workers[w]
            ident, pid = info["id"], info["pid"]
            if self._checks_pid[ident]:
                if not _liveness.pid_alive(pid):
                    raise errors.WorkerLost(f"worker {w} (pid {pid}) died")
                continue
            if not self._connected(ident):
                raise errors.WorkerLost(f"worker {w} (pid {pid} as it sees itself) lost its connection")
            silent = time.monotonic() - self._last_hb.get(ident, time.monotonic())
            if silent > _liveness.HEARTBEAT_TIMEOUT_MS / 1000:
                raise errors.WorkerLost(f"worker {w} (pid {pid} as it sees itself) sent no heartbeat "
                                        f"for {silent:.0f} s")

    def _connected(self, ident):
        """Whether the ROUTER still has a connection to ``ident`` (it drops
        one that closes)."""
        self._sock.router_mandatory = 1
        try:
            self._sock.send_multipart([ident, b"PING"], flags=zmq.NOBLOCK)
        except zmq.Again:   # its queue is full: still connected
            pass
        except zmq.ZMQError as err:
            if err.errno == zmq.EHOSTUNREACH:
                return False
            raise
        finally:
            self._sock.router_mandatory = 0
        return True

    # -- shutting down ------------------------------------------------------
    def close(self, timeout=5.0):
        if self._closed:
            return
        self._closed = True
        for w in self.workers:
            try:
                self._sock.send_multipart([w["id"], b"STOP"], flags=zmq.NOBLOCK)
            except zmq.ZMQError:
                pass
        deadline = time.monotonic() + timeout
        for p in self._procs:
            if isinstance(p, subprocess.Popen):
                try:
                    p.wait(max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
            else:
                _liveness.reap(p, deadline)
        self._sock.close()
        self._ctx.term()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

