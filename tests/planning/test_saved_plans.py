"""Saved plans (``llmgw plan --format json --out FILE``) apply only what was reviewed.

A saved plan carries, per shard, its spec, its digest and its rendered unit
and env files. ``llmgw apply FILE`` refuses a file in which they disagree: a
unit text edited after the review (an ``ExecStartPre=`` slipped in) never
reaches a node.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from llmgw.applying import saved
from llmgw.cli.main import main

EXAMPLE = Path(__file__).parents[2] / "cluster.example"


@pytest.fixture
def saved_plan(tmp_path: Path) -> Path:
    planfile = tmp_path / "plan.json"
    assert main(["plan", "--cluster", str(EXAMPLE), "--observed",
                 str(EXAMPLE / "fleet-snapshot.json"), "--format", "json",
                 "--out", str(planfile)]) == 0
    return planfile


def test_a_saved_plan_applies_only_what_its_specs_render_to(saved_plan: Path) -> None:
    assert saved.load(saved_plan).changes  # untouched: loads
    data = json.loads(saved_plan.read_text())
    shard = next(s for c in data["changes"] for s in c["shards"])
    shard["unit_text"] = shard["unit_text"].replace(
        "[Service]\n", "[Service]\nExecStartPre=/usr/bin/touch /tmp/p\n")
    saved_plan.write_text(json.dumps(data))
    with pytest.raises(saved.SavedPlanError, match="is not what its spec renders to; the "
                       "file was edited; plan again"):
        saved.load(saved_plan)


def test_a_saved_plan_whose_spec_was_edited_is_refused(saved_plan: Path) -> None:
    data = json.loads(saved_plan.read_text())
    shard = next(s for c in data["changes"] for s in c["shards"])
    shard["spec"]["argv"].append("--evil")
    saved_plan.write_text(json.dumps(data))
    with pytest.raises(saved.SavedPlanError, match="its digest is not its spec's"):
        saved.load(saved_plan)
