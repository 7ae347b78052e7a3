"""The built-in table of GPU classes.

A class is named from the family and the memory the *driver* reports, rounded
to whole GiB: an L40S reports 46068 MiB (44.99 GiB) and so is ``l40s-45g``,
not the ``l40s-48g`` of the datasheet. Agents name what they find with
:func:`class_for`, and cluster files may only name classes listed here (or
declared under ``cluster.gpu_classes``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class GpuClass:
    name: str
    family: str
    memory_gib: int
    compute_capability: tuple[int, int]
    description: str

    @property
    def supports_fp8(self) -> bool:
        """fp8 weights and KV cache need compute capability 8.9 (Ada) or newer."""
        return self.compute_capability >= (8, 9)


# family regex (matched against nvidia-smi's name, case-insensitive), family id,
# compute capability. Order matters: more specific names first.
_FAMILIES: tuple[tuple[str, str, tuple[int, int]], ...] = (
    (r"GH200", "gh200", (9, 0)),
    (r"GB200", "gb200", (10, 0)),
    (r"B200", "b200", (10, 0)),
    (r"H200", "h200", (9, 0)),
    (r"H100 NVL", "h100nvl", (9, 0)),
    (r"H100", "h100", (9, 0)),
    (r"H800", "h800", (9, 0)),
    (r"H20\b", "h20", (9, 0)),
    (r"A100", "a100", (8, 0)),
    (r"A800", "a800", (8, 0)),
    (r"L40S", "l40s", (8, 9)),
    (r"L40\b", "l40", (8, 9)),
    (r"\bL4\b", "l4", (8, 9)),
    (r"A10G", "a10g", (8, 6)),
    (r"\bA10\b", "a10", (8, 6)),
    (r"A30\b", "a30", (8, 0)),
    (r"A40\b", "a40", (8, 6)),
    (r"RTX 6000 Ada", "rtx6000ada", (8, 9)),
    (r"RTX A6000", "a6000", (8, 6)),
    (r"RTX 4090", "rtx4090", (8, 9)),
    (r"RTX 3090", "rtx3090", (8, 6)),
    (r"V100", "v100", (7, 0)),
    (r"Tesla T4|\bT4\b", "t4", (7, 5)),
)

# Classes as drivers report them (MiB from nvidia-smi's memory.total).
_KNOWN: tuple[tuple[str, int, str], ...] = (
    ("h100", 81559, "NVIDIA H100 80GB HBM3 (SXM) / H100 PCIe"),
    ("h100nvl", 95830, "NVIDIA H100 NVL"),
    ("h800", 81559, "NVIDIA H800"),
    ("h200", 143771, "NVIDIA H200 (141 GB)"),
    ("gh200", 97871, "NVIDIA GH200 96GB"),
    ("b200", 183359, "NVIDIA B200"),
    ("h20", 97871, "NVIDIA H20"),
    ("a100", 81920, "NVIDIA A100 80GB (SXM4 / PCIe)"),
    ("a100", 40960, "NVIDIA A100 40GB"),
    ("a800", 81920, "NVIDIA A800 80GB"),
    ("l40s", 46068, "NVIDIA L40S (48 GB on the datasheet, 44.99 GiB reported)"),
    ("l40", 46068, "NVIDIA L40"),
    ("l4", 23034, "NVIDIA L4"),
    ("a10g", 23028, "NVIDIA A10G"),
    ("a10", 23028, "NVIDIA A10"),
    ("a30", 24576, "NVIDIA A30"),
    ("a40", 46068, "NVIDIA A40"),
    ("rtx6000ada", 49140, "NVIDIA RTX 6000 Ada Generation"),
    ("a6000", 49140, "NVIDIA RTX A6000"),
    ("rtx4090", 24564, "NVIDIA GeForce RTX 4090"),
    ("rtx3090", 24576, "NVIDIA GeForce RTX 3090"),
    ("v100", 32768, "Tesla V100 32GB"),
    ("v100", 16384, "Tesla V100 16GB"),
    ("t4", 15360, "Tesla T4"),
)

_CAPABILITY = {family: cc for _, family, cc in _FAMILIES}

# PCI device ids (vendor 10de) of data-centre boards: device id → (family,
# GiB as the driver reports it, the board's name in the PCI ID Repository).
# Ids and names are from pci.ids (https://pci-ids.ucw.cz, as shipped by
# Debian's `pci.ids` package in /usr/share/misc/pci.ids, and the pciutils/
# pciids repository for boards newer than Debian 12's copy: H200, L40S,
# B200, H100 NVL). A board that only has a codename there (PG500-216) is
# matched here, where its driver name would not be. GiB is what the driver
# reports for that board (see _KNOWN), so a GPU whose memory is not
# reported still gets its class.
DEVICES: dict[str, tuple[str, int, str]] = {
    "1db1": ("v100", 16, "GV100GL [Tesla V100 SXM2 16GB]"),
    "1db4": ("v100", 16, "GV100GL [Tesla V100 PCIe 16GB]"),
    "1db5": ("v100", 32, "GV100GL [Tesla V100 SXM2 32GB]"),
    "1db6": ("v100", 32, "GV100GL [Tesla V100 PCIe 32GB]"),
    "1db8": ("v100", 32, "GV100GL [Tesla V100 SXM3 32GB]"),
    "1df0": ("v100", 32, "GV100GL [Tesla PG500-216]"),  # a V100 PCIe 32GB board
    "1df5": ("v100", 16, "GV100GL [Tesla V100 SXM2 16GB]"),
    "1df6": ("v100", 32, "GV100GL [Tesla V100S PCIe 32GB]"),
    "1eb8": ("t4", 15, "TU104GL [Tesla T4]"),
    "20b0": ("a100", 40, "GA100 [A100 SXM4 40GB]"),
    "20b1": ("a100", 40, "GA100 [A100 PCIe 40GB]"),
    "20b2": ("a100", 80, "GA100 [A100 SXM4 80GB]"),
    "20b5": ("a100", 80, "GA100 [A100 PCIe 80GB]"),
    "20f1": ("a100", 40, "GA100 [A100 PCIe 40GB]"),
    "20b7": ("a30", 24, "GA100GL [A30 PCIe]"),
    "2236": ("a10", 22, "GA102GL [A10]"),
    "2237": ("a10g", 22, "GA102GL [A10G]"),
    "2330": ("h100", 80, "GH100 [H100 SXM5 80GB]"),
    "2331": ("h100", 80, "GH100 [H100 PCIe]"),
    "2321": ("h100nvl", 94, "GH100 [H100L 94GB]"),  # sold as H100 NVL
    "2324": ("h800", 80, "GH100 [H800]"),
    "2335": ("h200", 140, "GH100 [H200 SXM 141GB]"),
    "26b5": ("l40", 45, "AD102GL [L40]"),
    "26b9": ("l40s", 45, "AD102GL [L40S]"),
    "27b8": ("l4", 22, "AD104GL [L4]"),
    "2901": ("b200", 179, "GB100 [B200]"),
}


def gib_from_mib(memory_mib: float) -> int:
    """Whole GiB as a class name uses them: 46068 MiB → 45."""
    return round(memory_mib / 1024)


def family_for(driver_name: str) -> str | None:
    """The family id for nvidia-smi's ``name`` column, or None when unknown."""
    for pattern, family, _ in _FAMILIES:
        if re.search(pattern, driver_name, re.IGNORECASE):
            return family
    return None


