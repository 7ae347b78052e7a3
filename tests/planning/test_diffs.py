"""Why a shard's digest changed, in words (llmgw.planning.diffs), one row per rule.

Plans quote these lines as a change's ``why``; the planning cases show a few in
context, this table holds every kind of line with its exact text.
"""

from __future__ import annotations

from typing import Any

import pytest

from llmgw.planning import diffs

BASE: dict[str, Any] = {
    "v": 1, "model": "m", "replica": 0, "rank": 0, "profile": 0,
    "nodes": ["gpu-01"], "engine": "vllm", "source": "org/m",
    "argv": ["/usr/bin/env", "vllm", "serve", "org/m", "--max-model-len", "8192",
             "--port", "18000", "--enforce-eager"],
    "env": {"CUDA_VISIBLE_DEVICES": "GPU-a", "NCCL_IB_HCA": "=mlx5_0"},
    "user_env": {"HF_HOME": "/models"}, "secret_env": {"HF_TOKEN": "/etc/llmgw/hf"},
    "gpu_class": "l40s-45g", "gpus": ["GPU-a"], "port": 18000, "dist_port": None,
    "fabric": None, "memory": 0,
}


def _with(**changes: Any) -> dict[str, Any]:
    return {**BASE, **changes}


def _argv(*extra: str) -> list[str]:
    return ["/usr/bin/env", "vllm", "serve", "org/m", *extra]


@pytest.mark.parametrize(
    ("new", "kwargs", "expected"),
    [
        pytest.param(BASE, {}, [], id="same-spec-nothing"),
        pytest.param(_with(engine="sglang"), {}, ["engine changed: vllm → sglang"],
                     id="engine"),
        pytest.param(_with(engine_version="0.5.23"), {},
                     ["engine version changed: none → 0.5.23"], id="engine-version-pinned"),
        pytest.param(_with(source="org/n"), {}, ["source changed: org/m → org/n"], id="source"),
        pytest.param(_with(gpu_class=None), {}, ["GPU class changed: l40s-45g → none"],
                     id="gpu-class-to-cpu"),
        pytest.param(_with(nodes=["gpu-02"]), {}, ["nodes changed: gpu-01 → gpu-02"],
                     id="nodes"),
        pytest.param(_with(nodes=["gpu-01", "gpu-02"], gpus=["GPU-b"]), {},
                     ["nodes changed: gpu-01 → gpu-01,gpu-02"], id="nodes-win-over-gpus"),
        pytest.param(_with(gpus=["GPU-b", "GPU-c"]), {},
                     ["GPUs changed on gpu-01: GPU-a → GPU-b,GPU-c"], id="gpus-as-uuids"),
        pytest.param(_with(gpus=["GPU-b"]),
                     {"gpu_names": lambda node, uuids: f"{node}:{len(uuids)}"},
                     ["GPUs changed on gpu-01: gpu-01:1 → gpu-01:1"], id="gpus-named"),
        pytest.param(_with(nodes=["a", "b"], rank=1, gpus=["GPU-b"]) | {"nodes": ["a", "b"]},
                     {}, ["nodes changed: gpu-01 → a,b"], id="rank-one-nodes"),
        pytest.param(_with(port=18001), {}, ["port changed: 18000 → 18001"], id="port"),
        pytest.param(_with(dist_port=18002), {}, ["rendezvous port changed: none → 18002"],
                     id="dist-port"),
        pytest.param(_with(fabric="ib-a"), {}, ["fabric changed: none → ib-a"], id="fabric"),
        pytest.param(_with(gpus=["GPU-b"], port=18001, fabric="ib-a"), {"placement": False},
                     [], id="placement-lines-left-out"),
        pytest.param(_with(memory=8 * 1024**3), {}, ["memory changed: 0 GiB → 8 GiB"],
                     id="memory"),
        pytest.param(_with(memory=None), {}, ["memory changed: 0 GiB → none"],
                     id="memory-unset"),
        pytest.param(_with(argv=_argv("--max-model-len", "16384", "--port", "18000",
                                      "--enforce-eager")), {},
                     ["args changed: max-model-len 8192 → 16384"], id="arg-value"),
        pytest.param(_with(argv=_argv("--max-model-len", "8192", "--port", "18000")), {},
                     ["args removed: --enforce-eager"], id="bare-flag-removed"),
        pytest.param(_with(argv=_argv("--port", "18000", "--enforce-eager")), {},
                     ["args removed: --max-model-len 8192"], id="flag-with-value-removed"),
        pytest.param(_with(argv=[*BASE["argv"], "--dtype", "bfloat16"]), {},
                     ["args added: --dtype bfloat16"], id="flag-with-value-added"),
        pytest.param(_with(argv=[*BASE["argv"], "--trust-remote-code"]), {},
                     ["args added: --trust-remote-code"], id="bare-flag-added"),
        pytest.param(_with(argv=_argv("--max-model-len", "8192", "--port", "18001",
                                      "--enforce-eager", "--host", "0.0.0.0")),
                     {"placement": False}, [], id="placement-flags-not-args"),
        pytest.param(_with(argv=["/usr/bin/env", "vllm", "serve", "org/n", "--max-model-len",
                                 "8192", "--port", "18000", "--enforce-eager"], source="org/m"),
                     {}, ["command changed: /usr/bin/env vllm serve org/m → "
                          "/usr/bin/env vllm serve org/n"], id="positional-words"),
        pytest.param(_with(env={"CUDA_VISIBLE_DEVICES": "GPU-b", "NCCL_IB_HCA": "=mlx5_0",
                                "VLLM_LOGGING_LEVEL": "DEBUG"}), {"placement": False},
                     ["env added: VLLM_LOGGING_LEVEL=DEBUG"], id="env-added-gpus-skipped"),
        pytest.param(_with(env={"CUDA_VISIBLE_DEVICES": "GPU-a", "NCCL_IB_HCA": "=mlx5_1"}), {},
                     ["env changed: NCCL_IB_HCA =mlx5_0 → =mlx5_1"], id="fabric-env-shown"),
        pytest.param(_with(env={"CUDA_VISIBLE_DEVICES": "GPU-a", "NCCL_IB_HCA": "=mlx5_1"}),
                     {"placement": False}, [], id="fabric-env-left-with-placement"),
        pytest.param(_with(env={"CUDA_VISIBLE_DEVICES": "GPU-a"}), {},
                     ["env removed: NCCL_IB_HCA"], id="env-removed"),
        pytest.param(_with(user_env={"HF_HOME": "/data"}), {},
                     ["env changed: HF_HOME /models → /data"], id="user-env"),
        pytest.param(_with(secret_env={"HF_TOKEN": "/etc/llmgw/hf2"}), {},
                     ["secret_env changed: HF_TOKEN read from /etc/llmgw/hf2 "
                      "(was /etc/llmgw/hf)"], id="secret-path-changed"),
        pytest.param(_with(secret_env={"HF_TOKEN": "/etc/llmgw/hf", "API": "/etc/a"}), {},
                     ["secret_env added: API read from /etc/a"], id="secret-added"),
        pytest.param(_with(secret_env={}), {}, ["secret_env removed: HF_TOKEN"],
                     id="secret-removed"),
        pytest.param(_with(prelude=[["mkdir", "-p", "/x"]]), {},
                     ["the commands run before the engine changed"], id="prelude"),
        pytest.param(_with(prelude=[["mkdir"]], engine="sglang"), {},
                     ["engine changed: vllm → sglang"], id="prelude-only-when-nothing-else"),
        pytest.param(_with(v=2, served_name="x"), {}, ["spec changed: served_name, v"],
                     id="any-other-field"),
        pytest.param(_with(v=2), {"placement": False}, [], id="other-fields-only-with-placement"),
        pytest.param(_with(replica=3, rank=1, profile=2), {}, [], id="identity-is-not-a-change"),
    ],
)
def test_explain(new: dict[str, Any], kwargs: dict[str, Any], expected: list[str]) -> None:
    assert diffs.explain(BASE, new, **kwargs) == expected


