"""What inventory and status print, from a fleet built here (no nodes needed)."""

from __future__ import annotations

import pytest

from llmgw.cli import inventories
from llmgw.fleet.types import FabricStatus, Fleet, Gpu, GpuProcess, NodeReport, Unit
from llmgw.spec.models import Cluster

NOW = 1_800_000_000.0

CLUSTER = Cluster.model_validate({
    "cluster": {"name": "lab"},
    "fabrics": {"ib-a": {"kind": "infiniband"}},
    "nodes": {
        "gpu-a-01": {"address": "10.0.0.11", "fabrics": {"ib-a": ["mlx5_0", "mlx5_1"]}},
        "gpu-a-02": {"address": "10.0.0.12", "ssh_port": 2222,
                     "fabrics": {"ib-a": ["mlx5_0", "mlx5_1"]}},
        "cpu-01": {"address": "local"},
        "gpu-b-01": {"address": "10.0.0.21"},
    },
})


def gpu(index: int, cls: str = "h100-80g", *, ecc: int = 0, procs: list[GpuProcess] | None = None
        ) -> Gpu:
    return Gpu(index=index, uuid=f"GPU-{index}", name="NVIDIA H100 80GB HBM3", gpu_class=cls,
               ecc_uncorrected=ecc, processes=procs or [])


def unit(model: str, replica: int, rank: int, state: str, **extra: object) -> Unit:
    return Unit.model_validate({
        "name": f"llmgw-{model}-r{replica}-s{rank}.service", "model": model, "replica": replica,
        "rank": rank, "digest": "d", "state": state, "since": NOW - 300, **extra,
    })


def fleet() -> Fleet:
    ours = [GpuProcess(pid=10, name="vllm", owned_by_llmgw=True)]
    foreign = [GpuProcess(pid=77, name="python3")]
    return Fleet(nodes={
        "gpu-a-01": NodeReport(
            node="gpu-a-01", cpu_count=96, memory_total_bytes=2 * 1024**4,
            gpus=[gpu(0, procs=ours), gpu(1, procs=ours), gpu(2, ecc=3), gpu(3)],
            fabrics=[FabricStatus(name="ib-a", kind="infiniband", adapters=["mlx5_0", "mlx5_1"],
                                  advertised=True)],
            units=[unit("llama", 0, 0, "ready", port=18000)],
        ),
        "gpu-a-02": NodeReport(
            node="gpu-a-02", gpus=[gpu(0, procs=ours), gpu(1, procs=foreign)],
            fabrics=[FabricStatus(name="ib-a", kind="infiniband", adapters=["mlx5_0"],
                                  advertised=False, reasons=["mlx5_1 port 1 is INIT"])],
            units=[unit("llama", 0, 1, "loading"),
                   unit("qwen", 0, 0, "failed", detail="exited 1", log_tail=["OOM"])],
        ),
        "cpu-01": NodeReport(node="cpu-01", cpu_count=16),
        "gpu-b-01": NodeReport(node="gpu-b-01", reachable=False,
                               error="refused: llmgw@10.0.0.21 refused the connection; "
                               "is sshd running there?"),
    })


def test_gpus_are_counted_by_class_as_used_free_and_faulty() -> None:
    counts = inventories.gpu_counts(fleet())
    assert list(counts) == ["h100-80g"]
    row = counts["h100-80g"]
    # gpu-a-01: 2 used, 1 ECC, 1 free; gpu-a-02: 1 used, 1 held by a foreign process.
    assert (row.total, row.used, row.free, row.faulty) == (6, 3, 1, 2)


