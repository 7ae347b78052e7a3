"""``llmgw doctor``'s checks: pure functions of a node's spec and its agent's report.

Each check answers ``ok``, ``warning`` or ``fail`` with what it saw and, when
not ok, the fix. :data:`CHECKS` is the table; :func:`examine` runs it for one
node. Nothing here reads a clock or a file: the time, this llmgw's version
and what the cluster asks of the node come in a :class:`Context`. An
unreachable node gets only the ``ssh`` check (nothing else can be known).

Each fault a node can have shows as exactly one failing check: a missing
adapter fails ``fabric-adapters`` and is not also a port without link.

Usage::

    findings = doctors.examine(spec, report, doctors.context_for(cluster, name, report, now=t))
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

from llmgw.engines import installables
from llmgw.fleet.types import NodeReport
from llmgw.spec.models import Cluster, Node

Status = Literal["ok", "warning", "fail"]
GiB = 1 << 30
DISK_FAIL = 5 * GiB
DISK_WARN = 20 * GiB
SKEW_SMALL = 0.5
SKEW_WARN = 2.0
SKEW_FAIL = 30.0
PORTS_CHECKED = 16  # engine ports from engine_ports_from that must be free for new engines
PROGRAMS = {"llama.cpp": "llama-server", "vllm": "vllm"}  # SGLang runs as `python3 -m sglang…`
MIN_PYTHON = (3, 11)
NOFILE_WARN = 4096  # open files below which an engine under load runs out


@dataclass(frozen=True)
class Finding:
    node: str
    check: str
    status: Status
    detail: str
    fix: str = ""


@dataclass(frozen=True)
class Context:
    """What the checks compare a report with."""

    version: str
    now: float
    engines: tuple[str, ...] = ()  # engines the cluster's models may run on this node
    fabrics: dict[str, tuple[str, int | None]] = field(default_factory=dict)  # name → kind, gid
    # (engine, version, install mode) of each vLLM or SGLang version the cluster names
    installs: tuple[tuple[str, str, str], ...] = ()


Verdict = tuple[Status, str, str]
Check = Callable[[Node, NodeReport, Context], Verdict]


def _ok(detail: str) -> Verdict:
    return "ok", detail, ""


def _agent_version(spec: Node, report: NodeReport, ctx: Context) -> Verdict:
    if report.agent_version is None:
        return "warning", "the agent did not say its version", "upgrade the agent to " + ctx.version
    if report.agent_version != ctx.version:
        return ("warning", f"agent {report.agent_version}, this llmgw {ctx.version}",
                f"install llmgw {ctx.version} on the node and restart llmgw-agent "
                "(engines keep running)")
    return _ok(f"agent {report.agent_version}, same as this llmgw")


def _sudo(spec: Node, report: NodeReport, ctx: Context) -> Verdict:
    host = report.host
    if host is None or host.agent_uid is None:
        return "warning", "the agent did not report its uid", "upgrade the agent"
    if host.agent_uid == 0:
        return _ok("the agent runs as root")
    if host.sudo:
        return _ok(f"the agent runs as uid {host.agent_uid}, with password-less sudo")
    return ("fail", f"the agent runs as uid {host.agent_uid}, which may not sudo without a "
            "password",
            "run the agent as root (llmgw-agent.service does), or give its user password-less "
            "sudo: `llmgw node add` needs it to upgrade llmgw there, the systemd backend to "
            "write units")


def _python(spec: Node, report: NodeReport, ctx: Context) -> Verdict:
    version = report.host.python_version if report.host else None
    if version is None:
        return "warning", "the agent did not report its Python", "upgrade the agent"
    parts = tuple(int(p) for p in version.split(".")[:2] if p.isdigit())
    if parts < MIN_PYTHON:
        return ("fail", f"Python {version}",
                f"install Python {'.'.join(map(str, MIN_PYTHON))} or newer for the agent")
    return _ok(f"Python {version}")


def _nvidia_driver(spec: Node, report: NodeReport, ctx: Context) -> Verdict:
    declared = sum(g.count for g in spec.gpus)
    smi = [w for w in report.warnings if w.startswith(("nvidia-smi", "NVML", "nvml"))]
    if declared and not report.gpus:
        return ("fail", f"{declared} GPUs declared, none reported" +
                (f" ({smi[0]})" if smi else ""),
                "install the NVIDIA driver (nvidia-smi must list the GPUs), or remove `gpus` "
                "from the node")
    if smi:
        return "warning", "; ".join(smi), "check the driver with `nvidia-smi` on the node"
    if not report.gpus:
        return _ok("no GPUs declared or found (CPU node)")
    return _ok(f"{len(report.gpus)} GPUs reported by the driver")


def _gpu_ecc(spec: Node, report: NodeReport, ctx: Context) -> Verdict:
    bad = [g for g in report.gpus if g.ecc_uncorrected]
    if bad:
        which = ", ".join(f"GPU {g.index} ({g.ecc_uncorrected} errors)" for g in bad)
        return ("fail", f"uncorrected ECC errors: {which}; placement skips "
                + ("it" if len(bad) == 1 else "them"),
                "drain the GPU, then reset it (`nvidia-smi -r -i N`) or have it replaced")
    return _ok("no uncorrected ECC errors" if report.gpus else "no GPUs")


def _gpu_processes(spec: Node, report: NodeReport, ctx: Context) -> Verdict:
    held = [(g.index, p) for g in report.gpus for p in g.processes if not p.owned_by_llmgw]
    if held:
        which = ", ".join(f"GPU {i}: pid {p.pid}" + (f" ({p.name})" if p.name else "")
                          for i, p in held)
        return ("fail", f"memory held by processes llmgw did not start: {which}",
                "stop those processes (llmgw never kills what it did not start)")
    return _ok("no GPU held by other processes" if report.gpus else "no GPUs")


def _gpu_mig(spec: Node, report: NodeReport, ctx: Context) -> Verdict:
    split = [g.index for g in report.gpus if g.mig_mode == "Enabled"]
    if split:
        which = ", ".join(map(str, split))
        return ("fail", f"MIG mode on GPU {which} (split into instances); engines take whole "
                "GPUs, so placement skips " + ("it" if len(split) == 1 else "them"),
                f"if llmgw is to use {'it' if len(split) == 1 else 'them'}: `nvidia-smi -i "
                f"{split[0]} -mig 0` for each, then reset the GPU (`nvidia-smi -r -i N`)")
    if not report.gpus:
        return _ok("no GPUs")
    if all(g.mig_mode is None for g in report.gpus):
        return _ok("no GPU with MIG, or a driver that does not say")
    return _ok("MIG off on every GPU that has it")


def _gpu_persistence(spec: Node, report: NodeReport, ctx: Context) -> Verdict:
    off = [g.index for g in report.gpus if g.persistence_mode == "Disabled"]
    if off:
        which = ", ".join(map(str, off))
        return ("warning", f"persistence mode off on GPU {which}: the driver lets go of an idle "
                "GPU, and the next engine start waits for it to be set up again",
                "enable nvidia-persistenced (`systemctl enable --now nvidia-persistenced`)")
    if not report.gpus:
        return _ok("no GPUs")
    if all(g.persistence_mode is None for g in report.gpus):
        return _ok("persistence mode not reported by this driver")
    return _ok("persistence mode on every GPU")


def _present(report: NodeReport) -> dict[str, bool]:
    return {a.name: a.active for a in report.adapters}


def _fabric_adapters(spec: Node, report: NodeReport, ctx: Context) -> Verdict:
    if not spec.fabrics:
        return _ok("no fabric declared")
    present = _present(report)
    missing = [f"{name}: {a}" for name, adapters in spec.fabrics.items()
               for a in adapters if a not in present]
    if missing:
        found = ", ".join(sorted(present)) or "none"
        return ("fail", f"declared adapters not present: {'; '.join(missing)} (found: {found})",
                "fix the node's `fabrics` in nodes.yaml, or the adapter (driver, firmware)")
    return _ok(f"every declared adapter present ({sum(map(len, spec.fabrics.values()))})")


def _fabric_ports(spec: Node, report: NodeReport, ctx: Context) -> Verdict:
    present = _present(report)
    down = [f"{name}: {a}" for name, adapters in spec.fabrics.items()
            for a in adapters if a in present and not present[a]]
    if down:
        return ("fail", f"no ACTIVE port on {'; '.join(down)}; NCCL leaves "
                + ("it" if len(down) == 1 else "them") + " out",
                "check the cable and the subnet manager (`ibstat`), or the switch port")
    return _ok("every declared adapter has an ACTIVE port" if spec.fabrics
               else "no fabric declared")


def _fabric_subnets(spec: Node, report: NodeReport, ctx: Context) -> Verdict:
    """Each declared InfiniBand fabric's adapters answer to one subnet manager; what each
    fabric's adapters answer to (RoCE: their IPv4 networks) is shown either way."""
    if not spec.fabrics:
        return _ok("no fabric declared")
    adapters = {a.name: a for a in report.adapters}
    split: list[str] = []
    seen: list[str] = []
    for name, declared in spec.fabrics.items():
        by_subnet: dict[str, list[str]] = {}
        for adapter in declared:
            for subnet in adapters[adapter].subnets if adapter in adapters else []:
                by_subnet.setdefault(subnet, []).append(adapter)
        groups = "; ".join(f"{', '.join(names)}: {subnet}" for subnet, names in by_subnet.items())
        # RoCE v2 is routed: one network per rail is a design, not a split.
        infiniband = ctx.fabrics.get(name, ("",))[0] == "infiniband"
        (split if infiniband and len(by_subnet) > 1 else seen).append(
            f"{name}: {groups or 'subnet unknown'}")
    if split:
        return ("fail", f"adapters of one fabric on different subnet managers: "
                f"{' | '.join(split)}",
                "declare each subnet as its own fabric (cluster `fabrics:` and the node's "
                "`fabrics:` in nodes.yaml), or cable the adapters to one subnet")
    return _ok("; ".join(seen))


