"""A real router process SIGKILLed mid-stream strands no budget (SQLite, then PostgreSQL).

A real ``llmgw serve --role router`` streams from a real test engine (a slow stream:
``--chunk-delay``), records what it relayed as it goes, and is killed with SIGKILL. A
restarted router releases the dead one's reservation once its heartbeat is
``MISSED_BEATS`` intervals old, billing what was recorded, and the project's next
request is admitted. The heartbeat interval is set small (``router_heartbeat``) and every
wait is on a condition, never on the clock.
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from support import daemons, nodes

from llmgw.daemon.leaders import LEASE
from llmgw.daemon.routetables import encode
from llmgw.router.routes import Endpoint
from llmgw.spec.models import StoreSettings
from llmgw.store import keys, reservations, stores
from llmgw.store.stores import Store

ENGINE = Path(__file__).resolve().parents[1] / "support" / "testengine.py"
WORDS = " ".join(f"w{i}" for i in range(400))  # echoed back: a 400-event stream


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[str]:
    port = nodes.free_port()
    with (tmp_path / "engine.log").open("ab") as log:
        process = subprocess.Popen(
            [sys.executable, str(ENGINE), "serve", "chat", "--port", str(port),
             "--chunk-delay", "0.05"], stdout=log, stderr=log, stdin=subprocess.DEVNULL)
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 30
        while not _answers(url + "/v1/models"):
            assert process.poll() is None, "the test engine exited"
            assert time.monotonic() < deadline, "the test engine never listened"
            time.sleep(0.05)
        yield url
    finally:
        process.kill()
        process.wait(10)


def _answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def run(coro: Any) -> Any:
    return asyncio.run(coro)


async def with_store(settings: dict[str, str], work: Any) -> Any:
    store = await stores.open_store(StoreSettings.model_validate(settings))
    try:
        return await work(store)
    finally:
        await store.close()


async def setup(store: Store, engine: str) -> str:
    grant = await store.acquire_lease(LEASE, "the-test", 600)
    assert grant is not None
    assert await store.publish_routes(LEASE, "the-test", grant.epoch,
                                      encode({"chat": [Endpoint(engine, "local", 0)]}))
    return (await keys.create(store, "research")).secret


def test_a_killed_router_releases_its_reservation_and_bills_what_it_streamed(
        tmp_path: Path, store_settings: dict[str, str], engine: str) -> None:
    directory = tmp_path / "cluster"
    directory.mkdir()
    (directory / "cluster.yaml").write_text(yaml.safe_dump({
        "cluster": {"name": "lab", "store": store_settings, "router_heartbeat": "0.2s"},
        "models": {"chat": {"source": "/models/chat.gguf",
                            "profiles": [{"engine": "llama.cpp", "cpu": True}],
                            "pricing": {"input_per_mtok": 1.0, "output_per_mtok": 2.0}}},
        "projects": {"research": {"budget_usd": 0.01}},
    }))
    key = run(with_store(store_settings, lambda s: setup(s, engine)))
    routers: list[daemons.Daemon] = []

    def router(name: str) -> daemons.Daemon:
        daemon = daemons.Daemon(directory, tmp_path / f"{name}.log")
        daemon.start("--role", "router", "--router-listen", daemon.listeners()["router"],
                     "--metrics-listen", daemon.listeners()["metrics"])
        routers.append(daemon)
        daemon.until(lambda: httpx.get(daemon.router + "/ready", timeout=2).status_code == 200,
                     f"router {name} ready")
        return daemon

    headers = {"Authorization": f"Bearer {key}"}
    body = {"model": "chat", "messages": [{"role": "user", "content": WORDS}],
            "max_tokens": 100_000, "stream": True}  # reserves $0.2: the $0.01 budget is held
    try:
        first = router("first")
        with httpx.Client(timeout=30) as client:
            with client.stream("POST", first.router + "/v1/chat/completions", json=body,
                               headers=headers) as response:
                assert response.status_code == 200
                lines = response.iter_lines()

                def recorded(above: float) -> Any:
                    def check() -> list[reservations.Held]:
                        next(lines)  # keep reading: the stream runs while we wait
                        held = run(with_store(store_settings, lambda s: s.list_reservations()))
                        return [h for h in held if h.used > above]
                    return check

                (prompt,) = first.until(recorded(0), "the prompt recorded")
                # Then five completion tokens more ($2/Mtok): the stream's progress.
                (held,) = first.until(recorded(prompt.used + 5 * 2e-6 - 1e-9),
                                      "the stream's progress recorded")
                # The budget is held: another request of the project gets 429 meanwhile.
                refused = httpx.post(first.router + "/v1/chat/completions", headers=headers,
                                     json={**body, "stream": False, "max_tokens": 5}, timeout=30)
                assert refused.status_code == 429, refused.text
                assert first.process is not None
                first.process.send_signal(signal.SIGKILL)
                first.process.wait(10)
        (still,) = run(with_store(store_settings, lambda s: s.list_reservations()))
        assert still.id == held.id and still.used >= held.used  # nobody settled it

        second = router("second")  # the restart: it releases once the heartbeat is stale
        second.until(lambda: not run(with_store(store_settings,
                                                lambda s: s.list_reservations())),
                     "the dead router's reservation released")
        rows = run(with_store(store_settings, lambda s: s.recent_usage(10)))
        (billed,) = [r for r in rows if r.status == reservations.RELEASED_STATUS]
        assert billed.project == "research" and billed.model == "chat" and billed.stream
        assert billed.completion_tokens is not None and billed.completion_tokens >= 5
        assert billed.cost_usd == pytest.approx(still.used)
        again = httpx.post(second.router + "/v1/chat/completions", headers=headers,
                           json={**body, "stream": False, "max_tokens": 5}, timeout=30)
        assert again.status_code == 200, again.text
    finally:
        for daemon in routers:
            daemon.stop()
