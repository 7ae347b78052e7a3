"""Every broken cluster directory produces exactly the located errors it lists.

Each case is a directory under ``broken/`` with YAML files and an
``expected.txt``: one ``file:line:col: message`` per line, in output order.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from llmgw.cli.main import main

CASES = sorted(p for p in (Path(__file__).parent / "broken").iterdir() if p.is_dir())


def test_the_corpus_is_large() -> None:
    assert len(CASES) >= 30


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_validate_reports_exact_locations(
    case: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(case)
    expected = (case / "expected.txt").read_text().splitlines()
    assert expected, "a broken case must expect at least one error"

    code = main(["validate", "--cluster", "."])

    out, err = capsys.readouterr()
    assert code == 1
    assert out == ""
    lines = err.splitlines()
    assert lines[:-1] == expected
    assert lines[-1] == f"error: {len(expected)} error{'s' if len(expected) > 1 else ''} in ."
    assert "Traceback" not in err
