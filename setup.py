from setuptools import setup

# Metadata lives in pyproject.toml; this file only wires in the cffi build.
setup(cffi_modules=["clamor/_build.py:ffibuilder"])
