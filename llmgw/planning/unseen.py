"""Nodes whose units nobody has seen, and the replicas they may run: never placed twice.

An unreachable node whose units are remembered (the daemon keeps what it
last reported, ``NodeReport.units_as_of``) shows its replicas as unknown,
and they count. A node nobody has seen since it went down — a one-shot
``llmgw apply`` has no memory — reports no units at all, yet may run a
replica of any model that could be placed there. Creating that replica
elsewhere could run a ``max: 1`` model twice, and a daemon that comes back
to both would then destroy one of them, maybe the warm original.

So a model is not scaled up past what ``max`` allows when each such node
is counted as one replica it may run, unless the model allows it
(``scaling.replace_unreachable``) or the operator forces it (``llmgw apply
--force``, :attr:`llmgw.planning.scaling.Policy.place_unseen`).

A purely computational module with no side effects.
"""

from __future__ import annotations

from collections.abc import Mapping

from llmgw.fleet.types import NodeReport
from llmgw.planning.placements import selector_mismatch
from llmgw.spec.models import Cluster, Model, Node


def nodes(cluster: Cluster, reports: Mapping[str, NodeReport]) -> dict[str, str]:
    """Declared nodes whose units are unknown → why, in a word or two."""
    found = {}
    for name in sorted(cluster.nodes):
        report = reports.get(name)
        if report is None:
            found[name] = "no report"
        elif not report.units_known:
            found[name] = "unreachable"
        # A node that answers, or whose units are remembered, shows what it runs.
    return found


def could_run(model: Model, node: Node) -> bool:
    """Whether any profile of ``model`` could have been placed on ``node``, by its spec."""
    declared = {g.gpu_class for g in node.gpus}
    for profile in model.profiles:
        if selector_mismatch(node.labels, profile.node_selector):
            continue
        if profile.cpu or not declared or declared & set(profile.gpu_classes):
            return True
    return False


def withheld(
    name: str, model: Model, cluster: Cluster, unseen: Mapping[str, str], counted: int,
    replicas: tuple[int, ...], *, forced: bool,
) -> str | None:
    """Why the replicas ``replicas`` of ``name`` are not placed now; None when they may be.

    ``counted``: the model's replicas known to run or already planned.
    """
    if forced or model.scaling.replace_unreachable:
        return None
    where = [node for node in unseen if could_run(model, cluster.nodes[node])]
    if not where or counted + len(where) < model.scaling.max:
        return None
    named = ", ".join(f"r{r}" for r in replicas)
    nodes_said = ", ".join(f"{node} ({unseen[node]})" for node in where)
    return (f"a replica may still run on {nodes_said}: {named} not placed elsewhere "
            f"(max {model.scaling.max}); --force to place")
