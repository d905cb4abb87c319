"""The pointers behind an object that share() cannot see as Python references.

``fields(o)`` lists the raw pointer fields of the types clamor knows (see
``csrc/pyshare.c``); ``Scanner`` scans the objects of the types it does not
know, word by word, through the region blocks they lead to, and reports a
word that points into the process's private writable memory outside the
region.  Both read this process's address map once per share() call.
"""
import bisect

from . import region
from .hooks import all_classes
from .._native import ffi, lib

FIELD_NAMES = {
    lib.CLAMOR_FIELD_DATA: "data buffer", lib.CLAMOR_FIELD_DIMS: "shape buffer",
    lib.CLAMOR_FIELD_STRIDES: "strides buffer", lib.CLAMOR_FIELD_ITEMS: "item array",
    lib.CLAMOR_FIELD_KEYS: "keys table", lib.CLAMOR_FIELD_VALUES: "values table",
    lib.CLAMOR_FIELD_TABLE: "hash table", lib.CLAMOR_FIELD_BUFFER: "buffer",
    lib.CLAMOR_FIELD_UTF8: "cached UTF-8 copy", lib.CLAMOR_FIELD_WSTR: "cached wide-character copy",
    lib.CLAMOR_FIELD_SUBARRAY: "subarray description", lib.CLAMOR_FIELD_CMETA: "C metadata",
}
_MAXF = 8
_out = ffi.new("uintptr_t[]", 2 * _MAXF)


def fields(o):
    """(field code, address) pairs of ``o``'s raw pointer fields."""
    n = lib.clamor_py_fields(id(o), _out, _MAXF)
    if n < 0:
        raise RuntimeError("numpy's C API could not be loaded")
    return [(int(_out[2 * i]), int(_out[2 * i + 1])) for i in range(n)]


def is_class(t):
    """Was the type ``t`` made by a class statement?  An extension's type is
    not, whether static or made at run time (``collections.deque`` is a heap
    type since 3.12, ``decimal.Decimal`` since 3.13): its objects have C
    fields no Python reference shows."""
    return bool(lib.clamor_py_is_class(id(t)))


_capsule_pointer = None


def vtable_of(cls):
    """The address of a Cython class's table of C methods (its
    ``__pyx_vtable__`` capsule's pointer), or None.  Every instance holds
    it in its body; the module made it when it was imported."""
    global _capsule_pointer
    try:
        cap = type.__dict__["__dict__"].__get__(cls).get("__pyx_vtable__")
    except (TypeError, AttributeError):
        return None
    if cap is None or type(cap).__name__ != "PyCapsule":
        return None
    if _capsule_pointer is None:
        import ctypes
        get = ctypes.pythonapi.PyCapsule_GetPointer
        get.restype, get.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]
        name = ctypes.pythonapi.PyCapsule_GetName
        name.restype, name.argtypes = ctypes.c_char_p, [ctypes.py_object]
        _capsule_pointer = lambda c: get(c, name(c))   # noqa: E731
    try:
        return _capsule_pointer(cap) or None
    except Exception:   # (a capsule that is not what Cython makes)
        return None


def vtables():
    """{address: class} of the C method tables of every Cython class alive."""
    out = {}
    for t in all_classes():
        a = vtable_of(t)
        if a:
            out.setdefault(a, t)
    return out


class AddressMap:
    """This process's mappings, read from /proc/self/maps: memory of loaded
    images (the same in every process of the image), and private writable
    memory outside the region (heap, anonymous mappings, stacks)."""

    def __init__(self):
        images, private = [], []
        rb, rs = region.base(), region.size()
        with open("/proc/self/maps") as f:
            for line in f:
                parts = line.split(None, 5)
                lo, hi = (int(x, 16) for x in parts[0].split("-"))
                perms = parts[1]
                path = parts[5].strip() if len(parts) > 5 else ""
                if rs and lo < rb + rs and rb < hi:
                    continue  # the region
                if path.startswith("/") and not path.startswith("/memfd:") and not path.endswith("(deleted)"):
                    images.append((lo, hi))
                elif "w" in perms:
                    private.append((lo, hi))
        self._images = sorted(images)
        self._starts = [lo for lo, _ in self._images]
        private.sort()
        self.private = ffi.new("uintptr_t[]", [x for r in private for x in r] or [0])
        self.nprivate = len(private)

    def images(self):
        """The loaded images' address ranges, sorted: [(lo, hi)]."""
        return list(self._images)

    def in_image(self, addr):
        i = bisect.bisect_right(self._starts, addr) - 1
        return i >= 0 and addr < self._images[i][1]


