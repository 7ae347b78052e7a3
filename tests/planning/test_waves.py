"""Waves bound how many replicas of a gated model are replaced at once."""

from __future__ import annotations

import pytest

from llmgw.planning import waves
from llmgw.planning.types import Change
from llmgw.spec.rollouts import Rollout

CBD, DBC = "create-before-destroy", "destroy-before-create"


def replace(model: str, replica: int, strategy: str = CBD) -> Change:
    return Change("replace", model, replica, ("args changed",), strategy=strategy)  # type: ignore[arg-type]


def other(action: str, model: str, replica: int) -> Change:
    return Change(action, model, replica, ("why",))  # type: ignore[arg-type]


def names(split: list[tuple[Change, ...]]) -> list[list[str]]:
    return [[f"{c.action[0]}:{c.model}:{c.replica}" for c in wave] for wave in split]


@pytest.mark.parametrize(
    ("changes", "gates", "expected"),
    [
        pytest.param([replace("a", 0), replace("a", 1), replace("a", 2)], {},
                     [["r:a:0", "r:a:1", "r:a:2"]], id="no-gate-one-wave"),
        pytest.param([replace("a", 0), replace("a", 1), replace("a", 2)],
                     {"a": Rollout()}, [["r:a:0"], ["r:a:1"], ["r:a:2"]],
                     id="default-surge-one-at-a-time"),
        pytest.param([replace("a", i) for i in range(5)], {"a": Rollout(max_surge=2)},
                     [["r:a:0", "r:a:1"], ["r:a:2", "r:a:3"], ["r:a:4"]], id="surge-two"),
        pytest.param([replace("a", i, DBC) for i in range(3)], {"a": Rollout()},
                     [["r:a:0"], ["r:a:1"], ["r:a:2"]], id="unavailable-zero-still-one"),
        pytest.param([replace("a", i, DBC) for i in range(3)],
                     {"a": Rollout(max_unavailable=3)}, [["r:a:0", "r:a:1", "r:a:2"]],
                     id="unavailable-three"),
        pytest.param([replace("a", 0), replace("a", 1, DBC), replace("a", 2),
                      replace("a", 3, DBC)], {"a": Rollout(max_surge=1, max_unavailable=1)},
                     [["r:a:0", "r:a:1"], ["r:a:2", "r:a:3"]], id="surge-and-unavailable"),
        pytest.param([other("destroy", "b", 0), replace("a", 0), replace("a", 1),
                      other("create", "a", 5), replace("c", 0), replace("c", 1)],
                     {"a": Rollout()},
                     [["d:b:0", "r:a:0", "c:a:5", "r:c:0", "r:c:1"], ["r:a:1"]],
                     id="the-rest-in-the-first-wave"),
        pytest.param([replace("a", 0), replace("b", 0), replace("a", 1), replace("b", 1)],
                     {"a": Rollout(), "b": Rollout()},
                     [["r:a:0", "r:b:0"], ["r:a:1", "r:b:1"]], id="models-side-by-side"),
        pytest.param([], {"a": Rollout()}, [], id="nothing"),
    ],
)
def test_split(changes: list[Change], gates: dict[str, Rollout],
               expected: list[list[str]]) -> None:
    assert names(waves.split(changes, gates)) == expected
