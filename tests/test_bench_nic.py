"""``inceptionn bench nic`` end to end on one small unshaped link: by default the daemons' default
path (gso); with --both the per-packet soft NIC, then nicd --gso with 1 and 2 queue pairs
(--queues 1,2), two parallel streams; real daemons, real TCP in namespaces. The figures are not asserted (they depend on the machine), the counters behind
them are: super-packets compressed, no drop, fewer wire packets than per packet, every stream's
bytes counted, daemon CPU per GB measured at each end, one count per queue. Bad arguments give
one line. With --trains, wire format v2 and v3 side by side."""
from __future__ import annotations

import json

import pytest

from cli_helpers import assert_one_line_error, run_cli
from netns_helpers import needs_root

from inceptionn.daemon.config import NicdConfig


@needs_root
def test_default_measures_the_daemons_default_gso(no_leaks, capsys):
    from inceptionn.cli import main
    rc = main(["bench", "nic", "--links", "unshaped@1500", "--rounds", "1", "--megabytes", "1", "--captures", "2",
               "--json"])
    assert rc == 0
    r = json.loads(capsys.readouterr().out)
    link = r["links"][0]
    assert r["path"] == link["path"] == "gso" and "gso_runs" not in link
    assert link["super_packets"] > 0 and link["drops"] == {} and link["ratio"] > 3, link
    assert link["nic_bytes"] == link["raw_bytes"] == link["bytes"]


@needs_root
def test_ipv6_beside_ipv4(no_leaks, capsys):
    """--ipv6: each round's streams also over IPv6, through the same daemons, compressed there too
    (the sender's counters during the IPv6 tagged streams alone), and a table of both families."""
    from inceptionn.cli import main
    rc = main(["bench", "nic", "--links", "unshaped@1500", "--ipv6", "--rounds", "1", "--megabytes", "1",
               "--captures", "2"])
    assert rc == 0
    out = capsys.readouterr().out
    assert "IPv4 beside IPv6" in out, out
    rc = main(["bench", "nic", "--links", "unshaped@9000", "--no-gso", "--ipv6", "--rounds", "1", "--megabytes", "1",
               "--captures", "2", "--json"])
    assert rc == 0
    link = json.loads(capsys.readouterr().out)["links"][0]
    assert len(link["nic6_gbps"]) == len(link["raw6_gbps"]) == 1 and link["nic6"] > 0
    assert link["nic6_egress_compressed"] > 0 and link["ratio6"] > 3, link
    assert link["raw6_egress_compressed"] == 0  # untagged IPv6 left alone
    assert link["drops"] == {}, link


@needs_root
def test_both_paths_gso_with_one_and_two_queues(no_leaks, capsys):
    from inceptionn.cli import main
    rc = main(["bench", "nic", "--links", "unshaped@1500", "--both", "--queues", "1,2", "--streams", "2",
               "--rounds", "1", "--megabytes", "1", "--captures", "2", "--json"])
    assert rc == 0
    r = json.loads(capsys.readouterr().out)
    link = r["links"][0]
    assert r["path"] == link["path"] == "per-packet" and link["super_packets"] == 0
    nbytes = 2 * link["bytes"]  # two streams, each the whole stream
    assert link["nic_bytes"] == link["raw_bytes"] == nbytes
    assert link["sender_s_per_gb"] > 0 and link["receiver_s_per_gb"] > 0
    assert [g["queues"] for g in link["gso_runs"]] == [1, 2]
    for g in link["gso_runs"]:
        assert g["bytes"] == nbytes and g["gbps"][0] > 0
        assert g["super_packets"] > 0 and g["send_errors"] == 0 and g["drops"] == {}, g
        # the daemons' default format (v3): their super-packets leave as trains
        assert g["trains"] is NicdConfig().trains and (g["trains_sent"] > 0) is g["trains"], g
        assert g["ratio"] > 3, g  # gradients compress ~6x
        assert g["sender_s_per_gb"] > 0 and g["receiver_s_per_gb"] > 0
        assert len(g["sender_queue_packets"]) == g["queues"] and sum(g["sender_queue_packets"]) > 0
        assert g["packets"] < 0.6 * link["nic_packets"], (g["packets"], link["nic_packets"])
    assert link["gso"] == link["gso_runs"][0]["gbps_median"]


@needs_root
def test_trains_beside_v2(no_leaks, capsys):
    """--trains: the gso stream without and with nicd --trains in turn (wire format v2 against
    v3): trains sent only by the v3 daemons, every byte counted, no drop, both compressed."""
    from inceptionn.cli import main
    rc = main(["bench", "nic", "--links", "unshaped@1500", "--trains", "--rounds", "1", "--megabytes", "1",
               "--captures", "2", "--json"])
    assert rc == 0
    link = json.loads(capsys.readouterr().out)["links"][0]
    v2, v3 = link["trains_ab"]["v2"], link["trains_ab"]["v3"]
    assert v2["trains"] is False and v3["trains"] is True
    assert v2["trains_sent"] == 0 < v3["trains_sent"] <= v3["super_packets"], (v2, v3)
    for g in (v2, v3):
        assert g["bytes"] == link["bytes"] and g["gbps"][0] > 0 and g["drops"] == {}, g
        assert g["super_packets"] > 0 and g["ratio"] > 3 and g["send_errors"] == 0, g
        # 1 MB costs a v3 receiver about a millisecond, under the 10 ms tick /proc counts CPU in:
        # reported, but it may be 0
        assert g["sender_s_per_gb"] >= 0 and g["receiver_s_per_gb"] >= 0, g


@needs_root
def test_raw_input_reports_both_codec_modes(no_leaks, capsys):
    """--input raw: the stream once in each codec mode, per packet and with gso: ratio and NMSE
    side by side; the scaled mode keeps raw gradients (NMSE <= 0.06), the paper's zeroes them."""
    from inceptionn.cli import main
    rc = main(["bench", "nic", "--links", "unshaped@1500", "--input", "raw", "--rounds", "1", "--megabytes", "1",
               "--captures", "2", "--json"])
    assert rc == 0
    modes = json.loads(capsys.readouterr().out)["links"][0]["modes"]
    assert [(m["mode"], m["gso"]) for m in modes] == [("paper", False), ("scaled", False), ("paper", True),
                                                      ("scaled", True)]
    for paper, scaled in (modes[:2], modes[2:]):
        assert scaled["nmse"] <= 0.06 < paper["nmse"], (paper, scaled)
        assert paper["ratio"] > scaled["ratio"] > 2, (paper, scaled)


@pytest.mark.parametrize("args,needle", [
    (["--queues", "1,x"], "--queues"),
    (["--queues", "0"], "--queues"),
    (["--streams", "0"], "--streams"),
    (["--no-gso", "--both"], "not allowed with"),
])
def test_bad_arguments_give_one_line(args, needle):
    assert_one_line_error(run_cli("bench", "nic", *args), needle)
