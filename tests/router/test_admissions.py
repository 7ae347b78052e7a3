"""The admission queue on its own: turns between projects, bounds, timeout, leaving."""

from __future__ import annotations

import asyncio

import pytest

from llmgw.router.admissions import Admissions
from llmgw.router.errors import ApiError


class Slots:
    """A model's free slots, as the route table would count them."""

    def __init__(self, free: int) -> None:
        self.free = free

    def __call__(self, model: str, cap: int | None) -> int | None:
        return None if cap is None else self.free


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def queue_up(admissions: Admissions, order: list[str], who: list[str],
                   timeout: float = 30.0) -> list[asyncio.Task[float | None]]:
    """One request per name in ``who`` (its project), queued in that order; each appends
    its name to ``order`` once admitted, and takes its slot (as picking a replica does)."""
    async def one(project: str, index: int) -> float | None:
        waited = await admissions.admit("chat", project, cap=1, limit=100, timeout=timeout)
        order.append(f"{project}{index}")
        slots = admissions._free
        assert isinstance(slots, Slots)
        slots.free = max(0, slots.free - 1)
        return waited

    counts: dict[str, int] = {}
    tasks = []
    for project in who:
        counts[project] = counts.get(project, 0) + 1
        tasks.append(asyncio.create_task(one(project, counts[project])))
        await settle()
    return tasks


async def test_a_free_slot_admits_at_once_and_no_cap_never_queues() -> None:
    admissions = Admissions(Slots(1))
    assert await admissions.admit("chat", "a", cap=1, limit=10, timeout=1) is None
    assert await admissions.admit("chat", "a", cap=None, limit=0, timeout=1) is None
    assert admissions.depths() == {}


async def test_projects_take_turns_and_each_line_is_first_come_first_served() -> None:
    slots = Slots(0)
    admissions = Admissions(slots)
    order: list[str] = []
    # A floods the queue before B and C ask once each.
    tasks = await queue_up(admissions, order, ["a"] * 5 + ["b", "c", "b"])
    assert admissions.depths() == {"chat": 8}
    for _ in range(8):  # one slot at a time, as requests end
        slots.free = 1
        admissions.pump("chat")
        slots.free = 0
        await settle()
    await asyncio.gather(*tasks)
    assert order == ["a1", "b1", "c1", "a2", "b2", "a3", "a4", "a5"]
    assert admissions.depths() == {}


async def test_a_newcomer_does_not_take_a_slot_handed_to_a_waiter() -> None:
    slots = Slots(0)
    admissions = Admissions(slots)
    order: list[str] = []
    tasks = await queue_up(admissions, order, ["a"])
    slots.free = 1
    admissions.pump("chat")  # handed to a1, which has not run yet; b asks right now:
    with pytest.raises(ApiError, match="queue_timeout|waited"):
        await admissions.admit("chat", "b", cap=1, limit=10, timeout=0.05)
    assert order == ["a1"]  # b queued behind the slot handed to a1, and timed out
    await asyncio.gather(*tasks)


async def test_a_full_queue_answers_503_queue_full_with_retry_after() -> None:
    admissions = Admissions(Slots(0))
    tasks = await queue_up(admissions, [], ["a", "a"])
    with pytest.raises(ApiError) as caught:
        await admissions.admit("chat", "b", cap=1, limit=2, timeout=5)
    error = caught.value
    assert (error.status, error.code, error.type) == (503, "queue_full", "server_error")
    assert error.headers == {"Retry-After": "1"}
    assert "2 requests are queued" in error.message
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    assert admissions.depths() == {}


async def test_limit_zero_means_no_queue_at_all() -> None:
    admissions = Admissions(Slots(0))
    with pytest.raises(ApiError, match="0 requests are queued"):
        await admissions.admit("chat", "a", cap=1, limit=0, timeout=5)


async def test_waiting_past_the_timeout_answers_503_queue_timeout_and_leaves() -> None:
    slots = Slots(0)
    admissions = Admissions(slots)
    order: list[str] = []
    tasks = await queue_up(admissions, order, ["a"], timeout=0.05)
    results = await asyncio.gather(*tasks, return_exceptions=True)
    error = results[0]
    assert isinstance(error, ApiError)
    assert (error.status, error.code) == (503, "queue_timeout")
    assert error.headers == {"Retry-After": "1"}
    assert "routing.queue_timeout" in error.message
    assert admissions.depths() == {}
    slots.free = 1
    admissions.pump("chat")  # nothing left to wake
    assert order == []


async def test_a_client_that_leaves_leaves_the_queue() -> None:
    slots = Slots(0)
    admissions = Admissions(slots)
    order: list[str] = []
    tasks = await queue_up(admissions, order, ["a", "b", "a"])
    tasks[0].cancel()  # a1's client hangs up while queued
    await settle()
    assert admissions.depths() == {"chat": 2}
    for _ in range(2):
        slots.free = 1
        admissions.pump("chat")
        await settle()
    assert order == ["a2", "b1"]  # a1 left: a's turn went to its next request
    await asyncio.gather(*tasks, return_exceptions=True)
    assert admissions.depths() == {}


async def test_a_slot_handed_to_a_client_that_left_goes_to_the_next() -> None:
    slots = Slots(0)
    admissions = Admissions(slots)
    order: list[str] = []
    tasks = await queue_up(admissions, order, ["a", "b"])
    slots.free = 1
    admissions.pump("chat")  # a1 is handed the slot ...
    tasks[0].cancel()  # ... and its client leaves before it runs
    await settle()
    assert order == ["b1"]
    await asyncio.gather(*tasks, return_exceptions=True)


async def test_removing_the_cap_lets_every_waiter_through() -> None:
    admissions = Admissions(Slots(0))
    order: list[str] = []
    tasks = await queue_up(admissions, order, ["a", "b", "a"])
    admissions.configure({})  # a spec reload without max_in_flight
    await asyncio.gather(*tasks)
    assert sorted(order) == ["a1", "a2", "b1"]
    assert admissions.depths() == {}


async def test_the_wait_is_measured_on_the_clock_given() -> None:
    now = [100.0]
    slots = Slots(0)
    admissions = Admissions(slots, clock=lambda: now[0])
    tasks = await queue_up(admissions, [], ["a"])
    now[0] = 102.5
    slots.free = 1
    admissions.pump("chat")
    assert await tasks[0] == 2.5


async def test_a_slot_freed_before_a_leaving_client_ran_skips_it() -> None:
    slots = Slots(0)
    admissions = Admissions(slots)
    order: list[str] = []
    tasks = await queue_up(admissions, order, ["a", "b"])
    tasks[0].cancel()  # its future is cancelled now; its task runs only later
    slots.free = 1
    admissions.pump("chat")  # must pass over a1, not fail on its cancelled future
    await settle()
    assert order == ["b1"]
    await asyncio.gather(*tasks, return_exceptions=True)
    assert admissions.depths() == {}
