"""A real vLLM (its CPU build, ``make vllm``) serving a tiny model through ``llmgw serve``.

The whole path, as an operator has it: a cluster file with a ``cpu: true``
vLLM profile pinned to the installed version → ``llmgw serve`` plans and
applies → the node's agent starts the unit → the unit runs exactly the
``vllm serve`` argv llmgw rendered → the router → the official ``openai``
client: models, completion, chat, a streamed completion. Then an argument
edit replaces the replica while a client keeps asking through the router,
and not one request fails; then ``runner: pooling`` turns the model into an
embedding model that answers ``/v1/embeddings``.

The tiny model is made offline (tests/support/tinymodel.py): random
weights, so the words are nonsense; the tests check shapes and counts.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
import vllmharness as vh
from support.plugin import SimClusterFactory

# vLLM imports torch and much else: minutes on two shared cores, per engine start.
pytestmark = [pytest.mark.skipif(not vh.VLLM.exists(), reason=vh.MISSING),
              pytest.mark.timeout(vh.TEST_TIMEOUT)]
NAME = "tiny"


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return vh.build_model(tmp_path_factory.mktemp("tiny") / "model")


@pytest.fixture
def served(sim_cluster: SimClusterFactory, tmp_path: Path,
           monkeypatch: pytest.MonkeyPatch) -> Iterator[vh.Served]:
    vh.patient_agents(monkeypatch)
    sim = sim_cluster(1, hardware=["cpu-only"])
    vh.install(sim)
    daemon = vh.Served(sim, tmp_path / "serve.log")
    yield daemon
    daemon.stop()


def models(source: Path, **extra: Any) -> dict[str, Any]:
    return {NAME: {"source": str(source), "scaling": {"min": 1, "max": 1},
                   "profiles": [vh.profile(**extra)]}}


def engine(served: vh.Served) -> tuple[int, list[str]]:
    (_, unit), = served.units(NAME)
    assert unit.state == "ready" and unit.pid is not None, unit
    return unit.pid, vh.served_argv(unit)


def test_vllm_serves_chat_completion_stream_and_embeddings_through_llmgw(
    served: vh.Served, tiny_model: Path,
) -> None:
    served.write(models(tiny_model))
    started = time.monotonic()
    served.start()
    served.wait(vh.ready(NAME), "the vLLM replica to be ready")
    print(f"vLLM ready {time.monotonic() - started:.0f} s after `llmgw serve` started")

    # The unit runs exactly what llmgw rendered, from the installed version's bin/.
    pid, rendered = engine(served)
    assert rendered[:3] == ["/usr/bin/env", "vllm", "serve"]
    running = vh.argv(pid)
    assert running[1].endswith("/bin/vllm") and running[2:] == rendered[2:], running
    assert rendered[rendered.index("--kv-cache-memory-bytes") + 1] == str(64 * 1024 * 1024)
    assert vh.environment(pid)["CUDA_VISIBLE_DEVICES"] == ""
    print(f"vLLM RSS with its children: {vh.rss_mib(pid)} MiB")

    client = openai.OpenAI(base_url=f"{served.router}/v1", api_key="unused", max_retries=0,
                           timeout=120)
    assert [m.id for m in client.models.list()] == [NAME]
    completion = client.completions.create(model=NAME, prompt="The capital of France is",
                                           max_tokens=8, temperature=0)
    assert completion.usage is not None and completion.usage.completion_tokens > 0
    chat = client.chat.completions.create(
        model=NAME, messages=[{"role": "user", "content": "Say hello."}], max_tokens=8)
    assert isinstance(chat.choices[0].message.content, str)
    assert chat.usage is not None and chat.usage.completion_tokens > 0
    chunks = [c for c in client.completions.create(model=NAME, prompt="One, two,",
                                                   max_tokens=8, stream=True,
                                                   temperature=0, extra_body={"ignore_eos": True})
              if c.choices]
    assert len(chunks) > 1 and "".join(c.choices[0].text for c in chunks)

    # An argument edit: a new replica beside the old one, the old one goes when
    # the new one is ready, and a client asking all along never sees a failure.
    answered: list[int] = []
    failures: list[str] = []
    done = threading.Event()

    def ask() -> None:
        with openai.OpenAI(base_url=f"{served.router}/v1", api_key="unused", max_retries=0,
                           timeout=120) as asker:
            while not done.is_set():
                try:
                    asker.completions.create(model=NAME, prompt="Hello", max_tokens=2)
                    answered.append(1)
                except openai.APIError as exc:
                    failures.append(repr(exc))

    thread = threading.Thread(target=ask)
    thread.start()
    try:
        served.write(models(tiny_model, args={"max-num-seqs": 3}))
        served.wait(lambda s: vh.ready(NAME)(s) and vh.gone(pid), "the replaced replica")
    finally:
        done.set()
        thread.join(timeout=180)
    print(f"requests answered during the replacement: {len(answered)}")
    assert failures == [] and answered
    new_pid, new_argv = engine(served)
    assert new_pid != pid and new_argv[new_argv.index("--max-num-seqs") + 1] == "3"
    assert vh.argv(new_pid)[2:] == new_argv[2:]

    # runner: pooling makes it an embedding model (vLLM adapts the causal LM).
    served.write(models(tiny_model, args={"runner": "pooling"}))
    served.wait(lambda s: vh.ready(NAME)(s) and vh.gone(new_pid), "the pooling replica")
    pooling_pid, pooling_argv = engine(served)
    assert pooling_argv[pooling_argv.index("--runner") + 1] == "pooling"
    embedded = client.embeddings.create(model=NAME, input=["hello", "llmgw"])
    assert [len(e.embedding) for e in embedded.data] == [256, 256]
    assert embedded.data[0].embedding != embedded.data[1].embedding
    assert vh.argv(pooling_pid)[2:] == pooling_argv[2:]
