"""How a worker and its driver stay tied, and tell whether the other is alive.

DESIGN.  A local worker (forked by a Cluster, or spawned by one with
start_method="spawn") lives exactly as long as the driver *process*.  The
driver makes one *lifeline* pipe (``lifeline()``) and never writes to it.
Its write end is close-on-exec, and every child forked from the driver
closes its copy at once (an at-fork hook), so only the driver holds it.  A
worker watches the read end from a thread (``watch_lifeline``): EOF means
the driver process is gone, however it ended, and the worker SIGKILLs
itself, even in the middle of a task.  The same thread checks
os.getppid() every second as a second guard.  PR_SET_PDEATHSIG is set too
when the main thread forks the worker: the kernel fires it when the
forking *thread* exits (prctl(2)), so it would kill workers forked from a
short-lived thread, but the main thread lives as long as the process, and
the signal needs no GIL (a task may hold it in C code).

Across hosts and containers: a PID means something only to a process in
the same PID namespace on the same boot of the same host.  Each side sends
``pid_namespace()`` in its hello, and checks the other by PID only when
they match (``shares_pids``).  Otherwise the connection tells.  The
worker's socket sends ZMTP heartbeats (``heartbeats``; libzmq's I/O thread
answers them, so a busy driver still does) and drops a connection silent
for HEARTBEAT_TIMEOUT_MS; the worker then exits.  The driver sees a closed
connection at once, and a silent worker by its application heartbeats
(HB, sent by the worker's block-service thread, clamor/runtime/executor.py,
so that a running task does not stop them).
Only across namespaces: a worker that shares the driver's must survive a
driver stopped for a while (Ctrl-Z), and a dropped connection would come
back under an identity the driver does not know.

Heartbeats are one mechanism for every driver and worker, a Cluster's and
clamor.dask's alike.  The driver's WELCOME names the interval
(``beat_interval``); a worker's ``Beat`` sends at it, from a thread that
runs no task, and tells when the driver is gone (its process, where it can
be seen; a BYE; or, across PID namespaces, silence).  The driver keeps
when it last heard each worker in a ``Heard`` and loses, or forgets, the
ones silent too long.  What a beat is on the wire differs by endpoint
(docs/wire.md): a Cluster's worker sends HB on a socket of its own and
expects no answer; a Dask worker asks PING and is answered PONG or BYE.

This is not clamor.worker: that module is also run as ``python -m``, and
the package must not import it first.
"""
import ctypes
import json
import os
import select
import signal
import socket
import stat
import subprocess
import sys
import threading
import time
import traceback

import psutil
import zmq

from .. import errors

HEARTBEAT_IVL_MS = 1000
HEARTBEAT_TIMEOUT_MS = 10000

# -- the lifeline ---------------------------------------------------------------------
_lifeline = None      # (read fd, write fd): this driver process's lifeline
_inherited = None     # read end of the lifeline of the process this one was forked from
_lifeline_lock = threading.Lock()
_libc = None


def lifeline():
    """Driver: the read end of this process's lifeline pipe (made on first
    use; both ends are close-on-exec, PEP 446)."""
    global _lifeline
    with _lifeline_lock:
        if _lifeline is None:
            _lifeline = os.pipe()
        return _lifeline[0]


def _after_fork_child():
    global _lifeline, _inherited
    _lifeline_lock.release()
    if _lifeline is not None:
        os.close(_lifeline[1])   # now only the driver holds the write end
        _inherited, _lifeline = _lifeline[0], None


# The lock is held across fork, so that no child inherits a write end
# another thread is still making.
os.register_at_fork(before=_lifeline_lock.acquire, after_in_parent=_lifeline_lock.release,
                    after_in_child=_after_fork_child)


def _suicide():
    os.kill(os.getpid(), signal.SIGKILL)


def watch_lifeline(fd, parent):
    """Worker: SIGKILL this process once the driver process is gone: ``fd``
    (the lifeline's read end; None for none) reads EOF, or the parent
    process is no longer ``parent``."""
    poll = None
    if fd is not None:
        poll = select.poll()
        poll.register(fd, select.POLLIN)

    def watch():
        p = poll
        while True:
            if p is None:
                time.sleep(1.0)
            else:
                events = p.poll(1000)
                if any(ev & select.POLLNVAL for _, ev in events):
                    p = None     # a task closed the descriptor: the parent check remains
                elif events:     # nobody writes: any event is the end of the pipe
                    _suicide()
            if os.getppid() != parent:
                _suicide()

    threading.Thread(target=watch, name="clamor-lifeline", daemon=True).start()


def _pdeathsig():
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # pragma: no cover - not Linux
        pass


def _listeners():
    """[(fd, (st_dev, st_ino))] of this process's listening sockets."""
    out = []
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        try:
            st = os.fstat(fd)
        except OSError:          # the directory's own descriptor, or closed meanwhile
            continue
        if stat.S_ISSOCK(st.st_mode) and _accepting(fd):
            out.append((fd, (st.st_dev, st.st_ino)))
    return out


