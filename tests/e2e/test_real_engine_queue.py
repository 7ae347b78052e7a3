"""The cap from the engine's own slots, against the real llama-server behind the router.

The model's profile runs llama-server with ``parallel: 2`` and sets no
``routing.max_in_flight``: the router takes 2 as the cap. A burst of streams
from the openai SDK then waits in the router's queue, never in the engine's:
llama-server's ``llamacpp:requests_deferred`` (requests it holds for want of a
slot) stays 0 while the router's queue holds the rest, and every stream is
served whole.

``make test`` builds the engine and the model first; run outside it, the test
is skipped with the command that provides them.
"""

from __future__ import annotations

import asyncio
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest
from support import llamaservers
from support.stacks import Stack

from llmgw.router import Settings
from llmgw.spec.models import Cluster

SLOTS, BURST = 2, 6

pytestmark = pytest.mark.skipif(not llamaservers.BUILT, reason=llamaservers.NOT_BUILT)


@pytest.fixture
def llama(tmp_path: Path) -> Iterator[str]:
    with llamaservers.serving(tmp_path / "llama.log", "--parallel", str(SLOTS),
                              "--metrics") as url:
        yield url


@pytest.fixture
def stack(llama: str, tmp_path: Path) -> Iterator[Stack]:
    spec = Cluster.model_validate({
        "cluster": {"name": "lab"},
        "models": {"chat": {"profiles": [{"engine": "llama.cpp", "cpu": True,
                                          "args": {"parallel": SLOTS}}]}},
        "projects": {"research": {}},
    })
    s = Stack(tmp_path, spec, Settings(), replicas=0)
    s.route({"chat": [llama]})
    try:
        yield s
    finally:
        s.close()


def deferred(url: str) -> int:
    text = urllib.request.urlopen(url + "/metrics", timeout=5).read().decode()  # noqa: S310
    [value] = [line.split()[1] for line in text.splitlines()
               if line.startswith("llamacpp:requests_deferred ")]
    return int(float(value))


async def test_requests_wait_in_the_router_not_in_the_engine(stack: Stack, llama: str) -> None:
    seen = {"deferred": 0, "queued": 0}
    done = threading.Event()

    def watch() -> None:  # both queues, sampled through the whole burst
        while not done.is_set():
            seen["deferred"] = max(seen["deferred"], deferred(llama))
            seen["queued"] = max(seen["queued"], stack.router.admissions.depth("chat"))
            time.sleep(0.02)

    watcher = threading.Thread(target=watch)
    watcher.start()
    client = openai.AsyncOpenAI(base_url=stack.url + "/v1", api_key=stack.key(),
                                max_retries=0, timeout=300)

    async def one(index: int) -> str:
        stream = await client.chat.completions.create(
            model="chat", stream=True, max_tokens=24, temperature=0,
            messages=[{"role": "user", "content": f"Count from {index} to {index + 20}."}])
        return "".join([chunk.choices[0].delta.content or "" async for chunk in stream
                        if chunk.choices])

    try:
        texts = await asyncio.gather(*(one(i) for i in range(BURST)))
    finally:
        done.set()
        watcher.join(30)
        await client.close()
    print(f"\nmost queued in the router {seen['queued']}, most deferred in the engine "
          f"{seen['deferred']}")
    assert all(texts)
    assert seen["queued"] >= 1  # the burst did exceed the slots
    assert seen["deferred"] == 0
    assert sorted(r.status for r in stack.rows()) == [200] * BURST
