"""The plan and its parts: plain, typed, immutable data.

A :class:`Plan` is a list of :class:`Change` in the order they must run
(destroys that free capacity first, then holds, restarts, replaces and
creates), each with its class of drift (:mod:`llmgw.planning.drifts`),
replicas held instead of repaired (:class:`Held`),
replicas that cannot be placed (:class:`Unplaceable`) and replicas whose nodes
did not answer (:class:`UnknownReplica`), each with its reasons, plus the
fingerprints a saved plan is checked against before it is applied.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from llmgw.rendering.units import UnitFiles
from llmgw.spec.rollouts import Hold

FORMAT_VERSION = 1

Action = Literal["create", "replace", "destroy", "restart", "hold"]
Strategy = Literal["create-before-destroy", "destroy-before-create"]
ACTIONS: tuple[Action, ...] = ("create", "replace", "destroy", "restart", "hold")


@dataclass(frozen=True)
class Shard:
    """One node's part of one replica, as the plan wants it to run."""

    model: str
    replica: int
    rank: int
    ranks: int
    node: str
    unit: str  # llmgw-<model>-r<replica>-s<rank>.service
    engine: str
    gpu_class: str | None
    gpus: tuple[int, ...]  # indices on the node, for people; the unit pins UUIDs
    port: int | None
    digest: str
    spec: Mapping[str, Any] = field(compare=False)
    files: UnitFiles | None = field(default=None, compare=False)
    # What the node does about the weights before the engine starts ("present in
    # /models", "will fetch 141 GB into /models"); empty for a path on the node.
    weights: str = field(default="", compare=False)


@dataclass(frozen=True)
class ObservedShard:
    """A unit the fleet reports."""

    node: str
    unit: str
    rank: int
    digest: str
    state: str
    port: int | None = None
    gpus: tuple[int, ...] = ()
    detail: str = ""


@dataclass(frozen=True)
class UnitOp:
    """One thing an agent does to one unit: what :mod:`llmgw.applying` sends."""

    node: str
    unit: str
    action: Literal["start", "stop", "remove"]
    files: UnitFiles | None = None  # start only


@dataclass(frozen=True)
class Change:
    action: Action
    model: str
    replica: int
    reasons: tuple[str, ...]
    shards: tuple[Shard, ...] = ()  # what will run: create, replace, restart
    removes: tuple[ObservedShard, ...] = ()  # what goes away: destroy, replace
    strategy: Strategy | None = None  # replace only
    new_replica: int | None = None  # replace only: the index of the new replica
    # The class of drift this change repairs (llmgw.planning.drifts) and what shows it.
    drift: str = "declared_change"
    evidence: tuple[str, ...] = ()
    # A destroy the autoscaler asked for: out of the routes and its requests finished
    # (bounded) before its units stop.
    drain: bool = False

    def phases(self) -> tuple[tuple[UnitOp, ...], ...]:
        """The unit operations of this change, phase by phase.

        Within a phase, operations may run in parallel. A create-before-destroy
        replace waits for its new shards to be ready before the second phase.
        """
        starts = tuple(UnitOp(s.node, s.unit, "start", s.files) for s in self.shards)
        removes = tuple(UnitOp(s.node, s.unit, "remove") for s in self.removes)
        if self.action == "hold":  # stop what crash-loops; its files stay for a later start
            return (tuple(UnitOp(s.node, s.unit, "stop") for s in self.removes),)
        if self.action == "destroy":
            return (removes,)
        if self.action in ("create", "restart"):
            return (starts,)
        if self.strategy == "create-before-destroy":
            return (starts, removes)
        # In place: same unit names; "start" rewrites and restarts a unit,
        # so only shards that disappear need removing first.
        kept = {(s.node, s.unit) for s in self.shards}
        gone = tuple(op for op in removes if (op.node, op.unit) not in kept)
        return tuple(phase for phase in (gone, starts) if phase)


@dataclass(frozen=True)
class Attempt:
    """Why one profile did not fit: one line per node (or per fabric)."""

    profile: int
    label: str  # "vllm · 2 nodes × 8 h100-80g"
    reasons: tuple[tuple[str, str], ...]  # (node or "", reason)


