"""What each node can still take: GPUs, ports, memory, fabrics, weights.

:class:`Capacity` is the planner's working view of the fleet. It starts from
the cluster (what should exist) and the fleet (what does), and is updated as
replicas are kept, placed or removed. It keeps the nodes that can take new
work in buckets by free GPUs per class, so finding the best node for a
replica does not scan a thousand nodes.

A purely computational module with no side effects.
"""

from __future__ import annotations

import bisect
import json
import operator
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from llmgw.fleet import stores
from llmgw.fleet.types import FabricStatus, Fleet, NodeReport
from llmgw.spec import quantities, sources
from llmgw.spec.models import Cluster, Node

FIRST_PORT = 18000
GIB = 1024**3


@dataclass
class GpuSlot:
    index: int
    uuid: str
    gpu_class: str
    faults: list[str]
    peers: frozenset[int] | None  # NVLink peers; None when the topology is unknown


@dataclass
class NodeState:
    """One node: what it has, what is taken, and why it may take nothing."""

    name: str
    spec: Node
    report: NodeReport | None
    gpus: dict[int, GpuSlot] = field(default_factory=dict)
    by_uuid: dict[str, int] = field(default_factory=dict)
    used: dict[int, str] = field(default_factory=dict)  # GPU index → who holds it
    ports: set[int] = field(default_factory=set)
    # Ports another program listens on (the agent's listening sockets, less llmgw's own
    # units'): port → who, in words ("" when the agent did not say).
    foreign_ports: dict[int, str] = field(default_factory=dict)
    memory_held: int = 0  # bytes promised to CPU replicas
    fabrics: dict[str, FabricStatus] = field(default_factory=dict)  # usable, declared here
    fabric_problems: dict[str, str] = field(default_factory=dict)
    weights: frozenset[str] = frozenset()
    fully_connected: bool = False  # every GPU an NVLink peer of every other (NVSwitch)
    version: int = 0  # bumped whenever something is taken or given back here
    # Set by placements.place() for one profile's node_selector, cleared after:
    # why this node is not a candidate for that profile.
    excluded: str | None = None
    class_counts: Counter[str] = field(default_factory=Counter)
    # class → (version, free GPU indices): ``free`` is asked for thousands of times a
    # plan, and only take/give_back (which bump ``version``) change the answer.
    _free: dict[str, tuple[int, list[int]]] = field(default_factory=dict, repr=False)

    @property
    def reachable(self) -> bool:
        return self.report is not None and self.report.reachable

    @property
    def placeable(self) -> bool:
        """New replicas may land here."""
        return (self.reachable and not self.spec.cordoned and not self.spec.drain
                and self.excluded is None)

    @property
    def memory_total(self) -> int | None:
        if self.report is not None and self.report.memory_total_bytes is not None:
            return self.report.memory_total_bytes
        return self.spec.memory

    def unavailable(self) -> str | None:
        """Why nothing new can land here; None when something can."""
        if self.report is None:
            return "no report from its agent"
        if not self.report.reachable:
            return f"unreachable: {self.report.error or 'no answer'}"
        if self.spec.drain:
            return "draining"
        if self.spec.cordoned:
            return "cordoned"
        return self.excluded

    def free(self, gpu_class: str) -> list[int]:
        """Healthy GPUs of ``gpu_class`` nobody holds, in index order; do not modify."""
        known = self._free.get(gpu_class)
        if known is not None and known[0] == self.version:
            return known[1]
        found = [
            g.index for g in self.gpus.values()
            if g.gpu_class == gpu_class and not g.faults and g.index not in self.used
        ]
        self._free[gpu_class] = (self.version, found)
        return found

    def classes(self) -> Counter[str]:
        return self.class_counts

    def topology_known(self, indices: Iterable[int]) -> bool:
        return all(self.gpus[i].peers is not None for i in indices)

    def next_ports(self, count: int) -> list[int]:
        """The lowest ``count`` free ports from the node's first engine port, not used by
        any llmgw unit nor listened on by another program."""
        found: list[int] = []
        port = self.spec.engine_ports_from
        while len(found) < count:
            if port not in self.ports and port not in self.foreign_ports:
                found.append(port)
            port += 1
        return found

    def port_taken(self, port: int) -> str | None:
        """Why another program stands on ``port`` here; None when it does not."""
        if port not in self.foreign_ports:
            return None
        who = self.foreign_ports[port] or "a program llmgw did not start"
        return f"port {port} is held by {who}"


