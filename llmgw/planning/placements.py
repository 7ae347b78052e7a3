"""Where a replica can run: the placement rules, and why a node does not fit.

:func:`place` tries one profile and returns either a :class:`Placement` or
the per-node reasons it did not fit (an :class:`~.types.Attempt`). Rules:

* Only nodes whose labels match the profile's ``node_selector``.
* GPUs of the profile's class, healthy (no uncorrected ECC errors, no memory
  held by processes llmgw did not start), not held by another replica; nodes
  reachable and not cordoned.
* A tensor-parallel group on one node when the profile says one node; on
  NVLink-connected GPUs when the node's topology is known and such a set is
  free (preferred, not required: PCIe cards have no NVLink at all).
* A multi-node replica only on nodes that advertise one common fabric, all
  of them on it, each with a management interface for the bootstrap.
* CPU profiles: ``min_memory_gb`` of system memory not promised to other CPU
  replicas, on each node of the replica; nodes without GPUs first. A vLLM CPU
  replica across nodes needs no fabric (its ranks use gloo over TCP).
* Preferences, in order: NVLink, spreading replicas of one model across
  nodes, nodes already holding the weights, the tightest fit; then the name,
  so equal choices always resolve the same way.

A purely computational module with no side effects.
"""

from __future__ import annotations

import itertools
from collections.abc import Sized
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from llmgw.planning.nodes import Capacity, NodeState, gib
from llmgw.planning.types import Attempt
from llmgw.spec.models import Profile

if TYPE_CHECKING:
    from llmgw.planning.replicas import ObservedReplica

# Combinations tried when looking for an NVLink-connected set on one node;
# C(8, 4) = 70, so this only bounds unusual 16-GPU boxes.
_CLIQUE_SEARCH_LIMIT = 5000
NVLINK, TOPOLOGY_UNKNOWN, NO_NVLINK = 0, 1, 2


@dataclass(frozen=True)
class Slot:
    """One shard's place: a node, its GPUs, its ports."""

    node: str
    gpu_class: str | None
    gpus: tuple[int, ...]
    gpu_uuids: tuple[str, ...]
    port: int | None = None  # HTTP, rank 0 only
    dist_port: int | None = None  # rendezvous, rank 0 of multi-node replicas only
    aux_port: int | None = None  # SGLang ranks > 0: their placeholder health server

    @property
    def ports(self) -> tuple[int, ...]:
        """Every port this shard holds on its node."""
        return tuple(p for p in (self.port, self.dist_port, self.aux_port) if p is not None)


@dataclass(frozen=True)
class Placement:
    profile: int
    slots: tuple[Slot, ...]  # in rank order
    fabric: str | None = None
    memory: int = 0  # bytes, CPU profiles


@dataclass(frozen=True)
class Request:
    model: str
    profile_index: int
    profile: Profile
    source: str


def label(profile: Profile) -> str:
    """``vllm · 2 nodes × 8 h100-80g`` — how plans name a profile."""
    if profile.cpu:
        memory = f", {profile.min_memory_gb:g} GiB" if profile.min_memory_gb else ""
        return f"{profile.engine} · cpu{memory}"
    classes = "|".join(profile.gpu_classes)
    per_node = f"{profile.gpus_per_node} {classes}"
    if profile.nodes > 1:
        return f"{profile.engine} · {profile.nodes} nodes × {per_node}"
    return f"{profile.engine} · {per_node}"


def place(capacity: Capacity, request: Request) -> Placement | Attempt:
    """The best place for one replica of ``request``, or why there is none."""
    selector = request.profile.node_selector
    if not selector:
        return _place(capacity, request)
    for node in capacity.nodes.values():
        node.excluded = selector_mismatch(node.spec.labels, selector)
    try:
        return _place(capacity, request)
    finally:
        for node in capacity.nodes.values():
            node.excluded = None


def selector_mismatch(labels: dict[str, str], selector: dict[str, str]) -> str | None:
    """Why a node with ``labels`` is left out by ``selector``; None when it matches."""
    wrong = [f"{key}={value}" for key, value in sorted(selector.items())
             if labels.get(key) != value]
    if not wrong:
        return None
    has = [f"{key}={labels[key]}" for key in sorted(selector) if key in labels]
    return (f"node_selector wants {', '.join(wrong)}; the node has "
            + (", ".join(has) if has else "no such label"))


