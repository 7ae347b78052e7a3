"""Processes as Linux shows them in ``/proc``: identity, groups, signals.

A pid alone does not name a process: the kernel reuses pids. A process is
identified here by its pid, its start time (clock ticks since boot, field 22
of ``/proc/<pid>/stat``), the boot it started in, and a hash of its command
line. The supervise backend writes that fingerprint next to each engine and
adopts a running process after an agent restart only when all of it matches.

This always reads the real ``/proc`` (the ``proc_root`` setting is for
hardware facts of fixture nodes, not for processes, which are always real).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import signal
from dataclasses import asdict, dataclass
from pathlib import Path

PROC = Path("/proc")


@dataclass(frozen=True)
class Stat:
    pid: int
    state: str  # R, S, D, Z (zombie), T, ...
    ppid: int
    pgrp: int
    start_ticks: int

    @property
    def alive(self) -> bool:
        return self.state not in ("Z", "X")


@dataclass(frozen=True)
class Fingerprint:
    pid: int
    start_ticks: int
    boot_id: str
    cmdline_sha256: str

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


def stat(pid: int) -> Stat | None:
    """The process's stat line, or None when no such process exists."""
    try:
        text = (PROC / str(pid) / "stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    # The command name sits in parentheses and may itself contain them.
    rest = text[text.rindex(")") + 2:].split()
    return Stat(pid=pid, state=rest[0], ppid=int(rest[1]), pgrp=int(rest[2]),
                start_ticks=int(rest[19]))


def cmdline(pid: int) -> bytes | None:
    try:
        return (PROC / str(pid) / "cmdline").read_bytes()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None


def boot_id() -> str:
    try:
        return (PROC / "sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def fingerprint(pid: int) -> Fingerprint | None:
    """The identity of a live process now, or None when it is gone."""
    info, line = stat(pid), cmdline(pid)
    if info is None or line is None or not info.alive:
        return None
    return Fingerprint(pid, info.start_ticks, boot_id(), hashlib.sha256(line).hexdigest())


def matches(recorded: Fingerprint) -> bool:
    """Whether the process recorded is still the one running under that pid.

    A different start time or boot means the pid was reused by an unrelated
    process, which must never be adopted (or signalled): within one boot, a
    pid and its start tick name one process. The command line is not compared:
    it changes when ``/usr/bin/env`` or a wrapper script execs the engine, or
    when the engine retitles itself, and an agent killed in that moment left a
    fingerprint of the first program, so its engine was orphaned.
    """
    current = fingerprint(recorded.pid)
    return current is not None and (current.start_ticks, current.boot_id) == (
        recorded.start_ticks, recorded.boot_id)


def group_members(pgid: int) -> list[int]:
    """Live (non-zombie) processes in a process group."""
    members = []
    for entry in PROC.iterdir():
        if not entry.name.isdigit():
            continue
        info = stat(int(entry.name))
        if info is not None and info.pgrp == pgid and info.alive:
            members.append(info.pid)
    return members


def signal_group(pgid: int, sig: signal.Signals) -> bool:
    """Send ``sig`` to every process of the group; False when none exists.

    Zombies still count as members for the kernel; :func:`group_members`
    says whether any process of the group is alive.
    """
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        return False
    except PermissionError:
        return False
    return True


def name(pid: int) -> str:
    """The short command name (``comm``) of a process, or empty when unknown."""
    with contextlib.suppress(OSError):
        return (PROC / str(pid) / "comm").read_text().strip()
    return ""
