"""The scheduler state machine, driven by events alone: no processes, no sockets."""
import random
import time
from collections import deque

import pytest

from clamor import errors
from clamor.runtime.scheduler import (Run, Scheduler, StageAborted, StageCancelledEvent, StageFinished, StageSubmittedEvent, TaskDoneEvent,
                              TaskFailedEvent, TaskSpec, WorkerJoinedEvent, WorkerLostEvent)

from scheduler_events import done, runs, sched, submit


def stage_msgs(out):
    return [i for i in out if not isinstance(i, Run)]


# ---- placement ----

def test_least_loaded_with_join_order_tie_break():
    s = sched("a", "b")
    out = submit(s, 1, 4)
    assert out == [Run((1, 0), "a", 1, 0), Run((1, 1), "b", 1, 1), Run((1, 2), "a", 1, 2), Run((1, 3), "b", 1, 3)]
    assert s.running("a") == {(1, 0), (1, 2)} and s.running("b") == {(1, 1), (1, 3)}
    assert s.running_count() == 4 and s.pending_count() == 0


def test_load_counts_tasks_not_free_slots():
    s = Scheduler()
    s.handle(WorkerJoinedEvent("big", 4))
    s.handle(WorkerJoinedEvent("small", 1))
    assert [w for _, w in runs(submit(s, 1, 5))] == ["big", "small", "big", "big", "big"]


def test_tasks_run_in_partition_order_whatever_the_submission_order():
    s = sched("a", slots=8)
    out = submit(s, 1, [5, 2, 7, 0])
    assert [i.partition for i in out] == [0, 2, 5, 7]


def test_a_worker_never_holds_more_than_its_slots():
    s = sched("a", slots=2)
    assert runs(submit(s, 1, 5)) == [((1, 0), "a"), ((1, 1), "a")]
    assert s.pending_count() == 3
    assert runs(done(s, 1, 1, "a")) == [((1, 2), "a")]
    assert len(s.running("a")) == 2


def test_no_workers_yet_means_tasks_wait_for_the_first_join():
    s = Scheduler()
    assert submit(s, 1, 3) == []
    assert s.stage_state(1) == "pending" and s.pending_count() == 3
    assert runs(s.handle(WorkerJoinedEvent("a", 2))) == [((1, 0), "a"), ((1, 1), "a")]
    assert s.stage_state(1) == "running"


def test_preferred_worker_with_a_free_slot_wins_over_a_less_loaded_one():
    s = sched("a", "b")
    submit(s, 1, 1)                                   # a holds one task
    out = submit(s, 2, 1, prefer={0: ("a",)})
    assert runs(out) == [((2, 0), "a")]


def test_preference_falls_back_when_preferred_is_full_dead_or_unknown():
    s = sched("a", "b", "c", slots=1)
    submit(s, 1, 1)                                   # a is full
    s.handle(WorkerLostEvent("b"))
    out = submit(s, 2, 1, prefer={0: ("a", "b", "nobody")})
    assert runs(out) == [((2, 0), "c")]


def test_among_preferred_workers_the_least_loaded_wins():
    s = sched("a", "b", "c", slots=3)
    submit(s, 1, 2, prefer={0: ("a",), 1: ("a",)})    # a: 2 tasks
    submit(s, 2, 1, prefer={0: ("b",)})               # b: 1 task
    out = submit(s, 3, 1, prefer={0: ("a", "b")})
    assert runs(out) == [((3, 0), "b")]
    out = submit(s, 4, 1, prefer={0: ("c", "b", "a")})    # c holds none
    assert runs(out) == [((4, 0), "c")]
    submit(s, 5, 1, prefer={0: ("c",)})
    out = submit(s, 6, 1, prefer={0: ("c", "b")})         # b and c both hold 2: b joined first
    assert runs(out) == [((6, 0), "b")]


def test_preference_placement_keeps_the_load_heap_honest():
    s = sched("a", "b", slots=2)
    submit(s, 1, 2, prefer={0: ("a",), 1: ("a",)})    # a full via preference
    assert [w for _, w in runs(submit(s, 2, 2))] == ["b", "b"]


