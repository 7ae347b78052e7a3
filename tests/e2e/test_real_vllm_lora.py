"""A LoRA adapter served by the real vLLM (its CPU build, ``make vllm``), through the router.

The tiny Llama of tests/support/tinymodel.py and a PEFT adapter made for it
(tests/support/tinylora.py). The cluster file declares the adapter; vLLM is
started with the argv llmgw renders (``--enable-lora --lora-modules
tiny-sql=PATH --max-lora-rank 8``); the router lists the adapter and sends a
request for it as it came (vLLM serves each ``--lora-modules`` name as a model).
The adapter's greedy answer differs from the base's, and the base's is the
same before and after.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
import vllmharness as vh
from support import nodes
from support.llamaservers import start as start_engine
from support.llamaservers import stop as stop_engine
from support.llamaservers import wait_healthy
from test_real_lora import Loop

from llmgw.engines import launches, profiles
from llmgw.router import Endpoint, Router, catalogs
from llmgw.spec import loading

pytestmark = [pytest.mark.skipif(not vh.VLLM.exists(), reason=vh.MISSING),
              pytest.mark.timeout(vh.TEST_TIMEOUT)]
ADAPTER_BUILDER = Path(__file__).parents[1] / "support" / "tinylora.py"


@pytest.fixture
def served(tmp_path: Path) -> Iterator[dict[str, Any]]:
    directory = tmp_path / "cluster"
    model_dir = vh.build_model(directory / "weights" / "tiny")
    subprocess.run([str(vh.VLLM_DIR / "bin" / "python"), str(ADAPTER_BUILDER), str(model_dir),
                    str(directory / "weights" / "tiny-sql")],
                   check=True, timeout=600, capture_output=True)
    profile = vh.profile()
    (directory / "cluster.yaml").write_text(loading_text(profile))
    cluster = loading.load(directory, extra_checks=[profiles.check])
    model = cluster.models["tiny"]
    port = nodes.free_port()
    command = launches.command(launches.Launch(
        model="tiny", served_name="tiny", source=str(model.source),
        profile=model.profiles[0], rank=0, bind_host="127.0.0.1", port=port,
        adapters=tuple(model.adapters)))
    log = tmp_path / "engine.log"
    env = {**dict(command.env), **model.profiles[0].env}
    engine = start_engine(command.argv, log, env, vh.VLLM.parent)
    loop = Loop()
    router = runner = None
    try:
        url = f"http://127.0.0.1:{port}"
        wait_healthy(url, engine, log, vh.READY_TIMEOUT)
        router = Router(catalogs.from_cluster(cluster))
        router.update_routes({"tiny": [Endpoint(url, node="local", replica=0)]})
        runner = loop.run(router.start("127.0.0.1", 0))
        yield {"router": f"http://127.0.0.1:{runner.addresses[0][1]}", "argv": command.argv,
               "adapter": directory / "weights" / "tiny-sql"}
    finally:
        if router is not None:
            loop.run(router.close(runner))
        loop.close()
        stop_engine(engine, 60)


def loading_text(profile: dict[str, Any]) -> str:
    """The cluster file (JSON is YAML): the tiny model, its adapter, the local node."""
    return json.dumps({
        "cluster": {"name": "lab", "auth": "none"},
        "nodes": {"local": {"address": "local", "weights_dirs": ["./weights"]}},
        "models": {"tiny": {"source": "./weights/tiny", "profiles": [profile],
                            "adapters": [{"name": "tiny-sql", "source": "./weights/tiny-sql",
                                          "rank": 8}]}},
    })


def test_vllm_serves_an_adapter_by_name_and_the_base_as_it_was(
        served: dict[str, Any]) -> None:
    argv = list(served["argv"])
    at = argv.index("--lora-modules")
    assert argv[at + 1] == f"tiny-sql={served['adapter']}"
    assert "--enable-lora" in argv and argv[argv.index("--max-lora-rank") + 1] == "8"

    client = openai.OpenAI(base_url=served["router"] + "/v1", api_key="none", max_retries=0)
    listed = {m.id: m.model_dump() for m in client.models.list().data}
    assert set(listed) == {"tiny", "tiny-sql"} and listed["tiny-sql"]["parent"] == "tiny"

    def complete(model: str) -> str:
        answer = client.completions.create(model=model, prompt="The capital of France is",
                                           max_tokens=8, temperature=0)
        return answer.choices[0].text

    before = complete("tiny")
    adapted = complete("tiny-sql")
    after = complete("tiny")
    assert adapted != before, "the adapter should change the greedy answer"
    assert after == before
