"""The CI preview workflow (``.github/workflows/llmgw-plan.yml``) really plans.

The plan step's own ``run:`` script is executed with bash the way GitHub
Actions runs it (``bash --noprofile --norc -eo pipefail``, the workflow's,
job's and step's ``env:`` merged, ``GITHUB_OUTPUT`` and
``GITHUB_STEP_SUMMARY`` files), with the cluster directory and snapshot
pointed at ``cluster.example`` and its fleet snapshot, and the venv's
``llmgw`` on PATH. The comment step's script runs under node against a
stand-in for GitHub's REST API, which cannot exist here.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from ruamel.yaml import YAML

ROOT = Path(__file__).resolve().parents[2]
WORKFLOW = ROOT / ".github" / "workflows" / "llmgw-plan.yml"
EXAMPLE = ROOT / "cluster.example"
SNAPSHOT = EXAMPLE / "fleet-snapshot.json"
VENV_BIN = Path(sys.executable).parent


def load_workflow() -> dict[str, Any]:
    data: dict[str, Any] = YAML(typ="safe").load(WORKFLOW.read_text())
    return data


def job() -> dict[str, Any]:
    jobs = load_workflow()["jobs"]
    assert list(jobs) == ["plan"], "the workflow has one job, `plan`"
    found: dict[str, Any] = jobs["plan"]
    return found


def step(step_id: str) -> dict[str, Any]:
    for candidate in job()["steps"]:
        if candidate.get("id") == step_id:
            return dict(candidate)
    raise AssertionError(f"no step with id {step_id!r} in {WORKFLOW}")


def comment_step() -> dict[str, Any]:
    for candidate in job()["steps"]:
        if str(candidate.get("uses", "")).startswith("actions/github-script@"):
            return dict(candidate)
    raise AssertionError(f"no actions/github-script step in {WORKFLOW}")


def run_plan_step(workdir: Path, cluster_dir: Path, snapshot: Path) -> tuple[int, str, Path]:
    """Run the plan step's script as Actions would; (exit status, stderr, plan file)."""
    plan = step("plan")
    env = {**load_workflow().get("env", {}), **job().get("env", {}), **plan.get("env", {})}
    assert {"CLUSTER_DIR", "SNAPSHOT", "PLAN_MD"} <= set(env), \
        "the plan step reads CLUSTER_DIR and SNAPSHOT and writes PLAN_MD"
    env.update(CLUSTER_DIR=str(cluster_dir), SNAPSHOT=str(snapshot))
    script = workdir / "plan-step.sh"
    script.write_text(plan["run"])
    outputs, summary = workdir / "github_output", workdir / "step_summary"
    outputs.touch()
    summary.touch()
    result = subprocess.run(
        ["bash", "--noprofile", "--norc", "-eo", "pipefail", str(script)],
        cwd=workdir, capture_output=True, text=True, timeout=120,
        env={
            "PATH": f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '/usr/bin:/bin')}",
            "HOME": str(workdir), "LANG": "C.UTF-8",
            "GITHUB_OUTPUT": str(outputs), "GITHUB_STEP_SUMMARY": str(summary),
            **{k: str(v) for k, v in env.items()},
        },
    )
    return result.returncode, result.stderr, workdir / str(env["PLAN_MD"])


def step_outputs(workdir: Path) -> dict[str, str]:
    lines = (workdir / "github_output").read_text().splitlines()
    return dict(line.split("=", 1) for line in lines if "=" in line)


def expected_summary() -> str:
    """The summary line, from llmgw's JSON plan of the same inputs (not hard-coded)."""
    out = subprocess.run(
        [str(VENV_BIN / "llmgw"), "plan", "--cluster", str(EXAMPLE), "--observed",
         str(SNAPSHOT), "--format", "json"],
        capture_output=True, text=True, check=True, timeout=120,
    ).stdout
    text: str = json.loads(out)["summary"]["text"]
    return text


