"""`llmgw store migrate` moves every table: SQLite → a real PostgreSQL → SQLite.

Rows are made through the store's own code paths (keys, users, single sign-on,
sessions, conversations, the apply journal, holds, the audit log, rate-limit
counters, usage and spend, reservations, the lease and what the leader publishes),
then copied both ways and compared table by table, row by row, on both sides.
"""

from __future__ import annotations

import asyncio
import dataclasses
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from support import keynotices
from support.postgres import Database

from llmgw.cli import main
from llmgw.spec.models import StoreSettings
from llmgw.spec.rollouts import Hold
from llmgw.store import (
    audits,
    conversations,
    journals,
    keys,
    notes,
    ratelimits,
    sessions,
    stores,
    tables,
    usages,
    users,
)
from llmgw.store.reservations import Owner, Progress
from llmgw.store.stores import Store
from llmgw.store.usages import UsageRow

NOW = 1_780_000_000.0
USAGE_ROWS = 12_000  # more than two batches of 5000
PASSWORD = "correct horse battery staple"


def usage(i: int, key_id: str | None) -> UsageRow:
    return UsageRow(ts=NOW - 86_400 + i * 7.25, project="research" if i % 3 else "ci",
                    key_id=key_id, model="chat", endpoint="/v1/chat/completions",
                    status=200 if i % 50 else 429, prompt_tokens=i % 97 or None,
                    completion_tokens=i % 13, latency_ms=12.5 + i, cost_usd=0.001 * (i % 7),
                    stream=bool(i % 2), user_name="alice" if i % 5 == 0 else None,
                    request_id=f"r{i}" if i % 2 else None)


async def fill(store: Store) -> dict[str, Any]:
    """A row in every table, each through the code that writes it in production."""
    made = await keys.create(store, "research", "notebook", NOW, rpm=60, tpm=10_000,
                             owner="alice")
    revoked = await keys.create(store, "ci", "ci", NOW + 1)
    await keys.revoke(store, revoked.info.id, NOW + 2)
    await users.create(store, "alice", PASSWORD, projects=["research"], admin_of=["research"],
                       now=NOW)
    await users.create(store, "root", PASSWORD, admin=True, now=NOW)
    await users.sign_on(store, "https://idp.example.org subject-7", "bob", admin=False,
                        projects=["research"], now=NOW)
    session = await sessions.create(store, "alice", 3600, now=NOW)
    cid = await conversations.create(store, "alice", "research", "Grüße, ünïcode ✓", NOW)
    await conversations.append(store, cid, "alice", [("user", "héllo"), ("assistant", "hi")],
                               NOW + 5)
    await notes.save(store, "alice", "Ideen", "Notiz mit ünïcode ✓\nzweite Zeile", now=NOW + 6)
    applied = await store.record_apply(journals.ApplyEntry(
        NOW, 2.5, "abc123", "daemon", False, changes=(
            journals.ChangeEntry("chat", 0, "create", ("n1", "n2"), "new model", True,
                                 duration=1.25),
            journals.ChangeEntry("chat", 1, "replace", ("n1",), "spec changed", False,
                                 error="engine exited", new_replica=2, gate="p50 TTFT",
                                 rolled_back=True))))
    await store.put_hold(Hold("chat", "d" * 64, "abc123", "p50 TTFT 4.1 s vs 0.3 s", NOW))
    await audits.record_cli(store, "key.create", key=made.info.id, project="research")
    await store.take_rate(int(NOW // 60), [ratelimits.Count("p:research:requests", 100, 3),
                                           ratelimits.Count(f"k:{made.info.id}:tokens", 10**6,
                                                            400)])
    await usages.insert(store, [usage(i, made.info.id if i % 4 else None)
                                for i in range(USAGE_ROWS)])
    # Not copied, but made all the same: the test checks they stay behind.
    owner = Owner("router-a", made.info.id, "chat", "/v1/chat/completions", ts=NOW)
    admitted = await store.reserve("research", 10_000.0, 0.5, 600.0, owner)
    await store.beat("router-a", 30.0, [Progress(str(admitted.id), 10, 2, 0.01)])
    grant = await store.acquire_lease("leader", "reconciler-1", 15.0)
    assert grant is not None and admitted.id is not None
    await store.publish_routes("leader", "reconciler-1", grant.epoch, '{"routes": []}')
    await store.publish_summary("leader", "reconciler-1", grant.epoch, '{"fleet": []}')
    await store.put_signals("router-a", '{"waiting": {}}')
    return {"secret": made.secret, "revoked": revoked.secret, "token": session.token,
            "conversation": cid, "apply": applied}


