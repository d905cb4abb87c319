"""Helpers shared by the scheduler's tests: build events, read instructions."""
from clamor.runtime.scheduler import Run, Scheduler, StageSubmittedEvent, TaskDoneEvent, TaskSpec, WorkerJoinedEvent


def specs(stage, parts, prefer=None):
    return tuple(TaskSpec((stage, p), stage, p, (prefer or {}).get(p, ())) for p in parts)


def submit(s, stage, n_or_parts, prefer=None):
    parts = range(n_or_parts) if isinstance(n_or_parts, int) else n_or_parts
    return s.handle(StageSubmittedEvent(stage, specs(stage, parts, prefer)))


def sched(*workers, slots=2, **kw):
    """A Scheduler(**kw) that ``workers`` joined, ``slots`` each."""
    s = Scheduler(**kw)
    for w in workers:
        assert s.handle(WorkerJoinedEvent(w, slots)) == []
    return s


def runs(out):
    return [(i.key, i.worker) for i in out if isinstance(i, Run)]


def done(s, stage, p, worker, result=None):
    return s.handle(TaskDoneEvent((stage, p), worker, (stage, p) if result is None else result))
