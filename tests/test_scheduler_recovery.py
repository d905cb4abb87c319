"""The scheduler's recovery (``recover=True``) and speculation (``Speculation``,
``TickEvent``, ``Cancel``, ``TaskSkippedEvent``) policies, driven by events alone.

tests/test_scheduler.py covers placement, stage order, failures and losses
without recovery; this file covers what the module docstring promises for a
lost worker's tasks when recovering, and for speculative copies."""
import random
import statistics
from collections import deque
from fractions import Fraction
from math import ceil

import pytest

from clamor import errors
from clamor.runtime.scheduler import (Cancel, Run, Scheduler, Speculation, StageAborted, StageCancelledEvent, StageFinished,
                              StageSubmittedEvent, TaskDoneEvent, TaskFailedEvent, TaskSkippedEvent, TaskSpec, TickEvent, WorkerJoinedEvent,
                              WorkerLostEvent)

import scheduler_events as events
from scheduler_events import done, runs, submit


# ---- helpers ----

def sched(*workers, slots=1, recover=False, speculation=None):
    return events.sched(*workers, slots=slots, recover=recover, speculation=speculation)


SPEC = Speculation(multiplier=1.5, quantile=0.5, min_runtime=0.0)


def straggler(recover=False, speculation=SPEC):
    """a, b, c (one slot each) run stage 1's three tasks from t=0; (1,0) and
    (1,1) finish at t=1, so 2 of 3 tasks are done (quantile 0.5 needs
    ceil(1.5) = 2), the median is 1, and (1,2) on c is a straggler once it has
    run longer than 1.5.  a and b are free."""
    s = sched("a", "b", "c", recover=recover, speculation=speculation)
    assert runs(submit(s, 1, 3)) == [((1, 0), "a"), ((1, 1), "b"), ((1, 2), "c")]
    assert s.handle(TickEvent(1)) == []
    assert done(s, 1, 0, "a") == [] and done(s, 1, 1, "b") == []
    return s


def two_stragglers(recover=False):
    """a, b, c, d (one slot each) run stage 1's four tasks from t=0; (1,0)
    and (1,1) finish at t=1; at t=2, (1,2) on c gets a copy on a and (1,3) on
    d one on b."""
    s = sched("a", "b", "c", "d", recover=recover, speculation=SPEC)
    submit(s, 1, 4)
    s.handle(TickEvent(1))
    done(s, 1, 0, "a", "r0")
    done(s, 1, 1, "b", "r1")
    assert s.handle(TickEvent(2)) == [Run((1, 2), "a", 1, 2), Run((1, 3), "b", 1, 3)]
    return s


# ---- recovery: a lost worker's tasks go back to the front of their stage's queue ----

def test_recover_requeues_lost_tasks_at_the_front_of_their_stage_queue():
    s = sched("a", "b", slots=2, recover=True)
    assert runs(submit(s, 1, 6)) == [((1, 0), "a"), ((1, 1), "b"), ((1, 2), "a"), ((1, 3), "b")]
    assert submit(s, 2, 2) == []
    assert s.handle(WorkerLostEvent("a", "connection reset")) == []       # no StageAborted; b is full
    assert s.stage_state(1) == "running" and s.stage_state(2) == "pending"
    assert s.workers == {"b"} and s.pending_count() == 6 and s.running_count() == 2
    # the lost (1,0) and (1,2) come before the never-assigned (1,4), (1,5), and before stage 2
    assert runs(done(s, 1, 1, "b")) == [((1, 0), "b")]
    assert runs(done(s, 1, 3, "b")) == [((1, 2), "b")]
    assert runs(s.handle(WorkerJoinedEvent("c", 4))) == [((1, 4), "c"), ((1, 5), "c"), ((2, 0), "c"), ((2, 1), "c")]
    for p in (0, 2):
        assert done(s, 1, p, "b") == []
    assert done(s, 1, 4, "c") == []
    assert done(s, 1, 5, "c") == [StageFinished(1, {p: (1, p) for p in range(6)})]
    done(s, 2, 0, "c")
    assert done(s, 2, 1, "c") == [StageFinished(2, {0: (2, 0), 1: (2, 1)})]
    assert s.running_count() == 0 and s.pending_count() == 0


def test_recover_requeued_task_goes_before_a_later_stage_already_running():
    s = sched("a", "b", slots=1, recover=True)
    submit(s, 1, 2)                                   # (1,0)->a, (1,1)->b: stage 1 fully assigned
    submit(s, 2, 3)
    assert runs(done(s, 1, 0, "a")) == [((2, 0), "a")]    # stage 2 is running, (2,1), (2,2) wait
    assert s.handle(WorkerLostEvent("b")) == []
    assert s.pending_count() == 3
    assert runs(done(s, 2, 0, "a")) == [((1, 1), "a")]    # the lost stage-1 task before (2,1)
    assert runs(done(s, 1, 1, "a")) == [((2, 1), "a")]
    assert s.stage_state(1) == "finished"


def test_recover_lost_tasks_of_several_stages_keep_submission_then_partition_order():
    s = sched("a", slots=4, recover=True)
    submit(s, 2, [3, 1])
    submit(s, 1, [5, 0])                              # submitted after stage 2
    assert s.handle(WorkerLostEvent("a")) == []
    assert runs(s.handle(WorkerJoinedEvent("b", 1))) == [((2, 1), "b")]
    order = []
    for _ in range(4):
        key, = s.running("b")
        order.append(key)
        s.handle(TaskDoneEvent(key, "b"))
    assert order == [(2, 1), (2, 3), (1, 0), (1, 5)]
    assert s.stage_state(2) == "finished" and s.stage_state(1) == "finished"