def _accepting(fd):
    # getsockopt(2) straight on the descriptor: a socket.socket object made
    # around it could change its blocking mode (socket.setdefaulttimeout).
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
    val, size = ctypes.c_int(0), ctypes.c_uint32(ctypes.sizeof(ctypes.c_int))
    rc = _libc.getsockopt(fd, socket.SOL_SOCKET, socket.SO_ACCEPTCONN, ctypes.byref(val), ctypes.byref(size))
    return rc == 0 and val.value != 0


def _close_listeners(inherited):
    """Close, in a child, the driver's listening sockets: they would keep its
    ports bound while the child lives.  A descriptor is closed only if it
    is still the same socket (a socket made after fork, such as the
    child's own page server's, has another inode)."""
    for fd, ident in inherited:
        try:
            st = os.fstat(fd)
            if (st.st_dev, st.st_ino) == ident:
                os.close(fd)
        except OSError:
            pass


def fork(body, *args):
    """Driver: fork a local worker that runs ``body(*args)`` and exits;
    returns its pid.  The child dies with this process (see DESIGN), ignores
    Ctrl-C (the driver's to handle) and closes the driver's listening
    sockets.

    The caller runs ``clamor.memory.hooks.prepare_fork()`` first, before it
    makes ``args``: what the child reads must not come from a free list
    that holds region objects dropped since a heap() block (the arguments'
    tuple is made at the call, before this runs)."""
    lifeline()
    parent = os.getpid()
    main = threading.current_thread() is threading.main_thread()
    listening = _listeners()
    pid = os.fork()
    if pid:
        return pid
    code = 0
    try:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        if main:
            _pdeathsig()
        watch_lifeline(_inherited, parent)
        if os.getppid() != parent:   # the driver died before the watch began
            os._exit(0)
        _close_listeners(listening)
        body(*args)
    except KeyboardInterrupt:   # a Ctrl-C before SIGINT was ignored
        code = 1
    except BaseException:
        traceback.print_exc()
        code = 1
    finally:
        os._exit(code)


def spawn(args, env=None):
    """Driver: start ``python -m clamor.worker`` with ``args`` as a fresh
    interpreter that dies with this process, as a forked worker does (it
    gets the lifeline's read end); returns the Popen."""
    fd = lifeline()
    # the driver's sys.path and working directory, as multiprocessing's
    # spawn hands its children (a script's own directory among them)
    env = {**os.environ, "CLAMOR_DIE_WITH_PARENT": "1", "CLAMOR_PARENT_PID": str(os.getpid()),
           "CLAMOR_LIFELINE_FD": str(fd), "CLAMOR_SYS_PATH": json.dumps(sys.path), **(env or {})}
    return subprocess.Popen([sys.executable, "-m", "clamor.worker", *args], env=env, pass_fds=(fd,),
                            cwd=os.getcwd())


def adopt_driver_path():
    """A spawned worker: put the driver's sys.path (CLAMOR_SYS_PATH) in
    front of its own, in the driver's order."""
    raw = os.environ.pop("CLAMOR_SYS_PATH", None)
    if not raw:
        return
    try:
        paths = json.loads(raw)
    except ValueError:
        return
    if isinstance(paths, list) and all(isinstance(p, str) for p in paths):
        sys.path[:] = paths + [p for p in sys.path if p not in paths]


def reap(pid, deadline):
    """Wait for child ``pid`` to exit until ``deadline`` (time.monotonic()),
    then SIGKILL it; reap it either way."""
    while True:
        try:
            if os.waitpid(pid, os.WNOHANG)[0]:
                return
        except ChildProcessError:   # reaped already
            return
        if time.monotonic() > deadline:
            break
        time.sleep(0.005)
    try:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    except (ProcessLookupError, ChildProcessError):
        pass


# -- liveness across PID namespaces ---------------------------------------------------
def pid_namespace():
    """Who sees the same PIDs: "host/boot id/PID-namespace inode", or None
    where that cannot be told."""
    try:
        ino = os.stat("/proc/self/ns/pid").st_ino
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
    except OSError:
        return None
    return f"{socket.gethostname()}/{boot}/{ino}"


def shares_pids(peer):
    """True if a peer that reported ``peer`` (its pid_namespace()) can be
    checked by PID from here."""
    mine = pid_namespace()
    return mine is not None and peer == mine


def exit_state(pid):
    """None while process ``pid`` runs; "process exited" once it has exited
    and is not reaped yet (a zombie), "process gone" once there is none.
    A child of this process costs one waitid() that reaps nothing (a stage
    begins with this check of every local worker); another, psutil's read
    of /proc."""
    try:
        return None if os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None else "process exited"
    except ChildProcessError:
        pass    # (not this process's child, or reaped already)
    try:
        return "process exited" if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE else None
    except psutil.NoSuchProcess:
        return "process gone"


