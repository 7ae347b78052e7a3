"""The audit log on both stores: written through ``audits.record`` only as identifiers,
read back newest first (``since``, ``limit``), purged past retention.

Every test runs on SQLite and on a real PostgreSQL (fixture ``store_settings``).
"""

from __future__ import annotations

import contextlib
import sqlite3
from pathlib import Path

import pytest

from llmgw.spec.models import StoreSettings
from llmgw.store import audits, migrations, stores
from llmgw.store.audits import Entry
from llmgw.store.stores import Store


async def open_(settings: dict[str, str]) -> Store:
    return await stores.open_store(StoreSettings.model_validate(settings))


def test_the_audit_table_comes_in_one_migration_step() -> None:
    [step] = [m for m in migrations.MIGRATIONS if "audit log" in m.title]
    assert "audit_log" in step.sqlite and "audit_log" in step.postgres


async def test_entries_round_trip_newest_first_with_since_limit_and_purge(
    store_settings: dict[str, str],
) -> None:
    store = await open_(store_settings)
    try:
        assert await store.audit_entries() == []
        for at, action in ((100.0, "key.create"), (200.0, "key.revoke"), (300.0, "logout")):
            await store.insert_audit(Entry(at, "ada", "10.0.0.7", action, "key=abc"))
        got = await store.audit_entries()
        assert [(e.at, e.action) for e in got] == [
            (300.0, "logout"), (200.0, "key.revoke"), (100.0, "key.create")]
        assert all(e.id is not None for e in got)
        assert [e.at for e in await store.audit_entries(since=200.0)] == [300.0, 200.0]
        assert [e.at for e in await store.audit_entries(limit=1)] == [300.0]
        assert await store.purge_audits(before=250.0) == 2
        assert [e.action for e in await store.audit_entries()] == ["logout"]
    finally:
        await store.close()


async def test_record_writes_identifiers_only(store_settings: dict[str, str]) -> None:
    store = await open_(store_settings)
    try:
        await audits.record(store, "ada", "127.0.0.1", "key.create", key="3f2a9c01d4e5",
                            project="research")
        await audits.record(store, "<b>eve</b>", "not an address", "login.failed",
                            user="x'; DROP TABLE keys; --", method="password",
                            projects=["research", "a b"], absent=None)
        await audits.record_cli(store, "user.delete", user="bob")
        cli, failed, created = await store.audit_entries()
        assert (created.actor, created.source, created.line()) == (
            "ada", "127.0.0.1", "key.create key=3f2a9c01d4e5 project=research")
        assert (failed.actor, failed.source, failed.line()) == (
            "?", "?", "login.failed user=? method=password projects=research,?")
        assert cli.actor.startswith("cli:") and cli.source == "cli"
        assert cli.line() == "user.delete user=bob"
        with pytest.raises(ValueError, match="not an audit action"):
            await audits.record(store, "ada", "cli", "Key Create")
    finally:
        await store.close()


async def test_a_store_that_refuses_the_write_does_not_fail_the_caller(
    tmp_path: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    store = await open_({"path": str(tmp_path / "llmgw.db")})
    try:
        with contextlib.closing(sqlite3.connect(tmp_path / "llmgw.db")) as conn:
            conn.execute("DROP TABLE audit_log")
        await audits.record(store, "ada", "cli", "logout", user="ada")  # no exception
    finally:
        await store.close()
    assert "could not write the audit entry logout user=ada" in caplog.text


async def test_housekeeping_deletes_entries_past_the_clusters_retention(
    store_settings: dict[str, str],
) -> None:
    from llmgw.daemon import housekeeping
    from llmgw.spec.models import Cluster

    now = 1_800_000_000.0
    store = await open_(store_settings)
    try:
        for age_days in (400, 100, 1):
            await store.insert_audit(Entry(now - age_days * 86400, "ada", "cli", "logout", ""))
        default = Cluster.model_validate({"cluster": {"name": "c"}})
        assert default.cluster.audit.retention == audits.DEFAULT_RETENTION == 365 * 86400
        await housekeeping.purge_once(store, default, now)
        assert len(await store.audit_entries()) == 2
        short = Cluster.model_validate({"cluster": {"name": "c", "audit": {"retention": "30d"}}})
        await housekeeping.purge_once(store, short, now)
        assert [round((now - e.at) / 86400) for e in await store.audit_entries()] == [1]
    finally:
        await store.close()


def test_a_retention_of_zero_is_refused() -> None:
    from pydantic import ValidationError

    from llmgw.spec.models import Cluster

    with pytest.raises(ValidationError, match="retention must be longer than zero"):
        Cluster.model_validate({"cluster": {"name": "c", "audit": {"retention": "0s"}}})
