"""The lab walkthrough of quickstart.md, gitops.md and operations.md runs as written.

Every ``<!-- run: lab -->`` console block of the three pages runs, in page
order, in one bash in an empty directory (see :mod:`sessions`): ``llmgw lab up``
starts the nodes, the pages' commands drive them, and the output each command
prints must match what the page shows in its stable parts. Then ``llmgw lab
down`` (the pages' last block) must leave no process of the lab running.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest
import sessions

from llmgw.onboarding import labs, processes

ENGINE = sessions.ROOT / ".cache" / "engine" / "bin" / "llama-server"
MODEL = sessions.ROOT / ".cache" / "models" / "gemma3-270m-q4_k_m.gguf"

needs_engine = pytest.mark.skipif(not (ENGINE.exists() and MODEL.exists()),
                                  reason="needs the engine and model: make engine model")
needs_sshd = pytest.mark.skipif(not shutil.which("/usr/sbin/sshd"), reason="sshd not installed")


def test_matching_keeps_to_the_stable_parts() -> None:
    assert sessions.matches(["a", "…", "d"], ["a", "b", "c", "d"])
    assert sessions.matches(["at 2026-11-29 08:29:27 UTC"], ["at 2027-01-02 10:11:12 UTC"])
    assert sessions.matches(["key …/cluster/known_hosts"], ["key /tmp/x/cluster/known_hosts"])
    assert not sessions.matches(["a", "d"], ["a", "b", "d"])
    assert not sessions.matches(["1 to create"], ["2 to create"])


@needs_engine
@needs_sshd
@pytest.mark.docs_session
@pytest.mark.timeout(1500)  # lab up enrols three nodes by node add: minutes
def test_the_lab_session_of_the_docs(tmp_path: Path) -> None:
    commands = sessions.commands(sessions.LAB_PAGES, "lab")
    assert commands[0].text.startswith("mkdir lab")
    assert "llmgw lab down" in [c.text for c in commands]
    sessions.build_wheels()  # lab up enrols the nodes by node add, which ships them
    env = sessions.environment([Path(sys.executable).parent])
    try:
        outputs = sessions.run(commands, tmp_path, env)
    finally:
        runtime = tmp_path / "lab" / labs.RUNTIME
        left = processes.marked(runtime)
        processes.terminate(left)
    differences = sessions.differences(commands, outputs)
    assert not differences, "\n\n".join(differences)
    assert left == [], "llmgw lab down left processes running"


def test_no_path_of_this_machine_in_the_docs() -> None:
    pages = [*sorted((sessions.ROOT / "docs").glob("*.md")), sessions.ROOT / "README.md"]
    found = [f"{page.name}:{number}: {line.strip()}" for page in pages
             for number, line in enumerate(page.read_text().splitlines(), 1)
             if "/work/" in line or "/tmp/llmgw-sim-" in line or "/tmp/lab" in line]
    assert not found, "\n".join(found)
