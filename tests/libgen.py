"""The driver of the differential hunt over library objects
(test_differential_libraries.py): scikit-learn models, pandas frames and
series, networkx graphs, scipy.sparse matrices and the collections types of
``pydata_objects``, plus models with ``partial_fit``, built and then
changed by the driver between stages.

The test runs ``main(seed, mode)`` in a fresh interpreter (this module
imported from tests/, so that spawned workers import it by name).  A
``random.Random(seed)`` picks kinds and builds each under ``clamor.heap()``
with random sizes and parameters, half before the Cluster starts its
workers and half inside the open Cluster, each in a region dict ``box``
(``box["v"]``) so that an update may also replace it.  Each round the
driver applies zero to two random updates to each object (``OPS``: what a
user does with the library: ``df.loc[k, "v"] = x``, a row or a column
added, ``G.add_edge``, ``A.data[i] = x``, ``A = A + B``, ``c[k] += 1``,
``model.fit`` again, ``partial_fit``, ``d.popleft()``...), each inside a
block or outside any (``@in``, ``@out``).  Then for each object:

- a random query, made from the object as it is now, read inside a block
  or outside (a reading may make a library's lazy state there);
- ``clamor.share(obj)`` (``portable=True`` for spawned workers): approved,
  or refused with a path and a reason (a refusal of an update made outside
  a block is expected; the Cluster's own check then decides whether the
  object travels by value);
- the driver's answer (``answer``: ``pydata_objects.use`` and a few more
  readings, floats rounded), and one stage of two tasks that answer the
  same query for the object as captured and as reached through ``box``.

In some rounds (``stage_first``) the stage runs before share() and before
the driver answers.  Every answer must be the driver's; a failed stage (the
Cluster is made with ``max_attempts=1``) and a lost worker are failures
too.  One JSON line reports what ran, what share() said and what differed.

The hunt runs with no workaround.  Library state made on first use
inside a block, which forked workers inherit, gave it wrong answers and
lost workers until CPython's slice cache, numpy's ufunc dispatch caches
and Cython's free lists were emptied before a fork and modules imported
in a block ran outside the region.
"""
import collections
import datetime
import decimal
import fractions
import json
import os
import pickle
import random
import time
import warnings

import numpy as np

import clamor
import pydata_objects as po

MODELS = ("rf1", "rf2", "knn", "kdknn", "pipe", "kmeans", "pca", "sgd", "mbkmeans", "ipca")


# ---- building, with random sizes and parameters ------------------------------------

def _xy(n, nrng):
    X = nrng.normal(size=(n, 5))
    return X, (X[:, 0] + 0.3 * X[:, 1] > 0).astype(int)


def _docs(n, nrng):
    return [" ".join(f"w{int(v)}" for v in nrng.integers(0, 80, int(nrng.integers(3, 20)))) for _ in range(n)]


def _model(kind, r):
    """An unfitted model of ``kind`` with random parameters."""
    from sklearn import cluster, decomposition, ensemble, linear_model, neighbors, pipeline, preprocessing
    from sklearn.feature_extraction import text
    seed = r.randrange(1 << 16)
    if kind in ("rf1", "rf2"):
        return ensemble.RandomForestClassifier(n_estimators=r.randint(3, 14), max_depth=r.choice([None, 3, 6]),
                                               random_state=seed, n_jobs=1 if kind == "rf1" else 2)
    if kind == "knn":
        return neighbors.NearestNeighbors(algorithm=r.choice(["ball_tree", "kd_tree", "brute"]))
    if kind == "kdknn":
        return neighbors.KNeighborsClassifier(n_neighbors=r.randint(1, 7), algorithm="kd_tree")
    if kind == "pipe":
        return pipeline.make_pipeline(preprocessing.StandardScaler(),
                                      linear_model.LogisticRegression(C=r.choice([0.1, 1.0, 10.0])))
    if kind == "kmeans":
        return cluster.KMeans(n_clusters=r.randint(2, 6), n_init=2, random_state=seed)
    if kind == "pca":
        return decomposition.PCA(n_components=r.randint(1, 4))
    if kind == "sgd":
        return linear_model.SGDClassifier(random_state=seed, max_iter=r.choice([5, 20]), tol=None)
    if kind == "mbkmeans":
        return cluster.MiniBatchKMeans(n_clusters=r.randint(2, 5), n_init=1, batch_size=r.choice([32, 64]),
                                       random_state=seed)
    if kind == "ipca":
        return decomposition.IncrementalPCA(n_components=r.randint(1, 4))
    if kind == "tfidf":
        return text.TfidfVectorizer(min_df=r.choice([1, 2]), sublinear_tf=r.random() < 0.5)
    return text.CountVectorizer(ngram_range=(1, r.choice([1, 2])))


