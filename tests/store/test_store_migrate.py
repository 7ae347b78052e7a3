"""`llmgw store migrate --to URL`: SQLite → a real PostgreSQL, keys still working (every
other table: tests/store/test_copies.py)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from support import nodes
from support.postgres import Database

from llmgw.cli import main
from llmgw.spec.models import StoreSettings
from llmgw.store import keys, stores, usages
from llmgw.store.usages import UsageRow

CLUSTER = """\
cluster:
  name: lab
  store: {path: state/llmgw.db}
projects:
  research: {budget_usd: 500}
"""


def row(cost: float, key_id: str | None = None) -> UsageRow:
    return UsageRow(ts=1.0, project="research", key_id=key_id, model="chat",
                    endpoint="/v1/completions", status=200, prompt_tokens=1,
                    completion_tokens=2, latency_ms=3.0, cost_usd=cost)


async def fill(settings: StoreSettings, n: int) -> list[str]:
    store = await stores.open_store(settings)
    try:
        made = [await keys.create(store, "research", f"k{i}") for i in range(2)]
        await keys.revoke(store, made[1].info.id)
        await usages.insert(store, [row(0.25, made[0].info.id) for _ in range(n)])
        return [k.secret for k in made]
    finally:
        await store.close()


async def look(settings: StoreSettings, secrets: list[str]) -> tuple[list[bool], float, int]:
    store = await stores.open_store(settings)
    try:
        verified = [await keys.verify(store, s) is not None for s in secrets]
        spend = (await usages.spend_by_project(store)).get("research", 0.0)
        return verified, spend, len(await usages.recent(store, 100000))
    finally:
        await store.close()


@pytest.fixture
def cluster_dir(tmp_path: Path) -> Path:
    (tmp_path / "cluster.yaml").write_text(CLUSTER)
    return tmp_path


def migrate(cluster_dir: Path, db: Database) -> int:
    return main.main(["store", "migrate", "--cluster", str(cluster_dir), "--to", db.url,
                      "--password-file", str(db.password_file)])


def test_migrate_copies_keys_and_usage_then_tops_up(
    cluster_dir: Path, postgres_db: Database, capsys: pytest.CaptureFixture[str]
) -> None:
    source = StoreSettings(path=str(cluster_dir / "state" / "llmgw.db"))
    secrets = asyncio.run(fill(source, 7000))  # more than one batch
    assert migrate(cluster_dir, postgres_db) == 0
    out = capsys.readouterr().out
    assert "copied 2 keys, 7000 usage rows and " in out
    assert "s3cret" not in out  # the password is never printed
    target = StoreSettings.model_validate(postgres_db.settings)
    # The active key verifies against PostgreSQL, the revoked one stays revoked.
    assert asyncio.run(look(target, secrets)) == ([True, False], 1750.0, 7000)

    # A daemon kept writing to SQLite: a second run copies only what is new.

    async def more() -> None:
        store = await stores.open_store(source)
        await usages.insert(store, [row(1.0)] * 3)
        await store.close()
    asyncio.run(more())
    assert migrate(cluster_dir, postgres_db) == 0
    assert "topped up 0 keys, 3 usage rows and 0 other rows" in capsys.readouterr().out
    assert asyncio.run(look(target, secrets)) == ([True, False], 1753.0, 7003)


def test_migrate_refuses_a_target_filled_elsewhere(
    cluster_dir: Path, postgres_db: Database, tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    asyncio.run(fill(StoreSettings.model_validate(postgres_db.settings), 1))
    asyncio.run(fill(StoreSettings(path=str(cluster_dir / "state" / "llmgw.db")), 1))
    assert migrate(cluster_dir, postgres_db) == 1
    err = capsys.readouterr().err
    assert "already holds rows not copied from" in err and "Traceback" not in err


@pytest.mark.parametrize(("to", "error"), [
    ("postgresql://llmgw:pw@db/x", "must not hold a password"),
    ("ftp://db/x", "should match pattern"),
])
def test_migrate_refuses_bad_targets(cluster_dir: Path, to: str, error: str,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    assert main.main(["store", "migrate", "--cluster", str(cluster_dir), "--to", to]) == 1
    assert error in capsys.readouterr().err


def test_migrate_to_an_unreachable_database_says_so(
    cluster_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main.main(["store", "migrate", "--cluster", str(cluster_dir), "--to",
                      f"postgresql://llmgw@127.0.0.1:{nodes.free_port()}/llmgw"]) == 1
    assert "cannot connect to the store" in capsys.readouterr().err
