"""``llmgw validate`` warns about a secret file that git has or would take.

Real git repositories in ``tmp_path``, the real command: each case puts a
secret file somewhere (tracked, inside the cluster directory, in a working tree
no ``.gitignore`` covers, ignored, in the state directory) and expects a located
warning on stderr, or none; the exit status stays 0 either way, since the
cluster is valid.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from llmgw.cli.main import main
from llmgw.spec import loading, statedirs

needs_git = pytest.mark.skipif(shutil.which("git") is None, reason="git not installed")
OIDC = ("  web:\n    oidc:\n      issuer: https://idp.example.com/realms/corp\n"
        "      client_id: llmgw\n      client_secret_file: {secret}\n")


def _git(repo: Path, *argv: str) -> None:
    subprocess.run(["git", "-C", str(repo), *argv], check=True, capture_output=True)


def _site(root: Path, *, repo: bool, password_file: str | None = None,
          oidc_secret: Path | None = None, state_dir: str | None = None) -> Path:
    """``root/cluster`` with a cluster.yaml naming the files; ``root`` a git repo if asked."""
    directory = root / "cluster"
    directory.mkdir(parents=True)
    if repo:
        _git(root, "init", "-q")
    text = "cluster:\n  name: site\n  store:\n    path: /var/lib/llmgw/site.db\n"
    if password_file:
        text += ("    url: postgresql://llmgw@db.internal:5432/llmgw\n"
                 f"    password_file: {password_file}\n")
    if oidc_secret:
        text += OIDC.format(secret=oidc_secret)
    if state_dir:
        text += f"  state_dir: {state_dir}\n"
    (directory / "cluster.yaml").write_text(text + "nodes: {}\nmodels: {}\n")
    return directory


def _validate(directory: Path, capsys: pytest.CaptureFixture[str]) -> list[str]:
    status = main(["validate", "--cluster", str(directory)])
    out, err = capsys.readouterr()
    assert status == 0 and "Cluster site is valid" in out, (status, out, err)
    return err.splitlines()


def _at_key(directory: Path, key: str) -> str:
    """``cluster.yaml:LINE:COL`` of ``key:`` in the file, as validate locates it."""
    for number, line in enumerate((directory / "cluster.yaml").read_text().splitlines(), 1):
        if line.strip().startswith(f"{key}:"):
            return f"cluster.yaml:{number}:{line.index(key) + 1}"
    raise AssertionError(f"no {key} in cluster.yaml")


def _secret(path: Path, text: str = "hunter2-the-password") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text + "\n")
    path.chmod(0o600)
    return path


@needs_git
@pytest.mark.parametrize(("place", "warned"), [
    pytest.param("tracked", "is tracked by git", id="tracked by git, outside the cluster dir"),
    pytest.param("inside", "lies inside the cluster directory",
                 id="in the cluster dir, no repository"),
    pytest.param("inside-ignored", "lies inside the cluster directory",
                 id="in the cluster dir, though .gitignore covers it"),
    pytest.param("exposed", "no .gitignore covers", id="in the working tree, not ignored"),
    pytest.param("ignored", None, id="in the working tree, ignored"),
    pytest.param("state", None, id="in the state directory"),
])
def test_a_password_file_git_has_or_would_take_is_a_located_warning(
        tmp_path: Path, state_dir: Path, capsys: pytest.CaptureFixture[str],
        place: str, warned: str | None) -> None:
    root = tmp_path / "site"
    repo = place in ("tracked", "inside-ignored", "exposed", "ignored")
    if place in ("tracked", "exposed", "ignored"):
        name = str(_secret(root / "secrets" / "pgpass"))
    else:
        name = "pgpass"  # relative: the state directory's, else (as before) the cluster's
    directory = _site(root, repo=repo, password_file=name)
    if place.startswith("inside"):
        _secret(directory / "pgpass")
    if place == "state":
        _secret(state_dir / "pgpass")
    if place in ("inside-ignored", "ignored"):
        (root / ".gitignore").write_text("pgpass\n")
    if place == "tracked":
        _git(root, "add", "secrets/pgpass")
    lines = _validate(directory, capsys)
    if warned is None:
        assert lines == []
        return
    [line] = lines
    where = _at_key(directory, "password_file")
    assert re.fullmatch(rf"(.*/)?{re.escape(where)}: warning: store\.password_file \S+/pgpass "
                        rf".*{warned}.*", line), line
    assert "hunter2" not in line


def test_a_relative_password_file_is_read_from_the_state_directory(
        tmp_path: Path, state_dir: Path) -> None:
    directory = _site(tmp_path, repo=False, password_file="pgpass")
    _secret(state_dir / "pgpass")
    _secret(directory / "pgpass", "the-old-copy")  # the state directory's wins
    cluster = loading.load(directory)
    assert cluster.cluster.store.password_file == str(state_dir / "pgpass")


def test_without_git_the_cluster_directory_still_warns(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    directory = _site(tmp_path, repo=False, password_file="pgpass")
    _secret(directory / "pgpass")
    monkeypatch.setenv("PATH", str(tmp_path / "no-programs-here"))
    [line] = _validate(directory, capsys)
    assert "lies inside the cluster directory" in line


@needs_git
def test_a_tracked_client_secret_is_a_warning_at_its_setting(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    secret = _secret(tmp_path / "oidc-client-secret")
    directory = _site(tmp_path, repo=True, oidc_secret=secret)
    _git(tmp_path, "add", secret.name)
    [line] = _validate(directory, capsys)
    assert f"{_at_key(directory, 'client_secret_file')}: warning: web.oidc.client_secret_file " \
           f"{secret} is tracked by git" in line


@pytest.mark.parametrize(("state", "warned"), [
    pytest.param("state", True, id="cluster.state_dir inside the cluster dir"),
    pytest.param("../state", False, id="cluster.state_dir beside it"),
])
def test_a_state_directory_inside_the_cluster_directory_is_a_warning(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], state: str, warned: bool) -> None:
    directory = _site(tmp_path, repo=False, state_dir=state)
    lines = _validate(directory, capsys)
    if not warned:
        assert lines == []
        return
    [line] = lines
    assert f"{_at_key(directory, 'state_dir')}: warning: the admin token " \
           f"({statedirs.ADMIN_TOKEN} in the state directory) " \
           f"{(directory / state).resolve() / statedirs.ADMIN_TOKEN} lies inside" in line


def test_the_state_directory_is_the_settings_then_the_environment_then_the_users() -> None:
    assert statedirs.default({}, euid=0) == Path("/var/lib/llmgw")
    assert statedirs.default({}, euid=1000) == Path.home() / ".local" / "state" / "llmgw"
    assert statedirs.default({statedirs.ENV: "/srv/llmgw"}, euid=0) == Path("/srv/llmgw")
    assert statedirs.default({statedirs.ENV: "rel"}, euid=0) == Path(os.getcwd()) / "rel"
