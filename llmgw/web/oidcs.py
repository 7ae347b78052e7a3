"""Single sign-on: OpenID Connect's authorization code flow with PKCE (S256).

The protocol is kept libraries' work: authlib builds the authorization URL and
the PKCE challenge and exchanges the code
(:class:`authlib.integrations.httpx_client.AsyncOAuth2Client`); joserfc checks
the ID token's signature against the provider's keys and its claims. This
module wires them and decides who the person is:

* **Discovery.** ``{issuer}/.well-known/openid-configuration``, whose
  ``issuer`` must equal the configured one (OpenID Discovery §4.3); kept for
  an hour.
* **Keys.** The JWKS at ``jwks_uri``, kept; read again (at most once a
  minute) when a token names a key id the kept set lacks (a rotation).
* **State, nonce, PKCE.** Each sign-in draws a random state, nonce and code
  verifier, kept in a cookie of the browser that started it
  (:data:`PENDING_COOKIE`: HttpOnly, SameSite=Lax so that the provider's
  redirect carries it, Path=/login/oidc, 10 minutes). The callback's state
  must equal the cookie's (constant time); the cookie is spent by the
  callback, whatever its outcome, so a replayed callback finds none.
* **The ID token.** Signed with an asymmetric algorithm the provider
  advertises (never ``none``, never HMAC); ``iss`` equal to the issuer;
  ``aud`` naming the client (and ``azp`` the client when there are several
  audiences); ``exp`` in the future (60 s of leeway for clock skew); ``iat``,
  ``sub`` present; ``nonce`` equal to ours.
* **Who.** The user name from ``username_claim`` (else ``sub``), lowercased,
  with what a user name cannot hold turned into ``-``; the groups from
  ``groups_claim`` (the ID token's, else userinfo's for the same ``sub``),
  mapped through ``groups`` to projects and the admin role at every sign-in.

Nothing here logs or shows a token, a code or the client secret; a refusal
(:class:`SignOnError`) says which check failed.

Usage::

    relying = Relying()
    start = await relying.start(settings, redirect_uri, next_path="/chat")
    # 303 to start.url, PENDING_COOKIE = start.cookie; then, at the callback:
    person = await relying.finish(settings, redirect_uri, cookie, dict(request.query))
"""

from __future__ import annotations

import base64
import hmac
import json
import re
import secrets
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

from authlib.integrations.base_client.errors import OAuthError
from authlib.integrations.httpx_client import AsyncOAuth2Client

# authlib's client is built on httpx2 where that is installed (huggingface_hub brings it),
# else on httpx: its errors, and the transport a test gives it, are of that same module.
from authlib.integrations.httpx_client._compat import httpx2 as http
from joserfc import errors as jose_errors
from joserfc import jwt
from joserfc.jwk import KeySet

from llmgw.spec.models import OidcSettings
from llmgw.store import users

PENDING_COOKIE = "llmgw_oidc"
PENDING_PATH = "/login/oidc"
PENDING_TTL = 600
CALLBACK = "/login/oidc/callback"
DISCOVERY_TTL = 3600.0
JWKS_REFETCH = 60.0  # the least time between two reads of the keys for an unknown key id
LEEWAY = 60  # seconds of clock skew allowed on exp and iat
ASYMMETRIC = ("RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384",
              "ES512", "EdDSA")
_WORD = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
_NOT_NAME = re.compile(r"[^a-z0-9._-]+")


class SignOnError(Exception):
    """A refused sign-in: ``str()`` is for the person, ``reason`` one word for the log."""

    def __init__(self, message: str, reason: str, status: int = 401) -> None:
        super().__init__(message)
        self.reason = reason
        self.status = status


@dataclass(frozen=True)
class Start:
    url: str  # the provider's authorization endpoint, with our request
    cookie: str  # PENDING_COOKIE's value: state, nonce, verifier and where to go after


@dataclass(frozen=True)
class Person:
    """Who signed in, and what their groups grant them now."""

    subject: str  # "<issuer> <sub>"
    name: str
    admin: bool
    projects: tuple[str, ...]
    groups: tuple[str, ...]
    admin_of: tuple[str, ...] = ()  # projects they are a project admin of (in ``projects``)


