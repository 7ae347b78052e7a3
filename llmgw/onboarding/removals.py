"""``llmgw node remove``: what draining a node moves, what it would strand, stopping its agent.

The removal itself is run by the CLI (it needs :mod:`llmgw.applying` too):

1. plan with the node *draining* (:func:`draining`): every replica there is
   re-created elsewhere first (create-before-destroy), or, where it fits
   nowhere, stays and is *stranded*;
2. :func:`refusals` — a model whose every replica would be stranded would
   be left unservable: refused unless ``--force``;
3. ``drain: true`` written to nodes.yaml, the moves (:func:`moves`) applied,
   every unit still on the node removed;
4. with ``--stop-agent`` the agent stopped and disabled, with ``--uninstall``
   also what ``node add`` installed deleted, both by the agent itself
   (``Shutdown``, :mod:`llmgw.agent.shutdowns`): the daemon's account has no
   shell; what only root can remove is printed (:func:`left_for_root`);
5. the node's entry and its known_hosts line deleted.

Engine versions the moves need are installed first (:func:`install_needs`).
Every function here but :func:`forget_host` is pure.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path

from llmgw.fleet.types import Fleet, NodeReport
from llmgw.planning import installs
from llmgw.planning.types import Plan
from llmgw.spec.models import Cluster
from llmgw.transport import hostkeys


class RemoveError(Exception):
    """Removing cannot go on; the message says why and what to do."""


def draining(cluster: Cluster, name: str) -> Cluster:
    """``cluster`` with node ``name`` marked ``drain: true`` (and cordoned)."""
    node = cluster.nodes[name].model_copy(update={"drain": True, "cordoned": True})
    return cluster.model_copy(update={"nodes": {**cluster.nodes, name: node}})


def moves(plan: Plan, name: str) -> Plan:
    """``plan`` cut down to the changes that take something off node ``name``."""
    changes = tuple(c for c in plan.changes if any(r.node == name for r in c.removes))
    stuck = tuple(u for u in plan.unplaceable if u.note and f"{name}: draining" in u.wanted)
    # Moves held waiting for an engine install stay: the convergence service installs
    # what they need before it changes anything.
    held = tuple(c for c in plan.awaiting_install if any(r.node == name for r in c.removes))
    return replace(plan, changes=changes, unplaceable=stuck, unknown=(), warnings=(),
                   awaiting_install=held)


@dataclass(frozen=True)
class Stranded:
    """A replica on the node that has nowhere else to go."""

    model: str
    replica: int
    elsewhere: tuple[int, ...]  # the model's replicas on other nodes


def stranded(plan: Plan, fleet: Fleet, cluster: Cluster, name: str) -> list[Stranded]:
    """Replicas on ``name`` that the draining ``plan`` does not move, with what else serves."""
    report = fleet.nodes.get(name)
    here = {(u.model, u.replica) for u in (report.units if report else [])
            if u.model in cluster.models}
    moved = {(c.model, c.replica) for c in plan.changes
             if c.action == "replace" and any(r.node == name for r in c.removes)}
    everywhere: dict[str, set[int]] = {}
    for node, other in fleet.nodes.items():
        for unit in other.units if node != name else []:
            everywhere.setdefault(unit.model, set()).add(unit.replica)
    return [Stranded(model, replica, tuple(sorted(everywhere.get(model, set()) - {
                r for m, r in here if m == model})))
            for model, replica in sorted(here - moved)]


def refusals(found: list[Stranded]) -> list[str]:
    """Why removing would leave a model unservable: one line per such model."""
    lines = []
    for model in sorted({s.model for s in found if not s.elsewhere}):
        mine = [f"r{s.replica}" for s in found if s.model == model]
        lines.append(f"{model}: {', '.join(mine)} {'fits' if len(mine) == 1 else 'fit'} on no "
                     "other node, and no replica runs elsewhere")
    return lines


def forget_host(known_hosts: Path, host: str, port: int) -> bool:
    """Delete ``host:port``'s lines from ``known_hosts``; True when one was there."""
    if not known_hosts.exists():
        return False
    name = hostkeys.entry(host, port)
    lines = known_hosts.read_text().splitlines(keepends=True)
    kept = [line for line in lines if name not in line.split(" ", 1)[0].split(",")]
    if len(kept) == len(lines):
        return False
    known_hosts.write_text("".join(kept))
    return True


def install_needs(plan: Plan, reports: Mapping[str, NodeReport], name: str) -> installs.Lacking:
    """The engine versions the drain of ``name`` needs installed first, and where: what
    its moves' new shards run (and moves held waiting for an install), as ``apply``
    installs them before it changes anything."""
    return installs.needed(moves(plan, name), reports)


def left_for_root(account: str, agent_left: tuple[str, ...]) -> list[str]:
    """What an uninstall leaves for an operator with root on the node: what the agent
    could not delete, then the daemon's account (``node add`` makes it unless the daemon
    logs in as root or as node add's own user; the daemon was logged in as it) and the
    group llmgw, once no other account is in it. Empty: nothing is left."""
    commands = list(agent_left)
    if account != "root":
        commands += [f"userdel -r {account}", "groupdel llmgw  # once no other account is in it"]
    return commands
