"""Keys, budgets, auth: none, request limits, errors' shape, /health and /ready."""

from __future__ import annotations

import aiohttp
import openai
import pytest
from support.stacks import Stack, StackFactory, cluster
from support.waits import wait_until

from llmgw.router import keycaches
from llmgw.store import keys, usages

BODY = {"model": "chat", "messages": [{"role": "user", "content": "hi"}]}


async def request(
    stack: Stack, path: str, *, key: str | None = None, method: str = "POST",
    data: bytes | None = None, json: object = None,
) -> tuple[int, dict[str, object], dict[str, str]]:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    async with aiohttp.ClientSession(headers=headers) as session:
        async with session.request(method, stack.url + path, data=data, json=json) as response:
            return response.status, await response.json(), dict(response.headers)


def assert_openai_error(answer: dict[str, object]) -> dict[str, object]:
    error = answer["error"]
    assert isinstance(error, dict) and set(error) == {"message", "type", "param", "code"}
    assert isinstance(error["message"], str) and error["message"]
    return error


@pytest.mark.parametrize("header, why, code", [
    (None, "missing API key", "missing_api_key"),
    ("llmgw_000000000000_" + "x" * 43, "invalid API key", "invalid_api_key"),
    ("sk-not-ours", "invalid API key", "invalid_api_key"),
])
async def test_requests_need_a_valid_key(
    stack: Stack, header: str | None, why: str, code: str
) -> None:
    for path, method in (("/v1/chat/completions", "POST"), ("/v1/models", "GET")):
        status, answer, _ = await request(stack, path, key=header, method=method, json=BODY)
        assert status == 401
        error = assert_openai_error(answer)
        assert why in error["message"] and error["code"] == code  # type: ignore[operator]
        assert error["type"] == "authentication_error"
    assert stack.upstreams[0].received == []


@pytest.mark.parametrize("scheme", ["Basic", "Token", "", "Bearer:"])
async def test_a_valid_key_under_another_scheme_is_refused(stack: Stack, scheme: str) -> None:
    key = stack.key()
    for path, method in (("/v1/chat/completions", "POST"), ("/v1/models", "GET")):
        headers = {"Authorization": f"{scheme} {key}".strip()}
        async with aiohttp.ClientSession(headers=headers) as session:
            async with session.request(method, stack.url + path, json=BODY) as response:
                assert response.status == 401
                error = assert_openai_error(await response.json())
        assert error["code"] == "invalid_api_key" and "Bearer" in error["message"]  # type: ignore[operator]
    assert not [r for u in stack.upstreams for r in u.received]


def test_revoked_key_is_refused(stack: Stack) -> None:
    key = stack.key()
    c = openai.OpenAI(base_url=stack.url + "/v1", api_key=key, max_retries=0)
    c.chat.completions.create(**BODY)  # type: ignore[call-overload]
    stack.run(keys.revoke(stack.db, keys.key_id_of(key) or ""))

    def refused() -> bool:
        try:
            c.chat.completions.create(**BODY)  # type: ignore[call-overload]
        except openai.AuthenticationError as exc:
            assert "revoked" in exc.message
            return True
        return False

    # The router's key cache lets it go within the stated bound (docs/ha.md), not at once.
    wait_until(refused, timeout=keycaches.REVOCATION_BOUND)


def test_budget_exhaustion_is_429(make_stack: StackFactory) -> None:
    # 4 prompt "words" * $1/M + 5 completion tokens * $2/M = $0.000014 per request.
    stack = make_stack(spec=cluster(research=0.00002, other=None))
    stack.route({"chat": stack.upstreams})
    c = openai.OpenAI(base_url=stack.url + "/v1", api_key=stack.key(), max_retries=0)
    c.chat.completions.create(**BODY)  # type: ignore[call-overload]  # $0.000014
    c.chat.completions.create(**BODY)  # type: ignore[call-overload]  # $0.000028: over now
    with pytest.raises(openai.RateLimitError, match="'research' is over its budget") as caught:
        c.chat.completions.create(**BODY)  # type: ignore[call-overload]
    assert caught.value.code == "insufficient_quota"
    assert sum(len(u.received) for u in stack.upstreams) == 2
    # Another project is not affected.
    other = openai.OpenAI(base_url=stack.url + "/v1", api_key=stack.key("other"), max_retries=0)
    other.chat.completions.create(**BODY)  # type: ignore[call-overload]
    assert [r.status for r in stack.rows()] == [200, 429, 200, 200]


