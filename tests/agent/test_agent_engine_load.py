"""Each report carries every ready engine's own load, read from its ``/metrics``:
a real llama-server (``--metrics``) under load through the agent's gRPC report, and
engines that answer badly (too much, too slowly, not metrics) bounded and explained."""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest
from agent_support import (
    eventually,
    free_port,
    node_settings,
    served_agent,
    short_dir,
    unit_name,
    unit_text,
)
from aiohttp import web

from llmgw.agent import scrapes, servers
from llmgw.fleet.types import EngineLoad, Unit
from llmgw.proto.conversions import UnitChange
from llmgw.transport.agent_client import AgentClient

ROOT = Path(__file__).resolve().parents[2]
LLAMA_SERVER = ROOT / ".cache" / "engine" / "bin" / "llama-server"
MODEL = ROOT / ".cache" / "models" / "gemma3-270m-q4_k_m.gguf"
REQUESTS, TOKENS = 3, 24


@pytest.fixture
def root() -> Iterator[Path]:
    path = short_dir()
    yield path
    shutil.rmtree(path, ignore_errors=True)


def spec(engine: str) -> str:
    return "X-Llmgw-Spec=" + json.dumps({"v": 1, "engine": engine}, separators=(",", ":"))


def agent_client(root: Path) -> contextlib.AbstractAsyncContextManager[
        tuple[servers.Agent, AgentClient]]:
    settings = node_settings("cpu-only", root, readiness={"probe_timeout": 5.0})
    return served_agent(settings, timeout=30)


@pytest.mark.skipif(not (LLAMA_SERVER.exists() and MODEL.exists()),
                    reason="the real engine and model are not built: run `make engine model`")
async def test_a_real_llama_server_under_load_reports_running_and_waiting(root: Path) -> None:
    port = free_port()
    exec_start = (f"ExecStart={LLAMA_SERVER} --model {MODEL} --alias gemma --host 127.0.0.1 "
                  f"--port {port} --n-gpu-layers 0 --metrics --parallel 1 --threads 1")
    text = unit_text("gemma", port=port, service=exec_start).replace(
        'X-Llmgw-Spec={"v":1}', spec("llama.cpp"))
    name = unit_name("gemma")

    async def unit(client: AgentClient) -> Unit:
        report = await client.report()
        return next(u for u in report.units if u.name == name)

    async with agent_client(root) as (_, client):
        [started] = await client.apply_units([UnitChange(name, text)])
        assert started.ok, started
        ready = await eventually(lambda: _ready(unit(client)), timeout=180, what="ready")
        idle = ready.load
        assert idle is not None and idle.error == ""
        assert (idle.requests_running, idle.requests_waiting) == (0, 0)
        assert idle.kv_cache_usage is None  # this build has no such metric: unknown, not 0

        async with httpx.AsyncClient(trust_env=False, timeout=300) as http:
            body = {"model": "gemma", "prompt": "Count slowly:", "max_tokens": TOKENS,
                    "ignore_eos": True}
            sent = [asyncio.create_task(http.post(f"http://127.0.0.1:{port}/v1/completions",
                                                  json=body)) for _ in range(REQUESTS)]

            async def busy() -> EngineLoad | None:
                load = (await unit(client)).load
                assert load is not None
                busy = (load.requests_running or 0) >= 1 and (load.requests_waiting or 0) >= 1
                return load if busy else None

            during = await eventually(busy, timeout=120, what="one running, others waiting")
            assert during.requests_running == 1  # --parallel 1: one slot
            answers = await asyncio.gather(*sent)
        assert all(a.status_code == 200 for a in answers)
        after = (await unit(client)).load
        assert after is not None
        assert (after.requests_running, after.requests_waiting) == (0, 0)
        assert after.generation_tokens_total == REQUESTS * TOKENS
        # The counter's rate since the report before: tokens were generated in between.
        assert after.generation_tokens_per_second is not None
        assert after.generation_tokens_per_second > 0


async def _ready(found: object) -> Unit | None:
    unit = await found  # type: ignore[misc]
    assert isinstance(unit, Unit)
    assert unit.state != "failed", unit.log_tail
    return unit if unit.state == "ready" else None


