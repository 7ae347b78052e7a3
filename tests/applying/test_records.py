"""Journal entries from applies: what a change did, how it ended, and never a secret."""

from __future__ import annotations

import pytest

from llmgw.applying import records
from llmgw.applying.executions import ChangeOutcome, Outcome
from llmgw.planning.types import Change, ObservedShard, Plan, Shard
from llmgw.rendering.units import UnitFiles

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
