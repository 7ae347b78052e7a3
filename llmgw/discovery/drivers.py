"""The NVIDIA driver's version, as its kernel module states it.

The command half is a file to read: ``<sysfs_root>/module/nvidia/version``,
which the loaded ``nvidia`` module writes as one line (``535.129.03``; the
games-on-whales driver image is built from exactly this text as the
version to download). No module loaded: no file, and no version (None,
never "0"). nvidia-smi prints the same number as ``driver_version``, but
this needs no process and answers on a node whose nvidia-smi hangs.

A purely computational module with no side effects (:func:`parse`).
"""

from __future__ import annotations

import re

PATH = ("module", "nvidia", "version")  # under sysfs_root
VERSION = re.compile(r"^\d{2,4}\.\d{1,3}(\.\d{1,3})?$")


def parse(text: str | None) -> str | None:
    """The version in the module's ``version`` file, or None when it says none."""
    line = (text or "").strip()
    return line if VERSION.match(line) else None


def key(version: str) -> tuple[int, ...]:
    """A driver version as numbers, for comparing: ``550.54.15`` → ``(550, 54, 15)``."""
    return tuple(int(part) for part in version.split("."))
