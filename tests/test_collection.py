"""End-to-end tests of DataCollection: every source, transformation and
action, checked against the same computation in plain Python.

One module-scoped cluster (two forked workers) serves every test; the pytest
process is its driver.  The workers are forked from this process, so the
functions of this module travel by reference and everything else (lambdas,
closures) by value.
"""
import collections
import functools
import operator
import os

import numpy as np
import pytest

import clamor


@pytest.fixture(scope="module")
def arrays():
    """Arrays for test_parallelize_ndarray, plain and in the region.  The
    region ones are made before the cluster runs anything: workers keep the
    pages they fetch and nothing invalidates them yet, so an array allocated
    after a stage could share a page a worker already holds."""
    a = np.arange(1000, dtype=np.int64) * 3
    m = np.arange(60, dtype=np.float64).reshape(20, 3)
    return {"plain": (a, m), "region": (clamor.array(a), clamor.array(m))}


@pytest.fixture(scope="module")
def cl(arrays):
    with clamor.Cluster(workers=2, progress=False) as c:
        yield c


def new_stages(cl, before):
    """Stage stats recorded since ``before`` stages had run."""
    return cl.stage_stats()[before:]


def stage_count(cl):
    return len(cl.stage_stats())


def py_reduce_by_key(pairs, fn):
    out = {}
    for k, v in pairs:
        out[k] = fn(out[k], v) if k in out else v
    return out


def py_group_by_key(pairs):
    out = {}
    for k, v in pairs:
        out.setdefault(k, []).append(v)
    return out


def py_join(left, right):
    return [(k, (v, w)) for k, v in left for k2, w in right if k == k2]


def as_groups(collected):
    """group_by_key output as {key: Counter(values)}; keys must be unique."""
    keys = [k for k, _ in collected]
    assert len(keys) == len(set(keys)), "a key came out of two reduce partitions"
    return {k: collections.Counter(vs) for k, vs in collected}


def counted(path):
    """How many times ``mark`` wrote to ``path`` (one line per call)."""
    if not os.path.exists(path):
        return 0
    with open(path) as f:
        return len(f.read().splitlines())


def marker(path):
    """A function that returns its argument and leaves one line in ``path``
    (O_APPEND writes of a few bytes do not interleave)."""
    path = str(path)

    def mark(x):
        with open(path, "a") as f:
            f.write(f"{os.getpid()}\n")
        return x
    return mark


# ---- sources -----------------------------------------------------------------

@pytest.mark.parametrize("n,parts", [(0, 1), (0, 4), (1, 1), (5, 1), (3, 10), (100, 7), (1000, 13), (64, 64)])
def test_parallelize_list(cl, n, parts):
    data = [f"item{i}" for i in range(n)]
    d = cl.parallelize(data, partitions=parts)
    assert d.num_partitions == parts
    assert d.collect() == data
    assert d.count() == n


def test_parallelize_default_partitions_and_other_sequences(cl):
    assert cl.parallelize([7, 8, 9]).num_partitions == 3          # never more partitions than items
    assert cl.parallelize(list(range(100))).num_partitions == 4   # two per worker
    assert cl.parallelize([]).collect() == []
    assert cl.parallelize((1, 2, 3), 2).collect() == [1, 2, 3]
    assert cl.parallelize(range(5, 12), 3).collect() == list(range(5, 12))
    assert cl.parallelize((x * x for x in range(6)), 4).collect() == [0, 1, 4, 9, 16, 25]  # an iterator
    assert cl.parallelize("hello", 2).collect() == list("hello")
    objs = [None, {"a": [1, 2]}, (3, "x"), 4.5, b"raw", frozenset({1})]
    assert cl.parallelize(objs, 4).collect() == objs


