"""The scheduler's side: which version each task reads, and which
versions tasks may still read.

A graph arrives pickled; the region arrays in it load here as
GlobalArrays, each with the version it was stamped with.  Every task of
the graph is annotated with that version (tasks of one submission were
pickled together, so they read one version, those that hold no array
themselves too), and with the executor ``clamor-<version>``, which the
worker plugin gates so that a worker runs tasks of one version at a time.
A retry, or a recomputation after a worker is lost, keeps the annotation.

Each such task also needs the worker resource ``clamor``, which a worker
has only once its plugin attached it: a worker that could not attach (no
secret, another one) gets none of these tasks, and they wait for one
that did.

A version stays live while a task annotated with it is known to the
scheduler (not forgotten), and for HOLD seconds after a graph holding it
was loaded here (it is annotated only once Dask has ordered the graph);
the driver asks for ``live()``.
"""
import logging
import time

from distributed.diagnostics.plugin import SchedulerPlugin

from . import _pickling

log = logging.getLogger("clamor.dask")

NAME = "clamor"
HOLD = 30.0
RESOURCE = "clamor"       # a worker resource: attached workers have plenty, others none


class VersionPlugin(SchedulerPlugin):
    name = NAME

    def __init__(self):
        self.keys_at = {}      # version -> keys annotated with it, not forgotten
        self.version_of = {}   # key -> version
        self.newest = None     # the highest version seen in a graph

    def start(self, scheduler):
        self.scheduler = scheduler
        scheduler.handlers["clamor_attached"] = self._attached

    def _attached(self, worker=None, **kwargs):
        """A worker attached (and set its resource): tasks waiting for an
        attached worker may go to it."""
        ws = self.scheduler.workers.get(worker)
        if ws is None:
            return "unknown"
        recs = self.scheduler.bulk_schedule_unrunnable_after_adding_worker(ws)
        self.scheduler.transitions(recs, stimulus_id=f"clamor-attached-{time.time()}")
        return "OK"

    def update_graph(self, scheduler, *, tasks=(), **kwargs):
        if not _pickling.loaded():   # no region array ever reached this scheduler
            return
        new = [scheduler.tasks[k] for k in tasks
               if k in scheduler.tasks and k not in self.version_of and scheduler.tasks[k].run_spec is not None]
        if not new:
            return
        versions = _pickling.versions_in([ts.run_spec for ts in new])
        if versions is None:   # could not walk the graph: the newest version seen (logged)
            versions = {self.newest} if self.newest is not None else set()
        if not versions:
            return
        if len(versions) > 1:
            log.info("a graph holds region arrays sent at versions %s: its tasks read the newest", sorted(versions))
        v = max(versions)
        self.newest = v if self.newest is None else max(self.newest, v)
        keys = self.keys_at.setdefault(v, set())
        for ts in new:
            ts.annotations = {**(ts.annotations or {}), "clamor": v, "executor": f"clamor-{v}"}
            ts.resource_restrictions = {**(ts.resource_restrictions or {}), RESOURCE: 1}
            keys.add(ts.key)
            self.version_of[ts.key] = v

    def transition(self, key, start, finish, *args, **kwargs):
        if finish == "forgotten":
            v = self.version_of.pop(key, None)
            if v is not None:
                keys = self.keys_at.get(v)
                keys.discard(key)
                if not keys:
                    del self.keys_at[v]

    def live(self):
        """The versions tasks may still read."""
        return sorted(set(self.keys_at) | _pickling.loaded_since(time.monotonic() - HOLD))
