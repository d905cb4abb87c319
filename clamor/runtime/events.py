"""What goes into the scheduler and what comes out of it (clamor/runtime/scheduler.py).

``TaskSpec`` is one task of a submitted stage.  The events are the stimuli
``Scheduler.handle`` takes: something that happened (a worker joined or was
lost, a stage was submitted or cancelled, a task reported, the clock moved).
The instructions are what it returns: something for the driver to do (run or
cancel a task, report a stage finished or aborted).  All are frozen records
(``StageSubmittedEvent`` stores its tasks as a tuple, and that is all they
do); the policy that connects them is the scheduler's, and its module
docstring says what each event does.
"""
from dataclasses import dataclass

__all__ = ["TaskSpec", "Event", "Instruction", "WorkerJoinedEvent", "WorkerLostEvent", "StageSubmittedEvent",
           "TaskDoneEvent", "TaskFailedEvent", "TaskSkippedEvent", "StageCancelledEvent", "TickEvent", "Run", "Cancel",
           "StageFinished", "StageAborted"]


@dataclass(frozen=True)
class TaskSpec:
    """One task.  ``key`` is hashable and unique for the scheduler's life
    (e.g. ``(stage_id, partition)``).  ``prefer`` names workers holding the
    task's input: a preference, not a constraint.  ``only``, if not empty,
    is a constraint: the task runs on one of these workers or not at all.
    (No __post_init__: one is built per task, so construction stays cheap;
    pass tuples.)"""
    key: object
    stage_id: int
    partition: int
    prefer: tuple = ()
    only: tuple = ()


# ---- events (stimuli in) ----

class Event:
    """A stimulus for ``Scheduler.handle``: something that happened."""
    __slots__ = ()


class Instruction:
    """What ``Scheduler.handle`` returns: something for the driver to do."""
    __slots__ = ()


@dataclass(frozen=True)
class WorkerJoinedEvent(Event):
    """A worker is ready; it may hold ``slots`` tasks at once (running and queued)."""
    worker: object
    slots: int = 2


@dataclass(frozen=True)
class WorkerLostEvent(Event):
    """A worker died or stopped answering."""
    worker: object
    reason: str = ""


@dataclass(frozen=True)
class StageSubmittedEvent(Event):
    """A stage of tasks (any iterable of ``TaskSpec``, stored as a tuple; may be empty)."""
    stage_id: int
    tasks: tuple = ()

    def __post_init__(self):
        if not isinstance(self.tasks, tuple):
            object.__setattr__(self, "tasks", tuple(self.tasks))


@dataclass(frozen=True)
class TaskDoneEvent(Event):
    """``worker`` ran task ``key``; ``result`` is passed through to ``StageFinished``."""
    key: object
    worker: object
    result: object = None


@dataclass(frozen=True)
class TaskFailedEvent(Event):
    """Task ``key`` raised on ``worker``; ``error`` is passed through to ``StageAborted``."""
    key: object
    worker: object
    error: object


@dataclass(frozen=True)
class TaskSkippedEvent(Event):
    """``worker`` dropped its copy of task ``key`` unrun, after a ``Cancel``."""
    key: object
    worker: object


@dataclass(frozen=True)
class TickEvent(Event):
    """The time is ``now`` (seconds, any monotonic clock): stamps the
    assignments and reports that follow, and may start speculative copies."""
    now: float


@dataclass(frozen=True)
class StageCancelledEvent(Event):
    """The driver gave up on a stage; nothing more is reported for it."""
    stage_id: int


# ---- instructions (out) ----

@dataclass(frozen=True)
class Run(Instruction):
    """Send task ``key`` to ``worker`` (live, with a free slot)."""
    key: object
    worker: object
    stage_id: int
    partition: int


@dataclass(frozen=True)
class Cancel(Instruction):
    """Another copy of task ``key`` reported first: ``worker`` may drop its
    copy (if it has not started it, answering ``TaskSkippedEvent``)."""
    key: object
    worker: object


@dataclass(frozen=True)
class StageFinished(Instruction):
    """Every task of the stage is done; ``results`` maps each partition to its result."""
    stage_id: int
    results: dict


@dataclass(frozen=True)
class StageAborted(Instruction):
    """The stage failed: ``error`` is the task's error or a ``clamor.errors.WorkerLost``."""
    stage_id: int
    error: object
