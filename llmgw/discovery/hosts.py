"""Memory and CPU of the node, from ``/proc`` and ``/sys`` (roots are settings).

Pure parsers for ``/proc/meminfo``, ``/proc/cpuinfo`` and the kernel's CPU
list format (``/sys/devices/system/cpu/online``), and :func:`read`, which
opens those files under the given roots. A file that cannot be read leaves
its facts absent (None), never zero.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class Memory:
    total_bytes: int | None = None
    available_bytes: int | None = None


@dataclass(frozen=True)
class Cpu:
    model: str | None = None
    count: int | None = None
    flags: tuple[str, ...] = ()


@dataclass(frozen=True)
class Host:
    memory: Memory = field(default_factory=Memory)
    cpu: Cpu = field(default_factory=Cpu)
    warnings: tuple[str, ...] = ()


_UNITS = {"kB": 1024, "B": 1}


def parse_meminfo(text: str) -> Memory:
    """``MemTotal`` and ``MemAvailable`` in bytes (the kernel's "kB" is KiB)."""
    values: dict[str, int] = {}
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        parts = rest.split()
        if not parts or not parts[0].isdigit():
            continue
        unit = _UNITS.get(parts[1], 1) if len(parts) > 1 else 1
        values[key.strip()] = int(parts[0]) * unit
    return Memory(values.get("MemTotal"), values.get("MemAvailable"))


def parse_cpuinfo(text: str) -> Cpu:
    """Model name, logical CPU count and flags from ``/proc/cpuinfo``.

    x86 spells them ``model name`` and ``flags``; arm64 has no model name and
    spells its flags ``Features``.
    """
    model: str | None = None
    flags: tuple[str, ...] = ()
    count = 0
    for line in text.splitlines():
        key, sep, rest = line.partition(":")
        if not sep:
            continue
        key, rest = key.strip(), rest.strip()
        if key == "processor":
            count += 1
        elif key == "model name" and model is None:
            model = rest or None
        elif key in ("flags", "Features") and not flags:
            flags = tuple(rest.split())
    return Cpu(model=model, count=count or None, flags=flags)


def parse_cpu_list(text: str) -> int | None:
    """How many CPUs a kernel CPU list names: ``"0-223"`` → 224, ``"0-3,8"`` → 5."""
    total = 0
    for part in text.strip().split(","):
        if not part:
            continue
        low, _, high = part.partition("-")
        if not low.isdigit() or (high and not high.isdigit()):
            return None
        total += (int(high) - int(low) + 1) if high else 1
    return total or None


def _read(path: Path, warnings: list[str]) -> str | None:
    try:
        return path.read_text(errors="replace")
    except OSError as exc:
        warnings.append(f"cannot read {path}: {exc.strerror or exc}")
        return None


def read(proc_root: Path | str = "/proc", sysfs_root: Path | str = "/sys") -> Host:
    """Memory and CPU facts of this node (or of a fixture node, by its roots)."""
    warnings: list[str] = []
    meminfo = _read(Path(proc_root) / "meminfo", warnings)
    cpuinfo = _read(Path(proc_root) / "cpuinfo", warnings)
    memory = parse_meminfo(meminfo) if meminfo is not None else Memory()
    cpu = parse_cpuinfo(cpuinfo) if cpuinfo is not None else Cpu()
    online = Path(sysfs_root) / "devices/system/cpu/online"
    if online.exists():
        text = _read(online, warnings)
        # The online list counts every logical CPU even where cpuinfo was cut short.
        count = parse_cpu_list(text) if text is not None else None
        if count is not None:
            cpu = Cpu(model=cpu.model, count=count, flags=cpu.flags)
    return Host(memory=memory, cpu=cpu, warnings=tuple(warnings))
