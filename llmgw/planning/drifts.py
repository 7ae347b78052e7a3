"""Classified drift: every difference between the cluster and the fleet gets a class.

The classes, and the evidence in the agents' reports that tells each apart:

``declared_change``
    The cluster (its git revision) asks for something else: a unit's
    ``X-Llmgw-Spec`` label differs from the spec the plan builds, a model or
    node left the cluster, scaling wants more or fewer replicas. Evidence:
    the change's reasons (:func:`llmgw.planning.diffs.explain`).
``engine_crash``
    A unit failed, or its engine ended abnormally: a non-zero exit status,
    or a signal nobody stops a service by (SIGKILL, SIGSEGV, SIGABRT).
    Evidence: ``Unit.last_exit``, ``last_exit_at``, ``restarts``, ``crashes``.
``hardware_fault``
    A GPU the replica holds has uncorrected ECC errors, is in MIG mode, or
    is gone; a fabric a multi-node replica runs over is not advertised.
    Evidence: ``Gpu.ecc_uncorrected``, ``Gpu.mig_mode``, the GPU's UUID
    missing from the report, ``FabricStatus.advertised``.
``foreign_process``
    A process llmgw did not start holds memory on a GPU the replica holds,
    or listens on a port its engine is given (the engine cannot bind).
    Evidence: ``GpuProcess.owned_by_llmgw`` false; ``Unit.port_holder``.
``stopped_by_hand``
    A unit stopped by a signal or ``systemctl stop`` llmgw did not send, or a
    shard whose unit is gone from a node that answers. Evidence:
    ``Unit.stopped_by == "operator"``; a rank the replica's spec names that
    its node does not report.
``stranger_unit``
    A unit named like llmgw's that no llmgw agent wrote. Evidence:
    ``Unit.written_by_llmgw`` false (the agent's ledger holds no digest that
    matches the unit file).
``node_lost``
    The node does not answer, or never reported. Evidence:
    ``NodeReport.reachable`` false. Never repaired: its replicas are unknown,
    and never placed a second time.
``agent_restarted``
    The unit does not run because its engine ended while no agent watched,
    or the node rebooted and nothing has started it since. Evidence:
    ``Unit.last_exit == UNSEEN_EXIT``; a stopped unit with no exit since
    ``NodeReport.agent_started_at`` (a new ``boot_id`` after a reboot).

Where a replica shows several, the first that applies in this order wins:
hardware fault, foreign process, then its units' troubles (agent restarted,
stopped by hand, engine crash); whatever else changes is a declared change.

What is repaired is the cluster's to say (``cluster.drift``): a class whose
``repair`` is false is *held* — shown in the plan, status and metrics, not
repaired — and an engine that crashed ``crash_loop.crashes`` times within
``crash_loop.window`` is held too: stopped if its agent is still restarting
it, not restarted if it is down, until fewer crashes fall in the window;
every shard of a multi-node replica is held, on each node that answers.

A purely computational module with no side effects: ``now`` is an argument.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

from llmgw.fleet.types import UNSEEN_EXIT, Fleet, NodeReport, Unit
from llmgw.planning import replicas
from llmgw.planning.replicas import ObservedReplica
from llmgw.planning.types import Change, Held, ObservedShard, Plan
from llmgw.spec.models import Cluster
from llmgw.spec.quantities import format_duration
from llmgw.spec.repairs import CrashLoop, DriftSettings

KINDS = (
    "declared_change", "engine_crash", "hardware_fault", "foreign_process", "stopped_by_hand",
    "stranger_unit", "node_lost", "agent_restarted",
)
# A replica's unit troubles, the first that applies winning.
_TROUBLES = ("agent_restarted", "stopped_by_hand", "engine_crash")


def title(kind: str) -> str:
    """``engine_crash`` → ``engine crash``: the class as plans and status print it."""
    return kind.replace("_", " ")


@dataclass(frozen=True)
class Finding:
    kind: str
    evidence: tuple[str, ...] = ()


# -- evidence → class -----------------------------------------------------------


def unit_finding(node: str, unit: Unit, report: NodeReport | None, now: float) -> Finding | None:
    """The class of a unit that does not run as it should; None while it does.

    A unit still starting counts only when its agent saw it crash (it is
    restarting it): that is what a crash loop is made of.
    """
    where = f"{node}: {unit.name}"
    ended = _ended(unit, now)
    if unit.last_exit == UNSEEN_EXIT and unit.state in ("failed", "stopped", "starting"):
        started = report.agent_started_at if report else None
        return Finding("agent_restarted", (f"{where}: its engine {UNSEEN_EXIT}; the agent "
                                           f"started {_ago(now, started)}",))
    if unit.state == "stopped":
        if unit.stopped_by == "operator":
            return Finding("stopped_by_hand", (f"{where} stopped by someone other than llmgw"
                                               f"{ended}",))
        if unit.stopped_by == "llmgw":
            return Finding("engine_crash", (f"{where} held stopped by llmgw{_crashes(unit, now)}",))
        if not unit.last_exit and report is not None and report.agent_started_at is not None:
            booted = f"the node booted {_ago(now, report.booted_at)}, " if report.booted_at else ""
            return Finding("agent_restarted", (
                f"{where} has not run since its agent started ({booted}the agent "
                f"{_ago(now, report.agent_started_at)})",))
        return Finding("stopped_by_hand", (f"{where} stopped (its agent does not say by whom)",))
    if unit.state == "failed":
        extra = f"{ended}{_restarts(unit)}{_crashes(unit, now)}"  # none from older agents
        return Finding("engine_crash", (f"{where} failed{extra}",) if extra else ())
    if unit.crashes and unit.state in ("starting", "loading"):
        return Finding("engine_crash", (f"{where} restarting{ended}{_restarts(unit)}"
                                        f"{_crashes(unit, now)}",))
    return None


def replica_finding(
    replica: ObservedReplica, reports: Mapping[str, NodeReport], now: float,
) -> Finding | None:
    """The class of what is wrong with a running replica; None when nothing is."""
    hardware: list[str] = []
    foreign: list[str] = []
    for _, member in sorted(replica.members.items()):
        report = reports.get(member.node)
        if report is None or not report.reachable:
            continue
        spec = member.spec or {}
        by_uuid = {g.uuid: g for g in report.gpus}
        for uuid in spec.get("gpus") or []:
            gpu = by_uuid.get(str(uuid))
            if gpu is None:
                hardware.append(f"{member.node}: GPU {uuid} is gone")
                continue
            if gpu.ecc_uncorrected:
                hardware.append(f"{member.node}: GPU {gpu.index} has {gpu.ecc_uncorrected} "
                                "uncorrected ECC errors")
            if gpu.mig_mode == "Enabled":
                hardware.append(f"{member.node}: GPU {gpu.index} is in MIG mode")
            for process in gpu.processes:
                if not process.owned_by_llmgw:
                    name = f" ({process.name})" if process.name else ""
                    foreign.append(f"{member.node}: GPU {gpu.index} has memory held by pid "
                                   f"{process.pid}{name}, not started by llmgw")
        if member.unit.port_holder:
            foreign.append(f"{member.node}: port {member.unit.port} is held by "
                           f"{member.unit.port_holder}, not started by llmgw")
        fabric = spec.get("fabric")
        if fabric and len(replica.peers or []) > 1 and fabric not in report.advertised_fabrics:
            status = next((f for f in report.fabrics if f.name == fabric), None)
            why = "; ".join(status.reasons) if status and status.reasons else "not advertised"
            hardware.append(f"{member.node}: fabric {fabric} is down: {why}")
    if hardware:
        return Finding("hardware_fault", tuple(hardware))
    if foreign:
        return Finding("foreign_process", tuple(foreign))
    found: list[Finding] = []
    for _, member in sorted(replica.members.items()):
        if member.reachable:
            finding = unit_finding(member.node, member.unit, reports.get(member.node), now)
            if finding is not None:
                found.append(finding)
    for rank, node in replica.missing():
        report = reports.get(node)
        if report is not None and report.reachable:
            found.append(Finding("stopped_by_hand", (f"{node}: shard {rank} is gone (its unit "
                                                     "was removed)",)))
    restarted = replica.restarted_alone()
    if restarted:
        found.append(Finding("engine_crash", tuple(restarted)))
    for kind in _TROUBLES:
        if any(f.kind == kind for f in found):
            return Finding(kind, tuple(line for f in found if f.kind == kind
                                       for line in f.evidence))
    return None


def blind_nodes(cluster: Cluster, reports: Mapping[str, NodeReport]) -> list[str]:
    """Warnings about nodes whose replicas the plan cannot see (lost, or never reported),
    and fabrics running on fewer adapters than declared."""
    warnings = []
    for name in sorted(cluster.nodes):
        report = reports.get(name)
        if report is None:
            warnings.append(f"{name}: no report from its agent; replicas there, if any, cannot "
                            "be seen")
        elif not report.units_known:
            warnings.append(f"{name}: unreachable and no earlier report of its units; replicas "
                            "there, if any, cannot be seen")
        elif report.reachable:
            for status in report.fabrics:
                if status.advertised and len(status.adapters) < status.declared_adapters:
                    warnings.append(f"{name}: fabric {status.name} has {status.active}")
    return warnings


def stranger(unit: Unit) -> bool:
    """Whether a unit is a stranger: named like llmgw's, written by no llmgw agent."""
    return unit.written_by_llmgw is False