def test_stale_load_heap_entries_are_compacted():
    s = sched("a", "b", slots=1)
    submit(s, 1, 1000, prefer={p: ("a",) for p in range(1000)})
    for p in range(1000):                             # each placement on "a" strands an entry
        key, w = next((k, w) for w in ("a", "b") for k in s.running(w))
        s.handle(TaskDoneEvent(key, w))
    assert s.stage_state(1) == "finished"
    assert len(s._idle) <= 4 * 2 + 64 + 1             # bounded by the workers, not the tasks


def test_lost_worker_gets_no_runs_and_rejoin_is_a_new_worker():
    s = sched("a", "b", slots=1)
    s.handle(WorkerLostEvent("a"))
    assert [w for _, w in runs(submit(s, 1, 1))] == ["b"]
    s.handle(WorkerJoinedEvent("a", 1))                    # same id, joins after b
    assert s.workers == {"a", "b"}
    assert [w for _, w in runs(submit(s, 2, 1))] == ["a"]


# ---- stages ----

def test_later_stage_waits_until_every_earlier_task_is_assigned_then_uses_free_slots():
    s = sched("a", slots=2)
    submit(s, 1, 3)
    assert submit(s, 2, 2) == []
    assert s.stage_state(2) == "pending"
    assert runs(done(s, 1, 0, "a")) == [((1, 2), "a")]     # earlier stage first
    assert runs(done(s, 1, 1, "a")) == [((2, 0), "a")]     # stage 1 still has (1, 2) running
    assert s.stage_state(1) == "running" and s.stage_state(2) == "running"


def test_stage_finishes_once_with_every_result():
    s = sched("a", "b")
    submit(s, 1, 3)
    assert stage_msgs(done(s, 1, 0, "a", "r0")) == []
    assert stage_msgs(done(s, 1, 2, "a", "r2")) == []
    out = done(s, 1, 1, "b", "r1")
    assert out == [StageFinished(1, {0: "r0", 1: "r1", 2: "r2"})]
    assert s.stage_state(1) == "finished"
    assert done(s, 1, 1, "b", "again") == []          # duplicate report
    assert s.running_count() == 0 and s.pending_count() == 0


def test_result_none_is_a_result():
    s = sched("a")
    submit(s, 1, 1)
    assert s.handle(TaskDoneEvent((1, 0), "a")) == [StageFinished(1, {0: None})]


def test_empty_stage_finishes_immediately():
    s = Scheduler()
    assert s.handle(StageSubmittedEvent(7, ())) == [StageFinished(7, {})]
    assert s.stage_state(7) == "finished"


def test_empty_stage_finishes_in_its_turn():
    s = sched("a")
    submit(s, 1, 1)
    assert submit(s, 2, 0) == []
    assert s.stage_state(2) == "running"              # done, but stage 1 is not
    assert done(s, 1, 0, "a") == [StageFinished(1, {0: (1, 0)}), StageFinished(2, {})]


def test_stage_finished_waits_for_earlier_stages():
    s = sched("a", slots=3)
    submit(s, 1, 2)
    submit(s, 2, 1)
    assert stage_msgs(done(s, 2, 0, "a")) == []
    assert s.stage_state(2) == "running"
    done(s, 1, 0, "a")
    out = done(s, 1, 1, "a")
    assert [m.stage_id for m in out] == [1, 2]


def test_aborted_earlier_stage_releases_a_finished_later_one():
    s = sched("a", slots=3)
    submit(s, 1, 2)
    submit(s, 2, 1)
    done(s, 2, 0, "a")
    out = s.handle(TaskFailedEvent((1, 0), "a", "boom"))
    assert out == [StageAborted(1, "boom"), StageFinished(2, {0: (2, 0)})]


