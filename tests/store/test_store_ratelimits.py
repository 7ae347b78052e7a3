"""Rate-limit counters on both stores (SQLite, real PostgreSQL): all or nothing, never past
the limit however many connections admit at once, corrections, keys' own limits."""

from __future__ import annotations

import asyncio

import pytest

from llmgw.spec.models import StoreSettings
from llmgw.store import keys, stores
from llmgw.store.ratelimits import Count
from llmgw.store.stores import Store

SLOT = 29_700_000  # a minute, as floor(unix time / 60)


async def open_(settings: dict[str, str]) -> Store:
    return await stores.open_store(StoreSettings.model_validate(settings))


async def test_an_admission_adds_to_every_counter_or_to_none(
        store_settings: dict[str, str]) -> None:
    store = await open_(store_settings)
    try:
        project, key = Count("p:research:requests", 2, 1), Count("k:abc:requests", 1, 1)
        first = await store.take_rate(SLOT, [project, key])
        assert (first.admitted, first.used) == (True, (1, 1))
        # The key is full: refused, and the project's counter did not move either.
        second = await store.take_rate(SLOT, [project, key])
        assert (second.admitted, second.used) == (False, (1, 1))
        other_key = await store.take_rate(SLOT, [project, Count("k:def:requests", 1, 1)])
        assert (other_key.admitted, other_key.used) == (True, (2, 1))
        full = await store.take_rate(SLOT, [project, Count("k:ghi:requests", 1, 1)])
        assert (full.admitted, full.used) == (False, (2, 0))
        # The next minute starts from nothing.
        assert (await store.take_rate(SLOT + 1, [project, key])).used == (1, 1)
    finally:
        await store.close()


async def test_tokens_are_admitted_while_the_estimate_fits_and_corrected_after(
        store_settings: dict[str, str]) -> None:
    store = await open_(store_settings)
    try:
        tokens = "p:research:tokens"
        assert (await store.take_rate(SLOT, [Count(tokens, 1000, 600)])).used == (600,)
        refused = await store.take_rate(SLOT, [Count(tokens, 1000, 500)])
        assert (refused.admitted, refused.used) == (False, (600,))
        await store.adjust_rate(SLOT, tokens, 100 - 600)  # it really used 100
        assert (await store.take_rate(SLOT, [Count(tokens, 1000, 500)])).used == (600,)
        await store.adjust_rate(SLOT, tokens, -10_000)  # never below zero
        assert (await store.take_rate(SLOT, [Count(tokens, 1000, 1000)])).used == (1000,)
        await store.adjust_rate(SLOT - 5, tokens, 50)  # a minute without a row: nothing
        assert (await store.take_rate(SLOT - 5, [Count(tokens, 1000, 1)])).used == (1,)
    finally:
        await store.close()


async def test_concurrent_admissions_on_many_connections_stop_at_the_limit(
        store_settings: dict[str, str]) -> None:
    """Four handles on the store (as four routers), 200 admissions at once, rpm 50: exactly
    50 admitted. Each admission also counts a key of its own, in a name order that differs
    from the project's, which must not deadlock."""
    handles = [await open_(store_settings) for _ in range(4)]
    try:
        async def one(i: int) -> bool:
            counts = [Count(f"{'a' if i % 2 else 'z'}:key{i % 7}:requests", 1000, 1),
                      Count("p:research:requests", 50, 1)]
            return (await handles[i % 4].take_rate(SLOT, counts)).admitted

        admitted = await asyncio.gather(*(one(i) for i in range(200)))
        assert admitted.count(True) == 50
        final = await handles[0].take_rate(SLOT, [Count("p:research:requests", 50, 1)])
        assert (final.admitted, final.used) == (False, (50,))
    finally:
        for handle in handles:
            await handle.close()


async def test_old_minutes_are_deleted_by_the_next_admission(
        store_settings: dict[str, str]) -> None:
    store = await open_(store_settings)
    try:
        name = "p:research:requests"
        await store.take_rate(SLOT, [Count(name, 5, 5)])
        await store.take_rate(SLOT + 2, [Count(name, 5, 1)])
        # The old minute's row is gone: a correction to it changes nothing, and an
        # admission there (a router with a clock far behind) starts from zero.
        assert (await store.take_rate(SLOT, [Count(name, 5, 1)])).used == (1,)
    finally:
        await store.close()


@pytest.mark.parametrize("rpm, tpm", [(None, None), (60, 100_000)])
async def test_a_keys_own_limits_are_stored_with_it(
        store_settings: dict[str, str], rpm: int | None, tpm: int | None) -> None:
    store = await open_(store_settings)
    try:
        created = await keys.create(store, "research", "ci", rpm=rpm, tpm=tpm)
        assert (created.info.rpm, created.info.tpm) == (rpm, tpm)
        verified = await keys.verify(store, created.secret)
        assert verified is not None and (verified.rpm, verified.tpm) == (rpm, tpm)
        (listed,) = await keys.list_all(store)
        assert (listed.rpm, listed.tpm) == (rpm, tpm)
    finally:
        await store.close()
