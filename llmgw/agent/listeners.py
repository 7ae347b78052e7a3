"""Whose socket listens on a unit's port: proof that an answer comes from our engine.

Another program on the engine's port answers ``/health`` and ``/v1/models``
as well as the engine would, and the engine, unable to bind, crash-loops
behind it. So before the monitor believes a probe, :class:`Listeners` finds
the sockets listening on the port (``/proc/net/tcp``, ``tcp6``), the
process holding each (``/proc/<pid>/fd``: the unit's main process first,
then every process) and asks the backend which unit that process belongs
to (its process group under ``supervise``, its cgroup under ``systemd``).

A process this agent may not inspect (another user's ``/proc/<pid>/fd``, as
when the agent runs unprivileged and systemd runs engines as root) is judged
by the socket's uid: a uid other than the unit's process's is another
program's; the same uid is taken as the unit's, unproven.

A socket's holder is remembered by inode while it listens (inodes are not
reused while the socket lives), so ``/proc`` is walked once per new socket,
not at every poll.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from llmgw.agent import processes
from llmgw.discovery import limits, sockets

UnitOf = Callable[[int], "str | None"]  # pid → the llmgw unit it belongs to, if any


@dataclass(frozen=True)
class Finding:
    """What listens on one unit's port.

    ``foreign``: the sentence naming a program that is not llmgw's
    ("port 18000 is held by pid 7539 (python3 -m http.server 18000)");
    ``holder``: that program in words ("pid 7539 (python3 …)"), for the report;
    ``other``: the sentence naming another llmgw unit still on the port;
    ``known``: whether the socket tables could be read at all.
    """

    listening: bool
    foreign: str = ""
    holder: str = ""
    other: str = ""
    known: bool = True

    @property
    def ours(self) -> bool:
        """Something listens and all of it is the unit's own."""
        return self.listening and not self.foreign and not self.other


class Listeners:
    """Listening sockets on this node, and their holders, read from ``proc``."""

    def __init__(self, proc: Path = processes.PROC) -> None:
        self.proc = proc
        self._holders: dict[int, int | None] = {}  # inode → pid (None: none readable)

    def tables(self) -> list[str] | None:
        """The text of ``/proc/net/tcp`` and ``tcp6``; None when neither can be read."""
        texts = []
        for name in sockets.TABLES:
            try:
                texts.append((self.proc / name).read_text())
            except OSError:
                continue
        return texts or None

    def ports(self) -> list[int] | None:
        """Every port a TCP socket listens on; None when unknown."""
        texts = self.tables()
        if texts is None:
            return None
        return sorted({s.port for t in texts for s in sockets.parse(t)})

    def check(self, port: int, name: str, pid: int | None, unit_of: UnitOf) -> Finding:
        """Who listens on ``port``, judged for unit ``name`` whose main process is ``pid``."""
        texts = self.tables()
        if texts is None:
            return Finding(listening=False, known=False)
        found = sockets.on_port(texts, port)
        live = {s.inode for t in texts for s in sockets.parse(t)}
        for inode in list(self._holders):
            if inode not in live:
                del self._holders[inode]
        if not found:
            return Finding(listening=False)
        self._resolve({s.inode for s in found}, pid)
        foreign: list[str] = []  # who, in words
        other: list[str] = []
        for listener in found:
            holder = self._holders.get(listener.inode)
            if holder is None:
                if not self._same_uid(listener.uid, pid):
                    who = f"uid {listener.uid}" if listener.uid is not None else "another user"
                    foreign.append(f"a process of {who} that this agent may not inspect")
                continue
            owner = unit_of(holder)
            if owner == name:
                continue
            described = sockets.holder(holder, processes.cmdline(holder))
            if owner is None:
                foreign.append(described)
            else:
                other.append(f"port {port} is still held by {owner} ({described})")
        holders = list(dict.fromkeys(foreign))
        return Finding(listening=True,
                       foreign=f"port {port} is held by {' and '.join(holders)}" if holders else "",
                       holder=" and ".join(holders), other="; ".join(dict.fromkeys(other)))

    # ---- internals ----------------------------------------------------------

    def _resolve(self, inodes: set[int], first: int | None) -> None:
        """Find a holder of each inode not known yet (or whose holder has gone)."""
        wanted = {i for i in inodes
                  if i not in self._holders or not self._alive(self._holders[i])}
        if not wanted:
            return
        found: dict[int, int] = {}
        for pid in self._candidates(first):
            for inode in self._socket_inodes(pid):
                if inode in wanted and inode not in found:
                    found[inode] = pid
            if len(found) == len(wanted):
                break
        for inode in wanted:
            self._holders[inode] = found.get(inode)

    def _candidates(self, first: int | None) -> Iterator[int]:
        if first is not None:
            yield first
        try:
            entries = list(self.proc.iterdir())
        except OSError:
            return
        for entry in entries:
            if entry.name.isdigit() and int(entry.name) != first:
                yield int(entry.name)

    def _socket_inodes(self, pid: int) -> Iterable[int]:
        directory = self.proc / str(pid) / "fd"
        try:
            names = os.listdir(directory)
        except OSError:  # gone, or another user's
            return ()
        inodes = []
        for fd in names:
            try:
                inode = sockets.socket_inode(os.readlink(directory / fd))
            except OSError:
                continue
            if inode is not None:
                inodes.append(inode)
        return inodes

    def _alive(self, pid: int | None) -> bool:
        if pid is None:
            return True  # unreadable stays unreadable until the socket goes
        info = processes.stat(pid)
        return info is not None and info.alive

    def _same_uid(self, uid: int | None, pid: int | None) -> bool:
        if uid is None or pid is None:
            return False
        try:
            status = (self.proc / str(pid) / "status").read_text()
        except OSError:
            return False
        return limits.parse_uid(status) == uid
