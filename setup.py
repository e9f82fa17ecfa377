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


ext_modules = [tag_preload]
# One source, one library per MPI ABI (collective/pmpi_abi.c refuses to run in the other kind);
# shim/mpienv.py picks the one a program needs.
for family, module in (("openmpi", "inceptionn.collective._pmpi_allreduce"),
                       ("mpich", "inceptionn.collective._pmpi_allreduce_mpich")):
    if (mpi := mpi_flags(family)) is None:
        continue
    ext_modules.append(Extension(
        module,
        sources=["collective/pmpi_allreduce.c", "collective/pmpi_abi.c", "collective/ring_engine.c",
                 "collective/ring_handshake.c", "collective/nicd_bound.c",
                 "collective/ring_codecs.c", "codecs_c/inceptionn_codec.c", "codecs_c/inceptionn_codec_avx2.c",
                 "codecs_c/blockscale_codec.c", "codecs_c/thc_codec.c", "codecs_c/threelc_codec.c",
                 "codecs_c/terngrad_codec.c"],
        include_dirs=["collective", "codecs_c", "shim", *mpi[0]],
        depends=["collective/pmpi_allreduce.h", "collective/ring_engine.h", "collective/ring_handshake.h",
                 "collective/nicd_bound.h", "codecs_c/inceptionn_codec.h",
                 "codecs_c/blockscale_codec.h", "codecs_c/thc_codec.h", "codecs_c/threelc_codec.h",
                 "codecs_c/terngrad_codec.h", "shim/inceptionn_contract.h", "shim/log_line.h"],
        extra_compile_args=["-O3", "-std=gnu11", "-Wall", "-Wextra", "-fvisibility=hidden", "-pthread",
                            "-ffp-contract=off"],  # the same roundings on every host, as the codecs
        library_dirs=mpi[1], runtime_library_dirs=mpi[1], libraries=[*mpi[2], "crypto", "m"], extra_link_args=mpi[3],
    ))

setup(
    cffi_modules=["codecs_c/build_ffi.py:ffibuilder", "daemon/build_ffi.py:ffibuilder",
                  "shim/build_ffi.py:ffibuilder", "collective/build_ffi.py:ffibuilder"],
    ext_modules=ext_modules,
)
