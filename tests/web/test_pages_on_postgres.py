"""``llmgw serve`` with ``store.url`` on a real PostgreSQL serves the pages.

A real ``llmgw serve --role router`` process, users made with ``llmgw users``
against the same PostgreSQL, and a login and /chat over real HTTP.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import httpx
from support import daemons
from support.pages import write_yaml
from support.postgres import Database

PASSWORD = "bob-user-pass"


def _llmgw(directory: Path, *args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "llmgw", *args, "--cluster", str(directory)],
                          input=stdin, capture_output=True, text=True, timeout=60)


def test_serve_on_postgresql_serves_login_and_chat(tmp_path: Path,
                                                   postgres_db: Database) -> None:
    directory = tmp_path / "cluster"
    directory.mkdir()
    write_yaml(directory / "cluster.yaml", {
        "cluster": {"name": "lab", "auth": "keys", "store": postgres_db.settings},
        "projects": {"research": {}},
    })
    made = _llmgw(directory, "users", "create", "bob", "--project", "research",
                  stdin=PASSWORD + "\n")
    assert made.returncode == 0, made.stderr
    listed = _llmgw(directory, "users", "list")
    assert re.search(r"^bob\s+user\s+research\s", listed.stdout, re.M), listed.stderr
    assert not (directory / "llmgw.db").exists(), "users went to PostgreSQL, not a file"

    daemon = daemons.Daemon(directory, tmp_path / "serve.log")
    router = daemon.listeners()["router"]
    daemon.start("--role", "router", "--router-listen", router,
                 "--metrics-listen", daemon.listeners()["metrics"])
    try:
        base = f"http://{router}"
        with httpx.Client(timeout=30) as client:
            form = daemon.until(lambda: _login_form(client, base), "/login to answer", 60,
                                poll=0.2)
            token = re.search(r'name="csrf" value="([^"]+)"', form)
            assert token, form
            wrong = client.post(f"{base}/login", data={"name": "bob", "password": "nope-nope",
                                                       "csrf": token.group(1)})
            assert wrong.status_code == 401 and "wrong user name or password" in wrong.text
            answer = client.post(f"{base}/login", data={"name": "bob", "password": PASSWORD,
                                                        "csrf": token.group(1)})
            assert answer.status_code == 303 and answer.headers["location"] == "/chat"
            chat = client.get(f"{base}/chat")
            assert chat.status_code == 200, chat.text
            assert "research" in chat.text and 'name="csrf-token"' in chat.text
        assert "need the SQLite store" not in daemon.log.read_text()
    finally:
        daemon.stop(timeout=30)


def _login_form(client: httpx.Client, base: str) -> str | None:
    answer = client.get(f"{base}/login")
    return answer.text if answer.status_code == 200 else None
