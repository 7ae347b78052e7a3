"""A node, summarised for people: the figures ``llmgw inventory``, ``llmgw status`` and
the /admin nodes pages show.

These are purely computational functions with no side-effects: no I/O, no
clock reads (``now`` is an argument), so the command line and the pages show
the same figures for the same fleet. The fleet-wide figures (capacity per GPU
class, free whole nodes, replicas, idle GPUs) are
:mod:`llmgw.planning.summaries`, which reads unit labels; what is here needs
only the reports and the cluster.

Absent stays absent: a figure a node did not report is ``None`` here (a sum
over GPUs is ``None`` when one of them did not report its part), never zero,
and each caller words it (``?`` in the terminal, ``—`` on the pages).

Usage::

    rows = summaries.node_rows(cluster, fleet, now)
    gpus = summaries.gpu_rows(report, held.get(report.node, set()))
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

from llmgw.fleet.types import Fleet, Gpu, NodeReport
from llmgw.spec.models import Cluster

GpuState = Literal["faulty", "used", "free"]
FabricCondition = Literal["advertised", "not advertised", "unreachable"]


@dataclass(frozen=True)
class NodeRow:
    """One node as the nodes table shows it."""

    name: str
    address: str
    flag: str  # "draining", "cordoned" or ""
    reachable: bool
    error: str | None
    gpus: str  # "8× h100-80g", "cpu only"
    gpu_count: int
    faulty: int  # GPUs that must not get new work
    gpu_memory_used_mib: int | None
    gpu_memory_total_mib: int | None
    cpu_count: int | None
    memory_total_bytes: int | None
    memory_available_bytes: int | None
    fabrics: tuple[str, ...]  # advertised ones
    units: int
    agent_version: str | None
    report_age: float | None  # seconds since its last report; None: never reported

    @property
    def reason(self) -> str:
        """Why it is unreachable, in its first clause (which names the node, the key or the
        port); what to check after it is in the whole :attr:`error`."""
        return (self.error or "unreachable").split("; ")[0]


@dataclass(frozen=True)
class GpuRow:
    """One GPU as a node's page shows it."""

    index: int
    gpu_class: str
    name: str
    memory_used_mib: int | None
    memory_total_mib: int | None
    utilization_pct: int | None
    mig_mode: str | None  # None: the GPU has no MIG
    ecc_uncorrected: int | None
    nvlink_peers: tuple[int, ...] | None  # None: the topology is unknown
    state: GpuState
    faults: tuple[str, ...]


@dataclass(frozen=True)
class FabricState:
    """A fabric the cluster declares for a node, as that node's report has it."""

    fabric: str
    node: str
    condition: FabricCondition
    text: str  # "4 adapters", "2 of 4 adapters ACTIVE", why not advertised, "unreachable"


def gpu_state(gpu: Gpu, held: Iterable[str] = ()) -> GpuState:
    """*faulty* when it must not get new work (:attr:`Gpu.faults`), *used* when an llmgw
    unit holds it (its UUID in ``held``) or a process llmgw started holds memory on it,
    *free* otherwise."""
    if gpu.faults:
        return "faulty"
    if gpu.uuid in held or any(p.owned_by_llmgw for p in gpu.processes):
        return "used"
    return "free"


def gpu_rows(report: NodeReport, held: Iterable[str] = ()) -> list[GpuRow]:
    """The node's GPUs in index order; ``held``: UUIDs live llmgw units were started on."""
    held = set(held)
    return [GpuRow(index=g.index, gpu_class=g.gpu_class, name=g.name,
                   memory_used_mib=g.memory_used_mib, memory_total_mib=g.memory_total_mib,
                   utilization_pct=g.utilization_pct, mig_mode=g.mig_mode,
                   ecc_uncorrected=g.ecc_uncorrected,
                   nvlink_peers=None if g.nvlink_peers is None else tuple(g.nvlink_peers),
                   state=gpu_state(g, held),
                   faults=tuple(g.faults))
            for g in sorted(report.gpus, key=lambda g: g.index)]


def node_rows(cluster: Cluster, fleet: Fleet, now: float) -> list[NodeRow]:
    """Every node of the fleet, by name."""
    return [node_row(cluster, name, report, now) for name, report in sorted(fleet.nodes.items())]


