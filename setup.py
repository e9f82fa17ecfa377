# Only what pyproject.toml cannot say: the C parts.
#  - cffi extensions: the codecs, the soft NIC's data path, the tagging contract with the
#    policy parser (the same C the preload library runs), and the ring engine (the same C the
#    MPI library runs)
#  - the tagging shim's LD_PRELOAD library, built as an extension module file so that every
#    install (editable or wheel) puts it beside inceptionn.shim; it is never imported, only
#    found by inceptionn.shim.run.preload_library() and handed to the dynamic loader
#  - the MPI_Allreduce interposition library (collective/pmpi_allreduce.c), likewise, once per MPI
#    ABI whose compiler wrapper is there to say how to build against it: OpenMPI's
#    (libopenmpi-dev) and MPICH's (libmpich-dev)
import importlib.util
import shlex
import shutil
import subprocess

from setuptools import Extension, setup

tag_preload = Extension(
    "inceptionn.shim._tagpreload",
    sources=["shim/inceptionn_tag.c", "shim/tag_policy.c"],
    include_dirs=["shim", "inceptionn"],
    depends=["shim/inceptionn_tag.h", "shim/tag_policy.h", "inceptionn/inceptionn_contract.h", "shim/log_line.h"],
    extra_compile_args=["-O2", "-std=gnu11", "-Wall", "-Wextra", "-fvisibility=hidden"],
    libraries=["dl"],
)



def mpi_flags(family):
    """(include dirs, library dirs, libraries, other link args) of one MPI family from its compiler
    wrapper, or None. The wrappers are named explicitly (Debian's mpicc.openmpi, mpicc.mpich):
    plain mpicc is a Debian alternative and may point to either."""
    if family == "openmpi":
        cc = shutil.which("mpicc.openmpi") or shutil.which("mpicc")
        queries = [[cc, "--showme:compile"], [cc, "--showme:link"]]
    else:
        cc = shutil.which("mpicc.mpich")
        queries = [[cc, "-compile_info"], [cc, "-link_info"]]
    if not cc:
        return None
    try:
        comp, link = (shlex.split(subprocess.run(q, capture_output=True, text=True, check=True).stdout)
                      for q in queries)
    except (OSError, subprocess.CalledProcessError):
        return None
    if family == "mpich":   # MPICH's answer is a whole command line: the compiler, then its flags
        link = [a for a in link[1:] if not a.startswith(("-I", "-Wl,"))]
    return ([a[2:] for a in comp if a.startswith("-I")], [a[2:] for a in link if a.startswith("-L")],
            [a[2:] for a in link if a.startswith("-l")], [a for a in link if not a.startswith(("-L", "-l"))])


# the MPI library's C files and flags, listed once (collective/build_ffi.py; the codecs' in codecs_c/build_ffi.py)
_spec = importlib.util.spec_from_file_location("engine_build", "collective/build_ffi.py")
engine = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(engine)

ext_modules = [tag_preload]
# One source, one library per MPI ABI (collective/pmpi_abi.c refuses to run in the other kind);
# collective/pmpi_env.py picks the one a program needs.
for family, module in (("openmpi", "inceptionn.collective._pmpi_allreduce"),
                       ("mpich", "inceptionn.collective._pmpi_allreduce_mpich")):
    if (mpi := mpi_flags(family)) is None:
        continue
    ext_modules.append(Extension(
        module,
        sources=engine.PMPI_SOURCES,
        include_dirs=[*engine.PMPI_INCLUDE, *mpi[0]],
        depends=engine.PMPI_DEPENDS,
        extra_compile_args=engine.PMPI_CFLAGS,
        library_dirs=mpi[1], runtime_library_dirs=mpi[1], libraries=[*mpi[2], *engine.PMPI_LIBRARIES], extra_link_args=mpi[3],
    ))

setup(
    cffi_modules=["codecs_c/build_ffi.py:ffibuilder", "daemon/build_ffi.py:ffibuilder",
                  "shim/build_ffi.py:ffibuilder", "collective/build_ffi.py:ffibuilder"],
    ext_modules=ext_modules,
)
