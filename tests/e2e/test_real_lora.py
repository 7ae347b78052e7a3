"""A LoRA adapter served by the real llama-server, through the router, with the openai client.

The adapter is made here (:mod:`support.ggufloras`): random rank-4 pairs on
every ``ffn_down`` of Gemma 3 270M, at scale 4, which changes what the model
says. The cluster file declares it; the spec loader accepts it; the engine is
started with the argv llmgw renders for it (``--lora-scaled PATH:SCALE``); the
router lists it in /v1/models and rewrites a request for it as llama-server
selects an adapter (``model`` → the base, ``lora: [{id, scale}]``).

What is shown: a request for the adapter is answered and differs from the base
model's greedy answer; the base still answers as before the adapter was
asked for, and as an engine without adapters does (llama-server applies every
loaded adapter to a request that lists none, so the router must list them).

Then the whole loop (``llmgw serve`` on ``cluster.example/local``, as
test_real_engine.py runs it): the daemon plans the engine with the adapter,
the router lists and serves it, and a second adapter added to the cluster
file replaces the replica with both loaded, each answering as itself.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar

import httpx
import openai
import pytest
import test_real_engine
from support import ggufloras, nodes
from support.llamaservers import start as start_engine
from support.llamaservers import stop as stop_engine
from support.llamaservers import wait_healthy

from llmgw.engines import launches, profiles
from llmgw.router import Endpoint, Router, catalogs
from llmgw.spec import loading

ROOT = Path(__file__).parents[2]
ENGINE = ROOT / ".cache" / "engine" / "bin" / "llama-server"
MODEL = ROOT / ".cache" / "models" / "gemma3-270m-q4_k_m.gguf"
T = TypeVar("T")

pytestmark = pytest.mark.skipif(
    not (ENGINE.exists() and MODEL.exists()),
    reason="the real engine and model are not built: run `make engine model` (make test does)",
)

CLUSTER = """\
cluster: {{name: lab, auth: none}}
nodes:
  local: {{address: local, weights_dirs: [{models}, ./adapters]}}
models:
  gemma:
    source: {model}
    profiles:
      - engine: llama.cpp
        cpu: true
        args: {{ctx-size: 1024, threads: 1, parallel: 1, no-jinja: true, chat-template: gemma}}
    pricing: {{input_per_mtok: 1.0, output_per_mtok: 2.0}}
    adapters:
      - {{name: gemma-noisy, source: ./adapters/noisy.gguf, scale: 4,
          pricing: {{input_per_mtok: 10.0, output_per_mtok: 20.0}}}}
"""
PROMPT = "The capital of France is"


class Loop:
    """An event loop in its own thread: the router serves there while the sync openai
    client blocks the test's thread."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coro: Coroutine[Any, Any, T], timeout: float = 30) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


@pytest.fixture
def served(tmp_path: Path) -> Iterator[dict[str, Any]]:
    directory = tmp_path / "cluster"
    (directory / "adapters").mkdir(parents=True)
    adapted = ggufloras.write(MODEL, directory / "adapters" / "noisy.gguf")
    (directory / "cluster.yaml").write_text(CLUSTER.format(models=MODEL.parent, model=MODEL))
    cluster = loading.load(directory, extra_checks=[profiles.check])
    model = cluster.models["gemma"]
    port = nodes.free_port()
    command = launches.command(launches.Launch(
        model="gemma", served_name="gemma", source=str(model.source),
        profile=model.profiles[0], rank=0, bind_host="127.0.0.1", port=port,
        adapters=tuple(model.adapters)))
    log = tmp_path / "engine.log"
    engine = start_engine(command.argv, log)
    loop = Loop()
    router = runner = None
    try:
        url = f"http://127.0.0.1:{port}"
        wait_healthy(url, engine, log)
        router = Router(catalogs.from_cluster(cluster))
        router.update_routes({"gemma": [Endpoint(url, node="local", replica=0)]})
        runner = loop.run(router.start("127.0.0.1", 0))
        yield {"router": f"http://127.0.0.1:{runner.addresses[0][1]}", "engine": url,
               "argv": command.argv, "adapted": adapted, "directory": directory, "log": log,
               "handle": router}
    finally:
        if router is not None:
            loop.run(router.close(runner))
        loop.close()
        stop_engine(engine, 30)


def complete(client: openai.OpenAI, model: str) -> str:
    answer = client.completions.create(model=model, prompt=PROMPT, max_tokens=8,
                                       temperature=0)
    assert answer.choices[0].text, answer
    return answer.choices[0].text


