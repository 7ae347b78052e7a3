"""The pages people use, served on the router's listener: login, /chat, /account, /admin.

:class:`Pages` holds what every page needs — the store, the router (its
models, budgets and spend; /chat streams through its own
``/v1/chat/completions``), the current cluster, and an optional view of the
daemon for /admin — and ``install(app)`` adds the routes and a middleware to
the router's application. Pages are rendered by jinja2 with autoescape on;
every asset comes from :mod:`llmgw.web` itself (``static/``), and each answer
carries a strict Content-Security-Policy: scripts, styles and fetches from
this origin only, no inline script or style, no framing.

Usage::

    pages = Pages(store, router, cluster=lambda: daemon.cluster, admin=admin_view)
    runner = await router.start(host, port, extend=pages.install)
"""

from __future__ import annotations

import re
import secrets
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from functools import partial
from importlib import resources
from typing import Any
from urllib.parse import quote

import jinja2
from aiohttp import web

from llmgw.fleet import summaries as nodesums
from llmgw.fleet.types import Fleet
from llmgw.planning.summaries import Summary
from llmgw.router.apps import Router
from llmgw.spec import identifiers
from llmgw.spec.models import Cluster, OidcSettings
from llmgw.store import users
from llmgw.store.stores import Store
from llmgw.web import logins, oidcs
from llmgw.web.logins import Gate, Visitor
from llmgw.web.logviews import LogSource

CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
       "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
SECURITY_HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}
PAGE_PREFIXES = ("/login", "/logout", "/chat", "/account", "/admin", "/static/")
STATIC = {"app.css": "text/css", "chat.js": "text/javascript",
          "refresh.js": "text/javascript", "theme.js": "text/javascript",
          "favicon.svg": "image/svg+xml", "markdown.js": "text/javascript",
          "logs.js": "text/javascript"}
MAX_FORM = 64 * 1024
NOT_OBSERVED = "The daemon has not observed the fleet yet."
VISITOR = web.RequestKey("visitor", Visitor)  # set by the middleware on page paths
# /admin/nodes and a node's page: where a login may go back to (a node name, or nothing).
NODE_PAGES = re.compile(r"/admin/nodes(?:/" + identifiers.PATTERNS["name"][0].strip("^$") + ")?")


@dataclass(frozen=True)
class Progress:
    """A fetch or install an agent reports as under way."""

    node: str
    kind: str  # "fetch" | "install"
    name: str
    done_bytes: int | None
    total_bytes: int | None
    state: str = ""

    @property
    def percent(self) -> int | None:
        if self.done_bytes is None or not self.total_bytes:
            return None
        return min(100, int(100 * self.done_bytes / self.total_bytes))


