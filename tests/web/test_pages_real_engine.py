"""The pages in a real browser, in front of the real engine (llama-server, Gemma 3 270M).

One daemon for the module: users ada (admin), bob (project research, which
keeps no conversations) and cy (project notes, which keeps them for 30 days).
Chromium logs in, streams a chat answer, creates a key on /account that the
official openai client then uses, revokes it, logs out; CSRF and expired
sessions are refused; the main flows work from the keyboard alone; and with
conversations off, the text of a chat is nowhere on disk or in the logs.
"""

from __future__ import annotations

import contextlib
import re
import sqlite3
import time
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from support.pages import PASSWORDS, Server, login, needs_engine, ready, serve_real, shot
from support.waits import wait_until

from llmgw.router import keycaches

pytestmark = needs_engine

PROJECTS = {"research": {"budget_usd": 50},
            "notes": {"conversations": {"retention": "30d"}}}
USERS = {"ada": ["--admin"], "bob": ["--project", "research"], "cy": ["--project", "notes"]}


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    server = serve_real(tmp_path_factory.mktemp("web"), PROJECTS, USERS)
    try:
        server.wait(ready, "the model to be ready")
        yield server
    finally:
        server.stop()


def chat(page: Any, message: str, system: str = "") -> str:
    """Send ``message`` on /chat and wait for the streamed answer; returns it."""
    page.fill("#max-tokens", "40")
    if system:
        page.fill("#system", system)
    page.fill("#message", message)
    page.click("#send")
    answer = page.locator(".msg.assistant .text").last
    page.wait_for_function(
        "() => { const a = [...document.querySelectorAll('.msg.assistant .text')].pop();"
        " return a && a.dataset.done; }", timeout=120_000)
    assert answer.get_attribute("data-done") == "yes", page.text_content("#status")
    return str(answer.text_content())


def test_login_chat_key_on_account_then_openai_then_logout(served: Server, browser: Any) -> None:
    page = browser.new_page(viewport={"width": 1100, "height": 900})
    login(page, served.url, "bob")
    assert page.url.endswith("/chat")

    # A streamed answer from the real engine: several chunks, text on the page.
    text = chat(page, "Write one short sentence about the sea.",
                system="You are a poet. Answer in one sentence.")
    assert text.strip()
    chunks = int(page.locator(".msg.assistant .text").last.get_attribute("data-chunks") or 0)
    assert chunks > 1, "the answer arrived in one piece: not streamed"
    shot(page, "chat.png")

    # /account: create a key (shown once), use it with the openai client, revoke it.
    page.click("nav >> text=Account")
    page.select_option("#key-project", "research")
    page.fill("#key-name", "laptop")
    page.click("text=Create key")
    secret = str(page.text_content("#secret")).strip()
    assert re.fullmatch(r"llmgw_[0-9a-f]{12}_[A-Za-z0-9_-]{43}", secret)
    assert page.text_content("#endpoint") == f"{served.url}/v1"
    client = openai.OpenAI(base_url=f"{served.url}/v1", api_key=secret, max_retries=0)
    reply = client.chat.completions.create(
        model="gemma3-270m", messages=[{"role": "user", "content": "Say hi."}], max_tokens=8)
    assert reply.choices[0].message.content
    page.goto(f"{served.url}/account")
    assert secret not in page.content(), "a key's secret is shown only once"
    key_id = secret.split("_")[1]
    page.click(f"[aria-label='Revoke key {key_id}']")
    assert "revoked" in str(page.text_content(f"tr:has-text('{key_id}')"))
    shot(page, "account.png")

    def refused() -> bool:
        try:
            client.models.list()
        except openai.AuthenticationError:
            return True
        return False

    # the routers' key cache lets a revoked key go within the stated bound (docs/ha.md)
    wait_until(refused, timeout=keycaches.REVOCATION_BOUND)

    # The chat's spend is charged to bob's project and shown to him.
    assert "Your own requests from this site: " in page.content()
    assert "0 requests" not in str(page.text_content("#usage-title + p"))

    # Logout ends the session: the pages send us back to the login.
    page.click("text=Log out")
    page.wait_for_url(re.compile(r"/login$"))
    page.goto(f"{served.url}/account")
    assert "/login" in page.url
    page.close()


def test_with_conversations_off_no_text_is_stored_anywhere(
    served: Server, browser: Any
) -> None:
    marker = f"zebra-marker-{time.monotonic_ns()}"
    page = browser.new_page()
    login(page, served.url, "bob")
    assert "Nothing you type here is stored" in page.content()
    chat(page, f"Repeat this word: {marker}", system=f"Context {marker}")
    page.close()
    served.llmgw("users", "list")  # any CLI run: the store's WAL is checkpointed by readers
    files = [p for p in served.store_dir.rglob("*") if p.is_file() and p.suffix != ".gguf"]
    files.append(served.log)
    assert any(p.name == "llmgw.db" for p in files)
    for path in files:
        assert marker.encode() not in path.read_bytes(), f"{marker} found in {path}"
    with sqlite3.connect(served.store_dir / "llmgw.db") as db:
        assert db.execute("SELECT COUNT(*) FROM messages").fetchone() == (0,)
    # The server refuses to keep a conversation for a project that keeps none.
    with contextlib.closing(_session(served, "bob")) as session:
        refused = session.post(f"{served.url}/chat/conversations", json={
            "project": "research", "turns": [{"role": "user", "content": marker}]},
            headers={"X-CSRF-Token": session.csrf})
    assert refused.status_code == 403


