"""The one version keeper (clamor/runtime/versions.py) that a Cluster and
clamor.dask both use: what it lists, what it keeps, and what each begun
version tells the caches that rest on region bytes."""
import pytest

from helpers import scenario


def test_changed_pages_are_listed_per_version_and_merged_by_trim():
    out = scenario("""
import warnings
from clamor.runtime.versions import VersionKeeper, change_version
region.init()
keep = VersionKeeper()
a = clamor.zeros(region.page_size() * 4 // 8)
first = keep.begin()
a[0] = 1.0
v1 = keep.begin()
a[region.page_size() // 8 * 2] = 2.0
v2 = keep.begin()
v3 = keep.begin()                       # nothing changed: no new version
one = keep.changed_between(first, v1).tolist()
both = keep.changed_between(v2, first).tolist()      # either order
none = keep.changed_between(v2, v3).tolist()
kept = keep.keep({v2, v3})
keep.trim({v2, v3})
print(json.dumps({"versions": [first, v1, v2, v3], "newest": keep.newest, "one": one, "both": both,
                  "none": none, "kept": kept, "lists": sorted(keep.changes)}))
""")
    first, v1, v2, v3 = out["versions"]
    assert v1 == first + 1 and v2 == v1 + 1 and v3 == v2 + 1, out
    assert out["newest"] == v2, out                 # v3 changed no byte
    assert len(out["one"]) == 1 and len(out["both"]) == 2 and out["one"][0] in out["both"], out
    assert out["none"] == [] and out["kept"] == [v2, v3], out
    assert out["lists"] == [], out                  # nothing between v2 and v3 to ask for


def test_a_dask_version_forgets_the_checks_resting_on_what_changed():
    """The Dask driver began versions without telling the checks before a
    stage (serialize.note_changed): a region dict checked once, then
    pointed (same size) at an object made outside any block, still went
    in place after a Dask version began, as if unchanged.  Every driver
    begins versions through the one keeper now, which tells them."""
    pytest.importorskip("distributed")
    out = scenario("""
import warnings
from clamor.runtime import serialize
from clamor.memory.share import note_fork
from clamor.dask._driver import Driver
warnings.simplefilter("ignore")
region.init()
region.version_begin(region.version_current() + 1)
with clamor.heap():
    d = {"a": float(len("abc")) * 0.5, "b": "x" * 3}
note_fork()                              # as a Cluster does when it forks
before = []
serialize.dumps(d, forked=True, objects=before)
made = [float(i) * 1.5 for i in range(100)]
d["a"] = made[41]                        # same size, after the 'fork', outside the region
Driver(None, "s" * 32, True, "127.0.0.1").stamp()    # a Dask version begins
after = []
serialize.dumps(d, forked=True, objects=after)
print(json.dumps({"before": len(before), "after": len(after)}))
""")
    assert out == {"before": 1, "after": 0}, out     # in place before; by value after the change
