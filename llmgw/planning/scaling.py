"""How many replicas each model wants, and which ones may go.

Decisions are made here from the cluster's scaling settings, the router's
:class:`~llmgw.fleet.types.Demand` and ``now`` — never from a clock:

* ``min`` replicas are always wanted; up to ``max`` when demand asks
  (requests waiting, or the router's wanted count).
* Replicas above the wanted count stop when the model has been idle for its
  ``idle_timeout``; without an ``idle_timeout`` they stay. Unknown is not idle:
  unless the replica's agent reports its last use, the router must have watched
  requests for a whole ``idle_timeout`` (``Demand.watched_since``) — a restarted
  daemon, or a plan made outside it, cannot tell a busy replica from an idle one.
* Eviction, when an on-demand model has requests waiting and nowhere to go:
  only single-node replicas of other on-demand (``min: 0``) models, never one
  younger than ``Policy.min_lifetime`` (two on-demand models must not evict
  each other in a loop), never one with no reported use, never one used in
  the last ``Policy.evict_idle`` seconds, one per plan.

Autoscaling (``scaling.target``), from a history of :class:`LoadSample` the
daemon keeps (:mod:`llmgw.daemon.loadhistories`); :func:`decide` is pure too:

* Up when the load per ready replica stayed above the target for all of
  ``up_window``: to ``ceil(ready × lowest / target)``, never beyond ``max``
  (the plan says when ``max`` stops it).
* Down when it stayed below for all of ``down_window`` and no change of the
  replica count came within ``cooldown``: to ``ceil(ready × highest /
  target)``, never under ``min`` nor under one (stopping the last replica is
  the idle timeout's call). The least loaded replica goes first, then the
  youngest, and it is drained first (:attr:`Change.drain`).
* Otherwise the count holds: unknown load, a history shorter than the window
  (a restarted daemon, a plan made outside it), a replica still starting, or
  load that crossed the target within the window (flapping).

A purely computational module with no side effects.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from llmgw.fleet.types import Demand, Fleet
from llmgw.planning.replicas import ObservedReplica
from llmgw.spec.models import Cluster, Model
from llmgw.spec.quantities import format_duration
from llmgw.spec.servings import Scaling, Target


@dataclass(frozen=True)
class Policy:
    """Scaling rules the cluster files do not (yet) expose."""

    min_lifetime: float = 600.0  # seconds an on-demand replica lives before it may be evicted
    evict_idle: float = 300.0  # seconds without requests before a replica may be evicted
    # Place replicas even where a node whose units nobody has seen may run some of the
    # model's (`llmgw apply --force`); what scaling.replace_unreachable allows per model.
    place_unseen: bool = False


@dataclass(frozen=True)
class LoadSample:
    """One model's load as the daemon read it at ``at`` (unix time). A figure is None
    when nothing reported it, never zero."""

    at: float
    ready: int  # replicas ready to serve
    waiting: float | None = None  # engines' queues + routers' queues + waiting for a replica
    in_flight: float | None = None  # requests the routers (else the engines) are serving
    first_token_seconds: float | None = None  # median time to first token, recent requests


@dataclass(frozen=True)
class Decision:
    """What the autoscaler makes of a history: the count, and why."""

    count: int
    reason: str
    warning: str = ""  # the load asks for more than max allows


@dataclass(frozen=True)
class Want:
    count: int
    reason: str  # why this many, for create reasons and unplaceable entries
    down: bool = False  # the autoscaler scales down: the least loaded go, drained
    warning: str = ""  # for the plan's warnings (max reached)
    decided: str = ""  # the autoscaler's decision, scale or hold (with a target only)


def want(
    name: str, model: Model, demand: Demand, running: int,
    history: Sequence[LoadSample] = (), now: float = 0.0, youngest: float | None = None,
) -> Want:
    scaling = model.scaling
    waiting = demand.waiting.get(name, 0)
    asked = demand.wanted.get(name, 0)
    decision = decide(name, scaling, running, history, now, youngest)
    if decision is not None and decision.count != running:
        on_demand = 1 if waiting else 0
        count = max(scaling.min, on_demand, min(decision.count, scaling.max))
        return Want(count, decision.reason, down=count < running, warning=decision.warning,
                    decided=decision.reason)
    warning, decided = (decision.warning, decision.reason) if decision else ("", "")
    count = max(scaling.min, min(max(asked, 1 if waiting else 0), scaling.max))
    if count > scaling.min and waiting and asked <= 1:  # the router asked for nothing more
        reason = (f"on demand: {waiting} request{'s' if waiting != 1 else ''} waiting, "
                  f"{running} running")
    elif count > scaling.min:
        reason = f"demand: the router wants {asked} (max {scaling.max}), {running} running"
    else:
        reason = f"scaling: min {scaling.min}, {running} running"
    return Want(count, reason, warning=warning, decided=decided)


def sample(name: str, cluster: Cluster, fleet: Fleet, demand: Demand, now: float) -> LoadSample:
    """``name``'s load now, from the routers' demand and the engines' own figures.

    Waiting adds the engines' queues (where they report them) to the routers'
    queue and the requests waiting for a replica; in flight is the routers'
    count, else the engines' running requests. With no router watching
    (``watched_since`` None) the router's parts are unknown, not zero.
    """
    ready = 0
    engine_waiting: list[int] = []
    engine_running: list[int] = []
    for report in fleet.nodes.values():
        if not report.reachable:
            continue
        for unit in report.units:
            if unit.model != name or unit.rank != 0 or unit.state != "ready":
                continue
            ready += 1
            if unit.load is not None:
                if unit.load.requests_waiting is not None:
                    engine_waiting.append(unit.load.requests_waiting)
                if unit.load.requests_running is not None:
                    engine_running.append(unit.load.requests_running)
    watched = demand.watched_since is not None
    routed = demand.waiting.get(name, 0) + demand.queued.get(name, 0)
    waiting: float | None = None
    if watched or engine_waiting:
        waiting = float(sum(engine_waiting) + (routed if watched else 0))
    in_flight: float | None = None
    if watched:
        in_flight = float(demand.in_flight.get(name, 0))
    elif engine_running:
        in_flight = float(sum(engine_running))
    first = demand.first_token_seconds.get(name)
    if first is None and watched and not routed and not demand.in_flight.get(name, 0):
        first = 0.0  # no request waits: none waits for its first token
    return LoadSample(now, ready, waiting, in_flight, first)


def per_replica(load: LoadSample, target: Target) -> float | None:
    """The figure ``target`` is compared with: per ready replica (first token as is)."""
    if target.first_token_seconds is not None:
        return load.first_token_seconds if load.ready else None
    total = load.waiting if target.waiting_per_replica is not None else load.in_flight
    return None if total is None or load.ready <= 0 else total / load.ready


def decide(
    name: str, scaling: Scaling, running: int, history: Sequence[LoadSample], now: float,
    youngest: float | None = None,
) -> Decision | None:
    """The replica count ``scaling.target`` asks for at ``now``; None without a target.

    ``history`` is the model's samples, oldest first; ``running`` its replicas now
    (ready or not); ``youngest`` the unix time its newest replica started, for the
    cooldown. A count equal to ``running`` is a hold, and its reason says why.
    """
    target = scaling.target
    if target is None:
        return None

    def hold(why: str, warning: str = "") -> Decision:
        return Decision(running, f"hold {name} at {running}: {why}", warning)

    if not history:
        return hold("no load history (the daemon started, or no daemon watches)")
    latest = history[-1]
    value = per_replica(latest, target)
    if value is None:
        return hold("load unknown (" + ("no replica ready" if not latest.ready
                                         else f"nothing reports {_metric(target)}") + ")")
    if latest.ready < running:
        return hold(f"{latest.ready} of {running} replicas ready")
    up = _over(history, now, scaling.up_window, target, above=True)
    if up is not None and math.isnan(up[1]):
        return hold(f"load unknown during the {format_duration(scaling.up_window)} up_window")
    if up is not None and up[0]:
        lowest = up[1]
        asked = math.ceil(latest.ready * lowest / target.value - 1e-9)
        load = _load(lowest, target, scaling.up_window)
        if asked <= running:
            return hold(f"{load}; {asked} replicas carry it")
        if running >= scaling.max:
            return hold(f"{load}: at max {scaling.max}",
                        f"{name}: {load} asks for {asked} replicas, but scaling.max is "
                        f"{scaling.max}: raise it to serve the load")
        count = min(asked, scaling.max)
        warning = (f"{name}: {load} asks for {asked} replicas; max {scaling.max} reached"
                   if asked > scaling.max else "")
        return Decision(count, f"scale {name} {running} → {count}: {load}"
                        + (f"; max {scaling.max}" if asked > scaling.max else ""), warning)
    covers = f"load history covers {_ago(now - history[0].at)} of the"
    if up is None:
        return hold(f"{covers} {format_duration(scaling.up_window)} up_window")
    now_at = f"{_metric(target)} {_num(value)} (target {_target(target)})"
    down = _over(history, now, scaling.down_window, target, above=False)
    if down is None:
        return hold(f"{now_at}, not above it for all of the up_window; {covers} "
                    f"{format_duration(scaling.down_window)} down_window")
    if math.isnan(down[1]):
        return hold(f"load unknown during the {format_duration(scaling.down_window)} "
                    "down_window")
    if not down[0]:
        return hold(f"{now_at}, not above it for all of the up_window nor below it for all "
                    "of the down_window")
    floor = max(scaling.min, 1)
    highest = down[1]
    count = max(floor, math.ceil(latest.ready * highest / target.value - 1e-9))
    if count >= running:
        return hold(f"at most {_load(highest, target, scaling.down_window)}; "
                    + (f"{running} carry it" if running > floor else f"at the floor {floor}"))
    changed = _last_change(history, youngest)
    if changed is not None and now - changed < scaling.cooldown:
        return hold(f"cooldown: the replica count changed {_ago(now - changed)} ago "
                    f"(cooldown {format_duration(scaling.cooldown)})")
    return Decision(count, f"scale {name} {running} → {count}: at most "
                    f"{_load(highest, target, scaling.down_window)}")


def _over(
    history: Sequence[LoadSample], now: float, window: float, target: Target, *, above: bool,
) -> tuple[bool, float] | None:
    """Whether the load stayed above (below) the target for the whole ``window`` before
    ``now``, and its lowest (highest) value; None when the history is shorter."""
    start = now - window
    if history[0].at > start:
        return None
    # The last sample at or before the window's start stood for the load at its start.
    first = max(i for i, s in enumerate(history) if s.at <= start)
    values = [per_replica(s, target) for s in history[first:] if s.at <= now]
    known = [v for v in values if v is not None]
    if len(known) != len(values):
        return False, math.nan  # unknown for part of the window: neither above nor below
    if above:
        return all(v > target.value for v in known), min(known)
    return all(v < target.value for v in known), max(known)


def _last_change(history: Sequence[LoadSample], youngest: float | None) -> float | None:
    """When the ready count last changed in ``history``, or the youngest replica started."""
    times = [youngest] if youngest is not None else []
    for before, after in zip(history, history[1:], strict=False):
        if before.ready != after.ready:
            times.append(after.at)
    return max(times) if times else None


def _metric(target: Target) -> str:
    return {"waiting_per_replica": "waiting per replica",
            "in_flight_per_replica": "in flight per replica",
            "first_token_seconds": "first token"}[target.name]


def _num(value: float) -> str:
    return f"{round(value, 2):g}"


def _target(target: Target) -> str:
    suffix = " s" if target.first_token_seconds is not None else ""
    return f"{_num(target.value)}{suffix}"


def _load(value: float, target: Target, window: float) -> str:
    """``7 waiting per replica over 60 s (target 2)``."""
    if target.first_token_seconds is not None:
        figure = f"first token in {_num(value)} s"
    else:
        figure = f"{_num(value)} {_metric(target)}"
    return f"{figure} over {_num(window)} s (target {_target(target)})"


def replica_load(replica: ObservedReplica, cluster: Cluster, demand: Demand) -> float | None:
    """Requests on ``replica`` now: the routers' count for its endpoint, else its engine's
    running and waiting requests; None when neither is known."""
    for member in replica.members.values():
        if member.unit.rank != 0 or member.unit.port is None:
            continue
        node = cluster.nodes.get(member.node)
        host = "127.0.0.1" if node is None or node.is_local else node.address
        routed = demand.replica_in_flight.get(f"http://{host}:{member.unit.port}")
        if routed is not None:
            return float(routed)
        load = member.unit.load
        if load is not None and load.requests_running is not None:
            return float(load.requests_running + (load.requests_waiting or 0))
    return None


def down_victims(
    replicas: Sequence[ObservedReplica], extra: int, cluster: Cluster, demand: Demand,
) -> list[ObservedReplica]:
    """The ``extra`` replicas a scale-down stops: the least loaded (unknown load last),
    then the youngest."""
    def key(replica: ObservedReplica) -> tuple[float, float, int]:
        load = replica_load(replica, cluster, demand)
        return (math.inf if load is None else load, -(replica.since() or 0.0), -replica.replica)
    return sorted(replicas, key=key)[:extra]


def last_use(name: str, replica: ObservedReplica, demand: Demand) -> float | None:
    """The latest request this replica's model is known to have served."""
    times = [t for t in (demand.last_used.get(name), replica.last_used()) if t is not None]
    return max(times) if times else None


