"""Running the commands discovery and the systemd backend build.

One place that runs an argv with a timeout and never raises for the
command's own failure: a missing binary, a non-zero exit and a timeout all
come back as a :class:`Completed` whose ``error`` says what happened. The
backends take a :data:`Runner`, so tests feed them recorded outputs.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Sequence
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
        await proc.wait()
        return Completed(args, None, error=f"{args[0]} did not finish within {timeout:g}s")
    return Completed(
        args, proc.returncode, out.decode(errors="replace"), err.decode(errors="replace")
    )


def runner(timeout: float) -> Runner:
    """A :data:`Runner` with a fixed timeout."""

    async def bound(argv: Sequence[str]) -> Completed:
        return await run(argv, timeout)

    return bound
