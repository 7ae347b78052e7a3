"""CHANGELOG.md keeps step with the version: an Unreleased section first, then an entry for
the version pyproject.toml names (Keep a Changelog), and its links resolve."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CHANGELOG = ROOT / "CHANGELOG.md"


def test_unreleased_first_then_the_version_of_pyproject() -> None:
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    headings = re.findall(r"^## \[([^\]]+)\](?: - (\d{4}-\d{2}-\d{2}))?$", CHANGELOG.read_text(),
                          flags=re.M)
    assert [name for name, _ in headings[:2]] == ["Unreleased", version], headings
    assert headings[1][1], f"the {version} entry has no date"
    dates = [date for _, date in headings[1:]]
    assert dates == sorted(dates, reverse=True), "entries newest first"


def test_every_relative_link_resolves() -> None:
    text = re.sub(r"`[^`\n]*`", "", CHANGELOG.read_text())
    targets = re.findall(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)", text)
    broken = [t for t in targets if not re.match(r"^[a-z]+:", t)
              and not (ROOT / t.partition("#")[0]).exists()]
    assert not broken, broken