def _place(capacity: Capacity, request: Request) -> Placement | Attempt:
    profile = request.profile
    if profile.cpu:
        return _place_cpu(capacity, request)
    if profile.nodes > 1:
        return _place_multi(capacity, request)
    return _place_single(capacity, request)


def choose_gpus(node: NodeState, gpu_class: str, count: int) -> tuple[tuple[int, ...], int]:
    """``count`` free GPUs of a class on one node, NVLink-connected when possible.

    Returns the indices and how well they are connected (``NVLINK``,
    ``TOPOLOGY_UNKNOWN``, ``NO_NVLINK``).
    """
    free = node.free(gpu_class)
    first = tuple(free[:count])
    if count <= 1 or node.fully_connected:
        return first, NVLINK
    if not node.topology_known(free):
        return first, TOPOLOGY_UNKNOWN
    if _clique(node, first):
        return first, NVLINK
    for tried, group in enumerate(itertools.combinations(free, count)):
        if tried >= _CLIQUE_SEARCH_LIMIT:
            break
        if _clique(node, group):
            return group, NVLINK
    return first, NO_NVLINK


def _clique(node: NodeState, group: tuple[int, ...]) -> bool:
    for position, index in enumerate(group):
        peers = node.gpus[index].peers or frozenset()
        if any(other not in peers for other in group[position + 1:]):
            return False
    return True


def _rank(
    capacity: Capacity, request: Request, node: NodeState, gpu_class: str, count: int,
    weights: set[str],
) -> tuple[tuple[int, int, int, int, str], tuple[int, ...]]:
    gpus, connected = choose_gpus(node, gpu_class, count)
    key = (
        connected,
        capacity.same_model(request.model, node.name),
        0 if node.name in weights else 1,
        len(node.free(gpu_class)) - count,
        node.name,
    )
    return key, gpus


def _place_single(capacity: Capacity, request: Request) -> Placement | Attempt:
    profile = request.profile
    count = profile.world_size
    weights = capacity.with_weights(request.source)
    for gpu_class in profile.gpu_classes:
        # Nodes with weights or with this model already are few: rank them all.
        # Among the rest only the fit differs, and by_free yields the tightest
        # fit first, so the first NVLink-connected one is the best of them.
        special = weights | set(capacity.model_nodes.get(request.model, {}))
        best: tuple[tuple[int, int, int, int, str], tuple[int, ...], NodeState] | None = None
        for name in sorted(special):
            node = capacity.nodes.get(name)
            if node is None or not node.placeable or len(node.free(gpu_class)) < count:
                continue
            if capacity.weights_room(node, request.source):
                continue
            key, gpus = _rank(capacity, request, node, gpu_class, count, weights)
            if best is None or key < best[0]:
                best = (key, gpus, node)
        for node in capacity.by_free(gpu_class, count):
            if node.name in special or capacity.weights_room(node, request.source):
                continue
            key, gpus = _rank(capacity, request, node, gpu_class, count, weights)
            if best is None or key < best[0]:
                best = (key, gpus, node)
            if key[0] == NVLINK:
                break
        if best is not None:
            _, gpus, node = best
            port = node.next_ports(1)[0]
            slot = Slot(
                node.name, gpu_class, gpus, tuple(node.gpus[i].uuid for i in gpus), port=port,
            )
            return Placement(request.profile_index, (slot,))
    classes = tuple(profile.gpu_classes)
    return Attempt(
        request.profile_index, label(profile),
        tuple((name, _why_not_single(capacity, node, classes, count, request.source))
              for name, node in capacity.nodes.items()),
    )


