import os
import shutil

from setuptools import setup
from setuptools.command.build_py import build_py


class build_py_with_header(build_py):
    """Ship csrc/clamor.h in the package (clamor/include/), for C code that
    uses clamor's allocator (``clamor.get_include()``)."""

    def run(self):
        super().run()
        dest = os.path.join(self.build_lib, "clamor", "include")
        os.makedirs(dest, exist_ok=True)
        shutil.copy(os.path.join(os.path.dirname(os.path.abspath(__file__)), "csrc", "clamor.h"), dest)


# Metadata lives in pyproject.toml; this file only wires in the cffi build
# and the header.
setup(cffi_modules=["clamor/_build.py:ffibuilder"], cmdclass={"build_py": build_py_with_header})
