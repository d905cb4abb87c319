"""clamor.lineage without processes: what a stage needs, and what a lost
worker takes with it.  Collections are built without a cluster."""
from clamor.runtime.collection import Parallel, Range
from clamor.runtime.lineage import Lineage


def test_uncomputed_collection_needs_nothing_and_reads_nothing():
    lin = Lineage()
    c = Range(None, 0, 100, 1, 4).map(lambda x: x)
    shuffled, lost, (rs, rc) = lin.needs(c, [0, 1, 2, 3])
    assert shuffled == [] and lost == {} and rs == set() and rc == set()


def test_shuffle_reads_stop_at_the_shuffle():
    lin = Lineage()
    base = Range(None, 0, 100, 1, 4).map(lambda x: (x % 3, x))
    red = base.reduce_by_key(lambda a, b: a + b).map(lambda kv: kv)
    shuffled, lost, (rs, rc) = lin.needs(red, [0, 1])
    assert [s.id for s in shuffled] == [red.deps[0].id]
    assert rs == set(red.deps[0].shuffle_ids) and rc == set() and lost == {}


def test_cached_partitions_here_are_read_lost_ones_are_recomputed_at_their_version():
    lin = Lineage()
    src = Parallel(None, list(range(40)), 4)
    c = src.map(lambda x: x).cache()
    top = c.map(lambda x: x + 1)
    for p, w in enumerate([b"w0", b"w1", b"w0", b"w1"]):
        lin.cached(c.id, p, w, version=3 if p < 2 else 5)
    assert lin.lose_worker(b"w1") == (set(), {(c.id, 1), (c.id, 3)})
    shuffled, lost, (rs, rc) = lin.needs(top, [0, 1, 2, 3])
    assert rc == {(c.id, 0), (c.id, 2)}
    assert lost == {3: {c: [1]}, 5: {c: [3]}}
    # the job that recomputes them does not need them itself
    shuffled, lost, (rs, rc) = lin.needs(c, [1, 3], recompute=True)
    assert lost == {} and rc == set()
    # a partition never cached is computed inline, from its own inputs
    lin2 = Lineage()
    assert lin2.needs(top, [2])[1] == {}


def test_losing_a_worker_marks_its_map_outputs_missing_and_keeps_the_version():
    lin = Lineage()
    lin.shuffle_started(7, 3, version=2)
    for m, w in enumerate([b"w0", b"w1", b"w1"]):
        lin.map_output(7, m, w)
    assert lin.missing_maps(7) == []
    shuffles, keys = lin.lose_worker(b"w1")
    assert shuffles == {7} and keys == set()
    assert lin.missing_maps(7) == [1, 2] and lin.shuffle_made[7] == 2
    lin.map_output(7, 1, b"w2")
    assert lin.missing_maps(7) == [2]
    lin.map_output(7, 1, b"w3")                 # a late duplicate does not move it
    assert lin.shuffles[7][1] == b"w2"


def test_a_block_a_live_worker_lacks_is_lost_only_where_it_was_recorded():
    lin = Lineage()
    lin.shuffle_started(1, 2, version=1)
    lin.map_output(1, 0, b"w0")
    lin.map_output(1, 1, b"w1")
    lin.cached(9, 0, b"w0", version=1)
    lin.lose_block(b"w1", ("shuffle", 1, 0, 0))  # w1 does not hold map 0: nothing changes
    assert lin.missing_maps(1) == []
    lin.lose_block(b"w0", ("shuffle", 1, 0, 3))
    assert lin.missing_maps(1) == [0]
    lin.lose_block(b"w0", ("cache", 9, 0))
    assert (9, 0) not in lin.cache and lin.cache_made[(9, 0)] == 1


def test_versions_count_lost_outputs_until_forgotten():
    lin = Lineage()
    lin.shuffle_started(1, 1, version=4)
    lin.cached(5, 0, b"w0", version=2)
    lin.cached(5, 1, b"w1", version=7)
    lin.lose_worker(b"w0")
    assert lin.versions() == {2, 4, 7}          # 2 is lost, but a re-run would read at it
    lin.forget("cache", 5)
    assert lin.versions() == {4}
    lin.forget("shuffle", 1)
    assert lin.versions() == set()
