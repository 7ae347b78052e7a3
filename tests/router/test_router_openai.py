"""The official openai client, sync and async, through the router to real upstreams."""

from __future__ import annotations

import openai
import pytest
from support.stacks import Stack


def client(stack: Stack, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=stack.url + "/v1", api_key=key, max_retries=0)


def test_sync_client_every_endpoint(stack: Stack) -> None:
    c = client(stack, stack.key())

    chat = c.chat.completions.create(
        model="chat", messages=[{"role": "user", "content": "secret prompt words"}])
    assert chat.choices[0].message.content == "Hello from the engine."
    assert chat.usage is not None and chat.usage.completion_tokens == 5

    pieces = c.chat.completions.create(
        model="chat", messages=[{"role": "user", "content": "hi"}], stream=True)
    chunks = list(pieces)
    assert "".join(ch.choices[0].delta.content or "" for ch in chunks) == "Hello from the"
    # The client did not ask for usage: the chunk the router asked for is not shown.
    assert all(ch.choices for ch in chunks)

    completion = c.completions.create(model="chat", prompt="Say hello")
    assert completion.choices[0].text == "Hello from the engine."

    embedding = c.embeddings.create(model="chat", input=["a", "b"])
    assert [e.index for e in embedding.data] == [0, 1]
    assert embedding.data[0].embedding == [0.5, -0.25, 0.125]

    response = c.responses.create(model="chat", input="hello")
    assert response.output_text == "Hello from the engine."

    assert [m.id for m in c.models.list()] == ["Coder-7B", "chat"]

    rows = stack.rows()
    assert sorted(r.endpoint for r in rows) == sorted([
        "/v1/chat/completions", "/v1/chat/completions", "/v1/completions", "/v1/embeddings",
        "/v1/responses"])
    assert all(r.status == 200 and r.project == "research" and r.model == "chat" for r in rows)
    by_endpoint = {(r.endpoint, r.stream): r for r in rows}
    assert by_endpoint[("/v1/chat/completions", True)].completion_tokens == 3
    assert by_endpoint[("/v1/chat/completions", False)].completion_tokens == 5
    assert by_endpoint[("/v1/responses", False)].completion_tokens == 5
    assert by_endpoint[("/v1/embeddings", False)].prompt_tokens == 2  # words of ["a", "b"]


async def test_async_client_every_endpoint(stack: Stack) -> None:
    c = openai.AsyncOpenAI(base_url=stack.url + "/v1", api_key=stack.key(), max_retries=0)
    chat = await c.chat.completions.create(
        model="chat", messages=[{"role": "user", "content": "hi"}])
    assert chat.choices[0].message.content == "Hello from the engine."

    stream = await c.chat.completions.create(
        model="chat", messages=[{"role": "user", "content": "hi"}], stream=True,
        stream_options={"include_usage": True})
    chunks = [chunk async for chunk in stream]
    # This client asked for usage: it gets the final chunk, as from the engine itself.
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == 3

    completion = await c.completions.create(model="chat", prompt="x", stream=True)
    assert "".join([ch.choices[0].text async for ch in completion]) == "Hello from the"

    embedding = await c.embeddings.create(model="chat", input="a")
    assert len(embedding.data) == 1

    models = [m.id async for m in c.models.list()]
    assert models == ["Coder-7B", "chat"]
    assert (await c.models.retrieve("chat")).id == "chat"
    with pytest.raises(openai.NotFoundError, match="model not found"):
        await c.models.retrieve("nope")
    await c.close()

    rows = stack.rows()
    assert len(rows) == 4
    assert {r.completion_tokens for r in rows if r.endpoint == "/v1/completions"} == {3}


def test_usage_rows_hold_no_text(stack: Stack) -> None:
    c = client(stack, stack.key())
    marker = "zebra-crossing-orchid"
    c.chat.completions.create(model="chat", messages=[{"role": "user", "content": marker}])
    list(c.chat.completions.create(
        model="chat", messages=[{"role": "user", "content": marker}], stream=True))
    c.embeddings.create(model="chat", input=marker)
    assert len(stack.rows()) == 3
    values = [v for table in ("usage", "keys") for v in stack.table_values(table)]
    assert values and not [v for v in values if marker in v or "Hello" in v]
    # And not in any page of the database or its write-ahead log either (SQLite's files).
    for path in stack.db_path.parent.glob("llmgw.db*"):
        raw = path.read_bytes()
        assert marker.encode() not in raw and b"Hello from" not in raw, path


def test_prices_become_spend(stack: Stack) -> None:
    c = client(stack, stack.key())
    c.chat.completions.create(model="chat", messages=[{"role": "user", "content": "a b c"}])
    (row,) = stack.rows()
    assert row.prompt_tokens and row.completion_tokens == 5
    assert row.cost_usd == pytest.approx((row.prompt_tokens * 1.0 + 5 * 2.0) / 1e6)
    assert stack.router.accounts.spent["research"] == pytest.approx(row.cost_usd)
