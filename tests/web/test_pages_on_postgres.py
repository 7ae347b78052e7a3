"""``llmgw serve`` with ``store.url`` on a real PostgreSQL serves the pages.

A real ``llmgw serve --role router`` process, users made with ``llmgw users``
against the same PostgreSQL, and a login and /chat over real HTTP.
"""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
from support import nodes
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

    router = f"127.0.0.1:{nodes.free_port()}"
    log = tmp_path / "serve.log"
    with log.open("ab") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "llmgw", "serve", "--cluster", str(directory), "--role",
             "router", "--router-listen", router, "--metrics-listen",
             f"127.0.0.1:{nodes.free_port()}"],
            stdin=subprocess.DEVNULL, stdout=out, stderr=out)
    try:
        base = f"http://{router}"
        with httpx.Client(timeout=30) as client:
            form = _wait_for_login_form(client, base, process, log)
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
        assert "need the SQLite store" not in log.read_text()
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)


def _wait_for_login_form(client: httpx.Client, base: str, process: subprocess.Popen[bytes],
                         log: Path) -> str:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        assert process.poll() is None, log.read_text()
        try:
            answer = client.get(f"{base}/login")
            if answer.status_code == 200:
                return answer.text
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise AssertionError(f"/login never answered\n{log.read_text()}")
