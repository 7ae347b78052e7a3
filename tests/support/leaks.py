"""The session-end leak check: no process a test started may outlive the run.

A pytest plugin (registered in ``tests/conftest.py``). At the start of the
session it records the processes present and puts this run's identity into
the environment, ``LLMGW_TEST_RUN="<pid> <start time> <test id>"``, with the
test id of the test that runs now (updated before each test's setup), so
every process a test starts inherits it, also once its parent is gone. When
the session ends, a process of this run is one that was not there at the start
and that

* descends from this pytest process, or
* carries this run's identity in its environment (orphans, engines an agent
  started in their own session), or
* carries the marker of a simulated cluster this pytest owns
  (:data:`llmgw.onboarding.processes.MARKER`, or the cluster's directory in its
  command line: sshd overwrites its environment with its process title), or
  names this run's temporary directory (pytest's ``basetemp``, where labs and
  clusters of ``tmp_path`` live) in its command line.

Processes of other pytest runs on the same machine match none of these. If any
is left after a short grace (processes told to stop may still be exiting), the
run fails with each one named (pid, the test that started it, its command
line), and they are stopped, so the next run starts clean.

It also closes, when each test ends, every synchronous ``openai.OpenAI`` client
the test made (:func:`openai_clients_closed`). Tests make one per request in
places; an unclosed one keeps its pooled socket until the garbage collector
finds it, and with warnings as errors the ResourceWarning then fails whichever
later test happened to be running (seen as the router queue test failing on a
socket of the adapters test).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from llmgw.onboarding import processes

RUN_VARIABLE = "LLMGW_TEST_RUN"
# Seconds for processes being stopped to finish exiting (LLMGW_LEAK_GRACE to change).
GRACE = float(os.environ.get("LLMGW_LEAK_GRACE", "5"))
SIM_ROOTS = Path("/tmp")


@dataclass(frozen=True)
class Leak:
    pid: int
    test: str
    command: str


@pytest.fixture(autouse=True)
def openai_clients_closed() -> Iterator[None]:
    """Close every ``openai.OpenAI`` client made during the test, when it ends."""
    import openai

    made: list[openai.OpenAI] = []
    original = openai.OpenAI.__init__

    def init(self: openai.OpenAI, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        made.append(self)

    openai.OpenAI.__init__ = init  # type: ignore[method-assign]
    try:
        yield
    finally:
        openai.OpenAI.__init__ = original  # type: ignore[method-assign]
        for client in made:
            client.close()


def _pids() -> list[int]:
    return [int(entry) for entry in os.listdir("/proc") if entry.isdigit()]


def _read(pid: int, name: str) -> bytes:
    try:
        return Path(f"/proc/{pid}/{name}").read_bytes()
    except OSError:
        return b""


def _variable(environ: bytes) -> str | None:
    prefix = f"{RUN_VARIABLE}=".encode()
    for entry in environ.split(b"\0"):
        if entry.startswith(prefix):
            return entry[len(prefix):].decode(errors="replace")
    return None


def _owned_sim_roots(run: str) -> list[Path]:
    """Simulated clusters (``llmgw-sim-*``) whose owner file names this pytest."""
    owned = []
    for root in SIM_ROOTS.glob("llmgw-sim-*"):
        try:
            if (root / "owner").read_text() == run:
                owned.append(root)
        except OSError:
            continue
    return owned


class LeakCheck:
    """Records the processes present at the start; finds this run's processes at the end."""

    def __init__(self) -> None:
        self.run = processes.identity(os.getpid())
        self.before = {processes.identity(pid) for pid in _pids()}

    def identity(self, test: str) -> str:
        return f"{self.run} {test}"

    def leaks(self, basetemp: Path | None = None) -> list[Leak]:
        mine = set(processes.descendants(os.getpid()))
        roots = [*_owned_sim_roots(self.run), *([basetemp] if basetemp else [])]
        for root in roots:
            mine.update(processes.marked(root))
        found = []
        for pid in _pids():
            if pid == os.getpid() or processes.identity(pid) in self.before:
                continue
            value = _variable(_read(pid, "environ"))
            ours = value is not None and value.startswith(f"{self.run} ")
            if not (ours or pid in mine) or not processes.alive(pid):
                continue
            test = value[len(self.run) + 1:] if ours and value else "(unknown test)"
            command = _read(pid, "cmdline").replace(b"\0", b" ").decode(errors="replace")
            found.append(Leak(pid, test, command.strip()[:200]))
        return found

    def settle(self, basetemp: Path | None = None, grace: float = GRACE) -> list[Leak]:
        """The leaks still there after ``grace`` seconds (re-checked as they exit)."""
        deadline = time.monotonic() + grace
        left = self.leaks(basetemp)
        while left and time.monotonic() < deadline:
            time.sleep(0.1)
            left = self.leaks(basetemp)
        return left


_check: LeakCheck | None = None


def pytest_sessionstart(session: pytest.Session) -> None:
    global _check
    _check = LeakCheck()
    os.environ[RUN_VARIABLE] = _check.identity("(session start)")


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    if _check is not None:
        os.environ[RUN_VARIABLE] = _check.identity(item.nodeid)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if _check is None:
        return
    factory = getattr(session.config, "_tmp_path_factory", None)
    basetemp = getattr(factory, "_basetemp", None)  # None when no test asked for tmp_path
    left = _check.settle(basetemp)
    if not left:
        return
    lines = [f"  pid {leak.pid}, started by {leak.test}: {leak.command}" for leak in left]
    report = ("processes started by the tests still run after the session "
              "(stopped now):\n" + "\n".join(lines))
    processes.terminate([leak.pid for leak in left])
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.ensure_newline()
        reporter.write_sep("=", "leaked processes", red=True)
        reporter.write_line(report)
    else:
        print(report)
    if session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
