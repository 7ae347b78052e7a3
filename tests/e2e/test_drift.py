"""Classified drift end to end: ``llmgw serve`` over real sshd nodes and agents.

An engine killed again and again (SIGKILL, as the OOM killer would) is an
engine crash; once it crashed ``crash_loop.crashes`` times within the window
the daemon stops it and holds it instead of letting it loop, and says so in
its plan, its status API, ``llmgw status`` and its metrics. An engine
stopped by hand (SIGTERM from someone other than llmgw) is classified as
stopped by hand, and with that class's repair off it stays stopped, held.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from support import nodes
from support.engines import MODELS, running
from support.plugin import SimClusterFactory
from test_serve import Served, ready, write

DRIFT = ("  drift:\n"
         "    engine_crash: {crash_loop: {crashes: 3, window: 10m}}\n"
         "    stopped_by_hand: {repair: false}\n")


@pytest.fixture
def served(sim_cluster: SimClusterFactory, engines: Path, tmp_path: Path) -> Iterator[Served]:
    sim = sim_cluster(2, hardware=("h100-ib", "cpu-only"))
    serve = Served(sim.cluster_dir, tmp_path / "serve.log")
    metrics = f"127.0.0.1:{nodes.free_port()}"
    serve.listeners = lambda: {  # type: ignore[method-assign]
        "router": serve.router.removeprefix("http://"),
        "admin": serve.admin.removeprefix("http://"), "metrics": metrics}
    directory = write(sim, serve, MODELS)
    path = directory / "cluster.yaml"
    path.write_text(path.read_text().replace("cluster:\n", "cluster:\n" + DRIFT, 1))
    serve.metrics = f"http://{metrics}"  # type: ignore[attr-defined]
    serve.start()
    yield serve
    serve.stop()


def held(model: str, kind: str) -> Callable[[dict[str, Any]], bool]:
    def check(status: dict[str, Any]) -> bool:
        entries = (status["plan"] or {}).get("held") or []
        return any(h["model"] == model and h["drift"] == kind for h in entries)
    return check


def test_a_crash_loop_is_held_and_a_stop_by_hand_is_classified(
    served: Served, engines: Path
) -> None:
    served.wait(ready({"chat", "tiny"}), "both models ready", timeout=90)

    # Crash tiny's engine three times: each time its agent restarts it.
    seen: set[int] = set()
    for _ in range(3):
        engine = served_engine(served, engines, "tiny", seen)
        seen.add(engine["pid"])
        os.kill(engine["pid"], signal.SIGKILL)
    status = served.wait(held("tiny", "engine_crash"), "tiny held in a crash loop", timeout=90)
    [entry] = [h for h in status["plan"]["held"] if h["model"] == "tiny"]
    assert "crash loop" in entry["reasons"][0] and "crashed 3 times" in entry["reasons"][0]
    assert any("killed by SIGKILL" in line for line in entry["evidence"])
    # Held, not restarted: it stays down while the daemon plans again and again.
    iterations = status["iterations"]
    status = served.wait(lambda s: s["iterations"] >= iterations + 3, "three more iterations")
    assert [r["state"] for r in status["replicas"] if r["model"] == "tiny"] == ["stopped"]
    assert "tiny" not in running(engines)
    assert "will be held" in served.log.read_text()

    # chat stopped by hand (SIGTERM from someone other than llmgw): classified, and held
    # because this cluster turns that class's repair off.
    chat = running(engines)["chat"]
    os.killpg(chat["pgid"], signal.SIGTERM)
    status = served.wait(held("chat", "stopped_by_hand"), "chat held, stopped by hand")
    [entry] = [h for h in status["plan"]["held"] if h["model"] == "chat"]
    assert "stopped by someone other than llmgw" in entry["evidence"][0]
    assert "chat" not in running(engines)

    # `llmgw status` tells the same story, from the agents' reports.
    shown = subprocess.run(
        [sys.executable, "-m", "llmgw", "status", "--cluster", str(served.directory)],
        capture_output=True, text=True, timeout=60)
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    assert any("tiny r0" in line and "(engine crash): held: crash loop" in line
               for line in lines), shown.stdout
    assert any("chat r0" in line and "(stopped by hand): held: repair of stopped by hand is "
               "off" in line for line in lines), shown.stdout

    # Metrics count each drift once, per class and node, and show what is held.
    text = httpx.get(f"{served.metrics}/metrics", timeout=5).text  # type: ignore[attr-defined]
    assert metric(text, "llmgw_drift_total", "engine_crash") == 1.0
    assert metric(text, "llmgw_drift_total", "stopped_by_hand") == 1.0
    assert metric(text, "llmgw_drift_held", "engine_crash") == 1.0


def served_engine(served: Served, engines: Path, model: str, seen: set[int]) -> dict[str, Any]:
    """The model's engine once a new one (not in ``seen``) runs and answers."""
    def fresh(status: dict[str, Any]) -> bool:
        engine = running(engines).get(model)
        return engine is not None and engine["pid"] not in seen and ready({"chat", model})(status)
    served.wait(fresh, f"a new {model} engine", timeout=90)
    return running(engines)[model]


def metric(text: str, name: str, kind: str) -> float:
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + "{") and f'class="{kind}"' in line:
            total += float(line.rsplit(" ", 1)[1])
    return total
