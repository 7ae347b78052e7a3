"""Process limits and listening ports from /proc text: pure parsers over real formats.

``/proc/<pid>/limits`` gives the memlock limit RDMA needs (NCCL over
InfiniBand pins memory; a 64 KiB default makes it fail at the first
collective). ``/proc/net/tcp`` and ``tcp6`` give the ports in LISTEN state,
so ``llmgw doctor`` can say an engine port is already taken.
``/proc/self/status`` gives the real uid the agent runs as.

>>> parse_memlock("Max locked memory         65536                65536                bytes")
(65536, False)
>>> sorted(parse_listening("  0: 00000000:07E8 00000000:0000 0A 0 0 0 0 0 1145"))
[2024]
>>> parse_uid("Name:\\tcat\\nUid:\\t1000\\t1000\\t1000\\t1000\\n")
1000
"""

from __future__ import annotations

_LISTEN = "0A"


def parse_memlock(limits: str) -> tuple[int | None, bool]:
    """``(soft limit in bytes, unlimited)`` from a limits file; ``(None, False)`` when absent."""
    for line in limits.splitlines():
        if line.startswith("Max locked memory"):
            fields = line[len("Max locked memory"):].split()
            if not fields:
                break
            if fields[0] == "unlimited":
                return None, True
            if fields[0].isdigit():
                return int(fields[0]), False
    return None, False


def parse_nofile(limits: str) -> int | None:
    """The soft limit of open files from a limits file; None when absent or unlimited.

    >>> parse_nofile("Max open files            20000                20000                files")
    20000
    """
    for line in limits.splitlines():
        if line.startswith("Max open files"):
            fields = line[len("Max open files"):].split()
            return int(fields[0]) if fields and fields[0].isdigit() else None
    return None


def parse_listening(table: str) -> set[int]:
    """Local ports of sockets in LISTEN state in a ``/proc/net/tcp`` (or ``tcp6``) table."""
    ports = set()
    for line in table.splitlines():
        fields = line.split()
        if len(fields) < 4 or fields[3] != _LISTEN or ":" not in fields[1]:
            continue
        try:
            ports.add(int(fields[1].rsplit(":", 1)[1], 16))
        except ValueError:
            continue
    return ports


def parse_uid(status: str) -> int | None:
    """The real uid (the first of four) from a ``/proc/<pid>/status`` file; None when absent."""
    for line in status.splitlines():
        if line.startswith("Uid:"):
            fields = line.split()
            return int(fields[1]) if len(fields) > 1 and fields[1].isdigit() else None
    return None
