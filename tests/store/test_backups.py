"""`llmgw store backup FILE` and `llmgw store restore FILE`, on SQLite and a real PostgreSQL.

The backup is taken while the store's usage path keeps appending rows; the
restore into a fresh store must hold exactly what the backup said it held, the
usage rows must be the first N ever written (a prefix: no row missing before a
later one), and each project's spend must equal its rows (spend and usage are
written in one transaction, so a torn copy shows as a difference).
"""

from __future__ import annotations

import asyncio
import re
import sqlite3
import stat
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from support import keynotices, postgres
from support.postgres import PgServer

from llmgw.cli import main
from llmgw.spec.models import StoreSettings
from llmgw.store import backups, keys, migrations, stores, usages, users
from llmgw.store.usages import UsageRow

PREFILL = {"sqlite": 20_000, "postgresql": 5_000}
COST = 0.25  # exact in binary: sums compare with ==
WRITER_TS = 1_000_000.0  # the concurrent writer's rows: ts = WRITER_TS + its sequence number


def cluster(directory: Path, store: dict[str, str]) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    section = ", ".join(f"{k}: '{v}'" for k, v in store.items())
    (directory / "cluster.yaml").write_text(
        "cluster:\n  name: lab\n  store: {" + section + "}\nprojects:\n"
        "  research: {budget_usd: 100000}\n"
    )
    return directory


