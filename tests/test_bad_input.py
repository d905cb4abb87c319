"""Bad input and wrong states at the public API: each gets a typed error,
and the process, the region and the cluster stay usable.

Every scenario runs in its own interpreter (some of these used to crash it),
and prints one JSON line of what it saw.
"""
from helpers import scenario


# ---- arrays, views, prefetch, configure --------------------------------------------

def test_view_checks_its_span_and_shape():
    out = scenario("""
        a = clamor.zeros(16, "i4"); a[:] = np.arange(16)
        raw = a.ctypes.data
        res = {
            "outside": attempt(clamor.view, 0x1000, "f8", 10),
            "runs past the end": attempt(clamor.view, region.base() + region.size() - 8, "f8", 2),
            "negative dim": attempt(clamor.view, raw, "u1", -1),
            "strides count": attempt(clamor.view, raw, "i4", (4, 4), strides=(4,)),
            "numpy int shape": clamor.view(raw, "i4", np.int64(4)).tolist(),
            "reversed": clamor.view(raw + 60, "i4", (4,), strides=(-4,)).tolist(),
            "below the block": attempt(clamor.view, raw + 60, "i4", (4,), strides=(-4,), owned=True),
        }
        print(json.dumps(res))
        """)
    for k in ("outside", "runs past the end", "below the block"):
        assert out[k][0] == "InvalidPointer" and out[k][2], (k, out[k])
    assert out["negative dim"][0] == "InvalidSize"
    assert out["strides count"][0] == "InvalidSize"
    assert out["numpy int shape"] == [0, 1, 2, 3]
    assert out["reversed"] == [15, 14, 13, 12]


def test_array_constructors_check_align_and_take_numpy_ints():
    out = scenario("""
        res = {f"align {a!r}": attempt(clamor.empty, 3, align=a) for a in (3, -1, 0, 1.5, None, True)}
        res["align 4096"] = clamor.empty(3, align=4096).ctypes.data % 4096
        res["numpy shape"] = list(clamor.zeros(np.int64(3)).shape)
        print(json.dumps(res))
        """)
    for k, v in out.items():
        if k.startswith("align ") and k != "align 4096":
            assert v[0] == "InvalidSize" and v[2], (k, v)
    assert out["align 4096"] == 0
    assert out["numpy shape"] == [3]


def test_prefetch_and_configure_reject_what_the_core_cannot_hold():
    out = scenario("""
        res = {
            "strided": attempt(clamor.prefetch, clamor.zeros((4, 4)).T),
            "huge size": attempt(clamor.prefetch, region.base() if region.size() else 0, 2**70),
            "bool": attempt(clamor.prefetch, True),
            "inf timeout": attempt(clamor.configure, fetch_timeout=float("inf")),
            "nan timeout": attempt(clamor.configure, fetch_timeout=float("nan")),
            "long timeout": attempt(clamor.configure, fetch_timeout=1e30),
            "huge readahead": attempt(clamor.configure, readahead=2**70),
            "huge mappings": attempt(clamor.configure, max_mappings=2**63),
            "huge region": attempt(region.init, size=1 << 70),
        }
        res["unchanged"] = clamor.configure()["fetch_timeout"]
        print(json.dumps(res))
        """)
    assert out["strided"] == ["ok", None]
    assert out["huge size"][0] == "InvalidSize"
    assert out["bool"][0] in ("TypeError", "InvalidPointer")
    for k in ("inf timeout", "nan timeout", "long timeout", "huge readahead", "huge mappings", "huge region"):
        assert out[k][0] == "ConfigError" and out[k][2], (k, out[k])
    assert out["unchanged"] > 0


# ---- connect --------------------------------------------------------------------------

def test_connect_checks_timeout_and_is_not_left_half_attached():
    out = scenario("""
        res = {"negative": attempt(clamor.connect, "tcp://127.0.0.1:1", timeout=-1),
               "text": attempt(clamor.connect, "tcp://127.0.0.1:1", timeout="x" * 1000),
               "endpoint type": attempt(clamor.connect, "tcp://127.0.0.1:1", serve_endpoint=5)}
        # a driver in a child process, and a port that is taken
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(r)
            region.init(size=1 << 30)
            ep = region.serve()
            os.write(w, ep.encode()); os.close(w)
            time.sleep(60)
            os._exit(0)
        os.close(w)
        ep = os.read(r, 256).decode()
        taken = socket.socket(); taken.bind(("127.0.0.1", 0)); taken.listen()
        busy = "tcp://127.0.0.1:%d" % taken.getsockname()[1]
        res["port taken"] = attempt(clamor.connect, ep, serve_endpoint=busy)
        res["role after"] = region.role()
        res["again"] = attempt(clamor.connect, ep)
        res["role now"] = region.role()
        os.kill(pid, signal.SIGKILL); os.waitpid(pid, 0)
        print(json.dumps(res))
        """)
    assert out["negative"][0] == "ConfigError" and out["negative"][2]
    assert out["text"][0] == "ConfigError" and len(out["text"][1]) < 120
    assert out["endpoint type"][0] == "ConfigError"
    assert out["port taken"][0] == "TransportError", out["port taken"]
    assert out["role after"] is None
    assert out["again"][0] == "ok" and out["role now"] == "worker"


