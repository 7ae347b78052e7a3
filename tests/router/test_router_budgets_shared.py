"""Budgets across routers: two routers share one store (SQLite, then PostgreSQL) and
concurrent clients through both cannot spend past budget + one reservation."""

from __future__ import annotations

import threading

import openai
from support.stacks import StackFactory, cluster

BODY = {"model": "chat", "messages": [{"role": "user", "content": "one two three four"}],
        "max_tokens": 5}


def test_two_routers_hold_one_budget_under_concurrent_clients(
        make_stack: StackFactory) -> None:
    # Each answer costs 4 prompt + 5 completion tokens at $1/$2 per M: $0.000014.
    budget = 0.0002
    spec = cluster(research=budget)
    stacks = [make_stack(spec=spec), make_stack(spec=spec)]  # the same store under both
    for stack in stacks:
        stack.route({"chat": stack.upstreams})
    key = stacks[0].key()
    statuses: list[int] = []
    lock = threading.Lock()

    def client(index: int) -> None:
        c = openai.OpenAI(base_url=stacks[index % 2].url + "/v1", api_key=key, max_retries=0)
        for _ in range(6):
            try:
                c.chat.completions.create(**BODY)  # type: ignore[call-overload]
                status = 200
            except openai.RateLimitError:
                status = 429
            with lock:
                statuses.append(status)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    stacks[1].run(stacks[1].router.accounts.flush())
    rows = stacks[0].rows()  # flushes the first; both wrote to the one store
    assert sorted(r.status for r in rows) == sorted(statuses)
    spent = sum(r.cost_usd for r in rows)
    # One reservation: the body's bytes as prompt tokens plus max_tokens, at the prices.
    one_reservation = (len(str(BODY)) * 2 * 1.0 + 5 * 2.0) / 1e6
    assert statuses.count(200) >= 10 and statuses.count(429) > 0
    assert spent <= budget + one_reservation, (spent, statuses.count(200))
