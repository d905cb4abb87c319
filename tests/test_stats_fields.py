"""struct clamor_stats is listed once, in the CLAMOR_STATS X-macro of
csrc/clamor.h; clamor/_cdefs.h has to repeat it expanded, because cffi's cdef
has no preprocessor.  These tests keep the two from drifting apart.  They read
the source files only: no build and no import of clamor."""
import pathlib
import re

from cffi import FFI

ROOT = pathlib.Path(__file__).resolve().parent.parent


def _xmacro_fields():
    """[(type, name)] of CLAMOR_STATS in csrc/clamor.h, in order."""
    text = (ROOT / "csrc" / "clamor.h").read_text()
    m = re.search(r"#define CLAMOR_STATS\(COUNTER, VALUE\)(.*?)(?<!\\)\n", text, re.S)
    assert m, "no #define CLAMOR_STATS(COUNTER, VALUE) in csrc/clamor.h"
    body = re.sub(r"/\*.*?\*/", " ", m.group(1), flags=re.S).replace("\\\n", " ")
    out = []
    for item in re.finditer(r"(\w+)\s*\(([^()]*)\)", body):
        kind, args = item.group(1), [a.strip() for a in item.group(2).split(",")]
        if kind == "COUNTER" and len(args) == 1:
            out.append(("uint64_t", args[0]))
        elif kind == "VALUE" and len(args) == 2:
            out.append((args[0], args[1]))
        else:
            raise AssertionError(f"CLAMOR_STATS: cannot read {item.group(0)!r}")
    # nothing but those items in the list
    assert not re.sub(r"(\w+)\s*\(([^()]*)\)", " ", body).strip(), body
    return out


def _cdef_fields():
    """[(type, name)] of struct clamor_stats as cffi reads clamor/_cdefs.h."""
    ffi = FFI()
    ffi.cdef((ROOT / "clamor" / "_cdefs.h").read_text())
    return [(f.type.cname, name) for name, f in ffi.typeof("struct clamor_stats").fields]


def test_xmacro_lists_every_field_once():
    fields = _xmacro_fields()
    names = [n for _, n in fields]
    assert len(names) == len(set(names)), names
    # the list as it stands; a change here is a change of the public struct
    assert len(fields) == 50, fields
    assert names[0] == "faults" and names[-1] == "latency_max_us", names
    assert {t for t, _ in fields} == {"uint64_t", "double"}, fields


def test_cdefs_struct_is_the_xmacro_expanded():
    assert _cdef_fields() == _xmacro_fields()


def test_no_other_copy_of_the_list_in_c():
    # the counters are generated everywhere else: a hand-written list would
    # show up as a second mention of a counter that only the X-macro names
    for path in ["csrc/internal.h", "csrc/stats.c"]:
        text = (ROOT / path).read_text()
        assert "pages_unchanged" not in text and "peer_timeouts" not in text, path
