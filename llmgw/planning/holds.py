"""Held revisions: a model whose replacement failed its rollout gate is not replaced again.

When a gate rolls a replacement back, the daemon writes a :class:`Hold` (the
model, the digest of the spec that failed, the git revision, the reason) to the
store. :func:`apply` then takes that model's replacements out of every plan and
lists the hold instead — in the text plan, the pull request comment and the
JSON — until one of:

* a new commit changes the model's spec (its :func:`digest` no longer matches:
  the hold is stale and :func:`apply` says so, for the daemon to drop it);
* ``llmgw apply --retry`` releases it.

The digest covers what makes the replica run differently — source, served
name, profiles — not scaling, pricing, routing or the gate's own settings, so
a longer bake alone does not retry a revision that failed. Purely
computational.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import replace

from llmgw.planning.types import Plan
from llmgw.spec.models import Model
from llmgw.spec.rollouts import Hold

_SPEC_FIELDS = {"source", "served_name", "profiles"}
__all__ = ["Hold", "apply", "digest"]


def digest(model: Model) -> str:
    """A digest of what makes ``model``'s replicas run as they do."""
    doc = model.model_dump(mode="json", include=_SPEC_FIELDS)
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:16]


def apply(plan: Plan, models: dict[str, Model],
          holds: Sequence[Hold]) -> tuple[Plan, list[Hold]]:
    """``plan`` without the replacements of held models, listing the holds; and the stale
    holds (the model changed since, or is gone), which no longer hold anything."""
    current: dict[str, Hold] = {}
    stale: list[Hold] = []
    for hold in holds:
        model = models.get(hold.model)
        if model is not None and digest(model) == hold.digest:
            current[hold.model] = hold
        else:
            stale.append(hold)
    if not current:
        return plan, stale
    changes = tuple(c for c in plan.changes
                    if not (c.action == "replace" and c.model in current))
    return replace(plan, changes=changes,
                   holds=tuple(current[m] for m in sorted(current))), stale
