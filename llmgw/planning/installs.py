"""Engine versions a plan needs installed first: "install vllm 0.11.0 on gpu-01 first".

A shard whose profile names an ``engine_version`` runs that version's
directory on its node (:mod:`llmgw.agent.installs`); until it is installed
the agent holds the unit. This module adds the step to the plan: each create,
replace or restart whose shards land on a node that does not report the
version installed gets one more reason, naming the command that installs it.

An upgrade must never cost the running replica before the new version is
there. A create-before-destroy replace is safe as it is (the old replica
serves until the new one is ready, and the new one waits for its install), so
it only gets the line. A destroy-before-create replace would stop the old
replica and leave nothing serving while the install is missing: it is *held*
instead. The change leaves the plan, the old replica keeps running, and the
plan warns "llama-70b r0 keeps running: its replace waits for install of vllm
0.11.2 on gpu-01 (llmgw engine install vllm==0.11.2 gpu-01)". Once the nodes
report the version, the next plan makes the replace with nothing to wait for.
A replace that moves the replica is held only while no other change of the
plan takes the GPUs it would free (the planner counted them as freed);
otherwise it stays, with its line.

A node whose agent does not report installs (no ``engines_dir``: older than
engine installs, or unreachable) gets no such line and holds nothing: absent
is not "missing".

A purely computational module with no side effects.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from llmgw.fleet.types import NodeReport
from llmgw.planning.types import Change, ObservedShard, Plan, Shard

Lacking = dict[tuple[str, str], set[str]]  # (engine, version) → nodes that lack it
WAITS = ": its replace waits for install of "  # in every hold's warning, and only there


def missing(shard: Shard, report: NodeReport | None) -> tuple[str, str] | None:
    """(engine, version) the shard needs and its node lacks, or None."""
    version = shard.spec.get("engine_version")
    if not isinstance(version, str) or report is None or report.host is None \
            or report.host.engines_dir is None:
        return None
    have = {(e.engine, e.version) for e in report.host.installed_engines}
    return None if (shard.engine, version) in have else (shard.engine, version)


def lacking(change: Change, reports: Mapping[str, NodeReport]) -> Lacking:
    """Each (engine, version) the change's shards need and the nodes that lack it."""
    found: Lacking = {}
    for shard in change.shards:
        need = missing(shard, reports.get(shard.node))
        if need is not None:
            found.setdefault(need, set()).add(shard.node)
    return found


def _command(engine: str, version: str, nodes: set[str]) -> str:
    return f"llmgw engine install {engine}=={version} {' '.join(sorted(nodes))}"


def reasons(change: Change, reports: Mapping[str, NodeReport]) -> tuple[str, ...]:
    """The "install … first" lines of one change, one per (engine, version), nodes sorted."""
    return tuple(
        f"install {engine} {version} on {', '.join(sorted(nodes))} first: "
        f"{_command(engine, version, nodes)}"
        for (engine, version), nodes in sorted(lacking(change, reports).items())
    )


def waiting(change: Change, needs: Lacking) -> str:
    """The warning of a held replace: what keeps running and what it waits for."""
    installs = "; ".join(
        f"{engine} {version} on {', '.join(sorted(nodes))} "
        f"({_command(engine, version, nodes)})"
        for (engine, version), nodes in sorted(needs.items())
    )
    return f"{change.model} r{change.replica} keeps running{WAITS}{installs}"


def holds(plan: Plan) -> int:
    """How many replaces the plan holds for an engine install."""
    return sum(1 for warning in plan.warnings if WAITS in warning)


def _places(shards: tuple[Shard, ...] | tuple[ObservedShard, ...]) -> set[tuple[str, int | None]]:
    """(node, GPU) of each GPU a shard holds; (node, None) for a shard without GPUs."""
    return {(s.node, gpu) for s in shards for gpu in (s.gpus or (None,))}


def _freed_reused(change: Change, plan: Plan) -> bool:
    """Whether another change of the plan takes what this replace frees.

    A replace in place keeps its GPUs (no other change can have them); one
    that moves frees its old GPUs (or its CPU node's memory), which the
    planner may have given to another change: holding it would put two
    replicas on them.
    """
    freed = _places(change.removes)
    return any(_places(other.shards) & freed for other in plan.changes if other is not change)


def noted(plan: Plan, reports: Mapping[str, NodeReport]) -> Plan:
    """The plan, each change whose nodes lack its engine version saying so, and each
    destroy-before-create replace that would wait for an install held (see above)."""
    changes: list[Change] = []
    held: list[Change] = []
    warnings: list[str] = []
    for change in plan.changes:
        needs = lacking(change, reports)
        if not needs:
            changes.append(change)
        elif change.action == "replace" and change.strategy == "destroy-before-create" \
                and not _freed_reused(change, plan):
            held.append(change)
            warnings.append(waiting(change, needs))
        else:
            changes.append(replace(change, reasons=change.reasons + reasons(change, reports)))
    return replace(plan, changes=tuple(changes), warnings=plan.warnings + tuple(warnings),
                   awaiting_install=plan.awaiting_install + tuple(held))


def needed(plan: Plan, reports: Mapping[str, NodeReport]) -> Lacking:
    """Every (engine, version) the plan's changes and held replaces need, and the nodes
    that lack it: what ``llmgw apply`` installs before it changes anything."""
    found: Lacking = {}
    for change in plan.changes + plan.awaiting_install:
        for need, nodes in lacking(change, reports).items():
            found.setdefault(need, set()).update(nodes)
    return dict(sorted(found.items()))