def weights_keys(path: str) -> set[str]:
    """Names under which weights at ``path`` may be asked for.

    ``/models/meta-llama/Llama-3.1-8B`` answers to the path itself, to
    ``meta-llama/Llama-3.1-8B`` and to ``Llama-3.1-8B``; a Hugging Face cache
    directory ``models--org--name`` answers to ``org/name``.
    """
    clean = path.rstrip("/")
    parts = [p for p in clean.split("/") if p]
    keys = {clean}
    if parts:
        keys.add(parts[-1])
    if len(parts) >= 2:
        keys.add("/".join(parts[-2:]))
    for part in parts:
        if part.startswith("models--"):
            repo = part[len("models--"):].split("--")
            keys.add("/".join(repo))
            keys.add(repo[-1])
    return keys


def source_keys(source: str) -> list[str]:
    """The keys :func:`weights_keys` would file ``source`` under."""
    if source.startswith("/"):
        return [source.rstrip("/")]
    if "://" in source or "@" in source or ":" in source:
        return [source]  # an URL, a revision or a file selection: only that fetch has it
    return [source, source.rsplit("/", 1)[-1]]


class Capacity:
    """The fleet as the planner works on it."""

    def __init__(self, cluster: Cluster, fleet: Fleet, cache: NodeCache | None = None) -> None:
        self.nodes: dict[str, NodeState] = {}
        self.sources = fleet.sources
        self.margin = cluster.cluster.weights.disk_margin
        self._weights: dict[str, set[str]] = {}
        self._parsed: dict[str, sources.Source] = {}  # every node asks about the same few
        self.model_nodes: dict[str, Counter[str]] = {}
        self.fabric_nodes: dict[str, list[str]] = {}
        # class → free count → sorted names of placeable nodes
        self._buckets: dict[str, dict[int, list[str]]] = {}
        # (node, what was asked) → (node version, why it did not fit): a failed
        # placement asks every node, and most nodes have not changed since.
        self.reasons: dict[tuple[str, tuple[str, ...], int], tuple[int, str]] = {}
        needs = {f: spec.min_adapters for f, spec in cluster.fabrics.items()}
        if cache is not None:
            cache.keep(cluster.nodes)
        for name in sorted(cluster.nodes):
            if cache is not None:
                node = cache.state(name, cluster.nodes[name], fleet.nodes.get(name), needs)
            else:
                node = _node_state(name, cluster.nodes[name], fleet.nodes.get(name), needs)
            self.nodes[name] = node
            for key in node.weights:
                self._weights.setdefault(key, set()).add(name)
            for fabric in node.spec.fabrics:
                self.fabric_nodes.setdefault(fabric, []).append(name)
            if node.placeable:
                for gpu_class in node.classes():
                    self._file(node, gpu_class)
        self.survey = stores.survey(
            fleet, {name: list(node.spec.fabrics) for name, node in self.nodes.items()},
            cluster.cluster.weights.shared_overrides, local=False)
        self._file_shared()
        # (fabric, store, source) → the first node this plan fetches it on: the
        # others that mount the store wait for that one fetch (llmgw.hub.fetches'
        # lock is in the directory), so the plan says it is fetched once.
        self.planned_fetches: dict[tuple[str, str, str], str] = {}

    def _file_shared(self) -> None:
        """A copy in a shared store counts for every node of its fabric that mounts it,
        under the path that node sees it at (its own weights directory there)."""
        for store in self.survey.stores:
            for copy in store.copies:
                for name, directory in store.dirs:
                    if name not in self.nodes:
                        continue
                    keys = ({copy.source} if copy.source is not None
                            else weights_keys(f"{directory.rstrip('/')}/{copy.relative}"))
                    for key in keys:
                        self._weights.setdefault(key, set()).add(name)

    # -- queries ----------------------------------------------------------

    def weights_room(self, node: NodeState, source: str) -> str | None:
        """Why ``node`` cannot fetch ``source`` (too little disk, or nowhere to put an URL's
        file) or may not serve it (a path outside its weights_dirs, or it declares none); else None.

        A node that has the weights needs no room; a size the source did not say
        cannot be judged here (the agent checks again before fetching).
        """
        parsed = self._parsed.get(source)
        if parsed is None:
            parsed = self._parsed[source] = sources.parse(source)
        dirs = node.spec.weights_dirs
        if parsed.kind == "path" and not dirs:
            # A node serves path sources from under its weights_dirs only: a cluster
            # file may not point an engine at /etc/passwd (issue 23).
            return "no weights_dirs to serve a path source from"
        if parsed.kind == "path" and not sources.within(parsed.path or source, dirs):
            return f"{parsed.path} is in none of its weights_dirs"
        if not parsed.fetched or node.name in self.with_weights(source):
            return None
        if not dirs and parsed.kind == "url":
            # Only the agent fetches an URL; no engine downloads one itself.
            return "no weights_dirs to fetch an URL source into"
        if not dirs:
            return None  # nothing to fetch into: the engine downloads, as it always could
        facts = self.sources.get(source)
        if facts is None or facts.size_bytes is None or node.report is None:
            return None
        disk = next((d for d in node.report.disks if d.path == dirs[0]), None)
        if disk is None or disk.free_bytes is None:
            return None
        need = facts.size_bytes + max(int(facts.size_bytes * self.margin), MIN_MARGIN)
        if disk.free_bytes >= need:
            return None
        return f"needs {human_bytes(need)}, {human_bytes(disk.free_bytes)} free in {dirs[0]}"

    def with_weights(self, source: str) -> set[str]:
        found: set[str] = set()
        for key in source_keys(source):
            found |= self._weights.get(key, set())
        return found

    def same_model(self, model: str, node: str) -> int:
        counts = self.model_nodes.get(model)
        return counts[node] if counts else 0

    def by_free(self, gpu_class: str, at_least: int) -> Iterator[NodeState]:
        """Placeable nodes with ``at_least`` free GPUs of a class, fewest free first."""
        buckets = self._buckets.get(gpu_class, {})
        for free in sorted(count for count in buckets if count >= at_least):
            for name in list(buckets[free]):
                if self.nodes[name].excluded is None:
                    yield self.nodes[name]

    def gpu_classes(self) -> list[str]:
        return sorted({g.gpu_class for n in self.nodes.values() for g in n.gpus.values()})

    # -- changes ----------------------------------------------------------

    def take(
        self, node: str, gpus: Iterable[int], ports: Iterable[int], memory: int,
        model: str, holder: str,
    ) -> None:
        """Mark GPUs, ports and memory on ``node`` as held by ``holder``."""
        state = self.nodes[node]
        touched = self._unfile(state, gpus)
        for index in gpus:
            state.used[index] = holder
        state.ports.update(ports)
        state.memory_held += memory
        state.version += 1
        self.model_nodes.setdefault(model, Counter())[node] += 1
        self._refile(state, touched)

    def give_back(
        self, node: str, gpus: Iterable[int], ports: Iterable[int], memory: int, model: str,
    ) -> None:
        """Undo :meth:`take`."""
        state = self.nodes[node]
        touched = self._unfile(state, gpus)
        for index in gpus:
            state.used.pop(index, None)
        state.ports.difference_update(ports)
        state.memory_held -= memory
        state.version += 1
        counts = self.model_nodes.get(model)
        if counts and counts[node]:
            counts[node] -= 1
        self._refile(state, touched)

    # -- the bucket index ---------------------------------------------------

    def _unfile(self, state: NodeState, gpus: Iterable[int]) -> set[str]:
        touched = {state.gpus[i].gpu_class for i in gpus if i in state.gpus}
        if state.placeable:
            for gpu_class in touched:
                bucket = self._buckets[gpu_class][len(state.free(gpu_class))]
                del bucket[bisect.bisect_left(bucket, state.name)]
        return touched

    def _refile(self, state: NodeState, touched: set[str]) -> None:
        if state.placeable:
            for gpu_class in touched:
                self._file(state, gpu_class)

    def _file(self, state: NodeState, gpu_class: str) -> None:
        free = len(state.free(gpu_class))
        bucket = self._buckets.setdefault(gpu_class, {}).setdefault(free, [])
        bisect.insort(bucket, state.name)