def test_stage_ids_need_not_be_ordered_ints():
    s = sched("a")
    s.handle(StageSubmittedEvent("z", (TaskSpec("k1", "z", 0),)))
    s.handle(StageSubmittedEvent("b", (TaskSpec("k2", "b", 0),)))
    s.handle(TaskDoneEvent("k2", "a", 2))
    assert s.handle(TaskDoneEvent("k1", "a", 1)) == [StageFinished("z", {0: 1}), StageFinished("b", {0: 2})]


# ---- failures, losses, cancels ----

def test_task_failure_aborts_once_and_drops_unassigned_tasks():
    s = sched("a", slots=2)
    submit(s, 1, 5)
    submit(s, 2, 2)
    err = ValueError("user bug")
    assert s.handle(TaskFailedEvent((1, 0), "a", err)) == [StageAborted(1, err), Run((2, 0), "a", 2, 0)]
    assert s.stage_state(1) == "aborted" and s.pending_count() == 1
    assert s.handle(TaskFailedEvent((1, 0), "a", err)) == []          # duplicate
    # the aborted stage's running task only frees its slot
    assert done(s, 1, 1, "a") == [Run((2, 1), "a", 2, 1)]
    assert s.handle(TaskFailedEvent((1, 2), "a", err)) == []          # dropped: never assigned


def test_second_failure_in_an_aborted_stage_is_silent():
    s = sched("a", slots=2)
    submit(s, 1, 2)
    s.handle(TaskFailedEvent((1, 0), "a", "e1"))
    assert s.handle(TaskFailedEvent((1, 1), "a", "e2")) == []
    assert s.running_count() == 0


def test_worker_lost_aborts_stages_it_held_tasks_of():
    s = sched("a", "b", slots=2)
    submit(s, 1, 2)                                   # (1,0)->a, (1,1)->b
    submit(s, 2, 1)                                   # (2,0)->a
    submit(s, 3, 1)                                   # (3,0)->b
    out = s.handle(WorkerLostEvent("a", "connection reset"))
    assert [(type(m), m.stage_id) for m in out] == [(StageAborted, 1), (StageAborted, 2)]
    assert isinstance(out[0].error, errors.WorkerLost)
    assert str(out[0].error) == "worker a lost: connection reset"
    assert out[0].error is not out[1].error
    assert s.workers == {"b"} and s.running("a") == frozenset()
    assert s.stage_state(3) == "running"
    assert done(s, 1, 1, "b") == []                   # survivor of aborted stage: slot only
    assert done(s, 3, 0, "b") == [StageFinished(3, {0: (3, 0)})]


def test_worker_lost_without_tasks_aborts_nothing_and_keeps_pending_work():
    s = sched("a", "b", slots=1)
    submit(s, 1, 3)                                   # a, b busy; one pending
    done(s, 1, 1, "b")                                # b takes (1, 2)
    s.handle(WorkerJoinedEvent("c", 1))
    assert s.handle(WorkerLostEvent("c", "bye")) == []
    assert s.stage_state(1) == "running"


def test_late_report_from_a_lost_worker_is_ignored():
    s = sched("a", "b", slots=1)
    submit(s, 1, 1)
    s.handle(WorkerLostEvent("a"))
    assert done(s, 1, 0, "a") == []
    assert s.handle(WorkerJoinedEvent("a", 1)) == []        # rejoined: its old task is not its own
    assert done(s, 1, 0, "a") == []
    assert s.stage_state(1) == "aborted"


def test_losing_the_last_worker_aborts_pending_stages():
    s = sched("a", slots=1)
    submit(s, 1, 2)                                   # (1,0) runs, (1,1) pending
    submit(s, 2, 2)
    submit(s, 3, 0)
    out = s.handle(WorkerLostEvent("a", "killed"))
    assert [(type(m), m.stage_id, str(getattr(m, "error", ""))) for m in out] == [
        (StageAborted, 1, "worker a lost: killed"), (StageAborted, 2, "no live workers"), (StageFinished, 3, "")]
    assert s.pending_count() == 0 and s.stage_state(3) == "finished"


