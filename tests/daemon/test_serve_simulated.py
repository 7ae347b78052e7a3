"""``llmgw lab simulate --relay`` and ``llmgw serve --simulated``, both as real processes.

The walkthrough of docs/testing.md's fleet simulator: the simulator serves its nodes and
a relay for them, the daemon finds the relay in the sockets directory and reaches every
node through it, places the models and sees them ready. Stopping the simulator leaves
every node unreachable, each with the relay's sentence for it.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from support import daemons

pytestmark = pytest.mark.fleetsim

NODES = 30
MODELS = 3
BOUND = 90.0  # a bound on every wait, not a measurement


@pytest.fixture
def simulator() -> Iterator[tuple[Path, subprocess.Popen[bytes]]]:
    root = Path(tempfile.mkdtemp(prefix="llmgw-ss-", dir="/tmp"))  # short socket paths
    out = root / "simulate.log"
    with out.open("wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "llmgw", "lab", "simulate", "--nodes", str(NODES),
             "--models", str(MODELS), "--load-delay", "0.5", "--relay", "--dir",
             str(root / "lab")], stdin=subprocess.DEVNULL, stdout=log, stderr=log)
    try:
        yield root, process
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGINT)
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(10)
        shutil.rmtree(root, ignore_errors=True)


def test_serve_reaches_a_simulated_fleet_through_its_relay(
        simulator: tuple[Path, subprocess.Popen[bytes]], tmp_path: Path) -> None:
    root, process = simulator
    log = root / "simulate.log"
    daemon = daemons.Daemon(root / "lab" / "cluster", tmp_path / "serve.log")
    _until_up(log, process)
    assert "relay on " in log.read_text()
    daemon.start("--role", "reconciler", "--ready-timeout", "60s",
                 "--simulated", str(root / "lab" / "sockets"),
                 "--admin-listen", daemon.listeners()["admin"],
                 "--metrics-listen", daemon.listeners()["metrics"])
    try:
        status = daemon.wait(
            lambda s: len(s["nodes"]) == NODES and all(n["reachable"] for n in s["nodes"].values())
            and [r["state"] for r in s["replicas"]] == ["ready"] * MODELS,
            "every node reachable and every model ready", timeout=BOUND)
        assert {r["model"] for r in status["replicas"]} == {f"m{i:05d}" for i in range(MODELS)}

        process.send_signal(signal.SIGINT)  # the simulator, and its relay, go
        process.wait(30)
        gone = daemon.wait(lambda s: not any(n["reachable"] for n in s["nodes"].values()),
                           "every node unreachable", timeout=BOUND)
        errors = {n["error"] for n in gone["nodes"].values()}
        assert all(e and e.startswith("unreachable: its relay does not answer") for e in errors)
    finally:
        assert daemon.stop() == 0, daemon.tail()


def _until_up(log: Path, process: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + BOUND
    while "Ctrl-C stops them." not in log.read_text():
        assert process.poll() is None, log.read_text()
        assert time.monotonic() < deadline, f"the simulator did not start:\n{log.read_text()}"
        time.sleep(0.1)
