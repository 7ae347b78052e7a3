"""Engine 5xx answers that are the client's fault: 400 to the client, no retry, no error.

Each recorded engine error body (tests/fixtures/engine-errors/, SOURCES.md) is
answered by a real HTTP upstream on both replicas of ``chat``, and sent through
the router with the official openai SDK, plain and streamed. A client fault is
answered ``400 invalid_request_error`` with the engine's message, reaches one
replica only, and counts as no error in the replicas' tallies (what rollout
gates read) nor as a 5xx in ``llmgw_requests_total`` (what LlmgwHighErrorRate
reads); a server fault is retried and stays a 5xx. Both are counted in
``llmgw_engine_errors_total``.
"""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families
from support.stacks import Stack

from llmgw.applying import gates
from llmgw.router import faults
from llmgw.spec.rollouts import Compare

RECORDED = Path(__file__).resolve().parents[1] / "fixtures" / "engine-errors"
MESSAGES = [{"role": "user", "content": "hi"}]

# file -> (fault, reason)
EXPECTED = {
    "llamacpp-500-tools-no-jinja.json": ("client", "tools_need_jinja"),
    "llamacpp-500-tool-choice-no-jinja.json": ("client", "tools_need_jinja"),
    "llamacpp-500-image-no-mmproj.json": ("client", "modality_unsupported"),
    "llamacpp-501-no-embeddings.json": ("client", "endpoint_unsupported"),
    "vllm-501-no-embeddings-api.json": ("client", "endpoint_unsupported"),
    "sglang-500-roles-must-alternate.json": ("client", "chat_template_rejected"),
    "vllm-500-engine-dead.json": ("server", "engine_dead"),
}


def _status(name: str) -> int:
    return int(name.split("-")[1])


def test_every_recorded_body_is_in_the_table() -> None:
    assert sorted(p.name for p in RECORDED.glob("*.json")) == sorted(EXPECTED)
    sources = (RECORDED / "SOURCES.md").read_text()
    assert [name for name in EXPECTED if f"`{name}`" not in sources] == []


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_recorded_bodies_are_classified(name: str) -> None:
    fault = faults.classify(_status(name), (RECORDED / name).read_bytes())
    assert (fault.fault, fault.reason) == EXPECTED[name]
    assert fault.message and fault.message in (RECORDED / name).read_text()


@pytest.mark.parametrize(("status", "body", "fault", "reason"), [
    pytest.param(500, b'{"error": {"message": "out of cheese"}}', "server", "unclassified",
                 id="unknown-message"),
    pytest.param(503, (RECORDED / "llamacpp-500-tools-no-jinja.json").read_bytes(), "server",
                 "unclassified", id="known-message-other-status"),
    pytest.param(500, b"<html>tools param requires --jinja flag</html>", "server",
                 "unclassified", id="anchored-pattern"),
    pytest.param(500, b"tools param requires --jinja flag", "client", "tools_need_jinja",
                 id="plain-text-body"),
    pytest.param(500, b'{"detail": "tools param requires --jinja flag"}', "client",
                 "tools_need_jinja", id="fastapi-detail"),
    pytest.param(500, b'[1, 2]', "server", "unclassified", id="json-not-an-object"),
    pytest.param(500, b'{"error": {"message": ' + b'[' * 100000 + b'}}', "server",
                 "unclassified", id="deeply-nested"),
])
def test_odd_bodies(status: int, body: bytes, fault: str, reason: str) -> None:
    found = faults.classify(status, body)
    assert (found.fault, found.reason) == (fault, reason)


def test_the_message_is_escaped_and_bounded() -> None:
    body = json.dumps({"error": {"message": "tools param requires --jinja flag\n\x1b[31m"
                                 + "x" * 5000}}).encode()
    fault = faults.classify(500, body)
    assert fault.client
    assert "\n" not in fault.message and "\x1b" not in fault.message
    assert "\\n\\x1b[31m" in fault.message
    assert len(fault.message) == faults.MAX_MESSAGE and fault.message.endswith("…")


def _samples(stack: Stack, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    text = urllib.request.urlopen(stack.metrics_url).read().decode()  # noqa: S310
    return {tuple(sorted(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples
            if s.name == name}


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_engine_errors_through_the_router(stack: Stack, name: str, stream: bool) -> None:
    status, (fault, reason) = _status(name), EXPECTED[name]
    for upstream in stack.upstreams:
        upstream.status, upstream.error_body = status, (RECORDED / name).read_bytes()
    client = openai.OpenAI(base_url=stack.url + "/v1", api_key=stack.key(), max_retries=0)
    with pytest.raises(openai.APIStatusError) as raised:
        client.chat.completions.create(model="chat", messages=MESSAGES, stream=stream)
    answered = raised.value.status_code
    reached = sum(len(u.received) for u in stack.upstreams)
    tallies = stack.call(stack.router.routes.tallies.snapshot)
    errors = sum(t["errors"] for t in tallies.values())
    counted = _samples(stack, "llmgw_engine_errors_total")
    if fault == "client":
        assert answered == 400
        body = raised.value.body
        assert isinstance(body, dict) and body["type"] == "invalid_request_error"
        assert body["code"] == reason
        assert body["message"] == faults.classify(status, upstream.error_body).message
        assert reached == 1  # not retried: every replica would refuse it alike
        assert errors == 0  # rollout gates see no failure
        assert counted == {(("fault", "client"), ("model", "chat"), ("reason", reason),
                            ("status", str(status))): 1.0}
    else:
        assert answered == status
        assert reached == 2 and errors == 2  # retried once, both replicas' fault
        assert counted == {(("fault", "server"), ("model", "chat"), ("reason", reason),
                            ("status", str(status))): 2.0}
    by_status = {labels[1][1]: value for labels, value in
                 _samples(stack, "llmgw_requests_total").items()}
    assert by_status == {str(answered): 1.0}
    assert [r.status for r in stack.rows()] == [answered]


@pytest.mark.parametrize(("name", "decision"), [
    ("llamacpp-500-tools-no-jinja.json", "promote"),
    ("vllm-500-engine-dead.json", "rollback"),
])
def test_a_rollout_gate_rolls_back_on_server_faults_only(
        stack: Stack, name: str, decision: str) -> None:
    old, new = stack.upstreams
    new.status, new.error_body = _status(name), (RECORDED / name).read_bytes()
    client = openai.OpenAI(base_url=stack.url + "/v1", api_key=stack.key(), max_retries=0)
    for upstream in (old, new):
        stack.route({"chat": [upstream]})
        for _ in range(20):
            try:
                client.chat.completions.create(model="chat", messages=MESSAGES)
            except openai.APIStatusError:
                assert upstream is new
    tallies = stack.call(stack.router.routes.tallies.snapshot)
    # The time to first token is not what this compares: only the error rate.
    verdict = gates.judge(Compare(max_ttft_ratio=1000), gates.stats(tallies, [new.url]),
                          gates.stats(tallies, [old.url]), baked=True)
    assert verdict.decision == decision, verdict.reason
