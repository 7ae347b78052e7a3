"""Plan outputs: golden files for text, Markdown and JSON; determinism; the size bound.

``LLMGW_UPDATE_GOLDEN=1 pytest tests/planning/test_outputs.py`` rewrites the
golden files from the current output — read the diff before committing it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from plan_builders import cluster_from, fleet_from
from test_plan_cases import load_case, run_case

from llmgw.fleet.types import Demand, Fleet
from llmgw.planning import outputs, plans
from llmgw.planning.types import Plan
from llmgw.spec.models import Cluster

GOLDEN = Path(__file__).parent / "golden"
SCENARIO = GOLDEN / "scenario.yaml"
FORMATS = {"plan.txt": outputs.text, "plan.md": outputs.markdown, "plan.json": outputs.json_text}


@pytest.fixture(scope="module")
def scenario() -> tuple[Plan, Cluster, Fleet, float]:
    return run_case(load_case(SCENARIO))


@pytest.mark.parametrize("name", sorted(FORMATS))
def test_golden(name: str, scenario: tuple[Plan, Cluster, Fleet, float]) -> None:
    rendered = FORMATS[name](scenario[0])
    path = GOLDEN / name
    if os.environ.get("LLMGW_UPDATE_GOLDEN"):
        path.write_text(rendered)
    assert rendered == path.read_text(), f"{name} differs from the golden file"


def test_json_is_versioned_and_complete(scenario: tuple[Plan, Cluster, Fleet, float]) -> None:
    data = json.loads(outputs.json_text(scenario[0]))
    assert next(iter(data)) == "format_version" and data["format_version"] == 1
    assert data["summary"] == {"create": 3, "replace": 2, "destroy": 2, "restart": 1,
                               "hold": 0, "unplaceable": 4, "held": 0, "unknown": 1,
                               "text": "Plan: 3 to create, 2 to replace, 2 to destroy, "
                                       "1 to restart. 4 replicas cannot be placed. "
                                       "1 replica unknown (node not reachable)."}
    create = next(c for c in data["changes"] if c["model"] == "llama-3.1-70b")
    assert [s["node"] for s in create["shards"]] == ["gpu-a-01", "gpu-a-02"]
    assert "X-Llmgw-Digest=" in create["shards"][0]["unit_text"]
    assert create["shards"][0]["secret_env"] == {"HF_TOKEN": "/etc/llmgw/secrets/hf_token"}
    assert {n["node"] for n in data["nodes"]} >= {"gpu-a-01", "l40s-05"}


def _reordered(cluster: Cluster, fleet: Fleet) -> tuple[Cluster, Fleet]:
    """The same state with every map and list in another order."""
    data: dict[str, Any] = cluster.model_dump(by_alias=True, exclude_none=True)
    for section in ("nodes", "models", "fabrics"):
        data[section] = dict(reversed(list(data[section].items())))
    for model in data["models"].values():
        for profile in model["profiles"]:
            profile["args"] = dict(reversed(list(profile.get("args", {}).items())))
    nodes = {
        name: report.model_copy(update={"units": list(reversed(report.units)),
                                        "weights": list(reversed(report.weights))})
        for name, report in reversed(list(fleet.nodes.items()))
    }
    return Cluster.model_validate(data), Fleet(nodes=nodes)


def test_same_inputs_same_bytes(scenario: tuple[Plan, Cluster, Fleet, float]) -> None:
    plan, cluster, fleet, now = scenario
    again = plans.plan(cluster, fleet, now, Demand())
    shuffled_cluster, shuffled_fleet = _reordered(cluster, fleet)
    shuffled = plans.plan(shuffled_cluster, shuffled_fleet, now, Demand())
    for render in FORMATS.values():
        assert render(again) == render(plan)
        assert render(shuffled) == render(plan)


def test_same_bytes_across_interpreters() -> None:
    """Set and dict ordering must not leak into a plan: hash seeds differ per process."""
    script = (
        "import sys; sys.path.insert(0, sys.argv[1])\n"
        "from pathlib import Path\n"
        "from test_plan_cases import load_case, run_case\n"
        "from llmgw.planning import outputs\n"
        "plan = run_case(load_case(Path(sys.argv[2])))[0]\n"
        "sys.stdout.write(outputs.json_text(plan) + outputs.text(plan))\n"
    )
    results = set()
    for seed in ("1", "2", "3"):
        done = subprocess.run(
            [sys.executable, "-c", script, str(Path(__file__).parent), str(SCENARIO)],
            capture_output=True, text=True, timeout=120,
            env={**os.environ, "PYTHONHASHSEED": seed},
        )
        assert done.returncode == 0, done.stderr
        results.add(done.stdout)
    assert len(results) == 1


def test_markdown_is_bounded_and_says_what_it_left_out() -> None:
    nodes = {f"l40s-{i:03d}": {"address": f"10.1.{i // 200}.{i % 200 + 1}",
                               "gpus": [{"class": "l40s-45g", "count": 4}]}
             for i in range(300)}
    models = {f"model-{i:03d}": {"source": f"org/model-{i:03d}", "scaling": {"min": 3, "max": 3},
                                 "profiles": [{"engine": "vllm", "gpu_class": "l40s-45g",
                                               "tensor_parallel": 2}]}
              for i in range(250)}
    cluster = cluster_from({"nodes": nodes, "models": models})
    plan = plans.plan(cluster, fleet_from(cluster, {}, [], 0.0), 0.0)
    assert len(plan.changes) == 600 and plan.unplaceable
    full = outputs.text(plan)
    assert len(full) > 2 * outputs.MARKDOWN_LIMIT
    comment = outputs.markdown(plan)
    assert len(comment) <= outputs.MARKDOWN_LIMIT
    assert comment.index("| model |") < comment.index("<details>")  # summary table first
    assert "**GPUs by class**" in comment
    assert "more models left out to stay under 60,000 characters" in comment
    small = outputs.markdown(plan, limit=8_000)
    assert len(small) <= 8_000 and "more rows: run `llmgw plan`" in small


def test_no_changes_says_whether_the_fleet_matches() -> None:
    cases = Path(__file__).parent / "cases"
    stuck = run_case(load_case(next(cases.glob("48-*.yaml"))))[0]
    assert not stuck.changes and stuck.unplaceable
    assert ("No changes can be made, and the fleet does not match the cluster: replicas "
            "cannot be placed (see below).") in outputs.text(stuck)


def test_markdown_names_each_replace_strategy() -> None:
    cases = Path(__file__).parent / "cases"
    destroy_first = outputs.markdown(run_case(load_case(next(cases.glob("21-*.yaml"))))[0])
    create_first = outputs.markdown(run_case(load_case(next(cases.glob("22-*.yaml"))))[0])
    assert "| replace: destroy, then create |" in destroy_first
    assert "| replace: create before destroy |" in create_first


@pytest.mark.parametrize(
    ("indices", "text"),
    [((), "-"), ((3,), "3"), ((0, 1, 2, 3), "0-3"), ((0, 2, 3, 7), "0,2-3,7")],
)
def test_gpu_list(indices: tuple[int, ...], text: str) -> None:
    assert outputs.gpu_list(indices) == text


def test_reasons_fold_per_node() -> None:
    reasons = [("", "fabric ib-a: 1 node fits, needs 2"), ("a", "cordoned"), ("b", "cordoned"),
               ("c", "cordoned"), ("d", "cordoned"), ("e", "no GPUs")]
    assert outputs.group_reasons(reasons) == [
        "fabric ib-a: 1 node fits, needs 2", "a, b, c (+1 more): cordoned", "e: no GPUs",
    ]


HOSTILE_VALUE = "\x1b[2J\x1b]52;c;cHduZWQ=\x07\rok\n```\n![pwned](https://example.invalid/x.png)"


def test_control_characters_in_reasons_are_shown_escaped() -> None:
    """An engine argument from a pull request cannot clear the operator's terminal, write
    their clipboard, hide a line behind a CR, or close a Markdown fence in the comment."""
    cluster = cluster_from({
        "nodes": {"cpu-01": {"address": "10.0.0.1", "memory": "64GiB",
                             "weights_dirs": ["/models"]}},
        "models": {"m": {"source": "/models/m.gguf", "profiles": [
            {"engine": "llama.cpp", "cpu": True, "args": {"chat-template": HOSTILE_VALUE}}]}},
    })
    now = 1_700_000_000.0
    fleet = fleet_from(cluster, {}, [{"model": "m", "replica": 0, "on": {"cpu-01": []},
                                      "applied": {"profiles.0.args.chat-template": "old"}}], now)
    plan = plans.plan(cluster, fleet, now)
    assert any(HOSTILE_VALUE in r for c in plan.changes for r in c.reasons)
    text = outputs.text(plan)
    markdown = outputs.markdown(plan)
    for rendered in (text, markdown):
        assert "\x1b" not in rendered and "\r" not in rendered and "\x07" not in rendered
    assert "\\x1b[2J\\x1b]52;c;cHduZWQ=\\x07\\rok\\n```\\n![pwned](https://" in text
    # In the comment: no line of the value's own, no image, and the fences are llmgw's.
    [row] = [line for line in markdown.splitlines() if line.startswith("| `+/-` | m |")]
    assert "\\x07\\rok \\`\\`\\` !\\[pwned\\](https://" in row
    fences = [line for line in markdown.splitlines() if line.lstrip().startswith("```")]
    assert fences == ["```text", "```"] * (len(fences) // 2)
    # JSON keeps the value exactly (escaped by JSON itself).
    assert HOSTILE_VALUE in json.loads(outputs.json_text(plan))["changes"][0]["reasons"][0]
