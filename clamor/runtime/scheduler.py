"""The driver's task scheduler: a pure state machine from events to instructions.

DESIGN
The cluster turns everything that happens (a worker joined or was lost, the
user submitted or cancelled a stage, a task reported its result or its
exception) into an event and passes it to ``Scheduler.handle``, which is the
only mutator.  ``handle`` returns a list of instructions (``Run`` a task on a
worker, a stage is ``StageFinished`` or ``StageAborted``) that the cluster
carries out in order.  The scheduler does no I/O, starts no threads and reads
no clock, so its whole policy is tested by feeding events, without sockets or
processes (tests/test_scheduler.py); this is the split of distributed's
worker_state_machine.  The records that go in and come out (``TaskSpec``, the
events, the instructions) are in clamor/runtime/events.py; this module
re-exports them, so that a caller imports the scheduler's vocabulary from here.

Queues.  Unassigned tasks wait in one FIFO: stages in submission order, each
stage's tasks in partition order.  A task at the head goes to a free slot as
soon as one exists, so a later stage starts using slots while the earlier
stage's last tasks still run, but none of its tasks is assigned before every
task of the earlier stages is.  Workers with a free slot sit in a heap keyed
by (assigned tasks, join order); entries whose load has changed since they
were pushed are skipped when they reach the top, and the heap is rebuilt when
stale entries pile up, so an assignment costs O(log workers).

Results.  ``StageFinished`` leaves in submission order: a stage whose tasks
are all done waits (and still reports "running") until every earlier stage is
finished, aborted or cancelled.  ``StageAborted`` is reported at once.

Policy
- A task goes to one of its ``prefer`` workers if one is live with a free slot
  (the least loaded of them, ties to the earliest joined); otherwise to the
  least loaded live worker with a free slot (same tie-break).  A worker never
  holds more than ``slots`` tasks; tasks wait while every slot is taken.
- A task with ``only`` goes to the least loaded of those workers with a
  free slot.  While none has one, it waits at the head of the queue, and
  the tasks behind it wait too (the queue is FIFO).  Once none of them is
  live, its stage is aborted with ``clamor.errors.WorkerLost``, with
  ``recover`` or without.  Such a task never gets a speculative copy.
- A stage with no tasks finishes at once, in its turn.
- ``TaskFailedEvent`` aborts the stage (one ``StageAborted`` with the task's
  error) and drops its unassigned tasks.  Its tasks still running keep their
  slots until they report; those reports only free slots.
- ``WorkerLostEvent`` removes the worker.  With ``recover=False`` the stages of
  the tasks it held are aborted with ``clamor.errors.WorkerLost``, and once
  some worker has joined, having no live worker aborts every stage with
  unassigned tasks, including stages submitted later, with
  ``WorkerLost("no live workers")``; before the first join, submitted stages
  wait for one.  With ``recover=True`` (lineage-based recovery) each task it
  held goes back to the front of its stage's queue, unless another copy of
  it still runs elsewhere, and stages wait for a worker however long none is
  live: the cluster decides when to give up.
- ``StageCancelledEvent`` is an abort that emits nothing for the stage.
- Speculation (``speculation=Speculation(...)``, off by default): on each
  ``TickEvent``, once ``quantile`` of a running stage's tasks are done, a task
  whose single copy has run longer than ``multiplier`` times the median time
  of the stage's finished tasks (and at least ``min_runtime``) gets a second
  copy on another live worker with a free slot, after every unassigned task
  has found one.  Times are measured from assignment to the first report,
  with the clock that ``TickEvent`` carries.  The first report of either copy
  wins; the others get ``Cancel``, and keep their slot until their worker
  reports them (``TaskDoneEvent``, ``TaskFailedEvent`` or ``TaskSkippedEvent``), whose
  content is then ignored.  A copy is never started on a worker that has
  one, and a task gets at most one extra copy.  A straggler for which no
  other worker has a free slot does not hold back the later ones.  A
  ``TaskSkippedEvent`` for a task's only copy (no ``Cancel`` asked for it) counts
  as a lost task: re-queued with ``recover=True``, its stage aborted with
  ``WorkerLostEvent`` without.  A ``TickEvent`` whose clock goes backwards still runs
  speculation, at the clock kept.

Bad input.  Ignored, because it happens in a healthy cluster: duplicate
``WorkerJoinedEvent`` (the first ``slots`` stays), ``WorkerLostEvent`` for an unknown
or already-lost worker, ``TaskDoneEvent``/``TaskFailedEvent``/``TaskSkippedEvent`` for an
unknown key, a key already reported, a key not assigned, or from a worker
not running it (late reports from a lost worker), a ``TickEvent`` whose clock
goes backwards (the clock stays), ``StageCancelledEvent`` for an
unknown, finished, aborted or cancelled stage.  Raised, because the caller is
wrong, before any state changes: ``ValueError`` for the id of a stage
still known or in the history, a key not yet released (see Memory), a ``TaskSpec``
whose ``stage_id`` differs from its stage, two tasks of one stage with the
same partition, or ``slots`` that is not a positive int; ``TypeError`` for an
event of an unknown type, a task that is not a ``TaskSpec``, or an
unhashable id or key.

Memory.  A long job submits stages without end, so the scheduler forgets
them.  A stage's keys are released when it is resolved (finished, aborted
or cancelled) and no worker holds a copy of the task any more (a cancelled
copy keeps its key until its worker reports it or is lost); a released key
may be submitted again, since no report can be mistaken for it.  The ids
and states of the last ``history`` resolved stages (1024) are kept for
``stage_state`` and for refusing their ids; older ones read as unknown.
"""
from collections import deque
from dataclasses import dataclass
from heapq import heapify, heappop, heappush
from math import ceil
from operator import attrgetter
from statistics import median

