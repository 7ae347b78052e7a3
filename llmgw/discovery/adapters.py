"""RDMA adapters from ``/sys/class/infiniband``: InfiniBand and RoCE alike.

sysfs is a tree of one-line files, so the "command" half of this source is
the list of files :func:`read` opens under a root (``/sys`` in production,
a fixture tree in tests) and the parsing half is the pure ``parse_*``
functions, one per file format:

    class/infiniband/mlx5_0/ports/1/state          "4: ACTIVE"
    class/infiniband/mlx5_0/ports/1/phys_state     "5: LinkUp"
    class/infiniband/mlx5_0/ports/1/rate           "400 Gb/sec (4X NDR)"
    class/infiniband/mlx5_0/ports/1/link_layer     "InfiniBand" | "Ethernet" (RoCE)
    class/infiniband/mlx5_0/ports/1/gids/<i>       "fe80:0000:0000:0000:..."
    class/infiniband/mlx5_0/ports/1/gid_attrs/types/<i>   "RoCE v2" (RoCE only)
    class/infiniband/mlx5_0/ports/1/lid            "0xb0"
    class/infiniband/mlx5_0/ports/1/sm_lid         "0x1" (the subnet manager's; "0x0" on RoCE)

A port's subnet (:attr:`llmgw.fleet.Port.subnet`) is its SM LID and GID prefix
(the first 64 bits of ``gids/0``) on InfiniBand, its IPv4 network on RoCE.
"""

from __future__ import annotations

import re
from pathlib import Path

from llmgw.fleet.types import Adapter, Port

CLASS_DIR = "class/infiniband"
EMPTY_GID = "0000:0000:0000:0000:0000:0000:0000:0000"

_RATE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*Gb/sec")


def parse_state(text: str) -> str | None:
    """``"4: ACTIVE"`` → ``"ACTIVE"``; the kernel's number is dropped, the name kept."""
    text = text.strip()
    if not text:
        return None
    return text.split(":", 1)[1].strip() if ":" in text else text


def parse_rate(text: str) -> float | None:
    """Gb/s from the kernel's rate string: ``"200 Gb/sec (4X HDR)"`` → 200.0."""
    match = _RATE.match(text)
    return float(match.group(1)) if match else None


def parse_lid(text: str | None) -> str | None:
    """A LID as sysfs writes it (``"0x1"``), normalised; None when absent or not hex.

    >>> parse_lid("0x01\n"), parse_lid("garbage"), parse_lid(None)
    ('0x1', None, None)
    """
    try:
        return None if text is None else hex(int(text.strip(), 16))
    except ValueError:
        return None


def parse_gid(text: str) -> str:
    return text.strip().lower()


def natural(name: str) -> tuple[tuple[int, int | str], ...]:
    """Sort key that orders numbers by value: ``mlx5_2`` before ``mlx5_10``.

    >>> sorted(["mlx5_10", "mlx5_2", "ibp3s0"], key=natural)
    ['ibp3s0', 'mlx5_2', 'mlx5_10']
    """
    return tuple((0, int(part)) if part.isdigit() else (1, part)
                 for part in re.split(r"(\d+)", name) if part)


def _read(path: Path) -> str | None:
    try:
        return path.read_text(errors="replace").strip()
    except OSError:
        # Some attributes cannot be read on some ports (EINVAL on a RoCE port
        # without a netdev): that value is absent, not the whole adapter.
        return None


def _indexed(directory: Path) -> dict[int, str]:
    entries: dict[int, str] = {}
    if not directory.is_dir():
        return entries
    for entry in directory.iterdir():
        if entry.name.isdigit():
            text = _read(entry)
            if text is not None:
                entries[int(entry.name)] = text
    return entries


def read_port(port_dir: Path) -> Port:
    """One port directory (``.../ports/<n>``) as a :class:`Port`."""
    gids = {i: parse_gid(g) for i, g in _indexed(port_dir / "gids").items()}
    populated = [i for i, gid in gids.items() if gid != EMPTY_GID]
    last = max(populated, default=-1)
    types = _indexed(port_dir / "gid_attrs" / "types")
    rate = _read(port_dir / "rate")
    state, phys = _read(port_dir / "state"), _read(port_dir / "phys_state")
    return Port(
        number=int(port_dir.name),
        state=None if state is None else parse_state(state),
        phys_state=None if phys is None else parse_state(phys),
        rate=rate or None,
        rate_gbps=None if rate is None else parse_rate(rate),
        link_layer=_read(port_dir / "link_layer") or None,
        gids=[gids.get(i, EMPTY_GID) for i in range(last + 1)],
        gid_types=[types.get(i, "") for i in range(last + 1)] if types else [],
        lid=parse_lid(_read(port_dir / "lid")),
        sm_lid=parse_lid(_read(port_dir / "sm_lid")),
    )


def read(sysfs_root: Path | str = "/sys") -> list[Adapter]:
    """Every RDMA adapter under ``<sysfs_root>/class/infiniband``, in natural name order.

    A node without the directory has no RDMA adapters: a single-node island,
    which is not an error.
    """
    base = Path(sysfs_root) / CLASS_DIR
    if not base.is_dir():
        return []
    adapters = []
    for device in sorted(base.iterdir(), key=lambda p: natural(p.name)):
        ports_dir = device / "ports"
        ports = []
        if ports_dir.is_dir():
            for port_dir in sorted(ports_dir.iterdir(), key=lambda p: p.name):
                if port_dir.name.isdigit():
                    ports.append(read_port(port_dir))
        adapters.append(Adapter(name=device.name, ports=sorted(ports, key=lambda p: p.number)))
    return adapters
