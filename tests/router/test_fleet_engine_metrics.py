"""The fleet collector's engine, GPU and fabric families: samples only where a node or
engine said, absent never exported as zero (names agreed in docs/operations.md)."""

from __future__ import annotations

import json

import pytest

from llmgw.fleet.types import (
    Adapter,
    EngineLoad,
    FabricStatus,
    Fleet,
    Gpu,
    NodeReport,
    Port,
    Unit,
)
from llmgw.metrics import collectors
from llmgw.planning import shards

Samples = dict[str, dict[tuple[tuple[str, str], ...], float]]


def gpu(index: int, **fields: object) -> Gpu:
    return Gpu.model_validate({"index": index, "uuid": f"GPU-{index}", "name": "NVIDIA H100",
                               "gpu_class": "h100-80g", **fields})


def unit(model: str, replica: int, engine: str, load: EngineLoad | None,
         rank: int = 0) -> Unit:
    return Unit(name=f"llmgw-{model}-r{replica}-s{rank}.service", model=model, replica=replica,
                rank=rank, digest="d", state="ready", port=18000 + replica, load=load,
                labels={"X-Llmgw-Spec": json.dumps({"engine": engine})})


def port(rate: float | None, state: str = "ACTIVE") -> Port:
    return Port(number=1, state=state, rate_gbps=rate, link_layer="InfiniBand")


FLEET = Fleet(nodes={
    "gpu-a-01": NodeReport(
        node="gpu-a-01",
        gpus=[gpu(0, memory_total_mib=81559, nvlink_peers=[1]),
              gpu(1, memory_total_mib=81559, nvlink_peers=[0]),
              gpu(2, nvlink_peers=[]),   # known: no NVLink at all → 0
              gpu(3)],                   # topology and memory unknown → no sample
        adapters=[Adapter(name="mlx5_0", ports=[port(400.0)]),
                  Adapter(name="mlx5_1", ports=[port(200.0)]),
                  Adapter(name="mlx5_2", ports=[port(100.0, "DOWN")]),
                  Adapter(name="mlx5_3", ports=[port(None)])],
        fabrics=[FabricStatus(name="ib0", kind="infiniband", adapters=["mlx5_0", "mlx5_1"],
                              advertised=True, declared_adapters=3),
                 # declared, but nothing ACTIVE with a rate: no rate sample
                 FabricStatus(name="ib1", kind="infiniband", adapters=["mlx5_3"],
                              advertised=True, declared_adapters=1)],
        units=[
            unit("llama", 0, "vllm", EngineLoad(requests_running=3, requests_waiting=0,
                                                kv_cache_usage=0.42,
                                                generation_tokens_per_second=181.5)),
            # SGLang before its first batch: nothing known, nothing exported
            unit("qwen", 0, "sglang", EngineLoad(error="")),
            # llama.cpp: running and waiting known, KV-cache and rate not
            unit("gemma", 1, "llama.cpp", EngineLoad(requests_running=2, requests_waiting=3)),
            unit("gemma", 2, "llama.cpp", None),  # not scraped: nothing
        ]),
    # Unreachable: its remembered units' loads and its GPUs are not exported.
    "gpu-a-02": NodeReport(node="gpu-a-02", reachable=False, gpus=[gpu(0, memory_total_mib=1)],
                           units=[unit("llama", 1, "vllm", EngineLoad(requests_running=9))]),
})


def collected(fleet: Fleet, rates: dict[str, float] | None = None) -> Samples:
    collector = collectors.FleetCollector()
    collector.observe(fleet, rates)
    found: Samples = {}
    for family in collector.collect():
        for sample in family.samples:
            found.setdefault(sample.name, {})[tuple(sorted(sample.labels.items()))] = sample.value
    return found


def engine(model: str, replica: int, name: str) -> tuple[tuple[str, str], ...]:
    return (("engine", name), ("model", model), ("node", "gpu-a-01"), ("replica", str(replica)))


@pytest.mark.parametrize(("family", "expected"), [
    ("llmgw_engine_requests_running", {engine("llama", 0, "vllm"): 3,
                                       engine("gemma", 1, "llama.cpp"): 2}),
    ("llmgw_engine_requests_waiting", {engine("llama", 0, "vllm"): 0,
                                       engine("gemma", 1, "llama.cpp"): 3}),
    ("llmgw_engine_kv_cache_usage_ratio", {engine("llama", 0, "vllm"): 0.42}),
    ("llmgw_engine_generation_tokens_per_second", {engine("llama", 0, "vllm"): 181.5}),
    ("llmgw_gpu_memory_total_bytes", {
        (("gpu", "0"), ("gpu_class", "h100-80g"), ("node", "gpu-a-01")): 81559 * 2**20,
        (("gpu", "1"), ("gpu_class", "h100-80g"), ("node", "gpu-a-01")): 81559 * 2**20}),
    ("llmgw_gpu_nvlink_peers", {(("gpu", "0"), ("node", "gpu-a-01")): 1,
                                (("gpu", "1"), ("node", "gpu-a-01")): 1,
                                (("gpu", "2"), ("node", "gpu-a-01")): 0}),
    # The slowest ACTIVE declared adapter: mlx5_1 at 200 (mlx5_2 is DOWN and not ACTIVE).
    ("llmgw_fabric_rate_gbps", {(("fabric", "ib0"), ("node", "gpu-a-01")): 200.0}),
])
def test_each_family_has_samples_only_where_known(
        family: str, expected: dict[tuple[tuple[str, str], ...], float]) -> None:
    assert collected(FLEET).get(family, {}) == expected


@pytest.mark.parametrize(("rates", "expected"), [
    ({}, {}),
    ({"ib0": 400.0, "roce9": 100.0}, {(("fabric", "ib0"), ("node", "gpu-a-01")): 400.0}),
])
def test_declared_rate_only_where_the_cluster_declares_one(
        rates: dict[str, float], expected: dict[tuple[tuple[str, str], ...], float]) -> None:
    assert collected(FLEET, rates).get("llmgw_fabric_declared_rate_gbps", {}) == expected


def test_no_fleet_yet_no_samples() -> None:
    assert collected(Fleet()) == {}


def holder(model: str, rank: int, state: str, gpus: list[str],
           digest: str | None = None) -> Unit:
    spec = {"engine": "vllm", "gpus": gpus}
    return Unit(name=f"llmgw-{model}-r0-s{rank}.service", model=model, replica=0, rank=rank,
                digest=digest or shards.digest(spec), state=state,  # type: ignore[arg-type]
                labels={shards.SPEC_LABEL: json.dumps(spec)})


def test_gpus_held_per_model_count_running_units_by_their_spec_label() -> None:
    # The idle alert asks which models hold GPUs (docs/alerts.yml, LlmgwModelIdle).
    fleet = Fleet(nodes={
        "gpu-a-01": NodeReport(node="gpu-a-01", units=[
            holder("big", 0, "ready", ["GPU-0", "GPU-1"]),
            holder("cpu", 0, "ready", []),  # a CPU model holds none: no sample
            holder("old", 0, "failed", ["GPU-2"]),  # ended: it holds nothing
            holder("forged", 0, "ready", ["GPU-3"], digest="0" * 16),  # label not its digest
        ]),
        "gpu-a-02": NodeReport(node="gpu-a-02", units=[
            holder("big", 1, "loading", ["GPU-0", "GPU-1"])]),
        "gpu-a-03": NodeReport(node="gpu-a-03", reachable=False, units=[
            holder("gone", 0, "ready", ["GPU-0"])]),  # unknown, not counted
    })
    assert collected(fleet).get("llmgw_model_gpus") == {(("model", "big"),): 4}
