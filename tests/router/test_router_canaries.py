"""A canary gets its share of requests; a failure there is retried on an old replica; every
attempt is tallied per replica."""

from __future__ import annotations

import openai
from support.stacks import Stack

from llmgw.router import Endpoint, tallies

BODY = {"model": "chat", "messages": [{"role": "user", "content": "hi"}]}


def client(stack: Stack) -> openai.OpenAI:
    return openai.OpenAI(base_url=stack.url + "/v1", api_key=stack.key(), max_retries=0)


def canary_table(stack: Stack, share: float) -> None:
    old, new = stack.upstreams
    stack.call(stack.router.update_routes, {"chat": [
        Endpoint(old.url, "local", 0), Endpoint(new.url, "local", 1, share=share)]})


def test_a_canary_gets_its_share_counted_not_drawn(stack: Stack) -> None:
    old, new = stack.upstreams
    canary_table(stack, 0.25)
    c = client(stack)
    for _ in range(12):
        c.chat.completions.create(**BODY)
    assert (len(old.received), len(new.received)) == (9, 3)


def test_without_a_share_both_replicas_take_turns(stack: Stack) -> None:
    old, new = stack.upstreams
    stack.route({"chat": [old, new]})
    c = client(stack)
    for _ in range(12):
        c.chat.completions.create(**BODY)
    assert (len(old.received), len(new.received)) == (6, 6)


def test_a_failing_canary_costs_clients_nothing_and_is_tallied(stack: Stack) -> None:
    old, new = stack.upstreams
    new.status = 500
    canary_table(stack, 0.5)
    c = client(stack)
    for i in range(10):
        if i % 2:
            text = "".join(ch.choices[0].delta.content or "" for ch in
                           c.chat.completions.create(**BODY, stream=True))
            assert text == "Hello from the"
        else:
            assert c.chat.completions.create(**BODY).choices[0].message.content
    assert len(new.received) == 5  # its share, each retried on the old replica
    assert len(old.received) == 10
    counts = stack.call(stack.router.tallies)
    assert (counts[new.url]["requests"], counts[new.url]["errors"]) == (5, 5)
    assert (counts[old.url]["requests"], counts[old.url]["errors"]) == (10, 0)
    assert len(counts[old.url]["ttft"]) == 10 and counts[new.url]["ttft"] == []
    assert counts[old.url]["inflight"] == counts[new.url]["inflight"] == 0


def test_a_replica_that_leaves_the_table_is_forgotten(stack: Stack) -> None:
    old, new = stack.upstreams
    stack.route({"chat": [old, new]})
    c = client(stack)
    for _ in range(2):
        c.chat.completions.create(**BODY)
    stack.route({"chat": [old]})
    assert set(stack.call(stack.router.tallies)) == {old.url}


def test_tallies_from_several_routers_add_up() -> None:
    a = {"http://x": {"requests": 3, "errors": 1, "inflight": 1, "ttft": [0.1]}}
    b = {"http://x": {"requests": 2, "errors": 0, "inflight": 0, "ttft": [0.2, 0.3]},
         "http://y": {"requests": "not a number", "errors": 0}}
    assert tallies.merge([a, b, "junk"]) == {  # type: ignore[list-item]
        "http://x": {"requests": 5, "errors": 1, "inflight": 1, "ttft": [0.1, 0.2, 0.3]}}


def test_a_5xx_with_no_replica_left_to_retry_counts_as_an_error(stack: Stack) -> None:
    only, _ = stack.upstreams
    only.status = 502
    stack.route({"chat": [only]})
    c = client(stack)
    for _ in range(2):
        try:
            c.chat.completions.create(**BODY)
        except openai.APIStatusError as exc:
            assert exc.status_code == 502
    counts = stack.call(stack.router.tallies)[only.url]
    assert (counts["requests"], counts["errors"]) == (2, 2)
