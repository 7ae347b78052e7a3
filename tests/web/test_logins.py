"""Users, sessions, login limits, escaping and the admin token, over real HTTP.

A router with the pages (:class:`support.stacks.Stack`) on a loopback port,
talked to with httpx: no browser needed for what is plain HTTP.
"""

from __future__ import annotations

import contextlib
import re
import sqlite3
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from support.stacks import Stack, cluster

from llmgw.daemon import admin
from llmgw.router import Settings
from llmgw.store import users
from llmgw.web.logins import Limiter


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[Stack]:
    made = Stack(tmp_path, cluster(research=None), Settings(), 1, pages=True)
    made.route({"chat": made.upstreams})
    users.create(made.sqlite, "bob", "bob-user-pass", projects=["research"])
    try:
        yield made
    finally:
        made.close()


def login(client: httpx.Client, base: str, name: str, password: str) -> httpx.Response:
    form = client.get(f"{base}/login").text
    token = re.search(r'name="csrf" value="([^"]+)"', form)
    assert token
    return client.post(f"{base}/login", data={"name": name, "password": password,
                                              "csrf": token.group(1)})


def csrf_of(client: httpx.Client, base: str) -> str:
    found = re.search(r'<meta name="csrf-token" content="([^"]+)"',
                      client.get(f"{base}/account").text)
    assert found
    return found.group(1)


def test_passwords_are_stored_as_argon2id_hashes(stack: Stack) -> None:
    stored = stack.sqlite.execute("SELECT password FROM users WHERE name = 'bob'").fetchone()[0]
    assert stored.startswith("$argon2id$") and "bob-user-pass" not in stored
    assert users.authenticate(stack.sqlite, "bob", "bob-user-pass") is not None
    assert users.authenticate(stack.sqlite, "bob", "bob-user-pasS") is None
    assert users.authenticate(stack.sqlite, "nobody", "bob-user-pass") is None


def test_the_session_cookie_is_httponly_and_samesite_and_logout_ends_it(stack: Stack) -> None:
    with httpx.Client(timeout=30) as client:
        answer = login(client, stack.url, "bob", "bob-user-pass")
        assert answer.status_code == 303 and answer.headers["location"] == "/chat"
        cookie = answer.headers["set-cookie"]
        assert "HttpOnly" in cookie and "SameSite=Strict" in cookie and "Secure" not in cookie
        token = client.cookies["llmgw_session"]
        assert stack.sqlite.execute("SELECT COUNT(*) FROM sessions WHERE digest = ?",
                                (token,)).fetchone() == (0,), "only the token's hash is stored"
        csrf = csrf_of(client, stack.url)
        assert client.post(f"{stack.url}/logout", data={"csrf": csrf}).status_code == 303
        # The old cookie, replayed, no longer opens a page.
        replay = httpx.get(f"{stack.url}/account", cookies={"llmgw_session": token})
        assert replay.status_code == 303 and replay.headers["location"].startswith("/login")


def test_failed_logins_are_limited_even_for_the_right_password(stack: Stack) -> None:
    with httpx.Client(timeout=30) as client:
        codes = [login(client, stack.url, "bob", "wrong-guess").status_code for _ in range(10)]
        assert codes == [401] * 10
        blocked = login(client, stack.url, "bob", "bob-user-pass")
        assert blocked.status_code == 429 and int(blocked.headers["retry-after"]) > 0
        assert "llmgw_session" not in blocked.headers.get("set-cookie", "")


def test_the_limiter_forgets_failures_after_its_window() -> None:
    now = [1000.0]
    limiter = Limiter(window=60, per_client=3, per_user=2, clock=lambda: now[0])
    limiter.failed("10.0.0.1", "bob")
    assert limiter.retry_after("10.0.0.1", "bob") == 0
    limiter.failed("10.0.0.2", "bob")
    assert limiter.retry_after("10.0.0.3", "bob") > 0  # per user, from any address
    assert limiter.retry_after("10.0.0.3", "cy") == 0
    now[0] += 61
    assert limiter.retry_after("10.0.0.3", "bob") == 0


def test_free_text_is_escaped_on_the_pages(stack: Stack) -> None:
    evil = '<script>alert("x")</script>'
    with httpx.Client(timeout=30) as client:
        login(client, stack.url, "bob", "bob-user-pass")
        csrf = csrf_of(client, stack.url)
        page = client.post(f"{stack.url}/account/keys",
                           data={"project": "research", "name": evil, "csrf": csrf})
        assert page.status_code == 201
        assert evil not in page.text and "&lt;script&gt;alert(" in page.text
        assert "script-src 'self'" in page.headers["content-security-policy"]
        assert page.headers["x-frame-options"] == "DENY"


