"""Which filesystem each weights directory lives on, from ``/proc/self/mountinfo``.

Two pure halves, as every discovery source: :func:`path` names the file to
read (under the agent's ``proc_root``), :func:`parse` reads it and
:func:`find` picks the mount a directory lies on. A line of mountinfo is
(``proc(5)``)::

    312 29 0:52 / /mnt/models rw,relatime shared:170 - nfs4 filer-a:/export/models rw,vers=4.2
    (1) (2) (3) (4)  (5)        (6)        (7)...    (8) (9)   (10)                  (11)

mount id, parent id, device, the root of the mount inside its filesystem,
the mount point, its options, optional fields ended by ``-``, the filesystem
type, the mount's source and the superblock options. The mount point and the
root escape space, tab, newline and backslash as octal (``\\040``).

Whether a filesystem is *shared* (one copy seen by many nodes) is read from
its type: :data:`llmgw.fleet.stores.SHARED_TYPES` lists the network and cluster filesystems.
The superblock options are never kept: some carry credentials.

A purely computational module with no side effects.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from llmgw.fleet.stores import is_shared
from llmgw.fleet.types import Mount

_OCTAL = re.compile(r"\\([0-7]{3})")
MAX_LINES = 100_000  # a container host can have thousands of mounts; more is not mountinfo
MAX_FIELD = 4096  # PATH_MAX: longer is not a path the kernel wrote


@dataclass(frozen=True)
class MountLine:
    """One line of mountinfo, the fields llmgw reads."""

    mount_id: int
    root: str
    mount_point: str
    fs_type: str
    source: str


def path(proc_root: str | Path) -> Path:
    """The file to read: ``<proc_root>/self/mountinfo``."""
    return Path(proc_root) / "self" / "mountinfo"


def _unescape(text: str) -> str:
    return _OCTAL.sub(lambda match: chr(int(match.group(1), 8)), text)


def parse(text: str) -> list[MountLine]:
    """Every well-formed line of ``text``, in order; a garbled line is skipped."""
    found = []
    for line in text.splitlines()[:MAX_LINES]:
        fields = line.split(" ")
        try:
            dash = fields.index("-", 6)
        except ValueError:
            continue
        if len(fields) < dash + 3 or not fields[0].isdigit() or len(line) > 4 * MAX_FIELD:
            continue
        found.append(MountLine(
            mount_id=int(fields[0]), root=_unescape(fields[3]),
            mount_point=_unescape(fields[4]), fs_type=fields[dash + 1],
            source=_unescape(fields[dash + 2]),
        ))
    return found


def _under(directory: str, mount_point: str) -> bool:
    return (mount_point == "/" or directory == mount_point
            or directory.startswith(mount_point.rstrip("/") + "/"))


def find(directory: str, mounts: Iterable[MountLine]) -> Mount | None:
    """The mount ``directory`` lies on: the longest mount point above it, the last
    mounted where one point is mounted over (as the kernel resolves it); None when
    no line covers it (an unreadable or empty mountinfo)."""
    clean = posixpath.normpath(directory) if directory.startswith("/") else directory
    best: MountLine | None = None
    for line in mounts:
        if not _under(clean, line.mount_point):
            continue
        if best is None or len(line.mount_point) >= len(best.mount_point):
            best = line
    if best is None:
        return None
    below = posixpath.relpath(clean, best.mount_point) if clean != best.mount_point else "."
    root = posixpath.normpath(posixpath.join(best.root, below)) if below != "." else best.root
    return Mount(mount_point=best.mount_point, fs_type=best.fs_type, source=best.source,
                 root=root, shared=is_shared(best.fs_type))
