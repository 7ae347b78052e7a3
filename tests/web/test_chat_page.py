"""/chat in a real browser: a saved conversation reopens, and a message never lands in a URL.

A router with the pages (:class:`support.stacks.Stack`) in front of a test
upstream, driven by Debian's chromium. The saved conversation holds the text
that broke the page — quotes, ``&``, ``<`` and a ``</script>`` — and the test
records every URL the page requested and every script error.
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
from llmgw.store import conversations, users

SAVED = 'He said "hi" & left <b>early</b></script><script>alert(1)</script> it\'s fine'
ANSWER = "Noted: 'quotes' & <tags>."
FOLLOW_UP = "my private follow-up zebra-7731"


@pytest.fixture
def chat_stack(tmp_path: Path) -> Iterator[tuple[Stack, str]]:
    data = cluster(research=None).model_dump(mode="json", by_alias=True, exclude_unset=True)
    data["projects"] = {"notes": {"conversations": {"retention": "30d"}}}
    made = Stack(tmp_path, Cluster.model_validate(data), Settings(), 1, pages=True)
    try:
        made.route({"chat": made.upstreams})
        made.run(users.create(made.db, "cy", "cy-user-pass", projects=["notes"]))
        cid = made.run(conversations.create(made.db, "cy", "notes", "quotes", now=1.0))
        made.run(conversations.append(made.db, cid, "cy", [("user", SAVED),
                                                           ("assistant", ANSWER)], now=2.0))
        yield made, cid
    finally:
        made.close()


def test_a_reopened_conversation_continues_and_no_text_reaches_a_url(
    chat_stack: tuple[Stack, str], browser: Any,
) -> None:
    stack, cid = chat_stack
    page = browser.new_page()
    requested: list[str] = []
    errors: list[str] = []
    page.on("request", lambda r: requested.append(r.url))
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(f"{stack.url}/login")
    page.fill("#name", "cy")
    page.fill("#password", "cy-user-pass")
    page.click("button[type=submit]")
    page.wait_for_url(re.compile(r"/chat$"))

    page.goto(f"{stack.url}/chat?c={cid}")
    shown = page.locator(".msg .text")
    assert [shown.nth(0).text_content(), shown.nth(1).text_content()] == [SAVED, ANSWER]
    page.select_option("#model", "chat")
    page.fill("#message", FOLLOW_UP)
    page.click("#send")
    page.wait_for_function(  # the answer streamed in, or the browser left the page
        "() => { const a = [...document.querySelectorAll('.msg.assistant .text')].pop();"
        " return (a && a.dataset.done) || !location.search.startsWith('?c='); }",
        timeout=30_000)
    assert errors == [], f"the page's script failed: {errors}"
    assert page.url == f"{stack.url}/chat?c={cid}", "the form was submitted natively"
    assert page.locator(".msg.assistant .text").last.get_attribute("data-done") == "yes", \
        page.text_content("#status")

    # The engine got the saved history, exactly, then the follow-up.
    sent = stack.upstreams[0].received[-1].body["messages"]
    assert sent == [{"role": "user", "content": SAVED}, {"role": "assistant", "content": ANSWER},
                    {"role": "user", "content": FOLLOW_UP}]
    # No message text in any URL the page asked for.
    for url in requested:
        assert "zebra-7731" not in url and "zebra" not in url, url
        assert "early" not in url, url
    # The follow-up was kept with the conversation.
    kept = stack.run(conversations.messages(stack.db, cid))
    assert [m.content for m in kept][-2] == FOLLOW_UP
    page.close()


def test_without_the_script_send_posts_and_puts_no_text_in_the_url(
    chat_stack: tuple[Stack, str], browser: Any,
) -> None:
    stack, _ = chat_stack
    context = browser.new_context(java_script_enabled=False)
    page = context.new_page()
    requests: list[tuple[str, str]] = []
    navigations: list[tuple[str, str]] = []
    page.on("request", lambda r: requests.append((r.method, r.url)))
    page.on("request", lambda r: r.is_navigation_request() and navigations.append(
        (r.method, r.url)))
    page.goto(f"{stack.url}/login")
    page.fill("#name", "cy")
    page.fill("#password", "cy-user-pass")
    page.click("button[type=submit]")
    page.wait_for_url(re.compile(r"/chat$"))
    page.fill("#message", FOLLOW_UP)
    with page.expect_navigation():
        page.click("#send")
    assert navigations[-1] == ("POST", f"{stack.url}/chat"), navigations
    assert not [url for _, url in requests if "zebra" in url], requests
    context.close()
