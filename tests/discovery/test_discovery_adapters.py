"""/sys/class/infiniband read from the fixture nodes' sysfs trees, and its formats."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmgw.discovery import adapters

NODES = Path(__file__).resolve().parents[1] / "fixtures" / "nodes"


@pytest.mark.parametrize(
    ("text", "gbps"),
    [
        ("400 Gb/sec (4X NDR)", 400.0),
        ("200 Gb/sec (4X HDR)", 200.0),
        ("100 Gb/sec (4X EDR)", 100.0),
        ("25 Gb/sec (1X EDR)", 25.0),
        ("2.5 Gb/sec (1X SDR)", 2.5),
        ("56 Gb/sec (4X FDR)", 56.0),
        ("", None),
        ("Invalid argument", None),
    ],
)
def test_rates_as_sysfs_writes_them(text: str, gbps: float | None) -> None:
    assert adapters.parse_rate(text) == gbps


@pytest.mark.parametrize(
    ("text", "state"),
    [("4: ACTIVE", "ACTIVE"), ("2: INIT", "INIT"), ("1: DOWN", "DOWN"), ("3: ARMED", "ARMED"),
     ("5: LinkUp", "LinkUp"), ("2: Polling", "Polling"), ("3: Disabled", "Disabled"), ("", None)],
)
def test_states_keep_the_name(text: str, state: str | None) -> None:
    assert adapters.parse_state(text) == state


def test_h100_node_has_four_ndr_infiniband_hcas() -> None:
    found = adapters.read(NODES / "h100-ib" / "sys")
    assert [a.name for a in found] == ["mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3"]
    for adapter in found:
        [port] = adapter.ports
        assert (port.number, port.state, port.phys_state, port.link_layer) == (
            1, "ACTIVE", "LinkUp", "InfiniBand"
        )
        assert port.rate == "400 Gb/sec (4X NDR)" and port.rate_gbps == 400.0
        assert port.gids[0].startswith("fe80:0000:0000:0000:") and len(port.gids) == 1
        assert port.gid_types == [] and adapter.active and adapter.link_layer == "InfiniBand"


def test_roce_node_reports_ethernet_ports_with_gid_types() -> None:
    found = adapters.read(NODES / "a100-roce" / "sys")
    assert [a.name for a in found] == ["mlx5_0", "mlx5_1"]
    port = found[0].ports[0]
    assert port.link_layer == "Ethernet" and port.rate_gbps == 100.0
    assert port.gid_types == ["IB/RoCE v1", "RoCE v2", "IB/RoCE v1", "RoCE v2"]
    assert port.gids[3] == "0000:0000:0000:0000:0000:ffff:0a00:0115"  # ::ffff:10.0.1.21
    assert len(port.gids) == 4, "trailing unpopulated GIDs are left out"


def test_faulty_node_has_one_port_in_init() -> None:
    states = {a.name: a.ports[0].state for a in adapters.read(NODES / "faulty" / "sys")}
    assert states == {"mlx5_0": "ACTIVE", "mlx5_1": "ACTIVE", "mlx5_2": "INIT", "mlx5_3": "ACTIVE"}


@pytest.mark.parametrize("node", ["l40s-nofabric", "cpu-only", "old-driver"])
def test_no_infiniband_directory_means_no_adapters(node: str) -> None:
    assert adapters.read(NODES / node / "sys") == []


def test_unreadable_attributes_are_absent(tmp_path: Path) -> None:
    port = tmp_path / "class/infiniband/mlx5_9/ports/1"
    port.mkdir(parents=True)
    (port / "state").write_text("1: DOWN\n")
    (port / "rate").mkdir()  # reading a directory fails like EINVAL does
    [adapter] = adapters.read(tmp_path)
    assert adapter.ports[0].state == "DOWN" and adapter.ports[0].rate is None
    assert adapter.ports[0].link_layer is None and not adapter.active


def test_adapters_sort_naturally(tmp_path: Path) -> None:
    """mlx5_2 before mlx5_10, as an operator counts, not as strings sort."""
    for name in ("mlx5_10", "mlx5_2", "mlx5_0", "mlx5_1", "mlx5_11"):
        (tmp_path / "class/infiniband" / name / "ports/1").mkdir(parents=True)
    assert [a.name for a in adapters.read(tmp_path)] == [
        "mlx5_0", "mlx5_1", "mlx5_2", "mlx5_10", "mlx5_11"]
