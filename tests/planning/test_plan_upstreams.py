"""``llmgw plan`` on upstreams: the files against what the leader last published."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from llmgw.daemon import routetables
from llmgw.planning import upstreams

REPO = Path(__file__).resolve().parents[2]
KEY = "sk-plan-KEYMARK-77d1"
RUNNING = {"url": "https://a.example.com", "key": True, "max_in_flight": None,
           "models": {"chat": ["gpt-small", "fallback"]}}


def entry(**changed: Any) -> dict[str, Any]:
    return {**RUNNING, **changed}


@pytest.mark.parametrize(("declared", "running", "expected"), [
    pytest.param({"a": entry()}, None,
                 [("add", "a", ("https://a.example.com (with a key): chat → gpt-small "
                                "(fallback)",))], id="nothing-published"),
    pytest.param({"a": entry()}, {"a": entry()},
                 [("keep", "a", ("https://a.example.com (with a key): chat → gpt-small "
                                 "(fallback)",))], id="unchanged"),
    pytest.param({}, {"a": entry()},
                 [("remove", "a", ("https://a.example.com (with a key): chat → gpt-small "
                                   "(fallback)",))], id="removed"),
    pytest.param({"a": entry(url="https://b.example.com", key=False, max_in_flight=8,
                             models={"chat": ["gpt-small", "always"], "code": ["c", "always"]})},
                 {"a": entry()},
                 [("change", "a", ("url https://a.example.com → https://b.example.com",
                                   "no key is sent any more", "max_in_flight no cap → 8",
                                   "chat: gpt-small (fallback) → gpt-small (always)",
                                   "+ code → c (always)"))], id="changed"),
])
def test_changes(declared: dict[str, Any], running: dict[str, Any] | None,
                 expected: list[tuple[str, str, tuple[str, ...]]]) -> None:
    found = upstreams.changes(declared, running)
    assert [(c.action, c.name, c.details) for c in found] == expected


def test_lines_count_what_changes() -> None:
    found = upstreams.changes({"a": entry(url="https://b.example.com"), "n": entry()},
                              {"a": entry(), "old": entry()})
    assert upstreams.lines(found) == [
        "", "Upstreams (the routers' now → the cluster files):",
        "  ~ a: url https://a.example.com → https://b.example.com",
        "  + n: https://a.example.com (with a key): chat → gpt-small (fallback)",
        "  - old: https://a.example.com (with a key): chat → gpt-small (fallback)",
        "Upstreams: 1 to add, 1 to change, 1 to remove.",
    ]


def test_the_published_table_carries_summaries_without_the_key() -> None:
    doc = routetables.encode({}, {"a": RUNNING})
    assert routetables.upstreams_of(doc) == {"a": RUNNING}
    assert routetables.decode(doc) == {}  # a router routes by its own files, not this
    assert routetables.upstreams_of(routetables.encode({})) is None


def test_plan_lists_upstreams_and_never_the_key(tmp_path: Path) -> None:
    directory = tmp_path / "cluster"
    shutil.copytree(REPO / "cluster.example", directory,
                    ignore=shutil.ignore_patterns("local", "agent"))
    (directory / "burst.key").write_text(KEY + "\n")
    (directory / "upstreams.yaml").write_text(
        "upstreams:\n"
        "  burst:\n"
        "    url: https://api.example.com\n"
        "    api_key_file: burst.key\n"
        "    models:\n"
        "      llama-3.1-8b: {model: meta-llama/llama-3.1-8b-instruct, use: fallback}\n")
    plan = subprocess.run(
        [sys.executable, "-m", "llmgw", "plan", "--cluster", str(directory), "--observed",
         str(directory / "fleet-snapshot.json")], capture_output=True, text=True, timeout=120,
        cwd=REPO)
    assert plan.returncode == 0, plan.stderr
    assert plan.stdout.endswith(
        "Upstreams (the routers' now → the cluster files):\n"
        "  + burst: https://api.example.com (with a key): llama-3.1-8b → "
        "meta-llama/llama-3.1-8b-instruct (fallback)\n"
        "Upstreams: 1 to add, 0 to change, 0 to remove.\n")
    assert KEY not in plan.stdout + plan.stderr
    assert "burst.key" not in plan.stdout
