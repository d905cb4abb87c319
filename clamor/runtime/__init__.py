"""The bulk-synchronous runtime: clusters of workers, collections, stages.

- ``cluster``: ``clamor.Cluster``, its workers and their statistics;
- ``collection``: ``DataCollection`` and its transformations;
- ``stages``: running an action's stages, recovery and speculation;
- ``scheduler``: the pure state machine (events in, instructions out);
- ``lineage``: which partitions and blocks exist, and at which version;
- ``executor``: what a worker runs; ``serialize``: what travels;
- ``liveness``: forking, reaping and watching worker processes;
- ``progress``: the progress bar; ``interrupt``: Ctrl-C between messages;
- ``worker``: a worker that was not forked joins a Cluster (``clamor worker``).

Imports ``clamor.memory`` and the top modules (``errors``, ``_native``),
never the other way round.
"""
