"""Secret-shaped values: what ``llmgw validate`` refuses in a profile's args and env, and
what :func:`llmgw.spec.secrets.scrub` hides in free text (engine output, details).

Before these checks, validate looked at variable *names* only: a token under a neutral
name, or an ``--api-key`` arg, passed and printed in every plan.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from llmgw.cli.main import main
from llmgw.spec import secrets

HF = "hf_" + "Ab3dEfGh1jKlMnOpQrStUvWxYz0123456"
OPENAI = "sk-proj-" + "Ab3dEf0123456789ghIJklMNopQR"
GITHUB = "ghp_" + "Ab3dEfGh1jKlMnOpQrStUvWxYz0123456789"
GITHUB_PAT = "github_pat_" + "11ABCDEFG0123456789_abcdefghijklmnop"
AWS = "AKIA" + "IOSFODNN7EXAMPLE"
JWT = ("eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0."
       "SflKxwRJSMeKKF2QT4fwpMeJf36POk6yJV_adQssw5c")
RANDOM = "kPfjp0WaYJBOh66OWUDL4zBa1wn0DmLj"

PROFILE = """\
cluster: {{name: c}}
models:
  m:
    source: meta-llama/Llama-3.1-8B-Instruct
    profiles:
      - engine: {engine}
        cpu: true
        {section}:
          {key}: {value}