def test_submission_with_no_live_worker_left_aborts_at_once():
    s = sched("a")
    s.handle(WorkerLostEvent("a"))
    out = submit(s, 1, 2)
    assert [type(m) for m in out] == [StageAborted] and str(out[0].error) == "no live workers"
    assert submit(s, 2, 0) == [StageFinished(2, {})]
    s.handle(WorkerJoinedEvent("b"))
    assert runs(submit(s, 3, 1)) == [((3, 0), "b")]


def test_cancel_is_a_silent_abort():
    s = sched("a", slots=2)
    submit(s, 1, 4)
    submit(s, 2, 1)
    assert s.handle(StageCancelledEvent(1)) == []
    assert s.stage_state(1) == "aborted" and s.pending_count() == 1
    assert done(s, 1, 0, "a") == [Run((2, 0), "a", 2, 0)]
    assert s.handle(TaskFailedEvent((1, 1), "a", "late")) == []
    assert done(s, 2, 0, "a") == [StageFinished(2, {0: (2, 0)})]
    assert s.handle(StageCancelledEvent(1)) == []          # twice
    assert s.handle(StageCancelledEvent(2)) == []          # finished
    assert s.handle(StageCancelledEvent(99)) == []         # unknown
    assert s.stage_state(2) == "finished"


def test_cancel_of_a_held_finished_stage_drops_its_results():
    s = sched("a", slots=2)
    submit(s, 1, 1)
    submit(s, 2, 1)
    done(s, 2, 0, "a")
    assert s.handle(StageCancelledEvent(2)) == []
    assert done(s, 1, 0, "a") == [StageFinished(1, {0: (1, 0)})]


def test_cancel_of_an_earlier_stage_releases_later_ones():
    s = sched("a", slots=2)
    submit(s, 1, 1)
    submit(s, 2, 1)
    done(s, 2, 0, "a")
    assert s.handle(StageCancelledEvent(1)) == [StageFinished(2, {0: (2, 0)})]


class _Recording(Scheduler):
    def __init__(self):
        super().__init__()
        self.calls = []

    def _on_lost_tasks(self, worker, lost, reason, out):
        self.calls.append((worker, [t.spec.key for t in lost], reason))


def test_lost_task_hook_sees_tasks_in_submission_and_partition_order():
    s = _Recording()
    s.handle(WorkerJoinedEvent("a", 4))
    submit(s, 2, [3, 1])
    submit(s, 1, [0])                                 # submitted later, so after stage 2
    assert s.handle(WorkerLostEvent("a", "r")) == []       # the hook decides: here, nothing
    assert s.calls == [("a", [(2, 1), (2, 3), (1, 0)], "r")]
    assert s.running_count() == 0 and s.running("a") == frozenset()


# ---- bad input ----

def test_harmless_duplicates_and_unknowns_are_ignored():
    s = sched("a", slots=1)
    assert s.handle(WorkerJoinedEvent("a", 5)) == []
    submit(s, 1, 2)
    submit(s, 2, 1)
    assert len(s.running("a")) == 1                   # still one slot
    assert s.handle(WorkerLostEvent("ghost")) == []
    assert s.handle(TaskDoneEvent("no such key", "a")) == []
    assert s.handle(TaskDoneEvent((1, 0), "ghost")) == []  # right key, wrong worker
    assert s.handle(TaskFailedEvent((1, 1), "a", "e")) == []   # pending, not assigned
    assert s.running("ghost") == frozenset() and s.stage_state("nope") is None
    assert s.stage_state(1) == "running" and s.running_count() == 1


