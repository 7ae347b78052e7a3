"""``llmgw apply`` with a rollout gate: real sshd nodes, real agents, real engine processes.

``tiny`` has a gate whose probe must answer within 2 s. A change that makes
its engine answer in 5 s (the test engine's ``--response-delay``) becomes
Ready — readiness does not ask for an answer — but fails its probe: ``llmgw
apply`` removes the new engine, leaves the old one untouched, holds the model,
exits 1, and the next apply and plan say it is held. ``--retry`` releases it
(``sync: manual``: and applies again: held again). A commit that changes the
model releases the hold, and a good change passes the gate.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from support import engines as engines_support
from support.engines import MODELS, alive, running
from support.plugin import SimClusterFactory

from llmgw.cli.main import main

GATED = json.loads(json.dumps(MODELS))
GATED["tiny"]["rollout"] = {"probe": {"timeout": "2s"}, "bake": "0s"}
REASON = "probe failed: no answer within 2 s"


def write(sim: Any, models: dict[str, Any]) -> Path:
    return sim.write_cluster({"models": engines_support.recording(models)})


def delayed(seconds: float) -> dict[str, Any]:
    models = json.loads(json.dumps(GATED))
    models["tiny"]["profiles"][0]["unchecked_args"] = {"response-delay": seconds}
    return models


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    code = main(list(args))
    captured = capsys.readouterr()
    return code, captured.out + captured.err


def tinies(engines: Path) -> list[int]:
    return [data["pid"] for name, data in alive(engines) if name == "tiny"]


def test_apply_probes_rolls_back_holds_and_retries(
    sim_cluster: SimClusterFactory, engines: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    sim = sim_cluster(2, hardware=("h100-ib", "cpu-only"))
    directory = write(sim, GATED)
    apply = ("apply", "--cluster", str(directory), "--auto-approve", "--ready-timeout", "60s")
    code, out = run(capsys, *apply)
    assert code == 0, out
    old = running(engines)["tiny"]["pid"]

    # A slow engine is Ready, fails its probe, and is rolled back; the old one serves on.
    write(sim, delayed(5))
    code, out = run(capsys, *apply)
    assert code == 1, out
    assert any("rolled back" in line and line.endswith(REASON) for line in out.splitlines())
    assert f"failed its gate: {REASON}" in out
    assert "the replica it replaces keeps running" in out
    assert "tiny held: spec " in out and f"failed its gate: {REASON}" in out
    assert tinies(engines) == [old]

    # Held: the next apply and the plan leave it alone and say so.
    code, out = run(capsys, *apply)
    assert code == 0, out
    assert "Plan: 0 to create, 0 to replace, 0 to destroy. 1 model held" in out
    assert tinies(engines) == [old]
    code, out = run(capsys, "plan", "--cluster", str(directory), "--format", "json")
    (held,) = json.loads(out)["holds"]
    assert (held["model"], held["reason"]) == ("tiny", REASON)

    # --retry releases it; under sync: manual the apply goes on, fails, holds again.
    code, out = run(capsys, *apply, "--retry", "tiny")
    assert code == 1, out
    assert "released tiny (held: spec " in out
    assert "Plan: 0 to create, 1 to replace, 0 to destroy." in out
    assert f"failed its gate: {REASON}" in out
    assert tinies(engines) == [old]
    code, out = run(capsys, *apply, "--retry", "nothing-like-it")
    assert code != 0 and "--retry: no model 'nothing-like-it' in the cluster" in out

    # A change to the model releases the hold; a fast enough engine passes the gate.
    write(sim, delayed(0.2))
    code, out = run(capsys, *apply)
    assert code == 0, out
    assert "Plan: 0 to create, 1 to replace, 0 to destroy." in out
    assert "promoted" in out and "not baked" not in out
    (new,) = tinies(engines)
    assert new != old
    code, out = run(capsys, "history", "--cluster", str(directory), "--json")
    entries = json.loads(out)
    gates = [c["gate"] for e in entries for c in e["changes"] if c["model"] == "tiny"]
    assert gates[0].startswith("passed: probe answered 200")
    # Newest first: each failed apply and its rollback entry, twice; then the create.
    assert gates[1:] == [f"failed: {REASON}"] * 4 + [None]
    assert [e["rollback_of"] for e in entries][1:5] == [entries[2]["id"], None,
                                                        entries[4]["id"], None]
