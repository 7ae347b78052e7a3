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
* **Login limits.** Failed logins are counted per client address and per
  user name in a sliding window; past the limit the login answers 429 with
  Retry-After, before checking the password (so guessing costs nothing
  further and the Argon2 cost cannot be used to load the host).
"""

from __future__ import annotations

import hmac
import ipaddress
import sqlite3
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from aiohttp import web

from llmgw.spec.models import WebSettings
from llmgw.store import sessions, users
from llmgw.store.sessions import Session
from llmgw.store.users import User

SESSION_COOKIE = "llmgw_session"
LOGIN_COOKIE = "llmgw_login"
CSRF_HEADER = "X-CSRF-Token"


@dataclass(frozen=True)
class Visitor:
    """A logged-in person on this request."""

    user: User
    session: Session
    token: str


class Gate:
    """Session and CSRF checks for one store and the cluster's web settings."""

    def __init__(self, store: sqlite3.Connection, settings: Callable[[], WebSettings],
                 clock: Callable[[], float] = time.time) -> None:
        self.store = store
        self.settings = settings
        self.clock = clock
        self.limiter = Limiter(clock=clock)

    # -- who ------------------------------------------------------------------------

    def visitor(self, request: web.Request) -> Visitor | None:
        """The live session's user, or None (no cookie, unknown, expired, user deleted)."""
        token = request.cookies.get(SESSION_COOKIE)
        if not token:
            return None
        session = sessions.lookup(self.store, token, self.clock())
        if session is None:
            return None
        user = users.get(self.store, session.user)
        return Visitor(user, session, token) if user is not None else None

    def login(self, response: web.StreamResponse, request: web.Request, user: User) -> None:
        """Start a session for ``user`` and set its cookie on ``response``."""
        created = sessions.create(self.store, user.name, self.settings().session_ttl,
                                  self.clock())
        response.set_cookie(SESSION_COOKIE, created.token, httponly=True, samesite="Strict",
                            secure=self.is_secure(request), path="/",
                            max_age=int(self.settings().session_ttl))
        response.del_cookie(LOGIN_COOKIE, path="/login")

    def logout(self, response: web.StreamResponse, visitor: Visitor | None) -> None:
        if visitor is not None:
            sessions.delete(self.store, visitor.token)
        response.del_cookie(SESSION_COOKIE, path="/")

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

    def _from_proxy(self, request: web.Request) -> bool:
        peer = request.remote
        if not peer:
            return False
        try:
            address = ipaddress.ip_address(peer)
        except ValueError:
            return False
        return any(address in ipaddress.ip_network(n, strict=False)
                   for n in self.settings().trusted_proxies)

    def is_secure(self, request: web.Request) -> bool:
        """Whether the client's connection is TLS (ours, or a trusted proxy's)."""
        if self.settings().secure_cookies or request.secure:
            return True
        if self._from_proxy(request):
            proto = request.headers.get("X-Forwarded-Proto", "").split(",")[0].strip()
            return proto.lower() == "https"
        return False

    def client(self, request: web.Request) -> str:
        """The client's address: a trusted proxy's X-Forwarded-For last hop, or the peer."""
        if self._from_proxy(request):
            hops = [h.strip() for h in request.headers.get("X-Forwarded-For", "").split(",")]
            if hops and hops[-1]:
                return hops[-1][:64]
        return request.remote or "?"

    def base_url(self, request: web.Request) -> str:
        """The router's address as the client sees it (for /account's instructions)."""
        scheme = "https" if self.is_secure(request) else "http"
        host = request.host
        if self._from_proxy(request):
            host = request.headers.get("X-Forwarded-Host", host).split(",")[0].strip()
        return f"{scheme}://{host}"


class Limiter:
    """Failed logins per key (client address, user name) in a sliding window; bounded."""

    def __init__(self, *, window: float = 900.0, per_client: int = 20, per_user: int = 10,
                 max_keys: int = 10_000, clock: Callable[[], float] = time.time) -> None:
        self.window = window
        self.limits = {"client": per_client, "user": per_user}
        self.max_keys = max_keys
        self.clock = clock
        self._failures: dict[tuple[str, str], deque[float]] = {}

    def retry_after(self, client: str, user: str) -> int:
        """Seconds until another attempt is allowed; 0 when it is allowed now."""
        now = self.clock()
        wait = 0.0
        for key in (("client", client), ("user", user)):
            times = self._recent(key, now)
            if len(times) >= self.limits[key[0]]:
                wait = max(wait, times[0] + self.window - now)
        return int(wait) + 1 if wait else 0

    def failed(self, client: str, user: str) -> None:
        now = self.clock()
        if len(self._failures) >= self.max_keys:
            self._prune(now)
        for key in (("client", client), ("user", user)):
            self._failures.setdefault(key, deque()).append(now)

    def succeeded(self, user: str) -> None:
        self._failures.pop(("user", user), None)

    def _recent(self, key: tuple[str, str], now: float) -> Sequence[float]:
        times = self._failures.get(key)
        if not times:
            return ()
        while times and times[0] <= now - self.window:
            times.popleft()
        return times

    def _prune(self, now: float) -> None:
        for key in list(self._failures):
            if not self._recent(key, now):
                del self._failures[key]
        while len(self._failures) >= self.max_keys:  # still full: forget the oldest
            del self._failures[next(iter(self._failures))]
