"""The hash seed of portable objects: a dict or set keyed by str or bytes
stores hashes CPython seeds per process, and a worker not forked from the
driver reads it right only with the driver's seed (see
``clamor.memory.portable``).
"""
import ctypes
import datetime
import hashlib
import os


_HASHED_BY_SEED = (str, bytes, datetime.date, datetime.time)   # (a date's hash is its bytes')


def hash_digest():
    """A digest of this interpreter's str/bytes hash secret (equal in two
    processes iff their str hashes agree)."""
    secret = (ctypes.c_char * 24).in_dll(ctypes.pythonapi, "_Py_HashSecret")
    return hashlib.blake2b(bytes(secret), digest_size=16).hexdigest()


def seed_passes_on():
    """Whether workers started from this process's environment get its
    hash secret: PYTHONHASHSEED is set to a number."""
    return os.environ.get("PYTHONHASHSEED", "random").isdigit()


def _seeded(k, depth=0):
    if isinstance(k, _HASHED_BY_SEED):
        return True
    if isinstance(k, (tuple, frozenset)) and depth < 8:
        return any(_seeded(x, depth + 1) for x in k)
    return False


def seed_message(path):
    return (f"{path} is a dict or set keyed by str or bytes, whose hashes CPython seeds per process: a worker not "
            f"forked from the driver reads it right only with the driver's seed.  Start the driver with "
            f"PYTHONHASHSEED set (for example PYTHONHASHSEED=0 python job.py): a Cluster passes it to the workers "
            f"it spawns; give hand-started workers the same")
