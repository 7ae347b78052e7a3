"""A model's cap per replica: stated, or the engine's own slots from its args."""

from __future__ import annotations

from typing import Any

import pytest

from llmgw.router import catalogs
from llmgw.spec.models import Cluster


def entry(profiles: list[dict[str, Any]], **routing: Any) -> catalogs.ModelEntry:
    cluster = Cluster.model_validate({
        "cluster": {"name": "lab"},
        "models": {"m": {"source": "org/m", "profiles": profiles, "routing": routing}},
    })
    return catalogs.from_cluster(cluster).models["m"]


@pytest.mark.parametrize("profiles, routing, cap", [
    pytest.param([{"engine": "llama.cpp", "cpu": True, "args": {"parallel": 4}}], {}, 4,
                 id="llama.cpp parallel"),
    pytest.param([{"engine": "llama.cpp", "cpu": True, "args": {"np": "2"}}], {}, 2,
                 id="llama.cpp np"),
    pytest.param([{"engine": "vllm", "gpu_class": "h100-80g", "args": {"max-num-seqs": 64}}],
                 {}, 64, id="vLLM max-num-seqs"),
    pytest.param([{"engine": "sglang", "gpu_class": "h100-80g",
                   "args": {"max-running-requests": 32}}], {}, 32, id="SGLang"),
    pytest.param([{"engine": "vllm", "gpu_class": "h100-80g", "args": {"max-num-seqs": 64}},
                  {"engine": "vllm", "gpu_class": "l40s-45g", "args": {"max-num-seqs": 16}}],
                 {}, 16, id="the smallest of the profiles"),
    pytest.param([{"engine": "llama.cpp", "cpu": True}], {}, None, id="not stated: no cap"),
    pytest.param([{"engine": "llama.cpp", "cpu": True, "args": {"parallel": 4}}],
                 {"max_in_flight": 9}, 9, id="routing.max_in_flight wins"),
])
def test_the_cap_per_replica(profiles: list[dict[str, Any]], routing: dict[str, Any],
                             cap: int | None) -> None:
    assert entry(profiles, **routing).max_in_flight == cap


def test_queue_settings_reach_the_router() -> None:
    found = entry([{"engine": "llama.cpp", "cpu": True}], queue_limit=5, queue_timeout="2m")
    assert (found.queue_limit, found.queue_timeout) == (5, 120.0)
