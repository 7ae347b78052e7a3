"""/account: your usage and spend, your keys, and how to connect.

**Whose keys.** In each of their projects a person is a ``member`` or an
``admin`` of that project (:mod:`llmgw.store.users`). A member sees and
revokes the keys they made here; a project admin every key of the project,
those made by ``llmgw keys create`` (which have no owner) too; an admin of
llmgw every key. :func:`may_manage` is that rule, and revoking a key it does
not allow is refused with 403 (whether the key exists or not), not merely
left off the page.

**A new key's secret is shown once.** Creating a key is POST, then 303 to
``GET /account``, so a reload creates nothing. The secret travels to that
GET in a cookie (:data:`NEW_KEY_COOKIE`: HttpOnly, SameSite=Strict,
Path=/account, a minute long, Secure where the session cookie is), which the
GET reads, checks against the store and deletes: never in a URL, a log or the
store, and a reload or the back button after it shows no secret again. A
cookie (rather than memory of this process) because the GET may reach
another router worker.

Usage and spend are their projects' (and their own requests from /chat),
charted per model over the last week.
"""

from __future__ import annotations

import json
from functools import partial
from typing import TYPE_CHECKING

from aiohttp import web

from llmgw.router import permissions
from llmgw.store import conversations, keys, notes, usages
from llmgw.store.keys import CreatedKey, KeyInfo
from llmgw.store.users import User
from llmgw.web import charts

if TYPE_CHECKING:
    from llmgw.web.logins import Visitor
    from llmgw.web.pages import Pages

MAX_KEY_NAME = 64
WEEK, DAY = 7 * 86400, 86400
NEW_KEY_COOKIE = "llmgw_new_key"
NEW_KEY_SECONDS = 60  # from the POST to its redirected GET


def install(pages: Pages, add: web.UrlDispatcher) -> None:
    add.add_get("/account", partial(_account, pages))
    add.add_post("/account/keys", partial(_create, pages))
    add.add_post("/account/keys/{key_id}/revoke", partial(_revoke, pages))
    add.add_get("/account/data", partial(_data, pages))


def may_manage(user: User, key: KeyInfo, projects: list[str]) -> bool:
    """Whether ``user`` (whose cluster projects are ``projects``) sees and may revoke
    ``key``: an admin any; a project admin any of that project's; a member their own."""
    if user.admin:
        return True
    if key.project not in projects:
        return False
    return user.role(key.project) == "admin" or (key.owner is not None
                                                 and key.owner == user.name)


def models_for(pages: Pages, projects: list[str]) -> list[str]:
    """The served names ready now that at least one of ``projects`` may call (every one
    under ``auth: none`` for a person without a project)."""
    chosen: list[str | None] = list(projects)
    if not chosen and pages.router.catalog.auth == "none":
        chosen = [None]
    return permissions.listed(pages.router.catalog, chosen, pages.router.models())


async def _account(pages: Pages, request: web.Request) -> web.StreamResponse:
    visitor = pages.need(request)
    presented = request.cookies.get(NEW_KEY_COOKIE)
    created = await _created(pages, visitor, presented) if presented else None
    response = await _page(pages, request, visitor, created=created)
    if presented is not None:
        response.del_cookie(NEW_KEY_COOKIE, path="/account")
    return response


async def _created(pages: Pages, visitor: Visitor, secret: str) -> CreatedKey | None:
    """The key the cookie names, when it is an active key this visitor made."""
    info = await keys.verify(pages.keystore(), secret)
    if info is None or info.owner != visitor.user.name:
        return None
    return CreatedKey(info, secret)


async def _page(pages: Pages, request: web.Request, visitor: Visitor,
                created: CreatedKey | None = None) -> web.Response:
    projects = pages.projects_of(visitor)
    user = visitor.user
    listed = [k for k in await keys.list_all(pages.keystore())
              if may_manage(user, k, projects)]
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
    roles = {p: "admin" if user.admin else user.role(p) or "member" for p in projects}
    return pages.render(request, "account.html", keys=listed, created=created,
                        projects=projects, roles=roles, chart=chart, budgets=budget_rows,
                        mine=mine, base_url=base, models=models_for(pages, projects),
                        auth=pages.router.catalog.auth,
                        all_keys=user.admin or "admin" in roles.values())


