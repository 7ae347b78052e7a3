"""`llmgw keys create/list/revoke` against a real cluster directory and store."""

from __future__ import annotations

import argparse
import asyncio
import json
from pathlib import Path

import pytest

from llmgw.cli import keys_cmd
from llmgw.cli.errors import UserError
from llmgw.spec.models import StoreSettings
from llmgw.store import keys, stores

CLUSTER = """\
cluster:
  name: lab
  store: {path: state/llmgw.db}
models:
  qwen-coder:
    scaling: {min: 0, max: 1}
    profiles: [{engine: llama.cpp, cpu: true, source: /models/qwen.gguf}]
projects:
  research: {budget_usd: 500}
  ci: {}
"""


def llmgw_keys(*argv: str) -> int:
    parser = argparse.ArgumentParser(prog="llmgw")
    keys_cmd.register(parser.add_subparsers())
    args = parser.parse_args(["keys", *argv])
    return int(args.handler(args))


@pytest.fixture
def cluster_dir(tmp_path: Path) -> Path:
    directory = tmp_path / "cluster"
    directory.mkdir()
    (directory / "cluster.yaml").write_text(CLUSTER)
    return directory


def test_create_list_revoke(cluster_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    d = str(cluster_dir)
    assert llmgw_keys("create", "--cluster", d, "--project", "research", "--name", "alice") == 0
    out, err = capsys.readouterr()
    secret = out.strip()
    assert secret.startswith("llmgw_") and "shown only this once" in err
    key_id = keys.key_id_of(secret)
    assert key_id and key_id in err

    # Stored where the cluster says, hashed: the secret is nowhere in the file.
    db = cluster_dir / "state" / "llmgw.db"
    store = asyncio.run(stores.open_store(StoreSettings(path=str(db))))
    verify = lambda: asyncio.run(keys.verify(store, secret))  # noqa: E731
    assert verify() is not None
    assert not [p for p in db.parent.iterdir() if secret.encode() in p.read_bytes()]

    assert llmgw_keys("list", "--cluster", d) == 0
    out, _ = capsys.readouterr()
    header, row = out.splitlines()
    assert header.split()[:3] == ["ID", "PROJECT", "NAME"]
    assert row.split()[:3] == [key_id, "research", "alice"] and row.endswith("active")
    assert secret not in out

    assert llmgw_keys("revoke", "--cluster", d, key_id) == 0
    assert "revoked key" in capsys.readouterr().out
    assert verify() is None  # the router's check refuses it now
    assert llmgw_keys("revoke", "--cluster", d, secret) == 0  # the whole key works too
    assert "already revoked" in capsys.readouterr().out

    assert llmgw_keys("list", "--cluster", d, "--json") == 0
    (listed,) = json.loads(capsys.readouterr().out)
    assert listed["id"] == key_id and listed["revoked_at"] is not None
    asyncio.run(store.close())


@pytest.mark.parametrize("argv, message", [
    (["create", "--project", "marketing"], "project 'marketing' is not defined"),
    (["revoke", "0123456789ab"], "no key with id '0123456789ab'"),
])
def test_mistakes_are_explained(cluster_dir: Path, argv: list[str], message: str) -> None:
    with pytest.raises(UserError, match=message):
        llmgw_keys(argv[0], "--cluster", str(cluster_dir), *argv[1:])


def test_a_broken_cluster_is_reported_not_a_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "c.yaml").write_text("cluster:\n  name: lab\n  bogus: 1\n")
    with pytest.raises(UserError, match="1 error"):
        llmgw_keys("list", "--cluster", str(tmp_path))
    assert "c.yaml:3:" in capsys.readouterr().err