@dataclass(frozen=True)
class AdminView:
    """What the daemon knows, as /admin shows it (built by the daemon on each request)."""

    summary: Summary
    fleet: Fleet | None = None  # the observed fleet the summary is of: the nodes pages
    observed_at: float | None = None
    revision: str | None = None
    applied_revision: str | None = None
    sync: str = "manual"
    plan_summary: str | None = None
    plan_text: str | None = None
    planned_at: float | None = None
    last_apply: str | None = None
    last_apply_ok: bool | None = None
    applied_at: float | None = None
    refused: list[str] = field(default_factory=list)
    progress: list[Progress] = field(default_factory=list)
    # In the HA layout, where a router shows the leader's published summary: whose it
    # is and how old ("summary from vm:1234:ab12 (leader), 4 s old"), and when it is
    # older than it should be, a sentence saying so.
    source: str | None = None
    stale: str | None = None


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class Pages:
    def __init__(
        self,
        store: Store,
        router: Router,
        *,
        cluster: Callable[[], Cluster],
        admin: Callable[[], AdminView | None] = lambda: None,
        absent: Callable[[], str] = lambda: NOT_OBSERVED,
        clock: Callable[[], float] = time.time,
        refresh_seconds: int = 10,
        logs: LogSource | None = None,
        relying: oidcs.Relying | None = None,
    ) -> None:
        self.store = store
        self.logs = logs  # replicas' logs through the daemon's agents (/admin/logs)
        self.router = router
        self.cluster = cluster
        self.admin = admin
        self.absent = absent  # what /admin says while ``admin`` has no view
        self.clock = clock
        self.refresh_seconds = refresh_seconds
        self.gate = Gate(store, lambda: cluster().cluster.web, clock)
        self.relying = relying or oidcs.Relying(clock=clock)  # single sign-on, when configured
        self.templates = jinja2.Environment(
            loader=jinja2.PackageLoader("llmgw.web", "templates"),
            autoescape=True, undefined=jinja2.StrictUndefined,
        )
        self.templates.filters["when"] = _when
        self.templates.filters["age"] = lambda t: nodesums.age(self.clock() - t) if t else "-"
        self.templates.filters["usd"] = _usd

    def install(self, app: web.Application) -> None:
        """Add the pages to ``app`` (the router's) and let the router see sessions."""
        from llmgw.web import (  # their handlers take this object
            accounts,
            admins,
            catalogs,
            chats,
            logviews,
            nodes,
            notes,
        )

        app.middlewares.append(self._middleware)
        add = app.router
        add.add_get("/", self._index)
        add.add_get("/login", self._login_form)
        add.add_post("/login", self._login)
        add.add_post("/logout", self._logout)
        add.add_get(oidcs.PENDING_PATH, self._oidc_start)
        add.add_get(oidcs.CALLBACK, self._oidc_callback)
        add.add_get("/static/{name}", self._static)
        chats.install(self, add)
        accounts.install(self, add)
        admins.install(self, add)
        nodes.install(self, add)
        catalogs.install(self, add)
        logviews.install(self, add)
        notes.install(self, add)
        self.router.page_auth = partial(chats.principal, self)

    # -- helpers for the page modules --------------------------------------------------

    def render(self, request: web.Request, name: str, status: int = 200,
               **context: Any) -> web.Response:
        visitor = context.pop("visitor", None) or request.get(VISITOR)
        html = self.templates.get_template(name).render(
            visitor=visitor, cluster=self.cluster().cluster.name, path=request.path, **context)
        return web.Response(text=html, status=status, content_type="text/html")

    def need(self, request: web.Request, *, admin: bool = False) -> Visitor:
        """The visitor, or a redirect to the login page (403 for a non-admin on /admin)."""
        visitor: Visitor | None = request.get(VISITOR)
        if visitor is None:
            raise web.HTTPSeeOther(f"/login?next={quote(request.path, safe='/')}")
        if admin and not visitor.user.admin:
            raise web.HTTPForbidden(text="this page is for admins")
        return visitor

    async def form(self, request: web.Request, visitor: Visitor,
                   limit: int = 0) -> dict[str, str]:
        """The posted form, after its CSRF token is checked (403 otherwise); 413 past
        ``limit`` bytes (default :data:`MAX_FORM`)."""
        data = await _form(request, limit or MAX_FORM)
        if not self.gate.csrf_ok(visitor, data.get("csrf")):
            raise web.HTTPForbidden(text="the form's CSRF token is missing or wrong: reload "
                                    "the page and try again")
        return data

    def keystore(self) -> Store:
        """The router's store, where API keys live (SQLite or PostgreSQL)."""
        store = self.router.accounts.store
        if store is None:
            raise web.HTTPServiceUnavailable(text="this router has no key store")
        return store

    def projects_of(self, visitor: Visitor) -> list[str]:
        """The visitor's projects that the cluster defines (all of them for an admin)."""
        defined = self.cluster().projects
        if visitor.user.admin:
            return sorted(defined)
        return [p for p in visitor.user.projects if p in defined]

    # -- middleware and the small pages ------------------------------------------------

    @web.middleware
    async def _middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        page = request.path == "/" or request.path.startswith(PAGE_PREFIXES)
        if not page:
            return await handler(request)
        visitor = await self.gate.visitor(request)
        if visitor is not None:
            request[VISITOR] = visitor
        try:
            response = await handler(request)
        except web.HTTPException as exc:
            if exc.status < 400:  # a redirect: answered as a plain response (headers kept)
                response = web.Response(status=exc.status, headers=exc.headers)
            else:
                response = self.render(request, "error.html", status=exc.status,
                                       message=exc.text or exc.reason)
        for name, value in SECURITY_HEADERS.items():
            if name == "Cache-Control" and request.path.startswith("/static/"):
                continue
            response.headers.setdefault(name, value)
        return response

    async def _index(self, request: web.Request) -> web.StreamResponse:
        visitor = self.need(request)
        raise web.HTTPSeeOther("/admin" if visitor.user.admin else "/chat")

    async def _login_form(self, request: web.Request) -> web.StreamResponse:
        token = request.cookies.get(logins.LOGIN_COOKIE) or secrets.token_urlsafe(24)
        response = self.render(request, "login.html", token=token, error="",
                               next=_next(request.query.get("next")), **self._sso())
        self.gate.set_login_cookie(request, response, token)
        return response

    async def _login(self, request: web.Request) -> web.StreamResponse:
        data = await _form(request)
        if not self.cluster().cluster.web.local_logins:
            raise web.HTTPForbidden(text="local logins are off on this cluster: use single "
                                    "sign-on")
        if not self.gate.login_token_ok(request, data.get("csrf")):
            raise web.HTTPForbidden(text="the login form's CSRF token is missing or wrong: "
                                    "reload the login page and try again")
        name, password = data.get("name", "").strip(), data.get("password", "")
        account = name if users.NAME.fullmatch(name) else "?"  # logged: a valid name or "?"
        source = self.gate.client(request)
        limiter = self.gate.limiter
        wait = limiter.retry_after(source, account)
        if wait:
            await self.gate.login_failed(request, name, "throttled")
            response = self._login_again(request, data, "too many failed logins from your "
                                         f"address: try again in {wait} s", status=429)
            response.headers["Retry-After"] = str(wait)
            return response
        user = await users.authenticate(self.store, name, password)  # Argon2 off the loop
        if user is None:
            known = account != "?" and await users.get(self.store, account) is not None
            limiter.failed(source, account, known=known)
            response = self._login_again(request, data, "wrong user name or password",
                                         status=401)
            await self.gate.conclude(
                request, response, method="password", account=account, user=None,
                reason="password", details=(
                    f"known={'yes' if known else 'no'} "
                    f"source_failures={limiter.failures(source)} account_under_attack="
                    f"{'yes' if limiter.under_attack(account) else 'no'} "
                    f"next_wait={limiter.retry_after(source, account)}s"))
            return response
        response = redirect(_next(data.get("next")) or ("/admin" if user.admin else "/chat"))
        await self.gate.conclude(request, response, method="password", account=user.name,
                                 user=user)
        return response

    def _login_again(self, request: web.Request, data: dict[str, str], error: str,
                     status: int) -> web.Response:
        return self.render(request, "login.html", status=status, token=data.get("csrf", ""),
                           error=error, next=_next(data.get("next")), **self._sso())

    def _sso(self) -> dict[str, Any]:
        """What the login page offers: a password form, a single sign-on button."""
        web_settings = self.cluster().cluster.web
        oidc = web_settings.oidc
        return {"local": web_settings.local_logins,
                "sso": oidc.display_name if oidc is not None else ""}

    # -- single sign-on (llmgw.web.oidcs) -------------------------------------------------

    def _oidc(self, request: web.Request) -> tuple[OidcSettings, str]:
        """The provider's settings and our callback's URL; 404 when SSO is off."""
        oidc = self.cluster().cluster.web.oidc
        if oidc is None:
            raise web.HTTPNotFound(text="single sign-on is not configured")
        return oidc, oidc.redirect_uri or self.gate.base_url(request) + oidcs.CALLBACK

    async def _oidc_start(self, request: web.Request) -> web.StreamResponse:
        oidc, callback = self._oidc(request)
        try:
            start = await self.relying.start(oidc, callback, _next(request.query.get("next")))
        except oidcs.SignOnError as exc:
            return self._sso_refused(request, str(exc), exc.status)
        response = redirect(start.url)
        response.set_cookie(oidcs.PENDING_COOKIE, start.cookie, httponly=True, samesite="Lax",
                            secure=self.gate.is_secure(request), path=oidcs.PENDING_PATH,
                            max_age=oidcs.PENDING_TTL)
        return response

    async def _oidc_callback(self, request: web.Request) -> web.StreamResponse:
        oidc, callback = self._oidc(request)
        cookie = request.cookies.get(oidcs.PENDING_COOKIE)
        account, user, reason, message, status = "?", None, "", "", 401
        try:
            found, target = await self.relying.finish(oidc, callback, cookie,
                                                      dict(request.query))
            account = found.name
            user = await users.sign_on(self.store, found.subject, found.name,
                                       admin=found.admin, projects=found.projects,
                                       admin_of=found.admin_of, now=self.clock())
            if user is None:
                reason, status = "name-taken", 403
                message = (f"the user name {found.name!r} belongs to another account: ask an "
                           "admin")
        except oidcs.SignOnError as exc:
            reason, message, status = exc.reason, str(exc), exc.status
        if user is None:
            response = self._sso_refused(request, message, status)
        else:
            # A page, not a redirect: the browser arrived here from the provider's site, and
            # SameSite=Strict keeps the new session cookie off a redirect of that navigation;
            # the page's own navigation is same-site.
            response = self.render(request, "continue.html", title="Signed in", target=(
                _next(target) or ("/admin" if user.admin else "/chat")))  # the cookie's: re-checked
        response.del_cookie(oidcs.PENDING_COOKIE, path=oidcs.PENDING_PATH)  # spent either way
        await self.gate.conclude(request, response, method="oidc", account=account,
                                 user=user, reason=reason)
        return response

    def _sso_refused(self, request: web.Request, message: str, status: int) -> web.Response:
        token = request.cookies.get(logins.LOGIN_COOKIE) or secrets.token_urlsafe(24)
        response = self.render(request, "login.html", status=status, token=token,
                               error=f"single sign-on failed: {message}", next="",
                               **self._sso())
        self.gate.set_login_cookie(request, response, token)
        return response

    async def _logout(self, request: web.Request) -> web.StreamResponse:
        visitor = self.need(request)
        await self.form(request, visitor)
        oidc = self.cluster().cluster.web.oidc
        response: web.Response = redirect("/login")
        if oidc is not None and visitor.user.subject is not None:
            # RP-initiated logout: end the provider's session too, then come back here. A
            # page, not a redirect: form-action 'self' forbids a form's redirect elsewhere.
            after = self.gate.base_url(request) + "/login"
            target = await self.relying.logout_url(oidc, after)
            if target is not None:
                response = self.render(request, "continue.html", title="Signing out",
                                       target=target)
        await self.gate.logout(response, visitor, request)
        return response

    async def _static(self, request: web.Request) -> web.StreamResponse:
        name = request.match_info["name"]
        if name not in STATIC:
            raise web.HTTPNotFound(text="no such file")
        body = resources.files("llmgw.web").joinpath("static", name).read_bytes()
        return web.Response(body=body, content_type=STATIC[name],
                            headers={"Cache-Control": "max-age=300"})


