"""Reservations owned by a router's heartbeat, on both stores (SQLite, real PostgreSQL).

A router that stops beating leaves its reservations stale: any other router's sweep
releases them, billing exactly once what the dead router recorded. Expiry is driven by a
small heartbeat ttl and waited on, never timed.
"""

from __future__ import annotations

import asyncio

import pytest

from llmgw.spec.models import StoreSettings
from llmgw.store import reservations, stores
from llmgw.store.reservations import Owner, Progress
from llmgw.store.stores import Store
from llmgw.store.usages import UsageRow

OWNER = Owner("router-a", "key000000001", "chat", "/v1/chat/completions", stream=True)


async def open_(settings: dict[str, str]) -> Store:
    return await stores.open_store(StoreSettings.model_validate(settings))


async def until_released(store: Store, timeout: float = 30) -> list[reservations.Held]:
    async with asyncio.timeout(timeout):
        while not (released := await store.release_stale()):
            await asyncio.sleep(0.05)
    return released


async def test_a_dead_routers_reservation_is_released_billing_what_it_recorded(
        store_settings: dict[str, str]) -> None:
    """The attack: a router killed mid-stream held $3.18 of a $3 budget for an hour and its
    streamed tokens were never billed. Here it stops beating; another router's sweep frees
    the budget and bills what was recorded, once."""
    dead, other = await open_(store_settings), await open_(store_settings)
    try:
        await dead.beat("router-a", 0.5)
        held = await dead.reserve("research", 3.0, 3.18, 86400, OWNER)
        assert held.id is not None
        await dead.beat("router-a", 0.5, [Progress(held.id, 12, 40, 0.02)])
        assert (await other.reserve("research", 3.0, 0.1, 60)).id is None  # locked out
        # It stops beating here (killed). Nothing is released while its heartbeat holds...
        (listed,) = [h for h in await other.list_reservations() if h.id == held.id]
        assert listed.router == "router-a" and listed.used == pytest.approx(0.02)
        # ...and once it expired by the store's clock, the other router's sweep frees it.
        (released,) = await until_released(other)
        assert (released.id, released.project, released.used) == (held.id, "research",
                                                                   pytest.approx(0.02))
        assert await other.release_stale() == []  # billed once, whoever sweeps again
        assert await dead.release_stale() == []
        assert (await other.spend_by_project())["research"] == pytest.approx(0.02)
        (row,) = await other.recent_usage(5)
        assert (row.status, row.project, row.key_id, row.model, row.prompt_tokens,
                row.completion_tokens, row.stream) == (
            reservations.RELEASED_STATUS, "research", "key000000001", "chat", 12, 40, True)
        admitted = await other.reserve("research", 3.0, 0.1, 60)
        assert admitted.id is not None and admitted.reserved == 0  # the budget is free
    finally:
        await dead.close()
        await other.close()


async def test_a_beating_routers_reservation_is_kept(store_settings: dict[str, str]) -> None:
    store = await open_(store_settings)
    try:
        await store.beat("router-a", 600)
        held = await store.reserve("research", 3.0, 1.0, 86400, OWNER)
        assert await store.release_stale() == []
        assert [h.id for h in await store.list_reservations()] == [held.id]
        assert (await store.list_reservations())[0].router_alive
    finally:
        await store.close()


async def test_a_reservation_of_a_router_that_never_beat_is_stale(
        store_settings: dict[str, str]) -> None:
    store = await open_(store_settings)
    try:
        held = await store.reserve("research", 3.0, 1.0, 86400,
                                   Owner("ghost", None, "chat", "/v1/completions"))
        assert [h.id for h in await store.release_stale()] == [held.id]
    finally:
        await store.close()


async def test_two_sweepers_bill_each_reservation_once(store_settings: dict[str, str]) -> None:
    first, second = await open_(store_settings), await open_(store_settings)
    try:
        ids = [(await first.reserve("research", 100.0, 1.0, 86400, OWNER)).id for _ in range(20)]
        await first.beat("router-a", 600, [Progress(i or "", 1, 1, 0.5) for i in ids])
        await first.drop_heartbeat("router-a")  # a clean stop: stale at once
        swept = await asyncio.gather(*[(first if i % 2 else second).release_stale()
                                       for i in range(8)])
        assert sorted(h.id for batch in swept for h in batch) == sorted(ids)
        assert (await first.spend_by_project())["research"] == pytest.approx(10.0)
    finally:
        await first.close()
        await second.close()