def _fit(kind, m, r, nrng):
    """Fit ``m`` on new random data (a refit of a fitted one)."""
    if kind in ("tfidf", "counts"):
        return m.fit(_docs(r.randint(20, 120), nrng))
    X, y = _xy(r.randint(60, 300), nrng)
    return m.fit(X, y) if kind in ("rf1", "rf2", "kdknn", "pipe", "sgd") else m.fit(X)


def build(kind, r, nrng):
    """A new object of ``kind`` (call inside a block)."""
    import networkx as nx
    import pandas as pd
    import scipy.sparse as sp
    if kind in MODELS or kind in ("tfidf", "counts"):
        return _fit(kind, _model(kind, r), r, nrng)
    n = r.randint(20, 400)
    if kind == "frame":
        df = pd.DataFrame({"id": [f"k{i}" for i in range(n)], "g": nrng.integers(0, 5, n), "v": nrng.normal(size=n)})
        return df.set_index("id")
    if kind == "frame_cat":
        return pd.DataFrame({"c": pd.Categorical(nrng.choice(["a", "b", "c"], n)), "v": nrng.normal(size=n),
                             "t": pd.date_range("2020-01-01", periods=n, freq="h")})
    if kind == "series":
        return pd.Series(nrng.normal(size=n), index=[f"s{i}" for i in range(n)])
    if kind == "graph":
        g = nx.gnm_random_graph(n, r.randint(n, 3 * n), seed=r.randrange(1 << 30))
        for u, v in list(g.edges)[::3]:
            g[u][v]["w"] = r.random()
        return g
    if kind == "digraph":
        g = nx.DiGraph()
        for _ in range(2 * n):
            g.add_edge(r.randrange(n // 2 + 2), r.randrange(n // 2 + 2), w=r.random())
        return g
    if kind in ("csr", "csc"):
        return sp.random(r.randint(10, 250), r.randint(10, 150), density=r.choice([0.02, 0.1]), format=kind,
                         random_state=r.randrange(1 << 30))
    if kind == "counter":
        return collections.Counter(f"w{int(v)}" for v in nrng.integers(0, n, 3 * n))
    if kind == "ddict":
        d = collections.defaultdict(list)
        for i in range(n):
            d[f"k{r.randrange(n // 5 + 3)}"].append(i)
        return d
    if kind == "odict":
        return collections.OrderedDict((f"o{i}", (i, r.random())) for i in range(n))
    if kind == "deque":
        return collections.deque(int(v) for v in nrng.integers(0, 1000, n))
    if kind == "stdlib":
        base = datetime.datetime(2024, 1, 1)
        return {base + datetime.timedelta(hours=i): (decimal.Decimal(i) / 7, fractions.Fraction(i, 3))
                for i in range(n)}
    raise KeyError(kind)


KINDS = list(po.KINDS) + ["sgd", "mbkmeans", "ipca"]


# ---- updates: what a user does with each library -----------------------------------

def _new(r):
    return f"z{r.getrandbits(40)}"


def _frame_row(df, r):
    return [r.randint(0, 4) if c == "g" else round(r.gauss(0, 1), 6) for c in df.columns]


def _edge(g, r):
    return r.choice(list(g.edges)) if g.number_of_edges() else None


def _sparse_other(a, r):
    import scipy.sparse as sp
    return sp.random(*a.shape, density=0.03, format=a.format, random_state=r.randrange(1 << 30))


def _refit(kind):
    return lambda b, r, nrng: _fit(kind, b["v"], r, nrng)


def _partial(kind):
    def op(b, r, nrng):
        X, y = _xy(r.randint(20, 80), nrng)
        b["v"].partial_fit(X, y, classes=[0, 1]) if kind == "sgd" else b["v"].partial_fit(X)
    return op


def _rebuilt(kind):
    """The object replaced by a new one of the kind (box["v"] = ...)."""
    def op(b, r, nrng):
        b["v"] = build(kind, r, nrng)
    return op


def _frame_ops():
    def loc_set(b, r, nrng):
        df = b["v"]
        df.loc[r.choice(list(df.index)), "v"] = round(r.gauss(0, 1), 6)

    def add_row(b, r, nrng):
        df = b["v"]
        df.loc[_new(r)] = _frame_row(df, r)

    def add_col(b, r, nrng):
        df = b["v"]
        df["x" + str(r.randrange(3))] = nrng.normal(size=len(df)).round(6)

    def sort(b, r, nrng):
        b["v"] = b["v"].sort_index() if r.random() < 0.5 else b["v"].sort_values("v")

    def drop(b, r, nrng):
        if len(b["v"]) > 5:
            b["v"] = b["v"].drop(r.choice(list(b["v"].index)))

    def iat_set(b, r, nrng):
        df = b["v"]
        df.iat[r.randrange(len(df)), list(df.columns).index("v")] = round(r.gauss(0, 1), 6)
    return dict(loc_set=loc_set, add_row=add_row, add_col=add_col, sort=sort, drop=drop, iat_set=iat_set)


def _frame_cat_ops():
    import pandas as pd

    def v_set(b, r, nrng):
        df = b["v"]
        df.loc[r.randrange(len(df)), "v"] = round(r.gauss(0, 1), 6)

    def c_set(b, r, nrng):
        df = b["v"]
        df.loc[r.randrange(len(df)), "c"] = r.choice(list(df["c"].cat.categories))

    def add_category(b, r, nrng):
        df = b["v"]
        new = _new(r)
        df["c"] = df["c"].cat.add_categories([new])
        df.loc[r.randrange(len(df)), "c"] = new

    def concat(b, r, nrng):
        df, k = b["v"], r.randint(1, 5)
        more = pd.DataFrame({"c": pd.Categorical(nrng.choice(list(df["c"].cat.categories), k),
                                                 categories=df["c"].cat.categories),
                             "v": nrng.normal(size=k).round(6),
                             "t": pd.date_range(df["t"].iloc[-1], periods=k + 1, freq="h")[1:]})
        b["v"] = pd.concat([df, more], ignore_index=True)
    return dict(v_set=v_set, c_set=c_set, add_category=add_category, concat=concat)


def _series_ops():
    def set_label(b, r, nrng):
        s = b["v"]
        s[r.choice(list(s.index))] = round(r.gauss(0, 1), 6)

    def enlarge(b, r, nrng):
        b["v"].loc[_new(r)] = round(r.gauss(0, 1), 6)

    def iloc_set(b, r, nrng):
        s = b["v"]
        s.iloc[r.randrange(len(s))] = round(r.gauss(0, 1), 6)

    def sort(b, r, nrng):
        b["v"] = b["v"].sort_values() if r.random() < 0.5 else b["v"].sort_index()

    def scale(b, r, nrng):
        s = b["v"]
        s *= 2.0
    return dict(set_label=set_label, enlarge=enlarge, iloc_set=iloc_set, sort=sort, scale=scale)


def _graph_ops():
    def add_edge(b, r, nrng):
        g = b["v"]
        nodes = list(g.nodes)
        g.add_edge(r.choice(nodes), r.choice(nodes), w=r.random())

    def remove_edge(b, r, nrng):
        e = _edge(b["v"], r)
        if e is not None:
            b["v"].remove_edge(*e)

    def add_node(b, r, nrng):
        g = b["v"]
        n = g.number_of_nodes() + 1000 + r.randrange(1000)
        g.add_node(n, label=_new(r))
        g.add_edge(n, r.choice(list(g.nodes)), w=r.random())

    def edge_attr(b, r, nrng):
        g = b["v"]
        e = _edge(g, r)
        if e is not None:
            g[e[0]][e[1]]["w"] = r.random()

    def add_edges_from(b, r, nrng):
        g = b["v"]
        nodes = list(g.nodes)
        g.add_edges_from((r.choice(nodes), r.choice(nodes), {"w": r.random()}) for _ in range(r.randint(2, 20)))
    return dict(add_edge=add_edge, remove_edge=remove_edge, add_node=add_node, edge_attr=edge_attr,
                add_edges_from=add_edges_from)


def _sparse_ops():
    def data_set(b, r, nrng):
        a = b["v"]
        if a.nnz:
            a.data[r.randrange(a.nnz)] = round(r.random(), 6)

    def add(b, r, nrng):
        b["v"] = b["v"] + _sparse_other(b["v"], r)

    def scale(b, r, nrng):
        b["v"] = b["v"] * 2.0

    def set_entry(b, r, nrng):
        import scipy.sparse as sp
        a = b["v"]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", sp.SparseEfficiencyWarning)
            a[r.randrange(a.shape[0]), r.randrange(a.shape[1])] = round(r.random(), 6)

    def zero_and_eliminate(b, r, nrng):
        a = b["v"]
        if a.nnz:
            a.data[r.randrange(a.nnz)] = 0.0
            a.eliminate_zeros()
    return dict(data_set=data_set, add=add, scale=scale, set_entry=set_entry, zero_and_eliminate=zero_and_eliminate)


def _counter_ops():
    def incr(b, r, nrng):
        c = b["v"]
        c[r.choice(list(c))] += 1

    def new_key(b, r, nrng):
        b["v"][_new(r)] = r.randint(1, 9)

    def update(b, r, nrng):
        b["v"].update(f"w{r.randrange(60)}" for _ in range(r.randint(1, 30)))

    def delete(b, r, nrng):
        c = b["v"]
        if len(c) > 3:
            del c[r.choice(list(c))]
    return dict(incr=incr, new_key=new_key, update=update, delete=delete)


def _ddict_ops():
    def append(b, r, nrng):
        d = b["v"]
        d[r.choice(list(d))].append(r.randrange(10000))

    def new_key(b, r, nrng):
        b["v"][_new(r)].append(r.randrange(10000))

    def extend(b, r, nrng):
        d = b["v"]
        d[r.choice(list(d))].extend(range(r.randint(1, 40)))
    return dict(append=append, new_key=new_key, extend=extend)


def _odict_ops():
    def set_(b, r, nrng):
        d = b["v"]
        d[r.choice(list(d))] = (r.randrange(1000), r.random())

    def new_key(b, r, nrng):
        b["v"][_new(r)] = (r.randrange(1000), r.random())

    def move_to_end(b, r, nrng):
        d = b["v"]
        d.move_to_end(r.choice(list(d)), last=r.random() < 0.5)

    def popitem(b, r, nrng):
        if len(b["v"]) > 3:
            b["v"].popitem(last=r.random() < 0.5)
    return dict(set=set_, new_key=new_key, move_to_end=move_to_end, popitem=popitem)


def _deque_ops():
    def append(b, r, nrng):
        b["v"].append(r.randrange(1000))

    def appendleft(b, r, nrng):
        b["v"].appendleft(r.randrange(1000))

    def pop(b, r, nrng):
        if len(b["v"]) > 5:
            b["v"].pop() if r.random() < 0.5 else b["v"].popleft()

    def rotate(b, r, nrng):
        b["v"].rotate(r.randint(-50, 50))

    def extend(b, r, nrng):
        b["v"].extend(r.randrange(1000) for _ in range(r.randint(1, 200)))
    return dict(append=append, appendleft=appendleft, pop=pop, rotate=rotate, extend=extend)


def _stdlib_ops():
    base = datetime.datetime(2024, 1, 1)

    def new_key(b, r, nrng):
        i = r.randrange(10 ** 6)
        b["v"][base + datetime.timedelta(minutes=i)] = (decimal.Decimal(i) / 13, fractions.Fraction(i, 11))

    def replace(b, r, nrng):
        d = b["v"]
        i = r.randrange(1000)
        d[r.choice(list(d))] = (decimal.Decimal(i) / 3, fractions.Fraction(i, 7))

    def delete(b, r, nrng):
        d = b["v"]
        if len(d) > 3:
            del d[r.choice(list(d))]
    return dict(new_key=new_key, replace=replace, delete=delete)


def _model_ops(kind):
    ops = {"refit": _refit(kind), "rebuilt": _rebuilt(kind)}
    if kind in ("sgd", "mbkmeans", "ipca"):
        ops["partial_fit"] = _partial(kind)
    if kind in ("rf1", "rf2"):
        def grow(b, r, nrng):      # more trees, the old ones kept
            m = b["v"]
            m.set_params(warm_start=True, n_estimators=m.n_estimators + r.randint(1, 4))
            _fit(kind, m, r, nrng)
        ops["warm_grow"] = grow
    if kind == "kdknn":
        def neighbours(b, r, nrng):
            b["v"].set_params(n_neighbors=r.randint(1, 7))
        ops["set_n_neighbors"] = neighbours
    if kind == "pipe":
        def set_c(b, r, nrng):
            b["v"].set_params(logisticregression__C=r.choice([0.01, 0.3, 3.0]))
            _fit(kind, b["v"], r, nrng)
        ops["set_params_fit"] = set_c
    if kind in ("tfidf", "counts"):
        def limit(b, r, nrng):
            b["v"].set_params(max_features=r.randint(5, 60))
            _fit(kind, b["v"], r, nrng)
        ops["max_features_fit"] = limit
    return ops


OPS = {"frame": _frame_ops(), "frame_cat": _frame_cat_ops(), "series": _series_ops(), "graph": _graph_ops(),
       "digraph": _graph_ops(), "csr": _sparse_ops(), "csc": _sparse_ops(), "counter": _counter_ops(),
       "ddict": _ddict_ops(), "odict": _odict_ops(), "deque": _deque_ops(), "stdlib": _stdlib_ops(),
       **{k: _model_ops(k) for k in MODELS + ("tfidf", "counts")}}
for _k in ("frame", "frame_cat", "series", "graph", "digraph", "csr", "csc", "counter", "ddict", "odict", "deque",
           "stdlib"):
    OPS[_k]["rebuilt"] = _rebuilt(_k)


# ---- queries and answers: run on the driver and on the workers ---------------------

def query(kind, obj, r, nrng):
    """A random query of ``obj`` as it is now."""
    if kind in MODELS:
        return nrng.normal(size=(r.randint(1, 9), 5))
    if kind in ("tfidf", "counts"):
        return _docs(r.randint(1, 5), nrng)
    if kind in ("frame", "series"):
        return r.sample(list(obj.index), min(3, len(obj)))
    if kind == "frame_cat":
        cats = list(obj["c"].cat.categories)
        return r.sample(cats, min(len(cats), r.randint(1, 3)))
    if kind in ("graph", "digraph"):
        return r.sample(list(obj.nodes), min(4, obj.number_of_nodes()))
    if kind in ("csr", "csc"):
        return r.sample(range(obj.shape[0] if kind == "csr" else obj.shape[1]), 2)
    if kind == "counter":
        return r.sample(list(obj), min(3, len(obj))) + ["absent"]
    if kind in ("ddict", "odict", "stdlib"):
        return r.sample(list(obj), min(3, len(obj)))
    if kind == "deque":
        return [r.randrange(-len(obj), len(obj)) for _ in range(3)]
    raise KeyError(kind)


def _r(x):
    return round(float(x), 9)


def answer(kind, obj, q):
    """What a reader of ``obj`` sees: ``pydata_objects.use`` and a few more
    readings (what the updates change), exactly comparable."""
    if kind == "sgd":
        return [obj.predict(q).tolist(), np.round(obj.coef_, 9).tolist(), _r(obj.intercept_[0])]
    if kind == "mbkmeans":
        return [obj.predict(q).tolist(), np.round(obj.cluster_centers_, 9).tolist()]
    if kind == "ipca":
        return [np.round(obj.transform(q), 9).tolist(), int(obj.n_samples_seen_)]
    out = [po.use(kind, obj, q)]
    if kind in ("rf1", "rf2"):
        out.append(len(obj.estimators_))
    elif kind == "kdknn":
        out.append(obj.kneighbors(q)[1].tolist())
    elif kind in ("tfidf", "counts"):
        out.append(sorted(obj.vocabulary_.items())[:20] + [len(obj.vocabulary_)])
    elif kind == "frame":
        out += [list(obj.shape), [str(c) for c in obj.columns], [str(x) for x in obj.index[:3]]]
        out += [_r(obj[c].sum()) for c in obj.columns if str(c).startswith("x")]
    elif kind == "frame_cat":
        out += [len(obj), [str(c) for c in obj["c"].cat.categories], str(obj["c"].iloc[-1]), _r(obj.v.sum())]
    elif kind == "series":
        out += [len(obj), _r(obj.sum()), [str(x) for x in obj.index[:3]]]
    elif kind in ("graph", "digraph"):
        out += [[sorted((str(m), _r(d.get("w", -1))) for m, d in obj[n].items()) for n in q],
                obj.number_of_nodes(), obj.number_of_edges()]
    elif kind in ("csr", "csc"):
        out += [list(obj.shape), _r(obj.sum()), obj.indices[:8].tolist()]
    elif kind == "counter":
        out += [len(obj), sum(obj.values())]
    elif kind == "ddict":
        out += [len(obj), sum(map(len, obj.values()))]
    elif kind == "odict":
        out += [len(obj), str(list(obj)[-1])]
    elif kind == "deque":
        out += [sum(obj), obj[0]]
    elif kind == "stdlib":
        out += [len(obj), str(min(obj)), str(max(obj))]
    return out


def safe_answer(kind, obj, q):
    try:
        return answer(kind, obj, q)
    except Exception as e:
        return ["error", type(e).__name__, str(e)[:200]]


def task_of(kind, obj, box, q):
    """The stage's function: the object as captured, and through its box."""
    return lambda _: (os.getpid(), safe_answer(kind, obj, q), safe_answer(kind, box["v"], q))


# ---- the driver --------------------------------------------------------------------


class Obj:
    def __init__(self, name, kind, box):
        self.name, self.kind, self.box = name, kind, box
        self.updates = []       # "round kind.op@where"


class Hunt:
    def __init__(self, seed, start_method, objects, rounds):
        self.r = random.Random(seed)
        self.nrng = np.random.default_rng(seed)
        self.seed, self.start_method, self.rounds, self.n = seed, start_method, rounds, objects
        self.portable = start_method == "spawn"
        self.objs = []
        self.rep = {"seed": seed, "start_method": start_method, "same_host": os.environ.get("CLAMOR_SAME_HOST"),
                    "rounds": rounds, "kinds": [], "cases": 0, "approved": 0,
                    "refused": 0, "refusals": {}, "share_warnings": 0, "by_value": 0, "ops": {},
                    "reads": {"in": 0, "out": 0},
                    "stage_first": 0, "stages": 0, "compared": 0, "mismatch_count": 0, "mismatches": [],
                    "failed_stages": [], "workers_lost": 0, "errors": [], "per_kind": {}}

    def build(self, kinds, phase):
        for kind in kinds:
            with clamor.heap():
                obj = build(kind, self.r, self.nrng)
                # a first reading inside the block makes the library's lazy
                # state (pandas' engines, networkx' views) in the region
                safe_answer(kind, obj, query(kind, obj, self.r, self.nrng))
                box = {"v": obj}
            self.objs.append(Obj(f"{kind}.{phase}", kind, box))

    def update(self, o, rnd):
        r = self.r
        op = r.choice(sorted(OPS[o.kind]))
        where = "in" if r.random() < 0.6 else "out"
        name = f"{o.kind}.{op}@{where}"
        self.rep["ops"][name] = self.rep["ops"].get(name, 0) + 1
        o.updates.append(f"{rnd} {name}")
        try:
            if where == "in":
                with clamor.heap():
                    OPS[o.kind][op](o.box, r, self.nrng)
            else:
                OPS[o.kind][op](o.box, r, self.nrng)
        except Exception as e:
            self.rep["errors"].append([o.name, rnd, name, f"update raised {type(e).__name__}: {str(e)[:200]}"])

    def share(self, o):
        """None if share() approved, else what it said (recorded)."""
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always", clamor.ShareWarning)
                clamor.share(o.box["v"], portable=self.portable)
            self.rep["share_warnings"] += sum(issubclass(w.category, clamor.ShareWarning) for w in caught)
            return None
        except clamor.NotShareable as e:
            msg = str(e)
            reason = " ".join(w for w in msg.split(" ", 1)[-1].split(" ") if "0x" not in w)[:90]
            self.rep["refusals"].setdefault(reason, [0, msg[:240]])[0] += 1
            return msg
        except Exception as e:
            self.rep["errors"].append([o.name, "share raised " + type(e).__name__, str(e)[:300]])
            return f"share raised {type(e).__name__}"

    def stage(self, cl, o, q):
        """One stage of two tasks; (results, error, workers lost, objects by value)."""
        lost, bv = cl.stats()["recovery"]["workers_lost"], clamor.memory.byvalue.counts()["objects"]
        self.rep["stages"] += 1
        err, res = None, []
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", clamor.ByValueWarning)
                res = cl.parallelize(range(2), 2).map(task_of(o.kind, o.box["v"], o.box, q)).collect()
        except Exception as e:
            err = f"{type(e).__name__}: {str(e).strip().splitlines()[0][:200] if str(e).strip() else ''}"
        gone = cl.stats()["recovery"]["workers_lost"] - lost
        return res, err, gone, clamor.memory.byvalue.counts()["objects"] - bv

    def check(self, cl, o, rnd):
        r, rep = self.r, self.rep
        read = "in" if r.random() < 0.5 else "out"
        rep["reads"][read] += 1
        if read == "in":
            with clamor.heap():
                q = query(o.kind, o.box["v"], r, self.nrng)
        else:
            q = query(o.kind, o.box["v"], r, self.nrng)
        q = pickle.loads(pickle.dumps(q))     # plain objects outside the region
        order = "stage_first" if r.random() < 0.3 else "share_first"
        rep["stage_first"] += order == "stage_first"
        if order == "share_first":
            refusal = self.share(o)
            want = safe_answer(o.kind, o.box["v"], q)
            res, err, gone, bv = self.stage(cl, o, q)
        else:
            res, err, gone, bv = self.stage(cl, o, q)
            want = safe_answer(o.kind, o.box["v"], q)
            refusal = self.share(o)
        ok = refusal is None
        rep["cases"] += 1
        rep["approved" if ok else "refused"] += 1
        rep["by_value"] += bv
        pk = rep["per_kind"].setdefault(o.kind, {"cases": 0, "approved": 0, "by_value": 0})
        pk["cases"] += 1
        pk["approved"] += ok
        pk["by_value"] += bv
        rep["workers_lost"] += gone
        now = [u for u in o.updates if u.startswith(f"{rnd} ")]
        if want and want[0] == "error":
            rep["errors"].append([o.name, rnd, "the driver's answer raised", want, now])
        if err or gone:
            rep["failed_stages"].append({"object": o.name, "round": rnd, "order": order, "approved": ok,
                                         "error": err or f"{gone} worker(s) lost", "updates": now})
        for pid, captured, held in res:
            for via, got in (("captured", captured), ("box", held)):
                rep["compared"] += 1
                if got != want:
                    self.mismatch(o, rnd, order, refusal, bv, via, pid, want, got, now)

    def mismatch(self, o, rnd, order, refusal, bv, via, pid, want, got, now):
        rep = self.rep
        rep["mismatch_count"] += 1
        for m in rep["mismatches"]:
            if (m["object"], m["round"]) == (o.name, rnd):
                m["vias"].append(f"{via} (worker {pid})")
                return
        if len(rep["mismatches"]) < 16:
            rep["mismatches"].append({
                "object": o.name, "round": rnd, "order": order, "vias": [f"{via} (worker {pid})"],
                "share": "approved" if refusal is None else "refused: " + refusal[:200], "by_value": bv,
                "updates_this_round": now, "updates_before": [u for u in o.updates if u not in now][-6:],
                "driver": repr(want)[:400], "worker": repr(got)[:400]})

    def round(self, cl, rnd):
        for o in self.objs:
            for _ in range(self.r.choice((0, 1, 1, 2))):
                self.update(o, rnd)
        for o in self.objs:
            self.check(cl, o, rnd)

    def run(self):
        po.import_libraries()
        kinds = self.r.sample(KINDS, self.n)
        self.rep["kinds"] = kinds
        half = len(kinds) // 2
        self.build(kinds[:half], "pre")          # before the workers start
        opts = dict(workers=2, progress=False, max_attempts=1, speculation=False, start_method=self.start_method)
        with clamor.Cluster(**opts) as cl:
            cl.parallelize(range(2), 2).map(lambda _: os.getpid()).collect()     # the workers exist
            self.build(kinds[half:], "post")
            for o in self.objs:                  # round -1: as built
                self.check(cl, o, -1)
            for rnd in range(self.rounds):
                self.round(cl, rnd)
            self.rep["recovery"] = cl.stats()["recovery"]
        return self.rep


def main(seed, start_method="fork", objects=10, rounds=3):
    """Run the hunt with ``seed``; print the report as one JSON line."""
    t0 = time.monotonic()
    rep = Hunt(seed, start_method, objects, rounds).run()
    rep["seconds"] = round(time.monotonic() - t0, 1)
    print(json.dumps(rep, default=repr), flush=True)
    return rep
