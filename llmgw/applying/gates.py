"""Rollout gates' decisions: does a new replica's probe pass, is it worse than the old one.

These are purely computational functions with no side effects; the probe's
HTTP call and the bake's polling are :mod:`llmgw.applying.bakes`. Each returns
its reason with its answer, worded for a plan line and the journal:
``p50 TTFT 4.1 s vs 0.3 s``, ``error rate 12.0% vs 0.0%``.

* :func:`check_probe`: the probe answer's status, shape (non-empty completion
  text) and latency against the model's ``rollout.probe``.
* :func:`judge`: the canary's tallies against the old replicas' during and at
  the end of the bake. Worse is found as soon as ``min_requests`` reached the
  canary (a broken replica is rolled back without waiting out the bake); better
  or equal is only promoted once the bake is over. Too few requests by then:
  promoted on the probe alone, and the reason says so.

Usage::

    verdict = gates.judge(rollout.compare, canary, baseline, baked=True)
    if verdict.decision == "rollback": ...
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from llmgw.spec.rollouts import Compare, Probe

Decision = Literal["wait", "promote", "rollback"]


@dataclass(frozen=True)
class Stats:
    """One or more replicas' tallied requests (see :mod:`llmgw.router.tallies`)."""

    requests: int = 0
    errors: int = 0
    ttft: tuple[float, ...] = ()  # seconds, recent successful requests

    @property
    def error_rate(self) -> float:
        return self.errors / self.requests if self.requests else 0.0

    @property
    def p50(self) -> float | None:
        return statistics.median(self.ttft) if self.ttft else None


@dataclass(frozen=True)
class Verdict:
    decision: Decision
    reason: str

    @property
    def passed(self) -> bool:
        return self.decision == "promote"


def stats(tallies: Mapping[str, Mapping[str, Any]], urls: Iterable[str]) -> Stats:
    """The tallies of ``urls`` added up (one replica, or every old one)."""
    requests = errors = 0
    ttft: list[float] = []
    for url in urls:
        doc = tallies.get(url)
        if doc is None:
            continue
        requests += int(doc.get("requests", 0))
        errors += int(doc.get("errors", 0))
        ttft.extend(float(t) for t in doc.get("ttft", ()))
    return Stats(requests, errors, tuple(ttft))


def judge(compare: Compare, canary: Stats, baseline: Stats, *, baked: bool) -> Verdict:
    """Promote, roll back or wait, comparing the canary with the old replicas."""
    if canary.requests < compare.min_requests:
        if not baked:
            return Verdict("wait", f"{canary.requests} of {compare.min_requests} requests")
        return Verdict("promote", f"passed on its probe: only {canary.requests} of "
                       f"{compare.min_requests} requests reached it during the bake")
    rate, base_rate = canary.error_rate, baseline.error_rate
    if rate > base_rate + compare.max_error_rate_increase:
        return Verdict("rollback", f"error rate {_percent(rate)} vs {_percent(base_rate)} "
                       f"({canary.errors} of {canary.requests} requests failed)")
    p50, base_p50 = canary.p50, baseline.p50
    if p50 is not None and base_p50 is not None and p50 > base_p50 * compare.max_ttft_ratio:
        return Verdict("rollback", f"p50 TTFT {_seconds(p50)} vs {_seconds(base_p50)}")
    measured = f"error rate {_percent(rate)} vs {_percent(base_rate)}"
    if p50 is not None and base_p50 is not None:
        measured += f", p50 TTFT {_seconds(p50)} vs {_seconds(base_p50)}"
    if not baked:
        return Verdict("wait", measured)
    return Verdict("promote", f"{measured} over {canary.requests} requests")


def check_probe(probe: Probe, status: int | None, body: bytes, latency: float,
                error: str | None = None) -> Verdict:
    """The probe's verdict from what the new replica answered (``error``: no answer)."""
    if error is not None:
        return Verdict("rollback", f"probe failed: {error}")
    if latency > probe.timeout:
        return Verdict("rollback", f"probe answered in {_seconds(latency)}, over its bound "
                       f"of {_seconds(probe.timeout)}")
    if status != probe.expect_status:
        return Verdict("rollback", f"probe answered {status}, expected {probe.expect_status}")
    if probe.expect == "text" and not completion_text(body):
        return Verdict("rollback", "probe answer holds no completion text")
    return Verdict("promote", f"probe answered {status} in {_seconds(latency)}")


def completion_text(body: bytes) -> str:
    """The text of a chat or text completion answer; empty when it holds none."""
    try:
        doc = json.loads(body)
        choice = doc["choices"][0]
        message = choice.get("message") or {}
        text = message.get("content") or message.get("reasoning_content") or choice.get("text")
    except (ValueError, KeyError, IndexError, TypeError, AttributeError, RecursionError):
        return ""
    return text.strip() if isinstance(text, str) else ""


def _percent(rate: float) -> str:
    return f"{rate * 100:.1f}%"


def _seconds(value: float) -> str:
    return f"{value:.1f} s" if value >= 0.1 else f"{value * 1000:.0f} ms"
