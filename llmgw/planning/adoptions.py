"""Replacements a daemon left loading, adopted by the next plan instead of started again.

A replace runs create-before-destroy: the new replica starts beside the old
one, which goes once the new one is ready. A daemon that stops in between
(restarted, failed over to a standby, killed) leaves both running, and the
next plan, which has no memory of the replace, saw a model over its ``max``:
it destroyed the newest replica (the one loading, maybe minutes into a large
model's weights) and replaced the old one all over again under a third
number.

Now a replica whose units are exactly what the spec renders today (every
digest equal) and that is in no trouble is recognised as the replacement of
one that is out of date: the plan replaces the old one *by it*, without
writing anything new, and the old one goes once it is ready, as if the first
daemon had carried on.

A purely computational module with no side effects.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from llmgw.engines import launches
from llmgw.fleet.types import NodeReport
from llmgw.planning import placements, shards
from llmgw.planning.nodes import Capacity
from llmgw.planning.replicas import TROUBLED_STATES, ObservedReplica
from llmgw.planning.types import Shard
from llmgw.spec.models import Cluster


def as_running(
    cluster: Cluster, reports: Mapping[str, NodeReport], capacity: Capacity,
    replica: ObservedReplica,
) -> tuple[Shard, ...] | None:
    """The replica's shards as the spec renders them now, when that is exactly what runs
    (same placement, same profile, every digest equal); None otherwise."""
    model = cluster.models.get(replica.model)
    index = replica.profile
    if (model is None or index is None or index >= len(model.profiles) or replica.missing()
            or any(m.spec is None for m in replica.members.values())):
        return None
    current = placements.current(capacity, replica)
    if current is None:
        return None
    try:
        built = shards.build(cluster, reports, replica.model, replica.replica,
                             replace(current, profile=index))
    except launches.EngineError:
        return None
    if len(built) != len(replica.members) or any(
            s.digest != replica.members[s.rank].unit.digest for s in built):
        return None
    return built


def pairs(
    known: list[ObservedReplica], up_to_date: Mapping[int, tuple[Shard, ...]], surplus: int,
) -> list[tuple[ObservedReplica, ObservedReplica, tuple[Shard, ...]]]:
    """(old, new, new's shards) for up to ``surplus`` replicas over ``max``: each new one
    up to date and in no trouble, each old one out of date, oldest first with newest."""
    new = [r for r in sorted(known, key=lambda r: -r.replica)
           if r.replica in up_to_date
           and not any(m.unit.state in TROUBLED_STATES for m in r.members.values())]
    old = [r for r in sorted(known, key=lambda r: r.replica) if r.replica not in up_to_date]
    return [(o, n, up_to_date[n.replica]) for o, n in zip(old, new, strict=False)][:surplus]
