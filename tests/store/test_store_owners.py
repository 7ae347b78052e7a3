"""Key owners and per-project roles, on both stores (SQLite and a real PostgreSQL).

/account shows a member only the keys they made, and a project admin every key
of the project: both rest on ``keys.owner`` and ``users.admin_of``, written in
the migration titled :data:`TITLE`.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from llmgw.spec.models import StoreSettings
from llmgw.store import keys, migrations, stores, users
from llmgw.store.stores import Store

TITLE = "key owners and per-project roles (members see their own keys)"


async def open_(settings: dict[str, str]) -> Store:
    return await stores.open_store(StoreSettings.model_validate(settings))


async def test_a_key_keeps_its_owner(store_settings: dict[str, str]) -> None:
    store = await open_(store_settings)
    try:
        mine = await keys.create(store, "research", "laptop", now=1.0, owner="bob")
        cli = await keys.create(store, "research", "ci", now=2.0)
        assert mine.info.owner == "bob" and cli.info.owner is None
        verified = await keys.verify(store, mine.secret)
        assert verified is not None and verified.owner == "bob"
        assert [(k.id, k.owner) for k in await keys.list_all(store)] == [
            (mine.info.id, "bob"), (cli.info.id, None)]
        revoked = await keys.revoke(store, mine.info.id, now=3.0)
        assert revoked is not None and revoked.owner == "bob"
        # A second handle (another router, `llmgw keys`) reads the same owner.
        other = await open_(store_settings)
        try:
            assert [k.owner for k in await keys.list_all(other)] == ["bob", None]
        finally:
            await other.close()
    finally:
        await store.close()


async def test_roles_per_project(store_settings: dict[str, str]) -> None:
    store = await open_(store_settings)
    try:
        made = await users.create(store, "bob", "bob-user-pass", projects=["ops"],
                                  admin_of=["research"], now=1.0)
        assert made.projects == ("ops", "research") and made.admin_of == ("research",)
        found = await users.get(store, "bob")
        assert found == made
        assert (found.role("research"), found.role("ops"), found.role("other")) == (
            "admin", "member", None)
        # Down to member, up to admin elsewhere, and a new project joined as admin.
        await users.set_role(store, "bob", "research", "member")
        await users.set_role(store, "bob", "ops", "admin")
        after = await users.set_role(store, "bob", "lab", "admin")
        stored = await users.get(store, "bob")
        assert stored == after
        assert stored.projects == ("lab", "ops", "research")
        assert stored.admin_of == ("lab", "ops")
        assert [u.admin_of for u in await users.list_all(store)] == [("lab", "ops")]
        with pytest.raises(users.UserError, match="no user 'nobody'"):
            await users.set_role(store, "nobody", "ops", "admin")
        with pytest.raises(users.UserError, match="unknown role 'owner'"):
            await users.set_role(store, "bob", "ops", "owner")
    finally:
        await store.close()


async def test_a_store_from_before_the_migration_keeps_its_keys_and_users(
    tmp_path: Path,
) -> None:
    step = next(m for m in migrations.MIGRATIONS if m.title == TITLE)
    path = tmp_path / "old.db"
    with sqlite3.connect(path) as db:  # the schema as it was just before the step
        for migration in migrations.MIGRATIONS:
            if migration.version < step.version:
                db.executescript(migration.sqlite)
        db.execute(f"PRAGMA user_version = {step.version - 1}")
        db.execute("INSERT INTO keys (id, digest, project, name, created_at) "
                   "VALUES ('aaaaaaaaaaaa', 'x', 'research', 'old', 1.0)")
        db.execute("INSERT INTO users (name, password, admin, projects, created_at) "
                   "VALUES ('cy', 'h', 0, '[\"research\"]', 1.0)")
    db.close()
    store = await open_({"path": str(path)})
    try:
        assert await store.schema_version() == migrations.LATEST
        (old,) = await keys.list_all(store)
        assert (old.name, old.owner) == ("old", None)
        cy = await users.get(store, "cy")
        assert cy is not None and cy.role("research") == "member"
    finally:
        await store.close()