def _place_multi(capacity: Capacity, request: Request) -> Placement | Attempt:
    profile = request.profile
    count = profile.gpus_per_node
    weights = capacity.with_weights(request.source)
    reasons: list[tuple[str, str]] = []
    best: tuple[tuple[int, ...], str, str, list[tuple[str, tuple[int, ...]]]] | None = None
    for gpu_class in profile.gpu_classes:
        for fabric in sorted(capacity.fabric_nodes):
            chosen = _best_multi(capacity, request, fabric, gpu_class, count, weights)
            if chosen is None:
                # Too few fit: ask every node of the fabric, to say why each does not.
                chosen = _misfits_multi(capacity, request, fabric, gpu_class, count, weights,
                                        reasons)
            if chosen is None:
                continue
            score = (
                sum(key[0] for key, _, _ in chosen), sum(key[1] for key, _, _ in chosen),
                sum(key[2] for key, _, _ in chosen), sum(key[3] for key, _, _ in chosen),
            )
            if best is None or (score, fabric) < (best[0], best[1]):
                best = (score, fabric, gpu_class, [(name, gpus) for _, gpus, name in chosen])
        if best is not None:
            break
    if best is None:
        if not capacity.fabric_nodes:
            reasons.append(("", f"no node declares a fabric; a replica across {profile.nodes} "
                                "nodes needs one"))
        return Attempt(request.profile_index, label(profile), tuple(reasons))
    _, fabric, gpu_class, members = best
    members.sort()  # rank 0 is the first by name: stable, and easy to find
    slots = []
    for rank, (name, gpus) in enumerate(members):
        node = capacity.nodes[name]
        uuids = tuple(node.gpus[i].uuid for i in gpus)
        if rank == 0:
            port, dist_port = node.next_ports(2)
            slots.append(Slot(name, gpu_class, gpus, uuids, port=port, dist_port=dist_port))
        elif profile.engine == "sglang":
            # SGLang binds a health server on every rank: give it a port of its own.
            slots.append(Slot(name, gpu_class, gpus, uuids, aux_port=node.next_ports(1)[0]))
        else:
            slots.append(Slot(name, gpu_class, gpus, uuids))
    return Placement(request.profile_index, tuple(slots), fabric=fabric)


_Fit = tuple[tuple[int, int, int, int, str], tuple[int, ...], str]  # (rank key, GPUs, node)


def _best_multi(
    capacity: Capacity, request: Request, fabric: str, gpu_class: str, count: int,
    weights: set[str],
) -> list[_Fit] | None:
    """The ``profile.nodes`` best nodes of ``fabric`` for one replica, best first; None when
    fewer fit.

    The same choice as ranking every node of the fabric, without asking 10,000 of
    them: nodes with the weights or the model are few and ranked all; every other
    node ranks by (NVLink, free GPUs left, name), the order ``by_free`` yields them
    in, so once enough NVLink-connected ones are found no later node can beat them.
    """
    wanted = request.profile.nodes

    def fits(node: NodeState) -> bool:
        return (_why_not_multi(node, fabric, gpu_class, count) is None
                and not capacity.weights_room(node, request.source))

    special = weights | set(capacity.model_nodes.get(request.model, {}))
    found: list[_Fit] = []
    for name in sorted(special):
        node = capacity.nodes.get(name)
        if node is not None and fits(node):
            key, gpus = _rank(capacity, request, node, gpu_class, count, weights)
            found.append((key, gpus, name))
    connected = 0
    for node in capacity.by_free(gpu_class, count):
        if node.name in special or not fits(node):
            continue
        key, gpus = _rank(capacity, request, node, gpu_class, count, weights)
        found.append((key, gpus, node.name))
        connected += key[0] == NVLINK
        if connected >= wanted:
            break
    if len(found) < wanted:
        return None
    return sorted(found)[:wanted]


def _misfits_multi(
    capacity: Capacity, request: Request, fabric: str, gpu_class: str, count: int,
    weights: set[str], reasons: list[tuple[str, str]],
) -> list[_Fit] | None:
    """Every node of ``fabric`` ranked or refused, the refusals added to ``reasons``."""
    profile = request.profile
    fits: list[_Fit] = []
    misfits: list[tuple[str, str]] = []
    for name in capacity.fabric_nodes[fabric]:
        node = capacity.nodes[name]
        why = (_why_not_multi(node, fabric, gpu_class, count)
               or capacity.weights_room(node, request.source))
        if why:
            misfits.append((name, why))
            continue
        key, gpus = _rank(capacity, request, node, gpu_class, count, weights)
        fits.append((key, gpus, name))
    if len(fits) >= profile.nodes:
        return sorted(fits)[: profile.nodes]
    verb = "fits" if len(fits) == 1 else "fit"
    reasons.append(("", f"fabric {fabric} ({gpu_class}): {len(fits)} node{_s(fits)} "
                        f"{verb}, needs {profile.nodes}"))
    reasons.extend(misfits)
    return None


