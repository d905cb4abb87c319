"""Fault-path scenarios: workers read driver memory page by page.

Each test runs a driver in a subprocess (see helpers.run_py); the driver
runs a clamor.Cluster whose workers are forked, spawned, or started by
hand, and calls functions on them with ``Cluster.run``.
"""
import json
import signal
from concurrent.futures import ThreadPoolExecutor

import pytest

from helpers import PRELUDE, flag_waiter

# Every test with workers that map the driver's pages and with workers that
# fetch them (conftest.same_host); those about the fetch itself, fetch only.
pytestmark = pytest.mark.usefixtures("same_host")


def test_random_reads_on_worker_equal_driver_values(py, same_host):
    p = py(PRELUDE + """
a = clamor.array(np.random.default_rng(0).standard_normal(1 << 22))   # 32 MiB: 512 pages
idx = np.random.default_rng(1).integers(0, a.size, 2500)               # ~5 a page: ~1 page in 130 unread
with clamor.Cluster(workers=1, start_method="spawn", progress=False, speculation=False) as cl:
    def f(r, idx):
        x = r.get()
        return x[idx].copy(), clamor.stats()
    got, st = cl.run(f, clamor.ref(a), idx)[0]
assert np.array_equal(got, a[idx]), "values differ"
assert st["faults"] > 0 and st["pages_fetched"] + st["pages_mapped"] > 0
assert st["bytes_fetched"] < a.nbytes, "sparse reads must not move the whole array"
print(json.dumps(st))
""", check=True)
    st = json.loads(p.stdout.strip().splitlines()[-1])
    assert st["fetch_errors"] == 0
    if same_host == "map":   # a spawned worker on the driver's host maps, copies nothing
        assert st["pages_mapped"] > 0 and st["bytes_fetched"] == 0, st
    else:
        assert st["pages_mapped"] == 0 and st["pages_fetched"] > 0, st


@pytest.mark.fetch_path
def test_many_threads_fault_one_page_fetch_it_once(py):
    py(PRELUDE + """
a = clamor.array(np.arange(1 << 22, dtype=np.int64))   # 32 MiB, 512 pages
with clamor.Cluster(workers=1, progress=False, speculation=False) as cl:
    def f(r):
        clamor.configure(readahead=0)
        x = r.get()
        before = clamor.stats()["pages_fetched"]
        n = 32
        barrier = threading.Barrier(n)
        out = [None] * n
        def reader(i):
            barrier.wait()
            out[i] = int(x[100000 + i])          # same 64 KiB page for all
        threads = [threading.Thread(target=reader, args=(i,)) for i in range(n)]
        [t.start() for t in threads]; [t.join() for t in threads]
        one = clamor.stats()["pages_fetched"] - before
        # different pages at once: each thread its own page
        barrier2 = threading.Barrier(n)
        out2 = [None] * n
        def reader2(i):
            barrier2.wait()
            out2[i] = int(x[(i + 20) * 8192 * 2])   # page i+40
        threads = [threading.Thread(target=reader2, args=(i,)) for i in range(n)]
        [t.start() for t in threads]; [t.join() for t in threads]
        many = clamor.stats()["pages_fetched"] - before - one
        return out, out2, one, many
    out, out2, one, many = cl.run(f, clamor.ref(a))[0]
assert out == [100000 + i for i in range(32)], out
assert out2 == [(i + 20) * 16384 for i in range(32)], out2
assert one == 1, f"one page fetched {one} times"
assert many == 32, f"{many} pages fetched for 32 distinct pages"
""", check=True)


def test_numpy_and_scipy_loops_holding_the_gil_fault_fine(py):
    py(PRELUDE + """
a = clamor.array(np.random.default_rng(2).random((2000, 500)))
with clamor.Cluster(workers=1, progress=False) as cl:
    def f(r):
        x = r.get()
        return float(x.sum()), x.mean(axis=0), float(np.linalg.norm(x[::7]))
    s, m, n = cl.run(f, clamor.ref(a))[0]
assert s == float(a.sum()) and np.array_equal(m, a.mean(axis=0)) and n == float(np.linalg.norm(a[::7]))
""", check=True)


