"""The state of one share() walk (``_Walk``): the address map, the C
memory scanner, the raw pointer fields it refuses and the objects of
unknown extension types it scans.
"""
import array
import gc
import weakref

import numpy as np

from . import _inherit, _pyshare, classkeys, region
from .._native import lib
from ..errors import NotShareable
from ._graph import _weak_links
from ._inherit import _ok_outside
from ._kinds import _STATIC
from .hooks import HANDLER


class _Walk:
    """One share() call: the address map and the objects it has vouched
    for or may accept outside the region, built when first needed.
    ``mode``: None for forked workers, or a portable walk
    (``portable._Mode``), which decides what outside the region workers
    not forked from the driver can have, and records the words to
    relocate."""

    def __init__(self, mode=None):
        self.mode = mode
        self._amap = self._scanner = None
        self._alive = None
        self._vtables = None
        self.tables = []     # region objects whose tables are to be made again in the region
        self.unsure = []
        self.doubt_path = None
        self.referents = set()
        self.buffers = []

    @property
    def amap(self):
        if self._amap is None:   # reading /proc/self/maps costs milliseconds
            self._amap = _pyshare.AddressMap()
        return self._amap

    @property
    def scanner(self):
        if self._scanner is None:
            self._scanner = _pyshare.Scanner(self.amap, self.ok_address)
        return self._scanner

    def ok_address(self, addr):
        """A private address that is an object the workers have, or a
        Python reference the walk follows (and names better)."""
        if addr in self.referents or addr == HANDLER:
            return True
        if self.mode is None and _inherit._inherited is not None and _inherit._inherited.has(addr):
            return True
        if any(lo <= addr < hi for lo, hi in self.buffers):
            return True
        if self._vtables is None:
            self._vtables = _pyshare.vtables()
        cls = self._vtables.get(addr)
        if cls is not None:   # a Cython class's C methods: its module made them at import
            return self.mode.vtable(cls, addr) if self.mode is not None else _ok_outside(cls)
        if self._alive is None:
            self._alive = {id(o): o for o in gc.get_objects() if isinstance(o, _STATIC)}
        o = self._alive.get(addr)
        if self.mode is not None:
            return o is not None and self.mode.outside_ok(o)
        return o is not None and _ok_outside(o)

    def fields(self, path, o, bring_in=False):
        """Refuse a raw pointer field of ``o`` (in the region) that leaves it.
        ``bring_in``: a dict's, list's or set's table that grew outside the
        region after its block is listed in ``tables``, to be made again
        in the region, instead."""
        for code, addr in _pyshare.fields(o):
            if code == lib.CLAMOR_FIELD_DATA and isinstance(o, np.ndarray):
                continue  # through .base, or checked with the array's size below
            size = 8 * o.ndim if code in (lib.CLAMOR_FIELD_DIMS, lib.CLAMOR_FIELD_STRIDES) else 1
            if region.contains(addr, size) or (code == lib.CLAMOR_FIELD_KEYS and self.amap.in_image(addr)):
                continue  # (the interpreter's shared empty keys table is static)
            if code == lib.CLAMOR_FIELD_KEYS and self.mode is None and classkeys.frozen_keys(addr):
                continue  # (an instance's dict over its class's keys, frozen at the fork: classkeys)
            name = _pyshare.FIELD_NAMES[code]
            split = code == lib.CLAMOR_FIELD_KEYS and any(c == lib.CLAMOR_FIELD_VALUES for c, _ in _pyshare.fields(o))
            if bring_in and not split and code in (lib.CLAMOR_FIELD_KEYS, lib.CLAMOR_FIELD_ITEMS,
                                                   lib.CLAMOR_FIELD_TABLE) and type(o) in (dict, list, set):
                self.tables.append(o)
                continue
            hint = {lib.CLAMOR_FIELD_KEYS: ": a dict sharing the keys of a class's instances (vars() of an "
                                           "instance); copy it with dict() inside clamor.heap()" if split else
                                           ": the dict grew outside clamor.heap(); rebuild it inside the block",
                    lib.CLAMOR_FIELD_UTF8: ": CPython made it on a request outside the block; build the "
                                           "string inside clamor.heap() and ship it before asking for its "
                                           "UTF-8 form outside"}.get(code, ": rebuild it inside clamor.heap()")
            raise NotShareable(f"{path}: the {name} of this {type(o).__name__} (at {id(o):#x}) lies at "
                               f"{addr:#x}, outside the region, in memory workers read stale{hint}")
        if isinstance(o, array.array) and len(o):
            addr = o.buffer_info()[0]
            if not region.contains(addr, len(o) * o.itemsize):
                raise NotShareable(f"{path}: the buffer of this array.array lies at {addr:#x}, outside the region")

    def opaque(self, path, o):
        """Scan an object of an extension type share() does not know."""
        name = type(o).__name__
        body = lib.clamor_py_body_size(id(o))
        refs = gc.get_referents(o)
        self.referents = {id(r) for r in refs}
        if isinstance(o, weakref.ReferenceType):
            self.referents |= _weak_links(o)
        # the C fields of an object may point into the buffers of the arrays
        # it holds (a cKDTree into its points): those arrays are walked
        self.buffers = [(a, a + r.nbytes) for r in refs if isinstance(r, np.ndarray) and r.nbytes
                        for a in (r.__array_interface__["data"][0],)]
        try:
            # past the reference count and the type pointer (the type is walked)
            done = self.scanner.scan(id(o) + 16, max(0, body - 16), f"this {name}")
        except _pyshare.CannotTell as err:
            off, addr, where = err.args
            where = f"byte {off + 16} of this {name}" if where == f"this {name}" else f"byte {off} of {where}"
            raise NotShareable(f"{path} ({name} at {id(o):#x}): {where}, reached through its C fields, holds "
                               f"{addr:#x}, an address in this process's private memory outside the region; "
                               f"share() cannot tell what lies there (memory a library allocated outside "
                               f"clamor.heap(), or a cache it reused): build it inside clamor.heap()") from None
        if self.mode is not None:
            self.mode.opaque(path, o, self.scanner.blocks)
        if not done:
            self.unsure.append(path)
        if self.scanner.doubts and self.doubt_path is None:
            self.doubt_path = f"{path} ({name})"
