"""Running the commands discovery and the systemd backend build.

One place that runs an argv with a timeout and never raises for the
command's own failure: a missing binary, a non-zero exit and a timeout all
come back as a :class:`Completed` whose ``error`` says what happened. The
backends take a :data:`Runner`, so tests feed them recorded outputs.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class Completed:
    argv: tuple[str, ...]
    returncode: int | None  # None: it did not run to the end (missing, timed out)
    stdout: str = ""
    stderr: str = ""
    error: str = ""

    @property
    def ok(self) -> bool:
        return self.returncode == 0

    def why(self) -> str:
        """One line for the operator: the error, or the first line the command printed."""
        if self.error:
            return self.error
        first = (self.stderr.strip() or self.stdout.strip()).splitlines()
        text = first[0] if first else "(no output)"
        return f"{self.argv[0]} exited with status {self.returncode}: {text}"


Runner = Callable[[Sequence[str]], Awaitable[Completed]]
DEFAULT_TIMEOUT = 30.0
# How long a killed command's pipes are read and its exit waited for: a process that
# left its group (setsid) may hold a pipe open for good.
DRAIN_BOUND = 30.0


class TimedRunner(Protocol):
    """A runner that can be told how long one command may take (``systemctl stop``)."""

    def __call__(self, argv: Sequence[str], timeout: float = DEFAULT_TIMEOUT) -> Awaitable[
        Completed]: ...


async def run(argv: Sequence[str], timeout: float = DEFAULT_TIMEOUT) -> Completed:
    """Run ``argv`` (no shell), capture its output, kill it after ``timeout`` seconds."""
    args = tuple(argv)
    try:
        proc = await asyncio.create_subprocess_exec(
            *args, stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )
    except OSError as exc:
        return Completed(args, None, error=f"cannot run {args[0]}: {exc.strerror or exc}")
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout)
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        # Read what is left, as stream() does: wait() alone waits for pipes that a full
        # buffer may have paused.
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(proc.communicate(), DRAIN_BOUND)
        await _reaped(proc)
        return Completed(args, None, error=f"{args[0]} did not finish within {timeout:g}s")
    return Completed(
        args, proc.returncode, out.decode(errors="replace"), err.decode(errors="replace")
    )


def runner(timeout: float) -> Runner:
    """A :data:`Runner` with a fixed timeout."""

    async def bound(argv: Sequence[str]) -> Completed:
        return await run(argv, timeout)

    return bound


class CommandFailed(Exception):
    """A streamed command that could not run or failed; the message says why, in one line."""


class Streamer(Protocol):
    """Runs an argv and yields its stdout as it comes (:func:`stream`); tests wrap it."""

    def __call__(self, argv: Sequence[str], *, max_bytes: int | None = None,
                 timeout: float | None = None) -> AsyncIterator[bytes]: ...


async def stream(argv: Sequence[str], *, max_bytes: int | None = None,
                 timeout: float | None = None) -> AsyncIterator[bytes]:
    """Run ``argv`` (no shell) and yield its stdout in chunks as it comes.

    Bounded both ways: after ``max_bytes`` the command is killed and the stream
    ends; after ``timeout`` seconds (None: for as long as the caller reads, as a
    follow does) it is killed and :class:`CommandFailed` raised. When the caller
    stops iterating (a client that left) the command is killed too. A command
    that cannot start, or exits non-zero, raises :class:`CommandFailed`.
    """
    args = tuple(argv)
    try:
        proc = await asyncio.create_subprocess_exec(
            *args, stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            start_new_session=True,  # its group is killed: a wrapper's child too (nsenter)
        )
    except OSError as exc:
        raise CommandFailed(f"cannot run {args[0]}: {exc.strerror or exc}") from None
    assert proc.stdout is not None and proc.stderr is not None
    errors = asyncio.ensure_future(_first_bytes(proc.stderr, 4096))
    loop = asyncio.get_running_loop()
    deadline = None if timeout is None else loop.time() + timeout
    left = max_bytes
    try:
        while left is None or left > 0:
            wait = None if deadline is None else max(0.0, deadline - loop.time())
            try:
                data = await asyncio.wait_for(
                    proc.stdout.read(65536 if left is None else min(65536, left)), wait)
            except TimeoutError:
                raise CommandFailed(f"{args[0]} did not finish within {timeout:g}s") from None
            if not data:
                code = await proc.wait()
                if code != 0:
                    said = (await errors).decode(errors="replace").strip().splitlines()
                    raise CommandFailed(f"{args[0]} exited with status {code}: "
                                        f"{said[0] if said else '(no output)'}")
                return
            if left is not None:
                left -= len(data)
            yield data
    finally:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        # Read both pipes to their end first (the group is dead, so it comes at once):
        # Python 3.11's wait() returns only once every pipe has closed, and a pipe whose
        # reader paused on a full buffer (``yes`` cut at max_bytes) never does, so
        # waiting first hung for good. A stray holder of a pipe is given a bound.
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(proc.stdout.read(), DRAIN_BOUND)
        with contextlib.suppress(TimeoutError, asyncio.CancelledError):
            await asyncio.wait_for(errors, DRAIN_BOUND)
        await _reaped(proc)


async def _reaped(proc: asyncio.subprocess.Process) -> None:
    """Wait for a killed ``proc``, bounded: past the bound (a stray holder keeps a pipe
    open), our ends are closed so that nothing is left open."""
    try:
        await asyncio.wait_for(asyncio.shield(proc.wait()), DRAIN_BOUND)
    except TimeoutError:
        transport = getattr(proc, "_transport", None)  # asyncio has no public close
        if transport is not None:
            transport.close()


async def _first_bytes(reader: asyncio.StreamReader, keep: int) -> bytes:
    """Everything ``reader`` gives until EOF, of which the first ``keep`` bytes are kept
    (reading on, so a chatty stderr never fills its pipe and stalls the command)."""
    kept = b""
    while data := await reader.read(65536):
        kept = (kept + data)[:keep]
    return kept