def test_recover_lost_tasks_run_at_once_on_free_slots_of_survivors():
    s = sched("a", "b", slots=2, recover=True)
    submit(s, 1, 3)                                   # (1,0)->a, (1,1)->b, (1,2)->a; b has a free slot
    out = s.handle(WorkerLostEvent("a", "killed"))
    assert out == [Run((1, 0), "b", 1, 0)]            # front of the queue first; (1,2) waits
    assert s.pending_count() == 1 and s.running("b") == {(1, 0), (1, 1)}
    assert done(s, 1, 1, "b") == [Run((1, 2), "b", 1, 2)]


@pytest.mark.parametrize("recover", [False, True])
def test_worker_lost_aborts_without_recover_and_requeues_with_it(recover):
    s = sched("a", "b", slots=1, recover=recover)
    submit(s, 1, 3)                                   # (1,0)->a, (1,1)->b, (1,2) pending
    out = s.handle(WorkerLostEvent("a", "gone"))
    if recover:
        assert out == [] and s.stage_state(1) == "running" and s.pending_count() == 2
        assert done(s, 1, 1, "b") == [Run((1, 0), "b", 1, 0)]
    else:
        assert len(out) == 1 and type(out[0]) is StageAborted and out[0].stage_id == 1
        assert isinstance(out[0].error, errors.WorkerLost) and str(out[0].error) == "worker a lost: gone"
        assert s.stage_state(1) == "aborted" and s.pending_count() == 0
        assert done(s, 1, 1, "b") == []


def test_recover_without_live_workers_waits_and_resumes_on_join():
    s = sched("a", slots=2, recover=True)
    submit(s, 1, 3)
    assert s.handle(WorkerLostEvent("a")) == []            # without recover: StageAborted "no live workers"
    assert s.workers == frozenset() and s.pending_count() == 3
    assert submit(s, 2, 1) == [] and submit(s, 3, 0) == []
    for _ in range(3):                                # time passes, nothing gives up
        assert s.handle(WorkerLostEvent("a")) == [] and s.handle(TaskDoneEvent((1, 0), "a")) == []
    assert [s.stage_state(i) for i in (1, 2, 3)] == ["running", "pending", "running"]
    assert runs(s.handle(WorkerJoinedEvent("b", 2))) == [((1, 0), "b"), ((1, 1), "b")]
    done(s, 1, 0, "b")
    done(s, 1, 1, "b")
    assert done(s, 1, 2, "b") == [StageFinished(1, {p: (1, p) for p in range(3)})]
    assert done(s, 2, 0, "b") == [StageFinished(2, {0: (2, 0)}), StageFinished(3, {})]


def test_recover_does_not_requeue_tasks_of_aborted_or_cancelled_stages():
    s = sched("a", "b", slots=2, recover=True)
    submit(s, 1, 2)                                   # (1,0)->a, (1,1)->b
    submit(s, 2, 2)                                   # (2,0)->a, (2,1)->b
    submit(s, 3, 1)
    assert s.handle(TaskFailedEvent((1, 1), "b", "boom")) == [StageAborted(1, "boom"), Run((3, 0), "b", 3, 0)]
    assert s.handle(StageCancelledEvent(2)) == []
    assert s.handle(WorkerLostEvent("a")) == []            # holds (1,0) and (2,0): both stages ended
    assert s.pending_count() == 0 and s.running_count() == 2
    assert s.handle(WorkerJoinedEvent("c", 2)) == []       # nothing to re-run
    assert s.handle(TaskDoneEvent((2, 1), "b")) == []      # the cancelled stage's survivor: slot only
    assert done(s, 3, 0, "b") == [StageFinished(3, {0: (3, 0)})]
    assert s.stage_state(1) == "aborted" and s.stage_state(2) == "aborted"


def test_recover_late_reports_from_the_lost_worker_are_ignored_and_the_rerun_counts():
    s = sched("a", "b", slots=1, recover=True)
    submit(s, 1, 2)                                   # (1,0)->a, (1,1)->b
    assert s.handle(WorkerLostEvent("a")) == []
    assert s.handle(TaskDoneEvent((1, 0), "a", "stale")) == []
    assert s.handle(TaskFailedEvent((1, 0), "a", "stale error")) == []     # does not abort
    assert s.handle(TaskSkippedEvent((1, 0), "a")) == []
    assert s.stage_state(1) == "running" and s.pending_count() == 1
    assert done(s, 1, 1, "b", "r1") == [Run((1, 0), "b", 1, 0)]
    assert s.handle(TaskDoneEvent((1, 0), "a", "stale")) == []
    assert s.running("b") == {(1, 0)}
    assert s.handle(TaskDoneEvent((1, 0), "b", "fresh")) == [StageFinished(1, {0: "fresh", 1: "r1"})]
    assert s.handle(TaskDoneEvent((1, 0), "a", "stale")) == []
    assert s.handle(TaskDoneEvent((1, 0), "b", "again")) == []
    assert s.stage_state(1) == "finished" and s.running_count() == 0


