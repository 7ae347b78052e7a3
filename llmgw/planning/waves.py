"""Waves: the order in which a plan's replacements run, bounded per model.

A model with a rollout gate (:mod:`llmgw.spec.rollouts`) has its replicas
replaced a few at a time: at most ``max_surge`` create-before-destroy
replacements (each runs a new replica beside the old one while it bakes) and
at most ``max_unavailable`` destroy-before-create ones (the replica is down
until its replacement is Ready; ``0`` still lets one through at a time, since
the planner chose that strategy only where no room is left beside it) in each
wave. The next wave starts when the previous one is done, so a gate that fails
in wave 1 has touched only wave 1's replicas.

Everything that is not a gated replacement — creates, destroys, restarts,
replacements of models without a gate — runs in the first wave, as before.
Purely computational.

Usage::

    for wave in waves.split(plan.changes, gates):   # gates: model → Rollout (or absent)
        ...
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence

from llmgw.planning.types import Change
from llmgw.spec.rollouts import Rollout


def split(changes: Sequence[Change],
          gates: Mapping[str, Rollout | None]) -> list[tuple[Change, ...]]:
    """``changes`` in waves, each keeping the plan's order; never an empty wave."""
    slot: dict[int, int] = {}  # id(change) → its wave
    surge: dict[str, int] = defaultdict(int)  # create-before-destroy replaces seen per model
    down: dict[str, int] = defaultdict(int)  # destroy-before-create replaces seen per model
    for change in changes:
        gate = gates.get(change.model)
        if change.action != "replace" or gate is None:
            slot[id(change)] = 0
        elif change.strategy == "create-before-destroy":
            slot[id(change)] = surge[change.model] // gate.max_surge
            surge[change.model] += 1
        else:
            slot[id(change)] = down[change.model] // max(1, gate.max_unavailable)
            down[change.model] += 1
    count = max(slot.values(), default=-1) + 1
    return [wave for i in range(count)
            if (wave := tuple(c for c in changes if slot[id(c)] == i))]
