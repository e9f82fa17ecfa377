"""``inceptionn demo``: the main job on the embedded default data.

Until the soft NIC and the training job land, the demo is the codec benchmark on real gradients
of the HDC model trained on scikit-learn's digits (shipped with the package, no download).
"""
from __future__ import annotations

from .bench import codec as codec_bench


def register(sub) -> None:
    p = sub.add_parser("demo", help="run the main job on the embedded default data",
                       description=__doc__)
    codec_bench.add_arguments(p)