def _node_state(name: str, spec: Node, report: NodeReport | None,
                needs: dict[str, int | None] | None = None) -> NodeState:
    """What ``name`` can take; ``needs``: each fabric's ``min_adapters``, if it sets one."""
    node = NodeState(name=name, spec=spec, report=report)
    if report is None:
        return node
    for gpu in report.gpus:
        node.gpus[gpu.index] = GpuSlot(
            index=gpu.index, uuid=gpu.uuid, gpu_class=gpu.gpu_class, faults=gpu.faults,
            peers=None if gpu.nvlink_peers is None else frozenset(gpu.nvlink_peers),
        )
        node.by_uuid[gpu.uuid] = gpu.index
        node.class_counts[gpu.gpu_class] += 1
    indices = set(node.gpus)
    node.fully_connected = bool(node.gpus) and all(
        g.peers is not None and g.peers >= indices - {g.index} for g in node.gpus.values()
    )
    reported = {f.name: f for f in report.fabrics}
    for fabric, declared in sorted(spec.fabrics.items()):
        status = reported.get(fabric)
        # The adapters NCCL may use: declared now and ACTIVE. An agent that has not
        # had the new declaration yet still reports the adapters it was given.
        active = [a for a in declared if status is not None and a in status.adapters]
        if status is None:
            node.fabric_problems[fabric] = f"fabric {fabric} not reported by the agent"
        elif not status.advertised or not status.adapters:
            why = "; ".join(status.reasons) or "no ACTIVE adapter"
            node.fabric_problems[fabric] = f"fabric {fabric} not advertised: {why}"
        elif not active:
            node.fabric_problems[fabric] = (
                f"fabric {fabric}: none of the adapters declared here ({', '.join(declared)}) "
                f"is among those the agent reports ACTIVE ({', '.join(status.adapters)})")
        elif len(active) < ((needs or {}).get(fabric) or 0):
            node.fabric_problems[fabric] = (
                f"fabric {fabric}: {len(active)} of {quantities.count(len(declared), 'adapter')} "
                f"ACTIVE, needs {(needs or {})[fabric]} (fabrics.{fabric}.min_adapters)")
        else:
            node.fabrics[fabric] = status
    keys: set[str] = set()
    for weights in report.weights:
        keys |= weights_keys(weights.path)
    # What llmgw fetched is filed under the source as written: `org/name:Q4_K_M`
    # is present only where that selection was fetched, not any file of the repo.
    keys |= {cached.source for cached in report.cached_weights}
    node.weights = frozenset(keys)
    node.foreign_ports = _foreign_ports(report)
    return node


