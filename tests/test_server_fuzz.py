"""The page server answers every malformed, short, oversized or unknown
message with an error (or, past libzmq's size limit, drops that connection)
and keeps serving.  Runs against a driver in a subprocess."""
import errno
import os
import random
import struct
import subprocess
import sys
import time

import pytest
import zmq

from helpers import PRELUDE, ROOT

MAGIC = 0x524D4C43
HDR = struct.Struct("<IBBHIIQII")
GET, PAGES, ERROR, HELLO, HELLO_REPLY = 1, 2, 3, 4, 5

DRIVER = PRELUDE + """
region.init(size=1 << 30)
a = clamor.array(np.arange(1 << 17, dtype=np.float64))   # 1 MiB, pages 0..16
ep = region.serve()
print(ep, a.ctypes.data - region.base(), flush=True)
sys.stdin.read()                                        # until the test closes stdin
print(clamor.stats()["bad_requests"], flush=True)
"""


@pytest.fixture
def driver():
    p = subprocess.Popen([sys.executable, "-c", DRIVER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         text=True, cwd=ROOT)
    ep, off = p.stdout.readline().split()
    yield p, ep, int(off)
    if p.poll() is None:
        p.kill()
    p.wait()


def hdr(type_, index=0, count=1, tag=0, proto=1, flags=0, magic=MAGIC, status=0, version=0):
    return HDR.pack(magic, proto, type_, flags, status, version, index, count, tag)


def parse(frames):
    magic, proto, type_, flags, status, version, index, count, tag = HDR.unpack(frames[0])
    assert magic == MAGIC and proto == 1
    return type_, status, index, count, tag


def ask(sock, frames, timeout=5000):
    sock.send_multipart(frames)
    assert sock.poll(timeout), "no reply: the server stalled or crashed"
    return sock.recv_multipart()


def good_get(sock, page):
    rep = ask(sock, [hdr(GET, index=page, tag=4242)])
    type_, status, index, count, tag = parse(rep)
    assert (type_, status, index, tag) == (PAGES, 0, page, 4242)
    return rep[1]


def test_errors_for_each_kind_of_bad_request(driver):
    p, ep, off = driver
    ctx = zmq.Context()
    s = ctx.socket(zmq.DEALER)
    s.connect(ep)
    page = off // 65536
    cases = {
        "short": ([b"CLMR"], errno.EBADMSG),
        "long": ([hdr(GET, index=page) + b"x"], errno.EBADMSG),
        "bad magic": ([hdr(GET, index=page, magic=0xDEADBEEF)], errno.EPROTO),
        "version": ([hdr(GET, index=page, proto=9)], errno.EPROTONOSUPPORT),
        "reserved flags": ([hdr(GET, index=page, flags=4)], errno.EPROTO),
        "flags on a non-GET": ([hdr(HELLO, flags=1)], errno.EPROTO),
        "redirect as request": ([hdr(7, index=page)], errno.ENOMSG),
        "unknown type": ([hdr(77, index=page)], errno.ENOMSG),
        "reply type as request": ([hdr(PAGES, index=page)], errno.ENOMSG),
        "count 0": ([hdr(GET, index=page, count=0)], errno.ERANGE),
        "count too big": ([hdr(GET, index=page, count=100000)], errno.ERANGE),
        "beyond region": ([hdr(GET, index=(1 << 30) // 65536)], errno.ERANGE),
        "huge index": ([hdr(GET, index=(1 << 64) - 1)], errno.ERANGE),
        "never allocated": ([hdr(GET, index=(1 << 29) // 65536)], errno.ENOENT),
        "extra frames": ([hdr(GET, index=page), b"junk"], errno.EBADMSG),
        "empty frame": ([b""], errno.EBADMSG),
    }
    for name, (frames, want) in cases.items():
        rep = ask(s, frames)
        type_, status, *_ = parse(rep)
        assert (type_, status) == (ERROR, want), f"{name}: got type {type_} status {status}"
    body = good_get(s, page)
    assert len(body) == 65536
    s.close()
    ctx.term()
    p.stdin.close()
    assert int(p.stdout.readline()) >= 8   # the server counted them


def test_random_garbage_never_stalls_the_server(driver):
    p, ep, off = driver
    page = off // 65536
    rng = random.Random(1234)
    ctx = zmq.Context()
    s = ctx.socket(zmq.DEALER)
    s.connect(ep)
    for i in range(3000):
        kind = rng.randrange(4)
        if kind == 0:
            frames = [os.urandom(rng.randrange(0, 200))]
        elif kind == 1:  # a valid header with random fields
            frames = [hdr(rng.randrange(256), rng.getrandbits(64), rng.getrandbits(32), i)]
        elif kind == 2:  # mutate one byte of a good request
            b = bytearray(hdr(GET, index=page, tag=i))
            b[rng.randrange(len(b))] ^= 1 << rng.randrange(8)
            frames = [bytes(b)]
        else:
            frames = [os.urandom(rng.randrange(1, 64)) for _ in range(rng.randrange(1, 5))]
        s.send_multipart(frames)
        if i % 100 == 0:  # read the replies so far; each has a valid header
            while s.poll(0):
                parse(s.recv_multipart())
    deadline = time.monotonic() + 10
    while s.poll(500) and time.monotonic() < deadline:
        parse(s.recv_multipart())
    assert len(good_get(s, page)) == 65536
    assert p.poll() is None, "the driver died"
    s.close()
    ctx.term()


def test_oversized_message_drops_only_that_connection(driver):
    p, ep, off = driver
    page = off // 65536
    ctx = zmq.Context()
    bad = ctx.socket(zmq.DEALER)
    bad.linger = 0
    bad.connect(ep)
    bad.send(b"x" * (1 << 20))            # over ZMQ_MAXMSGSIZE
    assert not bad.poll(1000), "an oversized message got a reply"
    good = ctx.socket(zmq.DEALER)
    good.connect(ep)
    assert len(good_get(good, page)) == 65536
    bad.close()
    good.close()
    ctx.term()
    assert p.poll() is None


def test_hello_reports_geometry(driver):
    p, ep, off = driver
    ctx = zmq.Context()
    s = ctx.socket(zmq.DEALER)
    s.connect(ep)
    rep = ask(s, [hdr(HELLO, tag=9)])
    type_, status, _, _, tag = parse(rep)
    assert (type_, status, tag) == (HELLO_REPLY, 0, 9)
    base, size, psize, role, _ = struct.unpack("<QQQII", rep[1])
    assert (base, size, psize, role) == (0x200000000000, 1 << 30, 65536, 1)
    s.close()
    ctx.term()
