"""An engine's load from its own metrics endpoint: the Prometheus text it serves.

Two pure halves, as every fact in this package: :func:`path` says what to ask
for, :func:`read` turns the text an engine answered into :class:`Figures`, and
:func:`load` makes the reported :class:`llmgw.fleet.EngineLoad` from them and
the previous scrape (a counter's rate needs two). Purely computational, no
side-effects; tested on recorded real output (``tests/fixtures/engines``).

Per engine, which of its metrics means what (:data:`NAMES`; prefixes
``vllm:``, ``sglang:``, ``llamacpp:`` left out):

    figure          vLLM                    SGLang                 llama.cpp
    running         num_requests_running    num_running_reqs       requests_processing
    waiting         num_requests_waiting    num_queue_reqs         requests_deferred
    KV cache (0-1)  kv_cache_usage_perc     token_usage            kv_cache_usage_ratio
                    (older: gpu_cache_usage_perc)
    token counter   generation_tokens_total generation_tokens_total tokens_predicted_total
    tokens/s gauge  -                       gen_throughput         predicted_tokens_seconds

A figure the text lacks is None, never zero. Samples of one metric with
different labels (vLLM's ``engine``, SGLang's ``dp_rank``: one engine process
serving through several schedulers) are summed; KV-cache use is their maximum,
the fullest scheduler being the one that refuses work first.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from llmgw.fleet.types import EngineLoad

PATH = "/metrics"
# Bigger than any engine's exposition seen (vLLM's, with every histogram: ~60 KiB).
MAX_BYTES = 1 << 20


@dataclass(frozen=True)
class Names:
    running: tuple[str, ...]
    waiting: tuple[str, ...]
    kv_cache: tuple[str, ...]  # the first one present wins
    tokens_counter: tuple[str, ...]
    tokens_gauge: tuple[str, ...] = ()


NAMES: dict[str, Names] = {
    "vllm": Names(
        running=("vllm:num_requests_running",),
        waiting=("vllm:num_requests_waiting",),
        kv_cache=("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
        tokens_counter=("vllm:generation_tokens_total",),
    ),
    "sglang": Names(
        running=("sglang:num_running_reqs",),
        waiting=("sglang:num_queue_reqs",),
        kv_cache=("sglang:token_usage",),
        tokens_counter=("sglang:generation_tokens_total",),
        tokens_gauge=("sglang:gen_throughput",),
    ),
    "llama.cpp": Names(
        running=("llamacpp:requests_processing",),
        waiting=("llamacpp:requests_deferred",),
        kv_cache=("llamacpp:kv_cache_usage_ratio",),
        tokens_counter=("llamacpp:tokens_predicted_total",),
        tokens_gauge=("llamacpp:predicted_tokens_seconds",),
    ),
}

# name{labels} value [timestamp]; label values may hold any character, escaped.
_SAMPLE = re.compile(
    r'^(?P<name>[A-Za-z_:][A-Za-z0-9_:]*)'
    r'(?:\{(?P<labels>(?:[^"}]|"(?:[^"\\]|\\.)*")*)\})?'
    r'\s+(?P<value>\S+)(?:\s+-?\d+)?\s*$'
)


@dataclass(frozen=True)
class Figures:
    """What one scrape said, before rates."""

    running: float | None = None
    waiting: float | None = None
    kv_cache: float | None = None
    tokens_total: float | None = None
    tokens_gauge: float | None = None


class NotMetrics(ValueError):
    """The text is not Prometheus exposition an engine serves."""


def path(engine: str) -> str | None:
    """What to GET on the engine's HTTP port; None for an engine llmgw cannot read."""
    return PATH if engine in NAMES else None


def samples(text: str) -> dict[str, list[float]]:
    """Every sample's value by metric name (labels dropped; comments skipped).

    Raises :class:`NotMetrics` when a line is neither a comment nor a sample (an
    HTML error page, a JSON body), saying which line.
    """
    found: dict[str, list[float]] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        match = _SAMPLE.match(stripped)
        if match is None:
            raise NotMetrics(f"line {number} is not a Prometheus sample")
        try:
            value = float(match.group("value"))
        except ValueError:
            # The engine's bytes are not echoed: the reason travels in public snapshots.
            raise NotMetrics(f"line {number}: the value is not a number") from None
        found.setdefault(match.group("name"), []).append(value)
    return found


def read(engine: str, text: str) -> Figures:
    """The figures ``engine``'s exposition ``text`` holds (see the module's table).

    Raises :class:`NotMetrics` for text that is not an exposition, and KeyError for
    an engine not in :data:`NAMES`.
    """
    names = NAMES[engine]
    found = samples(text)

    def first(candidates: tuple[str, ...]) -> list[float] | None:
        for name in candidates:
            values = [v for v in found.get(name, ()) if math.isfinite(v)]
            if values:
                return values
        return None

    def total(candidates: tuple[str, ...]) -> float | None:
        values = first(candidates)
        return sum(values) if values is not None else None

    kv = first(names.kv_cache)
    return Figures(
        running=total(names.running),
        waiting=total(names.waiting),
        kv_cache=min(max(max(kv), 0.0), 1.0) if kv is not None else None,
        tokens_total=total(names.tokens_counter),
        tokens_gauge=total(names.tokens_gauge),
    )


def rate(before: tuple[float, float] | None, now: tuple[float, float]) -> float | None:
    """A counter's per-second rate from (value, unix time) before and now; None
    without an earlier scrape, when time did not advance, or when the counter went
    back (the engine restarted: the next pair of scrapes has a rate again)."""
    if before is None:
        return None
    (value_before, at_before), (value_now, at_now) = before, now
    if at_now <= at_before or value_now < value_before:
        return None
    return (value_now - value_before) / (at_now - at_before)


def load(figures: Figures, scraped_at: float,
         before: tuple[float, float] | None = None) -> EngineLoad:
    """The load to report: counts as integers, tokens/s from the counter's rate
    since ``before`` (value, time) where there is one, else the engine's gauge."""
    per_second = None
    if figures.tokens_total is not None:
        per_second = rate(before, (figures.tokens_total, scraped_at))
    if per_second is None:
        per_second = figures.tokens_gauge
    return EngineLoad(
        requests_running=round(figures.running) if figures.running is not None else None,
        requests_waiting=round(figures.waiting) if figures.waiting is not None else None,
        kv_cache_usage=figures.kv_cache,
        generation_tokens_per_second=per_second,
        generation_tokens_total=figures.tokens_total,
        scraped_at=scraped_at,
    )
