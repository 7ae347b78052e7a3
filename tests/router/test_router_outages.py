"""Routers through a store outage: known keys keep working, usage arrives once.

THE test kills a real PostgreSQL (``pg_ctl stop -m immediate``) for 10 s
under load and starts it again; the revocation tests measure the bound
docs/ha.md states, by waiting on the refusal with that bound as deadline.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from support import postgres
from support.stacks import Stack, StackFactory, cluster
from support.waits import wait_until

from llmgw.router import Settings, keycaches
from llmgw.store import keys, usages

CHAT = {"model": "chat", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}
UNKNOWN = "llmgw_" + "0" * 12 + "_" + "a" * 43


def ask(url: str, key: str) -> httpx.Response:
    return httpx.post(f"{url}/v1/chat/completions", json=CHAT,
                      headers={"Authorization": f"Bearer {key}"}, timeout=30)


@pytest.fixture
def own_postgres() -> Iterator[postgres.PgServer]:
    """A PostgreSQL of this test's own, since it is killed; durable, since a commit it
    acknowledged and then lost in the kill would read as a row the router lost."""
    if postgres.bindir() is None:
        pytest.skip("PostgreSQL not installed (make sysdeps)")
    server = postgres.PgServer(durable=True)
    yield server
    with contextlib.suppress(RuntimeError):  # a failed test may leave it killed
        server.stop()


def test_a_store_outage_of_10s_under_load_fails_no_known_key_and_loses_no_row(
        own_postgres: postgres.PgServer, tmp_path: Path,
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="llmgw.router")
    db = own_postgres.database()
    stack = Stack(tmp_path, cluster(research=100.0), Settings(state_dir=tmp_path), 2,
                  db.settings)
    try:
        stack.route({"chat": stack.upstreams})
        key = stack.key()
        assert ask(stack.url, key).status_code == 200  # now known to the router
        answers: list[int] = []
        stop = threading.Event()

        def load() -> None:
            while not stop.is_set():
                answers.append(ask(stack.url, key).status_code)

        clients = [threading.Thread(target=load) for _ in range(4)]
        for client in clients:
            client.start()
        time.sleep(1)
        own_postgres.kill()
        killed_at = len(answers)
        time.sleep(1)
        unknown = ask(stack.url, UNKNOWN)
        metrics = httpx.get(stack.metrics_url).text
        time.sleep(9)
        during = len(answers) - killed_at
        own_postgres.start()
        time.sleep(3)
        stop.set()
        for client in clients:
            client.join(30)
        assert unknown.status_code == 503, unknown.text
        assert unknown.json()["error"]["code"] == "store_unavailable"
        assert "llmgw_router_store_up 0.0" in metrics
        assert during > 20, "too little load during the outage to prove anything"
        assert [s for s in answers if s != 200] == []
        print(f"{len(answers)} requests, {during} during the outage, none failed")
        print("\n".join(line for line in metrics.splitlines() if line.startswith(
            ("llmgw_router_store_up", "llmgw_router_usage_buffered", "llmgw_router_key_cache"))
            and "_created" not in line))
        wait_until(lambda: stack.router.accounts.health.up
                   and stack.router.accounts.buffer is not None
                   and stack.router.accounts.buffer.count == 0, timeout=15)
        rows = [r for r in stack.rows() if r.key_id == keys.key_id_of(key)]
        ids = [r.request_id for r in rows]
        assert len(rows) == len(answers) + 1  # the first request too
        assert len(set(ids)) == len(ids)
        assert not list(tmp_path.glob("usage-*.buffer"))
        print(f"{len(rows)} usage rows stored, {len(set(ids))} request ids")
        said = [r.getMessage() for r in caplog.records
                if r.name in ("llmgw.router.keycaches", "llmgw.router.usagebuffers")]
        print("\n".join(said))
        # one line when the store goes, one when it is back: not one per request
        assert [m.split(";")[0] for m in said if "unreachable" in m] == [
            "the store is unreachable"]
        assert len([m for m in said if m.startswith("the store is back after")]) == 1
        assert len([m for m in said if m.startswith("wrote ")]) >= 1
    finally:
        stack.close()


@pytest.mark.parametrize("store_settings", ["sqlite", "postgresql"], indirect=True)
def test_a_revoked_key_is_refused_within_the_stated_bound(make_stack: StackFactory) -> None:
    stack = make_stack()
    stack.route({"chat": stack.upstreams})
    key = stack.key()
    assert ask(stack.url, key).status_code == 200
    assert ask(stack.url, key).status_code == 200  # served from the cache
    bound = keycaches.REVOCATION_BOUND
    key_id = keys.key_id_of(key)
    assert key_id is not None
    stack.run(keys.revoke(stack.db, key_id))
    revoked = time.monotonic()
    wait_until(lambda: ask(stack.url, key).status_code == 401, timeout=bound)
    print(f"refused {time.monotonic() - revoked:.3f} s after the revoke ({stack.db.kind})")


def test_a_row_written_again_after_a_lost_answer_is_stored_once(
        make_stack: StackFactory) -> None:
    """A flush whose commit landed but whose answer was lost buffers its rows, and the
    buffer writes them again: the request id keeps it one row, and one charge."""
    stack = make_stack()
    row = usages.UsageRow(ts=time.time(), project="research", key_id="k", model="chat",
                          endpoint="/v1/chat/completions", status=200, prompt_tokens=1,
                          completion_tokens=1, latency_ms=1.0, cost_usd=0.5,
                          request_id="r-1")
    stack.run(stack.db.insert_usage([row]))
    stack.run(stack.db.insert_usage([row, row]))
    assert [r.request_id for r in stack.run(usages.recent(stack.db, 10))] == ["r-1"]
    assert stack.run(stack.db.spend_by_project()) == {"research": 0.5}


def test_a_budget_holds_on_the_local_ledger_during_an_outage(
        own_postgres: postgres.PgServer, tmp_path: Path) -> None:
    """One router, store away: spend stays under budget + one request's reservation
    (docs/ha.md), and the 429 comes from the local ledger, not a 503."""
    budget = 0.001
    db = own_postgres.database()
    stack = Stack(tmp_path, cluster(research=budget), Settings(state_dir=tmp_path), 1,
                  db.settings)
    try:
        stack.route({"chat": stack.upstreams})
        key = stack.key()
        assert ask(stack.url, key).status_code == 200
        own_postgres.kill()
        statuses = []
        while not statuses or statuses[-1] == 200:
            statuses.append(ask(stack.url, key).status_code)
            assert len(statuses) < 1000
        assert statuses[-1] == 429
        own_postgres.start()
        wait_until(lambda: stack.router.accounts.health.up
                   and stack.router.accounts.buffer is not None
                   and stack.router.accounts.buffer.count == 0, timeout=15)
        spent = sum(r.cost_usd for r in stack.rows())
        one = max(r.cost_usd for r in stack.rows())
        estimate = 8 * 2.0e-6 + len(str(CHAT)) * 1.0e-6  # the reservation's bound, generous
        assert budget - one <= spent <= budget + estimate
        print(f"{len(statuses) - 1} admitted during the outage; spent ${spent:.6f} of "
              f"${budget}")
    finally:
        stack.close()