@pytest.fixture(params=["sqlite", "postgresql"])
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def make_store(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> Callable[[str], dict[str, str]]:
    """A new empty store of the test's kind, as a ``cluster.store`` section."""

    def make(name: str) -> dict[str, str]:
        if kind == "sqlite":
            return {"path": str(tmp_path / name / "state" / "llmgw.db")}
        server: PgServer = request.getfixturevalue("postgres_server")
        return server.database().settings

    return make


def row(ts: float, key_id: str) -> UsageRow:
    return UsageRow(
        ts=ts,
        project="research",
        key_id=key_id,
        model="chat",
        endpoint="/v1/chat/completions",
        status=200,
        prompt_tokens=3,
        completion_tokens=5,
        latency_ms=12.0,
        cost_usd=COST,
        request_id=f"r{ts}",  # the column and its unique index travel too
    )


def counts(output: str) -> dict[str, int]:
    """The table of rows per table that backup and restore print."""
    return {name: int(n) for name, n in re.findall(r"^  ([a-z_]+)\s+(\d+)$", output, re.M)}


async def fill(settings: StoreSettings, n: int) -> tuple[str, str]:
    store = await stores.open_store(settings)
    try:
        made = await keys.create(store, "research", "ci")
        await users.create(store, "ada", "correct horse battery", projects=["research"])
        await usages.insert(store, [row(1000.0 + i, made.info.id) for i in range(n)])
        return made.secret, made.info.id
    finally:
        await store.close()


class Load:
    """The concurrent writer's count of committed rows, read from the backup's thread."""

    def __init__(self) -> None:
        self.written = 0
        self.writing = True
        self.remaining: list[int] = []  # pages left after each SQLite backup step

    def pace(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """Make every step of the SQLite backup wait for a usage row committed after it,
        so the writer's commits fall between all the steps (and record the pages left:
        a backup that restarts shows them going up)."""
        real = backups._pages

        def paced(what: str, progress: Callable[[str], None]) -> Callable[[int, int, int], None]:
            report = real(what, progress)

            def step(status: int, remaining: int, total: int) -> None:
                report(status, remaining, total)
                if what.startswith("backing up") and remaining:
                    self.remaining.append(remaining)
                    seen, deadline = self.written, time.monotonic() + 5
                    while self.writing and self.written == seen and time.monotonic() < deadline:
                        time.sleep(0.0002)

            return step

        monkeypatch.setattr(backups, "_pages", paced)


async def backup_under_load(
    settings: StoreSettings,
    key_id: str,
    argv: list[str],
    load: Load,
    capsys: pytest.CaptureFixture[str],
) -> tuple[int, str, int]:
    """Run ``llmgw store backup`` while the store's usage path appends one row at a time;
    the exit code, what it printed, and the rows written while it ran."""
    store = await stores.open_store(settings)
    done = asyncio.Event()

    async def writer() -> None:
        deadline = time.monotonic() + 20  # a backup that never ends must not hang the test
        while not done.is_set() and time.monotonic() < deadline:
            await usages.insert(store, [row(WRITER_TS + load.written, key_id)])
            load.written += 1
        load.writing = False

    try:
        task = asyncio.create_task(writer())
        while load.written < 20:  # the writer is going before the backup starts
            await asyncio.sleep(0.001)
        before = load.written
        code = await asyncio.to_thread(main.main, argv)
        during = load.written - before
        done.set()
        await task
        return code, capsys.readouterr().out, during
    finally:
        await store.close()


async def restored_rows(
    settings: StoreSettings, secret: str
) -> tuple[list[int], list[float], float, float, bool]:
    store = await stores.open_store(settings)
    try:
        page = await store.usage_after(0, 10**7)
        spend = (await usages.spend_by_project(store))["research"]
        period = (await store.spend_by_project({"research": 0.0}))["research"]
        return (
            [i for i, _ in page],
            [r.ts for _, r in page],
            spend,
            period,
            await keys.verify(store, secret) is not None,
        )
    finally:
        await store.close()


async def notices_after_restore(settings: StoreSettings, key_id: str) -> bool:
    store = await stores.open_store(settings)
    try:
        return await keynotices.revoke_is_noticed(store, key_id)
    finally:
        await store.close()


def test_a_backup_under_load_restores_to_a_consistent_instant(
    kind: str,
    make_store: Callable[[str], dict[str, str]],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # SQLite: many small steps of the backup API, a commit of the writer after each.
    monkeypatch.setattr(backups, "PAGES_PER_STEP", 8)
    load = Load()
    load.pace(monkeypatch)
    section = make_store("source")
    source = StoreSettings.model_validate(section)
    source_dir = cluster(tmp_path / "source", section)
    secret, key_id = asyncio.run(fill(source, PREFILL[kind]))
    file = tmp_path / "llmgw.backup"

    code, out, during = asyncio.run(
        backup_under_load(
            source,
            key_id,
            ["store", "backup", "--cluster", str(source_dir), str(file)],
            load,
            capsys,
        )
    )
    assert code == 0
    assert during > 0, "no usage row was written while the backup ran"
    if kind == "sqlite":  # a write after every step, and the copy never started over
        # dozens of steps (how many depends on how far the prefill's pages grew: ~100)
        assert len(load.remaining) > 50
        assert load.remaining == sorted(load.remaining, reverse=True)
    assert stat.S_IMODE(file.stat().st_mode) == 0o600
    backed_up = counts(out)
    assert backed_up["keys"] == 1 and backed_up["users"] == 1
    assert PREFILL[kind] <= backed_up["usage"] < PREFILL[kind] + load.written  # not the end
    assert set(backed_up) == backups.known_tables() - {"llmgw_schema"}

    target_settings = make_store("target")
    target_dir = cluster(tmp_path / "target", target_settings)
    assert main.main(["store", "restore", "--cluster", str(target_dir), str(file)]) == 0
    restored = capsys.readouterr()
    assert counts(restored.out) == backed_up
    assert "restoring" in restored.err  # progress

    ids, stamps, spend, period, verifies = asyncio.run(
        restored_rows(StoreSettings.model_validate(target_settings), secret)
    )
    n = backed_up["usage"]
    assert ids == list(range(1, n + 1))  # a prefix of the rows ever written, none skipped
    assert stamps[PREFILL[kind] :] == [WRITER_TS + i for i in range(n - PREFILL[kind])]
    assert spend == period == COST * n  # spend and usage of the same instant
    assert verifies  # keys travel hashed and keep working
    # PostgreSQL: the keys' change notices (a trigger and its function) are restored too
    assert asyncio.run(notices_after_restore(StoreSettings.model_validate(target_settings),
                                             key_id)) == (kind == "postgresql")


def test_restore_refuses_a_store_that_holds_rows_unless_forced(
    kind: str,
    make_store: Callable[[str], dict[str, str]],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    source = make_store("source")
    source_dir = cluster(tmp_path / "source", source)
    asyncio.run(fill(StoreSettings.model_validate(source), 3))
    file = tmp_path / "llmgw.backup"
    assert main.main(["store", "backup", "--cluster", str(source_dir), str(file)]) == 0
    capsys.readouterr()
    target = make_store("target")
    target_dir = cluster(tmp_path / "target", target)
    asyncio.run(fill(StoreSettings.model_validate(target), 7))

    assert main.main(["store", "restore", "--cluster", str(target_dir), str(file)]) == 1
    err = capsys.readouterr().err
    assert "is not empty (" in err and "usage 7" in err and "--force" in err
    assert "Traceback" not in err
    assert main.main(["store", "restore", "--cluster", str(target_dir), "--force", str(file)]) == 0
    assert counts(capsys.readouterr().out)["usage"] == 3

    # A daemon holding the lease: refused, --force or not.
    async def lead() -> None:
        store = await stores.open_store(StoreSettings.model_validate(target))
        try:
            await store.acquire_lease("reconciler", "host-a:123", 30)
        finally:
            await store.close()

    asyncio.run(lead())
    assert main.main(["store", "restore", "--cluster", str(target_dir), "--force", str(file)]) == 1
    err = capsys.readouterr().err
    assert "is in use (host-a:123 holds the reconciler lease" in err


def sqlite_not_llmgw(path: Path) -> None:
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE t (x)")


def sqlite_too_new(path: Path) -> None:
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE keys (x)")
        conn.execute("CREATE TABLE usage (x)")
        conn.execute(f"PRAGMA user_version = {migrations.LATEST + 1}")


@pytest.mark.parametrize(
    ("make", "message"),
    [
        pytest.param(None, "{file}: no such file", id="missing"),
        pytest.param(lambda p: p.mkdir(), "{file}: is a directory", id="directory"),
        pytest.param(
            lambda p: p.write_bytes(b"not a backup\n" * 10),
            "{file}: not an llmgw backup (neither an SQLite database nor a pg_dump",
            id="not-a-backup",
        ),
        pytest.param(
            sqlite_not_llmgw,
            "{file}: not an llmgw backup (no keys or usage table)",
            id="another-sqlite-database",
        ),
        pytest.param(sqlite_too_new, "{file}: written by a newer llmgw", id="newer-schema"),
        pytest.param(
            lambda p: p.write_bytes(b"PGDMP\x01\x0e\x00" + b"\x00" * 40),
            "{file}: not a readable pg_dump archive",
            id="damaged-pg-dump",
        ),
    ],
)
def test_restore_of_bad_input_says_where_and_changes_nothing(
    make: Callable[[Path], None] | None,
    message: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    if "pg_dump archive" in message and postgres.bindir() is None:
        pytest.skip("PostgreSQL's client programs are not installed (make sysdeps)")
    store = tmp_path / "c" / "state" / "llmgw.db"
    directory = cluster(tmp_path / "c", {"path": str(store)})
    file = tmp_path / "llmgw.backup"
    if make is not None:
        make(file)
    assert main.main(["store", "restore", "--cluster", str(directory), str(file)]) == 1
    err = capsys.readouterr().err
    assert f"error: {message.format(file=file)}" in err
    assert "Traceback" not in err
    assert not store.exists()


def test_a_backup_restores_only_into_a_store_of_its_kind(
    postgres_server: PgServer,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    sqlite_dir = cluster(tmp_path / "s", {"path": str(tmp_path / "s" / "llmgw.db")})
    database = postgres_server.database()
    pg_dir = cluster(tmp_path / "p", database.settings)
    asyncio.run(fill(StoreSettings(path=str(tmp_path / "s" / "llmgw.db")), 2))
    asyncio.run(fill(StoreSettings.model_validate(database.settings), 2))
    assert (
        main.main(["store", "backup", "--cluster", str(sqlite_dir), str(tmp_path / "s.backup")])
        == 0
    )
    assert main.main(["store", "backup", "--cluster", str(pg_dir), str(tmp_path / "p.backup")]) == 0
    out = capsys.readouterr()
    assert postgres.PASSWORD not in out.out + out.err  # never printed, nor on a command line

    assert (
        main.main(
            ["store", "restore", "--cluster", str(pg_dir), "--force", str(tmp_path / "s.backup")]
        )
        == 1
    )
    err = capsys.readouterr().err
    assert (
        f"{tmp_path / 's.backup'}: a backup of a SQLite store, but the cluster's store is "
        f"PostgreSQL ({database.url})" in err
    )
    assert (
        main.main(
            [
                "store",
                "restore",
                "--cluster",
                str(sqlite_dir),
                "--force",
                str(tmp_path / "p.backup"),
            ]
        )
        == 1
    )
    err = capsys.readouterr().err
    assert "a backup of a PostgreSQL store, but the cluster's store is SQLite" in err
    assert "Traceback" not in err


def test_backup_refuses_an_existing_file_and_a_missing_store(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    directory = cluster(tmp_path / "c", {"path": str(tmp_path / "c" / "state" / "llmgw.db")})
    file = tmp_path / "llmgw.backup"
    assert main.main(["store", "backup", "--cluster", str(directory), str(file)]) == 1
    assert "state/llmgw.db: no store there: nothing to back up" in capsys.readouterr().err
    assert not file.exists() and not list(tmp_path.glob(".*partial"))
    file.write_text("an older backup\n")
    assert main.main(["store", "backup", "--cluster", str(directory), str(file)]) == 1
    assert f"error: {file}: exists; remove it or name another file" in capsys.readouterr().err
    assert file.read_text() == "an older backup\n"
