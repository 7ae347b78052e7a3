"""GPUs from nvidia-smi: the commands to run and pure parsers for their CSV.

Two halves, as for every discovery source: :func:`query_command`,
:func:`identity_command` and :func:`processes_command` build the argv (the
agent runs it, with a timeout), :func:`parse_query`, :func:`parse_identity`
and :func:`parse_processes` turn its stdout into records, and :func:`build`
turns records into :class:`llmgw.fleet.Gpu`.

The PCI device id, MIG mode and persistence mode are a query of their own,
read by column name: a driver that does not know ``mig.mode.current``
(before R450) refuses the whole query, and then only those facts are missing.

Absent stays absent: ``[N/A]``, ``[Not Supported]`` and a column an older
driver does not print become ``None``, never ``0``.
"""

from __future__ import annotations

import csv
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace

from llmgw.fleet.types import Gpu, GpuProcess
from llmgw.spec import gpus as gpu_classes

# Order matters: utilization is last because an older driver prints rows
# without it, and such a row must still describe a GPU.
QUERY_FIELDS = (
    "index",
    "uuid",
    "name",
    "pci.bus_id",
    "memory.total",
    "memory.used",
    "compute_cap",
    "ecc.errors.uncorrected.volatile.total",
    "utilization.gpu",
)
REQUIRED_COLUMNS = len(QUERY_FIELDS) - 1
IDENTITY_FIELDS = ("uuid", "pci.device_id", "mig.mode.current", "persistence_mode")
PROCESS_FIELDS = ("gpu_uuid", "pid", "process_name", "used_memory")
FORMAT = "--format=csv,noheader,nounits"

# What nvidia-smi prints instead of a value it cannot give.
_ABSENT = re.compile(r"^\[?(N/A|Not Supported|Unknown Error|Insufficient Permissions|"
                     r"GPU requires reset|Requested functionality has been deprecated)\]?$",
                     re.IGNORECASE)
_NUMBER = re.compile(r"^(-?\d+(?:\.\d+)?)\s*(?:MiB|%|W|C)?$")


@dataclass(frozen=True)
class GpuRecord:
    """One GPU as a source reported it, before class and ownership are decided."""

    index: int
    uuid: str
    name: str
    pci_bus_id: str | None = None
    memory_total_mib: int | None = None
    memory_used_mib: int | None = None
    compute_capability: str | None = None
    ecc_uncorrected: int | None = None
    utilization_pct: int | None = None
    nvlink_peers: tuple[int, ...] | None = None
    pci_device_id: str | None = None  # "2330": the device half of 0x233010DE
    mig_mode: str | None = None  # "Enabled" | "Disabled"; None: no MIG on this GPU
    persistence_mode: str | None = None  # "Enabled" | "Disabled"; None: unknown


@dataclass(frozen=True)
class Identity:
    """What :func:`identity_command` adds to a GPU: its PCI device id, MIG and persistence
    mode."""

    pci_device_id: str | None = None
    mig_mode: str | None = None
    persistence_mode: str | None = None


@dataclass(frozen=True)
class ProcessRecord:
    """A compute process holding memory on one GPU (by UUID)."""

    gpu_uuid: str
    pid: int
    name: str
    used_memory_mib: int | None


@dataclass
class Parsed:
    gpus: list[GpuRecord] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def query_command(nvidia_smi: str = "nvidia-smi") -> list[str]:
    """argv of the per-GPU query.

    >>> query_command()[1].split(",")[:2]
    ['--query-gpu=index', 'uuid']
    """
    return [nvidia_smi, "--query-gpu=" + ",".join(QUERY_FIELDS), FORMAT]


def identity_command(nvidia_smi: str = "nvidia-smi") -> list[str]:
    """argv of the identity query: PCI device id and MIG mode, with a header row."""
    return [nvidia_smi, "--query-gpu=" + ",".join(IDENTITY_FIELDS), "--format=csv,nounits"]


def processes_command(nvidia_smi: str = "nvidia-smi") -> list[str]:
    """argv of the compute-process query (memory held per process per GPU)."""
    return [nvidia_smi, "--query-compute-apps=" + ",".join(PROCESS_FIELDS), FORMAT]


def value(text: str) -> str | None:
    """A CSV cell with nvidia-smi's placeholders for "no value" turned into None."""
    text = text.strip()
    if not text or _ABSENT.match(text):
        return None
    return text


def number(text: str) -> float | None:
    """A numeric cell (units tolerated) or None when absent or not a number."""
    cell = value(text)
    if cell is None:
        return None
    match = _NUMBER.match(cell)
    return float(match.group(1)) if match else None


def _int(text: str) -> int | None:
    parsed = number(text)
    return None if parsed is None else int(parsed)


def _rows(stdout: str) -> Iterable[list[str]]:
    reader = csv.reader(stdout.splitlines(), skipinitialspace=True)
    for row in reader:
        if row and any(cell.strip() for cell in row):
            yield [cell.strip() for cell in row]


def parse_query(stdout: str) -> Parsed:
    """Records from the output of :func:`query_command`.

    A row with the utilization column missing (older drivers) still yields a
    GPU, with ``utilization_pct`` None. A row too short to name a GPU, or a
    line that is not CSV at all (an error message), becomes a warning.
    """
    parsed = Parsed()
    for row in _rows(stdout):
        index = _int(row[0])
        if index is None or len(row) < REQUIRED_COLUMNS:
            parsed.warnings.append(f"nvidia-smi: unexpected line {', '.join(row)!r}")
            continue
        uuid, name = value(row[1]), value(row[2])
        if uuid is None or name is None:
            parsed.warnings.append(f"nvidia-smi: GPU {index} has no UUID or name; skipped")
            continue
        parsed.gpus.append(
            GpuRecord(
                index=index,
                uuid=uuid,
                name=name,
                pci_bus_id=value(row[3]),
                memory_total_mib=_int(row[4]),
                memory_used_mib=_int(row[5]),
                compute_capability=value(row[6]),
                ecc_uncorrected=_int(row[7]),
                utilization_pct=_int(row[8]) if len(row) > REQUIRED_COLUMNS else None,
            )
        )
    return parsed