def _foreign_ports(report: NodeReport) -> dict[int, str]:
    """Ports that programs other than llmgw's units listen on, with who, where known.

    A unit's own ports are its engine's, except where the agent found another
    program on it (``port_holder``): that port is someone else's until it goes.
    """
    listening = report.host.listening_ports if report.host is not None else None
    taken = {unit.port: unit.port_holder for unit in report.units
             if unit.port is not None and unit.port_holder}
    if not listening:
        return taken  # nothing else listens: no unit's spec label needs reading
    ours: set[int] = set()
    for unit in report.units:
        ours |= {p for p in _unit_ports(unit.port, unit.labels.get("X-Llmgw-Spec"))
                 if p not in taken}
    found = {port: "" for port in listening or () if port not in ours}
    return found | taken


def _unit_ports(port: int | None, spec_label: str | None) -> set[int]:
    ports = {port} if port is not None else set()
    try:
        spec = json.loads(spec_label or "{}")
    except ValueError:
        return ports
    if isinstance(spec, dict):
        ports |= {spec[key] for key in ("port", "dist_port", "aux_port")
                  if isinstance(spec.get(key), int)}
    return ports


MIN_MARGIN = 256 * 1024 * 1024  # as the agent keeps (llmgw.hub.fetches.MIN_MARGIN)