def idle_reason(
    name: str, model: Model, replica: ObservedReplica, demand: Demand, now: float,
) -> str | None:
    """Why this replica may stop for being idle; None while it may not."""
    timeout = model.scaling.idle_timeout
    if timeout is None or demand.waiting.get(name, 0):
        return None
    used = last_use(name, replica, demand)
    if used is not None and now - used < timeout:
        return None
    watched = demand.watched_since
    if replica.last_used() is None and (watched is None or now - watched < timeout):
        return None  # requests before the router watched are unknown: not idle
    if used is not None:
        return (f"idle: no requests for {_ago(now - used)} "
                f"(idle_timeout {format_duration(timeout)})")
    since = replica.since()
    if since is not None and now - since >= timeout:
        return (f"idle: no requests since it started {_ago(now - since)} ago "
                f"(idle_timeout {format_duration(timeout)})")
    return None  # no use and no start time reported: cannot prove it idle


def evictable(
    name: str, model: Model, replica: ObservedReplica, demand: Demand, now: float,
    policy: Policy,
) -> tuple[bool, str]:
    """Whether this replica may be evicted for another on-demand model, and why (not)."""
    single_node = len(replica.members) == 1 and len(replica.peers or [0]) == 1
    if model.scaling.min > 0:
        return False, f"min {model.scaling.min}"
    if not single_node:
        return False, "spans nodes"
    if demand.waiting.get(name, 0):
        return False, "has requests waiting"
    since = replica.since()
    if since is None:
        return False, "no start time reported"
    if now - since < policy.min_lifetime:
        return False, (f"started {_ago(now - since)} ago (minimum lifetime "
                       f"{format_duration(policy.min_lifetime)})")
    used = last_use(name, replica, demand)
    if used is None:
        return False, "no reported use"
    if now - used < policy.evict_idle:
        return False, f"used {_ago(now - used)} ago"
    return True, f"last request {_ago(now - used)} ago"


def _ago(seconds: float) -> str:
    return format_duration(max(0, round(seconds)))