@dataclass(frozen=True)
class Pending:
    state: str
    nonce: str
    verifier: str
    next: str

    def encode(self) -> str:
        raw = json.dumps([self.state, self.nonce, self.verifier, self.next]).encode()
        return base64.urlsafe_b64encode(raw).decode().rstrip("=")

    @classmethod
    def decode(cls, cookie: str | None) -> Pending | None:
        if not cookie or len(cookie) > 4096:
            return None
        try:
            fields = json.loads(base64.urlsafe_b64decode(cookie + "=" * (-len(cookie) % 4)))
        except ValueError:
            return None
        if not (isinstance(fields, list) and len(fields) == 4
                and all(isinstance(f, str) for f in fields)):
            return None
        return cls(*fields)


class Relying:
    """llmgw as an OpenID relying party: discovery and keys kept per issuer.

    ``transport`` is an async transport of authlib's HTTP module (``http``; tests
    put a real provider behind one that alters its answers); ``clock`` judges
    ``exp`` and the caches' ages.
    """

    def __init__(self, transport: Any = None, clock: Callable[[], float] = time.time) -> None:
        self.transport = transport
        self.clock = clock
        self._discovered: dict[str, tuple[float, dict[str, Any]]] = {}
        self._keys: dict[str, tuple[float, KeySet]] = {}

    def _client(self, settings: OidcSettings, redirect_uri: str) -> Any:
        return AsyncOAuth2Client(
            settings.client_id, _secret(settings), scope=" ".join(_scopes(settings)),
            redirect_uri=redirect_uri, code_challenge_method="S256",
            token_endpoint_auth_method=("client_secret_basic" if settings.client_secret_file
                                        else "none"),
            transport=self.transport, timeout=10.0)

    # -- the two legs ---------------------------------------------------------------

    async def start(self, settings: OidcSettings, redirect_uri: str, next_path: str) -> Start:
        """Where to send the browser, and the cookie that lets its return be checked."""
        meta = await self.metadata(settings)
        pending = Pending(secrets.token_urlsafe(32), secrets.token_urlsafe(32),
                          secrets.token_urlsafe(48), next_path)
        async with self._client(settings, redirect_uri) as client:
            url, _ = client.create_authorization_url(
                meta["authorization_endpoint"], state=pending.state, nonce=pending.nonce,
                code_verifier=pending.verifier)
        return Start(url, pending.encode())

    async def finish(self, settings: OidcSettings, redirect_uri: str, cookie: str | None,
                     query: Mapping[str, str]) -> tuple[Person, str]:
        """The person the callback's ``query`` proves, and where they were going."""
        pending = Pending.decode(cookie)
        if pending is None:
            raise SignOnError("this sign-in was not started in this browser, or was already "
                              "used: sign in again", "state")
        if not hmac.compare_digest(pending.state.encode(), query.get("state", "").encode()):
            raise SignOnError("the provider's answer does not belong to this sign-in (state "
                              "mismatch): sign in again", "state")
        if "error" in query:
            error = query["error"] if _WORD.match(query["error"]) else "error"
            raise SignOnError(f"the provider refused the sign-in ({error})", "provider", 403)
        code = query.get("code", "")
        if not code:
            raise SignOnError("the provider's answer has no authorization code", "code")
        meta = await self.metadata(settings)
        try:
            async with self._client(settings, redirect_uri) as client:
                token = await client.fetch_token(meta["token_endpoint"], code=code,
                                                 code_verifier=pending.verifier)
        except OAuthError as exc:
            error = exc.error if isinstance(exc.error, str) and _WORD.match(exc.error) else "?"
            raise SignOnError(f"the provider would not exchange the code ({error})",
                              "code") from None
        except (http.HTTPError, ValueError) as exc:
            raise SignOnError(f"cannot exchange the code at the provider "
                              f"({type(exc).__name__})", "provider", 502) from None
        id_token = token.get("id_token")
        if not isinstance(id_token, str):
            raise SignOnError("the provider's token answer has no ID token", "id_token")
        claims = await self.verify(settings, meta, id_token, pending.nonce)
        groups = claims.get(settings.groups_claim)
        if groups is None and meta.get("userinfo_endpoint"):
            groups = await self._userinfo_groups(settings, meta, token.get("access_token"),
                                                 claims["sub"])
        return person(settings, claims, groups), pending.next

    async def logout_url(self, settings: OidcSettings, after: str) -> str | None:
        """The provider's end-session URL (RP-initiated logout), when it has one."""
        try:
            endpoint = (await self.metadata(settings)).get("end_session_endpoint")
        except SignOnError:
            return None
        if not isinstance(endpoint, str) or not endpoint.startswith(("https://", "http://")):
            return None
        query = urlencode({"client_id": settings.client_id, "post_logout_redirect_uri": after})
        return f"{endpoint}{'&' if '?' in endpoint else '?'}{query}"

    # -- the provider's documents -----------------------------------------------------

    async def metadata(self, settings: OidcSettings) -> dict[str, Any]:
        """The provider's discovery document (kept for DISCOVERY_TTL)."""
        issuer = settings.issuer
        kept = self._discovered.get(issuer)
        if kept and self.clock() - kept[0] < DISCOVERY_TTL:
            return kept[1]
        url = issuer.rstrip("/") + "/.well-known/openid-configuration"
        meta = await self._get_json(url, "discovery document")
        if meta.get("issuer") != issuer:
            raise SignOnError(f"the provider's discovery document names another issuer than "
                              f"{issuer}: check cluster.web.oidc.issuer", "issuer", 502)
        for name in ("authorization_endpoint", "token_endpoint", "jwks_uri"):
            if not isinstance(meta.get(name), str) or not meta[name].startswith("http"):
                raise SignOnError(f"the provider's discovery document has no {name}",
                                  "provider", 502)
        self._discovered[issuer] = (self.clock(), meta)
        return meta

    async def keys(self, meta: Mapping[str, Any], kid: str | None) -> KeySet:
        """The provider's signing keys; read again when ``kid`` is not among those kept."""
        uri = meta["jwks_uri"]
        kept = self._keys.get(uri)
        if kept and (kid is None or any(k.kid == kid for k in kept[1].keys)
                     or self.clock() - kept[0] < JWKS_REFETCH):
            return kept[1]
        doc = await self._get_json(uri, "signing keys (JWKS)")
        try:
            keyset = KeySet.import_key_set(doc)  # type: ignore[arg-type]
        except (jose_errors.JoseError, ValueError, TypeError, KeyError):
            raise SignOnError("the provider's signing keys cannot be read", "provider",
                              502) from None
        self._keys[uri] = (self.clock(), keyset)
        return keyset

    async def _get_json(self, url: str, what: str,
                        headers: Mapping[str, str] | None = None) -> dict[str, Any]:
        try:
            async with http.AsyncClient(transport=self.transport, timeout=10.0) as client:
                answer = await client.get(url, headers={"Accept": "application/json",
                                                        **(headers or {})})
                answer.raise_for_status()
                doc = answer.json()
        except (http.HTTPError, ValueError) as exc:
            raise SignOnError(f"cannot read the provider's {what} ({type(exc).__name__})",
                              "provider", 502) from None
        if not isinstance(doc, dict):
            raise SignOnError(f"the provider's {what} is not a JSON object", "provider", 502)
        return doc

    async def _userinfo_groups(self, settings: OidcSettings, meta: Mapping[str, Any],
                               access_token: object, sub: str) -> object:
        try:
            info = await self._get_json(meta["userinfo_endpoint"], "userinfo",
                                        {"Authorization": f"Bearer {access_token}"})
        except SignOnError:
            return None
        if info.get("sub") != sub:
            return None  # userinfo about someone else is no evidence about this person
        return info.get(settings.groups_claim)

    # -- the ID token -----------------------------------------------------------------

    async def verify(self, settings: OidcSettings, meta: Mapping[str, Any], id_token: str,
                     nonce: str) -> dict[str, Any]:
        """The ID token's claims, once its signature and claims are checked."""
        advertised = meta.get("id_token_signing_alg_values_supported") or ["RS256"]
        algorithms = [a for a in ASYMMETRIC if a in advertised]
        try:
            header = json.loads(base64.urlsafe_b64decode(
                id_token.split(".")[0] + "=" * (-len(id_token.split(".")[0]) % 4)))
            kid = header.get("kid") if isinstance(header, dict) else None
            token = jwt.decode(id_token, await self.keys(meta, kid), algorithms=algorithms)
        except jose_errors.BadSignatureError:
            raise SignOnError("the ID token's signature does not verify", "signature") from None
        except (jose_errors.JoseError, ValueError, UnicodeDecodeError):
            raise SignOnError("the ID token cannot be verified (its form, algorithm or key "
                              "id is not the provider's)", "signature") from None
        registry = jwt.JWTClaimsRegistry(
            now=int(self.clock()), leeway=LEEWAY,
            iss={"essential": True, "value": settings.issuer},
            aud={"essential": True, "value": settings.client_id},
            exp={"essential": True}, iat={"essential": True}, sub={"essential": True},
            nonce={"essential": True, "value": nonce})
        try:
            registry.validate(token.claims)
        except jose_errors.ExpiredTokenError:
            raise SignOnError("the ID token has expired", "exp") from None
        except jose_errors.ClaimError as exc:
            raise SignOnError(f"the ID token's {exc.claim} claim is missing or not what "
                              "llmgw expects", exc.claim) from None
        claims = token.claims
        audiences = claims["aud"] if isinstance(claims["aud"], list) else [claims["aud"]]
        if len(audiences) > 1 and claims.get("azp") != settings.client_id:
            raise SignOnError("the ID token's azp claim is not this client", "azp")
        return claims


