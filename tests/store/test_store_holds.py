"""Held revisions on both stores: one per model, replaced, listed, released.

Every test runs on SQLite and on a real PostgreSQL (fixture ``store_settings``).
"""

from __future__ import annotations

from llmgw.spec.models import StoreSettings
from llmgw.spec.rollouts import Hold
from llmgw.store import stores
from llmgw.store.stores import Store


async def open_(settings: dict[str, str]) -> Store:
    return await stores.open_store(StoreSettings.model_validate(settings))


async def test_holds_round_trip_one_per_model_and_release(
    store_settings: dict[str, str],
) -> None:
    store = await open_(store_settings)
    try:
        assert await store.holds() == []
        first = Hold("chat", "d1", "1a2b3c4", "p50 TTFT 4.1 s vs 0.3 s", 100.0)
        again = Hold("chat", "d2", None, "probe answer holds no completion text", 200.0)
        other = Hold("tiny", "d3", "5e6f7a8", "error rate 12.0% vs 0.0%", 150.0)
        await store.put_hold(first)
        await store.put_hold(other)
        assert await store.holds() == [first, other]
        await store.put_hold(again)  # a newer failure of the same model replaces the older
        assert await store.holds() == [again, other]
        assert await store.release_holds(["tiny", "absent"]) == [other]
        assert await store.holds() == [again]
        await store.put_hold(other)
        assert await store.release_holds() == [again, other]
        assert await store.holds() == []
        assert await store.release_holds() == []
    finally:
        await store.close()
