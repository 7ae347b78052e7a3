"""``plan(cluster, fleet, now, demand) -> Plan``: what must change, and why.

The steps, in order:

1. Rebuild what runs from the units agents report (:mod:`.replicas`) and
   hold its GPUs, ports and memory. Units of removed models or nodes, and
   duplicates, are destroyed. Replicas with a shard on a node that did not
   answer are *unknown*: kept, counted, never placed a second time.
2. Scale down: replicas over ``max``, the autoscaler's (:func:`.scaling.decide`,
   from ``loads``: the least loaded, drained first), and idle ones above the
   wanted count.
3. Each remaining replica: unchanged (nothing to do), failed (restart),
   changed spec or no longer fitting (replace — create before destroy when
   capacity allows, destroy then create otherwise; never destroyed when the
   replacement fits nowhere).
4. Scale up to the wanted count: ``min`` for every model first, then what
   demand asks; profiles tried in order; what fits nowhere says why, per node.
5. One eviction, when an on-demand model has requests waiting and no room.
6. Each change gets its class of drift; what the cluster does not let llmgw
   repair, and engines in a crash loop, are held (:mod:`.drifts`).

This is a purely computational function with no side effects: no I/O, no
clock, and the same inputs give the same plan byte for byte.
"""

from __future__ import annotations

import contextlib
import gc
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from llmgw.engines import launches
from llmgw.fleet.types import Demand, Fleet, NodeReport
from llmgw.planning import (
    adoptions,
    diffs,
    drifts,
    fingerprints,
    fits,
    installs,
    placements,
    replicas,
    scaling,
    shards,
    unseen,
)
from llmgw.planning.nodes import Capacity, NodeCache
from llmgw.planning.placements import Placement, Request
from llmgw.planning.replicas import ObservedReplica
from llmgw.planning.scaling import LoadSample, Policy, Want
from llmgw.planning.types import (
    Attempt,
    CapacityRow,
    Change,
    NodeFingerprint,
    ObservedShard,
    Plan,
    Shard,
    UnknownReplica,
    Unplaceable,
)
from llmgw.spec import checks
from llmgw.spec.models import Cluster
from llmgw.spec.quantities import count

__all__ = ["Memory", "Policy", "plan"]

Key = tuple[str, int]
TROUBLED_STATES = replicas.TROUBLED_STATES


def plan(
    cluster: Cluster,
    fleet: Fleet,
    now: float,
    demand: Demand | None = None,
    *,
    revision: str | None = None,
    policy: Policy | None = None,
    loads: Mapping[str, Sequence[LoadSample]] | None = None,
    memory: Memory | None = None,
) -> Plan:
    """The changes that bring ``fleet`` to what ``cluster`` asks for, at time ``now``.

    ``revision`` names the cluster directory's git revision in the plan;
    ``demand`` is what the router has seen (default: nothing); ``loads`` each
    model's load history, oldest first, for ``scaling.target`` (none: it holds).
    ``memory`` keeps what this plan derived per node for the next one
    (:class:`llmgw.planning.planners.Planner`); the plan is the same without it.
    """
    with _collector_paused():
        planner = _Planner(cluster, fleet, now, demand or Demand(), policy or Policy(),
                           memory)
        planner.loads = loads or {}
        return drifts.settle(installs.noted(planner.run(revision), planner.reports), cluster,
                             fleet, now, planner.observed)


