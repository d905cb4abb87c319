"""The library objects users ship as globals, each with a lookup that
reads it: built under ``clamor.heap()`` by the tests, the differential
hunt and the compatibility table (``tests/compat_table.py``).

``KINDS`` maps a name to (build, use): ``build(rng)`` returns (object,
query), ``use(object, query)`` a JSON-able answer that must be the same on
a worker as in the driver.
"""
import collections
import datetime
import decimal
import fractions

import os

import numpy as np

# PYDATA_SCALE multiplies the size of the lookup-table kinds (frame, series,
# graph, csr, counter, ddict): the compatibility table measures bytes read
# against the pickled size on large ones.
SCALE = max(1, int(os.environ.get("PYDATA_SCALE", "1")))


def _xy(rng, n=300):
    X = rng.normal(size=(n, 5))
    return X, (X[:, 0] + 0.3 * X[:, 1] > 0).astype(int)


def _rf(n_jobs):
    def build(rng):
        from sklearn.ensemble import RandomForestClassifier
        X, y = _xy(rng)
        return RandomForestClassifier(n_estimators=12, random_state=0, n_jobs=n_jobs).fit(X, y), X[:8]
    return build


def _knn(rng):
    from sklearn.neighbors import NearestNeighbors
    X, _ = _xy(rng)
    return NearestNeighbors(algorithm="ball_tree").fit(X), X[:5]


def _kdknn(rng):
    from sklearn.neighbors import KNeighborsClassifier
    X, y = _xy(rng)
    return KNeighborsClassifier(algorithm="kd_tree").fit(X, y), X[:5]


def _pipe(rng):
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler
    X, y = _xy(rng)
    return make_pipeline(StandardScaler(), LogisticRegression()).fit(X, y), X[:8]


def _kmeans(rng):
    from sklearn.cluster import KMeans
    X, _ = _xy(rng)
    return KMeans(n_clusters=4, n_init=2, random_state=0).fit(X), X[:8]


def _pca(rng):
    from sklearn.decomposition import PCA
    X, _ = _xy(rng)
    return PCA(n_components=3).fit(X), X[:4]


def _docs(rng, n=80):
    return [" ".join(f"w{int(v)}" for v in rng.integers(0, 60, 15)) for _ in range(n)]


def _tfidf(rng):
    from sklearn.feature_extraction.text import TfidfVectorizer
    docs = _docs(rng)
    return TfidfVectorizer().fit(docs), docs[:4]


def _counts(rng):
    from sklearn.feature_extraction.text import CountVectorizer
    docs = _docs(rng)
    return CountVectorizer(ngram_range=(1, 2)).fit(docs), docs[:4]


def _frame(rng):
    import pandas as pd
    n = 400 * SCALE
    df = pd.DataFrame({"id": [f"k{i}" for i in range(n)], "g": rng.integers(0, 5, n), "v": rng.normal(size=n)})
    return df.set_index("id"), ["k3", "k77", "k301"]


def _frame_cat(rng):
    import pandas as pd
    n = 300
    return pd.DataFrame({"c": pd.Categorical(rng.choice(["a", "b", "c"], n)), "v": rng.normal(size=n),
                         "t": pd.date_range("2020-01-01", periods=n, freq="h")}), ["a", "c"]


def _series(rng):
    import pandas as pd
    n = 200 * SCALE
    return pd.Series(rng.normal(size=n), index=[f"s{i}" for i in range(n)]), ["s1", "s9", "s150"]


def _graph(rng):
    import networkx as nx
    return nx.gnm_random_graph(150 * SCALE, 500 * SCALE, seed=int(rng.integers(1 << 30))), [0, 7, 99]


def _digraph(rng):
    import networkx as nx
    g = nx.DiGraph()
    for _ in range(400):
        a, b = (int(x) for x in rng.integers(0, 120, 2))
        g.add_edge(a, b, w=float(rng.random()))
    return g, sorted(g.nodes)[:4]


def _csr(rng):
    import scipy.sparse as sp
    return sp.random(200 * SCALE, 150, density=0.05, format="csr", random_state=int(rng.integers(1 << 30))), [0, 5, 199]


