"""``llmgw init``: a site repository that validates, written once, and the daemon's unit."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from llmgw.onboarding import sites

REPO = Path(__file__).resolve().parents[2]


def llmgw(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "llmgw", *args], cwd=cwd, text=True,
                          capture_output=True, timeout=120)


def snapshot(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): p.read_text() for p in sorted(root.rglob("*"))
            if p.is_file()}


def test_init_writes_a_valid_site_once(tmp_path: Path) -> None:
    bare = ("--no-mirror", "--no-node", "--no-model")  # the files alone (test_init_cli: all)
    first = llmgw("init", "acme-gpu", *bare, cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    site = tmp_path / "acme-gpu"
    assert ("[1/7] cluster files: wrote cluster/cluster.yaml, cluster/nodes.yaml, "
            "cluster/models.yaml, cluster/known_hosts, .github/workflows/llmgw-plan.yml\n"
            "[2/7] .gitignore: added /cluster/state/ *.db ") in first.stdout
    # The way into the repository first, from where it ran.
    assert "Next:\n  cd acme-gpu\n" in first.stdout
    files = snapshot(site)
    assert set(files) == {"cluster/cluster.yaml", "cluster/nodes.yaml", "cluster/models.yaml",
                          "cluster/known_hosts", ".github/workflows/llmgw-plan.yml", ".gitignore"}
    assert files["cluster/known_hosts"] == ""
    assert files[".github/workflows/llmgw-plan.yml"] == (
        REPO / ".github" / "workflows" / "llmgw-plan.yml").read_text()
    validate = llmgw("validate", cwd=site)
    assert validate.returncode == 0, validate.stdout + validate.stderr
    assert "Cluster acme-gpu is valid: 0 nodes" in validate.stdout
    # The store is outside the repository.
    store = next(line for line in files["cluster/cluster.yaml"].splitlines()
                 if line.strip().startswith("path:"))
    assert store.split('"')[1].startswith("/") and str(site) not in store

    (site / "cluster" / "nodes.yaml").write_text("# mine\nnodes: {}\n")
    second = llmgw("init", "acme-gpu", *bare, cwd=tmp_path)
    assert second.returncode == 0 and "wrote" not in second.stdout
    assert "[1/7] cluster files: already there" in second.stdout
    assert snapshot(site)["cluster/nodes.yaml"] == "# mine\nnodes: {}\n"


def test_inits_model_example_has_a_price_that_makes_its_budget_bind(tmp_path: Path) -> None:
    """`init` writes `default: {budget_usd: 100}`; the model it shows how to add carries a
    price, so the budget binds: validate is clean with it, and an error without it."""
    assert llmgw("init", "site", "--no-model", cwd=tmp_path).returncode == 0
    site = tmp_path / "site"
    models = site / "cluster" / "models.yaml"
    example = [line[2:] for line in models.read_text().splitlines()
               if line.startswith("#   ") or line == "# models:"]
    models.write_text("\n".join(example) + "\n")
    validate = llmgw("validate", cwd=site)
    assert validate.returncode == 0, validate.stdout + validate.stderr
    assert "1 model" in validate.stdout
    models.write_text("\n".join(line for line in example if "pricing" not in line) + "\n")
    validate = llmgw("validate", cwd=site)
    assert validate.returncode == 1
    assert "cluster/cluster.yaml:" in validate.stdout + validate.stderr
    assert "project 'default' has a budget of $100.00 that never binds" in (
        validate.stdout + validate.stderr)


@pytest.mark.skipif(sites.systemd_is_init(), reason="would install a real unit")
def test_install_without_systemd_prints_a_unit_systemd_accepts(tmp_path: Path) -> None:
    result = llmgw("init", "site", "--install", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "systemd is not PID 1 here, so nothing was installed" in result.stdout
    unit = result.stdout.split("llmgw.service:\n\n", 1)[1].split("\n  systemctl", 1)[0]
    cluster = tmp_path / "site" / "cluster"
    assert f"serve --cluster {cluster}" in unit
    # As docs/operations.md's unit: a descriptor per client connection.
    assert "\nLimitNOFILE=65536\n" in unit
    assert not sites.UNIT_PATH.exists()
    if shutil.which("systemd-analyze"):
        path = tmp_path / "llmgw.service"
        path.write_text(unit)
        verify = subprocess.run(["systemd-analyze", "verify", "--man=no", str(path)],
                                capture_output=True, text=True, timeout=60, env=os.environ)
        assert verify.returncode == 0 and verify.stderr == "", verify.stderr


def test_a_directory_a_unit_cannot_hold_is_refused(tmp_path: Path) -> None:
    odd = tmp_path / "my site"
    result = llmgw("init", str(odd), "--install", cwd=tmp_path)
    assert result.returncode == 1
    assert "cannot go into a unit file" in result.stderr and "Traceback" not in result.stderr


@pytest.mark.parametrize("argv0, program", [
    ("/opt/llmgw/bin/llmgw", ["/opt/llmgw/bin/llmgw"]),  # the console script: its dir, not cwd
    ("/opt/llmgw/lib/python3.11/site-packages/llmgw/__main__.py",  # `python -m llmgw`
     [sys.executable, "-P", "-m", "llmgw"]),
], ids=["console script", "python -m"])
def test_the_daemon_unit_runs_llmgw_outside_the_repository(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, argv0: str, program: list[str],
) -> None:
    """A llmgw.py committed beside the cluster directory must never be what runs: the
    unit runs in /, and `python -m` runs with -P (no working directory on sys.path)."""
    monkeypatch.setattr(sys, "argv", [argv0])  # how llmgw was started: the unit runs it so
    unit = sites.daemon_unit(tmp_path / "site" / "cluster", user="llmgw")
    lines = unit.splitlines()
    assert "WorkingDirectory=/" in lines
    assert f"ExecStart={' '.join(program)} serve --cluster {tmp_path}/site/cluster" in lines
