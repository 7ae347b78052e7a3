"""Free space of each weights directory (``statvfs``)."""

from __future__ import annotations

import os
from collections.abc import Iterable

from llmgw.fleet.types import Disk


def read(paths: Iterable[str]) -> tuple[list[Disk], list[str]]:
    """One :class:`Disk` per path, and warnings for paths that cannot be measured.

    A missing directory is reported with its sizes absent, not zero: "no such
    directory" and "a full disk" call for different fixes.
    """
    disks, warnings = [], []
    for path in paths:
        try:
            stat = os.statvfs(path)
        except OSError as exc:
            disks.append(Disk(path=path))
            warnings.append(f"weights directory {path}: {exc.strerror or exc}")
            continue
        disks.append(
            Disk(
                path=path,
                free_bytes=stat.f_bavail * stat.f_frsize,
                total_bytes=stat.f_blocks * stat.f_frsize,
            )
        )
    return disks, warnings
