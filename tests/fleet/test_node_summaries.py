"""The per-node figures `llmgw inventory`, `llmgw status` and /admin's nodes pages share
(llmgw.fleet.summaries), as tables of cases: absent stays absent, never zero."""

from __future__ import annotations

from typing import Any

import pytest

from llmgw.fleet import summaries
from llmgw.fleet.types import FabricStatus, Fleet, Gpu, GpuProcess, NodeReport
from llmgw.spec.models import Cluster

NOW = 1_800_000_000.0
CLUSTER = Cluster.model_validate({
    "cluster": {"name": "lab"},
    "fabrics": {"ib-a": {"kind": "infiniband"}},
    "nodes": {
        "gpu-01": {"address": "10.0.0.11", "fabrics": {"ib-a": ["mlx5_0", "mlx5_1"]}},
        "gpu-02": {"address": "10.0.0.12", "ssh_port": 2222, "drain": True},
        "cpu-01": {"address": "local", "cordoned": True},
    },
})
OURS = GpuProcess(pid=10, name="vllm", owned_by_llmgw=True)
FOREIGN = GpuProcess(pid=77, name="python3")


def gpu(index: int = 0, **fields: Any) -> Gpu:
    return Gpu.model_validate({"index": index, "uuid": f"GPU-{index}", "name": "NVIDIA H100",
                               "gpu_class": "h100-80g", **fields})


@pytest.mark.parametrize(("fields", "held", "state"), [
    pytest.param({}, (), "free", id="nothing-on-it"),
    pytest.param({"ecc_uncorrected": 0, "utilization_pct": 0}, (), "free", id="zeros-are-facts"),
    pytest.param({}, ("GPU-0",), "used", id="held-by-a-unit"),
    pytest.param({"processes": [OURS]}, (), "used", id="llmgw-process"),
    pytest.param({"ecc_uncorrected": 2}, ("GPU-0",), "faulty", id="ecc-beats-held"),
    pytest.param({"processes": [FOREIGN]}, (), "faulty", id="foreign-memory"),
    pytest.param({"mig_mode": "Enabled"}, (), "faulty", id="mig-mode"),
    pytest.param({"mig_mode": "Disabled"}, (), "free", id="mig-disabled"),
])
def test_a_gpu_is_faulty_used_or_free(fields: dict[str, Any], held: tuple[str, ...],
                                      state: str) -> None:
    assert summaries.gpu_state(gpu(**fields), held) == state


@pytest.mark.parametrize(("gpus", "used", "total"), [
    pytest.param([], None, None, id="no-gpus-no-figure"),
    pytest.param([gpu(0, memory_used_mib=1, memory_total_mib=80)], 1, 80, id="one"),
    pytest.param([gpu(0, memory_used_mib=0, memory_total_mib=80),
                  gpu(1, memory_used_mib=5, memory_total_mib=80)], 5, 160, id="zero-counts"),
    pytest.param([gpu(0, memory_used_mib=3, memory_total_mib=80),
                  gpu(1, memory_total_mib=80)], None, 160, id="one-used-absent"),
    pytest.param([gpu(0), gpu(1)], None, None, id="all-absent"),
])
def test_gpu_memory_of_a_node_is_unknown_when_a_part_is(
    gpus: list[Gpu], used: int | None, total: int | None
) -> None:
    row = summaries.node_row(CLUSTER, "gpu-01", NodeReport(node="gpu-01", gpus=gpus), NOW)
    assert (row.gpu_memory_used_mib, row.gpu_memory_total_mib) == (used, total)


