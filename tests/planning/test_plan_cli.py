"""``llmgw plan`` as operators and CI run it: real processes, real files."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from plan_builders import apply
from ruamel.yaml import YAML

from llmgw.cli import plan_cmd
from llmgw.planning import plans
from llmgw.spec import loading

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "cluster.example"
SNAPSHOT = EXAMPLE / "fleet-snapshot.json"
SECRET = "s3cr3t-hf_9f8e7d6c5b4a-do-not-print"


def llmgw(*args: str, env: dict[str, str] | None = None,
          cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "llmgw", *args], capture_output=True, text=True, timeout=120,
        env={**os.environ, **(env or {})}, cwd=cwd or REPO,
    )


def test_example_snapshot_is_current() -> None:
    """The shipped snapshot is what tests/planning/example_snapshot.py writes today."""
    sys.path.insert(0, str(Path(__file__).parent))
    import example_snapshot

    assert SNAPSHOT.read_text() == example_snapshot.render(), (
        "cluster.example/fleet-snapshot.json is stale: run "
        ".venv/bin/python tests/planning/example_snapshot.py > "
        "cluster.example/fleet-snapshot.json"
    )


def test_example_plan_in_every_format(tmp_path: Path) -> None:
    text = llmgw("plan", "--cluster", str(EXAMPLE), "--observed", str(SNAPSHOT))
    assert text.returncode == 0, text.stderr
    assert text.stdout.rstrip().endswith(
        "Plan: 0 to create, 2 to replace, 1 to destroy, 1 to restart.")
    assert "args changed: max-model-len 4096 → 8192" in text.stdout
    markdown = llmgw("plan", "--cluster", str(EXAMPLE), "--observed", str(SNAPSHOT),
                     "--format", "markdown")
    assert markdown.stdout.startswith("### llmgw plan for `lab`")
    out = tmp_path / "plan.json"
    written = llmgw("plan", "--cluster", str(EXAMPLE), "--observed", str(SNAPSHOT),
                    "--format", "json", "--out", str(out))
    assert written.returncode == 0 and written.stdout == ""
    assert "Written to" in written.stderr
    data = json.loads(out.read_text())
    assert data["format_version"] == 1 and data["summary"]["replace"] == 2


def test_detailed_exitcode(tmp_path: Path) -> None:
    changes = llmgw("plan", "--cluster", str(EXAMPLE), "--observed", str(SNAPSHOT),
                    "--detailed-exitcode")
    assert changes.returncode == 2, changes.stderr
    # The same fleet after the plan ran: nothing left to do.
    cluster = loading.load(EXAMPLE)
    fleet = plan_cmd.read_snapshot(SNAPSHOT)
    now = plan_cmd.snapshot_time(fleet)
    settled = apply(fleet, plans.plan(cluster, fleet, now), now)
    settled_path = tmp_path / "settled.json"
    settled_path.write_text(settled.model_dump_json(indent=2))
    quiet = llmgw("plan", "--cluster", str(EXAMPLE), "--observed", str(settled_path),
                  "--detailed-exitcode")
    assert quiet.returncode == 0, quiet.stdout + quiet.stderr
    assert "No changes: the fleet matches the cluster." in quiet.stdout
    broken = llmgw("plan", "--cluster", str(tmp_path / "nowhere"), "--observed",
                   str(SNAPSHOT), "--detailed-exitcode")
    assert broken.returncode == 1


def test_unplaceable_replicas_are_in_every_summary_and_exit_3(tmp_path: Path) -> None:
    """A model that fits nowhere never reads as "No changes" with a green exit code."""
    cluster_dir = tmp_path / "cluster"
    cluster_dir.mkdir()
    for path in EXAMPLE.glob("*.yaml"):
        (cluster_dir / path.name).write_text(path.read_text())
    (cluster_dir / "known_hosts").write_text((EXAMPLE / "known_hosts").read_text())
    (cluster_dir / "huge.yaml").write_text(
        "models:\n  huge-cpu:\n    source: /models/huge.gguf\n    profiles:\n"
        "      - {engine: llama.cpp, cpu: true, min_memory_gb: 60000}\n"
    )
    cluster = loading.load(cluster_dir)
    fleet = plan_cmd.read_snapshot(SNAPSHOT)
    now = plan_cmd.snapshot_time(fleet)
    settled_path = tmp_path / "settled.json"
    settled_path.write_text(apply(fleet, plans.plan(cluster, fleet, now), now)
                            .model_dump_json(indent=2))
    summary = "Plan: 0 to create, 0 to replace, 0 to destroy. 1 replica cannot be placed."

    text = llmgw("plan", "--cluster", str(cluster_dir), "--observed", str(settled_path),
                 "--detailed-exitcode")
    assert text.returncode == 3, text.stdout + text.stderr
    assert text.stdout.rstrip().endswith(summary)
    assert "No changes: the fleet matches the cluster." not in text.stdout
    assert "No changes can be made, and the fleet does not match the cluster" in text.stdout
    markdown = llmgw("plan", "--cluster", str(cluster_dir), "--observed", str(settled_path),
                     "--format", "markdown", "--detailed-exitcode")
    assert markdown.returncode == 3
    assert markdown.stdout.splitlines()[2] == f"**{summary}**"
    as_json = llmgw("plan", "--cluster", str(cluster_dir), "--observed", str(settled_path),
                    "--format", "json", "--detailed-exitcode")
    assert as_json.returncode == 3
    data = json.loads(as_json.stdout)["summary"]
    assert data["text"] == summary and data["unplaceable"] == 1
    # Changes as well: still 3, so CI never shows green while a replica has no home.
    both = llmgw("plan", "--cluster", str(cluster_dir), "--observed", str(SNAPSHOT),
                 "--detailed-exitcode")
    assert both.returncode == 3
    assert both.stdout.rstrip().endswith(
        "Plan: 0 to create, 2 to replace, 1 to destroy, 1 to restart. "
        "1 replica cannot be placed.")


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "no such file (write one with `llmgw inventory --json`)"),
        ("{not json", "not a fleet snapshot:"),
        ('{"nodes": {"gpu-a-01": {"node": "gpu-a-01", "gpus": [{"index": "x"}]}}}',
         "nodes.gpu-a-01.gpus.0.index: Input should be a valid integer"),
        ('{"format_version": 99, "nodes": {}}', "format_version 99 is newer than this llmgw"),
    ],
)
def test_bad_snapshots_are_explained(tmp_path: Path, content: str | None, message: str) -> None:
    path = tmp_path / "fleet.json"
    if content is not None:
        path.write_text(content)
    result = llmgw("plan", "--cluster", str(EXAMPLE), "--observed", str(path))
    assert result.returncode == 1
    assert message in result.stderr
    assert "Traceback" not in result.stderr


def test_bad_cluster_is_explained_with_locations(tmp_path: Path) -> None:
    (tmp_path / "cluster.yaml").write_text("cluster:\n  name: lab\n  sync: sometimes\n")
    result = llmgw("plan", "--cluster", str(tmp_path), "--observed", str(SNAPSHOT))
    assert result.returncode == 1
    assert f"{tmp_path}/cluster.yaml:3:" in result.stderr or "cluster.yaml:3:" in result.stderr
    assert "Traceback" not in result.stderr


def _write_yaml(path: Path, data: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as out:
        YAML().dump(data, out)


def test_secret_values_never_appear_in_any_output(tmp_path: Path) -> None:
    """Secrets are paths in a plan; the values stay in their files, wherever they are."""
    secret_file = tmp_path / "hf_token"
    secret_file.write_text(SECRET + "\n")
    cluster_dir = tmp_path / "cluster"
    data = YAML(typ="safe").load((EXAMPLE / "models.yaml").read_text())
    for model in data["models"].values():
        for profile in model["profiles"]:
            profile["secret_env"] = {"HF_TOKEN": str(secret_file),
                                     "OPENAI_API_KEY": str(secret_file)}
    _write_yaml(cluster_dir / "models.yaml", data)
    for name in ("cluster.yaml", "nodes.yaml", "known_hosts"):
        (cluster_dir / name).write_text((EXAMPLE / name).read_text())
    fleet = json.loads(SNAPSHOT.read_text())
    # A secret in the environment of the process that plans must not leak either.
    env = {"HF_TOKEN": SECRET, "OPENAI_API_KEY": SECRET}
    outputs = []
    for fmt in ("text", "markdown", "json"):
        result = llmgw("plan", "--cluster", str(cluster_dir), "--observed", str(SNAPSHOT),
                       "--format", fmt, env=env)
        assert result.returncode == 0, result.stderr
        outputs.append(result.stdout + result.stderr)
    written = tmp_path / "plan.json"
    llmgw("plan", "--cluster", str(cluster_dir), "--observed", str(SNAPSHOT), "--format",
          "json", "--out", str(written), env=env)
    outputs.append(written.read_text())
    assert fleet  # the snapshot itself holds no secret: it is what agents report
    for output in outputs:
        assert SECRET not in output
    # The paths are there: the plan does tell which file each secret comes from.
    assert str(secret_file) in outputs[2]
    plan = json.loads(outputs[3])
    rendered = [s for c in plan["changes"] for s in c["shards"]]
    assert rendered and all(SECRET not in s["unit_text"] + s["env_text"] for s in rendered)
    assert all(s["secret_env"] == {"HF_TOKEN": str(secret_file),
                                   "OPENAI_API_KEY": str(secret_file)} for s in rendered)


@pytest.mark.timeout(180)
def test_live_plan_over_ssh(sim_cluster: Any) -> None:
    """Without --observed, `llmgw plan` asks real agents over real SSH."""
    sim = sim_cluster(3)  # node-01 h100-ib, node-02 l40s-nofabric, node-03 cpu-only
    models = {
        "llama-8b": {"source": "meta-llama/Llama-3.1-8B-Instruct",
                     "profiles": [{"engine": "vllm", "gpu_class": "l40s-45g"}]},
        "gemma-cpu": {"source": "/models/gemma.gguf",
                      "profiles": [{"engine": "llama.cpp", "cpu": True, "min_memory_gb": 1}]},
    }
    directory = sim.write_cluster({"models": models})
    result = llmgw("plan", "--cluster", str(directory), "--format", "json",
                   "--detailed-exitcode")
    assert result.returncode == 2, result.stdout + result.stderr
    data = json.loads(result.stdout)
    where = {c["model"]: [s["node"] for s in c["shards"]] for c in data["changes"]}
    assert where == {"llama-8b": ["node-02"], "gemma-cpu": ["node-03"]}
    assert all(n["reachable"] for n in data["nodes"])