def ready_unit(at: int, engine: str = "vllm", pid: int = 7, **fields: object) -> Unit:
    labels = {"X-Llmgw-Spec": json.dumps({"engine": engine})}
    return Unit.model_validate({"name": f"llmgw-m-r0-s{fields.get('rank', 0)}.service",
                                "model": "m", "replica": 0, "digest": "d", "state": "ready",
                                "port": at, "pid": pid, "labels": labels, **fields})


RELEASE = web.AppKey("release", asyncio.Event)


@contextlib.asynccontextmanager
async def engine_answering(handler: web.RequestHandler) -> AsyncIterator[int]:
    app = web.Application()
    app[RELEASE] = asyncio.Event()
    app.router.add_get("/metrics", handler)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        yield port
    finally:
        app[RELEASE].set()
        await runner.cleanup()


async def too_much(request: web.Request) -> web.StreamResponse:
    answer = web.StreamResponse()
    await answer.prepare(request)
    lines = b'vllm:num_requests_running{model_name="m"} 1\n' * 1500  # ~64 KiB a write
    for _ in range((2 << 20) // len(lines) + 1):
        await answer.write(lines)
    return answer


async def too_slow(request: web.Request) -> web.Response:
    await request.app[RELEASE].wait()  # answers only when the test is over
    return web.Response(text="vllm:num_requests_running 1\n")


async def html(_: web.Request) -> web.Response:
    return web.Response(text="<html>Bad Gateway</html>", content_type="text/html")


async def missing(_: web.Request) -> web.Response:
    return web.Response(status=404, text="Not Found")


@pytest.mark.parametrize(("handler", "timeout", "error"), [
    pytest.param(too_much, 10.0, "/metrics answered more than 1024 KiB",
                 id="over-the-size-limit"),
    pytest.param(too_slow, 0.5, "/metrics: no answer in time", id="slower-than-the-timeout"),
    pytest.param(html, 10.0, "line 1 is not a Prometheus sample", id="not-metrics"),
    pytest.param(missing, 10.0, "/metrics answered 404", id="no-metrics-endpoint"),
])
async def test_an_engine_that_answers_badly_has_no_figures_and_says_why(
        handler: web.RequestHandler, timeout: float, error: str) -> None:
    async with engine_answering(handler) as port, httpx.AsyncClient(trust_env=False) as http:
        [unit] = await scrapes.Scraper(http, timeout=timeout).loads([ready_unit(port)])
    assert unit.load is not None
    assert unit.load.error == error
    assert unit.load.requests_running is None and unit.load.scraped_at is not None


async def test_the_rate_needs_two_scrapes_of_one_process() -> None:
    total = {"value": 100.0}
    clock = iter([1000.0, 1010.0, 1020.0])

    async def counter(_: web.Request) -> web.Response:
        return web.Response(text=f"vllm:generation_tokens_total {total['value']}\n")

    async with engine_answering(counter) as port, httpx.AsyncClient(trust_env=False) as http:
        scraper = scrapes.Scraper(http, timeout=2, clock=lambda: next(clock))
        [first] = await scraper.loads([ready_unit(port)])
        total["value"] = 600.0
        [second] = await scraper.loads([ready_unit(port)])
        [restarted] = await scraper.loads([ready_unit(port, pid=8)])  # a new engine process
    rates = [u.load.generation_tokens_per_second if u.load else "unscraped"
             for u in (first, second, restarted)]
    assert rates == [None, 50.0, None]


@pytest.mark.parametrize("unit", [
    pytest.param(ready_unit(1, state="loading"), id="not-ready"),
    pytest.param(ready_unit(1, rank=1), id="a-worker-shard"),
    pytest.param(ready_unit(1, port=None), id="no-http-port"),
    pytest.param(ready_unit(1, engine="ray"), id="an-engine-llmgw-cannot-read"),
])
async def test_only_ready_serving_engines_are_asked(unit: Unit) -> None:
    async with httpx.AsyncClient(trust_env=False) as http:
        assert await scrapes.Scraper(http, timeout=0.5).loads([unit]) == [unit]
