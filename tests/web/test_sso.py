"""Single sign-on against a real OpenID provider (node-oidc-provider, started per test).

The router with the pages (:class:`support.stacks.Stack`) is llmgw; the provider
is :class:`support.oidcproviders.OidcProvider`. Over plain HTTP (httpx): what
llmgw refuses — a tampered ID token, another issuer or audience, an expired one,
a state that does not match or is replayed — and a session that outlives
``session_ttl``. In the real browser: a login through the provider's page, a
group change taking effect at the next login, and logout at both ends.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic import ValidationError
from support.oidcproviders import (
    CLIENT_ID,
    CLIENT_SECRET,
    OidcProvider,
    Rewriting,
    claims_of,
    provider_login,
    with_payload,
)
from support.stacks import Stack, cluster

from llmgw.router import Settings
from llmgw.spec import checks
from llmgw.spec.models import Cluster
from llmgw.store import users
from llmgw.web import oidcs


@dataclass
class Sso:
    stack: Stack
    provider: OidcProvider
    transport: Rewriting
    now: list[float]  # the pages' clock: now[0] seconds past the real time
    spec: Callable[..., Cluster]  # the cluster with SSO, given web settings to merge
    current: list[Cluster]

    def user(self, name: str) -> users.User | None:
        return self.stack.run(users.get(self.stack.db, name))

    def audited(self) -> list[str]:
        """The audit log's lines, oldest first: who, then what."""
        return [f"{e.actor} {e.line()}"
                for e in reversed(self.stack.run(self.stack.db.audit_entries()))]


def sso_cluster(base: Cluster, issuer: str, secret_file: Path, **web: Any) -> Cluster:
    doc = base.model_dump(mode="json", exclude_none=True)
    doc["cluster"]["web"] = {**doc["cluster"].get("web", {}), "oidc": {
        "issuer": issuer, "client_id": CLIENT_ID, "client_secret_file": str(secret_file),
        "scopes": ["openid", "profile", "groups"], "display_name": "Example ID",
        "groups": {"ml-research": {"projects": ["research"]},
                   "ml-leads": {"admin_of": ["research"]},
                   "llm-admins": {"admin": True}}}, **web}
    return Cluster.model_validate(doc)


@pytest.fixture
def sso(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Sso]:
    """llmgw and the provider; on SQLite, or where a test asks (indirect) on PostgreSQL, or
    with a provider that gives the groups at userinfo only ("userinfo")."""
    store, kind = None, getattr(request, "param", "sqlite")
    if kind == "postgresql":
        store = request.getfixturevalue("postgres_db").settings
    base = cluster(research=None, ops=None)
    current = [base]
    now = [0.0]
    transport = Rewriting()
    clock = lambda: time.time() + now[0]  # noqa: E731
    stack = Stack(tmp_path, base, Settings(), 1, store, pages=True, pages_options={
        "cluster": lambda: current[0], "clock": clock,
        "relying": oidcs.Relying(transport=transport, clock=clock)})
    provider = None
    try:
        provider = OidcProvider(tmp_path, stack.url + oidcs.CALLBACK, stack.url + "/login",
                                userinfo_only=kind == "userinfo")
        secret = tmp_path / "oidc-secret"
        secret.write_text(CLIENT_SECRET + "\n")
        spec = lambda **web: sso_cluster(base, provider.issuer, secret, **web)  # noqa: E731
        current[0] = spec()
        yield Sso(stack, provider, transport, now, spec, current)
    finally:
        if provider is not None:
            provider.stop()
        stack.close()


def sign_in(sso: Sso, client: httpx.Client, login: str = "alice") -> httpx.Response:
    callback = provider_login(client, sso.stack.url, login)
    return client.get(callback, follow_redirects=False)


@pytest.mark.parametrize("sso", ["sqlite", "postgresql"], indirect=True)
def test_a_provider_login_makes_a_user_with_its_groups_projects_and_a_session(
        sso: Sso) -> None:
    with httpx.Client(timeout=30) as client:
        answer = sign_in(sso, client)
        assert answer.status_code == 200 and 'url=/chat"' in answer.text
        assert "llmgw_session" in client.cookies
        assert client.get(f"{sso.stack.url}/account").status_code == 200
    assert sso.user("alice") == users.User(
        "alice", False, ("research",), sso.user("alice").created_at,  # type: ignore[union-attr]
        f"{sso.provider.issuer} alice")
    assert sso.audited() == ["alice login.ok user=alice method=oidc"]


