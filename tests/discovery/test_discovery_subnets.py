"""Subnet managers per port and NVIDIA cards on the PCI bus, from recorded sysfs trees.

``two-ib-roce`` is one node with two independent InfiniBand fabrics (a compute fabric
whose SM is LID 0x1 on the default prefix, a storage fabric with its own SM at 0x2a
and a site prefix), a port that is DOWN, and a RoCE port. ``gpu-no-driver`` is a PCI
bus with three NVIDIA GPUs (and an audio function of one), one without a driver.
"""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from llmgw.cli import checklists, node_cmd
from llmgw.discovery import adapters, fabrics, pcis
from llmgw.discovery.fabrics import DeclaredFabric
from llmgw.fleet.types import Gpu, NodeReport, PciCard
from llmgw.onboarding import doctors
from llmgw.spec.models import Node

SYSFS = Path(__file__).resolve().parents[1] / "fixtures" / "sysfs"
NODES = Path(__file__).resolve().parents[1] / "fixtures" / "nodes"
COMPUTE = "SM LID 0x1, GID prefix fe80:0000:0000:0000"
STORAGE = "SM LID 0x2a, GID prefix fec0:0000:0000:0002"


def found() -> list:
    return adapters.read(SYSFS / "two-ib-roce" / "sys")


def test_each_port_says_which_subnet_manager_it_answers_to() -> None:
    ports = {a.name: a.ports[0] for a in found()}
    seen = {name: (p.lid, p.sm_lid, p.gid_prefix, p.subnet) for name, p in ports.items()}
    assert seen == {
        "mlx5_0": ("0xb0", "0x1", "fe80:0000:0000:0000", COMPUTE),
        "mlx5_1": ("0xb1", "0x1", "fe80:0000:0000:0000", COMPUTE),
        "mlx5_2": ("0x17", "0x2a", "fec0:0000:0000:0002", STORAGE),
        # DOWN: no subnet, whatever stale values sysfs still holds.
        "mlx5_3": ("0xffff", "0x0", "fe80:0000:0000:0000", None),
        # RoCE: sm_lid 0x0; the network is the RoCE v2 GID's IPv4 address (192.168.50.11).
        "mlx5_4": ("0x0", "0x0", "fe80:0000:0000:0000", "RoCE 192.168.50.0/24"),
    }


def test_the_recorded_h100_node_is_one_subnet() -> None:
    subnets = {s for a in adapters.read(NODES / "h100-ib" / "sys") for s in a.subnets}
    assert subnets == {COMPUTE}


def test_a_fabric_over_two_subnet_managers_is_not_advertised_and_says_which() -> None:
    declared = DeclaredFabric("ib-a", "infiniband", ("mlx5_0", "mlx5_1", "mlx5_2"))
    [status] = fabrics.check([declared], found())
    assert not status.advertised
    assert status.reasons == [
        f"ib-a's adapters answer to 2 different subnet managers (mlx5_0, mlx5_1: {COMPUTE}; "
        f"mlx5_2: {STORAGE}); fix: declare each as its own fabric in the cluster's "
        "`fabrics:` and the node's `fabrics:` in nodes.yaml, or cable them to one subnet"]
    # Declared as two fabrics, both are whole.
    split = fabrics.check([DeclaredFabric("ib-a", "infiniband", ("mlx5_0", "mlx5_1")),
                           DeclaredFabric("ib-s", "infiniband", ("mlx5_2",))], found())
    assert [(s.advertised, s.reasons) for s in split] == [(True, []), (True, [])]


def test_a_down_port_does_not_split_a_fabric() -> None:
    declared = DeclaredFabric("ib-a", "infiniband", ("mlx5_0", "mlx5_3"))
    [status] = fabrics.check([declared], found())
    assert status.advertised and status.adapters == ["mlx5_0"]
    assert status.reasons[0] == "1 of 2 adapters ACTIVE"


def test_roce_rails_on_their_own_networks_are_one_fabric() -> None:
    # a100-roce: mlx5_0 on 10.0.1.21, mlx5_1 on 10.0.2.21; RoCE v2 is routed.
    on = adapters.read(NODES / "a100-roce" / "sys")
    assert [a.subnets for a in on] == [["RoCE 10.0.1.0/24"], ["RoCE 10.0.2.0/24"]]
    [status] = fabrics.check([DeclaredFabric("roce-a", "roce", ("mlx5_0", "mlx5_1"), 3)], on)
    assert status.advertised


def _doctor(check: str, spec: Node, report: NodeReport,
            kinds: dict[str, tuple[str, int | None]]) -> tuple[str, str, str]:
    ctx = doctors.Context(version="0", now=0.0, fabrics=kinds)
    [finding] = [f for f in doctors.examine("gpu-07", spec, report, ctx) if f.check == check]
    return finding.status, finding.detail, finding.fix


