"""The one hold rule no plan case can reach: a replace that moves is not held
when another change of the same plan already took the GPUs it frees.

(The planner fills freed GPUs only in layouts too large for a readable case,
so this builds the two changes by hand; the cases 91–94 cover the rest.)
"""

from __future__ import annotations

from dataclasses import replace

from llmgw.fleet.types import HostFacts, InstalledEngine, NodeReport
from llmgw.planning import installs, outputs
from llmgw.planning.types import Change, ObservedShard, Plan, Shard


def shard(model: str, replica: int, gpus: tuple[int, ...], version: str | None) -> Shard:
    spec = {"engine_version": version} if version else {}
    return Shard(model=model, replica=replica, rank=0, ranks=1, node="gpu-01",
                 unit=f"llmgw-{model}-r{replica}-s0.service", engine="vllm",
                 gpu_class="a100-80g", gpus=gpus, port=None, digest="d", spec=spec)


def observed(model: str, replica: int, gpus: tuple[int, ...]) -> ObservedShard:
    return ObservedShard(node="gpu-01", unit=f"llmgw-{model}-r{replica}-s0.service", rank=0,
                         digest="old", state="running", gpus=gpus)


REPORTS = {"gpu-01": NodeReport(node="gpu-01", host=HostFacts(
    engines_dir="/opt/llmgw/engines",
    installed_engines=[InstalledEngine(engine="vllm", version="0.11.2",
                                       path="/opt/llmgw/engines/vllm-0.11.2")]))}

# r0 moves from GPU 1 to GPUs 2-3 and needs vllm 0.12.0, which gpu-01 lacks.
MOVE = Change("replace", "llama-8b", 0, ("engine version changed: 0.11.2 → 0.12.0",),
              shards=(shard("llama-8b", 0, (2, 3), "0.12.0"),),
              removes=(observed("llama-8b", 0, (1,)),), strategy="destroy-before-create",
              new_replica=0)


def plan_of(*changes: Change) -> Plan:
    return Plan(cluster="lab", now=0.0, revision=None, changes=changes)


def test_a_move_whose_freed_gpu_another_change_took_is_not_held() -> None:
    taker = Change("create", "bge", 0, ("scaling: min 1, 0 running",),
                   shards=(shard("bge", 0, (1,), None),))
    noted = installs.noted(plan_of(MOVE, taker), REPORTS)
    assert [c.model for c in noted.changes] == ["llama-8b", "bge"]
    assert noted.changes[0].reasons[-1] == (
        "install vllm 0.12.0 on gpu-01 first: llmgw engine install vllm==0.12.0 gpu-01")
    assert noted.warnings == ()


def test_a_move_whose_freed_gpu_nobody_took_is_held() -> None:
    other = Change("create", "bge", 0, ("scaling: min 1, 0 running",),
                   shards=(shard("bge", 0, (0,), None),))
    noted = installs.noted(plan_of(MOVE, other), REPORTS)
    assert [c.model for c in noted.changes] == ["bge"]
    assert noted.warnings == (
        "llama-8b r0 keeps running: its replace waits for install of vllm 0.12.0 on gpu-01 "
        "(llmgw engine install vllm==0.12.0 gpu-01)",)


def test_a_plan_holding_a_replace_does_not_say_the_fleet_matches() -> None:
    held = installs.noted(plan_of(MOVE), REPORTS)
    assert installs.holds(held) == 1
    text = outputs.text(held)
    assert "No changes can be made yet: replaces wait for engine installs (see below)." in text
    assert "the fleet matches the cluster" not in text


def test_needed_names_the_installs_of_changes_and_held_replaces() -> None:
    beside = Change("create", "llama-8b", 1, ("scaling: min 2, 1 running",),
                    shards=(replace(shard("llama-8b", 1, (0,), "0.12.0"), node="gpu-02"),))
    noted = installs.noted(plan_of(MOVE, beside), REPORTS | {"gpu-02": REPORTS["gpu-01"]})
    assert [c.model for c in noted.awaiting_install] == ["llama-8b"]
    assert installs.needed(noted, REPORTS | {"gpu-02": REPORTS["gpu-01"]}) == {
        ("vllm", "0.12.0"): {"gpu-01", "gpu-02"}}