def test_a_group_grants_a_project_admin_role_until_a_login_without_it(sso: Sso) -> None:
    sso.provider.set_account("alice", groups=["ml-leads"])
    with httpx.Client(timeout=30) as client:
        assert sign_in(sso, client).status_code == 200
    user = sso.user("alice")
    assert user is not None and not user.admin
    assert (user.projects, user.admin_of, user.role("research")) == (
        ("research",), ("research",), "admin")
    sso.provider.set_account("alice", groups=["ml-research"])  # left ml-leads at the provider
    with httpx.Client(timeout=30) as client:
        assert sign_in(sso, client).status_code == 200
    user = sso.user("alice")
    assert user is not None and (user.admin_of, user.role("research")) == ((), "member")


def test_a_login_for_a_page_returns_to_it_and_a_foreign_next_is_dropped(sso: Sso) -> None:
    for asked, landing in [("/account", "/account"), ("//evil.example.com/", "/chat")]:
        with httpx.Client(timeout=30) as client:
            callback = provider_login(client, sso.stack.url, "alice", next_path=asked)
            answer = client.get(callback, follow_redirects=False)
            assert answer.status_code == 200 and f'url={landing}"' in answer.text


@pytest.mark.parametrize("sso", ["userinfo"], indirect=True)
def test_groups_absent_from_the_id_token_are_read_from_userinfo(sso: Sso) -> None:
    sso.provider.set_account("alice", groups=["ml-research", "llm-admins"])
    with httpx.Client(timeout=30) as client:
        assert sign_in(sso, client).status_code == 200
    assert "groups" not in claims_of(sso.transport.seen[0]), "the ID token had the groups"
    user = sso.user("alice")
    assert user is not None and user.admin and user.projects == ("research",)


def test_the_authorization_request_uses_pkce_s256_state_and_nonce(sso: Sso) -> None:
    with httpx.Client(timeout=30) as client:
        start = client.get(f"{sso.stack.url}/login/oidc", follow_redirects=False)
    assert start.status_code == 303
    query = httpx.URL(start.headers["location"]).params
    assert query["code_challenge_method"] == "S256" and len(query["code_challenge"]) == 43
    assert query["client_id"] == CLIENT_ID and query["response_type"] == "code"
    assert len(query["state"]) >= 43 and len(query["nonce"]) >= 43
    cookie = start.headers["set-cookie"]
    assert "HttpOnly" in cookie and "SameSite=Lax" in cookie and "Path=/login/oidc" in cookie


def resign(sso: Sso, **changes: Any) -> Callable[[str], str]:
    """Re-sign the provider's ID token with the provider's own key, claims changed."""
    return lambda token: sso.provider.sign({**claims_of(token), **changes})


@pytest.mark.parametrize(("rewrite", "refusal"), [
    pytest.param(lambda sso: lambda t: with_payload(t, {**claims_of(t),
                                                         "groups": ["llm-admins"]}),
                 "signature does not verify", id="tampered-payload"),
    pytest.param(lambda sso: resign(sso, iss="https://evil.example.com"), "iss claim",
                 id="wrong-issuer"),
    pytest.param(lambda sso: resign(sso, aud="another-client"), "aud claim",
                 id="wrong-audience"),
    pytest.param(lambda sso: resign(sso, exp=int(time.time()) - 3600), "expired",
                 id="expired"),
    pytest.param(lambda sso: resign(sso, nonce="not-ours"), "nonce claim", id="wrong-nonce"),
])
def test_an_id_token_that_fails_a_check_is_refused(
        sso: Sso, rewrite: Callable[[Sso], Callable[[str], str]], refusal: str,
        caplog: pytest.LogCaptureFixture) -> None:
    sso.transport.rewrite = rewrite(sso)
    with httpx.Client(timeout=30) as client:
        answer = sign_in(sso, client)
        assert answer.status_code == 401, answer.text[:500]
        assert "single sign-on failed" in answer.text and refusal in answer.text
        assert "llmgw_session" not in client.cookies
    assert sso.user("alice") is None
    assert sso.transport.seen and sso.transport.seen[0] not in caplog.text
    [line] = sso.audited()  # refused: audited as such, with neither token nor claim text
    assert line.startswith("- login.failed ") and "method=oidc" in line
    assert sso.transport.seen[0] not in line


