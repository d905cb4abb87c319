"""The one heartbeat mechanism (clamor/runtime/liveness.py), without
processes: a worker's Beat and a driver's Heard."""
import threading
import time

from clamor import errors
from clamor.runtime.liveness import BYE, Beat, Heard, beat_interval


def test_beat_sends_at_its_interval_and_not_between():
    sent = []
    beat = Beat(lambda: sent.append(1), 0.2)
    assert beat.tick() is None and len(sent) == 1     # the first at once
    assert beat.tick() is None and len(sent) == 1     # not due yet
    assert 0 < beat.due() <= 0.2
    time.sleep(0.21)
    assert beat.tick() is None and len(sent) == 2


def test_beat_tells_a_gone_process_without_sending():
    sent = []
    beat = Beat(lambda: sent.append(1), 0.01, alive=lambda: False)
    assert beat.tick() == "the driver's process is gone"
    assert sent == []


def test_beat_tells_bye():
    assert Beat(lambda: BYE, 0.01).tick() == "the driver detached"


def test_beat_tells_silence_only_with_a_grace():
    def unanswered():
        raise errors.TransportError("no answer")
    patient = Beat(unanswered, 0.01)
    strict = Beat(unanswered, 0.01, grace=0.05)
    assert strict.tick() is None                      # not silent long enough yet
    time.sleep(0.07)
    assert patient.tick() is None
    assert strict.tick() == "the driver has not answered for 0.05 s"


def test_an_answer_resets_the_silence():
    answers = iter([True, False, False])
    beat = Beat(lambda: next(answers), 0.04, grace=0.06)
    assert beat.tick() is None
    time.sleep(0.05)
    assert beat.tick() is None                        # 0.05 s since the answer
    time.sleep(0.05)
    assert beat.tick() == "the driver has not answered for 0.06 s"


def test_beat_run_stops_or_reports_once():
    stop, gone = threading.Event(), []
    t = threading.Thread(target=Beat(lambda: BYE, 0.01).run, args=(stop, gone.append))
    t.start()
    t.join(5)
    assert gone == ["the driver detached"]
    sent = []
    t = threading.Thread(target=Beat(lambda: sent.append(1), 0.01).run, args=(stop, gone.append))
    stop.set()
    t.start()
    t.join(5)
    assert not t.is_alive() and gone == ["the driver detached"]


def test_heard_lists_the_silent_and_pauses():
    h = Heard()
    h.heard("a", now=100.0)
    h.heard("b", now=104.0)
    assert h.silent(5.0, now=106.0) == [("a", 6.0)]
    h.pause(3.0)                                      # nobody listened for 3 s
    assert h.silent(5.0, now=106.0) == []
    assert h.forget("a") and not h.forget("a") and "a" not in h and "b" in h


def test_beat_interval_reads_the_welcome():
    assert beat_interval({"heartbeat": 0.25}) == 0.25
    assert beat_interval({"heartbeat": None}) == 1.0
    assert beat_interval({}) == 1.0
    assert beat_interval({"heartbeat": 0.0}) == 1.0
    assert beat_interval({"heartbeat": "1"}) == 1.0
