"""Tasks restricted to some workers (TaskSpec.only): placement, waiting,
and what happens once their workers are gone."""
from clamor import errors
from clamor.runtime.scheduler import (StageAborted, StageFinished, StageSubmittedEvent, TaskSpec, TickEvent,
                                      WorkerJoinedEvent, WorkerLostEvent, Speculation)
from scheduler_events import done, runs, sched, submit


def pinned(stage, only_of):
    """A stage with one task per partition, partition p restricted to only_of[p]."""
    return StageSubmittedEvent(stage, tuple(TaskSpec((stage, p), stage, p, (), tuple(ws))
                                            for p, ws in enumerate(only_of)))


def test_a_restricted_task_runs_only_where_it_may_even_when_another_worker_is_idle():
    s = sched("a", "b", "c")
    out = s.handle(pinned(1, [("c",), ("c",), ("b", "c")]))
    assert runs(out) == [((1, 0), "c"), ((1, 1), "c"), ((1, 2), "b")]


def test_it_waits_for_a_slot_of_its_worker_and_the_queue_behind_it_waits_too():
    s = sched("a", "b", slots=1)
    submit(s, 1, 1)                                     # a is full
    out = s.handle(pinned(2, [("a",), ()]))
    assert runs(out) == []                              # b is free, but the head may only run on a
    out = done(s, 1, 0, "a")
    assert runs(out) == [((2, 0), "a"), ((2, 1), "b")]


def test_once_none_of_its_workers_is_live_its_stage_aborts_even_with_recover():
    s = sched("a", "b", recover=True)
    out = s.handle(pinned(1, [("a",), ("b",)]))
    assert runs(out) == [((1, 0), "a"), ((1, 1), "b")]
    out = s.handle(WorkerLostEvent("a"))   # its task goes back to the queue, and cannot run anywhere
    aborted = [i for i in out if isinstance(i, StageAborted)]
    assert len(aborted) == 1 and isinstance(aborted[0].error, errors.WorkerLost)
    assert "a" in str(aborted[0].error)
    assert s.stage_state(1) == "aborted"
    assert s.pending_count() == 0


def test_restricted_to_an_unknown_worker_aborts_at_once_and_later_stages_go_on():
    s = sched("a")
    out = s.handle(pinned(1, [("nobody",)]))
    assert [type(i) for i in out] == [StageAborted]
    out = submit(s, 2, 1)
    assert runs(out) == [((2, 0), "a")]
    out = done(s, 2, 0, "a")
    assert [type(i) for i in out] == [StageFinished]


def test_restricted_to_a_worker_not_yet_joined_aborts_then_runs_once_it_has():
    s = sched("a")
    s.handle(pinned(1, [("b",)]))
    # b is not live yet: with no live worker among those it may use, the stage
    # would abort; a worker must be live when its restricted tasks are submitted
    assert s.stage_state(1) == "aborted"
    s.handle(WorkerJoinedEvent("b", 2))
    out = s.handle(pinned(2, [("b",)]))
    assert runs(out) == [((2, 0), "b")]


def test_a_restricted_task_gets_no_speculative_copy():
    s = sched("a", "b", speculation=Speculation(multiplier=1.0, quantile=0.5, min_runtime=0.0))
    s.handle(TickEvent(0.0))
    s.handle(pinned(1, [("a",), ("b",)]))
    s.handle(TickEvent(1.0))
    done(s, 1, 1, "b")
    out = s.handle(TickEvent(100.0))                    # (1, 0) has run 100x the median
    assert runs(out) == []
    out = done(s, 1, 0, "a")
    assert [type(i) for i in out] == [StageFinished]


def test_losing_the_last_worker_a_queued_restricted_task_may_use_aborts_at_once():
    s = sched("a", slots=1)
    submit(s, 1, 1)                                     # a is full
    s.handle(pinned(2, [("a",)]))                       # waits for a's slot
    out = s.handle(WorkerLostEvent("a"))
    aborted = [i for i in out if isinstance(i, StageAborted) and i.stage_id == 2]
    assert len(aborted) == 1 and isinstance(aborted[0].error, errors.WorkerLost)
    assert s.stage_state(2) == "aborted" and s.pending_count() == 0


def test_restricted_to_an_unknown_worker_aborts_at_once_even_with_no_free_slot():
    s = sched("a", slots=1)
    submit(s, 1, 1)                                     # no free slot anywhere
    out = s.handle(pinned(2, [("nobody",)]))
    assert [type(i) for i in out] == [StageAborted]
    assert s.stage_state(1) == "running"                # the other stage goes on