def test_a_token_re_signed_unchanged_with_the_providers_key_is_accepted(sso: Sso) -> None:
    """The control of the test above: its own signing is what the provider's is."""
    sso.transport.rewrite = resign(sso)
    with httpx.Client(timeout=30) as client:
        assert sign_in(sso, client).status_code == 200
    assert sso.user("alice") is not None


def test_a_mismatched_or_replayed_state_is_refused(sso: Sso) -> None:
    with httpx.Client(timeout=30) as client:
        callback = provider_login(client, sso.stack.url, "alice")
        url = httpx.URL(callback)
        forged = url.copy_set_param("state", "é" + "x" * 42)  # not even ASCII: still a 401
        answer = client.get(forged, follow_redirects=False)
        assert answer.status_code == 401 and "state mismatch" in answer.text
        # The refusal spent the pending sign-in: even the right state is now refused.
        answer = client.get(callback, follow_redirects=False)
        assert answer.status_code == 401 and "not started in this browser" in answer.text
    with httpx.Client(timeout=30) as client:
        callback = provider_login(client, sso.stack.url, "alice")
        pending = client.cookies["llmgw_oidc"]
        assert client.get(callback, follow_redirects=False).status_code == 200
        replay = client.get(callback, follow_redirects=False)
        assert replay.status_code == 401 and "not started in this browser" in replay.text
        # Even with the pending cookie put back, the code is spent at the provider.
        client.cookies.set("llmgw_oidc", pending, path="/login/oidc")
        replay = client.get(callback, follow_redirects=False)
        assert replay.status_code == 401 and "would not exchange the code" in replay.text


def test_a_provider_whose_discovery_names_another_issuer_is_refused(sso: Sso) -> None:
    sso.current[0] = sso_cluster(sso.current[0], sso.provider.issuer + "/",
                                 Path(sso.current[0].cluster.web.oidc.client_secret_file or ""))
    with httpx.Client(timeout=30) as client:
        answer = client.get(f"{sso.stack.url}/login/oidc", follow_redirects=False)
    assert answer.status_code == 502 and "names another issuer" in answer.text


def test_a_session_ends_at_session_ttl(sso: Sso) -> None:
    with httpx.Client(timeout=30) as client:
        assert sign_in(sso, client).status_code == 200
        assert client.get(f"{sso.stack.url}/account").status_code == 200
        sso.now[0] = 43200 + 1  # the default session_ttl, 12 h, has passed
        answer = client.get(f"{sso.stack.url}/account")
        assert answer.status_code == 303 and answer.headers["location"].startswith("/login")


def test_a_person_in_no_mapped_group_or_on_a_local_name_is_refused(sso: Sso) -> None:
    sso.provider.set_account("carol", groups=["marketing"])
    sso.stack.run(users.create(sso.stack.db, "bob", "bob-user-pass"))
    sso.provider.set_account("bob", groups=["llm-admins"])
    with httpx.Client(timeout=30) as client:
        answer = sign_in(sso, client, "carol")
        assert answer.status_code == 403 and "none of the groups" in answer.text
    with httpx.Client(timeout=30) as client:
        answer = sign_in(sso, client, "bob")
        assert answer.status_code == 403 and "belongs to another account" in answer.text
    bob = sso.user("bob")
    assert sso.user("carol") is None and bob is not None and not bob.admin


def test_with_local_logins_off_only_sso_signs_in(sso: Sso) -> None:
    sso.stack.run(users.create(sso.stack.db, "bob", "bob-user-pass"))
    sso.current[0] = sso.spec(local_logins=False)
    with httpx.Client(timeout=30) as client:
        form = client.get(f"{sso.stack.url}/login").text
        assert "Sign in with Example ID" in form and 'name="password"' not in form
        answer = client.post(f"{sso.stack.url}/login", data={
            "name": "bob", "password": "bob-user-pass", "csrf": "x"})
        assert answer.status_code == 403 and "local logins are off" in answer.text
        assert sign_in(sso, client).status_code == 200


# -- in the browser ----------------------------------------------------------------------

def browser_sign_in(page: Any, sso: Sso, login: str) -> None:
    page.goto(f"{sso.stack.url}/login", wait_until="domcontentloaded")
    page.click("text=Sign in with Example ID")
    page.wait_for_selector("input[name=login]")
    page.fill("input[name=login]", login)
    page.fill("input[name=password]", "any password")
    page.click("button[type=submit]")