@pytest.mark.parametrize("lost, winner", [("c", "a"), ("a", "c")])
def test_recover_lost_copy_is_not_requeued_while_the_other_copy_runs(lost, winner):
    s = straggler(recover=True)
    assert s.handle(TickEvent(2)) == [Run((1, 2), "a", 1, 2)]  # c runs the original, a the copy
    assert s.handle(WorkerLostEvent(lost)) == []
    assert s.pending_count() == 0 and s.running(winner) == {(1, 2)} and s.running_count() == 1
    assert s.handle(TickEvent(100)) == []                  # still one extra copy at most: no third one
    assert s.handle(TaskDoneEvent((1, 2), lost, "stale")) == []
    out = s.handle(TaskDoneEvent((1, 2), winner, "won"))
    assert out == [StageFinished(1, {0: (1, 0), 1: (1, 1), 2: "won"})]     # no Cancel for the lost worker


def test_recover_task_losing_both_copies_is_requeued():
    s = straggler(recover=True)
    s.handle(TickEvent(2))                                 # copy of (1,2) on a
    assert s.handle(WorkerLostEvent("c")) == []
    assert s.handle(WorkerLostEvent("a")) == [Run((1, 2), "b", 1, 2)]
    assert s.pending_count() == 0
    assert s.handle(TaskDoneEvent((1, 2), "b", "rerun")) == [StageFinished(1, {0: (1, 0), 1: (1, 1), 2: "rerun"})]


# ---- speculation: when a copy starts ----

def test_no_speculation_by_default():
    s = straggler(speculation=None)
    for now in (2, 10, 1000):
        assert s.handle(TickEvent(now)) == []
    assert s.running_count() == 1


def test_no_copy_before_the_quantile_of_tasks_is_done():
    # quantile 0.75 of 4 tasks: 3 must be done
    s = sched("a", "b", "c", "d", "e", speculation=Speculation(1.5, 0.75, 0.0))
    submit(s, 1, 4)                                   # a..d; e idle
    s.handle(TickEvent(1))
    done(s, 1, 0, "a")
    done(s, 1, 1, "b")
    for now in (2, 10, 50):                           # (1,2), (1,3) are far past 1.5 x median
        assert s.handle(TickEvent(now)) == []
    assert done(s, 1, 2, "c") == []                  # the third (time 50); not a TickEvent: no copy yet
    assert s.handle(TickEvent(50)) == [Run((1, 3), "a", 1, 3)]    # median 1: (1,3) has run 50


def test_copy_only_once_elapsed_is_longer_than_multiplier_times_median():
    s = straggler()
    assert s.handle(TickEvent(1.5)) == []                  # exactly 1.5 x median: not longer
    assert s.handle(TickEvent(1.6)) == [Run((1, 2), "a", 1, 2)]
    assert s.running("a") == {(1, 2)} and s.running("c") == {(1, 2)} and s.running_count() == 2


def test_min_runtime_is_a_floor_for_the_threshold():
    s = straggler(speculation=Speculation(1.5, 0.5, 10.0))
    for now in (2, 9.9, 10):
        assert s.handle(TickEvent(now)) == []
    assert s.handle(TickEvent(10.5)) == [Run((1, 2), "a", 1, 2)]


def test_threshold_uses_the_median_and_times_from_reassignment():
    s = sched("a", "b", "c", "d", recover=True, speculation=Speculation(1.5, 0.75, 0.0))
    submit(s, 1, 4)                                   # a, b, c, d at t=0
    s.handle(TickEvent(1))
    done(s, 1, 0, "a")
    done(s, 1, 1, "b")
    s.handle(TickEvent(10))
    done(s, 1, 2, "c")                                # times 1, 1, 10: median 1 (the mean is 4)
    assert s.handle(WorkerLostEvent("d")) == [Run((1, 3), "a", 1, 3)]      # re-run from t=10
    assert s.handle(TickEvent(11)) == []                   # 1 since its reassignment, not 11 since t=0
    assert s.handle(TickEvent(11.5)) == []
    assert s.handle(TickEvent(12)) == [Run((1, 3), "b", 1, 3)]     # 2 > 1.5 x median (not 1.5 x mean = 6)


def test_a_task_gets_at_most_one_extra_copy():
    s = straggler()
    assert runs(s.handle(TickEvent(2))) == [((1, 2), "a")]
    for now in (3, 10, 100):
        assert s.handle(TickEvent(now)) == []              # b is free, but (1,2) has its copy
    assert s.running("b") == frozenset() and s.running_count() == 2


def test_copy_goes_to_another_worker_with_a_free_slot_not_its_own():
    s = sched("a", "b", slots=2, speculation=Speculation(1.5, 0.25, 0.0))     # 1 of 3 done is enough
    submit(s, 1, 3)                                   # (1,0)->a, (1,1)->b, (1,2)->a
    s.handle(TickEvent(1))
    done(s, 1, 0, "a")                                # a: (1,2) and a free slot; b: (1,1) and a free slot
    out = s.handle(TickEvent(5))
    # (1,1) on b may only be copied to a; (1,2) on a only to b
    assert sorted(runs(out)) == [((1, 1), "a"), ((1, 2), "b")]
    assert s.running("a") == {(1, 1), (1, 2)} and s.running("b") == {(1, 1), (1, 2)}