@pytest.mark.fetch_path
def test_sequential_scan_uses_read_ahead(py):
    p = py(PRELUDE + """
a = clamor.array(np.arange(1 << 24, dtype=np.float64))   # 128 MiB, 2048 pages
with clamor.Cluster(workers=1, progress=False, speculation=False) as cl:
    def f(r, ra):
        clamor.configure(readahead=ra)
        clamor.reset_stats()
        s = float(r.get().sum())
        return s, clamor.stats()
    s, st = cl.run(f, clamor.ref(a), 8 << 20)[0]
assert s == float(a.sum())
print(json.dumps(st))
""", check=True)
    st = json.loads(p.stdout.strip().splitlines()[-1])
    # 2048 pages of array (plus one if it straddles), and read-ahead may run
    # at most one window past its end
    assert 2048 <= st["pages_fetched"] <= 2049 + (8 << 20) // 65536, st
    assert st["readahead_pages"] > 1500, st
    assert st["faults"] < 400, st


def test_region_pages_start_absent_in_forked_worker_and_driver_writes_stay_out(py, tmp_path):
    # A forked worker's region is memory of its own, every page absent at
    # first, so a driver write never reaches it through shared memory.  The
    # driver writes page 0 while the stage runs, once the worker holds it:
    # for the rest of that stage the worker still sees the old bytes, in
    # the page it holds and in one it fetches after the write (a page
    # request is answered as its stage sees the page).  The next stage
    # drops the changed pages on the worker and sees the write.
    py(PRELUDE + f"""
import time
a = clamor.array(np.zeros(1 << 20))        # 8 MiB
a[:] = 1.0
far = 1 << 19                              # 4 MiB further: a page the worker has not read
""" + flag_waiter(tmp_path, 0.01) + f"""def writer():
    wait_for("read")
    a[0] = 2.0                             # the worker holds page 0 already
    a[far] = 2.0
    say("written")
with clamor.Cluster(workers=1, progress=False, speculation=False) as cl:
    def first(r):
        clamor.configure(readahead=0)
        x = r.get()
        before = clamor.stats()["faults"]
        v = float(x[0])
        faults = clamor.stats()["faults"] - before
        say("read")
        wait_for("written")
        return v, faults, float(x[0]), float(x[far])
    t = threading.Thread(target=writer)
    t.start()
    v, faults, held, fetched = cl.run(first, clamor.ref(a))[0]
    t.join()
    assert v == 1.0 and faults >= 1, (v, faults)
    assert held == 1.0, "worker saw a later driver write through shared memory"
    assert fetched == 1.0, "a page fetched during a stage showed a driver write made while it ran"
    def again(r):
        x = r.get()
        return float(x[0]), float(x[far])
    assert cl.run(again, clamor.ref(a))[0] == (2.0, 2.0), "the next stage missed the driver's writes"
""", check=True)


