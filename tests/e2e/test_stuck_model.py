"""A model that never becomes ready holds up nothing else: ``llmgw serve`` over real sshd.

Its engine never lists its model on /v1/models, and the daemon's readiness
timeout is the default 15 minutes. Meanwhile a second model stopped by hand
is repaired at the next drift tick, a fix pushed to the YAML is applied at
once (the wait it made moot is cancelled), and the admin API, ``llmgw
status`` and the log say what is being waited for, and for how long.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.engines import MODELS, alive, running
from support.plugin import SimClusterFactory
from test_serve import Served, ready, write

NEVER = "100000"  # seconds the stuck engine takes to list its model


class SlowToGiveUp(Served):
    """``llmgw serve`` with the default readiness timeout (15m): no test waits that long."""

    def start(self) -> None:
        with self.log.open("ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "llmgw", "serve", "--cluster", str(self.directory),
                 "--ready-timeout", "15m", "--log-level", "debug"],
                stdin=subprocess.DEVNULL, stdout=log, stderr=log,
            )
        self.wait(lambda s: s["observed_at"] is not None, "the first observation")


def models(stuck: bool) -> dict[str, Any]:
    found = json.loads(json.dumps({"tiny": MODELS["tiny"], "stuck": MODELS["tiny"]}))
    found["stuck"]["source"] = "/models/stuck.gguf"
    if stuck:
        found["stuck"]["profiles"][0]["env"] = {"TESTENGINE_LOAD_DELAY": NEVER}
    return found


@pytest.fixture
def served(sim_cluster: SimClusterFactory, engines: Path,
           tmp_path: Path) -> Iterator[tuple[Served, Any]]:
    sim = sim_cluster(2, hardware=("h100-ib", "cpu-only"))
    serve = SlowToGiveUp(sim.cluster_dir, tmp_path / "serve.log")
    write(sim, serve, models(stuck=True))
    serve.start()
    yield serve, sim
    serve.stop()


def waiting_for(model: str, state: str) -> Any:
    def check(status: dict[str, Any]) -> bool:
        return any(w["model"] == model and w["state"] == state for w in status["waiting"])
    return check


def test_a_stuck_model_holds_up_neither_the_repair_of_another_nor_its_own_fix(
    served: tuple[Served, Any], engines: Path
) -> None:
    serve, sim = served
    status = serve.wait(lambda s: waiting_for("stuck", "loading")(s) and any(
        r["model"] == "tiny" and r["state"] == "ready" for r in s["replicas"]),
        "tiny ready while stuck loads")
    [wait] = [w for w in status["waiting"] if w["model"] == "stuck"]
    assert wait["line"].startswith("stuck r0: loading ") and wait["line"].endswith(" of 15m")
    assert wait["timeout"] == 900

    # `llmgw status` says it too, from the daemon's admin API.
    shown = subprocess.run(
        [sys.executable, "-m", "llmgw", "status", "--cluster", str(serve.directory)],
        capture_output=True, text=True, timeout=60)
    assert shown.returncode == 0, shown.stderr
    (serve.log.parent / "status.txt").write_text(shown.stdout)  # kept with the log
    assert "Waiting (llmgw serve)" in shown.stdout, shown.stdout
    assert any(line.strip().startswith("stuck r0: loading ") and " of 15m" in line
               for line in shown.stdout.splitlines()), shown.stdout

    # tiny stopped by hand while stuck loads: repaired within a drift tick or two (1 s),
    # not after stuck's 15 minutes.
    engine = running(engines)["tiny"]
    os.killpg(engine["pgid"], signal.SIGTERM)
    serve.wait(lambda s: running(engines).get("tiny", {}).get("pid") not in (None, engine["pid"])
               and any(r["model"] == "tiny" and r["state"] == "ready" for r in s["replicas"]),
               "tiny back with a new engine", timeout=30)
    assert waiting_for("stuck", "loading")(serve.status()), "stuck is still waited for"

    # The fix, pushed meanwhile: applied within seconds, the stuck replica replaced.
    write(sim, serve, models(stuck=False))
    serve.wait(lambda s: ready({"tiny", "stuck"})(s) and not s["waiting"]
               and [n for n, _ in alive(engines)].count("stuck") == 1,
               "the fixed model ready, the stuck replica gone", timeout=30)
    log = serve.log.read_text()
    assert "stuck r0: no longer waited for: the cluster changed" in log
    assert "waiting for stuck r0: loading" in log