@dataclass(frozen=True)
class Unplaceable:
    model: str
    replicas: tuple[int, ...]
    wanted: str  # why these replicas are wanted
    attempts: tuple[Attempt, ...]
    note: str = ""  # e.g. "the current replica keeps running"


@dataclass(frozen=True)
class Held:
    """A replica whose drift is not repaired: its class's repair is off, or it crash-loops."""

    model: str
    replica: int
    drift: str
    nodes: tuple[str, ...]
    reasons: tuple[str, ...]  # why it is held
    evidence: tuple[str, ...] = ()


@dataclass(frozen=True)
class UnknownReplica:
    model: str
    replica: int
    nodes: tuple[str, ...]
    reasons: tuple[str, ...]


@dataclass(frozen=True)
class CapacityRow:
    """GPUs of one class on reachable nodes, before and after the plan."""

    gpu_class: str
    total: int
    faulty: int
    used_before: int
    used_after: int

    @property
    def free_after(self) -> int:
        return self.total - self.faulty - self.used_after


@dataclass(frozen=True)
class NodeFingerprint:
    node: str
    reachable: bool
    digest: str  # of what the plan read from the node's report


@dataclass(frozen=True)
class Plan:
    cluster: str
    now: float
    revision: str | None
    changes: tuple[Change, ...]
    unplaceable: tuple[Unplaceable, ...] = ()
    unknown: tuple[UnknownReplica, ...] = ()
    capacity: tuple[CapacityRow, ...] = ()
    nodes: tuple[NodeFingerprint, ...] = ()
    warnings: tuple[str, ...] = ()
    held: tuple[Held, ...] = ()
    holds: tuple[Hold, ...] = ()  # models whose replacement failed its gate (planning.holds)
    # Each autoscaled model's decision (planning.scaling.decide): a scale or a hold, and why.
    scaling: tuple[str, ...] = ()
    # Replaces held until their engine version is installed (planning.installs);
    # in memory only: a saved plan keeps their warnings.
    awaiting_install: tuple[Change, ...] = field(default=(), compare=False)
    # Reasons that quote an engine's output (replicas.quotes), each → the same reason
    # without it: a Markdown comment shows the second unless asked. In memory only.
    quotes: Mapping[str, str] = field(default_factory=dict, compare=False)

    def count(self, action: Action) -> int:
        return sum(1 for change in self.changes if change.action == action)

    @property
    def has_changes(self) -> bool:
        return bool(self.changes)

    @property
    def unplaced(self) -> int:
        """How many wanted replicas cannot be placed."""
        return sum(len(entry.replicas) for entry in self.unplaceable)

    def summary(self) -> str:
        """``Plan: 2 to create, 1 to replace, 0 to destroy.`` (restarts when any), then
        what the plan cannot fix: ``3 replicas cannot be placed.``, ``1 replica unknown
        (node not reachable).`` — every output format and the daemon's log use this line,
        so trouble is never hidden behind "0 to create"."""
        text = (
            f"Plan: {self.count('create')} to create, {self.count('replace')} to replace, "
            f"{self.count('destroy')} to destroy"
        )
        restarts, holds = self.count("restart"), self.count("hold")
        text += f", {restarts} to restart" if restarts else ""
        text += f", {holds} to hold." if holds else "."
        if self.unplaced:
            plural = "s" if self.unplaced != 1 else ""
            text += f" {self.unplaced} replica{plural} cannot be placed."
        if self.unknown:
            plural = "s" if len(self.unknown) != 1 else ""
            text += f" {len(self.unknown)} replica{plural} unknown (node not reachable)."
        if self.held:
            plural = "s" if len(self.held) != 1 else ""
            text += f" {len(self.held)} replica{plural} held (not repaired)."
        if self.holds:
            plural = "s" if len(self.holds) != 1 else ""
            text += f" {len(self.holds)} model{plural} held (failed a rollout gate)."
        return text
