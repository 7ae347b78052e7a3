"""The apply journal on both stores: entries round-trip, newest first, filtered by model.

Every test runs on SQLite and on a real PostgreSQL (fixture ``store_settings``).
"""

from __future__ import annotations

import pytest

from llmgw.spec.models import StoreSettings
from llmgw.store import journals, stores
from llmgw.store.journals import ApplyEntry, ChangeEntry
from llmgw.store.stores import Store


async def open_(settings: dict[str, str]) -> Store:
    return await stores.open_store(StoreSettings.model_validate(settings))


CREATE = ChangeEntry("chat", 0, "create", ("node-1", "node-2"), "new replica", True,
                     duration=4.5)
FAILED = ChangeEntry("tiny", 0, "replace", ("node-2",), "args: ctx-size 2048 → 4096", False,
                     error="tiny-r1 on node-2: failed (exited with status 3) | out of memory",
                     duration=2.0, new_replica=1)


async def test_entries_round_trip_newest_first(store_settings: dict[str, str]) -> None:
    store = await open_(store_settings)
    try:
        assert await store.history() == []
        first = ApplyEntry(100.0, 5.0, "1a2b3c4", "daemon", True, (CREATE,))
        second = ApplyEntry(200.0, 2.5, None, "ops@laptop", False, (CREATE, FAILED))
        first_id = await store.record_apply(first)
        second_id = await store.record_apply(second)
        assert second_id > first_id
        got = await store.history()
        assert [e.id for e in got] == [second_id, first_id]
        assert got[0] == ApplyEntry(200.0, 2.5, None, "ops@laptop", False, (CREATE, FAILED),
                                    id=second_id)
        assert got[1] == ApplyEntry(100.0, 5.0, "1a2b3c4", "daemon", True, (CREATE,),
                                    id=first_id)
        # Columns for later features stay empty until those features fill them.
        assert got[0].changes[1].drift_class is None and got[0].gate is None
        assert [e.id for e in await store.history(limit=1)] == [second_id]
    finally:
        await store.close()


async def test_history_of_one_model_holds_only_its_changes(
    store_settings: dict[str, str],
) -> None:
    store = await open_(store_settings)
    try:
        only_chat = await store.record_apply(ApplyEntry(100.0, 1.0, "a", "daemon", True,
                                                        (CREATE,)))
        both = await store.record_apply(ApplyEntry(200.0, 1.0, "b", "daemon", False,
                                                   (CREATE, FAILED)))
        tiny = await store.history(model="tiny")
        assert [e.id for e in tiny] == [both]
        assert tiny[0].changes == (FAILED,)
        chat = await store.history(model="chat")
        assert [e.id for e in chat] == [both, only_chat]
        assert all(c.model == "chat" for e in chat for c in e.changes)
        assert await store.history(model="nosuch") == []
    finally:
        await store.close()


@pytest.mark.parametrize("limit", [0, -5])
async def test_limit_is_bounded(store_settings: dict[str, str], limit: int) -> None:
    store = await open_(store_settings)
    try:
        await store.record_apply(ApplyEntry(100.0, 1.0, "a", "daemon", True, (CREATE,)))
        assert await store.history(limit=limit) == []
        assert journals.MAX_LIMIT >= 100
    finally:
        await store.close()
