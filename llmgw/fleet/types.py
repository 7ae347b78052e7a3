"""Observed state: what agents report about their nodes.

These types cross the wire (gRPC → daemon) and land in fleet snapshots
(`llmgw inventory --json`, `llmgw plan --observed`), so they are pydantic at
this edge. A value the node did not report is ``None``, never zero: "no
utilization reported" and "0 % utilized" are different facts.
"""

from __future__ import annotations

import json
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

FORMAT_VERSION = 1
# A unit's last_exit when its engine ended while no agent watched (the agent restarted).
UNSEEN_EXIT = "ended while no agent watched (status unknown)"

UnitState = Literal[
    "fetching", "starting", "loading", "ready", "failed", "stopped", "unknown",
]


class Observed(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class GpuProcess(Observed):
    pid: int
    name: str = ""
    used_memory_mib: int | None = None
    owned_by_llmgw: bool = False


class Gpu(Observed):
    index: int
    uuid: str
    name: str
    gpu_class: str
    pci_bus_id: str | None = None
    memory_total_mib: int | None = None
    memory_used_mib: int | None = None
    compute_capability: str | None = None
    ecc_uncorrected: int | None = None
    utilization_pct: int | None = None
    nvlink_peers: list[int] | None = Field(
        None, description="Indices of GPUs reached over NVLink; None when the topology is unknown."
    )
    processes: list[GpuProcess] = Field(default_factory=list)
    pci_device_id: str | None = Field(
        None, description="PCI device id (vendor 10de), 4 hex digits: `2330` is an H100 SXM5."
    )
    mig_mode: str | None = Field(
        None, description="`Enabled` or `Disabled` (mig.mode.current); None: the GPU has no MIG."
    )
    persistence_mode: str | None = Field(
        None, description="`Enabled` or `Disabled` (persistence_mode); None: unknown.")

    @property
    def faults(self) -> list[str]:
        """Why this GPU must not get new work; empty when it is healthy."""
        reasons = []
        if self.mig_mode == "Enabled":
            reasons.append(f"GPU {self.index} is in MIG mode (split into instances); "
                           "engines here take whole GPUs")
        if self.ecc_uncorrected:
            reasons.append(f"GPU {self.index} has uncorrected ECC errors")
        foreign = [p for p in self.processes if not p.owned_by_llmgw]
        if foreign:
            who = ", ".join(f"pid {p.pid}" + (f" ({p.name})" if p.name else "") for p in foreign)
            reasons.append(f"GPU {self.index} has memory held by {who}, not started by llmgw")
        return reasons


def _hex(text: str | None) -> int | None:
    try:
        return None if text is None else int(text, 16)
    except ValueError:
        return None


class Port(Observed):
    number: int
    state: str | None = None  # ACTIVE, INIT, DOWN, ARMED
    phys_state: str | None = None  # LinkUp, Polling, Disabled
    rate: str | None = None  # as sysfs writes it: "200 Gb/sec (4X HDR)"
    rate_gbps: float | None = None
    link_layer: str | None = None  # InfiniBand | Ethernet
    gids: list[str] = Field(
        default_factory=list,
        description="GIDs by index as sysfs lists them (`gids/<i>`), up to the last populated "
        "one; an unpopulated index is all zeros. RoCE's gid_index points into this list.",
    )
    gid_types: list[str] = Field(
        default_factory=list,
        description="Per GID index, its type from `gid_attrs/types/<i>` (`RoCE v2`, "
        "`IB/RoCE v1`), or empty where sysfs has none (InfiniBand).",
    )
    lid: str | None = Field(None, description="The port's own LID (`lid`), as sysfs writes it.")
    sm_lid: str | None = Field(
        None, description="LID of the port's subnet manager (`sm_lid`): `0x0` on RoCE and on an "
        "InfiniBand port no SM has swept; None: not readable.")

    @property
    def active(self) -> bool:
        return self.state == "ACTIVE"

    @property
    def gid_prefix(self) -> str | None:
        """The subnet prefix: the first 64 bits of GID 0 (``fe80:0000:0000:0000``)."""
        if not self.gids or self.gids[0] == "0000:0000:0000:0000:0000:0000:0000:0000":
            return None
        return ":".join(self.gids[0].split(":")[:4])

    @property
    def subnet(self) -> str | None:
        """Which subnet manager (InfiniBand) or IP network (RoCE) this port answers to;
        ports with equal ``subnet`` can reach each other, others cannot. None: not known
        (the port is not ACTIVE, no SM has swept it, or a RoCE port has no IPv4 GID).

        InfiniBand: the SM's LID and the GID prefix, which the SM assigns per subnet.
        RoCE: the IPv4 network of the first RoCE v2 IPv4 GID, taken as a /24: sysfs holds
        the address, not its netmask."""
        if not self.active:
            return None
        if self.link_layer == "Ethernet":
            for index, gid in enumerate(self.gids):
                kind = self.gid_types[index] if index < len(self.gid_types) else ""
                groups = gid.split(":")
                if (kind == "RoCE v2" and gid.startswith("0000:0000:0000:0000:0000:ffff:")
                        and len(groups) == 8 and _hex(groups[6]) is not None):
                    high = _hex(groups[6]) or 0
                    return f"RoCE {high >> 8}.{high & 0xff}.{(_hex(groups[7]) or 0) >> 8}.0/24"
            return None
        if not _hex(self.sm_lid) or self.gid_prefix is None:
            return None  # 0x0: no subnet manager has swept this port
        return f"SM LID {self.sm_lid}, GID prefix {self.gid_prefix}"


class Adapter(Observed):
    name: str  # mlx5_0
    ports: list[Port] = Field(default_factory=list)

    @property
    def link_layer(self) -> str | None:
        layers = {p.link_layer for p in self.ports if p.link_layer}
        return layers.pop() if len(layers) == 1 else None

    @property
    def active(self) -> bool:
        return any(p.active for p in self.ports)

    @property
    def subnets(self) -> list[str]:
        """The distinct :attr:`Port.subnet` of its ACTIVE ports, in port order."""
        return list(dict.fromkeys(s for p in self.ports if (s := p.subnet)))


class PciCard(Observed):
    """An NVIDIA display or 3D controller on the PCI bus (``/sys/bus/pci/devices``)."""

    address: str = Field(description="The PCI address: `0000:41:00.0`.")
    device_id: str | None = Field(None, description="PCI device id, 4 hex digits: `2330`.")
    driver: str | None = Field(
        None, description="The bound driver (the `driver` link's target): `nvidia`; None: "
        "no driver is bound.")


class FabricStatus(Observed):
    """A fabric the cluster declares for this node, checked against discovery."""

    name: str
    kind: Literal["infiniband", "roce"]
    adapters: list[str] = Field(description="Declared adapters that are present and ACTIVE.")
    advertised: bool
    reasons: list[str] = Field(default_factory=list, description="Why not advertised, or warnings.")
    gid_index: int | None = None
    declared_adapters: int = Field(
        0, description="How many adapters the cluster declares for this node on the fabric.")

    @property
    def active(self) -> str:
        """``2 of 4 adapters ACTIVE``: how much of the fabric this node can use."""
        declared = max(self.declared_adapters, len(self.adapters))
        return f"{len(self.adapters)} of {declared} adapter{'' if declared == 1 else 's'} ACTIVE"


class Mount(Observed):
    """The filesystem a weights directory lies on, from ``/proc/self/mountinfo``."""

    mount_point: str
    fs_type: str = Field(description="As the kernel names it: `nfs4`, `lustre`, `ext4`.")
    source: str = Field(description="The mount's source: `filer-a:/export/models` (NFS), "
                        "`10.0.0.1@o2ib:/lfs01` (Lustre), `/dev/nvme0n1p1` (a local disk).")
    root: str = Field("/", description="Where the weights directory is inside that "
                      "filesystem: the mount's root joined with the path below its mount point.")
    shared: bool = Field(False, description="A network or cluster filesystem, by its type: "
                         "what one node writes there, the others that mount it read.")

    @property
    def store(self) -> tuple[str, str, str]:
        """What two nodes must both see to share one copy: the filesystem's family
        (``nfs4`` is ``nfs``), its source and the directory inside it."""
        family = "nfs" if self.fs_type in ("nfs", "nfs4") else self.fs_type
        return family, self.source.rstrip("/") or "/", self.root.rstrip("/") or "/"

    @property
    def label(self) -> str:
        """``filer-a:/export/models`` and the directory inside it, when not its root."""
        _, source, root = self.store
        return source if root == "/" else f"{source} {root}"


class Disk(Observed):
    path: str
    free_bytes: int | None = None
    total_bytes: int | None = None
    mount: Mount | None = Field(
        None, description="The filesystem it lies on; None: not known (an older agent, or "
        "mountinfo unreadable), planned as local.")


class Weights(Observed):
    path: str
    format: Literal["safetensors", "gguf"]
    size_bytes: int


class Fetch(Observed):
    """A download the agent runs before units can start (weights; engines later)."""

    kind: Literal["weights", "engine"] = "weights"
    target: str = Field(description="What is fetched, as the cluster wrote it.")
    # skipped: an engine this node has no use for (vLLM or SGLang without a GPU); no fault.
    state: Literal["queued", "running", "done", "failed", "skipped"] = "queued"
    bytes_done: int = 0
    bytes_total: int | None = Field(None, description="None while the source has not said.")
    rate_bps: float | None = Field(None, description="Bytes per second over this attempt.")
    error: str = Field("", description="Why it failed, for the operator.")
    units: list[str] = Field(default_factory=list, description="Units waiting for it.")
    started_at: float | None = None
    updated_at: float | None = None


class CachedWeights(Observed):
    """Weights llmgw fetched into one of the node's weights directories."""

    source: str
    path: str = Field(description="What engines get: a snapshot directory or a file.")
    size_bytes: int
    commit: str | None = None
    fetched_by: str = ""
    fetched_at: float | None = None
    used_by: list[str] = Field(default_factory=list, description="Units whose spec names it.")


class EngineLoad(Observed):
    """An engine's own figures, read from its metrics endpoint for one report.

    Each figure is None when the engine did not say (an older engine, a metric its
    version lacks, a first scrape with no rate yet), never zero.
    """

    requests_running: int | None = Field(None, description="Requests the engine is serving.")
    requests_waiting: int | None = Field(
        None, description="Requests queued in the engine, not yet started.")
    kv_cache_usage: float | None = Field(None, description="KV-cache in use, 0-1.")
    generation_tokens_per_second: float | None = Field(
        None, description="Generated tokens per second: the token counter's rate between two "
        "scrapes, else the engine's own throughput gauge.")
    generation_tokens_total: float | None = Field(
        None, description="The engine's generated-token counter, as read.")
    scraped_at: float | None = Field(None, description="Unix time of the scrape.")
    error: str = Field("", description="Why the endpoint gave no figures; empty when it did.")


class Unit(Observed):
    """One llmgw unit (one shard of one replica) as the node runs it."""

    name: str
    model: str
    replica: int
    rank: int = 0
    digest: str
    state: UnitState
    port: int | None = None
    pid: int | None = None
    since: float | None = Field(None, description="Unix time the unit entered its state.")
    last_used: float | None = Field(None, description="Unix time of the last routed request.")
    log_tail: list[str] = Field(default_factory=list)
    detail: str = ""
    labels: dict[str, str] = Field(
        default_factory=dict,
        description="Every `X-Llmgw-*` key of the unit file's [Unit] section, as written "
        "(`X-Llmgw-Spec` holds the shard spec the digest covers, so a plan can say which "
        "fields changed).",
    )
    # Evidence for drift classes (llmgw.planning.drifts); absent from older agents.
    restarts: int | None = Field(
        None, description="Automatic restarts after a failure since llmgw last started it.")
    last_exit: str = Field(
        "", description="How the main process last ended (`exited with status 3`, `killed by "
        "SIGKILL`); empty when it has not ended since the agent started or the node booted.")
    last_exit_at: float | None = Field(None, description="Unix time of that end.")
    crashes: list[float] = Field(
        default_factory=list,
        description="Unix times of the latest abnormal ends (at most 32), oldest first: what a "
        "crash-loop rule counts.")
    stopped_by: Literal["", "llmgw", "operator"] = Field(
        "", description="Who stopped a stopped unit: llmgw (asked by the daemon) or someone else "
        "(`systemctl stop`, a signal by hand); empty when not stopped or not known.")
    written_by_llmgw: bool | None = Field(
        None, description="Whether the unit file is the one an llmgw agent wrote (its ledger "
        "holds the file's digest); None when the agent does not say.")
    port_holder: str = Field(
        "", description="Who listens on the unit's port when it is not the unit's own engine "
        "(`pid 7539 (python3 -m http.server 18000)`, or `a process of uid 1001`); empty when "
        "the port is free or the engine's.")
    load: EngineLoad | None = Field(
        None, description="The engine's own load, scraped by the agent for this report; None "
        "when not scraped (not ready, no HTTP port, or an older agent).")

    @property
    def engine(self) -> str | None:
        """The engine the unit runs (`vllm`, `sglang`, `llama.cpp`), from the shard spec
        in its `X-Llmgw-Spec` label; None when the label is missing or unreadable."""
        try:
            spec = json.loads(self.labels.get("X-Llmgw-Spec", "") or "{}")
        except ValueError:
            return None
        engine = spec.get("engine") if isinstance(spec, dict) else None
        return engine if isinstance(engine, str) else None


class EngineBinary(Observed):
    name: str  # llama-server, vllm, sglang
    path: str = ""
    executable: bool = False


class InstalledEngine(Observed):
    """An engine version llmgw installed on the node (complete installs only)."""

    engine: str  # vllm | sglang | llama.cpp
    version: str
    path: str = Field(description="Its directory: <engines_dir>/<engine>-<version>.")
    program: str = Field("", description="The binary run with --version before it was moved in.")


class EngineLimits(Observed):
    """The limits an engine's process has, as the kernel applies them (soft values)."""

    memlock_bytes: int | None = Field(
        None, description="RLIMIT_MEMLOCK; None when unknown or unlimited.")
    memlock_unlimited: bool = False
    nofile: int | None = Field(None, description="RLIMIT_NOFILE; None when unknown.")
    source: str = Field("", description="Whose limits these are: a unit and its pid, a probe "
                        "unit, or the agent's own (supervise: engines inherit them).")


class HostFacts(Observed):
    """What ``llmgw doctor`` checks beyond placement: limits, engines, ports, Python."""

    python_version: str | None = None
    memlock_bytes: int | None = Field(
        None, description="RLIMIT_MEMLOCK (soft) of the agent; None when unknown or unlimited.")
    memlock_unlimited: bool = False
    engines: list[EngineBinary] = Field(
        default_factory=list, description="Engine programs found on the agent's PATH.")
    listening_ports: list[int] | None = Field(
        None, description="TCP ports in LISTEN state on the node; None when unknown.")
    agent_uid: int | None = Field(None, description="The agent's real uid; None when unknown.")
    sudo: bool | None = Field(
        None, description="Whether the agent's user may run `sudo -n`; None when it is root "
        "or that is unknown.")
    engines_dir: str | None = Field(
        None, description="Where the agent installs engine versions; None: an older agent.")
    installed_engines: list[InstalledEngine] = Field(
        default_factory=list, description="Engine versions installed under engines_dir.")
    engine_limits: EngineLimits | None = Field(
        None, description="The limits engines get on this node; None: an older agent.")
    driver_version: str | None = Field(
        None, description="The loaded NVIDIA kernel module's version (`535.129.03`, from "
        "/sys/module/nvidia/version); None: no driver loaded, or an older agent.")
    c_compiler: str | None = Field(
        None, description="The C compiler on the engines' PATH (`gcc`, else `cc`), which "
        "Triton runs when vLLM or SGLang first loads a model; empty: none; None: an older "
        "agent.")
    engines_free_bytes: int | None = Field(
        None, description="Free bytes on the filesystem of engines_dir; None: unknown.")


class NodeReport(Observed):
    node: str
    reachable: bool = True
    error: str | None = Field(None, description="Why the node could not be reached.")
    hostname: str | None = None
    agent_version: str | None = None
    cpu_model: str | None = None
    cpu_count: int | None = None
    cpu_flags: list[str] = Field(default_factory=list)
    memory_total_bytes: int | None = None
    memory_available_bytes: int | None = None
    gpus: list[Gpu] = Field(default_factory=list)
    adapters: list[Adapter] = Field(default_factory=list)
    fabrics: list[FabricStatus] = Field(default_factory=list)
    disks: list[Disk] = Field(default_factory=list)
    weights: list[Weights] = Field(default_factory=list)
    units: list[Unit] = Field(default_factory=list)
    collected_at: float | None = None
    warnings: list[str] = Field(default_factory=list)
    pci_gpus: list[PciCard] = Field(
        default_factory=list, description="NVIDIA cards on the PCI bus, answering or not; "
        "empty: none, or not scanned (an older agent, or no /sys/bus/pci).")
    fetches: list[Fetch] = Field(default_factory=list)
    cached_weights: list[CachedWeights] = Field(default_factory=list)
    host: HostFacts | None = None
    agent_started_at: float | None = Field(None, description="Unix time the agent started.")
    boot_id: str | None = Field(None, description="The kernel's boot id: a new one is a reboot.")
    booted_at: float | None = Field(None, description="Unix time the node booted.")
    units_as_of: float | None = Field(
        None, description="For an unreachable node: unix time of the report its units were "
        "last seen in (the daemon remembers them); None: its units are unknown, as to a "
        "one-shot `llmgw apply`. Agents never set it.")

    @property
    def units_known(self) -> bool:
        """Whether ``units`` says what runs here: a reachable node's, or remembered ones
        (a snapshot from before ``units_as_of`` existed holds the units it remembered)."""
        return self.reachable or self.units_as_of is not None or bool(self.units)

    @property
    def faults(self) -> list[str]:
        """Faults of the node itself (not of one GPU), each with what to check; empty: none.

        A card on the PCI bus that no driver answers for: no ``driver`` link, or bound
        but missing from what NVML or nvidia-smi listed."""
        if not self.pci_gpus:
            return []
        listed = {_pci(g.pci_bus_id) for g in self.gpus if g.pci_bus_id}
        silent = [c for c in self.pci_gpus
                  if c.driver is None or (listed and _pci(c.address) not in listed)]
        if not silent and len(self.gpus) >= len(self.pci_gpus):
            return []
        held = len(self.pci_gpus)
        answer = min(len(self.gpus), held)
        why = "; ".join(f"{c.address} " + ("has no driver bound" if c.driver is None else
                                           f"is bound to {c.driver} but not listed")
                        for c in silent) or "the driver lists fewer GPUs than the bus holds"
        return [f"{held} NVIDIA card{'' if held == 1 else 's'} on the PCI bus, {answer} "
                f"answer: {why}; check `dmesg | grep -i nvidia`, the driver version and "
                "`nvidia-smi -q`"]

    @property
    def is_cpu_only(self) -> bool:
        return not self.gpus

    @property
    def advertised_fabrics(self) -> dict[str, FabricStatus]:
        return {f.name: f for f in self.fabrics if f.advertised}


def _pci(address: str) -> str:
    """A PCI address as ``dddd:bb:dd.f`` in lower case: nvidia-smi writes an 8-digit
    domain (``00000000:41:00.0``), sysfs a 4-digit one."""
    domain, _, rest = address.strip().lower().partition(":")
    return f"{domain[-4:]:0>4}:{rest}"


class SourceFacts(Observed):
    """What the hub (or an URL's server) said about a fetched source when asked."""

    size_bytes: int | None = Field(None, description="Bytes of the selected files.")
    commit: str | None = None
    files: int | None = None
    error: str | None = Field(None, description="Why it could not be asked.")


class Fleet(Observed):
    """Every node's report at one moment: the input `plan()` reads."""

    format_version: int = FORMAT_VERSION
    nodes: dict[str, NodeReport] = Field(default_factory=dict)
    sources: dict[str, SourceFacts] = Field(
        default_factory=dict,
        description="Fetched sources (hub repos, URLs) → their size as the source said.",
    )
    revision: str | None = Field(None, description="Git revision the daemon last applied.")

    def units(self) -> list[tuple[str, Unit]]:
        return [(name, u) for name, report in sorted(self.nodes.items()) for u in report.units]


class Demand(Observed):
    """What the router has seen, for scaling decisions: pure data, no clocks."""

    waiting: dict[str, int] = Field(
        default_factory=dict, description="Model → requests waiting for a replica."
    )
    last_used: dict[str, float] = Field(
        default_factory=dict, description="Model → unix time of its last request."
    )
    wanted: dict[str, int] = Field(
        default_factory=dict, description="Model → replicas the load asks for (≤ max)."
    )
    watched_since: float | None = Field(
        None, description="Unix time since which the router has seen every request; None "
        "when no router watched (a plan made outside the daemon).",
    )
    queued: dict[str, int] = Field(
        default_factory=dict,
        description="Model → requests in the routers' admission queues: a replica is ready "
        "but every one is at its concurrency cap. Summed over routers.",
    )
    in_flight: dict[str, int] = Field(
        default_factory=dict,
        description="Model → requests the routers have sent to its replicas and not yet "
        "finished. Summed over routers.",
    )
    replica_in_flight: dict[str, int] = Field(
        default_factory=dict,
        description="Replica endpoint (its base URL) → requests in flight on it. Summed over "
        "routers, so that each router balances on every router's load.",
    )
    first_token_seconds: dict[str, float] = Field(
        default_factory=dict,
        description="Model → median time to first token of its recent requests, in seconds. "
        "The largest over routers; absent when no recent request had one.",
    )
