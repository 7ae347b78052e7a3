"""Fixtures for end-to-end tests: stand-in engines on the agents' PATH."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.engines import STUBS, kill_all


@pytest.fixture
def engines(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Path]:
    """Stand-in engine binaries on PATH; their records land in the returned directory."""
    records = tmp_path / "records"
    records.mkdir()
    monkeypatch.setenv("PATH", f"{STUBS}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("TESTENGINE_RECORD_DIR", str(records))
    yield records
    kill_all(records)