def _pci_gpus(spec: Node, report: NodeReport, ctx: Context) -> Verdict:
    faults = report.faults
    if faults:
        return ("fail", "; ".join(f.split("; check ")[0] for f in faults),
                "check `dmesg | grep -i nvidia`, the driver version and `nvidia-smi -q`")
    if not report.pci_gpus:
        # None seen: a CPU node, or a bus this agent cannot read (an older agent, a
        # container without /sys/bus/pci), where nvidia-smi's count is all there is.
        return _ok("no NVIDIA card on the PCI bus" if not report.gpus
                   else "no NVIDIA card read from the PCI bus; not checked")
    return _ok(f"every NVIDIA card on the PCI bus answers ({len(report.pci_gpus)})")


def _roce_gids(spec: Node, report: NodeReport, ctx: Context) -> Verdict:
    roce = {n: ctx.fabrics[n][1] for n in spec.fabrics if ctx.fabrics.get(n, ("",))[0] == "roce"}
    if not roce:
        return _ok("no RoCE fabric declared")
    ports = {a.name: a.ports for a in report.adapters}
    wrong = []
    for name, gid_index in roce.items():
        index = 3 if gid_index is None else gid_index
        for adapter in spec.fabrics[name]:
            for port in ports.get(adapter, []):
                gid = port.gids[index] if index < len(port.gids) else ""
                kind = port.gid_types[index] if index < len(port.gid_types) else ""
                if not gid.strip("0:") or (kind and kind != "RoCE v2"):
                    wrong.append(f"{adapter} port {port.number} GID {index}: "
                                 f"{gid or 'none'}{f' ({kind})' if kind else ''}")
    if wrong:
        return ("fail", "; ".join(wrong),
                "give the interface its IPv4 address, or set the fabric's gid_index to the "
                "RoCE v2 entry (`show_gids`)")
    return _ok("GID index holds a RoCE v2 address on every declared port")


