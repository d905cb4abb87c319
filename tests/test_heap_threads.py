"""clamor's own threads in the driver keep out of heap() blocks.

CPython's free lists are shared by every thread.  The driver's control
endpoint answers handshakes in a thread of its own (the Guard); what it
frees while the main thread is inside clamor.heap() went to the free lists
the block's next objects came from, outside the region, and share()
refused a list the block had built (seen under load, as a worker's
handshake landed in a block right after Cluster.start()).  The gate in
csrc/pygate.c holds the Guard until the block ends.

Each scenario runs a driver in its own interpreter; the handshake comes
from another process, so that no Python code of the driver runs but the
Guard's.
"""
from helpers import scenario

MEMBER = """
import subprocess, sys
SECRET = "gate-test-secret-0123456789abcdef"

def member_connects_in(delay, endpoint):
    # another process that holds the secret connects after ``delay`` s and
    # stays (a handshake, nothing sent)
    code = ("import time, zmq\\n"
            "from clamor.runtime.security import Security\\n"
            f"time.sleep({delay})\\n"
            "ctx = zmq.Context()\\n"
            "d = ctx.socket(zmq.DEALER)\\n"
            f"Security({SECRET!r}).client(d)\\n"
            f"d.connect({endpoint!r})\\n"
            "time.sleep(30)\\n")
    return subprocess.Popen([sys.executable, "-c", code])

def admitted_after(cl, n, timeout=15):
    deadline = time.monotonic() + timeout
    while cl._guard.admitted < n and time.monotonic() < deadline:
        time.sleep(0.02)
    return cl._guard.admitted
"""


def test_a_handshake_during_a_block_waits_and_the_block_keeps_its_lists_in_the_region():
    out = scenario(MEMBER + """
with clamor.Cluster(workers=1, progress=False, secret=SECRET) as cl:
    before = cl._guard.admitted
    peer = member_connects_in(0.3, cl.endpoint)
    try:
        with clamor.heap():
            time.sleep(3.0)                     # the peer's handshake arrives meanwhile
            objs = [[i, float(i) + 0.5, (i, str(i))] for i in range(3000)]
            during = cl._guard.admitted
        after = admitted_after(cl, before + 1)
        outside = [i for i, o in enumerate(objs) if not region.contains(id(o))][:5]
        shared = attempt(clamor.share, objs)
        got = cl.parallelize(range(2), 2).map(lambda k: sum(o[1] for o in objs[k::2])).collect()
    finally:
        peer.kill()
print(json.dumps({"before": before, "during": during, "after": after, "outside": outside,
                  "list": region.contains(id(objs)), "shared": shared, "got": got}))
""", timeout=120)
    assert out["during"] == out["before"], out          # the Guard waited for the block
    assert out["after"] == out["before"] + 1, out       # and then admitted the member
    assert out["list"] and out["outside"] == [], out
    assert out["shared"][0] == "ok", out
    assert out["got"] == [sum(i + 0.5 for i in range(k, 3000, 2)) for k in range(2)], out


def test_a_handshake_while_a_cluster_starts_inside_a_block_is_answered():
    """Cluster.start() inside a block suspends it; the Guard must answer
    the workers' handshakes then, or start() waits for nothing."""
    out = scenario(MEMBER + """
with clamor.heap():
    with clamor.Cluster(workers=2, progress=False, secret=SECRET, start_timeout=30) as cl:
        inner = [[i] for i in range(100)]
        got = cl.range(4).map(lambda i: i * 2).collect()
        n = len(cl.worker_pids)
print(json.dumps({"got": got, "workers": n, "inner": all(region.contains(id(x)) for x in inner)}))
""", timeout=120)
    assert out == {"got": [0, 2, 4, 6], "workers": 2, "inner": True}, out


def test_closing_a_cluster_from_another_thread_during_a_block_does_not_hang():
    """The Guard waits for a block to end; stopping it from another thread
    while the block stays open aborts the wait."""
    out = scenario(MEMBER + """
cl = clamor.Cluster(workers=1, progress=False, secret=SECRET).start()
guard = cl._guard
with clamor.heap():
    t = threading.Thread(target=cl.close)
    t.start()
    t.join(40)
    closed = not t.is_alive()
    guard_gone = not guard.is_alive()
print(json.dumps({"closed": closed, "guard_gone": guard_gone, "workers": len(cl.worker_pids)}))
""", timeout=120)
    assert out["closed"] and out["guard_gone"], out