def test_the_only_free_slot_on_the_tasks_own_worker_starts_no_copy():
    s = sched("a", "b", speculation=SPEC)
    s.handle(WorkerJoinedEvent("c", 2))
    submit(s, 1, 3)                                   # (1,0)->a, (1,1)->b, (1,2)->c
    submit(s, 2, 1)                                   # (2,0)->c: c full
    s.handle(TickEvent(1))
    done(s, 1, 0, "a")
    done(s, 1, 1, "b")
    assert runs(submit(s, 3, 2)) == [((3, 0), "a"), ((3, 1), "b")]    # a, b full
    assert done(s, 2, 0, "c") == []                  # c: the straggler (1,2) and a free slot
    for now in (5, 50):
        assert s.handle(TickEvent(now)) == []
    assert done(s, 3, 0, "a") == []
    assert s.handle(TickEvent(51)) == [Run((1, 2), "a", 1, 2)]


def test_copies_wait_until_every_queued_task_has_a_slot():
    s = straggler()                                   # a, b free; (1,2) is due once t > 1.5
    assert runs(submit(s, 2, 3)) == [((2, 0), "a"), ((2, 1), "b")]
    assert s.handle(TickEvent(5)) == [] and s.pending_count() == 1
    assert done(s, 2, 0, "a") == [Run((2, 2), "a", 2, 2)]    # the queued task, not a copy
    assert s.handle(TickEvent(6)) == []
    assert done(s, 2, 1, "b") == []                   # a slot, nothing queued, but not a TickEvent
    assert s.handle(TickEvent(7)) == [Run((1, 2), "b", 1, 2)]


def test_copies_are_limited_by_free_slots_oldest_stage_first():
    s = sched("a", "b", "c", speculation=SPEC)
    submit(s, 1, 2)                                   # (1,0)->a, (1,1)->b
    submit(s, 2, 2)                                   # (2,0)->c, (2,1) waits
    s.handle(TickEvent(1))
    assert done(s, 1, 0, "a") == [Run((2, 1), "a", 2, 1)]     # (2,1) starts at 1
    done(s, 2, 0, "c")                                # c free; both stages have a median of 1
    assert s.handle(TickEvent(10)) == [Run((1, 1), "c", 1, 1)]     # one slot: stage 1's straggler
    out = s.handle(TaskDoneEvent((1, 1), "b", "orig"))
    assert out == [Cancel((1, 1), "c"), StageFinished(1, {0: (1, 0), 1: "orig"})]
    assert s.handle(TickEvent(11)) == [Run((2, 1), "b", 2, 1)]     # now stage 2's, on the freed b


# ---- speculation: first report wins ----

@pytest.mark.parametrize("winner, loser", [("c", "a"), ("a", "c")])
def test_first_report_wins_and_the_other_copy_gets_cancel(winner, loser):
    s = straggler()
    s.handle(TickEvent(2))                                 # original on c, copy on a
    out = s.handle(TaskDoneEvent((1, 2), winner, f"from {winner}"))
    assert out == [Cancel((1, 2), loser), StageFinished(1, {0: (1, 0), 1: (1, 1), 2: f"from {winner}"})]
    assert s.running(loser) == {(1, 2)} and s.running(winner) == frozenset()
    assert s.handle(TaskDoneEvent((1, 2), loser, "late")) == []
    assert s.running_count() == 0


def test_cancelled_copy_keeps_its_slot_until_its_worker_reports():
    s = straggler()
    s.handle(TickEvent(2))
    s.handle(TaskDoneEvent((1, 2), "a", "copy won"))       # Cancel((1,2), "c")
    assert runs(submit(s, 2, 3)) == [((2, 0), "a"), ((2, 1), "b")]    # not c: its slot is taken
    assert s.pending_count() == 1 and s.running("c") == {(1, 2)} and s.running_count() == 3
    assert s.handle(TickEvent(100)) == []
    assert s.handle(TaskSkippedEvent((1, 2), "c")) == [Run((2, 2), "c", 2, 2)]
    assert s.running("c") == {(2, 2)}


@pytest.mark.parametrize("end", ["report", "lost"])
def test_a_cancelled_copy_keeps_its_key_until_its_worker_lets_go(end):
    s = straggler()
    s.handle(TickEvent(2))
    s.handle(TaskDoneEvent((1, 2), "a", "copy won"))       # stage 1 finished; its copy on c runs on
    assert s.stage_state(1) == "finished"
    reuse = StageSubmittedEvent(2, (TaskSpec((1, 2), 2, 0),))
    with pytest.raises(ValueError):                   # a report from c could be taken for it
        s.handle(reuse)
    if end == "report":
        assert s.handle(TaskDoneEvent((1, 2), "c", "late")) == []
    else:
        assert s.handle(WorkerLostEvent("c")) == []
    assert runs(s.handle(reuse)) == [((1, 2), "a")]
    assert s.handle(TaskDoneEvent((1, 2), "a", "new")) == [StageFinished(2, {0: "new"})]


def test_losing_copys_failure_or_result_is_ignored():
    s = two_stragglers()                              # (1,2): c + copy a; (1,3): d + copy b
    assert s.handle(TaskDoneEvent((1, 2), "c", "orig2")) == [Cancel((1, 2), "a")]
    assert s.handle(TaskFailedEvent((1, 2), "a", RuntimeError("loser"))) == []   # no StageAborted
    assert s.stage_state(1) == "running" and s.running("a") == frozenset()
    out = s.handle(TaskDoneEvent((1, 3), "b", "copy3"))
    assert out == [Cancel((1, 3), "d"), StageFinished(1, {0: "r0", 1: "r1", 2: "orig2", 3: "copy3"})]
    assert s.handle(TaskDoneEvent((1, 3), "d", "late and different")) == []
    assert s.running_count() == 0 and s.stage_state(1) == "finished"