@pytest.mark.parametrize("event", [
    StageSubmittedEvent(1, (TaskSpec("k", 1, 0),)),                            # reused stage id
    StageSubmittedEvent(2, (TaskSpec((1, 0), 2, 0),)),                         # key of an earlier stage
    StageSubmittedEvent(2, (TaskSpec("x", 2, 0), TaskSpec("x", 2, 1))),        # key twice in one stage
    StageSubmittedEvent(2, (TaskSpec("x", 2, 0), TaskSpec("y", 2, 0))),        # partition twice
    StageSubmittedEvent(2, (TaskSpec("x", 3, 0),)),                            # spec of another stage
    WorkerJoinedEvent("b", 0), WorkerJoinedEvent("b", -1), WorkerJoinedEvent("b", 1.5), WorkerJoinedEvent("b", True),
])
def test_caller_bugs_raise_value_error_and_change_nothing(event):
    s = sched("a", slots=1)
    submit(s, 1, 2)
    with pytest.raises(ValueError):
        s.handle(event)
    assert s.stage_state(2) is None and s.workers == {"a"} and s.pending_count() == 1
    assert done(s, 1, 0, "a") == [Run((1, 1), "a", 1, 1)]
    assert runs(s.handle(StageSubmittedEvent(2, (TaskSpec("fresh", 2, 0),)))) == []


def test_a_key_is_refused_until_its_stage_is_resolved_then_released():
    s = sched("a")
    submit(s, 1, 2)
    done(s, 1, 0, "a")                                # stage 1 still runs (1,1)
    with pytest.raises(ValueError):
        s.handle(StageSubmittedEvent(2, (TaskSpec((1, 0), 2, 0),)))
    done(s, 1, 1, "a")                                # finished: no worker holds its keys
    assert runs(s.handle(StageSubmittedEvent(2, (TaskSpec((1, 0), 2, 0),)))) == [((1, 0), "a")]
    assert s.stage_state(2) == "running"
    assert s.handle(TaskDoneEvent((1, 0), "a", "again")) == [StageFinished(2, {0: "again"})]


def test_resolved_stages_are_forgotten_beyond_the_history():
    s = sched("a", history=3)
    for sid in range(1, 6):
        submit(s, sid, 1)
        done(s, sid, 0, "a")
    assert [s.stage_state(i) for i in range(1, 6)] == [None, None, "finished", "finished", "finished"]
    with pytest.raises(ValueError):                   # in the history: still refused
        submit(s, 3, 1)
    assert runs(submit(s, 1, 1)) == [((1, 0), "a")]   # forgotten: a new stage
    cancelled = Scheduler(history=1)
    submit(cancelled, 1, 1)
    cancelled.handle(StageCancelledEvent(1))
    assert cancelled.stage_state(1) == "aborted" and cancelled.pending_count() == 0


def test_memory_stays_flat_over_many_stages():
    import tracemalloc
    s = sched("a", "b")

    def run(first, n):
        for sid in range(first, first + n):
            submit(s, sid, 8)
            for p in range(8):
                done(s, sid, p, "a" if p % 2 == 0 else "b")
            assert s.stage_state(sid) == "finished"

    tracemalloc.start()
    try:
        run(1, 2000)                                  # past the history: the plateau
        before = tracemalloc.get_traced_memory()[0]
        run(2001, 4000)
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    # 32 KiB over 32,000 tasks: a byte a task, or a _Stage a stage, is more.
    assert grown < 32 * 1024, f"the scheduler grew {grown} bytes over 4000 finished stages"


@pytest.mark.parametrize("event", [object(), "TaskDoneEvent", StageSubmittedEvent(2, ("not a spec",)),
                                   StageSubmittedEvent(2, (TaskSpec(["unhashable"], 2, 0),))])
def test_type_errors(event):
    s = sched("a")
    with pytest.raises(TypeError):
        s.handle(event)
    assert s.stage_state(2) is None


def test_stage_submitted_takes_any_iterable_of_specs():
    ev = StageSubmittedEvent(1, (TaskSpec(("k", p), 1, p, ("b",)) for p in range(2)))
    assert isinstance(ev.tasks, tuple) and len(ev.tasks) == 2
    assert runs(sched("a", "b").handle(ev)) == [(("k", 0), "b"), (("k", 1), "b")]


# ---- randomized invariants ----

