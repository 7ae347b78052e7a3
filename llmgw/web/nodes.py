"""/admin/nodes and /admin/nodes/<node>: every node and what each fabric holds, and one
node with its GPUs, for admins.

The figures are those of :mod:`llmgw.fleet.summaries` (per node and per GPU)
and :mod:`llmgw.planning.summaries` (which GPUs llmgw units hold) — the same
functions ``llmgw inventory`` and ``llmgw status`` print — over the fleet the
daemon last observed (:attr:`AdminView.fleet`); this module only lays them
out. A figure a node did not report is shown as unknown (``—``, titled "not
reported"), never as zero. A node name in the path must be a node name
(:data:`llmgw.spec.identifiers.PATTERNS`); an unknown one is a 404 page.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Any

from aiohttp import web
from markupsafe import Markup, escape

from llmgw.fleet import redactions
from llmgw.fleet import summaries as nodesums
from llmgw.fleet.types import Fleet
from llmgw.planning import holdings, summaries
from llmgw.spec import identifiers

if TYPE_CHECKING:
    from llmgw.web.pages import Pages

NODE_NAME = re.compile(identifiers.PATTERNS["name"][0])
UNKNOWN = Markup('<span class="unknown" title="not reported">—</span>')
MIB = 1024 * 1024


def install(pages: Pages, add: web.UrlDispatcher) -> None:
    pages.templates.globals.update(known=known, size=nodesums.size, mib=mib, pct=pct,
                                   peers=peers, duration=nodesums.age)
    add.add_get("/admin/nodes", partial(_nodes, pages))
    add.add_get("/admin/nodes/{node}", partial(_node, pages))


def known(value: Any, show: Callable[[Any], str] = str) -> Markup:
    """``value`` as ``show`` words it, escaped; unknown (``—``, "not reported") when None."""
    return UNKNOWN if value is None else escape(show(value))


def mib(value: int) -> str:
    return nodesums.size(value * MIB)


def pct(value: int) -> str:
    return f"{value} %"


def peers(value: tuple[int, ...]) -> str:
    return ", ".join(map(str, value)) if value else "none"


async def _nodes(pages: Pages, request: web.Request) -> web.StreamResponse:
    pages.need(request, admin=True)
    view = pages.admin()
    fleet = view.fleet if view is not None else None
    # Free text (errors) as it may leave the daemon: scrubbed of secrets, then escaped.
    shown = redactions.public(fleet) if fleet is not None else None
    rows = nodesums.node_rows(pages.cluster(), shown, pages.clock()) if shown else []
    # What each fabric holds (its shared stores, each node's own copies): the
    # planner's own count of copies, over the same scrubbed fleet, escaped.
    held = holdings.holdings(pages.cluster(), shown) if shown else None
    return pages.render(request, "admin_nodes.html", observed=fleet is not None, rows=rows,
                        holdings=held, observed_at=view.observed_at if view else None)


async def _node(pages: Pages, request: web.Request) -> web.StreamResponse:
    pages.need(request, admin=True)
    name = request.match_info["node"]
    if not NODE_NAME.fullmatch(name):
        raise web.HTTPNotFound(text="not a node name: node names are lower-case letters, "
                               "digits, '.', '_' and '-'")
    view = pages.admin()
    fleet = view.fleet if view is not None else None
    if fleet is None:
        raise web.HTTPServiceUnavailable(text="The daemon has not observed the fleet yet.")
    if name not in fleet.nodes:
        raise web.HTTPNotFound(text=f"no node named {name} in the fleet")
    # Which GPUs llmgw holds is read from the units' own labels; what is shown, from the
    # report scrubbed of secrets (engines' log tails, details, process names), then escaped.
    held = summaries.held_gpus(fleet).get(name, set())
    report = redactions.public(Fleet(nodes={name: fleet.nodes[name]})).nodes[name]
    cluster = pages.cluster()
    fabrics = [(state, cluster.fabrics[state.fabric].kind if state.fabric in cluster.fabrics
                else None) for state in nodesums.node_fabrics(cluster, report)]
    return pages.render(
        request, "admin_node.html", row=nodesums.node_row(cluster, name, report, pages.clock()),
        report=report, gpus=nodesums.gpu_rows(report, held), fabrics=fabrics,
        observed_at=view.observed_at if view else None)