def test_explain_lists_every_difference_in_order() -> None:
    new = _with(engine="sglang", source="org/n", gpu_class="h100-80g", nodes=["gpu-02"],
                port=18001, memory=1024**3,
                argv=["/usr/bin/env", "vllm", "serve", "org/m", "--port", "18001"],
                user_env={}, secret_env={})
    assert diffs.explain(BASE, new) == [
        "engine changed: vllm → sglang",
        "source changed: org/m → org/n",
        "GPU class changed: l40s-45g → h100-80g",
        "nodes changed: gpu-01 → gpu-02",
        "port changed: 18000 → 18001",
        "memory changed: 0 GiB → 1 GiB",
        "args removed: --enforce-eager",
        "args removed: --max-model-len 8192",
        "env removed: HF_HOME",
        "secret_env removed: HF_TOKEN",
    ]


@pytest.mark.parametrize(
    ("argv", "positional", "options"),
    [
        pytest.param(["serve", "m"], ["serve", "m"], {}, id="words"),
        pytest.param(["--a", "1", "--b"], [], {"a": "1", "b": None}, id="value-and-bare"),
        pytest.param(["--a=1", "x"], ["x"], {"a": "1"}, id="equals-form"),
        pytest.param(["--a", "--b", "2"], [], {"a": None, "b": "2"}, id="bare-before-flag"),
        pytest.param(["--temp", "-0.5", "-1"], ["-1"], {"temp": "-0.5"},
                     id="negative-numbers-are-values"),
        pytest.param(["-ngl", "99"], [], {"ngl": "99"}, id="single-dash"),
        pytest.param(["--x", "1e3"], [], {"x": "1e3"}, id="exponent-number"),
        pytest.param(["--last"], [], {"last": None}, id="bare-at-end"),
        pytest.param(["--lora-modules", "a=/x", "b=/y", "--port", "1"], [],
                     {"lora-modules": "a=/x b=/y", "port": "1"}, id="several-values"),
    ],
)
def test_parse_argv(argv: list[str], positional: list[str], options: dict[str, Any]) -> None:
    assert diffs.parse_argv(argv) == (positional, options)


def test_an_adapter_added_is_an_args_change() -> None:
    argv = ["/usr/bin/env", "vllm", "serve", "org/m", "--enable-lora", "--lora-modules",
            "sql=/m/sql"]
    old, new = _with(argv=argv), _with(argv=[*argv, "pirate=/m/pirate"])
    assert diffs.explain(old, new) == [
        "args changed: lora-modules sql=/m/sql → sql=/m/sql pirate=/m/pirate"]


def test_engine_upgrade_names_both_versions() -> None:
    old = _with(engine_version="0.5.22")
    assert diffs.explain(old, _with(engine_version="0.5.23")) == [
        "engine version changed: 0.5.22 → 0.5.23"]
    assert diffs.explain(old, BASE) == ["engine version changed: 0.5.22 → none"]
