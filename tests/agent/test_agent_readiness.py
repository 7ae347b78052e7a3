"""Readiness as a table (process state × who listens × probes → unit state), and the
listener check against real sockets of this process."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator

import pytest

from llmgw.agent import readiness
from llmgw.agent.listeners import Finding, Listeners
from llmgw.agent.unitfiles import Labels
from llmgw.agent.units import Observation, ProcessState

NAME = "llmgw-m1-r0-s0.service"
HELD = Finding(listening=True, foreign="port 18000 is held by pid 7539 (python3 -m http.server)",
               holder="pid 7539 (python3 -m http.server)")
OTHER = Finding(listening=True, other="port 18000 is still held by llmgw-m1-r1-s0.service "
                "(pid 7 (llama-server))")
OURS = Finding(listening=True)
NOTHING = Finding(listening=False)
UNKNOWN = Finding(listening=False, known=False)
LOADED = readiness.Probe(True, ("m1",))
UP = readiness.Probe(True, ())


def observed(process: ProcessState, detail: str = "") -> Observation:
    labels = Labels("m1", 0, 0, "d1", 18000, {"X-Llmgw-Port": "18000"})
    return Observation(NAME, labels, process, 42, 0.0, detail)


@pytest.mark.parametrize(("process", "detail", "listening", "probe", "state", "said"), [
    pytest.param("running", "", HELD, LOADED, "failed",
                 "port 18000 is held by pid 7539 (python3 -m http.server)",
                 id="another-program-answering-is-not-ready"),
    pytest.param("running", "", HELD, None, "failed",
                 "port 18000 is held by pid 7539 (python3 -m http.server)",
                 id="another-program-is-not-loading"),
    pytest.param("activating", "exited with status 1; restarting in 0.4s", HELD, None, "failed",
                 "port 18000 is held by pid 7539 (python3 -m http.server); exited with status 1; "
                 "restarting in 0.4s", id="crash-looping-on-bind-names-the-holder"),
    pytest.param("failed", "exited with status 1; gave up after 5 restarts", HELD, None,
                 "failed", "port 18000 is held by pid 7539 (python3 -m http.server); exited "
                 "with status 1; gave up after 5 restarts", id="given-up-names-the-holder"),
    pytest.param("running", "", OTHER, LOADED, "starting",
                 "waiting: port 18000 is still held by llmgw-m1-r1-s0.service (pid 7 "
                 "(llama-server))", id="an-old-llmgw-unit-draining-is-waited-for"),
    pytest.param("running", "", NOTHING, None, "starting",
                 "waiting for the engine to listen on port 18000", id="nothing-listens-yet"),
    pytest.param("running", "", OURS, UP, "loading", "waiting for a model in /v1/models",
                 id="ours-up-not-loaded"),
    pytest.param("running", "", OURS, LOADED, "ready", "", id="ours-loaded"),
    pytest.param("running", "", UNKNOWN, LOADED, "ready", "", id="tables-unreadable-probes-decide"),
    pytest.param("stopped", "", None, None, "stopped", "", id="stopped-is-not-looked-at"),
])
def test_state(process: ProcessState, detail: str, listening: Finding | None,
               probe: readiness.Probe | None, state: str, said: str) -> None:
    assert readiness.state(observed(process, detail), probe, listening) == (state, said)


@pytest.fixture
def listener() -> Iterator[int]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield int(sock.getsockname()[1])


@pytest.mark.parametrize(("owner", "ours", "foreign", "other"), [
    pytest.param(NAME, True, "", "", id="the-units-own"),
    pytest.param(None, False, "port {port} is held by pid {pid} (", "", id="not-llmgws"),
    pytest.param("llmgw-m1-r1-s0.service", False, "",
                 "port {port} is still held by llmgw-m1-r1-s0.service (pid {pid} (",
                 id="another-llmgw-unit"),
])
def test_the_holder_of_a_real_socket_is_found_and_judged(
    listener: int, owner: str | None, ours: bool, foreign: str, other: str,
) -> None:
    pid = os.getpid()
    asked: list[int] = []

    def unit_of(holder: int) -> str | None:
        asked.append(holder)
        return owner

    found = Listeners().check(listener, NAME, None, unit_of)
    assert found.listening and found.known and found.ours == ours
    assert asked == [pid], "the holder is this process, found through /proc/<pid>/fd"
    assert found.foreign.startswith(foreign.format(port=listener, pid=pid))
    assert bool(found.foreign) == bool(foreign)
    assert found.other.startswith(other.format(port=listener, pid=pid))
    assert bool(found.other) == bool(other)
    assert found.holder == (found.foreign.removeprefix(f"port {listener} is held by "))


def test_a_free_port_has_no_listener() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = int(sock.getsockname()[1])  # bound, not listening
        assert Listeners().check(port, NAME, None, lambda pid: None) == NOTHING


def test_a_holder_is_remembered_while_its_socket_listens(listener: int) -> None:
    listeners = Listeners()
    listeners.check(listener, NAME, os.getpid(), lambda pid: NAME)
    remembered = dict(listeners._holders)
    assert list(remembered.values()) == [os.getpid()]
    listeners.check(listener, NAME, os.getpid(), lambda pid: NAME)
    assert listeners._holders == remembered
