"""A held model's replacements stay out of the plan until its spec changes."""

from __future__ import annotations

from llmgw.planning import holds, outputs
from llmgw.planning.types import Change, Plan
from llmgw.spec.models import Model
from llmgw.spec.rollouts import Hold

GOOD = Model.model_validate({"source": "/m.gguf", "profiles": [
    {"engine": "llama.cpp", "cpu": True, "args": {"ctx-size": 1024}}]})
BAD = Model.model_validate({"source": "/m.gguf", "profiles": [
    {"engine": "llama.cpp", "cpu": True, "args": {"ctx-size": 1024, "logit-bias": "1+100"}}]})
REASON = "p50 TTFT 4.1 s vs 0.3 s"


def plan(*changes: Change) -> Plan:
    return Plan("lab", 0.0, "1a2b3c4d5e6f", tuple(changes))


def hold(model: str, spec: Model, revision: str | None = "1a2b3c4d5e6f") -> Hold:
    return Hold(model, holds.digest(spec), revision, REASON, 100.0)


REPLACE = Change("replace", "m", 0, ("args changed",), strategy="create-before-destroy")
CREATE = Change("create", "n", 0, ("min 1",))
SCALE_UP = Change("create", "m", 1, ("demand",))  # not held: only replacements are


def test_a_held_model_is_not_replaced_and_the_plan_says_why() -> None:
    held, stale = holds.apply(plan(REPLACE, CREATE, SCALE_UP), {"m": BAD, "n": GOOD},
                              [hold("m", BAD)])
    assert stale == []
    assert held.changes == (CREATE, SCALE_UP)
    line = "held: revision 1a2b3c4 failed its gate: p50 TTFT 4.1 s vs 0.3 s"
    assert [h.line() for h in held.holds] == [line]
    text = outputs.text(held)
    assert f"  = m: {line}" in text
    assert held.summary() == ("Plan: 2 to create, 0 to replace, 0 to destroy. "
                              "1 model held (failed a rollout gate).")
    assert line in outputs.markdown(held)
    assert outputs.to_dict(held)["holds"][0]["line"] == line


def test_a_commit_that_changes_the_model_releases_the_hold() -> None:
    fresh, stale = holds.apply(plan(REPLACE), {"m": GOOD}, [hold("m", BAD)])
    assert fresh.changes == (REPLACE,) and fresh.holds == ()
    assert [h.model for h in stale] == ["m"]


def test_a_removed_model_releases_the_hold() -> None:
    _, stale = holds.apply(plan(), {}, [hold("m", BAD)])
    assert [h.model for h in stale] == ["m"]


def test_scaling_or_the_gate_itself_changing_does_not_release_it() -> None:
    rescaled = BAD.model_copy(update={"scaling": BAD.scaling.model_copy(update={"max": 3})})
    assert holds.digest(rescaled) == holds.digest(BAD)
    assert holds.digest(GOOD) != holds.digest(BAD)


def test_no_holds_no_change_to_the_plan() -> None:
    same = plan(REPLACE)
    assert holds.apply(same, {"m": GOOD}, []) == (same, [])
    assert "holds" not in outputs.to_dict(same)


def test_without_git_the_line_names_the_spec() -> None:
    assert hold("m", BAD, None).line().startswith(f"held: spec {holds.digest(BAD)[:7]} failed")


def test_the_digest_is_short_and_does_not_depend_on_key_order() -> None:
    one = Model.model_validate({"source": "/m.gguf", "profiles": [
        {"engine": "llama.cpp", "cpu": True, "args": {"ctx-size": 1024, "threads": 2}}]})
    other = Model.model_validate({"source": "/m.gguf", "profiles": [
        {"engine": "llama.cpp", "cpu": True, "args": {"threads": 2, "ctx-size": 1024}}]})
    assert holds.digest(one) == holds.digest(other)
    assert len(holds.digest(one)) == 16 and int(holds.digest(one), 16) >= 0
