"""``llmgw agent serve`` and ``llmgw agent inventory``: the node agent's commands.

``serve`` runs the agent's gRPC service on its unix socket. ``inventory``
shows what the scheduler would see of this node: it asks the running agent
when one answers on the configured socket, and otherwise collects the same
report itself (read-only: it starts, stops and adopts nothing).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import socket
import sys
import time
from typing import Any

import grpc

from llmgw.agent import monitors, reports, servers, settings, shutdowns
from llmgw.cli.errors import UserError
from llmgw.fleet.types import Gpu, Mount, NodeReport, Port
from llmgw.transport.agent_client import AgentClient

ABSENT = "—"
# CPU features worth a glance when placing CPU engines (llama.cpp picks kernels by them).
NOTABLE_FLAGS = (
    "avx2", "fma", "f16c", "avx512f", "avx512_vnni", "avx512_bf16", "avx_vnni",
    "amx_tile", "amx_bf16", "amx_int8", "asimd", "sve",
)
ASK_TIMEOUT = 10.0


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "agent", help="the node agent: serve its API, or show this node's inventory",
        description="The node agent that reports hardware and runs units on one node.",
    )
    commands = parser.add_subparsers(dest="agent_command", metavar="COMMAND", required=True)
    serve = commands.add_parser("serve", help="serve the agent's gRPC API on its unix socket")
    serve.add_argument("--config", required=True, metavar="FILE", help="agent settings (YAML)")
    serve.add_argument("--log-level", default="info", choices=["debug", "info", "warning"])
    serve.set_defaults(handler=run_serve)
    inventory = commands.add_parser(
        "inventory", help="what the scheduler would see of this node",
        description="GPUs with class and health, fabrics advertised or not and why, memory, "
        "disks, weights and units. Asks the running agent if one answers on the socket of "
        "--config, else collects the report itself, read-only.",
    )
    inventory.add_argument("--config", metavar="FILE", help="agent settings (YAML)")
    inventory.add_argument("--json", action="store_true", help="the NodeReport as JSON")
    inventory.add_argument(
        "--local", action="store_true", help="collect here even when an agent is running"
    )
    inventory.set_defaults(handler=run_inventory)


def _settings(path: str | None) -> settings.Settings:
    if path is None:
        return settings.Settings()
    try:
        return settings.load(path)
    except settings.SettingsError as exc:
        raise UserError(str(exc)) from None


def run_serve(args: argparse.Namespace) -> int:
    chosen = _settings(args.config)
    logging.basicConfig(
        level=args.log_level.upper(), stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    # Readiness probes run every poll_interval; one log line each would drown the rest.
    logging.getLogger("httpx").setLevel(logging.WARNING)
    try:
        left = asyncio.run(servers.serve(chosen))
    except servers.ServeError as exc:
        raise UserError(str(exc)) from None
    if left is not None:  # node remove asked: its files go, after everything else
        shutdowns.finish(left, replace_process=True)
    return 0


def run_inventory(args: argparse.Namespace) -> int:
    chosen = _settings(args.config)
    report, source = asyncio.run(_inventory(chosen, local=args.local))
    if args.json:
        print(report.model_dump_json(indent=2))
    else:
        print(render(report, source), end="")
    return 0


def _listening(path: str) -> bool:
    with socket.socket(socket.AF_UNIX) as probe:
        try:
            probe.connect(path)
        except OSError:
            return False
    return True


async def _inventory(chosen: settings.Settings, local: bool) -> tuple[NodeReport, str]:
    path = chosen.socket.path
    if not local and _listening(path):
        try:
            async with grpc.aio.insecure_channel(f"unix:{path}") as channel:
                report = await AgentClient(channel, timeout=ASK_TIMEOUT).report()
            return report, f"from the agent on unix:{path}"
        except grpc.aio.AioRpcError as exc:
            print(f"note: the agent on {path} did not answer ({exc.code().name}: "
                  f"{exc.details()}); collecting here", file=sys.stderr)
    backend = servers.backend_for(chosen, readonly=True)
    monitor = monitors.Monitor(backend, chosen.readiness)
    try:
        units = await monitor.refresh()
    finally:
        await monitor.close()
    report = await reports.Collector(chosen).collect(chosen.declaration(), units, backend.owns)
    return report, "collected here (no agent asked)"


# ---- text output ---------------------------------------------------------------

def _size(value: int | None) -> str:
    if value is None:
        return ABSENT
    for unit, scale in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if value >= scale:
            return f"{value / scale:.1f} {unit}"
    return f"{value} B"


def _mount(mount: Mount | None) -> str:
    """``nfs4 filer-a:/export/models (shared)``; ``—`` when the agent did not say."""
    if mount is None:
        return "—"
    if mount.shared:
        return f"{mount.fs_type} {mount.label} (shared)"
    return f"{mount.fs_type} {mount.source} (local)"


def _show(value: object, suffix: str = "") -> str:
    return ABSENT if value is None else f"{value}{suffix}"


def _table(rows: list[list[str]], indent: str = "  ") -> str:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = []
    for row in rows:
        cells = [cell.ljust(width) for cell, width in zip(row, widths, strict=True)]
        lines.append((indent + "  ".join(cells)).rstrip())
    return "\n".join(lines) + "\n"


def _health(gpu: Gpu) -> str:
    faults = gpu.faults
    return "; ".join(faults) if faults else "ok"


def _gpus(report: NodeReport) -> str:
    if not report.gpus:
        return "GPUs      none: a CPU node\n" + "".join(
            f"Fault     {fault}\n" for fault in report.faults)
    classes: dict[str, int] = {}
    for gpu in report.gpus:
        classes[gpu.gpu_class] = classes.get(gpu.gpu_class, 0) + 1
    summary = ", ".join(f"{n} × {c}" for c, n in classes.items())
    unhealthy = sum(1 for g in report.gpus if g.faults)
    health = f"; {unhealthy} unhealthy" if unhealthy else ""
    rows = [["#", "CLASS", "NAME", "MEMORY USED/TOTAL", "CC", "ECC", "UTIL", "NVLINK", "HEALTH"]]
    for gpu in report.gpus:
        memory = f"{_show(gpu.memory_used_mib)} / {_show(gpu.memory_total_mib)} MiB"
        nvlink = ABSENT if gpu.nvlink_peers is None else (
            ",".join(map(str, gpu.nvlink_peers)) or "none"
        )
        rows.append([
            str(gpu.index), gpu.gpu_class, gpu.name, memory, _show(gpu.compute_capability),
            _show(gpu.ecc_uncorrected), _show(gpu.utilization_pct, "%"), nvlink, _health(gpu),
        ])
    out = f"GPUs      {summary}{health}\n" + _table(rows)
    return out + "".join(f"Fault     {fault}\n" for fault in report.faults)


def _port_row(adapter: str, port: Port) -> list[str]:
    return [adapter, f"port {port.number}", _show(port.link_layer), _show(port.state),
            _show(port.phys_state), _show(port.rate), _show(port.subnet)]


def _fabrics(report: NodeReport) -> str:
    out = []
    if report.adapters:
        out.append(f"RDMA      {len(report.adapters)} adapter(s)\n")
        rows = [_port_row(a.name, p) for a in report.adapters for p in a.ports]
        out.append(_table(rows) if rows else "  (no ports)\n")
    else:
        out.append("RDMA      none: this node is a single-node island\n")
    if not report.fabrics:
        out.append("Fabrics   none declared\n")
        return "".join(out)
    out.append("Fabrics\n")
    for fabric in report.fabrics:
        gid = f", GID index {fabric.gid_index}" if fabric.gid_index is not None else ""
        if fabric.advertised:
            out.append(f"  {fabric.name} ({fabric.kind}{gid}): advertised over "
                       f"{', '.join(fabric.adapters)}\n")
        else:
            out.append(f"  {fabric.name} ({fabric.kind}{gid}): NOT advertised\n")
        for reason in fabric.reasons:
            out.append(f"    - {reason}\n")
    return "".join(out)


def _units(report: NodeReport) -> str:
    if not report.units:
        return "Units     none\n"
    rows = [["UNIT", "STATE", "PORT", "PID", "SINCE", "DETAIL"]]
    now = time.time()
    for unit in report.units:
        since = ABSENT if unit.since is None else f"{max(0.0, now - unit.since):.0f}s ago"
        rows.append([unit.name, unit.state, _show(unit.port), _show(unit.pid), since,
                     unit.detail])
    out = "Units\n" + _table(rows)
    for unit in report.units:
        if unit.log_tail:
            out += f"  {unit.name} log tail:\n" + "".join(f"    | {line}\n"
                                                         for line in unit.log_tail[-10:])
    return out


def render(report: NodeReport, source: str) -> str:
    """The report for a terminal: one section per kind of fact, absent shown as —."""
    flags = [f for f in NOTABLE_FLAGS if f in report.cpu_flags]
    parts = [
        f"Node      {report.node} (host {_show(report.hostname)}, llmgw agent "
        f"{_show(report.agent_version)}; {source})\n",
        f"CPU       {_show(report.cpu_count)} × {_show(report.cpu_model)}"
        + (f" ({' '.join(flags)})" if flags else "") + "\n",
        f"Memory    {_size(report.memory_total_bytes)} total, "
        f"{_size(report.memory_available_bytes)} available\n",
        _gpus(report),
        _fabrics(report),
    ]
    if report.disks:
        parts.append("Disks\n" + _table([
            [d.path, f"{_size(d.free_bytes)} free of {_size(d.total_bytes)}", _mount(d.mount)]
            for d in report.disks
        ]))
    else:
        parts.append("Disks     no weights directories declared\n")
    if report.weights:
        parts.append("Weights\n" + _table([
            [w.path, w.format, _size(w.size_bytes)] for w in report.weights
        ]))
    else:
        parts.append("Weights   none found\n")
    parts.append(_units(report))
    if report.warnings:
        parts.append("Warnings\n" + "".join(f"  - {w}\n" for w in report.warnings))
    return "".join(parts)