def _memlock(spec: Node, report: NodeReport, ctx: Context) -> Verdict:
    """The memlock limit engines have, as the kernel applies it (the agent reads it from a
    running engine, or a probe unit); an older agent's report has only its own."""
    if not spec.fabrics:
        return _ok("no RDMA fabric declared; the limit does not matter")
    host = report.host
    engine = host.engine_limits if host is not None else None
    if engine is not None and (engine.memlock_unlimited or engine.memlock_bytes is not None):
        if engine.memlock_unlimited:
            return _ok(f"memlock unlimited for engines ({engine.source})")
        return ("fail", f"engines get memlock {engine.memlock_bytes} bytes ({engine.source}); "
                "NCCL over InfiniBand pins memory and needs it unlimited",
                "systemd grants LimitMEMLOCK=infinity only up to its own hard limit unless it "
                "has CAP_SYS_RESOURCE, and says nothing: raise the hard limit it starts with "
                "(the container's or VM's rlimit, DefaultLimitMEMLOCK=); with the supervise "
                "backend, run the agent with LimitMEMLOCK=infinity (engines inherit it)")
    if host is None or (host.memlock_bytes is None and not host.memlock_unlimited):
        return "warning", "the memlock limit is unknown", "upgrade the agent"
    if host.memlock_unlimited:
        return _ok("memlock unlimited")
    return ("fail", f"memlock limited to {host.memlock_bytes} bytes; RDMA pins memory",
            "set LimitMEMLOCK=infinity in llmgw-agent.service (engines inherit it)")


