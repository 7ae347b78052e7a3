"""A budget period that resets during the run: two routers over one real PostgreSQL.

Both routers read one clock the test holds (``Accounts.clock``): it stands a minute
before midnight in Paris, and the test moves it to midnight exactly while 16 clients
keep 256 requests going through both routers with the official openai client. Before
the reset the day's spend stays under budget + one reservation; after it, the new day
admits requests again at once; and each day's spend in the store is exactly the sum of
that day's usage rows (a request is billed to the day it arrived in).
"""

from __future__ import annotations

import datetime as dt
import threading
from zoneinfo import ZoneInfo

import openai
import pytest
from support.stacks import CPU, StackFactory

from llmgw.spec.models import Cluster

BODY = {"model": "chat", "messages": [{"role": "user", "content": "one two three four"}],
        "max_tokens": 5}
PARIS = ZoneInfo("Europe/Paris")
MIDNIGHT = dt.datetime(2026, 6, 3, tzinfo=PARIS).timestamp()
CLIENTS, EACH, FLIP_AFTER, CAP = 16, 16, 120, 1500


class Clock:
    """The routers' time: still unless the test moves it."""

    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def spec(budget: float) -> Cluster:
    return Cluster.model_validate({
        "cluster": {"name": "lab", "auth": "keys"},
        "models": {"chat": {"profiles": CPU, "scaling": {"min": 1, "max": 2},
                            "pricing": {"input_per_mtok": 1.0, "output_per_mtok": 2.0}}},
        "projects": {"research": {"budget": {"usd": budget, "period": "day",
                                             "timezone": "Europe/Paris"}}},
    })


@pytest.mark.parametrize("store_settings", ["postgresql"], indirect=True)
def test_a_daily_budget_resets_exactly_at_midnight_across_two_routers(
        make_stack: StackFactory) -> None:
    budget = 0.0002  # about a dozen answers
    clock = Clock(MIDNIGHT - 60)
    stacks = [make_stack(spec=spec(budget)), make_stack(spec=spec(budget))]  # one database
    for stack in stacks:
        stack.route({"chat": stack.upstreams})
        stack.router.accounts.clock = clock
    key = stacks[0].key()
    outcomes: list[tuple[bool, int]] = []  # (answered after the reset, status)
    lock = threading.Lock()

    def counts(after: bool, status: int) -> int:
        return sum(1 for o in outcomes if o == (after, status))

    def spent() -> bool:
        """The last 32 answers were all refusals: the day's budget is spent."""
        return len(outcomes) >= 2 * CLIENTS and all(
            status == 429 for _, status in outcomes[-2 * CLIENTS:])

    def done() -> bool:
        """Conditions, not timing: the clock moves once the day's budget was spent; the run
        ends once the new day admitted as many answers and was spent too, and 256 ran."""
        with lock:
            if len(outcomes) >= CAP:
                return True
            if clock.now < MIDNIGHT:
                if len(outcomes) >= FLIP_AFTER and spent():
                    clock.now = MIDNIGHT  # midnight in Paris, while requests are in flight
                return False
            return (len(outcomes) >= CLIENTS * EACH and spent()
                    and counts(True, 200) >= counts(False, 200))

    def client(index: int) -> None:
        c = openai.OpenAI(base_url=stacks[index % 2].url + "/v1", api_key=key, max_retries=0)
        while not done():
            try:
                c.chat.completions.create(**BODY)  # type: ignore[call-overload]
                status = 200
            except openai.RateLimitError:
                status = 429
            with lock:
                outcomes.append((clock.now >= MIDNIGHT, status))

    threads = [threading.Thread(target=client, args=(i,)) for i in range(CLIENTS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(300)
    assert CLIENTS * EACH <= len(outcomes) < CAP, "the new day never admitted a day's worth"
    assert counts(False, 429) > 0 and counts(True, 429) > 0
    stacks[1].run(stacks[1].router.accounts.flush())
    rows = stacks[0].rows()  # flushes the first; both wrote to the one store
    assert sorted(r.status for r in rows) == sorted(status for _, status in outcomes)

    one_reservation = (len(str(BODY)) * 2 * 1.0 + 5 * 2.0) / 1e6
    yesterday = [r for r in rows if r.ts < MIDNIGHT]
    today = [r for r in rows if r.ts >= MIDNIGHT]
    # Before midnight: the day's spend held its budget (within one reservation).
    assert sum(r.cost_usd for r in yesterday) <= budget + one_reservation
    # Midnight reset it exactly: the new day admitted a whole day's worth of answers (an
    # old reservation counted here, or an old row billed here, would leave less room),
    # and held its budget too.
    answered = [len([r for r in day if r.status == 200]) for day in (yesterday, today)]
    assert answered[0] >= 5 and answered[1] >= answered[0] - 1, answered
    assert sum(r.cost_usd for r in today) <= budget + one_reservation
    # Each request is billed to the day it arrived in: those answered before midnight to
    # the old day, and all but the (at most 16) in flight at midnight to the new one.
    assert len(yesterday) >= sum(1 for after, _ in outcomes if not after)
    assert len(today) >= sum(1 for after, _ in outcomes if after) - CLIENTS

    # Exact accounting: the store's figure for each day is the sum of that day's rows.
    store = stacks[0].db
    day_before = MIDNIGHT - 86400
    spent_yesterday = stacks[0].run(store.spend_by_project({"research": day_before}))
    spent_today = stacks[0].run(store.spend_by_project({"research": MIDNIGHT}))
    assert spent_today["research"] == pytest.approx(sum(r.cost_usd for r in today),
                                                    rel=1e-9, abs=1e-12)
    assert spent_yesterday["research"] - spent_today["research"] == pytest.approx(
        sum(r.cost_usd for r in yesterday), rel=1e-9, abs=1e-12)
    # And what the routers show for the current period agrees with the store (once each
    # reloaded it after the other's last rows).
    for stack in stacks:
        stack.run(stack.router.accounts.flush())
        shown = stack.call(stack.router.accounts.spent_now, "research")
        assert shown == pytest.approx(spent_today["research"], rel=1e-9, abs=1e-12)
