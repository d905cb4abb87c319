"""Classes for tests/test_portable_class_keys.py, which spawned workers
import by name, and what a worker does with them before it reads the
driver's instances."""
import dataclasses


class Point:
    def __init__(self, x, y, label):
        self.x, self.y, self.label = x, y, label


@dataclasses.dataclass
class Rec:
    id: int
    name: str
    score: float


class Branchy:
    """Its attributes' order in its class's table is the first instance's."""

    def __init__(self, leaf, v):
        if leaf:
            self.value = v
            self.kind = "leaf"
        else:
            self.kind = "node"
            self.left, self.right = v, -v


OWN = []     # (a worker's) instances of its own, made before it reads the driver's


def make_own(how):
    """Lay a worker's class tables out before the driver's instances come."""
    if how == "reversed":
        p = object.__new__(Point)
        p.label, p.y, p.x = "own", 1, 2          # label, y, x: not the driver's x, y, label
        OWN.append(p)
    elif how == "prefix":
        p = object.__new__(Point)
        p.x = 7                                   # x only: a prefix of the driver's
        OWN.append(p)
    elif how == "leaf first":
        OWN.append(Branchy(True, 5))             # value, kind: the driver made a node first
    return len(OWN)


def read_own():
    return [sorted(vars(o).items()) for o in OWN]


def read(objs, keys):
    out = []
    for o in (objs[k] for k in keys):
        out.append(sorted((k, getattr(o, k)) for k in ("x", "y", "label", "id", "name", "score", "value", "kind",
                                                          "left", "right", "extra") if hasattr(o, k)))
    return out
