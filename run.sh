#!/usr/bin/env bash
# One entry point that works as root on a fresh Debian machine: installs the system packages the
# project needs (only those missing), then hands over to make, which builds the virtual
# environment, the C codecs and runs the target.
#   ./run.sh demo    the main job on the embedded default data
#   ./run.sh test    the whole test suite (what CI runs)
#   ./run.sh TARGET  any other make target (bench, fuzz, check-c, clean)
set -euo pipefail
cd "$(dirname "$0")"

APT_PACKAGES=(
  make gcc libc6-dev python3 python3-venv python3-dev   # build and the venv
  clang libclang-rt-14-dev                               # libFuzzer + sanitizers
  iproute2 iptables iputils-ping ethtool iperf3          # testbed, rules, link checks
  nftables procps                                        # nft (netdev counters in tests), sysctl (testbed)
  libnetfilter-queue-dev                                 # the soft NIC's queue
  libssl-dev                                             # libcrypto: the ring handshake's HMAC-SHA256
  openmpi-bin libopenmpi-dev                             # mpirun wrapper, mpi4py, MPI baseline
  mpich libmpich-dev                                     # the MPI_Allreduce library's MPICH build, mpiexec.hydra
  slurmctld slurmd slurm-client munge                    # the Slurm test (daemons only in testbed namespaces)
  systemd systemd-container                              # the unit: systemd-analyze, nspawn test
  man-db                                                 # systemd-analyze verify opens the unit's man: links
  strace                                                 # the shim test: no extra syscalls untagged
  libcap2-bin                                            # capsh: nicd without CAP_NET_RAW (gso auto)
  prometheus prometheus-node-exporter                    # promtool, node_exporter: the metrics test
  python3-prometheus-client                              # its OpenMetrics parser, same test
)

missing=()
for p in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "run.sh: missing Debian packages: ${missing[*]}; run as root or install them first" >&2
    exit 1
  fi
  echo "run.sh: installing ${missing[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  # Debian starts a package's service on install (munge, slurmd, slurmctld, prometheus, ...). The
  # tests start their own, inside testbed namespaces; nothing runs machine-wide: policy-rc.d says no.
  policy=
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    policy=/usr/sbin/policy-rc.d
    trap 'rm -f "$policy"' EXIT
    printf '#!/bin/sh\nexit 101\n' > "$policy" && chmod 0755 "$policy"
  fi
  apt-get update -qq
  apt-get install -y -qq "${missing[@]}" >/dev/null
  if [ -n "$policy" ]; then rm -f "$policy"; trap - EXIT; fi
fi
# MPICH registers the same Debian alternatives as OpenMPI (mpi for mpicc and friends, mpirun, the
# include directory). The suite's OpenMPI tests call plain mpicc and mpirun (the build and the
# MPICH tests name each MPI's tools): keep OpenMPI selected whatever an install changed.
for alt in mpi mpirun mpi-x86_64-linux-gnu; do   # masters; libmpi.so and the rest follow them
  choice=$(update-alternatives --list "$alt" 2>/dev/null | grep -m1 openmpi || true)
  if [ -n "$choice" ] && [ "$(readlink -f "/etc/alternatives/$alt")" != "$(readlink -f "$choice")" ]; then
    if [ "$(id -u)" -ne 0 ]; then
      echo "run.sh: the $alt alternative is not OpenMPI's; run as root or: update-alternatives --set $alt $choice" >&2
      exit 1
    fi
    update-alternatives --set "$alt" "$choice" >/dev/null
  fi
done

# Two jobs per core pair: the sanitizer and fuzz binaries build beside the venv.
exec make --no-print-directory -j"$(nproc)" "${@:-test}"
