"""Malformed diffs from a fake page server.  A spawned worker (relocations
turned off in its task, so that it keeps copies and asks for diffs) reads
pages in full, drops them as an invalidation would, and reads them again
with clamor.prefetch: the fake server answers the diff request with a good
diff, one whose sums are wrong, or a malformed one of each kind.  A good
diff must give the new page; wrong sums, the page fetched whole instead;
a malformed one, a typed error for that fetch and nothing installed: the
copy is forgotten, the next read fetches the page whole, and the worker
goes on.  A diff that answers a request for none (a page the worker holds
no copy of) is malformed too.  Each case runs in a subprocess."""
import json

import pytest

from helpers import PRELUDE

SCENARIO = PRELUDE + """
import struct
import zmq
from clamor.runtime.security import Guard, Security
MODE = {mode!r}
M64 = (1 << 64) - 1

def page_sum(b):                        # csrc/pagetable.c, cl_page_sum
    w = np.frombuffer(b, dtype=np.uint64).tolist()
    h, a, c = 0x9e3779b97f4a7c15 ^ len(b), 0, 0
    for i in range(0, len(w) - 1, 2):
        a = ((a ^ w[i]) * 0xff51afd7ed558ccd) & M64
        c = ((c ^ w[i + 1]) * 0xc4ceb9fe1a85ec53) & M64
        a ^= a >> 29
        c ^= c >> 31
    h ^= (a + 3 * c) & M64
    h = (h * 0xbf58476d1ce4e5b9) & M64
    h ^= h >> 31
    return h | 1

def run(word, data):
    return struct.pack("<II", word, len(data) // 8) + data

region.init()
a = clamor.array(np.zeros(1 << 20, dtype=np.uint8))     # 16 pages of 64 KiB
ps = region.page_size()
W = ps // 8
first = (a.ctypes.data - region.base()) // ps

def old(i):
    return bytes([(i % 251) + 1]) * ps
def new(i):                            # word 3 of each page changed
    b = bytearray(old(i)); b[24:32] = bytes(x ^ 0xff for x in b[24:32]); return bytes(b)
CHANGE = run(3, bytes(x ^ y for x, y in zip(old(0)[24:32], new(0)[24:32])))

def diff_frame(idx, count):
    sums = b"".join(struct.pack("<Q", page_sum(new(i))) for i in range(idx, idx + count))
    runs = b"".join(run(k * W + 3, CHANGE[8:]) for k in range(count))
    if MODE in ("good", "unasked"):
        return sums + runs
    if MODE == "wrong sums":
        return b"".join(struct.pack("<Q", page_sum(new(i)) ^ 2) for i in range(idx, idx + count)) + runs
    if MODE == "truncated run":
        return sums + runs[:-4]
    if MODE == "offset past the pages":
        return sums + run(count * W, b"\\1" * 8)
    if MODE == "overlapping runs":
        return sums + run(4, b"\\1" * 16) + run(5, b"\\2" * 8)
    if MODE == "no sums":
        return sums[:-8]
    if MODE == "as long as the pages":
        return sums + run(0, b"\\1" * (count * ps - 8 * count - 8))
    raise AssertionError(MODE)

cl = clamor.Cluster(workers=1, start_method="spawn", same_host="fetch", progress=False, speculation=False,
                    replace_workers=False)
cl.join_command()
real = cl.page_endpoint
sec = Security(cl.secret)
ctx = zmq.Context()
guard = Guard(ctx, sec, "fake page server"); guard.start()
fake = ctx.socket(zmq.ROUTER); sec.server(fake); port = fake.bind_to_random_port("tcp://127.0.0.1")
up = ctx.socket(zmq.DEALER); sec.client(up); up.connect(real)
stop = threading.Event()
seen = {{}}
asked = []
def serve():
    while not stop.is_set():
        if not fake.poll(100):
            continue
        frames = fake.recv_multipart()
        ident, hdr = frames[0], frames[1]
        magic, ver, typ, flags, status, stage, idx, count, tag = struct.unpack("<IBBHIIQII", hdr)
        if typ == 4:
            up.send(hdr); fake.send_multipart([ident] + up.recv_multipart())
        elif typ == 1:
            asked.append([idx - first, count, flags, len(frames)])
            later = all(seen.get(i) for i in range(idx, idx + count))
            for i in range(idx, idx + count):
                seen[i] = True
            if flags & 128 and MODE == "old server":           # as a server of before diffs answers
                fake.send_multipart([ident, struct.pack("<IBBHIIQII", magic, ver, 3, 0, 71, stage, idx, count, tag),
                                     b"malformed header"])
                continue
            if flags & 128:                                   # a diff request: [hdr][bases]
                body, rflags = diff_frame(idx, count), 128
            elif MODE == "unasked" and not later:              # a diff nobody asked for
                body, rflags = struct.pack("<Q", page_sum(new(idx))) + CHANGE, 128
            else:
                body, rflags = b"".join((new if later else old)(i) for i in range(idx, idx + count)), 0
            rep = struct.pack("<IBBHIIQII", magic, ver, 2, rflags, 0, stage, idx, count, tag)
            fake.send_multipart([ident, rep, body])
t = threading.Thread(target=serve, daemon=True); t.start()
cl.page_endpoint = f"tcp://127.0.0.1:{{port}}"

def probe(r, pages):
    from clamor._native import lib
    lib.clamor_reloc_enable(0)           # this fake server sends no relocations
    clamor.configure(readahead=0)
    x = r.get()
    base = (x.ctypes.data - region.base()) // region.page_size()
    out = {{"first": [], "again": []}}
    def fetch(k):
        try:
            clamor.prefetch(x[k * ps:(k + 1) * ps])
            return "ok"
        except clamor.ClamorError as e:
            return [type(e).__name__, str(e)]
    for k in pages:
        out["first"].append(fetch(k))
    out["first_read"] = [[int(x[k * ps]), int(x[k * ps + 24])] for k in pages]
    region.invalidate(np.array([base + k for k in pages], dtype=np.uint64))
    out["kept"] = clamor.stats()["kept_bytes"] // ps
    for k in pages:
        out["again"].append(fetch(k))
    out["read"] = [[int(x[k * ps]), int(x[k * ps + 24])] for k in pages]   # whatever the fetch gave, or once more
    st = clamor.stats()
    out["stats"] = {{k: st[k] for k in ("diff_pages", "diff_retries", "pages_kept", "kept_bytes", "fetch_errors")}}
    return out

with cl:
    res = cl.run(probe, clamor.ref(a), [2, 5])[0]
stop.set(); t.join()
res["asked"] = asked
res["first_page"] = first
print(json.dumps(res))
"""

