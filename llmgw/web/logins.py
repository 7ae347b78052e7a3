"""Who is on the other end of a page request: sessions, CSRF, proxies, login limits.

* **Sessions.** ``llmgw_session`` holds a random token (see
  :mod:`llmgw.store.sessions`): HttpOnly, SameSite=Strict, Path=/, and
  Secure when the request reached us over TLS, which we believe only from a
  trusted proxy's ``X-Forwarded-Proto`` (``cluster.web.trusted_proxies``) or
  when ``cluster.web.secure_cookies`` says so.
* **CSRF.** Every form posts the session's CSRF token (``csrf`` field); the
  chat's fetch sends it as ``X-CSRF-Token``. The login form, before any
  session, uses a double-submit token: a ``llmgw_login`` cookie and the same
  value in the form. Compared in constant time.
* **Login limits.** Failed logins back off per source address and raise an
  alarm per account (:mod:`llmgw.web.throttles`); a held-back source gets 429
  with Retry-After before its password is checked (so guessing costs nothing
  further and the Argon2 cost cannot be used to load the host), while a source
  without failures always has its password checked. The source is the peer's
  address, or behind a trusted proxy the nearest untrusted X-Forwarded-For hop.
* **The audit log.** Every login, failed login and logout, and every change a
  page makes, is written through :meth:`Gate.audit` (:mod:`llmgw.store.audits`):
  who, the client's address as above, what. Never a password; a failed
  login's attempted name only when it is a valid user name.
"""

from __future__ import annotations

import hmac
import ipaddress
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from aiohttp import web

from llmgw.spec.models import WebSettings
from llmgw.store import audits, sessions, users
from llmgw.store.sessions import Session
from llmgw.store.stores import Store
from llmgw.store.users import User
from llmgw.web import throttles

SESSION_COOKIE = "llmgw_session"
LOGIN_COOKIE = "llmgw_login"
CSRF_HEADER = "X-CSRF-Token"
audit = logging.getLogger("llmgw.audit")  # security events: logins and failed logins


@dataclass(frozen=True)
class Visitor:
    """A logged-in person on this request."""

    user: User
    session: Session
    token: str


