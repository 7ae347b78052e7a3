"""What each fabric holds: its shared stores and the models in them, and each node's own copies.

The stores are :func:`llmgw.fleet.stores.survey`'s, over the cluster's fabrics
and its ``weights.filesystems``, as the planner counts them; this module
names the cluster's models each copy serves, for ``llmgw status`` and the
/admin nodes page. A purely computational module with no side effects.
"""

from __future__ import annotations

from dataclasses import dataclass

from llmgw.fleet import stores
from llmgw.fleet.types import Fleet
from llmgw.planning.nodes import source_keys, weights_keys
from llmgw.spec.models import Cluster


@dataclass(frozen=True)
class Held:
    """One copy, and the cluster's models whose source it is."""

    name: str  # the fetched source, else the path below the weights directory
    size_bytes: int
    models: tuple[str, ...]


@dataclass(frozen=True)
class StoreView:
    fabric: str
    fs_type: str
    source: str
    dirs: tuple[tuple[str, str], ...]  # (node, its weights directory there)
    held: tuple[Held, ...]

    @property
    def nodes(self) -> tuple[str, ...]:
        return tuple(node for node, _ in self.dirs)


@dataclass(frozen=True)
class Holdings:
    stores: tuple[StoreView, ...]
    local: tuple[tuple[str, tuple[Held, ...]], ...]  # (node, its own copies), by node
    alone: tuple[tuple[str, str], ...]  # (node, why its shared mount is not shared)

    def __bool__(self) -> bool:
        return bool(self.stores or self.local or self.alone)


def _sources(cluster: Cluster) -> dict[str, set[str]]:
    """Model → every source it or its profiles name."""
    found: dict[str, set[str]] = {}
    for name, model in cluster.models.items():
        names = {model.source} if model.source else set()
        names |= {p.source for p in model.profiles if p.source}
        found[name] = {str(s) for s in names}
    return found


def _models(copy: stores.Copy, sources: dict[str, set[str]]) -> tuple[str, ...]:
    if copy.source is not None:
        return tuple(sorted(m for m, names in sources.items() if copy.source in names))
    keys = weights_keys(f"{copy.directory.rstrip('/')}/{copy.relative}")
    return tuple(sorted(m for m, names in sources.items()
                        if any(k in keys for s in names for k in source_keys(s))))


def holdings(cluster: Cluster, fleet: Fleet) -> Holdings:
    """The fleet's stores and local copies, each copy with the models it serves."""
    found = stores.survey(fleet, {n: list(node.fabrics) for n, node in cluster.nodes.items()},
                          cluster.cluster.weights.shared_overrides)
    sources = _sources(cluster)

    def held(copies: tuple[stores.Copy, ...]) -> tuple[Held, ...]:
        items = [Held(c.name, c.size_bytes, _models(c, sources)) for c in copies]
        return tuple(sorted(items, key=lambda h: (h.models, h.name.lower())))

    views = tuple(StoreView(fabric=s.fabric, fs_type=s.fs_type, source=s.source, dirs=s.dirs,
                            held=held(s.copies)) for s in found.stores)
    local = tuple((node, held(copies)) for node, copies in sorted(found.local.items()))
    alone = tuple((node, why) for node, whys in sorted(found.alone.items()) for why in whys)
    return Holdings(stores=views, local=local, alone=alone)