def test_a_login_redirect_stays_on_this_site(stack: Stack) -> None:
    with httpx.Client(timeout=30) as client:
        form = client.get(f"{stack.url}/login", params={"next": "//evil.example/x"}).text
        assert "evil.example" not in form


def test_the_admin_token_file_is_owner_only(tmp_path: Path) -> None:
    token = admin.ensure_token(tmp_path)
    path = tmp_path / admin.TOKEN_FILE
    assert len(token) >= 43 and stat.S_IMODE(path.stat().st_mode) == 0o600
    assert admin.ensure_token(tmp_path) == token


CLUSTER_YAML = """
cluster: {name: lab}
projects: {research: {}}
"""


@pytest.mark.parametrize(
    ("args", "stdin", "message"),
    [
        pytest.param(["Bob"], "long-enough-pw\n", "invalid user name 'Bob'", id="bad-name"),
        pytest.param(["bob", "--project", "nope"], "long-enough-pw\n",
                     "project 'nope' is not defined", id="unknown-project"),
        pytest.param(["bob"], "short\n", "password too short", id="short-password"),
    ],
)
def test_users_create_refuses_bad_input_with_a_clear_error(
    tmp_path: Path, args: list[str], stdin: str, message: str
) -> None:
    (tmp_path / "cluster.yaml").write_text(CLUSTER_YAML)
    done = _llmgw(tmp_path, ["users", "create", *args], stdin)
    assert done.returncode == 1 and message in done.stderr and "Traceback" not in done.stderr


def test_users_create_reads_the_password_from_stdin_and_lists_users(tmp_path: Path) -> None:
    (tmp_path / "cluster.yaml").write_text(CLUSTER_YAML)
    done = _llmgw(tmp_path, ["users", "create", "ada", "--admin", "--project", "research"],
                  "a-long-password\n")
    assert done.returncode == 0, done.stderr
    assert done.stdout == "created admin ada (research); they log in at the router's /login\n"
    again = _llmgw(tmp_path, ["users", "create", "ada"], "a-long-password\n")
    assert again.returncode == 1 and "user 'ada' already exists" in again.stderr
    listed = _llmgw(tmp_path, ["users", "list"], "")
    assert re.search(r"^ada\s+admin\s+research\s", listed.stdout, re.M)
    with contextlib.closing(sqlite3.connect(tmp_path / "llmgw.db")) as db:
        assert users.authenticate(db, "ada", "a-long-password") is not None


def _llmgw(directory: Path, args: list[str], stdin: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "llmgw", *args, "--cluster", str(directory)],
                          input=stdin, capture_output=True, text=True, timeout=60)


def test_forms_and_cookie_requests_without_the_csrf_token_are_refused(stack: Stack) -> None:
    with httpx.Client(timeout=30) as client:
        login(client, stack.url, "bob", "bob-user-pass")
        for token in ("", "forged"):
            answer = client.post(f"{stack.url}/account/keys",
                                 data={"project": "research", "csrf": token})
            assert answer.status_code == 403
        chat = {"model": "chat", "messages": [{"role": "user", "content": "hi"}]}
        answer = client.post(f"{stack.url}/v1/chat/completions", json=chat,
                             headers={"X-Llmgw-Project": "research"})
        assert answer.status_code == 403 and "CSRF" in answer.text
        csrf = csrf_of(client, stack.url)
        answer = client.post(f"{stack.url}/v1/chat/completions", json=chat,
                             headers={"X-Llmgw-Project": "research", "X-CSRF-Token": csrf})
        assert answer.status_code == 200, answer.text
    assert stack.rows()[-1].user_name == "bob" and stack.rows()[-1].project == "research"


def test_a_project_without_conversations_cannot_have_any_stored(stack: Stack) -> None:
    with httpx.Client(timeout=30) as client:
        login(client, stack.url, "bob", "bob-user-pass")
        csrf = csrf_of(client, stack.url)
        answer = client.post(f"{stack.url}/chat/conversations", headers={"X-CSRF-Token": csrf},
                             json={"project": "research",
                                   "turns": [{"role": "user", "content": "keep-me-not"}]})
        assert answer.status_code == 403
    assert stack.sqlite.execute("SELECT COUNT(*) FROM messages").fetchone() == (0,)
    assert b"keep-me-not" not in stack.db_path.read_bytes()