class CannotTell(Exception):
    """A scan found a word it cannot vouch for: (offset, address, where)."""


class Scanner:
    """Conservative scan of opaque objects and the region blocks they lead
    to, each block once, up to ``budget`` bytes per share() call.

    A word of the object's own body that points into private memory is its
    field: that is a refusal.  One in a block behind it may be a pointer or
    bytes a block kept from an earlier use (a vector's spare capacity): it
    is recorded in ``doubts``, the first of them, and reported as such.

    ``ok(addr)`` says whether a private address is an object the workers
    have (inherited, or the same in every process of the image)."""

    def __init__(self, amap, ok, budget=1 << 30):
        self.amap, self.ok, self.budget = amap, ok, budget
        self._types = None
        self.doubts = []
        self.ndoubts = 0
        self.scanned = set()
        self.blocks = []    # (start, length) of the region blocks scanned
        self.bytes = 0
        self._inner = ffi.new("uintptr_t[]", 4096)
        self._outer = ffi.new("uintptr_t[]", 512)
        self._n = ffi.new("size_t[2]")
        self._blk = ffi.new("uintptr_t *")
        self._len = ffi.new("size_t *")

    def scan(self, lo, n, what):
        """Scan [lo, lo+n) and what it leads to in the region.  Returns
        False if the budget ran out; raises CannotTell(offset, address,
        where) for a word share() cannot vouch for."""
        todo = [(lo, n, what, 0)]
        while todo:
            lo, n, what, depth = todo.pop()
            self.bytes += n
            if self.bytes > self.budget:
                return False
            done = 0
            while done < n:
                done += lib.clamor_py_scan(lo + done, n - done, self.amap.private, self.amap.nprivate,
                                           self._inner, self._n, 4096, self._outer, self._n + 1, 512)
                for i in range(self._n[1]):
                    off, addr = int(self._outer[2 * i]), int(self._outer[2 * i + 1])
                    if self.ok(addr):
                        continue
                    if depth == 0:
                        raise CannotTell(off, addr, what)
                    self.ndoubts += 1
                    if not self.doubts:  # a word in a block behind it: maybe a pointer, maybe stale bytes
                        self.doubts.append((off, addr, what))
                for i in range(self._n[0]):
                    p = int(self._inner[i])
                    if lib.clamor_block_of(ffi.cast("void *", p), self._blk, self._len) != 0:
                        continue  # no live block there: nothing a reader would follow
                    start = int(self._blk[0])
                    if start not in self.scanned:
                        self.scanned.add(start)
                        # an atomic block (array data) holds no pointer: never read as if it did
                        if lib.clamor_block_atomic(ffi.cast("void *", start)) != 1 and \
                                not self._python_object(start, int(self._len[0])):
                            self.blocks.append((start, int(self._len[0])))
                            todo.append((start, int(self._len[0]), f"the region block at {start:#x}", depth + 1))
        return True

    def _python_object(self, start, length):
        """Does the block at ``start`` (``length`` bytes) hold a Python
        object (with or without a gc header)?  Those are the Python walk's:
        their links (a weakref's list, a dict's cached hash) are not data,
        and their references are checked by name.  Only words of the block
        are read: the words past a small block are its neighbour's (a
        hash table's array of keys passed for an object, since the object
        after it, and its words went unrelocated)."""
        if self._types is None:
            self._types = _all_types()
        words = ffi.cast("uintptr_t *", start)
        # the object, or a gc header then the object, or before that the
        # two words CPython 3.11+ keeps before an instance of a class with a
        # managed __dict__ (its collector links read as private pointers: a
        # ShareWarning on every pandas frame a weak reference led to)
        for at in (0, 2, 4):
            if (at + 2) * 8 > length:
                break
            refs, typ = int(words[at]), int(words[at + 1])
            if 0 < refs < 1 << 40 and typ in self._types:
                return True
        return False


def _all_types():
    """Addresses of every type object, static ones included."""
    return {id(t) for t in all_classes()} | {id(type)}

