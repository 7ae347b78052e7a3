"""``llmgw serve`` stopped by a signal at any moment leaves no process of llmgw's running.

The daemon runs as a real process for a cluster whose only node is this
machine (``address: local``): it starts its own agent (supervise backend),
which starts stand-in engines from ``tests/support/bin`` that load as slowly
as a test needs. Each test sends SIGINT or SIGTERM at one moment of the
daemon's life, then reads ``/proc``: no process the daemon, its workers, its
agent or the engines started may still run — checked by the pids seen while
it ran (its descendants, the agent's pid files, the engines' records) and by
any live command line naming the test's directory.

Also here: children run llmgw and nothing else — a ``llmgw.py`` and a
``llmgw/`` folder in the working directory change nothing.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import httpx
import pytest
from support import nodes
from support.engines import running

from llmgw.hub import caches, fetches

T = TypeVar("T")
WAIT = 180.0  # bound on any wait for a condition (a loaded machine starts Python slowly)

CLUSTER = """\
cluster:
  name: local
  sync: auto
  drift_interval: 1s
  auth: none
  listeners:
    router: 127.0.0.1:{router}
    admin: 127.0.0.1:{admin}
    metrics: 127.0.0.1:{metrics}
  store:
    path: {state}/llmgw.db
  agent_socket: {state}/agent.sock
  weights: {{endpoint: {endpoint}}}
nodes:
  local:
    address: local
    weights_dirs: [{weights}, /models]
models:
  tiny:
    source: {source}
    profiles:
      - engine: llama.cpp
        cpu: true
        min_memory_gb: 1
        env: {env}
"""


class Process:
    """A pid and its start time: a pid the kernel reused is not the same process."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.start = _start_ticks(pid)

    def alive(self) -> bool:
        return self.start is not None and _start_ticks(self.pid) == self.start \
            and _state(self.pid) not in (None, "Z", "X")

    def __repr__(self) -> str:
        return f"{self.pid} ({_cmdline(self.pid) or '?'})"


class Served:
    """A cluster directory for the local node and one ``llmgw serve`` run on it."""

    def __init__(self, tmp: Path, records: Path, env: dict[str, str],
                 source: str = "/models/tiny.gguf", endpoint: str = "null") -> None:
        self.tmp = tmp
        self.directory = tmp / "cluster"
        self.directory.mkdir()
        self.state = tmp / "state"
        self.records = records
        self.ports = {k: nodes.free_port() for k in ("router", "admin", "metrics")}
        engine_env = {"TESTENGINE_RECORD_DIR": str(records), **env}
        self.weights = tmp / "weights"
        (self.directory / "cluster.yaml").write_text(CLUSTER.format(
            state=self.state, env=json.dumps(engine_env), source=source, endpoint=endpoint,
            weights=self.weights, **self.ports))
        self.log = tmp / "serve.log"
        self.process: subprocess.Popen[bytes] | None = None
        self.seen: dict[int, Process] = {}  # every process of llmgw's seen while it ran

    def start(self, *flags: str, cwd: Path | None = None) -> None:
        # -P: the test's own run of llmgw is not what a planted llmgw.py replaces.
        with self.log.open("ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-P", "-m", "llmgw", "serve", "--cluster",
                 str(self.directory), *flags],
                stdin=subprocess.DEVNULL, stdout=log, stderr=log, cwd=cwd)
        self.note()

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def note(self) -> None:
        """Remember the processes of llmgw's alive now (to check each is gone later)."""
        found = {self.pid, *_descendants(self.pid), *self._recorded(), *_naming(self.tmp)}
        for pid in found:
            if pid not in self.seen:
                self.seen[pid] = Process(pid)

    def _recorded(self) -> list[int]:
        """Engines by their records, and the pids in the agent's pid files."""
        pids = [int(data["pid"]) for data in running(self.records).values()]
        for path in (self.state / "agent-state" / "units").glob("*/pid"):
            try:
                pids.append(int(json.loads(path.read_text())["pid"]))
            except (OSError, ValueError, KeyError):
                continue
        return pids

    def until(self, check: Callable[[], T], what: str) -> T:
        deadline = time.monotonic() + WAIT
        while time.monotonic() < deadline:
            assert self.process is not None and self.process.poll() is None, self.tail()
            self.note()
            found = check()
            if found:
                self.note()
                return found
            time.sleep(0.1)
        raise AssertionError(f"timed out waiting for {what}\n{self.tail()}")

    def logged(self, text: str) -> bool:
        return text in self.log.read_text(errors="replace")

    def engines(self) -> list[int]:
        return [int(data["pid"]) for data in running(self.records).values()]

    def agents(self) -> list[int]:
        config = str(self.state / "agent.yaml")
        return [pid for pid, line in _naming(self.tmp).items()
                if config in line and " agent serve " in f" {line} "]

    def workers(self) -> list[int]:
        return [pid for pid, line in _naming(self.tmp).items() if "--worker-of" in line]

    def answers(self) -> bool:
        try:
            reply = httpx.post(f"http://127.0.0.1:{self.ports['router']}/v1/completions",
                               json={"model": "tiny", "prompt": "hi", "max_tokens": 4},
                               timeout=10)
        except httpx.HTTPError:
            return False
        return reply.status_code == 200

    def send(self, signum: signal.Signals) -> None:
        self.note()
        assert self.process is not None
        self.process.send_signal(signum)

    def wait(self) -> int:
        assert self.process is not None
        try:
            return self.process.wait(timeout=WAIT)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"llmgw serve did not exit\n{self.tail()}") from None

    def left(self) -> list[Process]:
        """What is still alive of everything seen, and anything naming the test's directory."""
        alive = [p for p in self.seen.values() if p.alive()]
        named = [Process(pid) for pid in _naming(self.tmp) if pid not in self.seen]
        return alive + [p for p in named if p.alive()]

    def tail(self) -> str:
        text = self.log.read_text(errors="replace") if self.log.exists() else ""
        agent = self.state / "agent.log"
        if agent.exists():
            text += "\n--- agent.log\n" + agent.read_text(errors="replace")
        return "\n".join(text.splitlines()[-60:])

    def kill_all(self) -> None:
        """Teardown, pass or fail: SIGKILL whatever is left of what this test started."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        for process in self.left():
            try:
                os.killpg(process.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            try:
                os.kill(process.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass


@pytest.fixture
def serve(tmp_path: Path, engines: Path) -> Iterator[Callable[..., Served]]:
    made: list[Served] = []

    def make(source: str = "/models/tiny.gguf", endpoint: str = "null", **env: str) -> Served:
        served = Served(tmp_path, engines, env, source, endpoint)
        made.append(served)
        return served

    yield make
    for served in made:
        served.kill_all()


def assert_clean_exit(served: Served, status: int) -> None:
    code = served.wait()
    left = served.left()
    assert left == [], f"left running: {left}\n{served.tail()}"
    assert code == status, served.tail()
    assert "Traceback" not in served.tail(), served.tail()


# Where in its life the daemon is when the signal comes: what to wait for first, and the
# signal (both kinds take the same path; each is sent at least once).
MOMENTS: dict[str, tuple[Callable[[Served], object], signal.Signals]] = {
    "while the local agent starts": (lambda s: s.agents(), signal.SIGTERM),
    # The first apply waits for the engine to load: the daemon is in the middle of it.
    "before the first model is ready, mid-apply": (lambda s: s.engines(), signal.SIGINT),
    "once serving": (lambda s: s.logged("llmgw is serving tiny"), signal.SIGTERM),
}


@pytest.mark.parametrize("moment", sorted(MOMENTS))
def test_a_signal_at_any_moment_stops_everything(
    serve: Callable[..., Served], moment: str,
) -> None:
    reached, signum = MOMENTS[moment]
    # The engine loads for ten minutes unless the moment is "once serving".
    served = serve(TESTENGINE_LOAD_DELAY="0.3" if moment == "once serving" else "600")
    served.start()
    served.until(lambda: reached(served), moment)
    served.send(signum)
    assert_clean_exit(served, 0)
    assert served.logged(f"{signum.name}: stopping"), served.tail()


def test_a_signal_after_the_local_agent_was_killed_stops_the_engine_it_left(
    serve: Callable[..., Served],
) -> None:
    """The agent dies (kill -9); its engine runs on; the daemon is stopped before, or
    while, it restarts the agent: the daemon itself stops the engine the agent left."""
    served = serve(TESTENGINE_LOAD_DELAY="600")
    served.start()
    engine = served.until(served.engines, "an engine loading")[0]
    agent = served.until(served.agents, "the agent")[0]
    os.kill(agent, signal.SIGKILL)
    served.until(lambda: served.logged("restarting it in"), "the agent's restart planned")
    assert Process(engine).alive(), "the engine outlives its agent"
    served.send(signal.SIGTERM)
    assert_clean_exit(served, 0)
    assert served.logged("the local agent left"), served.tail()


def test_a_second_signal_stops_at_once(serve: Callable[..., Served]) -> None:
    """An engine that drains for ten minutes after SIGTERM: the orderly stop would wait for
    it (the daemon gives its agent 60 s); a second Ctrl-C SIGKILLs it, and exits 130."""
    served = serve(TESTENGINE_LOAD_DELAY="600", TESTENGINE_STOP_DELAY="600")
    served.start()
    served.until(served.engines, "an engine loading")
    served.send(signal.SIGINT)
    served.until(lambda: served.logged("stopping the local agent"), "the agent's stop begun")
    served.send(signal.SIGINT)
    assert_clean_exit(served, 128 + signal.SIGINT)
    assert served.logged("SIGINT again: stopping at once"), served.tail()
    agent_log = (served.state / "agent.log").read_text()
    assert "second signal: stopping at once" in agent_log, served.tail()
    # The engine was SIGKILLed at once, not after the orderly stop's timeout.
    assert not served.logged("did not stop in"), served.tail()


@pytest.fixture
def mirror(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """`llmgw mirror serve` with one 2 MiB GGUF repo, sending 64 KiB/s: a half-minute fetch."""
    root = tmp_path_factory.mktemp("mirror")  # not under the test's directory: it outlives
    weights = root / "tiny.gguf"              # the daemon, and is no process of llmgw serve's
    weights.write_bytes(os.urandom(2 * 1024 * 1024))
    caches.add(root / "hub", "acme/tiny-GGUF", {"tiny.gguf": weights})
    port = nodes.free_port()
    with (root / "mirror.log").open("ab") as log:
        process = subprocess.Popen(
            [sys.executable, "-P", "-m", "llmgw", "mirror", "serve", str(root),
             "--listen", f"127.0.0.1:{port}", "--max-rate", "65536"],
            stdin=subprocess.DEVNULL, stdout=log, stderr=log)
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + WAIT
        while True:
            assert process.poll() is None and time.monotonic() < deadline, \
                (root / "mirror.log").read_text()
            try:
                httpx.get(f"{url}/api/models/acme/tiny-GGUF", timeout=5)
                break
            except httpx.HTTPError:
                time.sleep(0.1)
        yield url
    finally:
        process.kill()
        process.wait()


def test_a_signal_during_a_weights_fetch_stops_everything(
    serve: Callable[..., Served], mirror: str,
) -> None:
    served = serve(source="acme/tiny-GGUF", endpoint=mirror)
    served.start()
    served.until(lambda: any(p.is_file() and p.stat().st_size > 0
                             for p in served.weights.rglob("*")), "bytes of the fetch")
    served.send(signal.SIGTERM)
    assert_clean_exit(served, 0)
    assert served.engines() == [] and not list((served.tmp / "records").glob("*.json")), \
        "no engine starts without its weights"
    # The download stopped with the agent; it did not hold the agent's exit to finish.
    assert fetches.records(served.weights) == [], served.tail()


AGENT = """\
node: local
socket: {{path: {state}/agent.sock, mode: "0600", group: null}}
backend: supervise
state_dir: {state}/agent-state
supervise: {{stop_on_exit: true}}
engines: {{dir: {state}/engines}}
"""


def test_a_signal_during_an_engine_install_stops_the_install(
    serve: Callable[..., Served], tmp_path: Path,
) -> None:
    """An install runs in the agent (`llmgw engine install`, or an apply): a llama-server
    whose `--version` check never ends, and the agent stopped meanwhile. The daemon
    stops its own agent the same way (SIGTERM), so this is that agent's part."""
    served = serve()
    served.state.mkdir()
    config = served.state / "agent.yaml"
    config.write_text(AGENT.format(state=served.state))
    slow = tmp_path / "llama-server"
    slow.write_text("#!/bin/sh\nexec sleep 600\n")
    slow.chmod(0o755)
    with served.log.open("ab") as log:
        served.process = subprocess.Popen(
            [sys.executable, "-P", "-m", "llmgw", "agent", "serve", "--config", str(config)],
            stdin=subprocess.DEVNULL, stdout=log, stderr=log)
    served.until(lambda: served.logged("llmgw agent serving"), "the agent")
    with served.log.open("ab") as log:
        install = subprocess.Popen(
            [sys.executable, "-P", "-m", "llmgw", "engine", "install", "llama.cpp==11434.0.0",
             "--binary", str(slow), "--cluster", str(served.directory)],
            stdin=subprocess.DEVNULL, stdout=log, stderr=log)
    try:
        check = served.until(
            lambda: [p for p in _descendants(served.pid) if _cmdline(p) == "sleep 600"],
            "the install's check running")
        served.send(signal.SIGTERM)
        install.wait(timeout=WAIT)  # its stream broke off: it says so and exits
        assert_clean_exit(served, 0)
        assert not Process(check[0]).alive()
    finally:
        install.kill()
        install.wait()


