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
CLIENTS, EACH, FLIP_AFTER = 16, 16, 120


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
    # Each answer costs 4 prompt + 5 completion tokens at $1/$2 per M: $0.000014.
    budget = 0.0002
    clock = Clock(MIDNIGHT - 60)
    stacks = [make_stack(spec=spec(budget)), make_stack(spec=spec(budget))]  # one database
    for stack in stacks:
        stack.route({"chat": stack.upstreams})
        stack.router.accounts.clock = clock
    key = stacks[0].key()
    outcomes: list[tuple[bool, int]] = []  # (sent after the reset, status)
    lock = threading.Lock()

    def client(index: int) -> None:
        c = openai.OpenAI(base_url=stacks[index % 2].url + "/v1", api_key=key, max_retries=0)
        for _ in range(EACH):
            after = clock.now >= MIDNIGHT
            try:
                c.chat.completions.create(**BODY)  # type: ignore[call-overload]
                status = 200
            except openai.RateLimitError:
                status = 429
            with lock:
                outcomes.append((after, status))
                if len(outcomes) == FLIP_AFTER:
                    clock.now = MIDNIGHT  # midnight in Paris, while requests are in flight

    threads = [threading.Thread(target=client, args=(i,)) for i in range(CLIENTS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert len(outcomes) == CLIENTS * EACH
    stacks[1].run(stacks[1].router.accounts.flush())
    rows = stacks[0].rows()  # flushes the first; both wrote to the one store
    assert sorted(r.status for r in rows) == sorted(status for _, status in outcomes)

    one_reservation = (len(str(BODY)) * 2 * 1.0 + 5 * 2.0) / 1e6
    yesterday = [r for r in rows if r.ts < MIDNIGHT]
    today = [r for r in rows if r.ts >= MIDNIGHT]
    before = [status for after, status in outcomes if not after]
    after = [status for after, status in outcomes if after]
    # The day was spent before midnight: refusals, and spend within one reservation.
    assert before.count(429) > 0 and before.count(200) >= 10
    assert sum(r.cost_usd for r in yesterday) <= budget + one_reservation
    # Midnight: the new day admits again (requests sent after it got answers), and it too
    # holds its budget.
    assert after.count(200) >= 10 and after.count(429) > 0
    assert sum(r.cost_usd for r in today) <= budget + one_reservation
    # Every answer of a request sent after midnight is billed to the new day.
    assert len([r for r in today if r.status == 200]) >= after.count(200)

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