@pytest.mark.fetch_path
def test_worker_page_server_serves_held_pages_to_peers(py):
    py(PRELUDE + """
import zmq, struct
a = clamor.array(np.arange(1 << 20, dtype=np.float64))
ps = region.page_size()
with clamor.Cluster(workers=1, start_method="spawn", progress=False, speculation=False) as cl:
    def touch(r):
        clamor.configure(readahead=0)
        x = r.get(); return float(x[0]), region.server_endpoint()   # page holding x[0] now held
    v, ep = cl.run(touch, clamor.ref(a))[0]
    assert v == 0.0
    stage = region.version_current()              # the stage the worker is in, as a peer's request says
    from clamor.runtime.security import Security
    ctx = zmq.Context(); s = ctx.socket(zmq.DEALER); Security(cl.secret).client(s); s.connect(ep)   # a member
    first = (a.ctypes.data - region.base()) // ps
    def get(idx, tag):
        s.send(struct.pack("<IBBHIIQII", 0x524d4c43, 1, 1, 0, 0, stage, idx, 1, tag))
        assert s.poll(5000)
        return s.recv_multipart()
    hdr, body = get(first, 1)
    typ, status = hdr[5], struct.unpack("<I", hdr[8:12])[0]
    assert typ == 2 and status == 0, (typ, status)
    off = a.ctypes.data - region.base() - first * ps
    assert np.frombuffer(body, np.float64)[off // 8] == 0.0
    hdr, text = get(first + 5, 2)                # not touched by the worker
    assert hdr[5] == 3 and struct.unpack("<I", hdr[8:12])[0] == 11, "expected EAGAIN"  # EAGAIN
    s.close(); ctx.term()
""", check=True)


def test_ipc_transport(py, tmp_path):
    py(PRELUDE + f"""
region.init()
ep = region.serve("ipc://{tmp_path}/pages")
a = clamor.array(np.arange(100000, dtype=np.int32))
with clamor.Cluster(workers=1, start_method="spawn", progress=False) as cl:
    assert cl.page_endpoint == ep, cl.page_endpoint
    assert cl.run(lambda r: int(r.get().sum()), clamor.ref(a)) == [int(a.sum())]
""", check=True)


def test_unallocated_page_is_a_clear_fatal_error(py):
    p = py(PRELUDE + """
a = clamor.array(np.arange(1000.0))
with clamor.Cluster(workers=1, progress=False, replace_workers=False) as cl:
    def wild():
        x = clamor.view(region.base() + (1 << 30), np.float64, (10,))
        return float(x[0])
    try:
        cl.run(wild)
    except clamor.WorkerLost as e:
        print("LOST", e)
""", timeout=60)
    assert "LOST" in p.stdout, p.stdout + p.stderr
    assert "clamor: fatal: access to region offset 0x40000000" in p.stderr, p.stderr
    assert "never allocated" in p.stderr, p.stderr


@pytest.mark.fetch_path
def test_driver_gone_ends_in_a_fatal_error_not_a_hang(py, tmp_path):
    """A worker started by hand reads a page, its driver is killed, and it
    reads the next page: no one serves it, and the fetch timeout ends the
    worker with a fatal error."""
    p = py(PRELUDE + flag_waiter(tmp_path) + """
import subprocess, time
a = clamor.array(np.arange(1 << 20, dtype=np.float64))
r = clamor.ref(a)
cl = clamor.Cluster(workers=0, remote=1, progress=False, speculation=False)
cl.join_command()
# a worker started by hand, as a remote one is: not tied to the driver's process
env = {k: v for k, v in os.environ.items() if k not in ("CLAMOR_PARENT_PID", "CLAMOR_LIFELINE_FD")}
env.update(CLAMOR_FETCH_TIMEOUT_MS="1500", CLAMOR_DIE_WITH_PARENT="0", CLAMOR_SECRET=cl.secret)
proc = subprocess.Popen([sys.executable, "-m", "clamor.worker", "--driver", cl.endpoint], env=env)
cl.start()
pid = cl.worker_pids[0]
assert pid == proc.pid, (pid, proc.pid)
def later(r):
    import time, os
    clamor.configure(readahead=0)
    x = r.get()
    first = float(x[0])
    driver = os.getppid()
    say("read")
    # the driver is killed while we wait; the next page has nobody to serve it
    deadline = time.monotonic() + 30
    while os.getppid() == driver and time.monotonic() < deadline:
        time.sleep(0.01)
    return float(x[-1])
threading.Thread(target=cl.run, args=(later, r), daemon=True).start()
wait_for("read")
print("WORKER", pid, flush=True)
os.kill(os.getpid(), 9)
""", timeout=60)
    assert p.returncode == -signal.SIGKILL
    pid = int(p.stdout.split("WORKER")[1].split()[0])
    import psutil, time
    deadline = time.monotonic() + 20
    while psutil.pid_exists(pid) and time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                break
        except psutil.NoSuchProcess:
            break
        time.sleep(0.2)
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE, \
        "worker outlived its driver"
    assert "clamor: fatal" in p.stderr and "fetch timeout" in p.stderr, p.stderr


