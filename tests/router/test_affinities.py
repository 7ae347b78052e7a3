"""Prefix affinity: the prompt key and consistent hashing with bounded loads.

These are the rules prefix routing promises: the same prefix keeps its replica,
a hot prefix spills rather than piling onto one replica, a removed replica
moves only its own keys, and short prompts are routed by load alone.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import pytest

from llmgw.router import affinities
from llmgw.router.routes import Endpoint, Routes

SYSTEM = "You are a careful assistant for the billing team. " * 20  # ~1 000 characters


@dataclass(eq=False)
class Box:
    name: str
    load: int = 0


def _ring(*names: str) -> tuple[affinities.Ring[Box], dict[str, Box]]:
    boxes = {name: Box(name) for name in names}
    return affinities.Ring(list(boxes.values()), lambda b: b.name), boxes


def _chat(*messages: tuple[str, str]) -> dict[str, object]:
    return {"model": "m", "messages": [{"role": r, "content": c} for r, c in messages]}


@pytest.mark.parametrize(
    ("body", "text"),
    [
        pytest.param(_chat(("system", "S"), ("user", "hi")), "system: S\x1euser: hi", id="chat"),
        pytest.param({"messages": [{"role": "user", "content": [
            {"type": "text", "text": "look "}, {"type": "image_url", "image_url": {}},
            {"type": "text", "text": "here"}]}]}, "user: look here", id="content-parts"),
        pytest.param({"prompt": "The capital of"}, "The capital of", id="completion"),
        pytest.param({"instructions": "Be brief.", "input": "Why?"}, "Be brief.\x1eWhy?",
                     id="responses"),
        pytest.param({"input": [{"role": "user", "content": "a"}]}, "user: a",
                     id="responses-items"),
        pytest.param({"model": "m"}, "", id="nothing"),
    ],
)
def test_prompt_text(body: dict[str, object], text: str) -> None:
    assert affinities.prompt_text(body) == text


def test_key_is_the_context_prefix_not_the_question() -> None:
    one = affinities.key(_chat(("system", SYSTEM), ("user", "invoice 1")), 4096, 256)
    two = affinities.key(_chat(("system", SYSTEM), ("user", "invoice 2")), 4096, 256)
    other = affinities.key(_chat(("system", SYSTEM.upper()), ("user", "invoice 1")), 4096, 256)
    assert one is not None and one == two
    assert other != one
    assert affinities.key(_chat(("system", SYSTEM), ("user", "x")), 512, 256) != one
    # A conversation keeps its key once its history outgrows prefix_chars.
    later = _chat(("system", SYSTEM), ("user", "invoice 1"), ("assistant", "Paid."),
                  ("user", "and 2?"))
    assert affinities.key(later, 512, 256) == affinities.key(
        _chat(("system", SYSTEM), ("user", "q")), 512, 256)
    # A completion's prompt is all context.
    assert affinities.key({"prompt": "x" * 600}, 512, 256) == affinities.key(
        {"prompt": "x" * 512 + "y" * 88}, 512, 256)


def test_prompt_text_context_leaves_out_the_question() -> None:
    body = _chat(("system", "S"), ("user", "hi"))
    assert affinities.prompt_text(body, context=True) == "system: S"
    assert affinities.prompt_text({"prompt": "p"}, context=True) == "p"


def test_message_boundaries_count() -> None:
    split_a = _chat(("user", "a" * 300 + "bc"), ("user", "q"))
    split_b = _chat(("user", "a" * 300 + "b"), ("user", "c"), ("user", "q"))
    assert affinities.key(split_a, 4096, 0) != affinities.key(split_b, 4096, 0)


def test_short_prompts_have_no_key() -> None:
    assert affinities.key(_chat(("system", "hi"), ("user", "q")), 2048, 256) is None
    assert affinities.key(_chat(("system", "x" * 300), ("user", "q")), 2048, 256) is not None


def test_same_key_same_member_while_not_overloaded() -> None:
    ring, _ = _ring("a", "b", "c")
    keys = [f"{n:016x}" for n in range(200)]
    first = [ring.pick(k, lambda b: b.load, 1.25) for k in keys]
    assert [ring.pick(k, lambda b: b.load, 1.25) for k in keys] == first
    spread = Counter(b.name for b in first if b is not None)
    assert set(spread) == {"a", "b", "c"}  # keys spread over every member
    assert min(spread.values()) > 200 / 3 / 2  # and none is starved


def test_a_hot_key_spills_at_the_bound() -> None:
    ring, boxes = _ring("a", "b")
    home = ring.pick("feedface00000000", lambda b: b.load, 1.25)
    assert home is not None
    placed = []
    for _ in range(8):  # eight requests in flight on one prefix
        chosen = ring.pick("feedface00000000", lambda b: b.load, 1.25)
        assert chosen is not None
        chosen.load += 1
        placed.append(chosen.name)
    # ceil(1.25 × (total + 1) / 2): the home replica never runs more than that ahead
    assert placed.count(home.name) == 5 and len(set(placed)) == 2
    assert max(b.load for b in boxes.values()) <= 5


def test_removing_a_member_moves_only_its_keys() -> None:
    ring, _ = _ring("a", "b", "c")
    smaller, _ = _ring("a", "b")
    keys = [f"{n:016x}" for n in range(300)]
    before = {k: ring.pick(k, lambda b: 0, 1.25) for k in keys}
    after = {k: smaller.pick(k, lambda b: 0, 1.25) for k in keys}
    for k in keys:
        was = before[k]
        assert was is not None
        now = after[k]
        assert now is not None
        if was.name != "c":
            assert now.name == was.name  # keys of a and b stay where they were


def test_excluded_members_are_skipped() -> None:
    ring, boxes = _ring("a", "b")
    home = ring.pick("0123456789abcdef", lambda b: b.load, 1.25)
    assert home is not None
    other = ring.pick("0123456789abcdef", lambda b: b.load, 1.25,
                      allowed=lambda b: b is not home)
    assert other is not None and other is not home
    assert ring.pick("0123456789abcdef", lambda b: b.load, 1.25, allowed=lambda b: False) is None
    assert affinities.Ring([], lambda b: b.name).pick("00", lambda b: 0, 1.25) is None
    assert set(boxes) == {"a", "b"}


def test_routes_pick_by_affinity_and_fall_back_to_least_outstanding() -> None:
    routes = Routes()
    routes.update({"m": [Endpoint("http://127.0.0.1:1"), Endpoint("http://127.0.0.1:2")]})
    digest = affinities.key(_chat(("system", SYSTEM), ("user", "q")), 2048, 256)
    picks = [routes.pick("m", affinity=digest) for _ in range(5)]
    homes = {u.endpoint.base_url for u in picks if u is not None}
    assert len(homes) == 1  # nothing in flight: the same replica every time
    fresh = Routes()
    fresh.update({"m": [Endpoint("http://127.0.0.1:1"), Endpoint("http://127.0.0.1:2")]})
    plain = [fresh.pick("m").endpoint.base_url for _ in range(4)]  # type: ignore[union-attr]
    assert len(set(plain)) == 2  # without a key, least outstanding takes turns
    home = routes.pick("m", affinity=digest)
    assert home is not None
    retry = routes.pick("m", exclude=[home], affinity=digest)
    assert retry is not None and retry is not home