async def test_release_by_id_and_all(store_settings: dict[str, str]) -> None:
    store = await open_(store_settings)
    try:
        await store.beat("router-a", 600)
        a, b, c = [(await store.reserve("research", 100.0, 1.0, 86400, OWNER)).id
                   for _ in range(3)]
        assert [h.id for h in await store.release_reservations([b or "", "0" * 16])] == [b]
        assert {h.id for h in await store.list_reservations()} == {a, c}
        assert {h.id for h in await store.release_reservations(None)} == {a, c}
        assert await store.list_reservations() == []
        assert (await store.spend_by_project()).get("research", 0.0) == 0  # nothing recorded
    finally:
        await store.close()


async def test_a_router_that_comes_back_bills_only_the_rest(
        store_settings: dict[str, str]) -> None:
    """Frozen (SIGSTOP, or cut off from the store) past the bound, not dead: its
    reservation was released and billed what it recorded; its request's own row, written
    later, bills only the rest, so the request is charged once in all."""
    frozen, other = await open_(store_settings), await open_(store_settings)
    try:
        await frozen.beat("router-a", 0.5)
        held = await frozen.reserve("research", 3.0, 1.0, 86400, OWNER)
        assert held.id is not None
        await frozen.beat("router-a", 0.5, [Progress(held.id, 12, 40, 0.02)])
        await until_released(other)
        await frozen.beat("router-a", 600, [Progress(held.id, 12, 90, 0.9)])  # it wakes up
        assert await other.release_stale() == []
        full = UsageRow(ts=2000.0, project="research", key_id="key000000001", model="chat",
                        endpoint="/v1/chat/completions", status=200, prompt_tokens=12,
                        completion_tokens=100, latency_ms=9.0, cost_usd=0.05, stream=True)
        await frozen.insert_usage([full], [held.id])
        assert (await other.spend_by_project())["research"] == pytest.approx(0.05)
        rows = sorted(await other.recent_usage(5), key=lambda r: r.status)
        assert [(r.status, r.prompt_tokens, r.completion_tokens, round(r.cost_usd, 6))
                for r in rows] == [(200, 0, 60, 0.03), (reservations.RELEASED_STATUS, 12, 40, 0.02)]
        assert await other.list_reservations() == []
    finally:
        await frozen.close()
        await other.close()


@pytest.mark.parametrize("settled, expected", [
    pytest.param([None], [(10, 100, 0.5)], id="no reservation: as is"),
    pytest.param(["a"], [(10, 100, 0.5)], id="not released: as is"),
    pytest.param(["r"], [(6, 70, 0.4)], id="released: the rest"),
    pytest.param([], [(10, 100, 0.5)], id="nothing settled"),
])
def test_deduct(settled: list[str | None], expected: list[tuple[int, int, float]]) -> None:
    row = UsageRow(ts=1.0, project="p", key_id=None, model="m", endpoint="/v1/completions",
                   status=200, prompt_tokens=10, completion_tokens=100, latency_ms=1.0,
                   cost_usd=0.5)
    out = reservations.deduct([row], settled, {"r": (4, 30, 0.1)})
    assert [(r.prompt_tokens, r.completion_tokens, round(r.cost_usd, 6)) for r in out] == expected


def test_deduct_never_goes_below_zero() -> None:
    row = UsageRow(ts=1.0, project="p", key_id=None, model="m", endpoint="/v1/completions",
                   status=499, prompt_tokens=None, completion_tokens=3, latency_ms=1.0,
                   cost_usd=0.01)
    (out,) = reservations.deduct([row], ["r"], {"r": (4, 30, 0.1)})
    assert (out.prompt_tokens, out.completion_tokens, out.cost_usd) == (None, 0, 0.0)
