"""Users, sessions, login limits, escaping and the admin token, over real HTTP.

A router with the pages (:class:`support.stacks.Stack`) on a loopback port,
talked to with httpx: no browser needed for what is plain HTTP.
"""

from __future__ import annotations

import asyncio
import re
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
from llmgw.spec.models import StoreSettings
from llmgw.store import sessions, stores, users
from llmgw.web.throttles import Rules


@pytest.fixture
def stack(tmp_path: Path, store_settings: dict[str, str]) -> Iterator[Stack]:
    """The pages on each store: SQLite, and a real PostgreSQL."""
    made = Stack(tmp_path, cluster(research=None), Settings(), 1, store_settings, pages=True)
    made.route({"chat": made.upstreams})
    made.run(users.create(made.db, "bob", "bob-user-pass", projects=["research"]))
    try:
        yield made
    finally:
        made.close()


def login(client: httpx.Client, base: str, name: str, password: str,
          **fields: str) -> httpx.Response:
    form = client.get(f"{base}/login").text
    token = re.search(r'name="csrf" value="([^"]+)"', form)
    assert token
    return client.post(f"{base}/login", data={"name": name, "password": password,
                                              "csrf": token.group(1), **fields})


def csrf_of(client: httpx.Client, base: str) -> str:
    found = re.search(r'<meta name="csrf-token" content="([^"]+)"',
                      client.get(f"{base}/account").text)
    assert found
    return found.group(1)


def test_passwords_are_stored_as_argon2id_hashes(stack: Stack) -> None:
    stored = stack.table_values("users")[1]
    assert stored.startswith("$argon2id$") and "bob-user-pass" not in stored
    assert stack.run(users.authenticate(stack.db, "bob", "bob-user-pass")) is not None
    assert stack.run(users.authenticate(stack.db, "bob", "bob-user-pasS")) is None
    assert stack.run(users.authenticate(stack.db, "nobody", "bob-user-pass")) is None


def test_the_session_cookie_is_httponly_and_samesite_and_logout_ends_it(stack: Stack) -> None:
    with httpx.Client(timeout=30) as client:
        answer = login(client, stack.url, "bob", "bob-user-pass")
        assert answer.status_code == 303 and answer.headers["location"] == "/chat"
        cookie = answer.headers["set-cookie"]
        assert "HttpOnly" in cookie and "SameSite=Strict" in cookie and "Secure" not in cookie
        token = client.cookies["llmgw_session"]
        stored = stack.table_values("sessions")
        assert token not in stored and sessions.digest(token) in stored, \
            "only the token's hash is stored"
        csrf = csrf_of(client, stack.url)
        assert client.post(f"{stack.url}/logout", data={"csrf": csrf}).status_code == 303
        # The old cookie, replayed, no longer opens a page.
        replay = httpx.get(f"{stack.url}/account", cookies={"llmgw_session": token})
        assert replay.status_code == 303 and replay.headers["location"].startswith("/login")


def test_a_source_past_its_free_tries_is_held_back_even_with_the_right_password(
    stack: Stack,
) -> None:
    stack.pages.gate.limiter.rules = Rules(base=300)  # held for minutes, however slow the host
    with httpx.Client(timeout=30) as client:
        codes = [login(client, stack.url, "bob", "wrong-guess").status_code for _ in range(8)]
        assert codes == [401] * 5 + [429] * 3
        blocked = login(client, stack.url, "bob", "bob-user-pass")
        assert blocked.status_code == 429 and int(blocked.headers["retry-after"]) > 0
        assert "llmgw_session" not in blocked.headers.get("set-cookie", "")


def test_free_text_is_escaped_on_the_pages(stack: Stack) -> None:
    evil = '<script>alert("x")</script>'
    with httpx.Client(timeout=30) as client:
        login(client, stack.url, "bob", "bob-user-pass")
        csrf = csrf_of(client, stack.url)
        created = client.post(f"{stack.url}/account/keys",
                              data={"project": "research", "name": evil, "csrf": csrf})
        assert created.status_code == 303
        page = client.get(f"{stack.url}/account")
        assert evil not in page.text and "&lt;script&gt;alert(" in page.text
        assert "script-src 'self'" in page.headers["content-security-policy"]
        assert page.headers["x-frame-options"] == "DENY"


