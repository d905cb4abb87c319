"""The compiled core serves only the Python it was built for, of a minor
version whose object layouts its C code knows (csrc/pyversion.c): the
build refuses another version, and the import refuses a core built for
another interpreter, with a message that says what to do."""
import importlib.machinery
import os
import shutil
import subprocess
import sys

import pytest

from clamor._native import interpreter_problem, lib, minors
from helpers import ROOT, clean_env

KNOWN = (1 << 11) | (1 << 12) | (1 << 13)


def hexversion(major, minor):
    return major << 24 | minor << 16 | 0xF0


def test_a_core_built_for_another_minor_version_is_refused_naming_both():
    why = interpreter_problem((3, 12), hexversion(3, 11), KNOWN)
    assert "built for Python 3.11" in why and "this is Python 3.12" in why, why
    assert "reinstall clamor with this interpreter" in why and "3.11, 3.12, 3.13" in why, why
    why = interpreter_problem((3, 13), hexversion(3, 12), KNOWN)
    assert "built for Python 3.12" in why and "this is Python 3.13" in why, why


def test_a_version_whose_layouts_are_unknown_is_refused_though_built_for():
    why = interpreter_problem((3, 14), hexversion(3, 14), KNOWN)
    assert "Python 3.14" in why and "supports Python 3.11, 3.12, 3.13" in why, why
    assert interpreter_problem((3, 10), hexversion(3, 10), KNOWN) is not None


def test_the_matching_known_version_passes():
    for minor in (11, 12, 13):
        assert interpreter_problem((3, minor), hexversion(3, minor) | 0x0100, KNOWN) is None


def test_the_installed_core_was_built_for_this_interpreter_and_is_named_for_it():
    built = lib.clamor_py_built_for()
    assert (built >> 24, built >> 16 & 0xFF) == sys.version_info[:2], hex(built)
    assert sys.version_info[1] in minors(lib.clamor_py_known_minors())
    # named with this interpreter's tag (not .abi3.so, which any CPython 3 loads)
    path = sys.modules["clamor._clamor"].__file__
    assert path.endswith(importlib.machinery.EXTENSION_SUFFIXES[0]), path


# A stand-in for the compiled module, as an old build left in a source tree
# would be found: it says it was built for 3.10 (or, older still, nothing).
STUB = """
import cffi
ffi = cffi.FFI()
class lib:
    {}
"""


def _import_with_stub(tmp_path, body):
    pkg = tmp_path / "clamor"
    shutil.copytree(os.path.join(ROOT, "clamor"), pkg, ignore=shutil.ignore_patterns("*.so", "__pycache__"))
    (pkg / "_clamor.py").write_text(STUB.format(body))
    code = ("import sys; sys.path.insert(0, sys.argv[1])\n"
            "try:\n    import clamor\nexcept Exception as e:\n"
            "    print(type(e).__name__, isinstance(e, ImportError)); print(e)\n")
    proc = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, timeout=60,
                          env=clean_env(), cwd=str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_importing_a_core_built_for_another_python_raises_with_both_versions(tmp_path):
    out = _import_with_stub(tmp_path, "clamor_py_built_for = staticmethod(lambda: 0x030A07F0)\n"
                                      f"    clamor_py_known_minors = staticmethod(lambda: {KNOWN})")
    head, msg = out.split("\n", 1)
    assert head == "UnsupportedPython True", out
    assert "built for Python 3.10" in msg and f"this is Python 3.{sys.version_info[1]}" in msg, out
    assert "reinstall clamor with this interpreter" in msg and "_clamor.py" in msg, out


def test_importing_a_core_too_old_to_say_what_it_was_built_for_raises(tmp_path):
    out = _import_with_stub(tmp_path, "pass")
    assert out.startswith("UnsupportedPython True\n") and "older than its Python code" in out, out


CC = shutil.which("cc")


def _compile_as(minor, tmp_path, free_threaded=False):
    """Compile internal.h where Python.h would have said 3.minor."""
    src = tmp_path / f"as_3_{minor}.c"
    src.write_text(f"#define PY_MAJOR_VERSION 3\n#define PY_MINOR_VERSION {minor}\n"
                   f"#define PY_VERSION_HEX {hexversion(3, minor):#x}\n"
                   + ("#define Py_GIL_DISABLED 1\n" if free_threaded else "")
                   + "typedef struct _typeobject PyTypeObject;\n#include \"internal.h\"\n")
    return subprocess.run([CC, "-std=gnu11", "-fsyntax-only", "-I", os.path.join(ROOT, "csrc"), str(src)],
                          capture_output=True, text=True, timeout=60)


@pytest.mark.skipif(CC is None, reason="no C compiler (cc) on PATH")
def test_the_build_fails_for_a_minor_version_the_c_code_does_not_know(tmp_path):
    for minor in (11, 12, 13):
        proc = _compile_as(minor, tmp_path)
        assert proc.returncode == 0, proc.stderr
    for minor in (10, 14):
        proc = _compile_as(minor, tmp_path)
        assert proc.returncode != 0 and "object layouts are not known" in proc.stderr, proc.stderr
    proc = _compile_as(13, tmp_path, free_threaded=True)
    assert proc.returncode != 0 and "free-threaded" in proc.stderr, proc.stderr



def test_the_body_of_an_int_is_its_digits():
    """An int's size word is a tag since 3.12, not its digit count."""
    for n in (1, -(2 ** 100), 2 ** 200 + 1):
        assert lib.clamor_py_body_size(id(n)) == sys.getsizeof(n), n


def test_types_an_extension_made_are_told_from_classes_static_or_not():
    import collections
    import decimal

    from clamor.memory._pyshare import is_class

    class Queue(collections.deque):
        pass

    assert [is_class(t) for t in (int, dict, collections.deque, decimal.Decimal)] == [False] * 4
    assert is_class(Queue) and is_class(type("Made", (), {}))
