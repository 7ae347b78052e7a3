"""What runs now, rebuilt from the units agents report.

There is no state file: every llmgw unit carries its model, replica, rank,
digest and spec as labels, so grouping the reported units by (model,
replica) gives back every replica, with the spec each shard was started
from. Units that belong to nothing the cluster wants — a model or node
removed from the cluster, a second copy of the same shard — are orphans, to
be removed with a reason.

A purely computational module with no side effects.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from llmgw.fleet.types import Fleet, Unit
from llmgw.planning import shards
from llmgw.spec import secrets
from llmgw.spec.models import Cluster

HEALTHY_STATES = frozenset({"fetching", "starting", "loading", "ready", "unknown"})
# A unit in one of these needs the planner: restarted, replaced, or held.
TROUBLED_STATES = frozenset({"failed", "stopped"})


@dataclass
class Member:
    """One reported shard of a replica."""

    node: str
    unit: Unit
    spec: dict[str, Any] | None  # None: no label, or one that does not match the digest
    reachable: bool


@dataclass
class ObservedReplica:
    model: str
    replica: int
    members: dict[int, Member] = field(default_factory=dict)  # by rank

    @property
    def peers(self) -> list[str] | None:
        """The nodes by rank, as the shards' specs recorded them."""
        for member in self.members.values():
            if member.spec and isinstance(member.spec.get("nodes"), list):
                return [str(n) for n in member.spec["nodes"]]
        return None

    @property
    def profile(self) -> int | None:
        for member in self.members.values():
            if member.spec and isinstance(member.spec.get("profile"), int):
                return int(member.spec["profile"])
        return None

    def unreachable_nodes(self) -> list[str]:
        return sorted({m.node for m in self.members.values() if not m.reachable})

    def missing(self) -> list[tuple[int, str]]:
        """(rank, node) of shards the specs expect that no node reported."""
        peers = self.peers or []
        return [(rank, node) for rank, node in enumerate(peers) if rank not in self.members]

    def restarted_alone(self) -> list[str]:
        """Why a replica across nodes must start again whole: ranks their agent restarted.

        The ranks of a multi-node engine meet once, when they start. A rank that
        ended and was started again on its own (``Restart=on-failure``) is not
        part of the replica any more, though its process runs: a rank above 0,
        having no HTTP port, is reported ready. (A rank still restarting is an
        engine crash already.) Empty on one node.
        """
        if len(self.peers or self.members) < 2:
            return []
        return [f"{m.node}: {m.unit.name} was restarted alone by its agent"
                + (f" ({m.unit.last_exit})" if m.unit.last_exit else "")
                + "; its peers will not take it back"
                for _, m in sorted(self.members.items())
                if (m.unit.restarts or 0) > 0 and m.unit.state == "ready"]

    def last_used(self) -> float | None:
        times = [m.unit.last_used for m in self.members.values() if m.unit.last_used is not None]
        return max(times) if times else None

    def since(self) -> float | None:
        head = self.members.get(0)
        return head.unit.since if head else None


@dataclass(frozen=True)
class Orphan:
    node: str
    unit: Unit
    reason: str


@dataclass
class Observation:
    replicas: dict[tuple[str, int], ObservedReplica]
    orphans: list[Orphan]
    warnings: list[str]


