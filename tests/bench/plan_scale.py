"""How long `plan()` takes, and how much memory, as the fleet grows.

Fleets of 10, 100 and 1,000 nodes with 8 GPUs each (70 % H100 on one
InfiniBand fabric, 30 % A100) and 500 models: tensor-parallel sizes 1 to 8,
every 25th model across two nodes, ``min`` 1–2, each model falling back from
H100 to A100. Three plans per size:

* fresh   — an empty fleet: everything is placed (or explained);
* steady  — the fleet after that plan ran: every replica is checked and kept;
* drift   — steady, with one flag changed on every model: everything replaced.

Times are the best of three runs; peak memory is what tracemalloc saw during
one plan. Run: ``.venv/bin/python tests/bench/plan_scale.py``.
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
from llmgw.planning import plans  # noqa: E402
from llmgw.planning.types import Plan  # noqa: E402
from llmgw.spec.models import Cluster  # noqa: E402

SIZES = (10, 100, 1000)
MODELS = 500
NOW = 1_767_600_000.0
TARGET_SECONDS = 1.0  # 1,000 nodes, fresh plan


def cluster_data(nodes: int, max_model_len: int = 8192) -> dict[str, Any]:
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
        args = {"max-model-len": max_model_len}
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


def best_of(runs: int, work: Callable[[], Plan]) -> tuple[float, Plan]:
    best, result = float("inf"), None
    for _ in range(runs):
        start = time.perf_counter()
        result = work()
        best = min(best, time.perf_counter() - start)
    assert result is not None
    return best, result


def peak_mib(work: Callable[[], Plan]) -> float:
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


def main() -> int:
    header = (f"{'nodes':>6} {'GPUs':>6} {'models':>6} {'replicas':>8} {'unplaced':>8} | "
              f"{'fresh s':>8} {'MiB':>6} | {'steady s':>8} {'MiB':>6} | {'drift s':>8} "
              f"{'MiB':>6} {'replaced':>8}")
    print(header)
    print("-" * len(header))
    fresh_1000 = None
    for size in SIZES:
        cluster = cluster_from(cluster_data(size))
        empty = fleet_from(cluster, {}, [], NOW)
        fresh_s, fresh_mib, fresh = measure(cluster, empty)
        running = apply(empty, fresh, NOW)
        steady_s, steady_mib, steady = measure(cluster, running)
        assert not steady.changes, "a steady fleet must plan no changes"
        drifted = cluster_from(cluster_data(size, max_model_len=16384))
        drift_s, drift_mib, drift = measure(drifted, running)
        replicas = sum(1 for c in fresh.changes if c.action == "create")
        unplaced = sum(len(u.replicas) for u in fresh.unplaceable)
        print(f"{size:>6} {size * 8:>6} {MODELS:>6} {replicas:>8} {unplaced:>8} | "
              f"{fresh_s:>8.3f} {fresh_mib:>6.1f} | {steady_s:>8.3f} {steady_mib:>6.1f} | "
              f"{drift_s:>8.3f} {drift_mib:>6.1f} {drift.count('replace'):>8}")
        if size == 1000:
            fresh_1000 = fresh_s
    if fresh_1000 is not None:
        verdict = "meets" if fresh_1000 < TARGET_SECONDS else "MISSES"
        print(f"\n1,000 nodes, fresh plan: {fresh_1000:.3f} s = "
              f"{fresh_1000 / TARGET_SECONDS:.2f} × the {TARGET_SECONDS:g} s target ({verdict} it)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
