"""Differential: what every kind of worker reads equals what the driver
reads, stage after stage, while the driver keeps updating.

Forked workers, a spawned one and one started by hand (at another region
base) read the same region arrays through random rounds: the driver writes
random slices (single elements, runs across page boundaries, whole pages,
sometimes nothing), then a stage of tasks reads random slices, and every
worker digests the whole array.  Each figure is compared with the driver's
own reading at the same point.  A stale page, a missed invalidation or a
page fetched at the wrong version shows up as a mismatch, with its round.
"""
import pytest

from helpers import scenario


# Every test with workers that map the driver's pages and with workers that
# fetch them (conftest.same_host).
pytestmark = pytest.mark.usefixtures("same_host")

BODY = """
        import hashlib, subprocess, sys, random
        rng = random.Random({seed})
        n = 1 << 20                                     # 8 MiB of int64: 128 pages of 64 KiB
        a = clamor.array(np.arange(n, dtype=np.int64) * 7)
        b = clamor.zeros(1 << 14, dtype=np.float64)     # a second global, on other pages
        ref_a, ref_b = clamor.ref(a), clamor.ref(b)

        def digest(ra, rb):
            x, y = ra.get(), rb.get()
            return hashlib.sha256(x.tobytes() + y.tobytes()).hexdigest()

        def reads(ra, rb, spans):
            x, y = ra.get(), rb.get()
            return [int(x[s:e].sum()) ^ int(y[s % y.size:(s % y.size) + 3].view(np.int64).sum()) for s, e in spans]

        cl = clamor.Cluster(workers=2, start_method="{method}", remote=1, progress=False, start_timeout=60)
        cl.join_command()
        hand = subprocess.Popen([sys.executable, "-m", "clamor.worker", cl.endpoint, "--base", hex(0x310000000000)],
                                env={{**os.environ, "CLAMOR_SECRET": cl.secret}})
        cl.start()
        bad = []
        for r in range({rounds}):
            kind = rng.choice(["none", "elements", "runs", "pages", "mixed"])
            if kind in ("elements", "mixed"):
                for _ in range(rng.randint(1, 50)):
                    a[rng.randrange(n)] = rng.randrange(-10**12, 10**12)
            if kind in ("runs", "mixed"):
                for _ in range(rng.randint(1, 5)):
                    s = rng.randrange(n - 20000); e = s + rng.randint(1, 20000)
                    a[s:e] = rng.randrange(10**9)
            if kind == "pages":
                p = rng.randrange(128)
                a[p * 8192:(p + 1) * 8192] = -r
            if rng.random() < 0.5:
                b[rng.randrange(b.size)] = rng.random()
            spans = []
            for _ in range(24):
                s = rng.randrange(n - 1); spans.append((s, min(n, s + rng.randint(1, 60000))))
            want = reads(ref_a, ref_b, spans)
            parts = [spans[i::8] for i in range(8)]
            got = [None] * len(spans)
            flat = cl.parallelize(list(range(8)), 8).map(lambda i: (i, reads(ref_a, ref_b, parts[i]))).collect()
            for i, vals in flat:
                for k, v in enumerate(vals):
                    got[i + 8 * k] = v
            if got != want:
                bad.append(["reads", r, kind, [k for k in range(len(spans)) if got[k] != want[k]][:5]])
            d = digest(ref_a, ref_b)
            ds = cl.run(digest, ref_a, ref_b)
            if any(x != d for x in ds):
                bad.append(["digest", r, kind, [i for i, x in enumerate(ds) if x != d]])
        res = {{"bad": bad, "workers": len(cl.run(os.getpid)), "stages": cl.stats()["stages"]}}
        cl.close()
        hand.wait(30)
        print(json.dumps(res))
"""


@pytest.mark.parametrize("method,seed", [("fork", 11), ("spawn", 12)])
def test_every_kind_of_worker_reads_what_the_driver_reads(method, seed):
    out = scenario(BODY.format(method=method, seed=seed, rounds=12), timeout=300)
    assert out["bad"] == [], out["bad"]
    assert out["workers"] == 3 and out["stages"] >= 12 * 2