def test_first_report_being_a_failure_aborts_and_cancels_the_other_copy():
    s = straggler()
    s.handle(TickEvent(2))
    err = ValueError("copy failed")
    assert s.handle(TaskFailedEvent((1, 2), "a", err)) == [Cancel((1, 2), "c"), StageAborted(1, err)]
    assert s.handle(TaskDoneEvent((1, 2), "c", "too late")) == []
    assert s.stage_state(1) == "aborted" and s.running_count() == 0


# ---- TaskSkippedEvent ----

def test_skip_after_cancel_only_frees_the_slot():
    s = two_stragglers()
    submit(s, 2, 1)                                   # waits: every slot is taken
    assert s.handle(TaskDoneEvent((1, 2), "a", "copy2")) == [Cancel((1, 2), "c"), Run((2, 0), "a", 2, 0)]
    assert s.handle(TaskSkippedEvent((1, 2), "c")) == []
    assert s.pending_count() == 0 and s.running("c") == frozenset()
    assert s.handle(TaskSkippedEvent((1, 2), "c")) == []   # twice
    assert done(s, 1, 3, "d", "r3") == [Cancel((1, 3), "b"),
                                        StageFinished(1, {0: "r0", 1: "r1", 2: "copy2", 3: "r3"})]
    assert s.handle(TaskSkippedEvent((1, 3), "b")) == []
    assert done(s, 2, 0, "a") == [StageFinished(2, {0: (2, 0)})]
    assert s.running_count() == 0


def test_skip_of_one_of_two_copies_keeps_the_other_and_starts_no_third():
    s = straggler(recover=True)
    s.handle(TickEvent(2))                                 # original on c, copy on a
    assert s.handle(TaskSkippedEvent((1, 2), "a")) == []   # no Cancel was sent; c still runs it
    assert s.pending_count() == 0 and s.running("a") == frozenset() and s.running("c") == {(1, 2)}
    assert s.handle(TickEvent(100)) == []                  # its one extra copy is spent
    assert s.handle(TaskDoneEvent((1, 2), "c", "orig")) == [StageFinished(1, {0: (1, 0), 1: (1, 1), 2: "orig"})]


def test_skip_of_the_only_copy_requeues_it_at_the_front_with_recover():
    s = sched("a", slots=1, recover=True)
    submit(s, 1, 3)
    # the skipped task runs again before (1,1), (1,2)
    assert s.handle(TaskSkippedEvent((1, 0), "a")) == [Run((1, 0), "a", 1, 0)]
    assert s.pending_count() == 2 and s.stage_state(1) == "running"
    assert done(s, 1, 0, "a", "r0") == [Run((1, 1), "a", 1, 1)]


def test_skip_of_the_only_copy_without_recover_aborts_the_stage_as_lost():
    # Not in the module docstring (TaskSkippedEvent is documented as an answer to a
    # Cancel); the code sends it to the lost-task hook, which aborts.
    s = sched("a", slots=1)
    submit(s, 1, 2)
    out = s.handle(TaskSkippedEvent((1, 0), "a"))
    assert len(out) == 1 and type(out[0]) is StageAborted and out[0].stage_id == 1
    assert isinstance(out[0].error, errors.WorkerLost)
    assert s.stage_state(1) == "aborted" and s.running_count() == 0 and s.pending_count() == 0


def test_skip_for_unknown_unassigned_or_elsewhere_running_keys_is_ignored():
    s = sched("a", "b", slots=1, recover=True)
    submit(s, 1, 3)                                   # (1,0)->a, (1,1)->b, (1,2) pending
    for ev in (TaskSkippedEvent("nope", "a"), TaskSkippedEvent((1, 2), "a"), TaskSkippedEvent((1, 1), "a"),
               TaskSkippedEvent((1, 0), "ghost")):
        assert s.handle(ev) == []
    assert s.running("a") == {(1, 0)} and s.running("b") == {(1, 1)} and s.pending_count() == 1


# ---- TickEvent ----

def test_tick_going_backwards_keeps_the_clock():
    s = sched("a", "b", "c", speculation=SPEC)
    submit(s, 1, 3)
    s.handle(TickEvent(10))
    assert s.handle(TickEvent(3)) == []
    done(s, 1, 0, "a")                                # time 10, not 3
    done(s, 1, 1, "b")                                # median 10: threshold 15
    assert s.handle(TickEvent(2)) == []
    assert s.handle(TickEvent(15)) == []                   # (1,2) has run 15: not longer than 15
    assert s.handle(TickEvent(14)) == []
    assert s.handle(TickEvent(15.5)) == [Run((1, 2), "a", 1, 2)]


def test_tick_going_backwards_stamps_assignments_with_the_kept_clock():
    s = sched("a", "b", speculation=SPEC)
    submit(s, 1, 3)                                   # (1,0)->a, (1,1)->b at 0; (1,2) waits
    s.handle(TickEvent(10))
    assert s.handle(TickEvent(0.5)) == []                  # backwards: the clock stays 10
    assert done(s, 1, 0, "a") == [Run((1, 2), "a", 1, 2)]     # time 10; (1,2) starts at 10, not 0.5
    assert done(s, 1, 1, "b") == []                   # time 10: median 10, threshold 15
    assert s.handle(TickEvent(16)) == []                   # 6 since 10 (15.5 since 0.5 would be due)
    assert s.handle(TickEvent(25)) == []                   # 15: not longer than 15
    assert s.handle(TickEvent(25.5)) == [Run((1, 2), "b", 1, 2)]