@pytest.mark.parametrize(
    ("states", "expected"),
    [
        pytest.param(["ready", "ready"], "ready", id="all-ready"),
        pytest.param(["ready", "loading"], "loading", id="least-advanced-wins"),
        pytest.param(["starting", "loading"], "starting", id="starting-before-loading"),
        pytest.param(["ready", "failed"], "failed", id="one-failed-shard-fails-it"),
    ],
)
def test_a_replica_is_as_far_along_as_its_least_advanced_shard(
    states: list[str], expected: str
) -> None:
    reports = {f"n{i}": NodeReport(node=f"n{i}", units=[unit("m", 0, i, s)])
               for i, s in enumerate(states)}
    [replica] = inventories.replicas(Fleet(nodes=reports))
    assert replica.state == expected
    assert [s.unit.rank for s in replica.shards] == list(range(len(states)))


def test_inventory_shows_every_section() -> None:
    text = inventories.render_inventory(CLUSTER, fleet(), NOW)
    assert text.startswith("Cluster lab: 4 nodes, 3 reachable, 1 unreachable\n")
    assert "gpu-a-02  10.0.0.12:2222" in text
    assert "cpu-01    local" in text and "cpu only" in text
    assert "h100-80g  6      3     1     2" in text
    assert "gpu-a-01: GPU 2 has uncorrected ECC errors" in text
    assert "gpu-a-02: GPU 1 has memory held by pid 77 (python3), not started by llmgw" in text
    assert "ib-a (infiniband): advertised by gpu-a-01 (2 adapters)" in text
    assert "not advertised: gpu-a-02: mlx5_1 port 1 is INIT" in text
    assert "llama  r0       loading  gpu-a-01:18000 s0 ready 5m, gpu-a-02 s1 loading 5m" in text
    assert "llmgw-qwen-r0-s0.service on gpu-a-02 failed: exited 1\n    | OOM" in text
    assert ("Unreachable nodes\n  gpu-b-01: refused: llmgw@10.0.0.21 refused the connection; "
            "is sshd running there?\n") in text


def test_status_is_one_line_per_node_and_replica() -> None:
    text = inventories.render_status(CLUSTER, fleet(), NOW)
    lines = text.splitlines()
    assert lines[0] == "lab: 4 nodes (1 unreachable), 2 replicas (1 failed, 1 loading)"
    assert len(lines) == 1 + 4 + 2 + 2
    # The summary shared with the admin API and /admin: capacity, then free nodes per fabric.
    assert lines[-2:] == ["GPUs: h100-80g 3 used, 1 free, 2 faulty", "free whole nodes on ib-a: 0"]
    assert "gpu-b-01  DOWN  refused: llmgw@10.0.0.21 refused the connection\n" in text
    assert "gpu-a-02  up    2× h100-80g (1 faulty), 2 units" in text


def test_a_fabric_with_adapters_down_says_how_many_are_active() -> None:
    reports = dict(fleet().nodes)
    reports["gpu-a-01"] = reports["gpu-a-01"].model_copy(update={"fabrics": [FabricStatus(
        name="ib-a", kind="infiniband", adapters=["mlx5_0"], advertised=True,
        declared_adapters=2, reasons=["1 of 2 adapters ACTIVE", "mlx5_1 has no ACTIVE port"])]})
    text = inventories.render_inventory(CLUSTER, Fleet(nodes=reports), NOW)
    assert "ib-a (infiniband): advertised by gpu-a-01 (1 of 2 adapters ACTIVE)" in text


def test_a_card_no_driver_answers_for_is_a_node_fault() -> None:
    from llmgw.fleet.types import PciCard
    reports = dict(fleet().nodes)
    report = reports["gpu-a-01"]
    bus = [PciCard(address=f"0000:{g.pci_bus_id or f'{i:02x}:00.0'}"[-12:], driver="nvidia")
           for i, g in enumerate(report.gpus)]
    bus.append(PciCard(address="0000:c1:00.0"))
    reports["gpu-a-01"] = report.model_copy(update={"pci_gpus": bus})
    text = inventories.render_inventory(CLUSTER, Fleet(nodes=reports), NOW)
    held = len(bus)
    assert (f"Node faults\n  gpu-a-01: {held} NVIDIA cards on the PCI bus, {held - 1} answer: "
            "0000:c1:00.0 has no driver bound; check `dmesg") in text
