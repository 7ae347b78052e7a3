"""A model's rollout merges over the cluster's field by field; absent or disabled: no gate."""

from __future__ import annotations

import pytest

from llmgw.spec.rollouts import Rollout, effective


def _r(**fields: object) -> Rollout:
    return Rollout.model_validate(fields)


@pytest.mark.parametrize(
    ("default", "own", "expected"),
    [
        pytest.param(None, None, None, id="none-anywhere-no-gate"),
        pytest.param(_r(bake="2m"), None, _r(bake="2m"), id="cluster-default-applies"),
        pytest.param(None, _r(share=0.5), _r(share=0.5), id="model-only"),
        pytest.param(_r(bake="2m", share=0.2), _r(share=0.5), _r(bake="2m", share=0.5),
                     id="model-overrides-one-field"),
        pytest.param(_r(compare={"max_ttft_ratio": 3, "min_requests": 50}),
                     _r(compare={"min_requests": 5}),
                     _r(compare={"max_ttft_ratio": 3, "min_requests": 5}),
                     id="nested-sections-merge"),
        pytest.param(_r(probe={"prompt": "hi", "max_tokens": 4}), _r(probe={"max_tokens": 2}),
                     _r(probe={"prompt": "hi", "max_tokens": 2}), id="probe-merges"),
        pytest.param(_r(bake="2m"), _r(probe=None), _r(bake="2m", probe=None),
                     id="model-turns-probe-off"),
        pytest.param(_r(bake="2m"), _r(enabled=False), None, id="model-opts-out"),
        pytest.param(_r(enabled=False), _r(enabled=True), _r(), id="model-opts-in"),
    ],
)
def test_effective(default: Rollout | None, own: Rollout | None,
                   expected: Rollout | None) -> None:
    got = effective(default, own)
    if expected is None:
        assert got is None
    else:
        assert got is not None
        assert got.model_dump() == expected.model_dump()


def test_defaults_a_user_expects() -> None:
    gate = Rollout()
    assert (gate.bake, gate.share, gate.max_surge, gate.max_unavailable) == (60.0, 0.1, 1, 0)
    assert gate.probe is not None and gate.probe.expect == "text"
    assert gate.probe.expect_status == 200
    assert gate.compare.min_requests == 20