def test_workers_are_stopped_with_the_daemon(serve: Callable[..., Served]) -> None:
    served = serve(TESTENGINE_LOAD_DELAY="600")
    served.start("--workers", "2")
    served.until(lambda: len(served.workers()) == 2 and served.engines(), "two workers")
    served.send(signal.SIGTERM)
    assert_clean_exit(served, 0)


# What a careless working directory may hold: each would run instead of llmgw under a
# plain `python -m llmgw`, or break its import.
PLANTS: dict[str, Callable[[Path], None]] = {
    "llmgw.py": lambda cwd: (cwd / "llmgw.py").write_text(
        "import sys\nprint('HIJACKED', flush=True)\nsys.exit(3)\n"),
    "llmgw/ folder": lambda cwd: (cwd / "llmgw").mkdir(),
}


def not_hijacked(served: Served) -> bool:
    assert not served.logged("HIJACKED"), served.tail()
    return True


@pytest.mark.parametrize("plant", sorted(PLANTS))
def test_children_run_llmgw_whatever_the_working_directory_holds(
    serve: Callable[..., Served], tmp_path: Path, plant: str,
) -> None:
    cwd = tmp_path / "checkout"
    cwd.mkdir()
    PLANTS[plant](cwd)
    served = serve(TESTENGINE_LOAD_DELAY="0.3")
    served.start("--workers", "2", cwd=cwd)
    served.until(lambda: not_hijacked(served) and served.answers(),
                 "an answer through the router workers")
    workers, agents = served.workers(), served.agents()
    assert len(workers) == 2 and len(agents) == 1, served.tail()
    for pid in [*workers, *agents]:
        assert _cmdline(pid).split()[1:4] == ["-P", "-m", "llmgw"], _cmdline(pid)
    assert {os.readlink(f"/proc/{pid}/cwd") for pid in workers} == {"/"}
    assert os.readlink(f"/proc/{agents[0]}/cwd") == str(served.state)
    served.send(signal.SIGTERM)
    assert_clean_exit(served, 0)
    assert not served.logged("HIJACKED"), served.tail()


def _stat_fields(pid: int) -> list[str] | None:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text[text.rindex(")") + 2:].split()


def _start_ticks(pid: int) -> int | None:
    fields = _stat_fields(pid)
    return int(fields[19]) if fields else None


def _state(pid: int) -> str | None:
    fields = _stat_fields(pid)
    return fields[0] if fields else None


def _cmdline(pid: int) -> str:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return ""
    return raw.replace(b"\0", b" ").decode(errors="replace").strip()


def _descendants(root: int) -> set[int]:
    """Every live process below ``root`` (by parent pid, read from /proc)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            fields = _stat_fields(int(entry.name))
            if fields is not None:
                children.setdefault(int(fields[1]), []).append(int(entry.name))
    found: set[int] = set()
    todo = [root]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def _naming(directory: Path) -> dict[int, str]:
    """Live processes whose command line names ``directory`` (config, records, cluster)."""
    found: dict[int, str] = {}
    needle = str(directory)
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and entry.name != str(os.getpid()):
            line = _cmdline(int(entry.name))
            if needle in line and _state(int(entry.name)) not in (None, "Z", "X"):
                found[int(entry.name)] = line
    return found
