"""Engine load from recorded ``/metrics`` answers (tests/fixtures/engines/SOURCES.md)."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmgw.discovery import enginemetrics
from llmgw.discovery.enginemetrics import Figures

RECORDED = Path(__file__).resolve().parents[1] / "fixtures" / "engines"


@pytest.mark.parametrize(("engine", "name", "figures"), [
    # vLLM 0.32.0 on CPU, the tiny Llama: idle, then 2 running and 3 queued (max-num-seqs 2).
    ("vllm", "vllm-idle.txt", Figures(running=0, waiting=0, kv_cache=0, tokens_total=0)),
    ("vllm", "vllm-busy.txt", Figures(running=2, waiting=3, kv_cache=0.007843137254901933,
                                      tokens_total=19)),
    ("vllm", "vllm-after.txt", Figures(running=0, waiting=0, kv_cache=0, tokens_total=1000)),
    # llama-server (--metrics --parallel 2): 2 slots busy and 3 deferred; no KV-cache
    # metric in this build, so none (not 0); the token counter moves when a slot finishes.
    ("llama.cpp", "llamacpp-idle.txt", Figures(running=0, waiting=0, tokens_total=0,
                                               tokens_gauge=0)),
    ("llama.cpp", "llamacpp-busy.txt", Figures(running=2, waiting=3, tokens_total=0,
                                               tokens_gauge=0)),
    ("llama.cpp", "llamacpp-after.txt", Figures(running=0, waiting=0, tokens_total=1500,
                                                tokens_gauge=5.63829)),
    # SGLang before its first batch: only max_total_num_tokens has a sample, so running,
    # waiting and KV-cache are unknown, not zero.
    ("sglang", "sglang-idle.txt", Figures()),
    ("sglang", "sglang-busy.txt", Figures(running=162, waiting=2826, kv_cache=0.77,
                                          tokens_total=7557572, tokens_gauge=86.50814177726902)),
    # Two data-parallel schedulers: counts and throughput summed, KV-cache the fullest.
    ("sglang", "sglang-dp2.txt", Figures(running=5, waiting=1, kv_cache=0.6, tokens_total=1000,
                                         tokens_gauge=70.5)),
])
def test_figures_from_recorded_expositions(engine: str, name: str, figures: Figures) -> None:
    assert enginemetrics.read(engine, (RECORDED / name).read_text()) == figures


@pytest.mark.parametrize(("text", "kv_cache"), [
    # Older vLLM names it gpu_cache_usage_perc; the newer name wins when both are there.
    ('vllm:gpu_cache_usage_perc{model_name="m"} 0.5\n', 0.5),
    ('vllm:gpu_cache_usage_perc{model_name="m"} 0.5\nvllm:kv_cache_usage_perc 0.25\n', 0.25),
    # A NaN is no figure; a value past 1 is clamped.
    ("vllm:kv_cache_usage_perc NaN\n", None),
    ("vllm:kv_cache_usage_perc 1.5\n", 1.0),
])
def test_kv_cache_names_and_odd_values(text: str, kv_cache: float | None) -> None:
    assert enginemetrics.read("vllm", text).kv_cache == kv_cache


def test_label_values_may_hold_braces_quotes_and_timestamps() -> None:
    text = ('vllm:num_requests_running{model_name="a}b\\"c",engine="0"} 4 1700000000000\n'
            'vllm:num_requests_running{model_name="x, y"} 1\n')
    assert enginemetrics.read("vllm", text).running == 5


@pytest.mark.parametrize(("text", "why"), [
    ("<html><body>502 Bad Gateway</body></html>\n", "line 1 is not a Prometheus sample"),
    ("# HELP x\nvllm:num_requests_running hf_secret\n", "line 2: the value is not a number"),
    ('{"detail": "Not Found"}\n', "line 1 is not a Prometheus sample"),
])
def test_anything_else_is_refused_with_its_line(text: str, why: str) -> None:
    with pytest.raises(enginemetrics.NotMetrics, match=why):
        enginemetrics.read("vllm", text)


@pytest.mark.parametrize(("figures", "before", "per_second"), [
    # The counter's rate between two scrapes, 10 s apart.
    (Figures(tokens_total=1500), (500.0, 90.0), 100.0),
    # No earlier scrape: the engine's own gauge, where it has one; else unknown.
    (Figures(tokens_total=1500, tokens_gauge=5.6), None, 5.6),
    (Figures(tokens_total=1500), None, None),
    # The counter went back (the engine restarted): no rate from that pair.
    (Figures(tokens_total=10, tokens_gauge=2.0), (500.0, 90.0), 2.0),
    # Nothing moved: a rate of zero is a figure, not an absence.
    (Figures(tokens_total=500), (500.0, 90.0), 0.0),
])
def test_tokens_per_second(figures: Figures, before: tuple[float, float] | None,
                           per_second: float | None) -> None:
    load = enginemetrics.load(figures, 100.0, before)
    assert load.generation_tokens_per_second == per_second
    assert load.scraped_at == 100.0


def test_load_keeps_absent_apart_from_zero() -> None:
    load = enginemetrics.load(Figures(running=0.0, waiting=None, kv_cache=0.0), 1.0)
    assert (load.requests_running, load.requests_waiting, load.kv_cache_usage) == (0, None, 0.0)


@pytest.mark.parametrize(("engine", "path"), [
    ("vllm", "/metrics"), ("sglang", "/metrics"), ("llama.cpp", "/metrics"), ("ray", None)])
def test_the_path(engine: str, path: str | None) -> None:
    assert enginemetrics.path(engine) == path
