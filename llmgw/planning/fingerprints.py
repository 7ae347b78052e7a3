"""Fingerprints of observed nodes, so a saved plan applies only to what it saw.

A plan records, per node, a digest of what planning read from the node's
report. Before a saved plan is applied, the nodes are observed again; a node
whose digest changed is re-planned, not acted on blindly.

A purely computational module with no side effects.
"""

from __future__ import annotations

import hashlib
import json
import operator

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


class Cache:
    """Each node's last fingerprint, kept for the next plan: hashing 10,000 reports
    that did not change in what :func:`node` reads is most of a steady plan."""

    def __init__(self) -> None:
        self._known: dict[str, tuple[NodeReport | None, NodeFingerprint]] = {}

    def node(self, name: str, report: NodeReport | None) -> NodeFingerprint:
        """What :func:`node` says of ``report``."""
        known = self._known.get(name)
        if known is not None and _same_content(known[0], report):
            if known[0] is not report:
                self._known[name] = (report, known[1])  # the next check is one of identity
            return known[1]
        found = node(name, report)
        self._known[name] = (report, found)
        return found

    def keep(self, names: set[str]) -> None:
        for name in [n for n in self._known if n not in names]:
            del self._known[name]


_GPU = operator.attrgetter("index", "uuid", "gpu_class", "nvlink_peers", "mig_mode",
                          "ecc_uncorrected")  # a GPU's faults: by what they are made of
_PROCESS = operator.attrgetter("pid", "name", "owned_by_llmgw")
_UNIT = operator.attrgetter("name", "digest", "state", "port")


def _same_content(old: NodeReport | None, new: NodeReport | None) -> bool:
    """Whether :func:`node` hashes the same content for both (compared more strictly
    than it reads)."""
    if old is new:
        return True
    return not (
        old is None or new is None or old.reachable != new.reachable
        or old.memory_total_bytes != new.memory_total_bytes
        or list(map(_GPU, old.gpus)) != list(map(_GPU, new.gpus))
        or _processes(old) != _processes(new) or old.fabrics != new.fabrics
        or [w.path for w in old.weights] != [w.path for w in new.weights]
        or list(map(_UNIT, old.units)) != list(map(_UNIT, new.units)))


def _processes(report: NodeReport) -> list[tuple[int, list[tuple[object, ...]]]]:
    return [(g.index, list(map(_PROCESS, g.processes))) for g in report.gpus
            if g.processes]
