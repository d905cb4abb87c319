"""The memory layer: the fixed-address region and everything that lives in it.

- ``region``: map, attach, serve and close the region; page statistics;
- ``alloc``: malloc semantics and numpy arrays in the region;
- ``hooks`` and ``heap``: ``with clamor.heap():`` sends this thread's
  allocations (Python, numpy, extension modules' C heap) to the region;
- ``share``: can workers use an object in place? (``_pyshare`` reads the
  pointers Python cannot see);
- ``refs``: references to region data that travel by address;
- ``io``: system-call wrappers that read into region memory.

Imports only downwards: ``clamor.errors`` and ``clamor._native``.  It knows
nothing of the runtime; the runtime registers what it needs (a guard
against closing the region under an open Cluster).
"""
