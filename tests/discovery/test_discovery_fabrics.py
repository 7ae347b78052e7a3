"""Declared fabrics against the adapters found: advertised or not, and why."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmgw.discovery import adapters, fabrics
from llmgw.discovery.fabrics import DeclaredFabric
from llmgw.fleet.types import Adapter, Port

NODES = Path(__file__).resolve().parents[1] / "fixtures" / "nodes"
IB4 = ("mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3")


def on(node: str) -> list[Adapter]:
    return adapters.read(NODES / node / "sys")


@pytest.mark.parametrize(
    ("node", "declared", "advertised", "usable", "reasons"),
    [
        pytest.param("h100-ib", DeclaredFabric("ib-a", "infiniband", IB4), True, list(IB4), [],
                     id="all-active"),
        pytest.param("faulty", DeclaredFabric("ib-a", "infiniband", IB4), True,
                     ["mlx5_0", "mlx5_1", "mlx5_3"],
                     ["3 of 4 adapters ACTIVE", "mlx5_2 has no ACTIVE port (port 1: INIT, LinkUp)"],
                     id="one-port-init"),
        pytest.param("h100-ib", DeclaredFabric("ib-a", "infiniband", (*IB4, "mlx5_4")), False,
                     list(IB4), ["adapter mlx5_4 is declared but not present "
                                 "(found: mlx5_0, mlx5_1, mlx5_2, mlx5_3)"], id="missing-adapter"),
        pytest.param("l40s-nofabric", DeclaredFabric("ib-a", "infiniband", ("mlx5_0",)), False,
                     [], ["adapter mlx5_0 is declared but not present (found: none)"],
                     id="no-infiniband-at-all"),
        pytest.param("a100-roce", DeclaredFabric("roce-a", "roce", ("mlx5_0", "mlx5_1"), 3),
                     True, ["mlx5_0", "mlx5_1"], [], id="roce"),
        pytest.param("a100-roce", DeclaredFabric("roce-a", "roce", ("mlx5_0",), 5), False, [],
                     ["mlx5_0 port 1 has no GID at index 5 (RoCE v2 needs an IP address on "
                      "the adapter's interface)", "no declared adapter of roce-a is usable"],
                     id="roce-gid-index-unpopulated"),
        pytest.param("a100-roce", DeclaredFabric("roce-a", "roce", ("mlx5_0",), 2), False, [],
                     ["mlx5_0 port 1 GID 2 is IB/RoCE v1, not RoCE v2",
                      "no declared adapter of roce-a is usable"], id="roce-v1-gid"),
        pytest.param("a100-roce", DeclaredFabric("ib-a", "infiniband", ("mlx5_0",)), False, [],
                     ["mlx5_0 is Ethernet, but ib-a is declared infiniband",
                      "no declared adapter of ib-a is usable"], id="roce-declared-as-ib"),
    ],
)
def test_check(
    node: str, declared: DeclaredFabric, advertised: bool, usable: list[str], reasons: list[str]
) -> None:
    [status] = fabrics.check([declared], on(node))
    assert (status.advertised, status.adapters, status.reasons) == (advertised, usable, reasons)


def test_roce_gets_the_default_gid_index_and_ib_none() -> None:
    [roce] = fabrics.check([DeclaredFabric("r", "roce", ("mlx5_0",))], on("a100-roce"))
    [ib] = fabrics.check([DeclaredFabric("i", "infiniband", ("mlx5_0",))], on("h100-ib"))
    assert roce.gid_index == 3 and roce.advertised and ib.gid_index is None


def test_every_port_down_is_not_advertised() -> None:
    down = [Adapter(name="mlx5_0", ports=[Port(number=1, state="DOWN", phys_state="Disabled",
                                                link_layer="InfiniBand")])]
    [status] = fabrics.check([DeclaredFabric("ib-a", "infiniband", ("mlx5_0",))], down)
    assert not status.advertised
    assert status.reasons == ["mlx5_0 has no ACTIVE port (port 1: DOWN, Disabled)",
                              "no declared adapter of ib-a is usable"]


def test_a_fabric_declared_without_adapters_is_not_advertised() -> None:
    [status] = fabrics.check([DeclaredFabric("ib-a", "infiniband", ())], on("h100-ib"))
    assert not status.advertised and status.reasons == [
        "no adapters declared for ib-a on this node"
    ]


def test_a_fabric_with_adapters_down_says_how_many_are_active() -> None:
    """Two of four HCAs down: advertised with the two, and the count is in the report."""
    found = on("faulty")
    for adapter in found:
        if adapter.name in ("mlx5_1", "mlx5_2"):
            adapter.ports[0] = adapter.ports[0].model_copy(update={"state": "DOWN"})
    [status] = fabrics.check([DeclaredFabric("ib-a", "infiniband", IB4)], found)
    assert status.advertised and status.adapters == ["mlx5_0", "mlx5_3"]
    assert status.declared_adapters == 4 and status.active == "2 of 4 adapters ACTIVE"
    assert status.reasons[0] == "2 of 4 adapters ACTIVE"


def test_found_adapters_are_listed_in_natural_order(tmp_path: Path) -> None:
    for name in ("mlx5_10", "mlx5_2", "mlx5_1"):
        (tmp_path / "class/infiniband" / name / "ports/1").mkdir(parents=True)
    [status] = fabrics.check([DeclaredFabric("ib-a", "infiniband", ("mlx5_3",))],
                             adapters.read(tmp_path))
    assert status.reasons[0] == ("adapter mlx5_3 is declared but not present "
                                 "(found: mlx5_1, mlx5_2, mlx5_10)")


def _roce_port(gids: list[tuple[str, str]]) -> Adapter:
    port = Port(number=1, state="ACTIVE", phys_state="LinkUp", link_layer="Ethernet",
                gids=[g for g, _ in gids], gid_types=[t for _, t in gids])
    return Adapter(name="mlx5_0", ports=[port])


LINK_LOCAL = "fe80:0000:0000:0000:0a00:00ff:fe00:0001"
IPV4 = "0000:0000:0000:0000:0000:ffff:0a00:0001"


def test_an_undeclared_roce_gid_index_is_the_one_nccl_would_pick() -> None:
    # A card whose RoCE v2 IPv4 GID is at 5, not at the 3 once assumed.
    adapter = _roce_port([(LINK_LOCAL, "IB/RoCE v1"), (LINK_LOCAL, "RoCE v2"),
                          (adapters.EMPTY_GID, ""), (adapters.EMPTY_GID, ""),
                          (IPV4, "IB/RoCE v1"), (IPV4, "RoCE v2")])
    [status] = fabrics.check([DeclaredFabric("r", "roce", ("mlx5_0",))], [adapter])
    assert (status.advertised, status.gid_index) == (True, 5)


def test_no_roce_v2_ipv4_gid_means_no_index_and_no_fabric() -> None:
    adapter = _roce_port([(LINK_LOCAL, "IB/RoCE v1"), (LINK_LOCAL, "RoCE v2")])
    [status] = fabrics.check([DeclaredFabric("r", "roce", ("mlx5_0",))], [adapter])
    assert (status.advertised, status.gid_index) == (False, None)
    assert status.reasons[0].startswith("mlx5_0 has no RoCE v2 GID with an IPv4 address")