@pytest.mark.parametrize(("name", "report", "expected"), [
    pytest.param("gpu-01", NodeReport(node="gpu-01", collected_at=NOW - 7, cpu_count=96,
                                      agent_version="0.9", gpus=[gpu(0), gpu(1, ecc_uncorrected=1)],
                                      fabrics=[FabricStatus(name="ib-a", kind="infiniband",
                                                            adapters=["mlx5_0"], advertised=True)]),
                 {"address": "10.0.0.11", "flag": "", "gpus": "2× h100-80g", "faulty": 1,
                  "cpu_count": 96, "fabrics": ("ib-a",), "agent_version": "0.9",
                  "report_age": 7.0}, id="reported"),
    pytest.param("gpu-02", NodeReport(node="gpu-02"),
                 {"address": "10.0.0.12:2222", "flag": "draining", "gpus": "cpu only",
                  "cpu_count": None, "memory_total_bytes": None, "agent_version": None,
                  "report_age": None}, id="nothing-reported"),
    pytest.param("cpu-01", NodeReport(node="cpu-01", reachable=False, units_as_of=NOW - 300,
                                      error="refused: llmgw@cpu-01; is sshd running there?"),
                 {"address": "local", "flag": "cordoned", "reachable": False,
                  "reason": "refused: llmgw@cpu-01", "report_age": 300.0},
                 id="unreachable-last-seen"),
    pytest.param("cpu-01", NodeReport(node="cpu-01", reachable=False),
                 {"reason": "unreachable", "report_age": None}, id="unreachable-unseen"),
    pytest.param("gone-01", NodeReport(node="gone-01", collected_at=NOW + 5),
                 {"address": "?", "flag": "", "report_age": 0.0}, id="undeclared-clock-skew"),
])
def test_node_rows(name: str, report: NodeReport, expected: dict[str, Any]) -> None:
    [row] = summaries.node_rows(CLUSTER, Fleet(nodes={name: report}), NOW)
    assert {key: getattr(row, key) for key in expected} == expected


@pytest.mark.parametrize(("report", "condition", "text"), [
    pytest.param(NodeReport(node="gpu-01", fabrics=[FabricStatus(
        name="ib-a", kind="infiniband", adapters=["mlx5_0", "mlx5_1"], advertised=True,
        declared_adapters=2)]), "advertised", "2 adapters", id="whole"),
    pytest.param(NodeReport(node="gpu-01", fabrics=[FabricStatus(
        name="ib-a", kind="infiniband", adapters=["mlx5_0"], advertised=True,
        declared_adapters=2)]), "advertised", "1 of 2 adapters ACTIVE", id="part"),
    pytest.param(NodeReport(node="gpu-01", fabrics=[FabricStatus(
        name="ib-a", kind="infiniband", adapters=[], advertised=False,
        reasons=["mlx5_0 port 1 is DOWN", "mlx5_1 is missing"])]),
        "not advertised", "mlx5_0 port 1 is DOWN; mlx5_1 is missing", id="why-not"),
    pytest.param(NodeReport(node="gpu-01"), "not advertised", "not reported", id="silent"),
    pytest.param(NodeReport(node="gpu-01", reachable=False), "unreachable", "unreachable",
                 id="unreachable"),
])
def test_a_node_on_a_fabric(report: NodeReport, condition: str, text: str) -> None:
    [state] = summaries.node_fabrics(CLUSTER, report)
    assert (state.fabric, state.node, state.condition, state.text) == (
        "ib-a", "gpu-01", condition, text)
    assert summaries.fabric_state(report, "ib-a") == state


def test_gpu_rows_keep_index_order_and_what_was_not_reported() -> None:
    report = NodeReport(node="gpu-01", gpus=[
        gpu(1, processes=[FOREIGN], memory_used_mib=18436, memory_total_mib=81559,
            utilization_pct=37),
        gpu(0, mig_mode="Enabled")])
    first, second = summaries.gpu_rows(report, {"GPU-1"})
    assert (first.index, first.state, first.memory_used_mib, first.utilization_pct) == (
        0, "faulty", None, None)
    assert first.faults == ("GPU 0 is in MIG mode (split into instances); engines here take "
                            "whole GPUs",)
    assert (second.index, second.state, second.memory_used_mib, second.utilization_pct) == (
        1, "faulty", 18436, 37)
    assert second.faults == ("GPU 1 has memory held by pid 77 (python3), not started by llmgw",)


@pytest.mark.parametrize(("value", "text"), [
    (None, "?"), (0, "0 B"), (1023, "1023 B"), (1024, "1.0 KiB"), (1536 * 1024**2, "1.5 GiB"),
    (2 * 1024**4, "2.0 TiB"), (3 * 1024**5, "3072.0 TiB"),
])
def test_sizes(value: int | None, text: str) -> None:
    assert summaries.size(value) == text


@pytest.mark.parametrize(("seconds", "text"), [
    (-5, "0s"), (0, "0s"), (119.9, "119s"), (120, "2m"), (7199, "119m"), (7200, "2h"),
    (172799, "47h"), (172800, "2d"),
])
def test_ages(seconds: float, text: str) -> None:
    assert summaries.age(seconds) == text


@pytest.mark.parametrize(("n", "text"), [(0, "0 nodes"), (1, "1 node"), (2, "2 nodes")])
def test_counts(n: int, text: str) -> None:
    assert summaries.count(n, "node") == text
