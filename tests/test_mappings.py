"""Random access to many more distinct pages than the mapping budget allows
stays within the budget, and so under vm.max_map_count."""
import pytest

from helpers import PRELUDE


@pytest.mark.usefixtures("same_host")
@pytest.mark.fetch_path
def test_random_pages_far_past_the_mapping_budget_do_not_exhaust_mappings(py):
    """Fetched pages: each opened in the middle of closed ones splits the
    mapping (workers that map the driver's pages: test_samehost.py).  A
    budget of 4096 mappings and 24,000 scattered pages (about twelve times
    as many mappings as the budget, left unbounded) show the bound that the
    default budget (half of vm.max_map_count) keeps at 100,000 pages."""
    p = py(PRELUDE + """
region.init(size=1 << 30, page_size=4096)
a = clamor.array(np.arange(1 << 25, dtype=np.int64))     # 256 MiB = 65536 pages of 4 KiB
pages = np.random.default_rng(3).permutation(a.size // 512)[:24000]
with clamor.Cluster(workers=1, progress=False) as cl:
    def f(r, pages):
        clamor.configure(readahead=0, max_mappings=4096)
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
assert budget == 4096, budget
assert st["pages_fetched"] >= 24000
assert st["mappings"] <= budget, (st["mappings"], budget)
assert maps < budget + 2048, (maps, budget)              # the rest: the interpreter's own mappings
assert st["evictions"] > 0, "the test did not reach the mapping budget"
""", timeout=900, check=True)
    print(p.stdout)
