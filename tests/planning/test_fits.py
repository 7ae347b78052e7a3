"""The fit check (llmgw.planning.fits): the formula by hand, what it reads from a profile,
unknown never refusing, and validate and plan refusing with the numbers."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from test_plan_cases import CASES, load_case, run_case

from llmgw.cli import clusters
from llmgw.cli.errors import UserError
from llmgw.planning import fits
from llmgw.spec import gpus
from llmgw.spec.models import Model

GIB = 1024**3
# Llama 3.1 8B's config.json: 32 layers, 8 key/value heads of 128, bfloat16.
LLAMA_8B = {"params_b": 8.03, "dtype": "bfloat16", "layers": 32, "kv_heads": 8,
            "head_dim": 128, "context_length": 131072}


def model(profile: dict[str, Any], shape: dict[str, Any] | None = None) -> Model:
    return Model.model_validate({"source": "org/name", "shape": shape,
                                 "profiles": [{"engine": "vllm", **profile}]})


def test_the_formula_by_hand() -> None:
    m = model({"gpu_class": "l40s-45g", "args": {"max-model-len": 8192}}, LLAMA_8B)
    figures = fits.estimate(fits.inputs(m, m.profiles[0]), gpus.BUILTIN["l40s-45g"])
    weights = 8_030_000_000 * 2
    assert figures.weights == weights
    assert figures.kv == 2 * 32 * 8 * 128 * 2 * 8192 == GIB  # 1 GiB: 128 KiB a token
    assert figures.overhead == GIB + int(0.10 * weights)
    assert figures.need == weights + GIB + GIB + int(0.10 * weights)
    assert figures.have == int(45 * GIB * 0.90)
    assert figures.fits is True


def test_tensor_parallel_splits_heads_and_pipeline_splits_layers() -> None:
    m = model({"gpu_class": "h100-80g", "args": {"max-model-len": 8192}}, LLAMA_8B)
    found = fits.inputs(m, m.profiles[0])
    h100 = gpus.BUILTIN["h100-80g"]
    one = fits.estimate(found, h100).kv
    assert one is not None
    assert fits.estimate(found, h100, tp=2).kv == one // 2
    assert fits.estimate(found, h100, tp=16).kv == one // 8  # 8 heads: one each, replicated
    assert fits.estimate(found, h100, pp=4).kv == one // 4
    assert fits.estimate(found, h100, tp=4).weights == 8_030_000_000 * 2 // 4


@pytest.mark.parametrize(("profile", "weights", "kv"), [
    pytest.param({}, 8.03e9 * 2, 2 * 32 * 8 * 128 * 2 * 131072,
                 id="auto: stored dtype, full context"),
    pytest.param({"quantization": "fp8"}, 8.03e9, None, id="fp8 weights: 1 byte"),
    pytest.param({"quantization": "awq"}, 8.03e9 * 0.5625, None, id="4-bit: 4.5 bits"),
    pytest.param({"dtype": "float32"}, 8.03e9 * 4, None, id="dtype float32: 4 bytes"),
    pytest.param({"kv_cache_dtype": "fp8_e4m3"}, None, 2 * 32 * 8 * 128 * 1 * 131072,
                 id="fp8 KV cache: 1 byte"),
    pytest.param({"args": {"max-model-len": 4096}}, None, 2 * 32 * 8 * 128 * 2 * 4096,
                 id="the profile's context"),
    pytest.param({"fit_sequences": 4, "args": {"max-model-len": 4096}}, None,
                 4 * 2 * 32 * 8 * 128 * 2 * 4096, id="sequences"),
])
def test_what_a_profile_says_is_read(profile: dict[str, Any], weights: float | None,
                                     kv: int | None) -> None:
    m = model({"gpu_class": "h100-80g", **profile}, LLAMA_8B)
    figures = fits.estimate(fits.inputs(m, m.profiles[0]), gpus.BUILTIN["h100-80g"])
    if weights is not None:
        assert figures.weights == round(weights)
    if kv is not None:
        assert figures.kv == kv


def test_the_profiles_memory_share_is_what_it_has() -> None:
    m = model({"gpu_class": "l4-22g", "args": {"gpu-memory-utilization": 0.5}}, LLAMA_8B)
    assert fits.estimate(fits.inputs(m, m.profiles[0]),
                         gpus.BUILTIN["l4-22g"]).have == int(22 * GIB * 0.5)


@pytest.mark.parametrize(("shape", "files"), [
    pytest.param(None, None, id="nothing known"),
    pytest.param({"layers": 126, "kv_heads": 8}, None, id="no size"),
    pytest.param({"params_b": 70.6}, None, id="weights fit, KV unknown"),
])
def test_unknown_never_refuses(shape: dict[str, Any] | None, files: int | None) -> None:
    m = model({"gpu_class": "h100-80g", "tensor_parallel": 8}, shape)
    assert fits.refusal(m, m.profiles[0], gpus.BUILTIN, files) is None
    assert fits.estimate(fits.inputs(m, m.profiles[0], files), gpus.BUILTIN["h100-80g"],
                         tp=8).fits is None


def test_a_lower_bound_over_the_gpu_refuses() -> None:
    m = model({"gpu_class": "l40s-45g"})
    why = fits.refusal(m, m.profiles[0], gpus.BUILTIN, files=150 * 10**9)
    assert why is not None and "needs at least 154.7 GiB per GPU" in why
    assert "KV cache unknown" in why and "has 40.5 GiB (90% of 45 GiB)" in why


def test_a_class_not_known_is_not_refused() -> None:
    m = model({"gpu_class": "mystery-8g"}, {"params_b": 70})
    assert fits.refusal(m, m.profiles[0], gpus.BUILTIN) is None


def test_fewest_gpus_per_context() -> None:
    m = model({"gpu_class": "l4-22g"}, LLAMA_8B)
    found = fits.inputs(m, m.profiles[0])
    assert fits.fit_line(found, gpus.BUILTIN["l4-22g"], (8192, 32768, 131072)) == (
        "fits on 1× l4-22g at 8k context; needs 2× for 32k and 128k")
    assert fits.fit_line(found, gpus.BUILTIN["h100-80g"], (8192, 32768, 131072)) == (
        "fits on 1× h100-80g at 8k, 32k and 128k context")
    big = model({"gpu_class": "l4-22g"}, {**LLAMA_8B, "params_b": 405.9})
    assert fits.fit_line(fits.inputs(big, big.profiles[0]), gpus.BUILTIN["l4-22g"],
                         (8192,)) == "does not fit 8× l4-22g at 8k context"
    unknown = model({"gpu_class": "l4-22g"}, {"params_b": 8.03})
    assert fits.fit_line(fits.inputs(unknown, unknown.profiles[0]), gpus.BUILTIN["l4-22g"],
                         (8192,)).startswith("unknown on l4-22g: needs at least")


def test_validate_refuses_405b_bf16_on_8x80gb_at_the_profile(tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str],
                                                             ) -> None:
    (tmp_path / "cluster.yaml").write_text(
        "cluster: {name: lab}\n"
        "nodes:\n"
        "  gpu-01: {address: 10.0.0.1, gpus: [{class: h100-80g, count: 8}]}\n"
        "models:\n"
        "  llama-405b:\n"
        "    source: meta-llama/Llama-3.1-405B-Instruct\n"
        "    shape: {params_b: 405.9, dtype: bfloat16, layers: 126, kv_heads: 8, head_dim: 128}\n"
        "    profiles:\n"
        "      - {engine: vllm, gpu_class: h100-80g, tensor_parallel: 8,\n"
        "         args: {max-model-len: 8192}}\n"
        "      - {engine: vllm, gpu_class: h100-80g, tensor_parallel: 8, quantization: fp8,\n"
        "         args: {max-model-len: 8192}}\n")
    with pytest.raises(UserError, match="1 error"):
        clusters.load(tmp_path)
    err = capsys.readouterr().err
    assert "/cluster.yaml:9:9: models.llama-405b.profiles[0] does not fit at 8k context" in err
    assert "needs 105.4 GiB per GPU on 8× h100-80g" in err
    assert "has 72.0 GiB (90% of 80 GiB)" in err


def test_plan_takes_the_profile_that_fits() -> None:
    case = load_case(CASES / "131-fit-405b-fp8-fits-8x80gb.yaml")
    plan = run_case(case)[0]
    created = {c.model: c.shards[0].spec["profile"] for c in plan.changes}
    assert created == {"llama-405b": 1, "mystery": 0}


def test_validates_summary_says_by_how_much_it_fits(tmp_path: Path) -> None:
    from llmgw.cli import validate_cmd

    (tmp_path / "cluster.yaml").write_text(
        "cluster: {name: lab}\n"
        "models:\n"
        "  llama-405b:\n"
        "    shape: {params_b: 405.9, layers: 126, kv_heads: 8, head_dim: 128}\n"
        "    source: meta-llama/Llama-3.1-405B-Instruct\n"
        "    profiles:\n"
        "      - {engine: vllm, gpu_class: h100-80g, tensor_parallel: 8, quantization: fp8,\n"
        "         args: {max-model-len: 16384}}\n"
        "  unknown:\n"
        "    source: org/name\n"
        "    profiles: [{engine: vllm, gpu_class: h100-80g}]\n")
    text = validate_cmd.summary(clusters.load(tmp_path))
    assert ("1. vllm on 8× h100-80g (TP 8); fits: 54.0 of 72.0 GiB per GPU on h100-80g at 16k "
            "context") in text
    assert "1. vllm on 1× h100-80g\n" in text + "\n"  # no shape: the summary as it was