def pid_alive(pid):
    return exit_state(pid) is None


def heartbeats(sock):
    """ZMTP heartbeats on ``sock``'s future connections (set before
    connect): a ping every HEARTBEAT_IVL_MS, and a connection that stays
    silent HEARTBEAT_TIMEOUT_MS after a ping is dropped."""
    sock.heartbeat_ivl = HEARTBEAT_IVL_MS
    sock.heartbeat_timeout = HEARTBEAT_TIMEOUT_MS


class LinkWatch:
    """Liveness of a DEALER's one connection, watched from before it is
    made: gone once it disconnects (closed by the peer, or silent past the
    heartbeat time-out), or if it is not made within ``grace`` seconds."""

    def __init__(self, sock, grace):
        # (imported here: it loads asyncio, a tenth of a second that a
        # driver and a forked worker, which watch no link, need not pay)
        from zmq.utils.monitor import recv_monitor_message
        self._recv = recv_monitor_message
        self.sock = sock
        self.mon = sock.get_monitor_socket(zmq.EVENT_CONNECTED | zmq.EVENT_DISCONNECTED)
        self.connected = False
        self.deadline = time.monotonic() + grace

    def __call__(self):
        while self.mon.poll(0):
            if self._recv(self.mon)["event"] == zmq.EVENT_DISCONNECTED:
                return False
            self.connected = True
        return self.connected or time.monotonic() < self.deadline

    def close(self):
        self.sock.disable_monitor()
        self.mon.close()


# -- heartbeats: the one mechanism of every driver and worker --------------------------
def beat_interval(welcome):
    """Seconds between a worker's heartbeats, as the driver's WELCOME asks
    (its ``heartbeat``); 1 s where it names none, or none in 0.01-60 s."""
    every = welcome.get("heartbeat")
    return float(every) if isinstance(every, (int, float)) and 0.01 <= every <= 60 else 1.0


class Heard:
    """Driver: when each worker was last heard from, by any key (a
    Cluster's worker ids, clamor.dask's page servers), and which have been
    silent too long.  Not locked: one thread keeps it."""

    def __init__(self):
        self.last = {}

    def heard(self, key, now=None):
        """``key`` spoke now (a heartbeat, or any message)."""
        self.last[key] = time.monotonic() if now is None else now

    def forget(self, key):
        """Stop watching ``key``; True if it was watched."""
        return self.last.pop(key, None) is not None

    def silent(self, timeout, now=None):
        """[(key, seconds)] of those unheard for more than ``timeout`` s."""
        now = time.monotonic() if now is None else now
        return [(k, now - t) for k, t in list(self.last.items()) if now - t > timeout]

    def pause(self, seconds):
        """Nobody listened for ``seconds``: that time is nobody's silence."""
        for k in self.last:
            self.last[k] += seconds

    def __contains__(self, key):
        return key in self.last


BYE = "bye"   # what a heartbeat's ``send`` returns when the driver says it detached


class Beat:
    """Worker: the heartbeat, and whether the driver is gone.

    Every ``every`` seconds (the WELCOME's, ``beat_interval``) ``tick``
    calls ``send()``: it sends one heartbeat and returns True (the driver
    answered), None (no answer is expected: a Cluster's HB), or BYE (the
    driver detached); a ClamorError or ZMQError from it is a beat not
    answered.  The driver is gone once ``alive()`` says its process is
    (None: this worker cannot see it, in another PID namespace), it said
    BYE, or, with ``grace``, no beat was answered for ``grace`` seconds.
    Checked before each beat: a gone driver is not sent one."""

    def __init__(self, send, every, alive=None, grace=None):
        self.send, self.every, self.alive, self.grace = send, every, alive, grace
        self.sent = float("-inf")
        self.answered = time.monotonic()

    def due(self):
        """Seconds until the next beat (0: now)."""
        return max(0.0, self.sent + self.every - time.monotonic())

    def tick(self):
        """Beat if one is due; returns why the driver is gone, or None."""
        now = time.monotonic()
        if now < self.sent + self.every:
            return None
        self.sent = now
        if self.alive is not None and not self.alive():
            return "the driver's process is gone"
        try:
            answer = self.send()
        except (errors.ClamorError, zmq.ZMQError):
            answer = False
        if answer == BYE:
            return "the driver detached"
        now = time.monotonic()   # (an answer may take a while)
        if answer:
            self.answered = now
        elif self.grace is not None and now - self.answered > self.grace:
            return f"the driver has not answered for {self.grace:g} s"
        return None

    def run(self, stop, gone):
        """The loop of a thread of its own: beat until ``stop`` (an Event)
        is set, or the driver is gone: then ``gone(why)``, and return."""
        while not stop.wait(self.due()):
            why = self.tick()
            if why:
                gone(why)
                return
