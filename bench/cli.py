"""``inceptionn bench ...``: benchmarks that print figures, side by side in one run."""
from . import codec, nic


def register(sub) -> None:
    p = sub.add_parser("bench", help="benchmarks (codec, ...)", description=__doc__)
    benches = p.add_subparsers(dest="bench", metavar="BENCH")
    benches.required = True
    codec.add_arguments(benches.add_parser(
        "codec", help="INCEPTIONN codec speed and bitwidth distribution on real gradients",
        description=codec.__doc__))
    nic.add_arguments(benches.add_parser(
        "nic", help="soft NIC goodput over emulated links, with and without the daemons",
        description=nic.__doc__))
