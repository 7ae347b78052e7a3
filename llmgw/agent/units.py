"""What the unit backends share: the change and result types, the backend
interface, secret env rendering, and careful file writes.

A unit is one shard of one replica (``llmgw-<model>-r<replica>-s<rank>.service``).
The daemon sends, per unit, the rendered unit text, its non-secret env file
text, the *paths* of secret files on the node, and an action. Two backends
run units behind :class:`Backend`: ``systemd`` (production) and
``supervise`` (machines without systemd).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Protocol

from llmgw.agent import unitfiles
from llmgw.agent.unitfiles import Labels, UnitFile, UnitFileError
from llmgw.proto.conversions import Action, UnitChange, UnitResult

__all__ = [
    "Action", "Backend", "Observation", "ProcessState", "SecretError", "UnitChange",
    "UnitResult", "check", "remove", "render_secrets", "tail", "write",
]

ProcessState = Literal["running", "activating", "stopped", "failed"]


@dataclass(frozen=True)
class Observation:
    """What a backend knows of one unit's process, before readiness probing.

    ``labels`` is None for a unit whose file llmgw can no longer read (it is
    then reported as state "unknown" with the reason in ``detail``).
    """

    name: str
    labels: Labels | None
    process: ProcessState
    pid: int | None = None
    since: float | None = None
    detail: str = ""


class Backend(Protocol):
    """Runs units. Every method is safe to call again with the same input."""

    kind: str

    async def apply(self, changes: Sequence[UnitChange]) -> list[UnitResult]:
        """Write, start, stop or remove each unit; one result per change, in order."""
        ...

    async def observe(self) -> list[Observation]:
        """Every llmgw unit this backend knows, with its process state."""
        ...

    async def logs(self, name: str, lines: int) -> list[str]:
        """The last ``lines`` lines the unit's engine wrote; raises KeyError if unknown."""
        ...

    def owns(self, pid: int) -> bool:
        """Whether a process belongs to a unit this backend runs (GPU ownership)."""
        ...

    async def tick(self) -> None:
        """Periodic work (restarts, log trimming); called by the agent's monitor."""
        ...

    async def close(self) -> None: ...


class SecretError(Exception):
    """A secret file that cannot be read; the message names the variable and path."""


def check(change: UnitChange) -> tuple[UnitFile, Labels]:
    """The parsed unit and its labels; raises UnitFileError when llmgw must refuse it."""
    if not unitfiles.NAME.match(change.name):
        raise UnitFileError(
            f"{change.name!r} is not an llmgw unit name (llmgw-<model>-r<replica>-s<rank>.service)"
        )
    unit = unitfiles.parse(change.name, change.unit_text)
    # A unit from a tampered saved plan or a compromised daemon must not smuggle in
    # ExecStartPre=, User= or a second [Service]: only what the template writes.
    problems = [f"[{name}] is not a section llmgw writes"
                for name in unit.sections if name not in ("Unit", "Service")]
    problems += unitfiles.shape_problems(
        (section, key) for section, pairs in unit.sections.items() for key, _ in pairs
    )
    if problems:
        raise UnitFileError(f"{change.name}: refused: " + "; ".join(problems))
    found = unitfiles.labels(unit)
    expected = f"llmgw-{found.model}-r{found.replica}-s{found.rank}.service"
    if expected != change.name:
        raise UnitFileError(f"{change.name}: its labels name it {expected}")
    if change.action == "start" and not unit.value("Service", "ExecStart"):
        raise UnitFileError(f"{change.name}: [Service] has no ExecStart=")
    return unit, found


def render_secrets(secret_env: Mapping[str, str]) -> str:
    """The secret env file's text, read from files on this node.

    Values are read here, on the node, and never leave it: not in results,
    not in logs. A trailing newline in a secret file is not part of the value.
    """
    env = {}
    for variable, path in sorted(secret_env.items()):
        if not path.startswith("/"):
            raise SecretError(f"secret_env {variable}: {path!r} is not an absolute path")
        try:
            env[variable] = Path(path).read_text().rstrip("\r\n")
        except OSError as exc:
            raise SecretError(
                f"secret_env {variable}: cannot read {path} on this node: {exc.strerror or exc}"
            ) from None
    return unitfiles.render_env_file(env)


def write(path: Path, text: str, mode: int = 0o644) -> bool:
    """Write ``text`` atomically with ``mode``; False when the file already held it.

    The temporary file is created with ``mode`` from the start, so a secret is
    never readable by others, not even for a moment.
    """
    try:
        if path.read_text() == text and (path.stat().st_mode & 0o777) == mode:
            return False
    except (OSError, ValueError):  # absent, unreadable or not UTF-8: write it afresh
        pass
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return True


def remove(path: Path) -> bool:
    try:
        path.unlink()
    except FileNotFoundError:
        return False
    return True


def tail(path: Path, lines: int, chunk: int = 64 * 1024) -> list[str]:
    """The last ``lines`` lines of a file, read from its end."""
    if lines <= 0:
        return []
    try:
        with path.open("rb") as handle:
            handle.seek(0, os.SEEK_END)
            end = handle.tell()
            data = b""
            while end > 0 and data.count(b"\n") <= lines:
                start = max(0, end - chunk)
                handle.seek(start)
                data = handle.read(end - start) + data
                end = start
    except FileNotFoundError:
        return []
    return data.decode(errors="replace").splitlines()[-lines:]
