"""What the docs say the defaults are is what the code has."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from llmgw.spec.models import Listeners

DOCS = Path(__file__).resolve().parents[2] / "docs"


@pytest.mark.parametrize("key", ["router", "admin", "metrics"])
def test_security_md_states_each_listeners_real_default(key: str) -> None:
    table = (DOCS / "security.md").read_text().split("## Listeners and ports", 1)[1]
    row = next(line for line in table.splitlines() if line.startswith(f"| {key} "))
    stated = re.findall(r"`([0-9.:\[\]]+:\d+)`", row)[0]
    assert stated == getattr(Listeners(), key), row


def test_every_serve_option_has_help(capsys: pytest.CaptureFixture[str]) -> None:
    from llmgw.cli.main import main

    with pytest.raises(SystemExit):
        main(["serve", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "--log-level {debug,info,warning} how much the daemon logs to stderr" in out
