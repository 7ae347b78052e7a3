"""Upstreams (``upstreams:``): routed beside replicas or as their fallback, real servers.

Each upstream here is a real aiohttp server (support.upstream) the router
probes and forwards to over sockets; the replicas are the same kind of server.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import urllib.request
from pathlib import Path
from typing import Any

import openai
import pytest
from support.stacks import CPU, Stack, StackFactory, cluster
from support.upstream import Upstream
from support.waits import wait_until

from llmgw.router import Settings, catalogs
from llmgw.spec.loras import LoraAdapter
from llmgw.spec.models import Cluster

KEY = "sk-upstream-KEYMARK-41c9"
FAST = {"interval": 0.1, "timeout": 1, "max_backoff": 0.2}


def spec(url: str, key_file: Path | None, use: str = "fallback", min_replicas: int = 1,
         **extra: Any) -> Cluster:
    upstream: dict[str, Any] = {
        "url": url, "health": FAST,
        "models": {"chat": {"model": "provider/chat-large", "use": use},
                   "only-there": {"use": "always",
                                  "pricing": {"input_per_mtok": 3.0, "output_per_mtok": 6.0}}},
        **extra,
    }
    if key_file is not None:
        upstream["api_key_file"] = str(key_file)
    return Cluster.model_validate({
        "cluster": {"name": "lab"},
        "models": {"chat": {"profiles": CPU, "scaling": {"min": min_replicas},
                            "pricing": {"input_per_mtok": 1.0, "output_per_mtok": 2.0}}},
        "projects": {"research": {}},
        "upstreams": {"ext": upstream},
    })


def until(condition: Any, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.02)


def key_file(tmp_path: Path) -> Path:
    path = tmp_path / "ext.key"
    path.write_text(KEY + "\n")
    path.chmod(0o600)
    return path


def with_upstream(make_stack: StackFactory, tmp_path: Path, use: str = "fallback",
                  replicas: int = 1, **extra: Any) -> tuple[Stack, Upstream]:
    stack = make_stack(replicas=replicas, wait_timeout=0.5)
    ext = stack.run(Upstream("ext").start())
    stack.upstreams.append(ext)  # stopped with the stack
    stack.call(stack.router.configure,
               catalogs.from_cluster(spec(ext.url, key_file(tmp_path), use, **extra)))
    until(lambda: stack.router.externals.status()["ext"][0])
    return stack, ext


def client(stack: Stack, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=stack.url + "/v1", api_key=key, max_retries=0)


def ask(c: openai.OpenAI, model: str = "chat") -> str:
    answer = c.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}])
    return answer.choices[0].message.content or ""


def scrape(stack: Stack) -> str:
    with urllib.request.urlopen(stack.metrics_url, timeout=10) as response:
        return response.read().decode()


def test_a_fallback_takes_requests_only_while_no_replica_is_ready(
        make_stack: StackFactory, tmp_path: Path) -> None:
    stack, ext = with_upstream(make_stack, tmp_path)
    replica = stack.upstreams[0]
    stack.route({"chat": [replica]})
    secret = stack.key()
    c = client(stack, secret)
    for _ in range(3):
        ask(c)
    assert len(replica.received) == 3 and not ext.received

    stack.route({})  # the only replica is gone from the table
    for _ in range(3):
        assert ask(c) == "Hello from the engine."
    assert len(ext.received) == 3
    sent = ext.received[0]
    assert sent.body["model"] == "provider/chat-large"  # the upstream's own name
    assert sent.headers["Authorization"] == f"Bearer {KEY}"
    assert secret not in json.dumps(sent.headers)  # the client's key is never forwarded
    assert all(p.get("Authorization") == f"Bearer {KEY}" for p in ext.probes)

    rows = stack.rows()
    assert sorted((r.upstream or "-") for r in rows) == ["-", "-", "-", "ext", "ext", "ext"]
    served = [r for r in rows if r.upstream == "ext"]
    assert all(r.model == "chat" and r.project == "research" and r.status == 200
               for r in served)
    row = served[0]  # charged at chat's own prices
    assert row.cost_usd == pytest.approx(
        ((row.prompt_tokens or 0) * 1.0 + (row.completion_tokens or 0) * 2.0) / 1e6)

    text = scrape(stack)
    assert 'llmgw_upstream_requests_total{upstream="ext"} 3.0' in text
    assert 'llmgw_upstream_up{upstream="ext"} 1.0' in text
    assert 'llmgw_upstream_failures_total{upstream="ext"} 0.0' in text

    stack.route({"chat": [replica]})  # back: the replica takes them again
    ask(c)
    assert len(replica.received) == 4 and len(ext.received) == 3


def test_a_replica_that_fails_before_its_first_byte_falls_back(
        make_stack: StackFactory, tmp_path: Path) -> None:
    stack, ext = with_upstream(make_stack, tmp_path, replicas=0)
    stack.route({"chat": ["http://127.0.0.1:9"]})  # still in the table, nothing listens
    c = client(stack, stack.key())
    assert ask(c) == "Hello from the engine."
    assert len(ext.received) == 1
    (row,) = stack.rows()
    assert row.status == 200 and row.upstream == "ext"


def test_always_is_routed_like_a_replica(make_stack: StackFactory, tmp_path: Path) -> None:
    stack, ext = with_upstream(make_stack, tmp_path, use="always")
    replica = stack.upstreams[0]
    stack.route({"chat": [replica]})
    c = client(stack, stack.key())
    for _ in range(6):
        ask(c)
    assert len(replica.received) == 3 and len(ext.received) == 3  # in turn


def test_a_name_only_upstreams_serve(make_stack: StackFactory, tmp_path: Path) -> None:
    stack, ext = with_upstream(make_stack, tmp_path)
    c = client(stack, stack.key())
    assert "only-there" in [m.id for m in c.models.list()]
    assert ask(c, "only-there") == "Hello from the engine."
    assert ext.received[-1].body["model"] == "only-there"
    (row,) = stack.rows()
    assert row.model == "only-there" and row.upstream == "ext"
    assert row.cost_usd == pytest.approx(
        ((row.prompt_tokens or 0) * 3.0 + (row.completion_tokens or 0) * 6.0) / 1e6)
    assert row.cost_usd > 0


def test_an_upstream_that_is_down_is_not_routed(
        make_stack: StackFactory, tmp_path: Path) -> None:
    stack, ext = with_upstream(make_stack, tmp_path)
    c = client(stack, stack.key())
    assert ask(c) == "Hello from the engine."

    ext.health_status = 503
    until(lambda: not stack.router.externals.status()["ext"][0])
    assert stack.router.externals.status()["ext"] == (False, "GET /v1/models answered 503")
    assert 'llmgw_upstream_up{upstream="ext"} 0.0' in scrape(stack)
    with pytest.raises(openai.APIStatusError) as refused:
        ask(c)
    assert refused.value.status_code == 503  # no replica, no upstream: model_loading
    assert "no upstream that is up (ext: GET /v1/models answered 503)" in str(refused.value)
    assert len(ext.received) == 1

    ext.health_status = 200
    until(lambda: stack.router.externals.status()["ext"][0])
    assert ask(c) == "Hello from the engine."
    assert 'llmgw_upstream_up{upstream="ext"} 1.0' in scrape(stack)


def test_a_key_the_upstream_refuses_keeps_it_down(
        make_stack: StackFactory, tmp_path: Path) -> None:
    stack, ext = with_upstream(make_stack, tmp_path)
    ext.health_status = 401
    until(lambda: stack.router.externals.status()["ext"]
          == (False, "GET /v1/models answered 401"))
    assert not stack.router.routes.has("chat")


def test_an_unreadable_key_file_is_not_routed_and_not_quoted(
        make_stack: StackFactory, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    stack = make_stack(replicas=0)
    ext = stack.run(Upstream("ext").start())
    stack.upstreams.append(ext)
    bad = tmp_path / "bad.key"
    bad.write_text("line one\nKEYMARK-second-line\n")
    with caplog.at_level(logging.DEBUG):
        stack.call(stack.router.configure, catalogs.from_cluster(spec(ext.url, bad)))
    up, why = stack.router.externals.status()["ext"]
    assert not up and why == (f"its key file {bad}: holds a space, line break or control "
                              "character")
    assert "KEYMARK" not in caplog.text
    assert not ext.probes


def test_streams_through_an_upstream(make_stack: StackFactory, tmp_path: Path) -> None:
    stack, ext = with_upstream(make_stack, tmp_path)
    ext.chunk_delays = [0.0, 0.05, 0.05]
    c = client(stack, stack.key())
    pieces = c.chat.completions.create(
        model="chat", messages=[{"role": "user", "content": "hi"}], stream=True)
    assert "".join(ch.choices[0].delta.content or "" for ch in pieces) == "Hello from the"
    sent = ext.received[0]
    assert sent.headers["Authorization"] == f"Bearer {KEY}"
    assert sent.body["model"] == "provider/chat-large" and sent.body["stream"] is True
    # The router writes a stream's row once its handler ends, which the client's last read
    # of the stream can come before (a fresh-clone CI run read no row yet).
    wait_until(lambda: bool(stack.rows()))
    (row,) = stack.rows()
    assert row.stream and row.upstream == "ext" and row.completion_tokens == 3


def test_an_upstream_cap_is_its_own(make_stack: StackFactory, tmp_path: Path) -> None:
    stack, ext = with_upstream(make_stack, tmp_path, max_in_flight=1)
    release = stack.run(_event())
    ext.hold = release
    secret = stack.key()

    async def two() -> list[Any]:
        async with openai.AsyncOpenAI(base_url=stack.url + "/v1", api_key=secret,
                                      max_retries=0) as c:
            return await both(c)

    async def both(c: openai.AsyncOpenAI) -> list[Any]:
        first = asyncio.create_task(c.chat.completions.create(
            model="only-there", messages=[{"role": "user", "content": "hi"}]))
        while not ext.active:
            await asyncio.sleep(0.01)
        assert stack.router.routes.free("only-there", None) == 0
        second = c.chat.completions.create(
            model="only-there", messages=[{"role": "user", "content": "hi"}])
        stack.loop.call_soon_threadsafe(release.set)
        return await asyncio.gather(first, second, return_exceptions=True)

    results = asyncio.run(two())
    assert [type(r).__name__ for r in results] == ["ChatCompletion", "ChatCompletion"]
    assert ext.peak == 1


async def _event() -> asyncio.Event:
    return asyncio.Event()


def test_the_key_is_nowhere_but_the_upstreams_requests(
        make_stack: StackFactory, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.DEBUG):
        stack, ext = with_upstream(make_stack, tmp_path)
        c = client(stack, stack.key())
        ask(c)
        ext.status = 500  # an error path too
        with pytest.raises(openai.APIStatusError):
            ask(c)
        ext.health_status = 503
        until(lambda: not stack.router.externals.status()["ext"][0])
        stack.rows()
    assert KEY not in caplog.text
    assert KEY not in scrape(stack)
    assert not any(KEY in v for v in stack.table_values("usage"))
    assert KEY not in repr(stack.router.routes.endpoints("chat"))


def test_an_adapter_is_never_sent_to_an_upstream(
        make_stack: StackFactory, tmp_path: Path) -> None:
    stack = make_stack(replicas=1, wait_timeout=0.5)
    ext = stack.run(Upstream("ext").start())
    stack.upstreams.append(ext)
    cluster = spec(ext.url, key_file(tmp_path), "always")
    cluster.models["chat"].adapters.append(LoraAdapter(name="chat-sql", source="/w/sql"))
    stack.call(stack.router.configure, catalogs.from_cluster(cluster))
    until(lambda: stack.router.externals.status()["ext"][0])
    c = client(stack, stack.key())
    with pytest.raises(openai.APIStatusError) as refused:
        ask(c, "chat-sql")  # only the upstream is there: no replica loaded the adapter
    assert refused.value.status_code == 503 and not ext.received
    replica = stack.upstreams[0]
    stack.route({"chat": [replica]})
    ask(c, "chat-sql")
    ask(c, "chat-sql")
    assert len(replica.received) == 2 and not ext.received


def test_an_on_demand_model_served_by_its_fallback_is_still_started(
        make_stack: StackFactory, tmp_path: Path) -> None:
    stack = make_stack(replicas=0, wait_timeout=0.5)
    ext = stack.run(Upstream("ext").start())
    stack.upstreams.append(ext)
    cluster = spec(ext.url, key_file(tmp_path), min_replicas=0)
    stack.call(stack.router.configure, catalogs.from_cluster(cluster))
    until(lambda: stack.router.externals.status()["ext"][0])
    assert stack.router.demand().waiting == {}
    assert ask(client(stack, stack.key())) == "Hello from the engine."  # no wait
    demand = stack.router.demand()
    assert demand.waiting == {"chat": 1} and demand.wanted == {"chat": 1}
    assert not stack.router.demands.snapshot(now=time.time() + 11).waiting  # a while only


def test_another_llmgw_as_the_upstream(make_stack: StackFactory, tmp_path: Path) -> None:
    """Router A in front of router B (its own store and keys): A sends B's key, B bills it."""
    (tmp_path / "b").mkdir()
    b = Stack(tmp_path / "b", cluster(), Settings(), 1)
    try:
        b.route({"chat": b.upstreams})
        b_key = tmp_path / "b.key"
        b_key.write_text(b.key() + "\n")
        a = make_stack(replicas=0, wait_timeout=0.5)
        a.call(a.router.configure, catalogs.from_cluster(Cluster.model_validate({
            "cluster": {"name": "edge"}, "projects": {"research": {}},
            "upstreams": {"b": {"url": b.url, "api_key_file": str(b_key), "health": FAST,
                                "models": {"chat": {"use": "always"}}}}})))
        until(lambda: a.router.externals.status()["b"][0])
        c = client(a, a.key())
        assert ask(c) == "Hello from the engine."
        pieces = c.chat.completions.create(
            model="chat", messages=[{"role": "user", "content": "hi"}], stream=True)
        assert "".join(ch.choices[0].delta.content or "" for ch in pieces) == "Hello from the"
        assert sorted((r.upstream or "", r.status, r.stream) for r in a.rows()) == [
            ("b", 200, False), ("b", 200, True)]
        billed = b.rows()  # B's own rows: its project, the key A holds
        assert len(billed) == 2 and all(r.project == "research" and r.upstream is None
                                        for r in billed)
        with pytest.raises(openai.AuthenticationError):  # A's key means nothing to B
            ask(openai.OpenAI(base_url=b.url + "/v1", api_key=a.key(), max_retries=0))
    finally:
        b.close()
