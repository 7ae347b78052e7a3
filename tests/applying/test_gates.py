"""Gate decisions: the probe's verdict and the canary judged against the old replicas."""

from __future__ import annotations

import json

import pytest

from llmgw.applying import gates
from llmgw.applying.gates import Stats
from llmgw.spec.rollouts import Compare, Probe

COMPARE = Compare(max_error_rate_increase=0.05, max_ttft_ratio=2.0, min_requests=10)


def ok(n: int, ttft: float = 0.3) -> Stats:
    return Stats(n, 0, (ttft,) * n)


@pytest.mark.parametrize(
    ("canary", "baseline", "baked", "decision", "reason"),
    [
        pytest.param(ok(9), ok(100), False, "wait", "9 of 10 requests", id="too-few-yet"),
        pytest.param(ok(9), ok(100), True, "promote",
                     "passed on its probe: only 9 of 10 requests reached it during the bake",
                     id="too-few-by-the-end"),
        pytest.param(ok(10), ok(100), False, "wait", "error rate 0.0% vs 0.0%, "
                     "p50 TTFT 0.3 s vs 0.3 s", id="as-good-but-still-baking"),
        pytest.param(ok(10), ok(100), True, "promote", "error rate 0.0% vs 0.0%, "
                     "p50 TTFT 0.3 s vs 0.3 s over 10 requests", id="as-good-and-baked"),
        pytest.param(Stats(20, 2, (0.3,) * 18), ok(100), False, "rollback",
                     "error rate 10.0% vs 0.0% (2 of 20 requests failed)",
                     id="errors-found-before-the-end"),
        pytest.param(Stats(20, 1, (0.3,) * 19), ok(100), True, "promote",
                     "error rate 5.0% vs 0.0%, p50 TTFT 0.3 s vs 0.3 s over 20 requests",
                     id="errors-at-the-bound-pass"),
        pytest.param(Stats(20, 3, (0.3,) * 17), Stats(100, 10, (0.3,) * 90), True, "promote",
                     "error rate 15.0% vs 10.0%, p50 TTFT 0.3 s vs 0.3 s over 20 requests",
                     id="errors-relative-to-the-old-pass"),
        pytest.param(Stats(20, 3, (0.3,) * 17), Stats(100, 1, (0.3,) * 99), True, "rollback",
                     "error rate 15.0% vs 1.0% (3 of 20 requests failed)",
                     id="errors-relative-to-the-old-fail"),
        pytest.param(ok(10, 4.1), ok(100, 0.3), False, "rollback", "p50 TTFT 4.1 s vs 0.3 s",
                     id="slow-found-before-the-end"),
        pytest.param(ok(10, 0.6), ok(100, 0.3), True, "promote",
                     "error rate 0.0% vs 0.0%, p50 TTFT 0.6 s vs 0.3 s over 10 requests",
                     id="slow-at-the-ratio-passes"),
        pytest.param(ok(10, 0.61), ok(100, 0.3), True, "rollback", "p50 TTFT 0.6 s vs 0.3 s",
                     id="slower-than-the-ratio-fails"),
        pytest.param(ok(10, 0.05), ok(100, 0.02), True, "rollback", "p50 TTFT 50 ms vs 20 ms",
                     id="milliseconds"),
        pytest.param(ok(10, 0.0125), ok(100, 0.005), True, "rollback",
                     "p50 TTFT 12 ms vs 5 ms", id="milliseconds-rounded"),
        pytest.param(Stats(12, 0, (9.0,) * 5 + (0.1,) * 7), ok(100, 0.3), True, "promote",
                     "error rate 0.0% vs 0.0%, p50 TTFT 0.1 s vs 0.3 s over 12 requests",
                     id="median-not-mean"),
        pytest.param(ok(10), Stats(), True, "promote",
                     "error rate 0.0% vs 0.0% over 10 requests", id="old-saw-nothing"),
    ],
)
def test_judge(canary: Stats, baseline: Stats, baked: bool, decision: str, reason: str) -> None:
    verdict = gates.judge(COMPARE, canary, baseline, baked=baked)
    assert (verdict.decision, verdict.reason) == (decision, reason)


def chat(content: object) -> bytes:
    return json.dumps({"choices": [{"message": {"role": "assistant", "content": content}}]}
                      ).encode()


PROBE = Probe(timeout=10.0)


@pytest.mark.parametrize(
    ("status", "body", "latency", "error", "decision", "reason"),
    [
        pytest.param(200, chat("ready"), 0.5, None, "promote", "probe answered 200 in 0.5 s",
                     id="good"),
        pytest.param(200, chat(""), 0.5, None, "rollback",
                     "probe answer holds no completion text", id="empty-text"),
        pytest.param(200, chat("  \n"), 0.5, None, "rollback",
                     "probe answer holds no completion text", id="blank-text"),
        pytest.param(200, chat(None), 0.5, None, "rollback",
                     "probe answer holds no completion text", id="null-content"),
        pytest.param(200, b"not json", 0.5, None, "rollback",
                     "probe answer holds no completion text", id="not-json"),
        pytest.param(200, b'{"choices": []}', 0.5, None, "rollback",
                     "probe answer holds no completion text", id="no-choice"),
        pytest.param(200, json.dumps({"choices": [{"message": {
                         "content": "", "reasoning_content": "thinking"}}]}).encode(), 0.5,
                     None, "promote", "probe answered 200 in 0.5 s", id="reasoning-text"),
        pytest.param(200, b'{"choices": [{"text": "ok"}]}', 0.5, None, "promote",
                     "probe answered 200 in 0.5 s", id="text-completion-shape"),
        pytest.param(400, chat("ready"), 0.5, None, "rollback",
                     "probe answered 400, expected 200", id="status"),
        pytest.param(200, chat("ready"), 10.5, None, "rollback",
                     "probe answered in 10.5 s, over its bound of 10.0 s", id="too-slow"),
        pytest.param(200, chat("ready"), 10.0, None, "promote", "probe answered 200 in 10.0 s",
                     id="at-the-bound"),
        pytest.param(None, b"", 1.0, "ClientConnectorError: refused", "rollback",
                     "probe failed: ClientConnectorError: refused", id="no-answer"),
    ],
)
def test_check_probe(status: int | None, body: bytes, latency: float, error: str | None,
                     decision: str, reason: str) -> None:
    verdict = gates.check_probe(PROBE, status, body, latency, error)
    assert (verdict.decision, verdict.reason) == (decision, reason)


def test_probe_expecting_any_answer_accepts_empty_text() -> None:
    verdict = gates.check_probe(Probe(expect="any"), 200, chat(""), 0.1)
    assert verdict.passed


def test_stats_add_up_the_urls_asked_for() -> None:
    tallies = {"http://a": {"requests": 3, "errors": 1, "inflight": 0, "ttft": [0.1, 0.2]},
               "http://b": {"requests": 2, "errors": 0, "inflight": 1, "ttft": [0.3]},
               "http://c": {"requests": 50, "errors": 50, "inflight": 0, "ttft": []}}
    both = gates.stats(tallies, ["http://gone", "http://a", "http://b"])
    assert both == Stats(5, 1, (0.1, 0.2, 0.3))
    assert both.p50 == 0.2 and both.error_rate == 0.2
    assert Stats().p50 is None and Stats().error_rate == 0.0


def test_stats_of_a_replica_with_nothing_tallied_are_zero() -> None:
    assert gates.stats({"http://a": {}}, ["http://a"]) == Stats()
