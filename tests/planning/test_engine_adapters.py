"""A model's LoRA adapters in each engine's argv: the flags, their values, their checks."""

from __future__ import annotations

from typing import Any

import pytest

from llmgw.engines import launches
from llmgw.engines.launches import Launch
from llmgw.spec.loras import LoraAdapter
from llmgw.spec.models import Profile

SQL = LoraAdapter(name="sql", source="/models/loras/sql", rank=8)
PIRATE = LoraAdapter(name="pirate", source="/models/loras/pirate.gguf", scale=2.5, rank=32)


def launch(profile: dict[str, Any], adapters: tuple[LoraAdapter, ...], **overrides: Any) -> Launch:
    values: dict[str, Any] = {
        "model": "m", "served_name": "served", "source": "/models/base",
        "profile": Profile.model_validate(profile), "rank": 0, "bind_host": "0.0.0.0",
        "port": 18000, "gpu_uuids": ("GPU-aaaa",), "gpu_indices": (0,), "adapters": adapters,
    }
    values.update(overrides)
    return Launch(**values)


def tail(argv: tuple[str, ...], flag: str, count: int) -> list[str]:
    at = argv.index(flag)
    return list(argv[at:at + 1 + count])


@pytest.mark.parametrize(("engine", "paths_flag"), [
    pytest.param("vllm", "--lora-modules", id="vllm"),
    pytest.param("sglang", "--lora-paths", id="sglang"),
])
def test_vllm_and_sglang_load_every_adapter_by_name_with_the_largest_rank(
        engine: str, paths_flag: str) -> None:
    argv = launches.command(launch({"engine": engine, "gpu_class": "h100-80g"},
                                   (SQL, PIRATE.model_copy(update={"scale": 1.0})))).argv
    assert "--enable-lora" in argv
    assert tail(argv, paths_flag, 2) == [paths_flag, "sql=/models/loras/sql",
                                         "pirate=/models/loras/pirate.gguf"]
    assert tail(argv, "--max-lora-rank", 1) == ["--max-lora-rank", "32"]


def test_vllm_across_nodes_gives_every_rank_the_adapters() -> None:
    profile = {"engine": "vllm", "gpu_class": "h100-80g", "nodes": 2, "tensor_parallel": 2,
               "multi_node": "native"}
    for rank in (0, 1):
        argv = launches.command(launch(profile, (SQL,), rank=rank, head_address="10.0.0.1",
                                       dist_port=18001, port=18000 if rank == 0 else None)).argv
        assert tail(argv, "--lora-modules", 1) == ["--lora-modules", "sql=/models/loras/sql"]


def test_llama_cpp_loads_every_adapter_at_its_scale_in_one_flag() -> None:
    argv = launches.command(launch({"engine": "llama.cpp", "cpu": True},
                                   (SQL, PIRATE))).argv
    assert tail(argv, "--lora-scaled", 1) == [
        "--lora-scaled", "/models/loras/sql:1,/models/loras/pirate.gguf:2.5"]
    assert "--lora-init-without-apply" not in argv  # it does not keep them off (see llama_cpp)


@pytest.mark.parametrize("engine", ["vllm", "sglang", "llama.cpp"])
def test_no_adapters_no_adapter_flags(engine: str) -> None:
    profile = {"engine": engine, **({"cpu": True} if engine == "llama.cpp"
                                    else {"gpu_class": "h100-80g"})}
    argv = launches.command(launch(profile, ())).argv
    assert not [token for token in argv if "lora" in token]


@pytest.mark.parametrize(("engine", "key"), [
    pytest.param("vllm", "lora-modules", id="vllm"),
    pytest.param("sglang", "lora-paths", id="sglang"),
    pytest.param("llama.cpp", "lora", id="llama.cpp"),
])
def test_an_adapter_flag_under_args_is_a_finding_when_the_model_has_adapters(
        engine: str, key: str) -> None:
    profile = {"engine": engine, "args": {key: "/models/x"},
               **({"cpu": True} if engine == "llama.cpp" else {"gpu_class": "h100-80g"})}
    _, found = launches.build(launch(profile, (SQL,)))
    assert [(f.where, f.message) for f in found] == [
        (("args", key), f"args.{key} is set by llmgw from the model's adapters; remove it, "
         "or declare the adapter under adapters:")]
    _, alone = launches.build(launch(profile, ()))
    assert alone == []


def test_a_rank_the_engine_version_refuses_is_a_finding() -> None:
    odd = SQL.model_copy(update={"rank": 12})
    found = launches.findings(Profile.model_validate(
        {"engine": "vllm", "gpu_class": "h100-80g", "engine_version": "0.33.0"}),
        "/models/base", (odd,))
    assert [f.message for f in found] == [
        "llmgw renders --max-lora-rank, but --max-lora-rank '12' is not one of vLLM 0.33.0's "
        "choices: 1, 128, 16, 256, 32, 320, 512, 64, 8"]
