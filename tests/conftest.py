"""Fixtures every test module gets by name: leak checks and namespaces that are removed even on
failure (no_leaks, tb_name, veth_ns), and real gradients (grads, small). Plain helpers live in
modules named for what they are: netns_helpers.py, cli_helpers.py, proc_helpers.py, codec_checks.py."""
from __future__ import annotations

import itertools
import os

import numpy as np
import pytest
from hypothesis import settings

# The property tests (hypothesis) draw the same examples on every run: CI's verdict must not
# depend on luck. INCEPTIONN_HYPOTHESIS=explore draws new ones each run, for a hunt.
settings.register_profile("fixed", derandomize=True, database=None)
settings.register_profile("explore", derandomize=False)
settings.load_profile(os.environ.get("INCEPTIONN_HYPOTHESIS", "fixed"))

from inceptionn.kernel_tc import netns as ns
from netns_helpers import SESSION_TAG, snapshot


@pytest.fixture
def no_leaks():
    """Assert the test left no namespace, root link, root qdisc or iptables/ip6tables rule behind."""
    before = snapshot()
    yield
    after = snapshot()
    assert after["netns"] == [], f"namespaces left behind: {after['netns']}"
    new = sorted(set(after["all_netns"]) - set(before["all_netns"]))
    assert not new, f"namespaces left behind: {new}"
    assert after["root_links"] == before["root_links"], "links appeared/vanished in the root namespace"
    assert after["root_qdiscs"] == before["root_qdiscs"], "root namespace qdiscs changed"
    assert after["root_rules"] == before["root_rules"], "iptables/ip6tables rules changed in the root namespace"


_names = itertools.count(1)


@pytest.fixture
def tb_name(no_leaks):
    """A testbed name unique to this run and test; its namespaces are removed even on failure,
    and then no_leaks (set up first, so checked last) asserts nothing is left."""
    from inceptionn.kernel_tc.testbed import teardown
    name = f"{SESSION_TAG}_{next(_names)}"
    teardown(name)
    try:
        yield name
    finally:
        teardown(name)


@pytest.fixture
def veth_ns(no_leaks):
    """A namespace holding a veth pair (va <-> vb), for shaping without touching real NICs;
    removed even on failure, then checked for leaks."""
    name = f"inc-{SESSION_TAG}-link"
    if ns.exists(name):
        ns.delete(name)
    ns.create(name)
    try:
        with ns.ipr(name) as ipr:
            ipr.link("add", ifname="va", kind="veth", peer="vb")
            for ifname in ("lo", "va", "vb"):
                ipr.link("set", index=ipr.link_lookup(ifname=ifname)[0], state="up")
        yield name
    finally:
        ns.delete(name)


# --- data --------------------------------------------------------------------------------------

@pytest.fixture(scope="session")
def grads() -> np.ndarray:
    """Real gradients (~9.4 MB of float32), scaled as in the manual run."""
    from inceptionn.train.gradients import gradient_sample
    return (gradient_sample(3) * np.float32(16)).astype(np.float32)


@pytest.fixture(scope="session")
def small(grads) -> np.ndarray:
    return np.ascontiguousarray(grads[: 512 * 1024])  # 2 MiB