def test_doctor_groups_each_fabric_by_subnet_manager() -> None:
    report = NodeReport(node="gpu-07", adapters=found())
    kinds: dict[str, tuple[str, int | None]] = {"ib-a": ("infiniband", None),
                                                "roce-a": ("roce", None)}
    bad = Node(address="10.0.0.7", fabrics={"ib-a": ["mlx5_0", "mlx5_2"]})
    assert _doctor("fabric-subnets", bad, report, kinds) == (
        "fail", f"adapters of one fabric on different subnet managers: ib-a: mlx5_0: "
        f"{COMPUTE}; mlx5_2: {STORAGE}",
        "declare each subnet as its own fabric (cluster `fabrics:` and the node's "
        "`fabrics:` in nodes.yaml), or cable the adapters to one subnet")
    good = Node(address="10.0.0.7", fabrics={"ib-a": ["mlx5_0", "mlx5_1"], "roce-a": ["mlx5_4"]})
    assert _doctor("fabric-subnets", good, report, kinds) == (
        "ok", f"ib-a: mlx5_0, mlx5_1: {COMPUTE}; roce-a: mlx5_4: RoCE 192.168.50.0/24", "")


def test_node_add_asks_once_per_subnet_manager() -> None:
    asked: list[str] = []
    answers = iter(["none", "ib-a", "ib-s", "none"])

    def ask(question: str) -> str:
        asked.append(question)
        return next(answers)

    steps = checklists.Checklist(io.StringIO(), ["fabrics"], live=False, ask=ask)
    chosen = node_cmd._fabrics(steps, NodeReport(node="n", adapters=found()), {},
                               ["ib-a", "ib-s"], interactive=True)
    assert [q.split(": on which")[0] for q in asked] == [
        "Ethernet adapters mlx5_4 (RoCE 192.168.50.0/24)",
        f"InfiniBand adapters mlx5_0, mlx5_1 ({COMPUTE})",
        f"InfiniBand adapters mlx5_2 ({STORAGE})",
        "InfiniBand adapters mlx5_3 (subnet unknown: no ACTIVE port)",
    ]
    assert chosen == {"ib-a": ["mlx5_0", "mlx5_1"], "ib-s": ["mlx5_2"]}


CARDS = [PciCard(address="0000:41:00.0", device_id="2330", driver="nvidia"),
         PciCard(address="0000:81:00.0", device_id="2330", driver="nvidia"),
         PciCard(address="0000:c1:00.0", device_id="2330", driver=None)]


def gpu(index: int, bus: str) -> Gpu:
    return Gpu(index=index, uuid=f"GPU-{index}", name="NVIDIA H100 80GB HBM3",
               gpu_class="h100-80g", pci_bus_id=bus)


def test_the_pci_scan_finds_nvidia_gpus_and_their_drivers() -> None:
    # The audio function (class 0x0403), the host bridge and the Mellanox card are left out.
    assert pcis.read(SYSFS / "gpu-no-driver" / "sys") == CARDS
    assert pcis.read(SYSFS / "two-ib-roce" / "sys") == CARDS  # the same bus, linked
    assert pcis.read(NODES / "h100-ib" / "sys") == []  # no /sys/bus/pci recorded


def test_a_card_no_driver_answers_for_is_a_node_fault_with_what_to_check() -> None:
    two = [gpu(0, "00000000:41:00.0"), gpu(1, "00000000:81:00.0")]
    cards = pcis.read(SYSFS / "gpu-no-driver" / "sys")
    report = NodeReport(node="gpu-07", gpus=two, pci_gpus=cards)
    assert report.faults == [
        "3 NVIDIA cards on the PCI bus, 2 answer: 0000:c1:00.0 has no driver bound; "
        "check `dmesg | grep -i nvidia`, the driver version and `nvidia-smi -q`"]
    status, detail, fix = _doctor("pci-gpus", Node(address="10.0.0.7"), report, {})
    assert (status, fix) == ("fail", "check `dmesg | grep -i nvidia`, the driver version "
                                     "and `nvidia-smi -q`")
    assert detail == "3 NVIDIA cards on the PCI bus, 2 answer: 0000:c1:00.0 has no driver bound"


@pytest.mark.parametrize(("cards", "gpus", "faults"), [
    pytest.param(CARDS[:2], [gpu(0, "00000000:41:00.0"), gpu(1, "00000000:81:00.0")], [],
                 id="every-card-answers"),
    pytest.param([], [], [], id="no-scan"),
    pytest.param(CARDS[:2], [gpu(0, "00000000:41:00.0")],
                 ["2 NVIDIA cards on the PCI bus, 1 answer: 0000:81:00.0 is bound to nvidia "
                  "but not listed; check `dmesg | grep -i nvidia`, the driver version and "
                  "`nvidia-smi -q`"], id="bound-but-not-listed"),
    pytest.param(CARDS, [gpu(0, ""), gpu(1, "")],  # nvidia-smi gave no bus ids
                 ["3 NVIDIA cards on the PCI bus, 2 answer: 0000:c1:00.0 has no driver bound; "
                  "check `dmesg | grep -i nvidia`, the driver version and `nvidia-smi -q`"],
                 id="no-bus-ids-no-driver"),
    pytest.param(CARDS[:1], [],
                 ["1 NVIDIA card on the PCI bus, 0 answer: the driver lists fewer GPUs than "
                  "the bus holds; check `dmesg | grep -i nvidia`, the driver version and "
                  "`nvidia-smi -q`"], id="driver-bound-nothing-listed"),
])
def test_node_faults(cards: list[PciCard], gpus: list[Gpu], faults: list[str]) -> None:
    assert NodeReport(node="n", gpus=gpus, pci_gpus=cards).faults == faults
