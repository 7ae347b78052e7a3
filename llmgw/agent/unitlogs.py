"""A unit's log as the agent serves it: bounded, the run before the last, secrets masked.

Two sources, one shape (:class:`Query` in, lines out):

* the **journal** on systemd nodes: ``journalctl --unit`` (the engine's own
  lines and systemd's about the unit). ``previous`` is the invocation before
  the latest one, told apart by ``_SYSTEMD_INVOCATION_ID`` (the engine's
  lines) and ``INVOCATION_ID`` (systemd's), from a bounded scan of the
  newest entries (:func:`previous_run`);
* the **supervise log** elsewhere: ``log`` holds the latest run, and the
  supervisor moves it to ``log.previous`` when it starts the unit again, so
  the run a SIGKILL ended is still there after the restart
  (:func:`tail`, :func:`follow_file`).

Every path is bounded: at most :data:`READ_BYTES_MAX` read per answer, every
line cut at :data:`LINE_CHARS_MAX`, the line count capped by the agent; a
follow reads as the log grows and ends when its caller stops (the gRPC
stream is cancelled when the client leaves). The values of the unit's
secret env never leave the node: :class:`Masker` replaces them, then
:func:`llmgw.spec.secrets.scrub` hides whatever else looks like a secret.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from collections.abc import AsyncGenerator, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from llmgw.agent import unitfiles
from llmgw.spec import secrets

LINE_CHARS_MAX = 4096
"""A longer line is cut here and ends with :data:`CUT`."""
READ_BYTES_MAX = 4 * 1024 * 1024
"""Most bytes one answer reads from a log file or from journalctl."""
JSON_LINE_BYTES_MAX = 256 * 1024
"""A journal entry as JSON longer than this is skipped (journald's own LineMax is 48K)."""
SCAN_ENTRIES = 20_000
"""Journal entries scanned, newest first, for the invocation before the latest."""
SECRET_CHARS_MIN = 4
"""Shorter secret values are not masked by value (they would mask common text)."""
FOLLOW_POLL = 0.25
"""Seconds between looks at a followed supervise log."""
CUT = " …[cut]"
MASK = secrets.REDACTED


@dataclass(frozen=True)
class Query:
    """What a caller asks of a unit's log.

    ``lines``: the most lines (already capped by the agent); ``previous``: the
    run before the latest instead of the latest lines; ``since``: Unix time,
    only lines written since (None: all that is kept).
    """

    lines: int
    previous: bool = False
    since: float | None = None


class LogError(Exception):
    """The log cannot be read (journalctl missing or failing); the message says why."""


# ---- masking ------------------------------------------------------------------

class Masker:
    """Hides the unit's secret values, then anything :func:`secrets.scrub` finds,
    then cuts the line to :data:`LINE_CHARS_MAX`.

    Usage::

        mask = Masker.of_file(Path(".../secret.env"))
        lines = [mask(line) for line in raw]
    """

    def __init__(self, values: Iterable[str]) -> None:
        # The longest first, so a secret that contains another is hidden whole.
        self.values = sorted({v for v in values if len(v) >= SECRET_CHARS_MIN},
                             key=len, reverse=True)

    @classmethod
    def of_file(cls, path: Path | None) -> Masker:
        """The values of a secret env file as :func:`llmgw.agent.units.render_secrets`
        writes it; none when it is absent or unreadable (nothing to hide then)."""
        if path is None:
            return cls(())
        try:
            return cls(unitfiles.parse_env_file(path.read_text()).values())
        except (OSError, ValueError):
            return cls(())

    def __call__(self, line: str) -> str:
        for value in self.values:
            if value in line:
                line = line.replace(value, MASK)
        line = secrets.scrub(line)
        return line if len(line) <= LINE_CHARS_MAX else line[:LINE_CHARS_MAX] + CUT


# ---- files (the supervise log) ---------------------------------------------------

def tail(path: Path, lines: int, max_bytes: int = READ_BYTES_MAX,
         chunk: int = 64 * 1024) -> list[str]:
    """The last ``lines`` lines of a file, read from its end, at most ``max_bytes``.

    A first line that the byte bound cut in the middle is dropped: half a line
    could hold half a secret, which no mask would recognise.
    """
    if lines <= 0:
        return []
    try:
        with path.open("rb") as handle:
            end = handle.seek(0, os.SEEK_END)
            floor = max(0, end - max_bytes)
            data = b""
            while end > floor and data.count(b"\n") <= lines:
                start = max(floor, end - chunk)
                handle.seek(start)
                data = handle.read(end - start) + data
                end = start
    except (FileNotFoundError, NotADirectoryError):
        return []
    found = data.decode(errors="replace").splitlines()
    if end > 0 and found:
        found = found[1:]  # begins mid-line
    return found[-lines:]


def read_runs(latest: Path, previous: Path, query: Query) -> list[str]:
    """The latest lines across the last two runs' logs, or (``query.previous``) the run
    before the latest. A log last written before ``query.since`` has nothing since: its
    lines carry no times of their own, so ``since`` keeps or drops whole runs here."""
    def read(path: Path, lines: int) -> list[str]:
        if query.since is not None:
            try:
                if path.stat().st_mtime < query.since:
                    return []
            except FileNotFoundError:
                return []
        return tail(path, lines)

    if query.previous:
        return read(previous, query.lines)
    found = read(latest, query.lines)
    if len(found) >= query.lines:
        return found
    return read(previous, query.lines - len(found)) + found


def cut_file(path: Path, max_bytes: int) -> None:
    """Keep a file to its last ``max_bytes`` (from a line start), in place."""
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        return
    if size <= max_bytes:
        return
    with path.open("r+b") as handle:
        handle.seek(size - max_bytes)
        keep = handle.read()
        newline = keep.find(b"\n")
        keep = keep[newline + 1:] if newline >= 0 else b""
        handle.seek(0)
        handle.write(keep)
        handle.truncate(len(keep))


class Lines:
    """Bytes in, whole lines out, never more than ``limit`` bytes of one line held: an
    endless line comes out in cut pieces, so memory stays bounded."""

    def __init__(self, limit: int = LINE_CHARS_MAX) -> None:
        self.limit = limit
        self.pending = b""

    def feed(self, data: bytes) -> Iterator[str]:
        self.pending += data
        while True:
            newline = self.pending.find(b"\n")
            if newline < 0:
                break
            line, self.pending = self.pending[:newline], self.pending[newline + 1:]
            yield line.decode(errors="replace")
        if len(self.pending) > self.limit:
            line, self.pending = self.pending[:self.limit], b""
            yield line.decode(errors="replace") + CUT

    def rest(self) -> Iterator[str]:
        if self.pending:
            line, self.pending = self.pending, b""
            yield line.decode(errors="replace")


def open_end(path: Path) -> BinaryIO | None:
    """``path`` opened at its end, for :func:`follow_file`; None when it does not exist."""
    try:
        handle = path.open("rb")
    except FileNotFoundError:
        return None
    handle.seek(0, os.SEEK_END)
    return handle


async def follow_file(path: Path, handle: BinaryIO | None, *, poll: float = FOLLOW_POLL,
                      chunk: int = 64 * 1024) -> AsyncGenerator[str, None]:
    """Each line written to ``path`` after ``handle`` (from :func:`open_end`, opened when
    the caller read the latest lines, so nothing falls between), until the caller stops.

    A new run replaces the file (:func:`rotate`): what the old run still wrote
    is read to its end, then the new file from its start. A file cut in place
    (the supervisor's size bound) is read on from its new end. Ends when the
    file's directory is gone (the unit was removed). Closes ``handle``.
    """
    lines = Lines()
    try:
        while True:
            if handle is not None:
                data = handle.read(chunk)
                if data:
                    for line in lines.feed(data):
                        yield line
                    continue  # more may be waiting; poll only when caught up
            try:
                current = path.stat()
            except FileNotFoundError:
                if not path.parent.exists():
                    return
                await asyncio.sleep(poll)
                continue
            if handle is None or os.fstat(handle.fileno()).st_ino != current.st_ino:
                for line in lines.rest():
                    yield line
                if handle is not None:
                    handle.close()
                handle = None
                with contextlib.suppress(FileNotFoundError):
                    handle = path.open("rb")  # the next run's log, from its start
                continue
            if current.st_size < handle.tell():
                handle.seek(0, os.SEEK_END)  # cut in place: read on from its new end
            await asyncio.sleep(poll)
    finally:
        if handle is not None:
            handle.close()


def rotate(path: Path, previous: Path, max_bytes: int) -> None:
    """Keep the ended run's log as ``previous`` (bounded), so the next run starts a new
    ``path``; the run before it is dropped. An engine still writing (there is none: a
    run is started only when the last one ended) would go on writing to ``previous``."""
    try:
        if path.stat().st_size == 0:
            return
    except FileNotFoundError:
        return
    os.replace(path, previous)
    cut_file(previous, max_bytes)


# ---- the journal (systemd nodes) -----------------------------------------------

def journal_command(name: str, query: Query, journalctl: str = "journalctl", *,
                    follow: bool = False) -> list[str]:
    """``journalctl`` for a unit's latest lines (``--output cat``) or, with
    ``previous``, the newest entries as JSON with their invocation, for
    :func:`previous_run`."""
    argv = [journalctl, "--unit", name, "--no-pager", "--quiet"]
    if query.since is not None:
        argv.append(f"--since=@{int(query.since)}")
    if query.previous:
        return [*argv, "--output", "json", "--reverse", "--lines", str(SCAN_ENTRIES),
                "--output-fields=MESSAGE,_SYSTEMD_INVOCATION_ID,INVOCATION_ID"]
    argv += ["--output", "cat", "--lines", str(query.lines)]
    return [*argv, "--follow"] if follow else argv


def _message(entry: dict[str, object]) -> str:
    message = entry.get("MESSAGE")
    if isinstance(message, list):  # journald stores non-UTF-8 text as an array of bytes
        return bytes(b for b in message if isinstance(b, int) and 0 <= b < 256).decode(
            errors="replace")
    return message if isinstance(message, str) else ""


def previous_run(json_lines: Iterable[str], lines: int) -> list[str] | None:
    """The last ``lines`` messages of the invocation before the latest one, oldest first,
    from ``journalctl --output json --reverse`` (newest first); None when the scanned
    entries hold no earlier invocation.

    An entry names its invocation in ``_SYSTEMD_INVOCATION_ID`` (what the engine
    wrote) or ``INVOCATION_ID`` (what systemd wrote about the unit: "Main process
    exited, code=killed, status=9/KILL"); one naming none belongs to the run
    around it. A purely computational function.
    """
    seen: list[str] = []
    found: list[str] = []
    for raw in json_lines:
        try:
            entry = json.loads(raw)
        except ValueError:
            continue
        if not isinstance(entry, dict):
            continue
        invocation = entry.get("_SYSTEMD_INVOCATION_ID") or entry.get("INVOCATION_ID")
        if isinstance(invocation, str) and invocation and (not seen or invocation != seen[-1]):
            if invocation in seen:
                continue  # an entry of a later run logged late: not this run's
            seen.append(invocation)
            if len(seen) > 2:
                break
        if len(seen) == 2 and len(found) < lines:
            found.append(_message(entry))
    return list(reversed(found)) if len(seen) >= 2 else None
