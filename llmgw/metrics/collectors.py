"""Fleet figures from the daemon's last observation, exported at scrape time.

:class:`FleetCollector` holds the newest :class:`llmgw.fleet.Fleet` the daemon
handed it (``observe(fleet)``) and turns it into metric families when
Prometheus scrapes, so nothing is computed between scrapes and nothing is
stale beyond one observation. Absent is not zero: a GPU that reported no
utilisation has no ``llmgw_gpu_utilization_ratio`` sample at all; an
unreachable node's GPUs are not counted as free.

Usage::

    collector = collectors.FleetCollector()
    registry.register(collector)
    collector.observe(fleet, declared_rates)  # after each observation (fabric → Gb/s)
    collector.observe_plan(plan)  # after each plan: drift per class and node
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from llmgw.fleet.types import FabricStatus, Fleet, Gpu, NodeReport, Unit
from llmgw.metrics.drifts import DriftCounts
from llmgw.planning import replicas as observed
from llmgw.planning.types import Plan

GPU_STATES = ("used", "free", "faulty")
REPLICA_STATES = ("fetching", "starting", "loading", "ready", "failed", "stopped", "unknown")
# When shards of one replica disagree, the replica is as far along as its slowest shard.
_STATE_ORDER = {
    "failed": 0, "unknown": 1, "stopped": 2, "fetching": 3, "starting": 4, "loading": 5, "ready": 6,
}


def gpu_state(gpu: Gpu) -> str:
    """faulty (any fault), used (an llmgw process holds it) or free."""
    if gpu.faults:
        return "faulty"
    if any(p.owned_by_llmgw for p in gpu.processes):
        return "used"
    return "free"


def replica_states(fleet: Fleet) -> dict[tuple[str, int], str]:
    """(model, replica) → one state for the replica, from the states of its shards."""
    shards: dict[tuple[str, int], list[Unit]] = {}
    for node, unit in fleet.units():
        state = unit.state if fleet.nodes[node].reachable else "unknown"
        shards.setdefault((unit.model, unit.replica), []).append(unit.model_copy(
            update={"state": state}))
    return {
        key: min((u.state for u in units), key=lambda s: _STATE_ORDER[s])
        for key, units in shards.items()
    }


class FleetCollector(Collector):
    def __init__(self) -> None:
        self._fleet: Fleet | None = None
        self._rates: Mapping[str, float] = {}
        self.drifts = DriftCounts()

    def observe_plan(self, plan: Plan) -> None:
        """Count the plan's drift (:mod:`llmgw.metrics.drifts`)."""
        self.drifts.observe(plan)

    def observe(self, fleet: Fleet, declared_rates: Mapping[str, float] | None = None) -> None:
        """Export ``fleet`` from now on (the reference swap is atomic for scraping threads);
        ``declared_rates`` is each fabric's declared rate in Gb/s, where the cluster says."""
        self._fleet, self._rates = fleet, dict(declared_rates or {})

    def describe(self) -> Iterable[Metric]:
        # Declared so registering never calls collect() before a fleet exists.
        return [*_families(None), *_observed_families(None, {}), *DriftCounts().families()]

    def collect(self) -> Iterable[Metric]:
        fleet, rates = self._fleet, self._rates
        return [*_families(fleet), *_observed_families(fleet, rates), *self.drifts.families()]


