"""Settlements sent together: every one written, each waiter back only once its own is,
fewer store calls than settlements under load, and a store error reaching every waiter."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

from llmgw.router.settlements import Settlements
from llmgw.store.stores import StoreError


class _Store:
    """settle_reservations only: what the batcher calls. Each call takes a turn of the
    loop, as a round trip does, and can be made to fail."""

    def __init__(self) -> None:
        self.calls: list[list[tuple[str, float]]] = []
        self.written: dict[str, float] = {}
        self.fail = False
        self.gate = asyncio.Event()
        self.gate.set()

    async def settle_reservations(self, settled: Sequence[tuple[str, float]]) -> None:
        self.calls.append(list(settled))
        await self.gate.wait()
        await asyncio.sleep(0)
        if self.fail:
            raise StoreError("store down")
        self.written.update(settled)


async def test_concurrent_settlements_share_round_trips_and_all_land() -> None:
    store = _Store()
    settlements = Settlements(store)  # type: ignore[arg-type]
    store.gate.clear()  # the first call waits: the others queue behind it
    waiters = [asyncio.create_task(settlements.settle("r0", 0.0))]
    for _ in range(3):
        await asyncio.sleep(0)
    assert store.calls == [[("r0", 0.0)]]
    waiters += [asyncio.create_task(settlements.settle(f"r{i}", i / 10)) for i in range(1, 20)]
    await asyncio.sleep(0)
    store.gate.set()
    await asyncio.gather(*waiters)
    assert store.written == {f"r{i}": i / 10 for i in range(20)}
    assert len(store.calls) == 2  # the first alone, then the 19 that waited behind it
    assert sorted(r for call in store.calls for r, _ in call) == sorted(store.written)


async def test_a_settlement_returns_only_once_its_batch_is_written() -> None:
    store = _Store()
    settlements = Settlements(store)  # type: ignore[arg-type]
    store.gate.clear()
    waiter = asyncio.create_task(settlements.settle("r1", 0.5))
    for _ in range(5):
        await asyncio.sleep(0)
    assert not waiter.done() and "r1" not in store.written
    store.gate.set()
    await waiter
    assert store.written == {"r1": 0.5}


async def test_a_lone_settlement_is_one_call() -> None:
    store = _Store()
    settlements = Settlements(store)  # type: ignore[arg-type]
    await settlements.settle("r1", 0.5)
    await settlements.settle("r2", 0.25)
    assert store.calls == [[("r1", 0.5)], [("r2", 0.25)]]


async def test_a_store_error_reaches_every_waiter_of_its_batch_and_the_next_batch_retries(
) -> None:
    store = _Store()
    settlements = Settlements(store)  # type: ignore[arg-type]
    store.fail = True
    results = await asyncio.gather(*[settlements.settle(f"r{i}", 0.1) for i in range(3)],
                                   return_exceptions=True)
    assert all(isinstance(r, StoreError) for r in results)
    store.fail = False
    await settlements.settle("r9", 0.2)
    assert store.written == {"r9": 0.2}


async def test_a_cancelled_waiter_leaves_the_batch_to_the_others() -> None:
    store = _Store()
    settlements = Settlements(store)  # type: ignore[arg-type]
    store.gate.clear()
    first = asyncio.create_task(settlements.settle("r1", 0.1))
    await asyncio.sleep(0)
    second = asyncio.create_task(settlements.settle("r2", 0.2))
    third = asyncio.create_task(settlements.settle("r3", 0.3))
    await asyncio.sleep(0)
    second.cancel()
    store.gate.set()
    await asyncio.gather(first, third)
    with pytest.raises(asyncio.CancelledError):
        await second
    assert store.written == {"r1": 0.1, "r2": 0.2, "r3": 0.3}
