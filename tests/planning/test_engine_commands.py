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
      "--host", "0.0.0.0", "--port", "18000"]),
    ({"tensor_parallel": 2, "pipeline_parallel": 2}, {},
     [*SGLANG, "--model-path", "org/model", "--served-model-name", "served", "--tp-size", "2",
      "--pp-size", "2", "--host", "0.0.0.0", "--port", "18000"]),
    ({"dtype": "bfloat16", "quantization": "fp8", "kv_cache_dtype": "fp8_e4m3"}, {},
     [*SGLANG, "--model-path", "org/model", "--served-model-name", "served", "--tp-size", "1",
      "--dtype", "bfloat16", "--quantization", "fp8", "--kv-cache-dtype", "fp8_e4m3",
      "--host", "0.0.0.0", "--port", "18000"]),
    ({"quantization": "awq"}, {"download_dir": "/models"},
     [*SGLANG, "--model-path", "org/model", "--served-model-name", "served", "--tp-size", "1",
      "--quantization", "awq", "--download-dir", "/models", "--host", "0.0.0.0",
      "--port", "18000"]),
    ({"kv_cache_dtype": "fp8_e5m2"}, {"source": "/models/local", "download_dir": "/models"},
     [*SGLANG, "--model-path", "/models/local", "--served-model-name", "served",
      "--tp-size", "1", "--kv-cache-dtype", "fp8_e5m2", "--host", "0.0.0.0",
      "--port", "18000"]),
])
def test_sglang_renders_each_profile_field(
        profile: dict[str, Any], overrides: dict[str, Any], argv: list[str]) -> None:
    built = launches.command(launch({"engine": "sglang", "gpu_class": "h100-80g", **profile},
                                    **overrides))
    assert list(built.argv) == argv