def test_local_spawned_worker_dies_with_its_driver(py):
    p = py(PRELUDE + """
a = clamor.array(np.arange(1000.0))
cl = clamor.Cluster(workers=1, start_method="spawn", progress=False).start()
print("WORKER", cl.worker_pids[0], flush=True)
os.kill(os.getpid(), 9)
""", timeout=60)
    import psutil, time
    pid = int(p.stdout.split("WORKER")[1].split()[0])
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                break
        except psutil.NoSuchProcess:
            break
        time.sleep(0.1)
    else:
        raise AssertionError("a local worker outlived its driver by 5 s")


# A page server of our own, put in the driver's place for a spawned worker:
# it answers every GET with a byte pattern of the page's index, one page
# (`short`) with a frame one byte short, and with the relocations frame the
# worker asked for (RELOCS: a list of (word, target, value) per reply).
# With SPARSE (a function of the pages' first index and count) set, a GET
# that takes sparse data gets the frame SPARSE returns, flagged sparse.
FAKE_SERVER = PRELUDE + """
import struct, zmq
SPARSE = globals().get("SPARSE")
from clamor.runtime.security import Guard, Security
region.init()
a = clamor.array(np.zeros(1 << 20, dtype=np.uint8))     # 16 pages of 64 KiB
ps = region.page_size()
first = (a.ctypes.data - region.base()) // ps
short = first + 9
cl = clamor.Cluster(workers=1, start_method="spawn", progress=False, speculation=False, replace_workers=False)
cl.join_command()                      # the control socket and page server are open, the workers not started yet
real = cl.page_endpoint
sec = Security(cl.secret)              # our page server is one of the cluster's: it holds the secret
ctx = zmq.Context()
guard = Guard(ctx, sec, "fake page server"); guard.start()
fake = ctx.socket(zmq.ROUTER); sec.server(fake); port = fake.bind_to_random_port("tcp://127.0.0.1")
up = ctx.socket(zmq.DEALER); sec.client(up); up.connect(real)
stop = threading.Event()
def serve():
    while not stop.is_set():
        if not fake.poll(100):
            continue
        frames = fake.recv_multipart()
        ident, hdr = frames[0], frames[1]
        magic, ver, typ, flags, status, stage, idx, count, tag = struct.unpack("<IBBHIIQII", hdr)
        if typ == 4:                                        # HELLO: the real geometry
            up.send(hdr); frames_up = up.recv_multipart()
            fake.send_multipart([ident] + frames_up)
        elif typ == 1:                                      # GET: our own bytes
            body = b"".join(bytes([(i % 251) + 1]) * ps for i in range(idx, idx + count))
            if idx <= short < idx + count:
                body = body[:-1]
            rel = flags & 32                                # the worker relocates: send a list
            sparse = 64 if SPARSE and flags & 64 else 0
            if sparse:
                body = SPARSE(idx, count)
            rep = struct.pack("<IBBHIIQII", magic, ver, 2, rel | sparse, 0, stage, idx, count, tag)
            extra = [struct.pack("<I", len(RELOCS)) + b"".join(struct.pack("<IIQ", *e) for e in RELOCS)] if rel else []
            fake.send_multipart([ident, rep, body] + extra)
t = threading.Thread(target=serve, daemon=True); t.start()
cl.page_endpoint = f"tcp://127.0.0.1:{port}"   # the workers are sent to our page server instead of the real one
def read(r, pages):
    clamor.configure(readahead=0)
    x = r.get()
    return [[int(x[k * ps]), int(x[k * ps + ps - 1])] for k in pages]
"""


