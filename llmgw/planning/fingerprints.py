"""Fingerprints of observed nodes, so a saved plan applies only to what it saw.

A plan records, per node, a digest of what planning read from the node's
report. Before a saved plan is applied, the nodes are observed again; a node
whose digest changed is re-planned, not acted on blindly.

A purely computational module with no side effects.
"""

from __future__ import annotations

import hashlib
import json

from llmgw.fleet.types import NodeReport
from llmgw.planning.types import NodeFingerprint


def node(name: str, report: NodeReport | None) -> NodeFingerprint:
    """A digest of what planning reads from a node's report, and nothing volatile.

    Utilisation, free memory and timestamps change every second; GPUs, their
    faults, fabrics, weights and units are what a saved plan depends on.
    """
    if report is None:
        return NodeFingerprint(name, False, _hash({"absent": True}))
    content = {
        "reachable": report.reachable,
        "memory_total": report.memory_total_bytes,
        "gpus": [[g.index, g.uuid, g.gpu_class, g.faults, g.nvlink_peers]
                 for g in sorted(report.gpus, key=lambda g: g.index)],
        "fabrics": [[f.name, f.advertised, f.adapters, f.gid_index]
                    for f in sorted(report.fabrics, key=lambda f: f.name)],
        "weights": sorted(w.path for w in report.weights),
        "units": sorted([u.name, u.digest, u.state, u.port] for u in report.units),
    }
    return NodeFingerprint(name, report.reachable, _hash(content))


def _hash(content: object) -> str:
    text = json.dumps(content, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]
