"""`plan` says, per shard, whether its node has the weights or how much it will fetch."""

from __future__ import annotations

from pathlib import Path

from test_plan_cases import load_case, run_case

from llmgw.planning import outputs

CASE = Path(__file__).parent / "cases" / "60-weights-disk-too-small.yaml"


def test_plan_shows_present_will_fetch_and_cannot_fetch() -> None:
    plan = run_case(load_case(CASE))[0]
    text = outputs.text(plan)
    assert "s0 gpu-02" in text and "weights: present in /models" in text
    assert "weights: will fetch 141 GB into /models" in text
    assert "gpu-01: needs 148 GB, 80 GB free in /models" in text
    notes = {s.node: s.weights for c in plan.changes for s in c.shards}
    assert notes == {"gpu-02": "present in /models", "gpu-03": "will fetch 141 GB into /models"}


def test_weights_an_operator_placed_at_org_name_are_used_not_fetched() -> None:
    case = load_case(CASE)
    case["cluster"]["models"]["llama-70b"]["scaling"] = {"min": 2, "max": 2}
    case["fleet"] = {"gpu-01": {"weights": ["/models/meta-llama/Llama-3.1-70B-Instruct"]},
                     "gpu-02": {"disk_free": "80GB"}, "gpu-03": {"disk_free": "2TB"}}
    plan = run_case(case)[0]
    shards = {s.node: s for c in plan.changes for s in c.shards}
    placed, fetched = shards["gpu-01"], shards["gpu-03"]
    assert "/models/meta-llama/Llama-3.1-70B-Instruct" in placed.spec["argv"]
    assert "weights" not in placed.spec and placed.weights == ""
    assert "${LLMGW_WEIGHTS}" in fetched.spec["argv"]
    assert fetched.spec["weights"] == {"source": "meta-llama/Llama-3.1-70B-Instruct",
                                       "dir": "/models"}
