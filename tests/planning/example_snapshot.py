"""Write ``cluster.example/fleet-snapshot.json``: an observed fleet for the example cluster.

A Tuesday morning in the example lab, as ``llmgw inventory --json`` would
record it: the 70B runs across gpu-a-01/02, the 8B and the embeddings model
on the L40S boxes (one replica on l40s-02, cordoned since), the coder idle
for two hours, the CPU model crashed, GPU 5 of gpu-a-03 with ECC errors, a
notebook holding memory on a100-02, and gpu-b-02 not answering. The 8B
still runs with last month's ``max-model-len: 4096``.

Units are rendered by the planner's own shard builder, so their labels and
digests are what a real agent reports for units llmgw wrote.

    .venv/bin/python tests/planning/example_snapshot.py > cluster.example/fleet-snapshot.json
"""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

from plan_builders import _units  # noqa: E402

from llmgw.fleet.types import (  # noqa: E402
    Adapter,
    Disk,
    FabricStatus,
    Fleet,
    Gpu,
    GpuProcess,
    NodeReport,
    Port,
    Weights,
)
from llmgw.spec import loading  # noqa: E402
from llmgw.spec.models import Cluster  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "cluster.example"
TAKEN_AT = 1_767_600_000.0  # 2026-01-05 08:00 UTC
GIB = 1024**3

HARDWARE: dict[str, dict[str, Any]] = {
    "h100-80g": {"name": "NVIDIA H100 80GB HBM3", "mib": 81559, "cc": "9.0", "nvlink": "all",
                 "buses": ["18", "2A", "3A", "5D", "9A", "AB", "BA", "DB"]},
    "a100-80g": {"name": "NVIDIA A100 80GB PCIe", "mib": 81920, "cc": "8.0", "nvlink": "pairs",
                 "buses": ["17", "31", "4B", "65", "98", "B1", "CA", "E3"]},
    "l40s-45g": {"name": "NVIDIA L40S", "mib": 46068, "cc": "8.9", "nvlink": "none",
                 "buses": ["01", "25", "81", "A1"]},
}
CPU = {"h100-80g": ("Intel(R) Xeon(R) Platinum 8480+", 224),
       "a100-80g": ("AMD EPYC 7763 64-Core Processor", 256),
       "l40s-45g": ("AMD EPYC 9354 32-Core Processor", 128),
       None: ("AMD EPYC 9454 48-Core Processor", 192)}
WEIGHTS = {
    "gpu-a-01": ["/models/models--meta-llama--Llama-3.1-70B-Instruct"],
    "gpu-a-02": ["/models/models--meta-llama--Llama-3.1-70B-Instruct"],
    "gpu-b-01": ["/models/models--Qwen--Qwen2.5-Coder-32B-Instruct"],
    "l40s-01": ["/models/models--meta-llama--Llama-3.1-8B-Instruct",
                "/models/models--BAAI--bge-m3"],
    "l40s-02": ["/models/models--meta-llama--Llama-3.1-8B-Instruct"],
    "cpu-01": ["/models/gemma-2-2b-it-Q4_K_M.gguf",
               "/models/qwen2.5-coder-14b-instruct-q4_k_m.gguf"],
}
RUNNING: list[dict[str, Any]] = [
    {"model": "llama-3.1-70b", "replica": 0, "fabric": "ib-a",
     "on": {"gpu-a-01": list(range(8)), "gpu-a-02": list(range(8))},
     "since": -4 * 86400, "last_used": -40},
    {"model": "llama-3.1-8b", "replica": 0, "on": {"l40s-01": [0]},
     "applied": {"profiles.0.args.max-model-len": 4096}, "since": -9 * 86400, "last_used": -5},
    {"model": "llama-3.1-8b", "replica": 1, "on": {"l40s-02": [0]},
     "applied": {"profiles.0.args.max-model-len": 4096}, "since": -9 * 86400, "last_used": -12},
    {"model": "bge-m3", "replica": 0, "on": {"l40s-01": [1]}, "since": -9 * 86400,
     "last_used": -3},
    {"model": "gemma-2-2b-cpu", "replica": 0, "on": {"cpu-01": []}, "state": "failed",
     "since": -700, "log_tail": [
         "main: loading model",
         "llama_model_load: error loading model: failed to open "
         "/models/gemma-2-2b-it-Q4_K_M.gguf: Permission denied",
         "main: exiting due to model loading error",
     ]},
    {"model": "qwen-coder", "replica": 0, "on": {"gpu-b-01": [0, 1]}, "since": -6 * 3600,
     "last_used": -2 * 3600 - 14 * 60},
]
ECC = {("gpu-a-03", 5): 2}
FOREIGN = {("a100-02", 2): GpuProcess(pid=48121, name="python3", used_memory_mib=30112)}
UNREACHABLE = {"gpu-b-02": "ssh: connect to 10.0.2.12 port 22: No route to host"}


def uuid_for(node: str, index: int) -> str:
    digest = hashlib.sha256(f"{node}/{index}".encode()).hexdigest()
    return f"GPU-{digest[:8]}-{digest[8:12]}-{digest[12:16]}-{digest[16:20]}-{digest[20:32]}"


