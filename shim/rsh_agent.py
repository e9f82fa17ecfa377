"""OpenMPI's remote-shell agent for testbed hosts: "ssh" into a network namespace.

mpirun (``--mca plm_rsh_agent``) calls it as it would call ssh::

    AGENT [ssh options] HOST COMMAND WORDS...

HOST is looked up in a JSON map written by ``inceptionn mpirun`` (path in INCEPTIONN_RSH_MAP):
host name or address -> the argv prefix that enters that host (``ip netns exec NS unshare
--uts ... hostname hN``: OpenMPI tells nodes apart by host name). The command words are joined
and run by ``sh -c``, as sshd would hand them to the remote shell. Standard library only, and
run with ``python -I``: it starts once per host and must start fast.
"""
import json
import os
import sys

MAP_ENV = "INCEPTIONN_RSH_MAP"


def main(argv: list[str]) -> int:
    args = list(argv)
    while args and args[0].startswith("-"):  # ssh-style options (e.g. -x): nothing to do here
        args.pop(0)
    if len(args) < 2:
        print("inceptionn rsh agent: usage: AGENT HOST COMMAND...", file=sys.stderr)
        return 255
    host, words = args[0], args[1:]
    path = os.environ.get(MAP_ENV)
    if not path:
        print(f"inceptionn rsh agent: {MAP_ENV} is not set (run through `inceptionn mpirun --testbed`)",
              file=sys.stderr)
        return 255
    with open(path) as f:
        hosts = json.load(f)
    if host not in hosts:
        print(f"inceptionn rsh agent: unknown host {host!r} (testbed hosts: {', '.join(sorted(hosts))})",
              file=sys.stderr)
        return 255
    prefix = hosts[host]
    os.execvp(prefix[0], [*prefix, "sh", "-c", " ".join(words)])
    return 255  # not reached


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
