"""How long `plan()` takes, and how much memory, as the fleet grows; full and incremental.

Fleets of 10 to 10,000 nodes with 8 GPUs each (70 % H100 on one InfiniBand
fabric, 30 % A100) and 500 models: tensor-parallel sizes 1 to 8, every 25th
model across two nodes, ``min`` 1–2, each model falling back from H100 to
A100. Per size, in one run:

* fresh   — an empty fleet: everything is placed (or explained);
* steady  — the fleet after that plan ran, every report collected again (new
  objects, a new ``collected_at``, as agents answer each tick): every replica
  is checked and kept; in full (``plans.plan``) and by a ``Planner`` that
  planned the tick before (incremental);
* edit 1% — steady, then 1 % of the nodes report a faulty GPU and 1 % of the
  models change a flag: full, and incremental from the tick before;
* drift   — steady, with one flag changed on every model: everything replaced.

The incremental plans are checked byte-identical to the full ones. Times
are CPU seconds of this process (``time.process_time``: the machine is
shared, and other work's load does not count), best of three; peak memory
is what tracemalloc saw during one plan. Run:
``.venv/bin/python tests/bench/plan_scale.py [sizes…]``.
"""

from __future__ import annotations

import sys
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "planning"))

from plan_builders import apply, cluster_from, fleet_from  # noqa: E402

from llmgw.fleet.types import Fleet  # noqa: E402
from llmgw.planning import outputs, plans  # noqa: E402
from llmgw.planning.planners import Planner  # noqa: E402
from llmgw.planning.types import Plan  # noqa: E402
from llmgw.spec.models import Cluster  # noqa: E402

SIZES = (10, 100, 1000, 10000)
MODELS = 500
NOW = 1_767_600_000.0
TARGETS = {"fresh": 2.0, "steady": 1.0}  # seconds at 10,000 nodes (issue 28)
EDITED = 0.01  # of the nodes and of the models, in "edit 1%"


def cluster_data(nodes: int, max_model_len: int = 8192,
                 edited: frozenset[int] = frozenset()) -> dict[str, Any]:
    """The bench's cluster; the models numbered in ``edited`` get max-model-len 4096."""
    node_specs = {}
    for i in range(nodes):
        h100 = i % 10 < 7
        spec: dict[str, Any] = {
            "address": f"10.{i // 250}.{i % 250}.10",
            "mgmt_interface": "eno1",
            "gpus": [{"class": "h100-80g" if h100 else "a100-80g", "count": 8}],
            "weights_dirs": ["/models"],
        }
        if h100:
            spec["fabrics"] = {"ib-a": ["mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3"]}
        node_specs[f"gpu-{i:04d}"] = spec
    models = {}
    for i in range(MODELS):
        tp = (1, 1, 2, 4, 8)[i % 5]
        args = {"max-model-len": 4096 if i in edited else max_model_len}
        if i % 25 == 0:
            profiles = [{"engine": "vllm", "gpu_class": "h100-80g", "nodes": 2,
                         "tensor_parallel": 8, "pipeline_parallel": 2, "args": args}]
        else:
            profiles = [
                {"engine": "vllm", "gpu_class": "h100-80g", "tensor_parallel": tp,
                 "args": args},
                {"engine": "sglang" if i % 2 else "vllm", "gpu_class": "a100-80g",
                 "tensor_parallel": tp, "args": args},
            ]
        models[f"model-{i:03d}"] = {
            "source": f"org/model-{i:03d}",
            "scaling": {"min": 1 + (i % 3 == 0), "max": 4},
            "profiles": profiles,
        }
    return {"cluster": {"name": "bench"}, "fabrics": {"ib-a": {"kind": "infiniband"}},
            "nodes": node_specs, "models": models}


def best_of(runs: int, work: Callable[[], Plan],
            before: Callable[[], object] = lambda: None) -> tuple[float, Plan]:
    """The least CPU time of ``runs`` runs of ``work`` (``before`` runs first, untimed)."""
    best, result = float("inf"), None
    for _ in range(runs):
        before()
        start = time.process_time()
        result = work()
        best = min(best, time.process_time() - start)
    assert result is not None
    return best, result


def peak_mib(work: Callable[[], Plan], before: Callable[[], object] = lambda: None) -> float:
    before()
    tracemalloc.start()
    try:
        work()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return peak / 2**20


def measure(cluster: Cluster, fleet: Fleet) -> tuple[float, float, Plan]:
    seconds, result = best_of(3, lambda: plans.plan(cluster, fleet, NOW))
    return seconds, peak_mib(lambda: plans.plan(cluster, fleet, NOW)), result


