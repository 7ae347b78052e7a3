"""``llmgw status``: one line per node and per replica, then the drift.

Until the daemon serves its admin API, this asks the agents directly (the
same collection as ``llmgw inventory``) and prints the compact view, then
every difference between the cluster and the fleet with its class of drift
and what is held instead of repaired (:func:`inventories.render_drift`). When
the daemon answers on its admin listener, the replicas it waits for follow
the replicas ("gemma r3: loading 3m12s of 15m"). With a
PostgreSQL store (several reconcilers, docs/ha.md) it also says which
reconciler leads, from the lease in the store.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from typing import Any

import httpx

from llmgw.cli import clusters, inventories, inventory_cmd, plan_cmd
from llmgw.daemon.leaders import LEASE
from llmgw.planning import plans
from llmgw.spec import statedirs
from llmgw.spec.models import Cluster
from llmgw.store import migrations, stores
from llmgw.store.stores import StoreError


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "status", help="nodes and replicas, one line each",
        description="Compact state of the fleet: each node (up, or why it is unreachable) and "
        "each replica with its shards' states.",
    )
    clusters.add_cluster_flag(parser)
    inventory_cmd.add_timeout_flag(parser)
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    cluster = clusters.load(args.cluster)
    fleet = inventory_cmd.collect(cluster, args.cluster, args.timeout)
    now = time.time()
    sys.stdout.write(inventories.render_status(cluster, fleet, now))
    sys.stdout.write(render_waiting(daemon_waits(cluster)))
    for hold in plan_cmd.read_holds(cluster):
        print(f"{hold.model}: {hold.line()} (`llmgw apply --retry {hold.model}` tries it "
              "again)")
    # The same classification the daemon's plan makes (no router demand here).
    sys.stdout.write(inventories.render_drift(plans.plan(cluster, fleet, now)))
    if cluster.cluster.store.url and not cluster.cluster.store.url.startswith("sqlite"):
        print(leader_line(cluster))
    return 0


def daemon_waits(cluster: Cluster, timeout: float = 2.0) -> list[dict[str, Any]]:
    """What a running ``llmgw serve`` waits for, from its admin API (empty when none runs
    here, or it does not answer: this is a courtesy, not a check)."""
    host, _, port = cluster.cluster.listeners.admin.rpartition(":")
    host = host.strip("[]")
    if host in ("0.0.0.0", "::", ""):
        host = "127.0.0.1"
    token_file = statedirs.admin_token(cluster.cluster)
    try:
        token = token_file.read_text().strip()
        reply = httpx.get(f"http://{host if ':' not in host else f'[{host}]'}:{port}"
                          "/api/v1/status", headers={"Authorization": f"Bearer {token}"},
                          timeout=timeout)
        found = reply.json().get("waiting") if reply.status_code == 200 else None
    except (OSError, httpx.HTTPError, ValueError, AttributeError):
        return []
    return [w for w in found if isinstance(w, dict)] if isinstance(found, list) else []


def render_waiting(waits: list[dict[str, Any]]) -> str:
    """The ``Waiting`` block: each replica the daemon waits for, how long, of how long."""
    lines = [f"  {w.get('line', '')}" + (f" on {w['node']}" if w.get("node") else "")
             for w in waits]
    return "\n".join(["", "Waiting (llmgw serve)", *lines]) + "\n" if lines else ""


def leader_line(cluster: Cluster) -> str:
    """``leader: HOLDER (epoch N, lease 12s left)``, or why nobody is known to lead."""
    async def read() -> str:
        store = await stores.open_store(cluster.cluster.store)
        try:
            grant = await store.lease(LEASE)
        finally:
            await store.close()
        if grant is None:
            return "leader: none (no reconciler holds the lease)"
        return (f"leader: {grant.holder} (epoch {grant.epoch}, lease "
                f"{grant.remaining:.0f}s left)")
    try:
        return asyncio.run(read())
    except (StoreError, migrations.SchemaTooNew) as exc:
        return f"leader: unknown ({exc})"