def crash_loop(replica: ObservedReplica, rule: CrashLoop | None, now: float) -> str:
    """Why a crashing replica is held (``rule`` met by one of its units), or ""."""
    if rule is None:
        return ""
    since = now - rule.window
    for _, member in sorted(replica.members.items()):
        recent = [t for t in member.unit.crashes if since < t <= now]
        if len(recent) >= rule.crashes:
            return (f"crash loop: {member.node}: {member.unit.name} crashed {len(recent)} times "
                    f"in the last {format_duration(rule.window)} (crash_loop: {rule.crashes} in "
                    f"{format_duration(rule.window)}); held, not restarted, until fewer crashes "
                    "fall in that window or the spec changes")
    return ""


def repairs(settings: DriftSettings, kind: str) -> bool:
    """Whether the cluster lets llmgw repair drift of ``kind``."""
    setting = getattr(settings, kind, None)
    return bool(getattr(setting, "repair", True))


def kept_strangers(cluster: Cluster, fleet: Fleet) -> frozenset[tuple[str, str]]:
    """(node, unit) of the strangers the plan must leave alone: their repair is off."""
    if repairs(cluster.cluster.drift, "stranger_unit"):
        return frozenset()
    return frozenset((node, unit.name) for node, unit in fleet.units()
                     if stranger(unit) and fleet.nodes[node].reachable)


