"""Routers through a store outage: known keys keep working, usage arrives once.

THE test kills a real PostgreSQL (``pg_ctl stop -m immediate``) for 10 s
under load and starts it again; the revocation tests measure the bound
docs/ha.md states, by waiting on the refusal with that bound as deadline.
"""

from __future__ import annotations

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
from llmgw.store import keys

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
    server.stop()


def test_a_store_outage_of_10s_under_load_fails_no_known_key_and_loses_no_row(
        own_postgres: postgres.PgServer, tmp_path: Path) -> None:
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
        wait_until(lambda: stack.router.accounts.health.up
                   and stack.router.accounts.buffer is not None
                   and stack.router.accounts.buffer.count == 0, timeout=15)
        rows = [r for r in stack.rows() if r.key_id == keys.key_id_of(key)]
        ids = [r.request_id for r in rows]
        assert len(rows) == len(answers) + 1  # the first request too
        assert len(set(ids)) == len(ids)
        assert not list(tmp_path.glob("usage-*.buffer"))
    finally:
        stack.close()


@pytest.mark.parametrize("store_settings", ["sqlite", "postgresql"], indirect=True)
def test_a_revoked_key_is_refused_within_the_stated_bound(make_stack: StackFactory) -> None:
    stack = make_stack()
    stack.route({"chat": stack.upstreams})
    key = stack.key()
    assert ask(stack.url, key).status_code == 200
    assert ask(stack.url, key).status_code == 200  # served from the cache
    bound = (keycaches.NOTIFY_BOUND if stack.db.kind == "postgresql"
             else keycaches.POLL_INTERVAL + 1.0)
    key_id = keys.key_id_of(key)
    assert key_id is not None
    stack.run(keys.revoke(stack.db, key_id))
    revoked = time.monotonic()
    wait_until(lambda: ask(stack.url, key).status_code == 401, timeout=bound)
    print(f"refused {time.monotonic() - revoked:.3f} s after the revoke ({stack.db.kind})")
