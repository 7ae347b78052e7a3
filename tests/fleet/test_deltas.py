"""A pushed delta changes the daemon's view of a node exactly as a full report would.

Random changes to a node's units and fetches (new, changed in any field, removed),
applied as the agent pushes them (:func:`llmgw.fleet.deltas.between`, through the real
proto messages) to the report the daemon holds, must give the report the agent would
send now, field for field.
"""

from __future__ import annotations

import random

import pytest

from llmgw.fleet import deltas
from llmgw.fleet.types import EngineLoad, Fetch, NodeReport, Unit
from llmgw.proto import conversions

STATES = ("fetching", "starting", "loading", "ready", "failed", "stopped", "unknown")


def random_unit(rng: random.Random, name: str) -> Unit:
    model, replica = name.split("-")[1], int(name.split("-r")[1].split("-")[0])
    return Unit(
        name=name, model=model, replica=replica, rank=0, digest=f"d{rng.randrange(4)}",
        state=rng.choice(STATES), port=rng.choice([None, 18000 + rng.randrange(50)]),
        pid=rng.choice([None, rng.randrange(1, 99999)]),
        since=rng.choice([None, rng.uniform(1e9, 2e9)]),
        log_tail=[f"line {i}" for i in range(rng.randrange(3))],
        detail=rng.choice(["", "waiting for /health", "restart in 3s"]),
        labels={"X-Llmgw-Model": model, "X-Llmgw-Digest": f"d{rng.randrange(4)}"},
        restarts=rng.choice([None, rng.randrange(5)]),
        crashes=[rng.uniform(1e9, 2e9) for _ in range(rng.randrange(3))],
        stopped_by=rng.choice(["", "llmgw", "operator"]),
        written_by_llmgw=rng.choice([None, True, False]),
        load=rng.choice([None, EngineLoad(requests_running=rng.randrange(9),
                                          scraped_at=rng.uniform(1e9, 2e9))]),
    )


def random_fetch(rng: random.Random) -> Fetch:
    return Fetch(target=f"org/model-{rng.randrange(5)}", state=rng.choice(
        ["queued", "running", "done", "failed"]), bytes_done=rng.randrange(10**9),
        bytes_total=rng.choice([None, 10**9]), units=[f"u{rng.randrange(3)}"])


def changed(rng: random.Random, report: NodeReport) -> NodeReport:
    """``report`` after a random handful of changes to its units and fetches."""
    units = {u.name: u for u in report.units}
    for _ in range(rng.randrange(6)):
        name = f"llmgw-m{rng.randrange(6)}-r{rng.randrange(3)}-s0.service"
        if name in units and rng.random() < 0.3:
            del units[name]
        elif name in units and rng.random() < 0.5:
            field = rng.choice(["state", "pid", "detail", "digest", "restarts", "load"])
            units[name] = units[name].model_copy(
                update={field: getattr(random_unit(rng, name), field)})
        else:
            units[name] = random_unit(rng, name)
    fetches = report.fetches if rng.random() < 0.5 else \
        [random_fetch(rng) for _ in range(rng.randrange(3))]
    return report.model_copy(update={"units": [units[n] for n in sorted(units)],
                                      "fetches": fetches})


@pytest.mark.parametrize("seed", range(40))
def test_a_delta_gives_the_view_a_full_report_would(seed: int) -> None:
    rng = random.Random(seed)
    agent = changed(rng, NodeReport(node="gpu-01", hostname="gpu-01", cpu_count=64))
    view = agent  # after the stream's first push: the full report
    for _ in range(25):
        agent = changed(rng, agent)
        delta = deltas.between(view, agent)
        wire = conversions.delta_from_message(conversions.delta_to_message(delta))
        assert wire == delta
        view = deltas.apply(view, wire)
        assert view == agent
        assert not deltas.between(view, agent)  # nothing left to send


def test_a_full_report_replaces_the_view_and_no_change_sends_nothing() -> None:
    rng = random.Random(7)
    old = changed(rng, NodeReport(node="n", cpu_count=8))
    new = NodeReport(node="n", cpu_count=16)
    wire = conversions.delta_from_message(conversions.delta_to_message(deltas.full(new)))
    assert wire.full and deltas.apply(old, wire) == new
    assert not deltas.between(old, old) and deltas.apply(old, deltas.Delta()) is old


def test_faults_differ_when_a_gpu_fails_not_when_memory_moves() -> None:
    from llmgw.fleet.types import Gpu

    gpu = Gpu(index=0, uuid="GPU-1", name="H100", gpu_class="h100-80g", ecc_uncorrected=0,
              memory_used_mib=10)
    base = NodeReport(node="n", gpus=[gpu])
    busier = base.model_copy(update={"gpus": [gpu.model_copy(update={"memory_used_mib": 900})]})
    broken = base.model_copy(update={"gpus": [gpu.model_copy(update={"ecc_uncorrected": 3})]})
    assert deltas.faults(base) == deltas.faults(busier)
    assert deltas.faults(base) != deltas.faults(broken)
