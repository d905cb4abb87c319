"""The driver keeps the page diffs it made (csrc/diffs.c): a second
request for the same (pages, base, version) gets the same bytes without
the pages being read again, and a request that names a version not begun
yet leaves nothing behind that a later request of that version would get.

A client talks to the page server of a driver in a subprocess; the
reference is the pages fetched whole at each version."""
import json
import struct
import subprocess
import sys

import numpy as np
import pytest
import zmq

from helpers import PRELUDE, ROOT

MAGIC = 0x524D4C43
HDR = struct.Struct("<IBBHIIQII")
GET, PAGES = 1, 2
RELOC, DIFF = 32, 128
N = 8   # pages

DRIVER = PRELUDE + """
import json
region.init(size=1 << 30)
rng = np.random.default_rng(5)
ps = region.page_size()
words = ps // 8
a = clamor.zeros((%d + 1) * words, dtype=np.uint64)
off = (-(a.ctypes.data - region.base()) %% ps) // 8
view = a[off:off + %d * words].reshape(%d, words)
view[:] = rng.integers(1, 1 << 63, view.shape, dtype=np.uint64)
ep = region.serve()
region.version_begin(1)
print(ep, (view.ctypes.data - region.base()) // ps, ps, flush=True)
for line in sys.stdin:
    v = int(line)
    view[:, rng.integers(0, words, 5)] += np.uint64(1)     # a few words of every page
    region.version_begin(v)
    st = clamor.stats()
    print(json.dumps({"served": st["diff_pages_served"], "reused": st["diff_pages_reused"]}), flush=True)
""" % (N, N, N)


@pytest.fixture
def driver():
    p = subprocess.Popen([sys.executable, "-c", DRIVER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         text=True, cwd=ROOT)
    ep, first, ps = p.stdout.readline().split()
    yield p, ep, int(first), int(ps)
    if p.poll() is None:
        p.kill()
    p.wait()


def get(sock, first, version, bases=None, flags=0):
    h = HDR.pack(MAGIC, 1, GET, flags | (DIFF if bases else 0), 0, version, first, N, 7)
    sock.send_multipart([h] + ([struct.pack("<%dI" % N, *bases)] if bases else []))
    assert sock.poll(10000), "no reply"
    rep = sock.recv_multipart()
    magic, _, type_, rflags, status, _, _, _, _ = HDR.unpack(rep[0])
    assert (magic, type_, status) == (MAGIC, PAGES, 0), (type_, status, rep[1:2])
    return rflags, rep[1:]


def applied(diff, base):
    """The pages a diff frame makes of the base pages."""
    out = np.frombuffer(base, dtype=np.uint64).copy()
    o = N * 8
    while o < len(diff):
        first, n = struct.unpack_from("<II", diff, o)
        out[first:first + n] ^= np.frombuffer(diff, dtype=np.uint64, count=n, offset=o + 8)
        o += 8 + n * 8
    return out.tobytes()


def advance(p, version):
    p.stdin.write(f"{version}\n")
    p.stdin.flush()
    return json.loads(p.stdout.readline())


def test_a_diff_asked_again_is_the_same_and_not_made_again(driver):
    p, ep, first, ps = driver
    ctx = zmq.Context()
    s = ctx.socket(zmq.DEALER)
    s.connect(ep)
    try:
        v1 = get(s, first, 1)[1][0]
        assert advance(p, 2) == {"served": 0, "reused": 0}
        v2 = get(s, first, 2)[1][0]
        assert v2 != v1
        fa, (da,) = get(s, first, 2, bases=[1] * N)
        fb, (db,) = get(s, first, 2, bases=[1] * N)
        assert fa & DIFF and fb & DIFF
        assert len(da) < len(v2) // 8        # five words a page changed
        assert applied(da, v1) == v2
        assert db == da
        # with relocations asked for: pages without lists get an empty frame
        fc, (dc, relocs) = get(s, first, 2, bases=[1] * N, flags=RELOC)
        assert fc & DIFF and fc & RELOC and dc == da and relocs == struct.pack("<I", 0)
        st = advance(p, 3)
        assert st == {"served": 3 * N, "reused": 2 * N}, st
    finally:
        s.close(linger=0)
        ctx.term()


def test_a_version_not_begun_leaves_no_diff_behind(driver):
    """Version 3 asked for while the driver is at 2 reads as 2 does then;
    once 3 has begun with other bytes, its diff is made from them."""
    p, ep, first, ps = driver
    ctx = zmq.Context()
    s = ctx.socket(zmq.DEALER)
    s.connect(ep)
    try:
        advance(p, 2)
        v2 = get(s, first, 2)[1][0]
        early = get(s, first, 3, bases=[2] * N)[1][0]
        assert applied(early, v2) == v2      # nothing changed yet
        advance(p, 3)
        v3 = get(s, first, 3)[1][0]
        assert v3 != v2
        _, (d,) = get(s, first, 3, bases=[2] * N)
        assert applied(d, v2) == v3
        st = advance(p, 4)
        assert st["reused"] == 0, st
    finally:
        s.close(linger=0)
        ctx.term()
