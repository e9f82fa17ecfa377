# Only what pyproject.toml cannot say: the C parts.
#  - cffi extensions: the codecs, the soft NIC's data path, and the tagging contract with the
#    policy parser (the same C the preload library runs)
#  - the tagging shim's LD_PRELOAD library, built as an extension module file so that every
#    install (editable or wheel) puts it beside inceptionn.shim; it is never imported, only
#    found by inceptionn.shim.run.preload_library() and handed to the dynamic loader
from setuptools import Extension, setup

tag_preload = Extension(
    "inceptionn.shim._tagpreload",
    sources=["shim/inceptionn_tag.c", "shim/tag_policy.c"],
    include_dirs=["shim"],
    depends=["shim/inceptionn_tag.h", "shim/tag_policy.h", "shim/inceptionn_contract.h"],
    extra_compile_args=["-O2", "-std=gnu11", "-Wall", "-Wextra", "-fvisibility=hidden"],
    libraries=["dl"],
)

setup(
    cffi_modules=["codecs_c/build_ffi.py:ffibuilder", "daemon/build_ffi.py:ffibuilder",
                  "shim/build_ffi.py:ffibuilder"],
    ext_modules=[tag_preload],
)
