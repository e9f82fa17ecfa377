# Only what pyproject.toml cannot say: the C parts.
#  - cffi extensions: the codecs, the soft NIC's data path, and the tagging contract with the
#    policy parser (the same C the preload library runs)
#  - the tagging shim's LD_PRELOAD library, built as an extension module file so that every
#    install (editable or wheel) puts it beside inceptionn.shim; it is never imported, only
#    found by inceptionn.shim.run.preload_library() and handed to the dynamic loader
#  - the MPI_Allreduce interposition library (collective/pmpi_allreduce.c), likewise, when
#    OpenMPI's mpicc is there to say how to build against libmpi (libopenmpi-dev)
import shlex
import shutil
import subprocess

from setuptools import Extension, setup

tag_preload = Extension(
    "inceptionn.shim._tagpreload",
    sources=["shim/inceptionn_tag.c", "shim/tag_policy.c"],
    include_dirs=["shim"],
    depends=["shim/inceptionn_tag.h", "shim/tag_policy.h", "shim/inceptionn_contract.h", "shim/log_line.h"],
    extra_compile_args=["-O2", "-std=gnu11", "-Wall", "-Wextra", "-fvisibility=hidden"],
    libraries=["dl"],
)



def mpi_flags():
    """(include dirs, library dirs, libraries, other link args) from `mpicc --showme`, or None."""
    if not shutil.which("mpicc"):
        return None
    try:
        comp = shlex.split(subprocess.run(["mpicc", "--showme:compile"], capture_output=True, text=True,
                                          check=True).stdout)
        link = shlex.split(subprocess.run(["mpicc", "--showme:link"], capture_output=True, text=True,
                                          check=True).stdout)
    except (OSError, subprocess.CalledProcessError):
        return None
    return ([a[2:] for a in comp if a.startswith("-I")], [a[2:] for a in link if a.startswith("-L")],
            [a[2:] for a in link if a.startswith("-l")], [a for a in link if not a.startswith(("-L", "-l"))])


ext_modules = [tag_preload]
if (mpi := mpi_flags()) is not None:
    ext_modules.append(Extension(
        "inceptionn.collective._pmpi_allreduce",
        sources=["collective/pmpi_allreduce.c", "codecs_c/inceptionn_codec.c", "codecs_c/inceptionn_codec_avx2.c",
                 "codecs_c/blockscale_codec.c"],
        include_dirs=["collective", "codecs_c", "shim", *mpi[0]],
        depends=["collective/pmpi_allreduce.h", "codecs_c/inceptionn_codec.h", "codecs_c/blockscale_codec.h", "shim/inceptionn_contract.h",
                 "shim/log_line.h"],
        extra_compile_args=["-O3", "-std=gnu11", "-Wall", "-Wextra", "-fvisibility=hidden", "-pthread",
                            "-ffp-contract=off"],  # the same roundings on every host, as the codecs
        library_dirs=mpi[1], runtime_library_dirs=mpi[1], libraries=[*mpi[2], "m"], extra_link_args=mpi[3],
    ))

setup(
    cffi_modules=["codecs_c/build_ffi.py:ffibuilder", "daemon/build_ffi.py:ffibuilder",
                  "shim/build_ffi.py:ffibuilder"],
    ext_modules=ext_modules,
)