from .. import errors
from .events import (Cancel, Event, Instruction, Run, StageAborted, StageCancelledEvent, StageFinished,
                     StageSubmittedEvent, TaskDoneEvent, TaskFailedEvent, TaskSkippedEvent, TaskSpec, TickEvent,
                     WorkerJoinedEvent, WorkerLostEvent)

__all__ = ["Scheduler", "Speculation", "TaskSpec", "Event", "Instruction", "WorkerJoinedEvent", "WorkerLostEvent",
           "StageSubmittedEvent", "TaskDoneEvent", "TaskFailedEvent", "TaskSkippedEvent", "StageCancelledEvent",
           "TickEvent", "Run", "Cancel", "StageFinished", "StageAborted"]


def _names(workers):
    return ", ".join(w.decode() if isinstance(w, bytes) else repr(w) for w in workers)


@dataclass(frozen=True)
class Speculation:
    """When a task gets a second copy (see the module docstring); the
    defaults are Spark's (spark.speculation.multiplier, .quantile,
    .minTaskRuntime)."""
    multiplier: float = 1.5
    quantile: float = 0.75
    min_runtime: float = 0.1

    def __post_init__(self):
        for name in ("multiplier", "quantile", "min_runtime"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                raise errors.ConfigError(f"speculation {name} must be a number, not {v!r}")
        if not self.multiplier >= 1.0:
            raise errors.ConfigError(f"speculation multiplier must be >= 1, not {self.multiplier!r}")
        if not 0.0 < self.quantile <= 1.0:
            raise errors.ConfigError(f"speculation quantile must be in (0, 1], not {self.quantile!r}")
        if not self.min_runtime >= 0.0:
            raise errors.ConfigError(f"speculation min_runtime must be >= 0, not {self.min_runtime!r}")


# ---- internal records ----

# Internal stage states.  "done" means every result is in but an earlier stage
# is unresolved, so StageFinished waits; it reads as "running" outside.
_PENDING, _RUNNING, _DONE, _FINISHED, _ABORTED = "pending", "running", "done", "finished", "aborted"
_PUBLIC_STATE = {_PENDING: "pending", _RUNNING: "running", _DONE: "running", _FINISHED: "finished",
                 _ABORTED: "aborted"}
_by_partition = attrgetter("partition")


class _Stage:
    __slots__ = ("id", "seq", "ntasks", "queue", "remaining", "results", "state", "times", "running", "keys")

    def __init__(self, stage_id, seq, specs):
        self.id, self.seq = stage_id, seq   # seq: submission order
        self.ntasks = len(specs)
        self.keys = [spec.key for spec in specs]   # released when the stage is resolved
        self.queue = deque(specs)     # unassigned TaskSpecs, partition order
        self.remaining = len(specs)   # tasks without a result yet
        self.results = {}             # partition -> result
        self.state = _PENDING if specs else _DONE
        self.times = []               # assignment-to-report times of its finished tasks
        self.running = {}             # key -> _Task, assigned and not reported


class _Task:
    """An assigned task (unassigned ones are only a TaskSpec in their stage's
    queue).  ``copies`` maps each worker id running a copy to its _Worker."""
    __slots__ = ("spec", "stage", "copies", "start", "speculated")

    def __init__(self, spec, stage, worker, start):
        self.spec, self.stage, self.start = spec, stage, start
        self.copies = {worker.id: worker}
        self.speculated = False


class _Worker:
    __slots__ = ("id", "slots", "order", "tasks", "load", "live")

    def __init__(self, worker_id, slots, order):
        self.id, self.slots, self.order = worker_id, slots, order
        self.tasks = set()            # keys assigned here
        self.load = 0                 # len(tasks), kept for the hot path
        self.live = True


class Scheduler:
    """See the module docstring.  ``handle`` is the only mutator; the other
    methods are read-only views for the cluster and the tests."""

    def __init__(self, recover=False, speculation=None, history=1024):
        if speculation is not None and not isinstance(speculation, Speculation):
            raise TypeError(f"speculation must be a Speculation or None, not {speculation!r}")
        self.recover = bool(recover)
        self.speculation = speculation
        self._history_len = history
        self._now = 0.0               # the clock of the last TickEvent
        self._workers = {}            # live worker id -> _Worker
        self._joins = 0               # joins so far: the next worker's tie-break order
        self._free = 0                # free slots over all live workers
        self._idle = []               # heap of (load, order, _Worker); stale once load changed
        self._stages = {}             # stage id -> _Stage, until it is resolved
        self._history = {}            # stage id -> public state of the last ``history`` resolved stages
        self._submitted = 0           # stages submitted so far: the next one's seq
        self._unresolved = deque()    # stages neither finished nor aborted, submission order
        self._ready = deque()         # stages that may have unassigned tasks, submission order
        self._tasks = {}              # key -> _Task, assigned and not reported (cancelled copies are only
                                      # keys in their worker's ``tasks``)
        self._keys = {}               # key -> its _Stage, while it is not released (module docstring)
        self._held = {}               # key -> workers holding a copy of it (cancelled copies included)
        self._npending = 0            # unassigned tasks of live stages

    # ---- the mutator ----

    def handle(self, event):
        """Apply one event; return the instructions it causes, in order.
        Raises ValueError/TypeError for caller bugs (module docstring), with
        the state unchanged."""
        try:
            apply = self._HANDLERS[type(event)]
        except KeyError:
            raise TypeError(f"not a scheduler event: {event!r}") from None
        out = []
        apply(self, event, out)
        if self._npending and not self._workers and self._joins and not self.recover:
            self._abort_unassigned(out)
        self._flush_finished(out)
        self._assign(out)
        if type(event) is TickEvent and self.speculation is not None and self._free:
            self._speculate(out)
        return out

    def _worker_joined(self, ev, out):
        slots = ev.slots
        if isinstance(slots, bool) or not isinstance(slots, int) or slots < 1:
            raise ValueError(f"worker {ev.worker!r}: slots must be a positive int, not {slots!r}")
        if ev.worker in self._workers:
            return
        w = _Worker(ev.worker, slots, self._joins)
        self._joins += 1
        self._workers[w.id] = w
        self._free += slots
        self._push_idle(w)

    def _worker_lost(self, ev, out):
        w = self._workers.pop(ev.worker, None)
        if w is None:
            return
        w.live = False
        self._free -= w.slots - w.load
        lost = []
        for key in w.tasks:
            self._unhold(key)
            t = self._tasks.get(key)
            if t is None or w.id not in t.copies:
                continue              # a cancelled copy
            del t.copies[w.id]
            if not t.copies:          # no other copy runs: the task itself is lost
                del self._tasks[key]
                del t.stage.running[key]
                lost.append(t)
        w.tasks, w.load = set(), 0
        if lost:
            lost.sort(key=lambda t: (t.stage.seq, t.spec.partition))
            self._on_lost_tasks(ev.worker, lost, ev.reason, out)
        self._abort_unplaceable(out)
        if len(self._idle) > 4 * len(self._workers) + 64:
            self._rebuild_idle()

    def _stage_submitted(self, ev, out):
        sid, tasks = ev.stage_id, ev.tasks
        if sid in self._stages or sid in self._history:
            raise ValueError(f"stage id {sid!r} was already submitted")
        keys, parts = set(), set()
        for spec in tasks:
            if not isinstance(spec, TaskSpec):
                raise TypeError(f"stage {sid!r}: not a TaskSpec: {spec!r}")
            if spec.stage_id != sid:
                raise ValueError(f"stage {sid!r}: task {spec.key!r} has stage_id {spec.stage_id!r}")
            if spec.key in keys or spec.key in self._keys:
                raise ValueError(f"stage {sid!r}: task key {spec.key!r} was already submitted")
            keys.add(spec.key)
            parts.add(spec.partition)
        if len(parts) != len(tasks):
            raise ValueError(f"stage {sid!r}: two tasks share a partition")
        specs = sorted(tasks, key=_by_partition)
        st = _Stage(sid, self._submitted, specs)
        self._submitted += 1
        self._stages[sid] = st
        self._keys.update(dict.fromkeys(keys, st))
        self._unresolved.append(st)
        if specs:
            self._ready.append(st)
            self._npending += len(specs)
            if any(spec.only for spec in specs):
                self._abort_unplaceable(out)

    def _task_done(self, ev, out):
        t = self._take(ev.key, ev.worker, out)
        if t is not None and t.stage.state == _RUNNING:
            st = t.stage
            st.results[t.spec.partition] = ev.result
            st.remaining -= 1
            st.times.append(self._now - t.start)
            if not st.remaining:
                st.state = _DONE

    def _task_failed(self, ev, out):
        t = self._take(ev.key, ev.worker, out)
        if t is not None and t.stage.state == _RUNNING:
            self._abort(t.stage, ev.error, out)

    def _task_skipped(self, ev, out):
        t = self._take(ev.key, ev.worker, out, skipped=True)
        if t is not None:             # skipped without a Cancel: the task must run again
            self._on_lost_tasks(ev.worker, [t], "skipped its task", out)

    def _tick(self, ev, out):
        if ev.now > self._now:
            self._now = ev.now

    def _stage_cancelled(self, ev, out):
        st = self._stages.get(ev.stage_id)
        if st is not None and st.state != _FINISHED and st.state != _ABORTED:
            self._abort(st, None, out, report=False)

    _HANDLERS = {WorkerJoinedEvent: _worker_joined, WorkerLostEvent: _worker_lost, StageSubmittedEvent: _stage_submitted,
                 TaskDoneEvent: _task_done, TaskFailedEvent: _task_failed, TaskSkippedEvent: _task_skipped,
                 StageCancelledEvent: _stage_cancelled, TickEvent: _tick}

    # ---- policy hook ----

    def _on_lost_tasks(self, worker, lost, reason, out):
        """Decide the fate of ``lost``: the tasks (``_Task``, in submission
        and partition order) that ``worker`` held when it was lost, already
        unassigned, their slots gone.  Without ``recover``, each unresolved
        stage among them is aborted, in submission order.  With it, each
        task of a running stage goes back to the front of its stage's queue
        (in partition order), and the stage back into ``_ready`` at its
        submission position.  A late report from the lost worker is ignored,
        because ``_take`` checks the workers running the key; that assumes a
        worker that rejoins gets a fresh id."""
        if not self.recover:
            for t in lost:
                if t.stage.state == _RUNNING:      # (a stage holding a task is running or aborted)
                    name = worker.decode() if isinstance(worker, bytes) else worker
                    msg = f"worker {name} lost: {reason}" if reason else f"worker {name} lost"
                    self._abort(t.stage, errors.WorkerLost(msg), out)
            return
        for t in reversed(lost):
            st = t.stage
            if st.state != _RUNNING:
                continue
            st.queue.appendleft(t.spec)
            self._npending += 1
            if st not in self._ready:
                i = 0
                while i < len(self._ready) and self._ready[i].seq < st.seq:
                    i += 1
                self._ready.insert(i, st)

    # ---- internals ----

    def _take(self, key, worker, out, skipped=False):
        """Free the slot of ``worker``'s copy of task ``key`` and, if that
        copy is the first to report, unassign the task (cancelling the other
        copies) and return it; None for unknown or late reports, reports of
        cancelled copies, and a skip (which un-assigns only that copy)."""
        w = self._workers.get(worker)
        if w is None or key not in w.tasks:
            return None
        w.tasks.discard(key)
        self._unhold(key)
        w.load -= 1
        self._free += 1
        self._push_idle(w)
        t = self._tasks.get(key)
        if t is None or worker not in t.copies:
            return None               # a cancelled copy
        del t.copies[worker]
        if skipped and t.copies:
            return None               # another copy still runs
        del self._tasks[key]
        del t.stage.running[key]
        for other in t.copies:
            out.append(Cancel(key, other))
        return t

    def _abort(self, st, error, out, report=True):
        st.state = _ABORTED
        self._npending -= len(st.queue)
        st.queue.clear()              # its stage leaves _ready lazily, in _assign
        st.results = None
        # Copies still running keep their slots until they report, but
        # their reports count for nothing now.
        for key, t in st.running.items():
            del self._tasks[key]
        st.running = {}
        if report:
            out.append(StageAborted(st.id, error))

    def _abort_unplaceable(self, out):
        """Abort the stages that hold a task none of whose ``only`` workers
        is live: whether or not any slot is free, it can never run."""
        live = self._workers
        for st in list(self._ready):
            if st.state in (_PENDING, _RUNNING):
                spec = next((s for s in st.queue if s.only and not any(w in live for w in s.only)), None)
                if spec is not None:
                    self._abort(st, errors.WorkerLost(
                        f"task {spec.key!r} may only run on {_names(spec.only)}, and none of them is live"), out)

    def _abort_unassigned(self, out):
        for st in self._ready:
            if st.queue and st.state != _ABORTED:
                self._abort(st, errors.WorkerLost("no live workers"), out)

    def _flush_finished(self, out):
        unresolved = self._unresolved
        while unresolved:
            st = unresolved[0]
            if st.state == _DONE:
                out.append(StageFinished(st.id, st.results))
                st.state, st.results = _FINISHED, None
            elif st.state != _ABORTED:
                break
            unresolved.popleft()
            self._retire(st)

    def _retire(self, st):
        """``st`` is resolved: forget it, but for its state in the history,
        and release its keys that no worker holds."""
        del self._stages[st.id]
        self._history[st.id] = _PUBLIC_STATE[st.state]
        if len(self._history) > self._history_len:
            del self._history[next(iter(self._history))]
        held, keys = self._held, self._keys
        for key in st.keys:
            if key not in held:
                del keys[key]
        st.keys = st.times = None

    def _hold(self, key):
        self._held[key] = self._held.get(key, 0) + 1

    def _unhold(self, key):
        n = self._held[key] - 1
        if n:
            self._held[key] = n
            return
        del self._held[key]
        if self._keys[key].keys is None:      # its stage was retired while a copy ran
            del self._keys[key]

    def _assign(self, out):
        # The hot path (one call per event): locals, and _Worker.load kept
        # alongside the key set so that no len() is needed.
        ready, tasks, free = self._ready, self._tasks, self._free
        while self._npending and free:
            st = ready[0]
            queue = st.queue
            if not queue:
                ready.popleft()
                continue
            if st.state == _PENDING:
                st.state = _RUNNING
            while queue and free:
                spec = queue[0]
                if spec.only:
                    w = self._preferred(spec.only)
                    if w is None:
                        # Its workers are busy (one with none live was aborted when it was
                        # submitted or they were lost: _abort_unplaceable): it, and the
                        # tasks behind it, wait.
                        self._free = free
                        return
                    queue.popleft()
                else:
                    queue.popleft()
                    w = self._preferred(spec.prefer) if spec.prefer else None
                if w is None:
                    idle = self._idle
                    while True:        # free > 0, so a valid entry exists
                        load, _, w = heappop(idle)
                        if w.live and w.load == load:
                            break
                w.tasks.add(spec.key)
                self._hold(spec.key)
                w.load += 1
                tasks[spec.key] = st.running[spec.key] = _Task(spec, st, w, self._now)
                free -= 1
                self._npending -= 1
                if w.load < w.slots:
                    heappush(self._idle, (w.load, w.order, w))
                out.append(Run(spec.key, w.id, st.id, spec.partition))
        self._free = free

    def _speculate(self, out):
        """Second copies of slow tasks (module docstring), oldest stage first."""
        spec = self.speculation
        for st in self._unresolved:
            if self._free <= 0:
                return
            if st.state != _RUNNING or not st.running or len(st.times) < max(1, ceil(spec.quantile * st.ntasks)):
                continue
            limit = max(spec.multiplier * median(st.times), spec.min_runtime)
            slow = [t for t in st.running.values()
                    if not t.speculated and not t.spec.only and len(t.copies) == 1 and self._now - t.start > limit]
            for t in sorted(slow, key=lambda t: t.start):
                w = self._least_loaded(exclude=t.copies)
                if w is None:
                    continue          # no room but on its own worker; a later straggler may have some
                t.speculated = True
                t.copies[w.id] = w
                w.tasks.add(t.spec.key)
                self._hold(t.spec.key)
                w.load += 1
                self._free -= 1
                self._push_idle(w)
                out.append(Run(t.spec.key, w.id, st.id, t.spec.partition))
                if self._free <= 0:
                    return

    def _least_loaded(self, exclude):
        best = None
        for w in self._workers.values():
            if w.id not in exclude and w.load < w.slots and (
                    best is None or (w.load, w.order) < (best.load, best.order)):
                best = w
        return best

    def _preferred(self, prefer):
        """The least loaded live preferred worker with a free slot, or None."""
        best = None
        for wid in prefer:
            w = self._workers.get(wid)
            if w is not None and w.load < w.slots and (
                    best is None or (w.load, w.order) < (best.load, best.order)):
                best = w
        return best

    def _push_idle(self, w):
        if w.load < w.slots:
            heappush(self._idle, (w.load, w.order, w))
            if len(self._idle) > 4 * len(self._workers) + 64:
                self._rebuild_idle()

    def _rebuild_idle(self):
        self._idle = [(w.load, w.order, w) for w in self._workers.values() if w.load < w.slots]
        heapify(self._idle)

    # ---- read-only views ----

    @property
    def workers(self):
        """Live worker ids."""
        return frozenset(self._workers)

    def running(self, worker):
        """Keys assigned to ``worker`` and not yet reported, cancelled copies
        included (empty if unknown)."""
        w = self._workers.get(worker)
        return frozenset(w.tasks) if w is not None else frozenset()

    def stage_state(self, stage_id):
        """One of "pending" (no task assigned yet), "running" (also while its
        results wait for an earlier stage), "finished" (StageFinished is out),
        "aborted" (failed, lost or cancelled); None for an unknown stage."""
        st = self._stages.get(stage_id)
        return _PUBLIC_STATE[st.state] if st is not None else self._history.get(stage_id)

    def pending_count(self):
        """Tasks waiting for a slot."""
        return self._npending

    def running_count(self):
        """Task copies assigned to a live worker and not yet reported (those
        of aborted stages and cancelled copies included: they hold slots)."""
        return sum(w.load for w in self._workers.values())
