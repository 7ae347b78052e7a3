"""What the applier runs for each change, phase by phase."""

from __future__ import annotations

from test_plan_cases import CASES, load_case, run_case

from llmgw.planning.types import Change


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
