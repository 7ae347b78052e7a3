"""docs/architecture.md and the import-linter layers name every package there is."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = sorted(p.name for p in (ROOT / "llmgw").iterdir()
                  if (p / "__init__.py").exists())


@pytest.mark.parametrize("package", PACKAGES)
def test_every_package_is_in_a_layer_and_described(package: str) -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    [layers] = [c["layers"] for c in config["contracts"] if c["type"] == "layers"]
    assert any(f"llmgw.{package}" in row.replace(":", " ").replace("|", " ").split()
               for row in layers), f"llmgw.{package} is in no import-linter layer"
    doc = (ROOT / "docs" / "architecture.md").read_text()
    assert f"`{package}`" in doc, f"docs/architecture.md does not describe llmgw.{package}"
