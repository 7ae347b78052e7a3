"""What ``llmgw inventory`` and ``llmgw status`` print: a fleet, summarised for people.

Pure functions of (cluster, fleet, now) → text: no I/O, no clock reads, so
the commands and their tests see the same output for the same input. The
figures come from :mod:`llmgw.fleet.summaries` (per node) and
:mod:`llmgw.planning.summaries` (the fleet), which the /admin pages show too;
this module only lays them out as text.

A GPU is *faulty* when it must not get new work (:attr:`Gpu.faults`:
uncorrected ECC errors, memory held by a process llmgw did not start),
*used* when a process llmgw started holds memory on it, *free* otherwise. A
replica's state is its least advanced shard's: one failed shard fails it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from llmgw.engines import installables
from llmgw.fleet import summaries as nodesums
from llmgw.fleet.types import Fleet
from llmgw.planning import drifts, holdings, outputs, summaries
from llmgw.planning.summaries import STATE_ORDER, Shard, gpu_counts, replicas
from llmgw.planning.types import Plan
from llmgw.spec.models import Cluster

__all__ = ["gpu_counts", "render_inventory", "render_status", "replicas"]

def render_inventory(cluster: Cluster, fleet: Fleet, now: float) -> str:
    """The full inventory: nodes, GPUs by class, faults, fabrics, replicas, unreachable nodes."""
    reachable = [r for r in fleet.nodes.values() if r.reachable]
    down = [r for r in fleet.nodes.values() if not r.reachable]
    lines = [
        f"Cluster {cluster.cluster.name}: {nodesums.count(len(fleet.nodes), 'node')}, "
        f"{len(reachable)} reachable, {len(down)} unreachable",
        "",
    ]
    rows = [["NODE", "ADDRESS", "GPUS", "CPUS", "MEMORY", "FABRICS", "UNITS"]]
    for node in nodesums.node_rows(cluster, fleet, now):
        if not node.reachable:
            rows.append([node.name, node.address, "-", "-", "-", "-", "unreachable"])
            continue
        rows.append([
            node.name + (f" ({node.flag})" if node.flag else ""),
            node.address,
            node.gpus,
            _unknown(node.cpu_count),
            nodesums.size(node.memory_total_bytes),
            ", ".join(node.fabrics) or "-",
            str(node.units),
        ])
    lines += _table(rows)

    counts = gpu_counts(fleet)
    if counts:
        lines += ["", "GPUs by class"]
        table = [["CLASS", "TOTAL", "USED", "FREE", "FAULTY"]]
        table += [[name, str(c.total), str(c.used), str(c.free), str(c.faulty)]
                  for name, c in counts.items()]
        lines += _table(table)

    faults = [f"  {name}: {fault}" for name, report in sorted(fleet.nodes.items())
              for gpu in report.gpus for fault in gpu.faults]
    if faults:
        lines += ["", "GPU faults (no new work is placed on these)", *faults]
    node_faults = [f"  {name}: {fault}" for name, report in sorted(fleet.nodes.items())
                   for fault in report.faults]
    if node_faults:
        lines += ["", "Node faults", *node_faults]

    fabric_lines = _fabrics(cluster, fleet)
    if fabric_lines:
        lines += ["", "Fabrics", *fabric_lines]

    found = replicas(fleet)
    lines += ["", f"Replicas ({len(found)})" if found else "Replicas: none running"]
    if found:
        table = [["MODEL", "REPLICA", "STATE", "SHARDS"]]
        for replica in found:
            table.append([replica.model, f"r{replica.replica}", replica.state,
                          ", ".join(_shard(s, now) for s in replica.shards)])
        lines += _table(table)
        for replica in found:
            for shard in replica.shards:
                if shard.unit.state == "failed":
                    lines += _failure(shard)

    lines += _fetches(fleet)

    if down:
        lines += ["", "Unreachable nodes"]
        lines += [f"  {r.node}: {r.error}" for r in sorted(down, key=lambda r: r.node)]
    warnings = [f"  {r.node}: {w}" for r in reachable for w in r.warnings]
    if warnings:
        lines += ["", "Warnings", *warnings]
    return "\n".join(lines) + "\n"


def render_status(cluster: Cluster, fleet: Fleet, now: float,
                  summary: summaries.Summary | None = None) -> str:
    """One line per node, then one per replica, then capacity, free nodes and idle
    replicas: the compact view of :func:`llmgw.planning.summaries.summarize`."""
    summary = summary or summaries.summarize(cluster, fleet, now)
    found = summary.replicas
    down = len(summary.unreachable)
    states = ", ".join(f"{n} {s}" for s, n in summary.by_state.items())
    lines = [
        f"{cluster.cluster.name}: {nodesums.count(len(fleet.nodes), 'node')}"
        + (f" ({down} unreachable)" if down else "")
        + f", {nodesums.count(len(found), 'replica')}" + (f" ({states})" if states else "")
    ]
    rows = []
    for node in nodesums.node_rows(cluster, fleet, now):
        if not node.reachable:
            # What to check after the reason's first clause is in `llmgw inventory`.
            rows.append([node.name, "DOWN", node.reason])
            continue
        gpus = node.gpus + (f" ({node.faulty} faulty)" if node.faulty else "")
        rows.append([node.name, "up", f"{gpus}, {nodesums.count(node.units, 'unit')}"])
    lines += _table(rows, header=False)
    if found:
        rows = [[r.model, f"r{r.replica}", r.state, ", ".join(_shard(s, now) for s in r.shards)]
                for r in found]
        lines += _table(rows, header=False)
    if summary.capacity:
        lines.append("GPUs: " + "; ".join(
            f"{name} {c.used} used, {c.free} free" + (f", {c.faulty} faulty" if c.faulty else "")
            for name, c in summary.capacity.items()))
    for fabric, free in summary.free_nodes.items():
        lines.append(f"free whole nodes on {fabric}: {len(free)}"
                     + (f" ({', '.join(free)})" if free else ""))
    for idle in summary.idle:
        since = ("never used" if idle.unused_for is None
                 else f"unused {nodesums.age(idle.unused_for)}")
        lines.append(f"idle: {idle.replica.model} r{idle.replica.replica} holds "
                     f"{nodesums.count(idle.replica.gpu_count, 'GPU')}, {since}")
    lines += _fetches(fleet)
    lines += render_holdings(holdings.holdings(cluster, fleet))
    return "\n".join(lines) + "\n"


def _held(item: holdings.Held) -> list[str]:
    models = ", ".join(item.models) or "(no model)"
    return [models, item.name, nodesums.size(item.size_bytes)]


def render_holdings(found: holdings.Holdings) -> list[str]:
    """Per fabric its shared stores and what each holds, then each node's own copies."""
    if not found:
        return []
    lines = ["", "Weights"]
    for store in found.stores:
        where = sorted({d for _, d in store.dirs})
        lines.append(f"  {store.fabric}: shared {store.fs_type} {store.source} at "
                     f"{', '.join(where)}, mounted by {', '.join(store.nodes)}")
        rows = [["", *_held(item)] for item in store.held]
        lines += _table(rows, header=False) if rows else ["    holds nothing yet"]
    for node, held in found.local:
        lines.append(f"  {node}: local")
        lines += _table([["", *_held(item)] for item in held], header=False)
    lines += [f"  {node}: {why}" for node, why in found.alone]
    return lines