# ---- Speculation settings ----

@pytest.mark.parametrize("kwargs", [
    dict(multiplier=0.99), dict(multiplier=0.0), dict(multiplier=-2.0), dict(multiplier=float("nan")),
    dict(quantile=0.0), dict(quantile=-0.5), dict(quantile=1.0001), dict(quantile=float("nan")),
    dict(min_runtime=-0.001), dict(min_runtime=float("nan")),
])
def test_bad_speculation_settings_raise_config_error(kwargs):
    with pytest.raises(errors.ConfigError):
        Speculation(**kwargs)


def test_speculation_boundary_settings_are_accepted():
    sp = Speculation(multiplier=1.0, quantile=1.0, min_runtime=0.0)
    assert (sp.multiplier, sp.quantile, sp.min_runtime) == (1.0, 1.0, 0.0)
    assert Speculation() == Speculation(1.5, 0.75, 0.1)
    assert issubclass(errors.ConfigError, ValueError)
    with pytest.raises(TypeError):
        Scheduler(speculation=(1.5, 0.75, 0.1))
    # quantile 1.0 needs every task done, and then none runs: no copy ever starts
    s = straggler(speculation=Speculation(1.0, 1.0, 0.0))
    assert s.handle(TickEvent(100)) == []                  # 2 of 3 done
    s = sched("a", "b", speculation=Speculation(1.0, 1.0, 0.0))
    submit(s, 1, 1)
    assert s.handle(TickEvent(100)) == []                  # nothing done, nothing to compare with


# ---- StageCancelledEvent and copies ----

def test_cancelling_a_stage_with_copies_running_sends_no_cancel_and_keeps_their_slots():
    s = straggler()
    s.handle(TickEvent(2))                                 # (1,2): c and a copy on a
    assert runs(submit(s, 2, 2)) == [((2, 0), "b")]   # (2,1) waits
    assert s.handle(StageCancelledEvent(1)) == []          # nothing for the stage, no Cancel either
    assert s.stage_state(1) == "aborted"
    assert s.running("a") == {(1, 2)} and s.running("c") == {(1, 2)} and s.pending_count() == 1
    assert s.handle(TaskDoneEvent((1, 2), "c", "late")) == [Run((2, 1), "c", 2, 1)]    # slot only
    assert s.handle(TaskFailedEvent((1, 2), "a", "late")) == []                          # no abort
    assert s.handle(TickEvent(1000)) == []                 # a is free; stage 2 has no finished task
    done(s, 2, 0, "b")
    assert done(s, 2, 1, "c") == [StageFinished(2, {0: (2, 0), 1: (2, 1)})]
    assert s.running_count() == 0


def test_cancelling_a_stage_after_a_copy_was_cancelled():
    s = two_stragglers()
    assert s.handle(TaskDoneEvent((1, 2), "a", "copy2")) == [Cancel((1, 2), "c")]
    assert s.handle(StageCancelledEvent(1)) == []          # (1,3) on d and b: no Cancel
    assert s.handle(TickEvent(100)) == []                  # a is free; no copies of a cancelled stage
    assert s.running_count() == 3                     # c's cancelled copy, (1,3) twice
    assert s.handle(TaskSkippedEvent((1, 2), "c")) == []
    assert s.handle(TaskDoneEvent((1, 3), "b", "x")) == [] and s.handle(TaskDoneEvent((1, 3), "d", "y")) == []
    assert s.running_count() == 0 and s.stage_state(1) == "aborted"


# ---- a straggler without an eligible worker does not hold back later ones ----

def test_a_due_straggler_gets_a_copy_even_if_an_older_one_cannot():
    s = Scheduler(speculation=Speculation(1.5, 0.25, 0.0))
    s.handle(WorkerJoinedEvent("a", 2))
    s.handle(WorkerJoinedEvent("b", 1))
    submit(s, 1, 4)                                   # (1,0)->a, (1,1)->b, (1,2)->a; (1,3) waits
    s.handle(TickEvent(1))
    assert done(s, 1, 1, "b") == [Run((1, 3), "b", 1, 3)]     # (1,3) on b from t=1
    done(s, 1, 0, "a")                                # a: (1,2) from t=0 and a free slot; b full
    # (1,3) has run 9 > 1.5 x median 1 and a is another live worker with a free slot
    assert s.handle(TickEvent(10)) == [Run((1, 3), "a", 1, 3)]


# ---- randomized: recovery and speculation together ----

