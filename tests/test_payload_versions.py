"""A region object a stage's payload sends by offset reads, on the workers,
as the driver has it when the payload is made.

Workers read the region at the version of the stage's begin, and the payload
is pickled after the begin.  An object CPython makes meanwhile at a region
address (off a free list that holds region objects which died outside a
block) is another object to the workers: it goes by value.  The object
below is a library's, whose ``__reduce__`` drops an entry of a cache it
keeps in the region and then returns a dict it makes there and then."""
from helpers import PRELUDE, run_driver

MODULE = '''
made = []

def rebuild(d):
    return d["v"]

class Box:
    def __init__(self, values, cache):
        self.values, self.cache = values, cache

    def __reduce__(self):
        if self.cache:
            self.cache.pop()     # a region dict dies outside a block: onto the free list
        v = self.values[len(made) % len(self.values)]
        made.append(v)
        return rebuild, ({"v": v},)
'''

DRIVER = """
sys.path.insert(0, {path!r})
import reducemod

with clamor.heap():
    values = tuple("value-%d-" % i + "x" * 30 for i in range(7))
    cache = [{{"v": "cached-%d" % j}} for j in range(60)]    # small key tables: no allocator call when freed
box = reducemod.Box(values, cache)
out, errors = [], []
with clamor.Cluster(workers=1, max_attempts=1, speculation=False, progress=False,
                    start_method={start!r}) as cl:
    cl.parallelize(range(1), 1).map(lambda _: 0).collect()     # the first stage: versions from here
    for i in range(12):
        try:
            got = cl.parallelize(range(1), 1).map(lambda _: box).collect()[0]
            out.append([got, reducemod.made[-1]])
        except Exception as e:
            errors.append(f"{{type(e).__name__}}: {{str(e).splitlines()[0][:150]}}")
    lost = cl.stats()["recovery"]["workers_lost"]
print(json.dumps({{"results": out, "errors": errors, "lost": lost, "pops": 60 - len(cache)}}))
"""


def _run(tmp_path, start, env=None):
    (tmp_path / "reducemod.py").write_text(MODULE)
    return run_driver(PRELUDE + DRIVER.format(path=str(tmp_path), start=start), timeout=240, env=env)


def test_a_dict_a_reduce_makes_after_the_begin_is_read_as_the_driver_made_it(tmp_path):
    """On the old code every one of the 12 stages read a dropped cache entry
    ("cached-58" for "value-1"): a silent wrong answer."""
    out = _run(tmp_path, "fork")
    assert out["exit"] == 0, out
    assert out["errors"] == [] and out["lost"] == 0, out
    assert len(out["results"]) == 12 and out["pops"] >= 12, out
    wrong = [r for r in out["results"] if r[0] != r[1]]
    assert wrong == [], out


def test_the_same_on_spawned_workers(tmp_path):
    """Workers not forked read the pages at the same version, relocated
    (the hash seed set, so that a dict keyed by str is theirs to read).  On
    the old code the dict's relocations agreed with no version of its page,
    and each of the 12 stages lost its worker."""
    out = _run(tmp_path, "spawn", env={"PYTHONHASHSEED": "0"})
    assert out["exit"] == 0, out
    assert out["errors"] == [] and out["lost"] == 0, out
    assert len(out["results"]) == 12 and out["pops"] >= 12, out
    wrong = [r for r in out["results"] if r[0] != r[1]]
    assert wrong == [], out
