"""``Planner().plan(...)``: :func:`.plans.plan`, remembering what it derived per node.

The daemon plans every few seconds, and at 10,000 nodes most of a plan in a
steady fleet is reading reports that did not change: each node's GPUs,
fabrics, weights and ports (:class:`.nodes.Capacity`) and its fingerprint.
A planner keeps both from its last plan and derives them again only for a
node whose report changed in what they read, or whose declaration did; a
node no longer declared is forgotten. Nothing a plan takes, places or decides
is kept: every plan places every replica afresh, so its result is the same,
byte for byte, as :func:`.plans.plan` without a planner (the equivalence test
compares the two over random edits of cluster and fleet).

    planner = planners.Planner()
    plan = planner.plan(cluster, fleet, now)   # in the daemon's loop, each tick

A purely computational module: the planner holds state, but no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from llmgw.fleet.types import Demand, Fleet
from llmgw.planning import plans
from llmgw.planning.scaling import LoadSample, Policy
from llmgw.planning.types import Plan
from llmgw.spec.models import Cluster


class Planner:
    """Plans like :func:`.plans.plan`; one per loop, reused from one plan to the next."""

    def __init__(self) -> None:
        self.memory = plans.Memory()

    @property
    def derived(self) -> int:
        """How many nodes the last plan read afresh (the others were unchanged)."""
        return self.memory.nodes.derived

    def plan(
        self,
        cluster: Cluster,
        fleet: Fleet,
        now: float,
        demand: Demand | None = None,
        *,
        revision: str | None = None,
        policy: Policy | None = None,
        loads: Mapping[str, Sequence[LoadSample]] | None = None,
    ) -> Plan:
        """What :func:`.plans.plan` returns for the same arguments."""
        return plans.plan(cluster, fleet, now, demand, revision=revision, policy=policy,
                          loads=loads, memory=self.memory)
