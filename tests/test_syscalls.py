"""System calls on region memory on a worker.  The kernel answers EFAULT,
not SIGSEGV, for pages that are not present; clamor.io makes them present
first.  Each case first shows the plain call failing, then the wrapper
working.  With workers that map the driver's pages too: each case's
buffer lies in a 4 MiB window of its own, so none is mapped by an earlier
case's fault."""
import pytest

from helpers import PRELUDE

pytestmark = pytest.mark.usefixtures("same_host")


def test_syscalls_into_and_from_region_memory(py, tmp_path):
    py(PRELUDE + f"""
import errno, socket
tmp = "{tmp_path}"
a = clamor.array(np.arange(1 << 22, dtype=np.float64))      # 32 MiB, 8 windows of 4 MiB
W = 1 << 19                                                  # float64 per window
with open(tmp + "/src.bin", "wb") as f:
    f.write(np.arange(4096, dtype=np.float64).tobytes())
with clamor.Cluster(workers=1, progress=False) as cl:
    def cases(r, tmp):
        clamor.configure(readahead=0)
        x = r.get()
        out = {{}}
        # os.write of a region buffer
        rfd, wfd = os.pipe()
        try:
            os.write(wfd, x[0:1024])                         # page 0 not present
            out["write_plain"] = "ok"
        except OSError as e:
            out["write_plain"] = e.errno
        n = clamor.write(wfd, x[0:1024])
        out["write"] = np.frombuffer(os.read(rfd, 1 << 16), np.float64).tolist() == x[0:1024].tolist() and n == 8192
        # file.readinto a region buffer (data lands in this worker's copy)
        dst = x[2 * W:2 * W + 4096]                           # window 2, not yet present
        with open(tmp + "/src.bin", "rb", buffering=0) as f:
            try:
                f.readinto(dst); out["readinto_plain"] = "ok"
            except OSError as e:
                out["readinto_plain"] = e.errno
        with open(tmp + "/src.bin", "rb", buffering=0) as f:
            out["readinto"] = clamor.readinto(f, dst) == 32768 and dst.tolist() == list(np.arange(4096.0))
        # socket.recv_into a region buffer
        s1, s2 = socket.socketpair()
        dst2 = x[4 * W:4 * W + 1024]                          # window 4
        s1.sendall(np.full(1024, 7.0).tobytes())
        try:
            s2.recv_into(dst2); out["recv_plain"] = "ok"
        except OSError as e:
            out["recv_plain"] = e.errno
        s1.sendall(np.full(1024, 7.0).tobytes())
        got = 0
        while got < 8192:
            got += clamor.recv_into(s2, memoryview(dst2).cast("B")[got:], 8192 - got)
        out["recv"] = bool((dst2 == 7.0).all())
        # np.fromfile into a region array
        dst3 = x[6 * W:6 * W + 4096]                          # window 6
        out["fromfile"] = clamor.fromfile(tmp + "/src.bin", dst3) == 4096 and dst3.tolist() == list(np.arange(4096.0))
        return out
    [out] = cl.run(cases, clamor.ref(a), tmp)
print(out)
assert out["write_plain"] == errno.EFAULT, out
assert out["readinto_plain"] == errno.EFAULT, out
assert out["recv_plain"] == errno.EFAULT, out
assert out["write"] and out["readinto"] and out["recv"] and out["fromfile"], out
""", check=True)


def test_prefetch_rejects_memory_outside_the_region(py):
    py(PRELUDE + """
import errno
a = clamor.array(np.arange(10.0))
with clamor.Cluster(workers=1, progress=False) as cl:
    def f():
        try:
            clamor.prefetch(np.zeros(10))
        except clamor.PageFetchError as e:
            return e.errno
    assert cl.run(f) == [errno.EFAULT]
""", check=True)