@pytest.mark.fetch_path
def test_pages_land_whole_at_their_offset_and_a_short_reply_is_fatal(py):
    # The pager writes each reply into the worker's memfd at the pages' offset
    # (pwrite) before it opens them.  The pattern must arrive whole at the
    # right pages, and the short reply must end in the malformed-reply fatal
    # error, never in a page opened half-written.
    p = py("RELOCS = []\n" + FAKE_SERVER + """
with cl:
    got = cl.run(read, clamor.ref(a), [0, 3, 4, 15])[0]
    want = [[((first + k) % 251) + 1] * 2 for k in (0, 3, 4, 15)]
    assert got == want, (got, want)
    print("PATTERN OK", flush=True)
    try:
        cl.run(read, clamor.ref(a), [9])
    except clamor.WorkerLost as e:
        print("LOST", e, flush=True)
stop.set(); t.join()
""", timeout=90)
    assert "PATTERN OK" in p.stdout, p.stdout + p.stderr
    assert "LOST" in p.stdout, p.stdout + p.stderr
    assert "malformed reply from the page server" in p.stderr, p.stderr


# Sparse frames for the fake page server: each page's first and last words
# hold its byte pattern, every other word is zero; or a malformed frame.
SPARSE_FRAMES = """
def run(word, data):
    return struct.pack("<II", word, len(data) // 8) + data
def pattern(idx, count):
    w = ps // 8
    return b"".join(run(k * w, bytes([((idx + k) % 251) + 1]) * 8) + run(k * w + w - 1, bytes([((idx + k) % 251) + 1]) * 8)
                    for k in range(count))
BAD = {
    "overlapping runs": lambda idx, count: run(4, b"\\1" * 16) + run(5, b"\\2" * 8),
    "runs out of order": lambda idx, count: run(9, b"\\1" * 8) + run(2, b"\\2" * 8),
    "a run past the pages": lambda idx, count: run(count * ps // 8 - 1, b"\\1" * 16),
    "a truncated run": lambda idx, count: run(0, b"\\1" * 16)[:-8],
    "a run of no words": lambda idx, count: struct.pack("<II", 3, 0),
    "longer than half the pages": lambda idx, count: run(0, b"\\1" * (count * ps // 2)),
}
"""


@pytest.mark.fetch_path
def test_sparse_replies_expand_to_their_pages_and_a_malformed_one_is_fatal(py):
    """A worker asks for sparse data with every GET.  A sparse reply must
    expand to exactly its pages (the words it names, zeros elsewhere); a
    malformed one, of every kind, must end in the malformed-reply fatal
    error, never in pages opened with what it could make of it."""
    p = py("RELOCS = []\n" + PRELUDE + "import struct\nps = 1 << 16\n" + SPARSE_FRAMES +
           "SPARSE = pattern\n" + FAKE_SERVER + """
def words(r, pages):
    clamor.configure(readahead=0)
    x = r.get().view(np.uint64)
    w = ps // 8
    return [[int(x[k * w] & 0xff), int(x[k * w + w - 1] & 0xff), int(np.count_nonzero(x[k * w:(k + 1) * w]))]
            for k in pages]
with cl:
    got = cl.run(words, clamor.ref(a), [0, 3, 4, 15])[0]
    want = [[((first + k) % 251) + 1, ((first + k) % 251) + 1, 2] for k in (0, 3, 4, 15)]
    assert got == want, (got, want)
    print("SPARSE OK", flush=True)
stop.set(); t.join()
""", timeout=90)
    assert "SPARSE OK" in p.stdout, p.stdout + p.stderr

    def malformed(kind):
        return kind, py("RELOCS = []\n" + PRELUDE + "import struct\nps = 1 << 16\n" + SPARSE_FRAMES +
                        f"SPARSE = BAD[{kind!r}]\n" + FAKE_SERVER + """
with cl:
    try:
        cl.run(read, clamor.ref(a), [2])
        print("READ A MALFORMED REPLY", flush=True)
    except clamor.WorkerLost as e:
        print("LOST", e, flush=True)
stop.set(); t.join()
""", timeout=90)
    kinds = ("overlapping runs", "runs out of order", "a run past the pages", "a truncated run",
             "a run of no words", "longer than half the pages")
    with ThreadPoolExecutor(3) as pool:          # each a driver, a fake server and a worker of its own
        runs = list(pool.map(malformed, kinds))
    for kind, p in runs:
        assert "LOST" in p.stdout and "READ A MALFORMED" not in p.stdout, (kind, p.stdout + p.stderr)
        assert "malformed reply from the page server" in p.stderr, (kind, p.stderr)


