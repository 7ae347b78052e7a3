"""Processes on this machine, read from /proc: trees, identities, marks, and stopping them.

Simulated nodes (:mod:`llmgw.onboarding.simnodes`) and labs
(:mod:`llmgw.onboarding.labs`) start processes that must all be found and
stopped again, including engines an agent started in their own process
group and processes whose parent is long gone. Three ways to find them:

* :func:`descendants` — the tree under a pid, while the tree holds;
* :func:`identity` — a pid with its start time, recorded when it was started,
  so a pid the kernel reused is never mistaken for ours;
* :func:`marked` — every process whose environment carries ``MARKER=root``
  (inherited by everything started below) or whose command line names a path
  under ``root`` (sshd rewrites its title over its environment).

Usage::

    terminate(marked(root))     # SIGTERM, wait, SIGKILL what is left
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterable
from pathlib import Path

STOP_TIMEOUT = 5.0
# Every process a simulated node starts carries this in its environment, so the
# final sweep finds engines that an agent started in their own process group.
MARKER = "LLMGW_SIM_ROOT"


def _stat_fields(pid: int) -> list[str] | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name may hold spaces and parentheses: split after the last ')'.
    return stat.rsplit(")", 1)[1].split()


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (children, their children, …), as /proc shows them now."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        fields = _stat_fields(int(entry))
        if fields is not None:
            children.setdefault(int(fields[1]), []).append(int(entry))
    found: list[int] = []
    todo = [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def alive(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie."""
    fields = _stat_fields(pid)
    return fields is not None and fields[0] != "Z"


def identity(pid: int) -> str:
    """``"PID STARTTIME"``, or ``""`` when there is no such process."""
    fields = _stat_fields(pid)
    return "" if fields is None else f"{pid} {fields[19]}"


def is_same(recorded: str) -> bool:
    """Whether the process recorded by :func:`identity` is still the one running."""
    pid = recorded.split()[0] if recorded else ""
    return pid.isdigit() and identity(int(pid)) == recorded


def marked(root: Path, *, exclude: Iterable[int] = ()) -> list[int]:
    """Processes carrying ``MARKER=root`` in their environment or ``root/`` in their argv."""
    marker = f"{MARKER}={root}".encode()
    directory = f"{root}/".encode()
    skip = {os.getpid(), *exclude}
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) in skip:
            continue
        try:
            environ = Path(f"/proc/{entry}/environ").read_bytes()
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
        except OSError:
            continue
        if marker in environ.split(b"\0") or directory in cmdline:
            found.append(int(entry))
    return found


def terminate(pids: Iterable[int], timeout: float = STOP_TIMEOUT) -> None:
    """SIGTERM, wait up to ``timeout`` seconds, then SIGKILL whatever is left."""
    targets = list(pids)
    for pid in targets:
        _signal(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(alive(p) for p in targets):
        time.sleep(0.02)
    for pid in targets:
        if alive(pid):
            _signal(pid, signal.SIGKILL)


def _signal(pid: int, sig: signal.Signals) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass
