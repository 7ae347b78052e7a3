"""/admin: the fleet at a glance, for admins only, refreshing itself.

Every figure about the fleet comes from the daemon's :class:`AdminView`,
whose ``summary`` is :func:`llmgw.planning.summaries.summarize` — the same
function behind ``llmgw status`` and ``/api/v1/status``; this module only
lays it out. Usage and spend come from the store, charted per project, key
and model over the last day (hourly) or week (daily). ``/admin/live`` is the
refreshing part alone, which ``refresh.js`` fetches and swaps in. The last
:data:`AUDIT_ROWS` entries of the audit log (:mod:`llmgw.store.audits`) close
the page, escaped like everything else.
"""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING

from aiohttp import web
from markupsafe import Markup

from llmgw.store import usages, users
from llmgw.web import charts

if TYPE_CHECKING:
    from llmgw.web.pages import Pages

RANGES = {"24h": (3600.0, 24), "7d": (86400.0, 7)}
AUDIT_ROWS = 50


def install(pages: Pages, add: web.UrlDispatcher) -> None:
    add.add_get("/admin", partial(_admin, pages, "admin.html"))
    add.add_get("/admin/live", partial(_admin, pages, "admin_live.html"))


async def _admin(pages: Pages, template: str, request: web.Request) -> web.StreamResponse:
    pages.need(request, admin=True)
    span = request.query.get("range", "24h")
    if span not in RANGES:
        raise web.HTTPBadRequest(text=f"range must be one of {', '.join(RANGES)}")
    step, slots = RANGES[span]
    now = pages.clock()
    since = (now // step) * step - (slots - 1) * step
    usage: dict[str, list[Markup]] = {}
    for by in ("project", "key", "model"):
        buckets = await usages.series(pages.store, by, since, step)
        usage[by] = [
            charts.usage_chart(buckets, since=since, step=step, slots=slots, value=value,
                               title=f"{label} per {by}, last {span}")
            for value, label in (("cost_usd", "Spend"), ("requests", "Requests"))
        ]
    view = pages.admin()
    cluster = pages.cluster()
    bars = ({name: charts.capacity_bar(name, counts)
             for name, counts in view.summary.capacity.items()} if view else {})
    accounts, catalog = pages.router.accounts, pages.router.catalog
    budget_rows = charts.budgets(
        {p: accounts.spent_now(p) for p in set(catalog.budgets) | set(accounts.spent)},
        catalog.budgets, catalog.periods, accounts.clock())
    return pages.render(request, template, view=view, bars=bars, usage=usage, span=span,
                        ranges=list(RANGES), budgets=budget_rows, now=now,
                        users=await users.list_all(pages.store), refresh=pages.refresh_seconds,
                        audit=await pages.store.audit_entries(limit=AUDIT_ROWS),
                        models=cluster.models, absent=pages.absent() if view is None else "")