# -- the plan, classified ---------------------------------------------------------


def settle(plan: Plan, cluster: Cluster, fleet: Fleet, now: float,
           observed: Mapping[tuple[str, int], ObservedReplica] | None = None) -> Plan:
    """``plan`` with each change's class and evidence, and what is held instead of repaired.

    A change whose class the cluster does not let llmgw repair is taken out
    of the plan and listed as held, with the reason; so is a restart of an
    engine in a crash loop. A crash loop its agents are still restarting gets
    a ``hold`` change that stops every shard still running or restarting on
    a node that answers (their files stay), also when the plan's restart of
    its failed or stopped shards is what was held: a multi-node replica is
    held whole, not half of it. A node that does not answer is left alone.
    """
    settings = cluster.cluster.drift
    if observed is None:  # the planner passes what it collected from the same fleet
        observed = replicas.collect(cluster, fleet).replicas
    findings = {key: replica_finding(r, fleet.nodes, now) for key, r in observed.items()}
    kept: list[Change] = []
    held: list[Held] = []
    touched: set[tuple[str, int]] = set()
    holds: list[Change] = []
    for change in plan.changes:
        key = (change.model, change.replica)
        touched.add(key)
        finding = _classify(change, findings.get(key), observed.get(key), fleet)
        change = replace(change, drift=finding.kind, evidence=finding.evidence)
        nodes = _nodes(change)
        if finding.kind != "declared_change" and not repairs(settings, finding.kind):
            held.append(Held(change.model, change.replica, finding.kind, nodes,
                             (_off(finding.kind),), finding.evidence))
            continue
        loop = crash_loop(observed[key], settings.engine_crash.crash_loop, now) if (
            finding.kind == "engine_crash" and change.action in ("restart", "replace")) else ""
        if loop:
            # The restart names only the shards that are down; the hold covers them all.
            replica = observed[key]
            nodes = tuple(sorted(set(nodes) | {m.node for m in replica.members.values()}))
            held.append(Held(change.model, change.replica, finding.kind, nodes, (loop,),
                             finding.evidence))
            holds += _hold(key, replica, loop, finding)  # the plan restarts a replica once
            continue
        kept.append(change)
    for key, replica in observed.items():
        found = findings[key]
        if key in touched or found is None or found.kind != "engine_crash":
            continue
        loop = crash_loop(replica, settings.engine_crash.crash_loop, now)
        if not loop:
            continue
        nodes = tuple(sorted({m.node for m in replica.members.values()}))
        held.append(Held(key[0], key[1], "engine_crash", nodes, (loop,), found.evidence))
        holds += _hold(key, replica, loop, found)
    held += _kept_strangers(cluster, fleet)
    destroys = [c for c in kept if c.action == "destroy"]
    rest = [c for c in kept if c.action != "destroy"]
    return replace(plan, changes=tuple(destroys + holds + rest),
                   held=tuple(sorted(held, key=lambda h: (h.model, h.replica))))


