"""Where ``llmgw serve`` keeps its admin token: the state directory, whatever the store is.

A real ``llmgw serve`` process on each store (SQLite in a directory of its own,
and a real PostgreSQL, where "next to the store" used to mean the cluster
directory, a git working tree), with no node: the token must land in the state
directory (``$LLMGW_STATE_DIR``, or ``cluster.state_dir``), never beside the
store nor in the cluster directory, and open the admin API. A token an earlier
llmgw left next to the store is moved there, keeping its value.
"""

from __future__ import annotations

import json
import stat
from pathlib import Path

import httpx
import pytest
from support import daemons

from llmgw.spec import statedirs


def _cluster(directory: Path, daemon: daemons.Daemon, store: dict[str, str],
             extra: str = "") -> None:
    directory.mkdir(exist_ok=True)
    (directory / "cluster.yaml").write_text(
        "cluster:\n  name: tokens\n  sync: manual\n"
        f"  listeners: {json.dumps(daemon.listeners())}\n"
        f"  store: {json.dumps(store)}\n{extra}nodes: {{}}\nmodels: {{}}\n")


def _serve(daemon: daemons.Daemon) -> None:
    daemon.start("--role", "reconciler", "--ready-timeout", "30s")
    daemon.until(lambda: daemon.status()["cluster"] == "tokens", "the admin API", timeout=60)


def _only_owner(path: Path) -> bool:
    return stat.S_IMODE(path.stat().st_mode) == 0o600


def test_the_token_lands_in_the_state_directory_on_either_store(
        tmp_path: Path, state_dir: Path, store_settings: dict[str, str]) -> None:
    directory = tmp_path / "cluster"
    daemon = daemons.Daemon(directory, tmp_path / "serve.log")
    _cluster(directory, daemon, store_settings)
    try:
        _serve(daemon)
        token = state_dir / statedirs.ADMIN_TOKEN
        assert daemon.token == token and _only_owner(token)
        assert not list(directory.rglob("*.token")), "a secret in the cluster directory"
        assert not list(tmp_path.rglob("admin.token")), "a token beside the store"
        wrong = httpx.get(f"{daemon.admin}/api/v1/status", timeout=5,
                          headers={"Authorization": "Bearer not-the-token"})
        assert wrong.status_code == 401
        assert f"admin token in {token}" in daemon.log.read_text()
    finally:
        daemon.stop()


def test_a_token_beside_the_store_is_moved_with_its_value(
        tmp_path: Path, state_dir: Path) -> None:
    directory, store = tmp_path / "cluster", tmp_path / "store"
    store.mkdir()
    old = store / statedirs.ADMIN_TOKEN
    old.write_text("the-token-an-older-llmgw-made\n")
    old.chmod(0o600)
    daemon = daemons.Daemon(directory, tmp_path / "serve.log")
    _cluster(directory, daemon, {"path": str(store / "llmgw.db")})
    try:
        _serve(daemon)  # with the old token's value, read from the new place
        assert daemon.token.read_text() == "the-token-an-older-llmgw-made\n"
        assert _only_owner(daemon.token) and not old.exists()
    finally:
        daemon.stop()
    daemon.start("--role", "reconciler", "--ready-timeout", "30s")  # a second start: in place
    try:
        daemon.until(lambda: daemon.status()["cluster"] == "tokens", "the admin API")
    finally:
        daemon.stop()
    assert daemon.log.read_text().count("moved the admin token") == 1


@pytest.mark.parametrize("where", ["absolute", "relative"])
def test_cluster_state_dir_wins_over_the_environment(
        tmp_path: Path, state_dir: Path, where: str) -> None:
    directory, chosen = tmp_path / "cluster", tmp_path / "host-state"
    text = str(chosen) if where == "absolute" else "../host-state"
    daemon = daemons.Daemon(directory, tmp_path / "serve.log",
                            token=chosen / statedirs.ADMIN_TOKEN)
    _cluster(directory, daemon, {"path": str(tmp_path / "llmgw.db")},
             f"  state_dir: {json.dumps(text)}\n")
    try:
        _serve(daemon)
        assert _only_owner(chosen / statedirs.ADMIN_TOKEN)
        assert not (state_dir / statedirs.ADMIN_TOKEN).exists()
    finally:
        daemon.stop()
