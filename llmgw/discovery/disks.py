"""Free space of each weights directory (``statvfs``) and the mount it lies on."""

from __future__ import annotations

import os
from collections.abc import Iterable

from llmgw.discovery import mounts
from llmgw.fleet.types import Disk


def read(paths: Iterable[str], mountinfo: str | None = None) -> tuple[list[Disk], list[str]]:
    """One :class:`Disk` per path, and warnings for paths that cannot be measured.

    ``mountinfo`` is the text of ``/proc/self/mountinfo`` (None: unknown, and so is
    every mount): a directory is looked up there by its real path, symlinks followed.

    A missing directory is reported with its sizes absent, not zero: "no such
    directory" and "a full disk" call for different fixes.
    """
    disks, warnings = [], []
    lines = mounts.parse(mountinfo) if mountinfo is not None else []
    for path in paths:
        mount = mounts.find(os.path.realpath(path), lines) if lines else None
        try:
            stat = os.statvfs(path)
        except OSError as exc:
            disks.append(Disk(path=path, mount=mount))
            warnings.append(f"weights directory {path}: {exc.strerror or exc}")
            continue
        disks.append(
            Disk(
                path=path,
                free_bytes=stat.f_bavail * stat.f_frsize,
                total_bytes=stat.f_blocks * stat.f_frsize,
                mount=mount,
            )
        )
    return disks, warnings