@pytest.mark.parametrize("kind", ["plain", "region"])
def test_parallelize_ndarray(cl, arrays, kind):
    a, m = arrays[kind]
    assert clamor.in_region(a) == (kind == "region")
    d = cl.parallelize(a, partitions=6)
    kinds = d.map_partitions(lambda part: [(type(part).__name__, part.dtype.str, len(part))]).collect()
    assert [k[:2] for k in kinds] == [("ndarray", "<i8")] * 6
    assert sum(k[2] for k in kinds) == 1000
    assert d.collect() == list(a)
    assert d.sum() == int(a.sum())
    assert d.count() == 1000
    assert d.map(lambda x: int(x) // 3).collect() == list(range(1000))

    rows = cl.parallelize(m, partitions=7)
    assert rows.count() == 20
    assert np.array_equal(np.array(rows.collect()), m)
    assert np.array_equal(rows.sum(), m.sum(axis=0))   # rows add up elementwise
    assert rows.map(lambda r: float(r[1])).collect() == list(m[:, 1])


def test_collected_rows_are_values_not_views_of_the_region(cl, arrays):
    # A result is what the task saw: rows of a region array (collect, take,
    # a reduce that returns one of its arguments) must not come back as
    # references that read the driver's memory, which the driver writes next.
    m = arrays["region"][1]
    saved = m.copy()
    rows = cl.parallelize(m, partitions=3).collect()
    first = cl.parallelize(m, partitions=3).take(2)
    biggest = cl.parallelize(m, partitions=3).reduce(lambda a, b: a if a[0] > b[0] else b)
    try:
        m[:] = -1
        assert np.array_equal(np.array(rows), saved)
        assert np.array_equal(np.array(first), saved[:2])
        assert np.array_equal(biggest, saved[-1])
    finally:
        m[:] = saved


def test_collect_and_take_keep_numpy_element_types(cl):
    a = np.arange(100, dtype=np.uint16)
    out = cl.parallelize(a, partitions=4).collect()
    assert out == list(a) and {type(x) for x in out} == {np.uint16}
    got = cl.parallelize(a, partitions=4).take(30)
    assert got == list(range(30)) and {type(x) for x in got} == {np.uint16}
    cases = [
        [np.float32(i) / 3 for i in range(50)],
        [np.int32(i) if i % 2 else np.int64(i) for i in range(64)],      # two types in a partition
        [np.bool_(i % 3 == 0) for i in range(40)],
        [np.complex64(i + 1j) for i in range(40)],
        [np.timedelta64(i, "s") if i % 5 else np.timedelta64(i, "ms") for i in range(40)],
        [np.float64(i) for i in range(39)] + [7],                        # a Python int among them
    ]
    for xs in cases:
        d = cl.parallelize(xs, partitions=2)
        for out in (d.collect(), d.map(lambda x: x).collect(), d.take(len(xs))):
            assert [(type(x), x) for x in out] == [(type(x), x) for x in xs]
            assert [str(x) for x in out] == [str(x) for x in xs]       # timedelta units


@pytest.mark.parametrize("args,parts", [
    ((10,), None), ((10,), 1), ((10,), 3), ((3, 17), 4), ((20, 3, -3), 2), ((-5, 5, 2), 3),
    ((0,), None), ((5, 5), 2), ((7,), 20), ((1, 1000, 7), 9),
])
def test_range(cl, args, parts):
    d = cl.range(*args, partitions=parts)
    want = list(range(*args))
    assert d.collect() == want
    assert d.count() == len(want)
    assert d.sum() == sum(want)
    if parts is not None:
        assert d.num_partitions == parts


def expected_lines(data):
    """Lines of ``data`` (bytes): split at "\\n", one "\\r" before it dropped,
    no empty line after a final newline."""
    lines = data.split(b"\n")
    last = lines.pop()
    out = [ln[:-1] if ln.endswith(b"\r") else ln for ln in lines]
    if last:
        out.append(last)
    return [ln.decode("utf-8") for ln in out]


@pytest.fixture(scope="module")
def text_files(tmp_path_factory):
    d = tmp_path_factory.mktemp("text")
    long_lines = "".join(f"{i:05d} {'ü€x' * (i % 13)} {'y' * (i * 7 % 61)}\n" for i in range(400))
    contents = {
        "a_newline.txt": b"alpha\nbeta\n\ngamma\n",
        "b_no_newline.txt": b"first line\nsecond line\nlast without newline",
        "c_empty.txt": b"",
        "d_crlf.txt": b"one\r\ntwo\r\n\r\nthree \r\nfour\r\n",
        "e_long.txt": long_lines.encode("utf-8"),
        "f_single.txt": b"just one line",
        "g_crlf_no_end.txt": b"x\r\ny\r\nz",
        "h_blank_lines.txt": b"\n\n\nafter blanks\n\n",
        "i_odd_cr.txt": b"a\r\r\nmid\rline\r\n\rlead\n",
    }
    paths = []
    for name, data in contents.items():
        p = d / name
        p.write_bytes(data)
        paths.append(str(p))
    want = [line for name in contents for line in expected_lines(contents[name])]
    return d, paths, want


@pytest.mark.parametrize("parts", [None, 1, 9, 10, 37, 400])
def test_read_text_splits_keep_every_line_once(cl, text_files, parts):
    _, paths, want = text_files
    d = cl.read_text(paths, partitions=parts)
    if parts is not None and parts > len(paths):
        assert d.num_partitions > len(paths)     # files are split, not only one partition each
    assert d.collect() == want
    assert d.count() == len(want)


def test_read_text_split_at_every_byte(cl, text_files):
    # Each small file alone, cut into ranges of about one byte (and more
    # ranges than bytes): every split point falls once on every position,
    # inside "\r\n", right after "\n", inside a line.
    _, paths, _ = text_files
    for path in paths:
        data = open(path, "rb").read()
        if len(data) > 64:
            continue
        for parts in (2, 3, max(1, len(data)), len(data) + 5):
            d = cl.read_text(path, partitions=parts)
            assert d.collect() == expected_lines(data), (path, parts)


def test_read_text_single_path_glob_and_missing(cl, text_files, tmp_path):
    folder, paths, want = text_files
    assert cl.read_text(paths[0]).collect() == ["alpha", "beta", "", "gamma"]
    assert cl.read_text(str(folder / "*.txt"), partitions=11).collect() == want   # glob: sorted names
    assert cl.read_text(paths[2]).collect() == []                                   # the empty file
    with pytest.raises(FileNotFoundError):
        cl.read_text(str(tmp_path / "nope.txt"))
    with pytest.raises(FileNotFoundError):
        cl.read_text(str(tmp_path / "none*.txt"))


def test_read_text_then_transform(cl, text_files):
    _, paths, want = text_files
    words = cl.read_text(paths, partitions=13).flat_map(str.split).map(lambda w: (w, 1))
    got = dict(words.reduce_by_key(operator.add, partitions=5).collect())
    assert got == dict(collections.Counter(w for line in want for w in line.split()))


def test_read_npy(cl, tmp_path):
    arrs = [np.arange(10, dtype=np.int32), np.arange(0, dtype=np.int32), np.arange(100, 107, dtype=np.int32)]
    paths = []
    for i, a in enumerate(arrs):
        p = tmp_path / f"part{i}.npy"
        np.save(p, a)
        paths.append(str(p))
    d = cl.read_npy(paths)
    assert d.num_partitions == 3
    assert d.collect() == [x for a in arrs for x in a]
    assert d.count() == 17
    assert d.sum() == sum(int(a.sum()) for a in arrs)
    assert d.map_partitions(lambda part: [(type(part).__name__, part.dtype.str, part.shape)]).collect() == [
        ("ndarray", "<i4", (10,)), ("ndarray", "<i4", (0,)), ("ndarray", "<i4", (7,))]
    assert cl.read_npy(str(tmp_path / "part*.npy")).collect() == d.collect()

    m = np.arange(24, dtype=np.float64).reshape(8, 3)
    np.save(tmp_path / "m.npy", m)
    rows = cl.read_npy(str(tmp_path / "m.npy"))
    assert np.array_equal(np.array(rows.collect()), m)
    assert np.array_equal(rows.sum(), m.sum(axis=0))
    assert rows.map(lambda r: float(r @ r)).collect() == [float(r @ r) for r in m]
    with pytest.raises(FileNotFoundError):
        cl.read_npy(str(tmp_path / "missing.npy"))


# ---- narrow transformations --------------------------------------------------------

def test_map_filter_flat_map(cl):
    data = list(range(-50, 150))
    d = cl.parallelize(data, partitions=7)
    assert d.map(lambda x: x * x - 1).collect() == [x * x - 1 for x in data]
    assert d.filter(lambda x: x % 3 == 0).collect() == [x for x in data if x % 3 == 0]
    assert d.filter(lambda x: False).collect() == []
    assert d.flat_map(lambda x: [x] * (x % 3)).collect() == [y for x in data for y in [x] * (x % 3)]
    assert d.flat_map(lambda x: range(x % 4)).count() == sum(x % 4 for x in data)
    assert d.flat_map(lambda x: ()).collect() == []
    chained = d.map(lambda x: x + 1).filter(lambda x: x % 2).flat_map(lambda x: (x, -x)).map(abs)
    assert chained.collect() == [abs(y) for x in data if (x + 1) % 2 for y in (x + 1, -(x + 1))]
    assert d.key_by(lambda x: x % 5).take(3) == [(x % 5, x) for x in data[:3]]
    assert d.map(lambda x: (x, x)).map_values(str).collect() == [(x, str(x)) for x in data]


def test_map_partitions(cl):
    data = list(range(23))
    d = cl.parallelize(data, partitions=5)
    sizes = d.map_partitions(lambda part: [len(part)]).collect()
    assert sizes == [len(data[(23 * i) // 5:(23 * (i + 1)) // 5]) for i in range(5)]
    assert d.map_partitions(lambda part: (x * 2 for x in part)).collect() == [x * 2 for x in data]  # generator
    assert d.map_partitions(lambda part: (x for x in part if x > 100)).count() == 0
    assert d.map_partitions(lambda part: [sum(part)]).sum() == sum(data)
    assert d.map_partitions_with_index(lambda i, part: [(i, x) for x in part]).collect() == [
        (i, x) for i in range(5) for x in data[(23 * i) // 5:(23 * (i + 1)) // 5]]


def test_zip(cl):
    a = cl.range(10, partitions=3)
    b = cl.range(10, 20, partitions=3)
    assert a.zip(b).collect() == list(zip(range(10), range(10, 20)))
    left = cl.parallelize(list("abcdefg"), 4)
    assert left.zip(left.map(str.upper)).collect() == [(c, c.upper()) for c in "abcdefg"]
    assert cl.parallelize([], 2).zip(cl.range(0, partitions=2)).collect() == []
    assert a.zip(b).map(lambda ab: ab[0] * ab[1]).sum() == sum(x * y for x, y in zip(range(10), range(10, 20)))


def test_zip_mismatched_sizes_raise(cl):
    with pytest.raises(clamor.ConfigError):
        cl.range(10, partitions=3).zip(cl.range(10, partitions=4))       # partition counts differ
    with pytest.raises(TypeError):
        cl.range(10).zip(list(range(10)))
    bad = cl.range(10, partitions=2).zip(cl.range(11, partitions=2))    # a partition has one more
    with pytest.raises(clamor.TaskError, match="zip"):
        bad.collect()
    shrunk = cl.range(10, partitions=2).zip(cl.range(10, partitions=2).filter(lambda x: x != 3))
    with pytest.raises(clamor.TaskError, match="zip"):
        shrunk.count()
    assert cl.range(4, partitions=2).collect() == [0, 1, 2, 3]   # still usable


# ---- keyed transformations -----------------------------------------------------------

KEYS = ["a", "", "ünï€", "a b", ("t", 1), ("t", (2, None)), (), None, -1, -7, 0, 3, 2 ** 70, -(2 ** 70),
        1.5, -0.25, float("inf"), frozenset({1, 2}), b"bytes", (None, -1.5, "z")]


def keyed_pairs(n=600):
    return [(KEYS[(i * 7) % len(KEYS)], i) for i in range(n)]


@pytest.mark.parametrize("parts,shuffle_parts", [(1, 1), (4, 3), (7, None), (3, 64)])
def test_reduce_by_key_nontrivial_keys(cl, parts, shuffle_parts):
    pairs = keyed_pairs()
    out = cl.parallelize(pairs, parts).reduce_by_key(operator.add, partitions=shuffle_parts).collect()
    assert len(out) == len(KEYS)
    assert dict(out) == py_reduce_by_key(pairs, operator.add)
    mx = cl.parallelize(pairs, parts).reduce_by_key(max, partitions=shuffle_parts).collect()
    assert dict(mx) == py_reduce_by_key(pairs, max)


@pytest.mark.parametrize("parts,shuffle_parts", [(1, 1), (5, 2), (3, 40)])
def test_group_by_key_nontrivial_keys(cl, parts, shuffle_parts):
    pairs = keyed_pairs()
    out = cl.parallelize(pairs, parts).group_by_key(partitions=shuffle_parts).collect()
    assert as_groups(out) == {k: collections.Counter(v) for k, v in py_group_by_key(pairs).items()}
    assert all(isinstance(vs, list) for _, vs in out)


def test_equal_keys_of_different_types_meet(cl):
    # 3 == 3.0, -3 == -3.0, 0 == -0.0 == False, np.int64(5) == 5: one group each, as in a dict
    pairs = [(3, 1), (3.0, 2), (-3, 4), (-3.0, 8), (0, 16), (-0.0, 32), (False, 64), (np.int64(5), 128),
             (5, 256), (("k", 2), 512), (("k", 2.0), 1024), (np.float64(2.5), 2048), (2.5, 4096)]
    for shuffle_parts in (2, 3, 7, 13):
        got = cl.parallelize(pairs, 4).reduce_by_key(operator.add, partitions=shuffle_parts).collect()
        assert dict(got) == py_reduce_by_key(pairs, operator.add)
        assert len(got) == 6


def test_skewed_keys(cl):
    pairs = [("hot" if i % 10 else f"cold{i}", i) for i in range(5000)]   # 90% on one key
    d = cl.parallelize(pairs, 8)
    assert dict(d.reduce_by_key(operator.add, partitions=4).collect()) == py_reduce_by_key(pairs, operator.add)
    groups = as_groups(d.group_by_key(partitions=4).collect())
    assert sum(groups["hot"].values()) == 4500
    assert groups == {k: collections.Counter(v) for k, v in py_group_by_key(pairs).items()}
    other = cl.parallelize([("hot", "H"), ("hot", "H2"), ("cold10", "C")], 2)
    joined = d.join(other, partitions=3).collect()
    assert collections.Counter(joined) == collections.Counter(py_join(pairs, other.collect()))
    assert len(joined) == 4500 * 2 + 1


def test_join_duplicates_and_one_sided_keys(cl):
    left = [(1, "a"), (2, "b"), (1, "c"), ("s", 0), (None, "n"), ((1, 2), "t"), (9, "only left"), (1, "a")]
    right = [(1, "X"), (1, "Y"), ("s", 1), ("s", 2), (None, "N"), ((1, 2), "T"), (8, "only right")]
    for lp, rp, jp in [(1, 1, None), (3, 2, None), (2, 5, 1), (4, 4, 11)]:
        got = cl.parallelize(left, lp).join(cl.parallelize(right, rp), partitions=jp).collect()
        assert collections.Counter(got) == collections.Counter(py_join(left, right))
    assert cl.parallelize(left, 2).join(cl.parallelize([(7, 0)], 1)).collect() == []
    cg = dict(cl.parallelize(left, 2).cogroup(cl.parallelize(right, 3), partitions=2).collect())
    assert set(cg) == {k for k, _ in left} | {k for k, _ in right}
    assert sorted(cg[1][0]) == ["a", "a", "c"] and sorted(cg[1][1]) == ["X", "Y"]
    assert cg[9] == (["only left"], []) and cg[8] == ([], ["only right"])


def test_keyed_ops_reject_non_pairs(cl):
    with pytest.raises(clamor.TaskError, match="pairs"):
        cl.range(5).reduce_by_key(operator.add).collect()
    assert cl.parallelize([(1, 1), (1, 2)]).reduce_by_key(operator.add).collect() == [(1, 3)]


def test_chain_of_shuffles(cl):
    words = [f"w{(i * i) % 37}" for i in range(2000)]
    counts = cl.parallelize(words, 6).map(lambda w: (w, 1)).reduce_by_key(operator.add, partitions=4)
    by_count = counts.map(lambda kv: (kv[1] % 5, kv[0])).group_by_key(partitions=3)
    sizes = by_count.map_values(len)
    before = stage_count(cl)
    got = dict(sizes.collect())
    py_counts = collections.Counter(words)
    py_by = py_group_by_key([(c % 5, w) for w, c in py_counts.items()])
    assert got == {k: len(v) for k, v in py_by.items()}
    assert [s["kind"] for s in new_stages(cl, before)] == ["map", "map", "collect"]   # two shuffles, one result

    # a third and fourth shuffle: join the counts back onto the groups, then reduce again
    flat = by_count.flat_map(lambda kv: [(w, kv[0]) for w in kv[1]])
    joined = flat.join(counts, partitions=5).map(lambda kv: (kv[1][0], kv[1][1])).reduce_by_key(operator.add, 2)
    want = py_reduce_by_key([(c % 5, c) for c in py_counts.values()], operator.add)
    assert dict(joined.collect()) == want


def test_shuffle_partition_count_is_checked(cl):
    d = cl.parallelize([(1, 2)])
    for bad in (0, -1):
        with pytest.raises(clamor.ConfigError):
            d.reduce_by_key(operator.add, partitions=bad)
        with pytest.raises(clamor.ConfigError):
            d.group_by_key(partitions=bad)
        with pytest.raises(clamor.ConfigError):
            d.join(d, partitions=bad)
    assert d.group_by_key(partitions=1).num_partitions == 1


# ---- actions -----------------------------------------------------------------------

def test_reduce(cl):
    words = [f"<{i}>" for i in range(40)]
    d = cl.parallelize(words, 6)
    assert d.reduce(operator.add) == "".join(words)       # partition order is kept
    assert cl.range(1, 11, partitions=4).reduce(operator.mul) == 3628800
    assert cl.parallelize([42], 5).reduce(operator.add) == 42              # four empty partitions
    assert cl.range(100, partitions=9).filter(lambda x: x == 57).reduce(max) == 57
    assert cl.parallelize([[1], [2, 3], []], 2).reduce(operator.add) == [1, 2, 3]


def test_reduce_of_empty_raises_value_error(cl):
    with pytest.raises(ValueError):
        cl.parallelize([], 3).reduce(operator.add)
    with pytest.raises(ValueError):
        cl.range(0).reduce(operator.add)
    with pytest.raises(ValueError):
        cl.range(50, partitions=5).filter(lambda x: x < 0).reduce(operator.add)


def test_sum_and_count(cl):
    floats = [i / 7 for i in range(300)]
    assert cl.parallelize(floats, 9).sum() == pytest.approx(sum(floats))
    assert cl.parallelize([], 3).sum() == 0
    assert cl.range(100, partitions=10).filter(lambda x: x > 95).sum() == 96 + 97 + 98 + 99
    assert cl.parallelize([[1], [2]], 2).sum() == [1, 2]              # whatever + means
    assert cl.parallelize([], 4).count() == 0
    assert cl.range(1000, partitions=11).filter(lambda x: x % 7 == 0).count() == len(range(0, 1000, 7))


def test_take(cl):
    data = list(range(100))
    d = cl.parallelize(data, 10)
    assert d.take(0) == [] and d.take(-3) == []
    before = stage_count(cl)
    assert d.take(3) == [0, 1, 2]
    st = new_stages(cl, before)
    assert len(st) == 1 and st[0]["tasks"] == 1                # only the first partition ran
    assert d.take(10) == data[:10]
    assert d.take(25) == data[:25]                            # across partitions
    assert d.take(100) == data
    assert d.take(1000) == data                               # more than there is
    assert cl.parallelize([], 3).take(5) == []
    sparse = d.filter(lambda x: x >= 85)                      # the first partitions are empty
    assert sparse.take(4) == [85, 86, 87, 88]
    assert sparse.take(50) == data[85:]
    assert cl.parallelize(data, 1).take(7) == data[:7]
    assert cl.range(5, partitions=20).take(9) == [0, 1, 2, 3, 4]   # more partitions than items


def test_foreach(cl, tmp_path):
    out = tmp_path / "foreach"
    out.mkdir()
    folder = str(out)

    def write(x):
        with open(os.path.join(folder, f"{x}.txt"), "w") as f:
            f.write(str(x * 3))

    assert cl.range(-5, 30, partitions=6).foreach(write) is None
    got = {int(n[:-4]): int((out / n).read_text()) for n in os.listdir(folder)}
    assert got == {x: x * 3 for x in range(-5, 30)}
    cl.parallelize([], 2).foreach(write)
    assert len(os.listdir(folder)) == 35


# ---- empty collections through every operation -------------------------------------

def test_empty_collection_everywhere(cl):
    for e in (cl.parallelize([], 1), cl.parallelize([], 4), cl.range(0, partitions=3), cl.range(3).filter(bool)
              .filter(lambda x: x > 5)):
        assert e.collect() == [] and e.count() == 0 and e.sum() == 0 and e.take(3) == []
        assert e.map(str).collect() == [] and e.filter(bool).collect() == [] and e.flat_map(list).collect() == []
        assert e.map_partitions(lambda p: [len(p)]).sum() == 0
        assert e.reduce_by_key(operator.add).collect() == [] and e.group_by_key(2).collect() == []
        assert e.join(cl.parallelize([(1, 2)])).collect() == []
        assert cl.parallelize([(1, 2)]).join(e.map(lambda x: (x, x))).collect() == []
        with pytest.raises(ValueError):
            e.reduce(operator.add)


# ---- cache ---------------------------------------------------------------------------

def test_cache_reuses_partitions_across_actions(cl, tmp_path):
    log = tmp_path / "calls"
    data = list(range(200))
    c = cl.parallelize(data, 6).map(marker(log)).map(lambda x: x * 2).cache()
    assert c.sum() == sum(x * 2 for x in data)
    assert counted(log) == 200
    before = stage_count(cl)
    assert c.count() == 200
    assert c.collect() == [x * 2 for x in data]
    assert c.take(5) == [0, 2, 4, 6, 8]
    assert c.filter(lambda x: x % 3 == 0).count() == len([x for x in data if x * 2 % 3 == 0])  # derived, too
    assert counted(log) == 200                      # nothing upstream of the cache ran again
    assert [s["kind"] for s in new_stages(cl, before)] == ["count", "collect", "take", "count"]

    c.unpersist()
    assert c.count() == 200
    assert counted(log) == 400                      # recomputed from lineage after unpersist


def test_uncached_recomputes(cl, tmp_path):
    log = tmp_path / "calls"
    d = cl.parallelize(list(range(50)), 3).map(marker(log))
    d.count()
    d.count()
    assert counted(log) == 100


def test_cache_after_shuffle_skips_the_map_stage(cl, tmp_path):
    log = tmp_path / "calls"
    pairs = [(i % 13, i) for i in range(500)]
    c = cl.parallelize(pairs, 5).map(marker(log)).reduce_by_key(operator.add, partitions=3).cache()
    before = stage_count(cl)
    first = dict(c.collect())
    assert [s["kind"] for s in new_stages(cl, before)] == ["map", "collect"]
    assert first == py_reduce_by_key(pairs, operator.add)
    before = stage_count(cl)
    assert dict(c.collect()) == first
    assert c.map(lambda kv: kv[1]).sum() == sum(i for i in range(500))
    assert c.count() == 13
    assert [s["kind"] for s in new_stages(cl, before)] == ["collect", "sum", "count"]   # no shuffle map again
    assert counted(log) == 500
    # a further shuffle on top of the cached one reuses it, too
    top = c.map(lambda kv: (kv[0] % 2, kv[1])).reduce_by_key(operator.add, 2)
    assert dict(top.collect()) == py_reduce_by_key([(k % 2, v) for k, v in first.items()], operator.add)
    assert counted(log) == 500


def test_cache_of_empty_and_of_source(cl):
    e = cl.parallelize([], 3).cache()
    assert e.count() == 0 and e.collect() == []
    r = cl.range(30, partitions=4).cache()
    assert r.sum() == 435 and r.collect() == list(range(30)) and r.take(2) == [0, 1]
    arr = cl.parallelize(np.arange(12.0), 3).cache()
    assert arr.sum() == 66.0 and arr.count() == 12 and arr.collect() == list(np.arange(12.0))


def test_functools_partial_and_builtins_travel(cl):
    add3 = functools.partial(operator.add, 3)
    assert cl.range(5).map(add3).collect() == [3, 4, 5, 6, 7]
    assert cl.parallelize(["b", "a"], 2).map(str.upper).collect() == ["B", "A"]
