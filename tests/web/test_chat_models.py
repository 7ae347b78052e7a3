"""/chat offers only the models a person's projects allow, and sends each under one of those.

A real browser against a router with the pages (:class:`support.stacks.Stack`):
``cy`` is in two projects whose ``models:`` lists differ, so the page offers the
union and switches the project field to one that allows the chosen model; the
router still refuses a pairing the page would not make (403
``model_not_allowed``).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.stacks import Stack, cluster

from llmgw.router import Settings
from llmgw.spec.models import Cluster
from llmgw.store import users


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[Stack]:
    data = cluster().model_dump(mode="json", by_alias=True, exclude_unset=True)
    data["projects"] = {"research": {"models": ["chat"]},
                        "other": {"models": ["Coder-*"]},
                        "closed": {"models": ["steady"]}}
    made = Stack(tmp_path, Cluster.model_validate(data), Settings(), 1, pages=True)
    try:
        # Ready: chat and steady; Coder-7B starts on demand, so it is listed too.
        made.route({"chat": made.upstreams, "steady": made.upstreams})
        made.run(users.create(made.db, "cy", "cy-user-pass", projects=["other", "research"]))
        yield made
    finally:
        made.close()


def options(page: Any, selector: str) -> list[tuple[str, bool]]:
    return [(str(o.get_attribute("value")), o.is_disabled())
            for o in page.locator(f"{selector} option").all()]


def test_chat_offers_the_union_of_the_projects_models(stack: Stack, browser: Any) -> None:
    page = browser.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(f"{stack.url}/login")
    page.fill("#name", "cy")
    page.fill("#password", "cy-user-pass")
    page.click("button[type=submit]")
    page.wait_for_url(re.compile(r"/chat$"))

    assert [v for v, _ in options(page, "#model")] == ["Coder-7B", "chat"]  # not steady
    page.select_option("#model", "Coder-7B")
    assert options(page, "#project") == [("other", False), ("research", True)]
    assert page.input_value("#project") == "other"
    page.select_option("#model", "chat")
    assert options(page, "#project") == [("other", True), ("research", False)]
    assert page.input_value("#project") == "research"
    assert errors == []

    page.fill("#message", "hello")
    page.click("#send")
    page.wait_for_function("() => { const a = [...document.querySelectorAll("
                           "'.msg.assistant .text')].pop(); return a && a.dataset.done; }",
                           timeout=30_000)
    assert page.locator(".msg.assistant .text").last.get_attribute("data-done") == "yes"
    assert [(r.project, r.model, r.user_name) for r in stack.rows()] == [
        ("research", "chat", "cy")]

    # The pairing the page does not offer is refused by the router itself.
    status, code = page.evaluate("""async () => {
        const csrf = document.querySelector('meta[name="csrf-token"]').content;
        const answer = await fetch('/v1/chat/completions', {method: 'POST',
            headers: {'Content-Type': 'application/json', 'X-CSRF-Token': csrf,
                      'X-Llmgw-Project': 'other'},
            body: JSON.stringify({model: 'chat', messages: [{role: 'user', content: 'x'}]})});
        return [answer.status, (await answer.json()).error.code];
    }""")
    assert (status, code) == (403, "model_not_allowed")

    page.goto(f"{stack.url}/account")  # the connect instructions name the same models
    assert re.findall(r"<code>([^<]+)</code>", str(page.inner_html("#connect-title + p"))
                      ) == ["Coder-7B", "chat"]
    page.close()
