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

A purely computational module with no side effects.
"""

from __future__ import annotations

from dataclasses import dataclass

from llmgw.fleet.types import Demand
from llmgw.planning.replicas import ObservedReplica
from llmgw.spec.models import Model
from llmgw.spec.quantities import format_duration


@dataclass(frozen=True)
class Policy:
    """Scaling rules the cluster files do not (yet) expose."""

    min_lifetime: float = 600.0  # seconds an on-demand replica lives before it may be evicted
    evict_idle: float = 300.0  # seconds without requests before a replica may be evicted
    # Place replicas even where a node whose units nobody has seen may run some of the
    # model's (`llmgw apply --force`); what scaling.replace_unreachable allows per model.
    place_unseen: bool = False


@dataclass(frozen=True)
class Want:
    count: int
    reason: str  # why this many, for create reasons and unplaceable entries


def want(name: str, model: Model, demand: Demand, running: int) -> Want:
    scaling = model.scaling
    waiting = demand.waiting.get(name, 0)
    asked = demand.wanted.get(name, 0)
    count = max(scaling.min, min(max(asked, 1 if waiting else 0), scaling.max))
    if count > scaling.min and waiting and asked <= 1:  # the router asked for nothing more
        reason = (f"on demand: {waiting} request{'s' if waiting != 1 else ''} waiting, "
                  f"{running} running")
    elif count > scaling.min:
        reason = f"demand: the router wants {asked} (max {scaling.max}), {running} running"
    else:
        reason = f"scaling: min {scaling.min}, {running} running"
    return Want(count, reason)


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
