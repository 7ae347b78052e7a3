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