def node_row(cluster: Cluster, name: str, report: NodeReport, now: float) -> NodeRow:
    """One node's row; ``name`` is its key in the fleet."""
    node = cluster.nodes.get(name)
    flag = ("draining" if node is not None and node.drain else
            "cordoned" if node is not None and node.cordoned else "")
    last = report.collected_at if report.collected_at is not None else report.units_as_of
    return NodeRow(
        name=name, address=address(cluster, name), flag=flag,
        reachable=report.reachable, error=report.error, gpus=gpu_summary(report),
        gpu_count=len(report.gpus), faulty=sum(1 for g in report.gpus if g.faults),
        gpu_memory_used_mib=_total(g.memory_used_mib for g in report.gpus),
        gpu_memory_total_mib=_total(g.memory_total_mib for g in report.gpus),
        cpu_count=report.cpu_count, memory_total_bytes=report.memory_total_bytes,
        memory_available_bytes=report.memory_available_bytes,
        fabrics=tuple(f.name for f in report.fabrics if f.advertised),
        units=len(report.units), agent_version=report.agent_version,
        report_age=None if last is None else max(0.0, now - last),
    )


def gpu_summary(report: NodeReport) -> str:
    """``8× h100-80g`` (classes by name), or ``cpu only``."""
    if not report.gpus:
        return "cpu only"
    classes: dict[str, int] = defaultdict(int)
    for gpu in report.gpus:
        classes[gpu.gpu_class] += 1
    return ", ".join(f"{n}× {c}" for c, n in sorted(classes.items()))


def fabric_state(report: NodeReport | None, fabric: str) -> FabricState:
    """How a member node stands on ``fabric``: advertised with its adapters (``4
    adapters`` when all it declares are ACTIVE, ``2 of 4 adapters ACTIVE`` otherwise), not
    advertised and why, or unreachable."""
    name = report.node if report is not None else "?"
    if report is None or not report.reachable:
        return FabricState(fabric, name, "unreachable", "unreachable")
    status = next((f for f in report.fabrics if f.name == fabric), None)
    if status is not None and status.advertised:
        whole = len(status.adapters) >= status.declared_adapters
        text = count(len(status.adapters), "adapter") if whole else status.active
        return FabricState(fabric, name, "advertised", text)
    why = "; ".join(status.reasons) if status and status.reasons else "not reported"
    return FabricState(fabric, name, "not advertised", why)


def node_fabrics(cluster: Cluster, report: NodeReport) -> list[FabricState]:
    """The fabrics the cluster declares for this node, by name."""
    node = cluster.nodes.get(report.node)
    declared = sorted(node.fabrics) if node is not None else []
    return [fabric_state(report, name) for name in declared]


def address(cluster: Cluster, name: str) -> str:
    """How the daemon reaches the node: ``local``, ``host`` or ``host:port``; ``?`` for a
    node the cluster does not declare."""
    node = cluster.nodes.get(name)
    if node is None:
        return "?"
    if node.is_local:
        return "local"
    port = node.ssh_port or cluster.cluster.ssh.port
    return node.address if port == 22 else f"{node.address}:{port}"


def count(n: int, noun: str) -> str:
    """``1 node``, ``3 nodes``."""
    return f"{n} {noun}" + ("" if n == 1 else "s")


def size(value: int | None) -> str:
    """Bytes for people (``1.5 GiB``); ``?`` when not reported."""
    if value is None:
        return "?"
    amount = float(value)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if amount < 1024 or unit == "TiB":
            return f"{amount:.0f} {unit}" if unit == "B" else f"{amount:.1f} {unit}"
        amount /= 1024
    return f"{amount:.1f} TiB"  # pragma: no cover - the loop returns


def age(seconds: float) -> str:
    """A duration, coarsely: ``45s``, ``12m``, ``5h``, ``3d`` (a unit once it is two of it)."""
    seconds = max(0, int(seconds))
    if seconds < 120:
        return f"{seconds}s"
    if seconds < 7200:
        return f"{seconds // 60}m"
    if seconds < 172800:
        return f"{seconds // 3600}h"
    return f"{seconds // 86400}d"


def _total(values: Iterable[int | None]) -> int | None:
    """The sum, or None when any part is unknown (or there are no parts)."""
    parts = list(values)
    if not parts or any(v is None for v in parts):
        return None
    return sum(v for v in parts if v is not None)
