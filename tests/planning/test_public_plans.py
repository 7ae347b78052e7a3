"""What a public plan may contain: no secret, engine output in the comment only when asked,
no ``@mention`` that pings anyone.

The attacks of issue 23: an engine's error line carrying an ``hf_`` token appeared
verbatim in ``--format markdown`` (the comment CI posts) and in every other format; a
secret in a running unit's old args was quoted by the reason that replaced it; an
``@mention`` in free text passed into the comment and would ping its owner.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from plan_builders import cluster_from, fleet_from

from llmgw.cli.main import main
from llmgw.planning import outputs, plans
from llmgw.planning.types import Plan

NOW = 1_700_000_000.0
HF = "hf_" + "Ab3dEfGh1jKlMnOpQrStUvWxYz0123456"
OPENAI = "sk-" + "Ab3dEf0123456789ghIJklMNopQR"
GITHUB = "ghp_" + "Ab3dEfGh1jKlMnOpQrStUvWxYz0123456789"
AWS = "AKIA" + "IOSFODNN7EXAMPLE"
JWT = ("eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0."
       "SflKxwRJSMeKKF2QT4fwpMeJf36POk6yJV_adQssw5c")
ERROR = "OSError: 401 Client Error for https://huggingface.co/api/models: token {} is invalid"

CLUSTER = {
    "nodes": {"cpu-01": {"address": "10.0.0.1", "memory": "64GiB", "weights_dirs": ["/models"]}},
    "models": {"gemma": {"source": "/models/gemma.gguf",
                         "profiles": [{"engine": "llama.cpp", "cpu": True}]}},
}
FORMATS: dict[str, Callable[[Plan], str]] = {
    "text": outputs.text,
    "json": outputs.json_text,
    "markdown": outputs.markdown,
    "markdown --engine-output": lambda plan: outputs.markdown(plan, engine_output=True),
}


def _plan(running: dict[str, Any], cluster: dict[str, Any] | None = None) -> Plan:
    spec = cluster_from(cluster or CLUSTER)
    fleet = fleet_from(spec, None, [{"model": "gemma", "replica": 0, "on": {"cpu-01": []},
                                     **running}], NOW)
    return plans.plan(spec, fleet, NOW)


@pytest.mark.parametrize("fmt", sorted(FORMATS))
@pytest.mark.parametrize("secret", [HF, OPENAI, GITHUB, AWS, JWT],
                         ids=["hf", "openai", "github", "aws", "jwt"])
def test_an_engine_error_line_never_carries_a_token_into_a_plan(secret: str, fmt: str) -> None:
    plan = _plan({"state": "failed", "log_tail": ["main: loading", ERROR.format(secret)]})
    assert any("401 Client Error" in r for c in plan.changes for r in c.reasons)  # quoted
    rendered = FORMATS[fmt](plan)
    assert secret not in rendered
    assert secret[4:20] not in rendered  # no part of it either
    if fmt in ("text", "json", "markdown --engine-output"):
        assert "401 Client Error" in rendered and "[redacted]" in rendered


def test_a_token_cut_by_the_length_limit_leaves_no_part_behind() -> None:
    line = "error: " + "x" * 275 + " " + HF  # the reason is cut at 300 characters
    plan = _plan({"state": "failed", "log_tail": [line]})
    for render in FORMATS.values():
        assert HF[:12] not in render(plan)


def test_markdown_quotes_engine_output_only_when_asked() -> None:
    plan = _plan({"state": "failed", "detail": "exited with status 1",
                  "log_tail": ["error: unable to mmap /models/gemma.gguf: Cannot allocate "
                               "memory"]})
    comment = outputs.markdown(plan)
    assert "unable to mmap" not in comment
    row = next(line for line in comment.splitlines() if line.startswith("| `~` | gemma |"))
    assert ("engine crash: cpu-01: llmgw-gemma-r0-s0.service failed: exited with status 1; "
            "the engine's output is left out (llmgw plan --engine-output quotes it)") in row
    assert "unable to mmap" in outputs.markdown(plan, engine_output=True)
    assert "unable to mmap" in outputs.text(plan)  # a terminal is not public


def test_a_secret_in_a_running_units_old_args_is_not_quoted_by_its_replacement() -> None:
    cluster = json.loads(json.dumps(CLUSTER))
    cluster["models"]["gemma"]["profiles"][0]["env"] = {"X": "1"}
    plan = _plan({"applied": {"profiles.0.args.hf-token": HF, "profiles.0.env.X": OPENAI}},
                 cluster)
    [change] = plan.changes
    assert change.action == "replace"
    assert any(HF in r for r in change.reasons) and any(OPENAI in r for r in change.reasons)
    for fmt, render in FORMATS.items():
        rendered = render(plan)
        assert HF not in rendered and OPENAI not in rendered, fmt
        assert "args removed: --hf-token [redacted]" in rendered, fmt


@pytest.mark.parametrize(("where", "running"), [
    ("engine output", {"state": "failed", "log_tail": ["error: ask @octocat or @acme/ops"]}),
    ("unit detail", {"state": "failed", "detail": "killed by @octocat and @acme/ops"}),
    ("port holder", {"port_holder": "pid 7 (python3 notify.py @octocat @acme/ops)"}),
])
def test_markdown_mentions_ping_nobody(where: str, running: dict[str, Any]) -> None:
    comment = outputs.markdown(_plan(running), engine_output=True)
    assert "@octocat" not in comment and "@acme/ops" not in comment, where
    assert "@\u200boctocat" in comment and "@\u200bacme/ops" in comment, where


def test_plan_cli_markdown_takes_engine_output(tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    spec = cluster_from(CLUSTER)
    fleet = fleet_from(spec, None, [{"model": "gemma", "replica": 0, "on": {"cpu-01": []},
                                     "state": "failed",
                                     "log_tail": ["error: bad magic", ERROR.format(HF)]}], NOW)
    (tmp_path / "cluster").mkdir()
    (tmp_path / "cluster" / "c.yaml").write_text(json.dumps({"cluster": {"name": "c"},
                                                             **CLUSTER}))
    (tmp_path / "fleet.json").write_text(fleet.model_dump_json())
    base = ["plan", "--cluster", str(tmp_path / "cluster"), "--observed",
            str(tmp_path / "fleet.json"), "--format", "markdown"]
    assert main(base) == 0
    plain = capsys.readouterr().out
    assert main([*base, "--engine-output"]) == 0
    quoted = capsys.readouterr().out
    assert "bad magic" not in plain and "left out" in plain
    assert "401 Client Error" in quoted and "[redacted]" in quoted
    assert HF not in plain + quoted