def test_nested_and_suspended_blocks_keep_the_gate_count():
    """Only a thread's outermost block counts; suspended() opens it for
    the while; an error in the block leaves it open."""
    out = scenario("""
from clamor._native import lib
seen = [lib.clamor_py_gate_blocks()]
with clamor.heap():
    seen.append(lib.clamor_py_gate_blocks())
    with clamor.heap():
        seen.append(lib.clamor_py_gate_blocks())
        with clamor.heap.suspended():
            seen.append(lib.clamor_py_gate_blocks())
        seen.append(lib.clamor_py_gate_blocks())
    seen.append(lib.clamor_py_gate_blocks())
try:
    with clamor.heap():
        raise KeyError("in the block")
except KeyError:
    pass
seen.append(lib.clamor_py_gate_blocks())
print(json.dumps(seen))
""")
    assert out == [0, 1, 1, 0, 1, 1, 0], out


LOOPER = """
import logging, sys
from clamor.memory import gate

class Settles(logging.Handler):
    # the warning of a block that went on without a resident that did not park
    def __init__(self):
        super().__init__()
        self.timeouts = 0
    def emit(self, record):
        self.timeouts += "did not pause" in record.getMessage()

settles = Settles()
logging.getLogger("clamor.heap").addHandler(settles)

class Looper:
    # a thread that runs a plain loop, as Dask's profiler does: it sleeps a
    # millisecond, then makes and frees lists and dicts
    def __init__(self, profiler=None):
        self.turns, self.events, self.stop, self.own = 0, 0, False, None
        self.started = threading.Event()
        self.t = threading.Thread(target=self.run, args=(profiler,), daemon=True)
        self.t.start()
        self.started.wait()

    def run(self, profiler):
        if profiler:
            sys.setprofile(self.count)
        self.started.set()
        while not self.stop:
            time.sleep(0.001)
            junk = [[i, {"k": i}] for i in range(20)]
            del junk
            self.turns += 1
        self.own = sys.getprofile()
        sys.setprofile(None)

    def count(self, frame, event, arg):
        self.events += 1
"""


def test_a_thread_running_a_plain_loop_is_parked_by_its_knock_and_keeps_its_profiler():
    """A resident with no event loop (knock None) is parked at its next call
    by a one-shot profile hook: it runs no turn while a block is open, and
    the profile function it had is put back and still called."""
    out = scenario(LOOPER + """
plain, profiled = Looper(), Looper(profiler=True)
rs = [gate.keep_out(plain.t.ident, None, "plain"), gate.keep_out(profiled.t.ident, None, "profiled")]
frozen, outside = [], 0
for b in range(20):
    with clamor.heap():
        a = (plain.turns, profiled.turns)
        time.sleep(0.02)                 # the GIL is free: a thread not parked runs 10 turns
        made = [[i, float(i)] for i in range(200)] + [{"i": i} for i in range(200)]
        frozen.append((plain.turns, profiled.turns) == a)
    outside += sum(not region.contains(id(o)) for o in made)
before = (plain.turns, profiled.turns, profiled.events)
time.sleep(0.1)
after = (plain.turns, profiled.turns, profiled.events)
for r in rs:
    gate.let_in(r)
plain.stop = profiled.stop = True
plain.t.join(5); profiled.t.join(5)
print(json.dumps({"frozen": frozen, "outside": outside, "timeouts": settles.timeouts,
                  "runs_after": [y > x for x, y in zip(before, after)],
                  "own": [plain.own is None, profiled.own == profiled.count]}))
""")
    assert out["frozen"] == [True] * 20, out
    assert out["outside"] == 0, out
    assert out["runs_after"] == [True, True, True], out     # both run between blocks, the profiler is called
    assert out["own"] == [True, True], out
    assert out["timeouts"] == 0, out     # no block went on without them after 10 s


def test_a_knocked_thread_that_ended_is_let_in_without_a_wait():
    out = scenario(LOOPER + """
from clamor._native import lib
lo = Looper()
r = gate.keep_out(lo.t.ident, None, "gone")
lo.stop = True
lo.t.join(5)
with clamor.heap():
    x = [1, 2]
print(json.dumps({"timeouts": settles.timeouts, "listed": id(r) in gate._residents, "esrch": lib.clamor_py_knock(lo.t.ident, r._abort, 0)}))
""")
    assert out["timeouts"] == 0, out     # the block did not wait 10 s for it
    assert out["listed"] is False, out
    assert out["esrch"] == -3, out       # ESRCH: no thread of that ident
