"""A job's record, for the stage runner (clamor/runtime/stages.py).

A *job* is one logical stage: some partitions of a collection, computed at
one *version*, run as one or more *attempts* (scheduler stages) until every
partition has its result.  ``_Job`` keeps what the runner knows of one: its
results so far, its losses, what its tasks read, its attempts.
``_InputsLost`` is how the runner tells itself that the running attempt lost
an input and must be retried; ``_cached_ids`` names the cached collections a
job's partitions may be read from.
"""
import collections


class _InputsLost(Exception):
    """Internal: the running attempt lost an input or an output; retry."""


class _Job:
    __slots__ = ("kind", "node", "parent", "action", "arg", "parts", "version", "results", "losses", "stat",
                 "bar", "reads", "rerun", "attempts", "asids", "only")

    def __init__(self, kind, node, parent, action, arg, parts, version, rerun, only=None):
        self.kind, self.node, self.parent, self.action, self.arg = kind, node, parent, action, arg
        self.parts, self.version, self.rerun = list(parts), version, rerun
        self.results = {}                       # partition -> value (map jobs: worker id)
        self.losses = collections.Counter()     # partition -> times lost with a worker
        self.reads = (set(), set())             # (shuffle ids, cache keys) the tasks fetch
        self.attempts = 0
        self.asids = []                         # its attempts' scheduler stage ids
        self.only = only or {}                  # partition -> the workers it may run on (Cluster.run)

    @property
    def computes(self):
        """The collection whose partitions the tasks compute."""
        return self.node.deps[self.parent] if self.kind == "map" else self.node


def _cached_ids(node):
    """The ids of the cached collections ``node`` is made from, itself included."""
    out, stack = set(), [node]
    while stack:
        c = stack.pop()
        if c.cached:
            out.add(c.id)
        stack.extend(c.deps)
    return out