def test_the_workflow_previews_pull_requests_that_touch_the_cluster() -> None:
    workflow = load_workflow()
    assert "pull_request" in workflow["on"]
    assert "cluster/**" in workflow["on"]["pull_request"]["paths"]
    assert workflow["permissions"]["pull-requests"] == "write"
    steps = job()["steps"]
    ids = [s.get("id") for s in steps]
    fetch = next(s for s in steps if "/api/v1/fleet" in s.get("run", ""))
    assert '"$SNAPSHOT"' in fetch["run"], "the fetch step writes the file the plan step reads"
    # The token is given to the fetch step alone, never to a step that runs llmgw.
    holders = [s.get("name") for s in steps if "LLMGW_ADMIN_TOKEN" in json.dumps(s)]
    assert holders == [fetch["name"]]
    assert steps.index(fetch) < ids.index("plan") < steps.index(comment_step())
    assert "steps.plan.outputs.exitcode" in comment_step()["if"]


def test_plan_step_writes_the_markdown_plan_and_treats_changes_as_success(
    tmp_path: Path,
) -> None:
    status, stderr, plan_md = run_plan_step(tmp_path, EXAMPLE, SNAPSHOT)
    assert status == 0, stderr
    assert step_outputs(tmp_path)["exitcode"] == "2"  # the example fleet has changes
    lines = plan_md.read_text().splitlines()
    assert lines[0] == "### llmgw plan for `lab`"
    assert lines[2] == f"**{expected_summary()}**"
    assert "| `+/-` | llama-3.1-8b | r0 |" in plan_md.read_text()
    assert (tmp_path / "step_summary").read_text() == plan_md.read_text()


def test_plan_step_exits_zero_when_nothing_would_change(tmp_path: Path) -> None:
    cluster = tmp_path / "cluster"
    cluster.mkdir()
    (cluster / "cluster.yaml").write_text("cluster:\n  name: empty\n")
    snapshot = tmp_path / "fleet.json"
    snapshot.write_text(json.dumps({"format_version": 1, "nodes": {}}))
    status, stderr, plan_md = run_plan_step(tmp_path, cluster, snapshot)
    assert status == 0, stderr
    assert step_outputs(tmp_path)["exitcode"] == "0"
    text = plan_md.read_text()
    assert text.startswith("### llmgw plan for `empty`")
    assert "No changes" in text


def test_plan_step_fails_with_the_error_in_the_comment(tmp_path: Path) -> None:
    cluster = tmp_path / "cluster"
    shutil.copytree(EXAMPLE, cluster)
    models = cluster / "models.yaml"
    models.write_text(models.read_text().replace("scaling: {min: 1, max: 2}",
                                                 "scaling: {min: 3, max: 2}", 1))
    status, _, plan_md = run_plan_step(tmp_path, cluster, SNAPSHOT)
    assert status != 0
    assert step_outputs(tmp_path)["exitcode"] == "1"
    text = plan_md.read_text()
    assert text.startswith("### llmgw plan failed")
    assert "models.yaml:" in text and "min 3 is greater than max 2" in text


def test_plan_step_fails_when_replicas_cannot_be_placed_and_keeps_the_plan(
    tmp_path: Path,
) -> None:
    """Exit 3: the job goes red, and the comment is the plan itself, saying why."""
    cluster = tmp_path / "cluster"
    shutil.copytree(EXAMPLE, cluster)
    (cluster / "huge.yaml").write_text(
        "models:\n  huge-cpu:\n    source: /models/huge.gguf\n    profiles:\n"
        "      - {engine: llama.cpp, cpu: true, min_memory_gb: 60000}\n"
    )
    status, stderr, plan_md = run_plan_step(tmp_path, cluster, SNAPSHOT)
    assert status != 0
    assert step_outputs(tmp_path)["exitcode"] == "3"
    lines = plan_md.read_text().splitlines()
    assert lines[0] == "### llmgw plan for `lab`"
    assert lines[2].endswith(" 1 replica cannot be placed.**")
    assert "| `!` | huge-cpu | r0 | cannot be placed |" in plan_md.read_text()
    assert (tmp_path / "step_summary").read_text() == plan_md.read_text()


