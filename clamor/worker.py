"""``python -m clamor.worker --driver ENDPOINT``: the entry point of a worker
started by hand (the code is ``clamor.runtime.worker``)."""
import sys

from .runtime.worker import main

if __name__ == "__main__":
    sys.exit(main())
