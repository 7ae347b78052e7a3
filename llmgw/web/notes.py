"""/chat/notes: a person's own notes, kept beside their conversations.

Private: every read and write names the visitor's user (:mod:`llmgw.store.notes`),
so another person's note is answered 404 whether it exists or not. The text is the
person's and is stored as typed, shown escaped (the templates autoescape, bodies in
``white-space: pre-wrap``), never logged, exported with the person's data
(``/account/data``) and deleted with their user. Writes are forms: POST (CSRF
checked), then 303 back, so a reload repeats nothing.
"""

from __future__ import annotations

import re
from functools import partial
from typing import TYPE_CHECKING

from aiohttp import web

from llmgw.store import notes

if TYPE_CHECKING:
    from llmgw.web.pages import Pages

NOTE_ID = re.compile(r"^[0-9a-f]{16}$")
# A form of a whole note: each character up to 4 UTF-8 bytes, each byte %XX in the form.
MAX_FORM = (notes.MAX_BODY + notes.MAX_TITLE) * 12 + 1024


def install(pages: Pages, add: web.UrlDispatcher) -> None:
    add.add_get("/chat/notes", partial(_page, pages))
    add.add_post("/chat/notes", partial(_save, pages))
    add.add_post("/chat/notes/{nid}/delete", partial(_delete, pages))


async def _page(pages: Pages, request: web.Request, error: str | None = None,
                status: int = 200, draft: tuple[str, str] | None = None) -> web.StreamResponse:
    visitor = pages.need(request)
    mine = await notes.list_of(pages.store, visitor.user.name)
    wanted = request.query.get("edit")
    editing = next((n for n in mine if n.id == wanted), None)
    if wanted is not None and editing is None:
        raise web.HTTPNotFound(text="no such note of yours")
    return pages.render(request, "notes.html", status=status, notes=mine, editing=editing,
                        error=error, draft=draft, max_notes=notes.MAX_NOTES,
                        max_body=notes.MAX_BODY, max_title=notes.MAX_TITLE)


async def _save(pages: Pages, request: web.Request) -> web.StreamResponse:
    visitor = pages.need(request)
    data = await pages.form(request, visitor, MAX_FORM)
    nid = data.get("id") or None
    if nid is not None and not NOTE_ID.match(nid):
        raise web.HTTPNotFound(text="no such note of yours")
    title, body = data.get("title", ""), data.get("body", "")
    try:
        await notes.save(pages.store, visitor.user.name, title, body, nid, pages.clock())
    except notes.NoteError as exc:  # shown with what was typed, so nothing is lost
        status = 404 if nid is not None and "no such note" in str(exc) else 400
        if status == 404:
            raise web.HTTPNotFound(text=str(exc)) from None
        return await _page(pages, request, error=str(exc), status=status,
                           draft=(title, body))
    raise web.HTTPSeeOther("/chat/notes")


async def _delete(pages: Pages, request: web.Request) -> web.StreamResponse:
    visitor = pages.need(request)
    await pages.form(request, visitor)
    nid = request.match_info["nid"]
    if not NOTE_ID.match(nid) or not await notes.delete(pages.store, nid, visitor.user.name):
        raise web.HTTPNotFound(text="no such note of yours")
    raise web.HTTPSeeOther("/chat/notes")