def _nofile(spec: Node, report: NodeReport, ctx: Context) -> Verdict:
    engine = report.host.engine_limits if report.host is not None else None
    if engine is None:
        return _ok("the agent reports no engine limits; not checked")
    if engine.nofile is None:
        return "warning", f"the open-files limit engines get is unknown ({engine.source})", \
            "upgrade the agent"
    if engine.nofile < NOFILE_WARN:
        return ("warning", f"engines may open {engine.nofile} files ({engine.source}); one "
                "connection or weight file each", "raise the hard open-files limit the "
                "engines start under (DefaultLimitNOFILE= for systemd, the agent's own for "
                "supervise); llmgw's units ask for 1048576")
    return _ok(f"engines may open {engine.nofile} files ({engine.source})")


def _engines(spec: Node, report: NodeReport, ctx: Context) -> Verdict:
    if not ctx.engines:
        return _ok("no model needs an engine here")
    found = {e.name: e for e in (report.host.engines if report.host else [])}
    # Versions llmgw installed count too: their units put their bin/ first on PATH.
    installed = {e.engine for e in (report.host.installed_engines if report.host else [])}
    missing, unchecked = [], []
    for engine in ctx.engines:
        program = PROGRAMS.get(engine)
        if engine in installed:
            continue
        if program is None:
            unchecked.append(engine)
        elif program not in found or not found[program].executable:
            missing.append(f"{program} ({engine})")
    if missing:
        return ("fail", f"not on the agent's PATH: {', '.join(missing)}",
                "llmgw engine install ENGINE==VERSION NODE (docs/install.md), or put it on "
                "the agent's PATH")
    if unchecked:
        return "warning", f"not checked: {', '.join(unchecked)}", ""
    return _ok(", ".join(f"{PROGRAMS[e]} at {found[PROGRAMS[e]].path}" if e not in installed
                         else f"{e} installed by llmgw" for e in ctx.engines))


def _engine_install(spec: Node, report: NodeReport, ctx: Context) -> Verdict:
    """Whether each engine version the cluster names can be installed here
    (:mod:`llmgw.engines.installables`, what the daemon's ``install: auto`` decides by)."""
    if not ctx.installs:
        return _ok("no vLLM or SGLang version named (engines: or a profile's engine_version)")
    words = {"installed": "installed", "install": "can be installed", "skip": "skipped",
             "cannot": "cannot be installed", "unknown": "unknown"}
    parts, fixes = [], []
    status: Status = "ok"
    for engine, version, mode in ctx.installs:
        verdict = installables.check(engine, version, report.node, report)
        parts.append(f"{engine} {version}: {words[verdict.state]}: {verdict.reason}")
        if verdict.state == "cannot":
            fixes.append(f"{engine} {version}: {verdict.fix}")
            status = "fail" if mode == "auto" or status == "fail" else "warning"
        elif verdict.state == "unknown" and status == "ok":
            status = "warning"
            fixes.append(f"{engine} {version}: upgrade the agent")
    return status, "; ".join(parts), "; ".join(fixes)


def _disk(spec: Node, report: NodeReport, ctx: Context) -> Verdict:
    if not spec.weights_dirs:
        return _ok("no weights_dirs declared")
    disks = {d.path: d for d in report.disks}
    missing = [p for p in spec.weights_dirs if p not in disks]
    if missing:
        return ("fail", f"weights directory missing: {', '.join(missing)}",
                "create it on the node, or fix the node's weights_dirs")
    low = [(d.path, d.free_bytes) for d in report.disks if d.free_bytes is not None]
    worst = min(low, key=lambda pair: pair[1], default=None)
    if worst is not None and worst[1] < DISK_WARN:
        status: Status = "fail" if worst[1] < DISK_FAIL else "warning"
        return (status, f"{worst[0]}: {worst[1] / GiB:.1f} GiB free",
                "free space there, or add another weights_dir")
    return _ok("; ".join(f"{p}: {(f or 0) / GiB:.1f} GiB free" for p, f in low) or "unknown")


