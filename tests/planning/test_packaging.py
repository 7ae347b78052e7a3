"""The unit templates ship inside the wheel, and the installed package renders with them."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
TEMPLATES = sorted(p.name for p in (REPO / "templates").glob("*.j2"))


def test_templates_live_at_the_top_level_and_in_the_package() -> None:
    assert TEMPLATES == ["llmgw.service.j2", "unit.env.j2", "unit.service.j2"]
    packaged = REPO / "llmgw" / "templates"
    assert sorted(p.name for p in packaged.glob("*.j2")) == TEMPLATES
    assert packaged.resolve() == (REPO / "templates").resolve()


@pytest.mark.timeout(240)
def test_wheel_contains_the_templates_and_renders_with_them(tmp_path: Path) -> None:
    source = tmp_path / "src"
    source.mkdir()
    shutil.copy2(REPO / "pyproject.toml", source / "pyproject.toml")
    readme = REPO / "README.md"
    (source / "README.md").write_text(readme.read_text() if readme.exists() else "llmgw\n")
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    shutil.copytree(REPO / "llmgw", source / "llmgw", symlinks=True, ignore=ignore)
    shutil.copytree(REPO / "templates", source / "templates", ignore=ignore)
    dist = tmp_path / "dist"
    build = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
         "--no-index", "-q", "-w", str(dist), str(source)],
        capture_output=True, text=True, timeout=200,
    )
    assert build.returncode == 0, build.stderr
    (wheel,) = dist.glob("llmgw-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        assert {f"llmgw/templates/{name}" for name in TEMPLATES} <= names
        # What `llmgw init` and `llmgw lab` read: the CI workflow and the lab's hardware.
        assert "llmgw/templates/llmgw-plan.yml" in names
        hardware = "llmgw/onboarding/hardware/h100-ib"
        assert f"{hardware}/sys/class/infiniband/mlx5_0/ports/1/state" in names
        installed = tmp_path / "installed"
        archive.extractall(installed)
    # The unpacked wheel, first on the path, renders a unit from its own templates.
    script = (
        "import sys; sys.path.insert(0, sys.argv[1])\n"
        "import llmgw\n"
        "assert llmgw.__file__.startswith(sys.argv[1]), llmgw.__file__\n"
        "from llmgw.rendering import units\n"
        "files = units.render(units.UnitSpec(name='llmgw-m-r0-s0.service', model='m', "
        "replica=0, rank=0, ranks=1, node='n', engine='vllm', digest='d', spec_json='{}', "
        "argv=('/usr/bin/env', 'vllm', 'serve', 'm'), port=18000))\n"
        "print(files.unit_text)\n"
    )
    rendered = subprocess.run([sys.executable, "-c", script, str(installed)],
                              capture_output=True, text=True, timeout=60)
    assert rendered.returncode == 0, rendered.stderr
    assert "X-Llmgw-Model=m" in rendered.stdout
    assert "KillMode=control-group" in rendered.stdout
