"""Journal entries from applies: what a change did, how it ended, and never a secret."""

from __future__ import annotations

import pytest

from llmgw.applying import records
from llmgw.applying.executions import ChangeOutcome, Outcome
from llmgw.planning.types import Change, ObservedShard, Plan, Shard
from llmgw.rendering.units import UnitFiles
from llmgw.spec.models import Model

SECRET_PATH = "/etc/llmgw/secrets/hf-token"


def shard(node: str) -> Shard:
    files = UnitFiles("llmgw-chat-r1-s0.service", "[Service]\n", "", (("HF_TOKEN", SECRET_PATH),))
    return Shard("chat", 1, 0, 1, node, files.name, "vllm", "h100-80g", (0,), 8000, "d1",
                 {}, files)


def outcome(ok: bool, errors: list[str], logs: list[str]) -> ChangeOutcome:
    change = Change("replace", "chat", 0,
                    ("args changed: --max-model-len 8192 → 16384",
                     f"secret_env changed: HF_TOKEN read from {SECRET_PATH}"),
                    shards=(shard("gpu-2"),),
                    removes=(ObservedShard("gpu-1", "llmgw-chat-r0-s0.service", 0, "d0",
                                           "ready"),),
                    strategy="create-before-destroy", new_replica=1)
    return ChangeOutcome(change, ok=ok, errors=errors, logs={"gpu-2/u": logs}, elapsed=3.5)


def entry_of(item: ChangeOutcome) -> records.ChangeEntry:
    plan = Plan("lab", 0.0, "1a2b3c", (item.change,))
    return records.entry(plan, Outcome([item], 4.0), 100.0, "daemon").changes[0]


def test_a_change_is_journaled_with_its_nodes_reasons_and_duration() -> None:
    got = entry_of(outcome(True, [], []))
    assert (got.model, got.replica, got.action, got.nodes, got.ok, got.error,
            got.duration) == ("chat", 0, "replace", ("gpu-1", "gpu-2"), True, None, 3.5)
    assert got.new_replica == 1
    assert got.why.startswith("args changed: --max-model-len 8192 → 16384; ")
    assert got.drift_class == "declared_change"


def test_a_change_is_journaled_with_its_class_of_drift() -> None:
    item = outcome(True, [], [])
    item.change = Change("restart", "chat", 0, ("gpu-1: llmgw-chat-r0-s0.service failed",),
                         shards=(shard("gpu-1"),), drift="engine_crash",
                         evidence=("gpu-1: llmgw-chat-r0-s0.service failed (killed by SIGKILL)",))
    assert entry_of(item).drift_class == "engine_crash"


def test_a_failure_keeps_the_reason_and_the_engines_last_log_line() -> None:
    got = entry_of(outcome(False, ["llmgw-chat-r1-s0.service on gpu-2: failed (exited)"],
                           ["loading", "CUDA out of memory", ""]))
    assert got.error == ("llmgw-chat-r1-s0.service on gpu-2: failed (exited) | "
                         "CUDA out of memory")


@pytest.mark.parametrize("line", [
    "env: HF_TOKEN=hf_abcdefSECRET",
    "HF_TOKEN: hf_abcdefSECRET",
    f"HF_TOKEN=hf_abcdefSECRET (from {SECRET_PATH})",
])
def test_no_secret_path_or_value_reaches_the_journal(line: str) -> None:
    got = entry_of(outcome(False, [f"failed at {SECRET_PATH}"], [line]))
    text = f"{got.why} {got.error}"
    assert SECRET_PATH not in text
    assert "hf_abcdefSECRET" not in text
    assert "secret_env changed (paths are not journaled)" in got.why


def test_error_text_is_bounded_and_has_no_control_characters() -> None:
    got = entry_of(outcome(False, ["x\x1b[31m" * 1000], []))
    assert got.error is not None and len(got.error) == records.MAX_ERROR
    assert "\x1b" not in got.error


def gated(rolled_back: bool) -> tuple[Plan, Outcome]:
    item = outcome(not rolled_back, [], [])
    if rolled_back:
        item.fail("failed its gate: p50 TTFT 4.1 s vs 0.3 s")
        item.kept_old = item.rolled_back = True
        item.gate, item.rolled_back_at, item.elapsed = "failed: p50 TTFT 4.1 s vs 0.3 s", 3.0, 3.5
    else:
        item.gate = "passed: error rate 0.0% vs 0.0% over 40 requests"
    return Plan("lab", 0.0, "1a2b3c", (item.change,)), Outcome([item], 4.0)


def test_a_passed_gate_is_journaled_and_needs_no_rollback_entry() -> None:
    plan, result = gated(False)
    got = records.entry(plan, result, 100.0, "daemon")
    assert got.gate == "passed"
    assert got.changes[0].gate == "passed: error rate 0.0% vs 0.0% over 40 requests"
    assert got.changes[0].rolled_back is None
    assert records.rollback(plan, result, 100.0, "daemon", 7) is None


def test_a_failed_gate_is_journaled_with_its_rollback() -> None:
    plan, result = gated(True)
    applied = records.entry(plan, result, 100.0, "daemon")
    assert applied.gate == "failed: chat r0: p50 TTFT 4.1 s vs 0.3 s"
    (change,) = applied.changes
    assert (change.ok, change.gate, change.rolled_back) == (
        False, "failed: p50 TTFT 4.1 s vs 0.3 s", True)
    undone = records.rollback(plan, result, 100.0, "daemon", 7)
    assert undone is not None
    assert (undone.rollback_of, undone.started_at, undone.duration, undone.ok) == (
        7, 103.0, 0.5, True)
    (removal,) = undone.changes
    assert (removal.action, removal.replica, removal.nodes, removal.rolled_back) == (
        "destroy", 1, ("gpu-2",), True)
    assert removal.why == "rollback: r0's replacement failed its gate; r0 kept"


def test_a_failed_gate_holds_the_model() -> None:
    plan, result = gated(True)
    spec = Model.model_validate({"source": "/m.gguf", "profiles": [
        {"engine": "llama.cpp", "cpu": True}]})
    (hold,) = records.held(plan, result, {"chat": spec}, 500.0)
    assert (hold.model, hold.revision, hold.reason, hold.held_at) == (
        "chat", "1a2b3c", "p50 TTFT 4.1 s vs 0.3 s", 500.0)
    assert records.held(*gated(False), {"chat": spec}, 500.0) == []


HF_TOKEN = "hf_" + "Ab3dEfGh1jKlMnOpQrStUvWxYz0123456"


def test_an_engine_line_with_a_token_is_journaled_without_it() -> None:
    # The journal is shown by `llmgw history` and GET /api/v1/history (issue 23).
    got = entry_of(outcome(False, ["llmgw-chat-r1-s0.service on gpu-2: failed (exited)"],
                           [f"OSError: 401 for url: token {HF_TOKEN} is invalid"]))
    assert got.error is not None and "OSError: 401" in got.error
    assert HF_TOKEN not in got.error and HF_TOKEN[:12] not in got.error


def test_an_entry_journaled_before_scrubbing_is_shown_without_its_token() -> None:
    old = records.ChangeEntry("chat", 0, "restart", ("gpu-1",), f"why {HF_TOKEN}", False,
                              error=f"failed | token {HF_TOKEN}", gate=f"gate {HF_TOKEN}")
    doc = records.document(records.ApplyEntry(100.0, 4.0, "1a2b3c", "daemon", False, (old,)))
    text = repr(doc)
    assert HF_TOKEN[:12] not in text
    assert "failed | token" in text and doc["outcome"] == "failed"
