"""``llmgw history`` refuses bad flags with a clear message, before touching any store."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmgw.cli.main import main


@pytest.mark.parametrize(("flags", "message"), [
    (["--model", "../etc/passwd"], "is not a model name"),
    (["--model", "a\x1b[2Jb"], "is not a model name"),
    (["--limit", "0"], "--limit must be between 1 and 1000"),
    (["--limit", "100000"], "--limit must be between 1 and 1000"),
])
def test_bad_flags_are_refused_without_a_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flags: list[str], message: str,
) -> None:
    code = main(["history", "--cluster", str(tmp_path / "absent"), *flags])
    captured = capsys.readouterr()
    assert code != 0
    assert message in captured.err
    assert "Traceback" not in captured.err
    assert not (tmp_path / "absent").exists()
