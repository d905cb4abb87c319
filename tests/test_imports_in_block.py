"""A module imported inside ``heap()`` runs its code outside the region
(``hooks._imports_outside``): its state is the interpreter's, which a forked
worker inherits, and the driver changes it later outside any block."""
from helpers import PRELUDE, run_driver

ENV = {"OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}

IMPORTS = PRELUDE + """
inside = lambda o: region.contains(id(o), 1)
assert "multiprocessing.dummy" not in sys.modules and "colorsys" not in sys.modules
with clamor.heap():
    import multiprocessing.dummy          # gives the main thread a WeakKeyDictionary of pool threads
    made = [0.5 * i for i in range(8)]    # what the block itself makes stays in the region
    box = {}
    t = threading.Thread(target=lambda: box.update(mod=__import__("colorsys"), own=bytearray(64)))
    t.start()                             # a thread the block adopted imports a module too
    t.join()
children = threading.current_thread()._children
print(json.dumps({
    "module": inside(sys.modules["multiprocessing.dummy"]),
    "module_dict": inside(vars(sys.modules["multiprocessing.dummy"])),
    "children": [inside(children), inside(children.data)],
    "function": inside(multiprocessing.dummy.Pool),
    "adopted_module": inside(box["mod"]), "adopted_function": inside(box["mod"].rgb_to_hsv),
    "made": [inside(made), all(inside(x) for x in made)], "adopted_made": inside(box["own"]),
    "usable": multiprocessing.dummy.Pool(2).map(abs, [-1, -2]),
}))
"""


def test_a_module_imported_in_a_block_keeps_its_state_outside_the_region():
    out = run_driver(IMPORTS, timeout=90, env=ENV)
    assert out["exit"] == 0, out
    assert not out["module"] and not out["module_dict"] and out["children"] == [False, False], out
    assert not out["function"], out
    assert not out["adopted_module"] and not out["adopted_function"], out
    assert out["made"] == [True, True] and out["adopted_made"], out
    assert out["usable"] == [1, 2], out


FOREST = PRELUDE + """
from sklearn.ensemble import RandomForestClassifier
with clamor.heap():
    # joblib's thread pool imports multiprocessing.dummy here, on first use
    m = RandomForestClassifier(n_estimators=14, max_depth=3, n_jobs=2, random_state=7)
    X = np.random.default_rng(0).normal(size=(70, 5))
    m.fit(X, (X[:, 0] > 0).astype(int))
    m.predict(np.random.default_rng(2).normal(size=(5, 5)))
q = np.random.default_rng(1).normal(size=(40, 5))
with clamor.Cluster(workers=2, max_attempts=1, progress=False) as cl:
    want = m.predict(q).tolist()      # the driver's pool threads change that state after the fork
    got, err = [], None
    try:
        for _ in range(3):
            got += cl.parallelize(range(2), 2).map(lambda _: m.predict(q).tolist()).collect()
    except Exception as e:
        err = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
    lost = cl.stats()["recovery"]["workers_lost"]
print(json.dumps({"same": [g == want for g in got], "err": err, "lost": lost, "spread": len(set(want))}))
"""


def test_a_forest_fitted_with_threads_in_a_block_predicts_on_forked_workers_as_on_the_driver():
    """Before the fix the workers died or looped for ever (no heartbeat) in
    the main thread's dict of pool threads, which the import of
    multiprocessing.dummy inside the block had made in the region; the
    libraries' hunt met it as a forest predicting zeros."""
    for mode in ("map", "fetch"):
        out = run_driver(FOREST, timeout=150, env={**ENV, "CLAMOR_SAME_HOST": mode})
        assert out["exit"] == 0, (mode, out)
        assert out["spread"] == 2, out       # the query has answers of both classes
        assert out["err"] is None and out["lost"] == 0, (mode, out)
        assert out["same"] == [True] * 6, (mode, out)


def test_an_import_outside_any_block_is_left_to_the_interpreter():
    """The wrapper passes imports outside blocks straight through (the
    module is outside the region, as without clamor)."""
    out = run_driver(PRELUDE + """
with clamor.heap():
    pass
import colorsys
print(json.dumps({"inside": region.contains(id(colorsys), 1),
                  "wrapped": getattr(sys.modules["_frozen_importlib"]._find_and_load, "_clamor", False)}))
""", timeout=60, env=ENV)
    assert out["exit"] == 0 and out["wrapped"] and not out["inside"], out
