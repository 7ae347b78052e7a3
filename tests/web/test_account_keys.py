"""/account's keys: whose they are, who may revoke them, and a new secret shown once.

A router with the pages (:class:`support.stacks.Stack`). The rules of who sees
which key are checked over plain HTTP on both stores, the revocation refused
by posting the form directly (not by finding the button missing); the
create-reload-back sequence in a real browser.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from support.stacks import Stack, cluster

from llmgw.router import Settings
from llmgw.spec.models import Cluster
from llmgw.store import keys, users

SECRET = re.compile(r"llmgw_[0-9a-f]{12}_[A-Za-z0-9_-]{43}")
PASSWORD = "a-long-password"


def spec() -> Cluster:
    data = cluster(research=None, other=None).model_dump(mode="json", by_alias=True,
                                                         exclude_unset=True)
    return Cluster.model_validate(data)


def open_stack(tmp_path: Path, store: dict[str, str] | None) -> Stack:
    made = Stack(tmp_path, spec(), Settings(), 1, store, pages=True)
    made.route({"chat": made.upstreams})
    made.run(users.create(made.db, "bob", PASSWORD, projects=["research"]))
    made.run(users.create(made.db, "cy", PASSWORD, projects=["research", "other"]))
    made.run(users.create(made.db, "dana", PASSWORD, projects=["other"],
                          admin_of=["research"]))
    made.run(users.create(made.db, "root", PASSWORD, admin=True))
    return made


@pytest.fixture
def stack(tmp_path: Path, store_settings: dict[str, str]) -> Iterator[Stack]:
    made = open_stack(tmp_path, store_settings)
    try:
        yield made
    finally:
        made.close()


class Person:
    """An HTTP client logged in as ``name``."""

    def __init__(self, stack: Stack, name: str) -> None:
        self.base = stack.url
        self.client = httpx.Client(timeout=30)
        form = self.client.get(f"{self.base}/login").text
        token = re.search(r'name="csrf" value="([^"]+)"', form)
        assert token
        answer = self.client.post(f"{self.base}/login", data={
            "name": name, "password": PASSWORD, "csrf": token.group(1)})
        assert answer.status_code == 303, answer.text
        self.csrf = re.findall(r'name="csrf-token" content="([^"]+)"', self.account())[0]

    def account(self) -> str:
        answer = self.client.get(f"{self.base}/account")
        assert answer.status_code == 200
        return answer.text

    def create(self, project: str = "research", name: str = "") -> str:
        """A new key's secret, as the redirected page shows it."""
        answer = self.client.post(f"{self.base}/account/keys", data={
            "project": project, "name": name, "csrf": self.csrf})
        assert answer.status_code == 303 and answer.headers["location"] == "/account"
        assert not SECRET.search(answer.headers["location"])
        found = SECRET.findall(self.account())
        assert len(set(found)) == 1, "the new secret is on the page after the redirect"
        return found[0]

    def listed(self) -> set[str]:
        return set(re.findall(r"Revoke key ([0-9a-f]{12})", self.account()))

    def revoke(self, key_id: str) -> int:
        return self.client.post(f"{self.base}/account/keys/{key_id}/revoke",
                                data={"csrf": self.csrf}).status_code

    def close(self) -> None:
        self.client.close()


def key_id(secret: str) -> str:
    found = keys.key_id_of(secret)
    assert found
    return found


def active(stack: Stack) -> set[str]:
    return {k.id for k in stack.run(keys.list_all(stack.db)) if k.active}


def test_a_member_sees_and_revokes_only_their_own_keys(stack: Stack) -> None:
    bob, cy, dana, root = (Person(stack, n) for n in ("bob", "cy", "dana", "root"))
    try:
        bobs = key_id(bob.create())
        cys = key_id(cy.create())
        cys_other = key_id(cy.create("other"))
        cli = key_id(stack.key("research"))  # `llmgw keys create`: no owner
        owners = {k.id: k.owner for k in stack.run(keys.list_all(stack.db))}
        assert owners == {bobs: "bob", cys: "cy", cys_other: "cy", cli: None}

        assert bob.listed() == {bobs}
        assert cy.listed() == {cys, cys_other}
        # dana admins research (all its keys, the CLI's too) and is a member of other.
        assert dana.listed() == {bobs, cys, cli}
        assert root.listed() == {bobs, cys, cys_other, cli}
        page = dana.account()
        assert "<th scope=\"col\">Owner</th>" in page and "llmgw keys" in page
        assert "Owner</th>" not in bob.account()

        # Refused on the server, whatever the page shows: another member's key, a key
        # without an owner, a key of another project, a key that does not exist.
        for other in (cys, cli, cys_other, "000000000000"):
            assert bob.revoke(other) == 403
        assert dana.revoke(cys_other) == 403  # dana is only a member of `other`
        assert active(stack) == {bobs, cys, cys_other, cli}

        assert bob.revoke(bobs) == 303
        assert dana.revoke(cys) == 303 and dana.revoke(cli) == 303
        assert root.revoke(cys_other) == 303
        assert active(stack) == set()
    finally:
        for person in (bob, cy, dana, root):
            person.close()


def test_a_role_set_on_the_command_line_takes_effect_on_the_next_page(stack: Stack) -> None:
    bob, cy = Person(stack, "bob"), Person(stack, "cy")
    try:
        cys = key_id(cy.create())
        assert bob.revoke(cys) == 403
        stack.run(users.set_role(stack.db, "bob", "research", "admin"))
        assert cys in bob.listed()
        assert bob.revoke(cys) == 303
    finally:
        bob.close()
        cy.close()


def test_a_created_secret_is_shown_once_and_a_reload_creates_nothing(
    tmp_path: Path, browser: Any,
) -> None:
    stack = open_stack(tmp_path, None)
    try:
        page = browser.new_page()
        urls: list[str] = []
        page.on("request", lambda r: urls.append(r.url))
        page.goto(f"{stack.url}/login")
        page.fill("#name", "bob")
        page.fill("#password", PASSWORD)
        page.click("button[type=submit]")
        page.wait_for_url(re.compile(r"/chat$"))
        page.goto(f"{stack.url}/account")
        page.fill("#key-name", "laptop")
        page.click("text=Create key")
        page.wait_for_selector("#secret")
        assert page.url == f"{stack.url}/account", "the POST ends on a GET of /account"
        secret = str(page.text_content("#secret")).strip()
        assert SECRET.fullmatch(secret)
        assert page.content().count(secret) >= 1
        made = stack.run(keys.list_all(stack.db))
        assert [(k.owner, k.active) for k in made] == [("bob", True)]

        page.reload()  # a GET again: no second key, and the secret is gone
        assert len(stack.run(keys.list_all(stack.db))) == 1
        assert page.locator("#secret").count() == 0 and secret not in page.content()
        assert page.locator("text=Revoke").count() == 1

        page.goto(f"{stack.url}/chat")
        page.go_back()  # back to /account: fetched anew (no-store), still no secret
        page.wait_for_url(re.compile(r"/account$"))
        assert secret not in page.content()
        assert len(stack.run(keys.list_all(stack.db))) == 1
        assert not [u for u in urls if secret in u or key_id(secret) in u and "revoke" not in u]
        assert not [c for c in page.context.cookies() if c["name"] == "llmgw_new_key"]
        page.close()
    finally:
        stack.close()
