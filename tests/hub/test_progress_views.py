"""A fetch's progress, as node reports carry it, in `llmgw status`, inventory and metrics."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest

from llmgw.cli import inventories
from llmgw.fleet.types import Fetch, Fleet, NodeReport, Unit
from llmgw.metrics.collectors import FleetCollector
from llmgw.spec.models import Cluster

CLUSTER = Cluster.model_validate({"cluster": {"name": "lab"},
                                  "nodes": {"gpu-01": {"address": "10.0.0.1"}}})


def fleet() -> Fleet:
    unit = Unit(name="llmgw-llama-r0-s0.service", model="llama", replica=0, digest="d",
                state="fetching", detail="fetching meta-llama/Llama-3.1-70B-Instruct: 42 GB of "
                "141 GB at 310 MB/s")
    fetching = Fetch(kind="weights", target="meta-llama/Llama-3.1-70B-Instruct", state="running",
                     bytes_done=42_000_000_000, bytes_total=141_000_000_000, rate_bps=310e6,
                     units=[unit.name])
    failed = Fetch(kind="weights", target="acme/gated", state="failed", bytes_done=0,
                   error="acme/gated: the hub answered 401: token needed")
    return Fleet(nodes={"gpu-01": NodeReport(node="gpu-01", units=[unit],
                                             fetches=[fetching, failed])})


def test_status_and_inventory_show_fetches_with_bytes_rate_and_reasons() -> None:
    status = inventories.render_status(CLUSTER, fleet(), 0.0)
    assert "llama  r0  fetching" in status
    assert ("gpu-01: weights meta-llama/Llama-3.1-70B-Instruct running, 39.1 GiB of 131.3 GiB "
            "at 295.6 MiB/s") in status
    assert "gpu-01: weights acme/gated failed, 0 B of ?: acme/gated: the hub answered 401" in status
    assert "Fetches" in inventories.render_inventory(CLUSTER, fleet(), 0.0)


def test_metrics_export_fetch_progress() -> None:
    collector = FleetCollector()
    collector.observe(fleet())
    registry = CollectorRegistry()
    registry.register(collector)
    text = generate_latest(registry).decode()
    labels = ('kind="weights",node="gpu-01",state="running",'
              'target="meta-llama/Llama-3.1-70B-Instruct"')
    assert f"llmgw_fetch_bytes_done{{{labels}}} 4.2e+10" in text
    assert f"llmgw_fetch_bytes_total{{{labels}}} 1.41e+11" in text
    assert f"llmgw_fetch_rate_bytes_per_second{{{labels}}} 3.1e+08" in text
    assert 'llmgw_replicas{model="llama",state="fetching"} 1.0' in text
