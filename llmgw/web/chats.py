"""/chat: pick a model, set a system prompt, stream the answer; conversations if kept.

The page's script sends the chat to the router's own ``/v1/chat/completions``
(so balancing, budgets, usage rows and metrics are the router's), with the
session cookie instead of an API key: :func:`principal` turns the session
into the router's :class:`Principal` — the user, and the project they chose
(``X-Llmgw-Project``), which must be one of theirs — and refuses a cookie
request without the session's CSRF token in ``X-CSRF-Token``.

The model list holds only what the person's projects may call (the union of
their ``models:`` allow-lists, :mod:`llmgw.router.permissions`), and each
model names the projects that allow it, so the script sends a chat under one
of those; the router checks the pairing again.

Nothing is stored by default. Only when the chosen project declares
``conversations: {retention: …}`` does the script post each finished turn to
``/chat/conversations``; the server refuses those posts for any other
project, so no prompt or answer text can reach the store otherwise. A
regenerated answer is posted alone with ``replace: true`` and takes the place
of the conversation's last answer.
"""

from __future__ import annotations

import json
from functools import partial
from typing import TYPE_CHECKING, Any

from aiohttp import web

from llmgw.router import permissions
from llmgw.router.accounts import Principal
from llmgw.router.errors import ApiError
from llmgw.store import conversations
from llmgw.web import accounts, logins

if TYPE_CHECKING:
    from llmgw.web.pages import Pages

PROJECT_HEADER = "X-Llmgw-Project"
MAX_TURNS_BODY = 1024 * 1024


def install(pages: Pages, add: web.UrlDispatcher) -> None:
    add.add_get("/chat", partial(_chat, pages))
    add.add_post("/chat/conversations", partial(_save, pages))
    add.add_post("/chat/conversations/{cid}/messages", partial(_save, pages))
    add.add_post("/chat/conversations/{cid}/delete", partial(_delete, pages))


async def principal(pages: Pages, request: web.Request) -> Principal | None:
    """The router's principal for a page request with a session; None without a session."""
    visitor = await pages.gate.visitor(request)
    if visitor is None:
        return None
    if not pages.gate.csrf_ok(visitor, request.headers.get(logins.CSRF_HEADER)):
        raise ApiError(403, "a request with a session cookie needs the session's CSRF token "
                       f"in {logins.CSRF_HEADER}", code="csrf_failed")
    project = request.headers.get(PROJECT_HEADER) or None
    mine = pages.projects_of(visitor)
    if project is None and pages.router.catalog.auth == "none" and not mine:
        return Principal(None, None, visitor.user.name)
    if project is None or project not in mine:
        raise ApiError(403, f"choose one of your projects in {PROJECT_HEADER} "
                       f"(yours: {', '.join(mine) or 'none; ask an admin'})",
                       code="unknown_project")
    return Principal(project, None, visitor.user.name)


def retention(pages: Pages, project: str | None) -> float | None:
    """Seconds ``project`` keeps conversations; None when it keeps none (the default)."""
    spec = pages.cluster().projects.get(project or "")
    return spec.conversations.retention if spec and spec.conversations else None


async def _chat(pages: Pages, request: web.Request) -> web.StreamResponse:
    visitor = pages.need(request)
    projects = pages.projects_of(visitor)
    kept = {p: retention(pages, p) for p in projects}
    listed = (await conversations.list_for(pages.store, visitor.user.name)
              if any(kept.values()) else [])
    current, history = None, []
    cid = request.query.get("c")
    if cid:
        current = await conversations.get(pages.store, cid, visitor.user.name)
        if current is None:
            raise web.HTTPNotFound(text="no such conversation")
        history = await conversations.messages(pages.store, cid)
    models = accounts.models_for(pages, projects)
    allowed = {m: permissions.projects_for(pages.router.catalog, projects, m) for m in models}
    return pages.render(request, "chat.html", models=models, allowed=allowed,
                        projects=projects, kept=kept, conversations=listed, current=current,
                        history=[{"role": m.role, "content": m.content} for m in history])


async def _save(pages: Pages, request: web.Request) -> web.StreamResponse:
    cid = request.match_info.get("cid")
    visitor = pages.need(request)
    if not pages.gate.csrf_ok(visitor, request.headers.get(logins.CSRF_HEADER)):
        raise web.HTTPForbidden(text=f"missing or wrong {logins.CSRF_HEADER}")
    if request.content_length is None or request.content_length > MAX_TURNS_BODY:
        raise web.HTTPRequestEntityTooLarge(max_size=MAX_TURNS_BODY,
                                            actual_size=request.content_length or 0)
    doc = _json(await request.read())
    turns = _turns(doc.get("turns"))
    replace = doc.get("replace", False)
    if not isinstance(replace, bool) or (replace and (cid is None or [r for r, _ in turns]
                                                      != ["assistant"])):
        raise web.HTTPBadRequest(text="replace: true takes one assistant turn, posted to an "
                                 "existing conversation's /messages")
    name = visitor.user.name
    if cid is None:
        project = doc.get("project")
        if not isinstance(project, str) or project not in pages.projects_of(visitor):
            raise web.HTTPForbidden(text="not one of your projects")
        if retention(pages, project) is None:
            raise web.HTTPForbidden(text=f"project {project!r} does not keep conversations")
        title = next((c for r, c in turns if r == "user"), "untitled").strip()
        cid = await conversations.create(pages.store, name, project, title, pages.clock())
    else:
        found = await conversations.get(pages.store, cid, name)
        if found is None:
            raise web.HTTPNotFound(text="no such conversation")
        if retention(pages, found.project) is None:
            raise web.HTTPForbidden(text=f"project {found.project!r} does not keep "
                                    "conversations")
    await conversations.append(pages.store, cid, name, turns, pages.clock(),
                               replace_answer=replace)
    return web.json_response({"id": cid})


async def _delete(pages: Pages, request: web.Request) -> web.StreamResponse:
    visitor = pages.need(request)
    await pages.form(request, visitor)
    if not await conversations.delete(pages.store, request.match_info["cid"], visitor.user.name):
        raise web.HTTPNotFound(text="no such conversation")
    raise web.HTTPSeeOther("/chat")


def _json(body: bytes) -> dict[str, Any]:
    try:
        doc = json.loads(body)
    except ValueError:
        raise web.HTTPBadRequest(text="expected a JSON object") from None
    if not isinstance(doc, dict):
        raise web.HTTPBadRequest(text="expected a JSON object")
    return doc


def _turns(value: Any) -> list[tuple[str, str]]:
    if not isinstance(value, list) or not value or len(value) > 3:
        raise web.HTTPBadRequest(text="turns: a list of 1 to 3 {role, content} objects")
    turns = []
    for item in value:
        role = item.get("role") if isinstance(item, dict) else None
        content = item.get("content") if isinstance(item, dict) else None
        if role not in conversations.ROLES or not isinstance(content, str):
            raise web.HTTPBadRequest(text="each turn needs a role (system, user, assistant) "
                                     "and a content string")
        if len(content) > conversations.MAX_MESSAGE:
            raise web.HTTPBadRequest(text="a turn is longer than "
                                     f"{conversations.MAX_MESSAGE} characters")
        turns.append((role, content))
    return turns