def _place_cpu(capacity: Capacity, request: Request) -> Placement | Attempt:
    profile = request.profile
    need = int((profile.min_memory_gb or 0) * 1024**3)
    weights = capacity.with_weights(request.source)
    fits: list[tuple[tuple[int, int, int, int, str], NodeState]] = []
    for node in capacity.nodes.values():
        if _why_not_cpu(node, need) is not None or capacity.weights_room(node, request.source):
            continue
        total = node.memory_total or 0
        key = (
            1 if node.gpus else 0,  # keep GPU nodes' memory for their engines
            capacity.same_model(request.model, node.name),
            0 if node.name in weights else 1,
            total - node.memory_held - need,
            node.name,
        )
        fits.append((key, node))
    if len(fits) < profile.nodes:
        reasons = tuple((name, _why_not_cpu(node, need)
                         or capacity.weights_room(node, request.source) or "")
                        for name, node in capacity.nodes.items())
        if profile.nodes > 1:
            verb = "fits" if len(fits) == 1 else "fit"
            reasons = (("", f"{len(fits)} node{_s(fits)} {verb}, needs {profile.nodes}"),
                       *((name, why) for name, why in reasons if why))
        return Attempt(request.profile_index, label(profile), reasons)
    # Rank 0 is the first by name, as for GPU replicas across nodes.
    chosen = sorted(fits, key=lambda fit: fit[0])[: profile.nodes]
    members = sorted((node for _, node in chosen), key=lambda node: node.name)
    if len(members) == 1:
        slot = Slot(members[0].name, None, (), (), port=members[0].next_ports(1)[0])
        return Placement(request.profile_index, (slot,), memory=need)
    port, dist_port = members[0].next_ports(2)
    slots = [Slot(members[0].name, None, (), (), port=port, dist_port=dist_port)]
    slots += [Slot(node.name, None, (), ()) for node in members[1:]]
    return Placement(request.profile_index, tuple(slots), memory=need)


# -- replicas that already run ---------------------------------------------


def current(capacity: Capacity, replica: ObservedReplica) -> Placement | None:
    """Where an observed replica runs, rebuilt from its shards' specs; None if incomplete."""
    peers = replica.peers
    if not peers or replica.missing() or len(replica.members) != len(peers):
        return None
    slots = []
    head: dict[str, Any] = replica.members[0].spec or {}
    for rank in range(len(peers)):
        member = replica.members[rank]
        spec = member.spec or {}
        node = capacity.nodes[member.node]
        uuids = tuple(str(u) for u in spec.get("gpus", []))
        gpus = tuple(node.by_uuid.get(u, -1) for u in uuids)
        slots.append(Slot(
            member.node, spec.get("gpu_class"), gpus, uuids,
            port=spec.get("port") if rank == 0 else None,
            dist_port=spec.get("dist_port") if rank == 0 else None,
            aux_port=spec.get("aux_port"),
        ))
    return Placement(int(head.get("profile") or 0), tuple(slots),
                     fabric=head.get("fabric"), memory=int(head.get("memory") or 0))