def _clock(spec: Node, report: NodeReport, ctx: Context) -> Verdict:
    if report.collected_at is None:
        return "warning", "the report carries no time", "upgrade the agent"
    skew = report.collected_at - ctx.now
    text = (f"node clock within {SKEW_SMALL}s of this host's" if abs(skew) < SKEW_SMALL else
            f"node clock {abs(skew):.1f}s {'ahead of' if skew > 0 else 'behind'} this host's")
    if abs(skew) > SKEW_FAIL:
        return "fail", text, "run an NTP client (chrony, systemd-timesyncd) on both"
    if abs(skew) > SKEW_WARN:
        return "warning", text, "run an NTP client (chrony, systemd-timesyncd) on both"
    return _ok(text)


def _engine_ports(spec: Node, report: NodeReport, ctx: Context) -> Verdict:
    listening = report.host.listening_ports if report.host else None
    first = spec.engine_ports_from
    if listening is None:
        return "warning", "listening ports unknown", "upgrade the agent"
    ours = {u.port for u in report.units if u.port is not None}
    taken = sorted(p for p in listening
                   if first <= p < first + PORTS_CHECKED and p not in ours)
    if taken:
        return ("fail", f"ports taken by programs llmgw did not start: "
                f"{', '.join(map(str, taken))}",
                "stop them, or move the node's engine_ports_from past them")
    return _ok(f"{first}-{first + PORTS_CHECKED - 1} free or llmgw's")


CHECKS: tuple[tuple[str, Check], ...] = (
    ("sudo", _sudo),
    ("agent-version", _agent_version),
    ("python", _python),
    ("nvidia-driver", _nvidia_driver),
    ("gpu-ecc", _gpu_ecc),
    ("gpu-processes", _gpu_processes),
    ("gpu-mig", _gpu_mig),
    ("gpu-persistence", _gpu_persistence),
    ("pci-gpus", _pci_gpus),
    ("fabric-adapters", _fabric_adapters),
    ("fabric-ports", _fabric_ports),
    ("fabric-subnets", _fabric_subnets),
    ("roce-gids", _roce_gids),
    ("memlock", _memlock),
    ("nofile", _nofile),
    ("engines", _engines),
    ("engine-install", _engine_install),
    ("disk", _disk),
    ("clock", _clock),
    ("engine-ports", _engine_ports),
)


def examine(name: str, spec: Node, report: NodeReport, ctx: Context) -> list[Finding]:
    """Every check for one node, in :data:`CHECKS` order, after ``ssh``."""
    if not report.reachable:
        return [Finding(name, "ssh", "fail", report.error or "unreachable",
                        "see the message: it names what to check")]
    how = "its local socket" if spec.is_local else "SSH, host key pinned"
    findings = [Finding(name, "ssh", "ok", f"agent reached through {how}")]
    for check, function in CHECKS:
        status, detail, fix = function(spec, report, ctx)
        findings.append(Finding(name, check, status, detail, fix))
    return findings


def context_for(cluster: Cluster, name: str, report: NodeReport, *, version: str,
                now: float) -> Context:
    """What ``cluster`` asks of node ``name``: engines its models may run there, its fabrics."""
    classes = {g.gpu_class for g in report.gpus}
    engines: set[str] = set()
    for model in cluster.models.values():
        for profile in model.profiles:
            if profile.cpu:
                fits = not report.gpus
            else:
                wanted = profile.gpu_class
                accepted = {wanted} if isinstance(wanted, str) else set(wanted or [])
                fits = bool(classes) and (not accepted or bool(accepted & classes))
            if fits:
                engines.add(profile.engine)
    fabrics: dict[str, tuple[str, int | None]] = {
        n: (f.kind, f.gid_index) for n, f in cluster.fabrics.items()}
    named: dict[tuple[str, str], str] = {
        (e, d.version): d.install for e, d in cluster.engines.declared()}
    for model in cluster.models.values():
        for profile in model.profiles:
            if profile.engine in installables.ENGINES and profile.engine_version:
                named.setdefault((profile.engine, profile.engine_version), "profiles")
    return Context(version=version, now=now, engines=tuple(sorted(engines)), fabrics=fabrics,
                   installs=tuple((e, v, m) for (e, v), m in sorted(named.items())))


def failed(findings: list[Finding]) -> bool:
    return any(f.status == "fail" for f in findings)