def _families(fleet: Fleet | None) -> Iterator[Metric]:
    gpus = GaugeMetricFamily(
        "llmgw_gpus", "GPUs on reachable nodes by class and state (used, free, faulty).",
        labels=["gpu_class", "state"],
    )
    reachable = GaugeMetricFamily(
        "llmgw_node_reachable", "1 when the node answered the last observation, else 0.",
        labels=["node"],
    )
    utilization = GaugeMetricFamily(
        "llmgw_gpu_utilization_ratio",
        "GPU utilisation (0-1) as the node reported it; absent when not reported.",
        labels=["node", "gpu", "gpu_class"],
    )
    memory_used = GaugeMetricFamily(
        "llmgw_gpu_memory_used_bytes", "GPU memory in use as reported; absent when not reported.",
        labels=["node", "gpu", "gpu_class"],
    )
    replicas = GaugeMetricFamily(
        "llmgw_replicas", "Replicas by model and state (a replica is as ready as its slowest "
        "shard; shards on unreachable nodes are unknown).",
        labels=["model", "state"],
    )
    fetch_done = GaugeMetricFamily(
        "llmgw_fetch_bytes_done", "Bytes a node's fetch (weights, engines) has in place.",
        labels=["node", "kind", "target", "state"],
    )
    fetch_total = GaugeMetricFamily(
        "llmgw_fetch_bytes_total", "Bytes a node's fetch needs in all; absent until known.",
        labels=["node", "kind", "target", "state"],
    )
    fetch_rate = GaugeMetricFamily(
        "llmgw_fetch_rate_bytes_per_second", "A fetch's transfer rate over its current attempt.",
        labels=["node", "kind", "target", "state"],
    )
    if fleet is not None:
        for name, report in sorted(fleet.nodes.items()):
            for fetch in report.fetches:
                labels = [name, fetch.kind, fetch.target, fetch.state]
                fetch_done.add_metric(labels, fetch.bytes_done)
                if fetch.bytes_total is not None:
                    fetch_total.add_metric(labels, fetch.bytes_total)
                if fetch.rate_bps is not None:
                    fetch_rate.add_metric(labels, fetch.rate_bps)
        counts: Counter[tuple[str, str]] = Counter()
        for name, report in sorted(fleet.nodes.items()):
            reachable.add_metric([name], 1.0 if report.reachable else 0.0)
            if report.reachable:
                _gpu_samples(name, report, counts, utilization, memory_used)
        for (gpu_class, state), count in sorted(counts.items()):
            gpus.add_metric([gpu_class, state], count)
        per_state: Counter[tuple[str, str]] = Counter(
            (model, state) for (model, _), state in replica_states(fleet).items()
        )
        for (model, state), count in sorted(per_state.items()):
            replicas.add_metric([model, state], count)
    yield from (gpus, reachable, utilization, memory_used, replicas, fetch_done, fetch_total,
                fetch_rate)


def _gpu_samples(
    node: str,
    report: NodeReport,
    counts: Counter[tuple[str, str]],
    utilization: GaugeMetricFamily,
    memory_used: GaugeMetricFamily,
) -> None:
    for gpu in report.gpus:
        counts[(gpu.gpu_class, gpu_state(gpu))] += 1
        labels = [node, str(gpu.index), gpu.gpu_class]
        if gpu.utilization_pct is not None:
            utilization.add_metric(labels, gpu.utilization_pct / 100)
        if gpu.memory_used_mib is not None:
            memory_used.add_metric(labels, gpu.memory_used_mib * 2**20)


ENGINE_LABELS = ["model", "replica", "node", "engine"]


def _observed_families(fleet: Fleet | None, rates: Mapping[str, float]) -> Iterator[Metric]:
    """Engine load per replica, GPU memory and NVLink, fabric rates: each sample only
    where the node or engine said (absent is not zero), and only from reachable nodes
    (an unreachable node's remembered units carry no load worth exporting)."""
    running = GaugeMetricFamily(
        "llmgw_engine_requests_running", "Requests the replica's engine serves, as it said.",
        labels=ENGINE_LABELS)
    waiting = GaugeMetricFamily(
        "llmgw_engine_requests_waiting", "Requests queued in the replica's engine, as it said.",
        labels=ENGINE_LABELS)
    kv_cache = GaugeMetricFamily(
        "llmgw_engine_kv_cache_usage_ratio", "KV-cache in use in the replica's engine (0-1).",
        labels=ENGINE_LABELS)
    tokens = GaugeMetricFamily(
        "llmgw_engine_generation_tokens_per_second",
        "Tokens the replica's engine generates per second (its counter's rate between two "
        "reports, else its own gauge).", labels=ENGINE_LABELS)
    memory_total = GaugeMetricFamily(
        "llmgw_gpu_memory_total_bytes", "GPU memory in all as reported; absent when not reported.",
        labels=["node", "gpu", "gpu_class"])
    nvlink = GaugeMetricFamily(
        "llmgw_gpu_nvlink_peers", "GPUs this GPU reaches over NVLink; absent when the topology "
        "is unknown, 0 when known to have none.", labels=["node", "gpu"])
    fabric_rate = GaugeMetricFamily(
        "llmgw_fabric_rate_gbps", "The slowest ACTIVE declared adapter's link rate on the node "
        "(Gb/s); absent when no declared adapter is ACTIVE with a known rate.",
        labels=["node", "fabric"])
    declared = GaugeMetricFamily(
        "llmgw_fabric_declared_rate_gbps", "The link rate the cluster declares for the fabric "
        "(Gb/s), per node on it; absent when the cluster declares none.",
        labels=["node", "fabric"])
    model_gpus = GaugeMetricFamily(
        "llmgw_model_gpus", "GPUs the model's running units hold (starting, loading or ready), "
        "from each unit's spec label, on reachable nodes.", labels=["model"])
    held: Counter[str] = Counter()
    for name, report in sorted((fleet.nodes if fleet is not None else {}).items()):
        if not report.reachable:
            continue
        held.update(holding(report.units))
        for gpu in report.gpus:
            if gpu.memory_total_mib is not None:
                memory_total.add_metric([name, str(gpu.index), gpu.gpu_class],
                                        gpu.memory_total_mib * 2**20)
            if gpu.nvlink_peers is not None:
                nvlink.add_metric([name, str(gpu.index)], len(gpu.nvlink_peers))
        for fabric in report.fabrics:
            slowest = fabric_rate_gbps(report, fabric)
            if slowest is not None:
                fabric_rate.add_metric([name, fabric.name], slowest)
            if fabric.name in rates:
                declared.add_metric([name, fabric.name], rates[fabric.name])
        for unit in report.units:
            load = unit.load
            if load is None:
                continue
            labels = [unit.model, str(unit.replica), name, unit.engine or ""]
            for family, value in ((running, load.requests_running),
                                  (waiting, load.requests_waiting),
                                  (kv_cache, load.kv_cache_usage),
                                  (tokens, load.generation_tokens_per_second)):
                if value is not None:
                    family.add_metric(labels, float(value))
    for model, count in sorted(held.items()):
        model_gpus.add_metric([model], count)
    yield from (running, waiting, kv_cache, tokens, memory_total, nvlink, fabric_rate, declared,
                model_gpus)


