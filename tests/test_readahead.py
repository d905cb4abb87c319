"""Read-ahead follows the access pattern (csrc/pager.c): random lookups
fetch about the pages they touch and no more, sequential scans still read
ahead in large windows.

Each scenario runs a driver in a subprocess with one spawned worker that
fetches its pages from the driver (same_host="fetch": a worker that maps
the driver's pages reads nothing ahead), at the default read-ahead.  The
worker names the pages it touches from the addresses it reads, so
"touched" is exact, not estimated.
"""
import json
import textwrap

from helpers import PRELUDE

DRIVER = """
a = clamor.array(np.arange(1 << 24, dtype=np.int64))    # 128 MiB: 2048 pages of 64 KiB
with clamor.Cluster(workers=1, start_method="spawn", same_host="fetch", progress=False, speculation=False) as cl:
    def f(r):
        x = r.get()
        ps = region.page_size()
        def page(i):                       # the page that holds x[i]
            return (x.ctypes.data + 8 * int(i) - region.base()) // ps
        clamor.reset_stats()
{body}
        time.sleep(0.5)                    # read-ahead still on the wire lands and is counted
        return got, len(touched), clamor.stats()
    got, touched, st = cl.run(f, clamor.ref(a))[0]
{check}
print(json.dumps({{"touched": touched, "stats": st}}))
"""


def scenario(py, body, check):
    code = PRELUDE + DRIVER.format(body=textwrap.indent(textwrap.dedent(body), " " * 8), check=textwrap.dedent(check))
    p = py(code, check=True, timeout=180)
    out = json.loads(p.stdout.strip().splitlines()[-1])
    return out["touched"], out["stats"]


def test_random_lookups_fetch_about_the_pages_they_touch(py):
    # Lookups of 16-byte records at random places, a third of them
    # straddling a page boundary (as a probe chain or a struct that crosses
    # a page does): pages touched one or two at a time, in no order, often
    # next to one touched just before.
    touched, st = scenario(py, """
        rng = np.random.default_rng(7)
        per = ps // 8
        starts = np.concatenate([rng.integers(0, x.size - 2, 600),
                                 rng.integers(1, x.size // per - 1, 300) * per - 1])   # a page's last word
        starts = starts[rng.permutation(starts.size)]
        got = ([int(x[s]) + int(x[s + 1]) for s in starts], starts.tolist())
        touched = {page(s) for s in starts} | {page(s + 1) for s in starts}
        """, """
        values, starts = got
        assert values == [int(a[s]) + int(a[s + 1]) for s in starts]
        """)
    assert st["fetch_errors"] == 0, st
    assert 800 < touched < 1200, touched   # the pattern did what it says
    # every page touched was fetched, and at most a quarter more
    assert touched <= st["pages_fetched"] <= 1.25 * touched, (touched, st)
    # random lookups start no stream, so next to nothing is read ahead
    assert st["readahead_pages"] <= 0.05 * touched, (touched, st)


def test_sequential_scan_still_reads_ahead_in_large_windows(py):
    touched, st = scenario(py, """
        got = int(x.sum())
        touched = set(range(page(0), page(x.size - 1) + 1))
        """, """
        assert got == int(a.sum())
        """)
    pages = touched
    assert st["fetch_errors"] == 0, st
    # the whole array came, and read-ahead ran at most one window past it
    assert pages <= st["pages_fetched"] <= pages + (4 << 20) // 65536, st
    assert st["readahead_pages"] >= 0.95 * pages, st     # nearly every page came ahead of the scan
    assert st["faults"] < pages / 8, st                  # the scan rarely waited
    # the window grew to full size: requests of up to 1 MiB, not a page at a time
    assert st["fetch_requests"] < pages / 8, st