def human_bytes(size: int) -> str:
    """``141000000000`` → ``141 GB`` (decimal units, as disks are sold and df -H says)."""
    value = float(size)
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if value < 1000 or unit == "TB":
            break
        value /= 1000
    return f"{value:.0f} {unit}" if value >= 10 or unit == "B" else f"{value:.1f} {unit}"


def gib(size: int) -> str:
    """``25769803776`` → ``24``; ``1.5 GiB`` keeps one decimal."""
    value = size / GIB
    return f"{value:.0f}" if abs(value - round(value)) < 0.05 else f"{value:.1f}"



class NodeCache:
    """Each node's state as derived from its last report, kept for the next plan.

    A report that differs from the last one in nothing :func:`_node_state` reads
    (utilisation, free memory and the time of collection change every tick) gives
    the same state: the next plan starts from a copy of it instead of deriving it
    again. What a plan takes or gives back is never cached: every copy starts empty.
    """

    def __init__(self) -> None:
        self._known: dict[str, tuple[Node, dict[str, int | None], NodeReport | None,
                                     NodeState]] = {}
        self.derived = 0  # states derived afresh by the last plan; the others were copies

    def state(self, name: str, spec: Node, report: NodeReport | None,
              needs: dict[str, int | None]) -> NodeState:
        known = self._known.get(name)
        if (known is not None and (known[0] is spec or known[0] == spec) and known[1] == needs
                and same_reading(known[2], report)):
            # Kept with the newest report: the pool hands the same object again until the
            # node pushes, and the next plan's comparison is then one identity check.
            self._known[name] = (spec, needs, report, known[3])
            return _copied(known[3], spec, report)
        self.derived += 1
        node = _node_state(name, spec, report, needs)
        self._known[name] = (spec, needs, report, _copied(node, spec, report))
        return node

    def keep(self, names: Iterable[str]) -> None:
        """Forget nodes no longer declared; start counting a new plan."""
        wanted = set(names)
        for name in [n for n in self._known if n not in wanted]:
            del self._known[name]
        self.derived = 0


# What _node_state reads of a GPU, of its processes, of a unit: fetched in C, compared whole.
_GPU_READ = operator.attrgetter("index", "uuid", "gpu_class", "mig_mode", "ecc_uncorrected",
                                "nvlink_peers")
_PROCESS_READ = operator.attrgetter("pid", "name", "owned_by_llmgw")


def same_reading(old: NodeReport | None, new: NodeReport | None) -> bool:
    """Whether :func:`_node_state` reads the same from both reports."""
    if old is new:
        return True
    if (old is None or new is None
            or list(map(_GPU_READ, old.gpus)) != list(map(_GPU_READ, new.gpus))
            or _processes(old) != _processes(new) or old.fabrics != new.fabrics
            or [w.path for w in old.weights] != [w.path for w in new.weights]
            or [c.source for c in old.cached_weights] != [c.source for c in new.cached_weights]):
        return False
    listening = old.host.listening_ports if old.host is not None else None
    if listening != (new.host.listening_ports if new.host is not None else None):
        return False
    return _unit_ports_read(old, bool(listening)) == _unit_ports_read(new, bool(listening))


def _processes(report: NodeReport) -> list[tuple[int, list[tuple[object, ...]]]]:
    return [(g.index, list(map(_PROCESS_READ, g.processes))) for g in report.gpus
            if g.processes]


def _unit_ports_read(report: NodeReport, labels: bool) -> list[tuple[object, ...]]:
    if labels:
        return [(u.port, u.port_holder, u.labels.get("X-Llmgw-Spec")) for u in report.units]
    return [(u.port, u.port_holder) for u in report.units]


def _copied(node: NodeState, spec: Node, report: NodeReport | None) -> NodeState:
    """A state with ``node``'s derived facts (shared: nothing changes them) and nothing
    taken; ``report`` is the newest, for what is read from it directly."""
    return NodeState(
        name=node.name, spec=spec, report=report, gpus=node.gpus, by_uuid=node.by_uuid,
        foreign_ports=node.foreign_ports, fabrics=node.fabrics,
        fabric_problems=node.fabric_problems, weights=node.weights,
        fully_connected=node.fully_connected, class_counts=node.class_counts,
    )
