"""Build clusters and observed fleets for plan tests from short YAML.

A case file states only what differs from a healthy fleet. Every node of
the cluster reports, by default, exactly what the cluster declares: its GPUs
(all NVLink-connected), its memory, every declared fabric advertised with its
adapters ACTIVE. ``fleet:`` overrides that per node::

    fleet:
      gpu-01:
        gpus: 8 h100-80g        # or a list: ["4 h100-80g", "4 a100-80g"]
        nvlink: pairs           # all (default) | pairs | none | unknown
        ecc: [3]                # GPU 3 has uncorrected ECC errors
        mig: [5]                # GPU 5 is in MIG mode (mig.mode.current Enabled)
        foreign: {2: python}    # GPU 2 has memory held by a process llmgw did not start
        memory: 8GiB
        fabrics_down: {ib-a: "mlx5_2: no ACTIVE port"}
        adapters_down: {ib-a: [mlx5_2, mlx5_3]}   # advertised with the others
        weights: [/models/meta-llama/Llama-3.1-8B-Instruct]
        disk_free: 80GB         # free bytes in the node's first weights_dirs entry
        fetched: [org/name]     # sources llmgw already fetched there
        mount: nfs4 filer-a:/export/models   # the filesystem of the first weights_dirs entry
        engines: [vllm 0.11.0]  # engine versions installed (absent: an agent that does not say)
        unreachable: connection refused
        absent: true            # no report at all
        agent_started_at: -60   # relative to the case's now (drift evidence)
        booted_at: -90

``running:`` lists replicas the fleet runs. Their units are rendered by the
planner's own shard builder from the cluster — as it was when they started
(``applied:`` patches the model with dotted paths) — so an unchanged replica
has exactly the digest the planner computes, and a changed one carries the
old spec in its label, as a real agent would report it::

    running:
      - model: m
        replica: 0
        on: {gpu-01: [0, 1]}        # node → GPU indices, in rank order
        profile: 0
        fabric: ib-a                # multi-node replicas
        applied: {profiles.0.args.max-model-len: 8192}
        state: ready                # or per node: states: {gpu-01: failed}
        since: -3600                # relative to the case's now
        last_used: -2700
        labels: false               # the agent reported no labels
        # drift evidence, as an agent reports it (times relative to now):
        restarts: 3
        last_exit: killed by SIGKILL
        last_exit_at: -5
        crashes: [-300, -200, -100]
        stopped_by: operator        # or llmgw
        written: false              # no agent's ledger vouches for the unit file
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from llmgw.fleet.stores import is_shared
from llmgw.fleet.types import (
    CachedWeights,
    Disk,
    FabricStatus,
    Fleet,
    Gpu,
    GpuProcess,
    HostFacts,
    InstalledEngine,
    Mount,
    NodeReport,
    SourceFacts,
    Unit,
    Weights,
)
from llmgw.planning import shards
from llmgw.planning.nodes import FIRST_PORT
from llmgw.planning.placements import Placement, Slot
from llmgw.planning.scaling import LoadSample
from llmgw.spec import gpus as gpu_table
from llmgw.spec.models import Cluster
from llmgw.spec.quantities import parse_size


def cluster_from(data: Mapping[str, Any]) -> Cluster:
    """A Cluster from the sections of a case (``cluster:`` settings optional)."""
    sections = dict(copy.deepcopy(dict(data)))
    sections.setdefault("cluster", {"name": "test"})
    return Cluster.model_validate(sections)


def loads_from(data: Mapping[str, Any] | None, now: float) -> dict[str, tuple[LoadSample, ...]]:
    """Each model's load history (``loads:``), as the daemon would hand it to the planner::

        loads:
          gemma: {from: -60, every: 10, ready: 1, waiting: [7, 7, 7, 7, 7, 7, 7]}

    One sample per value, ``every`` seconds from ``from`` (relative to now). ``ready``,
    ``in_flight`` and ``first_token`` are one value for every sample or a list like
    ``waiting``; ``null`` is an unknown figure. ``[]`` is no history (a restarted daemon).
    """
    out: dict[str, tuple[LoadSample, ...]] = {}
    for model, spec in (data or {}).items():
        lists = {k: spec.get(k) for k in ("ready", "waiting", "in_flight", "first_token")}
        length = max((len(v) for v in lists.values() if isinstance(v, list)), default=0)

        def at(key: str, i: int, lists: dict[str, Any] = lists) -> Any:
            value = lists[key]
            return value[i] if isinstance(value, list) else value

        start, step = now + float(spec.get("from", 0)), float(spec.get("every", 10))
        out[model] = tuple(
            LoadSample(start + i * step, int(at("ready", i) or 0), at("waiting", i),
                       at("in_flight", i), at("first_token", i))
            for i in range(length))
    return out


def fleet_from(
    cluster: Cluster,
    nodes: Mapping[str, Any] | None,
    running: list[Mapping[str, Any]] | None,
    now: float,
    gone: Mapping[str, Any] | None = None,
    sources: Mapping[str, Any] | None = None,
) -> Fleet:
    """The observed fleet of a case.

    ``gone`` holds ``models:`` and ``nodes:`` that were in the cluster when
    the running units started but are not any more.
    """
    if gone:
        data = cluster.model_dump(by_alias=True, exclude_none=True)
        for section in ("models", "nodes", "fabrics"):
            data[section] = {**data.get(section, {}), **dict(gone.get(section) or {})}
        cluster = Cluster.model_validate(data)
    overrides = dict(nodes or {})
    reports: dict[str, NodeReport] = {}
    for name in sorted({*cluster.nodes, *overrides}):
        extra = dict(overrides.get(name) or {})
        if extra.get("absent"):
            continue
        reports[name] = _report(cluster, name, extra, now)
    units: dict[str, list[Unit]] = {name: [] for name in reports}
    owned: dict[str, set[int]] = {name: set() for name in reports}
    ports: dict[str, set[int]] = {name: set() for name in reports}
    for entry in running or []:
        for node, unit, gpu_indices in _units(cluster, reports, entry, now, ports):
            units[node].append(unit)
            owned[node].update(gpu_indices)
    final = {}
    for name, report in reports.items():
        gpus = [
            g.model_copy(update={"processes": [
                *g.processes, GpuProcess(pid=40000 + g.index, name="python3",
                                         used_memory_mib=70000, owned_by_llmgw=True),
            ]}) if g.index in owned[name] else g
            for g in report.gpus
        ]
        final[name] = report.model_copy(update={"units": units[name], "gpus": gpus})
    facts = {text: SourceFacts(size_bytes=parse_size(str(size)))
             for text, size in (sources or {}).items()}
    return Fleet(nodes=final, sources=facts)


def _report(cluster: Cluster, name: str, extra: dict[str, Any], now: float) -> NodeReport:
    spec = cluster.nodes.get(name)
    if extra.get("unreachable"):
        # units_as_of (seconds from now): the daemon remembers what the node last reported.
        seen = extra.get("units_as_of")
        return NodeReport(node=name, reachable=False, error=str(extra["unreachable"]),
                          units_as_of=None if seen is None else now + float(seen))
    declared = extra.get("gpus")
    if declared is None and spec is not None:
        declared = [f"{g.count} {g.gpu_class}" for g in spec.gpus]
    if isinstance(declared, str):
        declared = [declared]
    gpu_list: list[Gpu] = []
    for group in declared or []:
        count, gpu_class = str(group).split()
        for _ in range(int(count)):
            gpu_list.append(_gpu(name, len(gpu_list), gpu_class))
    gpu_list = _topology(gpu_list, str(extra.get("nvlink", "all")))
    ecc = set(extra.get("ecc", []))
    mig = set(extra.get("mig", []))
    foreign = {int(k): str(v) for k, v in (extra.get("foreign") or {}).items()}
    gpu_list = [
        g.model_copy(update={
            "ecc_uncorrected": 4 if g.index in ecc else 0,
            "mig_mode": "Enabled" if g.index in mig else "Disabled",
            "processes": [GpuProcess(pid=7000 + g.index, name=foreign[g.index],
                                     used_memory_mib=2048)] if g.index in foreign else [],
        })
        for g in gpu_list
    ]
    memory = extra.get("memory")
    memory_bytes = parse_size(memory) if memory is not None else (spec.memory if spec else None)
    down = dict(extra.get("fabrics_down") or {})
    fabrics = []
    for fabric, adapters in sorted((spec.fabrics if spec else {}).items()):
        kind = cluster.fabrics[fabric].kind
        if fabric in down:
            fabrics.append(FabricStatus(name=fabric, kind=kind, adapters=[], advertised=False,
                                        reasons=[str(down[fabric])]))
        else:
            gone = set((extra.get("adapters_down") or {}).get(fabric, []))
            fabrics.append(FabricStatus(name=fabric, kind=kind,
                                        adapters=[a for a in adapters if a not in gone],
                                        advertised=True, declared_adapters=len(adapters),
                                        gid_index=cluster.fabrics[fabric].gid_index))
    weights = [
        Weights(path=str(p), format="gguf" if str(p).endswith(".gguf") else "safetensors",
                size_bytes=16 * 1024**3)
        for p in extra.get("weights", [])
    ]
    disks = []
    if ("disk_free" in extra or "mount" in extra) and spec is not None and spec.weights_dirs:
        free = parse_size(str(extra["disk_free"])) if "disk_free" in extra else None
        mount = None
        if "mount" in extra:  # "nfs4 filer-a:/export/models": the first weights_dirs entry's
            fs_type, source = str(extra["mount"]).split()
            mount = Mount(mount_point=spec.weights_dirs[0], fs_type=fs_type, source=source,
                          shared=is_shared(fs_type))
        disks = [Disk(path=spec.weights_dirs[0], free_bytes=free,
                      total_bytes=None if free is None else free * 4, mount=mount)]
    first = spec.weights_dirs[0] if spec is not None and spec.weights_dirs else "/models"
    cached = [CachedWeights(source=str(s), path=f"{first}/hub/{s}", size_bytes=1)
              for s in extra.get("fetched", [])]
    started, booted = extra.get("agent_started_at"), extra.get("booted_at")
    host = None
    if "engines" in extra:
        installed = [str(e).split(" ", 1) for e in extra["engines"] or []]
        host = HostFacts(engines_dir="/opt/llmgw/engines", installed_engines=[
            InstalledEngine(engine=engine, version=version,
                            path=f"/opt/llmgw/engines/{engine}-{version}")
            for engine, version in installed])
    if "listening" in extra:  # TCP ports in LISTEN state on the node, llmgw's engines' too
        host = (host or HostFacts()).model_copy(
            update={"listening_ports": [int(p) for p in extra["listening"] or []]})
    return NodeReport(
        node=name, hostname=name, agent_version="0.1.0", cpu_count=64,
        memory_total_bytes=memory_bytes, memory_available_bytes=memory_bytes,
        gpus=gpu_list, fabrics=fabrics, weights=weights, collected_at=now,
        disks=disks, cached_weights=cached, host=host,
        agent_started_at=None if started is None else now + float(started),
        booted_at=None if booted is None else now + float(booted),
    )


def _gpu(node: str, index: int, gpu_class: str) -> Gpu:
    known = gpu_table.BUILTIN.get(gpu_class)
    family = known.family if known else gpu_class.rsplit("-", 1)[0]
    memory_gib = known.memory_gib if known else int(gpu_class.rsplit("-", 1)[1].rstrip("g"))
    capability = ".".join(map(str, known.compute_capability)) if known else "9.0"
    return Gpu(
        index=index, uuid=f"GPU-{node}-{index:02d}", name=f"NVIDIA {family.upper()}",
        gpu_class=gpu_class, pci_bus_id=f"00000000:{0x18 + index:02X}:00.0",
        memory_total_mib=memory_gib * 1024, memory_used_mib=0,
        compute_capability=capability, ecc_uncorrected=0, utilization_pct=0,
    )


def _topology(gpu_list: list[Gpu], kind: str) -> list[Gpu]:
    indices = [g.index for g in gpu_list]
    out = []
    for gpu in gpu_list:
        if kind == "unknown":
            peers = None
        elif kind == "none":
            peers = []
        elif kind == "pairs":
            peers = [gpu.index ^ 1] if gpu.index ^ 1 in indices else []
        else:
            peers = [i for i in indices if i != gpu.index]
        out.append(gpu.model_copy(update={"nvlink_peers": peers}))
    return out


def _applied(cluster: Cluster, model: str, patch: Mapping[str, Any] | None) -> Cluster:
    if not patch:
        return cluster
    data = cluster.model_dump(by_alias=True, exclude_none=True)
    target = data["models"][model]
    for dotted, value in patch.items():
        parts = [int(p) if p.isdigit() else p for p in str(dotted).split(".")]
        place: Any = target
        for part in parts[:-1]:
            place = place[part]
        if value is None and isinstance(place, dict):
            place.pop(parts[-1], None)
        else:
            place[parts[-1]] = value
    return Cluster.model_validate(data)


def _units(
    cluster: Cluster,
    reports: Mapping[str, NodeReport],
    entry: Mapping[str, Any],
    now: float,
    ports: dict[str, set[int]],
) -> list[tuple[str, Unit, list[int]]]:
    model = str(entry["model"])
    replica = int(entry.get("replica", 0))
    profile_index = int(entry.get("profile", 0))
    applied = _applied(cluster, model, entry.get("applied"))
    profile = applied.models[model].profiles[profile_index]
    placement_nodes = dict(entry["on"])
    slots = []
    for rank, (node, gpu_indices) in enumerate(placement_nodes.items()):
        report = reports.get(node)
        by_index = {g.index: g for g in report.gpus} if report else {}
        indices = [int(i) for i in gpu_indices or []]
        uuids = tuple(by_index[i].uuid if i in by_index else f"GPU-{node}-{i:02d}"
                      for i in indices)
        gpu_class = (by_index[indices[0]].gpu_class if indices and indices[0] in by_index
                     else (profile.gpu_classes[0] if profile.gpu_classes else None))
        port = dist_port = None
        if rank == 0:
            wanted = entry.get("ports", {}).get(node)
            taken = ports.setdefault(node, set())
            free = [p for p in range(FIRST_PORT, FIRST_PORT + 100) if p not in taken]
            port = int(wanted) if wanted is not None else free[0]
            taken.add(port)
            if len(placement_nodes) > 1:
                dist_port = next(p for p in free if p != port)
                taken.add(dist_port)
        slots.append(Slot(node, gpu_class, tuple(indices), uuids, port=port,
                          dist_port=dist_port))
    memory = int((profile.min_memory_gb or 0) * 1024**3) if profile.cpu else 0
    placement = Placement(profile_index, tuple(slots), fabric=entry.get("fabric"),
                          memory=memory)
    built = shards.build(applied, reports, model, replica, placement)
    states = dict(entry.get("states") or {})
    out = []
    dropped = {int(r) for r in entry.get("drop_ranks", [])}
    for shard in built:
        if shard.rank in dropped:
            continue
        labels = {
            "X-Llmgw-Model": model, "X-Llmgw-Replica": str(replica),
            "X-Llmgw-Rank": str(shard.rank), "X-Llmgw-Digest": shard.digest,
            shards.SPEC_LABEL: shards.spec_json(shard.spec),
        }
        if shard.port is not None:
            labels["X-Llmgw-Port"] = str(shard.port)
        state = str(states.get(shard.node, entry.get("state", "ready")))
        since = entry.get("since")
        last_used = entry.get("last_used")
        unit = Unit(
            name=shard.unit, model=model, replica=replica, rank=shard.rank, digest=shard.digest,
            state=state,  # type: ignore[arg-type]
            port=shard.port, pid=None if state in ("failed", "stopped") else 5000 + shard.rank,
            since=None if since is None else now + float(since),
            last_used=None if last_used is None else now + float(last_used),
            detail=str(entry.get("detail", "")) if state == "failed" else "",
            port_holder=str(entry.get("port_holder", "")) if shard.rank == 0 else "",
            log_tail=[str(line) for line in entry.get("log_tail", [])],
            labels=labels if entry.get("labels", True) else {},
            **_evidence(entry, now),
        )
        out.append((shard.node, unit, list(shard.gpus)))
    return out


def _evidence(entry: Mapping[str, Any], now: float) -> dict[str, Any]:
    """The drift evidence fields of a ``running:`` entry, times made absolute."""
    found: dict[str, Any] = {}
    if "restarts" in entry:
        found["restarts"] = int(entry["restarts"])
    if "last_exit" in entry:
        found["last_exit"] = str(entry["last_exit"])
    if "last_exit_at" in entry:
        found["last_exit_at"] = now + float(entry["last_exit_at"])
    if "crashes" in entry:
        found["crashes"] = [now + float(t) for t in entry["crashes"]]
    if "stopped_by" in entry:
        found["stopped_by"] = str(entry["stopped_by"])
    if "written" in entry:
        found["written_by_llmgw"] = bool(entry["written"])
    return found


def apply(fleet: Fleet, plan: Any, now: float, state: str = "ready") -> Fleet:
    """The fleet after ``plan`` ran and every new unit reached ``state``.

    What a real agent would report afterwards: removed units gone, started
    units present with the labels of their rendered unit file.
    """
    units: dict[str, dict[str, Unit]] = {
        name: {u.name: u for u in report.units} for name, report in fleet.nodes.items()
    }
    for change in plan.changes:
        for gone in change.removes:
            units[gone.node].pop(gone.unit, None)
        for shard in change.shards:
            labels = {
                "X-Llmgw-Model": shard.model, "X-Llmgw-Replica": str(shard.replica),
                "X-Llmgw-Rank": str(shard.rank), "X-Llmgw-Digest": shard.digest,
                shards.SPEC_LABEL: shards.spec_json(shard.spec),
            }
            if shard.port is not None:
                labels["X-Llmgw-Port"] = str(shard.port)
            units[shard.node][shard.unit] = Unit(
                name=shard.unit, model=shard.model, replica=shard.replica, rank=shard.rank,
                digest=shard.digest, state=state,  # type: ignore[arg-type]
                port=shard.port, since=now, labels=labels,
            )
    return Fleet(nodes={
        name: report.model_copy(update={"units": sorted(units[name].values(),
                                                        key=lambda u: u.name)})
        for name, report in fleet.nodes.items()
    })