class Sim:
    """A toy cluster: answers only the Run instructions it received and
    checks every instruction against what it knows."""

    def __init__(self, seed):
        self.rng = random.Random(seed)
        self.s = Scheduler()
        self.slots = {}                 # live worker -> slots
        self.held = {}                  # live worker -> set of keys it was told to run
        self.ever = set()               # every worker id used
        self.stale = []                 # reports that may arrive late (lost workers, duplicates)
        self.stages = {}                # stage id -> set of partitions
        self.order = []                 # stage ids in submission order
        self.outcome = {}               # stage id -> "finished" | "aborted" | "cancelled"
        self.ever_run = set()
        self.queue = deque()            # unassigned keys, the order the scheduler must follow
        self.prefer = {}                # key -> preferred workers
        self.joined = {}                # worker -> join order
        self.next_stage = self.next_worker = 0

    def send(self, ev):
        out = self.s.handle(ev)
        for ins in out:
            self.check(ins)
        self.invariants()
        return out

    def check(self, ins):
        s = self.s
        if isinstance(ins, Run):
            assert ins.worker in self.slots and ins.worker in s.workers
            assert ins.key not in self.ever_run, "a task ran twice"
            assert ins.key == (ins.stage_id, ins.partition) and ins.stage_id not in self.outcome
            while self.queue[0][0] in self.outcome:       # dropped with an aborted or cancelled stage
                self.queue.popleft()
            assert self.queue.popleft() == ins.key, "not the head of the FIFO"
            free = [w for w in self.slots if len(self.held[w]) < self.slots[w]]
            preferred = [w for w in free if w in self.prefer[ins.key]]
            rank = lambda w: (len(self.held[w]), self.joined[w])   # noqa: E731
            assert ins.worker == min(preferred or free, key=rank), "placement policy"
            self.ever_run.add(ins.key)
            self.held[ins.worker].add(ins.key)
            assert len(self.held[ins.worker]) <= self.slots[ins.worker]
            return
        sid = ins.stage_id
        assert sid in self.stages and sid not in self.outcome, f"second outcome for stage {sid}"
        if isinstance(ins, StageFinished):
            assert ins.results == {p: ("r", sid, p) for p in self.stages[sid]}
            earlier = self.order[:self.order.index(sid)]
            assert all(e in self.outcome for e in earlier), "stage finished out of order"
            self.outcome[sid] = "finished"
        else:
            assert isinstance(ins, StageAborted)
            self.outcome[sid] = "aborted"

    def invariants(self):
        s = self.s
        assert s.workers == set(self.slots)
        for w in self.slots:
            assert s.running(w) == self.held[w]
        assert s.running_count() == sum(map(len, self.held.values()))
        if self.joined and not self.slots:   # every worker gone: nothing may wait for one
            assert s.pending_count() == 0
        if s.pending_count():        # work-conserving: tasks only wait when every slot is taken
            assert all(len(self.held[w]) == n for w, n in self.slots.items())
        for sid in self.order:
            state = s.stage_state(sid)
            want = {"finished": "finished", "aborted": "aborted", "cancelled": "aborted"}.get(self.outcome.get(sid))
            assert state == want if want else state in ("pending", "running")

    def step(self):
        r, rng = self.rng.random(), self.rng
        live = sorted(self.slots)
        busy = [(w, k) for w in live for k in sorted(self.held[w])]
        if r < 0.08 or not self.ever:
            w = f"w{self.next_worker}"
            self.next_worker += 1
            self.ever.add(w)
            self.slots[w], self.held[w], self.joined[w] = rng.randint(1, 3), set(), len(self.joined)
            self.send(WorkerJoinedEvent(w, self.slots[w]))
        elif r < 0.12 and live:
            w = rng.choice(live)
            keys = self.held.pop(w)
            del self.slots[w]
            self.stale += [TaskDoneEvent(k, w, ("stale",)) for k in keys]
            self.send(WorkerLostEvent(w, "simulated"))
            for k in keys:          # no recovery: their stages must have ended
                assert k[0] in self.outcome
        elif r < 0.30:
            sid = self.next_stage
            self.next_stage += 1
            parts = rng.sample(range(20), rng.randint(0, 8))
            everyone = sorted(self.ever) + ["never-joined"]
            tasks = [TaskSpec((sid, p), sid, p, tuple(rng.sample(everyone, rng.randint(0, 2)))) for p in parts]
            self.stages[sid] = set(parts)
            self.queue.extend((sid, p) for p in sorted(parts))
            self.prefer.update((t.key, t.prefer) for t in tasks)
            self.order.append(sid)
            self.send(StageSubmittedEvent(sid, tuple(tasks)))
        elif r < 0.33 and self.order:
            sid = rng.choice(self.order)
            if sid not in self.outcome:
                self.outcome[sid] = "cancelled"
            out = self.send(StageCancelledEvent(sid))    # may release later stages, never reports sid
            assert all(isinstance(i, StageFinished) and i.stage_id != sid for i in out)
        elif r < 0.36 and self.stale:
            ev = self.stale.pop(rng.randrange(len(self.stale)))
            assert not [i for i in self.send(ev) if not isinstance(i, Run)]
        elif r < 0.38 and busy:                         # a report from the wrong worker
            w, k = rng.choice(busy)
            other = rng.choice(sorted(self.ever - {w}) or ["ghost"])
            assert self.send(rng.choice([TaskDoneEvent(k, other, "x"), TaskFailedEvent(k, other, "x")])) == []
        elif busy:
            w, k = rng.choice(busy)
            self.held[w].discard(k)
            if rng.random() < 0.05:
                self.send(TaskFailedEvent(k, w, f"error in {k}"))
            else:
                self.send(TaskDoneEvent(k, w, ("r",) + k))
                self.stale.append(TaskDoneEvent(k, w, ("dup",)))

    def drain(self):
        if not self.slots:
            self.slots["last"], self.held["last"], self.joined["last"] = 2, set(), len(self.joined)
            self.send(WorkerJoinedEvent("last", 2))
        while any(self.held.values()):
            w = next(w for w in sorted(self.held) if self.held[w])
            k = min(self.held[w])
            self.held[w].discard(k)
            self.send(TaskDoneEvent(k, w, ("r",) + k))


