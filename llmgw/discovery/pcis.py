"""NVIDIA cards on the PCI bus, from ``/sys/bus/pci/devices``, answering or not.

NVML and nvidia-smi list the GPUs their driver answers for; a card whose driver
did not bind (a failed probe, a fallen-off-the-bus card, a driver older than the
card) is simply absent there. The bus still holds it, one directory per device:

    bus/pci/devices/0000:41:00.0/vendor   "0x10de"      (NVIDIA)
    bus/pci/devices/0000:41:00.0/class    "0x030200"    (3D controller; 0x0300xx: VGA)
    bus/pci/devices/0000:41:00.0/device   "0x2330"      (H100 SXM5)
    bus/pci/devices/0000:41:00.0/driver   -> ../../../bus/pci/drivers/nvidia  (absent: none)

:func:`parse` is pure over those values; :func:`read` opens them under a root
(``/sys`` in production, a recorded tree in tests). The fault itself is
:attr:`llmgw.fleet.NodeReport.faults`.
"""

from __future__ import annotations

import os
from pathlib import Path

from llmgw.fleet.types import PciCard

DEVICES_DIR = "bus/pci/devices"
NVIDIA = "0x10de"
# PCI class codes of a GPU: display controller (0x03), VGA (0x00) or 3D (0x02).
GPU_CLASSES = ("0x0300", "0x0302")


def parse(address: str, vendor: str, pci_class: str, device: str | None,
          driver_link: str | None) -> PciCard | None:
    """One device's files as a card, or None when it is not an NVIDIA GPU.

    >>> parse("0000:41:00.0", "0x10de\\n", "0x030200\\n", "0x2330\\n", "../../nvidia")
    PciCard(address='0000:41:00.0', device_id='2330', driver='nvidia')
    >>> parse("0000:41:00.1", "0x10de", "0x040300", None, None) is None  # its audio function
    True
    """
    if vendor.strip().lower() != NVIDIA or not pci_class.strip().lower().startswith(GPU_CLASSES):
        return None
    device_id = (device or "").strip().lower().removeprefix("0x") or None
    driver = os.path.basename(driver_link.rstrip("/")) if driver_link else None
    return PciCard(address=address, device_id=device_id, driver=driver or None)


def _read(path: Path) -> str | None:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return None


def read(sysfs_root: Path | str = "/sys") -> list[PciCard]:
    """Every NVIDIA GPU under ``<sysfs_root>/bus/pci/devices``, by address; none when the
    directory is absent (a container without /sys/bus: nothing to compare with)."""
    base = Path(sysfs_root) / DEVICES_DIR
    if not base.is_dir():
        return []
    cards = []
    for entry in sorted(base.iterdir(), key=lambda p: p.name):
        vendor, pci_class = _read(entry / "vendor"), _read(entry / "class")
        if vendor is None or pci_class is None:
            continue
        try:
            link: str | None = os.readlink(entry / "driver")
        except OSError:
            link = None
        card = parse(entry.name, vendor, pci_class, _read(entry / "device"), link)
        if card is not None:
            cards.append(card)
    return cards
