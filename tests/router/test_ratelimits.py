"""The per-minute window of llmgw.router.ratelimits with an injected clock, on a real
SQLite store: admission, refusal with Retry-After and headers, the next minute, tokens
corrected to their real use, the local fast path, and a store that is gone."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from llmgw.router import ratelimits
from llmgw.router.errors import ApiError
from llmgw.router.ratelimits import RateLimiter, limits_of
from llmgw.spec.models import StoreSettings
from llmgw.store import stores
from llmgw.store.stores import Store, StoreError

MINUTE = 29_700_000 * 60.0  # the start of a minute, as Unix time


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[Store]:
    opened = await stores.open_store(StoreSettings(path=str(tmp_path / "llmgw.db")))
    yield opened
    await opened.close()


async def refused(limiter: RateLimiter, limits: list[ratelimits.Limit],
                  tokens: int = 10) -> ApiError:
    with pytest.raises(ApiError) as caught:
        await limiter.admit(limits, tokens)
    return caught.value


@pytest.mark.parametrize("now, after, shown", [
    (MINUTE, 60.0, "1m0s"), (MINUTE + 12.5, 47.5, "48s"), (MINUTE + 59.9, 0.1, "1s"),
])
def test_the_window_is_the_minute(now: float, after: float, shown: str) -> None:
    assert ratelimits.slot_of(now) == ratelimits.slot_of(MINUTE)
    assert ratelimits.slot_of(MINUTE + 60) == ratelimits.slot_of(MINUTE) + 1
    assert ratelimits.reset_after(now) == pytest.approx(after)
    assert ratelimits.duration(ratelimits.reset_after(now)) == shown


def test_the_limits_of_a_request() -> None:
    assert limits_of("research", "abc", None, None) == []
    found = limits_of("research", "abc", 100, None, None, 5000)
    assert [(lim.name, lim.kind, lim.limit) for lim in found] == [
        ("p:research:requests", "requests", 100), ("k:abc:tokens", "tokens", 5000)]
    # A page's session has no key: its project's limits only.
    assert [lim.name for lim in limits_of("research", None, 1, 2, 3, 4)] == [
        "p:research:requests", "p:research:tokens"]


async def test_a_full_minute_is_refused_until_the_next(store: Store) -> None:
    clock, seen = Clock(MINUTE + 42.2), []
    limiter = RateLimiter(store, clock, refused=lambda project, kind: seen.append(kind))
    limits = limits_of("research", "abc", 2, None)
    first = await limiter.admit(limits, 10)
    assert first is not None and first.headers == {
        "x-ratelimit-limit-requests": "2", "x-ratelimit-remaining-requests": "1",
        "x-ratelimit-reset-requests": "18s"}
    await limiter.admit(limits, 10)
    error = await refused(limiter, limits)
    assert (error.status, error.code, error.type) == (429, "rate_limit_exceeded", "requests")
    assert error.headers["Retry-After"] == "18"
    assert error.headers["x-ratelimit-remaining-requests"] == "0"
    assert "Limit 2, Used 2, Requested 1" in error.message and seen == ["requests"]
    clock.now = MINUTE + 60.0  # the next minute: counted from zero again
    again = await limiter.admit(limits, 10)
    assert again is not None and again.headers["x-ratelimit-remaining-requests"] == "1"


class Unreachable:
    """A store whose database is gone: every call raises StoreError, and is counted."""

    def __init__(self) -> None:
        self.calls = 0

    async def take_rate(self, *_: object) -> None:
        self.calls += 1
        raise StoreError("db:5432: connection refused")


async def test_a_router_that_saw_the_minute_full_refuses_without_the_store(
        store: Store) -> None:
    clock = Clock(MINUTE + 1)
    limiter = RateLimiter(store, clock)
    limits = limits_of("research", None, 1, None)
    await limiter.admit(limits, 1)
    await refused(limiter, limits)  # the store said full: remembered
    gone = Unreachable()
    limiter.store = gone  # type: ignore[assignment]
    local = await refused(limiter, limits)  # the fast path answered, as the store did
    assert (local.status, local.headers["x-ratelimit-remaining-requests"]) == (429, "0")
    assert "Used 1" in local.message
    assert gone.calls == 0
    clock.now = MINUTE + 60  # a new minute: the store is asked again, and it is gone
    assert await limiter.admit(limits, 1) is not None  # counted on this router instead
    assert gone.calls == 1


async def test_a_store_outage_counts_in_a_local_window_and_sends_it_on_recovery(
        store: Store, caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock(MINUTE + 1)
    limiter = RateLimiter(store, clock)
    limits = limits_of("research", None, 3, None)
    await limiter.admit(limits, 1)  # the store counts 1
    gone = Unreachable()
    limiter.store = gone  # type: ignore[assignment]
    await limiter.admit(limits, 1)  # from the store's last answer: 2 of 3
    assert gone.calls == 1
    await limiter.admit(limits, 1)  # 3 of 3; the store not asked again within RETRY
    assert gone.calls == 1
    clock.now += ratelimits.RETRY  # asked again, still gone: refused on the local count
    error = await refused(limiter, limits)
    assert (error.status, error.headers["x-ratelimit-remaining-requests"]) == (429, "0")
    assert "Used 3" in error.message
    assert gone.calls == 2
    assert [r.getMessage() for r in caplog.records] == [
        "cannot count requests against their rate limits in the store; counting on this "
        "router until it returns: db:5432: connection refused"]  # one line, not one a request
    # Back: the 2 admitted locally are added to the store's count first, so the minute's
    # limit holds across the outage for every router (the store says 3 of 3, not 1).
    limiter.store = store
    other = limits_of("research", "k", None, None, 5, None)  # a counter not known full
    clock.now += ratelimits.RETRY
    assert await limiter.admit(other, 1) is not None
    assert "Used 3" in (await refused(RateLimiter(store, clock), limits)).message
    clock.now = MINUTE + 60  # a new minute: counted in the store again, from 0
    ticket = await limiter.admit(limits, 1)
    assert ticket is not None and ticket.headers["x-ratelimit-remaining-requests"] == "2"


async def test_tokens_count_the_estimate_then_what_was_used(store: Store) -> None:
    clock = Clock(MINUTE + 30)
    limiter = RateLimiter(store, clock)
    limits = limits_of("research", "abc", None, 1000)
    ticket = await limiter.admit(limits, 800)
    assert ticket is not None and ticket.headers["x-ratelimit-remaining-tokens"] == "200"
    error = await refused(limiter, limits, 300)  # 800 + 300 > 1000
    assert (error.type, error.headers["x-ratelimit-remaining-tokens"]) == ("tokens", "200")
    await limiter.settle(ticket, 150)  # it used 150 of its 800
    after = await limiter.admit(limits, 300)
    assert after is not None and after.headers["x-ratelimit-remaining-tokens"] == "550"
    # An estimate above the whole limit can never fit a minute: refused at once.
    too_large = await refused(limiter, limits, 1001)
    assert too_large.code == "rate_limit_exceeded" and "Retry-After" not in too_large.headers
    assert "Request too large" in too_large.message


async def test_the_key_and_its_project_are_counted_together(store: Store) -> None:
    limiter = RateLimiter(store, Clock(MINUTE))
    alice = limits_of("research", "alice", 3, None, 1, None)
    bob = limits_of("research", "bob", 3, None)
    await limiter.admit(alice, 1)
    error = await refused(limiter, alice)
    assert "key alice" in error.message
    # Alice's refusal did not count for the project: Bob has its two requests left.
    await limiter.admit(bob, 1)
    ticket = await limiter.admit(bob, 1)
    assert ticket is not None and ticket.headers["x-ratelimit-remaining-requests"] == "0"
    assert "project 'research'" in (await refused(limiter, bob)).message