# ---- closing the region --------------------------------------------------------------

def test_close_is_refused_inside_heap_and_while_heap_objects_live():
    out = scenario("""
        res = {}
        def in_heap():   # locals, not globals: the module's dict must not grow inside the block
            with clamor.heap():
                r = attempt(region.close)
                d = {"kept": list(range(10))}
            return [str(x) for x in r], d   # copies outside the region: r lives in it
        inside, d = in_heap()
        res["inside heap"] = inside
        res["built in heap"] = attempt(region.close)
        res["role"] = region.role()
        res["d intact"] = d == {"kept": list(range(10))}
        print(json.dumps(res))
        """)
    assert out["inside heap"][0] == "RegionInUse" and "inside clamor.heap()" in out["inside heap"][1]
    assert out["inside heap"][2] == "True"
    assert out["built in heap"][0] == "RegionInUse" and "still allocated" in out["built in heap"][1]
    assert out["role"] == "driver" and out["d intact"]


def test_close_is_refused_while_a_cluster_is_open_and_forced_otherwise():
    out = scenario("""
        res = {}
        a = clamor.full(1000, 2.0)
        c = clamor.Cluster(workers=1, progress=False).start()
        res["cluster open"] = attempt(region.close)
        res["cluster works"] = c.parallelize(list(range(10))).map(lambda i: float(a[i])).sum()
        c.close()
        res["array alive"] = attempt(region.close)
        res["forced"] = attempt(region.close, force=True)   # `a` must not be touched after this
        res["role after"] = region.role()
        print(json.dumps(res))
        """)
    assert out["cluster open"][0] == "RegionInUse" and "Cluster" in out["cluster open"][1]
    assert out["cluster works"] == 20.0
    assert out["array alive"][0] == "RegionInUse"
    assert out["forced"] == ["ok", None] and out["role after"] is None


# ---- the runtime inside heap() ----------------------------------------------------------

def test_serving_and_actions_inside_a_heap_block():
    out = scenario("""
        res = {}
        with clamor.heap():
            res["serve"] = region.serve().startswith("tcp://")
        region.stop_serving()
        c = clamor.Cluster(workers=2, progress=False).start()
        with clamor.heap():
            table = {i: i * i for i in range(100)}    # data the tasks read in place
            a = np.arange(100.0)
            xs = c.range(10)                           # a collection built in the block ...
            res["inside"] = c.parallelize(list(range(10))).map(lambda i: table[i] + a[i]).sum()
            res["still inside"] = clamor.heap_stats()["allocated"] > 0 and clamor.in_region(np.ones(3))
        res["after"] = xs.map(lambda i: table[i]).sum()  # ... used after it
        c.close()
        print(json.dumps(res))
        """)
    assert out["serve"] is True
    assert out["inside"] == sum(i * i + i for i in range(10))
    assert out["still inside"] is True
    assert out["after"] == sum(i * i for i in range(10))


# ---- collections -----------------------------------------------------------------------

def test_keys_that_compare_equal_meet_whatever_their_type():
    out = scenario("""
        from fractions import Fraction
        with clamor.Cluster(workers=2, progress=False) as c:
            pairs = c.range(12).map(lambda i: ((np.float32(0.5), 0.5, Fraction(1, 2))[i % 3], 1))
            res = {"reduced": [[float(k), v] for k, v in pairs.reduce_by_key(lambda a, b: a + b, partitions=3).collect()],
                   "ints": sorted([int(k), v] for k, v in c.range(12).map(lambda i: ((3, 3.0, np.int8(3), True)[i % 4], 1))
                                  .reduce_by_key(lambda a, b: a + b, partitions=5).collect()),
                   "joined": c.range(4).map(lambda i: (np.float32(0.5), i)).join(
                       c.range(4).map(lambda i: (0.5, i)), partitions=3).count()}
        print(json.dumps(res))
        """)
    assert out["reduced"] == [[0.5, 12]]
    assert out["ints"] == [[1, 3], [3, 9]]
    assert out["joined"] == 16


