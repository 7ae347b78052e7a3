"""What a plan may do while changes are in flight (:func:`convergences.defer`), as a table.

The loop plans again while a replica loads: the planner then sees an in-flight
replace as two replicas (and would scale the new one down) or a create as a
loading replica. The change in flight decides; a plan's changes to the same
replicas wait, and so do changes that would land on room a waiting destroy was
to free.
"""

from __future__ import annotations

import pytest

from llmgw.applying import convergences
from llmgw.planning.types import Change, ObservedShard, Plan, Shard


def shard(model: str, replica: int, node: str) -> Shard:
    return Shard(model=model, replica=replica, rank=0, ranks=1, node=node,
                 unit=f"llmgw-{model}-r{replica}-s0.service", engine="llama.cpp",
                 gpu_class=None, gpus=(), port=18000, digest="d", spec={})


def observed(model: str, replica: int, node: str) -> ObservedShard:
    return ObservedShard(node=node, unit=f"llmgw-{model}-r{replica}-s0.service", rank=0,
                         digest="old", state="ready")


def create(model: str, replica: int, node: str = "n1") -> Change:
    return Change("create", model, replica, ("wanted",), shards=(shard(model, replica, node),))


def restart(model: str, replica: int, node: str = "n1") -> Change:
    return Change("restart", model, replica, ("stopped",), shards=(shard(model, replica, node),))


def destroy(model: str, replica: int, node: str = "n1") -> Change:
    return Change("destroy", model, replica, ("over max",),
                  removes=(observed(model, replica, node),))


def drained(model: str, replica: int, node: str = "n1") -> Change:
    """A scale-down's destroy: the replica drained first."""
    return Change("destroy", model, replica, ("scale m 2 → 1",),
                  removes=(observed(model, replica, node),), drain=True)


def replace(model: str, old: int, new: int, node: str = "n1",
            strategy: str = "create-before-destroy") -> Change:
    return Change("replace", model, old, ("args changed",), shards=(shard(model, new, node),),
                  removes=(observed(model, old, node),), strategy=strategy,  # type: ignore[arg-type]
                  new_replica=new)


CASES = {
    "nothing in flight: the plan as it is": (
        [], [create("m", 0), restart("o", 0)], []),
    "a create in flight: a destroy of its replica waits": (
        [create("m", 0)], [destroy("m", 0), restart("o", 0)], ["destroy m r0"]),
    "a replace in flight: neither its new replica scaled down nor its old one replaced again": (
        [replace("m", 0, 1)], [destroy("m", 1), replace("m", 0, 2, node="n2")],
        ["destroy m r1", "replace m r0"]),
    "another replica of the same model is not held up": (
        [create("m", 0)], [create("m", 1, node="n2")], []),
    "room a waiting destroy was to free is not taken meanwhile": (
        [replace("m", 0, 1)], [destroy("m", 1, node="n1"), create("o", 0, node="n1"),
                               create("p", 0, node="n2")],
        ["destroy m r1", "create o r0"]),
    "a scale-down draining a replica: another of its model's is not drained for it too": (
        [drained("m", 1)], [drained("m", 0, node="n2"), destroy("m", 2, node="n2"),
                            drained("o", 0, node="n3")],
        ["destroy m r0"]),
    "a waiting destroy-before-create frees nothing meanwhile either": (
        [create("m", 0)], [replace("m", 0, 0, strategy="destroy-before-create"),
                           replace("o", 0, 1, node="n1"), restart("p", 0, node="n1")],
        ["replace m r0", "replace o r0"]),
}


@pytest.mark.parametrize(("busy", "planned", "deferred"), list(CASES.values()), ids=list(CASES))
def test_a_plan_waits_for_what_is_in_flight(busy: list[Change], planned: list[Change],
                                            deferred: list[str]) -> None:
    plan = Plan(cluster="c", now=0.0, revision=None, changes=tuple(planned))
    kept, held = convergences.defer(plan, busy)
    assert [f"{c.action} {c.model} r{c.replica}" for c in held] == deferred
    assert [c for c in kept.changes] == [c for c in planned if all(c is not d for d in held)]
    assert len(kept.warnings) == len(deferred)
    assert all("deferred until the change in flight" in line for line in kept.warnings)