def test_a_login_through_the_providers_page_lands_on_chat_signed_in(
        sso: Sso, browser: Any) -> None:
    page = browser.new_page()
    browser_sign_in(page, sso, "alice")
    page.wait_for_url(f"{sso.stack.url}/chat")
    assert page.text_content(".who") == "alice"
    assert page.locator("nav >> text=Admin").count() == 0


@pytest.mark.parametrize("sso", ["sqlite", "postgresql"], indirect=True)
def test_a_group_change_takes_effect_at_the_next_login_and_logout_ends_both(
        sso: Sso, browser: Any) -> None:
    page = browser.new_page()
    browser_sign_in(page, sso, "alice")
    page.wait_for_url(f"{sso.stack.url}/chat")
    sso.provider.set_account("alice", groups=["ml-research", "llm-admins"])
    page.goto(f"{sso.stack.url}/account", wait_until="domcontentloaded")
    assert page.text_content(".who") == "alice", "a group change waits for the next login"
    user = sso.user("alice")
    assert user is not None and not user.admin
    # Logout: llmgw's session ends, then the provider's (its own confirmation page).
    page.click("header button:has-text('Log out')")
    page.wait_for_url(f"{sso.provider.issuer}/**")
    page.click("button[autofocus]")  # "Yes, sign me out"
    page.wait_for_url(f"{sso.stack.url}/login")
    assert page.goto(f"{sso.stack.url}/account").url.startswith(f"{sso.stack.url}/login")
    # The provider asks for the login again (its session ended too); the new groups count.
    browser_sign_in(page, sso, "alice")
    page.wait_for_url(f"{sso.stack.url}/admin")
    assert page.text_content(".who") == "alice (admin)"
    user = sso.user("alice")
    assert user is not None and user.admin and user.projects == ("research",)


# -- the configuration -------------------------------------------------------------------

@pytest.mark.parametrize(("web", "error"), [
    pytest.param({"local_logins": False}, "local_logins: false needs oidc", id="nobody-logs-in"),
    pytest.param({"oidc": {"issuer": "http://idp.example.com", "client_id": "llmgw"}},
                 "https URL", id="plain-http-issuer"),
    pytest.param({"oidc": {"issuer": "https://idp.example.com", "client_id": "llmgw",
                           "client_secret_file": "s3cret-value"}},
                 "absolute path to a file, not the secret itself; got a value of 12",
                 id="secret-inline"),
])
def test_a_web_section_that_cannot_work_is_refused(web: dict[str, Any], error: str) -> None:
    doc = cluster().model_dump(mode="json", exclude_none=True)
    doc["cluster"]["web"] = web
    with pytest.raises(ValidationError, match=error) as raised:
        Cluster.model_validate(doc)
    # What `llmgw validate` prints of an error is its message: never the secret.
    assert all("s3cret-value" not in e["msg"] for e in raised.value.errors())


def test_a_group_granting_an_undefined_project_is_a_located_problem(tmp_path: Path) -> None:
    spec = sso_cluster(cluster(research=None), "https://idp.example.com", tmp_path / "s")
    doc = spec.model_dump(mode="json", exclude_none=True)
    doc["cluster"]["web"]["oidc"]["groups"]["contractors"] = {"projects": ["reserch"]}
    problems = [p for p in checks.check(Cluster.model_validate(doc)) if p.path[0] == "cluster"]
    assert [(p.path, p.message) for p in problems] == [(
        ("cluster", "web", "oidc", "groups", "contractors", "projects", 0),
        "group 'contractors' grants project 'reserch', which is not defined "
        "(projects: research)")]
    assert [p for p in checks.check(spec) if p.path[0] == "cluster"] == []
    doc["cluster"]["web"]["oidc"]["groups"]["contractors"] = {"admin_of": ["research", "opz"]}
    problems = [p for p in checks.check(Cluster.model_validate(doc)) if p.path[0] == "cluster"]
    assert [(p.path, p.message) for p in problems] == [(
        ("cluster", "web", "oidc", "groups", "contractors", "admin_of", 1),
        "group 'contractors' grants the admin role of project 'opz', which is not defined "
        "(projects: research)")]


@pytest.mark.parametrize(("claimed", "name"), [
    ("alice", "alice"), ("Alice.Smith@Corp", "alice.smith-corp"),
    ("  bob  ", "bob"), ("ÉVE", "ve"), ("@@@", None), ("x" * 80, "x" * 63),
])
def test_a_claimed_name_becomes_a_valid_user_name_or_none(claimed: str, name: str | None) -> None:
    assert oidcs.user_name(claimed) == name
