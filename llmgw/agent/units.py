"""What the unit backends share: the change and result types, the backend
interface, secret env rendering, and careful file writes.

A unit is one shard of one replica (``llmgw-<model>-r<replica>-s<rank>.service``).
The daemon sends, per unit, the rendered unit text, its non-secret env file
text, the *paths* of secret files on the node, and an action. Two backends
run units behind :class:`Backend`: ``systemd`` (production) and
``supervise`` (machines without systemd).
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from collections.abc import AsyncGenerator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Protocol

from llmgw.agent import unitfiles
from llmgw.agent.unitfiles import Labels, UnitFile, UnitFileError
from llmgw.agent.unitlogs import Query
from llmgw.discovery import limits
from llmgw.fleet.types import EngineLimits
from llmgw.proto.conversions import Action, UnitChange, UnitResult

__all__ = [
    "CRASHES_KEPT", "Action", "Backend", "Evidence", "Ledger", "Observation", "ProcessState",
    "SecretError", "UnitChange", "UnitResult", "check", "remove", "render_secrets", "write",
]

ProcessState = Literal["running", "activating", "stopped", "failed"]
CRASHES_KEPT = 32  # crash times kept per unit: enough for any crash-loop rule worth setting


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
    evidence: Evidence | None = None


@dataclass(frozen=True)
class Evidence:
    """What tells one kind of drift from another (:mod:`llmgw.planning.drifts`).

    ``crashes`` are unix times of abnormal ends, oldest first; ``stopped_by``
    says who stopped a stopped unit ("llmgw", "operator", or "" unknown);
    ``written`` whether the unit file is one this agent's ledger vouches for.
    """

    restarts: int | None = None
    last_exit: str = ""
    last_exit_at: float | None = None
    crashes: tuple[float, ...] = ()
    stopped_by: str = ""
    written: bool | None = None


class Backend(Protocol):
    """Runs units. Every method is safe to call again with the same input."""

    kind: str

    async def apply(self, changes: Sequence[UnitChange]) -> list[UnitResult]:
        """Write, start, stop or remove each unit; one result per change, in order."""
        ...

    async def observe(self) -> list[Observation]:
        """Every llmgw unit this backend knows, with its process state."""
        ...

    async def logs(self, name: str, query: Query) -> list[str]:
        """The unit's log as ``query`` asks (:mod:`llmgw.agent.unitlogs`), bounded, its
        secret values masked; raises KeyError if unknown, LogError if unreadable."""
        ...

    def follow(self, name: str, query: Query) -> AsyncGenerator[str, None]:
        """The last ``query.lines`` lines, then each new line as it is written, masked,
        until the caller stops; raises KeyError if unknown, LogError if unreadable."""
        ...

    def owns(self, pid: int) -> bool:
        """Whether a process belongs to a unit this backend runs (GPU ownership)."""
        ...

    def unit_of(self, pid: int) -> str | None:
        """The llmgw unit a process belongs to (its process group, its cgroup), if any:
        what proves the socket on a unit's port is the unit's own."""
        ...

    async def engine_limits(self) -> EngineLimits | None:
        """The resource limits an engine gets here, as the kernel applies them."""
        ...

    async def tick(self) -> None:
        """Periodic work (restarts, log trimming); called by the agent's monitor."""
        ...

    async def close(self) -> None: ...


def process_limits(proc: Path, pid: int | str, source: str) -> EngineLimits | None:
    """A process's limits from ``<proc>/<pid>/limits``; None when it cannot be read."""
    try:
        text = (proc / str(pid) / "limits").read_text()
    except OSError:
        return None
    return parse_process_limits(text, source)


def parse_process_limits(text: str, source: str) -> EngineLimits | None:
    """Limits from the text of a ``/proc/<pid>/limits`` file; None when it is not one."""
    if "Max locked memory" not in text:
        return None
    memlock, unlimited = limits.parse_memlock(text)
    return EngineLimits(memlock_bytes=memlock, memlock_unlimited=unlimited,
                        nofile=limits.parse_nofile(text), source=source)


def tightest(found: Sequence[EngineLimits]) -> EngineLimits | None:
    """Of several processes' limits, the one with the least memlock (then nofile)."""
    def key(item: EngineLimits) -> tuple[float, float]:
        memlock = float("inf") if item.memlock_unlimited else float(item.memlock_bytes or 0)
        return memlock, float("inf") if item.nofile is None else float(item.nofile)

    return min(found, key=key) if found else None


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


class Ledger:
    """Which unit files this agent wrote: one ``<name><suffix>`` file per unit holding the
    SHA-256 of the unit text it wrote. A unit whose file does not match is not llmgw's (a
    stranger, or a hand edit). The first agent to keep a ledger on a node vouches for the
    units already there (``adopt``), so an upgrade does not turn the fleet into strangers.
    """

    MARKER = ".llmgw-ledger"

    def __init__(self, directory: Path, suffix: str = ".written") -> None:
        self.directory = directory
        self.suffix = suffix

    def _path(self, name: str) -> Path:
        return self.directory / f"{name}{self.suffix}"

    def record(self, name: str, unit_text: str) -> None:
        write(self._path(name), _sha256(unit_text) + "\n", mode=0o600)

    def forget(self, name: str) -> None:
        remove(self._path(name))

    def vouches(self, name: str, unit_text: str) -> bool:
        try:
            return self._path(name).read_text().strip() == _sha256(unit_text)
        except (OSError, ValueError):
            return False

    def adopt(self, units: Mapping[str, str]) -> None:
        """Vouch for ``units`` (name → text) once, when this node had no ledger yet."""
        marker = self.directory / self.MARKER
        if marker.exists():
            return
        try:
            for name, text in units.items():
                self.record(name, text)
            write(marker, "units llmgw wrote: one file per unit with the SHA-256 of its text\n")
        except OSError:
            pass  # a read-only look (`llmgw agent inventory` as another user) adopts nothing


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()
