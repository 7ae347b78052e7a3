"""A day of edits applied over real sshd nodes, then told back by ``llmgw history``.

Create a model, change its args (a replace), make a change whose engine fails
(the test engine exits at once: the replace fails and the old replica serves
on), then remove the model. The journal must tell that story in order, with
each outcome, and never hold a secret: neither the secret's value nor its path.
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from support import engines as engines_support
from support import nodes
from support.engines import running
from support.plugin import SimClusterFactory

from llmgw.cli.main import main

MARKER = "journal-secret-7f3a9c"


def apply(directory: Path, capsys: pytest.CaptureFixture[str],
          ready_timeout: str = "60s") -> tuple[int, str]:
    code = main(["apply", "--cluster", str(directory), "--auto-approve", "--ready-timeout",
                 ready_timeout])
    captured = capsys.readouterr()
    return code, captured.out + captured.err


def history(directory: Path, capsys: pytest.CaptureFixture[str], *flags: str) -> str:
    assert main(["history", "--cluster", str(directory), *flags]) == 0
    return capsys.readouterr().out


def commit(directory: Path, message: str) -> str:
    """Commit the cluster directory as an operator would; the new revision."""
    git = ["git", "-C", str(directory), "-c", "user.email=ops@example.com", "-c",
           "user.name=ops"]
    if not (directory / ".git").exists():
        subprocess.run([*git, "init", "-q"], check=True)
        (directory / ".gitignore").write_text("llmgw.db*\nadmin.token\n")
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-qm", message], check=True)
    return subprocess.run([*git, "rev-parse", "--short=12", "HEAD"], check=True,
                          capture_output=True, text=True).stdout.strip()


def tiny(args: dict[str, Any], secret: Path, **unchecked: Any) -> dict[str, Any]:
    profile = {"engine": "llama.cpp", "cpu": True, "min_memory_gb": 1, "args": args,
               "secret_env": {"HF_TOKEN": str(secret)}}
    if unchecked:  # the test engine's own flags: llama-server has no such options
        profile["unchecked_args"] = {k.replace("_", "-"): v for k, v in unchecked.items()}
    return engines_support.recording({"tiny": {"source": "/models/tiny.gguf",
                                               "profiles": [profile]}})


@pytest.mark.timeout(180)
def test_history_tells_a_day_of_edits_in_order(
    sim_cluster: SimClusterFactory, engines: Path, tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    sim: nodes.SimCluster = sim_cluster(1, hardware=("cpu-only",))
    morning, noon = tmp_path / "token-a", tmp_path / "token-b"
    for path in (morning, noon):
        path.write_text(MARKER + "\n")

    directory = sim.write_cluster({"models": tiny({"ctx-size": 2048}, morning)})
    revisions = [commit(directory, "tiny: first replica")]
    code, out = apply(directory, capsys)
    assert code == 0, out
    first_pid = running(engines)["tiny"]["pid"]

    # Args (and the secret's file) change: the replica is replaced.
    sim.write_cluster({"models": tiny({"ctx-size": 4096}, noon)})
    revisions.append(commit(directory, "tiny: longer context, new token file"))
    code, out = apply(directory, capsys)
    assert code == 0, out
    assert running(engines)["tiny"]["pid"] != first_pid

    # A change whose engine fails to start: the replace fails, the old replica stays.
    serving = running(engines)["tiny"]["pid"]
    sim.write_cluster({"models": tiny({"ctx-size": 4096}, noon, exit_after=0,
                                      exit_code=3)})
    revisions.append(commit(directory, "tiny: a flag that breaks it"))
    # The agent restarts an engine that exits, so the apply gives up at its timeout.
    code, out = apply(directory, capsys, ready_timeout="5s")
    assert code == 1, out
    assert "not written to the journal" not in out and "FAILED" in out, out
    assert running(engines)["tiny"]["pid"] == serving

    # The model goes away.
    sim.write_cluster({"models": {}})
    revisions.append(commit(directory, "tiny: retired"))
    code, out = apply(directory, capsys)
    assert code == 0, out
    deadline = time.monotonic() + 30  # the agent stops the unit; its process may linger
    while "tiny" in running(engines):
        assert time.monotonic() < deadline, out
        time.sleep(0.1)

    entries = json.loads(history(directory, capsys, "--json"))
    story = [(e["started_by"].split("@")[0] != "daemon",
              [(c["action"], c["model"], c["outcome"]) for c in e["changes"]])
             for e in reversed(entries)]
    assert [changes for _, changes in story] == [
        [("create", "tiny", "ok")],
        [("replace", "tiny", "ok")],
        [("replace", "tiny", "failed")],
        [("destroy", "tiny", "ok")] * 2,  # the serving replica and the failed one's unit
    ]
    assert [e["revision"] for e in reversed(entries)] == revisions
    assert all(by_hand for by_hand, _ in story)  # `llmgw apply`, not the daemon
    assert all("@" in e["started_by"] for e in entries)
    failed = entries[1]
    assert failed["outcome"] == "failed"
    assert "main process exited with status 3" in failed["changes"][0]["error"]
    assert "ctx-size 2048 → 4096" in entries[2]["changes"][0]["why"]
    assert all(c["nodes"] == ["node-01"] for e in entries for c in e["changes"])
    assert [e["started_at"] for e in entries] == sorted(
        (e["started_at"] for e in entries), reverse=True)

    table = history(directory, capsys)
    with capsys.disabled():
        print(table)  # docs/history.md shows this output (pytest -s)
        print(json.dumps(entries[1], indent=2, ensure_ascii=False))
    lines = table.splitlines()
    assert lines[0].split()[:2] == ["WHEN", "(UTC)"]
    assert [line.split()[4:6] for line in lines[1:]] == [
        ["create", "tiny"], ["replace", "tiny"], ["replace", "tiny"], ["destroy", "tiny"],
        ["destroy", "tiny"]]
    assert lines[3].rstrip().split("  ")[-1].startswith("failed: ")
    assert "replace tiny r0 → r1 on node-01" in lines[2]  # who replaced whom
    assert [line.split()[2] for line in lines[1:]] == [*revisions, revisions[-1]]
    assert history(directory, capsys, "--model", "other") == "No applies recorded yet.\n"
    assert len(json.loads(history(directory, capsys, "--json", "--limit", "2"))) == 2

    # No secret anywhere in the journal: not the value, not the file it is read from.
    dump = "\n".join(sqlite3.connect(directory / "llmgw.db").iterdump())
    for text in (dump, table, json.dumps(entries)):
        assert MARKER not in text
        assert str(morning) not in text and str(noon) not in text
