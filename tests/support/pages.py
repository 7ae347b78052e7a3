"""Helpers for the pages' tests: a real ``llmgw serve`` process, users made with the CLI,
and what drives Debian's chromium (the ``browser`` fixture is in tests/web/conftest.py).

Chromium is the distribution's (``make sysdeps`` installs it); nothing is
downloaded at test time. The server runs in the same network namespace as the
browser (tests run under ``nsrun``), on free loopback ports.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from ruamel.yaml import YAML
from support import daemons, nodes

ROOT = Path(__file__).resolve().parents[2]
ENGINE = ROOT / ".cache" / "engine" / "bin" / "llama-server"
MODEL = ROOT / ".cache" / "models" / "gemma3-270m-q4_k_m.gguf"
CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                 "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]
# Screenshots land in docs/images only when asked (LLMGW_SCREENSHOTS=1 pytest -m browser):
# a plain test run must not rewrite files of the checkout.
IMAGES = ROOT / "docs" / "images" if os.environ.get("LLMGW_SCREENSHOTS") else None
PASSWORDS = {"ada": "ada-admin-pass", "bob": "bob-user-pass", "cy": "cy-user-pass"}

needs_engine = pytest.mark.skipif(
    not (ENGINE.exists() and MODEL.exists()),
    reason="the real engine and model are not built: run `make engine model` (make test does)",
)


class Server(daemons.Daemon):
    """A running ``llmgw serve`` for one cluster directory, its store in ``store_dir``."""

    def __init__(self, directory: Path, store_dir: Path, log: Path,
                 env: dict[str, str] | None = None) -> None:
        super().__init__(directory, log, env=env)
        self.store_dir = store_dir
        self.url = self.router

    def llmgw(self, *args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "llmgw", *args, "--cluster",
                               str(self.directory)], input=stdin, capture_output=True,
                              text=True, env=self.env, timeout=60)

    def user(self, name: str, *flags: str) -> None:
        done = self.llmgw("users", "create", name, *flags, stdin=PASSWORDS[name] + "\n")
        assert done.returncode == 0, done.stderr

    def start(self, *args: str) -> subprocess.Popen[bytes]:
        return super().start("--ready-timeout", "120s", *args)

    def wait(self, check: Callable[[dict[str, Any]], bool], what: str,
             timeout: float = 180, poll: float = 0.3) -> dict[str, Any]:
        return super().wait(check, what, timeout, poll)

    def stop(self, sig: signal.Signals = signal.SIGINT, timeout: float = 60) -> int | None:
        return super().stop(sig, timeout)


def ready(status: dict[str, Any]) -> bool:
    return any(r["state"] == "ready" for r in status["replicas"]) and not (
        status["plan"] or {}).get("has_changes", True)


def write_yaml(path: Path, data: dict[str, Any]) -> None:
    yaml = YAML()
    with path.open("w") as out:
        yaml.dump(data, out)


def local_cluster(tmp_path: Path, server_ports: dict[str, str],
                  projects: dict[str, Any]) -> tuple[Path, Path]:
    """cluster.example/local with keys, projects, prices and this test's ports and paths."""
    directory, state = tmp_path / "local", tmp_path / "state"
    directory.mkdir()
    data = YAML(typ="safe").load((ROOT / "cluster.example" / "local" / "cluster.yaml")
                                 .read_text())
    settings = data["cluster"]
    settings.update(auth="keys", listeners=server_ports,
                    store={"path": str(state / "llmgw.db")},
                    agent_socket=str(state / "agent.sock"),
                    web={"trusted_proxies": ["127.0.0.1"]})
    data["nodes"]["local"]["weights_dirs"] = [str(MODEL.parent)]
    data["nodes"]["local"]["engine_ports_from"] = nodes.free_ports(32)
    model = data["models"]["gemma3-270m"]
    model["source"] = str(MODEL)
    model["pricing"] = {"input_per_mtok": 100.0, "output_per_mtok": 200.0}
    data["projects"] = projects
    write_yaml(directory / "cluster.yaml", data)
    return directory, state


def serve_real(tmp: Path, projects: dict[str, Any], users: dict[str, list[str]]) -> Server:
    """llmgw serving Gemma 3 270M on llama-server, with ``users`` (name → CLI flags)
    created; started, not yet waited for."""
    env = {**os.environ, "PATH": f"{ENGINE.parent}{os.pathsep}{os.environ['PATH']}"}
    server = Server(tmp / "local", tmp / "state", tmp / "serve.log", env)
    local_cluster(tmp, server.listeners(), projects)
    for name, flags in users.items():
        server.user(name, *flags)
    server.start()
    return server


def login(page: Any, base: str, name: str) -> None:
    page.goto(f"{base}/login")
    page.fill("#name", name)
    page.fill("#password", PASSWORDS[name])
    page.click("button[type=submit]")
    page.wait_for_url(lambda url: "/login" not in url)


def shot(page: Any, name: str, **options: Any) -> None:
    """A screenshot for docs/web.md (taken always; kept with ``LLMGW_SCREENSHOTS=1``)."""
    data = page.screenshot(full_page=True, **options)
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    if IMAGES is not None:
        IMAGES.mkdir(parents=True, exist_ok=True)
        (IMAGES / name).write_bytes(data)