def misfits(capacity: Capacity, placement: Placement, profile: Profile) -> list[str]:
    """Why a running replica's place does not suit ``profile``; empty when it does."""
    problems: list[str] = [f"{slot.node}: draining, what runs here moves elsewhere"
                           for slot in placement.slots if capacity.nodes[slot.node].spec.drain]
    for slot in placement.slots:
        wrong = selector_mismatch(capacity.nodes[slot.node].spec.labels, profile.node_selector)
        if wrong:
            problems.append(f"{slot.node}: {wrong}")
        # The engine cannot bind while another program holds its port: move it.
        problems += [f"{slot.node}: {taken}" for port in slot.ports
                     if (taken := capacity.nodes[slot.node].port_taken(port))]
    if problems:
        return problems
    if profile.cpu:
        if any(slot.gpus for slot in placement.slots) or (
                profile.nodes == 1 and len(placement.slots) != 1):
            return ["the profile runs on CPU"]
        if len(placement.slots) != profile.nodes:
            return [f"runs on {len(placement.slots)} node(s), the profile needs {profile.nodes}"]
        need = int((profile.min_memory_gb or 0) * 1024**3)
        for slot in placement.slots:
            node = capacity.nodes[slot.node]
            total = node.memory_total
            if total is not None and total - node.memory_held + placement.memory < need:
                problems.append(f"{slot.node}: has {total / 1024**3:g} GiB of memory, "
                                f"needs {need / 1024**3:g}")
        return problems
    if len(placement.slots) != profile.nodes:
        return [f"runs on {len(placement.slots)} node(s), the profile needs {profile.nodes}"]
    for slot in placement.slots:
        node = capacity.nodes[slot.node]
        if slot.gpu_class not in profile.gpu_classes:
            problems.append(f"{slot.node}: runs on {slot.gpu_class or 'CPU'}, the profile "
                            f"needs {' or '.join(profile.gpu_classes)}")
        if len(slot.gpus) != profile.gpus_per_node:
            held = len(slot.gpus)
            problems.append(f"{slot.node}: holds {held} GPU{'s' if held != 1 else ''}, the "
                            f"profile needs {profile.gpus_per_node}")
        for index, uuid in zip(slot.gpus, slot.gpu_uuids, strict=True):
            if index < 0:
                problems.append(f"{slot.node}: GPU {uuid} is gone")
                continue
            problems += [f"{slot.node}: {fault}" for fault in node.gpus[index].faults]
        if profile.nodes > 1 and placement.fabric not in node.fabrics:
            problems.append(f"{slot.node}: " + node.fabric_problems.get(
                str(placement.fabric), f"not on fabric {placement.fabric}"))
    return problems


# -- why a node does not fit: the sentences plans show --------------------


def _why_not_single(
    capacity: Capacity, node: NodeState, classes: tuple[str, ...], count: int, source: str,
) -> str:
    room = capacity.weights_room(node, source)
    if room and any(len(node.free(c)) >= count for c in classes) and not node.unavailable():
        return room  # the GPUs are there: the disk is what stands in the way
    gpus = _why_not_gpus_cached(capacity, node, classes, count)
    return f"{gpus}; {room}" if room else gpus


def _why_not_gpus_cached(
    capacity: Capacity, node: NodeState, classes: tuple[str, ...], count: int,
) -> str:
    if node.excluded is not None:
        return node.excluded  # one profile's selector: not for the cache
    key = (node.name, classes, count)
    known = capacity.reasons.get(key)
    if known is not None and known[0] == node.version:
        return known[1]
    text = _why_not_gpus(node, list(classes), count)
    capacity.reasons[key] = (node.version, text)
    return text


def _why_not_gpus(node: NodeState, classes: list[str], count: int) -> str:
    blocked = node.unavailable()
    if blocked:
        return blocked
    have = node.classes()
    if not have:
        return "no GPUs"
    wanted = [c for c in classes if have[c]]
    if not wanted:
        present = ", ".join(f"{n} {c}" for c, n in sorted(have.items()))
        return f"no {' or '.join(classes)} GPUs (has {present})"
    faults = [
        fault for g in sorted(node.gpus.values(), key=lambda g: g.index)
        if g.gpu_class in wanted for fault in g.faults
    ]
    counts = ", ".join(f"{len(node.free(c))} free {c}" for c in wanted)
    return "; ".join([*faults, f"{counts}, needs {count}"])


def _why_not_multi(node: NodeState, fabric: str, gpu_class: str, count: int) -> str | None:
    blocked = node.unavailable()
    if blocked:
        return blocked
    if fabric not in node.fabrics:
        return node.fabric_problems.get(fabric, f"not on fabric {fabric}")
    if len(node.free(gpu_class)) < count:
        return _why_not_gpus(node, [gpu_class], count)
    if node.spec.is_local:
        return "address is local; a replica across nodes needs a reachable address"
    if not node.spec.mgmt_interface:
        return "no mgmt_interface for the NCCL/Gloo bootstrap"
    return None


def _why_not_cpu(node: NodeState, need: int) -> str | None:
    blocked = node.unavailable()
    if blocked:
        return blocked
    total = node.memory_total
    if total is None:
        return "memory not reported"
    if total - node.memory_held >= need:
        return None
    held = f", {gib(node.memory_held)} GiB held by llmgw replicas" if node.memory_held else ""
    return f"has {gib(total)} GiB of memory{held}, needs {gib(need)}"


def _s(items: Sized) -> str:
    return "" if len(items) == 1 else "s"
