"""Planning: what must change in the fleet, and why — a pure function.

Usage::

    from llmgw import planning

    result = planning.plan(cluster, fleet, now, demand)   # no I/O, no clock
    print(planning.outputs.text(result))
    for change in result.changes:                         # in execution order
        for phase in change.phases():
            ...                                           # llmgw.applying runs these

See :mod:`.plans` for the steps, :mod:`.placements` for the placement rules,
:mod:`.outputs` for the text, Markdown and JSON forms.
"""

from llmgw.planning import outputs
from llmgw.planning.plans import plan
from llmgw.planning.scaling import Policy
from llmgw.planning.types import (
    FORMAT_VERSION,
    Attempt,
    CapacityRow,
    Change,
    NodeFingerprint,
    ObservedShard,
    Plan,
    Shard,
    UnitOp,
    UnknownReplica,
    Unplaceable,
)

__all__ = [
    "FORMAT_VERSION", "Attempt", "CapacityRow", "Change", "NodeFingerprint", "ObservedShard",
    "Plan", "Policy", "Shard", "UnitOp", "UnknownReplica", "Unplaceable", "outputs", "plan",
]