def gpus_of(cluster: Cluster, node: str) -> list[Gpu]:
    out: list[Gpu] = []
    for decl in cluster.nodes[node].gpus:
        hardware = HARDWARE[decl.gpu_class]
        count = decl.count
        for index in range(len(out), len(out) + count):
            if hardware["nvlink"] == "all":
                peers = [i for i in range(count) if i != index]
            elif hardware["nvlink"] == "pairs":
                peers = [index ^ 1]
            else:
                peers = []
            out.append(Gpu(
                index=index, uuid=uuid_for(node, index), name=hardware["name"],
                gpu_class=decl.gpu_class, pci_bus_id=f"00000000:{hardware['buses'][index]}:00.0",
                memory_total_mib=hardware["mib"], memory_used_mib=1,
                compute_capability=hardware["cc"], ecc_uncorrected=ECC.get((node, index), 0),
                utilization_pct=0, nvlink_peers=peers,
                processes=[FOREIGN[(node, index)]] if (node, index) in FOREIGN else [],
            ))
    return out


def adapters_of(cluster: Cluster, node: str) -> tuple[list[Adapter], list[FabricStatus]]:
    adapters, fabrics = [], []
    spec = cluster.nodes[node]
    for fabric_name, names in sorted(spec.fabrics.items()):
        fabric = cluster.fabrics[fabric_name]
        for offset, name in enumerate(names):
            if fabric.kind == "infiniband":
                port = Port(number=1, state="ACTIVE", phys_state="LinkUp",
                            rate="400 Gb/sec (4X NDR)", rate_gbps=400.0,
                            link_layer="InfiniBand",
                            gids=[f"fe80:0000:0000:0000:a088:c203:00{offset:02x}:{node[-2:]}00"])
            else:
                last = int(spec.address.rsplit(".", 1)[1])
                ipv4 = f"0000:0000:0000:0000:0000:ffff:0a00:{3:02x}{last:02x}"
                port = Port(number=1, state="ACTIVE", phys_state="LinkUp",
                            rate="100 Gb/sec (4X EDR)", rate_gbps=100.0, link_layer="Ethernet",
                            gids=[f"fe80:0000:0000:0000:0e42:a1ff:fe{offset:02x}:{last:04x}",
                                  f"fe80:0000:0000:0000:0e42:a1ff:fe{offset:02x}:{last:04x}",
                                  ipv4, ipv4],
                            gid_types=["IB/RoCE v1", "RoCE v2", "IB/RoCE v1", "RoCE v2"])
            adapters.append(Adapter(name=name, ports=[port]))
        fabrics.append(FabricStatus(name=fabric_name, kind=fabric.kind, adapters=list(names),
                                    advertised=True, gid_index=fabric.gid_index))
    return adapters, fabrics


def report_for(cluster: Cluster, node: str) -> NodeReport:
    if node in UNREACHABLE:
        return NodeReport(node=node, reachable=False, error=UNREACHABLE[node],
                          collected_at=TAKEN_AT)
    spec = cluster.nodes[node]
    gpu_class = spec.gpus[0].gpu_class if spec.gpus else None
    cpu_model, cpu_count = CPU[gpu_class]
    # The kernel reserves some memory: a "2TiB" node reports a little less.
    memory = int((spec.memory or 64 * GIB) * 0.985)
    adapters, fabrics = adapters_of(cluster, node)
    return NodeReport(
        node=node, reachable=True, hostname=f"{node}.lab.internal", agent_version="0.1.0",
        cpu_model=cpu_model, cpu_count=cpu_count, cpu_flags=["avx2", "avx512f"],
        memory_total_bytes=memory, memory_available_bytes=int(memory * 0.8),
        gpus=gpus_of(cluster, node), adapters=adapters, fabrics=fabrics,
        disks=[Disk(path=d, free_bytes=3_100 * GIB, total_bytes=7_000 * GIB)
               for d in spec.weights_dirs],
        weights=[Weights(path=p, format="gguf" if p.endswith(".gguf") else "safetensors",
                         size_bytes=(2 if p.endswith(".gguf") else 64) * GIB)
                 for p in WEIGHTS.get(node, [])],
        collected_at=TAKEN_AT,
    )


def snapshot() -> Fleet:
    cluster = loading.load(EXAMPLE)
    reports = {name: report_for(cluster, name) for name in sorted(cluster.nodes)}
    units: dict[str, list[Any]] = {name: [] for name in reports}
    owned: dict[str, set[int]] = {name: set() for name in reports}
    ports: dict[str, set[int]] = {name: set() for name in reports}
    for entry in RUNNING:
        for node, unit, gpus in _units(cluster, reports, entry, TAKEN_AT, ports):
            units[node].append(unit.model_copy(update={"pid": None if unit.pid is None
                                                       else 31000 + len(units[node])}))
            owned[node].update(gpus)
    nodes = {}
    for name, report in reports.items():
        gpus = [
            g.model_copy(update={
                "memory_used_mib": 71234 if g.index in owned[name] else g.memory_used_mib,
                "utilization_pct": 37 if g.index in owned[name] else 0,
                "processes": [*g.processes, GpuProcess(
                    pid=31100 + g.index, name="python3", used_memory_mib=71232,
                    owned_by_llmgw=True)] if g.index in owned[name] else g.processes,
            })
            for g in report.gpus
        ]
        nodes[name] = report.model_copy(update={"gpus": gpus, "units": units[name]})
    return Fleet(nodes=nodes, revision=None)


def render() -> str:
    return snapshot().model_dump_json(indent=2) + "\n"


if __name__ == "__main__":
    sys.stdout.write(render())