PAGES = (2, 5)


def _run(py, mode):
    p = py(SCENARIO.format(mode=mode), timeout=120)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-4000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


def test_a_good_diff_gives_the_new_page(py):
    out = _run(py, "good")
    base = out["first_page"]
    assert out["first"] == ["ok", "ok"] and out["again"] == ["ok", "ok"], out
    assert out["kept"] == 2, out
    olds = [((base + k) % 251) + 1 for k in PAGES]
    assert out["first_read"] == [[v, v] for v in olds], out
    assert out["read"] == [[v, v ^ 0xff] for v in olds], out       # word 3 changed, the rest kept
    assert out["stats"]["diff_pages"] == 2 and out["stats"]["diff_retries"] == 0, out
    assert [a[2] & 128 for a in out["asked"]] == [0, 0, 128, 128], out["asked"]
    assert all(a[3] == (3 if a[2] & 128 else 2) for a in out["asked"]), out["asked"]   # [id][hdr][bases]


def test_a_diff_that_does_not_sum_right_is_fetched_whole(py):
    out = _run(py, "wrong sums")
    base = out["first_page"]
    assert out["again"] == ["ok", "ok"], out
    olds = [((base + k) % 251) + 1 for k in PAGES]
    assert out["read"] == [[v, v ^ 0xff] for v in olds], out
    assert out["stats"]["diff_retries"] == 2 and out["stats"]["diff_pages"] == 0, out
    # each page asked once more, without DIFF
    assert [a[2] & 128 for a in out["asked"]] == [0, 0, 128, 0, 128, 0], out["asked"]


@pytest.mark.parametrize("mode", ["truncated run", "offset past the pages", "overlapping runs", "no sums",
                                  "as long as the pages"])
def test_a_malformed_diff_fails_that_fetch_and_nothing_else(py, mode):
    out = _run(py, mode)
    base = out["first_page"]
    assert out["first"] == ["ok", "ok"], out
    for e in out["again"]:                 # a typed error for that fetch, naming the page
        assert e != "ok" and e[0] == "ProtocolError" and "could not be fetched" in e[1], out
        assert "Bad message" in e[1], out
    # nothing of it installed: the copy forgotten, the next read fetched the page whole
    olds = [((base + k) % 251) + 1 for k in PAGES]
    assert out["read"] == [[v, v ^ 0xff] for v in olds], out
    assert out["stats"]["diff_pages"] == 0 and out["stats"]["kept_bytes"] == 0, out
    assert [a[2] & 128 for a in out["asked"]] == [0, 0, 128, 128, 0, 0], out["asked"]


def test_a_diff_for_a_page_without_a_copy_is_refused(py):
    out = _run(py, "unasked")
    for e in out["first"]:
        assert e != "ok" and e[0] == "ProtocolError" and "Bad message" in e[1], out
    base = out["first_page"]
    olds = [((base + k) % 251) + 1 for k in PAGES]
    assert out["first_read"] == [[v, v ^ 0xff] for v in olds], out      # asked again: the page whole
    # (its next diff, against that copy, does not sum right: fetched whole, never installed wrong)
    assert out["read"] == [[v, v ^ 0xff] for v in olds], out
    assert out["stats"]["diff_pages"] == 0 and out["stats"]["diff_retries"] == 2, out


def test_a_driver_of_before_diffs_is_asked_again_without(py):
    """A server of before diffs refuses the flag (EPROTO): the worker asks
    again without it, and asks for no more diffs."""
    out = _run(py, "old server")
    base = out["first_page"]
    assert out["again"] == ["ok", "ok"], out
    olds = [((base + k) % 251) + 1 for k in PAGES]
    assert out["read"] == [[v, v ^ 0xff] for v in olds], out
    assert out["stats"]["diff_pages"] == 0 and out["stats"]["fetch_errors"] == 0, out
    assert [a[2] & 128 for a in out["asked"]] == [0, 0, 128, 0, 0], out["asked"]
