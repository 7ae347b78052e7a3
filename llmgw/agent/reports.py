"""The whole node, as one :class:`llmgw.fleet.NodeReport`.

Runs each discovery source (commands through a runner, files under the
configured roots), checks the declared fabrics against the adapters found,
and adds the units with their states. Nothing here fails the report: a
source that cannot be read leaves its facts absent and says why in
``warnings``.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from llmgw import __version__
from llmgw.agent import commands, processes, units
from llmgw.agent.settings import Settings
from llmgw.discovery import (
    adapters,
    disks,
    drivers,
    fabrics,
    gpus,
    hosts,
    limits,
    mounts,
    nvml,
    pcis,
    topologies,
    weights,
)
from llmgw.discovery.fabrics import Declaration
from llmgw.fleet.types import (
    Adapter,
    Disk,
    EngineBinary,
    EngineLimits,
    HostFacts,
    NodeReport,
    PciCard,
    Unit,
)

# nvidia-smi says this, with a non-zero status, on a machine without NVIDIA GPUs.
_NO_DEVICES = "No devices were found"
# Engine programs looked up on the agent's PATH (the engines' units run with it).
ENGINE_PROGRAMS = ("llama-server", "vllm", "sglang")
COMPILERS = ("gcc", "clang")  # what Triton looks for, in its order
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


@dataclass
class GpuFacts:
    records: list[gpus.GpuRecord] = field(default_factory=list)
    processes: list[gpus.ProcessRecord] = field(default_factory=list)
    source: str = "none"
    warnings: list[str] = field(default_factory=list)


@dataclass
class Collector:
    """Collects reports for one agent's settings; keeps caches between reports."""

    settings: Settings
    run: commands.Runner | None = None
    _weights_cache: weights.Cache = field(default_factory=dict)
    # When this agent started: a later time in a report than before says it restarted.
    started_at: float = field(default_factory=time.time)
    _sudo: bool | None = None

    def __post_init__(self) -> None:
        if self.run is None:
            self.run = commands.runner(self.settings.hardware.command_timeout)

    async def sudo(self) -> bool:
        """Whether this agent's user may ``sudo -n`` (asked once: sudo logs every use)."""
        if self._sudo is None:
            program = shutil.which(self.settings.hardware.sudo)
            assert self.run is not None
            self._sudo = program is not None and (await self.run([program, "-n", "true"])).ok
        return self._sudo

    async def gpus(self) -> GpuFacts:
        """GPU records: NVML when enabled and usable, else nvidia-smi, else none (CPU node)."""
        facts = GpuFacts()
        if self.settings.hardware.nvml == "auto":
            module, why = nvml.load()
            if module is not None:
                snapshot, why = await asyncio.to_thread(nvml.read, module, processes.name)
                if snapshot is not None:
                    facts.records, facts.processes = snapshot.gpus, snapshot.processes
                    facts.source, facts.warnings = "nvml", snapshot.warnings
                    return facts
        smi = self.settings.nvidia_smi_path
        if smi is None:
            return facts  # no nvidia-smi and no NVML: a CPU node, which is not an error
        assert self.run is not None
        query = await self.run(gpus.query_command(smi))
        if not query.ok:
            if _NO_DEVICES not in query.stdout + query.stderr:
                facts.warnings.append(f"nvidia-smi: {query.why()}")
            return facts
        parsed = gpus.parse_query(query.stdout)
        facts.records, facts.source = parsed.gpus, "nvidia-smi"
        facts.warnings.extend(parsed.warnings)
        identity = await self.run(gpus.identity_command(smi))
        if identity.ok:
            facts.records = gpus.with_identity(facts.records, gpus.parse_identity(identity.stdout))
        else:
            facts.warnings.append(f"nvidia-smi: MIG mode, persistence mode and PCI device ids "
                                  f"unknown ({identity.why()})")
        if len(facts.records) > 1:  # without NVML, the matrix is the only NVLink source
            # A failed query leaves the peers unknown (shown as such), not a warning:
            # the planner treats unknown as "no NVLink preference", as before.
            topology = await self.run(topologies.command(smi))
            peers = topologies.parse(topology.stdout) if topology.ok else None
            if topology.ok and peers is None:
                facts.warnings.append("nvidia-smi topo -m: not a topology matrix this agent "
                                      "can read; NVLink peers unknown")
            facts.records = gpus.with_peers(facts.records, peers)
        apps = await self.run(gpus.processes_command(smi))
        if apps.ok:
            facts.processes = gpus.parse_processes(apps.stdout)
        else:
            facts.warnings.append(
                f"nvidia-smi: GPU processes unknown, so memory held by others is not seen "
                f"({apps.why()})"
            )
        return facts

    def _files(self, declaration: Declaration) -> tuple[
        hosts.Host, list[Adapter], list[Disk], weights.Found, list[str], list[PciCard]
    ]:
        hw = self.settings.hardware
        host = hosts.read(hw.proc_root, hw.sysfs_root)
        found_adapters = adapters.read(hw.sysfs_root)
        try:
            mountinfo: str | None = mounts.path(hw.proc_root).read_text()
        except OSError:
            mountinfo = None  # every mount unknown: planned as local
        found_disks, disk_warnings = disks.read(declaration.weights_dirs, mountinfo)
        found_weights = weights.find(declaration.weights_dirs, self._weights_cache)
        cards = pcis.read(hw.sysfs_root)
        return host, found_adapters, found_disks, found_weights, disk_warnings, cards

    def own_limits(self) -> EngineLimits | None:
        """The agent's own limits (under ``proc_root``): what an engine it starts inherits."""
        return units.process_limits(Path(self.settings.hardware.proc_root), "self",
                                    "the agent's own; engines inherit them")

    def host_facts(self) -> HostFacts:
        """Limits (under ``proc_root``), engines on PATH, listening ports (this machine's)."""
        def read(path: Path) -> str | None:
            try:
                return path.read_text()
            except OSError:
                return None

        status_text = read(Path(self.settings.hardware.proc_root) / "self" / "status")
        limits_text = read(Path(self.settings.hardware.proc_root) / "self" / "limits")
        memlock, unlimited = limits.parse_memlock(limits_text or "")
        tables = [read(Path("/proc/net") / name) for name in ("tcp", "tcp6")]
        ports = (sorted(set().union(*(limits.parse_listening(t) for t in tables if t)))
                 if any(t is not None for t in tables) else None)
        engines = []
        for name in ENGINE_PROGRAMS:
            found = shutil.which(name)
            if found:
                engines.append(EngineBinary(name=name, path=found,
                                            executable=os.access(found, os.X_OK)))
        driver = drivers.parse(read(Path(self.settings.hardware.sysfs_root).joinpath(
            *drivers.PATH)))
        return HostFacts(python_version=".".join(map(str, sys.version_info[:3])),
                         memlock_bytes=memlock, memlock_unlimited=unlimited,
                         engines=engines, listening_ports=ports,
                         agent_uid=limits.parse_uid(status_text or ""),
                         driver_version=driver, c_compiler=c_compiler())

    async def collect(
        self, declaration: Declaration, units: Sequence[Unit] = (),
        owned: Callable[[int], bool] = lambda pid: False,
    ) -> NodeReport:
        """The report for ``declaration`` (what the cluster expects of this node)."""
        facts, files, host_facts = await asyncio.gather(
            self.gpus(), asyncio.to_thread(self._files, declaration),
            asyncio.to_thread(self.host_facts),
        )
        host, found_adapters, found_disks, found_weights, disk_warnings, cards = files
        if host_facts.agent_uid not in (0, None):
            host_facts = host_facts.model_copy(update={"sudo": await self.sudo()})
        warnings = [*facts.warnings, *host.warnings, *disk_warnings, *found_weights.notes]
        return NodeReport(
            node=declaration.node or self.settings.node or socket.gethostname(),
            hostname=socket.gethostname(),
            agent_version=__version__,
            cpu_model=host.cpu.model,
            cpu_count=host.cpu.count,
            cpu_flags=list(host.cpu.flags),
            memory_total_bytes=host.memory.total_bytes,
            memory_available_bytes=host.memory.available_bytes,
            gpus=gpus.build(facts.records, facts.processes, owned),
            adapters=found_adapters,
            fabrics=fabrics.check(declaration.fabrics, found_adapters),
            disks=found_disks,
            weights=found_weights.weights,
            units=list(units),
            collected_at=time.time(),
            warnings=warnings,
            pci_gpus=cards,
            host=host_facts,
            agent_started_at=self.started_at,
            **boot(Path(self.settings.hardware.proc_root)),
        )


