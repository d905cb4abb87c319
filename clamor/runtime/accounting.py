"""What a Cluster's stages moved and took: the totals and the per-stage
records behind ``stats()`` and ``stage_stats()``.

DESIGN.  Workers send their cumulative counters with every report (DONE,
SKIP, FAIL); ``account`` credits what moved since the worker's previous
report to the attempt the report is about, in that attempt's record and in
the totals at once, so the totals are the sum of the stage records by
construction (clamor/runtime/executor.py says what the counters are).
"""
import collections
import logging
import statistics

from .. import errors
from . import serialize

log = logging.getLogger("clamor")


class StageAccounts:
    """The totals (a Counter) and the last ``keep`` stage records."""

    def __init__(self, keep=1000):
        self.totals = collections.Counter()
        self.stages = collections.deque(maxlen=keep)
        self.attempts = collections.OrderedDict()   # attempt -> its record, for reports (the last ``keep``)

    def account(self, w, asid, frame):
        """Count what worker ``w`` moved since its previous report (or its
        HELLO) for attempt ``asid``, the one this report is about.  Workers
        send their cumulative counters with every DONE, SKIP and FAIL, so the
        figures add up by construction: a losing copy's fetches count, so
        do a failed task's and read-ahead that landed after a task ended
        (in the worker's next report), and nothing counts twice.  Each worker's
        reports arrive in order on one socket."""
        try:
            now = serialize.unpack_counters(frame)
        except errors.ProtocolError as err:   # counted nowhere, rather than stop the action
            log.warning("worker %s sent a malformed report: %s", w.pid, err)
            return
        last = w.counters or {}
        w.counters = now
        w.served, w.followed, w.fallbacks = now["served"], now["redirects"], now["fallbacks"]
        w.direct, w.timeouts = now["direct"], now["timeouts"]
        moved = ("faults", "bytes_fetched", "bytes_from_peers", "mapped", "wire", "diff_wire", "diff_pages")
        if any(now[k] < last.get(k, 0) for k in moved):
            last = {}   # a task zeroed the worker's counters (clamor.reset_stats())
        d = {k: now[k] - last.get(k, 0) for k in moved}
        # (The worker's snapshot reads bytes_fetched and bytes_from_peers one
        # after the other: a fetch landing between them can move one run of
        # pages between the two columns of consecutive reports, never in or
        # out of their sum.)
        self.count_moved(asid, {"faults": d["faults"], "bytes_from_peers": d["bytes_from_peers"],
                                "bytes_from_driver": d["bytes_fetched"] - d["bytes_from_peers"],
                                "bytes_mapped": d["mapped"], "wire_bytes": d["wire"],
                                "wire_bytes_diff": d["diff_wire"], "diff_pages": d["diff_pages"]})

    def opened(self, asid, stat):
        """Attempt ``asid`` starts: what its tasks' reports say moved goes
        into ``stat`` (``count_moved``), even after the attempt ends."""
        self.attempts[asid] = stat
        while len(self.attempts) > self.stages.maxlen:
            self.attempts.popitem(last=False)

    def count_moved(self, asid, moved):
        """Faults and bytes a worker reported since its previous report, for
        attempt ``asid``: into the totals and that attempt's stage stat at
        once, so that the totals are the sum of the stage stats.  A late
        report (a losing copy that ran on) still adds to a stage already
        recorded."""
        stat = self.attempts.get(asid)
        for k, v in moved.items():
            self.totals[k] += v
            if stat is not None:
                stat[k] += v

    def record(self, stat):
        d = stat.pop("durations")
        stat["task_s"] = ({"min": min(d), "median": statistics.median(d), "max": max(d)} if d
                          else {"min": 0.0, "median": 0.0, "max": 0.0})
        self.stages.append(stat)
        self.totals["stages"] += 1
        self.totals["tasks"] += stat["tasks"]
        self.totals["task_seconds"] += sum(d)

    def stage_stats(self):
        return [dict(s) for s in self.stages]
