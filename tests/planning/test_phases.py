"""What the applier runs for each change, phase by phase; the plan's summary line."""

from __future__ import annotations

import pytest
from test_plan_cases import CASES, load_case, run_case

from llmgw.planning.types import (
    Change,
    Held,
    ObservedShard,
    Plan,
    Shard,
    UnknownReplica,
    Unplaceable,
)
from llmgw.spec.rollouts import Hold


def changes(case: str) -> list[Change]:
    return list(run_case(load_case(CASES / f"{case}.yaml"))[0].changes)


def ops(change: Change) -> list[list[tuple[str, str, str]]]:
    return [[(op.action, op.node, op.unit) for op in phase] for phase in change.phases()]


def test_create_before_destroy_starts_the_new_replica_first() -> None:
    (change,) = changes("22-args-changed-create-before-destroy")
    assert ops(change) == [
        [("start", "l40s-01", "llmgw-llama-8b-r1-s0.service")],
        [("remove", "l40s-01", "llmgw-llama-8b-r0-s0.service")],
    ]
    (start,) = change.phases()[0]
    assert start.files is not None and "X-Llmgw-Replica=1" in start.files.unit_text


def test_destroy_before_create_in_place_rewrites_the_same_unit() -> None:
    (change,) = changes("21-args-changed-destroy-then-create")
    assert ops(change) == [[("start", "l40s-01", "llmgw-llama-8b-r0-s0.service")]]
    (start,) = change.phases()[0]
    assert start.files is not None and "--max-model-len 16384" in start.files.unit_text


def test_destroy_removes_and_create_starts() -> None:
    destroy, create = changes("25-removed-node-units-destroyed")
    assert ops(destroy) == [[("remove", "gpu-old", "llmgw-llama-8b-r0-s0.service")]]
    assert ops(create) == [[("start", "gpu-01", "llmgw-llama-8b-r0-s0.service")]]


def test_restart_starts_only_the_failed_shard() -> None:
    (change,) = changes("23-failed-unit-restarts")
    assert ops(change) == [[("start", "gpu-01", "llmgw-llama-8b-r0-s0.service")]]


def test_a_multi_node_replace_removes_shards_that_move_before_starting() -> None:
    (change,) = changes("34-multi-node-shard-missing")
    assert change.strategy == "destroy-before-create"
    phases = ops(change)
    assert phases[-1] == [("start", "gpu-a-01", "llmgw-llama-70b-r0-s0.service"),
                          ("start", "gpu-a-02", "llmgw-llama-70b-r0-s1.service")]


def shard(node: str, rank: int) -> Shard:
    return Shard("m", 0, rank, 2, node, f"llmgw-m-r0-s{rank}.service", "vllm", "h100-80g",
                 (0,), 8000, "d1", {})


def observed(node: str, rank: int) -> ObservedShard:
    return ObservedShard(node, f"llmgw-m-r0-s{rank}.service", rank, "d0", "ready")


def test_an_in_place_replace_removes_a_shard_that_moves_to_another_node_first() -> None:
    # Rank 1 moves from g2 to g3: its unit on g2 goes before the new shards start;
    # rank 0 stays on g1, where "start" rewrites its unit in place.
    change = Change("replace", "m", 0, ("node g2 left",), shards=(shard("g1", 0), shard("g3", 1)),
                    removes=(observed("g1", 0), observed("g2", 1)),
                    strategy="destroy-before-create")
    assert ops(change) == [
        [("remove", "g2", "llmgw-m-r0-s1.service")],
        [("start", "g1", "llmgw-m-r0-s0.service"), ("start", "g3", "llmgw-m-r0-s1.service")],
    ]


@pytest.mark.parametrize(
    ("count", "word"),
    [pytest.param(1, "replica", id="one"), pytest.param(2, "replicas", id="two")],
)
def test_the_summary_line_counts_what_the_plan_cannot_fix(count: int, word: str) -> None:
    unplaceable = (Unplaceable("m", tuple(range(count)), "min 2", ()),)
    unknown = tuple(UnknownReplica("m", i, ("g1",), ("down",)) for i in range(count))
    held = tuple(Held("m", i, "config", ("g1",), ("repair off",)) for i in range(count))
    holds = tuple(Hold(f"m{i}", "abc", None, "slow", 0.0) for i in range(count))
    text = Plan("lab", 0.0, None, (), unplaceable=unplaceable, unknown=unknown, held=held,
                holds=holds).summary()
    model = "model" if count == 1 else "models"
    assert text == (f"Plan: 0 to create, 0 to replace, 0 to destroy. "
                    f"{count} {word} cannot be placed. "
                    f"{count} {word} unknown (node not reachable). "
                    f"{count} {word} held (not repaired). "
                    f"{count} {model} held (failed a rollout gate).")