def _csc(rng):
    import scipy.sparse as sp
    return sp.random(100, 80, density=0.1, format="csc", random_state=int(rng.integers(1 << 30))), [1, 79]


def _counter(rng):
    return collections.Counter(f"w{int(v)}" for v in rng.integers(0, 100 * SCALE, 1000 * SCALE)), ["w1", "w2", "w99"]


def _ddict(rng):
    d = collections.defaultdict(list)
    for i in range(300 * SCALE):
        d[f"k{int(rng.integers(0, 40 * SCALE))}"].append(i)
    return d, ["k1", "k2", "k39"]


def _odict(rng):
    return collections.OrderedDict((f"o{i}", (i, float(rng.random()))) for i in range(200)), ["o0", "o199"]


def _deque(rng):
    return collections.deque(int(v) for v in rng.integers(0, 1000, 300)), [0, 150, -1]


def _stdlib(rng):
    """Keys and values of standard-library types with C fields."""
    base = datetime.datetime(2024, 1, 1)
    return ({base + datetime.timedelta(hours=i): (decimal.Decimal(i) / 7, fractions.Fraction(i, 3))
             for i in range(100)}, [base, base + datetime.timedelta(hours=50)])


def _use(kind, obj, q):
    if kind in ("rf1", "rf2", "pipe", "kmeans", "kdknn"):
        return obj.predict(q).tolist()
    if kind == "knn":
        return obj.kneighbors(q, 3)[1].tolist()
    if kind == "pca":
        return np.round(obj.transform(q), 9).tolist()
    if kind in ("tfidf", "counts"):
        return np.round(obj.transform(q).toarray(), 9).tolist()
    if kind == "frame":
        if SCALE > 1:    # a lookup only: what the table measures
            return [float(obj.loc[k, "v"]) for k in q]
        sub = obj[obj.v > 0].groupby("g").v.sum()
        return [float(obj.loc[k, "v"]) for k in q] + [round(float(x), 9) for x in sub]
    if kind == "frame_cat":
        return [round(float(obj[obj.c == c].v.sum()), 9) for c in q] + [str(obj.t.iloc[-1])]
    if kind == "series":
        return [float(obj[k]) for k in q]
    if kind == "graph":
        return [sorted(obj[n]) for n in q] + ([] if SCALE > 1 else [obj.number_of_edges()])
    if kind == "digraph":
        return [sorted((m, round(d["w"], 12)) for m, d in obj[n].items()) for n in q]
    if kind in ("csr", "csc"):
        return [round(float(obj[:, i].sum() if kind == "csc" else obj[i].sum()), 9) for i in q] + [int(obj.nnz)]
    if kind in ("counter", "ddict"):
        # (a method looked up on the instance reads its __dict__ first)
        return [obj[k] for k in q] + [obj.get(q[0])]
    if kind == "odict":
        return [obj[k] for k in q] + [next(iter(obj))]
    if kind == "deque":
        return [obj[i] for i in q] + [len(obj)]
    if kind == "stdlib":
        return [[str(x) for x in obj[k]] for k in q]
    raise KeyError(kind)


BUILD = {"rf1": _rf(1), "rf2": _rf(2), "knn": _knn, "kdknn": _kdknn, "pipe": _pipe, "kmeans": _kmeans, "pca": _pca,
         "tfidf": _tfidf, "counts": _counts, "frame": _frame, "frame_cat": _frame_cat, "series": _series,
         "graph": _graph, "digraph": _digraph, "csr": _csr, "csc": _csc, "counter": _counter, "ddict": _ddict,
         "odict": _odict, "deque": _deque, "stdlib": _stdlib}
KINDS = list(BUILD)
LIBRARIES = ("sklearn.ensemble", "sklearn.neighbors", "sklearn.pipeline", "sklearn.preprocessing",
             "sklearn.linear_model", "sklearn.cluster", "sklearn.decomposition", "sklearn.feature_extraction.text",
             "pandas", "networkx", "scipy.sparse")


def build(kind, seed=0):
    return BUILD[kind](np.random.default_rng(seed))


def use(kind, obj, q):
    return _use(kind, obj, q)


def import_libraries():
    import importlib
    for m in LIBRARIES:
        importlib.import_module(m)