def c_compiler() -> str:
    """The C compiler engines find, its path, or "" when there is none.

    Triton (vLLM's and SGLang's kernels) compiles a small launcher in C when an
    engine first loads a model: ``$CC``, else ``gcc``, else ``clang`` on PATH
    (``triton/runtime/build.py``), and fails with "Failed to find C compiler"
    when there is none. Engines' units run with the agent's PATH after their
    install's ``bin/``."""
    path = os.environ.get("PATH") or SYSTEM_PATH
    for name in COMPILERS:
        found = shutil.which(name, path=f"{path}:{SYSTEM_PATH}")
        if found:
            return found
    return ""


def boot(proc_root: Path) -> dict[str, str | float | None]:
    """``boot_id`` (a new one means the node rebooted) and ``booted_at`` (unix time) from
    ``/proc``; each None when it cannot be read."""
    def read(path: Path) -> str | None:
        try:
            return path.read_text()
        except OSError:
            return None

    boot_id = (read(proc_root / "sys" / "kernel" / "random" / "boot_id") or "").strip()
    booted_at = None
    for line in (read(proc_root / "stat") or "").splitlines():
        key, _, value = line.partition(" ")
        if key == "btime" and value.strip().isdigit():
            booted_at = float(value.strip())
    return {"boot_id": boot_id or None, "booted_at": booted_at}