def _number(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _texts(value: object) -> bool:
    return isinstance(value, list) and all(isinstance(item, str) for item in value)


def _text_or_none(value: object) -> bool:
    return value is None or isinstance(value, str)


def _number_or_none(value: object) -> bool:
    return value is None or _number(value)


# The spec fields the planner reads, and what llmgw writes in each. A label is
# text on the node: anyone who can edit the unit file can recompute its digest.
_FIELDS: dict[str, tuple[str, Callable[[object], bool]]] = {
    "nodes": ("a list of names", _texts),
    "gpus": ("a list of GPU UUIDs", _texts),
    "profile": ("a profile number", _number),
    "memory": ("a number of bytes", _number),
    "port": ("a port", _number_or_none),
    "dist_port": ("a port", _number_or_none),
    "aux_port": ("a port", _number),
    "fabric": ("a fabric name", _text_or_none),
    "gpu_class": ("a GPU class", _text_or_none),
}


def parse_spec(unit: Unit) -> dict[str, Any] | None:
    """The unit's spec label, if present, covered by its digest and shaped as llmgw
    writes it; :func:`collect` warns about one that is not."""
    return _read_spec(unit)[0]


def _read_spec(unit: Unit) -> tuple[dict[str, Any] | None, str | None]:
    text = unit.labels.get(shards.SPEC_LABEL)
    if not text:
        return None, None
    try:
        spec = json.loads(text)
    except ValueError:
        spec = None
    if not isinstance(spec, dict) or shards.digest(spec) != unit.digest:
        return None, "its X-Llmgw-Spec label does not match its digest"
    for name, (what, fits) in _FIELDS.items():
        if name in spec and not fits(spec[name]):
            return None, f"its X-Llmgw-Spec label's {name} is not {what}"
    return spec, None


def collect(cluster: Cluster, fleet: Fleet) -> Observation:
    """Group the fleet's units into replicas; set aside what no one wants."""
    replicas: dict[tuple[str, int], ObservedReplica] = {}
    orphans: list[Orphan] = []
    warnings: list[str] = []
    for node_name in sorted(fleet.nodes):
        report = fleet.nodes[node_name]
        if not report.units:
            continue  # most of a large fleet runs nothing
        for unit in sorted(report.units, key=lambda u: (u.model, u.replica, u.rank, u.name)):
            if unit.written_by_llmgw is False:  # a stranger: whatever it claims, it is not ours
                if report.reachable:
                    orphans.append(Orphan(node_name, unit, f"{unit.name} on {node_name} was not "
                                                            "written by llmgw"))
                continue
            if node_name not in cluster.nodes:
                if report.reachable:
                    orphans.append(Orphan(node_name, unit, f"node {node_name} is not in the "
                                                            "cluster any more"))
                continue
            if unit.model not in cluster.models:
                if report.reachable:
                    orphans.append(Orphan(node_name, unit, f"model {unit.model} is not in the "
                                                            "cluster any more"))
                continue
            spec, problem = _read_spec(unit)
            if problem:
                warnings.append(f"{node_name}: {unit.name}: {problem}; treating its spec as "
                                "unknown")
            key = (unit.model, unit.replica)
            replica = replicas.setdefault(key, ObservedReplica(unit.model, unit.replica))
            first = replica.members.get(unit.rank)
            if first is not None:
                if report.reachable:
                    orphans.append(Orphan(node_name, unit, f"duplicate of shard {unit.rank} "
                                                            f"on {first.node}"))
                continue
            replica.members[unit.rank] = Member(node_name, unit, spec, report.reachable)
    return Observation(dict(sorted(replicas.items())), orphans, warnings)


_ERROR_LINE = re.compile(r"error|exception|fatal|killed|denied", re.IGNORECASE)
_DETAIL_MAX = 300
LEFT_OUT = "the engine's output is left out (llmgw plan --engine-output quotes it)"


def failure(member: Member) -> str:
    """``node: unit failed: <why>``, the why from the agent or the engine's log tail.

    The last log line is often a generic "exiting", and the agent's detail
    often "exited with status 1"; the last log lines naming an error (the
    cause and its consequence) say more. Secrets in them are scrubbed
    (:func:`llmgw.spec.secrets.scrub`) before the line is cut to length, so no
    part of one survives the cut.
    """
    return _failure(member.node, member.unit, quote=True)


def quotes(fleet: Fleet) -> dict[str, str]:
    """Each failure line that quotes an engine's output → the same line without it
    (``…failed: its output is left out …``): what a public comment shows by default."""
    out = {}
    for node, unit in fleet.units():
        quoted, plain = _failure(node, unit, quote=True), _failure(node, unit, quote=False)
        if quoted != plain:
            out[quoted] = plain
    return out


def _failure(node: str, unit: Unit, quote: bool) -> str:
    lines = [line.strip() for line in unit.log_tail if line.strip()]
    errors = [line for line in lines if _ERROR_LINE.search(line)]
    said = ""  # what the engine said, when it says more than the agent
    if errors:
        said = " | ".join(errors[-2:])
    elif not unit.detail and lines:
        said = lines[-1]
    if said and not quote:
        detail = "; ".join(part for part in (secrets.scrub(unit.detail).strip(), LEFT_OUT) if part)
    else:
        detail = secrets.scrub(said or unit.detail).strip()
    if len(detail) > _DETAIL_MAX:
        detail = detail[:_DETAIL_MAX - 3] + "..."
    return f"{node}: {unit.name} {unit.state}" + (f": {detail}" if detail else "")
