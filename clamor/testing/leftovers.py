"""What processes leave behind in /dev/shm, and who removes it.

multiprocessing names its POSIX semaphores ``/dev/shm/sem.mp-*`` and its
shared memory blocks ``/dev/shm/psm_*``.  Made in a spawn or forkserver
context (Dask's nannies make their queues in one), a name stays until the
process that made it unlinks it (when the object is collected, or at exit),
or, should that process die first, until its resource tracker unlinks it,
once every process that shares the tracker is gone.  A SIGKILL to a whole
session or PID namespace (clamor/testing/nethosts.py's teardown, a benchmark's reap)
kills the tracker too, and the names stay for good.  So whoever kills
processes takes ``held_shm(pids)`` first and calls ``unlink_unheld(paths)``
once they are gone: the names of multiprocessing that no live process
holds any more are removed, as the tracker would have done.

Run as a script (``python leftovers.py watch PID``) it is the watcher of
tests/leftovers_plugin.py: it notes every name that appears in /dev/shm
while held by PID, a descendant of it, or a process whose environment
carries the run's mark (RUN_ENV), and, when a line arrives on its stdin,
prints those names as a JSON list and exits.

Linux only (/proc).  This module imports neither pytest nor psutil:
benchmarks import it too.
"""
import json
import os
import select
import sys
import time

SHM = "/dev/shm"
MP_PREFIXES = ("sem.mp-", "psm_")     # multiprocessing's names (semaphores, SharedMemory)
RUN_ENV = "PYTEST_LEFTOVERS_RUN"      # the mark of one test run's processes (not CLAMOR_*: helpers drop those)
NOTED_ENV = "PYTEST_LEFTOVERS_NOTED"  # a file the watcher keeps the names it noted in (for the check's own tests)
POLL = 0.2                            # seconds between two looks at /dev/shm
PATIENCE = 2.0                        # a new name nobody of ours holds for this long is not ours


def _pids():
    return [int(d) for d in os.listdir("/proc") if d.isdigit()]


def _stat(pid):
    """(ppid, pgrp) of ``pid``, or None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        return int(fields[1]), int(fields[2])
    except (OSError, IndexError, ValueError):
        return None


def descendants(pid):
    """The pids of the live processes below ``pid`` (not ``pid`` itself)."""
    kids = {}
    for p in _pids():
        st = _stat(p)
        if st is not None:
            kids.setdefault(st[0], []).append(p)
    out, todo = [], [pid]
    while todo:
        for k in kids.get(todo.pop(), ()):
            out.append(k)
            todo.append(k)
    return out


def group_pids(pgid):
    """The pids of the live processes in process group ``pgid``."""
    return [p for p in _pids() if (_stat(p) or (0, 0))[1] == pgid]


def marked(name, value, exclude=()):
    """The pids of the processes whose environment holds name=value."""
    want = f"{name}={value}".encode()
    out = []
    for p in _pids():
        if p in exclude:
            continue
        try:
            with open(f"/proc/{p}/environ", "rb") as f:
                if want in f.read().split(b"\0"):
                    out.append(p)
        except OSError:
            pass
    return out


def _key(st):
    return os.major(st.st_dev), os.minor(st.st_dev), st.st_ino


def _held_keys(pids):
    """(major, minor, inode) of each file under /dev/shm that ``pids`` map or
    hold open.  By inode, not path: sem_open() maps a file under a name of
    its own and links the semaphore's name to it after, so its maker's
    /proc/PID/maps shows a name that no longer exists."""
    keys = set()
    prefix = SHM + "/"
    for p in pids:
        try:
            with open(f"/proc/{p}/maps") as f:
                for line in f:
                    if prefix in line:
                        dev, ino = line.split(None, 5)[3:5]
                        major, minor = dev.split(":")
                        keys.add((int(major, 16), int(minor, 16), int(ino)))
            fds = os.listdir(f"/proc/{p}/fd")
        except (OSError, ValueError):
            continue
        for fd in fds:
            link = f"/proc/{p}/fd/{fd}"
            try:
                if os.readlink(link).startswith(prefix):
                    keys.add(_key(os.stat(link)))
            except OSError:
                continue
    return keys


def held_shm(pids):
    """The paths in /dev/shm whose files the processes ``pids`` map or hold open."""
    keys = _held_keys(pids)
    out = set()
    if keys:
        for name in os.listdir(SHM):
            path = os.path.join(SHM, name)
            try:
                if _key(os.stat(path)) in keys:
                    out.add(path)
            except OSError:
                continue
    return out


def unlink_unheld(paths):
    """Remove those of ``paths`` that are multiprocessing's names, still
    exist, and no live process holds; returns the paths removed."""
    cands = {p for p in paths if os.path.basename(p).startswith(MP_PREFIXES) and os.path.exists(p)}
    if not cands:
        return []
    cands -= held_shm(_pids())
    removed = []
    for p in sorted(cands):
        try:
            os.unlink(p)
            removed.append(p)
        except FileNotFoundError:
            pass
    return removed


def run_pids(root, mark=None):
    """``root``, its descendants and the processes with the run's mark (but
    this process)."""
    pids = {root, *descendants(root)}
    if mark:
        pids.update(marked(RUN_ENV, mark, exclude=pids))
    pids.discard(os.getpid())
    return pids


def watch(root, mark=None, out=sys.stdout, stop=sys.stdin):
    """Until a line (or the end) comes on ``stop``: note the names that
    appear in /dev/shm held by the run's processes; then write them to
    ``out`` as a JSON list.  Each look reads the maps of ``root`` and its
    descendants; the environments of every process (the run's mark, on
    processes no longer below ``root``) are read only for a name about to
    be given up.  Says "ready" on ``out`` once it knows what was there
    before; with NOTED_ENV set, keeps the names it has noted in that file
    (a test of the check waits for its name there)."""
    before = set(os.listdir(SHM))
    out.write("ready\n")
    out.flush()
    pending, ours = {}, set()
    me = os.getpid()
    noted = os.environ.get(NOTED_ENV)
    while True:
        ready, _, _ = select.select([stop], [], [], POLL)
        now = set(os.listdir(SHM))
        t = time.monotonic()
        for name in now - before - ours:
            pending.setdefault(name, t)
        for name in [n for n in pending if n not in now]:
            del pending[name]                 # gone again: nothing to attribute
        if pending:
            tree = {root, *descendants(root)} - {me}
            held = {os.path.basename(p) for p in held_shm(tree)}
            late = [n for n in pending if n not in held and t - pending[n] > PATIENCE]
            if late and mark:
                held |= {os.path.basename(p) for p in held_shm(marked(RUN_ENV, mark, exclude=tree | {me}))}
            for name in list(pending):
                if name in held:
                    ours.add(name)
                    del pending[name]
                    if noted:
                        with open(noted + ".new", "w") as f:
                            f.write("\n".join(sorted(ours)))
                        os.replace(noted + ".new", noted)
                elif name in late:
                    before.add(name)          # another user's, or gone from ours before we looked
                    del pending[name]
        if ready:
            break
    out.write(json.dumps(sorted(ours)) + "\n")
    out.flush()


if __name__ == "__main__":
    if len(sys.argv) < 3 or sys.argv[1] != "watch":
        raise SystemExit("usage: leftovers.py watch PID [MARK]")
    watch(int(sys.argv[2]), sys.argv[3] if len(sys.argv) > 3 else None)