def test_an_adapter_is_listed_answers_differently_and_leaves_the_base_as_it_was(
        served: dict[str, Any]) -> None:
    adapter = str(served["directory"] / "adapters" / "noisy.gguf")
    argv = list(served["argv"])
    assert argv[argv.index("--lora-scaled") + 1] == f"{adapter}:4"
    client = openai.OpenAI(base_url=served["router"] + "/v1", api_key="none", max_retries=0)

    listed = {m.id: m.model_dump() for m in client.models.list().data}
    assert set(listed) == {"gemma", "gemma-noisy"}
    assert listed["gemma-noisy"]["parent"] == "gemma"
    assert "parent" not in listed["gemma"]

    before = complete(client, "gemma")
    noisy = complete(client, "gemma-noisy")
    after = complete(client, "gemma")
    assert noisy != before, "the adapter at scale 4 should change the greedy answer"
    assert after == before, "asking for the adapter must not change the base model"

    # The base as an engine without adapters answers it: the adapter is off, not merely
    # applied in the same way twice (llama-server applies a loaded adapter by default).
    plain = httpx.post(served["engine"] + "/v1/completions", timeout=60, json={
        "model": "gemma", "prompt": PROMPT, "max_tokens": 8, "temperature": 0,
        "lora": [{"id": 0, "scale": 0.0}]}).json()
    assert plain["choices"][0]["text"] == before

    # Chat too, streamed, through the same rewrite.
    chunks = client.chat.completions.create(
        model="gemma-noisy", messages=[{"role": "user", "content": "Name a colour."}],
        max_tokens=6, temperature=0, stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)


def test_a_base_request_that_names_adapters_itself_is_refused(served: dict[str, Any]) -> None:
    answer = httpx.post(served["router"] + "/v1/completions", timeout=60, json={
        "model": "gemma", "prompt": PROMPT, "max_tokens": 4, "lora": [{"id": 0, "scale": 4}]})
    assert answer.status_code == 400
    assert answer.json()["error"]["param"] == "lora"


# -- the whole loop: `llmgw serve` plans the engine with its adapters ------------------------

@pytest.fixture
def local_cluster(tmp_path: Path) -> Path:
    """cluster.example/local (as test_real_engine.py copies it) with an adapter declared."""
    directory: Path = test_real_engine.local_cluster.__wrapped__(tmp_path)
    adapters = tmp_path / "adapters"
    adapters.mkdir()
    ggufloras.write(MODEL, adapters / "noisy.gguf")
    ggufloras.write(MODEL, adapters / "other.gguf", targets="attn_output", seed=1)
    path = directory / "cluster.yaml"
    text = path.read_text()
    text = text.replace(f"weights_dirs: [{MODEL.parent}]",
                        f"weights_dirs: [{MODEL.parent}, {adapters}]")
    assert str(adapters) in text
    path.write_text(text + f"    adapters:\n      - {{name: gemma-noisy, source: "
                    f"{adapters}/noisy.gguf, scale: 4}}\n")
    return directory


daemon = test_real_engine.daemon


def test_the_daemon_serves_an_adapter_and_a_second_one_added(daemon: dict[str, Any]) -> None:
    test_real_engine.wait_status(daemon, test_real_engine.ready, "the model to be ready")
    (pid, argv), = ((p, a) for p, a in test_real_engine.engine_processes().items()
                    if str(MODEL) in a)
    adapters = Path(str(daemon["dir"])).parent / "adapters"
    assert argv[argv.index("--lora-scaled") + 1] == f"{adapters}/noisy.gguf:4"

    client = openai.OpenAI(base_url=f"{daemon['router']}/v1", api_key="unused", max_retries=0)
    assert sorted(m.id for m in client.models.list()) == ["gemma-noisy", "gemma3-270m"]
    before = complete(client, "gemma3-270m")
    assert complete(client, "gemma-noisy") != before

    # A second adapter: the replica is replaced with both loaded, each answers as itself.
    path = daemon["dir"] / "cluster.yaml"
    path.write_text(path.read_text() + f"      - {{name: gemma-other, source: "
                    f"{adapters}/other.gguf, scale: 8}}\n")
    test_real_engine.wait_status(
        daemon, lambda s: test_real_engine.ready(s) and pid not in
        test_real_engine.engine_processes(), "the replacement with two adapters")
    assert sorted(m.id for m in client.models.list()) == [
        "gemma-noisy", "gemma-other", "gemma3-270m"]
    answers = {name: complete(client, name)
               for name in ("gemma3-270m", "gemma-noisy", "gemma-other")}
    assert answers["gemma3-270m"] == before
    assert len(set(answers.values())) == 3, answers
