"""The gate that keeps the driver's other Python threads out of a
``heap()`` block (csrc/pygate.c).

CPython's free lists are shared by every thread: what another thread frees
while a block runs, the block's next object may be made from, outside the
region.  So while a block is open:

- clamor's own threads run no Python: each waits in C for its sockets or
  its period (``Gated``), then for the gate;
- a *resident*, a thread that runs Python whenever it likes (a Dask
  client's event loop, which in a LocalCluster runs the scheduler too;
  Dask's profiler, which samples that loop), is asked to park
  (``keep_out``): the block begins once it waits in C.

``close_gate``/``open_gate`` are what heap() and ``suspended`` call at a
block's edges; the Cluster's and the Dask driver's threads use the same.
"""
import errno
import logging
import threading

from .. import errors
from .._native import ffi, lib

log = logging.getLogger("clamor.heap")

SETTLE_S = 10.0     # how long a block waits for the residents to park before it goes on

_CANCELED = -errno.ECANCELED   # (made once: a gated thread allocates nothing around its waits)


class Gated:
    """How a clamor thread of the driver waits: for its libzmq sockets
    (pyzmq's, at most CLAMOR_GATE_MAX_SOCKETS) or, with none, for a while,
    in C, then for every heap() block to end.  It runs Python only between
    ``wait`` and ``done``.  ``stop``, from any thread, ends a wait, even
    one for a block that stays open."""

    def __init__(self, sockets=()):
        self._abort = ffi.new("int[1]")
        self._busy = False
        self.set_sockets(sockets)

    def set_sockets(self, sockets):
        """What ``wait`` polls from now on (before the thread's first wait)."""
        if len(sockets) > lib.CLAMOR_GATE_MAX_SOCKETS:
            raise errors.ClamorError(f"a gated thread waits for at most {lib.CLAMOR_GATE_MAX_SOCKETS} sockets")
        self.n = len(sockets)
        self._handles = ffi.new("uintptr_t[]", [s.underlying for s in sockets] or [0])
        self._revents = ffi.new("short[]", max(self.n, 1))

    def wait(self, timeout_ms=-1):
        """zmq_poll's result (sockets ready, 0 after a timeout or a sleep,
        -errno), this thread now busy until ``done``; or -ECANCELED, not
        busy, once stopped.  Made and freed nothing from its call to here."""
        rc = lib.clamor_py_gate_poll(self._handles, self.n, timeout_ms, self._revents, self._abort)
        self._busy = rc != _CANCELED
        return rc

    def hold(self, lock):
        """Take ``lock`` (a threading.Lock) while busy.  Its holder may be
        opening a heap() block, which waits for this thread to stop being
        busy (a walk's bring-in under the Dask driver's lock, while the
        keeper waited for that lock: both waited for ever).  So while the
        lock is taken this thread steps out of the gate and back in,
        waiting meanwhile for any block to end."""
        while not lock.acquire(timeout=0.02):
            if self._busy:
                self.done()
                # (no socket, no wait: busy again once no block is open; not if stopped)
                self._busy = lib.clamor_py_gate_poll(self._handles, 0, 0, self._revents, self._abort) == 0

    def ready(self, i):
        """Whether socket ``i`` had input at the last ``wait``."""
        return bool(self._revents[i])

    def done(self):
        if self._busy:
            self._busy = False
            lib.clamor_py_gate_release()

    def stop(self):
        self._abort[0] = 1
        lib.clamor_py_gate_wake()


class Resident:
    """A thread kept out of heap() blocks by parking (``keep_out``)."""

    def __init__(self, ident, knock, name):
        self.ident, self.knock, self.name = ident, knock, name
        self._abort = ffi.new("int[1]")

    def park(self, knocked):
        """On the resident's thread: wait, in C, until the gate opens after
        the knock that read generation ``knocked`` (at once if it has)."""
        lib.clamor_py_gate_park(self._abort, knocked)

    def __repr__(self):
        return f"<clamor resident {self.name} (thread {self.ident})>"


class _Park:
    """What a knock has the resident call: ``park()`` for the block whose
    close read ``knocked``."""
    __slots__ = ("r", "knocked")

    def __init__(self, r, knocked):
        self.r, self.knocked = r, knocked

    def __call__(self):
        self.r.park(self.knocked)


_residents = {}
_residents_lock = threading.Lock()


_knocked = []     # the abort flags of residents knocked in C: a knock may wait on them after let_in


def _knock_in_c(r):
    def knock(park):
        return lib.clamor_py_knock(r.ident, r._abort, park.knocked) == 0   # (-ESRCH: the thread ended)
    _knocked.append(r._abort)
    return knock


def keep_out(ident, knock, name):
    """Keep the thread ``ident`` (``threading.get_ident()``), which runs
    Python whenever it likes, out of heap() blocks: as a block begins,
    ``knock(park)`` must make that thread call ``park()`` soon (an event
    loop's call_soon_threadsafe), and return False if it no longer can
    (the loop closed: the thread is let in).  ``knock=None``, for a thread
    that runs a plain loop: a one-shot profile function parks it at its
    next call or return (csrc/pyknock.c).  Returns the Resident, for
    ``let_in``."""
    r = Resident(ident, knock, name)
    if knock is None:
        r.knock = _knock_in_c(r)
    with _residents_lock:
        _residents[id(r)] = r
        lib.clamor_py_gate_enlist()
    return r


def let_in(r):
    """Undo ``keep_out``: the thread runs freely, a park it is in ends."""
    with _residents_lock:
        if _residents.pop(id(r), None) is None:
            return
        r._abort[0] = 1
        lib.clamor_py_gate_discharge()


def close_gate():
    """At a block's start: wait until clamor's threads are out of Python,
    then have every resident park (the block's own thread excepted); after
    SETTLE_S seconds, go on without those that did not, with a warning."""
    lib.clamor_py_gate_close()
    with _residents_lock:
        residents = list(_residents.values())
    if not residents:
        return
    me, mine = threading.get_ident(), 0
    generation = lib.clamor_py_gate_generation()
    for r in residents:
        if r.ident == me:
            mine += 1
            continue
        try:
            knocked = r.knock(_Park(r, generation))
        except Exception as err:  # the loop is gone, or worse: the thread runs free
            log.debug("could not knock on %r: %s", r, err)
            knocked = False
        if knocked is False:
            let_in(r)
    if lib.clamor_py_gate_settle(mine, int(SETTLE_S * 1000)) == errno.ETIMEDOUT:
        log.warning("a heap() block begins while %s did not pause within %g s: objects built in the block may "
                    "come from CPython's free lists, outside the region (share() and clamor.dask.ref would say "
                    "so)", ", ".join(r.name for r in residents), SETTLE_S)


def open_gate():
    """At a block's end: clamor's threads and the residents go on."""
    lib.clamor_py_gate_open()