def test_a_project_that_keeps_conversations_lists_and_deletes_them(
    served: Server, browser: Any
) -> None:
    page = browser.new_page(viewport={"width": 1100, "height": 800})
    login(page, served.url, "cy")
    chat(page, "Name a colour.")
    page.goto(f"{served.url}/chat")
    entry = page.locator("aside li a").first
    assert entry.text_content() == "Name a colour."
    entry.click()
    assert page.locator(".msg.user .text").first.text_content() == "Name a colour."
    shot(page, "conversations.png")
    with sqlite3.connect(served.store_dir / "llmgw.db") as db:
        assert db.execute("SELECT COUNT(*) FROM conversations WHERE user_name = 'cy'"
                          ).fetchone() == (1,)
    page.click("[aria-label='Delete conversation Name a colour.']")
    page.wait_for_url(re.compile(r"/chat$"))
    assert "none yet" in str(page.text_content("aside"))
    with sqlite3.connect(served.store_dir / "llmgw.db") as db:
        assert db.execute("SELECT COUNT(*) FROM messages").fetchone() == (0,)
    page.close()


def test_csrf_is_required_and_an_expired_session_logs_out(
    served: Server, browser: Any
) -> None:
    with contextlib.closing(_session(served, "bob")) as session:
        # A form posted without (or with the wrong) CSRF token is refused.
        for token in ("", "forged"):
            answer = session.post(f"{served.url}/account/keys",
                                  data={"project": "research", "csrf": token})
            assert answer.status_code == 403, answer.text
        # So is a chat request carrying the cookie but not the token (a cross-site post).
        answer = session.post(f"{served.url}/v1/chat/completions", headers={
            "X-Llmgw-Project": "research"}, json={"model": "gemma3-270m", "messages": []})
        assert answer.status_code == 403 and "CSRF" in answer.text
        # The login form needs its own double-submit token.
        bare = httpx.post(f"{served.url}/login", data={"name": "bob", "password": "x"})
        assert bare.status_code == 403
        # With the token, the same form is accepted.
        answer = session.post(f"{served.url}/account/keys",
                              data={"project": "research", "csrf": session.csrf})
        assert answer.status_code == 303

    page = browser.new_page()
    login(page, served.url, "bob")
    with sqlite3.connect(served.store_dir / "llmgw.db") as db:
        db.execute("UPDATE sessions SET expires_at = ? WHERE user_name = 'bob'",
                   (time.time() - 1,))
    page.goto(f"{served.url}/account")
    assert page.url.endswith("/login?next=/account")
    page.close()


def test_keyboard_only_login_chat_account_and_logout(served: Server, browser: Any) -> None:
    page = browser.new_page()
    page.goto(f"{served.url}/login")
    # The login form focuses the name field; Tab moves to the password; Enter submits.
    page.wait_for_function("document.activeElement && document.activeElement.id === 'name'")
    page.keyboard.type("bob")
    page.keyboard.press("Tab")
    page.keyboard.type(PASSWORDS["bob"])
    page.keyboard.press("Enter")
    page.wait_for_url(re.compile(r"/chat$"))

    def tab_to(selector: str, limit: int = 40) -> None:
        for _ in range(limit):
            page.keyboard.press("Tab")
            if page.evaluate(f"document.activeElement.matches({selector!r})"):
                return
        raise AssertionError(f"Tab never reached {selector}")

    # The first Tab reaches the skip link; then the navigation.
    page.keyboard.press("Tab")
    assert page.evaluate("document.activeElement.textContent") == "Skip to content"
    tab_to("#message")
    page.keyboard.type("Say yes.")
    page.keyboard.press("Control+Enter")
    page.wait_for_function("() => document.querySelector('.msg.assistant .text')"
                           " && document.querySelector('.msg.assistant .text').dataset.done",
                           timeout=120_000)
    page.goto(f"{served.url}/chat")
    tab_to("nav a[href='/account']")
    page.keyboard.press("Enter")
    page.wait_for_url(re.compile(r"/account$"))
    tab_to("#key-name")
    page.keyboard.type("by keyboard")
    page.keyboard.press("Enter")
    page.wait_for_selector("#secret")
    tab_to(".logout button")
    page.keyboard.press("Enter")
    page.wait_for_selector("#password")
    assert page.url.endswith("/login")
    page.close()


class _Session(httpx.Client):
    csrf: str


def _session(served: Server, name: str) -> _Session:
    """An HTTP client logged in as ``name``, with the session's CSRF token at hand."""
    client = _Session(follow_redirects=False, timeout=30)
    form = client.get(f"{served.url}/login").text
    token = re.search(r'name="csrf" value="([^"]+)"', form)
    assert token
    answer = client.post(f"{served.url}/login", data={
        "name": name, "password": PASSWORDS[name], "csrf": token.group(1)})
    assert answer.status_code == 303, answer.text
    page = client.get(f"{served.url}/account").text
    csrf = re.search(r'<meta name="csrf-token" content="([^"]+)"', page)
    assert csrf
    client.csrf = csrf.group(1)
    return client