def test_plan_step_refuses_an_alias_bomb_from_a_pull_request_with_its_place(
    tmp_path: Path,
) -> None:
    """A stranger's pull request adds nine levels of nine aliases (9⁹ values): the
    preview stops at the alias that crosses the bound and says where."""
    cluster = tmp_path / "cluster"
    shutil.copytree(EXAMPLE, cluster)
    bomb = ROOT / "tests" / "spec" / "broken" / "bound-alias-bomb" / "cluster.yaml"
    (cluster / "zz-bomb.yaml").write_text(
        bomb.read_text().replace("cluster:\n  name: lab\n  x:\n", "x:\n")
    )
    status, _, plan_md = run_plan_step(tmp_path, cluster, SNAPSHOT)
    assert status != 0
    assert step_outputs(tmp_path)["exitcode"] == "1"
    text = plan_md.read_text()
    assert text.startswith("### llmgw plan failed")
    assert "zz-bomb.yaml:8:14: alias *l4 (66,430 values) expands the file past 100,000 " \
        "values" in text


COMMENT_HARNESS = r"""
const script = require('fs').readFileSync(process.argv[2], 'utf8');
const existing = JSON.parse(process.argv[3]);
const calls = [];
const github = {
  paginate: async (fn, args) => { calls.push(['list', args]); return existing; },
  rest: { issues: {
    listComments: 'listComments',
    createComment: async (args) => { calls.push(['create', args]); },
    updateComment: async (args) => { calls.push(['update', args]); },
  } },
};
const context = { repo: { owner: 'acme', repo: 'infra' }, issue: { number: 7 } };
const AsyncFunction = Object.getPrototypeOf(async function () {}).constructor;
new AsyncFunction('github', 'context', 'require', script)(github, context, require)
  .then(() => console.log(JSON.stringify(calls)))
  .catch((e) => { console.error(e); process.exit(1); });
"""


@pytest.mark.skipif(shutil.which("node") is None, reason="node is not installed")
@pytest.mark.parametrize(("existing", "expected"), [
    pytest.param([], ("create", None), id="first-push-creates"),
    pytest.param([{"id": 11, "user": {"type": "User"}, "body": "<!-- llmgw-plan -->\nquoted"},
                  {"id": 12, "user": {"type": "Bot"}, "body": "<!-- llmgw-plan -->\nold"}],
                 ("update", 12), id="later-push-updates-its-own"),
])
def test_comment_step_creates_one_comment_and_then_updates_it(
    tmp_path: Path, existing: list[dict[str, Any]], expected: tuple[str, int | None],
) -> None:
    (tmp_path / "plan.md").write_text("### llmgw plan for `lab`\n")
    script = tmp_path / "comment.js"
    script.write_text(comment_step()["with"]["script"])
    harness = tmp_path / "harness.js"
    harness.write_text(COMMENT_HARNESS)
    result = subprocess.run(
        ["node", str(harness), str(script), json.dumps(existing)], cwd=tmp_path,
        capture_output=True, text=True, timeout=60,
        env={**os.environ, **job()["env"], "PLAN_MD": str(tmp_path / "plan.md")},
    )
    assert result.returncode == 0, result.stderr
    calls = json.loads(result.stdout)
    writes = [c for c in calls if c[0] != "list"]
    assert len(writes) == 1
    action, args = writes[0]
    assert action == expected[0]
    assert args["body"] == "<!-- llmgw-plan -->\n### llmgw plan for `lab`\n"
    if expected[1] is not None:
        assert args["comment_id"] == expected[1]
    else:
        assert args["issue_number"] == 7