def events(plan: Plan) -> list[tuple[str, str, str]]:
    """(class, node, what) of every drift in ``plan``: changes, held replicas, unknown ones.

    ``what`` names the replica (``tiny r0``); metrics count each once while it lasts.
    """
    found: set[tuple[str, str, str]] = set()
    for change in plan.changes:
        for node in _nodes(change):
            found.add((change.drift, node, f"{change.model} r{change.replica}"))
    for entry in plan.held:
        for node in entry.nodes:
            found.add((entry.drift, node, f"{entry.model} r{entry.replica}"))
    for unknown in plan.unknown:
        for node in unknown.nodes:
            found.add(("node_lost", node, f"{unknown.model} r{unknown.replica}"))
    return sorted(found)


def _classify(
    change: Change, finding: Finding | None, replica: ObservedReplica | None, fleet: Fleet,
) -> Finding:
    if change.action == "destroy":
        strangers = [f"{s.node}: {s.unit} was not written by llmgw (no agent's ledger "
                     "matches its file)" for s in change.removes
                     if stranger(_unit(fleet, s.node, s.unit))]
        return Finding("stranger_unit", tuple(strangers)) if strangers else Finding(
            "declared_change")
    if finding is None or change.action == "create":
        return Finding("declared_change")
    if change.action == "restart" or finding.kind in ("hardware_fault", "foreign_process"):
        return finding
    # A replace whose replica is also in trouble: the trouble is the cause only when
    # the plan gives no other reason (no field of its spec changed).
    if replica is not None and set(change.reasons) <= _trouble_reasons(replica):
        return finding
    return Finding("declared_change")


def _trouble_reasons(replica: ObservedReplica) -> set[str]:
    """The reasons the planner gives for a replica's troubles, and nothing else."""
    lines = {replicas.failure(m) for m in replica.members.values()
             if m.unit.state in ("failed", "stopped")}
    lines |= {f"shard {rank} missing on {node}" for rank, node in replica.missing()}
    lines |= set(replica.restarted_alone())
    return lines | {"its spec is unknown (no X-Llmgw-Spec label)"}


def _hold(
    key: tuple[str, int], replica: ObservedReplica, loop: str, finding: Finding,
) -> list[Change]:
    """The ``hold`` that stops every shard of a crash-looping replica its agent still runs
    or restarts, on nodes that answer (a node that does not is left alone); [] when none."""
    running = tuple(_observed(m.node, m.unit) for _, m in sorted(replica.members.items())
                    if m.reachable and m.unit.state not in ("stopped", "failed"))
    if not running:
        return []
    return [Change("hold", key[0], key[1], (loop,), removes=running, drift="engine_crash",
                   evidence=finding.evidence)]


def _kept_strangers(cluster: Cluster, fleet: Fleet) -> list[Held]:
    out = []
    for node, name in sorted(kept_strangers(cluster, fleet)):
        unit = _unit(fleet, node, name)
        out.append(Held(unit.model, unit.replica, "stranger_unit", (node,),
                        (_off("stranger_unit"),),
                        (f"{node}: {name} was not written by llmgw (no agent's ledger matches "
                         "its file)",)))
    return out


def _off(kind: str) -> str:
    return f"repair of {title(kind)} is off (cluster.drift.{kind}.repair: false)"


def _nodes(change: Change) -> tuple[str, ...]:
    return tuple(sorted({shard.node for shard in change.shards}
                        | {shard.node for shard in change.removes}))


def _unit(fleet: Fleet, node: str, name: str) -> Unit:
    report = fleet.nodes.get(node)
    for unit in report.units if report else ():
        if unit.name == name:
            return unit
    return Unit(name=name, model="", replica=0, digest="", state="unknown")


def _observed(node: str, unit: Unit) -> ObservedShard:
    return ObservedShard(node=node, unit=unit.name, rank=unit.rank, digest=unit.digest,
                         state=unit.state, port=unit.port, detail=unit.detail)


def _ago(now: float, then: float | None) -> str:
    if then is None:
        return "at an unknown time"
    seconds = max(0.0, now - then)
    return f"{format_duration(round(seconds))} ago" if seconds >= 1 else "just now"


def _ended(unit: Unit, now: float) -> str:
    if not unit.last_exit:
        return ""
    return f" ({unit.last_exit}, {_ago(now, unit.last_exit_at)})"


def _restarts(unit: Unit) -> str:
    if not unit.restarts:
        return ""
    return f", restarted {unit.restarts} time{'s' if unit.restarts != 1 else ''}"


def _crashes(unit: Unit, now: float) -> str:
    if not unit.crashes:
        return ""
    count = len(unit.crashes)
    return (f", {count} crash{'es' if count != 1 else ''} since "
            f"{_ago(now, unit.crashes[0])}")
