"""Random access to 100,000+ distinct pages stays under vm.max_map_count."""
import pytest

from helpers import PRELUDE


@pytest.mark.usefixtures("same_host")
@pytest.mark.fetch_path
def test_100k_random_pages_do_not_exhaust_mappings(py):
    """Fetched pages: each opened in the middle of closed ones splits the
    mapping (workers that map the driver's pages: test_samehost.py)."""
    p = py(PRELUDE + """
region.init(size=4 << 30, page_size=4096)
a = clamor.array(np.arange(1 << 27, dtype=np.int64))     # 1 GiB = 262144 pages of 4 KiB
pages = np.random.default_rng(3).permutation(a.size // 512)[:110000]
with clamor.Cluster(workers=1, progress=False) as cl:
    def f(r, pages):
        clamor.configure(readahead=0)
        x = r.get()
        bad = []
        chunks = np.array_split(pages, 8)                 # 8 threads keep the pager busy
        def run(ch):
            for p in ch:
                v = int(x[p * 512 + 7])
                if v != p * 512 + 7:
                    bad.append((int(p), v))
        th = [threading.Thread(target=run, args=(c,)) for c in chunks]
        [t.start() for t in th]; [t.join() for t in th]
        with open("/proc/self/maps") as fh:
            maps = sum(1 for _ in fh)
        st = clamor.stats()
        return bad, maps, st, clamor.configure()["max_mappings"]
    [(bad, maps, st, budget)] = cl.run(f, clamor.ref(a), pages)
print(json.dumps({"maps": maps, "budget": budget, **st}))
assert not bad, bad[:5]
assert st["pages_fetched"] >= 110000
assert st["mappings"] <= budget, (st["mappings"], budget)
assert maps < 65530
assert st["evictions"] > 0, "the test did not reach the mapping budget"
""", timeout=900, check=True)
    print(p.stdout)
