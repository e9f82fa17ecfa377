# Only what pyproject.toml cannot say: the cffi extension build.
from setuptools import setup

setup(cffi_modules=["codecs_c/build_ffi.py:ffibuilder", "daemon/build_ffi.py:ffibuilder"])
