"""The daemon's loop turns a rising load into a larger replica count (and only after its window).

The loop runs in-process on a clock of the test's own, with a pool that reports
one ready replica whose engine says how many requests it has queued: what an
agent reports once it scrapes the engine's metrics. Each ``reconcile()`` samples
that load into the daemon's history; the plan holds until the load has stayed
above the target for all of ``up_window``, then creates the replicas it asks for.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from llmgw.daemon.reconcilers import Daemon
from llmgw.fleet.types import EngineLoad, Fleet, NodeReport, Unit
from llmgw.spec.models import Cluster

START = 1_700_000_000.0


class Clock:
    def __init__(self) -> None:
        self.now = START

    def __call__(self) -> float:
        return self.now


class Pool:
    """Every node's report: one ready gemma replica whose engine queues ``waiting``."""

    nodes = ["n1"]
    max_parallel = 4
    call_timeout = 10.0

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.waiting = 0

    async def fleet(self) -> Fleet:
        unit = Unit(name="llmgw-gemma-r0-s0.service", model="gemma", replica=0, digest="d",
                    state="ready", port=18000, since=START - 3600,
                    load=EngineLoad(requests_waiting=self.waiting, requests_running=4,
                                    scraped_at=self.clock()))
        return Fleet(nodes={"n1": NodeReport(node="n1", reachable=True, units=[unit],
                                             collected_at=self.clock(),
                                             memory_total_bytes=64 << 30,
                                             memory_available_bytes=60 << 30,
                                             cpu_count=16)})

    async def aclose(self) -> None:
        return None


CLUSTER: dict[str, Any] = {
    "cluster": {"name": "t"},
    "nodes": {"n1": {"address": "10.0.0.1", "weights_dirs": ["/models"]}},
    "models": {"gemma": {
        "source": "/models/gemma.gguf",
        "profiles": [{"engine": "llama.cpp", "cpu": True, "min_memory_gb": 1}],
        "scaling": {"min": 1, "max": 3, "target": {"waiting_per_replica": 2},
                    "up_window": "30s"},
    }},
}


async def test_a_rising_engine_queue_raises_the_replica_count_after_the_up_window(
    tmp_path: Path,
) -> None:
    clock = Clock()
    pool = Pool(clock)
    daemon = Daemon(tmp_path, Cluster.model_validate(CLUSTER), clock=clock,
                    agents=pool)  # type: ignore[arg-type]
    creates = []
    for step, waiting in enumerate([0, 0, 8, 8, 8, 8, 8]):
        clock.now = START + 10 * step
        pool.waiting = waiting
        plan = await daemon.reconcile()
        creates.append(sum(1 for c in plan.changes if c.action == "create"))
    # Above the target from the third sample (t+20 s): the 30 s window is full at t+50 s.
    assert creates == [0, 0, 0, 0, 0, 2, 2]
    assert plan.scaling == ("scale gemma 1 → 3: 8 waiting per replica over 30 s (target 2); "
                            "max 3",)
    assert [s.waiting for s in daemon.loads.history("gemma")] == [0, 0, 8, 8, 8, 8, 8]