HOLDING = ("starting", "loading", "ready")


def holding(units: Iterable[Unit]) -> Counter[str]:
    """Model → GPUs its units hold: each running unit's GPUs, as its spec label names them."""
    counts: Counter[str] = Counter()
    for unit in units:
        spec = observed.parse_spec(unit) if unit.state in HOLDING else None
        gpus = spec.get("gpus") if spec is not None else None
        if gpus:
            counts[unit.model] += len(gpus)
    return counts


def fabric_rate_gbps(report: NodeReport, fabric: FabricStatus) -> float | None:
    """The slowest link rate among the fabric's ACTIVE declared adapters' ACTIVE ports on
    this node; None when none is ACTIVE with a known rate."""
    active = set(fabric.adapters)
    rates = [port.rate_gbps for adapter in report.adapters if adapter.name in active
             for port in adapter.ports if port.active and port.rate_gbps is not None]
    return min(rates) if rates else None


LeaseView = tuple[str, int | None, bool]  # (holder, epoch, leading)


class LeaseCollector(Collector):
    """Who leads, from this reconciler's point of view, read at scrape time.

    ``llmgw_reconciler_leading{holder}`` is 1 on the leader and 0 on a standby (sum it
    over reconcilers: anything but 1 is an alert); ``llmgw_reconciler_lease_epoch``
    is the fencing epoch the leader holds.
    """

    def __init__(self, read: Callable[[], LeaseView]) -> None:
        self._read = read

    def collect(self) -> Iterator[Metric]:
        holder, epoch, leading = self._read()
        family = GaugeMetricFamily("llmgw_reconciler_leading",
                                   "1 when this reconciler holds the leader lease, else 0.",
                                   labels=["holder"])
        family.add_metric([holder], 1.0 if leading else 0.0)
        yield family
        if leading and epoch is not None:
            epochs = GaugeMetricFamily("llmgw_reconciler_lease_epoch",
                                       "Fencing epoch of the lease this reconciler holds.",
                                       labels=["holder"])
            epochs.add_metric([holder], float(epoch))
            yield epochs


RolloutView = tuple[list[str], dict[tuple[str, str], int]]


class RolloutCollector(Collector):
    """Gated rollouts, read at scrape time: ``llmgw_rollout_held{model}`` is 1 for each
    model held after a failed gate (alert on it), ``llmgw_rollout_gates_total{model,
    result}`` counts verdicts (``promoted``, ``rolled_back``) since the daemon started."""

    def __init__(self, read: Callable[[], RolloutView]) -> None:
        self._read = read

    def collect(self) -> Iterator[Metric]:
        held, gates = self._read()
        family = GaugeMetricFamily("llmgw_rollout_held",
                                   "1 for each model held after its replacement failed a "
                                   "rollout gate.", labels=["model"])
        for model in sorted(held):
            family.add_metric([model], 1.0)
        yield family
        verdicts = CounterMetricFamily("llmgw_rollout_gates",
                                       "Rollout gate verdicts by model and result.",
                                       labels=["model", "result"])
        for (model, result), n in sorted(gates.items()):
            verdicts.add_metric([model, result], float(n))
        yield verdicts