def device_id(text: str | None) -> str | None:
    """The device half of nvidia-smi's ``pci.device_id`` (``0x233010DE`` → ``2330``).

    The value is the 32-bit PCI id with the vendor (``10DE``, NVIDIA) in the
    low half, as NVML's ``pciDeviceId``; a plain 4-digit device id is kept.
    """
    cell = None if text is None else value(text)
    if cell is None:
        return None
    digits = cell.lower().removeprefix("0x")
    if not re.fullmatch(r"[0-9a-f]{1,8}", digits):
        return None
    return digits.zfill(8)[:4] if len(digits) > 4 else digits.zfill(4)


def parse_identity(stdout: str) -> dict[str, Identity]:
    """PCI device id and MIG mode by GPU UUID, from CSV with a header row.

    Columns are found by their header name, so a recorded
    ``--query-gpu=uuid,mig.mode.current,mig.mode.pending`` reads the same
    way. ``[N/A]`` (a GPU without MIG) is None.
    """
    rows = list(_rows(stdout))
    if not rows:
        return {}
    header = [cell.split(" [")[0].strip().lower() for cell in rows[0]]
    if "uuid" not in header:
        return {}
    column = {name: header.index(name) for name in header}
    found = {}
    for row in rows[1:]:
        if len(row) != len(header):
            continue

        def cell(name: str, row: list[str] = row) -> str | None:
            return value(row[column[name]]) if name in column else None

        uuid = cell("uuid")
        if uuid:
            found[uuid] = Identity(device_id(cell("pci.device_id")), cell("mig.mode.current"),
                                   cell("persistence_mode"))
    return found


def with_identity(records: Sequence[GpuRecord], found: dict[str, Identity]) -> list[GpuRecord]:
    """``records`` with the device id and MIG mode :func:`parse_identity` found."""
    out = []
    for record in records:
        extra = found.get(record.uuid)
        out.append(record if extra is None else replace(
            record, pci_device_id=extra.pci_device_id or record.pci_device_id,
            mig_mode=extra.mig_mode or record.mig_mode,
            persistence_mode=extra.persistence_mode or record.persistence_mode))
    return out


def with_peers(records: Sequence[GpuRecord], peers: dict[int, tuple[int, ...]] | None,
               ) -> list[GpuRecord]:
    """``records`` with NVLink peers from ``nvidia-smi topo -m`` where none are known."""
    if peers is None:
        return list(records)
    return [record if record.nvlink_peers is not None or record.index not in peers
            else replace(record, nvlink_peers=peers[record.index]) for record in records]


def parse_processes(stdout: str) -> list[ProcessRecord]:
    """Records from the output of :func:`processes_command`.

    The process name sits between fixed columns and may itself hold a comma,
    so the first two and the last cells are taken by position.
    """
    records = []
    for line in stdout.splitlines():
        cells = [cell.strip() for cell in line.split(",")]
        if len(cells) < len(PROCESS_FIELDS) or not cells[0].startswith("GPU-"):
            continue  # "No running processes found" and the like
        pid = _int(cells[1])
        if pid is None:
            continue
        records.append(
            ProcessRecord(
                gpu_uuid=cells[0],
                pid=pid,
                name=value(", ".join(cells[2:-1])) or "",
                used_memory_mib=_int(cells[-1]),
            )
        )
    return records


def class_of(record: GpuRecord) -> str:
    """The GPU class from PCI device id, name and memory (see :mod:`llmgw.spec.gpus`)."""
    return gpu_classes.classify(record.name, record.memory_total_mib, record.pci_device_id)


def build(
    records: Sequence[GpuRecord],
    processes: Sequence[ProcessRecord] = (),
    owned: Callable[[int], bool] = lambda pid: False,
) -> list[Gpu]:
    """Fleet GPUs from records, each with the processes holding its memory.

    ``owned(pid)`` says whether a process belongs to a unit this agent runs;
    any other process marks its GPU (see :attr:`llmgw.fleet.Gpu.faults`).
    This is a purely computational function with no side-effects.
    """
    by_uuid: dict[str, list[GpuProcess]] = {}
    for proc in processes:
        by_uuid.setdefault(proc.gpu_uuid, []).append(
            GpuProcess(
                pid=proc.pid,
                name=proc.name,
                used_memory_mib=proc.used_memory_mib,
                owned_by_llmgw=owned(proc.pid),
            )
        )
    return [
        Gpu(
            index=record.index,
            uuid=record.uuid,
            name=record.name,
            gpu_class=class_of(record),
            pci_bus_id=record.pci_bus_id,
            memory_total_mib=record.memory_total_mib,
            memory_used_mib=record.memory_used_mib,
            compute_capability=record.compute_capability,
            ecc_uncorrected=record.ecc_uncorrected,
            utilization_pct=record.utilization_pct,
            nvlink_peers=None if record.nvlink_peers is None else list(record.nvlink_peers),
            pci_device_id=record.pci_device_id,
            mig_mode=record.mig_mode,
            persistence_mode=record.persistence_mode,
            processes=by_uuid.get(record.uuid, []),
        )
        for record in sorted(records, key=lambda r: r.index)
    ]
