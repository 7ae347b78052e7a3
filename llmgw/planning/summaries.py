"""One summary of the fleet for people: capacity, free nodes, replicas, idle GPUs.

``summarize(cluster, fleet, now)`` is the single place these figures are
computed; ``llmgw status``, ``llmgw inventory``, the admin API
(``/api/v1/status``) and the /admin page all show what it returns. This is a
purely computational function with no side-effects: no I/O, no clock reads
(``now`` and the router's ``last_used`` are arguments).

Definitions:

* A GPU is *faulty* when it must not get new work (:attr:`Gpu.faults`),
  *used* when an llmgw unit holds it (its UUID is in the unit's spec label,
  or a process llmgw started holds memory on it), *free* otherwise
  (:func:`llmgw.fleet.summaries.gpu_state`, given :func:`held_gpus`). Only
  reachable nodes count.
* A *free whole node* of a fabric advertises it, is reachable, not cordoned,
  has GPUs and none of them used or faulty: where a multi-node replica fits.
* A replica's state is its least advanced shard's: one failed shard fails it.
* An *idle* replica holds GPUs and has served no request for ``idle_after``
  seconds (its model's ``idle_timeout`` when set), or never since it started.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from llmgw.fleet import summaries as nodesums
from llmgw.fleet.types import Fleet, Unit
from llmgw.planning import replicas as observed
from llmgw.spec.models import Cluster

# Worst first: a replica is as far along as its least advanced shard.
STATE_ORDER = ("failed", "unknown", "stopped", "fetching", "starting", "loading", "ready")
IDLE_AFTER = 3600.0  # seconds without a request before a GPU replica counts as idle
_HOLDING = ("starting", "loading", "ready", "unknown")


@dataclass
class GpuCounts:
    total: int = 0
    used: int = 0
    free: int = 0
    faulty: int = 0


@dataclass(frozen=True)
class Shard:
    node: str
    unit: Unit
    gpus: tuple[int, ...] = ()  # indices on its node


@dataclass
class Replica:
    model: str
    replica: int
    shards: list[Shard] = field(default_factory=list)

    @property
    def state(self) -> str:
        states = {s.unit.state for s in self.shards}
        return next(s for s in STATE_ORDER if s in states)

    @property
    def gpu_count(self) -> int:
        return sum(len(s.gpus) for s in self.shards)

    @property
    def since(self) -> float | None:
        known = [s.unit.since for s in self.shards if s.unit.since is not None]
        return min(known) if known else None

    @property
    def last_used(self) -> float | None:
        known = [s.unit.last_used for s in self.shards if s.unit.last_used is not None]
        return max(known) if known else None


@dataclass(frozen=True)
class Idle:
    replica: Replica
    unused_for: float | None  # seconds since the last request; None: never used
    threshold: float


@dataclass
class Summary:
    cluster: str
    nodes: int
    unreachable: list[str]
    capacity: dict[str, GpuCounts]
    free_nodes: dict[str, list[str]]  # fabric → nodes with every GPU free
    replicas: list[Replica]
    idle: list[Idle]

    @property
    def by_state(self) -> dict[str, int]:
        counts: dict[str, int] = defaultdict(int)
        for replica in self.replicas:
            counts[replica.state] += 1
        return dict(sorted(counts.items(), key=lambda item: STATE_ORDER.index(item[0])))


def summarize(
    cluster: Cluster, fleet: Fleet, now: float, last_used: dict[str, float] | None = None,
) -> Summary:
    """The fleet's figures at ``now``; ``last_used`` is the router's model → last request."""
    held = held_gpus(fleet)
    found = replicas(fleet, held)
    return Summary(
        cluster=cluster.cluster.name,
        nodes=len(fleet.nodes),
        unreachable=sorted(n for n, r in fleet.nodes.items() if not r.reachable),
        capacity=gpu_counts(fleet, held),
        free_nodes=_free_nodes(cluster, fleet, held),
        replicas=found,
        idle=_idle(cluster, found, now, last_used or {}),
    )


def gpu_counts(
    fleet: Fleet, held: dict[str, set[str]] | None = None
) -> dict[str, GpuCounts]:
    """GPUs of reachable nodes by class: total, used, free, faulty."""
    held = held_gpus(fleet) if held is None else held
    counts: dict[str, GpuCounts] = defaultdict(GpuCounts)
    for name, report in fleet.nodes.items():
        if not report.reachable:
            continue
        for gpu in report.gpus:
            row = counts[gpu.gpu_class]
            row.total += 1
            state = nodesums.gpu_state(gpu, held.get(name, ()))
            if state == "faulty":
                row.faulty += 1
            elif state == "used":
                row.used += 1
            else:
                row.free += 1
    return dict(sorted(counts.items()))


def replicas(fleet: Fleet, held: dict[str, set[str]] | None = None) -> list[Replica]:
    """Units grouped into replicas (model, replica number), shards in rank order."""
    found: dict[tuple[str, int], Replica] = {}
    for node, unit in fleet.units():
        report = fleet.nodes[node]
        uuids = set(_unit_gpus(unit))
        indices = tuple(sorted(g.index for g in report.gpus if g.uuid in uuids))
        key = (unit.model, unit.replica)
        found.setdefault(key, Replica(unit.model, unit.replica)).shards.append(
            Shard(node, unit, indices))
    for replica in found.values():
        replica.shards.sort(key=lambda s: (s.unit.rank, s.node))
    return [found[key] for key in sorted(found)]


def _unit_gpus(unit: Unit) -> list[str]:
    spec = observed.parse_spec(unit)
    gpus = spec.get("gpus") if spec else None
    return [g for g in gpus if isinstance(g, str)] if isinstance(gpus, list) else []


def held_gpus(fleet: Fleet) -> dict[str, set[str]]:
    """Node → UUIDs of GPUs a live llmgw unit was started on."""
    held: dict[str, set[str]] = defaultdict(set)
    for node, unit in fleet.units():
        if unit.state in _HOLDING:
            held[node].update(_unit_gpus(unit))
    return held


def _free_nodes(
    cluster: Cluster, fleet: Fleet, held: dict[str, set[str]]
) -> dict[str, list[str]]:
    free: dict[str, list[str]] = {name: [] for name in sorted(cluster.fabrics)}
    for name, report in sorted(fleet.nodes.items()):
        node = cluster.nodes.get(name)
        if node is None or node.cordoned or node.drain or not report.reachable or not report.gpus:
            continue
        if any(nodesums.gpu_state(g, held.get(name, ())) != "free" for g in report.gpus):
            continue
        for fabric in report.advertised_fabrics:
            free.setdefault(fabric, []).append(name)
    return free


def _idle(
    cluster: Cluster, found: list[Replica], now: float, last_used: dict[str, float]
) -> list[Idle]:
    idle = []
    for replica in found:
        if replica.state != "ready" or not replica.gpu_count:
            continue
        model = cluster.models.get(replica.model)
        threshold = (model.scaling.idle_timeout if model and model.scaling.idle_timeout
                     else IDLE_AFTER)
        used = max((t for t in (replica.last_used, last_used.get(replica.model))
                    if t is not None), default=None)
        reference = used if used is not None else replica.since
        if reference is not None and now - reference < threshold:
            continue
        idle.append(Idle(replica, None if used is None else now - used, threshold))
    return idle
