"""One harness for ``llmgw serve`` as a real process: start it, wait on it, stop it.

The daemon runs with the arguments a test gives, its output in ``log``, on
free loopback ports (:attr:`Daemon.ports`, for the cluster's ``listeners``
or the ``--*-listen`` flags). Waits poll a condition with a bound, fail at
once with the log's tail if the process has exited, and take a daemon that
is not answering yet (connection refused, no admin token yet) as "not yet".

Usage::

    daemon = daemons.Daemon(cluster_dir, tmp_path / "serve.log")
    daemon.start("--ready-timeout", "60s")
    status = daemon.wait(lambda s: s["observed_at"] is not None, "the first observation")
    daemon.stop()
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

import httpx
from support import nodes

from llmgw.spec import statedirs

T = TypeVar("T")
Status = dict[str, Any]
LISTENERS = ("router", "admin", "metrics")
# A daemon that is still starting answers with one of these: not yet, not a failure.
NOT_YET = (httpx.HTTPError, FileNotFoundError, ValueError)


class Daemon:
    """A ``llmgw serve`` process for one cluster directory, and its admin API."""

    def __init__(self, directory: Path, log: Path, *, token: Path | None = None,
                 env: Mapping[str, str] | None = None,
                 ports: Mapping[str, int] | None = None) -> None:
        self.directory = directory
        self.log = log
        self.env = dict(env if env is not None else os.environ)
        # The admin API's bearer token, which the daemon writes to its state directory
        # (the test's, from support.plugin; beside the log for a process of no test),
        # unless the cluster names one with cluster.state_dir: then the test says where.
        self.env.setdefault(statedirs.ENV, str(log.parent / "llmgw-state"))
        self.token = (token if token is not None
                      else Path(self.env[statedirs.ENV]) / statedirs.ADMIN_TOKEN)
        self.ports = dict(ports) if ports else {name: nodes.free_port() for name in LISTENERS}
        self.router = f"http://127.0.0.1:{self.ports['router']}"
        self.admin = f"http://127.0.0.1:{self.ports['admin']}"
        self.metrics = f"http://127.0.0.1:{self.ports['metrics']}"
        self.process: subprocess.Popen[bytes] | None = None

    def listeners(self) -> dict[str, str]:
        """``cluster.listeners`` for this daemon's ports."""
        return {name: f"127.0.0.1:{port}" for name, port in self.ports.items()}

    def start(self, *args: str) -> subprocess.Popen[bytes]:
        """Start ``llmgw serve --cluster DIR ARGS…``; returns at once."""
        with self.log.open("ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "llmgw", "serve", "--cluster", str(self.directory),
                 *args], stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=self.env)
        return self.process

    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def auth(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token.read_text().strip()}"}

    def status(self) -> Status:
        """``GET /api/v1/status``, as the admin."""
        reply = httpx.get(f"{self.admin}/api/v1/status", headers=self.auth(), timeout=5)
        reply.raise_for_status()
        status: Status = reply.json()
        return status

    def until(self, check: Callable[[], T | None], what: str, timeout: float = 90,
              poll: float = 0.1) -> T:
        """``check()``'s first truthy value; fails when the daemon exits or ``timeout`` passes."""
        deadline = time.monotonic() + timeout
        last = "nothing yet"
        while time.monotonic() < deadline:
            assert self.running(), f"the daemon exited while waiting for {what}\n{self.tail()}"
            try:
                found = check()
                if found:
                    return found
                last = repr(found)
            except NOT_YET as exc:
                last = repr(exc)
            time.sleep(poll)
        raise AssertionError(f"timed out waiting for {what}; last {last}\n{self.tail()}")

    def wait(self, check: Callable[[Status], bool], what: str, timeout: float = 90,
             poll: float = 0.1) -> Status:
        """The first status for which ``check`` holds."""
        seen: list[Status] = []

        def holds() -> Status | None:
            seen[:] = [self.status()]
            return seen[0] if check(seen[0]) else None

        try:
            return self.until(holds, what, timeout, poll)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\nlast status: {seen[0] if seen else None}") from None

    def stop(self, sig: signal.Signals = signal.SIGTERM, timeout: float = 60) -> int | None:
        """Signal the daemon and wait for it (SIGKILL after ``timeout``); its exit status."""
        if self.process is None:
            return None
        if self.process.poll() is None:
            self.process.send_signal(sig)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        return self.process.returncode

    def tail(self, lines: int = 40) -> str:
        try:
            text = self.log.read_text(errors="replace")
        except FileNotFoundError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])