def _fetches(fleet: Fleet) -> list[str]:
    """Downloads under way or failed, per node: enough to tell a slow fetch from a wedged one."""
    lines = []
    for name, report in sorted(fleet.nodes.items()):
        for fetch in report.fetches:
            if fetch.state == "done":
                continue
            total = nodesums.size(fetch.bytes_total)
            rate = f" at {nodesums.size(int(fetch.rate_bps))}/s" if fetch.rate_bps else ""
            why = f": {fetch.error}" if fetch.error else ""
            lines.append(f"  {name}: {fetch.kind} {fetch.target} {fetch.state}, "
                         f"{nodesums.size(fetch.bytes_done)} of {total}{rate}{why}")
    return ["", "Fetches", *lines] if lines else []


def _state_key(item: tuple[str, int]) -> int:
    return STATE_ORDER.index(item[0]) if item[0] in STATE_ORDER else -1


def _fabrics(cluster: Cluster, fleet: Fleet) -> list[str]:
    lines = []
    for name, fabric in sorted(cluster.fabrics.items()):
        members = [n for n, node in sorted(cluster.nodes.items()) if name in node.fabrics]
        up, out = [], []
        for node in members:
            state = nodesums.fabric_state(fleet.nodes.get(node), name)
            if state.condition == "unreachable":
                out.append(f"{node} (unreachable)")
            elif state.condition == "advertised":
                up.append(f"{node} ({state.text})")
            else:
                out.append(f"{node}: {state.text}")
        lines.append(f"  {name} ({fabric.kind}): advertised by " + (", ".join(up) or "no node"))
        lines += [f"    not advertised: {o}" for o in out]
    return lines