class Sim:
    """A toy cluster with recover=True and speculation on.  It keeps its own
    model of what the scheduler must do (queues, copies, clock, times) and
    checks every instruction against it."""

    def __init__(self, seed, liveness=False):
        self.rng = rng = random.Random(seed)
        self.sp = Speculation(rng.choice([1.0, 1.5, 2.0]), rng.choice([0.25, 0.5, 0.75, 1.0]),
                              rng.choice([0.0, 1.0, 3.0]))
        self.s = Scheduler(recover=True, speculation=self.sp)
        self.liveness = liveness
        self.clock = 0.0
        self.slots, self.joined, self.held = {}, {}, {}   # live worker -> slots / join order / keys held
        self.nworkers = 0
        self.stages = {}              # sid -> dict(parts, results, times, started, end)
        self.order = []               # sids in submission order
        self.queues = {}              # sid -> deque of unassigned partitions (live stages)
        self.attempt = {}             # key -> dict(start, speculated, copies) for assigned, unreported tasks
        self.stale = []               # reports from lost workers and duplicates: must change nothing
        self.settled = set()          # ended stages whose final stage_state was checked
        self.stats = dict(copies=0, cancels=0, requeued=0, skips=0, finished=0, losses=0, backwards=0)

    # -- the model --

    def live_stage(self, sid):
        return self.stages[sid]["end"] is None

    def pending(self):
        return sum(map(len, self.queues.values()))     # (an ended stage's queue is empty)

    def complete(self, sid):
        st = self.stages[sid]
        return len(st["results"]) == len(st["parts"])

    def due(self, key):
        a = self.attempt[key]
        st = self.stages[key[0]]
        if a["speculated"] or len(a["copies"]) != 1 or self.complete(key[0]):
            return False
        need = max(1, ceil(Fraction(self.sp.quantile) * len(st["parts"])))
        if len(st["times"]) < need:
            return False
        limit = max(self.sp.multiplier * statistics.median(st["times"]), self.sp.min_runtime)
        return self.clock - a["start"] > limit

    def requeue(self, keys):
        for sid in sorted({k[0] for k in keys}):
            self.queues[sid] = deque(sorted(p for s_, p in keys if s_ == sid) + list(self.queues[sid]))
        self.stats["requeued"] += len(keys)

    def end_stage(self, sid, how):
        self.stages[sid]["end"] = how
        self.queues[sid].clear()
        for key in [k for k in self.attempt if k[0] == sid]:
            del self.attempt[key]

    # -- sending an event and checking what comes out --

    def send(self, ev, cancels=(), abort=None):
        out = self.s.handle(ev)
        got_cancels = [(i.key, i.worker) for i in out if isinstance(i, Cancel)]
        assert sorted(got_cancels, key=repr) == sorted(cancels, key=repr), "Cancel instructions"
        aborts = [i for i in out if isinstance(i, StageAborted)]
        assert aborts == ([abort] if abort else []), "StageAborted"
        for ins in out:
            assert not isinstance(ins, (Run, Cancel)) or ins.worker in self.slots, "instruction to a lost worker"
            if isinstance(ins, Run):
                self.check_run(ins, isinstance(ev, TickEvent))
            elif isinstance(ins, StageFinished):
                sid = ins.stage_id
                assert self.live_stage(sid) and self.complete(sid)
                assert all(not self.live_stage(e) for e in self.order[:self.order.index(sid)]), "out of order"
                assert ins.results == self.stages[sid]["results"], "each partition's winning result, once"
                self.stages[sid]["end"] = "finished"
                self.stats["finished"] += 1
        first_live = next((sid for sid in self.order if self.live_stage(sid)), None)
        assert first_live is None or not self.complete(first_live), "a StageFinished is missing"
        self.invariants(isinstance(ev, TickEvent))
        return out

    def check_run(self, ins, on_tick):
        w, key = ins.worker, ins.key
        sid, p = key
        assert (ins.stage_id, ins.partition) == key and self.live_stage(sid)
        assert len(self.held[w]) < self.slots[w], "a worker over its slots"
        assert key not in self.held[w], "two copies on one worker"
        if key in self.attempt:                        # a speculative copy
            assert on_tick and self.pending() == 0, "a copy took a slot a queued task needs"
            assert self.due(key), "a premature or extra copy"
            a = self.attempt[key]
            a["speculated"] = True
            a["copies"].add(w)
            self.stats["copies"] += 1
        else:
            head = next(s_ for s_ in self.order if self.live_stage(s_) and self.queues[s_])
            assert (head, self.queues[head][0]) == key, "not the head of the queue"
            self.queues[head].popleft()
            free = [v for v in self.slots if len(self.held[v]) < self.slots[v]]
            assert w == min(free, key=lambda v: (len(self.held[v]), self.joined[v])), "placement"
            self.attempt[key] = dict(start=self.clock, speculated=False, copies={w})
            self.stages[sid]["started"] = True
        self.held[w].add(key)

    def invariants(self, on_tick):
        s = self.s
        assert s.workers == set(self.slots)
        for w, n in self.slots.items():
            assert s.running(w) == self.held[w] and len(self.held[w]) <= n
        assert s.running_count() == sum(map(len, self.held.values()))
        assert s.pending_count() == self.pending()
        if self.pending():                             # tasks only wait while every slot is taken
            assert all(len(self.held[w]) == n for w, n in self.slots.items())
        for sid in self.order:
            if sid in self.settled:
                continue
            st = self.stages[sid]
            want = {"finished": "finished", "aborted": "aborted", "cancelled": "aborted"}.get(st["end"])
            if want is None:
                want = "running" if st["started"] or not st["parts"] else "pending"
            else:
                self.settled.add(sid)
            assert s.stage_state(sid) == want
        if self.liveness and on_tick and self.slots:   # no due straggler left with a usable slot
            for key in self.attempt:
                if self.due(key):
                    a = self.attempt[key]
                    assert not [w for w in self.slots if w not in a["copies"]
                                and len(self.held[w]) < self.slots[w]], f"{key} is due and a slot is free"

    # -- the stream --

    def join(self):
        w = f"w{self.nworkers}"
        self.nworkers += 1
        self.slots[w], self.joined[w], self.held[w] = self.rng.randint(1, 3), len(self.joined), set()
        self.send(WorkerJoinedEvent(w, self.slots[w]))

    def report(self, w, key):
        """w reports its copy of key (active, or cancelled / of an ended stage)."""
        rng = self.rng
        self.held[w].discard(key)
        a = self.attempt.get(key)
        if a is None or w not in a["copies"]:          # a loser or a copy of an ended stage
            ev = rng.choice([TaskDoneEvent(key, w, ("loser", w)), TaskFailedEvent(key, w, "loser"), TaskSkippedEvent(key, w)])
            self.send(ev)
            return
        r = rng.random()
        if r < 0.06:                                   # skipped without a Cancel
            self.stats["skips"] += 1
            a["copies"].discard(w)
            if not a["copies"]:
                del self.attempt[key]
                self.requeue([key])
            self.send(TaskSkippedEvent(key, w))
            return
        others = [(key, v) for v in a["copies"] if v != w]
        self.stats["cancels"] += len(others)
        del self.attempt[key]
        sid, p = key
        if r < 0.09:
            err = RuntimeError(f"{key} on {w}")
            self.end_stage(sid, "aborted")
            self.send(TaskFailedEvent(key, w, err), cancels=others, abort=StageAborted(sid, err))
        else:
            st = self.stages[sid]
            st["results"][p] = ("r", key, w)
            st["times"].append(self.clock - a["start"])
            self.send(TaskDoneEvent(key, w, ("r", key, w)), cancels=others)
            self.stale.append(TaskDoneEvent(key, w, "duplicate"))

    def step(self):
        rng = self.rng
        r = rng.random()
        live = sorted(self.slots)
        held = [(w, k) for w in live for k in sorted(self.held[w])]
        if r < 0.06 or not self.nworkers:
            self.join()
        elif r < 0.10 and live:
            w = rng.choice(live)
            keys = self.held.pop(w)
            del self.slots[w]
            lost = []
            for k in keys:
                a = self.attempt.get(k)
                if a is not None and w in a["copies"]:
                    a["copies"].discard(w)
                    if not a["copies"]:
                        del self.attempt[k]
                        lost.append(k)
                self.stale += [TaskDoneEvent(k, w, "stale"), TaskFailedEvent(k, w, "stale"), TaskSkippedEvent(k, w)]
            self.requeue(lost)
            self.stats["losses"] += 1
            self.send(WorkerLostEvent(w, "simulated"))
        elif r < 0.22:
            sid = len(self.order)
            parts = rng.sample(range(12), rng.randint(0, 6))
            self.stages[sid] = dict(parts=set(parts), results={}, times=[], started=False, end=None)
            self.queues[sid] = deque(sorted(parts))
            self.order.append(sid)
            self.send(StageSubmittedEvent(sid, tuple(TaskSpec((sid, p), sid, p) for p in parts)))
        elif r < 0.45:
            if rng.random() < 0.15:
                now = self.clock - rng.uniform(0, 5)   # backwards: ignored, the clock stays
                self.stats["backwards"] += 1
            else:
                now = self.clock + rng.choice([0, 0.5, 1, 2, 5])
                self.clock = now
            self.send(TickEvent(now))
        elif r < 0.47 and self.order:
            sid = rng.choice(self.order)
            if self.live_stage(sid):
                self.end_stage(sid, "cancelled")
            self.send(StageCancelledEvent(sid))
        elif r < 0.52 and self.stale:
            ev = self.stale.pop(rng.randrange(len(self.stale)))
            assert self.send(ev) == []
        elif held:
            self.report(*rng.choice(held))

    def drain(self):
        if not self.slots:
            self.join()
        while any(self.held.values()):
            w = next(w for w in sorted(self.held) if self.held[w])
            key = min(self.held[w])
            self.held[w].discard(key)
            a = self.attempt.get(key)
            if a is None or w not in a["copies"]:
                self.send(TaskSkippedEvent(key, w))
            else:
                others = [(key, v) for v in a["copies"] if v != w]
                del self.attempt[key]
                st = self.stages[key[0]]
                st["results"][key[1]] = ("r", key, w)
                st["times"].append(self.clock - a["start"])
                self.send(TaskDoneEvent(key, w, ("r", key, w)), cancels=others)


def run_sim(seed, liveness=False, steps=300):
    sim = Sim(seed, liveness)
    for _ in range(steps):
        sim.step()
    sim.drain()
    assert sim.s.pending_count() == 0 and sim.s.running_count() == 0
    for sid in sim.order:                              # every stage ended; no stage aborted by a loss
        assert sim.stages[sid]["end"] is not None, f"stage {sid} never ended"
    return sim


@pytest.mark.parametrize("seed", range(200))
def test_random_recovery_and_speculation_streams_keep_the_invariants(seed):
    run_sim(seed)


def test_random_streams_exercise_copies_losses_and_skips():
    totals = {}
    for seed in range(40):
        for k, v in run_sim(seed).stats.items():
            totals[k] = totals.get(k, 0) + v
    for k in ("copies", "cancels", "requeued", "skips", "finished", "losses", "backwards"):
        assert totals[k] >= 20, (k, totals)


def test_random_streams_leave_no_due_straggler_with_a_usable_free_slot():
    for seed in range(200):
        run_sim(seed, liveness=True)