async def _create(pages: Pages, request: web.Request) -> web.StreamResponse:
    visitor = pages.need(request)
    data = await pages.form(request, visitor)
    project = data.get("project", "")
    if project not in pages.projects_of(visitor):
        raise web.HTTPForbidden(text="you can create keys only for your own projects")
    name = " ".join(data.get("name", "").split())[:MAX_KEY_NAME]
    label = f"{name} (by {visitor.user.name})" if name else f"by {visitor.user.name}"
    created = await keys.create(pages.keystore(), project, label, pages.clock(),
                                owner=visitor.user.name)
    await pages.gate.audit(request, visitor.user.name, "key.create", key=created.info.id,
                           project=project)
    response = web.Response(status=303, headers={"Location": "/account"})
    response.set_cookie(NEW_KEY_COOKIE, created.secret, httponly=True, samesite="Strict",
                        secure=pages.gate.is_secure(request), path="/account",
                        max_age=NEW_KEY_SECONDS)
    return response


async def _revoke(pages: Pages, request: web.Request) -> web.StreamResponse:
    visitor = pages.need(request)
    await pages.form(request, visitor)
    key_id = request.match_info["key_id"]
    found = {k.id: k for k in await keys.list_all(pages.keystore())}.get(key_id)
    if found is None or not may_manage(visitor.user, found, pages.projects_of(visitor)):
        raise web.HTTPForbidden(text="you may revoke only your own keys (a project's admins "
                                "revoke any of its keys)")
    await keys.revoke(pages.keystore(), key_id, pages.clock())
    await pages.gate.audit(request, visitor.user.name, "key.revoke", key=key_id,
                           project=found.project)
    raise web.HTTPSeeOther("/account")


async def _data(pages: Pages, request: web.Request) -> web.StreamResponse:
    """What llmgw keeps of the visitor, as one JSON download: their account, the keys they
    made (never a secret or digest), their kept conversations with every message, their
    notes and their own usage from the pages."""
    visitor = pages.need(request)
    user, name = visitor.user, visitor.user.name
    made = [k for k in await keys.list_all(pages.keystore()) if k.owner == name]
    kept = []
    for c in await conversations.list_for(pages.store, name, limit=10_000):
        history = await conversations.messages(pages.store, c.id)
        kept.append({"id": c.id, "project": c.project, "title": c.title,
                     "created_at": c.created_at, "updated_at": c.updated_at,
                     "messages": [{"role": m.role, "content": m.content, "ts": m.ts}
                                  for m in history]})
    requests, tokens, usd = await usages.totals_for_user(pages.store, name)
    doc = {
        "user": {"name": name, "admin": user.admin, "projects": list(user.projects),
                 "admin_of": list(user.admin_of), "created_at": user.created_at,
                 "single_sign_on": user.subject.split(" ", 1)[0] if user.subject else None},
        "keys": [{"id": k.id, "project": k.project, "name": k.name,
                  "created_at": k.created_at, "revoked_at": k.revoked_at,
                  "last_used_at": k.last_used_at} for k in made],
        "conversations": kept,
        "notes": [{"id": n.id, "title": n.title, "body": n.body, "created_at": n.created_at,
                   "updated_at": n.updated_at} for n in await notes.list_of(pages.store, name)],
        "usage_from_pages": {"requests": requests, "tokens": tokens, "cost_usd": usd},
        "exported_at": pages.clock(),
    }
    await pages.gate.audit(request, name, "user.export", user=name)
    return web.Response(
        text=json.dumps(doc, indent=2), content_type="application/json",
        headers={"Content-Disposition": f'attachment; filename="llmgw-{name}.json"'})
