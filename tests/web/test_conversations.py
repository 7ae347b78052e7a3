"""Conversations: kept only where a project says so, and purged past retention.

The store tests run on both stores (fixture ``store_settings``).
"""

from __future__ import annotations

from pathlib import Path

from llmgw.daemon import housekeeping
from llmgw.spec.models import Cluster, StoreSettings
from llmgw.store import conversations, stores

DAY = 86400.0
NOW = 1_800_000_000.0


def spec(retention: str | None) -> Cluster:
    notes = {"conversations": {"retention": retention}} if retention else {}
    return Cluster.model_validate({"cluster": {"name": "lab"},
                                   "projects": {"notes": notes, "research": {}}})


async def test_the_daemon_purges_conversations_past_retention_and_their_text(
    store_settings: dict[str, str], tmp_path: Path
) -> None:
    db = await stores.open_store(StoreSettings.model_validate(store_settings))
    try:
        old = await conversations.create(db, "cy", "notes", "old", now=NOW - 31 * DAY)
        await conversations.append(db, old, "cy", [("user", "old-secret-text")],
                                   now=NOW - 31 * DAY)
        new = await conversations.create(db, "cy", "notes", "new", now=NOW - DAY)
        await conversations.append(db, new, "cy", [("user", "new-text")], now=NOW - DAY)
        assert await housekeeping.purge_once(db, spec("30d"), NOW) == 1
        assert [c.id for c in await conversations.list_for(db, "cy")] == [new]
        assert await conversations.messages(db, old) == []
        assert [m.content for m in await conversations.messages(db, new)] == ["new-text"]
        # Turning conversations off for the project deletes what it kept.
        assert await housekeeping.purge_once(db, spec(None), NOW) == 1
        assert await conversations.list_for(db, "cy") == []
        assert await conversations.messages(db, new) == []
    finally:
        await db.close()
    if db.kind == "sqlite":  # the text is gone from the file and its WAL, not just hidden
        data = b"".join(p.read_bytes() for p in tmp_path.iterdir() if p.is_file())
        assert b"old-secret-text" not in data and b"new-text" not in data


async def test_a_conversation_is_visible_only_to_its_owner(
    store_settings: dict[str, str]
) -> None:
    db = await stores.open_store(StoreSettings.model_validate(store_settings))
    try:
        cid = await conversations.create(db, "cy", "notes", "mine", now=NOW)
        assert await conversations.get(db, cid, "bob") is None
        assert not await conversations.append(db, cid, "bob", [("user", "intruder")], now=NOW)
        assert not await conversations.delete(db, cid, "bob")
        assert await conversations.messages(db, cid) == []
        assert await conversations.get(db, cid, "cy") is not None
        assert await conversations.append(db, cid, "cy", [("user", "a"), ("assistant", "b")],
                                          now=NOW + 1)
        found = await conversations.get(db, cid, "cy")
        assert found is not None and found.updated_at == NOW + 1
        assert [(m.role, m.content) for m in await conversations.messages(db, cid)] == [
            ("user", "a"), ("assistant", "b")]
        assert await conversations.delete(db, cid, "cy")
        assert await conversations.messages(db, cid) == []
    finally:
        await db.close()


def test_retention_must_be_given_and_positive() -> None:
    import pytest
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="retention"):
        Cluster.model_validate({"cluster": {"name": "lab"},
                                "projects": {"p": {"conversations": {}}}})
    with pytest.raises(ValidationError, match="longer than zero"):
        spec("0s")


def test_admin_shows_fetches_in_progress_from_the_fleet() -> None:
    from llmgw.daemon import admin
    from llmgw.fleet.types import Fetch, Fleet, NodeReport

    fleet = Fleet(nodes={"gpu-01": NodeReport(node="gpu-01", fetches=[
        Fetch(target="org/big", state="running", bytes_done=250, bytes_total=1000),
        Fetch(target="org/small", state="done", bytes_done=10, bytes_total=10),
        Fetch(target="org/gone", state="failed", error="404 from the hub"),
    ])})
    shown = admin.progress(fleet)
    assert [(p.name, p.percent, p.state) for p in shown] == [
        ("org/big", 25, "running"), ("org/gone", None, "failed: 404 from the hub")]


async def test_replace_answer_swaps_only_a_last_answer_in_one_write(
    store_settings: dict[str, str]
) -> None:
    db = await stores.open_store(StoreSettings.model_validate(store_settings))
    try:
        cid = await conversations.create(db, "cy", "notes", "regen", now=NOW)
        await conversations.append(db, cid, "cy", [("user", "q"), ("assistant", "a1")], now=NOW)

        async def shown() -> list[str]:
            return [m.content for m in await conversations.messages(db, cid)]
        assert await conversations.append(db, cid, "cy", [("assistant", "a2")], now=NOW + 1,
                                          replace_answer=True)
        assert await shown() == ["q", "a2"]
        # A conversation that ends with a question keeps it: the answer is added.
        await conversations.append(db, cid, "cy", [("user", "q2")], now=NOW + 2)
        assert await conversations.append(db, cid, "cy", [("assistant", "b")], now=NOW + 3,
                                          replace_answer=True)
        assert await shown() == ["q", "a2", "q2", "b"]
        # Someone else's conversation: nothing is deleted, nothing added.
        assert not await conversations.append(db, cid, "bob", [("assistant", "x")], now=NOW,
                                              replace_answer=True)
        assert await shown() == ["q", "a2", "q2", "b"]
    finally:
        await db.close()