def incremental(
    previous: tuple[Cluster, Fleet], cluster: Cluster, fleet: Fleet, full: Plan,
) -> tuple[float, float, int]:
    """A planner that planned ``previous`` (the tick before) plans ``cluster`` and ``fleet``:
    its CPU seconds, peak MiB and how many nodes it read afresh; its plan must be ``full``."""
    planner = Planner()

    def warm() -> None:
        nonlocal planner
        planner = Planner()
        planner.plan(*previous, NOW)

    seconds, result = best_of(3, lambda: planner.plan(cluster, fleet, NOW), warm)
    assert outputs.json_text(result) == outputs.json_text(full), "incremental ≠ full"
    derived = planner.derived
    return seconds, peak_mib(lambda: planner.plan(cluster, fleet, NOW), warm), derived


def collected_again(fleet: Fleet, at: float) -> Fleet:
    """Every agent answers again: new report objects, the same content but the time."""
    return Fleet(nodes={name: report.model_copy(update={"collected_at": at}, deep=True)
                        for name, report in fleet.nodes.items()}, sources=fleet.sources)


def faulted(fleet: Fleet, share: float) -> Fleet:
    """``share`` of the nodes (spread evenly) report uncorrected ECC errors on GPU 7."""
    step = max(1, round(1 / share))
    nodes = dict(fleet.nodes)
    for name in sorted(nodes)[::step]:
        report = nodes[name]
        gpus = [*report.gpus[:-1], report.gpus[-1].model_copy(update={"ecc_uncorrected": 4})]
        nodes[name] = report.model_copy(update={"gpus": gpus})
    return Fleet(nodes=nodes, sources=fleet.sources)


def main(sizes: tuple[int, ...] = SIZES) -> int:
    header = (f"{'nodes':>6} {'replicas':>8} {'unplaced':>8} | {'fresh s':>7} {'MiB':>5} | "
              f"{'steady s':>8} {'incr s':>7} {'ratio':>5} {'MiB':>5} {'incr':>5} | "
              f"{'edit 1% s':>9} {'incr s':>7} {'ratio':>5} {'read':>5} | {'drift s':>7} "
              f"{'MiB':>5}")
    print(header)
    print("-" * len(header))
    largest: dict[str, float] = {}
    for size in sizes:
        cluster = cluster_from(cluster_data(size))
        empty = fleet_from(cluster, {}, [], NOW)
        fresh_s, fresh_mib, fresh = measure(cluster, empty)
        ran = apply(empty, fresh, NOW)
        running = collected_again(ran, NOW + 30)
        steady_s, steady_mib, steady = measure(cluster, running)
        assert not steady.changes, "a steady fleet must plan no changes"
        steady_i, steady_imib, _ = incremental((cluster, ran), cluster, running, steady)
        edited_models = frozenset(range(0, MODELS, round(1 / EDITED)))
        edited = cluster_from(cluster_data(size, edited=edited_models))
        broken = faulted(running, EDITED)
        edit_s, _, edit = measure(edited, broken)
        edit_i, _, read = incremental((cluster, running), edited, broken, edit)
        drifted = cluster_from(cluster_data(size, max_model_len=16384))
        drift_s, drift_mib, _ = measure(drifted, running)
        replicas = sum(1 for c in fresh.changes if c.action == "create")
        unplaced = sum(len(u.replicas) for u in fresh.unplaceable)
        print(f"{size:>6} {replicas:>8} {unplaced:>8} | {fresh_s:>7.3f} {fresh_mib:>5.0f} | "
              f"{steady_s:>8.3f} {steady_i:>7.3f} {steady_i / steady_s:>5.2f} {steady_mib:>5.0f} "
              f"{steady_imib:>5.0f} | {edit_s:>9.3f} {edit_i:>7.3f} {edit_i / edit_s:>5.2f} "
              f"{read:>5} | {drift_s:>7.3f} {drift_mib:>5.0f}")
        largest = {"size": size, "fresh": fresh_s, "steady": steady_i}
    if largest:
        for what, target in TARGETS.items():
            seconds = largest[what]
            verdict = "meets" if seconds < target else "MISSES"
            print(f"{largest['size']:,.0f} nodes, {what} plan: {seconds:.3f} s = "
                  f"{seconds / target:.2f} × the {target:g} s target ({verdict} it)")
    return 0


if __name__ == "__main__":
    sys.exit(main(tuple(int(a) for a in sys.argv[1:]) or SIZES))
