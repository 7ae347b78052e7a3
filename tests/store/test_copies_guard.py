"""Every table of a freshly migrated store is either copied by `llmgw store migrate` or
listed, with its reason, as not copied (llmgw.store.tables): a migration that adds a
table without saying what becomes of it fails here."""

from __future__ import annotations

from pathlib import Path

from llmgw.spec.models import StoreSettings
from llmgw.store import migrations, stores, tables


async def test_every_table_is_copied_or_said_not_to_be(store_settings: dict[str, str]) -> None:
    store = await stores.open_store(StoreSettings.model_validate(store_settings))
    try:
        live = set(await store.shapes())
    finally:
        await store.close()
    assert tables.unlisted(live) == [], "add them to tables.COPIED or tables.NOT_COPIED"
    assert {t.name for t in tables.COPIED} <= live  # and no copied table is gone
    assert not {t.name for t in tables.COPIED} & set(tables.NOT_COPIED)


def test_not_copied_names_only_tables_that_exist() -> None:
    # Each store has its own bookkeeping (PostgreSQL's llmgw_schema); the rest exist on both.
    sql = " ".join(m.sqlite + m.postgres for m in migrations.MIGRATIONS)
    for name in set(tables.NOT_COPIED) - {"llmgw_schema"}:
        assert f"TABLE IF NOT EXISTS {name} " in sql or f"TABLE {name} " in sql, name


def test_the_docs_say_what_becomes_of_every_table() -> None:
    doc = (Path(__file__).resolve().parents[2] / "docs" / "ha.md").read_text()
    section = doc.split("## Moving between stores: `llmgw store migrate`")[1].split("\n## ")[0]
    for name in [t.name for t in tables.COPIED] + list(tables.NOT_COPIED):
        assert f"`{name}`" in section, name