class Gate:
    """Session and CSRF checks for one store and the cluster's web settings."""

    def __init__(self, store: Store, settings: Callable[[], WebSettings],
                 clock: Callable[[], float] = time.time) -> None:
        self.store = store
        self.settings = settings
        self.clock = clock
        self.limiter = throttles.Limiter(clock=clock)

    # -- who ------------------------------------------------------------------------

    async def visitor(self, request: web.Request) -> Visitor | None:
        """The live session's user, or None (no cookie, unknown, expired, user deleted)."""
        token = request.cookies.get(SESSION_COOKIE)
        if not token:
            return None
        session = await sessions.lookup(self.store, token, self.clock())
        if session is None:
            return None
        user = await users.get(self.store, session.user)
        return Visitor(user, session, token) if user is not None else None

    async def conclude(self, request: web.Request, response: web.StreamResponse, *,
                       method: str, account: str, user: User | None, reason: str = "",
                       details: str = "") -> None:
        """Where every login attempt ends, by password or single sign-on, either way.

        ``method`` is ``password`` or ``oidc``; ``account`` the name tried (a valid
        user name or "?"), never a password or token; ``user`` the person let in, or
        None with ``reason`` (a word) and ``details`` (already safe to log). Logs the
        outcome on ``llmgw.audit`` and, on success, starts the session on
        ``response``; either way writes the audit log (``login.ok``, ``login.failed``).
        """
        source = self.client(request)
        if user is None:
            audit.warning("login failed: method=%s account=%s reason=%s source=%s%s", method,
                          account, reason, source, f" {details}" if details else "")
            await self.login_failed(request, account, reason, method)
            return
        audit.info("login: method=%s account=%s admin=%s source=%s", method, user.name,
                   "yes" if user.admin else "no", source)
        await self.login(response, request, user, method)

    async def login(self, response: web.StreamResponse, request: web.Request,
                    user: User, method: str = "password") -> None:
        """Start a session for ``user`` and set its cookie on ``response``; audited as
        ``login.ok`` by ``method`` (``password``, ``oidc``)."""
        created = await sessions.create(self.store, user.name, self.settings().session_ttl,
                                  self.clock())
        response.set_cookie(SESSION_COOKIE, created.token, httponly=True, samesite="Strict",
                            secure=self.is_secure(request), path="/",
                            max_age=int(self.settings().session_ttl))
        response.del_cookie(LOGIN_COOKIE, path="/login")
        await self.audit(request, user.name, "login.ok", user=user.name, method=method)

    async def login_failed(self, request: web.Request, name: str, reason: str,
                           method: str = "password") -> None:
        """Audit a refused login: ``name`` is the client's text, kept only when it is a
        valid user name (else ``?``); no password or token is ever passed here."""
        await self.audit(request, "-", "login.failed", user=name if users.NAME.fullmatch(name)
                         else audits.UNKNOWN, method=method, reason=reason)

    async def logout(self, response: web.StreamResponse, visitor: Visitor | None,
                     request: web.Request | None = None) -> None:
        if visitor is not None:
            await sessions.delete(self.store, visitor.token)
            if request is not None:
                await self.audit(request, visitor.user.name, "logout", user=visitor.user.name)
        response.del_cookie(SESSION_COOKIE, path="/")

    async def audit(self, request: web.Request, actor: str, action: str, /,
                    **target: str | Sequence[str] | None) -> None:
        """Write an audit entry for a page request: ``actor`` (a user name) did ``action``
        on ``target`` (identifiers only) from the client's address (:meth:`client`)."""
        await audits.record(self.store, actor, self.client(request), action, **target)

    # -- CSRF -----------------------------------------------------------------------

    @staticmethod
    def csrf_ok(visitor: Visitor, presented: str | None) -> bool:
        return bool(presented) and hmac.compare_digest(visitor.session.csrf, presented or "")

    def set_login_cookie(self, request: web.Request, response: web.StreamResponse,
                         token: str) -> None:
        """The login form's double-submit cookie; the form carries the same ``token``."""
        response.set_cookie(LOGIN_COOKIE, token, httponly=True, samesite="Strict",
                            secure=self.is_secure(request), path="/login", max_age=3600)

    @staticmethod
    def login_token_ok(request: web.Request, presented: str | None) -> bool:
        cookie = request.cookies.get(LOGIN_COOKIE)
        return bool(cookie and presented) and hmac.compare_digest(cookie or "", presented or "")

    # -- proxies ----------------------------------------------------------------------

    def _trusted(self, address: str) -> bool:
        try:
            parsed = ipaddress.ip_address(address)
        except ValueError:
            return False
        return any(parsed in ipaddress.ip_network(n, strict=False)
                   for n in self.settings().trusted_proxies)

    def _from_proxy(self, request: web.Request) -> bool:
        return bool(request.remote) and self._trusted(request.remote or "")

    def is_secure(self, request: web.Request) -> bool:
        """Whether the client's connection is TLS (ours, or a trusted proxy's)."""
        if self.settings().secure_cookies or request.secure:
            return True
        if self._from_proxy(request):
            proto = request.headers.get("X-Forwarded-Proto", "").split(",")[0].strip()
            return proto.lower() == "https"
        return False

    def client(self, request: web.Request) -> str:
        """The client's address, as the login limits count it (:func:`throttles.source_of`).

        Straight from the peer; only when the peer is a trusted proxy, from its
        X-Forwarded-For: the nearest hop that is not itself a trusted proxy (each
        proxy appends the address it saw, so hops further left are the client's
        own words). A hop that is not an IP address ends the walk: the last one
        believed stands.
        """
        address = request.remote or "?"
        if self._from_proxy(request):
            hops = [h.strip() for h in request.headers.get("X-Forwarded-For", "").split(",")]
            for hop in reversed(hops[-16:]):
                if throttles.source_of(hop) == "?":
                    break
                address = hop
                if not self._trusted(hop):
                    break
        return throttles.source_of(address)

    def base_url(self, request: web.Request) -> str:
        """The router's address as the client sees it (for /account's instructions)."""
        scheme = "https" if self.is_secure(request) else "http"
        host = request.host
        if self._from_proxy(request):
            host = request.headers.get("X-Forwarded-Host", host).split(",")[0].strip()
        return f"{scheme}://{host}"