"""


def _validate(tmp_path: Path, capsys: pytest.CaptureFixture[str], section: str, key: str,
              value: str, engine: str = "llama.cpp") -> tuple[int, str]:
    (tmp_path / "c.yaml").write_text(PROFILE.format(engine=engine, section=section, key=key,
                                                    value=value))
    status = main(["validate", "--cluster", str(tmp_path)])
    captured = capsys.readouterr()
    return status, captured.out + captured.err


@pytest.mark.parametrize(("section", "key", "value", "shape"), [
    pytest.param("env", "NEUTRAL", HF, "a Hugging Face token", id="env-hf"),
    pytest.param("env", "NEUTRAL", OPENAI, "an OpenAI-style key", id="env-openai"),
    pytest.param("env", "NEUTRAL", GITHUB, "a GitHub token", id="env-github"),
    pytest.param("env", "NEUTRAL", GITHUB_PAT, "a GitHub token", id="env-github-pat"),
    pytest.param("env", "NEUTRAL", AWS, "an AWS access key id", id="env-aws"),
    pytest.param("env", "NEUTRAL", JWT, "a JSON Web Token", id="env-jwt"),
    pytest.param("env", "HEADER", "'Authorization: Bearer abcdefgh12345678'",
                 "an Authorization header", id="env-bearer"),
    pytest.param("env", "MIRROR", "https://me:pa55word@mirror.example/hub",
                 "a password in a URL", id="env-url-password"),
    pytest.param("env", "NEUTRAL", RANDOM, "a long random string", id="env-random"),
    pytest.param("env", "OPTS", "'--api-key s3cr3tvalue'", "a value under a secret's name",
                 id="env-api-key-in-value"),
    pytest.param("args", "hf-overrides", f"'{{\"token\": \"{HF}\"}}'", "a Hugging Face token",
                 id="args-json-hf"),
    pytest.param("unchecked_args", "new-flag", OPENAI, "an OpenAI-style key",
                 id="unchecked-args-openai"),
])
def test_validate_refuses_secret_shaped_values(
    tmp_path: Path, capsys: pytest.CaptureFixture[str],
    section: str, key: str, value: str, shape: str,
) -> None:
    status, out = _validate(tmp_path, capsys, section, key, value)
    assert status == 1
    [line] = [line for line in out.splitlines() if f".{section}.{key}:" in line]
    assert line.startswith(f"{tmp_path}/c.yaml:9:"), line  # the value's place
    assert f"looks like {shape}" in line and "secret_env" in line
    assert value.strip("'") not in out and "Traceback" not in out


@pytest.mark.parametrize(("engine", "flag", "value", "hint"), [
    pytest.param("llama.cpp", "api-key", "mykey12345", "LLAMA_API_KEY", id="llama-api-key"),
    pytest.param("vllm", "api-key", "1234567890", "VLLM_API_KEY", id="vllm-api-key-number"),
    pytest.param("llama.cpp", "hf-token", "short", "HF_TOKEN", id="hf-token"),
    pytest.param("sglang", "admin-api-key", "adminkey", "secret_env (a variable",
                 id="sglang-admin-api-key"),
])
def test_validate_refuses_a_literal_value_for_a_secret_flag(
    tmp_path: Path, capsys: pytest.CaptureFixture[str],
    engine: str, flag: str, value: str, hint: str,
) -> None:
    text = PROFILE.format(engine=engine, section="args", key=flag, value=value)
    if engine == "sglang":
        text = text.replace("cpu: true", "gpu_class: h100-80g")
    (tmp_path / "c.yaml").write_text(text)
    assert main(["validate", "--cluster", str(tmp_path)]) == 1
    captured = capsys.readouterr()
    out = captured.out + captured.err
    [line] = [line for line in out.splitlines() if f".args.{flag}:" in line]
    assert line.startswith(f"{tmp_path}/c.yaml:9:")
    assert f"`--{flag}` takes a secret" in line and hint in line
    assert value not in out


@pytest.mark.parametrize(("section", "key", "value"), [
    pytest.param("unchecked_args", "x-name", "nvidia/Llama-3_1-Nemotron-70B-Instruct-HF",
                 id="repo-id"),
    pytest.param("unchecked_args", "x-name", "Meta-Llama-3-70B-Instruct-abliterated-v2",
                 id="long-name"),
    pytest.param("unchecked_args", "x-name", "Qwen2ForCausalLMWithValueHead", id="class-name"),
    pytest.param("args", "lora", "/models/hub/models--Qwen--Qwen2-7B-Instruct-GGUF/"
                 "snapshots/0123456789abcdef0123", id="hub-path"),
    pytest.param("args", "ctx-size", "8192", id="number"),
    pytest.param("args", "api-key-file", "/etc/llmgw/secrets/api-key", id="api-key-file-path"),
    pytest.param("args", "chat-template", "chatml", id="short-value"),
    pytest.param("args", "override-kv", "tokenizer.ggml.add_bos_token=bool:false",
                 id="token-inside-a-key"),
    pytest.param("env", "DIGEST", "70b28a97b742877364e6222b57403ff844f07ef9", id="hex-digest"),
    pytest.param("env", "GPU", "GPU-8f3e6a2b-1c2d-3e4f-5a6b-7c8d9e0f1a2b", id="gpu-uuid"),
    pytest.param("env", "PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True", id="torch-conf"),
    pytest.param("env", "HTTPS_PROXY", "http://proxy.internal:3128", id="proxy-url"),
    pytest.param("env", "HF_HUB_ENABLE_HF_TRANSFER", "'1'", id="hf-prefixed-name"),
    pytest.param("env", "NOTE", "'max_num_batched_tokens=8192'", id="tokens-number"),
])
def test_validate_passes_ordinary_values(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], section: str, key: str, value: str,
) -> None:
    status, out = _validate(tmp_path, capsys, section, key, value)
    assert "secret_env" not in out and "takes a secret" not in out, out
    assert status == 0, out


@pytest.mark.parametrize(("text", "hidden", "kept"), [
    pytest.param(f"OSError: 401 Client Error: token {HF} is invalid", HF, "401 Client Error",
                 id="hf"),
    pytest.param(f"Authorization: Bearer {JWT}", JWT, "Authorization: Bearer [redacted]",
                 id="bearer-jwt"),
    pytest.param("curl -H 'Authorization: token abcdef0123456789'", "abcdef0123456789",
                 "Authorization: token [redacted]", id="authorization-token"),
    pytest.param(f"keys {OPENAI} and {AWS}", OPENAI, "keys [redacted] and [redacted]",
                 id="openai-aws"),
    pytest.param("https://user:s3cr3tpass@mirror.example/x", "s3cr3tpass",
                 "https://user:[redacted]@mirror.example/x", id="url-password"),
    pytest.param("aws_secret_access_key=wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
                 "wJalrXUtnFEMI", "aws_secret_access_key=[redacted]", id="aws-secret"),
    pytest.param("--api-key mysecretvalue --max-num-batched-tokens 8192", "mysecretvalue",
                 "--max-num-batched-tokens 8192", id="api-key-flag"),
    pytest.param(f"glued{HF}glued", HF[3:], "glued[redacted]", id="glued-to-text"),
    pytest.param(f"x {RANDOM} y", RANDOM, "x [redacted] y", id="random"),
])
def test_scrub_hides_secrets_and_keeps_the_rest(text: str, hidden: str, kept: str) -> None:
    scrubbed = secrets.scrub(text)
    assert hidden not in scrubbed and kept in scrubbed
    assert secrets.scrub(scrubbed) == scrubbed


@pytest.mark.parametrize("text", [
    "ValueError: max_num_batched_tokens (2048) is smaller than max_model_len (8192)",
    "llama_model_load: error loading model: failed to open /models/gemma-2-2b-it-Q4_K_M.gguf",
    "Loading nvidia/Llama-3_1-Nemotron-70B-Instruct-HF (AutoModelForCausalLM)",
    "digest 70b28a97b742877364e6222b57403ff844f07ef9 on GPU-8f3e6a2b-1c2d-3e4f-5a6b",
    "print_info: BOS token        = 2 '<bos>'",
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",
])
def test_scrub_leaves_ordinary_engine_output_alone(text: str) -> None:
    assert secrets.scrub(text) == text


def test_an_error_that_quotes_a_value_back_scrubs_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    """A failed plan's errors become the pull request comment (the plan workflow)."""
    (tmp_path / "c.yaml").write_text(PROFILE.format(engine="vllm", section="args", key="x",
                                                    value="1").replace("cpu: true",
                                                                       f"gpu_class: {HF}"))
    assert main(["validate", "--cluster", str(tmp_path)]) == 1
    captured = capsys.readouterr()
    out = captured.out + captured.err
    assert "invalid name '[redacted]'" in out, out
    assert HF not in out
