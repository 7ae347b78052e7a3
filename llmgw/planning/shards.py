"""From a placement to shards: engine command, spec, digest, unit files.

A shard's *spec* is everything that makes it what it is — argv, environment,
secret file paths, GPUs by UUID, ports, peers — as one JSON object. Its
*digest* is a hash of that object, so "the digest changed" means "something
that matters changed". The spec rides along in the unit as the
``X-Llmgw-Spec`` label; the agent reports it back, and the next plan can say
exactly which fields changed instead of guessing.

A purely computational module with no side effects.
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from llmgw.engines import flags, launches
from llmgw.engines.launches import EngineError, FabricUse, Launch
from llmgw.fleet import stores
from llmgw.fleet.types import NodeReport, SourceFacts
from llmgw.planning.nodes import human_bytes
from llmgw.planning.placements import Placement
from llmgw.planning.types import Shard
from llmgw.rendering import units
from llmgw.spec import sources
from llmgw.spec.models import Cluster, Node

SPEC_VERSION = 1
SPEC_LABEL = "X-Llmgw-Spec"
# Fields of the spec the digest does not cover: the profile's position in
# the list says nothing about how the engine runs, and moving it must not
# restart anything.
# Where a node fetches from (mirror, token file, margin) does not change what
# runs: moving to a mirror must not restart every replica.
UNDIGESTED = frozenset({"profile", "fetch"})

__all__ = ["EngineError", "build", "digest", "files", "spec_json", "unit_name"]


def unit_name(model: str, replica: int, rank: int) -> str:
    return f"llmgw-{model}-r{replica}-s{rank}.service"


def digest(spec: Mapping[str, Any]) -> str:
    """16 hex digits of SHA-256 over the canonical JSON of the digested fields."""
    covered = {key: value for key, value in spec.items() if key not in UNDIGESTED}
    canonical = json.dumps(covered, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def spec_json(spec: Mapping[str, Any]) -> str:
    """The spec as the unit's label: one ASCII line."""
    return json.dumps(spec, sort_keys=True, separators=(",", ":"), ensure_ascii=True)


def build(
    cluster: Cluster,
    reports: Mapping[str, NodeReport],
    model_name: str,
    replica: int,
    placement: Placement,
    *,
    render: bool = False,
) -> tuple[Shard, ...]:
    """The shards of one replica at ``placement``.

    Raises :class:`EngineError` when the profile cannot become a command line.
    With ``render``, each shard carries its unit files.
    """
    model = cluster.models[model_name]
    profile = model.profiles[placement.profile]
    source = profile.source or model.source
    if not source:
        raise EngineError(
            f"no source: set models.{model_name}.source or the profile's source"
        )
    peers = [slot.node for slot in placement.slots]
    head = cluster.nodes[peers[0]]
    head_slot = placement.slots[0]
    multi = len(placement.slots) > 1
    shards = []
    fetched = sources.parse(source).fetched
    for rank, slot in enumerate(placement.slots):
        node = cluster.nodes[slot.node]
        fabric = _fabric(cluster, reports.get(slot.node), slot.node, placement.fabric)
        # A repo or URL is fetched by the node's agent into its first weights
        # directory; the engine opens the local copy and never downloads.
        local = _placed(reports.get(slot.node), source) if fetched else None
        weights_dir = node.weights_dirs[0] if fetched and node.weights_dirs and not local else None
        launch = Launch(
            model=model_name,
            served_name=model.served_name or model_name,
            source=flags.WEIGHTS if weights_dir else (local or source),
            profile=profile,
            rank=rank,
            bind_host="127.0.0.1" if node.is_local else "0.0.0.0",
            port=head_slot.port if rank == 0 else None,
            head_address=_mgmt_address(head) if multi else None,
            dist_port=head_slot.dist_port if multi else None,
            gpu_uuids=slot.gpu_uuids,
            gpu_indices=slot.gpus,
            mgmt_interface=node.mgmt_interface,
            host_ip=_mgmt_ip(node) if multi else None,
            aux_port=slot.aux_port,
            fabric=fabric,
            download_dir=node.weights_dirs[0] if node.weights_dirs else None,
            adapters=tuple(model.adapters),
        )
        command = launches.command(launch)
        spec: dict[str, Any] = {
            "v": SPEC_VERSION,
            "model": model_name,
            "replica": replica,
            "rank": rank,
            "nodes": peers,
            "engine": profile.engine,
            "source": source,
            "served_name": launch.served_name,
            "argv": list(command.argv),
            "env": dict(command.env),
            "user_env": dict(sorted(profile.env.items())),
            "secret_env": dict(sorted(profile.secret_env.items())),
            "gpu_class": slot.gpu_class,
            "gpus": list(slot.gpu_uuids),
            "port": launch.port,
            "dist_port": head_slot.dist_port if multi and rank == 0 else None,
            **({"aux_port": slot.aux_port} if slot.aux_port is not None else {}),
            # What the node installs; in the digest, so an upgrade restarts the engine.
            **({"engine_version": profile.engine_version} if profile.engine_version else {}),
            "fabric": placement.fabric,
            "memory": placement.memory,
            "profile": placement.profile,
        }
        if command.prelude:
            spec["prelude"] = [list(step) for step in command.prelude]
        if model.adapters:  # for the agent's weights_dirs confinement (llmgw.agent.confines)
            spec["adapters"] = [adapter.source for adapter in model.adapters]
        if weights_dir:
            settings = cluster.cluster.weights
            spec["weights"] = {"source": source, "dir": weights_dir}
            # A gated repo's token: the cluster's token_file, else the file the
            # profile already hands its engine as HF_TOKEN. A path, never a value.
            token_file = settings.token_file or profile.secret_env.get("HF_TOKEN")
            spec["fetch"] = {"endpoint": settings.endpoint, "token_file": token_file,
                             "disk_margin": settings.disk_margin}
            if settings.allowed_hosts:  # what the node may fetch from beyond public hosts
                spec["fetch"]["allowed_hosts"] = list(settings.allowed_hosts)
        shard = Shard(
            model=model_name, replica=replica, rank=rank, ranks=len(placement.slots),
            node=slot.node, unit=unit_name(model_name, replica, rank), engine=profile.engine,
            gpu_class=slot.gpu_class, gpus=slot.gpus, port=launch.port,
            digest=digest(spec), spec=spec,
        )
        shards.append(with_files(shard) if render else shard)
    return tuple(shards)