def redirect(location: str) -> web.Response:
    """303 See Other: after a form, the browser GETs ``location``."""
    return web.Response(status=303, headers={"Location": location})


async def _form(request: web.Request, limit: int = MAX_FORM) -> dict[str, str]:
    if request.content_length is not None and request.content_length > limit:
        raise web.HTTPRequestEntityTooLarge(max_size=limit,
                                            actual_size=request.content_length)
    posted = await request.post()
    return {k: v for k, v in posted.items() if isinstance(v, str)}


def _next(target: str | None) -> str:
    """A same-site path to go to after login; anything else (//evil, http:…) is dropped.

    Only printable ASCII passes: the result goes into a Location header, where
    CR/LF would split the response (aiohttp refuses such a header and drops
    the connection) and other bytes have no business.
    """
    if not target or not target.startswith("/") or target.startswith("//") or "\\" in target:
        return ""
    if not all("!" <= c <= "~" for c in target):
        return ""
    path = target.split("?")[0]
    return target if path in ("/", "/chat", "/account", "/admin") or NODE_PAGES.fullmatch(
        path) else ""


def _when(ts: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(ts)) if ts else "-"


def _usd(amount: float | None) -> str:
    if amount is None:
        return "-"
    return f"${amount:,.2f}" if amount >= 0.01 or amount == 0 else f"${amount:.6f}"


__all__ = ["AdminView", "Pages", "Progress", "logins"]
