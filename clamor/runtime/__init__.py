"""The bulk-synchronous runtime: clusters of workers, collections, stages.

- ``cluster``: ``clamor.Cluster``, built of the parts below; ``options``: its settings;
- ``pool``: its workers (typed records, starting, joining, losing);
- ``collection``: ``DataCollection`` and its transformations;
- ``stages``: running an action's stages, recovery and speculation;
  ``shipping``: the in-place checks of what a stage ships; ``accounting``: stats;
- ``driver`` and ``versions``: the driver core (joining, the region's one
  driver, replication, page versions) that the Cluster and clamor.dask share;
- ``scheduler``: the pure state machine (events in, instructions out);
- ``lineage``: which partitions and blocks exist, and at which version;
- ``executor``: what a worker runs; ``serialize``: what travels;
- ``liveness``: forking, reaping and watching worker processes;
- ``progress``: the progress bar; ``interrupt``: Ctrl-C between messages;
- ``worker``: the worker core (joining, attaching), and a worker that was not
  forked joining a Cluster (``clamor worker``).

Imports ``clamor.memory`` and the top modules (``errors``, ``_native``),
never the other way round.
"""