def test_a_login_redirect_stays_on_this_site(stack: Stack) -> None:
    with httpx.Client(timeout=30) as client:
        form = client.get(f"{stack.url}/login", params={"next": "//evil.example/x"}).text
        assert "evil.example" not in form


@pytest.mark.parametrize("target", ["/chat?\r\nSet-Cookie: llmgw_session=evil", "/chat?a\nb",
                                    "/chat?\x00", "/chat?caf\u00e9"])
def test_control_characters_in_next_get_a_safe_redirect(stack: Stack, target: str) -> None:
    with httpx.Client(timeout=30) as client:
        form = client.get(f"{stack.url}/login", params={"next": target}).text
        assert 'name="next" value=""' in form
        answer = login(client, stack.url, "bob", "bob-user-pass", next=target)
        assert answer.status_code == 303 and answer.headers["location"] == "/chat"
        assert "evil" not in answer.headers.get("set-cookie", "")


def test_control_characters_in_a_page_path_get_a_safe_login_redirect(stack: Stack) -> None:
    answer = httpx.post(f"{stack.url}/chat/conversations/a%0D%0ASet-Cookie:x=1/delete",
                        timeout=30)
    assert answer.status_code == 303
    location = answer.headers["location"]
    assert location.startswith("/login?next=/chat/conversations/a%0D%0ASet-Cookie")
    assert "x=1" not in answer.headers.get("set-cookie", "")


def test_the_admin_token_file_is_owner_only(tmp_path: Path) -> None:
    path = tmp_path / "state" / admin.TOKEN_FILE
    token = admin.ensure_token(path)
    assert len(token) >= 43 and stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert admin.ensure_token(path) == token


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
        pytest.param(["bob", "--project", "research:owner"], "long-enough-pw\n",
                     "--project 'research:owner': unknown role 'owner'; use research:member "
                     "or research:admin", id="unknown-role"),
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
    async def check() -> None:
        db = await stores.open_store(StoreSettings(path=str(tmp_path / "llmgw.db")))
        try:
            assert await users.authenticate(db, "ada", "a-long-password") is not None
        finally:
            await db.close()
    asyncio.run(check())


def test_project_roles_from_the_command_line(tmp_path: Path) -> None:
    (tmp_path / "cluster.yaml").write_text(CLUSTER_YAML.replace(
        "{research: {}}", "{research: {}, ops: {}}"))
    done = _llmgw(tmp_path, ["users", "create", "bob", "--project", "research:admin",
                             "--project", "ops"], "a-long-password\n")
    assert done.returncode == 0, done.stderr
    assert done.stdout == ("created user bob (ops, research (admin)); they log in at the "
                           "router's /login\n")
    changed = _llmgw(tmp_path, ["users", "set-role", "bob", "research", "member"], "")
    assert changed.returncode == 0, changed.stderr
    assert changed.stdout == "bob is now a member of research (ops, research)\n"
    changed = _llmgw(tmp_path, ["users", "set-role", "bob", "ops", "admin"], "")
    assert changed.stdout == "bob is now an admin of ops (ops (admin), research)\n"
    listed = _llmgw(tmp_path, ["users", "list"], "")
    assert re.search(r"^bob\s+user\s+ops \(admin\), research\s", listed.stdout, re.M)
    for args, message in ((["nobody", "ops", "admin"], "no user 'nobody'"),
                          (["bob", "nope", "admin"], "project 'nope' is not defined"),
                          (["bob", "ops", "owner"], "invalid choice: 'owner'")):
        refused = _llmgw(tmp_path, ["users", "set-role", *args], "")
        assert refused.returncode != 0 and message in refused.stderr, refused.stderr
        assert "Traceback" not in refused.stderr


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
    assert stack.table_values("messages") == []
    if stack.db.kind == "sqlite":
        assert b"keep-me-not" not in stack.db_path.read_bytes()
