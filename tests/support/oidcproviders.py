"""A real OpenID provider for the single sign-on tests: node-oidc-provider on loopback.

``make oidc-provider`` installs it (npm, from ``tests/support/oidc/package-lock.json``)
into ``.cache/node``; :class:`OidcProvider` runs ``tests/support/oidc/provider.mjs``
with one client and a signing key made here, so a test can also sign tokens of its
own with the provider's key (:meth:`OidcProvider.sign`). The provider listens on a
port the kernel picks and is killed when the test ends, pass or fail.
:class:`Rewriting` is an httpx transport for llmgw's relying party that alters the
provider's token answers, as a man in the middle would.
"""

from __future__ import annotations

import base64
import json
import os
import re
import select
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from joserfc import jwt
from joserfc.jwk import RSAKey

from llmgw.web.oidcs import http  # the HTTP module authlib's client runs on

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = Path(__file__).resolve().parent / "oidc" / "provider.mjs"
MODULE = ROOT / ".cache" / "node" / "node_modules" / "oidc-provider" / "lib" / "index.js"
CLIENT_ID = "llmgw"
CLIENT_SECRET = "test-client-secret-5f1c9a"  # noqa: S105 - the test provider's own


class OidcProvider:
    def __init__(self, tmp: Path, redirect_uri: str, post_logout_uri: str, *,
                 userinfo_only: bool = False) -> None:
        if not MODULE.exists():
            pytest.skip("oidc-provider is not installed (make oidc-provider installs it)")
        self.key = RSAKey.generate_key(2048, parameters={"kid": "test-1", "use": "sig",
                                                         "alg": "RS256"}, private=True)
        self.accounts_file = tmp / "accounts.json"
        self.accounts: dict[str, dict[str, Any]] = {}
        self.set_account("alice", groups=["ml-research"])
        config = tmp / "provider.json"
        config.write_text(json.dumps({
            "module": str(MODULE), "accounts": str(self.accounts_file),
            "conform": userinfo_only,
            "jwks": {"keys": [self.key.as_dict(private=True)]},
            "client": {"client_id": CLIENT_ID, "client_secret": CLIENT_SECRET,
                       "redirect_uris": [redirect_uri],
                       "post_logout_redirect_uris": [post_logout_uri]},
        }))
        self.log = (tmp / "provider.log").open("w")
        self.process = subprocess.Popen(
            ["node", str(SCRIPT), str(config)], stdout=subprocess.PIPE, stderr=self.log,
            env={**os.environ, "NODE_ENV": "test"}, text=True)
        try:
            self.issuer = self._issuer()
        except BaseException:
            self.stop()
            raise

    def _issuer(self) -> str:
        assert self.process.stdout is not None
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            ready, _, _ = select.select([self.process.stdout], [], [], 0.5)
            if ready:
                line = self.process.stdout.readline()
                assert line, f"the provider exited: {self.log.name}"
                return str(json.loads(line)["issuer"])
            assert self.process.poll() is None, f"the provider exited: {self.log.name}"
        raise AssertionError("the provider did not start in 30 s")

    def set_account(self, login: str, **claims: Any) -> None:
        """Create or change ``login``'s claims; read by the provider at the next sign-in."""
        self.accounts[login] = claims
        part = self.accounts_file.with_suffix(".part")
        part.write_text(json.dumps(self.accounts))
        part.replace(self.accounts_file)

    def sign(self, claims: dict[str, Any]) -> str:
        """A JWT of ``claims`` signed with the provider's own key, as the provider signs."""
        return jwt.encode({"alg": "RS256", "kid": "test-1", "typ": "JWT"}, claims, self.key)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        if self.process.stdout is not None:
            self.process.stdout.close()
        self.log.close()


def claims_of(token: str) -> dict[str, Any]:
    """The payload of a compact JWT, unverified (the test reads what the provider wrote)."""
    part = token.split(".")[1]
    return dict(json.loads(base64.urlsafe_b64decode(part + "=" * (-len(part) % 4))))


def with_payload(token: str, claims: dict[str, Any]) -> str:
    """``token`` with its payload replaced and its signature kept: a tampered token."""
    header, _, signature = token.split(".")
    payload = base64.urlsafe_b64encode(json.dumps(claims).encode()).decode().rstrip("=")
    return f"{header}.{payload}.{signature}"


class Rewriting(http.AsyncBaseTransport):  # type: ignore[misc]
    """Passes every request to the real provider; ``rewrite`` alters the ID token answered
    by its token endpoint (None: nothing altered)."""

    def __init__(self) -> None:
        self.rewrite: Callable[[str], str] | None = None
        self.seen: list[str] = []  # the ID tokens the provider answered, as it sent them

    async def handle_async_request(self, request: Any) -> Any:
        async with http.AsyncClient() as client:
            answer = await client.send(http.Request(
                request.method, request.url, headers=request.headers,
                content=await request.aread()))
        headers = {k: v for k, v in answer.headers.items()
                   if k.lower() not in ("content-encoding", "content-length",
                                        "transfer-encoding")}
        body = answer.content
        if request.method == "POST" and request.url.path.endswith("/token") and answer.is_success:
            doc = json.loads(body)
            self.seen.append(doc["id_token"])
            if self.rewrite is not None:
                doc["id_token"] = self.rewrite(doc["id_token"])
            body = json.dumps(doc).encode()
        return http.Response(answer.status_code, headers=headers, content=body)


def provider_login(client: httpx.Client, llmgw: str, login: str, next_path: str = "") -> str:
    """Sign ``login`` in at the provider's page, starting at llmgw (for ``next_path``); the
    callback URL to llmgw that the provider redirected to (not yet followed)."""
    answer = client.get(f"{llmgw}/login/oidc", params={"next": next_path} if next_path else None,
                        follow_redirects=False)
    for _ in range(10):
        assert answer.status_code in (302, 303), answer.text[:300]
        location = str(answer.url.join(answer.headers["location"]))
        if location.startswith(f"{llmgw}/login/oidc/callback"):
            return location
        answer = client.get(location, follow_redirects=False)
        if answer.status_code == 200:  # the provider's login page
            action = re.search(r'<form[^>]*action="([^"]+)"', answer.text)
            assert action, answer.text[:300]
            answer = client.post(str(answer.url.join(action.group(1))), data={
                "prompt": "login", "login": login, "password": "any"},
                follow_redirects=False)
    raise AssertionError("the provider never redirected back to llmgw")
