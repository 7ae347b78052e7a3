"""docs/data.md and docs/backup.md hold to the code: every file they name exists, and
data.md describes every table the migrations create."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from llmgw.store import backups

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "docs" / "data.md", ROOT / "docs" / "backup.md"]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_file_a_claim_names_exists(page: Path) -> None:
    named = set(re.findall(r"`(llmgw/[\w/]+\.py)", page.read_text()))
    assert named, f"{page.name} names no file"
    missing = sorted(n for n in named if not (ROOT / n).is_file())
    assert not missing, f"{page.name} names files that do not exist: {missing}"


def test_data_md_describes_every_table() -> None:
    rows = "\n".join(
        line
        for line in (ROOT / "docs" / "data.md").read_text().splitlines()
        if line.startswith("| `")
    )
    described = set(re.findall(r"`([a-z_]+)`", rows))
    missing = sorted(backups.known_tables() - described)
    assert not missing, f"docs/data.md has no row for the tables {missing}"