def _failure(shard: Shard) -> list[str]:
    unit = shard.unit
    head = f"  {unit.name} on {shard.node} failed" + (f": {unit.detail}" if unit.detail else "")
    return [head, *(f"    | {line}" for line in unit.log_tail[-10:])]


def _shard(shard: Shard, now: float) -> str:
    unit = shard.unit
    port = f":{unit.port}" if unit.port else ""
    age = f" {nodesums.age(now - unit.since)}" if unit.since is not None else ""
    return f"{shard.node}{port} s{unit.rank} {unit.state}{age}"






def _table(rows: Sequence[Sequence[str]], *, header: bool = True) -> list[str]:
    if not rows:
        return []
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    out = []
    for row in rows:
        cells = [cell.ljust(width) for cell, width in zip(row, widths, strict=True)]
        out.append(("" if header else "  ") + "  ".join(cells).rstrip())
    return out




def _unknown(value: object) -> str:
    return "?" if value is None else str(value)






def render_drift(plan: Plan) -> str:
    """The ``Drift`` block of ``llmgw status``: every difference between the cluster and the
    fleet with its class (:mod:`llmgw.planning.drifts`), what llmgw will do about it, and
    what it holds instead of repairing. Empty when the fleet matches the cluster."""
    lines = []
    for change in plan.changes:
        what = outputs.headline(change).split(" will ", 1)[-1]
        why = change.evidence[0] if change.evidence else "; ".join(change.reasons)
        lines.append(f"  {outputs.symbol(change)} {change.model} r{change.replica} "
                     f"({drifts.title(change.drift)}): will {what}: {why}")
    for held in plan.held:
        lines.append(f"  = {held.model} r{held.replica} on {', '.join(held.nodes)} "
                     f"({drifts.title(held.drift)}): held: {'; '.join(held.reasons)}")
        lines += [f"      {line}" for line in held.evidence]
    for unknown in plan.unknown:
        lines.append(f"  ? {unknown.model} r{unknown.replica} on {', '.join(unknown.nodes)} "
                     f"(node lost): {'; '.join(unknown.reasons)}")
    return "\n".join(["", "Drift", *lines]) + "\n" if lines else ""


def render_engine_installs(cluster: Cluster, fleet: Fleet, served: Any = None) -> str:
    """The ``Engines`` block: per engine of ``engines:`` and node, installed, installing, or
    why not. The daemon's own states (``served``: an install under way, a failure waiting
    for its retry) win over what the report alone says."""
    daemon: dict[tuple[str, str, str], str] = {}
    for item in served if isinstance(served, list) else []:
        if isinstance(item, dict) and all(isinstance(item.get(k), str) for k in (
                "engine", "version", "node", "state", "reason")):
            fix = f" (fix: {item['fix']})" if item.get("fix") else ""
            daemon[(item["engine"], item["version"], item["node"])] = (
                f"{item['state']}: {item['reason']}{fix}")
    lines = []
    for engine, declared in cluster.engines.declared():
        lines.append(f"  {engine} {declared.version} (install: {declared.install})")
        width = max((len(n) for n in cluster.nodes), default=0)
        for node in sorted(cluster.nodes):
            said = daemon.get((engine, declared.version, node))
            if said is None:
                verdict = installables.check(engine, declared.version, node,
                                             fleet.nodes.get(node))
                fix = f" (fix: {verdict.fix})" if verdict.fix else ""
                said = f"{verdict.state}: {verdict.reason}{fix}"
            lines.append(f"    {node:<{width}}  {said}")
    return "\n".join(["", "Engines", *lines]) + "\n" if lines else ""