def class_for(driver_name: str, memory_mib: float) -> str:
    """The class name of one GPU as its driver reports it.

    >>> class_for("NVIDIA L40S", 46068)
    'l40s-45g'

    Unknown families still get a stable name from the driver's own words, so
    an operator can declare it under ``cluster.gpu_classes``.
    """
    family = family_for(driver_name)
    if family is None:
        family = re.sub(r"[^a-z0-9]+", "", driver_name.lower().replace("nvidia", "")) or "gpu"
    return f"{family}-{gib_from_mib(memory_mib)}g"


def classify(driver_name: str, memory_mib: float | None, device_id: str | None = None) -> str:
    """The class of one GPU: family by PCI device id, else by name; GiB as reported.

    >>> classify("Tesla PG500-216", 32768, "1df0")
    'v100-32g'
    >>> classify("NVIDIA H100 80GB HBM3", None, "2330")
    'h100-80g'
    >>> classify("NVIDIA A10", None)
    'a10-22g'

    Memory not reported: the device table's GiB, else the one size the
    family comes in, else ``unknown`` (an A100 could be 40 or 80 GiB).
    """
    known = DEVICES.get((device_id or "").lower())
    if memory_mib is not None:
        if known is not None:
            return f"{known[0]}-{gib_from_mib(memory_mib)}g"
        return class_for(driver_name, memory_mib)
    if known is not None:
        return f"{known[0]}-{known[1]}g"
    family = family_for(driver_name)
    sizes = {c.memory_gib for c in BUILTIN.values() if c.family == family}
    if family is not None and len(sizes) == 1:
        return f"{family}-{sizes.pop()}g"
    return "unknown"


def _build_table() -> dict[str, GpuClass]:
    table: dict[str, GpuClass] = {}
    for family, mib, description in _KNOWN:
        name = f"{family}-{gib_from_mib(mib)}g"
        table[name] = GpuClass(name, family, gib_from_mib(mib), _CAPABILITY[family], description)
    return table


BUILTIN: dict[str, GpuClass] = _build_table()
