"""Node fingerprints (llmgw.planning.fingerprints): what a saved plan depends on.

A saved plan is applied only to nodes whose fingerprint is unchanged, so the
fingerprint must move with every fact planning reads and stay put for the
facts that change every second.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any

import pytest
from plan_builders import cluster_from, fleet_from

from llmgw.fleet.types import NodeReport
from llmgw.planning import fingerprints

CLUSTER = cluster_from({
    "fabrics": {"ib-a": {"kind": "infiniband"}, "ib-b": {"kind": "infiniband"}},
    "nodes": {"gpu-01": {"address": "10.0.0.1", "mgmt_interface": "eno1",
                         "gpus": [{"class": "h100-80g", "count": 2}],
                         "fabrics": {"ib-a": ["mlx5_0"], "ib-b": ["mlx5_1"]}}},
    "models": {},
})


def _report() -> NodeReport:
    return fleet_from(CLUSTER, None, None, 1_700_000_000.0).nodes["gpu-01"]


def _edit(change: Callable[[dict[str, Any]], object]) -> NodeReport:
    """The default report with ``change`` applied to its data (reports are frozen)."""
    data = _report().model_dump()
    change(data)
    return NodeReport.model_validate(data)


def _unit(**fields: object) -> dict[str, object]:
    base: dict[str, object] = {"name": "llmgw-m-r0-s0.service", "model": "m", "replica": 0,
                               "digest": "d1", "state": "ready", "port": 18000}
    return {**base, **fields}


def test_absent_node() -> None:
    absent = fingerprints.node("gpu-01", None)
    assert (absent.node, absent.reachable) == ("gpu-01", False)
    # Saved plans carry this digest: it stays what every llmgw version computed.
    assert absent.digest == hashlib.sha256(b'{"absent":true}').hexdigest()[:16]
    assert absent.digest == fingerprints.node("gpu-02", None).digest
    assert absent.digest != fingerprints.node("gpu-01", _report()).digest
    unreachable = _edit(lambda r: r.__setitem__("reachable", False))
    assert fingerprints.node("gpu-01", unreachable).digest != absent.digest


def test_present_node() -> None:
    present = fingerprints.node("gpu-01", _report())
    assert (present.node, present.reachable) == ("gpu-01", True)
    assert len(present.digest) == 16
    assert present == fingerprints.node("gpu-01", _report())


@pytest.mark.parametrize(
    "change",
    [
        pytest.param(lambda r: r.__setitem__("reachable", False), id="reachable"),
        pytest.param(lambda r: r.__setitem__("memory_total_bytes", 1), id="memory-total"),
        pytest.param(lambda r: r["gpus"].pop(), id="a-gpu-gone"),
        pytest.param(lambda r: r["gpus"][0].__setitem__("ecc_uncorrected", 2), id="gpu-fault"),
        pytest.param(lambda r: r["gpus"][0].__setitem__("gpu_class", "a100-80g"), id="gpu-class"),
        pytest.param(lambda r: r["gpus"][0].__setitem__("nvlink_peers", []), id="nvlink"),
        pytest.param(lambda r: r["gpus"][0].__setitem__("uuid", "GPU-new"), id="gpu-uuid"),
        pytest.param(lambda r: r["fabrics"][0].__setitem__("advertised", False), id="fabric-down"),
        pytest.param(lambda r: r["fabrics"][0].__setitem__("adapters", []), id="fabric-adapters"),
        pytest.param(lambda r: r["fabrics"][0].__setitem__("gid_index", 3), id="fabric-gid"),
        pytest.param(lambda r: r["weights"].append(
            {"path": "/models/x", "format": "gguf", "size_bytes": 1}), id="weights"),
        pytest.param(lambda r: r["units"].append(_unit()), id="a-unit"),
    ],
)
def test_what_planning_reads_changes_the_digest(change: Callable[[dict[str, Any]], object]) -> None:
    assert fingerprints.node("gpu-01", _edit(change)).digest != \
        fingerprints.node("gpu-01", _report()).digest


@pytest.mark.parametrize(
    ("before", "after"),
    [
        pytest.param({"digest": "d1"}, {"digest": "d2"}, id="digest"),
        pytest.param({"state": "loading"}, {"state": "ready"}, id="state"),
        pytest.param({"port": 18000}, {"port": 18001}, id="port"),
        pytest.param({"name": "llmgw-m-r0-s0.service"}, {"name": "llmgw-m-r1-s0.service"},
                     id="name"),
    ],
)
def test_unit_fields_change_the_digest(before: dict[str, object], after: dict[str, object],
                                       ) -> None:
    one = _edit(lambda r: r["units"].append(_unit(**before)))
    two = _edit(lambda r: r["units"].append(_unit(**after)))
    assert fingerprints.node("gpu-01", one).digest != fingerprints.node("gpu-01", two).digest


def test_volatile_facts_and_order_do_not() -> None:
    busy = _edit(lambda r: (
        r.__setitem__("collected_at", 1.0),
        r["gpus"][0].__setitem__("utilization_pct", 99),
        r["units"].append(_unit(pid=4242, since=5.0, last_used=6.0)),
    ))
    calm = _edit(lambda r: r["units"].append(_unit(pid=1, since=1.0, last_used=None)))
    assert fingerprints.node("gpu-01", busy).digest == fingerprints.node("gpu-01", calm).digest
    reordered = _edit(lambda r: (r["fabrics"].reverse(), r["gpus"].reverse()))
    assert fingerprints.node("gpu-01", reordered).digest == \
        fingerprints.node("gpu-01", _report()).digest


def test_fabrics_are_compared_by_name_not_position() -> None:
    def rename(report: dict[str, Any]) -> None:
        for fabric in report["fabrics"]:
            fabric["name"] = fabric["name"].replace("ib", "ic")
    assert fingerprints.node("gpu-01", _edit(rename)).digest != \
        fingerprints.node("gpu-01", _report()).digest
