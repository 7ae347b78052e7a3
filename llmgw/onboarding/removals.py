"""``llmgw node remove``: what draining a node moves, what it would strand, stopping its agent.

The removal itself is run by the CLI (it needs :mod:`llmgw.applying` too):

1. plan with the node *draining* (:func:`draining`): every replica there is
   re-created elsewhere first (create-before-destroy), or, where it fits
   nowhere, stays and is *stranded*;
2. :func:`refusals` — a model whose every replica would be stranded would
   be left unservable: refused unless ``--force``;
3. ``drain: true`` written to nodes.yaml, the moves (:func:`moves`) applied,
   every unit still on the node removed;
4. the node's entry and its known_hosts line deleted; with ``--stop-agent``
   (:func:`stop_agent`) the agent stopped and disabled, with ``--uninstall``
   also what ``node add`` installed deleted.

Everything but :func:`stop_agent` is pure.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, replace
from pathlib import Path

import asyncssh

from llmgw.fleet.types import Fleet
from llmgw.planning.types import Plan
from llmgw.spec.models import Cluster
from llmgw.transport import hostkeys

SAFE_PATH = re.compile(r"^(/[A-Za-z0-9._+-]+)+$")


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
    return replace(plan, changes=changes, unplaceable=stuck, unknown=(), warnings=())


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


# The prefix `node add` installed into, read back from the unit it wrote
# (systemd's copy, else the supervise backend's under the socket's prefix).
FIND_PREFIX = (r"sed -n 's|^ExecStart=\(/[^ ]*\)/venv/bin/llmgw agent serve .*|\1|p' "
               "/etc/systemd/system/llmgw-agent.service {fallback} 2>/dev/null | head -n1")


async def stop_agent(cluster: Cluster, cluster_dir: Path, name: str, *,
                     uninstall: bool) -> str:
    """Stop (and disable) node ``name``'s agent over SSH; with ``uninstall``, delete what
    ``node add`` installed. Returns what was done, for one line of output."""
    node = cluster.nodes[name]
    settings = cluster.cluster
    socket = node.agent_socket or settings.agent_socket
    supervised = socket.endswith("/run/agent.sock")
    fallback = shlex.quote(socket.removesuffix("/run/agent.sock") + "/etc/llmgw-agent.service") \
        if supervised else ""

    def resolve(path: str) -> str:
        expanded = Path(path).expanduser()
        return str(expanded if expanded.is_absolute() else cluster_dir / expanded)

    keys = ({"client_keys": [resolve(settings.ssh.identity_file)]}
            if settings.ssh.identity_file else {})
    try:
        async with asyncssh.connect(
                node.address, port=node.ssh_port or settings.ssh.port,
                username=settings.ssh.user, known_hosts=resolve(settings.ssh.known_hosts),
                agent_path=None, connect_timeout=settings.ssh.connect_timeout,
                **keys) as conn:
            found = await conn.run(FIND_PREFIX.format(fallback=fallback), check=False)
            prefix = str(found.stdout).strip()
            if not SAFE_PATH.match(prefix) or prefix.count("/") < 2:
                raise RemoveError(f"{name}: no agent installed by `llmgw node add` found (no "
                                  "llmgw-agent.service naming its prefix); stop it by hand")
            sudo = "" if settings.ssh.user == "root" else "sudo -n "
            quoted = shlex.quote(prefix)
            stop = (f"if [ -d /run/systemd/system ] && [ -e /etc/systemd/system/llmgw-agent."
                    f"service ]; then {sudo}systemctl disable --now llmgw-agent && "
                    f"{sudo}rm -f /etc/systemd/system/llmgw-agent.service && "
                    f"{sudo}systemctl daemon-reload; else pid=$(cat {quoted}/run/agent.pid "
                    f"2>/dev/null) && kill $pid 2>/dev/null; while kill -0 \"$pid\" "
                    f"2>/dev/null; do sleep 0.1; done; rm -f {quoted}/run/agent.pid; fi")
            if uninstall:
                stop += (f" && test -x {quoted}/venv/bin/llmgw && test -f {quoted}/etc/agent."
                         f"yaml && {sudo}rm -rf {quoted}")
            result = await conn.run(stop, check=False)
            if result.exit_status != 0:
                raise RemoveError(f"{name}: stopping the agent failed: "
                                  f"{str(result.stderr).strip()[-300:] or result.exit_status}")
            return (f"stopped, and {prefix} deleted" if uninstall
                    else f"stopped and disabled (still installed in {prefix})")
    except (OSError, asyncssh.Error) as exc:
        raise RemoveError(f"{name}: cannot log in to stop the agent: {exc}") from None
