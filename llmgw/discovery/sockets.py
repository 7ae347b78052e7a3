"""Listening TCP sockets and who holds them, from /proc text: pure halves.

What a readiness probe must prove before it believes an answer on a port is
that the socket listening there belongs to the unit's own processes: another
program on the engine's port answers ``/health`` too. The kernel says it in
two places, read by the agent and parsed here:

* ``/proc/net/tcp`` and ``tcp6`` (:data:`TABLES`): one row per socket; a row
  in state ``0A`` is a listener, with its local address, its owner's uid and
  its inode;
* ``/proc/<pid>/fd/<n>``: each descriptor is a link; a socket's reads
  ``socket:[<inode>]`` (:func:`socket_inode`), which ties an inode to a pid.

:func:`holder` turns a pid's command line into the words an operator reads
("pid 7539 (python3 -m http.server 18000)").

>>> [(s.port, s.inode) for s in parse("  0: 0100007F:4650 00000000:0000 0A 0 0 0 0 0 17949")]
[(18000, 17949)]
>>> socket_inode("socket:[17949]"), socket_inode("pipe:[18989]")
(17949, None)

Purely computational, no side effects; the agent (:mod:`llmgw.agent.listeners`)
reads the files.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

TABLES = ("net/tcp", "net/tcp6")  # under /proc: the agent's network namespace
LISTEN = "0A"  # TCP_LISTEN in include/net/tcp_states.h, as /proc/net/tcp prints it
_SOCKET = re.compile(r"^socket:\[(\d+)\]$")
COMMAND_SHOWN = 60  # characters of a holder's command line kept in a sentence


@dataclass(frozen=True)
class Listener:
    """One listening socket: where it listens, whose it is, its inode."""

    address: str  # as the table writes it: 0100007F (127.0.0.1), 32 hex digits for tcp6
    port: int
    uid: int | None
    inode: int


def parse(table: str) -> list[Listener]:
    """The listeners of one ``/proc/net/tcp`` or ``tcp6`` table; other rows are skipped.

    Columns: ``sl local_address rem_address st tx:rx tr:when retrnsmt uid timeout inode …``.
    """
    found = []
    for line in table.splitlines():
        fields = line.split()
        if len(fields) < 10 or fields[3] != LISTEN or ":" not in fields[1]:
            continue
        address, _, port = fields[1].rpartition(":")
        try:
            number, inode = int(port, 16), int(fields[9])
        except ValueError:
            continue
        uid = int(fields[7]) if fields[7].isdigit() else None
        found.append(Listener(address, number, uid, inode))
    return found


def on_port(tables: Iterable[str], port: int) -> list[Listener]:
    """Every listener on ``port``, IPv4 and IPv6 (an engine may bind either, or both)."""
    return [s for table in tables for s in parse(table) if s.port == port]


def socket_inode(link: str) -> int | None:
    """The inode a ``/proc/<pid>/fd/<n>`` link names when it is a socket; else None."""
    match = _SOCKET.match(link.strip())
    return int(match.group(1)) if match else None


def holder(pid: int, cmdline: bytes | None) -> str:
    """``pid 7539 (python3 -m http.server 18000)``: a process as a sentence names it.

    The command line is ``/proc/<pid>/cmdline`` (NUL-separated); the program is
    named by its base name, and a long line is cut with an ellipsis.
    """
    words = [w.decode(errors="replace") for w in (cmdline or b"").split(b"\0") if w]
    if not words:
        return f"pid {pid}"
    words[0] = words[0].rsplit("/", 1)[-1]
    text = " ".join(" ".join(words).split())  # a newline in an argument must not break a line
    if len(text) > COMMAND_SHOWN:
        text = text[:COMMAND_SHOWN - 1].rstrip() + "…"
    return f"pid {pid} ({text})"
