"""Engine versions a plan needs installed first: "install vllm 0.11.0 on gpu-01 first".

A shard whose profile names an ``engine_version`` runs that version's
directory on its node (:mod:`llmgw.agent.installs`); until it is installed
the agent holds the unit. This module adds the step to the plan: each create,
replace or restart whose shards land on a node that does not report the
version installed gets one more reason, naming the command that installs it.

A node whose agent does not report installs (no ``engines_dir``: older than
engine installs, or unreachable) gets no such line: absent is not "missing".

A purely computational module with no side effects.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from llmgw.fleet.types import NodeReport
from llmgw.planning.types import Change, Plan, Shard


def missing(shard: Shard, report: NodeReport | None) -> tuple[str, str] | None:
    """(engine, version) the shard needs and its node lacks, or None."""
    version = shard.spec.get("engine_version")
    if not isinstance(version, str) or report is None or report.host is None \
            or report.host.engines_dir is None:
        return None
    have = {(e.engine, e.version) for e in report.host.installed_engines}
    return None if (shard.engine, version) in have else (shard.engine, version)


def reasons(change: Change, reports: Mapping[str, NodeReport]) -> tuple[str, ...]:
    """The "install … first" lines of one change, one per (engine, version), nodes sorted."""
    lacking: dict[tuple[str, str], set[str]] = {}
    for shard in change.shards:
        found = missing(shard, reports.get(shard.node))
        if found is not None:
            lacking.setdefault(found, set()).add(shard.node)
    return tuple(
        f"install {engine} {version} on {', '.join(sorted(nodes))} first: "
        f"llmgw engine install {engine}=={version} {' '.join(sorted(nodes))}"
        for (engine, version), nodes in sorted(lacking.items())
    )


def noted(plan: Plan, reports: Mapping[str, NodeReport]) -> Plan:
    """The plan, each change whose nodes lack its engine version saying so."""
    changes = tuple(
        replace(change, reasons=change.reasons + extra) if (extra := reasons(change, reports))
        else change
        for change in plan.changes
    )
    return replace(plan, changes=changes)