@pytest.mark.fetch_path
def test_relocations_that_cannot_apply_are_a_clear_fatal_error(py):
    """A spawned worker asks for each page's relocations.  A list that
    names a target the worker never bound, or a word past the reply,
    fails the access with its reason: the page is never opened half
    relocated."""
    for relocs, says in (("[(3, 77, 0x7f0000001000)]", "name a target this worker has not bound"),
                         ("[(1 << 20, 0, 0)]", "malformed reply from the page server")):
        p = py(f"RELOCS = {relocs}\n" + FAKE_SERVER + """
with cl:
    try:
        cl.run(read, clamor.ref(a), [2])
    except clamor.WorkerLost as e:
        print("LOST", e, flush=True)
stop.set(); t.join()
""", timeout=90)
        assert "LOST" in p.stdout, p.stdout + p.stderr
        assert says in p.stderr, p.stderr


def test_a_region_block_grown_on_a_worker_becomes_a_private_copy(py):
    """A list built under heap() is appended to in a task: its item array is
    reallocated on the worker, which keeps a private copy.  Only the driver
    knows the old block's size; the copy must not read past it into pages
    the driver never allocated (that killed the worker)."""
    p = py(PRELUDE + """
n = 200000
with clamor.Cluster(workers=1, progress=False, recover=False) as cl:
    with clamor.heap():
        L = [7] * n                      # its item array is the last region block
    def task(i):
        L.append(1)
        L.extend(range(10))
        return [len(L), L[0], L[n - 1], L[n], sum(L[n:])]
    got = cl.range(1, partitions=1).map(task).collect()
print(json.dumps({"got": got, "driver_len": len(L)}))
""", timeout=120)
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout.strip().splitlines()[-1])
    assert out == {"got": [[200011, 7, 7, 1, 46]], "driver_len": 200000}, out


@pytest.mark.fetch_path
def test_a_failed_fetch_is_tried_again_by_the_next_access(py):
    """A prefetch that timed out left its pages in the error state for good:
    the next prefetch failed at once and a plain touch ended the worker."""
    p = py(PRELUDE + """
a = clamor.array(np.arange(1 << 25, dtype=np.int64))      # 256 MiB
with clamor.Cluster(workers=1, progress=False) as cl:
    def f(r):
        x = r.get()
        out = {}
        clamor.configure(fetch_timeout=0.001)
        try:
            clamor.prefetch(x)
            out["first"] = "ok"
        except clamor.PageFetchError:
            out["first"] = "timed out"
        clamor.configure(fetch_timeout=30)
        out["touch"] = int(x[0]) + int(x[-1])
        clamor.prefetch(x)
        out["sum"] = int(x.sum())
        return out
    res = cl.run(f, clamor.ref(a))[0]
print(json.dumps(res))
""", timeout=180)
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout.strip().splitlines()[-1])
    n = 1 << 25
    assert out["touch"] == n - 1 and out["sum"] == n * (n - 1) // 2, out
    assert out["first"] == "timed out", out       # the scenario happened
