"""Declared fabrics checked against the adapters a node really has.

A fabric the cluster declares for a node is advertised to the planner only
when every declared adapter is present and at least one of them has an
ACTIVE port of the right link layer. A fabric with some adapters down is
advertised with the usable ones and says so ("2 of 4 adapters ACTIVE"); a
fabric that needs more (``fabrics.<name>.min_adapters``) is refused by the
planner, which knows the cluster. Otherwise the planner must not place a
multi-node replica over it: NCCL would pick whatever it finds and the job
would hang on its first all-reduce. Each refusal and each degraded adapter
is reported with a reason an operator can act on.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from llmgw.discovery import adapters as adapters_
from llmgw.discovery.adapters import EMPTY_GID
from llmgw.fleet.types import Adapter, FabricStatus, Port

FabricKind = Literal["infiniband", "roce"]
LINK_LAYER: dict[str, str] = {"infiniband": "InfiniBand", "roce": "Ethernet"}
_IPV4_MAPPED = "0000:0000:0000:0000:0000:ffff:"


@dataclass(frozen=True)
class DeclaredFabric:
    """One fabric as the cluster declares it for this node."""

    name: str
    kind: FabricKind
    adapters: tuple[str, ...] = ()
    gid_index: int | None = None


@dataclass(frozen=True)
class Declaration:
    """What the cluster expects of a node; the daemon sends it with each Report."""

    node: str = ""
    fabrics: tuple[DeclaredFabric, ...] = ()
    weights_dirs: tuple[str, ...] = ()


@dataclass
class _Verdict:
    usable: list[str] = field(default_factory=list)
    reasons: list[str] = field(default_factory=list)
    missing: bool = False
    gid_indices: set[int] = field(default_factory=set)


def roce_v2_ipv4_index(port: Port) -> int | None:
    """The first GID of ``port`` that is RoCE v2 over IPv4: what NCCL's auto-select picks."""
    for index, gid in enumerate(port.gids):
        kind = port.gid_types[index] if index < len(port.gid_types) else ""
        if kind == "RoCE v2" and gid.startswith(_IPV4_MAPPED):
            return index
    return None


def _describe(port: Port) -> str:
    parts = [p for p in (port.state, port.phys_state) if p]
    return f"port {port.number}: {', '.join(parts) or 'state unknown'}"


def _gid_problem(adapter: Adapter, port: Port, index: int) -> str | None:
    gid = port.gids[index] if index < len(port.gids) else EMPTY_GID
    if gid == EMPTY_GID:
        return (
            f"{adapter.name} port {port.number} has no GID at index {index} "
            "(RoCE v2 needs an IP address on the adapter's interface)"
        )
    kind = port.gid_types[index] if index < len(port.gid_types) else ""
    if kind and kind != "RoCE v2":
        return f"{adapter.name} port {port.number} GID {index} is {kind}, not RoCE v2"
    return None


def _check_adapter(fabric: DeclaredFabric, adapter: Adapter, verdict: _Verdict) -> None:
    wanted = LINK_LAYER[fabric.kind]
    matching = [p for p in adapter.ports if p.link_layer in (wanted, None)]
    if not matching:
        layers = ", ".join(sorted({p.link_layer or "?" for p in adapter.ports})) or "no ports"
        verdict.reasons.append(
            f"{adapter.name} is {layers}, but {fabric.name} is declared {fabric.kind}"
        )
        return
    active = [p for p in matching if p.active]
    if not active:
        states = "; ".join(_describe(p) for p in matching)
        verdict.reasons.append(f"{adapter.name} has no ACTIVE port ({states})")
        return
    if fabric.kind == "roce":
        if fabric.gid_index is None:
            # Nothing declared: the GID NCCL would select itself, if the port has one.
            found = [i for i in map(roce_v2_ipv4_index, active) if i is not None]
            if not found:
                verdict.reasons.append(
                    f"{adapter.name} has no RoCE v2 GID with an IPv4 address on an ACTIVE port "
                    "(RoCE v2 needs an IP address on the adapter's interface)")
                return
            verdict.gid_indices.add(found[0])
        else:
            problems = [_gid_problem(adapter, p, fabric.gid_index) for p in active]
            if all(problems):
                verdict.reasons.extend(p for p in problems if p)
                return
    verdict.usable.append(adapter.name)


def check_one(fabric: DeclaredFabric, adapters: Sequence[Adapter]) -> FabricStatus:
    """The status of one declared fabric. Purely computational, no side-effects."""
    present = {a.name: a for a in adapters}
    verdict = _Verdict()
    if not fabric.adapters:
        verdict.reasons.append(f"no adapters declared for {fabric.name} on this node")
    for name in fabric.adapters:
        adapter = present.get(name)
        if adapter is None:
            verdict.missing = True
            found = ", ".join(sorted(present, key=adapters_.natural)) or "none"
            verdict.reasons.append(
                f"adapter {name} is declared but not present (found: {found})"
            )
            continue
        _check_adapter(fabric, adapter, verdict)
    split = _split(fabric, [present[name] for name in verdict.usable])
    if split:
        verdict.reasons.append(split)
    advertised = bool(verdict.usable) and not verdict.missing and not split
    if not advertised and fabric.adapters and not verdict.missing and not split:
        verdict.reasons.append(f"no declared adapter of {fabric.name} is usable")
    declared = len(fabric.adapters)
    if advertised and len(verdict.usable) < declared:
        # Advertised, but not whole: the count first, then which adapters and why.
        verdict.reasons.insert(0, f"{len(verdict.usable)} of {declared} adapters ACTIVE")
    return FabricStatus(
        name=fabric.name,
        kind=fabric.kind,
        adapters=verdict.usable,
        advertised=advertised,
        reasons=verdict.reasons,
        gid_index=_gid_index(fabric, verdict),
        declared_adapters=len(fabric.adapters),
    )


def _split(fabric: DeclaredFabric, usable: Sequence[Adapter]) -> str | None:
    """Why ``usable`` are not one fabric: their ports answer to different subnet managers
    (InfiniBand), so a rank on one cannot reach a rank on the other. None when they agree,
    when a subnet is unknown (nothing to compare), or on RoCE: RoCE v2 is routed, and a
    rail-optimised site puts each rail's adapters on an IP network of their own."""
    if fabric.kind != "infiniband":
        return None
    by_subnet: dict[str, list[str]] = {}
    for adapter in usable:
        for subnet in adapter.subnets:
            by_subnet.setdefault(subnet, []).append(adapter.name)
    if len(by_subnet) < 2:
        return None
    groups = "; ".join(f"{', '.join(names)}: {subnet}" for subnet, names in by_subnet.items())
    return (f"{fabric.name}'s adapters answer to {len(by_subnet)} different subnet managers "
            f"({groups}); fix: declare each as its own fabric in the cluster's `fabrics:` "
            "and the node's `fabrics:` in nodes.yaml, or cable them to one subnet")


def _gid_index(fabric: DeclaredFabric, verdict: _Verdict) -> int | None:
    """The declared index, else the one every usable adapter agrees on, else None
    (NCCL then selects per adapter)."""
    if fabric.kind != "roce":
        return None
    if fabric.gid_index is not None:
        return fabric.gid_index
    return next(iter(verdict.gid_indices)) if len(verdict.gid_indices) == 1 else None


def check(declared: Sequence[DeclaredFabric], adapters: Sequence[Adapter]) -> list[FabricStatus]:
    """Every declared fabric's status, in declaration order.

    >>> check([], [])
    []
    """
    return [check_one(fabric, adapters) for fabric in declared]
