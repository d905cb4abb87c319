"""cffi builder for clamor's C core (API mode, out of line).

Run by setuptools through ``cffi_modules`` in setup.py; it never imports the
``clamor`` package itself, so it works before anything is built.
"""
import glob
import os

import numpy
from cffi import FFI

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
CSRC = os.path.join(ROOT, "csrc")


def _rel(path):
    # setuptools wants sources relative to the project root it runs from.
    try:
        return os.path.relpath(path)
    except ValueError:
        return path


ffibuilder = FFI()
with open(os.path.join(HERE, "_cdefs.h")) as f:
    ffibuilder.cdef(f.read())

ffibuilder.set_source(
    "clamor._clamor",
    # clamor.h is the C contract, binding.h what only this module calls, and
    # internal.h declares the Python-only hooks (clamor_py_*) the cdefs name.
    '#include "clamor.h"\n#include "binding.h"\n#include "internal.h"\n',
    sources=[_rel(p) for p in sorted(glob.glob(os.path.join(CSRC, "*.c")))],
    libraries=["dl", "pthread", "m"],
    include_dirs=[_rel(CSRC), numpy.get_include()],
    define_macros=[("CLAMOR_WITH_PYTHON", "1")],
    extra_compile_args=["-std=gnu11", "-O2", "-Wall", "-Wextra", "-Wno-unused-parameter", "-Werror=implicit-function-declaration",
                        "-fvisibility=hidden"],
    depends=[_rel(p) for p in sorted(glob.glob(os.path.join(CSRC, "*.h")))],
    # Not the stable ABI: the py*.c files read CPython's internal layouts,
    # which change with every minor version.  The file is then named for its
    # interpreter (_clamor.cpython-312-x86_64-linux-gnu.so), so an editable
    # install for a second Python builds its own instead of loading another's.
    py_limited_api=False,
)

if __name__ == "__main__":
    ffibuilder.compile(verbose=True)
