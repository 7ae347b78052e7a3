"""Whether a store tells routers of key changes as they happen (the PostgreSQL trigger of
migration 19, ``llmgw.store.outages``): for tests that move or restore a store."""

from __future__ import annotations

import asyncio

from llmgw.store import keys
from llmgw.store.stores import Store


async def revoke_is_noticed(store: Store, key_id: str) -> bool:
    """Revoke ``key_id`` through the store; True when a watch on the store is told of it
    (False where the store sends no notices: SQLite)."""
    seen: asyncio.Queue[str | None] = asyncio.Queue()
    watch = await store.watch_keys(seen.put_nowait)
    if watch is None:
        await keys.revoke(store, key_id)
        return False
    try:
        assert await asyncio.wait_for(seen.get(), 30) is None  # connected: read all again
        await keys.revoke(store, key_id)
        return await asyncio.wait_for(seen.get(), 30) == key_id
    finally:
        await watch.close()
