"""What changed on a node since the daemon last heard, and that change applied.

An agent pushes its node's observations over the ``WatchUnits`` stream: a
full :class:`~llmgw.fleet.types.NodeReport` when the stream starts (so on
every reconnect) and at a slow backstop interval, and in between only a
:class:`Delta` — the units that changed or went, and the fetches when they
changed. The daemon keeps each node's last report and applies each delta to
it (:func:`apply`), so its work per round grows with what changed, not with
the fleet.

Both halves are purely computational functions with no side-effects, and
they are inverse: for any two reports ``a`` and ``b`` of one node whose other
facts are the same, ``apply(a, between(a, b)) == b``.
(``tests/fleet/test_deltas.py`` checks that over random changes.)

Usage::

    delta = deltas.between(sent, now)      # the agent: what to push
    if delta:
        view = deltas.apply(view, delta)   # the daemon: its copy follows
"""

from __future__ import annotations

from dataclasses import dataclass

from llmgw.fleet.types import Fetch, NodeReport, Unit


@dataclass(frozen=True)
class Delta:
    """One push: units changed (whole, by name) or removed, fetches when they changed,
    or a full report, which replaces everything the daemon knew of the node."""

    units: tuple[Unit, ...] = ()
    removed: tuple[str, ...] = ()
    fetches: tuple[Fetch, ...] | None = None  # None: unchanged
    report: NodeReport | None = None

    def __bool__(self) -> bool:
        return bool(self.units or self.removed or self.fetches is not None
                    or self.report is not None)

    @property
    def full(self) -> bool:
        return self.report is not None


def full(report: NodeReport) -> Delta:
    """The delta that replaces what the daemon knows: a whole report."""
    return Delta(report=report)


def between(before: NodeReport, after: NodeReport) -> Delta:
    """What turns ``before``'s units and fetches into ``after``'s (the other facts are
    not compared: a change there is pushed as a full report)."""
    old = {unit.name: unit for unit in before.units}
    new = {unit.name: unit for unit in after.units}
    changed = tuple(unit for name, unit in sorted(new.items()) if old.get(name) != unit)
    removed = tuple(sorted(old.keys() - new.keys()))
    fetches = tuple(after.fetches) if after.fetches != before.fetches else None
    return Delta(units=changed, removed=removed, fetches=fetches)


def apply(report: NodeReport, delta: Delta) -> NodeReport:
    """``report`` with ``delta`` applied; units stay in name order, as agents send them."""
    if delta.report is not None:
        return delta.report
    if not (delta.units or delta.removed or delta.fetches is not None):
        return report
    units = {unit.name: unit for unit in report.units}
    for name in delta.removed:
        units.pop(name, None)
    for unit in delta.units:
        units[unit.name] = unit
    update: dict[str, object] = {"units": [units[name] for name in sorted(units)]}
    if delta.fetches is not None:
        update["fetches"] = list(delta.fetches)
    return report.model_copy(update=update)


def faults(report: NodeReport) -> tuple[object, ...]:
    """What placement refuses a node or a GPU for: each GPU's identity and health, the
    cards on the PCI bus, the fabrics' states. When these change the agent pushes a full
    report; free memory, utilisation and free disk change all the time and wait for the
    backstop."""
    gpus = tuple((g.index, g.uuid, g.gpu_class, g.memory_total_mib, g.ecc_uncorrected,
                  g.mig_mode, g.pci_device_id) for g in report.gpus)
    cards = tuple((c.address, c.device_id, c.driver) for c in report.pci_gpus)
    fabrics = tuple((f.name, f.advertised, tuple(f.reasons)) for f in report.fabrics)
    return gpus, cards, fabrics, report.boot_id