def test_collection_arguments_are_checked_on_the_driver():
    out = scenario("""
        import threading
        with clamor.Cluster(workers=1, progress=False) as c:
            xs = c.range(10)
            lock = threading.Lock()
            res = {
                "join int": attempt(xs.join, 5),
                "cogroup list": attempt(xs.cogroup, [1, 2]),
                "partitions float": attempt(xs.group_by_key, partitions=2.7),
                "partitions bool": attempt(xs.group_by_key, partitions=True),
                "partitions str": attempt(xs.group_by_key, partitions="a"),
                "map int": attempt(xs.map, 5),
                "reduce None": attempt(xs.reduce, None),
                "take str": attempt(xs.take, "a"),
                "take huge": attempt(xs.take, 10**20),
                "captures cluster": attempt(lambda: xs.map(lambda i: c).collect()),
                "captures lock": attempt(lambda: xs.map(lambda i: lock).collect()),
                "still works": xs.sum(),
            }
        print(json.dumps(res))
        """)
    for k in ("join int", "cogroup list", "map int", "reduce None", "take str"):
        assert out[k][0] == "TypeError", (k, out[k])
    for k in ("partitions float", "partitions bool", "partitions str"):
        assert out[k][0] == "ConfigError", (k, out[k])
    assert out["take huge"] == ["ok", list(range(10))]
    assert out["captures cluster"][0] == "NotSerializable" and "Cluster" in out["captures cluster"][1]
    assert out["captures lock"][0] == "NotSerializable" and "lock" in out["captures lock"][1]
    assert out["still works"] == 45


# ---- interrupted and failed actions ------------------------------------------------------

def test_an_interrupted_action_does_not_hold_back_the_next():
    """Ctrl-C in an action: the workers drop its queued tasks, so the next
    action waits at most for the tasks already running."""
    out = scenario("""
        c = clamor.Cluster(workers=2, slots=8, progress=False, speculation=False).start()
        def interrupt():
            time.sleep(1.0)
            signal.raise_signal(signal.SIGINT)
        threading.Thread(target=interrupt).start()
        t0 = time.monotonic()
        res = {"interrupted": attempt(lambda: c.range(40, partitions=40).map(lambda i: time.sleep(1.0)).collect())}
        res["interrupted after"] = time.monotonic() - t0
        t1 = time.monotonic()
        res["next"] = c.range(10).sum()
        res["next took"] = time.monotonic() - t1
        c.close()
        print(json.dumps(res))
        """)
    assert out["interrupted"][0] == "KeyboardInterrupt"
    assert out["next"] == 45
    # 40 one-second tasks on 2 workers: 20 s if the queued ones still ran;
    # at most the two running ones (about 1 s) if they were dropped
    assert out["next took"] < 5.0, out


def test_losing_every_worker_while_idle_fails_the_next_action_at_once():
    out = scenario("""
        c = clamor.Cluster(workers=2, replace_workers=False, progress=False).start()
        res = {"first": c.range(10).sum()}
        for pid in c.worker_pids:
            os.kill(pid, signal.SIGKILL)
        time.sleep(0.5)
        t0 = time.monotonic()
        res["next"] = attempt(c.range(10).sum)
        res["took"] = time.monotonic() - t0
        c.close()
        print(json.dumps(res))
        """)
    assert out["first"] == 45
    assert out["next"][0] == "WorkerLost" and "no live workers" in out["next"][1]
    assert out["took"] < 5.0, out


def test_a_lost_worker_is_reaped_at_once():
    out = scenario("""
        import psutil
        c = clamor.Cluster(workers=2, heartbeat_timeout=1.0, progress=False).start()
        res = {"first": c.range(10).sum()}
        stopped = c.worker_pids[0]
        os.kill(stopped, signal.SIGSTOP)   # no heartbeats: declared lost, then killed
        res["during"] = c.range(16, partitions=8).map(lambda i: (time.sleep(0.3), i)[1]).sum()   # (> 1 s)
        res["next"] = c.range(10).sum()
        res["zombies"] = [p.pid for p in psutil.Process().children()
                          if p.status() == psutil.STATUS_ZOMBIE]
        res["stopped gone"] = not psutil.pid_exists(stopped)
        res["lost"] = c.stats()["recovery"]["workers_lost"]
        c.close()
        print(json.dumps(res))
        """)
    assert out["first"] == 45 and out["during"] == 120 and out["next"] == 45
    assert out["lost"] >= 1
    assert out["zombies"] == [] and out["stopped gone"], out


