"""The two router defects, against the real llama-server behind the router.

* The 499 repro: the official openai SDK reads 20 streams to their ``[DONE]``
  and closes; every one is recorded 200 (usage rows and ``llmgw_requests_total``).
* llama-server started without ``--jinja`` answers a request with ``tools``
  ``500 tools param requires --jinja flag``: the client's fault, so the client
  gets a 400 ``invalid_request_error`` with that message, and it is counted as
  ``fault="client"`` in ``llmgw_engine_errors_total``, not as a 5xx.

``make test`` builds the engine and the model first; run outside it, the test
is skipped with the command that provides them.
"""

from __future__ import annotations

import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families
from support import llamaservers
from support.stacks import Stack, cluster

from llmgw.router import Settings

STREAMS = 20

pytestmark = pytest.mark.skipif(not llamaservers.BUILT, reason=llamaservers.NOT_BUILT)


@pytest.fixture(scope="module")
def llama(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real llama-server without --jinja (this build's default is --jinja)."""
    log = tmp_path_factory.mktemp("llama") / "llama.log"
    with llamaservers.serving(log, "--parallel", "2", "--no-jinja") as url:
        yield url


@pytest.fixture
def stack(llama: str, tmp_path: Path) -> Iterator[Stack]:
    s = Stack(tmp_path, cluster(), Settings(), replicas=0)
    s.route({"chat": [llama]})
    try:
        yield s
    finally:
        s.close()


def _samples(stack: Stack, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    text = urllib.request.urlopen(stack.metrics_url).read().decode()  # noqa: S310
    return {tuple(sorted(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples
            if s.name == name}


def test_the_openai_sdk_finishes_20_streams_and_none_is_499(stack: Stack) -> None:
    client = openai.OpenAI(base_url=stack.url + "/v1", api_key=stack.key(), max_retries=0)
    for index in range(STREAMS):
        pieces = [chunk.choices[0].delta.content or ""
                  for chunk in client.chat.completions.create(
                      model="chat", messages=[{"role": "user", "content": f"Count to {index}"}],
                      max_tokens=8, stream=True)
                  if chunk.choices]
        assert pieces
    # The router records a request once its handler ends, which may be just after the
    # client read [DONE] and left: wait for the last row, then every one must be a 200.
    deadline = time.monotonic() + 30
    while len(rows := stack.rows()) < STREAMS and time.monotonic() < deadline:
        time.sleep(0.1)
    assert [r.status for r in rows] == [200] * STREAMS
    assert all(r.completion_tokens for r in rows)  # the engine's usage chunk was read
    by_status = {dict(labels)["status"]: value
                 for labels, value in _samples(stack, "llmgw_requests_total").items()}
    assert by_status == {"200": float(STREAMS)}


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_tools_without_jinja_are_the_clients_fault(stack: Stack, stream: bool) -> None:
    client = openai.OpenAI(base_url=stack.url + "/v1", api_key=stack.key(), max_retries=0)
    tool = {"type": "function", "function": {"name": "weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}}}}
    with pytest.raises(openai.BadRequestError) as raised:
        client.chat.completions.create(model="chat", messages=[{"role": "user", "content": "hi"}],
                                       tools=[tool], max_tokens=4, stream=stream)  # type: ignore[list-item]
    assert raised.value.status_code == 400
    assert raised.value.body == {"message": "tools param requires --jinja flag",
                                 "type": "invalid_request_error", "param": None,
                                 "code": "tools_need_jinja"}
    assert _samples(stack, "llmgw_engine_errors_total") == {
        (("fault", "client"), ("model", "chat"), ("reason", "tools_need_jinja"),
         ("status", "500")): 1.0}
    by_status = {dict(labels)["status"]: value
                 for labels, value in _samples(stack, "llmgw_requests_total").items()}
    assert by_status == {"400": 1.0}
    assert stack.call(stack.router.routes.tallies.snapshot)[stack_url(stack)]["errors"] == 0


def stack_url(stack: Stack) -> str:
    (url,) = stack.call(stack.router.routes.tallies.snapshot)
    return str(url)