def run_sim(seed, steps=600):
    sim = Sim(seed)
    for _ in range(steps):
        sim.step()
    sim.drain()
    assert set(sim.outcome) == set(sim.order), "a stage never ended"
    assert sim.s.pending_count() == 0 and sim.s.running_count() == 0
    return sim


@pytest.mark.parametrize("seed", range(40))
def test_random_streams_keep_the_invariants(seed):
    outcomes = set(run_sim(seed).outcome.values())
    assert {"finished", "aborted"} <= outcomes, "the stream should both finish and abort stages"


def test_random_streams_exercise_cancels():
    assert all("cancelled" in run_sim(seed).outcome.values() for seed in range(3))


# ---- throughput (a measurement, not an assertion) ----

def test_throughput_100k_tasks(capsys):
    n = 100_000
    s = Scheduler()
    for i in range(8):
        s.handle(WorkerJoinedEvent(i, 2))
    stage = StageSubmittedEvent(0, tuple(TaskSpec(p, 0, p) for p in range(n)))
    wall, cpu = time.perf_counter(), time.process_time()
    queue = deque(s.handle(stage))
    submitted = time.perf_counter() - wall
    events, finished = 1, []
    while queue:
        ins = queue.popleft()
        if isinstance(ins, Run):
            events += 1
            queue.extend(s.handle(TaskDoneEvent(ins.key, ins.worker, ins.partition)))
        else:
            finished.append(ins)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    assert len(finished) == 1 and len(finished[0].results) == n
    with capsys.disabled():
        print(f"\nscheduler: {n} tasks, 8 workers x 2 slots: submit {submitted:.3f}s; {events} events "
              f"through handle() in {wall:.3f}s wall, {cpu:.3f}s CPU ({events / cpu:,.0f} events per CPU s)")
