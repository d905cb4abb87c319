"""``python -m clamor.worker tcp://HOST:PORT``: the entry point of a worker
that joins a Cluster, as ``clamor worker`` (the code is
``clamor.runtime.worker``)."""
import sys

from .runtime.worker import main

if __name__ == "__main__":
    sys.exit(main())