async def dump(store: Store, kinds: dict[str, dict[str, tables.Kind]]) -> dict[str, list[Any]]:
    """Every table's rows, canonical (as the checksum sees them), sorted."""
    shapes = await store.shapes()
    found: dict[str, list[Any]] = {}
    async with store.reading() as reader:
        for name, shape in shapes.items():
            names = sorted(c.name for c in shape.columns)
            at = [[c.name for c in shape.columns].index(n) for n in names]
            rows = []
            async for page in reader.rows(shape):
                rows += [tuple(tables.canonical(r[i], kinds.get(name, {}).get(n, "text"))
                               for i, n in zip(at, names, strict=True)) for r in page]
            found[name] = sorted(rows, key=repr)
    return found


async def kinds_of(*settings: StoreSettings) -> dict[str, dict[str, tables.Kind]]:
    merged: dict[str, dict[str, tables.Kind]] = {}
    for one in settings:
        store = await stores.open_store(one)
        try:
            for name, shape in (await store.shapes()).items():
                for c in shape.columns:
                    was = merged.setdefault(name, {}).get(c.name, c.kind)
                    merged[name][c.name] = tables.merged_kind(name, c.name, was, c.kind)
        finally:
            await store.close()
    return merged


async def contents(settings: StoreSettings,
                   kinds: dict[str, dict[str, tables.Kind]]) -> dict[str, list[Any]]:
    store = await stores.open_store(settings)
    try:
        return await dump(store, kinds)
    finally:
        await store.close()


async def make(settings: StoreSettings) -> dict[str, Any]:
    store = await stores.open_store(settings)
    try:
        return await fill(store)
    finally:
        await store.close()


def migrate(cluster_dir: Path, to: str, password_file: Path | None = None,
            source: str | None = None, source_password: Path | None = None) -> int:
    argv = ["store", "migrate", "--cluster", str(cluster_dir), "--to", to]
    if password_file:
        argv += ["--password-file", str(password_file)]
    if source:
        argv += ["--from", source]
    if source_password:
        argv += ["--from-password-file", str(source_password)]
    return main.main(argv)


@pytest.fixture
def cluster_dir(tmp_path: Path) -> Path:
    (tmp_path / "cluster.yaml").write_text(
        "cluster:\n  name: lab\n  store: {path: state/llmgw.db}\nprojects:\n  research: {}\n"
        "  ci: {}\n")
    return tmp_path