def _placed(report: NodeReport | None, source: str) -> str | None:
    """Complete weights an operator put at ``<weights dir>/org/name`` for a plain repo id.

    Only for ``org/name`` as written (no revision, no file selection): those
    are the bytes such a directory is known by. Anything more precise is
    fetched, so the revision asked for is the one served.
    """
    if report is None or "@" in source or ":" in source:
        return None
    for found in sorted(report.weights, key=lambda w: w.path):
        if found.format == "safetensors" and found.path.rstrip("/").endswith("/" + source):
            return found.path
    return None


def weights_noted(
    built: tuple[Shard, ...], reports: Mapping[str, NodeReport],
    facts: Mapping[str, SourceFacts], survey: stores.Survey | None = None,
    planned: dict[tuple[str, str, str], str] | None = None,
) -> tuple[Shard, ...]:
    """The shards, each saying whether its node has the weights or what it will fetch;
    ``planned`` (kept by the caller across replicas) says which node of a shared store
    this plan fetches each source on first."""
    return tuple(replace(s, weights=weights_note(s, reports.get(s.node), facts, survey,
                                                 planned))
                 for s in built)


def weights_note(shard: Shard, report: NodeReport | None,
                 facts: Mapping[str, SourceFacts], survey: stores.Survey | None = None,
                 planned: dict[tuple[str, str, str], str] | None = None) -> str:
    weights = shard.spec.get("weights")
    if not isinstance(weights, dict):
        return ""
    source, directory = str(weights.get("source")), str(weights.get("dir"))
    if report is not None and any(c.source == source for c in report.cached_weights):
        return f"present in {directory}"
    store = survey.of(shard.node, directory) if survey is not None else None
    where = f" (shared: {store.fs_type} {store.source} on {store.fabric})" if store else ""
    if store is not None:
        if any(c.source == source for c in store.copies):
            holders = sorted({n for c in store.copies if c.source == source for n in c.nodes})
            return f"present in {directory}{where}, as {', '.join(holders)} reported"
        if planned is not None:
            first = planned.setdefault((store.fabric, store.source, source), shard.node)
            if first != shard.node:
                return f"fetched once into {directory}{where}, by {first}"
    known = facts.get(source)
    if known is None:
        return f"will fetch {source} into {directory}{where}"
    if known.size_bytes is None:
        return f"will fetch {source} into {directory}{where} (size unknown: {known.error})"
    return f"will fetch {human_bytes(known.size_bytes)} into {directory}{where}"


def files(shard: Shard) -> units.UnitFiles:
    """The unit and env file of a shard, rendered from its spec."""
    spec = shard.spec
    return units.render(units.UnitSpec(
        name=shard.unit,
        model=shard.model,
        replica=shard.replica,
        rank=shard.rank,
        ranks=shard.ranks,
        node=shard.node,
        engine=shard.engine,
        digest=shard.digest,
        spec_json=spec_json(spec),
        argv=tuple(spec["argv"]),
        port=shard.port,
        served_name=str(spec.get("served_name") or shard.model),
        prelude=tuple(tuple(step) for step in spec.get("prelude", ())),
        env=tuple(sorted(spec["env"].items())),
        user_env=tuple(sorted(spec["user_env"].items())),
        secret_env=tuple(sorted(spec["secret_env"].items())),
    ))


def with_files(shard: Shard) -> Shard:
    return replace(shard, files=files(shard))


def _mgmt_address(node: Node) -> str:
    """Where peers reach a node: its management address, else its SSH address."""
    return node.mgmt_address or node.address


def _mgmt_ip(node: Node) -> str | None:
    """The node's management IP, if known: an engine's own address must be an IP."""
    for candidate in (node.mgmt_address, node.address):
        try:
            return str(ipaddress.ip_address(candidate or ""))
        except ValueError:
            continue
    return None


def _fabric(
    cluster: Cluster, report: NodeReport | None, node: str, fabric: str | None,
) -> FabricUse | None:
    if fabric is None:
        return None
    declared = cluster.nodes[node].fabrics.get(fabric, [])
    kind = cluster.fabrics[fabric].kind
    gid_index = cluster.fabrics[fabric].gid_index
    status = None
    if report is not None:
        status = next((f for f in report.fabrics if f.name == fabric), None)
    if status is not None:
        # Only the declared adapters the agent found ACTIVE: NCCL must not be
        # pointed at a port that is down.
        adapters = [a for a in declared if a in status.adapters]
        if gid_index is None:
            gid_index = status.gid_index
    else:
        adapters = list(declared)
    return FabricUse(fabric, kind, tuple(adapters), gid_index)
