"""docs/fabrics.md: its transcripts are what the commands print now.

Every ``<!-- run: fabrics -->`` block runs in one bash (see :mod:`sessions`), in a
directory where ``tests`` and ``cluster.example`` are this checkout's: the agent's
inventory of the fixture nodes (their recorded sysfs trees, through the real parsers and
fabric checks) and the NCCL environment the planner rendered into the example fleet.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest
import sessions

PAGE = sessions.ROOT / "docs" / "fabrics.md"


@pytest.mark.skipif(shutil.which("jq") is None, reason="jq is not installed")
def test_the_fabrics_page_shows_what_the_commands_print(tmp_path: Path) -> None:
    for name in ("tests", "cluster.example"):
        (tmp_path / name).symlink_to(sessions.ROOT / name)
    commands = sessions.commands([PAGE], "fabrics")
    assert len(commands) >= 4
    env = sessions.environment([Path(sys.executable).parent])
    outputs = sessions.run(commands, tmp_path, env, timeout=300)
    differences = sessions.differences(commands, outputs)
    assert not differences, "\n\n".join(differences)
