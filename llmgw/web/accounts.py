"""/account: your usage and spend, your projects' keys, and how to connect.

A person sees the keys of their projects (an admin: of every project),
creates one — its secret is on the answer page once and stored nowhere —
and revokes them. Usage and spend are their projects' (and their own
requests from /chat), charted per model over the last week.
"""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING

from aiohttp import web

from llmgw.store import keys, usages
from llmgw.store.keys import CreatedKey
from llmgw.web import charts

if TYPE_CHECKING:
    from llmgw.web.logins import Visitor
    from llmgw.web.pages import Pages

MAX_KEY_NAME = 64
WEEK, DAY = 7 * 86400, 86400


def install(pages: Pages, add: web.UrlDispatcher) -> None:
    add.add_get("/account", partial(_account, pages))
    add.add_post("/account/keys", partial(_create, pages))
    add.add_post("/account/keys/{key_id}/revoke", partial(_revoke, pages))


async def _account(pages: Pages, request: web.Request) -> web.StreamResponse:
    return await _page(pages, request, pages.need(request))


async def _page(pages: Pages, request: web.Request, visitor: Visitor,
                created: CreatedKey | None = None, status: int = 200) -> web.Response:
    projects = pages.projects_of(visitor)
    listed = [k for k in await keys.list_all(pages.keystore()) if k.project in projects]
    now = pages.clock()
    since = (now // DAY) * DAY - 6 * DAY
    buckets = (await usages.series(pages.store, "model", since, DAY, projects)
               if projects else [])
    chart = charts.usage_chart(buckets, since=since, step=DAY, slots=7, value="cost_usd",
                               title="Spend per model, last 7 days (your projects)")
    accounts, catalog = pages.router.accounts, pages.router.catalog
    budget_rows = charts.budgets({p: accounts.spent_now(p) for p in projects},
                                 {p: catalog.budgets.get(p) for p in projects},
                                 catalog.periods, accounts.clock())
    mine = await usages.totals_for_user(pages.store, visitor.user.name)
    base = pages.gate.base_url(request)
    return pages.render(request, "account.html", status=status, keys=listed, created=created,
                        projects=projects, chart=chart, budgets=budget_rows, mine=mine,
                        base_url=base, models=pages.router.models(),
                        auth=pages.router.catalog.auth)


async def _create(pages: Pages, request: web.Request) -> web.StreamResponse:
    visitor = pages.need(request)
    data = await pages.form(request, visitor)
    project = data.get("project", "")
    if project not in pages.projects_of(visitor):
        raise web.HTTPForbidden(text="you can create keys only for your own projects")
    name = " ".join(data.get("name", "").split())[:MAX_KEY_NAME]
    label = f"{name} (by {visitor.user.name})" if name else f"by {visitor.user.name}"
    created = await keys.create(pages.keystore(), project, label, pages.clock())
    return await _page(pages, request, visitor, created=created, status=201)


async def _revoke(pages: Pages, request: web.Request) -> web.StreamResponse:
    visitor = pages.need(request)
    await pages.form(request, visitor)
    key_id = request.match_info["key_id"]
    found = {k.id: k for k in await keys.list_all(pages.keystore())}.get(key_id)
    if found is None or found.project not in pages.projects_of(visitor):
        raise web.HTTPNotFound(text="no such key among your projects' keys")
    await keys.revoke(pages.keystore(), key_id, pages.clock())
    raise web.HTTPSeeOther("/account")