@contextlib.contextmanager
def _collector_paused() -> Iterator[None]:
    """Planning allocates a few objects per GPU and per unit, all alive until the plan
    is returned: each time a generation fills, the cyclic collector walks the whole
    observed fleet to find no garbage. At 10,000 nodes that was a third of a plan."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


@dataclass
class Memory:
    """What a plan derived per node from reports, for the next plan to reuse."""

    nodes: NodeCache = field(default_factory=NodeCache)
    fingerprints: fingerprints.Cache = field(default_factory=fingerprints.Cache)


@dataclass(frozen=True)
class _Hold:
    node: str
    gpus: tuple[int, ...]
    ports: tuple[int, ...]
    memory: int


class _Planner:
    def __init__(
        self, cluster: Cluster, fleet: Fleet, now: float, demand: Demand, policy: Policy,
        memory: Memory | None = None,
    ) -> None:
        self.cluster = cluster
        self.fleet = fleet
        self.reports: dict[str, NodeReport] = dict(fleet.nodes)
        self.now = now
        self.demand = demand
        self.policy = policy
        self.loads: Mapping[str, Sequence[LoadSample]] = {}
        self.memory = memory
        self.capacity = Capacity(cluster, fleet, memory.nodes if memory else None)
        self.classes = checks.known_classes(cluster)
        self.sizes = fits.Reported(fleet)
        observation = replicas.collect(cluster, fleet)
        self.observed = observation.replicas
        self.orphans = observation.orphans
        self.kept = drifts.kept_strangers(cluster, fleet)  # repair off: they stay, hold GPUs
        self.warnings: list[str] = list(observation.warnings)
        self.destroys: list[Change] = []
        self.restarts: list[Change] = []
        self.replaces: list[Change] = []
        self.creates: list[Change] = []
        self.unplaceable: list[Unplaceable] = []
        self.unknown: list[UnknownReplica] = []
        self.unknown_keys: set[Key] = set()
        self.touched: set[Key] = set()
        self.indices: dict[str, set[int]] = {name: set() for name in cluster.models}
        self.holds: dict[Key, list[_Hold]] = {}
        self.released: dict[Key, list[_Hold]] = {}
        self.transitional: list[Key] = []
        self.adopted_new: set[Key] = set()  # replacements left loading, adopted (_adopt)
        self.orphan_holds: list[_Hold] = []
        self.created: Counter[str] = Counter()
        self.wants: dict[str, Want] = {}
        self.alive: dict[str, list[ObservedReplica]] = {name: [] for name in cluster.models}
        self.unseen = unseen.nodes(cluster, self.reports)  # nodes whose units are unknown

    # -- the steps ----------------------------------------------------------

    def run(self, revision: str | None) -> Plan:
        self.warnings += drifts.blind_nodes(self.cluster, self.reports)
        self._destroy_orphans()
        self._hold_observed()
        used_before = self._gpus_in_use()
        for hold in self.orphan_holds:  # their destroys run first
            self.capacity.give_back(hold.node, hold.gpus, hold.ports, hold.memory, "")
        self._classify()
        self._scale_down()
        for key, replica in self.observed.items():
            if key not in self.touched and key not in self.unknown_keys:
                self._reconcile(replica)
        self._scale_up()
        self._evict()
        for key in self.transitional:
            self._release(key)
        return Plan(
            cluster=self.cluster.cluster.name,
            now=self.now,
            revision=revision,
            changes=tuple(self.destroys + self.restarts + self.replaces + self.creates),
            unplaceable=tuple(self.unplaceable),
            unknown=tuple(self.unknown),
            capacity=self._capacity_rows(used_before),
            nodes=self._fingerprints(),
            warnings=tuple(self.warnings),
            scaling=tuple(w.decided for _, w in sorted(self.wants.items()) if w.decided),
            quotes=replicas.quotes(self.fleet),
        )

    def _fingerprints(self) -> tuple[NodeFingerprint, ...]:
        names = sorted({*self.cluster.nodes, *self.reports})
        if self.memory is None:
            return tuple(fingerprints.node(name, self.reports.get(name)) for name in names)
        cache = self.memory.fingerprints
        cache.keep(set(names))
        return tuple(cache.node(name, self.reports.get(name)) for name in names)

    def _destroy_orphans(self) -> None:
        groups: dict[Key, list[replicas.Orphan]] = {}
        for orphan in self.orphans:
            groups.setdefault((orphan.unit.model, orphan.unit.replica), []).append(orphan)
        for (model, replica), orphans in sorted(groups.items()):
            reasons = tuple(dict.fromkeys(o.reason for o in orphans))
            removes = []
            for orphan in orphans:
                node = self.capacity.nodes.get(orphan.node)
                spec = replicas.parse_spec(orphan.unit) or {}
                gpus = tuple(sorted(node.by_uuid[u] for u in spec.get("gpus", [])
                                    if u in node.by_uuid)) if node else ()
                kept = (orphan.node, orphan.unit.name) in self.kept
                if node is not None and gpus:
                    # Held until the plan's destroys run (for ever, if kept): in use before.
                    self.capacity.take(orphan.node, gpus, (), 0, "", f"{model} r{replica}")
                    if not kept:
                        self.orphan_holds.append(_Hold(orphan.node, gpus, (), 0))
                if not kept:
                    removes.append(_observed_shard(orphan.node, orphan.unit, gpus))
            if removes:
                self.destroys.append(Change("destroy", model, replica, reasons,
                                            removes=tuple(removes)))

    def _hold_observed(self) -> None:
        unlabelled: set[str] = set()
        for key, replica in self.observed.items():
            self.indices[replica.model].add(replica.replica)
            holds = []
            for _, member in sorted(replica.members.items()):
                spec = member.spec or {}
                if member.spec is None:
                    unlabelled.add(member.node)
                node = self.capacity.nodes[member.node]
                gpus = tuple(node.by_uuid[u] for u in spec.get("gpus", []) if u in node.by_uuid)
                for index in gpus:
                    holder = node.used.get(index)
                    if holder is not None:
                        self.warnings.append(
                            f"{member.node}: GPU {index} is claimed by both {holder} and "
                            f"{replica.model} r{replica.replica}"
                        )
                ports = tuple(sorted({
                    p for p in (member.unit.port, spec.get("port"), spec.get("dist_port"),
                                spec.get("aux_port"))
                    if isinstance(p, int)
                }))
                memory = int(spec.get("memory") or 0)
                hold = _Hold(member.node, gpus, ports, memory)
                self._take_hold(replica.model, replica.replica, hold)
                holds.append(hold)
            self.holds[key] = holds
        # A unit without its spec label says nothing about its GPUs; keep the
        # ones llmgw's processes hold away from new replicas.
        for name in sorted(unlabelled):
            node = self.capacity.nodes[name]
            report = self.reports[name]
            held = tuple(sorted(
                g.index for g in report.gpus
                if g.index not in node.used and any(p.owned_by_llmgw for p in g.processes)
            ))
            if held:
                self.capacity.take(name, held, (), 0, "", "an llmgw unit without a spec label")

    def _classify(self) -> None:
        for key, replica in self.observed.items():
            reasons = [f"{node}: {self._unreachable(node)}"
                       for node in replica.unreachable_nodes()]
            for rank, node in replica.missing():
                report = self.reports.get(node)
                if report is None or not report.reachable:
                    reasons.append(f"{node}: {self._unreachable(node)} (shard {rank})")
            if reasons:
                nodes = {m.node for m in replica.members.values()} | set(replica.peers or [])
                self.unknown.append(UnknownReplica(
                    replica.model, replica.replica, tuple(sorted(nodes)),
                    tuple(dict.fromkeys(reasons)),
                ))
                self.unknown_keys.add(key)
            self.alive[replica.model].append(replica)

    def _scale_down(self) -> None:
        for name in sorted(self.cluster.models):
            model = self.cluster.models[name]
            alive = self.alive[name]
            youngest = max((t for r in alive if (t := r.since()) is not None), default=None)
            want = scaling.want(name, model, self.demand, len(alive), self.loads.get(name, ()),
                                self.now, youngest)
            self.wants[name] = want
            self.warnings += [want.warning] if want.warning else []
            known = [r for r in alive if (name, r.replica) not in self.unknown_keys]
            if len(alive) > model.scaling.max:
                self._adopt(known, len(alive) - model.scaling.max)
                alive[:] = [r for r in alive if (name, r.replica) not in self.adopted_new]
                known = [r for r in known if (name, r.replica) not in self.adopted_new]
            victims: list[tuple[ObservedReplica, str]] = []
            if len(alive) > model.scaling.max:
                extra = len(alive) - model.scaling.max
                ordered = sorted(known, key=lambda r: (not self._troubled(r), -r.replica))
                reason = f"over max: {count(len(alive), 'replica')}, max {model.scaling.max}"
                victims = [(r, reason) for r in ordered[:extra]]
            elif len(alive) > want.count and want.down:
                victims = [(r, want.reason) for r in scaling.down_victims(
                    known, len(alive) - want.count, self.cluster, self.demand)]
            elif len(alive) > want.count:
                idle = []
                for replica in known:
                    why = scaling.idle_reason(name, model, replica, self.demand, self.now)
                    if why:
                        used = scaling.last_use(name, replica, self.demand)
                        idle.append((used if used is not None else -1.0, -replica.replica,
                                     replica, why))
                idle.sort(key=lambda item: (item[0], item[1]))
                extra = len(alive) - want.count
                victims = [(r, f"{why}; min {model.scaling.min}")
                           for _, _, r, why in idle[:extra]]
            for replica, reason in victims:
                self._destroy(replica, (reason,), drain=want.down)
                alive.remove(replica)

    def _adopt(self, known: list[ObservedReplica], surplus: int) -> None:
        """Replacements a stopped daemon left loading replace their old replicas now
        (:mod:`.adoptions`), instead of being destroyed as over ``max``."""
        current = {r.replica: built for r in known if (built := adoptions.as_running(
            self.cluster, self.reports, self.capacity, r)) is not None}
        for old, new, built in adoptions.pairs(known, current, surplus):
            states = sorted({m.unit.state for m in new.members.values()})
            reasons = [*self._explain(old, built, placement=False),
                       f"r{new.replica} was started as its replacement and is "
                       f"{'/'.join(states)}: adopted, not started again"]
            key, new_key = (old.model, old.replica), (new.model, new.replica)
            self.touched.update((key, new_key))
            self.adopted_new.add(new_key)
            self.replaces.append(Change(
                "replace", old.model, old.replica, tuple(dict.fromkeys(reasons)),
                shards=tuple(shards.with_files(s) for s in built),
                removes=self._observed_shards(old), strategy="create-before-destroy",
                new_replica=new.replica,
            ))
            self.transitional.append(key)

    def _reconcile(self, replica: ObservedReplica) -> None:
        name = replica.model
        model = self.cluster.models[name]
        members = replica.members
        if any(m.spec is None for m in members.values()):
            troubles = self._troubles(replica)
            if not troubles:
                self.warnings.append(
                    f"{name} r{replica.replica}: its units carry no X-Llmgw-Spec label; kept as "
                    "they are, but their spec cannot be checked"
                )
                return
            self._replace(replica, [*troubles, "its spec is unknown (no X-Llmgw-Spec label)"],
                          in_place=None, profiles=range(len(model.profiles)))
            return
        current = placements.current(self.capacity, replica)
        recorded = replica.profile
        order = [i for i in range(len(model.profiles)) if i != recorded]
        if recorded is not None and recorded < len(model.profiles):
            order.insert(0, recorded)
        first_fit: tuple[int, tuple[Shard, ...]] | None = None
        if current is not None:
            for index in order:
                if placements.misfits(self.capacity, current, model.profiles[index]):
                    continue
                try:
                    built = shards.build(self.cluster, self.reports, name, replica.replica,
                                         replace(current, profile=index))
                except launches.EngineError:
                    continue
                if first_fit is None:
                    first_fit = (index, built)
                if all(s.digest == members[s.rank].unit.digest for s in built):
                    if len(built) > 1 and self._troubled(replica):
                        self._replace_whole(replica, self._troubles(replica),
                                            replace(current, profile=index))
                        return
                    self._restart_troubled(replica, built)
                    return
        if first_fit is not None:
            index, built = first_fit
            reasons = self._explain(replica, built, placement=True)
            self._replace(replica, reasons, in_place=built, profiles=[index])
            return
        profile = model.profiles[recorded if recorded is not None and recorded < len(
            model.profiles) else 0]
        reasons = placements.misfits(self.capacity, current, profile) if current is not None else []
        reasons += [f"shard {rank} missing on {node}" for rank, node in replica.missing()]
        reasons += self._troubles(replica) if not reasons else []
        self._replace(replica, reasons or ["its profile no longer fits where it runs"],
                      in_place=None, profiles=range(len(model.profiles)))

    def _scale_up(self) -> None:
        def size(name: str) -> tuple[int, int]:
            first = self.cluster.models[name].profiles[0]
            return (first.nodes, 0 if first.cpu else first.world_size)

        # Hardest to place first: replicas across nodes (they need whole sets
        # of nodes on one fabric), then the most GPUs, so the small ones fill
        # the gaps instead of making them.
        order = sorted(self.cluster.models, key=lambda n: (-size(n)[0], -size(n)[1], n))
        # min replicas of every model before anything demand asks for
        for name in order:
            self._create(name, min(self.wants[name].count, self.cluster.models[name].scaling.min))
        short = {u.model for u in self.unplaceable}
        for name in order:
            if name not in short:
                self._create(name, self.wants[name].count)

    def _create(self, name: str, count: int) -> None:
        want = self.wants[name]
        while len(self.alive[name]) + self._created(name) < count:
            missing = count - len(self.alive[name]) - self._created(name)
            why = unseen.withheld(
                name, self.cluster.models[name], self.cluster, self.unseen,
                len(self.alive[name]) + self._created(name), self._next_indices(name, missing),
                forced=self.policy.place_unseen)
            if why is not None:
                self.unplaceable.append(Unplaceable(
                    name, self._next_indices(name, missing), want.reason, (), note=why))
                return
            result = self._place(name, range(len(self.cluster.models[name].profiles)))
            if isinstance(result, Placement):
                index = self._next_index(name)
                built = self._build(name, index, result)
                self.creates.append(Change("create", name, index, (want.reason,), shards=built))
                self.created[name] += 1
                continue
            missing = count - len(self.alive[name]) - self._created(name)
            self.unplaceable.append(Unplaceable(
                name, self._next_indices(name, missing), want.reason, tuple(result),
            ))
            return

    def _evict(self) -> None:
        for entry in list(self.unplaceable):
            name = entry.model
            waiting = self.demand.waiting.get(name, 0)
            if self.cluster.models[name].scaling.min > 0 or not waiting or entry.note:
                continue
            candidates = []
            refused = []
            for key, victim in self.observed.items():
                if key[0] == name or key in self.touched or key in self.unknown_keys:
                    continue
                ok, why = scaling.evictable(key[0], self.cluster.models[key[0]], victim,
                                            self.demand, self.now, self.policy)
                if ok:
                    used = scaling.last_use(key[0], victim, self.demand) or 0.0
                    candidates.append((used, key, victim, why))
                else:
                    refused.append(f"{key[0]} r{key[1]}: {why}")
            for _, key, victim, why in sorted(candidates, key=lambda c: (c[0], c[1])):
                self._release(key)
                result = self._place(name, range(len(self.cluster.models[name].profiles)))
                if not isinstance(result, Placement):
                    self._retake(key)
                    refused.append(f"{key[0]} r{key[1]}: evicting it would not make room")
                    continue
                plural = "s" if waiting != 1 else ""
                self._destroy(victim, (f"evicted for {name}: {waiting} request{plural} waiting "
                                       f"and no free capacity; {why}",), release=False)
                index = entry.replicas[0]
                self.indices[name].add(index)
                built = self._build(name, index, result)
                self.creates.append(Change(
                    "create", name, index,
                    (f"{entry.wanted}; room made by evicting {key[0]} r{key[1]}",), shards=built,
                ))
                self.created[name] += 1
                self.unplaceable.remove(entry)
                if len(entry.replicas) > 1:
                    self.unplaceable.append(replace(entry, replicas=entry.replicas[1:]))
                return  # one eviction per plan
            if refused:
                position = self.unplaceable.index(entry)
                self.unplaceable[position] = replace(
                    entry, note="nothing to evict: " + "; ".join(sorted(refused)),
                )

    # -- replace -------------------------------------------------------------

    def _replace(
        self,
        replica: ObservedReplica,
        reasons: list[str],
        *,
        in_place: tuple[Shard, ...] | None,
        profiles: range | list[int],
    ) -> None:
        name = replica.model
        key = (name, replica.replica)
        self.touched.add(key)
        removes = self._observed_shards(replica)
        # Create before destroy: a new replica beside the old one, which keeps
        # serving until the new one is ready.
        result = self._place(name, profiles)
        if isinstance(result, Placement):
            index = self._next_index(name)
            built = self._build(name, index, result)
            if in_place is None:
                reasons = reasons + self._explain(replica, built, placement=False)
            self.replaces.append(Change(
                "replace", name, replica.replica, tuple(dict.fromkeys(reasons)), shards=built,
                removes=removes, strategy="create-before-destroy", new_replica=index,
            ))
            self.transitional.append(key)
            return
        if in_place is not None:
            self.replaces.append(Change(
                "replace", name, replica.replica, tuple(dict.fromkeys(reasons)),
                shards=tuple(shards.with_files(s) for s in in_place), removes=removes,
                strategy="destroy-before-create", new_replica=replica.replica,
            ))
            return
        self._release(key)
        result = self._place(name, range(len(self.cluster.models[name].profiles)))
        if isinstance(result, Placement):
            built = self._build(name, replica.replica, result)
            reasons = reasons + self._explain(replica, built, placement=False)
            self.replaces.append(Change(
                "replace", name, replica.replica, tuple(dict.fromkeys(reasons)), shards=built,
                removes=removes, strategy="destroy-before-create", new_replica=replica.replica,
            ))
            return
        self._retake(key)
        self.unplaceable.append(Unplaceable(
            name, (replica.replica,), f"a new place for r{replica.replica}: "
            + "; ".join(reasons), tuple(result),
            note=f"r{replica.replica} keeps running where it is",
        ))

    def _replace_whole(
        self, replica: ObservedReplica, reasons: list[str], placement: Placement,
    ) -> None:
        """A replica across nodes in trouble starts again whole, under a new number.

        Its ranks rendezvous once, at start: restarting the rank that died
        leaves it outside its replica, and rewriting units of the same name
        and digest restarts nothing. New unit names start every rank anew,
        together: beside the old replica when there is room, else in its
        place once it is removed.
        """
        name = replica.model
        key = (name, replica.replica)
        self.touched.add(key)
        removes = self._observed_shards(replica)
        result = self._place(name, [placement.profile])
        strategy: Literal["create-before-destroy", "destroy-before-create"]
        if isinstance(result, Placement):
            strategy = "create-before-destroy"
            self.transitional.append(key)
        else:
            self._release(key)
            result, strategy = placement, "destroy-before-create"
        index = self._next_index(name)
        self.replaces.append(Change(
            "replace", name, replica.replica, tuple(dict.fromkeys(reasons)),
            shards=self._build(name, index, result), removes=removes, strategy=strategy,
            new_replica=index,
        ))

    # -- helpers -------------------------------------------------------------

    def _place(self, name: str, profiles: range | list[int]) -> Placement | list[Attempt]:
        model = self.cluster.models[name]
        attempts: list[Attempt] = []
        for index in profiles:
            profile = model.profiles[index]
            source = profile.source or model.source
            problems = launches.problems(profile)
            if not source:
                problems.insert(0, f"no source: set models.{name}.source or the profile's "
                                   "source")
            elif refused := fits.refusal(model, profile, self.classes,
                                         self.sizes.size(source)):
                problems.append(refused)
            if problems:
                attempts.append(Attempt(index, placements.label(profile),
                                        tuple(("", p) for p in problems)))
                continue
            result = placements.place(self.capacity, Request(name, index, profile, str(source)))
            if isinstance(result, Placement):
                return result
            attempts.append(result)
        return attempts

    def _build(self, name: str, index: int, placement: Placement) -> tuple[Shard, ...]:
        built = shards.build(self.cluster, self.reports, name, index, placement, render=True)
        built = shards.weights_noted(built, self.reports, self.fleet.sources,
                                     self.capacity.survey, self.capacity.planned_fetches)
        holds = []
        for slot in placement.slots:
            ports = slot.ports
            hold = _Hold(slot.node, slot.gpus, ports, placement.memory)
            self._take_hold(name, index, hold)
            holds.append(hold)
        self.holds[(name, index)] = holds
        self.indices[name].add(index)
        return built

    def _take_hold(self, model: str, replica: int, hold: _Hold) -> None:
        self.capacity.take(hold.node, hold.gpus, hold.ports, hold.memory, model,
                           f"{model} r{replica}")

    def _release(self, key: Key) -> None:
        holds = self.holds.pop(key, [])
        for hold in holds:
            self.capacity.give_back(hold.node, hold.gpus, hold.ports, hold.memory, key[0])
        self.released[key] = holds

    def _retake(self, key: Key) -> None:
        holds = self.released.pop(key, [])
        for hold in holds:
            self._take_hold(key[0], key[1], hold)
        self.holds[key] = holds

    def _destroy(
        self, replica: ObservedReplica, reasons: tuple[str, ...], *, release: bool = True,
        drain: bool = False,
    ) -> None:
        key = (replica.model, replica.replica)
        self.touched.add(key)
        if release:
            self._release(key)
        self.destroys.append(Change("destroy", replica.model, replica.replica, reasons,
                                    removes=self._observed_shards(replica), drain=drain))

    def _restart_troubled(self, replica: ObservedReplica, built: tuple[Shard, ...]) -> None:
        troubled = [s for s in built if replica.members[s.rank].unit.state in TROUBLED_STATES]
        if not troubled:
            return
        self.touched.add((replica.model, replica.replica))
        self.restarts.append(Change(
            "restart", replica.model, replica.replica, tuple(self._troubles(replica)),
            shards=tuple(shards.with_files(s) for s in troubled),
        ))

    def _explain(
        self, replica: ObservedReplica, built: tuple[Shard, ...], *, placement: bool,
    ) -> list[str]:
        lines: list[str] = []
        for shard in built:
            member = replica.members.get(shard.rank)
            if member is None or member.spec is None:
                continue
            lines += diffs.explain(member.spec, shard.spec, placement=placement,
                                   gpu_names=self._gpu_names)
        return list(dict.fromkeys(lines))

    def _gpu_names(self, node: str, uuids: list[str]) -> str:
        state = self.capacity.nodes.get(node)
        if state is None:
            return ",".join(uuids)
        return ",".join(str(state.by_uuid.get(u, u)) for u in uuids)

    def _troubled(self, replica: ObservedReplica) -> bool:
        return bool(self._troubles(replica))

    def _troubles(self, replica: ObservedReplica) -> list[str]:
        lines = []
        for _, member in sorted(replica.members.items()):
            if member.unit.state in TROUBLED_STATES:
                lines.append(replicas.failure(member))
        lines += [f"shard {rank} missing on {node}" for rank, node in replica.missing()]
        return lines + replica.restarted_alone()

    def _observed_shards(self, replica: ObservedReplica) -> tuple[ObservedShard, ...]:
        out = []
        for _, member in sorted(replica.members.items()):
            if not member.reachable:
                continue
            node = self.capacity.nodes[member.node]
            gpus = tuple(sorted(node.by_uuid[u] for u in (member.spec or {}).get("gpus", [])
                                if u in node.by_uuid))
            out.append(_observed_shard(member.node, member.unit, gpus))
        return tuple(out)

    def _unreachable(self, node: str) -> str:
        report = self.reports.get(node)
        if report is None:
            return "no report from its agent"
        return f"unreachable: {report.error or 'no answer'}"

    def _created(self, name: str) -> int:
        return self.created[name]

    def _next_index(self, name: str) -> int:
        index = self._next_indices(name, 1)[0]
        self.indices[name].add(index)
        return index

    def _next_indices(self, name: str, count: int) -> tuple[int, ...]:
        found: list[int] = []
        index = 0
        while len(found) < count:
            if index not in self.indices[name]:
                found.append(index)
            index += 1
        return tuple(found)

    def _gpus_in_use(self) -> Counter[str]:
        used: Counter[str] = Counter()
        for node in self.capacity.nodes.values():
            if node.reachable:
                for index in node.used:
                    if index in node.gpus:
                        used[node.gpus[index].gpu_class] += 1
        return used

    def _capacity_rows(self, used_before: Counter[str]) -> tuple[CapacityRow, ...]:
        total: Counter[str] = Counter()
        faulty: Counter[str] = Counter()
        for node in self.capacity.nodes.values():
            if not node.reachable:
                continue
            for gpu in node.gpus.values():
                total[gpu.gpu_class] += 1
                if gpu.faults and gpu.index not in node.used:
                    faulty[gpu.gpu_class] += 1
        used_after = self._gpus_in_use()
        return tuple(
            CapacityRow(name, total[name], faulty[name], used_before[name], used_after[name])
            for name in sorted(total)
        )


def _observed_shard(node: str, unit: Any, gpus: tuple[int, ...]) -> ObservedShard:
    return ObservedShard(node=node, unit=unit.name, rank=unit.rank, digest=unit.digest,
                         state=unit.state, port=unit.port, gpus=gpus, detail=unit.detail)
