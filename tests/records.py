"""Classes for the Dask tests whose region objects workers use in place: a
worker that was not forked finds a class by its module and name, so it
cannot be one defined in the driver's ``__main__``."""
import dataclasses


@dataclasses.dataclass
class Record:
    name: str
    values: list
    index: dict