def test_every_table_moves_sqlite_to_postgresql_and_back(
    cluster_dir: Path, postgres_db: Database, tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    sqlite = StoreSettings(path=str(cluster_dir / "state" / "llmgw.db"))
    postgres = StoreSettings.model_validate(postgres_db.settings)
    made = asyncio.run(make(sqlite))
    kinds = asyncio.run(kinds_of(sqlite, postgres))
    before = asyncio.run(contents(sqlite, kinds))
    # Every table has rows (but the copy markers, which only a copy writes): a table a new
    # migration adds must get a row here too, through the code that writes it.
    assert sorted(t for t, rows in before.items() if not rows) == ["store_copies"]

    assert migrate(cluster_dir, postgres_db.url, postgres_db.password_file) == 0
    captured = capsys.readouterr()
    assert "every table checks the same on both sides" in captured.out
    assert f"copied 2 keys, {USAGE_ROWS} usage rows and " in captured.out
    assert f"usage: 10000 of {USAGE_ROWS} rows" in captured.err  # progress while copying
    assert "not copied: reservations (1 row)" in captured.out
    assert postgres_db.password_file.read_text().strip() not in captured.out + captured.err
    on_postgres = asyncio.run(contents(postgres, kinds))
    for table in (t.name for t in tables.COPIED):
        assert on_postgres[table] == before[table], table
    for table in tables.NOT_COPIED:
        assert on_postgres.get(table, []) == [] or table == "store_copies" or \
            table == "llmgw_schema", table

    # Back into a new SQLite file, from PostgreSQL.
    back = tmp_path / "back.db"
    assert migrate(cluster_dir, f"sqlite:{back}", source=postgres_db.url,
                   source_password=postgres_db.password_file) == 0
    assert "every table checks the same on both sides" in capsys.readouterr().out
    returned = asyncio.run(contents(StoreSettings(path=str(back)), kinds))
    for table in (t.name for t in tables.COPIED):
        assert returned[table] == before[table], table
    # Byte for byte as SQLite first had them (types included), but the tables left behind.
    with sqlite3.connect(cluster_dir / "state" / "llmgw.db") as a, sqlite3.connect(back) as b:
        for table in (t.name for t in tables.COPIED):
            query = f"SELECT * FROM {table} ORDER BY 1, 2"
            assert a.execute(query).fetchall() == b.execute(query).fetchall(), table
    asyncio.run(_still_works(postgres, made))


async def _still_works(settings: StoreSettings, made: dict[str, Any]) -> None:
    """The moved rows do what they did: keys, logins, sessions, history, and new rows."""
    store = await stores.open_store(settings)
    try:
        assert await keys.verify(store, made["secret"]) is not None
        assert await keys.verify(store, made["revoked"]) is None
        assert await users.authenticate(store, "alice", PASSWORD) is not None
        assert (await sessions.lookup(store, made["token"], NOW + 60)) is not None
        assert [m.content for m in await conversations.messages(
            store, made["conversation"])] == ["héllo", "hi"]
        [entry] = await store.history()
        assert entry.id == made["apply"] and [c.ok for c in entry.changes] == [True, False]
        assert [h.model for h in await store.holds()] == ["chat"]
        spend = await usages.spend_by_project(store)
        assert spend == pytest.approx({"research": sum(usage(i, None).cost_usd
                                                       for i in range(USAGE_ROWS) if i % 3),
                                       "ci": sum(usage(i, None).cost_usd
                                                 for i in range(USAGE_ROWS) if not i % 3)})
        # The sequences moved past the copied ids: new rows take new ones.
        await usages.insert(store, [usage(0, None)])
        assert await store.usage_after(USAGE_ROWS, 10) != []
        assert await store.record_apply(journals.ApplyEntry(NOW, 1, None, "daemon", True)) \
            == made["apply"] + 1
        await audits.record_cli(store, "user.create", user="carol")
        assert len(await store.audit_entries()) == 2
        cid = made["conversation"]
        assert await conversations.append(store, cid, "alice", [("user", "again")], NOW + 9)
        # A copied request id still makes a replayed row a no-op (its unique index moved).
        before = len(await store.usage_after(0, 10**6))
        await store.insert_usage([usage(1, None)])
        assert len(await store.usage_after(0, 10**6)) == before
        # PostgreSQL tells routers of key changes: the trigger on keys works on the copy.
        key_id = keys.key_id_of(made["secret"])
        assert key_id is not None
        assert await keynotices.revoke_is_noticed(store, key_id) == (store.kind == "postgresql")
    finally:
        await store.close()


@pytest.mark.parametrize("kind", ["sqlite", "postgresql"])
def test_a_copy_that_fails_leaves_the_target_empty(
    kind: str, cluster_dir: Path, tmp_path: Path, request: pytest.FixtureRequest,
    capsys: pytest.CaptureFixture[str],
) -> None:
    source = cluster_dir / "state" / "llmgw.db"
    asyncio.run(make(StoreSettings(path=str(source))))
    # SQLite keeps whatever it is given: a status that is text, in the last usage row, which
    # is copied after keys, users, sessions, the journal and 11999 usage rows.
    with sqlite3.connect(source) as conn:
        conn.execute("UPDATE usage SET status = 'secret client text' WHERE id = ?",
                     (USAGE_ROWS,))
    if kind == "sqlite":
        target = StoreSettings(path=str(tmp_path / "target.db"))
        code = migrate(cluster_dir, f"sqlite:{target.path}")
    else:
        db: Database = request.getfixturevalue("postgres_db")
        target = StoreSettings.model_validate(db.settings)
        code = migrate(cluster_dir, db.url, db.password_file)
    err = capsys.readouterr().err
    assert code == 1
    assert (f"table usage, the row with id {USAGE_ROWS}, column status: not an integer (the "
            "column holds int values); nothing was copied") in err
    assert "secret client text" not in err and "Traceback" not in err
    left = asyncio.run(contents(target, {}))
    assert {t: rows for t, rows in left.items() if rows and t != "llmgw_schema"} == {}


def test_a_top_up_appends_what_both_sides_wrote_since(
    cluster_dir: Path, postgres_db: Database, capsys: pytest.CaptureFixture[str],
) -> None:
    sqlite = StoreSettings(path=str(cluster_dir / "state" / "llmgw.db"))
    postgres = StoreSettings.model_validate(postgres_db.settings)
    made = asyncio.run(make(sqlite))
    assert migrate(cluster_dir, postgres_db.url, postgres_db.password_file) == 0
    capsys.readouterr()

    async def meanwhile(settings: StoreSettings, who: str) -> int:
        store = await stores.open_store(settings)
        try:
            await usages.insert(store, [dataclasses.replace(usage(i, None),
                                                            request_id=f"{who}-{i}")
                                        for i in range(3)])  # new requests: new ids
            assert await conversations.append(store, made["conversation"], "alice",
                                              [("user", f"from {who}")], NOW + 50)
            await audits.record_cli(store, "user.create", user=who)
            await users.create(store, who, PASSWORD, now=NOW)
            return await store.record_apply(journals.ApplyEntry(
                NOW + 60, 1.0, who, "daemon", True, changes=(
                    journals.ChangeEntry("chat", 0, "restart", ("n1",), f"by {who}", True),)))
        finally:
            await store.close()

    asyncio.run(meanwhile(sqlite, "sqlitecarol"))  # the daemon, before it switched
    store_revoke = asyncio.run(_revoke_on(sqlite, made["secret"]))
    asyncio.run(meanwhile(postgres, "postgresdave"))  # and after, on PostgreSQL
    assert migrate(cluster_dir, postgres_db.url, postgres_db.password_file) == 0
    out = capsys.readouterr().out
    assert "topped up 0 keys, 3 usage rows and 5 other rows" in out, out
    assert "every source row is on the target" in out
    assert "target has its own too" in out

    async def look() -> None:
        store = await stores.open_store(postgres)
        try:
            assert await keys.verify(store, made["secret"]) is None  # revoked on SQLite
            assert {u.name for u in await users.list_all(store)} >= {"sqlitecarol",
                                                                        "postgresdave"}
            history = await store.history()
            # The apply from SQLite came after PostgreSQL's own: renumbered, with its change.
            assert [(e.revision, [c.why for c in e.changes]) for e in history[:2]] == [
                ("sqlitecarol", ["by sqlitecarol"]), ("postgresdave", ["by postgresdave"])]
            assert len(await usages.recent(store, 10**6)) == USAGE_ROWS + 6
            said = [m.content for m in await conversations.messages(store, made["conversation"])]
            assert said == ["héllo", "hi", "from postgresdave", "from sqlitecarol"]
        finally:
            await store.close()
    asyncio.run(look())
    assert store_revoke
    # A third run finds nothing new.
    assert migrate(cluster_dir, postgres_db.url, postgres_db.password_file) == 0
    assert "topped up 0 keys, 0 usage rows and 0 other rows" in capsys.readouterr().out


async def _revoke_on(settings: StoreSettings, secret: str) -> bool:
    store = await stores.open_store(settings)
    try:
        info = await keys.verify(store, secret)
        assert info is not None
        return await keys.revoke(store, info.id, NOW + 100) is not None
    finally:
        await store.close()


def test_a_target_with_only_logins_is_not_empty(
    cluster_dir: Path, postgres_db: Database, capsys: pytest.CaptureFixture[str],
) -> None:
    async def one_user() -> None:
        store = await stores.open_store(StoreSettings.model_validate(postgres_db.settings))
        try:
            await users.create(store, "eve", PASSWORD)
        finally:
            await store.close()
    asyncio.run(one_user())
    asyncio.run(make(StoreSettings(path=str(cluster_dir / "state" / "llmgw.db"))))
    assert migrate(cluster_dir, postgres_db.url, postgres_db.password_file) == 1
    err = capsys.readouterr().err
    assert "already holds rows not copied from" in err and "1 in users" in err


def test_a_copy_that_reads_back_differently_is_rolled_back(
    cluster_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    asyncio.run(make(StoreSettings(path=str(cluster_dir / "state" / "llmgw.db"))))
    stored = tables.stored

    def lossy(value: Any, kind: tables.Kind, flavour: Any) -> Any:  # a conversion bug
        done = stored(value, kind, flavour)
        return round(done, 2) if kind == "float" and done is not None else done
    monkeypatch.setattr(tables, "stored", lossy)
    target = tmp_path / "target.db"
    assert migrate(cluster_dir, f"sqlite:{target}") == 1
    captured = capsys.readouterr()
    assert "DIFFERS" in captured.out and "keys " in captured.out  # the table, every row
    assert ("the copy does not check out (audit_log, usage, project_spend, spend_buckets): "
            "nothing was written to the target; do not switch to it") in captured.err
    left = asyncio.run(contents(StoreSettings(path=str(target)), {}))
    assert {t: rows for t, rows in left.items() if rows} == {}


def test_a_source_file_that_is_not_there_is_refused_not_made(
    cluster_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    assert migrate(cluster_dir, f"sqlite:{tmp_path / 'to.db'}",
                   source=f"sqlite:{tmp_path / 'typo.db'}") == 1
    assert "nothing to copy" in capsys.readouterr().err
    assert not (tmp_path / "typo.db").exists() and not (tmp_path / "to.db").exists()


def test_a_top_up_onto_a_target_that_lost_usage_rows_fails_and_writes_nothing(
    cluster_dir: Path, postgres_db: Database, capsys: pytest.CaptureFixture[str],
) -> None:
    import asyncpg

    asyncio.run(make(StoreSettings(path=str(cluster_dir / "state" / "llmgw.db"))))
    assert migrate(cluster_dir, postgres_db.url, postgres_db.password_file) == 0
    dsn = stores.target_of(postgres_db.url, "", str(postgres_db.password_file)).dsn

    async def lose(n: int) -> int:
        conn = await asyncpg.connect(dsn)
        try:
            await conn.execute("DELETE FROM usage WHERE id <= $1", n)
            return int(await conn.fetchval("SELECT COUNT(*) FROM usage"))
        finally:
            await conn.close()
    assert asyncio.run(lose(10)) == USAGE_ROWS - 10
    capsys.readouterr()
    assert migrate(cluster_dir, postgres_db.url, postgres_db.password_file) == 1
    captured = capsys.readouterr()
    assert "MISSING 10" in captured.out
    assert "the copy does not check out (usage): nothing was written" in captured.err
    assert asyncio.run(lose(0)) == USAGE_ROWS - 10  # the top-up rolled back
