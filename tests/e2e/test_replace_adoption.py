"""A daemon stopped in the middle of a replace: the next one adopts the replacement.

Real ``llmgw serve`` processes one after the other, a real sshd node and its
agent (which, unlike serve's own local agent, outlives the daemon), stand-in
engines whose load takes a while. The first daemon starts the replacement of
an edited model and is stopped while it loads; the second must not destroy it
as over ``max`` nor start a third replica: the replacement keeps its process,
and the old replica goes once the replacement is ready.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from support import daemons
from support.engines import MODELS, alive, recording
from support.plugin import SimClusterFactory

LOAD = 15.0  # seconds the replacement loads: the first daemon is stopped meanwhile


def engines_by_port(records: Path) -> dict[int, int]:
    """Port → pid of every stand-in engine alive now."""
    return {int(data["argv"][data["argv"].index("--port") + 1]): data["pid"]
            for _, data in alive(records)}


def units(status: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {r["unit"]: r for r in status["replicas"]}


@pytest.mark.timeout(600)
def test_a_replacement_left_loading_by_a_stopped_daemon_is_adopted_not_restarted(
    sim_cluster: SimClusterFactory, engines: Path, tmp_path: Path,
) -> None:
    records = engines
    sim = sim_cluster(1, hardware=["cpu-only"])
    models = recording({"tiny": MODELS["tiny"]})
    models["tiny"]["scaling"] = {"min": 1, "max": 1}
    daemon = daemons.Daemon(sim.cluster_dir, tmp_path / "serve.log")

    def write(tiny: dict[str, Any]) -> None:
        sim.write_cluster({"cluster": {
            "sync": "auto", "drift_interval": "1s", "auth": "none",
            "store": {"path": str(sim.cluster_dir.parent / "llmgw.db")},
            "listeners": daemon.listeners()}, "models": {"tiny": tiny}})

    write(models["tiny"])
    daemon.start("--ready-timeout", "5m")
    try:
        first = daemon.wait(lambda s: [r["state"] for r in s["replicas"]] == ["ready"],
                            "tiny r0 ready")
        (old,) = units(first)
        # The edit: a slow load, so the replacement is still loading when the daemon stops.
        models["tiny"]["profiles"][0]["env"]["TESTENGINE_LOAD_DELAY"] = str(LOAD)
        write(models["tiny"])
        loading = daemon.wait(lambda s: len(s["replicas"]) == 2, "the replacement started")
        new = next(u for u in units(loading) if u != old)
        daemon.stop()
        by_port = engines_by_port(records)
        new_port = units(loading)[new]["port"]
        new_pid = by_port[new_port]

        daemon.start("--ready-timeout", "5m")
        done = daemon.wait(lambda s: list(units(s)) == [new]
                           and units(s)[new]["state"] == "ready", "the old replica gone", 240)
        assert engines_by_port(records) == {new_port: new_pid}, "the replacement was restarted"
        assert units(done)[new]["port"] == new_port
        log = daemon.log.read_text()
        assert "adopted, not started again" in log, daemon.tail()
        assert "over max" not in log, daemon.tail()
    finally:
        daemon.stop()
