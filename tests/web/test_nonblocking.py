"""No page handler waits on the database on the event loop.

* A guard: nothing in ``llmgw/web`` imports ``sqlite3`` (or the raw database
  module), so every page reaches its records through the async Store.
* Behaviour: while another process holds SQLite's write lock, a login's session
  write waits on the store's thread, and the same router keeps answering the
  login page and /health meanwhile; the login completes once the lock is gone.
"""

from __future__ import annotations

import ast
import re
import sqlite3
import sys
import threading
import time
from pathlib import Path

import httpx
from support.stacks import Stack, cluster

from llmgw.router import Settings
from llmgw.store import users

WEB = Path(__file__).resolve().parents[2] / "llmgw" / "web"
RAW = {"sqlite3", "llmgw.store.databases", "aiosqlite"}


def test_no_web_module_imports_a_raw_database_driver() -> None:
    found = []
    for path in sorted(WEB.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            found += [f"{path.name}:{node.lineno}: {n}" for n in names if n in RAW]
    assert found == []


def test_a_locked_sqlite_store_does_not_stall_the_router(tmp_path: Path) -> None:
    stack = Stack(tmp_path, cluster(research=None), Settings(), 1, pages=True)
    locker = sqlite3.connect(stack.db_path, isolation_level=None)
    try:
        stack.run(users.create(stack.db, "bob", "bob-user-pass", projects=["research"]))
        with httpx.Client(timeout=60) as client:
            form = client.get(f"{stack.url}/login")
            csrf = re.search(r'name="csrf" value="([^"]+)"', form.text)
            assert csrf
            # Another process (`llmgw keys`, a backup) holds the write lock.
            locker.execute("BEGIN IMMEDIATE")
            answers: dict[str, httpx.Response] = {}
            login = threading.Thread(target=lambda: answers.setdefault("login", client.post(
                f"{stack.url}/login", data={"name": "bob", "password": "bob-user-pass",
                                            "csrf": csrf.group(1)})))
            login.start()
            _wait_until_a_thread_waits_in("insert_session")
            # The login is stuck on the lock; the router's loop is not: requests that need
            # no store answer meanwhile (SQLite's own calls queue on its one thread).
            with httpx.Client(timeout=60) as other:
                page = other.get(f"{stack.url}/login")
                health = other.get(f"{stack.url}/health")
            still_waiting = login.is_alive()
            locker.execute("ROLLBACK")
            login.join(60)
        assert page.status_code == 200 and health.status_code == 200
        assert still_waiting, "the login finished before the lock was released"
        assert answers["login"].status_code == 303, answers["login"].text
    finally:
        locker.close()
        stack.close()


def _wait_until_a_thread_waits_in(method: str) -> None:
    """Until some thread's stack is inside the store's ``method`` (blocked on the lock)."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        for frame in sys._current_frames().values():
            while frame is not None:
                if f".{method}." in frame.f_code.co_qualname:
                    return
                frame = frame.f_back  # type: ignore[assignment]
        time.sleep(0.01)
    raise AssertionError(f"no thread ever waited in {method}")
