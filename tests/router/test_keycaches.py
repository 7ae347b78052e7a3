"""The router's key cache (llmgw.router.keycaches) on a real SQLite store: a key is read
once, a re-read drops a revoked one, a notice drops one at once, and a read that a notice
overtook is not cached (it may predate the change the notice is about)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from llmgw.router.keycaches import KeyCache, StoreHealth
from llmgw.store import keys
from llmgw.store.sqlitestores import SQLiteStore
from llmgw.store.stores import KeyRow


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[SQLiteStore]:
    opened = await SQLiteStore.open(tmp_path / "llmgw.db")
    yield opened
    await opened.close()


class Counted:
    """The store's key reads, counted; ``hold`` (when set) keeps a read waiting on it."""

    def __init__(self, store: SQLiteStore) -> None:
        self.store = store
        self.kind = store.kind
        self.reads = 0
        self.hold: asyncio.Event | None = None
        self.answered = asyncio.Event()  # a held read has its answer

    async def key_row(self, key_id: str) -> KeyRow | None:
        self.reads += 1
        found = await self.store.key_row(key_id)
        if self.hold is not None:
            self.answered.set()
            await self.hold.wait()
        return found

    async def key_rows(self, ids: list[str]) -> list[KeyRow]:
        return await self.store.key_rows(ids)


def cache_of(counted: Counted) -> KeyCache:
    return KeyCache(counted, StoreHealth())  # type: ignore[arg-type]


async def test_a_key_is_read_once_and_a_re_read_drops_it_once_revoked(
        store: SQLiteStore) -> None:
    made = await keys.create(store, "research")
    counted = Counted(store)
    cache = cache_of(counted)
    for _ in range(3):
        assert await cache.row(made.info.id) is not None
    assert counted.reads == 1
    await keys.revoke(store, made.info.id)
    assert (await cache.row(made.info.id)) is not None and counted.reads == 1  # stale
    await cache.refresh()
    found = await cache.row(made.info.id)
    assert found is not None and found.revoked_at is not None and counted.reads == 2


async def test_a_notice_drops_a_key_and_a_read_it_overtook_is_not_cached(
        store: SQLiteStore) -> None:
    made = await keys.create(store, "research")
    counted = Counted(store)
    cache = cache_of(counted)
    await cache.row(made.info.id)
    cache.changed(made.info.id)  # PostgreSQL's notice: read again at the next use
    await cache.row(made.info.id)
    assert counted.reads == 2
    cache.changed(made.info.id)
    counted.hold = asyncio.Event()
    reading = asyncio.create_task(cache.row(made.info.id))
    await counted.answered.wait()  # the read has its (soon stale) answer
    assert counted.reads == 3
    cache.changed(made.info.id)  # a revoke's notice arrives meanwhile
    counted.hold.set()
    assert await reading is not None
    counted.hold = None
    await cache.row(made.info.id)
    assert counted.reads == 4  # not served from a cache filled by the overtaken read