def test_fromfile_reads_whole_items_and_serve_checks_the_port():
    out = scenario("""
        import tempfile
        res = {}
        with tempfile.TemporaryDirectory() as d:
            p = os.path.join(d, "short.bin")
            with open(p, "wb") as f:
                f.write(np.arange(3.0).tobytes() + b"xyz")     # three items and part of a fourth
            a = clamor.full(5, -1.0)
            res["regular"] = [clamor.fromfile(p, a), a.tolist()]
            r, w = os.pipe()
            os.write(w, np.arange(2.0).tobytes() + b"ab"); os.close(w)
            b = clamor.full(4, -1.0)
            with os.fdopen(r, "rb") as f:
                res["pipe"] = [clamor.fromfile(f, b), b.tolist()]
        res["port"] = attempt(region.serve, "tcp://127.0.0.1:70000")
        res["serving"] = region.server_endpoint()
        print(json.dumps(res))
        """)
    assert out["regular"] == [3, [0.0, 1.0, 2.0, -1.0, -1.0]]
    assert out["pipe"] == [2, [0.0, 1.0, -1.0, -1.0]]
    assert out["port"][0] == "TransportError" and "70000" in out["port"][1]
    assert out["serving"] == ""


def test_ctrl_c_never_tears_a_message_the_driver_reads():
    """SIGINT lands many times while a loop reads five-frame messages under
    the driver's deferral: every message arrives whole, none is lost."""
    out = scenario("""
        import zmq
        from clamor.runtime.interrupt import Deferred
        ctx = zmq.Context.instance()
        rx, tx = ctx.socket(zmq.PAIR), ctx.socket(zmq.PAIR)
        rx.bind("inproc://torn"); tx.connect("inproc://torn")
        N = 20000
        def send():
            for i in range(N):
                tx.send_multipart([b"%d" % i, b"b", b"c", b"d", b"e"])
        done, armed = threading.Event(), threading.Event()
        def interrupt():
            armed.wait()                         # (no press before the deferral, as Thread.start() still waits)
            for _ in range(200):
                if done.is_set():
                    return
                time.sleep(0.002)
                signal.raise_signal(signal.SIGINT)
        got, interrupts = [], 0
        threading.Thread(target=send, daemon=True).start()   # (a receiver that gave up must not leave it blocking the exit)
        pressing = threading.Thread(target=interrupt)
        pressing.start()
        deadline = time.monotonic() + 30     # (a lost message would leave it short of N)
        try:
            with Deferred() as d:            # one deferral throughout: no signal lands outside it
                armed.set()
                while len(got) < N and time.monotonic() < deadline:
                    try:
                        d.check()
                    except KeyboardInterrupt:
                        interrupts += 1
                    if rx.poll(100):
                        got.append(rx.recv_multipart())
                done.set()                   # the presses end inside the deferral, whenever the reads do
                pressing.join()
        except KeyboardInterrupt:            # one noted after the last check comes out at the end
            interrupts += 1
        print(json.dumps({"sizes": sorted({len(m) for m in got}), "ids": [int(m[0]) for m in got] == list(range(N)),
                          "interrupts": interrupts}))
        """)
    assert out["sizes"] == [5] and out["ids"]
    assert out["interrupts"] > 0


def test_a_loop_that_never_checks_can_still_be_left_with_a_later_ctrl_c():
    out = scenario("""
        from clamor.runtime.interrupt import Deferred, ESCAPE_S
        def press(after):
            time.sleep(after)
            signal.raise_signal(signal.SIGINT)
        threading.Thread(target=press, args=(0.2,)).start()
        threading.Thread(target=press, args=(0.3,)).start()            # soon after: it waits too
        threading.Thread(target=press, args=(0.4 + ESCAPE_S,)).start() # later: it is out at once
        t0 = time.monotonic()
        try:
            with Deferred():
                while time.monotonic() - t0 < 30:
                    time.sleep(0.05)                                    # never checks
            res = {"left": False}
        except KeyboardInterrupt:
            res = {"left": True, "after": time.monotonic() - t0}
        print(json.dumps(res))
        """)
    assert out["left"] and 2.0 < out["after"] < 10, out