def person(settings: OidcSettings, claims: Mapping[str, Any], groups: object) -> Person:
    """Who ``claims`` name and what ``groups`` grant; SignOnError when nothing is granted.

    A purely computational function with no side effects.
    """
    listed = [groups] if isinstance(groups, str) else groups if isinstance(groups, list) else []
    mine = tuple(sorted({g for g in listed if isinstance(g, str)}))
    grants = [settings.groups[g] for g in mine if g in settings.groups]
    if not grants:
        raise SignOnError("your account at the provider is in none of the groups that give "
                          "access to llmgw: ask an admin", "groups", 403)
    claimed = claims.get(settings.username_claim)
    name = user_name(claimed if isinstance(claimed, str) and claimed else str(claims["sub"]))
    if name is None:
        raise SignOnError("the provider's name for you cannot be made a user name",
                          "name", 403)
    admin_of = tuple(sorted({p for g in grants for p in g.admin_of}))
    projects = tuple(sorted({p for g in grants for p in g.projects} | set(admin_of)))
    return Person(f"{settings.issuer} {claims['sub']}", name, any(g.admin for g in grants),
                  projects, mine, admin_of)


def user_name(claimed: str) -> str | None:
    """``claimed`` as a user name: lowercased, runs of other characters as ``-``; None if empty.

    Two claims that map to one name are two subjects: the second is refused at
    :func:`llmgw.store.users.sign_on`, so mapping never merges two people.
    """
    name = _NOT_NAME.sub("-", claimed.lower())[:63].strip("._-")
    return name if users.NAME.fullmatch(name) else None


def _scopes(settings: OidcSettings) -> list[str]:
    return ["openid", *(s for s in settings.scopes if s != "openid")]


def _secret(settings: OidcSettings) -> str | None:
    if settings.client_secret_file is None:
        return None
    try:
        secret = Path(settings.client_secret_file).read_text().strip()
    except OSError as exc:
        raise SignOnError(f"cannot read cluster.web.oidc.client_secret_file "
                          f"({exc.strerror or type(exc).__name__})", "secret", 500) from None
    if not secret:
        raise SignOnError("cluster.web.oidc.client_secret_file is empty", "secret", 500)
    return secret
