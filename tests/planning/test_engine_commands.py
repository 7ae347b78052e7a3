"""Exact argv for the single-node options of an engine command.

test_engines.py covers the multi-node shapes; these rows pin each option
llmgw renders from a profile field (pipeline size, dtype, quantization, KV
cache dtype, download dir) to its exact spelling and place, and each absent
field to no option at all.
"""

from __future__ import annotations

from typing import Any

import pytest

from llmgw.engines import launches
from llmgw.engines.launches import Launch
from llmgw.spec.models import Profile

SGLANG = ["/usr/bin/env", "python3", "-m", "sglang.launch_server"]


def launch(profile: dict[str, Any], **overrides: Any) -> Launch:
    values: dict[str, Any] = {
        "model": "m", "served_name": "served", "source": "org/model",
        "profile": Profile.model_validate(profile), "rank": 0, "bind_host": "0.0.0.0",
        "port": 18000, "gpu_uuids": ("GPU-aaaa",), "gpu_indices": (0,),
    }
    values.update(overrides)
    return Launch(**values)


@pytest.mark.parametrize(("profile", "overrides", "argv"), [
    ({"tensor_parallel": 1}, {},
     [*SGLANG, "--model-path", "org/model", "--served-model-name", "served", "--tp-size", "1",
      "--host", "0.0.0.0", "--port", "18000", "--enable-metrics"]),
    ({"tensor_parallel": 2, "pipeline_parallel": 2}, {},
     [*SGLANG, "--model-path", "org/model", "--served-model-name", "served", "--tp-size", "2",
      "--pp-size", "2", "--host", "0.0.0.0", "--port", "18000", "--enable-metrics"]),
    ({"dtype": "bfloat16", "quantization": "fp8", "kv_cache_dtype": "fp8_e4m3"}, {},
     [*SGLANG, "--model-path", "org/model", "--served-model-name", "served", "--tp-size", "1",
      "--dtype", "bfloat16", "--quantization", "fp8", "--kv-cache-dtype", "fp8_e4m3",
      "--host", "0.0.0.0", "--port", "18000", "--enable-metrics"]),
    ({"quantization": "awq"}, {"download_dir": "/models"},
     [*SGLANG, "--model-path", "org/model", "--served-model-name", "served", "--tp-size", "1",
      "--quantization", "awq", "--download-dir", "/models", "--host", "0.0.0.0",
      "--port", "18000", "--enable-metrics"]),
    ({"kv_cache_dtype": "fp8_e5m2"}, {"source": "/models/local", "download_dir": "/models"},
     [*SGLANG, "--model-path", "/models/local", "--served-model-name", "served",
      "--tp-size", "1", "--kv-cache-dtype", "fp8_e5m2", "--host", "0.0.0.0",
      "--port", "18000", "--enable-metrics"]),
])
def test_sglang_renders_each_profile_field(
        profile: dict[str, Any], overrides: dict[str, Any], argv: list[str]) -> None:
    built = launches.command(launch({"engine": "sglang", "gpu_class": "h100-80g", **profile},
                                    **overrides))
    assert list(built.argv) == argv


def _profile(**fields: Any) -> Profile:
    return Profile.model_validate({"gpu_class": "h100-80g", **fields})


RESERVED_ENV = "is set by llmgw from the placement (GPUs, fabric); remove it"
NOT_LLAMA = ("does not apply to llama.cpp (a GGUF file carries its own quantization); "
             "pass llama-server flags under args")


