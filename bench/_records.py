"""The record classes of bench/objects.py, in a module of their own: a
spawned worker imports them by name (the script puts bench/ on its
PYTHONPATH), as a user's workers import the user's module."""
import dataclasses


class Plain:
    def __init__(self, id, name, score):
        self.id, self.name, self.score = id, name, score


@dataclasses.dataclass
class Rec:
    id: int
    name: str
    score: float