def test_spend_survives_a_restart(make_stack: StackFactory) -> None:
    spec = cluster(research=0.00001)
    first = make_stack(spec=spec)
    first.route({"chat": first.upstreams})
    key = first.key()
    openai.OpenAI(base_url=first.url + "/v1", api_key=key, max_retries=0).chat.completions.create(
        **BODY)  # type: ignore[call-overload]
    first.run(first.router.accounts.flush())
    assert first.run(usages.spend_by_project(first.db))["research"] > 0.00001
    second = make_stack(spec=spec)  # same database, fresh router
    second.route({"chat": second.upstreams})
    with pytest.raises(openai.RateLimitError):
        openai.OpenAI(base_url=second.url + "/v1", api_key=key,
                      max_retries=0).chat.completions.create(**BODY)  # type: ignore[call-overload]


async def test_key_of_a_project_gone_from_the_spec(make_stack: StackFactory) -> None:
    stack = make_stack(spec=cluster(research=None))
    key = stack.key("old-project")
    status, answer, _ = await request(stack, "/v1/chat/completions", key=key, json=BODY)
    error = assert_openai_error(answer)
    assert status == 403 and "'old-project'" in error["message"]  # type: ignore[operator]
    assert error["code"] == "unknown_project" and error["type"] == "permission_error"


def test_auth_none_needs_no_key(make_stack: StackFactory) -> None:
    stack = make_stack(spec=cluster(auth="none"))
    stack.route({"chat": stack.upstreams})
    c = openai.OpenAI(base_url=stack.url + "/v1", api_key="anything", max_retries=0)
    assert c.chat.completions.create(**BODY).choices  # type: ignore[call-overload]
    (row,) = stack.rows()
    assert row.project is None and row.key_id is None and row.completion_tokens == 5


@pytest.mark.parametrize("data, status, fragment", [
    (b"{not json", 400, "not valid JSON"),
    (b"[1, 2]", 400, "JSON object"),
    (b'{"messages": []}', 400, "model parameter"),
    (b'{"model": 7}', 400, "model parameter"),
    (b'{"model": "chat", "x": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", 400,
     "nested too deeply"),
])
async def test_bad_bodies(stack: Stack, data: bytes, status: int, fragment: str) -> None:
    got, answer, _ = await request(stack, "/v1/chat/completions", key=stack.key(), data=data)
    assert got == status and fragment in assert_openai_error(answer)["message"]  # type: ignore[operator]


async def test_body_size_limit(make_stack: StackFactory) -> None:
    stack = make_stack(max_body_bytes=1000)
    stack.route({"chat": stack.upstreams})
    big = {**BODY, "messages": [{"role": "user", "content": "x" * 2000}]}
    status, answer, _ = await request(stack, "/v1/chat/completions", key=stack.key(), json=big)
    assert status == 413 and "limit" in assert_openai_error(answer)["message"]  # type: ignore[operator]
    assert stack.upstreams[0].received == [] and stack.upstreams[1].received == []

    # Without a Content-Length (chunked), the limit still holds while reading.
    async def chunks():  # type: ignore[no-untyped-def]
        for _ in range(20):
            yield b" " * 100
    async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {stack.key()}"}) as s:
        async with s.post(stack.url + "/v1/chat/completions", data=chunks()) as response:
            assert response.status == 413
            assert_openai_error(await response.json())


@pytest.mark.parametrize("path, method, status", [
    ("/v1/nothing", "GET", 404),
    ("/v1/chat/completions", "GET", 405),
])
async def test_routing_errors_are_openai_shaped(
    stack: Stack, path: str, method: str, status: int
) -> None:
    got, answer, _ = await request(stack, path, method=method)
    assert got == status
    assert_openai_error(answer)


async def test_health_and_ready(make_stack: StackFactory) -> None:
    stack = make_stack()
    assert (await request(stack, "/health", method="GET"))[0] == 200
    status, answer, _ = await request(stack, "/ready", method="GET")
    assert status == 503 and answer["status"] == "not ready"
    stack.route({"chat": stack.upstreams})
    status, answer, _ = await request(stack, "/ready", method="GET")
    assert status == 200 and answer["models"] == ["chat"]
