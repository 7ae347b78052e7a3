"""The llama.cpp walkthrough of engines.md runs as written.

Every ``<!-- run: engines -->`` block of docs/engines.md runs in one bash in an
empty directory (see :mod:`sessions`): a lab, its model given an
``engine_version``, the plan saying to install it first, ``llmgw engine
install`` shipping the ``llama-server`` built by ``make engine``, the apply,
a completion from the installed engine, and ``llmgw lab down`` leaving
nothing running. The output of each command must match the page.
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
PAGE = sessions.ROOT / "docs" / "engines.md"


@pytest.mark.skipif(not (ENGINE.exists() and MODEL.exists()),
                    reason="needs the engine and model: make engine model")
@pytest.mark.skipif(not shutil.which("/usr/sbin/sshd"), reason="sshd not installed")
@pytest.mark.docs_session
@pytest.mark.timeout(1200)  # lab up enrols three nodes by node add: minutes
def test_the_engine_install_session_of_engines_md(tmp_path: Path) -> None:
    commands = sessions.commands([PAGE], "engines")
    assert commands[0].text.startswith("mkdir lab")
    assert commands[-1].text == "llmgw lab down"
    # The control host ships the llama-server on its PATH: the one `make engine` built.
    sessions.build_wheels()  # lab up enrols the nodes by node add, which ships them
    env = sessions.environment([Path(sys.executable).parent, ENGINE.parent])
    try:
        outputs = sessions.run(commands, tmp_path, env)
    finally:
        left = processes.marked(tmp_path / "lab" / labs.RUNTIME)
        processes.terminate(left)
    differences = sessions.differences(commands, outputs)
    assert not differences, "\n\n".join(differences)
    assert left == [], "llmgw lab down left processes running"