@pytest.mark.parametrize(("profile", "found"), [
    # Names pydantic already refuses are checked again here: a saved plan's profile
    # reaches this module without the spec loader.
    (_profile(engine="vllm", engine_version="0.33.0").model_copy(update={
        "env": {"CUDA_VISIBLE_DEVICES": "0", "MULTI": "a\nb", "1BAD": "x"},
        "secret_env": {"bad-name": "s"}}),
     [(("env", "CUDA_VISIBLE_DEVICES"), f"env.CUDA_VISIBLE_DEVICES {RESERVED_ENV}"),
      (("env", "1BAD"), "env.1BAD is not a valid environment variable name"),
      (("env", "bad-name"), "env.bad-name is not a valid environment variable name"),
      (("env", "MULTI"),
       "env.MULTI spans lines; a unit's environment holds one line per variable")]),
    (_profile(engine="sglang", engine_version="0.5.23", args={"--port": 1},
              unchecked_args={"host": "x", "mem-fraction-static": 0.8}),
     [(("args", "--port"), "args.--port is set by llmgw (it allocates ports); remove it"),
      (("unchecked_args", "host"),
       "unchecked_args.host is set by llmgw (it binds each engine itself); remove it")]),
    (_profile(engine="vllm", engine_version="0.33.0", args={"seed": 1},
              unchecked_args={"seed": 2}),
     [(("unchecked_args", "seed"), "unchecked_args.seed is also under args; keep one")]),
    (_profile(engine="llama.cpp", gpu_class="l4-22g", nodes=2, tensor_parallel=2,
              dtype="bfloat16", quantization="awq", kv_cache_dtype="fp8"),
     [(("nodes",), "llama.cpp runs on one node; set nodes: 1"),
      (("dtype",), f"dtype {NOT_LLAMA}"),
      (("quantization",), f"quantization {NOT_LLAMA}"),
      (("kv_cache_dtype",), f"kv_cache_dtype {NOT_LLAMA}")]),
    (_profile(engine="vllm", engine_version="0.33.0", args={"max-model-len": False},
              unchecked_args={"new.flag": False}),
     [(("args", "max-model-len"),
       "args.max-model-len: false would need --no-max-model-len, but vLLM 0.33.0 defines no "
       "--no-max-model-len; remove the key to keep the engine's default"),
      (("unchecked_args", "new.flag"),
       "unchecked_args.new.flag: false would need --no-new.flag, but unchecked flags are "
       "written as they are; remove the key to keep the engine's default")]),
    (_profile(engine="sglang", engine_version="0.5.23", nodes=2, tensor_parallel=2,
              args={"no-such-flag": 1, "--port": 2}),
     [(("args", "--port"), "args.--port is set by llmgw (it allocates ports); remove it"),
      (("args", "no-such-flag"), "args.no-such-flag: SGLang 0.5.23 has no option "
       "--no-such-flag; a flag newer than llmgw's table goes under unchecked_args")]),
    # A reserved flag SGLang does not define: flagged once, never also as unknown.
    (_profile(engine="sglang", engine_version="0.5.23", args={"--tp": 2}),
     [(("args", "--tp"), "args.--tp is set by llmgw (from tensor_parallel); remove it")]),
    # A dotted key keeps its dots: the field is args, the key all the rest.
    (_profile(engine="vllm", engine_version="0.33.0", args={"compilation-config.mode": False}),
     [(("args", "compilation-config.mode"),
       "args.compilation-config.mode: false would need --no-compilation-config.mode, but "
       "vLLM 0.33.0 defines no --no-compilation-config.mode; remove the key to keep the "
       "engine's default")]),
    (_profile(engine="vllm", engine_version="0.0.1", env={"RAY_ADDRESS": "x"}),
     [(("env", "RAY_ADDRESS"), f"env.RAY_ADDRESS {RESERVED_ENV}"),
      (("engine_version",), "vLLM 0.0.1 is older than every flag table llmgw has (0.11.2, "
       "0.12.0, 0.13.0, 0.23.0, 0.24.0, 0.31.0, 0.32.0, 0.33.0); use a newer engine, or "
       "generate its table with `make engine-flags`")]),
])
def test_findings_name_the_field_and_say_why(
        profile: Profile, found: list[tuple[tuple[str, ...], str]]) -> None:
    """Each finding once (across ranks too), at the profile field it is about."""
    assert [(f.where, f.message) for f in launches.findings(profile)] == found
    assert launches.problems(profile) == [message for _, message in found]


def test_unknown_version_builds_no_command() -> None:
    built, found = launches.build(launch({"engine": "vllm", "gpu_class": "h100-80g",
                                          "engine_version": "0.0.1"}))
    assert built == launches.Command(())
    assert [f.where for f in found] == [("engine_version",)]


def test_command_refusal_lists_every_finding() -> None:
    bad = launch({"engine": "llama.cpp", "gpu_class": "l4-22g", "dtype": "bfloat16",
                  "quantization": "awq"})
    with pytest.raises(launches.EngineError) as refused:
        launches.command(bad)
    assert str(refused.value) == f"dtype {NOT_LLAMA}; quantization {NOT_LLAMA}"


def test_cpu_profile_gets_no_gpu_even_when_given_some() -> None:
    built = launches.command(launch({"engine": "llama.cpp", "cpu": True, "min_memory_gb": 8},
                                    source="/models/g.gguf"))
    assert dict(built.env)["CUDA_VISIBLE_DEVICES"] == ""


def test_a_cpu_vllm_profile_leaves_thread_placement_to_the_kernel() -> None:
    """vLLM's auto binding pins every CPU replica on a node to the same first cores (a
    replace runs two at once); a profile's env, written to the unit's env file, which
    systemd and the supervise backend read after Environment=, overrides it."""
    cpu = {"engine": "vllm", "cpu": True, "min_memory_gb": 2,
           "args": {"kv-cache-memory-bytes": 1 << 26}}
    built = launches.command(launch(cpu, gpu_uuids=(), gpu_indices=()))
    assert dict(built.env)["VLLM_CPU_OMP_THREADS_BIND"] == "nobind"
    gpu = launches.command(launch({"engine": "vllm", "gpu_class": "h100-80g"}))
    assert "VLLM_CPU_OMP_THREADS_BIND" not in dict(gpu.env)
    pinned = launches.findings(Profile.model_validate(
        {**cpu, "env": {"VLLM_CPU_OMP_THREADS_BIND": "0-15"}}))
    assert pinned == []  # the operator's own core list is allowed


def test_vllm_renders_quantization() -> None:
    built = launches.command(launch({"engine": "vllm", "gpu_class": "h100-80g",
                                     "quantization": "awq"}))
    assert list(built.argv) == [
        "/usr/bin/env", "vllm", "serve", "org/model", "--served-model-name", "served",
        "--tensor-parallel-size", "1", "--pipeline-parallel-size", "1", "--quantization", "awq",
        "--host", "0.0.0.0", "--port", "18000"]


@pytest.mark.parametrize(("head", "pinned"), [("10.0.1.11", True), ("gpu-1.lab", False)])
def test_a_ray_head_is_told_its_address_only_when_it_is_an_ip(head: str, pinned: bool) -> None:
    """Ray's --node-ip-address takes an IP; a host name is left for Ray to resolve."""
    built = launches.command(launch(
        {"engine": "vllm", "gpu_class": "h100-80g", "nodes": 2, "tensor_parallel": 2,
         "multi_node": "ray"}, head_address=head, dist_port=18001, host_ip="10.0.1.11"))
    (start_head,) = built.prelude
    assert start_head[:5] == ("/usr/bin/env", "ray", "start", "--head", "--port")
    assert (start_head[-2:] == ("--node-ip-address", head)) is pinned
    assert ("--node-ip-address" in start_head) is pinned
